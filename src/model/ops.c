/*
 * ops.c -- leaf operations of the forward pass.  Formulas follow what ggml's
 * CPU backend computes for the same graph (double-precision sum in RMSNorm,
 * iterative theta in RoPE), so that results agree with the peer goldens.
 */
#include "ops.h"

#include "core/core.h"

#include <math.h>
#include <stdatomic.h>


void sp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void sp_rope(float *x, int n_heads, int head_dim, int rope_dims, uint32_t pos, float theta_base, float freq_scale,
             bool neox, const float *freq_factors) {
    const float theta_scale = powf(theta_base, -2.0f / (float)rope_dims);
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        float theta = (float)pos;
        for (int i = 0; i < rope_dims / 2; i++) {
            const float t = (freq_factors ? theta / freq_factors[i] : theta) * freq_scale;
            const float c = cosf(t), s = sinf(t);
            const int i0 = neox ? i : 2 * i;
            const int i1 = neox ? i + rope_dims / 2 : 2 * i + 1;
            const float a = v[i0], b = v[i1];
            v[i0] = a * c - b * s;
            v[i1] = a * s + b * c;
            theta *= theta_scale;
        }
    }
}

void sp_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

size_t sp_act_bytes(int64_t n, int64_t n_tok) {
    /* F32 is the widest conversion (4 bytes/element); round up to a Q8_K block. */
    return (size_t)((n + 255) / 256 * 256) * 4 * (size_t)n_tok + 64;
}

const void *sp_act_convert(uint32_t wtype, const float *x, int64_t n, int64_t x_ld, int64_t n_tok, void *buf,
                           size_t *stride) {
    const struct sp_qtraits *tw = sp_qtraits_get(wtype);
    SP_ASSERT(tw);
    if (tw->vec_dot_type == SP_QTYPE_F32) {
        *stride = (size_t)x_ld * sizeof(float);
        return x;
    }
    const struct sp_qtraits *ta = sp_qtraits_get(tw->vec_dot_type);
    SP_ASSERT(ta && ta->from_float);
    const size_t rb = sp_qtype_row_bytes(tw->vec_dot_type, n);
    for (int64_t t = 0; t < n_tok; t++) ta->from_float(x + t * x_ld, (uint8_t *)buf + (size_t)t * rb, n);
    *stride = rb;
    return buf;
}

struct matmul_job {
    struct sp_mm_part p;
    const struct sp_qtraits *tw;
    size_t row_bytes;
    int64_t chunk_rows; /* rows per work item, a multiple of 16 */
    atomic_int_fast64_t next; /* the next work item to take */
};

/* Rows [r0, r1) of product p (tw its traits, row_bytes its weight rows). */
static void part_rows(const struct sp_mm_part *p, const struct sp_qtraits *tw, size_t row_bytes, int64_t r0,
                      int64_t r1) {
    const uint8_t *w = (const uint8_t *)p->w + (size_t)r0 * row_bytes;
    if (tw->gemm) {
        tw->gemm(p->n_cols, w, row_bytes, r1 - r0, p->xc, p->x_stride, p->n_tok, p->y + r0, p->ldy);
    } else {
        sp_gemm_generic(p->wtype, p->n_cols, w, row_bytes, r1 - r0, p->xc, p->x_stride, p->n_tok, p->y + r0, p->ldy);
    }
}

static void matmul_rows(const struct matmul_job *j, int64_t r0, int64_t r1) {
    part_rows(&j->p, j->tw, j->row_bytes, r0, r1);
}

/* Threads take contiguous runs of rows (whole 16-row groups, so kernels
 * that work on row groups see whole groups) from a shared counter: each
 * run is one sequential stream of weights, and a thread that gets less CPU
 * (another process on its core) simply takes fewer runs. */
static void matmul_task(void *arg, int ith, int nth) {
    struct matmul_job *j = arg;
    (void)ith;
    (void)nth;
    for (;;) {
        const int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        const int64_t r0 = c * j->chunk_rows;
        if (r0 >= j->p.n_rows) return;
        matmul_rows(j, r0, SP_MIN(j->p.n_rows, r0 + j->chunk_rows));
    }
}

void sp_matmul(struct sp_pool *pool, uint32_t wtype, const void *w, int64_t n_cols, int64_t n_rows, const void *xc,
               size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    const struct sp_qtraits *tw = sp_qtraits_get(wtype);
    SP_ASSERT(tw && tw->vec_dot);
    struct matmul_job j = {{wtype, w, n_cols, n_rows, xc, x_stride, n_tok, y, ldy}, tw,
                           sp_qtype_row_bytes(wtype, n_cols), 0, 0};
    /* Small products are not worth waking threads for. */
    const int nth = pool ? sp_pool_n_threads(pool) : 1;
    if (nth == 1 || (uint64_t)n_rows * j.row_bytes * (uint64_t)n_tok < (1u << 15)) {
        matmul_rows(&j, 0, n_rows);
        return;
    }
    /* About 16 runs per thread: the last run ends the product for all, so
     * short runs keep the threads finishing together (decode of llama-7b
     * q4_0, 2 threads: 4 runs 5.6-5.9 tok/s, 16 runs 5.9-6.2, 32 runs
     * 5.3-5.7); each run's fixed cost (the kernels prepare the activations
     * per call) stays small next to 100+ rows of weights. */
    const int64_t per = (n_rows + 16 * nth - 1) / (16 * nth);
    j.chunk_rows = SP_MAX(16, (per + 15) / 16 * 16);
    atomic_init(&j.next, 0);
    sp_pool_run(pool, matmul_task, &j);
}

/* ---- several products in one parallel pass ------------------------------ */

struct multi_job {
    const struct sp_mm_part *parts;
    int n;
    int64_t n_chunks; /* 16-row chunks over all parts */
};

static void multi_task(void *arg, int ith, int nth) {
    const struct multi_job *j = arg;
    const int64_t per = (j->n_chunks + nth - 1) / nth;
    const int64_t c0 = per * ith, c1 = SP_MIN(j->n_chunks, per * (ith + 1));
    int64_t base = 0; /* first chunk of part k */
    for (int k = 0; k < j->n && base < c1; k++) {
        const struct sp_mm_part *p = &j->parts[k];
        const int64_t nc = (p->n_rows + 15) / 16;
        const int64_t a = SP_MAX(c0, base) - base, b = SP_MIN(c1, base + nc) - base;
        base += nc;
        if (b <= a) continue;
        part_rows(p, sp_qtraits_get(p->wtype), sp_qtype_row_bytes(p->wtype, p->n_cols), a * 16,
                  SP_MIN(p->n_rows, b * 16));
    }
}

void sp_matmul_multi(struct sp_pool *pool, const struct sp_mm_part *parts, int n) {
    struct multi_job j = {parts, n, 0};
    uint64_t bytes = 0;
    for (int k = 0; k < n; k++) {
        SP_ASSERT(sp_qtraits_get(parts[k].wtype) && sp_qtraits_get(parts[k].wtype)->vec_dot);
        j.n_chunks += (parts[k].n_rows + 15) / 16;
        bytes += (uint64_t)parts[k].n_rows * sp_qtype_row_bytes(parts[k].wtype, parts[k].n_cols);
    }
    if (!pool || sp_pool_n_threads(pool) == 1 || bytes < (1u << 15)) {
        multi_task(&j, 0, 1);
    } else {
        sp_pool_run(pool, multi_task, &j);
    }
}
