/*
 * ref.c -- plain-C reference kernels for every tensor type in quant.h:
 * to_float (dequantize), from_float (quantize) and vec_dot.  These are the
 * specification and the test oracle; they favour clarity over speed, and
 * SIMD variants in x86/ and arm/ must agree with them (tests/test_quant.c).
 *
 * Block layouts are in types.h (ggml's, bit for bit).  Activation quantizers
 * reproduce ggml's x86 CPU backend rounding exactly (see ref.h); weight
 * quantizers are simple and deterministic.  Not here: threading, row loops
 * over matrices, repacking.
 */
#include "ref.h"

#include "core/core.h"
#include "types.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* Round to nearest, ties to even, in the default FP environment (as
 * _mm256_round_ps(_MM_ROUND_NEAREST) and ggml's nearest_int() do).  Values
 * beyond +-2^30 saturate and NaN gives -2^30, so callers' clamps stay
 * defined on garbage input (ggml's results there are garbage too). */
static inline int round_even(float v) {
    if (!(v > -1073741824.0f && v < 1073741824.0f)) return v > 0 ? 1073741824 : -1073741824;
    return (int)rintf(v);
}

/* C's float -> int truncation (what ggml's (int8_t)(x + 8.5f) casts do for
 * in-range values), saturating like round_even outside +-2^30, NaN -> 0. */
static inline int trunc_sat(float v) {
    if (v != v) return 0;
    if (!(v > -1073741824.0f && v < 1073741824.0f)) return v > 0 ? 1073741824 : -1073741824;
    return (int)v;
}

static inline int clampi(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

/* What _mm256_cvtps_epi32 gives for an already-rounded float: the int32
 * value, or 0x80000000 for NaN and out-of-range input. */
static inline int32_t x86_cvt_i32(float r) {
    if (!(r >= -2147483648.0f && r < 2147483648.0f)) return INT32_MIN;
    return (int32_t)r;
}

/* Signed saturation to int8, as _mm256_packs_epi32 + _mm256_packs_epi16. */
static inline int8_t sat_i8(int32_t v) {
    return (int8_t)(v < -128 ? -128 : (v > 127 ? 127 : v));
}

/* ========================================================================
 * F32 / F16 / BF16
 * ======================================================================== */

/* F32 rows are copied as they are (both directions). */
void sp_f32_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void sp_f32_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* IEEE binary16 <-> float, round to nearest even (core.h converters). */
void sp_f16_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = sp_fp16_to_fp32(h[i]);
}

void sp_f16_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = sp_fp32_to_fp16(src[i]);
}

/* bfloat16 <-> float, round to nearest even, NaN made quiet. */
void sp_bf16_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = sp_bf16_to_fp32(h[i]);
}

void sp_bf16_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = sp_fp32_to_bf16(src[i]);
}

/* Dot products of float-like rows: exact products, accumulated in double in
 * element order. */
void sp_vec_dot_f32_f32_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const float *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)a[i] * b[i];
    *s = (float)sum;
}

void sp_vec_dot_f16_f16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const uint16_t *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(sp_fp16_to_fp32(a[i]) * sp_fp16_to_fp32(b[i]));
    *s = (float)sum;
}

void sp_vec_dot_bf16_bf16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const uint16_t *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(sp_bf16_to_fp32(a[i]) * sp_bf16_to_fp32(b[i]));
    *s = (float)sum;
}

/* ========================================================================
 * 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1
 * Element j < 16 is the low nibble of qs[j], element j + 16 the high one.
 * ======================================================================== */

