/*
 * kv.h -- the element types of the KV cache and the kernels attention runs
 * on them.
 *
 * A KV type stores one head's row (head_dim values) of a key or a value.
 * f32, f16, q8_0 and q4_0 are ggml's formats, stored as llama.cpp stores
 * them (q8_0 / q4_0 need head_dim % 32 == 0).  q4h is Sparrow's own: each
 * 32-value block of the row is rotated by a fixed orthonormal transform
 * (random signs, then a 32-point Walsh-Hadamard transform, / sqrt(32)) and
 * stored as a trellis code (kv_tq.c): a 10-bit log scale and 32 codes, each
 * value a level chosen by its code from a table the previous code picks.
 * Keys and values take two sizes of it: keys 19 bytes per 32 values (4.75
 * bits), values 17 (4.25), so a q4h cache holds 4.5 bits per value, q4_0's
 * size; the value rows' code is the internal type SP_KV_Q4H_V below.
 * The rotation spreads a channel outlier (a bias, a norm weight) over its
 * block, which is what uniform per-token blocks quantize worst; because it
 * is orthonormal, q . k is the same in the rotated basis, so attention
 * rotates the query once instead of un-rotating every key, and accumulates
 * rotated values, rotating the output back once (docs/MEMORY.md).  The
 * forward pass (model/llama.c) also rewrites attention for q4h in two exact
 * ways: a value bias is added to the output instead of to each stored
 * value, and keys are balanced against queries per channel from qwen3's
 * q/k norm weights (docs/MEMORY.md, "KV cache types").
 *
 * Attention (src/kv/cache.c) works on tiles of up to SP_KV_TILE rows: a
 * tile's rows are converted to F32 in the type's domain (rotated for q4h)
 * by sp_kv_rows_to_float, then the F32 kernels below compute scores and
 * accumulate values.  Every kernel has a plain-C reference; the ISA files
 * (x86/kv_avx2.c, x86/kv_avx512.c, arm/kv_neon.c) replace table entries at
 * sp_quant_init and are tested against the references (tests/test_kv.c).
 */
#ifndef SP_QUANT_KV_H
#define SP_QUANT_KV_H

#include "core/core.h"
#include "core/cpu.h"
#include "quant/kv_tq.h"

#include <stdbool.h>
#include <stdint.h>

#define SP_KV_TILE 32          /* rows attention converts and scores at a time */
#define SP_KV_ROT_BLOCK 32     /* q4h's rotation block */
#define SP_KV_MAX_HEAD_DIM 1024 /* largest head the cache takes (stack scratch) */

struct sp_kv_type_info {
    const char *name;      /* "f16", "q4h", as -ctk / -ctv spell them */
    double bits;           /* nominal bits per value as stored */
    uint32_t qtype;        /* the block type a row is stored as (quant.h ids; q4h: none, kv_tq.c) */
    int32_t block;         /* head_dim must be a multiple of this */
    bool rotated;          /* q4h: rows live in the rotated basis */
    const char *about;     /* one line for --list-cache-types */
};

/* Facts of type t, or NULL for an id outside the enum. */
const struct sp_kv_type_info *sp_kv_type_get(enum sp_kv_type t);

/* The row code of a type's value rows: the type itself, except q4h, whose
 * value rows are the smaller SP_KV_Q4H_V (an id past the public enum, for
 * the row functions below only: sp_kv_type_get gives NULL for it).  Callers
 * pass sp_kv_value_rows(type_v) to the row functions for value rows. */
#define SP_KV_Q4H_V ((enum sp_kv_type)SP_KV_TYPE_COUNT)
static inline enum sp_kv_type sp_kv_value_rows(enum sp_kv_type t) {
    return t == SP_KV_Q4H ? SP_KV_Q4H_V : t;
}

/* q4h's trellis code on one rotated block of 32 values (kv_tq.c): the
 * key code (value = 0, 19 bytes) or the value code (value = 1, 17 bytes). */
size_t sp_kv_tq_block_bytes(int value);
void sp_kv_tq_encode(int value, const float *x, uint8_t *dst);
void sp_kv_tq_decode(int value, const uint8_t *src, float *y);

/* Bytes of one row of hd values of type t; 0 if hd is not a multiple of the
 * type's block. */
