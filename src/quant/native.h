/*
 * native.h -- Sparrow's own block types (contract; docs/FORMAT.md is the
 * byte-level spec).
 *
 * Signed INT3 / INT4 / INT6 / INT8 weights in blocks of 32, 64 or 128, with a
 * per-block scale stored as FP16 or as an 8-bit exponent-only power of two
 * (E8M0, as OCP Microscaling), plus asymmetric (scale + min) variants of the
 * low-bit types.  A block's scale and quants are contiguous.  A row whose
 * length is not a multiple of the block ends in a zero-padded last block, so
 * sp_qtype_row_bytes(t, n) = ceil(n / block) * block_bytes for these types.
 *
 * Ids start at SP_QTYPE_NATIVE_FIRST, far above ggml's, and are stable once
 * released (files carry them).  A file that holds any of them says so in its
 * metadata (sparrow.requires = "native-types-1").
 *
 * Names: "i<bits>[a|n]_b<block>[_e8|_l8]": i4_b32 (INT4, 32-blocks, FP16
 * scale), i4_b32_e8 (E8M0 scale), i4n_b32_l8 (non-uniform levels, L8 scale:
 * sign and log2 in eighths of an octave, one byte), i3a_b64 (asymmetric
 * INT3, FP16 scale + FP16 min), i4n_b64 (non-uniform 4-bit levels, FP16).
 */
#ifndef SP_QUANT_NATIVE_H
#define SP_QUANT_NATIVE_H

#include "core/core.h"
#include "quant.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define SP_QTYPE_NATIVE_FIRST 1024u
/* Ids [SP_QTYPE_NATIVE_FIRST, + SP_QTYPE_NATIVE_COUNT) are reserved for
 * Sparrow; the dispatch table has one entry per id (most are holes). */
#define SP_QTYPE_NATIVE_COUNT 128u

/* ---- ids ------------------------------------------------------------------
 * A weight type's id is FIRST + 8 * kind + 2 * blk + sc for the FP16 (sc 0)
 * and E8M0 (sc 1) scales, FIRST + 64 + 4 * kind + blk for the L8 scale (sc
 * 2), with blk 0, 1, 2 for blocks of 32, 64, 128; the 8-bit scales are for
 * the symmetric kinds only.  docs/FORMAT.md lists every id; they never
 * change. */
enum sp_native_kind {
    SP_NK_I3 = 0,  /* signed INT3, q in -4..3 */
    SP_NK_I4 = 1,  /* signed INT4, q in -8..7 */
    SP_NK_I6 = 2,  /* signed INT6, q in -32..31 */
    SP_NK_I8 = 3,  /* signed INT8, q in -128..127 */
    SP_NK_I3A = 4, /* asymmetric INT3: x = d * u + m, u in 0..7 */
    SP_NK_I4A = 5, /* asymmetric INT4: u in 0..15 */
    SP_NK_I4N = 6, /* non-uniform 4-bit: x = d * sp_native_nl4[u], u in 0..15 */
    SP_NK_COUNT = 7
};
/* Bits per value and asymmetry of a kind (constant expressions). */
#define SP_NATIVE_KIND_BITS(k)                                                                                        \
    ((k) == SP_NK_I3 || (k) == SP_NK_I3A                      ? 3                                                      \
     : (k) == SP_NK_I4 || (k) == SP_NK_I4A || (k) == SP_NK_I4N ? 4                                                      \
     : (k) == SP_NK_I6                                         ? 6                                                      \
                                                               : 8)
#define SP_NATIVE_KIND_ASYM(k) ((k) == SP_NK_I3A || (k) == SP_NK_I4A)
/* Non-uniform kinds: the code indexes a fixed table of int8 levels. */
#define SP_NATIVE_KIND_NL(k) ((k) == SP_NK_I4N)

/* Scale kinds (the sc of the ids and of SP_NATIVE_TYPES). */
enum sp_native_scale { SP_NS_F16 = 0, SP_NS_E8 = 1, SP_NS_L8 = 2 };
#define SP_NATIVE_SCALE_BYTES(sc) ((sc) == SP_NS_F16 ? 2 : 1)

