/*
 * prune.c -- structured pruning before quantization: which FFN neurons and
 * which attention heads each layer keeps.
 *
 * A neuron j of a SwiGLU FFN is row j of ffn_gate and ffn_up and column j of
 * ffn_down; dropping it removes its whole contribution down_:,j * h_j.  Its
 * importance is the expected square of that contribution under a diagonal
 * approximation, |down_:,j|^2 * E[h_j^2], with E[h_j^2] from calibration
 * (the input statistics of ffn_down), or |gate_j| |up_j| |down_:,j| from the
 * weights alone.  A head is scored the same way from attn_output's columns
 * and the head's attention output.
 *
 * GGUF's llama keys hold one FFN width and one head count for all layers, so
 * every layer keeps the same numbers.  With grouped-query attention the
 * query heads of a KV group share its key and value heads, so heads go in
 * whole groups (query heads and their KV head together); the group size, and
 * with it the model's attention layout, stays what it was.
 *
 * The plan is index lists; quantize.c applies them while it streams tensors.
 */
#include "quantize.h"

#include <math.h>

void sp_prune_plan_free(struct sp_prune_plan *p) {
    if (!p) return;
    for (uint32_t il = 0; p->layers && il < p->n_layers; il++) {
        struct sp_prune_layer *L = &p->layers[il];
        sp_free(L->ff);
        sp_free(L->q_rows);
        sp_free(L->k_rows);
        sp_free(L->v_rows);
        sp_free(L->o_cols);
    }
    sp_free(p->layers);
    sp_free(p);
}

/* The whole tensor t as floats (sp_malloc'd into *out). */
static sp_status read_all(struct sp_model *m, const struct sp_tensor_desc *t, float **out) {
    const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    *out = sp_malloc((size_t)(rows * t->ne[0]) * sizeof(float));
    if (!*out) return sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory reading '%s'", t->name);
    sp_status rc = sp_qread_rows(m, t, 0, rows, *out);
    if (rc) {
        sp_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Squared norms of the n_out rows (ne[1]) or of the columns (ne[0]) of t. */
static sp_status norms2(struct sp_model *m, const struct sp_tensor_desc *t, bool columns, double *out) {
    float *w;
    sp_status rc = read_all(m, t, &w);
    if (rc) return rc;
    const int64_t nc = t->ne[0], nr = t->ne[1];
    memset(out, 0, (size_t)(columns ? nc : nr) * sizeof(double));
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t k = 0; k < nc; k++) {
            const double v = w[r * nc + k];
            out[columns ? k : r] += v * v;
        }
    }
    sp_free(w);
    return SP_OK;
}

/* Mean x^2 per input channel of t from calibration into e; false without. */
static bool act2(const struct sp_model *m, const struct sp_calib *c, const struct sp_tensor_desc *t, float *e) {
    return c && sp_calib_importance(c, (uint32_t)(t - m->mf->tensors), e);
}

/* The indices of the n_keep largest of score[0..n), ascending (ties keep the
 * lower index). */
static void keep_top(const double *score, uint32_t n, uint32_t n_keep, uint32_t *keep, bool *mark) {
    memset(mark, 0, n * sizeof(bool));
    for (uint32_t k = 0; k < n_keep; k++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t j = 0; j < n; j++) {
            if (!mark[j] && (best == UINT32_MAX || score[j] > score[best])) best = j;
        }
        mark[best] = true;
    }
    uint32_t o = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (mark[j]) keep[o++] = j;
    }
}

/* FFN neurons of layer il to keep. */
static sp_status plan_ffn(struct sp_model *m, const struct sp_calib *c, uint32_t il, uint32_t n_keep, uint32_t *keep) {
    const struct sp_layer_weights *L = &m->layers[il];
    const uint32_t F = m->mf->hp.n_ff;
    double *score = sp_malloc(F * sizeof(double)), *g = sp_malloc(F * sizeof(double));
    double *u = sp_malloc(F * sizeof(double));
    float *e = sp_malloc(F * sizeof(float));
    bool *mark = sp_malloc(F * sizeof(bool));
    sp_status rc = SP_OK;
    if (!score || !g || !u || !e || !mark) {
        rc = sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
        goto done;
    }
    if ((rc = norms2(m, L->ffn_down, true, score))) goto done;
    if (act2(m, c, L->ffn_down, e)) {
        for (uint32_t j = 0; j < F; j++) score[j] *= e[j];
    } else {
        if ((rc = norms2(m, L->ffn_gate, false, g)) || (rc = norms2(m, L->ffn_up, false, u))) goto done;
        for (uint32_t j = 0; j < F; j++) score[j] *= g[j] * u[j];
    }
    keep_top(score, F, n_keep, keep, mark);
done:
    sp_free(score);
    sp_free(g);
    sp_free(u);
    sp_free(e);
    sp_free(mark);
    return rc;
}

