/*
 * gguf.c -- the GGUF container, v2 and v3: a reader that turns untrusted
 * bytes into metadata values and a tensor directory, and a streaming writer
 * that always writes v3.  The layout is summarised in gguf.h; the reference
 * is ggml's docs/gguf.md.
 *
 * It does not interpret metadata beyond general.alignment (model_file.c maps
 * keys to hyper-parameters and vocabulary), reads no tensor data, and keeps
 * no pointer into the file: every string is copied to the heap.
 */
#include "gguf.h"

#include "core/file.h"

#include "quant/native.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_HEADER_BYTES 24       /* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_DEPTH 8           /* nesting of arrays inside arrays */
#define GGUF_MAX_NAME 64           /* ggml's GGML_MAX_NAME, NUL included (writer only) */
/* Smallest possible encodings, used to refuse absurd counts before allocating:
 * a kv is a string (8-byte length + >= 1 byte) + u32 type + >= 1 byte of value;
 * a tensor is a name (8 + >= 1) + u32 n_dims + >= 1 u64 dim + u32 type + u64 offset. */
#define GGUF_KV_MIN_BYTES 14
#define GGUF_TENSOR_MIN_BYTES 33
#define RD_WINDOW (64 * 1024)

static const char *const meta_type_names[SP_META_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* Smallest encoded size of one value of type t (array: elem type + count). */
static uint64_t meta_min_bytes(enum sp_meta_type t) {
    static const uint8_t sizes[SP_META_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};
    return sizes[t];
}

static bool is_pow2(uint64_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

/* Round x up to a multiple of a (a power of two); 1 on overflow. */
static int align_up(uint64_t x, uint64_t a, uint64_t *out) {
    uint64_t t;
    if (sp_add_overflow_u64(x, a - 1, &t)) return 1;
    *out = t & ~(a - 1);
    return 0;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | b[i];
    return x;
}

static uint32_t le32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* ---- a set of names, for duplicate keys and tensor names ---------------- */

struct nameset {
    const char **slots; /* (cap) borrowed pointers, NULL = empty */
    size_t cap;         /* power of two */
    size_t n;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static sp_status nameset_grow(struct nameset *s) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    const char **slots = sp_calloc(cap, sizeof(*slots));
    if (!slots) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slots[i]) continue;
        size_t j = hash_str(s->slots[i]) & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = s->slots[i];
    }
    sp_free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return SP_OK;
}

/* Insert name (borrowed; must outlive the set).  *dup is set when an equal
 * name is already present (nothing is inserted then). */
static sp_status nameset_add(struct nameset *s, const char *name, bool *dup) {
    *dup = false;
    if ((s->n + 1) * 2 > s->cap) {
        sp_status rc = nameset_grow(s);
        if (rc) return rc;
    }
    size_t j = hash_str(name) & (s->cap - 1);
    while (s->slots[j]) {
        if (strcmp(s->slots[j], name) == 0) {
            *dup = true;
            return SP_OK;
        }
        j = (j + 1) & (s->cap - 1);
    }
    s->slots[j] = name;
    s->n++;
    return SP_OK;
}

static void nameset_free(struct nameset *s) {
    sp_free(s->slots);
    s->slots = NULL;
    s->cap = s->n = 0;
}

/* ========================================================================
 * Reader
 * ======================================================================== */

struct span {
    uint64_t start, end;
    uint32_t i;
};

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->i > y->i) - (x->i < y->i);
}

/* No two tensors' data may share a byte: a directory whose ranges overlap
 * (a type changed without moving the neighbours, say) would let one tensor
 * be read as another's.  Offsets are absolute and checked against the file
 * size; empty tensors overlap nothing. */
static sp_status check_overlap(const struct sp_model_file *mf, const char *path) {
    if (mf->n_tensors < 2) return SP_OK;
    struct span *s = sp_malloc((size_t)mf->n_tensors * sizeof *s);
    if (!s) return sp_err(SP_E_NOMEM, "sp_gguf_read: out of memory");
    uint32_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        if (t->size) s[n++] = (struct span){t->offset, t->offset + t->size, i};
    }
    qsort(s, n, sizeof *s, span_cmp);
    sp_status rc = SP_OK;
    for (uint32_t k = 1; k < n && !rc; k++) {
        if (s[k].start >= s[k - 1].end) continue;
        const struct sp_tensor_desc *a = &mf->tensors[s[k - 1].i], *b = &mf->tensors[s[k].i];
        rc = sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': the data of tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                    path, a->name, (unsigned long long)s[k - 1].start, (unsigned long long)s[k - 1].end, b->name,
                    (unsigned long long)s[k].start, (unsigned long long)s[k].end);
    }
    sp_free(s);
    return rc;
}

/* A forward cursor over the file with a read-ahead window, so that a
 * 150k-token vocabulary costs a few dozen pread calls, not 300k.  Invariant:
 * pos <= size.  `what` describes the item being read, for error messages. */
struct rd {
    struct sp_file *f;
    const char *path;
    uint64_t size;
    uint64_t pos;
    uint8_t *win;     /* (RD_WINDOW) */
    uint64_t win_off; /* file offset of win[0] */
    size_t win_len;
    char what[192];
};

static uint64_t rd_left(const struct rd *r) {
    return r->size - r->pos;
}

static sp_status rd_read(struct rd *r, void *dst, size_t n) {
    if ((uint64_t)n > rd_left(r)) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s' truncated: %s needs %zu bytes at offset %llu, but the file ends at %llu",
                      r->path, r->what, n, (unsigned long long)r->pos, (unsigned long long)r->size);
    }
    if (r->pos >= r->win_off && r->pos - r->win_off + n <= r->win_len) {
        memcpy(dst, r->win + (r->pos - r->win_off), n);
    } else if (n > RD_WINDOW / 2) {
        sp_status rc = sp_file_read_at(r->f, r->pos, dst, n);
        if (rc) return rc;
    } else {
        size_t fill = (size_t)SP_MIN((uint64_t)RD_WINDOW, rd_left(r));
        /* a package's header (core/file.h prefix): read ahead only what is held */
        const uint64_t held = sp_file_held(r->f), avail = held > r->pos ? held - r->pos : 0;
        if (fill > avail && avail >= n) fill = (size_t)avail;
        sp_status rc = sp_file_read_at(r->f, r->pos, r->win, fill);
        if (rc) return rc;
        r->win_off = r->pos;
        r->win_len = fill;
        memcpy(dst, r->win, n);
    }
    r->pos += n;
    return SP_OK;
}