/* x = d * (q - 8) */
void sp_q4_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK4_0 == 0);
    const struct sp_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / SP_QK4_0; i++, dst += SP_QK4_0) {
        const float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK4_0 / 2; j++) {
            dst[j] = ((b[i].qs[j] & 0x0f) - 8) * d;
            dst[j + SP_QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* x = d * q + m */
void sp_q4_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK4_1 == 0);
    const struct sp_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / SP_QK4_1; i++, dst += SP_QK4_1) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const float m = sp_fp16_to_fp32(b[i].m);
        for (int j = 0; j < SP_QK4_1 / 2; j++) {
            dst[j] = (b[i].qs[j] & 0x0f) * d + m;
            dst[j + SP_QK4_1 / 2] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void store_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The 32 5-bit values of a Q5 block, unsigned 0..31. */
static void q5_unpack(const uint8_t qh4[4], const uint8_t qs[16], int q[32]) {
    const uint32_t qh = load_u32le(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

/* x = d * (q - 16) */
void sp_q5_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK5_0 == 0);
    const struct sp_block_q5_0 *b = src;
    int q[32];
    for (int64_t i = 0; i < n / SP_QK5_0; i++, dst += SP_QK5_0) {
        const float d = sp_fp16_to_fp32(b[i].d);
        q5_unpack(b[i].qh, b[i].qs, q);
        for (int j = 0; j < SP_QK5_0; j++) dst[j] = (q[j] - 16) * d;
    }
}

/* x = d * q + m */
void sp_q5_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK5_1 == 0);
    const struct sp_block_q5_1 *b = src;
    int q[32];
    for (int64_t i = 0; i < n / SP_QK5_1; i++, dst += SP_QK5_1) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const float m = sp_fp16_to_fp32(b[i].m);
        q5_unpack(b[i].qh, b[i].qs, q);
        for (int j = 0; j < SP_QK5_1; j++) dst[j] = q[j] * d + m;
    }
}

/* x = d * q */
void sp_q8_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK8_0 == 0);
    const struct sp_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / SP_QK8_0; i++, dst += SP_QK8_0) {
        const float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK8_0; j++) dst[j] = b[i].qs[j] * d;
    }
}

/* x = d * q (s is not needed to dequantize) */
void sp_q8_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK8_1 == 0);
    const struct sp_block_q8_1 *b = src;
    for (int64_t i = 0; i < n / SP_QK8_1; i++, dst += SP_QK8_1) {
        const float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK8_1; j++) dst[j] = b[i].qs[j] * d;
    }
}

/* ---- weight quantizers (ggml's simple *_ref rules, no imatrix) ---------- */

/* The element of largest magnitude, with its sign (first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Q4_0: d = max / -8 (max signed, so it maps to q = 0), q = min(15, trunc(x/d + 8.5)). */
void sp_q4_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK4_0 == 0);
    struct sp_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / SP_QK4_0; i++, src += SP_QK4_0) {
        const float d = signed_absmax(src, SP_QK4_0) / -8;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = sp_fp32_to_fp16(d);
        for (int j = 0; j < SP_QK4_0 / 2; j++) {
            const int q0 = clampi(trunc_sat(src[j] * id + 8.5f), 0, 15);
            const int q1 = clampi(trunc_sat(src[j + SP_QK4_0 / 2] * id + 8.5f), 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

/* Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min)/d + 0.5)). */
void sp_q4_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK4_1 == 0);
    struct sp_block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / SP_QK4_1; i++, src += SP_QK4_1) {
        float lo = src[0], hi = src[0];
        for (int j = 1; j < SP_QK4_1; j++) {
            lo = SP_MIN(lo, src[j]);
            hi = SP_MAX(hi, src[j]);
        }
        const float d = (hi - lo) / 15;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = sp_fp32_to_fp16(d);
        y[i].m = sp_fp32_to_fp16(lo);
        for (int j = 0; j < SP_QK4_1 / 2; j++) {
            const int q0 = clampi(trunc_sat((src[j] - lo) * id + 0.5f), 0, 15);
            const int q1 = clampi(trunc_sat((src[j + SP_QK4_1 / 2] - lo) * id + 0.5f), 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void q5_pack(const int q[32], uint8_t qh4[4], uint8_t qs[16]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    store_u32le(qh4, qh);
}

/* Q5_0: d = max / -16, q = min(31, trunc(x/d + 16.5)). */
void sp_q5_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK5_0 == 0);
    struct sp_block_q5_0 *y = dst;
    int q[32];
    for (int64_t i = 0; i < n / SP_QK5_0; i++, src += SP_QK5_0) {
        const float d = signed_absmax(src, SP_QK5_0) / -16;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = sp_fp32_to_fp16(d);
        for (int j = 0; j < SP_QK5_0; j++) q[j] = clampi(trunc_sat(src[j] * id + 16.5f), 0, 31);
        q5_pack(q, y[i].qh, y[i].qs);
    }
}

/* Q5_1: d = (max - min) / 31, m = min, q = min(31, trunc((x - min)/d + 0.5)). */
void sp_q5_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK5_1 == 0);
    struct sp_block_q5_1 *y = dst;
    int q[32];
    for (int64_t i = 0; i < n / SP_QK5_1; i++, src += SP_QK5_1) {
        float lo = src[0], hi = src[0];
        for (int j = 1; j < SP_QK5_1; j++) {
            lo = SP_MIN(lo, src[j]);
            hi = SP_MAX(hi, src[j]);
        }
        const float d = (hi - lo) / 31;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = sp_fp32_to_fp16(d);
        y[i].m = sp_fp32_to_fp16(lo);
        for (int j = 0; j < SP_QK5_1; j++) q[j] = clampi(trunc_sat((src[j] - lo) * id + 0.5f), 0, 31);
        q5_pack(q, y[i].qh, y[i].qs);
    }
}

