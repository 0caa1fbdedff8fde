/*
 * kernels.h -- the integer vec_dot and gemm kernels of the ARM files, written
 * once and compiled twice: neon.c includes it with a plain-NEON int8 dot
 * (SMULL + SADALP), dotprod.c with SDOT (-march=armv8.2-a+dotprod).  Not a
 * header to include anywhere else: the includer defines arm_dot16() first,
 * and everything here is static to that file.
 *
 * Math (the spec is ref.c): each weight block is decoded into int8 vectors
 * and integer scales, the products with the activation block are summed
 * exactly in int32 (K-quants: per 16-element group times the group's
 * integer scale, min terms from the Q8_K bsums), then the float step per
 * block is ref.c's expression in ref.c's order.  So with -ffp-contract=off
 * (GCC's default for -std=c11) the results equal ref.c's bit for bit; the
 * tests still only rely on named tolerances.
 */
#ifndef SP_ARM_KERNELS_H
#define SP_ARM_KERNELS_H

#include "quant/quant.h"
#include "quant/types.h"

#include <arm_neon.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define ARM_INLINE static inline __attribute__((always_inline))

/* fp16 bit pattern -> float (FCVT, exact). */
ARM_INLINE float arm_h2f(const void *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

/* Sum of the four int32 lanes of each of a, b, c, d: {sum a, sum b, sum c, sum d}. */
ARM_INLINE int32x4_t arm_hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* Lane j of the result is 0x10 where bit j % 8 of byte lo (j < 8) or hi
 * (j >= 8) is set: the bit-4 planes of Q5_0/Q5_1. */
ARM_INLINE uint8x16_t arm_bits_to_0x10(uint8_t lo, uint8_t hi) {
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    return vandq_u8(vtstq_u8(v, vld1q_u8(sel)), vdupq_n_u8(0x10));
}

/* ==========================================================================
 * 32-element blocks: Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1
 * ========================================================================== */

enum w32_kind { W32_Q4_0, W32_Q4_1, W32_Q5_0, W32_Q5_1, W32_Q8_0 };

/* One decoded weight block: elements 0..15 in lo, 16..31 in hi; x = d*q + m. */
struct w32 {
    int8x16_t lo, hi;
    float d, m;
};

ARM_INLINE size_t w32_bytes(enum w32_kind k) {
    switch (k) {
    case W32_Q4_0: return sizeof(struct sp_block_q4_0);
    case W32_Q4_1: return sizeof(struct sp_block_q4_1);
    case W32_Q5_0: return sizeof(struct sp_block_q5_0);
    case W32_Q5_1: return sizeof(struct sp_block_q5_1);
    default: return sizeof(struct sp_block_q8_0);
    }
}

/* Q4_1 and Q5_1 pair with Q8_1 activations and carry a min. */
ARM_INLINE bool w32_has_min(enum w32_kind k) {
    return k == W32_Q4_1 || k == W32_Q5_1;
}

ARM_INLINE struct w32 w32_decode(enum w32_kind k, const uint8_t *p) {
    struct w32 r = {.m = 0};
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    switch (k) {
    case W32_Q4_0: {
        const struct sp_block_q4_0 *b = (const void *)p;
        const uint8x16_t v = vld1q_u8(b->qs);
        r.lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), vdupq_n_s8(8));
        r.hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
        r.d = arm_h2f(&b->d);
        break;
    }
    case W32_Q4_1: {
        const struct sp_block_q4_1 *b = (const void *)p;
        const uint8x16_t v = vld1q_u8(b->qs);
        r.lo = vreinterpretq_s8_u8(vandq_u8(v, m4));
        r.hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        r.d = arm_h2f(&b->d);
        r.m = arm_h2f(&b->m);
        break;
    }
    case W32_Q5_0: {
        const struct sp_block_q5_0 *b = (const void *)p;
        const uint8x16_t v = vld1q_u8(b->qs);
        const uint8x16_t lo = vorrq_u8(vandq_u8(v, m4), arm_bits_to_0x10(b->qh[0], b->qh[1]));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(v, 4), arm_bits_to_0x10(b->qh[2], b->qh[3]));
        r.lo = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(16));
        r.hi = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(16));
        r.d = arm_h2f(&b->d);
        break;
    }
    case W32_Q5_1: {
        const struct sp_block_q5_1 *b = (const void *)p;
        const uint8x16_t v = vld1q_u8(b->qs);
        r.lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, m4), arm_bits_to_0x10(b->qh[0], b->qh[1])));
        r.hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), arm_bits_to_0x10(b->qh[2], b->qh[3])));
        r.d = arm_h2f(&b->d);
        r.m = arm_h2f(&b->m);
        break;
    }
    default: {
        const struct sp_block_q8_0 *b = (const void *)p;
        r.lo = vld1q_s8(b->qs);
        r.hi = vld1q_s8(b->qs + 16);
        r.d = arm_h2f(&b->d);
        break;
    }
    }
    return r;
}