size_t sp_kv_row_bytes(enum sp_kv_type t, int32_t hd);

/* Store one row: x (hd floats, the original basis) -> dst (sp_kv_row_bytes).
 * note: call only with hd a multiple of the type's block and <= SP_KV_MAX_HEAD_DIM. */
void sp_kv_row_store(enum sp_kv_type t, const float *x, void *dst, int32_t hd);

/* Load one row back into the original basis (the inverse rotation for q4h):
 * what a context shift re-rotates and a session file may convert. */
void sp_kv_row_load(enum sp_kv_type t, const void *src, float *x, int32_t hd);

/* Convert n rows (row pointers) to F32 in the type's domain (rotated for
 * q4h): out row r at out + r * hd.  The attention's tile conversion. */
void sp_kv_rows_to_float(enum sp_kv_type t, const void *const *rows, int32_t n, int32_t hd, float *out);

/* The query for keys of type t: q (hd floats) rotated as the keys are, into
 * out (may equal q).  Identity for the unrotated types. */
void sp_kv_query_prep(enum sp_kv_type t, const float *q, float *out, int32_t hd);

/* The output accumulated over values of type t, rotated back in place.
 * Identity for the unrotated types. */
void sp_kv_output_fix(enum sp_kv_type t, float *o, int32_t hd);

/* The orthonormal transform of q4h on one block of SP_KV_ROT_BLOCK floats,
 * in place, and its inverse (tests). */
void sp_kv_rotate(float *x);
void sp_kv_unrotate(float *x);

/* ---- F32 attention kernels ------------------------------------------------
 * scores:  s[i * n + r] = scale * dot(q[i * q_ld .. + hd), k[r * hd .. + hd))
 *          for i < n_q queries and r < n rows (n <= SP_KV_TILE)
 * accum:   o[i * o_ld + c] = o[i * o_ld + c] * keep[i] + sum over r < n of
 *          (p[i * n + r] * p_scale[i]) * v[r * hd + c]: the online softmax's
 *          rescale of the normalised accumulator and its new weights, in one
 *          pass (first the rescale, then the products in row order r = 0, 1,
 *          ...: one rounding per product and per sum, no FMA, so every
 *          variant gives the reference's bits)
 * Any hd >= 1; n_q >= 1. */
typedef void (*sp_attn_scores_fn)(const float *restrict q, int32_t q_ld, int32_t n_q, const float *restrict k,
                                  int32_t n, int32_t hd, float scale, float *restrict s);
typedef void (*sp_attn_accum_fn)(const float *restrict p, int32_t n_q, const float *restrict p_scale,
                                 const float *restrict keep, const float *restrict v, int32_t n, int32_t hd,
                                 float *restrict o, int32_t o_ld);
/* x[r] = exp(x[r] - m) for r < n (the softmax's numerators, m the running
 * max).  The reference uses expf; the SIMD variants a polynomial within a
 * few ulp of it. */
typedef void (*sp_attn_exp_fn)(float *x, int32_t n, float m);

/* ---- the wide path: many query rows (a prefill), vectorised across queries
 * The queries are transposed once per work item, qt[c * nqp + i] (hd x nqp,
 * padding columns 0), and a tile's scores come out transposed too,
 * st[r * nqp + i]; nqp is a multiple of the table's wide_pad.
 *  scores_t:  st[r*nqp + i] = scale * sum_c k[r*hd + c] * qt[c*nqp + i]
 *  softmax_t: per query column i < nqp, with the running max m[i] and sum
 *             l[i]: mx = max(m, max_r st), p = exp(st - mx), l' = l e^(m-mx) +
 *             sum_r p; then st = p / l', keep[i] = l e^(m-mx) / l' (a division:
 *             exactly 1 when the tile adds nothing to the column; the factor
 *             the normalised accumulator is scaled by), m = mx, l = l'.  A
 *             column whose scores are all -inf (masked) keeps m, l, gets
 *             st = 0 and keep = 1.
 *  accum_t:   o[i*o_ld + c] = keep[i] * o[i*o_ld + c] + sum_r st[r*nqp + i] *
 *             v[r*hd + c] for i < nq
 * SIMD variants use FMA and another summation order: tested with a
 * tolerance against the references. */