static sp_status rd_u32(struct rd *r, uint32_t *x) {
    uint8_t b[4];
    sp_status rc = rd_read(r, b, 4);
    if (!rc) *x = le32(b);
    return rc;
}

static sp_status rd_u64(struct rd *r, uint64_t *x) {
    uint8_t b[8];
    sp_status rc = rd_read(r, b, 8);
    if (!rc) *x = le64(b);
    return rc;
}

/* A GGUF string: u64 length + bytes, copied into a NUL-terminated heap
 * buffer.  The length must fit in what is left of the file.  name_like: the
 * string is a key or tensor name, which must be non-empty and NUL-free. */
static sp_status rd_string(struct rd *r, char **out, uint64_t *out_len, bool name_like) {
    uint64_t len;
    const uint64_t at = r->pos;
    sp_status rc = rd_u64(r, &len);
    if (rc) return rc;
    if (len > rd_left(r)) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s: string length %llu at offset %llu exceeds the %llu bytes left in the file",
                      r->path, r->what, (unsigned long long)len, (unsigned long long)at, (unsigned long long)rd_left(r));
    }
    if (len >= SIZE_MAX) return sp_err(SP_E_NOMEM, "sp_gguf_read: '%s': %s: string too long", r->path, r->what);
    if (name_like && len == 0) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s at offset %llu is empty", r->path, r->what, (unsigned long long)at);
    }
    char *s = sp_malloc((size_t)len + 1);
    if (!s) return sp_err(SP_E_NOMEM, "sp_gguf_read: '%s': out of memory for a %llu-byte string", r->path, (unsigned long long)len);
    rc = rd_read(r, s, (size_t)len);
    if (rc) {
        sp_free(s);
        return rc;
    }
    s[len] = '\0';
    if (name_like && memchr(s, '\0', (size_t)len)) {
        sp_free(s);
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s at offset %llu contains a NUL byte", r->path, r->what,
                      (unsigned long long)at);
    }
    *out = s;
    *out_len = len;
    return SP_OK;
}

/* Read one value of type t into v (zeroed by the caller).  On failure v holds
 * only what sp_meta_value_clear can free. */
static sp_status rd_value(struct rd *r, enum sp_meta_type t, struct sp_meta_value *v, int depth) {
    uint8_t b[8];
    sp_status rc;
    switch (t) {
    case SP_META_U8:
    case SP_META_BOOL:
        if ((rc = rd_read(r, b, 1))) return rc;
        v->v.u64 = t == SP_META_BOOL ? (b[0] != 0) : b[0];
        break;
    case SP_META_I8:
        if ((rc = rd_read(r, b, 1))) return rc;
        v->v.i64 = (int8_t)b[0];
        break;
    case SP_META_U16:
        if ((rc = rd_read(r, b, 2))) return rc;
        v->v.u64 = (uint16_t)(b[0] | b[1] << 8);
        break;
    case SP_META_I16:
        if ((rc = rd_read(r, b, 2))) return rc;
        v->v.i64 = (int16_t)(uint16_t)(b[0] | b[1] << 8);
        break;
    case SP_META_U32:
        if ((rc = rd_read(r, b, 4))) return rc;
        v->v.u64 = le32(b);
        break;
    case SP_META_I32:
        if ((rc = rd_read(r, b, 4))) return rc;
        v->v.i64 = (int32_t)le32(b);
        break;
    case SP_META_U64:
        if ((rc = rd_read(r, b, 8))) return rc;
        v->v.u64 = le64(b);
        break;
    case SP_META_I64:
        if ((rc = rd_read(r, b, 8))) return rc;
        v->v.i64 = (int64_t)le64(b);
        break;
    case SP_META_F32: {
        if ((rc = rd_read(r, b, 4))) return rc;
        uint32_t u = le32(b);
        float x;
        memcpy(&x, &u, 4);
        v->v.f64 = x;
        break;
    }
    case SP_META_F64: {
        if ((rc = rd_read(r, b, 8))) return rc;
        uint64_t u = le64(b);
        double x;
        memcpy(&x, &u, 8);
        v->v.f64 = x;
        break;
    }
    case SP_META_STRING: {
        char *s;
        uint64_t len;
        if ((rc = rd_string(r, &s, &len, false))) return rc;
        v->v.str.ptr = s;
        v->v.str.len = len;
        break;
    }
    case SP_META_ARRAY: {
        uint32_t et;
        uint64_t n;
        const uint64_t at = r->pos;
        if (depth >= GGUF_MAX_DEPTH) {
            return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s: arrays nested deeper than %d at offset %llu", r->path,
                          r->what, GGUF_MAX_DEPTH, (unsigned long long)at);
        }
        if ((rc = rd_u32(r, &et)) || (rc = rd_u64(r, &n))) return rc;
        if (et >= SP_META_TYPE_COUNT) {
            return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s: unknown array element type %u at offset %llu", r->path,
                          r->what, et, (unsigned long long)at);
        }
        const uint64_t min = meta_min_bytes((enum sp_meta_type)et);
        if (n > rd_left(r) / min) {
            return sp_err(SP_E_FORMAT,
                          "sp_gguf_read: '%s': %s: array of %llu %s values at offset %llu needs at least %llu bytes per "
                          "value, but only %llu bytes are left in the file",
                          r->path, r->what, (unsigned long long)n, meta_type_names[et], (unsigned long long)at,
                          (unsigned long long)min, (unsigned long long)rd_left(r));
        }
        v->type = SP_META_ARRAY; /* from here on, clear() frees the items */
        v->v.arr.elem_type = (enum sp_meta_type)et;
        v->v.arr.n = 0;
        v->v.arr.items = NULL;
        if (n == 0) return SP_OK;
        if (n > SIZE_MAX / sizeof(struct sp_meta_value)) return sp_err(SP_E_NOMEM, "sp_gguf_read: array too large");
        v->v.arr.items = sp_calloc((size_t)n, sizeof(struct sp_meta_value));
        if (!v->v.arr.items) {
            return sp_err(SP_E_NOMEM, "sp_gguf_read: '%s': %s: out of memory for %llu array values", r->path, r->what,
                          (unsigned long long)n);
        }
        v->v.arr.n = n;
        for (uint64_t i = 0; i < n; i++) {
            if ((rc = rd_value(r, (enum sp_meta_type)et, &v->v.arr.items[i], depth + 1))) return rc;
        }
        return SP_OK;
    }
    default:
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': %s: unknown value type %d", r->path, r->what, (int)t);
    }
    v->type = t;
    return SP_OK;
}

