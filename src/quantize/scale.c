/*
 * scale.c -- activation-aware channel scaling before quantization (the AWQ
 * method: Lin et al., "AWQ: Activation-aware Weight Quantization for LLM
 * Compression and Acceleration", 2023).
 *
 * A weight W (rows = outputs, columns = input channels) sees inputs x whose
 * channels differ in size by one or two orders of magnitude.  Multiplying
 * column c by s_c and dividing channel c of the input by s_c leaves W x
 * unchanged, but gives the channels with large activations a finer grid in
 * the block quantizer.  The division is folded into the operation that
 * produces x, exactly, so the model computes the same function:
 *   attn_q/k/v  <- attn_norm        (x = rmsnorm(h) * attn_norm)
 *   ffn_gate/up <- ffn_norm
 *   ffn_down    <- ffn_up's rows    (x = silu(gate) * up: linear in up)
 *   attn_output <- attn_v's rows    (x = softmax weights * V: linear in V;
 *                                    the query heads of a KV group share one s,
 *                                    and so do those whose KV heads fold into
 *                                    one, fold.c: pooled V rows keep one s)
 *   output      <- output_norm      (only when not tied to the embedding)
 * s_c = stat_c^(alpha/2), stat E[x_c^2] or the largest sampled x_c^2,
 * normalised to a geometric mean of 1; alpha is chosen per layer and input
 * from a grid to minimise the output error: over the calibration's sampled
 * input rows, sum (w . x - w^ . x^)^2, w^ the scaled row quantized and x^ the
 * scaled input rounded to the activation type the kernels use (so both
 * roundings count); without samples, the weight error (w^ - w)^T H (w^ - w)
 * with H = E[x x^T] or its diagonal.  alpha = 0 (no scaling) is on the grid,
 * so the calibrated error never gets worse.
 *
 * The result is multipliers per tensor, applied when quantize.c reads rows.
 */
#include "quantize.h"

#include "quant/native.h"
#include "quant/quant.h"

#include <math.h>

#define SCALE_ALPHAS 11      /* alpha = 0, 0.1, ..., 1 */
#define SCALE_SAMPLE_ROWS 256 /* rows per tensor the search quantizes */
#define SCALE_MIN 1e-3f
#define SCALE_MAX 1e3f

void sp_scale_plan_free(struct sp_scale_plan *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        sp_free(p->col[i]);
        sp_free(p->row[i]);
    }
    sp_free(p->col);
    sp_free(p->row);
    sp_free(p);
}

/* Multipliers of tensor t's columns or rows, allocated as ones on first use. */
static float *mul_of(struct sp_scale_plan *p, const struct sp_model *m, const struct sp_tensor_desc *t, bool rows) {
    const uint32_t i = (uint32_t)(t - m->mf->tensors);
    float **slot = rows ? &p->row[i] : &p->col[i];
    const int64_t n = rows ? t->ne[1] : t->ne[0];
    if (!*slot && (*slot = sp_malloc((size_t)n * sizeof(float)))) {
        for (int64_t k = 0; k < n; k++) (*slot)[k] = 1.0f;
    }
    return *slot;
}

/* One group: the tensors that read one input, their types, and the input's
 * statistics. */
struct group {
    const struct sp_tensor_desc *w[3];
    uint32_t type[3];
    int n_w;
    int64_t n;            /* input channels */
    const float *imp;     /* (n) E[x^2] */
    const double *h;      /* (n, n) covariance sums, or NULL */
    double h_scale;       /* 1 / tokens, to turn sums into means */
    const int32_t *cls;   /* (n / period) attn_output's heads: channel j of the heads */
    int64_t period;       /* of one class shares s; period 0 = no sharing */
    const float *x;       /* (n_x, n) sampled input rows, or NULL */
    int32_t n_x;
};