typedef void (*sp_attn_scores_t_fn)(const float *restrict qt, int32_t nqp, const float *restrict k, int32_t n,
                                    int32_t hd, float scale, float *restrict st);
typedef void (*sp_attn_softmax_t_fn)(float *restrict st, int32_t n, int32_t nqp, float *restrict m,
                                     float *restrict l, float *restrict keep);
typedef void (*sp_attn_accum_t_fn)(const float *restrict st, int32_t nqp, int32_t nq, const float *restrict keep,
                                   const float *restrict v, int32_t n, int32_t hd, float *restrict o, int32_t o_ld);

/* The narrow path straight from the cache's rows (no F32 tile): rows[r] is
 * row r as stored in type t.  scores_rows = scores over those rows
 * converted; accum_rows = accum over them, the same bits as accum on the
 * converted rows (conversion is exact, the sums run in the same order).
 * They return false for a type they do not take (the caller converts the
 * tile and uses scores / accum); NULL in a table that has none. */
typedef bool (*sp_attn_scores_rows_fn)(enum sp_kv_type t, const float *restrict q, int32_t q_ld, int32_t n_q,
                                       const void *const *rows, int32_t n, int32_t hd, float scale,
                                       float *restrict s);
typedef bool (*sp_attn_accum_rows_fn)(enum sp_kv_type t, const float *restrict p, int32_t n_q,
                                      const float *restrict p_scale, const float *restrict keep,
                                      const void *const *rows, int32_t n, int32_t hd, float *restrict o,
                                      int32_t o_ld);

struct sp_attn_kernels {
    sp_attn_scores_rows_fn scores_rows;
    sp_attn_accum_rows_fn accum_rows;
    sp_attn_scores_fn scores;
    sp_attn_accum_fn accum;
    sp_attn_exp_fn exp;
    sp_attn_scores_t_fn scores_t;
    sp_attn_softmax_t_fn softmax_t;
    sp_attn_accum_t_fn accum_t;
    int32_t wide_pad; /* nqp of the wide path is a multiple of this (<= SP_KV_WIDE_PAD_MAX) */
    /* q4h's row code (kv_tq.h): the trellis search its store runs for each
     * scale it tries, and the decoding of a row's blocks (row load and the
     * tile conversion); both give the reference's bits */
    sp_kv_tq_search_fn tq_search;
    sp_kv_tq_decode_fn tq_decode;
};
#define SP_KV_WIDE_PAD_MAX 64

/* The dispatched kernels (after sp_quant_init) and the references. */
const struct sp_attn_kernels *sp_attn_kernels_get(void);
const struct sp_attn_kernels *sp_attn_kernels_ref(void);

void sp_attn_scores_ref(const float *restrict q, int32_t q_ld, int32_t n_q, const float *restrict k, int32_t n,
                        int32_t hd, float scale, float *restrict s);
void sp_attn_accum_ref(const float *restrict p, int32_t n_q, const float *restrict p_scale,
                       const float *restrict keep, const float *restrict v, int32_t n, int32_t hd, float *restrict o,
                       int32_t o_ld);
void sp_attn_exp_ref(float *x, int32_t n, float m);
void sp_attn_scores_t_ref(const float *restrict qt, int32_t nqp, const float *restrict k, int32_t n, int32_t hd,
                          float scale, float *restrict st);
void sp_attn_softmax_t_ref(float *restrict st, int32_t n, int32_t nqp, float *restrict m, float *restrict l,
                           float *restrict keep);
void sp_attn_accum_t_ref(const float *restrict st, int32_t nqp, int32_t nq, const float *restrict keep,
                         const float *restrict v, int32_t n, int32_t hd, float *restrict o, int32_t o_ld);

/* Called by sp_quant_init (traits.c) to fill the table from CPU features. */
void sp_attn_kernels_init(void);

#if defined(__x86_64__)
void sp_attn_register_avx2(struct sp_attn_kernels *k, const struct sp_cpu_features *f);
void sp_attn_register_avx512(struct sp_attn_kernels *k, const struct sp_cpu_features *f);
#endif
#if defined(__aarch64__)
void sp_attn_register_neon(struct sp_attn_kernels *k, const struct sp_cpu_features *f);
#endif

#endif /* SP_QUANT_KV_H */