/* general.alignment: any integer type, a nonzero power of two that fits u32. */
static sp_status read_alignment(const struct rd *r, const struct sp_model_file *mf, uint32_t *out) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < mf->n_meta; i++) {
        if (strcmp(mf->meta[i].key, "general.alignment") != 0) continue;
        const struct sp_meta_value *v = &mf->meta[i].value;
        uint64_t a;
        switch (v->type) {
        case SP_META_U8: case SP_META_U16: case SP_META_U32: case SP_META_U64:
            a = v->v.u64;
            break;
        case SP_META_I8: case SP_META_I16: case SP_META_I32: case SP_META_I64:
            if (v->v.i64 < 0) {
                return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': key 'general.alignment' = %lld is not a positive power of two",
                              r->path, (long long)v->v.i64);
            }
            a = (uint64_t)v->v.i64;
            break;
        default:
            return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': key 'general.alignment' has type %s, expected an integer",
                          r->path, meta_type_names[v->type]);
        }
        if (!is_pow2(a) || a > UINT32_MAX) {
            return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': key 'general.alignment' = %llu is not a nonzero power of two (u32)",
                          r->path, (unsigned long long)a);
        }
        *out = (uint32_t)a;
        return SP_OK;
    }
    return SP_OK;
}

/* Read one tensor descriptor at r->pos into t (zeroed by the caller; t->name
 * is set first so that the caller can free it on failure).  Checks the name,
 * n_dims, every dimension, the element count, the type, the row length
 * against the block size and the offset's alignment; the data range is
 * checked later, once the data section's start is known. */
static sp_status rd_tensor(struct rd *r, struct sp_tensor_desc *t, uint64_t index, uint32_t alignment) {
    sp_status rc;
    uint64_t len;
    uint32_t n_dims, type;
    snprintf(r->what, sizeof r->what, "the name of tensor %llu", (unsigned long long)index);
    if ((rc = rd_string(r, &t->name, &len, true))) return rc;
    snprintf(r->what, sizeof r->what, "tensor '%.100s'", t->name);

    const uint64_t dims_at = r->pos;
    if ((rc = rd_u32(r, &n_dims))) return rc;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s' has n_dims = %u at offset %llu (must be 1..%d)", r->path,
                      t->name, n_dims, (unsigned long long)dims_at, GGUF_MAX_DIMS);
    }
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    uint64_t n_elems = 1;
    bool overflow = false, empty = false;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((rc = rd_u64(r, &ne))) return rc;
        if (ne > (uint64_t)INT64_MAX) {
            return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s' has a negative dimension ne[%u] = %lld", r->path,
                          t->name, d, (long long)ne);
        }
        t->ne[d] = (int64_t)ne;
        empty |= ne == 0;
        if (sp_mul_overflow_u64(n_elems, ne, &n_elems) || n_elems > (uint64_t)INT64_MAX) overflow = true;
    }
    /* A zero dimension makes the product 0 whatever the others are. */
    if (overflow && !empty) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s' has too many elements (%lld x %lld x %lld x %lld overflows)",
                      r->path, t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    }
    if ((rc = rd_u32(r, &type))) return rc;
    t->type = type;
    const struct sp_qtraits *tr = sp_qtraits_ref(type);
    if (!tr) {
        return sp_err(SP_E_UNSUPPORTED, "sp_gguf_read: '%s': tensor '%s' has unknown type id %u", r->path, t->name, type);
    }
    /* Sparrow's native types pad the last block of a row (quant/native.h);
     * the resident layouts hold whole groups (their kernels read them so). */
    const bool padded = type >= SP_QTYPE_NATIVE_FIRST && !sp_qtype_resident_from(type);
    if (!padded && t->ne[0] % tr->block_elems != 0) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s': row length ne[0] = %lld is not a multiple of the %s block size %lld",
                      r->path, t->name, (long long)t->ne[0], tr->name, (long long)tr->block_elems);
    }
    /* size = row bytes * rows, with rows = ne1*ne2*ne3 (overflow-checked). */
    uint64_t rows = 1, size = 0;
    for (uint32_t d = 1; d < GGUF_MAX_DIMS; d++) overflow |= sp_mul_overflow_u64(rows, (uint64_t)t->ne[d], &rows);
    const uint64_t n_blocks = ((uint64_t)t->ne[0] + (padded ? (uint64_t)tr->block_elems - 1 : 0)) / (uint64_t)tr->block_elems;
    uint64_t row_bytes = 0;
    overflow |= sp_mul_overflow_u64(n_blocks, tr->block_bytes, &row_bytes);
    if (!empty && (overflow || sp_mul_overflow_u64(row_bytes, rows, &size))) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s': byte size overflows", r->path, t->name);
    }
    t->size = empty ? 0 : size;

    const uint64_t off_at = r->pos;
    if ((rc = rd_u64(r, &t->offset))) return rc;
    if (t->offset % alignment != 0) {
        return sp_err(SP_E_FORMAT, "sp_gguf_read: '%s': tensor '%s' offset %llu (field at %llu) is not a multiple of the alignment %u",
                      r->path, t->name, (unsigned long long)t->offset, (unsigned long long)off_at, alignment);
    }
    return SP_OK;
}