/* s for exponent alpha: stat^(alpha/2) for a per-channel statistic stat
 * (E[x^2], or the square of the largest sampled |x|), shared across heads
 * when period > 0 (the largest over the channels that share), normalised to
 * a geometric mean of 1 and clamped. */
static void scales_for(const struct group *g, double alpha, const float *stat, float *s) {
    double logsum = 0;
    for (int64_t c = 0; c < g->n; c++) {
        double e;
        if (g->period) {
            const int64_t h = c / g->period, j = c % g->period;
            e = 0;
            for (int64_t k = 0; k < g->n / g->period; k++) {
                if (g->cls[k] == g->cls[h]) e = SP_MAX(e, (double)stat[k * g->period + j]);
            }
        } else {
            e = stat[c];
        }
        s[c] = (float)pow(e > 1e-30 ? e : 1e-30, alpha / 2);
        logsum += log(s[c]);
    }
    const float norm = (float)exp(-logsum / (double)g->n);
    for (int64_t c = 0; c < g->n; c++) {
        const float v = s[c] * norm;
        s[c] = v < SCALE_MIN ? SCALE_MIN : v > SCALE_MAX ? SCALE_MAX : v;
    }
}

/* Dequantized round trip of row x (n floats) through type t into out
 * (padded width): a weight through sp_quantize_rows (with importance imp), an
 * activation through its type's converter, as the kernels convert it.  q:
 * scratch of a row's bytes. */
static sp_status round_trip(uint32_t t, bool weight, const float *x, int64_t n, const float *imp, uint8_t *q,
                            float *out) {
    const struct sp_qtraits *tr = sp_qtraits_get(t);
    const int64_t be = tr->block_elems, np = (n + be - 1) / be * be;
    if (weight) {
        sp_status rc = sp_quantize_rows(t, x, 1, n, imp, q);
        if (rc) return rc;
    } else {
        tr->from_float(x, q, n);
    }
    tr->to_float(q, out, np);
    return SP_OK;
}

/* dot(a, b) over n floats, in eight independent partial sums. */
static float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    }
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* What the search reads once per group: each tensor's sampled rows and,
 * with sampled inputs, their exact products; plus scratch sized for the
 * input's width. */
struct scratch {
    float *rows[3];    /* (n_rows[k], n) sampled rows of tensor k */
    int64_t n_rows[3];
    float *y[3];       /* (n_rows[k], n_x) w . x, or NULL */
    float *scaled, *imp_s, *deq, *xs; /* xs: (n_x, padded n) activations as the kernels see them */
    uint8_t *q;
};

/* The group's output error with column multipliers s.  With sampled inputs:
 * sum over sampled rows w and inputs x of (w . x - w^ . x^)^2, w^ the row
 * quantized after scaling and x^ = x / s converted to the activation type the
 * kernels use (so activation rounding counts too).  Else the calibrated
 * weight error sum (w^ - w)^T H (w^ - w) (H, or its diagonal). */
static sp_status group_error(const struct group *g, const float *s, struct scratch *S, double *err) {
    *err = 0;
    const int64_t n = g->n, np = n + 128;
    for (int64_t c = 0; c < n; c++) S->imp_s[c] = g->imp[c] / (s[c] * s[c]);
    for (int k = 0; k < g->n_w; k++) {
        const uint32_t act = sp_qtraits_get(g->type[k])->vec_dot_type;
        sp_status rc;
        for (int32_t j = 0; g->x && j < g->n_x; j++) { /* the activations as the kernels will see them */
            for (int64_t c = 0; c < n; c++) S->scaled[c] = g->x[j * n + c] / s[c];
            if ((rc = round_trip(act, false, S->scaled, n, NULL, S->q, S->xs + (size_t)(j * np)))) return rc;
        }
        for (int64_t r = 0; r < S->n_rows[k]; r++) {
            const float *row = S->rows[k] + (size_t)(r * n);
            for (int64_t c = 0; c < n; c++) S->scaled[c] = row[c] * s[c];
            if ((rc = round_trip(g->type[k], true, S->scaled, n, S->imp_s, S->q, S->deq))) return rc;
            if (g->x) {
                const float *y = S->y[k] + (size_t)(r * g->n_x);
                for (int32_t j = 0; j < g->n_x; j++) {
                    const double d = (double)y[j] - dot8(S->deq, S->xs + (size_t)(j * np), n);
                    *err += d * d;
                }
                continue;
            }
            for (int64_t c = 0; c < n; c++) S->deq[c] = S->deq[c] / s[c] - row[c]; /* the error, unscaled */
            if (g->h) {
                for (int64_t a = 0; a < n; a++) {
                    double acc = 0;
                    for (int64_t b = 0; b < n; b++) acc += g->h[a * n + b] * S->deq[b];
                    *err += S->deq[a] * acc * g->h_scale;
                }
            } else {
                for (int64_t c = 0; c < n; c++) *err += (double)g->imp[c] * S->deq[c] * S->deq[c];
            }
        }
    }
    return SP_OK;
}

