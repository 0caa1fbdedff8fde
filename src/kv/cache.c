/*
 * cache.c -- contiguous KV cache storage (F32 or F16).
 *
 * Invariants:
 *  1. k and v are allocated once in sp_kv_init and never resized.
 *  2. Row (il, pos) of keys starts at k + (il * n_ctx + pos) * k_dim elements
 *     (values likewise with v_dim); head kh occupies [kh*hd, (kh+1)*hd) of a row.
 *  3. Only rows below the session's n_past hold meaningful data; attend reads
 *     rows [0, n_pos) and the caller guarantees n_pos <= n_past + 1.
 */
#include "cache.h"

#include "quant/quant.h"

#include <math.h>

struct sp_kv_cache {
    uint32_t n_layers, n_ctx, k_dim, v_dim;
    enum sp_kv_type type;
    size_t elem;   /* 4 or 2 */
    void *k;       /* (n_layers, n_ctx, k_dim) */
    void *v;       /* (n_layers, n_ctx, v_dim) */
    uint64_t bytes;
};

sp_status sp_kv_init(uint32_t n_layers, uint32_t n_ctx, uint32_t k_dim, uint32_t v_dim, enum sp_kv_type type,
                     struct sp_kv_cache **out) {
    *out = NULL;
    if (!n_layers || !n_ctx || !k_dim || !v_dim) return sp_err(SP_E_INVALID, "%s: zero dimension", __func__);
    if (type != SP_KV_F32 && type != SP_KV_F16) return sp_err(SP_E_INVALID, "%s: unknown kv type %d", __func__, type);
    struct sp_kv_cache *kv = sp_calloc(1, sizeof(*kv));
    if (!kv) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    kv->n_layers = n_layers;
    kv->n_ctx = n_ctx;
    kv->k_dim = k_dim;
    kv->v_dim = v_dim;
    kv->type = type;
    kv->elem = type == SP_KV_F32 ? 4 : 2;
    uint64_t rows = (uint64_t)n_layers * n_ctx;
    uint64_t kb = rows * k_dim * kv->elem, vb = rows * v_dim * kv->elem;
    kv->k = sp_malloc_aligned((size_t)kb, 64);
    kv->v = sp_malloc_aligned((size_t)vb, 64);
    if (!kv->k || !kv->v) {
        sp_kv_free(kv);
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %llu bytes of KV cache", __func__,
                      (unsigned long long)(kb + vb));
    }
    kv->bytes = kb + vb;
    *out = kv;
    return SP_OK;
}

void sp_kv_free(struct sp_kv_cache *kv) {
    if (!kv) return;
    sp_free_aligned(kv->k);
    sp_free_aligned(kv->v);
    sp_free(kv);
}

uint64_t sp_kv_bytes(const struct sp_kv_cache *kv) {
    return kv->bytes;
}

void sp_kv_store(struct sp_kv_cache *kv, uint32_t il, uint32_t pos, const float *k, const float *v) {
    SP_ASSERT(il < kv->n_layers && pos < kv->n_ctx);
    size_t row = (size_t)il * kv->n_ctx + pos;
    if (kv->type == SP_KV_F32) {
        memcpy((float *)kv->k + row * kv->k_dim, k, kv->k_dim * sizeof(float));
        memcpy((float *)kv->v + row * kv->v_dim, v, kv->v_dim * sizeof(float));
    } else {
        uint16_t *kd = (uint16_t *)kv->k + row * kv->k_dim;
        uint16_t *vd = (uint16_t *)kv->v + row * kv->v_dim;
        /* the dispatched converter: the reference's bits (tests/test_kernels.c) */
        const sp_from_float_fn f2h = sp_qtraits_get(SP_QTYPE_F16)->from_float;
        f2h(k, kd, kv->k_dim);
        f2h(v, vd, kv->v_dim);
    }
}

/* out[i] += a * v[i], four lanes at a time in GCC/Clang vector types (SSE
 * on any x86-64, NEON on arm64; the loop over plain arrays stayed scalar at
 * -O2 and was 75% of the attention).  The product and the sum are separate
 * statements, so no compiler fuses them: each lane rounds as the scalar
 * loop does, bit for bit. */
typedef float sp_v4f __attribute__((vector_size(16)));

static void axpy(float *restrict out, float a, const float *restrict v, uint32_t n) {
    const sp_v4f av = {a, a, a, a};
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        sp_v4f o, x;
        memcpy(&o, out + i, sizeof o);
        memcpy(&x, v + i, sizeof x);
        const sp_v4f prod = av * x;
        o = o + prod;
        memcpy(out + i, &o, sizeof o);
    }
    for (; i < n; i++) {
        const float prod = a * v[i];
        out[i] = out[i] + prod;
    }
}

