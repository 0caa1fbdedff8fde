/*
 * session.c -- the saved-session file's header (see session.h): parse with
 * every count checked against the file's size, verify the checksum, write.
 */
#include "session.h"

#include <stdio.h>

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

void sp_session_file_header(const struct sp_session_file *h, uint8_t out[SP_SESSION_HEADER_BYTES]) {
    memset(out, 0, SP_SESSION_HEADER_BYTES);
    memcpy(out, SP_SESSION_MAGIC, 8);
    wr32(out + 8, SP_SESSION_VERSION);
    wr32(out + 12, SP_SESSION_HEADER_BYTES);
    memcpy(out + 16, h->fingerprint, SP_SHA256_BYTES);
    wr32(out + 48, h->n_ctx);
    wr32(out + 52, h->type_k);
    wr32(out + 56, h->type_v);
    wr32(out + 60, h->n_layers);
    wr32(out + 64, h->n_kv_heads);
    wr32(out + 68, h->hd_k);
    wr32(out + 72, h->hd_v);
    wr32(out + 76, h->n_cells);
    wr32(out + 80, (uint32_t)h->next_pos);
    wr64(out + 84, h->n_discarded);
    wr32(out + 92, h->n_shifts);
    for (int i = 0; i < 4; i++) wr64(out + 96 + 8 * i, h->rng[i]);
}

#define BAD(...) sp_err(SP_E_FORMAT, __VA_ARGS__)