/* Parse the header, metadata and tensor directory of f into mf.  mf->path
 * and mf->file_size are set by the caller (file_size is re-read from f).
 * Returns SP_OK, SP_E_FORMAT (malformed, truncated or inconsistent; the
 * message names the path, the offset and the key or tensor), SP_E_UNSUPPORTED
 * (GGUF v1 or a later version, big-endian files, unknown tensor types),
 * SP_E_IO or SP_E_NOMEM.  On failure mf may hold part of the metadata and
 * directory; sp_model_file_free releases it. */
sp_status sp_gguf_read(struct sp_file *f, struct sp_model_file *mf) {
    struct rd r = {.f = f, .path = sp_file_path(f), .size = sp_file_size(f)};
    struct nameset names = {0};
    sp_status rc;
    uint8_t hdr[GGUF_HEADER_BYTES];

    mf->kind = SP_FILE_GGUF;
    mf->file_size = r.size;
    r.win = sp_malloc(RD_WINDOW);
    if (!r.win) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);

    /* ---- header ---- */
    if (r.size >= 4) {
        if ((rc = sp_file_read_at(f, 0, hdr, 4))) goto done;
        if (memcmp(hdr, "GGUF", 4) != 0) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' is not a GGUF file (magic %02x %02x %02x %02x at offset 0, expected \"GGUF\")",
                        __func__, r.path, hdr[0], hdr[1], hdr[2], hdr[3]);
            goto done;
        }
    }
    snprintf(r.what, sizeof r.what, "the GGUF header");
    if ((rc = rd_read(&r, hdr, sizeof hdr))) goto done;
    const uint32_t version = le32(hdr + 4);
    const uint64_t n_tensors = le64(hdr + 8);
    const uint64_t n_kv = le64(hdr + 16);
    if (version != 2 && version != 3) {
        const uint32_t swapped = __builtin_bswap32(version);
        if (version == 1) {
            rc = sp_err(SP_E_UNSUPPORTED, "%s: '%s' is GGUF v1 (32-bit counts), which is not supported: only v2 and v3 are; "
                        "convert it again with a current converter", __func__, r.path);
        } else if (swapped >= 1 && swapped <= 3) {
            rc = sp_err(SP_E_UNSUPPORTED, "%s: '%s' is a big-endian GGUF v%u file, which is not supported", __func__, r.path, swapped);
        } else if (version == 0) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': invalid GGUF version 0 at offset 4", __func__, r.path);
        } else {
            rc = sp_err(SP_E_UNSUPPORTED, "%s: '%s': unsupported GGUF version %u (only v2 and v3 are supported)", __func__, r.path, version);
        }
        goto done;
    }
    mf->version = version;

    /* Refuse counts the remaining bytes cannot hold before allocating anything. */
    {
        const uint64_t left = rd_left(&r);
        uint64_t need_kv, need_t, need;
        if (n_kv > left / GGUF_KV_MIN_BYTES || n_tensors > left / GGUF_TENSOR_MIN_BYTES ||
            sp_mul_overflow_u64(n_kv, GGUF_KV_MIN_BYTES, &need_kv) ||
            sp_mul_overflow_u64(n_tensors, GGUF_TENSOR_MIN_BYTES, &need_t) || sp_add_overflow_u64(need_kv, need_t, &need) ||
            need > left || n_tensors > UINT32_MAX) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': header claims %llu tensors and %llu metadata keys, more than the %llu bytes after "
                        "the header can hold (>= %d bytes per key, >= %d per tensor)", __func__, r.path,
                        (unsigned long long)n_tensors, (unsigned long long)n_kv, (unsigned long long)left,
                        GGUF_KV_MIN_BYTES, GGUF_TENSOR_MIN_BYTES);
            goto done;
        }
    }

    /* ---- metadata ---- */
    if (n_kv) {
        mf->meta = sp_calloc((size_t)n_kv, sizeof(*mf->meta));
        if (!mf->meta) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory for %llu metadata keys", __func__, (unsigned long long)n_kv);
            goto done;
        }
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        struct sp_meta_kv *kv = &mf->meta[i];
        uint64_t len;
        uint32_t type;
        snprintf(r.what, sizeof r.what, "the key of metadata entry %llu", (unsigned long long)i);
        if ((rc = rd_string(&r, &kv->key, &len, true))) goto done;
        mf->n_meta = i + 1; /* entry i is now owned by mf, whatever happens next */
        snprintf(r.what, sizeof r.what, "key '%.100s'", kv->key);
        bool dup;
        if ((rc = nameset_add(&names, kv->key, &dup))) goto done;
        if (dup) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': duplicate metadata key '%s' (entry %llu)", __func__, r.path, kv->key,
                        (unsigned long long)i);
            goto done;
        }
        const uint64_t type_at = r.pos;
        if ((rc = rd_u32(&r, &type))) goto done;
        if (type >= SP_META_TYPE_COUNT) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has unknown value type %u at offset %llu", __func__, r.path, kv->key,
                        type, (unsigned long long)type_at);
            goto done;
        }
        if ((rc = rd_value(&r, (enum sp_meta_type)type, &kv->value, 0))) goto done;
    }
    nameset_free(&names);
    uint32_t alignment;
    if ((rc = read_alignment(&r, mf, &alignment))) goto done;
    mf->alignment = alignment;

    /* ---- tensor directory ---- */
    if (n_tensors) {
        mf->tensors = sp_calloc((size_t)n_tensors, sizeof(*mf->tensors));
        if (!mf->tensors) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory for %llu tensors", __func__, (unsigned long long)n_tensors);
            goto done;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct sp_tensor_desc *t = &mf->tensors[i];
        rc = rd_tensor(&r, t, i, alignment);
        if (t->name) mf->n_tensors = (uint32_t)i + 1;
        if (rc) goto done;
        bool dup;
        if ((rc = nameset_add(&names, t->name, &dup))) goto done;
        if (dup) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': duplicate tensor name '%s' (tensor %llu)", __func__, r.path, t->name,
                        (unsigned long long)i);
            goto done;
        }
    }

    /* ---- data section: every tensor's bytes must lie inside the file ---- */
    uint64_t data_offset;
    if (align_up(r.pos, alignment, &data_offset)) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s': data offset overflows", __func__, r.path);
        goto done;
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        struct sp_tensor_desc *t = &mf->tensors[i];
        uint64_t start, end;
        if (sp_add_overflow_u64(data_offset, t->offset, &start) || sp_add_overflow_u64(start, t->size, &end)) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': tensor '%s' offset %llu + size %llu overflows (data section at %llu)",
                        __func__, r.path, t->name, (unsigned long long)t->offset, (unsigned long long)t->size,
                        (unsigned long long)data_offset);
            goto done;
        }
        if (end > r.size) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': tensor '%s' data [%llu, %llu) past end of file (%llu)", __func__, r.path,
                        t->name, (unsigned long long)start, (unsigned long long)end, (unsigned long long)r.size);
            goto done;
        }
        t->offset = start; /* absolute from here on */
    }
    if ((rc = check_overlap(mf, r.path))) goto done;
    /* Vocabulary-only files end right after the directory, without padding. */
    mf->data_offset = mf->n_tensors == 0 ? SP_MIN(data_offset, r.size) : data_offset;
    rc = SP_OK;