/* Per-head importance of layer il into score (n_heads). */
static sp_status head_scores(struct sp_model *m, const struct sp_calib *c, uint32_t il, double *score) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    const uint32_t H = hp->n_heads, rep = hp->n_heads / hp->n_kv_heads, hdv = hp->head_dim_v;
    const int64_t OD = (int64_t)H * hdv;
    double *col = sp_malloc((size_t)OD * sizeof(double));
    double *vrow = sp_malloc((size_t)hp->n_kv_heads * hdv * sizeof(double));
    float *e = sp_malloc((size_t)OD * sizeof(float));
    sp_status rc = SP_OK;
    if (!col || !vrow || !e) {
        rc = sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
        goto done;
    }
    if ((rc = norms2(m, L->wo, true, col))) goto done;
    const bool calibrated = act2(m, c, L->wo, e);
    if (!calibrated && (rc = norms2(m, L->wv, false, vrow))) goto done;
    for (uint32_t h = 0; h < H; h++) {
        double s = 0, v = 0;
        for (uint32_t k = 0; k < hdv; k++) {
            const size_t ci = (size_t)h * hdv + k;
            s += calibrated ? col[ci] * e[ci] : col[ci];
            if (!calibrated) v += vrow[(size_t)(h / rep) * hdv + k];
        }
        score[h] = calibrated ? s : s * v;
    }
done:
    sp_free(col);
    sp_free(vrow);
    sp_free(e);
    return rc;
}

/* Expand kept heads into row/column index lists of layer L. */
static sp_status expand_heads(const struct sp_hparams *hp, const uint32_t *heads, uint32_t n_heads,
                              const uint32_t *groups, uint32_t n_groups, struct sp_prune_layer *L) {
    const uint32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    L->q_rows = sp_malloc((size_t)n_heads * hdk * sizeof(uint32_t));
    L->o_cols = sp_malloc((size_t)n_heads * hdv * sizeof(uint32_t));
    L->k_rows = sp_malloc((size_t)n_groups * hdk * sizeof(uint32_t));
    L->v_rows = sp_malloc((size_t)n_groups * hdv * sizeof(uint32_t));
    if (!L->q_rows || !L->o_cols || !L->k_rows || !L->v_rows) {
        return sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
    }
    for (uint32_t i = 0; i < n_heads; i++) {
        for (uint32_t k = 0; k < hdk; k++) L->q_rows[i * hdk + k] = heads[i] * hdk + k;
        for (uint32_t k = 0; k < hdv; k++) L->o_cols[i * hdv + k] = heads[i] * hdv + k;
    }
    for (uint32_t i = 0; i < n_groups; i++) {
        for (uint32_t k = 0; k < hdk; k++) L->k_rows[i * hdk + k] = groups[i] * hdk + k;
        for (uint32_t k = 0; k < hdv; k++) L->v_rows[i * hdv + k] = groups[i] * hdv + k;
    }
    return SP_OK;
}

/* Heads of layer il to keep: all but the drop_groups KV groups of lowest
 * importance (the sum of their query heads'), with their query heads. */
static sp_status plan_heads(struct sp_model *m, const struct sp_calib *c, uint32_t il, uint32_t drop_groups,
                            struct sp_prune_layer *L) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t H = hp->n_heads, G = hp->n_kv_heads, rep = H / G, ng = G - drop_groups;
    double *score = sp_malloc(H * sizeof(double)), *gs = sp_malloc(G * sizeof(double));
    uint32_t *heads = sp_malloc(H * sizeof(uint32_t)), *groups = sp_malloc(G * sizeof(uint32_t));
    bool *mark = sp_malloc(G * sizeof(bool));
    sp_status rc = SP_OK;
    if (!score || !gs || !heads || !groups || !mark) {
        rc = sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
        goto done;
    }
    if ((rc = head_scores(m, c, il, score))) goto done;
    for (uint32_t g = 0; g < G; g++) {
        gs[g] = 0;
        for (uint32_t r = 0; r < rep; r++) gs[g] += score[g * rep + r];
    }
    keep_top(gs, G, ng, groups, mark);
    for (uint32_t i = 0; i < ng; i++) {
        for (uint32_t r = 0; r < rep; r++) heads[i * rep + r] = groups[i] * rep + r;
    }
    rc = expand_heads(hp, heads, ng * rep, groups, ng, L);
done:
    sp_free(score);
    sp_free(gs);
    sp_free(heads);
    sp_free(groups);
    sp_free(mark);
    return rc;
}