static void scratch_free(struct scratch *S) {
    for (int k = 0; k < 3; k++) {
        sp_free(S->rows[k]);
        sp_free(S->y[k]);
    }
    sp_free(S->scaled);
    sp_free(S->imp_s);
    sp_free(S->deq);
    sp_free(S->xs);
    sp_free(S->q);
}

/* Read evenly spaced rows of the group's tensors (at most about
 * SCALE_SAMPLE_ROWS each), and their exact products with the sampled inputs. */
static sp_status scratch_init(struct sp_model *m, const struct group *g, struct scratch *S) {
    const int64_t n = g->n, np = n + 128;
    memset(S, 0, sizeof(*S));
    S->scaled = sp_malloc((size_t)n * sizeof(float));
    S->imp_s = sp_malloc((size_t)n * sizeof(float));
    S->deq = sp_malloc((size_t)np * sizeof(float));
    S->xs = sp_malloc((size_t)(SP_MAX(g->n_x, 1) * np) * sizeof(float));
    S->q = sp_malloc((size_t)np * 8); /* more than any row type needs per element */
    if (!S->scaled || !S->imp_s || !S->deq || !S->xs || !S->q) goto nomem;
    for (int k = 0; k < g->n_w; k++) {
        const int64_t rows = g->w[k]->ne[1], step = SP_MAX((int64_t)1, rows / SCALE_SAMPLE_ROWS);
        S->n_rows[k] = (rows + step - 1) / step;
        if (!(S->rows[k] = sp_malloc((size_t)(S->n_rows[k] * n) * sizeof(float)))) goto nomem;
        for (int64_t r = 0; r < S->n_rows[k]; r++) {
            sp_status rc = sp_qread_rows(m, g->w[k], r * step, 1, S->rows[k] + (size_t)(r * n));
            if (rc) return rc;
        }
        if (!g->x) continue;
        if (!(S->y[k] = sp_malloc((size_t)(S->n_rows[k] * g->n_x) * sizeof(float)))) goto nomem;
        for (int64_t r = 0; r < S->n_rows[k]; r++) {
            for (int32_t j = 0; j < g->n_x; j++) {
                S->y[k][r * g->n_x + j] = dot8(S->rows[k] + (size_t)(r * n), g->x + (size_t)(j * n), n);
            }
        }
    }
    return SP_OK;
nomem:
    return sp_err(SP_E_NOMEM, "sp_scale_plan_build: out of memory");
}