/* sum + this block's term, as ref.c writes it:
 *   Q8_0 activations: sum + (d_w * d_x) * isum
 *   Q8_1 activations: sum + ((d_w * d_x) * isum + m_w * s_x)
 * xb is one Q8_0 block (d, qs) or Q8_1 block (d, s, qs). */
ARM_INLINE float w32_step(enum w32_kind k, float sum, const struct w32 *w, const uint8_t *xb) {
    const int8_t *qs = (const int8_t *)xb + (w32_has_min(k) ? 4 : 2);
    const int32x4_t acc = arm_dot16(arm_dot16(vdupq_n_s32(0), w->lo, vld1q_s8(qs)), w->hi, vld1q_s8(qs + 16));
    const float isum = (float)vaddvq_s32(acc);
    const float dx = arm_h2f(xb);
    if (w32_has_min(k)) return sum + ((w->d * dx) * isum + w->m * arm_h2f(xb + 2));
    return sum + (w->d * dx) * isum;
}

/* One weight row against one activation row, blocks in order. */
ARM_INLINE float w32_row(enum w32_kind k, int64_t nb, const uint8_t *w, const uint8_t *x) {
    const size_t wb = w32_bytes(k), xb = w32_has_min(k) ? sizeof(struct sp_block_q8_1) : sizeof(struct sp_block_q8_0);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        const struct w32 q = w32_decode(k, w + (size_t)i * wb);
        sum = w32_step(k, sum, &q, x + (size_t)i * xb);
    }
    return sum;
}

/* sp_gemm_fn for 32-element types: each weight block is decoded once per
 * four tokens; leftover tokens go through w32_row. */
ARM_INLINE void w32_gemm(enum w32_kind k, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                         size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n / 32;
    const size_t wb = w32_bytes(k), xb = w32_has_min(k) ? sizeof(struct sp_block_q8_1) : sizeof(struct sp_block_q8_0);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        int64_t t = 0;
        for (; t + 4 <= n_tok; t += 4) {
            const uint8_t *x0 = (const uint8_t *)x + (size_t)t * x_stride;
            const uint8_t *x1 = x0 + x_stride, *x2 = x1 + x_stride, *x3 = x2 + x_stride;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t i = 0; i < nb; i++) {
                const struct w32 q = w32_decode(k, wr + (size_t)i * wb);
                const size_t o = (size_t)i * xb;
                s0 = w32_step(k, s0, &q, x0 + o);
                s1 = w32_step(k, s1, &q, x1 + o);
                s2 = w32_step(k, s2, &q, x2 + o);
                s3 = w32_step(k, s3, &q, x3 + o);
            }
            y[(t + 0) * ldy + r] = s0;
            y[(t + 1) * ldy + r] = s1;
            y[(t + 2) * ldy + r] = s2;
            y[(t + 3) * ldy + r] = s3;
        }
        for (; t < n_tok; t++) y[t * ldy + r] = w32_row(k, nb, wr, (const uint8_t *)x + (size_t)t * x_stride);
    }
}

/* ==========================================================================
 * K-quants (256-element super-blocks) against Q8_K
 * Every type decodes into the same shape: 16 vectors of 16 int8 (vector g
 * holds elements 16g..16g+15), one integer scale and one integer min per
 * 16-element group (Q4_K/Q5_K's per-32 values repeated), and the two float
 * super-scales.  Then
 *   isum = sum_g sc[g] * dot(q_g, x_g),  msum = sum_g m[g] * bsums[g]
 * are exactly ref.c's integers.
 * ========================================================================== */

enum wk_kind { WK_Q2_K, WK_Q3_K, WK_Q4_K, WK_Q5_K, WK_Q6_K };

