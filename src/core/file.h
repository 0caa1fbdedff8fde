/*
 * file.h -- a read-only byte source with bounds-checked positional reads: a
 * file on disk (pread) or a memory buffer (tests, fuzzing).  Parsers in
 * format/ read through this, never through raw pointers into a mapping, so
 * that no length or offset from an untrusted file is trusted unchecked.
 */
#ifndef SP_FILE_H
#define SP_FILE_H

#include "core.h"

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

#endif /* SP_FILE_H */
