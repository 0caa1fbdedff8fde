/*
 * neon.c -- AArch64 Advanced SIMD kernels (baseline ARMv8-A, every arm64 CPU):
 * dot products of F32/F16/BF16 rows, the integer vec_dot and gemm kernels of
 * kernels.h with a SMULL/SADALP int8 dot, and the activation quantizers
 * (F16, BF16, Q8_0, Q8_1, Q8_K from_float), which give ref.c's bytes exactly.
 * sp_quant_register_neon() installs them and, where the CPU has the dot
 * product extension, lets dotprod.c replace the integer kernels.
 * The spec of every kernel is its ref.c counterpart (tests/test_kernels.c).
 */
#include "quant/isa.h"

#include "core/core.h"
#include "quant/ref.h"
#include "quant/types.h"

#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* acc + the products of the 16 int8 lanes of a and b, in some lane order. */
static inline __attribute__((always_inline)) int32x4_t arm_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

#include "kernels.h"
#include "native_kernels.h"

/* ==========================================================================
 * Float rows: products in float, fused into 16 float accumulators (ref.c
 * accumulates in double, so results differ by rounding only).
 * ========================================================================== */

static inline float hsum4x4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(a, b), vaddq_f32(c, d)));
}

static void vec_dot_f32(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const float *a = w, *b = x;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    float sum = hsum4x4(acc0, acc1, acc2, acc3);
    for (; i < n; i++) sum += a[i] * b[i];
    *s = sum;
}

/* F16: widen to float (exact), then as F32. */
static void vec_dot_f16(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const uint16_t *a = w, *b = x;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t a0 = vreinterpretq_f16_u16(vld1q_u16(a + i)), b0 = vreinterpretq_f16_u16(vld1q_u16(b + i));
        const float16x8_t a1 = vreinterpretq_f16_u16(vld1q_u16(a + i + 8));
        const float16x8_t b1 = vreinterpretq_f16_u16(vld1q_u16(b + i + 8));
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vget_low_f16(a0)), vcvt_f32_f16(vget_low_f16(b0)));
        acc1 = vfmaq_f32(acc1, vcvt_high_f32_f16(a0), vcvt_high_f32_f16(b0));
        acc2 = vfmaq_f32(acc2, vcvt_f32_f16(vget_low_f16(a1)), vcvt_f32_f16(vget_low_f16(b1)));
        acc3 = vfmaq_f32(acc3, vcvt_high_f32_f16(a1), vcvt_high_f32_f16(b1));
    }
    for (; i + 4 <= n; i += 4) {
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(a + i))),
                         vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(b + i))));
    }
    float sum = hsum4x4(acc0, acc1, acc2, acc3);
    for (; i < n; i++) sum += arm_h2f(a + i) * arm_h2f(b + i);
    *s = sum;
}

/* bf16 -> float is a 16-bit left shift. */
static inline float32x4_t bf16_lo(uint16x8_t v) {
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
}

static inline float32x4_t bf16_hi(uint16x8_t v) {
    return vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
}

static void vec_dot_bf16(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const uint16_t *a = w, *b = x;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const uint16x8_t a0 = vld1q_u16(a + i), b0 = vld1q_u16(b + i);
        const uint16x8_t a1 = vld1q_u16(a + i + 8), b1 = vld1q_u16(b + i + 8);
        acc0 = vfmaq_f32(acc0, bf16_lo(a0), bf16_lo(b0));
        acc1 = vfmaq_f32(acc1, bf16_hi(a0), bf16_hi(b0));
        acc2 = vfmaq_f32(acc2, bf16_lo(a1), bf16_lo(b1));
        acc3 = vfmaq_f32(acc3, bf16_hi(a1), bf16_hi(b1));
    }
    float sum = hsum4x4(acc0, acc1, acc2, acc3);
    for (; i < n; i++) sum += sp_bf16_to_fp32(a[i]) * sp_bf16_to_fp32(b[i]);
    *s = sum;
}

/* ==========================================================================
 * Activation quantizers: the same bytes as ref.c.
 * A block whose values are not all finite, or whose scale would overflow,
 * is handed to the ref.c quantizer, so the vector path only sees products
 * within +-127.5 where FCVTNS (round half to even) equals ref.c's rintf.
 * ========================================================================== */

/* float -> fp16 bits, round to nearest even (FCVT; equals sp_fp32_to_fp16). */
static inline uint16_t f2h(float f) {
    const __fp16 h = (__fp16)f;
    uint16_t r;
    memcpy(&r, &h, sizeof r);
    return r;
}