/* ---- activation quantizers (ggml x86 quantize_row_q8_0 / q8_1) ----------
 * amax = max |x|, d = amax / 127 (stored fp16), id = 127 / amax (0 if
 * amax == 0), q = x * id rounded half to even, saturated to int8.  Q8_1 adds
 * s = fp16(d * sum(q)) with the unrounded float d. */

static float block_amax(const float *x, int n) {
    float amax = 0;
    for (int j = 0; j < n; j++) amax = SP_MAX(amax, fabsf(x[j]));
    return amax;
}

/* Activation rule (ggml x86 quantize_row_q8_0), see above. */
void sp_q8_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK8_0 == 0);
    struct sp_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / SP_QK8_0; i++, src += SP_QK8_0) {
        const float amax = block_amax(src, SP_QK8_0);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = sp_fp32_to_fp16(d);
        for (int j = 0; j < SP_QK8_0; j++) y[i].qs[j] = sat_i8(x86_cvt_i32(rintf(src[j] * id)));
    }
}

/* Activation rule (ggml x86 quantize_row_q8_1), see above. */
void sp_q8_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK8_1 == 0);
    struct sp_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / SP_QK8_1; i++, src += SP_QK8_1) {
        const float amax = block_amax(src, SP_QK8_1);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        uint32_t sum = 0; /* wraps like the SIMD int32 adds */
        y[i].d = sp_fp32_to_fp16(d);
        for (int j = 0; j < SP_QK8_1; j++) {
            const int32_t v = x86_cvt_i32(rintf(src[j] * id));
            sum += (uint32_t)v;
            y[i].qs[j] = sat_i8(v);
        }
        y[i].s = sp_fp32_to_fp16(d * (float)(int32_t)sum);
    }
}

/* ---- dot products against Q8_0 / Q8_1 ----------------------------------- */

/* sum over blocks of (d_w * d_x) * sum((q_w - 8) * q_x) */
void sp_vec_dot_q4_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK8_0 == 0);
    const struct sp_block_q4_0 *a = w;
    const struct sp_block_q8_0 *b = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((a[i].qs[j] & 0x0f) - 8) * b[i].qs[j];
            isum += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        }
        sum += (sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d)) * (float)isum;
    }
    *s = sum;
}

/* sum(d_w*q_w + m_w)(d_x*q_x) = d_w*d_x*sum(q_w*q_x) + m_w*s_x */
void sp_vec_dot_q4_1_q8_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK8_1 == 0);
    const struct sp_block_q4_1 *a = w;
    const struct sp_block_q8_1 *b = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK8_1; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (a[i].qs[j] & 0x0f) * b[i].qs[j];
            isum += (a[i].qs[j] >> 4) * b[i].qs[j + 16];
        }
        sum += (sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d)) * (float)isum +
               sp_fp16_to_fp32(a[i].m) * sp_fp16_to_fp32(b[i].s);
    }
    *s = sum;
}

/* sum over blocks of (d_w * d_x) * sum((q_w - 16) * q_x) */
void sp_vec_dot_q5_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK8_0 == 0);
    const struct sp_block_q5_0 *a = w;
    const struct sp_block_q8_0 *b = x;
    int q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        q5_unpack(a[i].qh, a[i].qs, q);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += (q[j] - 16) * b[i].qs[j];
        sum += (sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d)) * (float)isum;
    }
    *s = sum;
}

/* as Q4_1 with 5-bit q_w */
void sp_vec_dot_q5_1_q8_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK8_1 == 0);
    const struct sp_block_q5_1 *a = w;
    const struct sp_block_q8_1 *b = x;
    int q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK8_1; i++) {
        q5_unpack(a[i].qh, a[i].qs, q);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += q[j] * b[i].qs[j];
        sum += (sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d)) * (float)isum +
               sp_fp16_to_fp32(a[i].m) * sp_fp16_to_fp32(b[i].s);
    }
    *s = sum;
}

