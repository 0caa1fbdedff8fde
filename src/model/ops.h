/*
 * ops.h -- the leaf operations of the forward pass (llama2.c's helpers):
 * RMSNorm, RoPE, SiLU-gating and the matrix-vector product over any weight
 * type through the kernel table.  Plain functions on float arrays; no
 * knowledge of models, files or the pager.
 */
#ifndef SP_OPS_H
#define SP_OPS_H

#include "quant/quant.h"
#include "sched/pool.h"

#include <stdbool.h>
#include <stdint.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]   (sum of squares in double,
 * as ggml); w is F32 or F16 (w_type: SP_QTYPE_F32 or SP_QTYPE_F16). */
void sp_rmsnorm(float *out, const float *x, const void *w, uint32_t w_type, int64_t n, float eps);

/* w[i] of a weight vector stored as F32 or F16 (w_type). */
static inline float sp_vec_get(const void *w, uint32_t w_type, int64_t i) {
    return w_type == SP_QTYPE_F16 ? sp_fp16_to_fp32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Rotate the first rope_dims of each of n_heads heads (head_dim apart) for
 * position pos (a whole number; negative rotates back: a context shift
 * moves stored keys by -n this way).  neox: pairs (i, i + rope_dims/2); else adjacent pairs
 * (2i, 2i+1).  freq_factors (rope_dims/2) divides each frequency, or NULL. */
void sp_rope(float *x, int n_heads, int head_dim, int rope_dims, float pos, float theta_base, float freq_scale,
             bool neox, const float *freq_factors);

/* g[i] = silu(g[i]) * u[i] */
void sp_silu_mul(float *g, const float *u, int64_t n);

/* Bytes of scratch that sp_act_convert needs for n_tok rows of up to n elements. */
size_t sp_act_bytes(int64_t n, int64_t n_tok);

/* Convert n_tok activation rows (n floats each, x_ld floats apart) to the
 * vec_dot_type of weight type wtype into buf (sp_act_bytes bytes).  Returns
 * the rows to pass to sp_matmul and their stride in bytes via *stride: x
 * itself for F32 weights. */
const void *sp_act_convert(uint32_t wtype, const float *x, int64_t n, int64_t x_ld, int64_t n_tok, void *buf,
                           size_t *stride);

/* y[t * ldy + r] = dot(row r of w, activation row t) for r in [0, n_rows),
 * t in [0, n_tok): w has n_rows rows of n_cols elements of type wtype; xc
 * holds the converted activations (sp_act_convert).  Rows are split across
 * the pool's threads (pool may be NULL). */
void sp_matmul(struct sp_pool *pool, uint32_t wtype, const void *w, int64_t n_cols, int64_t n_rows, const void *xc,
               size_t x_stride, int64_t n_tok, float *y, int64_t ldy);

/* One product of a batch for sp_matmul_multi: the arguments of sp_matmul. */
struct sp_mm_part {
    uint32_t wtype;
    const void *w;
    int64_t n_cols, n_rows;
    const void *xc;
    size_t x_stride;
    int64_t n_tok;
    float *y;
    int64_t ldy;
};

/* Several independent products in one parallel pass: the threads split the
 * rows of all parts between them (ops.c: each thread one contiguous range of
 * row chunks, the backs of the ranges shared at the end), so a batch of
 * products -- the chosen experts of a layer, or Q, K and V -- costs one
 * wake-up of the pool instead of one per product.  Same results as
 * sp_matmul on each. */
void sp_matmul_multi(struct sp_pool *pool, const struct sp_mm_part *parts, int n);

#endif /* SP_OPS_H */