#define SP_NATIVE_ID(kind, blk, sc)                                                                                   \
    ((sc) == SP_NS_L8 ? SP_QTYPE_NATIVE_FIRST + 64u + 4u * (uint32_t)(kind) + (uint32_t)(blk)                        \
                      : SP_QTYPE_NATIVE_FIRST + 8u * (uint32_t)(kind) + 2u * (uint32_t)(blk) + (uint32_t)(sc))

/* Every native weight type, as X(name, kind, blk, sc): kernel files
 * instantiate their per-type entry points from this list. */
#define SP_NATIVE_TYPES(X)                                                                                           \
    X(i3_b32, SP_NK_I3, 0, 0) X(i3_b32_e8, SP_NK_I3, 0, 1) X(i3_b64, SP_NK_I3, 1, 0) X(i3_b64_e8, SP_NK_I3, 1, 1)     \
    X(i3_b128, SP_NK_I3, 2, 0) X(i3_b128_e8, SP_NK_I3, 2, 1)                                                          \
    X(i4_b32, SP_NK_I4, 0, 0) X(i4_b32_e8, SP_NK_I4, 0, 1) X(i4_b64, SP_NK_I4, 1, 0) X(i4_b64_e8, SP_NK_I4, 1, 1)     \
    X(i4_b128, SP_NK_I4, 2, 0) X(i4_b128_e8, SP_NK_I4, 2, 1)                                                          \
    X(i6_b32, SP_NK_I6, 0, 0) X(i6_b32_e8, SP_NK_I6, 0, 1) X(i6_b64, SP_NK_I6, 1, 0) X(i6_b64_e8, SP_NK_I6, 1, 1)     \
    X(i6_b128, SP_NK_I6, 2, 0) X(i6_b128_e8, SP_NK_I6, 2, 1)                                                          \
    X(i8_b32, SP_NK_I8, 0, 0) X(i8_b32_e8, SP_NK_I8, 0, 1) X(i8_b64, SP_NK_I8, 1, 0) X(i8_b64_e8, SP_NK_I8, 1, 1)     \
    X(i8_b128, SP_NK_I8, 2, 0) X(i8_b128_e8, SP_NK_I8, 2, 1)                                                          \
    X(i3a_b32, SP_NK_I3A, 0, 0) X(i3a_b64, SP_NK_I3A, 1, 0) X(i3a_b128, SP_NK_I3A, 2, 0)                              \
    X(i4a_b32, SP_NK_I4A, 0, 0) X(i4a_b64, SP_NK_I4A, 1, 0) X(i4a_b128, SP_NK_I4A, 2, 0)                              \
    X(i4n_b32, SP_NK_I4N, 0, 0) X(i4n_b32_e8, SP_NK_I4N, 0, 1) X(i4n_b64, SP_NK_I4N, 1, 0)                            \
    X(i4n_b64_e8, SP_NK_I4N, 1, 1) X(i4n_b128, SP_NK_I4N, 2, 0) X(i4n_b128_e8, SP_NK_I4N, 2, 1)                     \
    X(i3_b32_l8, SP_NK_I3, 0, 2) X(i3_b64_l8, SP_NK_I3, 1, 2) X(i3_b128_l8, SP_NK_I3, 2, 2)                          \
    X(i4_b32_l8, SP_NK_I4, 0, 2) X(i4_b64_l8, SP_NK_I4, 1, 2) X(i4_b128_l8, SP_NK_I4, 2, 2)                          \
    X(i6_b32_l8, SP_NK_I6, 0, 2) X(i6_b64_l8, SP_NK_I6, 1, 2) X(i6_b128_l8, SP_NK_I6, 2, 2)                          \
    X(i8_b32_l8, SP_NK_I8, 0, 2) X(i8_b64_l8, SP_NK_I8, 1, 2) X(i8_b128_l8, SP_NK_I8, 2, 2)                          \
    X(i4n_b32_l8, SP_NK_I4N, 0, 2) X(i4n_b64_l8, SP_NK_I4N, 1, 2) X(i4n_b128_l8, SP_NK_I4N, 2, 2)

