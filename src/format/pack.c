/*
 * pack.c -- model packages and patches: the shard cutting rule, the manifest
 * and patch layouts (pack.h has the byte-level spec), their parsers and
 * serializers, and reading one zstd frame.  Every length, count and offset
 * read from a file is checked before it is used; nothing here writes files
 * or runs threads (package/ does).
 */
#include "pack.h"

#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>

#define CONTENT_FIXED 72  /* "SPKC" .. header SHA-256 */
#define PACKAGE_FIXED 24  /* "SPKZ" .. reserved */
#define SHARD_REC 56
#define RANGE_REC 24
#define COMP_REC 40
#define PATCH_REC 16

/* ---- little-endian helpers ------------------------------------------------ */

static void put32(uint8_t *b, uint32_t x) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(x >> (8 * i));
}
static void put64(uint8_t *b, uint64_t x) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t get64(const uint8_t *b) {
    return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32;
}

void sp_pack_manifest_clear(struct sp_pack_manifest *m) {
    if (!m) return;
    sp_free(m->header);
    sp_free(m->shards);
    sp_free(m->ranges);
    memset(m, 0, sizeof *m);
}

/* ========================================================================
 * Cutting
 * ======================================================================== */

/* The layer a tensor belongs to: N of "blk.N.", else -1. */
static long layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    long n = 0;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9' && n < 100000000) n = n * 10 + (*p++ - '0');
    return *p == '.' ? n : -1;
}

struct piece {
    uint64_t start, size;
    uint32_t tensor;
    bool split;   /* a piece of a tensor larger than the shard size */
};