done:
    nameset_free(&names);
    sp_free(r.win);
    return rc;
}

/* ========================================================================
 * Writer
 * ======================================================================== */

struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t offset; /* relative to the data section */
    uint64_t size;
};

struct sp_gguf_writer {
    char *path;
    char *tmp_path;
    FILE *fp;
    uint32_t alignment;
    struct sp_meta_kv *kv; /* (n_kv) owned copies */
    uint64_t n_kv, cap_kv;
    struct wtensor *t;     /* (n_t) */
    uint32_t n_t, cap_t;
    uint64_t data_end;     /* end of the last declared tensor (unpadded) */
    bool header_done;      /* metadata and directory are frozen once written */
    bool finished;
    bool failed;           /* an I/O error happened: only free is left */
    uint32_t cur;          /* tensor receiving data */
    uint64_t cur_done;     /* bytes of tensor cur written */
    uint64_t data_pos;     /* bytes written into the data section, padding included */
    uint64_t header_bytes; /* bytes written before the data section */
};

/* Open a writer whose output goes to a temporary file beside path
 * ("<path>.sparrow-tmp.<pid>", core/file.h; leftovers of killed writers of
 * path are removed first) until finish renames it over path.  The magic is
 * written last, so the temporary is never a GGUF file, even renamed by hand.
 * alignment: 0 for GGUF's default (32), else a power of two; a non-default
 * one is recorded as general.alignment.  Returns SP_OK and *out,
 * SP_E_INVALID, SP_E_IO (the temporary file cannot be created) or
 * SP_E_NOMEM. */
sp_status sp_gguf_writer_open(const char *path, uint32_t alignment, struct sp_gguf_writer **out) {
    sp_status rc;
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!path || !*path) return sp_err(SP_E_INVALID, "%s: empty path", __func__);
    if (alignment == 0) alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!is_pow2(alignment)) return sp_err(SP_E_INVALID, "%s: alignment %u is not a power of two", __func__, alignment);

    struct sp_gguf_writer *w = sp_calloc(1, sizeof(*w));
    if (!w) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    w->alignment = alignment;
    w->path = sp_strdup(path);
    if (!w->path) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    int fd;
    if ((rc = sp_file_tmp_create(path, &w->tmp_path, &fd))) goto fail;
    w->fp = fdopen(fd, "wb");
    if (!w->fp) {
        rc = sp_err(SP_E_IO, "%s: fdopen '%s': %s", __func__, w->tmp_path, strerror(errno));
        close(fd);
        unlink(w->tmp_path);
        goto fail;
    }
    if (alignment != GGUF_DEFAULT_ALIGNMENT && (rc = sp_gguf_writer_set_u32(w, "general.alignment", alignment))) {
        fclose(w->fp);
        unlink(w->tmp_path);
        goto fail;
    }
    *out = w;
    return SP_OK;

fail:
    sp_free(w->path);
    sp_free(w->tmp_path);
    sp_free(w);
    return rc;
}

static sp_status writer_usable(const struct sp_gguf_writer *w, const char *fn) {
    if (!w) return sp_err(SP_E_INVALID, "%s: writer is NULL", fn);
    if (w->failed) return sp_err(SP_E_STATE, "%s: '%s': an earlier write failed", fn, w->tmp_path);
    if (w->finished) return sp_err(SP_E_STATE, "%s: '%s' is already finished", fn, w->path);
    return SP_OK;
}

/* Check that v is something GGUF can encode (types in range, array items of
 * the array's element type, strings with bytes, bounded nesting). */