struct wk {
    int8x16_t q[16];
    int32x4_t sc[4]; /* scales of groups 4j..4j+3 */
    int16x8_t m[2];  /* mins of groups 0..7, 8..15 (zero for Q3_K/Q6_K) */
    float d, dmin;
};

ARM_INLINE size_t wk_bytes(enum wk_kind k) {
    switch (k) {
    case WK_Q2_K: return sizeof(struct sp_block_q2_k);
    case WK_Q3_K: return sizeof(struct sp_block_q3_k);
    case WK_Q4_K: return sizeof(struct sp_block_q4_k);
    case WK_Q5_K: return sizeof(struct sp_block_q5_k);
    default: return sizeof(struct sp_block_q6_k);
    }
}

ARM_INLINE bool wk_has_min(enum wk_kind k) {
    return k == WK_Q2_K || k == WK_Q4_K || k == WK_Q5_K;
}

/* 16 signed 8-bit scales -> four int32x4 (groups 0..3, 4..7, ...). */
ARM_INLINE void wk_scales_s8(struct wk *r, int8x16_t s) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(s)), hi = vmovl_high_s8(s);
    r->sc[0] = vmovl_s16(vget_low_s16(lo));
    r->sc[1] = vmovl_high_s16(lo);
    r->sc[2] = vmovl_s16(vget_low_s16(hi));
    r->sc[3] = vmovl_high_s16(hi);
}

/* 16 unsigned mins (0..63) -> two int16x8. */
ARM_INLINE void wk_mins_u8(struct wk *r, uint8x16_t m) {
    r->m[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m)));
    r->m[1] = vreinterpretq_s16_u16(vmovl_high_u8(m));
}

/* Q4_K/Q5_K: 8 6-bit scales and mins from scales[12] (layout in types.h),
 * each repeated for the two 16-element groups of its 32-element sub-block. */
ARM_INLINE void wk_k4_scales(struct wk *r, const uint8_t sc12[12]) {
    uint32_t a[3];
    memcpy(a, sc12, sizeof a);
    const uint32_t s_lo = a[0] & 0x3f3f3f3fu;                                       /* sub-blocks 0..3 */
    const uint32_t s_hi = (a[2] & 0x0f0f0f0fu) | ((a[0] >> 6) & 0x03030303u) << 4;  /* 4..7 */
    const uint32_t m_lo = a[1] & 0x3f3f3f3fu;
    const uint32_t m_hi = ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 6) & 0x03030303u) << 4;
    const uint8x8_t s8 = vcreate_u8((uint64_t)s_lo | (uint64_t)s_hi << 32);
    const uint8x8_t m8 = vcreate_u8((uint64_t)m_lo | (uint64_t)m_hi << 32);
    wk_scales_s8(r, vreinterpretq_s8_u8(vcombine_u8(vzip1_u8(s8, s8), vzip2_u8(s8, s8))));
    wk_mins_u8(r, vcombine_u8(vzip1_u8(m8, m8), vzip2_u8(m8, m8)));
}