/* max |x[0..n)|, n % 16 == 0; NaN if any element is NaN (FMAX propagates it). */
static inline float amax_n(const float *x, int n) {
    float32x4_t m0 = vdupq_n_f32(0), m1 = m0, m2 = m0, m3 = m0;
    for (int j = 0; j < n; j += 16) {
        m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(x + j)));
        m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(x + j + 4)));
        m2 = vmaxq_f32(m2, vabsq_f32(vld1q_f32(x + j + 8)));
        m3 = vmaxq_f32(m3, vabsq_f32(vld1q_f32(x + j + 12)));
    }
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)));
}

/* round_half_even(x[0..16) * id) saturated to int8 into q; returns the sum
 * of the int32 values. */
static inline int32x4_t quant16(const float *x, float id, int8_t *q) {
    const int32x4_t i0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x), id));
    const int32x4_t i1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4), id));
    const int32x4_t i2 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8), id));
    const int32x4_t i3 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 12), id));
    const int16x8_t h0 = vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1));
    const int16x8_t h1 = vcombine_s16(vqmovn_s32(i2), vqmovn_s32(i3));
    vst1q_s8(q, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
    return vaddq_s32(vaddq_s32(i0, i1), vaddq_s32(i2, i3));
}

static void q8_0_from_float(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / SP_QK8_0; i++, src += SP_QK8_0) {
        const float amax = amax_n(src, SP_QK8_0);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        if (!(amax <= FLT_MAX && id <= FLT_MAX)) {
            sp_q8_0_from_float_ref(src, &y[i], SP_QK8_0);
            continue;
        }
        y[i].d = f2h(d);
        quant16(src, id, y[i].qs);
        quant16(src + 16, id, y[i].qs + 16);
    }
}

static void q8_1_from_float(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / SP_QK8_1; i++, src += SP_QK8_1) {
        const float amax = amax_n(src, SP_QK8_1);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        if (!(amax <= FLT_MAX && id <= FLT_MAX)) {
            sp_q8_1_from_float_ref(src, &y[i], SP_QK8_1);
            continue;
        }
        y[i].d = f2h(d);
        const int32x4_t s0 = quant16(src, id, y[i].qs);
        const int32x4_t s1 = quant16(src + 16, id, y[i].qs + 16);
        y[i].s = f2h(d * (float)vaddvq_s32(vaddq_s32(s0, s1)));
    }
}

/* Q8_K: the scale comes from the first element of largest magnitude, sign
 * included (ref.c's signed_absmax); bsums are the sums of 16 quants. */
static void q8_k_from_float(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_block_q8_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        const float amax = amax_n(src, SP_QK_K);
        if (!(amax <= FLT_MAX)) {
            sp_q8_k_from_float_ref(src, &y[i], SP_QK_K);
            continue;
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float32x4_t av = vdupq_n_f32(amax);
        int j = 0;
        while (!vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(src + j)), av))) j += 4;
        while (!(src[j] == amax || src[j] == -amax)) j++;
        const float iscale = -127.f / src[j];
        if (!(iscale >= -FLT_MAX && iscale <= FLT_MAX)) {
            sp_q8_k_from_float_ref(src, &y[i], SP_QK_K);
            continue;
        }
        for (int g = 0; g < SP_QK_K / 16; g++) {
            quant16(src + 16 * g, iscale, y[i].qs + 16 * g);
            y[i].bsums[g] = vaddlvq_s8(vld1q_s8(y[i].qs + 16 * g));
        }
        y[i].d = 1 / iscale;
    }
}

/* FCVTL widens exactly and makes NaNs quiet keeping the payload, as
 * sp_fp16_to_fp32 does (the values of an F16 KV cache come through here). */
static void f16_to_float(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(v)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(v));
    }
    for (; i < n; i++) dst[i] = sp_fp16_to_fp32(h[i]);
}

/* FCVTN rounds to nearest even and keeps NaN payloads as F16C does. */
static void f16_from_float(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t v = vcombine_f16(vcvt_f16_f32(vld1q_f32(src + i)), vcvt_f16_f32(vld1q_f32(src + i + 4)));
        vst1q_u16(h + i, vreinterpretq_u16_f16(v));
    }
    for (; i < n; i++) h[i] = sp_fp32_to_fp16(src[i]);
}

