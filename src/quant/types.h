/*
 * types.h -- block structs of the quantized tensor types, byte for byte as
 * ggml lays them out in GGUF files (ggml-common.h is the spec).  Each struct
 * is pinned with a static_assert on its size.  fp16 fields are uint16_t bit
 * patterns (IEEE binary16, convert with sp_fp16_to_fp32 from core/core.h).
 *
 * Element order inside a block (which byte/bit holds element i) is documented
 * at each struct and implemented by the dequantizers in ref.c.  This file
 * holds no code.
 */
#ifndef SP_QUANT_TYPES_H
#define SP_QUANT_TYPES_H

#include <assert.h>
#include <stdint.h>

#define SP_QK4_0 32
#define SP_QK4_1 32
#define SP_QK5_0 32
#define SP_QK5_1 32
#define SP_QK8_0 32
#define SP_QK8_1 32
#define SP_QK_K 256 /* super-block size of the K-quants */
#define SP_K_SCALE_SIZE 12

/* ---- 32-element blocks ----------------------------------------------------
 * Element j < 16 is in the low nibble of qs[j], element j + 16 in the high
 * nibble.  Q5 types keep bit 4 of element j in bit j of the little-endian
 * 32-bit word qh. */

/* x = d * (q - 8), q in 0..15 */
struct sp_block_q4_0 {
    uint16_t d;                 /* fp16 scale */
    uint8_t qs[SP_QK4_0 / 2];   /* nibbles */
};
static_assert(sizeof(struct sp_block_q4_0) == 2 + SP_QK4_0 / 2, "wrong q4_0 block size/padding");

/* x = d * q + m, q in 0..15 */
struct sp_block_q4_1 {
    uint16_t d;                 /* fp16 scale */
    uint16_t m;                 /* fp16 min */
    uint8_t qs[SP_QK4_1 / 2];
};
static_assert(sizeof(struct sp_block_q4_1) == 2 * 2 + SP_QK4_1 / 2, "wrong q4_1 block size/padding");

/* x = d * (q - 16), q in 0..31 */
struct sp_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];              /* bit 4 of each element, little-endian u32 */
    uint8_t qs[SP_QK5_0 / 2];   /* low 4 bits */
};
static_assert(sizeof(struct sp_block_q5_0) == 2 + 4 + SP_QK5_0 / 2, "wrong q5_0 block size/padding");

/* x = d * q + m, q in 0..31 */
struct sp_block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[SP_QK5_1 / 2];
};
static_assert(sizeof(struct sp_block_q5_1) == 2 * 2 + 4 + SP_QK5_1 / 2, "wrong q5_1 block size/padding");

/* x = d * q, q in -127..127 (-128 never produced) */
struct sp_block_q8_0 {
    uint16_t d;
    int8_t qs[SP_QK8_0];
};
static_assert(sizeof(struct sp_block_q8_0) == 2 + SP_QK8_0, "wrong q8_0 block size/padding");

/* Activation type for Q4_1/Q5_1: x = d * q, s = d * sum(q) (both fp16). */
struct sp_block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[SP_QK8_1];
};
static_assert(sizeof(struct sp_block_q8_1) == 2 * 2 + SP_QK8_1, "wrong q8_1 block size/padding");

/* ---- 256-element super-blocks (K-quants) ----------------------------------
 * Q2_K/Q3_K: element i (0..255) has h = i / 128, j = (i % 128) / 32,
 * l = i % 32; its 2 low bits are (qs[32*h + l] >> 2*j) & 3.  Scales are per
 * 16 elements (index i / 16).
 * Q4_K/Q5_K: element i has c = i / 64, l = i % 32; its low 4 bits are the
 * low nibble of qs[32*c + l] when (i % 64) < 32, else the high nibble.
 * Scales/mins are per 32 elements (index i / 32), 6 bits each, packed into
 * scales[12]: for s < 4 scale = scales[s] & 63, min = scales[s+4] & 63; for
 * s >= 4 scale = (scales[s+4] & 15) | (scales[s-4] >> 6) << 4 and
 * min = (scales[s+4] >> 4) | (scales[s] >> 6) << 4. */

