/*
 * file.h -- a read-only byte source with bounds-checked positional reads: a
 * file on disk (pread) or a memory buffer (tests, fuzzing).  Parsers in
 * format/ read through this, never through raw pointers into a mapping, so
 * that no length or offset from an untrusted file is trusted unchecked.
 */
#ifndef SP_FILE_H
#define SP_FILE_H

#include "core.h"

#include <sys/types.h>

struct sp_file;

/* Open path read-only.  SP_E_IO (message names the path and errno text). */
sp_status sp_file_open(const char *path, struct sp_file **out);

/* Wrap n bytes of caller memory (not copied; must outlive the sp_file). */
sp_status sp_file_from_memory(const void *data, size_t n, struct sp_file **out);

void sp_file_close(struct sp_file *f);

uint64_t sp_file_size(const struct sp_file *f);
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