/* bf16 = (bits + 0x7fff + lsb) >> 16, NaN made quiet (ref.c's rule). */
static inline uint16x4_t bf16_round4(float32x4_t f) {
    const uint32x4_t u = vreinterpretq_u32_f32(f);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t q = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(64));
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(nan, q, r));
}

static void bf16_from_float(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_u16(h + i, vcombine_u16(bf16_round4(vld1q_f32(src + i)), bf16_round4(vld1q_f32(src + i + 4))));
    }
    for (; i < n; i++) h[i] = sp_fp32_to_bf16(src[i]);
}

/* ==========================================================================
 * Registration
 * ========================================================================== */

/* Install the NEON kernels into table (a copy of the reference table) when
 * f->neon, then the dot-product ones from dotprod.c when f->dotprod.  Call
 * once from sp_quant_init(); tests may call it on their own tables. */
void sp_quant_register_neon(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!f->neon) return;
    table[SP_QTYPE_F32].vec_dot = vec_dot_f32;
    table[SP_QTYPE_F16].vec_dot = vec_dot_f16;
    table[SP_QTYPE_BF16].vec_dot = vec_dot_bf16;
    table[SP_QTYPE_F16].from_float = f16_from_float;
    table[SP_QTYPE_F16].to_float = f16_to_float;
    table[SP_QTYPE_BF16].from_float = bf16_from_float;
    table[SP_QTYPE_Q8_0].from_float = q8_0_from_float;
    table[SP_QTYPE_Q8_1].from_float = q8_1_from_float;
    table[SP_QTYPE_Q8_K].from_float = q8_k_from_float;
    arm_install_int(table);
    if (f->dotprod) sp_quant_register_dotprod(table, f);
}

/* The native types' vec_dot (native_kernels.h) into ntable, indexed by id -
 * SP_QTYPE_NATIVE_FIRST; the SDOT ones from dotprod.c when f->dotprod. */
void sp_quant_register_native_neon(struct sp_qtraits *ntable, const struct sp_cpu_features *f) {
    if (!f->neon) return;
    armn_install(ntable);
    if (f->dotprod) sp_quant_register_native_dotprod(ntable, f);
}

/* ==========================================================================
 * The F32 attention kernels of quant/kv.h: four key rows at a time against
 * one query (fused multiply-adds, another summation order than the
 * reference); values accumulated for up to 8 queries per run of 4 columns,
 * multiply then add in row order (the reference's bits).
 * ========================================================================== */
#include "quant/kv.h"

static void kv_scores_neon(const float *restrict q, int32_t q_ld, int32_t n_q, const float *restrict k, int32_t n,
                           int32_t hd, float scale, float *restrict s) {
    const int32_t hv = hd - hd % 4;
    for (int32_t i = 0; i < n_q; i++) {
        const float *qi = q + (size_t)i * q_ld;
        float *si = s + (size_t)i * n;
        int32_t r = 0;
        for (; r + 4 <= n; r += 4) {
            const float *k0 = k + (size_t)r * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
            float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t c = 0; c < hv; c += 4) {
                const float32x4_t qv = vld1q_f32(qi + c);
                a0 = vfmaq_f32(a0, qv, vld1q_f32(k0 + c));
                a1 = vfmaq_f32(a1, qv, vld1q_f32(k1 + c));
                a2 = vfmaq_f32(a2, qv, vld1q_f32(k2 + c));
                a3 = vfmaq_f32(a3, qv, vld1q_f32(k3 + c));
            }
            float t0 = vaddvq_f32(a0), t1 = vaddvq_f32(a1), t2 = vaddvq_f32(a2), t3 = vaddvq_f32(a3);
            for (int32_t c = hv; c < hd; c++) {
                t0 += qi[c] * k0[c];
                t1 += qi[c] * k1[c];
                t2 += qi[c] * k2[c];
                t3 += qi[c] * k3[c];
            }
            si[r] = t0 * scale;
            si[r + 1] = t1 * scale;
            si[r + 2] = t2 * scale;
            si[r + 3] = t3 * scale;
        }
        for (; r < n; r++) {
            const float *kr = k + (size_t)r * hd;
            float32x4_t a = vdupq_n_f32(0);
            for (int32_t c = 0; c < hv; c += 4) a = vfmaq_f32(a, vld1q_f32(qi + c), vld1q_f32(kr + c));
            float t = vaddvq_f32(a);
            for (int32_t c = hv; c < hd; c++) t += qi[c] * kr[c];
            si[r] = t * scale;
        }
    }
}