/* x = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3 */
struct sp_block_q2_k {
    uint8_t scales[SP_QK_K / 16]; /* low nibble scale, high nibble min */
    uint8_t qs[SP_QK_K / 4];      /* 2-bit quants */
    uint16_t d;                   /* fp16 super-scale for scales */
    uint16_t dmin;                /* fp16 super-scale for mins */
};
static_assert(sizeof(struct sp_block_q2_k) == 2 * 2 + SP_QK_K / 16 + SP_QK_K / 4, "wrong q2_K block size/padding");

/* x = d * (sc - 32) * (q - 4 * !hbit), q in 0..3; hbit of element i is bit
 * (i / 32) of hmask[i % 32].  The 16 6-bit scales sc: low 4 bits are
 * scales[s] & 15 (s < 8) or scales[s-8] >> 4 (s >= 8); high 2 bits are
 * (scales[8 + s % 4] >> 2*(s / 4)) & 3. */
struct sp_block_q3_k {
    uint8_t hmask[SP_QK_K / 8];   /* high bit */
    uint8_t qs[SP_QK_K / 4];      /* low 2 bits */
    uint8_t scales[12];           /* 16 6-bit scales */
    uint16_t d;                   /* fp16 super-scale */
};
static_assert(sizeof(struct sp_block_q3_k) == 2 + SP_QK_K / 4 + SP_QK_K / 8 + 12, "wrong q3_K block size/padding");

/* x = d * sc * q - dmin * m, q in 0..15 */
struct sp_block_q4_k {
    uint16_t d;                   /* fp16 super-scale for scales */
    uint16_t dmin;                /* fp16 super-scale for mins */
    uint8_t scales[SP_K_SCALE_SIZE]; /* 8 6-bit scales and mins */
    uint8_t qs[SP_QK_K / 2];      /* 4-bit quants */
};
static_assert(sizeof(struct sp_block_q4_k) == 2 * 2 + SP_K_SCALE_SIZE + SP_QK_K / 2, "wrong q4_K block size/padding");

/* x = d * sc * q - dmin * m, q in 0..31; bit 4 of element i is bit
 * 2*(i / 64) + ((i % 64) >= 32) of qh[i % 32]. */
struct sp_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[SP_K_SCALE_SIZE];
    uint8_t qh[SP_QK_K / 8];      /* high bit */
    uint8_t qs[SP_QK_K / 2];      /* low 4 bits */
};
static_assert(sizeof(struct sp_block_q5_k) == 2 * 2 + SP_K_SCALE_SIZE + SP_QK_K / 2 + SP_QK_K / 8,
              "wrong q5_K block size/padding");

/* x = d * scales[i / 16] * (q - 32), q in 0..63.  Element i has h = i / 128,
 * k = (i % 128) / 32, l = i % 32: low 4 bits are ql[64*h + 32*(k & 1) + l]
 * (low nibble for k < 2, high nibble for k >= 2), high 2 bits are
 * (qh[32*h + l] >> 2*k) & 3. */
struct sp_block_q6_k {
    uint8_t ql[SP_QK_K / 2];      /* low 4 bits */
    uint8_t qh[SP_QK_K / 4];      /* high 2 bits */
    int8_t scales[SP_QK_K / 16];  /* 8-bit signed scales */
    uint16_t d;                   /* fp16 super-scale */
};
static_assert(sizeof(struct sp_block_q6_k) == 3 * SP_QK_K / 4 + SP_QK_K / 16 + 2, "wrong q6_K block size/padding");

/* Activation type for the K-quants: x = d * q; bsums[g] = sum of q over
 * elements 16g..16g+15 (used for the min terms). */
struct sp_block_q8_k {
    float d;                      /* fp32 scale */
    int8_t qs[SP_QK_K];
    int16_t bsums[SP_QK_K / 16];
};
static_assert(sizeof(struct sp_block_q8_k) == sizeof(float) + SP_QK_K + SP_QK_K / 16 * sizeof(int16_t),
              "wrong q8_K block size/padding");

#endif /* SP_QUANT_TYPES_H */
