/*
 * quant.h -- tensor element types and the kernel dispatch table.
 *
 * Type ids below SP_QTYPE_COUNT are ggml's GGUF ids, so a GGUF tensor's type
 * field indexes the table directly.  Every type has one plain-C reference
 * implementation in ref.c (the specification and the test oracle); SIMD
 * variants in x86/ and arm/ replace table entries at sp_quant_init() when the
 * CPU has the features.  Block layouts are in types.h.
 *
 * Dot products follow ggml's CPU backend: the activation row is first
 * converted to the weight type's vec_dot_type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1
 * for Q4_1/Q5_1, Q8_K for the K-quants, F16 for F16, BF16 for BF16, F32 for
 * F32), then vec_dot multiplies one weight row by the converted activations.
 */
#ifndef SP_QUANT_H
#define SP_QUANT_H

#include "sparrow.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sp_qtype {
    SP_QTYPE_F32 = 0,
    SP_QTYPE_F16 = 1,
    SP_QTYPE_Q4_0 = 2,
    SP_QTYPE_Q4_1 = 3,
    SP_QTYPE_Q5_0 = 6,
    SP_QTYPE_Q5_1 = 7,
    SP_QTYPE_Q8_0 = 8,
    SP_QTYPE_Q8_1 = 9,
    SP_QTYPE_Q2_K = 10,
    SP_QTYPE_Q3_K = 11,
    SP_QTYPE_Q4_K = 12,
    SP_QTYPE_Q5_K = 13,
    SP_QTYPE_Q6_K = 14,
    SP_QTYPE_Q8_K = 15,
    SP_QTYPE_BF16 = 30,
    SP_QTYPE_COUNT = 31
};

/* Q4_0 repacked by groups of 8 blocks, a resident layout: the pager makes
 * it from Q4_0 in place when it loads weights (sp_pager_wtype), or a native
 * file stores it (`sparrow convert`, docs/FORMAT.md); no type name resolves
 * to it.  Per 256 elements, 144
 * bytes as 8 Q4_0 blocks: the 8 fp16 scales (block order), then 4 vectors of
 * 32 bytes in which dword k of vector m is bytes 4m..4m+3 of block k's qs.
 * Its id lies in the native range (native.h) so traits.c keeps its kernels
 * in the native table; docs/KERNELS.md says why the layout. */
#define SP_QTYPE_Q4_0_G8 1149u
#define SP_QK_G8 256 /* elements per group */
/* Q4_K with each super-block's quant bytes turned for decode, a resident
 * layout: the pager makes it from Q4_K in place when it loads weights
 * (sp_pager_wtype), or a native file stores it; no type name resolves to
 * it.
 * Per 256 elements the 144 bytes of a Q4_K super-block: d, dmin and the 12
 * scale bytes as Q4_K, then 4 vectors of 32 bytes in which dword k of
 * vector m holds elements 4m..4m+3 of sub-block k (32 elements) in its low
 * nibbles and 16+4m..16+4m+3 in its high ones (docs/KERNELS.md says why).
 * Its id lies in the native range (native.h), so traits.c keeps its
 * kernels in the native table. */
#define SP_QTYPE_Q4_K_G8 1148u

/* Convert n elements (n a multiple of block_elems) of packed blocks to float. */
typedef void (*sp_to_float_fn)(const void *restrict src, float *restrict dst, int64_t n);
/* Quantize n floats (n a multiple of block_elems) into packed blocks. */
typedef void (*sp_from_float_fn)(const float *restrict src, void *restrict dst, int64_t n);
/* *s = dot(w[0..n), x[0..n)) where w is one row of this type and x is the
 * activation row already converted to vec_dot_type.  n % block_elems == 0. */