/* Build the plan; see quantize.h for the rules and the errors. */
sp_status sp_prune_plan_build(struct sp_model *m, const struct sp_calib *c, float ffn_frac, int32_t n_heads,
                              struct sp_prune_plan **out) {
    *out = NULL;
    const struct sp_hparams *hp = &m->mf->hp;
    if (!(ffn_frac >= 0.0f && ffn_frac < 1.0f)) {
        return sp_err(SP_E_INVALID, "sp_quantize: --prune-ffn %g is not in [0, 1)", (double)ffn_frac);
    }
    if (n_heads < 0 || (uint32_t)n_heads >= hp->n_heads) {
        return sp_err(SP_E_INVALID, "sp_quantize: --prune-heads %d: the model has %u heads per layer and must keep "
                      "at least one", (int)n_heads, hp->n_heads);
    }
    if (hp->n_experts > 0) {
        return sp_err(SP_E_UNSUPPORTED, "sp_quantize: pruning Mixture-of-Experts models is not supported");
    }
    const uint32_t H = hp->n_heads, G = hp->n_kv_heads, rep = H / G, N = (uint32_t)n_heads;
    if (N % rep != 0) {
        return sp_err(SP_E_INVALID, "sp_quantize: --prune-heads %u cannot be expressed: the %u query heads share %u KV "
                      "heads in groups of %u, and pruning drops whole groups (every layer keeps the same group "
                      "size); use a multiple of %u", N, H, G, rep, rep);
    }
    const uint32_t drop_groups = N / rep;
    uint32_t ff_drop = (uint32_t)lround((double)ffn_frac * hp->n_ff);
    if (ff_drop >= hp->n_ff) ff_drop = hp->n_ff - 1;

    struct sp_prune_plan *p = sp_calloc(1, sizeof(*p));
    if (!p || !(p->layers = sp_calloc(hp->n_layers, sizeof(*p->layers)))) {
        sp_free(p);
        return sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
    }
    p->n_layers = hp->n_layers;
    p->n_ff = hp->n_ff - ff_drop;
    p->n_heads = H - N;
    p->n_kv_heads = G - drop_groups;
    p->ffn = ff_drop > 0;
    p->heads = N > 0;
    sp_status rc = SP_OK;
    for (uint32_t il = 0; il < hp->n_layers && !rc; il++) {
        struct sp_prune_layer *L = &p->layers[il];
        if (p->ffn) {
            if (!(L->ff = sp_malloc(p->n_ff * sizeof(uint32_t)))) {
                rc = sp_err(SP_E_NOMEM, "sp_prune_plan_build: out of memory");
                break;
            }
            rc = plan_ffn(m, c, il, p->n_ff, L->ff);
        }
        if (!rc && p->heads) rc = plan_heads(m, c, il, drop_groups, L);
    }
    if (rc) {
        sp_prune_plan_free(p);
        return rc;
    }
    *out = p;
    return SP_OK;
}

void sp_prune_cut_of(const struct sp_prune_plan *p, const struct sp_model *m, const struct sp_tensor_desc *t,
                     struct sp_prune_cut *out) {
    memset(out, 0, sizeof(*out));
    if (!p) return;
    const struct sp_hparams *hp = &m->mf->hp;
    const int64_t nq = (int64_t)p->n_heads * hp->head_dim_k, nk = (int64_t)p->n_kv_heads * hp->head_dim_k;
    const int64_t nv = (int64_t)p->n_kv_heads * hp->head_dim_v, no = (int64_t)p->n_heads * hp->head_dim_v;
    for (uint32_t il = 0; il < p->n_layers; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        const struct sp_prune_layer *P = &p->layers[il];
        if (P->ff && (t == L->ffn_gate || t == L->ffn_up)) {
            out->rows = P->ff, out->n_rows = p->n_ff;
        } else if (P->ff && t == L->ffn_down) {
            out->cols = P->ff, out->n_cols = p->n_ff;
        } else if (P->q_rows && t == L->wq) {
            out->rows = P->q_rows, out->n_rows = nq;
        } else if (P->q_rows && t == L->bq) {
            out->cols = P->q_rows, out->n_cols = nq;
        } else if (P->k_rows && t == L->wk) {
            out->rows = P->k_rows, out->n_rows = nk;
        } else if (P->k_rows && t == L->bk) {
            out->cols = P->k_rows, out->n_cols = nk;
        } else if (P->v_rows && t == L->wv) {
            out->rows = P->v_rows, out->n_rows = nv;
        } else if (P->v_rows && t == L->bv) {
            out->cols = P->v_rows, out->n_cols = nv;
        } else if (P->o_cols && t == L->wo) {
            out->cols = P->o_cols, out->n_cols = no;
        } else {
            continue;
        }
        return;
    }
}