/* Search alpha for group g; write the best s into best (n). */
static sp_status search_group(struct sp_model *m, const struct group *g, float *best, double *best_alpha,
                              double *gain) {
    const int64_t n = g->n;
    struct scratch S;
    float *s = sp_malloc((size_t)n * sizeof(float)), *amax2 = sp_malloc((size_t)n * sizeof(float));
    sp_status rc = scratch_init(m, g, &S);
    if (!rc && (!s || !amax2)) rc = sp_err(SP_E_NOMEM, "sp_scale_plan_build: out of memory");
    if (rc) goto done;
    /* two families: s from E[x^2], and (with samples) from the largest |x|,
     * which is what rounding activations to 8 bits per block feels */
    for (int64_t c = 0; c < n; c++) amax2[c] = 0;
    for (int32_t j = 0; j < g->n_x; j++) {
        for (int64_t c = 0; c < n; c++) amax2[c] = SP_MAX(amax2[c], g->x[j * n + c] * g->x[j * n + c]);
    }
    double e0 = 0, eb = INFINITY;
    for (int k = 0; k < (g->x ? 2 : 1) * SCALE_ALPHAS; k++) {
        const double alpha = (double)(k % SCALE_ALPHAS) / (SCALE_ALPHAS - 1);
        double e;
        if (k == SCALE_ALPHAS) continue; /* alpha 0 again */
        scales_for(g, alpha, k < SCALE_ALPHAS ? g->imp : amax2, s);
        if ((rc = group_error(g, s, &S, &e))) goto done;
        if (k == 0) e0 = e;
        if (e < eb) {
            eb = e;
            *best_alpha = alpha;
            memcpy(best, s, (size_t)n * sizeof(float));
        }
    }
    *gain = eb > 0 ? e0 / eb : 1.0;
done:
    sp_free(s);
    sp_free(amax2);
    scratch_free(&S);
    return rc;
}

/* Statistics of the input the group's first tensor reads. */
static bool group_stats(const struct sp_model *m, const struct sp_calib *c, struct group *g, float *imp) {
    const uint32_t i = (uint32_t)(g->w[0] - m->mf->tensors);
    if (!sp_calib_importance(c, i, imp)) return false;
    g->imp = imp;
    g->n = g->w[0]->ne[0];
    g->h = sp_calib_cov(c, i);
    g->x = sp_calib_samples(c, i, &g->n_x);
    const int32_t owner = c->cov_of ? c->cov_of[i] : -1;
    g->h_scale = owner >= 0 && c->count[owner] ? 1.0 / (double)c->count[owner] : 0.0;
    return true;
}

/* Type the plan gives tensor t (quantize.c fills types by tensor index). */
static uint32_t type_of(const struct sp_model *m, const uint32_t *types, const struct sp_tensor_desc *t) {
    return types[t - m->mf->tensors];
}

static bool quantized(uint32_t t) {
    return t != SP_QTYPE_F32;
}