/* sum over blocks of (d_w * d_x) * sum(q_w * q_x) */
void sp_vec_dot_q8_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK8_0 == 0);
    const struct sp_block_q8_0 *a = w;
    const struct sp_block_q8_0 *b = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += a[i].qs[j] * b[i].qs[j];
        sum += (sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d)) * (float)isum;
    }
    *s = sum;
}

/* ========================================================================
 * K-quants: 256-element super-blocks.  Each type has an unpack helper that
 * turns one block into plain per-element integers and per-sub-block scales;
 * the dequantizer, the dot product and the tests all read blocks through it,
 * so the bit layout is written down exactly once (see also types.h).
 * ======================================================================== */

/* Q2_K: q[i] in 0..3 */
static void q2_k_unpack(const struct sp_block_q2_k *b, int q[SP_QK_K]) {
    for (int i = 0; i < SP_QK_K; i++) {
        const int h = i / 128, j = (i % 128) / 32, l = i % 32;
        q[i] = (b->qs[32 * h + l] >> (2 * j)) & 3;
    }
}

/* Q3_K: q[i] in -4..3, sc[g] in -32..31 for g = i / 16 */
static void q3_k_unpack(const struct sp_block_q3_k *b, int q[SP_QK_K], int sc[16]) {
    for (int i = 0; i < SP_QK_K; i++) {
        const int h = i / 128, j = (i % 128) / 32, l = i % 32;
        const int low = (b->qs[32 * h + l] >> (2 * j)) & 3;
        const int hbit = (b->hmask[l] >> (i / 32)) & 1;
        q[i] = low - (hbit ? 0 : 4);
    }
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? b->scales[g] & 0x0f : b->scales[g - 8] >> 4;
        const int hi = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (lo | hi << 4) - 32;
    }
}

/* 6-bit scale and min of sub-block s (0..7) of Q4_K/Q5_K. */
static void k4_scale_min(const uint8_t sc12[12], int s, int *sc, int *m) {
    if (s < 4) {
        *sc = sc12[s] & 63;
        *m = sc12[s + 4] & 63;
    } else {
        *sc = (sc12[s + 4] & 0x0f) | (sc12[s - 4] >> 6) << 4;
        *m = (sc12[s + 4] >> 4) | (sc12[s] >> 6) << 4;
    }
}

/* Q4_K: q[i] in 0..15, sc/m per 32 elements */
static void q4_k_unpack(const struct sp_block_q4_k *b, int q[SP_QK_K], int sc[8], int m[8]) {
    for (int i = 0; i < SP_QK_K; i++) {
        const uint8_t byte = b->qs[32 * (i / 64) + i % 32];
        q[i] = (i % 64) < 32 ? byte & 0x0f : byte >> 4;
    }
    for (int s = 0; s < 8; s++) k4_scale_min(b->scales, s, &sc[s], &m[s]);
}

/* Q5_K: q[i] in 0..31 */
static void q5_k_unpack(const struct sp_block_q5_k *b, int q[SP_QK_K], int sc[8], int m[8]) {
    for (int i = 0; i < SP_QK_K; i++) {
        const uint8_t byte = b->qs[32 * (i / 64) + i % 32];
        const int low = (i % 64) < 32 ? byte & 0x0f : byte >> 4;
        q[i] = low | ((b->qh[i % 32] >> (i / 32)) & 1) << 4;
    }
    for (int s = 0; s < 8; s++) k4_scale_min(b->scales, s, &sc[s], &m[s]);
}

/* Q6_K: q[i] in -32..31 */
static void q6_k_unpack(const struct sp_block_q6_k *b, int q[SP_QK_K]) {
    for (int i = 0; i < SP_QK_K; i++) {
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        const uint8_t lb = b->ql[64 * h + 32 * (k & 1) + l];
        const int low = k < 2 ? lb & 0x0f : lb >> 4;
        const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
        q[i] = (low | high << 4) - 32;
    }
}

/* ---- to_float ------------------------------------------------------------ */