/* ---- the activation type ----------------------------------------------------
 * Every native weight type takes its activations as x8_b128: int8 values in
 * runs of 32, each with its own float scale and scaled sum (the min / offset
 * terms of the weight blocks), four runs to a 128-element block.  A weight
 * block of 32, 64 or 128 meets 1, 2 or 4 runs.  A row of n elements has
 * ceil(n / 128) blocks (so every weight block of a padded row has its runs);
 * elements past n are 0.  Not a storage type (files never hold it); it has
 * no vec_dot. */
#define SP_QTYPE_X8 (SP_QTYPE_NATIVE_FIRST + 127u)
#define SP_QK_X8 128 /* elements per block */
#define SP_QR_X8 32  /* elements per run */

struct sp_x8_run {
    float d;             /* x = d * q */
    float s;             /* d * sum(q) */
    int8_t qs[SP_QR_X8]; /* round_even(x / d), |q| <= 127 */
};

struct sp_block_x8 {
    struct sp_x8_run r[SP_QK_X8 / SP_QR_X8];
};

/* The reference x8_b128 quantizer (from_float of SP_QTYPE_X8): SIMD
 * variants must give its bytes exactly. */
void sp_x8_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);

/* ---- layouts ----------------------------------------------------------------
 * A block is [scale][planes]: the scale is an fp16 d (2 bytes), an E8M0
 * exponent e (1 byte, d = the float with bits e << 23), an L8 byte (d =
 * sp_l8_to_fp32) or, for the asymmetric kinds, fp16 d then fp16 m (4 bytes).  Planes hold the unsigned
 * code u of each element: INT3 = a 2-bit plane then a 1-bit plane (u = lo |
 * hi << 2), INT4 = one 4-bit plane, INT6 = a 4-bit plane then a 2-bit plane
 * (u = lo | hi << 4), INT8 = one byte per element (two's complement q).  In a
 * w-bit plane of P = block * w / 8 bytes, element k * P + j (j < P) sits in
 * bits [w k, w k + w) of byte j.  Symmetric kinds: x = d * (u - 2^(bits-1));
 * non-uniform: x = d * sp_native_nl4[u]. */
struct sp_native_layout {
    enum sp_native_kind kind;
    uint8_t bits;       /* 3, 4, 6, 8 */
    bool asym;          /* x = d * u + m */
    bool nl;            /* x = d * sp_native_nl4[u] */
    bool e8;            /* E8M0 scale */
    bool l8;            /* L8 scale */
    uint8_t l8_shift;   /* SP_NATIVE_L8_SHIFT(kind) */
    uint16_t block;     /* elements per block: 32, 64, 128 */
    uint16_t head;      /* bytes before the planes: 1, 2 or 4 */
    uint16_t bytes;     /* bytes per block */
};

/* The 16 levels of the non-uniform 4-bit kind (i4n), ascending: a
 * Lloyd-Max codebook for blocks of 32 Gaussian weights, each block with its
 * own least-squares scale (docs/FORMAT.md).  Asymmetric on purpose: the
 * sign of d picks which end gets the finer steps. */
extern const int8_t sp_native_nl4[16];

/* Index of the level of sp_native_nl4 nearest v (v in units of d; ties go
 * down; NaN gives 0). */
static inline int sp_native_nl4_index(float v) {
    int k = 0;
    while (k < 15 && v > 0.5f * (float)(sp_native_nl4[k] + sp_native_nl4[k + 1])) k++;
    return k;
}

/* Layout of native weight type t, or NULL (not native, a hole, or x8_b128). */
const struct sp_native_layout *sp_native_layout(uint32_t t);

/* The reference traits of native id t (x8_b128 included), or NULL.  traits.c
 * builds its second table from these. */
const struct sp_qtraits *sp_native_ref_traits(uint32_t t);

/* E8M0 scale byte -> float: the float with bit pattern e << 23 (e = 0 gives
 * 0, e = 255 gives +inf; OCP MX reads those as 2^-127 and NaN). */