ARM_INLINE void wk_decode(enum wk_kind k, const uint8_t *p, struct wk *r) {
    const uint8x16_t m2 = vdupq_n_u8(3), m4 = vdupq_n_u8(0x0f);
    switch (k) {
    case WK_Q2_K: {
        /* element 128h + 32j + l: bits 2j of qs[32h + l]; group 8h + 2j + (l >= 16) */
        const struct sp_block_q2_k *b = (const void *)p;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * h), v1 = vld1q_u8(b->qs + 32 * h + 16);
            int8x16_t *q = &r->q[8 * h];
            q[0] = vreinterpretq_s8_u8(vandq_u8(v0, m2));
            q[1] = vreinterpretq_s8_u8(vandq_u8(v1, m2));
            q[2] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v0, 2), m2));
            q[3] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v1, 2), m2));
            q[4] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v0, 4), m2));
            q[5] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v1, 4), m2));
            q[6] = vreinterpretq_s8_u8(vshrq_n_u8(v0, 6));
            q[7] = vreinterpretq_s8_u8(vshrq_n_u8(v1, 6));
        }
        const uint8x16_t sm = vld1q_u8(b->scales);
        wk_scales_s8(r, vreinterpretq_s8_u8(vandq_u8(sm, m4)));
        wk_mins_u8(r, vshrq_n_u8(sm, 4));
        r->d = arm_h2f(&b->d);
        r->dmin = arm_h2f(&b->dmin);
        break;
    }
    case WK_Q3_K: {
        /* as Q2_K, minus 4 where bit (i / 32) of hmask[i % 32] is clear */
        const struct sp_block_q3_k *b = (const void *)p;
        const uint8x16_t hm0 = vld1q_u8(b->hmask), hm1 = vld1q_u8(b->hmask + 16), four = vdupq_n_u8(4);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * h), v1 = vld1q_u8(b->qs + 32 * h + 16);
            uint8x16_t lo[8];
            lo[0] = vandq_u8(v0, m2);
            lo[1] = vandq_u8(v1, m2);
            lo[2] = vandq_u8(vshrq_n_u8(v0, 2), m2);
            lo[3] = vandq_u8(vshrq_n_u8(v1, 2), m2);
            lo[4] = vandq_u8(vshrq_n_u8(v0, 4), m2);
            lo[5] = vandq_u8(vshrq_n_u8(v1, 4), m2);
            lo[6] = vshrq_n_u8(v0, 6);
            lo[7] = vshrq_n_u8(v1, 6);
            for (int j = 0; j < 4; j++) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + j)));
                const uint8x16_t sub0 = vbicq_u8(four, vtstq_u8(hm0, bit)), sub1 = vbicq_u8(four, vtstq_u8(hm1, bit));
                r->q[8 * h + 2 * j] = vsubq_s8(vreinterpretq_s8_u8(lo[2 * j]), vreinterpretq_s8_u8(sub0));
                r->q[8 * h + 2 * j + 1] = vsubq_s8(vreinterpretq_s8_u8(lo[2 * j + 1]), vreinterpretq_s8_u8(sub1));
            }
        }
        /* 16 6-bit scales: low nibbles from scales[0..7], high 2 bits from scales[8..11] */
        uint32_t a[3], s[4];
        memcpy(a, b->scales, sizeof a);
        s[0] = (a[0] & 0x0f0f0f0fu) | (a[2] & 0x03030303u) << 4;
        s[1] = (a[1] & 0x0f0f0f0fu) | ((a[2] >> 2) & 0x03030303u) << 4;
        s[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | ((a[2] >> 4) & 0x03030303u) << 4;
        s[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | ((a[2] >> 6) & 0x03030303u) << 4;
        int8x16_t sc;
        memcpy(&sc, s, sizeof sc);
        wk_scales_s8(r, vsubq_s8(sc, vdupq_n_s8(32)));
        r->m[0] = r->m[1] = vdupq_n_s16(0);
        r->d = arm_h2f(&b->d);
        r->dmin = 0;
        break;
    }
    case WK_Q4_K: {
        /* element 64c + l (l < 32): low nibble of qs[32c + l]; 64c + 32 + l: high nibble */
        const struct sp_block_q4_k *b = (const void *)p;
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * c), v1 = vld1q_u8(b->qs + 32 * c + 16);
            r->q[4 * c + 0] = vreinterpretq_s8_u8(vandq_u8(v0, m4));
            r->q[4 * c + 1] = vreinterpretq_s8_u8(vandq_u8(v1, m4));
            r->q[4 * c + 2] = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
            r->q[4 * c + 3] = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        }
        wk_k4_scales(r, b->scales);
        r->d = arm_h2f(&b->d);
        r->dmin = arm_h2f(&b->dmin);
        break;
    }
    case WK_Q5_K: {
        /* as Q4_K; bit 4 of element i is bit i / 32 of qh[i % 32] */
        const struct sp_block_q5_k *b = (const void *)p;
        const uint8x16_t qh0 = vld1q_u8(b->qh), qh1 = vld1q_u8(b->qh + 16), b4 = vdupq_n_u8(0x10);
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * c), v1 = vld1q_u8(b->qs + 32 * c + 16);
            const uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * c))), bh = vdupq_n_u8((uint8_t)(2u << (2 * c)));
            r->q[4 * c + 0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v0, m4), vandq_u8(vtstq_u8(qh0, bl), b4)));
            r->q[4 * c + 1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v1, m4), vandq_u8(vtstq_u8(qh1, bl), b4)));
            r->q[4 * c + 2] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v0, 4), vandq_u8(vtstq_u8(qh0, bh), b4)));
            r->q[4 * c + 3] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v1, 4), vandq_u8(vtstq_u8(qh1, bh), b4)));
        }
        wk_k4_scales(r, b->scales);
        r->d = arm_h2f(&b->d);
        r->dmin = arm_h2f(&b->dmin);
        break;
    }
    default: {
        /* Q6_K, element 128h + 32k + l: low 4 bits from ql[64h + 32(k & 1) + l]
         * (high nibble for k >= 2), bits 4-5 from qh[32h + l] >> 2k; minus 32 */
        const struct sp_block_q6_k *b = (const void *)p;
        const uint8x16_t m30 = vdupq_n_u8(0x30);
        const int8x16_t s32 = vdupq_n_s8(32);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
            const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            uint8x16_t u[8];
            u[0] = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(h0, 4), m30));
            u[1] = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(h1, 4), m30));
            u[2] = vorrq_u8(vandq_u8(l2, m4), vandq_u8(vshlq_n_u8(h0, 2), m30));
            u[3] = vorrq_u8(vandq_u8(l3, m4), vandq_u8(vshlq_n_u8(h1, 2), m30));
            u[4] = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(h0, m30));
            u[5] = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(h1, m30));
            u[6] = vorrq_u8(vshrq_n_u8(l2, 4), vandq_u8(vshrq_n_u8(h0, 2), m30));
            u[7] = vorrq_u8(vshrq_n_u8(l3, 4), vandq_u8(vshrq_n_u8(h1, 2), m30));
            for (int j = 0; j < 8; j++) r->q[8 * h + j] = vsubq_s8(vreinterpretq_s8_u8(u[j]), s32);
        }
        wk_scales_s8(r, vld1q_s8(b->scales));
        r->m[0] = r->m[1] = vdupq_n_s16(0);
        r->d = arm_h2f(&b->d);
        r->dmin = 0;
        break;
    }
    }
}