/* x = (d * sc) * q - (dmin * m), sc/m the nibbles of scales[i / 16] */
void sp_q2_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q2_k *b = src;
    int q[SP_QK_K];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const float dmin = sp_fp16_to_fp32(b[i].dmin);
        q2_k_unpack(&b[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (b[i].scales[g] & 0x0f);
            const float ml = dmin * (b[i].scales[g] >> 4);
            for (int l = 0; l < 16; l++) dst[16 * g + l] = dl * q[16 * g + l] - ml;
        }
    }
}

/* x = (d * sc) * q, sc in -32..31, q in -4..3 */
void sp_q3_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q3_k *b = src;
    int q[SP_QK_K], sc[16];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        const float d = sp_fp16_to_fp32(b[i].d);
        q3_k_unpack(&b[i], q, sc);
        for (int g = 0; g < 16; g++) {
            const float dl = d * sc[g];
            for (int l = 0; l < 16; l++) dst[16 * g + l] = dl * q[16 * g + l];
        }
    }
}

/* x = (d * sc) * q - (dmin * m), 6-bit sc/m per 32 elements */
void sp_q4_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q4_k *b = src;
    int q[SP_QK_K], sc[8], m[8];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const float dmin = sp_fp16_to_fp32(b[i].dmin);
        q4_k_unpack(&b[i], q, sc, m);
        for (int s = 0; s < 8; s++) {
            const float dl = d * sc[s];
            const float ml = dmin * m[s];
            for (int l = 0; l < 32; l++) dst[32 * s + l] = dl * q[32 * s + l] - ml;
        }
    }
}

/* x = (d * sc) * q - (dmin * m), q in 0..31 */
void sp_q5_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q5_k *b = src;
    int q[SP_QK_K], sc[8], m[8];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const float dmin = sp_fp16_to_fp32(b[i].dmin);
        q5_k_unpack(&b[i], q, sc, m);
        for (int s = 0; s < 8; s++) {
            const float dl = d * sc[s];
            const float ml = dmin * m[s];
            for (int l = 0; l < 32; l++) dst[32 * s + l] = dl * q[32 * s + l] - ml;
        }
    }
}

/* x = (d * scales[i / 16]) * q, q in -32..31 */
void sp_q6_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q6_k *b = src;
    int q[SP_QK_K];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        const float d = sp_fp16_to_fp32(b[i].d);
        q6_k_unpack(&b[i], q);
        for (int l = 0; l < SP_QK_K; l++) dst[l] = d * b[i].scales[l / 16] * q[l];
    }
}

/* x = d * q (fp32 d) */
void sp_q8_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q8_k *b = src;
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        for (int l = 0; l < SP_QK_K; l++) dst[l] = b[i].d * b[i].qs[l];
    }
}

/* ---- Q8_K activation quantizer (ggml quantize_row_q8_K_ref, used on x86) --
 * max = the element of largest |x| with its sign; iscale = -127 / max;
 * q = min(127, x * iscale rounded half to even); d = 1 / iscale (fp32);
 * bsums[g] = sum of q over each 16 elements.  An all-zero block gives d = 0,
 * q = 0, bsums = 0. */
void sp_q8_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q8_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        const float max = signed_absmax(src, SP_QK_K);
        if (max == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int l = 0; l < SP_QK_K; l++) y[i].qs[l] = (int8_t)clampi(round_even(iscale * src[l]), -128, 127);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- dot products against Q8_K -------------------------------------------
 * Per super-block: isum = sum over sub-blocks of scale * sum(q_w * q_x) in
 * int32 (exact), the min terms from bsums, then
 * sum += d_w * d_x * isum - dmin_w * d_x * msum in float. */

/* Q2_K: 4-bit scale and min per 16 elements */
void sp_vec_dot_q2_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q2_k *a = w;
    const struct sp_block_q8_k *b = x;
    int q[SP_QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        q2_k_unpack(&a[i], q);
        int32_t isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t gsum = 0;
            for (int l = 0; l < 16; l++) gsum += q[16 * g + l] * b[i].qs[16 * g + l];
            isum += (a[i].scales[g] & 0x0f) * gsum;
            msum += (a[i].scales[g] >> 4) * b[i].bsums[g];
        }
        sum += sp_fp16_to_fp32(a[i].d) * b[i].d * (float)isum - sp_fp16_to_fp32(a[i].dmin) * b[i].d * (float)msum;
    }
    *s = sum;
}