static sp_status check_value(const struct sp_meta_value *v, const char *key, int depth) {
    if ((unsigned)v->type >= SP_META_TYPE_COUNT) {
        return sp_err(SP_E_INVALID, "sp_gguf_writer_set: key '%s': unknown value type %d", key, (int)v->type);
    }
    if (v->type == SP_META_STRING && v->v.str.len && !v->v.str.ptr) {
        return sp_err(SP_E_INVALID, "sp_gguf_writer_set: key '%s': string with NULL bytes pointer", key);
    }
    if (v->type != SP_META_ARRAY) return SP_OK;
    if (depth >= GGUF_MAX_DEPTH) {
        return sp_err(SP_E_INVALID, "sp_gguf_writer_set: key '%s': arrays nested deeper than %d", key, GGUF_MAX_DEPTH);
    }
    if ((unsigned)v->v.arr.elem_type >= SP_META_TYPE_COUNT || (v->v.arr.n && !v->v.arr.items)) {
        return sp_err(SP_E_INVALID, "sp_gguf_writer_set: key '%s': malformed array", key);
    }
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (v->v.arr.items[i].type != v->v.arr.elem_type) {
            return sp_err(SP_E_INVALID, "sp_gguf_writer_set: key '%s': array item %llu has type %s, the array holds %s", key,
                          (unsigned long long)i, meta_type_names[v->v.arr.items[i].type % SP_META_TYPE_COUNT],
                          meta_type_names[v->v.arr.elem_type]);
        }
        sp_status rc = check_value(&v->v.arr.items[i], key, depth + 1);
        if (rc) return rc;
    }
    return SP_OK;
}

/* Add or replace metadata key (copied, with v, deeply).  Only before the
 * first sp_gguf_writer_write.  general.alignment must be an integer equal to
 * the writer's alignment.  Returns SP_OK, SP_E_INVALID, SP_E_STATE or
 * SP_E_NOMEM. */
sp_status sp_gguf_writer_set(struct sp_gguf_writer *w, const char *key, const struct sp_meta_value *v) {
    sp_status rc = writer_usable(w, __func__);
    if (rc) return rc;
    if (w->header_done) return sp_err(SP_E_STATE, "%s: key '%s': metadata is frozen once tensor data is written", __func__, key ? key : "");
    if (!key || !*key || !v) return sp_err(SP_E_INVALID, "%s: empty key or NULL value", __func__);
    if ((rc = check_value(v, key, 0))) return rc;
    if (strcmp(key, "general.alignment") == 0) {
        const bool is_int = v->type <= SP_META_I32 || v->type == SP_META_U64 || v->type == SP_META_I64;
        const bool is_signed = v->type == SP_META_I8 || v->type == SP_META_I16 || v->type == SP_META_I32 || v->type == SP_META_I64;
        if (!is_int || (is_signed ? (uint64_t)v->v.i64 : v->v.u64) != w->alignment) {
            return sp_err(SP_E_INVALID, "%s: general.alignment must be an integer equal to the writer's alignment %u", __func__,
                          w->alignment);
        }
    }
    struct sp_meta_value copy;
    if ((rc = sp_meta_value_copy(&copy, v))) return rc;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            sp_meta_value_clear(&w->kv[i].value);
            w->kv[i].value = copy;
            return SP_OK;
        }
    }
    char *k = sp_strdup(key);
    if (!k) goto nomem;
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        struct sp_meta_kv *kv = sp_realloc(w->kv, (size_t)cap * sizeof(*kv));
        if (!kv) goto nomem;
        w->kv = kv;
        w->cap_kv = cap;
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].value = copy;
    w->n_kv++;
    return SP_OK;

nomem:
    sp_free(k);
    sp_meta_value_clear(&copy);
    return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
}

/* Convenience setters: a string (copied), a u32, an f32, a bool. */
sp_status sp_gguf_writer_set_str(struct sp_gguf_writer *w, const char *key, const char *s) {
    if (!s) return sp_err(SP_E_INVALID, "%s: key '%s': NULL string", __func__, key ? key : "");
    struct sp_meta_value v = {.type = SP_META_STRING};
    v.v.str.ptr = (char *)s; /* only read: set() copies it */
    v.v.str.len = strlen(s);
    return sp_gguf_writer_set(w, key, &v);
}

sp_status sp_gguf_writer_set_u32(struct sp_gguf_writer *w, const char *key, uint32_t x) {
    struct sp_meta_value v = {.type = SP_META_U32, .v.u64 = x};
    return sp_gguf_writer_set(w, key, &v);
}

sp_status sp_gguf_writer_set_f32(struct sp_gguf_writer *w, const char *key, float x) {
    struct sp_meta_value v = {.type = SP_META_F32, .v.f64 = x};
    return sp_gguf_writer_set(w, key, &v);
}

sp_status sp_gguf_writer_set_bool(struct sp_gguf_writer *w, const char *key, bool x) {
    struct sp_meta_value v = {.type = SP_META_BOOL, .v.u64 = x ? 1 : 0};
    return sp_gguf_writer_set(w, key, &v);
}

/* Declare a tensor: name (1..63 bytes, unique, so ggml-based readers accept
 * it), a known type, 1..4 dims >= 0 with ne[0] a multiple of the type's
 * block size.  Its offset is the previous tensor's end rounded up to the
 * alignment.  Only before the first write.  Returns SP_OK, SP_E_INVALID,
 * SP_E_STATE or SP_E_NOMEM. */