/* out[i] = sum over p of a[p] * v[p * v_stride + i], added in position
 * order for every i (what a plain axpy per position gives, bit for bit),
 * 16 elements at a time held in a local array so that the compiler keeps
 * them in vector registers across the positions (several add chains). */
static void attend_v_f32(const float *restrict v, size_t v_stride, const float *restrict a, uint32_t n_pos,
                         uint32_t hd, float *restrict out) {
    uint32_t i = 0;
    for (; i + 16 <= hd; i += 16) {
        float lo[8] = {0}, hi[8] = {0};
        for (uint32_t p = 0; p < n_pos; p++) {
            const float *restrict vp = v + p * v_stride + i;
            for (int k = 0; k < 8; k++) lo[k] += a[p] * vp[k];
            for (int k = 0; k < 8; k++) hi[k] += a[p] * vp[k + 8];
        }
        for (int k = 0; k < 8; k++) out[i + k] = lo[k];
        for (int k = 0; k < 8; k++) out[i + k + 8] = hi[k];
    }
    for (; i < hd; i++) {
        float s = 0.0f;
        for (uint32_t p = 0; p < n_pos; p++) s += a[p] * v[p * v_stride + i];
        out[i] = s;
    }
}

void sp_kv_attend(const struct sp_kv_cache *kv, uint32_t il, uint32_t kh, uint32_t hd_k, uint32_t hd_v,
                  uint32_t n_pos, const float *q, float scale, float *att, float *out) {
    SP_ASSERT(il < kv->n_layers && n_pos > 0 && n_pos <= kv->n_ctx);
    SP_ASSERT((kh + 1) * hd_k <= kv->k_dim && (kh + 1) * hd_v <= kv->v_dim && hd_k <= SP_KV_MAX_HEAD_DIM &&
              hd_v <= SP_KV_MAX_HEAD_DIM);
    const size_t base = (size_t)il * kv->n_ctx;
    /* Scores through the dispatched dot kernels: F32 keys meet the F32 query;
     * F16 keys meet the query rounded to F16, as ggml does for an F16 cache. */
    float max = -INFINITY;
    if (kv->type == SP_KV_F32) {
        const sp_vec_dot_fn dot = sp_qtraits_get(SP_QTYPE_F32)->vec_dot;
        const float *k = (const float *)kv->k + base * kv->k_dim + (size_t)kh * hd_k;
        for (uint32_t p = 0; p < n_pos; p++) dot(hd_k, &att[p], k + (size_t)p * kv->k_dim, q);
    } else {
        const sp_vec_dot_fn dot = sp_qtraits_get(SP_QTYPE_F16)->vec_dot;
        uint16_t qh[SP_KV_MAX_HEAD_DIM];
        sp_qtraits_get(SP_QTYPE_F16)->from_float(q, qh, hd_k);
        const uint16_t *k = (const uint16_t *)kv->k + base * kv->k_dim + (size_t)kh * hd_k;
        for (uint32_t p = 0; p < n_pos; p++) dot(hd_k, &att[p], k + (size_t)p * kv->k_dim, qh);
    }
    for (uint32_t p = 0; p < n_pos; p++) {
        att[p] *= scale;
        if (att[p] > max) max = att[p];
    }
    double sum = 0.0;
    for (uint32_t p = 0; p < n_pos; p++) {
        att[p] = expf(att[p] - max);
        sum += att[p];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t p = 0; p < n_pos; p++) att[p] *= inv;
    if (kv->type == SP_KV_F32) {
        attend_v_f32((const float *)kv->v + base * kv->v_dim + (size_t)kh * hd_v, kv->v_dim, att, n_pos, hd_v, out);
        return;
    }
    /* F16: each position's values widened by the dispatched converter, then
     * out += a * v in position order (the same bits as the scalar loop). */
    const sp_to_float_fn h2f = sp_qtraits_get(SP_QTYPE_F16)->to_float;
    float vf[SP_KV_MAX_HEAD_DIM];
    for (uint32_t i = 0; i < hd_v; i++) out[i] = 0.0f;
    for (uint32_t p = 0; p < n_pos; p++) {
        h2f((const uint16_t *)kv->v + (base + p) * kv->v_dim + (size_t)kh * hd_v, vf, hd_v);
        axpy(out, att[p], vf, hd_v);
    }
}
