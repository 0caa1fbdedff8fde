/*
 * session.h -- the saved-session file (sp_session_save / sp_session_load,
 * `run --prompt-cache`): the one parser of it (untrusted bytes -> a plain
 * struct, every count checked against the file size) and the header a
 * writer emits.  docs/FORMAT.md gives the layout; all little-endian:
 *
 *   offset  size  field
 *   0       8     magic "SPSESS\0\1"
 *   8       4     version (3; 1 and 2 are still read unless they hold q4h rows)
 *   12      4     header bytes (the fixed part: 128)
 *   16      32    model fingerprint (SHA-256 of what identifies the model)
 *   48      4     n_ctx the session was made with
 *   52      4+4   type_k, type_v (enum sp_kv_type)
 *   60      4x4   n_layers, n_kv_heads, head_dim_k, head_dim_v
 *   76      4+4   n_cells (tokens held), next_pos
 *   84      8+4   n_discarded, n_shifts
 *   96      32    sampler RNG state (4 x u64)
 *   128     4 n   the cells' token ids, then 4 n their positions,
 *           4     n_hist, then 4 n_hist penalty-history tokens (oldest first),
 *           4     n_logits (0, or n_vocab: the last token's logits, F32), then
 *                 4 n_logits bytes of them,
 *           ...   the KV rows: per cell, per layer, per KV head, the key row
 *                 then the value row, as stored (row bytes from the types)
 *   end-32  32    SHA-256 of every byte before it
 */
#ifndef SP_FORMAT_SESSION_H
#define SP_FORMAT_SESSION_H

#include "core/core.h"
#include "core/file.h"
#include "core/hash.h"

#include <stdbool.h>

#define SP_SESSION_MAGIC "SPSESS\0\1"
#define SP_SESSION_VERSION 3u
/* Version 1 and 2 files are read too, except with a q4h key or value type:
 * their q4h rows are older codes (version 1: before the value-bias and
 * key-balance rewrites; version 2: the 4-bit non-uniform levels of i4n_b32,
 * before the trellis code of quant/kv_tq.c) and would not decode. */
#define SP_SESSION_VERSION_MIN 1u
#define SP_SESSION_TYPE_Q4H 4u /* enum sp_kv_type's SP_KV_Q4H */
#define SP_SESSION_HEADER_BYTES 128u

struct sp_session_file {
    uint8_t fingerprint[SP_SHA256_BYTES];
    uint32_t n_ctx, type_k, type_v;
    uint32_t n_layers, n_kv_heads, hd_k, hd_v;
    uint32_t n_cells;
    int32_t next_pos;
    uint64_t n_discarded;
    uint32_t n_shifts;
    uint64_t rng[4];
    uint32_t n_hist, n_logits;
    /* filled by the parser: where the sections are (absolute offsets) */
    uint64_t tok_off, pos_off, hist_off, logits_off, kv_off, hash_off;
    uint64_t cell_bytes; /* KV bytes of one cell */
};

/* Row bytes of a KV type for a head size, of its key rows or (value) its
 * value rows; 0 = unknown type or a head size it cannot take (the caller's
 * knowledge: quant/kv.h). */
typedef size_t (*sp_session_row_bytes_fn)(uint32_t type, uint32_t hd, bool value);

/* Parse f's header and lay out its sections: SP_E_FORMAT naming the field
 * for a bad magic, version, header size, geometry, count, or a file whose
 * size is not what the counts give ("truncated" / "trailing bytes"). */
sp_status sp_session_file_parse(struct sp_file *f, sp_session_row_bytes_fn row_bytes, struct sp_session_file *out);

/* Check the trailing SHA-256 over the whole file: SP_E_FORMAT ("checksum
 * mismatch") when it does not match, SP_E_IO on a read error. */
sp_status sp_session_file_verify(struct sp_file *f, const struct sp_session_file *h);

/* The fixed header bytes of h (SP_SESSION_HEADER_BYTES). */
void sp_session_file_header(const struct sp_session_file *h, uint8_t out[SP_SESSION_HEADER_BYTES]);

#endif /* SP_FORMAT_SESSION_H */