sp_status sp_gguf_writer_add_tensor(struct sp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne) {
    sp_status rc = writer_usable(w, __func__);
    if (rc) return rc;
    if (w->header_done) return sp_err(SP_E_STATE, "%s: tensor '%s': the directory is frozen once data is written", __func__, name ? name : "");
    if (!name || !*name || strlen(name) >= GGUF_MAX_NAME) {
        return sp_err(SP_E_INVALID, "%s: tensor name must be 1..%d bytes", __func__, GGUF_MAX_NAME - 1);
    }
    const struct sp_qtraits *tr = sp_qtraits_ref(type);
    if (!tr) return sp_err(SP_E_INVALID, "%s: tensor '%s': unknown type id %u", __func__, name, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne) {
        return sp_err(SP_E_INVALID, "%s: tensor '%s': n_dims %u must be 1..%d", __func__, name, n_dims, GGUF_MAX_DIMS);
    }
    for (uint32_t i = 0; i < w->n_t; i++) {
        if (strcmp(w->t[i].name, name) == 0) return sp_err(SP_E_INVALID, "%s: duplicate tensor name '%s'", __func__, name);
    }
    struct wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    uint64_t rows = 1, n_elems = 1;
    bool overflow = false, empty = false;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 0) return sp_err(SP_E_INVALID, "%s: tensor '%s': ne[%u] = %lld is negative", __func__, name, d, (long long)ne[d]);
        t.ne[d] = ne[d];
        empty |= ne[d] == 0;
        overflow |= sp_mul_overflow_u64(n_elems, (uint64_t)ne[d], &n_elems);
        if (d > 0) overflow |= sp_mul_overflow_u64(rows, (uint64_t)ne[d], &rows);
    }
    /* native types pad the last block; the resident layouts hold whole groups */
    const bool padded = type >= SP_QTYPE_NATIVE_FIRST && !sp_qtype_resident_from(type);
    if (!padded && ne[0] % tr->block_elems != 0) {
        return sp_err(SP_E_INVALID, "%s: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld", __func__, name,
                      (long long)ne[0], tr->name, (long long)tr->block_elems);
    }
    const uint64_t n_blocks = ((uint64_t)ne[0] + (padded ? (uint64_t)tr->block_elems - 1 : 0)) / (uint64_t)tr->block_elems;
    uint64_t row_bytes = 0;
    overflow |= sp_mul_overflow_u64(n_blocks, tr->block_bytes, &row_bytes);
    uint64_t end;
    if (empty) {
        t.size = 0;
    } else if (overflow || n_elems > (uint64_t)INT64_MAX || sp_mul_overflow_u64(row_bytes, rows, &t.size)) {
        return sp_err(SP_E_INVALID, "%s: tensor '%s': size overflows", __func__, name);
    }
    if (align_up(w->data_end, w->alignment, &t.offset) || sp_add_overflow_u64(t.offset, t.size, &end)) {
        return sp_err(SP_E_INVALID, "%s: tensor '%s': data section overflows", __func__, name);
    }
    if (w->n_t == w->cap_t) {
        if (w->cap_t >= UINT32_MAX / 2) return sp_err(SP_E_INVALID, "%s: too many tensors", __func__);
        uint32_t cap = w->cap_t ? w->cap_t * 2 : 16;
        struct wtensor *nt = sp_realloc(w->t, (size_t)cap * sizeof(*nt));
        if (!nt) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = sp_strdup(name))) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    w->t[w->n_t++] = t;
    w->data_end = end;
    return SP_OK;
}

/* ---- serialisation ---- */

static sp_status wr(struct sp_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->failed = true;
        return sp_err(SP_E_IO, "sp_gguf_writer: write to '%s' failed: %s", w->tmp_path, strerror(errno));
    }
    if (!w->header_done) w->header_bytes += n;
    return SP_OK;
}

static sp_status wr_u32(struct sp_gguf_writer *w, uint32_t x) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(x >> (8 * i));
    return wr(w, b, 4);
}

static sp_status wr_u64(struct sp_gguf_writer *w, uint64_t x) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(x >> (8 * i));
    return wr(w, b, 8);
}

static sp_status wr_str(struct sp_gguf_writer *w, const char *s, uint64_t len) {
    sp_status rc = wr_u64(w, len);
    return rc ? rc : wr(w, s, (size_t)len);
}

static sp_status wr_zeros(struct sp_gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = (size_t)SP_MIN(n, (uint64_t)sizeof zeros);
        sp_status rc = wr(w, zeros, k);
        if (rc) return rc;
        n -= k;
    }
    return SP_OK;
}

/* The payload of v (no type tag: the caller wrote it or the array holds it). */
static sp_status wr_value(struct sp_gguf_writer *w, const struct sp_meta_value *v) {
    switch (v->type) {
    case SP_META_U8: case SP_META_I8: case SP_META_BOOL: {
        uint8_t b = (uint8_t)(v->type == SP_META_I8 ? (uint64_t)v->v.i64 : v->v.u64);
        return wr(w, &b, 1);
    }
    case SP_META_U16: case SP_META_I16: {
        uint16_t x = (uint16_t)(v->type == SP_META_I16 ? (uint64_t)v->v.i64 : v->v.u64);
        uint8_t b[2] = {(uint8_t)x, (uint8_t)(x >> 8)};
        return wr(w, b, 2);
    }
    case SP_META_U32: return wr_u32(w, (uint32_t)v->v.u64);
    case SP_META_I32: return wr_u32(w, (uint32_t)(uint64_t)v->v.i64);
    case SP_META_U64: return wr_u64(w, v->v.u64);
    case SP_META_I64: return wr_u64(w, (uint64_t)v->v.i64);
    case SP_META_F32: {
        float x = (float)v->v.f64;
        uint32_t u;
        memcpy(&u, &x, 4);
        return wr_u32(w, u);
    }
    case SP_META_F64: {
        uint64_t u;
        memcpy(&u, &v->v.f64, 8);
        return wr_u64(w, u);
    }
    case SP_META_STRING: return wr_str(w, v->v.str.ptr, v->v.str.len);
    case SP_META_ARRAY: {
        sp_status rc = wr_u32(w, (uint32_t)v->v.arr.elem_type);
        if (!rc) rc = wr_u64(w, v->v.arr.n);
        for (uint64_t i = 0; !rc && i < v->v.arr.n; i++) rc = wr_value(w, &v->v.arr.items[i]);
        return rc;
    }
    default:
        return sp_err(SP_E_INVALID, "sp_gguf_writer: unknown value type %d", (int)v->type);
    }
}