sp_status sp_scale_plan_build(struct sp_model *m, const struct sp_calib *c, const uint32_t *types,
                              const struct sp_prune_plan *pp, const struct sp_fold_plan *f,
                              const struct sp_quantize_params *progress, struct sp_scale_plan **out) {
    *out = NULL;
    const struct sp_model_file *mf = m->mf;
    const struct sp_hparams *hp = &mf->hp;
    if (hp->n_experts > 0) return SP_OK; /* expert FFNs: not scaled */
    struct sp_scale_plan *p = sp_calloc(1, sizeof(*p));
    float *imp = NULL, *s = NULL;
    int32_t *cls = NULL;
    sp_status rc = SP_OK;
    if (!p || !(p->col = sp_calloc(mf->n_tensors, sizeof(float *))) ||
        !(p->row = sp_calloc(mf->n_tensors, sizeof(float *)))) {
        rc = sp_err(SP_E_NOMEM, "sp_scale_plan_build: out of memory");
        goto done;
    }
    p->n_tensors = mf->n_tensors;
    int64_t widest = SP_MAX((int64_t)hp->n_embd, (int64_t)hp->n_ff);
    widest = SP_MAX(widest, (int64_t)hp->n_heads * hp->head_dim_v);
    imp = sp_malloc((size_t)widest * sizeof(float));
    s = sp_malloc((size_t)widest * sizeof(float));
    cls = sp_malloc(hp->n_heads * sizeof(int32_t));
    if (!imp || !s || !cls) {
        rc = sp_err(SP_E_NOMEM, "sp_scale_plan_build: out of memory");
        goto done;
    }
    const bool tied = m->output == m->tok_embd;
    const uint32_t rep = hp->n_heads / hp->n_kv_heads;
    for (uint32_t il = 0; il <= hp->n_layers && !rc; il++) {
        if (il && (rc = sp_quantize_progress(progress, "scaling", (int32_t)il, (int32_t)hp->n_layers + 1))) break;
        const struct sp_layer_weights *L = il < hp->n_layers ? &m->layers[il] : NULL;
        for (int kind = 0; kind < 4 && !rc; kind++) {
            struct group g = {0};
            const struct sp_tensor_desc *fold = NULL; /* 1-D tensor (or rows) the inverse goes into */
            bool fold_rows = false;
            if (!L) {
                if (kind > 0 || tied) break;
                g.w[g.n_w++] = m->output;
                fold = m->output_norm;
            } else if (kind == 0) {
                g.w[g.n_w++] = L->wq, g.w[g.n_w++] = L->wk, g.w[g.n_w++] = L->wv;
                fold = L->attn_norm;
            } else if (kind == 1) {
                g.w[g.n_w++] = L->ffn_gate, g.w[g.n_w++] = L->ffn_up;
                fold = L->ffn_norm;
            } else if (kind == 2) {
                g.w[g.n_w++] = L->ffn_down;
                fold = L->ffn_up, fold_rows = true;
            } else {
                g.w[g.n_w++] = L->wo;
                fold = L->wv, fold_rows = true;
                g.period = hp->head_dim_v;
                /* a query head's class: the KV head it reads in the output
                 * (pruned: its own source KV head, apart from all others) */
                for (uint32_t h = 0; h < hp->n_heads; h++) {
                    const uint32_t kh = h / rep;
                    const int32_t o = sp_fold_kv_head(f, pp, m, il, kh);
                    cls[h] = o >= 0 ? o : -1 - (int32_t)kh;
                }
                g.cls = cls;
            }
            bool any = false;
            for (int k = 0; k < g.n_w; k++) {
                g.type[k] = type_of(m, types, g.w[k]);
                any |= quantized(g.type[k]);
            }
            /* a bias on attn_v would need the same fold: qwen2's bv */
            if (!any || !group_stats(m, c, &g, imp) || (kind == 3 && L->bv)) continue;
            double alpha = 0, gain = 1;
            if ((rc = search_group(m, &g, s, &alpha, &gain))) break;
            if (alpha == 0) continue;
            p->n_scaled++;
            p->alpha_sum += alpha;
            for (int k = 0; k < g.n_w; k++) {
                float *cm = mul_of(p, m, g.w[k], false);
                if (!cm) goto nomem;
                for (int64_t j = 0; j < g.n; j++) cm[j] *= s[j];
            }
            if (kind == 3) { /* attn_v rows: KV head kh's channel j <- s of query heads kh*rep.. */
                float *rm = mul_of(p, m, fold, true);
                if (!rm) goto nomem;
                for (int64_t r = 0; r < fold->ne[1]; r++) {
                    const int64_t kh = r / g.period, j = r % g.period;
                    rm[r] /= s[kh * rep * g.period + j];
                }
            } else {
                float *fm = mul_of(p, m, fold, fold_rows);
                if (!fm) goto nomem;
                for (int64_t j = 0; j < g.n; j++) fm[j] /= s[j];
            }
        }
    }
    goto done;
nomem:
    rc = sp_err(SP_E_NOMEM, "sp_scale_plan_build: out of memory");
done:
    sp_free(imp);
    sp_free(s);
    sp_free(cls);
    if (rc) {
        sp_scale_plan_free(p);
        return rc;
    }
    *out = p;
    return SP_OK;
}