/* sum + this super-block's term against one Q8_K block, as ref.c writes it. */
ARM_INLINE float wk_step(enum wk_kind k, float sum, const struct wk *w, const struct sp_block_q8_k *x) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int j = 0; j < 4; j++) {
        const int8x16_t *q = &w->q[4 * j];
        const int8_t *xq = x->qs + 64 * j;
        const int32x4_t z = vdupq_n_s32(0);
        const int32x4_t g0 = arm_dot16(z, q[0], vld1q_s8(xq)), g1 = arm_dot16(z, q[1], vld1q_s8(xq + 16));
        const int32x4_t g2 = arm_dot16(z, q[2], vld1q_s8(xq + 32)), g3 = arm_dot16(z, q[3], vld1q_s8(xq + 48));
        acc = vmlaq_s32(acc, arm_hsum4(g0, g1, g2, g3), w->sc[j]);
    }
    const float isum = (float)vaddvq_s32(acc);
    if (!wk_has_min(k)) return sum + w->d * x->d * isum;
    const int16x8_t b0 = vld1q_s16(x->bsums), b1 = vld1q_s16(x->bsums + 8);
    int32x4_t m = vmull_s16(vget_low_s16(w->m[0]), vget_low_s16(b0));
    m = vmlal_high_s16(m, w->m[0], b0);
    m = vmlal_s16(m, vget_low_s16(w->m[1]), vget_low_s16(b1));
    m = vmlal_high_s16(m, w->m[1], b1);
    const float msum = (float)vaddvq_s32(m);
    return sum + (w->d * x->d * isum - w->dmin * x->d * msum);
}

ARM_INLINE float wk_row(enum wk_kind k, int64_t nb, const uint8_t *w, const struct sp_block_q8_k *x) {
    const size_t wb = wk_bytes(k);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        struct wk q;
        wk_decode(k, w + (size_t)i * wb, &q);
        sum = wk_step(k, sum, &q, &x[i]);
    }
    return sum;
}