/* Q3_K: signed 6-bit scale per 16 elements, no min */
void sp_vec_dot_q3_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q3_k *a = w;
    const struct sp_block_q8_k *b = x;
    int q[SP_QK_K], sc[16];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        q3_k_unpack(&a[i], q, sc);
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t gsum = 0;
            for (int l = 0; l < 16; l++) gsum += q[16 * g + l] * b[i].qs[16 * g + l];
            isum += sc[g] * gsum;
        }
        sum += sp_fp16_to_fp32(a[i].d) * b[i].d * (float)isum;
    }
    *s = sum;
}

/* Q4_K: 6-bit scale and min per 32 elements; a min pairs with two bsums */
void sp_vec_dot_q4_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q4_k *a = w;
    const struct sp_block_q8_k *b = x;
    int q[SP_QK_K], sc[8], m[8];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        q4_k_unpack(&a[i], q, sc, m);
        int32_t isum = 0, msum = 0;
        for (int t = 0; t < 8; t++) {
            int32_t gsum = 0;
            for (int l = 0; l < 32; l++) gsum += q[32 * t + l] * b[i].qs[32 * t + l];
            isum += sc[t] * gsum;
            msum += m[t] * (b[i].bsums[2 * t] + b[i].bsums[2 * t + 1]);
        }
        sum += sp_fp16_to_fp32(a[i].d) * b[i].d * (float)isum - sp_fp16_to_fp32(a[i].dmin) * b[i].d * (float)msum;
    }
    *s = sum;
}

/* Q5_K: as Q4_K with 5-bit q_w */
void sp_vec_dot_q5_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q5_k *a = w;
    const struct sp_block_q8_k *b = x;
    int q[SP_QK_K], sc[8], m[8];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        q5_k_unpack(&a[i], q, sc, m);
        int32_t isum = 0, msum = 0;
        for (int t = 0; t < 8; t++) {
            int32_t gsum = 0;
            for (int l = 0; l < 32; l++) gsum += q[32 * t + l] * b[i].qs[32 * t + l];
            isum += sc[t] * gsum;
            msum += m[t] * (b[i].bsums[2 * t] + b[i].bsums[2 * t + 1]);
        }
        sum += sp_fp16_to_fp32(a[i].d) * b[i].d * (float)isum - sp_fp16_to_fp32(a[i].dmin) * b[i].d * (float)msum;
    }
    *s = sum;
}

/* Q6_K: int8 scale per 16 elements, no min */
void sp_vec_dot_q6_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q6_k *a = w;
    const struct sp_block_q8_k *b = x;
    int q[SP_QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        q6_k_unpack(&a[i], q);
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t gsum = 0;
            for (int l = 0; l < 16; l++) gsum += q[16 * g + l] * b[i].qs[16 * g + l];
            isum += a[i].scales[g] * gsum;
        }
        sum += sp_fp16_to_fp32(a[i].d) * b[i].d * (float)isum;
    }
    *s = sum;
}

/* ---- K-quant weight quantizers (Sparrow's own, not ggml's) -----------------
 * Two steps per super-block.  (1) Each sub-block gets a least-squares scale
 * (and min): try a grid of 21 trial scales around the range-filling one,
 * round the elements with each, refit the scale (and min) to those integers
 * and keep the fit with the smallest squared error.  (2) The sub-block
 * scales are themselves quantized against an fp16 super-scale, and the
 * elements are rounded again with the scales as they will be decoded. */

#define FIT_TRIALS 10 /* trial scales at nmax + 0.1*t, t = -10..10 */

/* x[0..n) ~ a*q - m with q in 0..nmax, a >= 0, m >= 0.  Returns a; *m_out = m. */
static float fit_scale_min(const float *x, int n, int nmax, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = SP_MIN(lo, x[i]);
        hi = SP_MAX(hi, x[i]);
    }
    if (lo > 0) lo = 0; /* the min term can only subtract */
    if (hi <= lo) {     /* constant block: all of it in the min */
        *m_out = -lo;
        return 0;
    }
    float best_a = (hi - lo) / nmax, best_b = lo, best_err = INFINITY;
    for (int t = -FIT_TRIALS; t <= FIT_TRIALS; t++) {
        const float inv = (nmax + 0.1f * t) / (hi - lo);
        double sq = 0, sqq = 0, sx = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            const int q = clampi(round_even((x[i] - lo) * inv), 0, nmax);
            sq += q;
            sqq += (double)q * q;
            sx += x[i];
            sqx += (double)q * x[i];
        }
        const double det = n * sqq - sq * sq;
        if (det <= 0) continue;
        double a = (n * sqx - sq * sx) / det;
        double b = (sqq * sx - sq * sqx) / det;
        if (b > 0) { /* min must be >= 0: refit the scale alone */
            b = 0;
            a = sqx / sqq;
        }
        if (a <= 0) continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            const int q = clampi(round_even((float)((x[i] - b) / a)), 0, nmax);
            const double e = a * q + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = (float)err;
            best_a = (float)a;
            best_b = (float)b;
        }
    }
    *m_out = -best_b;
    return best_a;
}

