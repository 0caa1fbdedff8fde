/*
 * kv.c -- KV cache element types (kv.h): the table of types, row store and
 * load, q4h's rotation, and the reference F32 attention kernels with their
 * dispatch table.
 */
#include "kv.h"

#include "quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>


static const struct sp_kv_type_info kv_types[SP_KV_TYPE_COUNT] = {
    [SP_KV_F32] = {"f32", 32.0, SP_QTYPE_F32, 1, false, "32-bit floats (the reference)"},
    [SP_KV_F16] = {"f16", 16.0, SP_QTYPE_F16, 1, false, "IEEE half precision (llama.cpp's default)"},
    [SP_KV_Q8_0] = {"q8_0", 8.5, SP_QTYPE_Q8_0, 32, false, "ggml Q8_0: int8 in blocks of 32, FP16 scale"},
    [SP_KV_Q4_0] = {"q4_0", 4.5, SP_QTYPE_Q4_0, 32, false, "ggml Q4_0: int4 in blocks of 32, FP16 scale"},
    [SP_KV_Q4H] = {"q4h", 4.5, 0, 32, true,
                   "Sparrow: blocks of 32 rotated (signs + Walsh-Hadamard), trellis-coded with a log scale: "
                   "keys 4.75 bits, values 4.25"},
};

const struct sp_kv_type_info *sp_kv_type_get(enum sp_kv_type t) {
    return (unsigned)t < SP_KV_TYPE_COUNT ? &kv_types[t] : NULL;
}

/* q4h's rows: the key code for SP_KV_Q4H, the value code for SP_KV_Q4H_V. */
static bool is_tq(enum sp_kv_type t) {
    return t == SP_KV_Q4H || t == SP_KV_Q4H_V;
}

size_t sp_kv_row_bytes(enum sp_kv_type t, int32_t hd) {
    if (is_tq(t)) return hd > 0 && hd % 32 == 0 ? (size_t)(hd / 32) * sp_kv_tq_block_bytes(t == SP_KV_Q4H_V) : 0;
    const struct sp_kv_type_info *ti = sp_kv_type_get(t);
    if (!ti || hd <= 0 || hd % ti->block != 0) return 0;
    return sp_qtype_row_bytes(ti->qtype, hd);
}

/* ---- the rotation -----------------------------------------------------------
 * R = H D / sqrt(32): D negates the elements whose bit is set in ROT_SIGNS
 * (a fixed pattern, so that a structured input -- one hot channel, a
 * constant -- does not meet H's own structure), H is the 32-point
 * Walsh-Hadamard matrix (entries +-1, H H = 32 I).  R is orthonormal and
 * R^-1 = D H / sqrt(32). */
#define ROT_SIGNS 0x5f3759dfu

