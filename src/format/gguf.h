/*
 * gguf.h -- the GGUF container (v2 and v3): reader and streaming writer.
 *
 * File layout (little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv   (v1 used u32 counts: refused)
 *   n_kv × { string key | u32 type | value }      string = u64 len + bytes
 *   n_tensors × { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to general.alignment (default 32) | tensor data (offsets relative to here)
 * Array values are u32 elem_type | u64 n | n values (arrays may nest).
 *
 * Only format/ and the synthetic-model generator (model/synth.c, which uses
 * the writer) include this header.
 */
#ifndef SP_GGUF_H
#define SP_GGUF_H

#include "core/file.h"
#include "model_file.h"

/* Parse the GGUF header, metadata and tensor directory of f into mf (the
 * caller has set mf->path and mf->file_size).  Fills kind, version,
 * alignment, data_offset, meta, tensors.  Does not interpret the metadata
 * (see sp_model_file_open).  Every count, length and offset is validated. */
sp_status sp_gguf_read(struct sp_file *f, struct sp_model_file *mf);

/* ---- writer ------------------------------------------------------------
 * Streaming: add all metadata and tensor descriptors first, then write tensor
 * data in directory order, then finish.  Output goes to a temporary file
 * beside path (core/file.h: sp_file_tmp_create) and is renamed over path by
 * sp_gguf_writer_finish; sp_gguf_writer_free without finish removes the
 * temporary file, and the next writer of path removes one a killed process
 * left. */
struct sp_gguf_writer;

sp_status sp_gguf_writer_open(const char *path, uint32_t alignment, struct sp_gguf_writer **out);
/* Copies key and value (deeply). */
sp_status sp_gguf_writer_set(struct sp_gguf_writer *w, const char *key, const struct sp_meta_value *v);
sp_status sp_gguf_writer_set_str(struct sp_gguf_writer *w, const char *key, const char *s);
sp_status sp_gguf_writer_set_u32(struct sp_gguf_writer *w, const char *key, uint32_t x);
sp_status sp_gguf_writer_set_f32(struct sp_gguf_writer *w, const char *key, float x);
sp_status sp_gguf_writer_set_bool(struct sp_gguf_writer *w, const char *key, bool x);
/* Declare a tensor; its size comes from type and shape.  Offsets are assigned
 * in declaration order, each aligned. */
sp_status sp_gguf_writer_add_tensor(struct sp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne);
/* Write the next chunk of tensor data (tensors in declaration order; a tensor
 * may be written in several chunks; padding is inserted automatically). */
sp_status sp_gguf_writer_write(struct sp_gguf_writer *w, const void *data, size_t n);
/* Check every declared byte was written, fsync, rename into place. */
sp_status sp_gguf_writer_finish(struct sp_gguf_writer *w);
void sp_gguf_writer_free(struct sp_gguf_writer *w);

#endif /* SP_GGUF_H */