/* x[0..n) ~ s*q with q in -nneg..nneg-1.  Returns s (either sign). */
static float fit_scale_sym(const float *x, int n, int nneg) {
    const float max = signed_absmax(x, n);
    if (max == 0) return 0;
    float best_s = max / -nneg;
    double best_score = -1; /* sqx^2 / sqq, larger = smaller error */
    for (int t = -FIT_TRIALS; t <= FIT_TRIALS; t++) {
        const float inv = -(nneg + 0.1f * t) / max;
        double sqq = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            const int q = clampi(round_even(x[i] * inv), -nneg, nneg - 1);
            sqq += (double)q * q;
            sqx += (double)q * x[i];
        }
        if (sqq <= 0) continue;
        const double score = sqx * sqx / sqq;
        if (score > best_score) {
            best_score = score;
            best_s = (float)(sqx / sqq);
        }
    }
    return best_s;
}

/* Quantize v >= 0 against super-scale dd into 0..qmax. */
static int quant_scale(float v, float dd, int qmax) {
    return dd > 0 ? clampi(round_even(v / dd), 0, qmax) : 0;
}

/* Q2_K: per 16 elements a (scale, min) fit with q in 0..3; 4-bit scales and
 * mins against fp16 d = max scale / 15 and dmin = max min / 15. */
void sp_q2_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q2_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        float a[16], m[16], amax = 0, mmax = 0;
        for (int g = 0; g < 16; g++) {
            a[g] = fit_scale_min(src + 16 * g, 16, 3, &m[g]);
            amax = SP_MAX(amax, a[g]);
            mmax = SP_MAX(mmax, m[g]);
        }
        y[i].d = sp_fp32_to_fp16(amax / 15);
        y[i].dmin = sp_fp32_to_fp16(mmax / 15);
        const float dd = sp_fp16_to_fp32(y[i].d), dm = sp_fp16_to_fp32(y[i].dmin);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int g = 0; g < 16; g++) {
            const int ls = quant_scale(a[g], dd, 15), lm = quant_scale(m[g], dm, 15);
            y[i].scales[g] = (uint8_t)(ls | lm << 4);
            const float dl = dd * ls, ml = dm * lm;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l;
                const int q = dl > 0 ? clampi(round_even((src[e] + ml) / dl), 0, 3) : 0;
                y[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e % 128) / 32)));
            }
        }
    }
}

/* Q3_K: per 16 elements a symmetric fit with q in -4..3; signed 6-bit scales
 * against fp16 d chosen so the largest scale is -32. */
void sp_q3_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q3_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        float sg[16], smax = 0;
        for (int g = 0; g < 16; g++) {
            sg[g] = fit_scale_sym(src + 16 * g, 16, 4);
            if (fabsf(sg[g]) > fabsf(smax)) smax = sg[g];
        }
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = sp_fp32_to_fp16(smax / -32); /* the largest scale maps to -32 */
        const float dd = sp_fp16_to_fp32(y[i].d);
        for (int g = 0; g < 16; g++) {
            const int sc = dd != 0 ? clampi(round_even(sg[g] / dd), -32, 31) : 0;
            const int v = sc + 32;
            if (g < 8)
                y[i].scales[g] |= (uint8_t)(v & 0x0f);
            else
                y[i].scales[g - 8] |= (uint8_t)((v & 0x0f) << 4);
            y[i].scales[8 + g % 4] |= (uint8_t)((v >> 4) << (2 * (g / 4)));
            const float dl = dd * sc;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l;
                const int q = dl != 0 ? clampi(round_even(src[e] / dl), -4, 3) : 0;
                const int u = q + 4; /* 0..7: bit 2 goes to hmask, set means "no -4" */
                y[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e % 128) / 32)));
                if (u & 4) y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            }
        }
    }
}