/* Header, metadata, directory, then padding up to the data section. */
static sp_status write_header(struct sp_gguf_writer *w) {
    sp_status rc = wr_zeros(w, 4); /* the magic comes last (sp_gguf_writer_finish) */
    if (!rc) rc = wr_u32(w, 3);
    if (!rc) rc = wr_u64(w, w->n_t);
    if (!rc) rc = wr_u64(w, w->n_kv);
    for (uint64_t i = 0; !rc && i < w->n_kv; i++) {
        rc = wr_str(w, w->kv[i].key, strlen(w->kv[i].key));
        if (!rc) rc = wr_u32(w, (uint32_t)w->kv[i].value.type);
        if (!rc) rc = wr_value(w, &w->kv[i].value);
    }
    for (uint32_t i = 0; !rc && i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        rc = wr_str(w, t->name, strlen(t->name));
        if (!rc) rc = wr_u32(w, t->n_dims);
        for (uint32_t d = 0; !rc && d < t->n_dims; d++) rc = wr_u64(w, (uint64_t)t->ne[d]);
        if (!rc) rc = wr_u32(w, t->type);
        if (!rc) rc = wr_u64(w, t->offset);
    }
    if (rc) return rc;
    uint64_t data_start = 0;
    if (align_up(w->header_bytes, w->alignment, &data_start)) return sp_err(SP_E_INVALID, "sp_gguf_writer: header too large");
    if ((rc = wr_zeros(w, data_start - w->header_bytes))) return rc;
    w->header_done = true;
    return SP_OK;
}

/* Skip finished and empty tensors; pad up to the next one's offset. */
static sp_status advance(struct sp_gguf_writer *w) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].size) {
        w->cur++;
        w->cur_done = 0;
    }
    if (w->cur < w->n_t && w->cur_done == 0 && w->data_pos < w->t[w->cur].offset) {
        sp_status rc = wr_zeros(w, w->t[w->cur].offset - w->data_pos);
        if (rc) return rc;
        w->data_pos = w->t[w->cur].offset;
    }
    return SP_OK;
}

/* Append n bytes of tensor data: tensors in declaration order, each in as
 * many chunks as the caller likes; alignment padding is inserted here.  The
 * first call writes the header (metadata and directory are frozen then).
 * Returns SP_OK, SP_E_INVALID (more bytes than declared), SP_E_STATE or
 * SP_E_IO. */
sp_status sp_gguf_writer_write(struct sp_gguf_writer *w, const void *data, size_t n) {
    sp_status rc = writer_usable(w, __func__);
    if (rc) return rc;
    if (n && !data) return sp_err(SP_E_INVALID, "%s: NULL data", __func__);
    if (!w->header_done && (rc = write_header(w))) return rc;
    const uint8_t *p = data;
    while (n) {
        if ((rc = advance(w))) return rc;
        if (w->cur >= w->n_t) {
            return sp_err(SP_E_INVALID, "%s: '%s': %zu bytes more than the declared tensors hold", __func__, w->path, n);
        }
        const struct wtensor *t = &w->t[w->cur];
        const size_t k = (size_t)SP_MIN((uint64_t)n, t->size - w->cur_done);
        if ((rc = wr(w, p, k))) return rc;
        p += k;
        n -= k;
        w->cur_done += k;
        w->data_pos += k;
    }
    return SP_OK;
}

/* Write the header if no data came, check that every declared tensor byte
 * was written, pad the end to the alignment, flush, fsync and rename the
 * temporary file over path (then fsync the directory).  Returns SP_OK,
 * SP_E_STATE (a tensor is incomplete: the message names it; the writer stays
 * usable), SP_E_IO. */
sp_status sp_gguf_writer_finish(struct sp_gguf_writer *w) {
    sp_status rc = writer_usable(w, __func__);
    if (rc) return rc;
    if (!w->header_done && (rc = write_header(w))) return rc;
    /* Only skip complete and empty tensors; a partial one is an error. */
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].size) {
        w->cur++;
        w->cur_done = 0;
    }
    if (w->cur < w->n_t) {
        const struct wtensor *t = &w->t[w->cur];
        return sp_err(SP_E_STATE, "%s: '%s': tensor '%s' has %llu of its %llu bytes written (%u of %u tensors complete)", __func__,
                      w->path, t->name, (unsigned long long)w->cur_done, (unsigned long long)t->size, w->cur, w->n_t);
    }
    uint64_t end = 0;
    if (align_up(w->data_pos, w->alignment, &end)) return sp_err(SP_E_INVALID, "%s: data section too large", __func__);
    if (w->n_t && (rc = wr_zeros(w, end - w->data_pos))) return rc;
    w->data_pos = end;

    FILE *fp = w->fp;
    w->fp = NULL;
    w->failed = true; /* until the rename succeeds */
    if (fflush(fp) != 0 || pwrite(fileno(fp), "GGUF", 4, 0) != 4) {
        rc = sp_err(SP_E_IO, "%s: writing '%s' failed: %s", __func__, w->tmp_path, strerror(errno));
        fclose(fp);
        return rc;
    }
    rc = sp_file_tmp_commit(fileno(fp), w->tmp_path, w->path);
    if (fclose(fp) != 0 && !rc) {
        rc = sp_err(SP_E_IO, "%s: closing '%s' failed: %s", __func__, w->path, strerror(errno));
    }
    if (rc) return rc;
    w->failed = false;
    w->finished = true;
    return SP_OK;
}

/* Free the writer.  Without a successful finish the temporary file is closed
 * and removed, so a failed conversion leaves nothing behind.  NULL is a no-op. */
void sp_gguf_writer_free(struct sp_gguf_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    if (!w->finished && w->tmp_path) unlink(w->tmp_path);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        sp_free(w->kv[i].key);
        sp_meta_value_clear(&w->kv[i].value);
    }
    for (uint32_t i = 0; i < w->n_t; i++) sp_free(w->t[i].name);
    sp_free(w->kv);
    sp_free(w->t);
    sp_free(w->path);
    sp_free(w->tmp_path);
    sp_free(w);
}