static void wht32(float *x) {
    for (int len = 1; len < SP_KV_ROT_BLOCK; len <<= 1) {
        for (int i = 0; i < SP_KV_ROT_BLOCK; i += 2 * len) {
            for (int j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
        }
    }
}

static const float rot_norm = 0.17677669529663687f; /* 1 / sqrt(32) */

void sp_kv_rotate(float *x) {
    for (int i = 0; i < SP_KV_ROT_BLOCK; i++)
        if (ROT_SIGNS >> i & 1u) x[i] = -x[i];
    wht32(x);
    for (int i = 0; i < SP_KV_ROT_BLOCK; i++) x[i] *= rot_norm;
}

void sp_kv_unrotate(float *x) {
    wht32(x);
    for (int i = 0; i < SP_KV_ROT_BLOCK; i++) {
        x[i] *= rot_norm;
        if (ROT_SIGNS >> i & 1u) x[i] = -x[i];
    }
}

/* ---- rows ---------------------------------------------------------------- */

void sp_kv_row_store(enum sp_kv_type t, const float *x, void *dst, int32_t hd) {
    if (is_tq(t)) {
        SP_ASSERT(hd > 0 && hd % SP_KV_ROT_BLOCK == 0 && hd <= SP_KV_MAX_HEAD_DIM);
        const int val = t == SP_KV_Q4H_V;
        const size_t bb = sp_kv_tq_block_bytes(val);
        const sp_kv_tq_search_fn search = sp_attn_kernels_get()->tq_search;
        float r[SP_KV_ROT_BLOCK];
        for (int32_t b = 0; b < hd; b += SP_KV_ROT_BLOCK) {
            memcpy(r, x + b, sizeof r);
            sp_kv_rotate(r);
            sp_kv_tq_encode_with(search, val, r, (uint8_t *)dst + (size_t)(b / SP_KV_ROT_BLOCK) * bb);
        }
        return;
    }
    const struct sp_kv_type_info *ti = &kv_types[t];
    SP_ASSERT((unsigned)t < SP_KV_TYPE_COUNT && hd > 0 && hd % ti->block == 0 && hd <= SP_KV_MAX_HEAD_DIM);
    if (t == SP_KV_F32) {
        memcpy(dst, x, (size_t)hd * sizeof(float));
        return;
    }
    /* the dispatched quantizers give the reference's bytes (test_kernels) */
    sp_qtraits_get(ti->qtype)->from_float(x, dst, hd);
}

/* a row of q4h's code (value rows: val) -> F32, rotated (the dispatched
 * decoding: the reference's floats) */
static void tq_row_decode(const struct sp_attn_kernels *k, int val, const void *src, float *x, int32_t hd) {
    k->tq_decode(sp_kv_tq_code_get(val), src, x, hd / SP_KV_ROT_BLOCK);
}

void sp_kv_row_load(enum sp_kv_type t, const void *src, float *x, int32_t hd) {
    if (is_tq(t)) {
        SP_ASSERT(hd > 0 && hd % SP_KV_ROT_BLOCK == 0);
        tq_row_decode(sp_attn_kernels_get(), t == SP_KV_Q4H_V, src, x, hd);
        for (int32_t b = 0; b < hd; b += SP_KV_ROT_BLOCK) sp_kv_unrotate(x + b);
        return;
    }
    const struct sp_kv_type_info *ti = &kv_types[t];
    SP_ASSERT((unsigned)t < SP_KV_TYPE_COUNT && hd > 0 && hd % ti->block == 0);
    sp_qtraits_get(ti->qtype)->to_float(src, x, hd);
}

void sp_kv_rows_to_float(enum sp_kv_type t, const void *const *rows, int32_t n, int32_t hd, float *out) {
    if (is_tq(t)) {
        const struct sp_attn_kernels *k = sp_attn_kernels_get();
        for (int32_t r = 0; r < n; r++) tq_row_decode(k, t == SP_KV_Q4H_V, rows[r], out + (size_t)r * hd, hd);
        return;
    }
    const struct sp_kv_type_info *ti = &kv_types[t];
    if (t == SP_KV_F32) {
        for (int32_t r = 0; r < n; r++) memcpy(out + (size_t)r * hd, rows[r], (size_t)hd * sizeof(float));
        return;
    }
    const sp_to_float_fn to_float = sp_qtraits_get(ti->qtype)->to_float;
    for (int32_t r = 0; r < n; r++) to_float(rows[r], out + (size_t)r * hd, hd);
}

void sp_kv_query_prep(enum sp_kv_type t, const float *q, float *out, int32_t hd) {
    if (out != q) memcpy(out, q, (size_t)hd * sizeof(float));
    if (is_tq(t))
        for (int32_t b = 0; b < hd; b += SP_KV_ROT_BLOCK) sp_kv_rotate(out + b);
}

void sp_kv_output_fix(enum sp_kv_type t, float *o, int32_t hd) {
    if (is_tq(t))
        for (int32_t b = 0; b < hd; b += SP_KV_ROT_BLOCK) sp_kv_unrotate(o + b);
}

/* ---- reference F32 kernels -------------------------------------------------- */

void sp_attn_scores_ref(const float *restrict q, int32_t q_ld, int32_t n_q, const float *restrict k, int32_t n,
                        int32_t hd, float scale, float *restrict s) {
    for (int32_t i = 0; i < n_q; i++) {
        const float *qi = q + (size_t)i * q_ld;
        for (int32_t r = 0; r < n; r++) {
            const float *kr = k + (size_t)r * hd;
            float acc = 0.0f;
            for (int32_t c = 0; c < hd; c++) acc += qi[c] * kr[c];
            s[(size_t)i * n + r] = acc * scale;
        }
    }
}

void sp_attn_accum_ref(const float *restrict p, int32_t n_q, const float *restrict p_scale,
                       const float *restrict keep, const float *restrict v, int32_t n, int32_t hd, float *restrict o,
                       int32_t o_ld) {
    for (int32_t i = 0; i < n_q; i++) {
        float *oi = o + (size_t)i * o_ld;
        for (int32_t c = 0; c < hd; c++) oi[c] *= keep[i];
        for (int32_t r = 0; r < n; r++) {
            const float a = p[(size_t)i * n + r] * p_scale[i];
            const float *vr = v + (size_t)r * hd;
            for (int32_t c = 0; c < hd; c++) {
                const float prod = a * vr[c];
                oi[c] = oi[c] + prod;
            }
        }
    }
}

void sp_attn_exp_ref(float *x, int32_t n, float m) {
    for (int32_t r = 0; r < n; r++) x[r] = expf(x[r] - m);
}

void sp_attn_scores_t_ref(const float *restrict qt, int32_t nqp, const float *restrict k, int32_t n, int32_t hd,
                          float scale, float *restrict st) {
    for (int32_t r = 0; r < n; r++) {
        for (int32_t i = 0; i < nqp; i++) {
            float acc = 0.0f;
            for (int32_t c = 0; c < hd; c++) acc += k[(size_t)r * hd + c] * qt[(size_t)c * nqp + i];
            st[(size_t)r * nqp + i] = acc * scale;
        }
    }
}

void sp_attn_softmax_t_ref(float *restrict st, int32_t n, int32_t nqp, float *restrict m, float *restrict l,
                           float *restrict keep) {
    for (int32_t i = 0; i < nqp; i++) {
        float mx = m[i];
        for (int32_t r = 0; r < n; r++) mx = st[(size_t)r * nqp + i] > mx ? st[(size_t)r * nqp + i] : mx;
        if (mx == -INFINITY) {
            for (int32_t r = 0; r < n; r++) st[(size_t)r * nqp + i] = 0.0f;
            keep[i] = 1.0f;
            continue;
        }
        float sum = 0.0f;
        for (int32_t r = 0; r < n; r++) {
            const float p = expf(st[(size_t)r * nqp + i] - mx);
            st[(size_t)r * nqp + i] = p;
            sum += p;
        }
        const float kept = l[i] * expf(m[i] - mx), lnew = kept + sum, inv = 1.0f / lnew;
        for (int32_t r = 0; r < n; r++) st[(size_t)r * nqp + i] *= inv;
        keep[i] = kept / lnew; /* exactly 1 when the tile adds nothing (all masked) */
        m[i] = mx;
        l[i] = lnew;
    }
}

void sp_attn_accum_t_ref(const float *restrict st, int32_t nqp, int32_t nq, const float *restrict keep,
                         const float *restrict v, int32_t n, int32_t hd, float *restrict o, int32_t o_ld) {
    for (int32_t i = 0; i < nq; i++) {
        float *oi = o + (size_t)i * o_ld;
        for (int32_t c = 0; c < hd; c++) {
            float acc = oi[c] * keep[i];
            for (int32_t r = 0; r < n; r++) acc += st[(size_t)r * nqp + i] * v[(size_t)r * hd + c];
            oi[c] = acc;
        }
    }
}

static const struct sp_attn_kernels ref_kernels = {
    .scores_rows = NULL,
    .accum_rows = NULL,
    .scores = sp_attn_scores_ref,
    .accum = sp_attn_accum_ref,
    .exp = sp_attn_exp_ref,
    .scores_t = sp_attn_scores_t_ref,
    .softmax_t = sp_attn_softmax_t_ref,
    .accum_t = sp_attn_accum_t_ref,
    .wide_pad = 1,
    .tq_search = sp_kv_tq_search_ref,
    .tq_decode = sp_kv_tq_decode_ref,
};
static struct sp_attn_kernels kernels;
static atomic_int kernels_ready;

void sp_attn_kernels_init(void) {
    if (atomic_load(&kernels_ready)) return;
    kernels = ref_kernels;
    const char *isa = getenv("SPARROW_ISA");
#if defined(__x86_64__)
    {
        const int cap = !isa ? 9 : !strcmp(isa, "ref") ? 0 : !strcmp(isa, "avx2") ? 1 : !strcmp(isa, "avx512") ? 2 : 9;
        const struct sp_cpu_features *f = sp_cpu_features();
        if (cap >= 1) sp_attn_register_avx2(&kernels, f);
        if (cap >= 2) sp_attn_register_avx512(&kernels, f);
    }
#elif defined(__aarch64__)
    if (!isa || strcmp(isa, "ref")) sp_attn_register_neon(&kernels, sp_cpu_features());
#else
    (void)isa;
#endif
    atomic_store(&kernels_ready, 1);
}

const struct sp_attn_kernels *sp_attn_kernels_get(void) {
    if (!atomic_load(&kernels_ready)) sp_attn_kernels_init();
    return &kernels;
}

const struct sp_attn_kernels *sp_attn_kernels_ref(void) {
    return &ref_kernels;
}