static void kv_accum_neon(const float *restrict p0, int32_t n_q, const float *restrict p_scale,
                          const float *restrict keep, const float *restrict v, int32_t n, int32_t hd,
                          float *restrict o, int32_t o_ld) {
    enum { QB = 8 };
    const int32_t hv = hd - hd % 4;
    float p[QB * SP_KV_TILE]; /* p * p_scale, the weights the reference multiplies by */
    for (int32_t i0 = 0; i0 < n_q; i0 += QB) {
        const int32_t nq = n_q - i0 < QB ? n_q - i0 : QB;
        for (int32_t i = 0; i < nq; i++) {
            float *oi = o + (size_t)(i0 + i) * o_ld;
            for (int32_t c = 0; c < hd; c++) oi[c] *= keep[i0 + i];
            for (int32_t r = 0; r < n; r++) p[(size_t)i * n + r] = p0[(size_t)(i0 + i) * n + r] * p_scale[i0 + i];
        }
        const float *pb = p;
        float *ob = o + (size_t)i0 * o_ld;
        for (int32_t c = 0; c < hv; c += 4) {
            float32x4_t acc[QB];
            for (int32_t i = 0; i < nq; i++) acc[i] = vld1q_f32(ob + (size_t)i * o_ld + c);
            for (int32_t r = 0; r < n; r++) {
                const float32x4_t vr = vld1q_f32(v + (size_t)r * hd + c);
                for (int32_t i = 0; i < nq; i++) acc[i] = vaddq_f32(acc[i], vmulq_n_f32(vr, pb[(size_t)i * n + r]));
            }
            for (int32_t i = 0; i < nq; i++) vst1q_f32(ob + (size_t)i * o_ld + c, acc[i]);
        }
        for (int32_t i = 0; i < nq; i++) {
            float *oi = ob + (size_t)i * o_ld;
            for (int32_t r = 0; r < n; r++) {
                const float a = pb[(size_t)i * n + r];
                for (int32_t c = hv; c < hd; c++) {
                    const float prod = a * v[(size_t)r * hd + c];
                    oi[c] = oi[c] + prod;
                }
            }
        }
    }
}

/* exp(x) for x <= 0 lanes as the x86 variant: Cody-Waite reduction, degree-6
 * Taylor polynomial, 2^n through the exponent bits; below -87.3 gives 0. */
static inline float32x4_t kv_exp_neon(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(-87.33654f);
    const uint32x4_t ok = vcgeq_f32(x, lo);
    x = vmaxq_f32(x, lo);
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_n_f32(x, n, 0.693359375f);
    r = vfmsq_n_f32(r, n, -2.12194440e-4f);
    float32x4_t p = vdupq_n_f32(1.0f / 720.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_f32(y)));
}

static void kv_exp_vec_neon(float *x, int32_t n, float m) {
    const float32x4_t mv = vdupq_n_f32(m);
    int32_t r = 0;
    for (; r + 4 <= n; r += 4) vst1q_f32(x + r, kv_exp_neon(vsubq_f32(vld1q_f32(x + r), mv)));
    for (; r < n; r++) x[r] = expf(x[r] - m);
}

/* The wide path (kv.h): four key rows x 16 query columns per block. */
static void kv_scores_t_neon(const float *restrict qt, int32_t nqp, const float *restrict k, int32_t n, int32_t hd,
                             float scale, float *restrict st) {
    for (int32_t i0 = 0; i0 < nqp; i0 += 16) {
        int32_t r = 0;
        for (; r + 4 <= n; r += 4) {
            const float *k0 = k + (size_t)r * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
            float32x4_t a[4][4];
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) a[x][b] = vdupq_n_f32(0);
            for (int32_t c = 0; c < hd; c++) {
                const float *qc = qt + (size_t)c * nqp + i0;
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) {
                    const float32x4_t q = vld1q_f32(qc + 4 * b);
                    a[0][b] = vfmaq_n_f32(a[0][b], q, k0[c]);
                    a[1][b] = vfmaq_n_f32(a[1][b], q, k1[c]);
                    a[2][b] = vfmaq_n_f32(a[2][b], q, k2[c]);
                    a[3][b] = vfmaq_n_f32(a[3][b], q, k3[c]);
                }
            }
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) vst1q_f32(st + (size_t)(r + x) * nqp + i0 + 4 * b, vmulq_n_f32(a[x][b], scale));
        }
        for (; r < n; r++) {
            const float *kr = k + (size_t)r * hd;
            float32x4_t a[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (int32_t c = 0; c < hd; c++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) a[b] = vfmaq_n_f32(a[b], vld1q_f32(qt + (size_t)c * nqp + i0 + 4 * b), kr[c]);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) vst1q_f32(st + (size_t)r * nqp + i0 + 4 * b, vmulq_n_f32(a[b], scale));
        }
    }
}