/* sp_gemm_fn for K-quants: each super-block is decoded once per four tokens. */
ARM_INLINE void wk_gemm(enum wk_kind k, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                        size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n / SP_QK_K;
    const size_t wb = wk_bytes(k);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        int64_t t = 0;
        for (; t + 4 <= n_tok; t += 4) {
            const struct sp_block_q8_k *x0 = (const void *)((const uint8_t *)x + (size_t)t * x_stride);
            const struct sp_block_q8_k *x1 = (const void *)((const uint8_t *)x0 + x_stride);
            const struct sp_block_q8_k *x2 = (const void *)((const uint8_t *)x1 + x_stride);
            const struct sp_block_q8_k *x3 = (const void *)((const uint8_t *)x2 + x_stride);
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t i = 0; i < nb; i++) {
                struct wk q;
                wk_decode(k, wr + (size_t)i * wb, &q);
                s0 = wk_step(k, s0, &q, &x0[i]);
                s1 = wk_step(k, s1, &q, &x1[i]);
                s2 = wk_step(k, s2, &q, &x2[i]);
                s3 = wk_step(k, s3, &q, &x3[i]);
            }
            y[(t + 0) * ldy + r] = s0;
            y[(t + 1) * ldy + r] = s1;
            y[(t + 2) * ldy + r] = s2;
            y[(t + 3) * ldy + r] = s3;
        }
        for (; t < n_tok; t++) {
            y[t * ldy + r] = wk_row(k, nb, wr, (const void *)((const uint8_t *)x + (size_t)t * x_stride));
        }
    }
}

/* ==========================================================================
 * The entries: sp_vec_dot_fn / sp_gemm_fn per type, and arm_install_int()
 * which puts them in a dispatch table.
 * ========================================================================== */

#define ARM_DEF_W32(name, kind)                                                                                    \
    static void vec_dot_##name(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {    \
        *s = w32_row(kind, n / 32, w, x);                                                                          \
    }                                                                                                              \
    static void gemm_##name(int64_t n, const void *restrict w, size_t w_stride, int64_t n_rows,                   \
                            const void *restrict x, size_t x_stride, int64_t n_tok, float *restrict y,            \
                            int64_t ldy) {                                                                         \
        w32_gemm(kind, n, w, w_stride, n_rows, x, x_stride, n_tok, y, ldy);                                        \
    }

#define ARM_DEF_WK(name, kind)                                                                                     \
    static void vec_dot_##name(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {    \
        *s = wk_row(kind, n / SP_QK_K, w, x);                                                                      \
    }                                                                                                              \
    static void gemm_##name(int64_t n, const void *restrict w, size_t w_stride, int64_t n_rows,                   \
                            const void *restrict x, size_t x_stride, int64_t n_tok, float *restrict y,            \
                            int64_t ldy) {                                                                         \
        wk_gemm(kind, n, w, w_stride, n_rows, x, x_stride, n_tok, y, ldy);                                         \
    }

ARM_DEF_W32(q4_0, W32_Q4_0)
ARM_DEF_W32(q4_1, W32_Q4_1)
ARM_DEF_W32(q5_0, W32_Q5_0)
ARM_DEF_W32(q5_1, W32_Q5_1)
ARM_DEF_W32(q8_0, W32_Q8_0)
ARM_DEF_WK(q2_k, WK_Q2_K)
ARM_DEF_WK(q3_k, WK_Q3_K)
ARM_DEF_WK(q4_k, WK_Q4_K)
ARM_DEF_WK(q5_k, WK_Q5_K)
ARM_DEF_WK(q6_k, WK_Q6_K)

/* Replace vec_dot and gemm of every quantized weight type in table. */
static void arm_install_int(struct sp_qtraits *table) {
#define ARM_SET(T, name)                                                                                           \
    do {                                                                                                           \
        table[T].vec_dot = vec_dot_##name;                                                                         \
        table[T].gemm = gemm_##name;                                                                               \
    } while (0)
    ARM_SET(SP_QTYPE_Q4_0, q4_0);
    ARM_SET(SP_QTYPE_Q4_1, q4_1);
    ARM_SET(SP_QTYPE_Q5_0, q5_0);
    ARM_SET(SP_QTYPE_Q5_1, q5_1);
    ARM_SET(SP_QTYPE_Q8_0, q8_0);
    ARM_SET(SP_QTYPE_Q2_K, q2_k);
    ARM_SET(SP_QTYPE_Q3_K, q3_k);
    ARM_SET(SP_QTYPE_Q4_K, q4_k);
    ARM_SET(SP_QTYPE_Q5_K, q5_k);
    ARM_SET(SP_QTYPE_Q6_K, q6_k);
#undef ARM_SET
}

#endif /* SP_ARM_KERNELS_H */
