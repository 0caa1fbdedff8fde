/*
 * ops.c -- leaf operations of the forward pass.  Formulas follow what ggml's
 * CPU backend computes for the same graph (double-precision sum in RMSNorm,
 * iterative theta in RoPE), so that results agree with the peer goldens.
 */
#include "ops.h"

#include "core/core.h"

#include <math.h>
#include <stdatomic.h>


void sp_rmsnorm(float *out, const float *x, const void *w, uint32_t w_type, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w_type == SP_QTYPE_F16) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * sp_vec_get(w, w_type, i);
        return;
    }
    const float *wf = w;
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * wf[i];
}

void sp_rope(float *x, int n_heads, int head_dim, int rope_dims, float pos, float theta_base, float freq_scale,
             bool neox, const float *freq_factors) {
    const float theta_scale = powf(theta_base, -2.0f / (float)rope_dims);
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        float theta = pos;
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

/* ---- splitting products between threads --------------------------------
 * The rows of one or more products are counted in 16-row groups (kernels
 * that work on row groups see whole groups; a product's last group may be
 * short), numbered through all products.  Thread i owns the i-th of
 * n_ranges contiguous ranges of groups and takes pieces from its front, so
 * its weights are one sequential stream from the first piece to the last
 * (taking every other run of rows from a shared counter started a new
 * stream each run: ~5% slower per thread, docs/BENCHMARKS.md).  A thread
 * done with its own range takes pieces from the back of the range with the
 * most left, so the threads still finish together, and one that gets less
 * CPU (another process on its core) simply does less.  A piece is a quarter
 * of what is left of its range (at least min_groups): large while there is
 * much to do (each kernel call prepares the activations again), small at
 * the end, where the last piece keeps the other threads waiting.  Which
 * thread computes a row never changes its result. */

#define MM_RANGES 64 /* ranges of a job; threads past this only take from the backs */

struct mm_range {
    /* groups [front, back) not taken yet: front in the low 32 bits, back in the high */
    _Alignas(64) atomic_uint_fast64_t fb;
};

struct mm_job {
    const struct sp_mm_part *parts;
    int n_parts;
    int n_ranges;
    uint32_t min_groups;
    struct mm_range r[MM_RANGES];
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

static int64_t part_groups(const struct sp_mm_part *p) {
    return (p->n_rows + 15) / 16;
}

/* Groups [g0, g1) of the job: the rows they cover in each product. */
static void run_groups(const struct mm_job *j, int64_t g0, int64_t g1) {
    int64_t base = 0; /* first group of product k */
    for (int k = 0; k < j->n_parts && base < g1; k++) {
        const struct sp_mm_part *p = &j->parts[k];
        const int64_t ng = part_groups(p), a = SP_MAX(g0, base) - base, b = SP_MIN(g1, base + ng) - base;
        base += ng;
        if (b <= a) continue;
        part_rows(p, sp_qtraits_get(p->wtype), sp_qtype_row_bytes(p->wtype, p->n_cols), a * 16,
                  SP_MIN(p->n_rows, b * 16));
    }
}

/* Take a piece from the front (or back) of a range into [*g0, *g1); false
 * when the range is empty. */
static bool take_piece(struct mm_range *r, bool front, uint32_t min_groups, int64_t *g0, int64_t *g1) {
    uint64_t v = atomic_load_explicit(&r->fb, memory_order_relaxed);
    for (;;) {
        const uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
        if (f >= b) return false;
        const uint32_t n = SP_MIN(b - f, SP_MAX(min_groups, (b - f) / 4));
        const uint64_t nv = front ? v + n : v - ((uint64_t)n << 32);
        if (atomic_compare_exchange_weak_explicit(&r->fb, &v, nv, memory_order_relaxed, memory_order_relaxed)) {
            *g0 = front ? f : b - n;
            *g1 = front ? f + n : b;
            return true;
        }
    }
}

static void mm_task(void *arg, int ith, int nth) {
    struct mm_job *j = arg;
    (void)nth;
    int64_t g0, g1;
    if (ith < j->n_ranges) {
        while (take_piece(&j->r[ith], true, j->min_groups, &g0, &g1)) run_groups(j, g0, g1);
    }
    for (;;) {
        int best = -1;
        uint32_t most = 0;
        for (int i = 0; i < j->n_ranges; i++) {
            const uint64_t v = atomic_load_explicit(&j->r[i].fb, memory_order_relaxed);
            const uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
            if (b > f && b - f > most) {
                most = b - f;
                best = i;
            }
        }
        if (best < 0) return;
        if (take_piece(&j->r[best], false, j->min_groups, &g0, &g1)) run_groups(j, g0, g1);
    }
}

/* Run n products on the pool (or here, when small). */
static void mm_run(struct sp_pool *pool, const struct sp_mm_part *parts, int n) {
    uint64_t bytes = 0;
    int64_t n_groups = 0, n_tok = 1;
    for (int k = 0; k < n; k++) {
        SP_ASSERT(sp_qtraits_get(parts[k].wtype) && sp_qtraits_get(parts[k].wtype)->vec_dot);
        bytes += (uint64_t)parts[k].n_rows * sp_qtype_row_bytes(parts[k].wtype, parts[k].n_cols) *
                 (uint64_t)parts[k].n_tok;
        n_groups += part_groups(&parts[k]);
        n_tok = SP_MAX(n_tok, parts[k].n_tok);
    }
    const int nth = pool ? sp_pool_n_threads(pool) : 1;
    /* A batch's pieces are at least the gemm's 64-row blocks. */
    struct mm_job j = {parts, n, SP_MIN(nth, MM_RANGES), n_tok > 1 ? 4 : 1, {{0}}};
    /* Small products are not worth waking threads for. */
    if (nth == 1 || bytes < (1u << 15)) {
        run_groups(&j, 0, n_groups);
        return;
    }
    SP_ASSERT(n_groups < ((int64_t)1 << 32));
    for (int i = 0; i < j.n_ranges; i++) {
        const uint64_t f = (uint64_t)(n_groups * i / j.n_ranges), b = (uint64_t)(n_groups * (i + 1) / j.n_ranges);
        atomic_init(&j.r[i].fb, f | b << 32);
    }
    sp_pool_run(pool, mm_task, &j);
}

void sp_matmul(struct sp_pool *pool, uint32_t wtype, const void *w, int64_t n_cols, int64_t n_rows, const void *xc,
               size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    const struct sp_mm_part p = {wtype, w, n_cols, n_rows, xc, x_stride, n_tok, y, ldy};
    mm_run(pool, &p, 1);
}

void sp_matmul_multi(struct sp_pool *pool, const struct sp_mm_part *parts, int n) {
    mm_run(pool, parts, n);
}