static void kv_softmax_t_neon(float *restrict st, int32_t n, int32_t nqp, float *restrict m, float *restrict l,
                              float *restrict keep) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0), one = vdupq_n_f32(1.0f);
    for (int32_t i = 0; i < nqp; i += 4) {
        const float32x4_t m0 = vld1q_f32(m + i), l0 = vld1q_f32(l + i);
        float32x4_t mx = m0;
        for (int32_t r = 0; r < n; r++) mx = vmaxq_f32(mx, vld1q_f32(st + (size_t)r * nqp + i));
        const uint32x4_t dead = vceqq_f32(mx, ninf);
        const float32x4_t mxs = vbslq_f32(dead, zero, mx);
        float32x4_t sum = zero;
        for (int32_t r = 0; r < n; r++) {
            const float32x4_t p = kv_exp_neon(vsubq_f32(vld1q_f32(st + (size_t)r * nqp + i), mxs));
            vst1q_f32(st + (size_t)r * nqp + i, p);
            sum = vaddq_f32(sum, p);
        }
        const float32x4_t kept = vmulq_f32(l0, kv_exp_neon(vsubq_f32(m0, mxs)));
        const float32x4_t lnew = vaddq_f32(kept, sum);
        const float32x4_t inv = vbslq_f32(dead, zero, vdivq_f32(one, lnew));
        for (int32_t r = 0; r < n; r++) vst1q_f32(st + (size_t)r * nqp + i, vmulq_f32(vld1q_f32(st + (size_t)r * nqp + i), inv));
        vst1q_f32(keep + i, vbslq_f32(dead, one, vdivq_f32(kept, lnew)));
        vst1q_f32(m + i, vbslq_f32(dead, m0, mx));
        vst1q_f32(l + i, vbslq_f32(dead, l0, lnew));
    }
}

static void kv_accum_t_neon(const float *restrict st, int32_t nqp, int32_t nq, const float *restrict keep,
                            const float *restrict v, int32_t n, int32_t hd, float *restrict o, int32_t o_ld) {
    const int32_t hv = hd - hd % 4;
    int32_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        for (int32_t c = 0; c < hv; c += 4) {
            float32x4_t a[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) a[q] = vmulq_n_f32(vld1q_f32(o + (size_t)(i + q) * o_ld + c), keep[i + q]);
            for (int32_t r = 0; r < n; r++) {
                const float32x4_t vv = vld1q_f32(v + (size_t)r * hd + c);
                const float *pr = st + (size_t)r * nqp + i;
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) a[q] = vfmaq_n_f32(a[q], vv, pr[q]);
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) vst1q_f32(o + (size_t)(i + q) * o_ld + c, a[q]);
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            float *oq = o + (size_t)(i + q) * o_ld;
            for (int32_t c = hv; c < hd; c++) {
                float acc = oq[c] * keep[i + q];
                for (int32_t r = 0; r < n; r++) acc += st[(size_t)r * nqp + i + q] * v[(size_t)r * hd + c];
                oq[c] = acc;
            }
        }
    }
    for (; i < nq; i++) {
        float *oq = o + (size_t)i * o_ld;
        for (int32_t c = 0; c < hd; c++) {
            float acc = oq[c] * keep[i];
            for (int32_t r = 0; r < n; r++) acc += st[(size_t)r * nqp + i] * v[(size_t)r * hd + c];
            oq[c] = acc;
        }
    }
}

/* ==========================================================================
 * q4h's trellis search (quant/kv_tq.h): the next position's codes across
 * the lanes (4 per vector, 8 to 32 codes: 2 to 8 vectors), the previous
 * codes in a loop, each term as the reference computes it (d * level,
 * difference, square, plus the previous cost: no FMA) and a strict
 * less-than with a select (FMIN would pass a NaN on), so each lane keeps
 * the reference's minimum and its first previous code.  The decoding stays
 * on the reference (a table lookup per value; NEON has no gather).
 * ========================================================================== */
#include "quant/kv_tq.h"

