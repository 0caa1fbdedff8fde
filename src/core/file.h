/*
 * file.h -- a read-only byte source with bounds-checked positional reads: a
 * file on disk (pread) or a memory buffer (tests, fuzzing).  Parsers in
 * format/ read through this, never through raw pointers into a mapping, so
 * that no length or offset from an untrusted file is trusted unchecked.
 */
#ifndef SP_FILE_H
#define SP_FILE_H

#include "core.h"

#include <stdbool.h>
#include <sys/types.h>

struct sp_file;

/* Open path read-only.  SP_E_IO (message names the path and errno text). */
sp_status sp_file_open(const char *path, struct sp_file **out);

/* Wrap n bytes of caller memory (not copied; must outlive the sp_file). */
sp_status sp_file_from_memory(const void *data, size_t n, struct sp_file **out);

/* The first n bytes of a size-byte file, held in caller memory (not copied;
 * must outlive the sp_file), named name in messages: a package's manifest
 * carries a model's GGUF header but not its tensor data (format/pack.c).
 * sp_file_size() says size; reads past the n bytes held are SP_E_FORMAT.
 * n <= size. */
sp_status sp_file_from_prefix(const void *data, size_t n, uint64_t size, const char *name, struct sp_file **out);

void sp_file_close(struct sp_file *f);

uint64_t sp_file_size(const struct sp_file *f);
/* Bytes that can be read from offset 0: the size, or a prefix's n. */
uint64_t sp_file_held(const struct sp_file *f);
const char *sp_file_path(const struct sp_file *f); /* "<memory>" for buffers */
int sp_file_fd(const struct sp_file *f);           /* -1 for buffers */

/* Read exactly n bytes at off into dst.  Returns SP_E_FORMAT when
 * [off, off+n) is not inside the file ("truncated"), SP_E_IO on a read error. */
sp_status sp_file_read_at(struct sp_file *f, uint64_t off, void *dst, size_t n);

/* ---- the read every model-file read goes through ------------------------
 * sp_file_read_at above, the pager's loads and its streamed spans all read
 * with sp_file_pread_all (file.c states the retry policy), which calls
 * sp_file_pread, the one place a read reaches the OS. */
#define SP_FILE_RETRIES 3u       /* retries of a failed read (EIO...), after 1, 2, 4 ms */
#define SP_FILE_RETRIES_INTR 64u /* retries of EINTR / EAGAIN in a row */

/* pread(2) through the fault hook: the byte count, or -1 with errno. */
ssize_t sp_file_pread(int fd, void *dst, size_t n, uint64_t off);

/* Read [off, off + n) with the retry policy.  0 with *got bytes read (short
 * only at end of file), or the errno of the last try with *got bytes read
 * before the failing offset (off + *got).  EINVAL is not retried. */
int sp_file_pread_all(int fd, void *dst, size_t n, uint64_t off, size_t *got);

/* ---- writing a file whole or not at all -----------------------------------
 * Writers (the GGUF writer: quantize, synth; later packages and session
 * files) write "<path>.sparrow-tmp.<pid>" in the target's folder, fsync it
 * and rename it over path, so path is either absent, the old file or the
 * complete new one, whatever instant the process is killed at.  A temporary
 * a killed process left is recognisable by that name (never a model's
 * name: nothing globs it as one) and removed by the next writer of the same
 * path once its process is gone. */
#define SP_FILE_TMP_TAG ".sparrow-tmp."

/* Remove what killed writers of path left: "<path>.sparrow-tmp.<pid>" whose
 * process no longer exists (another live writer's file is left alone).
 * Returns how many were removed (each logged at info level). */
int sp_file_tmp_sweep(const char *path);

/* Sweep, then create and open the temporary file for path (write-only,
 * truncated, mode 0644).  *tmp_path (sp_malloc'd, the caller frees) and
 * *fd on success; SP_E_IO naming the file, SP_E_NOMEM. */
sp_status sp_file_tmp_create(const char *path, char **tmp_path, int *fd);

/* fsync fd, rename tmp_path over path, fsync the folder.  fd stays open
 * (the caller closes it).  SP_E_IO naming the step that failed. */
sp_status sp_file_tmp_commit(int fd, const char *tmp_path, const char *path);

/* True when a and b name the same existing file (same device and inode:
 * hard links and symbolic links included). */
bool sp_file_same(const char *a, const char *b);

/* ---- fault injection (tests; SQLite's faultsim in spirit) ----------------
 * Arm: calls of sp_file_pread are numbered from 1 after sp_file_fault_set;
 * calls at..at+count-1 (count 0: every call from `at` on) misbehave as
 * `kind` says.  Global to the process, as the allocator hook is: arm it only
 * while the reads you mean to hit are the only ones running.  NULL or
 * SP_FAULT_NONE disarms. */
enum sp_fault_kind {
    SP_FAULT_NONE = 0,
    SP_FAULT_EIO,   /* fails with EIO (retried by the policy, then reported) */
    SP_FAULT_SHORT, /* reads half of what was asked (a legal short count) */
    SP_FAULT_EINTR, /* fails with EINTR, as a read a signal interrupted */
    SP_FAULT_STALL, /* sleeps stall_ms, then reads */
    SP_FAULT_COUNT
};
struct sp_file_fault {
    enum sp_fault_kind kind;
    uint64_t at;       /* first call to misbehave, counted from 1 */
    uint64_t count;    /* calls in a row that misbehave; 0 = all from `at` on */
    uint32_t stall_ms; /* SP_FAULT_STALL */
};
void sp_file_fault_set(const struct sp_file_fault *f);
uint64_t sp_file_fault_calls(void); /* sp_file_pread calls while armed (since arming) */
uint64_t sp_file_fault_hits(void);  /* of those, how many misbehaved */

#endif /* SP_FILE_H */
