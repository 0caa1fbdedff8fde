/*
 * native_kernels.h -- the vec_dot kernels of Sparrow's native block types
 * (quant/native.h, docs/FORMAT.md) for AArch64, written once and compiled
 * twice like kernels.h: neon.c includes it with the SMULL + SADALP int8 dot,
 * dotprod.c with SDOT.  Not a header to include anywhere else: the includer
 * defines arm_dot16() and ARM_INLINE (kernels.h) first; everything here is
 * static to that file.
 *
 * Per weight block the codes are decoded into signed int8 vectors of 16
 * (shifts and masks of the bit planes, minus the offset of the symmetric
 * kinds), dotted with the x8_b128 activation bytes exactly in int32, then
 * the float step is native.c's expression in native.c's order, so (with
 * -ffp-contract=off, GCC's default for -std=c11) results equal the
 * reference bit for bit; the tests rely only on named tolerances.
 */
#ifndef SP_ARM_NATIVE_KERNELS_H
#define SP_ARM_NATIVE_KERNELS_H

#include "quant/native.h"

/* Field values of elements 16g..16g+15 of a w-bit plane (w = 1, 2, 4) of a
 * B-element block: P = B w / 8 bytes, element k P + j in bits [w k, w k + w)
 * of byte j. */
ARM_INLINE uint8x16_t armn_plane(const int w, const int B, const uint8_t *p, const int g) {
    const int P = B * w / 8;
    const uint8x16_t mask = vdupq_n_u8((uint8_t)((1 << w) - 1));
    if (P >= 16) { /* 16 consecutive bytes hold the 16 elements' field k */
        const int off = (16 * g) % P, k = (16 * g) / P;
        return vandq_u8(vshlq_u8(vld1q_u8(p + off), vdupq_n_s8((int8_t)(-w * k))), mask);
    }
    if (P == 8) { /* 8 bytes: fields k and k + 1 for the two halves */
        const uint8x8_t v = vld1_u8(p);
        const int k = 2 * g;
        const int8x16_t sh = vcombine_s8(vdup_n_s8((int8_t)(-w * k)), vdup_n_s8((int8_t)(-w * (k + 1))));
        return vandq_u8(vshlq_u8(vcombine_u8(v, v), sh), mask);
    }
    /* P == 4 (the 1-bit plane of a 32-block): fields 4g..4g+3, 4 bytes each */
    uint32_t u;
    memcpy(&u, p, 4);
    const int8_t s0 = (int8_t)(-4 * g);
    const int8_t shv[16] = {s0, s0, s0, s0, (int8_t)(s0 - 1), (int8_t)(s0 - 1), (int8_t)(s0 - 1), (int8_t)(s0 - 1),
                            (int8_t)(s0 - 2), (int8_t)(s0 - 2), (int8_t)(s0 - 2), (int8_t)(s0 - 2),
                            (int8_t)(s0 - 3), (int8_t)(s0 - 3), (int8_t)(s0 - 3), (int8_t)(s0 - 3)};
    return vandq_u8(vshlq_u8(vreinterpretq_u8_u32(vdupq_n_u32(u)), vld1q_s8(shv)), mask);
}

/* Signed values q of elements 16g..16g+15 (u - offset for the symmetric
 * kinds, u for the asymmetric ones, the bytes for INT8, the levels of the
 * non-uniform kind by a table lookup). */
ARM_INLINE int8x16_t armn_q(const int bits, const bool asym, const bool nl, const int B, const uint8_t *q,
                            const int g) {
    if (nl) return vqtbl1q_s8(vld1q_s8(sp_native_nl4), armn_plane(4, B, q, g));
    uint8x16_t u;
    switch (bits) {
    case 3: u = vorrq_u8(armn_plane(2, B, q, g), vshlq_n_u8(armn_plane(1, B, q + B / 4, g), 2)); break;
    case 4: u = armn_plane(4, B, q, g); break;
    case 6: u = vorrq_u8(armn_plane(4, B, q, g), vshlq_n_u8(armn_plane(2, B, q + B / 2, g), 4)); break;
    default: return vld1q_s8((const int8_t *)q + 16 * g);
    }
    if (asym) return vreinterpretq_s8_u8(u);
    return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8((int8_t)(1 << (bits - 1))));
}

/* sc: the scale kind (enum sp_native_scale), sh: the kind's L8 shift. */
ARM_INLINE float armn_dot(const int bits, const bool asym, const bool nl, const int sc, const int sh, const int B,
                          int64_t n, const uint8_t *w, const struct sp_x8_run *a) {
    const int head = asym ? 4 : SP_NATIVE_SCALE_BYTES(sc), bytes = head + B * bits / 8;
    float sum = 0;
    for (int64_t i0 = 0; i0 < n; i0 += B, w += bytes) {
        const float d = sc == SP_NS_E8 ? sp_e8m0_to_fp32(w[0]) : sc == SP_NS_L8 ? sp_l8_to_fp32(w[0], sh) : arm_h2f(w);
        float sx = 0;
        for (int j = 0; j < B / 32; j++, a++) {
            int32x4_t acc = arm_dot16(vdupq_n_s32(0), armn_q(bits, asym, nl, B, w + head, 2 * j), vld1q_s8(a->qs));
            acc = arm_dot16(acc, armn_q(bits, asym, nl, B, w + head, 2 * j + 1), vld1q_s8(a->qs + 16));
            sum += (d * a->d) * (float)vaddvq_s32(acc);
            sx = j ? sx + a->s : a->s;
        }
        if (asym) sum += arm_h2f(w + 2) * sx;
    }
    return sum;
}


#define ARMN_DEF(name, kind, blk, sc)                                                                                 \
    static void armn_vec_dot_##name(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) { \
        *s = armn_dot(SP_NATIVE_KIND_BITS(kind), SP_NATIVE_KIND_ASYM(kind), SP_NATIVE_KIND_NL(kind), (sc),             \
                      SP_NATIVE_L8_SHIFT(kind), 32 << (blk), n, w, x);                                                \
    }
SP_NATIVE_TYPES(ARMN_DEF)

/* Replace the vec_dot of every native weight type in ntable (indexed by id -
 * SP_QTYPE_NATIVE_FIRST). */
static void armn_install(struct sp_qtraits *ntable) {
#define ARMN_SET(name, kind, blk, sc) ntable[SP_NATIVE_ID(kind, blk, sc) - SP_QTYPE_NATIVE_FIRST].vec_dot = armn_vec_dot_##name;
    SP_NATIVE_TYPES(ARMN_SET)
#undef ARMN_SET
}

#endif /* SP_ARM_NATIVE_KERNELS_H */