/* Pack 6-bit scale ls and min lm of sub-block s into Q4_K/Q5_K scales[12]
 * (zeroed beforehand; sub-blocks written in order 0..7). */
static void k4_pack_scale_min(uint8_t sc12[12], int s, int ls, int lm) {
    if (s < 4) {
        sc12[s] |= (uint8_t)ls;
        sc12[s + 4] |= (uint8_t)lm;
    } else {
        sc12[s + 4] = (uint8_t)((ls & 0x0f) | (lm & 0x0f) << 4);
        sc12[s - 4] |= (uint8_t)((ls >> 4) << 6);
        sc12[s] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): sub-block fits, 6-bit scales
 * and mins, final element values q[256] in 0..nmax. */
static void k4_quantize(const float *x, int nmax, uint16_t *d, uint16_t *dmin, uint8_t sc12[12], int q[SP_QK_K]) {
    float a[8], m[8], amax = 0, mmax = 0;
    for (int s = 0; s < 8; s++) {
        a[s] = fit_scale_min(x + 32 * s, 32, nmax, &m[s]);
        amax = SP_MAX(amax, a[s]);
        mmax = SP_MAX(mmax, m[s]);
    }
    *d = sp_fp32_to_fp16(amax / 63);
    *dmin = sp_fp32_to_fp16(mmax / 63);
    const float dd = sp_fp16_to_fp32(*d), dm = sp_fp16_to_fp32(*dmin);
    memset(sc12, 0, 12);
    for (int s = 0; s < 8; s++) {
        const int ls = quant_scale(a[s], dd, 63), lm = quant_scale(m[s], dm, 63);
        k4_pack_scale_min(sc12, s, ls, lm);
        const float dl = dd * ls, ml = dm * lm;
        for (int l = 0; l < 32; l++) {
            const float v = x[32 * s + l];
            q[32 * s + l] = dl > 0 ? clampi(round_even((v + ml) / dl), 0, nmax) : 0;
        }
    }
}

/* Q4_K: per 32 elements a (scale, min) fit with q in 0..15; 6-bit scales and
 * mins against fp16 d = max scale / 63, dmin = max min / 63. */
void sp_q4_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q4_k *y = dst;
    int q[SP_QK_K];
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        k4_quantize(src, 15, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int e = 0; e < SP_QK_K; e++) y[i].qs[32 * (e / 64) + e % 32] |= (uint8_t)(q[e] << ((e % 64) < 32 ? 0 : 4));
    }
}

/* Q5_K: as Q4_K with q in 0..31. */
void sp_q5_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q5_k *y = dst;
    int q[SP_QK_K];
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        k4_quantize(src, 31, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qs, 0, sizeof y[i].qs);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int e = 0; e < SP_QK_K; e++) {
            y[i].qs[32 * (e / 64) + e % 32] |= (uint8_t)((q[e] & 0x0f) << ((e % 64) < 32 ? 0 : 4));
            y[i].qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
        }
    }
}

/* Q6_K: per 16 elements a symmetric fit with q in -32..31; int8 scales
 * against fp16 d = max |scale| / 127. */
void sp_q6_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    struct sp_block_q6_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        float sg[16], samax = 0;
        for (int g = 0; g < 16; g++) {
            sg[g] = fit_scale_sym(src + 16 * g, 16, 32);
            samax = SP_MAX(samax, fabsf(sg[g]));
        }
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = sp_fp32_to_fp16(samax / 127);
        const float dd = sp_fp16_to_fp32(y[i].d);
        for (int g = 0; g < 16; g++) {
            const int sc = dd > 0 ? clampi(round_even(sg[g] / dd), -127, 127) : 0;
            y[i].scales[g] = (int8_t)sc;
            const float dl = dd * sc;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l;
                const int q = dl != 0 ? clampi(round_even(src[e] / dl), -32, 31) : 0;
                const int u = q + 32; /* 0..63 */
                const int h = e / 128, k = (e % 128) / 32, j = e % 32;
                y[i].ql[64 * h + 32 * (k & 1) + j] |= (uint8_t)((u & 0x0f) << (k < 2 ? 0 : 4));
                y[i].qh[32 * h + j] |= (uint8_t)((u >> 4) << (2 * k));
            }
        }
    }
}