typedef void (*sp_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
/* Batched product for prefill: for r in [0, n_rows) and t in [0, n_tok)
 *   y[t * ldy + r] = dot(row r of w, row t of x)
 * w: n_rows rows of n elements, w_stride bytes apart; x: n_tok activation rows
 * already converted to vec_dot_type, x_stride bytes apart.  Must give the same
 * result as vec_dot up to float summation order.  Callers split rows across
 * threads, so a kernel sees any row range (pass w and y offset). */
typedef void (*sp_gemm_fn)(int64_t n, const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict x,
                           size_t x_stride, int64_t n_tok, float *restrict y, int64_t ldy);

struct sp_qtraits {
    const char *name;             /* "Q4_K"; NULL for ids that are not types */
    int64_t block_elems;          /* elements per block */
    size_t block_bytes;           /* bytes per block */
    sp_to_float_fn to_float;      /* NULL only for none */
    sp_from_float_fn from_float;  /* NULL where no quantizer exists yet */
    sp_vec_dot_fn vec_dot;        /* NULL for activation-only types (Q8_1, Q8_K) */
    sp_gemm_fn gemm;              /* NULL: callers loop over vec_dot (sp_gemm_generic) */
    enum sp_qtype vec_dot_type;   /* what activations are converted to */
};

/* Fill the dispatch table from CPU features.  Idempotent; called by sp_init(). */
void sp_quant_init(void);

/* Traits of type t, or NULL if t is not a known type id (ggml ids below
 * SP_QTYPE_COUNT, Sparrow's native ids from SP_QTYPE_NATIVE_FIRST).  Valid after
 * sp_quant_init(); the table is read-only afterwards. */
const struct sp_qtraits *sp_qtraits_get(uint32_t t);

/* The reference (plain C) traits, never replaced by SIMD: the oracle for tests. */
const struct sp_qtraits *sp_qtraits_ref(uint32_t t);

/* The portable batched product: loops over vec_dot of type t. */
void sp_gemm_generic(uint32_t t, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                     size_t x_stride, int64_t n_tok, float *y, int64_t ldy);

/* The resident layout made from file type t (SP_QTYPE_Q4_0_G8 from Q4_0,
 * SP_QTYPE_Q4_K_G8 from Q4_K), or 0 if t has none.  Whether one is worth
 * making here is the caller's question: the table has its gemm, and rows
 * are whole blocks of it (sp_qtraits_ref(layout)->block_elems). */
uint32_t sp_qtype_resident(uint32_t t);
/* The file type resident layout r is made from, or 0 if r is not one. */
uint32_t sp_qtype_resident_from(uint32_t r);
/* Repack n_rows rows of n elements (n a multiple of r's block), stride
 * bytes apart, from r's file type to resident layout r in place. */
void sp_qtype_repack(uint32_t r, void *rows, int64_t n_rows, int64_t n, size_t stride);
/* The inverse: rows of resident layout r back to r's file type, in place,
 * byte for byte (the fallback for a file that stores r where the kernel
 * table lacks r's kernels). */
void sp_qtype_unrepack(uint32_t r, void *rows, int64_t n_rows, int64_t n, size_t stride);
/* Whether the kernel table reads resident layout r here: it has r's gemm
 * (x86 with AVX2, where AMX did not take the file type's prefill; not on
 * AArch64, not under SPARROW_ISA=ref or SPARROW_REPACK=0). */
bool sp_qtype_layout_here(uint32_t r);
/* The resident layout of file type t the kernel table reads here for rows
 * of n elements (sp_qtype_layout_here, n whole blocks of it), or 0. */
uint32_t sp_qtype_resident_here(uint32_t t, int64_t n);
/* The type a writer stores a matrix of type t (rows of n elements) as under
 * layout l (enum sp_layout, sparrow.h): NONE t's file type, AUTO the
 * resident layout of that file type the kernels read here (else the file
 * type), RESIDENT its resident layout wherever rows are whole groups of it.
 * t may itself be a resident layout (it is reduced to its file type). */
uint32_t sp_qtype_stored(uint32_t t, int64_t n, enum sp_layout l);

/* "F32", "Q4_K", ... or NULL for unknown ids. */
const char *sp_qtype_name(uint32_t t);

/* Bytes of a row of n elements, or 0 if t is unknown or n is not a multiple of
 * the block size.  Native types (native.h) pad the last block instead:
 * ceil(n / block) * block_bytes for any n >= 0. */
size_t sp_qtype_row_bytes(uint32_t t, int64_t n);

#endif /* SP_QUANT_H */