static inline float sp_e8m0_to_fp32(uint8_t e) {
    const uint32_t bits = (uint32_t)e << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* L8 scale byte -> float: bit 7 the sign, m = bits 0..6 the magnitude,
 * d = +-2^(m / 8 - 18 + sh) for m in 1..127, m = 0 gives 0.  sh is the
 * kind's SP_NATIVE_L8_SHIFT, so that every kind covers the same block
 * maxima, about 5.3e-4 .. 29 (d = 2^-17.875 .. 2^-2.125 for the kinds whose
 * codes reach 127).  Steps of 2^(1/8) are 9% apart: rounding d to them
 * costs at most 4.4%.  Exact: the float is assembled from the sign, the
 * exponent and the correctly rounded mantissa of 2^((m % 8) / 8). */
#define SP_NATIVE_L8_SHIFT(kind) ((kind) == SP_NK_I8 || (kind) == SP_NK_I4N ? 0 : 8 - SP_NATIVE_KIND_BITS(kind))
/* The mantissa bits of 2^(k / 8), k = 0..7, correctly rounded. */
#define SP_NATIVE_L8_FRAC(k)                                                                                          \
    ((k) == 0 ? 0u : (k) == 1 ? 0x0b95c2u : (k) == 2 ? 0x1837f0u : (k) == 3 ? 0x25fed7u : (k) == 4 ? 0x3504f3u       \
     : (k) == 5 ? 0x45672au : (k) == 6 ? 0x5744fdu : 0x6ac0c7u)
/* The float bits of L8 byte c at shift sh (a constant expression for
 * constant arguments: kernels build tables from it). */
#define SP_NATIVE_L8_BITS(c, sh)                                                                                      \
    (((c) & 127u) ? (uint32_t)((c) & 128u) << 24 | ((((c) & 127u) >> 3) + 109u + (uint32_t)(sh)) << 23 |              \
                        SP_NATIVE_L8_FRAC((c) & 7u)                                                                  \
                  : 0u)
static inline float sp_l8_to_fp32(uint8_t c, int sh) {
    const uint32_t bits = SP_NATIVE_L8_BITS((uint32_t)c, sh);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The L8 byte nearest d (linear distance) for shift sh; 0 for d = 0 or
 * NaN, magnitudes clamped to the representable range. */
uint8_t sp_fp32_to_l8(float d, int sh);

/* The block scale d of layout L as its header stores it (FP16 rounding,
 * nearest power of two for E8M0, nearest L8 value). */
float sp_native_scale_round(const struct sp_native_layout *L, float d);

/* The largest |value| a block of layout L can hold (its largest scale times
 * its largest level); infinite for FP16 scales, which the quantizer never
 * needs to clamp on weights of sane size. */
float sp_native_reach(const struct sp_native_layout *L);

/* The scale d in a block's header (not the min of the asymmetric kinds). */
float sp_native_scale_get(const struct sp_native_layout *L, const void *blk);

/* Type id for a name: native names as above, and ggml names ("F32", "F16",
 * "BF16", "Q8_0", "Q4_K", ... case-insensitive).  -1 if unknown. */
int32_t sp_qtype_from_name(const char *name);

/* True for ids in the native range that name a type. */
bool sp_qtype_is_native(uint32_t t);

/* What a file's sparrow.requires must name for a tensor of type t
 * (docs/FORMAT.md): 0 nothing (ggml's types), 1 native-types-1, 2
 * native-types-2 (L8 scales), 3 native-types-3 (the resident layouts).  A
 * file names the highest level of its tensors; each level reads the ones
 * below. */
int sp_native_requires_level(uint32_t t);
/* "native-types-N" for level N in 1..3, NULL for 0 (no key). */
const char *sp_native_requires_name(int level);
/* The level a sparrow.requires value names, or -1 for a value this
 * version does not know. */
int sp_native_requires_parse(const char *value);

/* Quantize n_rows rows of n_per_row floats (row-major) into type t.  With imp
 * != NULL (n_per_row non-negative weights, one per input channel), scales and
 * rounding minimise sum_i imp[i] * (w_i - q_i)^2 per block; with NULL, the
 * plain squared error.  dst holds n_rows * sp_qtype_row_bytes(t, n_per_row)
 * bytes.  Works for native types and for every ggml type with a quantizer
 * (those ignore imp and need n_per_row % block == 0; native rows may end in
 * a padded block).  Deterministic, no global state: threads may quantize
 * disjoint rows at once.  About 15-20 M weights/s per thread for the FP16
 * and asymmetric types, several times that for E8M0.
 * SP_E_UNSUPPORTED if t cannot be quantized to; SP_E_INVALID on bad sizes. */
sp_status sp_quantize_rows(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, const float *imp,
                           void *dst);

/* sp_quantize_rows without the scale searches, for weights whose error does
 * not matter (sparrow synth's random matrices): each block's scale maps its
 * element of largest magnitude to the end of the code range (an E8M0 scale:
 * the smallest power of two that fits it; the asymmetric kinds: the block's
 * [min, max]), rounded once to the header's format.  Several times faster
 * for the native types, a larger error; ggml types as sp_quantize_rows. */
sp_status sp_quantize_rows_fast(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, void *dst);

/* Encode one block of native type t from codes chosen elsewhere (gptq.c
 * rounds against a grid of its own choosing): code[0..nv) are the signed q of
 * a symmetric kind (clamped to its range) or the unsigned u of an asymmetric
 * or non-uniform one, d the scale -- stored as FP16, for an E8M0 type as the exponent of
 * d, which must then be a positive power of two, for an L8 type as the
 * nearest L8 value (sp_native_scale_round) -- and m the asymmetric
 * kinds' min (FP16; ignored otherwise).  Elements past nv (a padded last
 * block) get the code nearest 0.  Decoding gives d * q (+ m) with d and m as
 * stored.  SP_E_INVALID if t is not a native weight type. */
sp_status sp_native_pack_block(uint32_t t, const int32_t *code, int nv, float d, float m, void *blk);

/* ---- resident g4 layouts --------------------------------------------------
 * The symmetric 64-blocks with FP16 scales (mem4's i3_b64, i4_b64, i6_b64)
 * regrouped for the decode kernels, a resident layout (quant.h): the
 * pager makes it in place when it loads weights, or a file stores it
 * (`sparrow convert`, docs/FORMAT.md); no type name resolves to it.  Per group of 4 blocks (256 elements, the
 * bytes of the 4 file blocks, rows whole groups):
 *   - the 4 FP16 scales, block order (8 bytes);
 *   - pair 0 (blocks 0 and 2), then pair 1 (blocks 1 and 3), 16 * bits
 *     bytes each: every 16-byte chunk c of the pair's planes as
 *     [chunk c of the first block | chunk c of the second], for INT4 the
 *     two chunks of the 4-bit plane, for INT6 those and the 2-bit plane,
 *     for INT3 the 2-bit plane -- then INT3's 1-bit planes as 16 bytes, in
 *     which bit 2f of byte j is the first block's high bit of element
 *     16f + j and bit 2f + 1 the second block's.
 * One 32-byte load gives a pair's chunk side by side, as the file layout's
 * decode builds it from two loads; INT3's high bits are one 16-byte load
 * and one shift, and a group's scales one 8-byte load (docs/KERNELS.md). */
#define SP_QTYPE_I3_B64_G4 1145u
#define SP_QTYPE_I4_B64_G4 1146u
#define SP_QTYPE_I6_B64_G4 1147u
#define SP_QK_G4 256 /* elements per group */

/* Repack rows (n a multiple of SP_QK_G4) from the file type to its g4 layout
 * in place; the reference to_float / vec_dot of the g4 layouts read them as
 * the file type's reference does, bit for bit. */
void sp_native_g4_repack_i3(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_native_g4_repack_i4(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_native_g4_repack_i6(void *rows, int64_t n_rows, int64_t n, size_t stride);
/* The inverses: a group back to its 4 file blocks, exactly (a permutation
 * of bytes and, for INT3, of the 1-bit planes' bits). */
void sp_native_g4_unrepack_i3(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_native_g4_unrepack_i4(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_native_g4_unrepack_i6(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_native_g4_to_float_i3(const void *restrict src, float *restrict dst, int64_t n);
void sp_native_g4_to_float_i4(const void *restrict src, float *restrict dst, int64_t n);
void sp_native_g4_to_float_i6(const void *restrict src, float *restrict dst, int64_t n);
void sp_native_g4_vec_dot_i3(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_native_g4_vec_dot_i4(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_native_g4_vec_dot_i6(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);

#endif /* SP_QUANT_NATIVE_H */