static int cmp_by_offset(const void *a, const void *b, void *ctx) {
    const struct sp_model_file *mf = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const uint64_t ox = mf->tensors[x].offset, oy = mf->tensors[y].offset;
    if (ox != oy) return ox < oy ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Tensor indices sorted by offset (ties by index): a stable insertion-free
 * merge sort is not worth it for a few thousand tensors; qsort_r with the
 * index as tie-break is deterministic. */
static uint32_t *sorted_tensors(const struct sp_model_file *mf) {
    uint32_t *ix = sp_malloc((size_t)(mf->n_tensors ? mf->n_tensors : 1) * sizeof *ix);
    if (!ix) return NULL;
    for (uint32_t i = 0; i < mf->n_tensors; i++) ix[i] = i;
    qsort_r(ix, mf->n_tensors, sizeof *ix, cmp_by_offset, (void *)mf);
    return ix;
}

sp_status sp_pack_cut(const struct sp_model_file *mf, uint64_t S, struct sp_pack_manifest *m) {
    memset(m, 0, sizeof *m);
    if (mf->kind != SP_FILE_GGUF) return sp_err(SP_E_INVALID, "%s: '%s' is not a GGUF file: only GGUF files pack", __func__, mf->path);
    if (S < SP_PACK_MIN_SHARD || S > SP_PACK_MAX_SHARD) {
        return sp_err(SP_E_INVALID, "%s: shard size %llu outside [%llu, %llu]", __func__, (unsigned long long)S,
                      (unsigned long long)SP_PACK_MIN_SHARD, (unsigned long long)SP_PACK_MAX_SHARD);
    }
    m->file_size = mf->file_size;
    m->header_size = mf->data_offset;
    m->shard_size = S;
    uint32_t *ix = sorted_tensors(mf);
    struct piece *pc = NULL;
    uint64_t *cuts = NULL;
    sp_status rc = SP_OK;
    if (!ix) goto nomem;

    /* pieces: each tensor, or the pieces of a split one */
    size_t n_pc = 0, cap_pc = (size_t)mf->n_tensors + 16;
    if (!(pc = sp_malloc(cap_pc * sizeof *pc))) goto nomem;
    for (uint32_t k = 0; k < mf->n_tensors; k++) {
        const struct sp_tensor_desc *t = &mf->tensors[ix[k]];
        if (t->size == 0) continue;
        uint64_t unit = t->size, step = t->size;
        if (t->size > S) {
            /* rows, or whole experts for 3-D tensors */
            const uint64_t outer = t->n_dims >= 3 ? (uint64_t)t->ne[2] * (uint64_t)t->ne[3]
                                                  : (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
            unit = outer && t->size % outer == 0 ? t->size / outer : t->size;
            step = unit * SP_MAX((uint64_t)1, S / unit);
        }
        for (uint64_t off = 0; off < t->size; off += step) {
            if (n_pc == cap_pc) {
                cap_pc *= 2;
                struct piece *np = sp_realloc(pc, cap_pc * sizeof *pc);
                if (!np) goto nomem;
                pc = np;
            }
            pc[n_pc++] = (struct piece){.start = t->offset + off, .size = SP_MIN(step, t->size - off), .tensor = ix[k],
                                        .split = step < t->size};
        }
    }
    /* shard starts */
    if (!(cuts = sp_malloc((n_pc + 1) * sizeof *cuts))) goto nomem;
    size_t n_cuts = 0;
    uint64_t acc = 0;
    long layer = -2;
    bool prev_split = false;
    for (size_t p = 0; p < n_pc; p++) {
        const long L = layer_of(mf->tensors[pc[p].tensor].name);
        const bool start = n_cuts == 0 || pc[p].split || prev_split || L != layer || acc + pc[p].size > S;
        if (start) {
            const uint64_t at = n_cuts == 0 ? m->header_size : pc[p].start;
            if (n_cuts == 0 || at > cuts[n_cuts - 1]) cuts[n_cuts++] = at; /* overlapping tensors: no empty shard */
            acc = 0;
        }
        acc += pc[p].size;
        layer = L;
        prev_split = pc[p].split;
    }
    if (n_cuts == 0 && m->file_size > m->header_size) cuts[n_cuts++] = m->header_size; /* data without tensors */
    if (n_cuts > UINT32_MAX / 2) goto nomem;
    m->n_shards = (uint32_t)n_cuts;
    if (n_cuts && !(m->shards = sp_calloc(n_cuts, sizeof *m->shards))) goto nomem;
    for (size_t s = 0; s < n_cuts; s++) {
        m->shards[s].raw_offset = cuts[s];
        m->shards[s].raw_size = (s + 1 < n_cuts ? cuts[s + 1] : m->file_size) - cuts[s];
        if (m->shards[s].raw_size > SP_PACK_MAX_SHARD) {
            rc = sp_err(SP_E_INVALID, "%s: '%s': shard %zu would hold %llu bytes (more than %llu): a row or an expert "
                        "of tensor '%s' is too large", __func__, mf->path, s, (unsigned long long)m->shards[s].raw_size,
                        (unsigned long long)SP_PACK_MAX_SHARD, n_pc ? mf->tensors[pc[0].tensor].name : "?");
            goto fail;
        }
    }
    /* ranges: each tensor's bytes intersected with the shards it overlaps */
    size_t cap_r = n_pc + n_cuts + 16, n_r = 0;
    if (!(m->ranges = sp_malloc(cap_r * sizeof *m->ranges))) goto nomem;
    for (size_t s = 0; s < n_cuts; s++) {
        struct sp_pack_shard *sh = &m->shards[s];
        const uint64_t lo = sh->raw_offset, hi = lo + sh->raw_size;
        sh->first_range = (uint32_t)n_r;
        for (uint32_t k = 0; k < mf->n_tensors; k++) {
            const struct sp_tensor_desc *t = &mf->tensors[ix[k]];
            if (t->size == 0 || t->offset >= hi) continue;
            if (t->offset + t->size <= lo) continue;
            const uint64_t a = SP_MAX(lo, t->offset), b = SP_MIN(hi, t->offset + t->size);
            if (n_r == cap_r) {
                cap_r *= 2;
                struct sp_pack_range *nr = sp_realloc(m->ranges, cap_r * sizeof *nr);
                if (!nr) goto nomem;
                m->ranges = nr;
            }
            m->ranges[n_r++] = (struct sp_pack_range){.tensor = ix[k], .offset = a - t->offset, .length = b - a};
        }
        if (n_r - sh->first_range > UINT32_MAX) goto nomem;
        sh->n_ranges = (uint32_t)(n_r - sh->first_range);
    }
    if (n_r > UINT32_MAX) goto nomem;
    m->n_ranges = (uint32_t)n_r;
    sp_free(ix);
    sp_free(pc);
    sp_free(cuts);
    return SP_OK;
nomem:
    rc = sp_err(SP_E_NOMEM, "%s: out of memory cutting '%s'", __func__, mf->path);
fail:
    sp_free(ix);
    sp_free(pc);
    sp_free(cuts);
    sp_pack_manifest_clear(m);
    return rc;
}

/* ========================================================================
 * Manifest bytes
 * ======================================================================== */

static size_t content_len(const struct sp_pack_manifest *m) {
    return CONTENT_FIXED + (size_t)m->header_size + (size_t)m->n_shards * SHARD_REC + (size_t)m->n_ranges * RANGE_REC;
}

static size_t package_len(const struct sp_pack_manifest *m) {
    return PACKAGE_FIXED + (size_t)m->n_shards * COMP_REC;
}

static void write_content(const struct sp_pack_manifest *m, uint8_t *b) {
    memcpy(b, "SPKC", 4);
    put32(b + 4, SP_PACK_VERSION);
    put64(b + 8, m->file_size);
    put64(b + 16, m->header_size);
    put64(b + 24, m->shard_size);
    put32(b + 32, m->n_shards);
    put32(b + 36, m->n_ranges);
    memcpy(b + 40, m->header_sha, SP_SHA256_BYTES);
    uint8_t *p = b + CONTENT_FIXED;
    if (m->header_size) memcpy(p, m->header, (size_t)m->header_size);
    p += m->header_size;
    for (uint32_t i = 0; i < m->n_shards; i++, p += SHARD_REC) {
        const struct sp_pack_shard *s = &m->shards[i];
        put64(p, s->raw_offset);
        put64(p + 8, s->raw_size);
        put32(p + 16, s->first_range);
        put32(p + 20, s->n_ranges);
        memcpy(p + 24, s->raw_sha, SP_SHA256_BYTES);
    }
    for (uint32_t i = 0; i < m->n_ranges; i++, p += RANGE_REC) {
        const struct sp_pack_range *r = &m->ranges[i];
        put32(p, r->tensor);
        put32(p + 4, 0);
        put64(p + 8, r->offset);
        put64(p + 16, r->length);
    }
}

static void write_package(const struct sp_pack_manifest *m, uint8_t *b) {
    memcpy(b, "SPKZ", 4);
    put32(b + 4, SP_PACK_VERSION);
    put32(b + 8, (uint32_t)m->level);
    put32(b + 12, m->zstd_version);
    put32(b + 16, m->n_shards);
    put32(b + 20, 0);
    uint8_t *p = b + PACKAGE_FIXED;
    for (uint32_t i = 0; i < m->n_shards; i++, p += COMP_REC) {
        put64(p, m->shards[i].comp_size);
        memcpy(p + 8, m->shards[i].comp_sha, SP_SHA256_BYTES);
    }
}

sp_status sp_pack_content_bytes(const struct sp_pack_manifest *m, uint8_t **out, size_t *n) {
    *out = NULL;
    const size_t len = content_len(m);
    uint8_t *b = sp_malloc(len);
    if (!b) return sp_err(SP_E_NOMEM, "%s: out of memory (%zu bytes)", __func__, len);
    write_content(m, b);
    *out = b;
    *n = len;
    return SP_OK;
}

sp_status sp_pack_manifest_bytes(const struct sp_pack_manifest *m, uint8_t **out, size_t *n) {
    *out = NULL;
    if (!m->has_package) return sp_err(SP_E_INVALID, "%s: the manifest has no package section", __func__);
    const size_t lc = content_len(m), len = lc + package_len(m);
    uint8_t *b = sp_malloc(len);
    if (!b) return sp_err(SP_E_NOMEM, "%s: out of memory (%zu bytes)", __func__, len);
    write_content(m, b);
    write_package(m, b + lc);
    *out = b;
    *n = len;
    return SP_OK;
}

sp_status sp_pack_content_id(struct sp_pack_manifest *m) {
    uint8_t *b;
    size_t n;
    sp_status rc = sp_pack_content_bytes(m, &b, &n);
    if (rc) return rc;
    rc = sp_sha256(b, n, m->content_id);
    sp_free(b);
    return rc;
}

/* ---- parsing -------------------------------------------------------------- */

#define BAD(...) (rc = sp_err(SP_E_FORMAT, __VA_ARGS__), (void)0)

sp_status sp_pack_manifest_parse(const uint8_t *b, size_t n, bool with_package, const char *where,
                                 struct sp_pack_manifest *m) {
    sp_status rc = SP_OK;
    memset(m, 0, sizeof *m);
    if (n < CONTENT_FIXED) {
        return sp_err(SP_E_FORMAT, "%s: content section truncated (%zu bytes, the fixed part alone is %d)", where, n,
                      CONTENT_FIXED);
    }
    if (memcmp(b, "SPKC", 4) != 0) return sp_err(SP_E_FORMAT, "%s: bad content section magic (expected \"SPKC\")", where);
    if (get32(b + 4) != SP_PACK_VERSION) {
        return sp_err(SP_E_UNSUPPORTED, "%s: content section version %u (this Sparrow reads %u)", where, get32(b + 4),
                      SP_PACK_VERSION);
    }
    m->file_size = get64(b + 8);
    m->header_size = get64(b + 16);
    m->shard_size = get64(b + 24);
    m->n_shards = get32(b + 32);
    m->n_ranges = get32(b + 36);
    memcpy(m->header_sha, b + 40, SP_SHA256_BYTES);
    const uint64_t left = n - CONTENT_FIXED;
    if (m->header_size > left || m->header_size > m->file_size) {
        rc = sp_err(SP_E_FORMAT, "%s: field header_size %llu exceeds the %llu bytes left (or the file size %llu)", where,
                    (unsigned long long)m->header_size, (unsigned long long)left, (unsigned long long)m->file_size);
        goto fail;
    }
    if (m->shard_size < SP_PACK_MIN_SHARD || m->shard_size > SP_PACK_MAX_SHARD) {
        BAD("%s: field shard_size %llu outside [%llu, %llu]", where, (unsigned long long)m->shard_size,
            (unsigned long long)SP_PACK_MIN_SHARD, (unsigned long long)SP_PACK_MAX_SHARD);
        goto fail;
    }
    const uint64_t tables = left - m->header_size;
    if ((uint64_t)m->n_shards > tables / SHARD_REC ||
        (uint64_t)m->n_ranges > (tables - (uint64_t)m->n_shards * SHARD_REC) / RANGE_REC) {
        BAD("%s: fields n_shards %u / n_ranges %u need more than the %llu bytes left", where, m->n_shards, m->n_ranges,
            (unsigned long long)tables);
        goto fail;
    }
    const size_t clen = content_len(m);
    const size_t plen = with_package ? PACKAGE_FIXED + (size_t)m->n_shards * COMP_REC : 0;
    if (clen + plen != n) {
        BAD("%s: %zu bytes where the fields say %zu (content %zu + package %zu)", where, n, clen + plen, clen, plen);
        goto fail;
    }
    const uint8_t *p = b + CONTENT_FIXED;
    if (!(m->header = sp_malloc(m->header_size ? (size_t)m->header_size : 1)) ||
        (m->n_shards && !(m->shards = sp_calloc(m->n_shards, sizeof *m->shards))) ||
        (m->n_ranges && !(m->ranges = sp_calloc(m->n_ranges, sizeof *m->ranges)))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory for the manifest", where);
        goto fail;
    }
    memcpy(m->header, p, (size_t)m->header_size);
    uint8_t d[SP_SHA256_BYTES];
    if ((rc = sp_sha256(m->header, (size_t)m->header_size, d))) goto fail;
    if (!sp_sha256_eq(d, m->header_sha)) {
        BAD("%s: the model header's bytes do not match field header_sha256: the manifest is damaged", where);
        goto fail;
    }
    p += m->header_size;
    uint64_t at = m->header_size;
    uint32_t next_range = 0;
    for (uint32_t i = 0; i < m->n_shards; i++, p += SHARD_REC) {
        struct sp_pack_shard *s = &m->shards[i];
        s->raw_offset = get64(p);
        s->raw_size = get64(p + 8);
        s->first_range = get32(p + 16);
        s->n_ranges = get32(p + 20);
        memcpy(s->raw_sha, p + 24, SP_SHA256_BYTES);
        if (s->raw_offset != at || s->raw_size == 0 || s->raw_size > SP_PACK_MAX_SHARD ||
            s->raw_size > m->file_size - at) {
            BAD("%s: shard %u: offset %llu size %llu does not continue the shards before it (at %llu, file size %llu, "
                "at most %llu per shard)", where, i, (unsigned long long)s->raw_offset, (unsigned long long)s->raw_size,
                (unsigned long long)at, (unsigned long long)m->file_size, (unsigned long long)SP_PACK_MAX_SHARD);
            goto fail;
        }
        if (s->first_range != next_range || s->n_ranges > m->n_ranges - next_range) {
            BAD("%s: shard %u: ranges [%u, +%u) do not follow the previous shard's (next is %u of %u)", where, i,
                s->first_range, s->n_ranges, next_range, m->n_ranges);
            goto fail;
        }
        next_range += s->n_ranges;
        at += s->raw_size;
    }
    if (at != m->file_size || next_range != m->n_ranges) {
        BAD("%s: the shards end at %llu with %u ranges, the file at %llu with %u", where, (unsigned long long)at,
            next_range, (unsigned long long)m->file_size, m->n_ranges);
        goto fail;
    }
    for (uint32_t i = 0; i < m->n_ranges; i++, p += RANGE_REC) {
        struct sp_pack_range *r = &m->ranges[i];
        r->tensor = get32(p);
        r->offset = get64(p + 8);
        r->length = get64(p + 16);
        if (get32(p + 4) != 0 || r->length == 0 || r->offset + r->length < r->offset) {
            BAD("%s: range %u (tensor %u): reserved field set, empty or overflowing [%llu, +%llu)", where, i, r->tensor,
                (unsigned long long)r->offset, (unsigned long long)r->length);
            goto fail;
        }
    }
    /* ranges inside their shard: lengths add up to at most the shard's size */
    for (uint32_t i = 0; i < m->n_shards; i++) {
        uint64_t sum = 0;
        for (uint32_t k = 0; k < m->shards[i].n_ranges; k++) sum += m->ranges[m->shards[i].first_range + k].length;
        if (sum > m->shards[i].raw_size) {
            BAD("%s: shard %u: its tensor ranges hold %llu bytes, more than its %llu", where, i, (unsigned long long)sum,
                (unsigned long long)m->shards[i].raw_size);
            goto fail;
        }
    }
    if ((rc = sp_sha256(b, clen, m->content_id))) goto fail;
    if (!with_package) return SP_OK;

    p = b + clen;
    if (memcmp(p, "SPKZ", 4) != 0) {
        BAD("%s: bad package section magic (expected \"SPKZ\")", where);
        goto fail;
    }
    if (get32(p + 4) != SP_PACK_VERSION || get32(p + 16) != m->n_shards || get32(p + 20) != 0) {
        BAD("%s: package section: version %u, n_shards %u (content says %u), reserved %u", where, get32(p + 4),
            get32(p + 16), m->n_shards, get32(p + 20));
        goto fail;
    }
    m->level = (int32_t)get32(p + 8);
    m->zstd_version = get32(p + 12);
    m->has_package = true;
    p += PACKAGE_FIXED;
    for (uint32_t i = 0; i < m->n_shards; i++, p += COMP_REC) {
        m->shards[i].comp_size = get64(p);
        memcpy(m->shards[i].comp_sha, p + 8, SP_SHA256_BYTES);
        if (m->shards[i].comp_size == 0 || m->shards[i].comp_size > ZSTD_compressBound(m->shards[i].raw_size)) {
            BAD("%s: shard %u: compressed size %llu impossible for %llu raw bytes", where, i,
                (unsigned long long)m->shards[i].comp_size, (unsigned long long)m->shards[i].raw_size);
            goto fail;
        }
    }
    return SP_OK;
fail:
    sp_pack_manifest_clear(m);
    return rc;
}

/* ---- layout check ---------------------------------------------------------- */

sp_status sp_pack_check_layout(const struct sp_pack_manifest *m, const char *where, struct sp_model_file **out) {
    *out = NULL;
    struct sp_file *f = NULL;
    struct sp_model_file *mf = sp_calloc(1, sizeof *mf);
    struct sp_pack_manifest cut = {0};
    sp_status rc;
    if (!mf || !(mf->path = sp_strdup(where))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    if ((rc = sp_file_from_prefix(m->header, (size_t)m->header_size, m->file_size, where, &f))) goto done;
    if ((rc = sp_gguf_read(f, mf))) goto done;
    if (mf->data_offset != m->header_size) {
        BAD("%s: field header_size %llu, but the GGUF header's data section starts at %llu", where,
            (unsigned long long)m->header_size, (unsigned long long)mf->data_offset);
        goto done;
    }
    if ((rc = sp_pack_cut(mf, m->shard_size, &cut))) {
        rc = sp_err(SP_E_FORMAT, "%s: the model header cannot be cut into shards (%s)", where, sp_last_error());
        goto done;
    }
    if (cut.n_shards != m->n_shards || cut.n_ranges != m->n_ranges) {
        BAD("%s: %u shards with %u tensor ranges, but the tensor directory cuts into %u with %u", where, m->n_shards,
            m->n_ranges, cut.n_shards, cut.n_ranges);
        goto done;
    }
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct sp_pack_shard *a = &m->shards[i], *b = &cut.shards[i];
        bool same = a->raw_offset == b->raw_offset && a->raw_size == b->raw_size && a->first_range == b->first_range &&
                    a->n_ranges == b->n_ranges;
        for (uint32_t k = 0; same && k < a->n_ranges; k++) {
            const struct sp_pack_range *x = &m->ranges[a->first_range + k], *y = &cut.ranges[a->first_range + k];
            same = x->tensor == y->tensor && x->offset == y->offset && x->length == y->length;
        }
        if (!same) {
            char name[160];
            sp_pack_shard_name(&cut, mf, i, name, sizeof name);
            BAD("%s: %s: its offset, size or tensor ranges differ from the tensor directory's", where, name);
            goto done;
        }
    }
    rc = SP_OK;
    *out = mf;
    mf = NULL;
done:
    sp_pack_manifest_clear(&cut);
    sp_file_close(f);
    sp_model_file_free(mf);
    return rc;
}

sp_status sp_pack_gguf_dir(struct sp_file *f, struct sp_model_file **out) {
    *out = NULL;
    uint8_t magic[8] = {0};
    sp_status rc = sp_file_read_at(f, 0, magic, SP_MIN((uint64_t)8, sp_file_size(f)));
    if (rc) return rc;
    if (sp_pack_is_package(magic, 8)) return sp_err(SP_E_INVALID, "'%s' is a package already", sp_file_path(f));
    if (memcmp(magic, "GGUF", 4) != 0) {
        return sp_err(SP_E_INVALID, "'%s' is not a GGUF file (only GGUF files pack; convert a llama2.c checkpoint first)",
                      sp_file_path(f));
    }
    struct sp_model_file *mf = sp_calloc(1, sizeof *mf);
    if (!mf || !(mf->path = sp_strdup(sp_file_path(f)))) {
        sp_free(mf);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    if ((rc = sp_gguf_read(f, mf))) {
        sp_model_file_free(mf);
        return rc;
    }
    *out = mf;
    return SP_OK;
}

void sp_pack_shard_name(const struct sp_pack_manifest *m, const struct sp_model_file *dir, uint32_t i, char *buf,
                        size_t cap) {
    if (i >= m->n_shards) {
        snprintf(buf, cap, "shard %u", i);
        return;
    }
    const struct sp_pack_shard *s = &m->shards[i];
    if (!dir || s->n_ranges == 0 || m->ranges[s->first_range].tensor >= dir->n_tensors) {
        snprintf(buf, cap, "shard %u (file bytes %llu..%llu)", i, (unsigned long long)s->raw_offset,
                 (unsigned long long)(s->raw_offset + s->raw_size));
        return;
    }
    const struct sp_pack_range *r = &m->ranges[s->first_range];
    char more[48] = "";
    if (s->n_ranges > 1) snprintf(more, sizeof more, " and %u more tensor%s", s->n_ranges - 1, s->n_ranges > 2 ? "s" : "");
    snprintf(buf, cap, "shard %u (%.80s bytes %llu..%llu%s)", i, dir->tensors[r->tensor].name,
             (unsigned long long)r->offset, (unsigned long long)(r->offset + r->length), more);
}

/* ========================================================================
 * Package files
 * ======================================================================== */

bool sp_pack_is_package(const uint8_t *b, size_t n) {
    return n >= 8 && memcmp(b, SP_PACK_MAGIC, 8) == 0;
}

bool sp_pack_is_patch(const uint8_t *b, size_t n) {
    return n >= 8 && memcmp(b, SP_PATCH_MAGIC, 8) == 0;
}

void sp_pack_header_write(const struct sp_pack_file_header *h, uint8_t out[SP_PACK_HEADER_BYTES]) {
    memset(out, 0, SP_PACK_HEADER_BYTES);
    memcpy(out, SP_PACK_MAGIC, 8);
    put32(out + 8, h->version);
    put32(out + 12, h->flags);
    put64(out + 16, h->manifest_offset);
    put64(out + 24, h->manifest_size);
    memcpy(out + 32, h->manifest_sha, SP_SHA256_BYTES);
}

sp_status sp_pack_decompress(void *dctx, const void *comp, size_t comp_n, void *dst, size_t raw_n, const void *prefix,
                             size_t prefix_n, const char *what) {
    ZSTD_DCtx *d = dctx;
    const unsigned long long fsz = ZSTD_getFrameContentSize(comp, comp_n);
    if (fsz != (unsigned long long)raw_n) {
        return sp_err(SP_E_FORMAT, "%s: the zstd frame %s (expected %zu bytes)", what,
                      fsz == ZSTD_CONTENTSIZE_ERROR     ? "is not a zstd frame"
                      : fsz == ZSTD_CONTENTSIZE_UNKNOWN ? "does not state its size"
                                                        : "holds a different number of bytes",
                      raw_n);
    }
    const size_t fn = ZSTD_findFrameCompressedSize(comp, comp_n);
    if (ZSTD_isError(fn) || fn != comp_n) {
        return sp_err(SP_E_FORMAT, "%s: the zstd frame is truncated or followed by other bytes", what);
    }
    ZSTD_DCtx_reset(d, ZSTD_reset_session_and_parameters);
    size_t r = ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, 31);
    if (!ZSTD_isError(r) && prefix) r = ZSTD_DCtx_refPrefix(d, prefix, prefix_n);
    if (!ZSTD_isError(r)) r = ZSTD_decompressDCtx(d, dst, raw_n, comp, comp_n);
    if (ZSTD_isError(r)) return sp_err(SP_E_FORMAT, "%s: zstd: %s", what, ZSTD_getErrorName(r));
    if (r != raw_n) return sp_err(SP_E_FORMAT, "%s: the zstd frame gave %zu bytes, expected %zu", what, r, raw_n);
    return SP_OK;
}

sp_status sp_pack_read_manifest(struct sp_file *f, struct sp_pack_manifest *m, struct sp_model_file **dir) {
    memset(m, 0, sizeof *m);
    if (dir) *dir = NULL;
    const char *path = sp_file_path(f);
    const uint64_t size = sp_file_size(f);
    uint8_t h[SP_PACK_HEADER_BYTES];
    uint8_t *z = NULL, *raw = NULL;
    ZSTD_DCtx *d = NULL;
    struct sp_model_file *mf = NULL;
    char where[512];
    sp_status rc;
    if (size < SP_PACK_HEADER_BYTES) {
        return sp_err(SP_E_FORMAT, "'%s': %llu bytes: too short for a package header (%d bytes)", path,
                      (unsigned long long)size, SP_PACK_HEADER_BYTES);
    }
    if ((rc = sp_file_read_at(f, 0, h, sizeof h))) return rc;
    if (!sp_pack_is_package(h, sizeof h)) return sp_err(SP_E_FORMAT, "'%s' is not a Sparrow package (bad magic)", path);
    const uint32_t version = get32(h + 8), flags = get32(h + 12);
    const uint64_t moff = get64(h + 16), mlen = get64(h + 24);
    if (version != SP_PACK_VERSION) {
        return sp_err(SP_E_UNSUPPORTED, "'%s': package version %u (this Sparrow reads %u)", path, version, SP_PACK_VERSION);
    }
    if (flags != 0) return sp_err(SP_E_UNSUPPORTED, "'%s': field flags %#x: unknown package features", path, flags);
    if (moff < SP_PACK_HEADER_BYTES || mlen == 0 || moff > size || mlen != size - moff || mlen > SP_PACK_MAX_MANIFEST) {
        return sp_err(SP_E_FORMAT, "'%s': field manifest_offset %llu / manifest_size %llu do not end the %llu-byte file "
                      "(truncated or extended?)", path, (unsigned long long)moff, (unsigned long long)mlen,
                      (unsigned long long)size);
    }
    if (!(z = sp_malloc((size_t)mlen))) {
        rc = sp_err(SP_E_NOMEM, "'%s': out of memory for the manifest", path);
        goto done;
    }
    if ((rc = sp_file_read_at(f, moff, z, (size_t)mlen))) goto done;
    uint8_t dg[SP_SHA256_BYTES];
    if ((rc = sp_sha256(z, (size_t)mlen, dg))) goto done;
    if (!sp_sha256_eq(dg, h + 32)) {
        rc = sp_err(SP_E_FORMAT, "'%s': the manifest does not match field manifest_sha256: the package is damaged", path);
        goto done;
    }
    const unsigned long long rn = ZSTD_getFrameContentSize(z, (size_t)mlen);
    if (rn == ZSTD_CONTENTSIZE_ERROR || rn == ZSTD_CONTENTSIZE_UNKNOWN || rn > SP_PACK_MAX_MANIFEST || rn == 0) {
        rc = sp_err(SP_E_FORMAT, "'%s': the manifest frame states no usable size", path);
        goto done;
    }
    if (!(raw = sp_malloc((size_t)rn)) || !(d = ZSTD_createDCtx())) {
        rc = sp_err(SP_E_NOMEM, "'%s': out of memory for the manifest", path);
        goto done;
    }
    snprintf(where, sizeof where, "'%s': manifest", path);
    if ((rc = sp_pack_decompress(d, z, (size_t)mlen, raw, (size_t)rn, NULL, 0, where))) goto done;
    if ((rc = sp_pack_manifest_parse(raw, (size_t)rn, true, where, m))) goto done;
    uint64_t at = SP_PACK_HEADER_BYTES;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        m->shards[i].comp_offset = at;
        if (m->shards[i].comp_size > moff - at) {
            rc = sp_err(SP_E_FORMAT, "%s: shard %u: its frame (%llu bytes at %llu) runs past the manifest at %llu", where, i,
                        (unsigned long long)m->shards[i].comp_size, (unsigned long long)at, (unsigned long long)moff);
            goto done;
        }
        at += m->shards[i].comp_size;
    }
    if (at != moff) {
        rc = sp_err(SP_E_FORMAT, "%s: the shards' frames end at %llu, the manifest starts at %llu", where,
                    (unsigned long long)at, (unsigned long long)moff);
        goto done;
    }
    if ((rc = sp_pack_check_layout(m, path, &mf))) goto done;
    if (dir) {
        *dir = mf;
        mf = NULL;
    }
    rc = SP_OK;
done:
    if (rc) sp_pack_manifest_clear(m);
    sp_model_file_free(mf);
    ZSTD_freeDCtx(d);
    sp_free(z);
    sp_free(raw);
    return rc;
}

/* ========================================================================
 * Patches
 * ======================================================================== */

void sp_patch_header_write(const struct sp_patch_header *h, uint8_t out[SP_PATCH_HEADER_BYTES]) {
    memset(out, 0, SP_PATCH_HEADER_BYTES);
    memcpy(out, SP_PATCH_MAGIC, 8);
    put32(out + 8, SP_PACK_VERSION);
    put32(out + 12, 0);
    memcpy(out + 16, h->old_id, 32);
    memcpy(out + 48, h->new_id, 32);
    memcpy(out + 80, h->old_header_sha, 32);
    memcpy(out + 112, h->table_sha, 32);
    put64(out + 144, h->old_shard_size);
    put32(out + 152, h->old_n_shards);
    put32(out + 156, h->n_records);
    put64(out + 160, h->content_size);
    put64(out + 168, h->content_zsize);
    put64(out + 176, h->payload_total);
    put64(out + 184, 0);
}

sp_status sp_patch_header_parse(const uint8_t *b, size_t n, uint64_t file_size, const char *where,
                                struct sp_patch_header *h) {
    memset(h, 0, sizeof *h);
    if (n < SP_PATCH_HEADER_BYTES || file_size < SP_PATCH_HEADER_BYTES) {
        return sp_err(SP_E_FORMAT, "%s: too short for a patch header (%d bytes)", where, SP_PATCH_HEADER_BYTES);
    }
    if (!sp_pack_is_patch(b, n)) return sp_err(SP_E_FORMAT, "%s is not a Sparrow patch (bad magic)", where);
    if (get32(b + 8) != SP_PACK_VERSION || get32(b + 12) != 0) {
        return sp_err(SP_E_UNSUPPORTED, "%s: patch version %u flags %#x (this Sparrow reads version %u, no flags)", where,
                      get32(b + 8), get32(b + 12), SP_PACK_VERSION);
    }
    memcpy(h->old_id, b + 16, 32);
    memcpy(h->new_id, b + 48, 32);
    memcpy(h->old_header_sha, b + 80, 32);
    memcpy(h->table_sha, b + 112, 32);
    h->old_shard_size = get64(b + 144);
    h->old_n_shards = get32(b + 152);
    h->n_records = get32(b + 156);
    h->content_size = get64(b + 160);
    h->content_zsize = get64(b + 168);
    h->payload_total = get64(b + 176);
    if (get64(b + 184) != 0) return sp_err(SP_E_FORMAT, "%s: reserved header field is not zero", where);
    if (h->old_shard_size < SP_PACK_MIN_SHARD || h->old_shard_size > SP_PACK_MAX_SHARD) {
        return sp_err(SP_E_FORMAT, "%s: field old_shard_size %llu out of range", where, (unsigned long long)h->old_shard_size);
    }
    if (h->content_size < CONTENT_FIXED || h->content_size > SP_PACK_MAX_MANIFEST || h->content_zsize == 0 ||
        h->content_zsize > file_size) {
        return sp_err(SP_E_FORMAT, "%s: fields content_size %llu / content_zsize %llu out of range", where,
                      (unsigned long long)h->content_size, (unsigned long long)h->content_zsize);
    }
    h->content_offset = SP_PATCH_HEADER_BYTES;
    uint64_t t_end, end;
    h->table_offset = h->content_offset + h->content_zsize;
    if (sp_add_overflow_u64(h->table_offset, (uint64_t)h->n_records * PATCH_REC, &t_end) ||
        sp_add_overflow_u64(t_end, h->payload_total, &end) || end != file_size) {
        return sp_err(SP_E_FORMAT, "%s: the sections (content frame %llu, %u records, payloads %llu bytes) do not end at the "
                      "file's %llu bytes: truncated or extended", where, (unsigned long long)h->content_zsize,
                      h->n_records, (unsigned long long)h->payload_total, (unsigned long long)file_size);
    }
    h->payload_offset = t_end;
    return SP_OK;
}

void sp_patch_table_write(const struct sp_patch_record *recs, uint32_t n, uint8_t *out) {
    for (uint32_t i = 0; i < n; i++, out += PATCH_REC) {
        put32(out, recs[i].kind);
        put32(out + 4, recs[i].old_shard);
        put64(out + 8, recs[i].size);
    }
}

sp_status sp_patch_table_parse(const uint8_t *b, size_t n, const struct sp_patch_header *h, const char *where,
                               struct sp_patch_record *recs) {
    if ((uint64_t)n != (uint64_t)h->n_records * PATCH_REC) {
        return sp_err(SP_E_FORMAT, "%s: record table of %zu bytes for %u records", where, n, h->n_records);
    }
    uint64_t at = h->payload_offset, total = 0;
    for (uint32_t i = 0; i < h->n_records; i++, b += PATCH_REC) {
        struct sp_patch_record *r = &recs[i];
        r->kind = get32(b);
        r->old_shard = get32(b + 4);
        r->size = get64(b + 8);
        r->offset = at;
        bool ok;
        switch (r->kind) {
        case SP_PATCH_REF: ok = r->size == 0 && r->old_shard < h->old_n_shards; break;
        case SP_PATCH_WHOLE: ok = r->size > 0 && r->old_shard == SP_PATCH_NO_SHARD; break;
        case SP_PATCH_DELTA: ok = r->size > 0 && r->old_shard < h->old_n_shards; break;
        default: ok = false;
        }
        if (!ok || r->size > h->payload_total - total) {
            return sp_err(SP_E_FORMAT, "%s: record %u (new shard %u): kind %u, old shard %u (of %u), %llu payload bytes: "
                          "invalid", where, i, i, r->kind, r->old_shard, h->old_n_shards, (unsigned long long)r->size);
        }
        total += r->size;
        at += r->size;
    }
    if (total != h->payload_total) {
        return sp_err(SP_E_FORMAT, "%s: records hold %llu payload bytes, field payload_bytes says %llu", where,
                      (unsigned long long)total, (unsigned long long)h->payload_total);
    }
    return SP_OK;
}

sp_status sp_patch_read(struct sp_file *f, const uint8_t *old_header, size_t old_header_n, struct sp_patch_header *h,
                        struct sp_patch_record **recs, struct sp_pack_manifest *content) {
    *recs = NULL;
    memset(content, 0, sizeof *content);
    const char *path = sp_file_path(f);
    char where[512];
    snprintf(where, sizeof where, "patch '%s'", path);
    uint8_t hb[SP_PATCH_HEADER_BYTES];
    uint8_t *meta = NULL, *raw = NULL;
    ZSTD_DCtx *d = NULL;
    sp_status rc;
    if (sp_file_size(f) < SP_PATCH_HEADER_BYTES) {
        return sp_err(SP_E_FORMAT, "%s: %llu bytes, too short for a patch", where, (unsigned long long)sp_file_size(f));
    }
    if ((rc = sp_file_read_at(f, 0, hb, sizeof hb))) return rc;
    if ((rc = sp_patch_header_parse(hb, sizeof hb, sp_file_size(f), where, h))) return rc;
    uint8_t dg[SP_SHA256_BYTES];
    if ((rc = sp_sha256(old_header, old_header_n, dg))) return rc;
    if (!sp_sha256_eq(dg, h->old_header_sha)) {
        char a[SP_SHA256_HEX], b[SP_SHA256_HEX];
        sp_sha256_hex(h->old_header_sha, a);
        sp_sha256_hex(dg, b);
        return sp_err(SP_E_INVALID, "%s is for another model: field old_header_sha256 is %.16s..., this model's header "
                      "hashes to %.16s...", where, a, b);
    }
    const size_t mlen = (size_t)(h->payload_offset - h->content_offset);
    if (!(meta = sp_malloc(mlen)) || !(d = ZSTD_createDCtx()) ||
        !(*recs = sp_calloc(h->n_records ? h->n_records : 1, sizeof **recs))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", where);
        goto fail;
    }
    if ((rc = sp_file_read_at(f, h->content_offset, meta, mlen))) goto fail;
    if ((rc = sp_sha256(meta, mlen, dg))) goto fail;
    if (!sp_sha256_eq(dg, h->table_sha)) {
        rc = sp_err(SP_E_FORMAT, "%s: the manifest frame and record table do not match field table_sha256: the patch is "
                    "damaged", where);
        goto fail;
    }
    if ((rc = sp_patch_table_parse(meta + h->content_zsize, mlen - (size_t)h->content_zsize, h, where, *recs))) goto fail;
    /* the frame must state the size the header gives before that much is allocated */
    if (ZSTD_getFrameContentSize(meta, (size_t)h->content_zsize) != (unsigned long long)h->content_size) {
        rc = sp_err(SP_E_FORMAT, "%s: the new manifest's frame does not hold field content_size = %llu bytes", where,
                    (unsigned long long)h->content_size);
        goto fail;
    }
    if (!(raw = sp_malloc((size_t)h->content_size))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", where);
        goto fail;
    }
    char w2[560];
    snprintf(w2, sizeof w2, "%s: new manifest", where);
    if ((rc = sp_pack_decompress(d, meta, (size_t)h->content_zsize, raw, (size_t)h->content_size, old_header,
                                 old_header_n, w2)) ||
        (rc = sp_pack_manifest_parse(raw, (size_t)h->content_size, false, w2, content))) {
        goto fail;
    }
    if (!sp_sha256_eq(content->content_id, h->new_id) || content->n_shards != h->n_records) {
        rc = sp_err(SP_E_FORMAT, "%s: the new manifest's hash or shard count (%u) is not the header's (%u records)", w2,
                    content->n_shards, h->n_records);
        goto fail;
    }
    rc = SP_OK;
    goto done;
fail:
    sp_free(*recs);
    *recs = NULL;
    sp_pack_manifest_clear(content);
done:
    ZSTD_freeDCtx(d);
    sp_free(meta);
    sp_free(raw);
    return rc;
}