sp_status sp_session_file_parse(struct sp_file *f, sp_session_row_bytes_fn row_bytes, struct sp_session_file *out) {
    const char *path = sp_file_path(f);
    const uint64_t size = sp_file_size(f);
    uint8_t b[SP_SESSION_HEADER_BYTES];
    memset(out, 0, sizeof *out);
    if (size < SP_SESSION_HEADER_BYTES + 4 + SP_SHA256_BYTES)
        return BAD("%s: not a Sparrow session file: %llu bytes is too short", path, (unsigned long long)size);
    sp_status rc = sp_file_read_at(f, 0, b, sizeof b);
    if (rc) return rc;
    if (memcmp(b, SP_SESSION_MAGIC, 8) != 0) return BAD("%s: not a Sparrow session file (bad magic)", path);
    const uint32_t version = rd32(b + 8), hbytes = rd32(b + 12);
    if (version < SP_SESSION_VERSION_MIN || version > SP_SESSION_VERSION)
        return BAD("%s: session file version %u; this Sparrow reads versions %u to %u", path, version,
                   SP_SESSION_VERSION_MIN, SP_SESSION_VERSION);
    if (hbytes != SP_SESSION_HEADER_BYTES)
        return BAD("%s: session header of %u bytes, expected %u", path, hbytes, SP_SESSION_HEADER_BYTES);
    memcpy(out->fingerprint, b + 16, SP_SHA256_BYTES);
    out->n_ctx = rd32(b + 48);
    out->type_k = rd32(b + 52);
    out->type_v = rd32(b + 56);
    out->n_layers = rd32(b + 60);
    out->n_kv_heads = rd32(b + 64);
    out->hd_k = rd32(b + 68);
    out->hd_v = rd32(b + 72);
    out->n_cells = rd32(b + 76);
    out->next_pos = (int32_t)rd32(b + 80);
    out->n_discarded = rd64(b + 84);
    out->n_shifts = rd32(b + 92);
    if (version < 3 && (out->type_k == SP_SESSION_TYPE_Q4H || out->type_v == SP_SESSION_TYPE_Q4H)) {
        const char *was = version < 2 ? "values with their bias, keys not balanced per channel"
                                      : "4-bit levels, before the trellis code";
        return BAD("%s: session file version %u holds q4h rows in an old code (%s); this Sparrow stores q4h as "
                   "version %u: save the session again",
                   path, version, was, SP_SESSION_VERSION);
    }
    for (int i = 0; i < 4; i++) out->rng[i] = rd64(b + 96 + 8 * i);
    if (out->n_layers == 0 || out->n_layers > 4096 || out->n_kv_heads == 0 || out->n_kv_heads > 4096)
        return BAD("%s: session geometry out of range (%u layers, %u KV heads)", path, out->n_layers,
                   out->n_kv_heads);
    const size_t rk = row_bytes(out->type_k, out->hd_k, false), rv = row_bytes(out->type_v, out->hd_v, true);
    if (rk == 0) return BAD("%s: session key type %u with head size %u is not one this Sparrow stores", path,
                            out->type_k, out->hd_k);
    if (rv == 0) return BAD("%s: session value type %u with head size %u is not one this Sparrow stores", path,
                            out->type_v, out->hd_v);
    if (out->n_cells > out->n_ctx || out->n_ctx > (1u << 24))
        return BAD("%s: session holds %u tokens in a context of %u", path, out->n_cells, out->n_ctx);
    if (out->n_cells > 0 && out->next_pos < 0)
        return BAD("%s: session next position %d is negative", path, out->next_pos);
    /* every size below is bounded: 2^24 cells x 2^12 x 2^12 x rows < 2^64 */
    out->cell_bytes = (uint64_t)out->n_layers * out->n_kv_heads * (rk + rv);
    out->tok_off = SP_SESSION_HEADER_BYTES;
    out->pos_off = out->tok_off + 4ull * out->n_cells;
    out->hist_off = out->pos_off + 4ull * out->n_cells;
    if (out->hist_off + 4 > size) return BAD("%s: truncated session file (the token section)", path);
    uint8_t nh[4];
    if ((rc = sp_file_read_at(f, out->hist_off, nh, 4))) return rc;
    out->n_hist = rd32(nh);
    if (out->n_hist > (1u << 20)) return BAD("%s: session penalty history of %u tokens", path, out->n_hist);
    out->logits_off = out->hist_off + 4 + 4ull * out->n_hist;
    if (out->logits_off + 4 > size) return BAD("%s: truncated session file (the history section)", path);
    if ((rc = sp_file_read_at(f, out->logits_off, nh, 4))) return rc;
    out->n_logits = rd32(nh);
    if (out->n_logits > (1u << 24)) return BAD("%s: session logits of %u values", path, out->n_logits);
    out->kv_off = out->logits_off + 4 + 4ull * out->n_logits;
    uint64_t kv_bytes;
    if (sp_mul_overflow_u64(out->cell_bytes, out->n_cells, &kv_bytes) ||
        sp_add_overflow_u64(out->kv_off, kv_bytes, &out->hash_off))
        return BAD("%s: session sizes overflow", path);
    const uint64_t want = out->hash_off + SP_SHA256_BYTES;
    if (size < want)
        return BAD("%s: truncated session file: %llu bytes, its header says %llu", path, (unsigned long long)size,
                   (unsigned long long)want);
    if (size > want)
        return BAD("%s: %llu trailing bytes after the session's checksum", path, (unsigned long long)(size - want));
    return SP_OK;
}

sp_status sp_session_file_verify(struct sp_file *f, const struct sp_session_file *h) {
    struct sp_sha256_ctx *c = NULL;
    sp_status rc = sp_sha256_init(&c);
    if (rc) return rc;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = sp_malloc(CHUNK);
    if (!buf) {
        sp_sha256_free(c);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    for (uint64_t off = 0; off < h->hash_off && !rc;) {
        const size_t n = (size_t)SP_MIN((uint64_t)CHUNK, h->hash_off - off);
        if (!(rc = sp_file_read_at(f, off, buf, n))) rc = sp_sha256_update(c, buf, n);
        off += n;
    }
    uint8_t want[SP_SHA256_BYTES], got[SP_SHA256_BYTES];
    if (!rc) rc = sp_file_read_at(f, h->hash_off, want, sizeof want);
    if (!rc) {
        rc = sp_sha256_final(c, got);
        c = NULL;
    }
    sp_sha256_free(c);
    sp_free(buf);
    if (!rc && !sp_sha256_eq(got, want))
        rc = BAD("%s: session file checksum mismatch: the file is corrupt", sp_file_path(f));
    return rc;
}
