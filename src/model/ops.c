/*
 * ops.c -- leaf operations of the forward pass.  Formulas follow what ggml's
 * CPU backend computes for the same graph (double-precision sum in RMSNorm,
 * iterative theta in RoPE), so that results agree with the peer goldens.
 */
#include "ops.h"

#include "core/core.h"

#include <math.h>

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

size_t sp_act_bytes(int64_t n) {
    /* F32 is the widest conversion (4 bytes/element); round up to a Q8_K block. */
    return (size_t)((n + 255) / 256 * 256) * 4 + 64;
}

const void *sp_act_convert(uint32_t wtype, const float *x, int64_t n, void *buf) {
    const struct sp_qtraits *tw = sp_qtraits_get(wtype);
    SP_ASSERT(tw);
    if (tw->vec_dot_type == SP_QTYPE_F32) return x;
    const struct sp_qtraits *ta = sp_qtraits_get(tw->vec_dot_type);
    SP_ASSERT(ta && ta->from_float);
    ta->from_float(x, buf, n);
    return buf;
}

struct matvec_job {
    sp_vec_dot_fn dot;
    const uint8_t *w;
    size_t row_bytes;
    int64_t n_cols, n_rows;
    const void *xc;
    float *y;
};

static void matvec_task(void *arg, int ith, int nth) {
    const struct matvec_job *j = arg;
    const int64_t per = (j->n_rows + nth - 1) / nth;
    const int64_t r0 = per * ith, r1 = SP_MIN(j->n_rows, r0 + per);
    for (int64_t r = r0; r < r1; r++) j->dot(j->n_cols, &j->y[r], j->w + (size_t)r * j->row_bytes, j->xc);
}

void sp_matvec(struct sp_pool *pool, uint32_t wtype, const void *w, int64_t n_cols, int64_t n_rows, const void *xc,
               float *y) {
    const struct sp_qtraits *tw = sp_qtraits_get(wtype);
    SP_ASSERT(tw && tw->vec_dot);
    struct matvec_job j = {tw->vec_dot, w, sp_qtype_row_bytes(wtype, n_cols), n_cols, n_rows, xc, y};
    /* Small matrices are not worth waking threads for. */
    if (!pool || sp_pool_n_threads(pool) == 1 || (uint64_t)n_rows * j.row_bytes < (1u << 16)) {
        matvec_task(&j, 0, 1);
    } else {
        sp_pool_run(pool, matvec_task, &j);
    }
}