#define TQN_UPD(V)                                                                                                   \
    do {                                                                                                             \
        const float32x4_t t = vmulq_f32(dv, vld1q_f32(l + 4 * (V)));                                                 \
        const float32x4_t r = vsubq_f32(xv, t);                                                                      \
        const float32x4_t v = vaddq_f32(cs, vmulq_f32(r, r));                                                        \
        const uint32x4_t lt = vcltq_f32(v, b[V]);                                                                    \
        b[V] = vbslq_f32(lt, v, b[V]);                                                                               \
        if (fr) ix[V] = vbslq_u32(lt, sv, ix[V]);                                                                    \
    } while (0)

#define TQN_STEP(NV)                                                                                                 \
    do {                                                                                                             \
        float32x4_t b[8];                                                                                            \
        uint32x4_t ix[8];                                                                                            \
        for (int v_ = 0; v_ < (NV); v_++) b[v_] = vdupq_n_f32(INFINITY), ix[v_] = vdupq_n_u32(0);                    \
        for (uint32_t s = 0; s < np; s++) {                                                                          \
            const float32x4_t cs = vdupq_n_f32(cp[s]);                                                               \
            const uint32x4_t sv = vdupq_n_u32(s);                                                                    \
            const float *l = lev + (s << nb);                                                                        \
            for (int v_ = 0; v_ < (NV); v_++) TQN_UPD(v_);                                                           \
        }                                                                                                            \
        for (int v_ = 0; v_ < (NV); v_++) {                                                                          \
            vst1q_f32(cn + 4 * v_, b[v_]);                                                                           \
            if (fr) vst1q_u32(fr + 4 * v_, ix[v_]);                                                                  \
        }                                                                                                            \
    } while (0)

static inline void tq_step_neon(const float *cp, uint32_t np, const float *lev, uint32_t nb, float x, float d,
                                float *cn, uint32_t *fr) {
    const float32x4_t xv = vdupq_n_f32(x), dv = vdupq_n_f32(d);
    const uint32_t nv = (1u << nb) / 4;
    if (nv == 2) TQN_STEP(2);
    else if (nv == 4) TQN_STEP(4);
    else TQN_STEP(8);
}
#undef TQN_STEP
#undef TQN_UPD

/* q: a code of 3- to 5-bit positions (tq_search_ok_neon). */
static float tq_search_neon(const struct sp_kv_tq_code *q, const float *x, float d, uint8_t *code) {
    float cost[2][SP_KV_TQ_MAXC];
    uint32_t from[SP_KV_TQ_N][SP_KV_TQ_MAXC];
    const uint32_t n0 = 1u << q->bits[0];
    {
        const float32x4_t dv = vdupq_n_f32(d), xv = vdupq_n_f32(x[0]);
        for (uint32_t c = 0; c < n0; c += 4) {
            const float32x4_t r = vsubq_f32(xv, vmulq_f32(dv, vld1q_f32(q->lev[0] + c)));
            vst1q_f32(cost[0] + c, vmulq_f32(r, r));
        }
    }
    int cur = 0;
    for (int j = 1; j < SP_KV_TQ_N; j++, cur ^= 1)
        tq_step_neon(cost[cur], 1u << q->bits[j - 1], q->lev[j], q->bits[j], x[j], d, cost[cur ^ 1],
                     code ? from[j] : NULL);
    const float *last = cost[cur];
    const uint32_t n = 1u << q->bits[SP_KV_TQ_N - 1];
    uint32_t bc = 0;
    for (uint32_t c = 1; c < n; c++)
        if (last[c] < last[bc]) bc = c;
    const float e = last[bc];
    if (!code) return e;
    for (int j = SP_KV_TQ_N - 1; j >= 0; j--) {
        code[j] = (uint8_t)bc;
        bc = j ? from[j][bc] : 0;
    }
    return e;
}

static bool tq_search_ok_neon(const struct sp_kv_tq_code *q) {
    for (int j = 0; j < SP_KV_TQ_N; j++)
        if (q->bits[j] < 3 || q->bits[j] > 5) return false;
    return true;
}

void sp_attn_register_neon(struct sp_attn_kernels *k, const struct sp_cpu_features *f) {
    if (!f->neon) return;
    k->scores = kv_scores_neon;
    k->accum = kv_accum_neon;
    k->exp = kv_exp_vec_neon;
    k->scores_t = kv_scores_t_neon;
    k->softmax_t = kv_softmax_t_neon;
    k->accum_t = kv_accum_t_neon;
    k->wide_pad = 16;
    if (tq_search_ok_neon(sp_kv_tq_code_get(0)) && tq_search_ok_neon(sp_kv_tq_code_get(1)))
        k->tq_search = tq_search_neon;
}
