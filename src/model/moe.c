/*
 * moe.c -- the Mixture-of-Experts FFN (qwen3moe; llama with experts, the
 * Mixtral layout).  For each token, with h = ffn_norm output:
 *   p = softmax(W_router h) over all X experts;
 *   sel = the K most probable, in descending order (ties: lower id first);
 *   w = p[sel], divided by their sum when the architecture renormalizes;
 *   out = sum_j w_j * down_j(silu(gate_j h) * up_j h)   [+ shared expert].
 * A batch is grouped by expert, so each chosen expert's weights are read
 * once per batch and multiplied with the rows of the tokens that chose it.
 *
 * Invariants:
 *  1. Routed-expert weights are reached only through expert_matmul(), which
 *     pins exactly that expert's byte range of the 3-D tensor; the budgeted
 *     pager (expert cache, prefetch) hooks in there and in experts_chosen().
 *  2. No allocation here: all scratch is in struct sp_fwd, sized by
 *     sp_moe_fwd_init for n_batch tokens.
 *  3. A token chooses K distinct experts, so an expert's group holds each
 *     token at most once, in ascending token order.
 */
#include "moe.h"

#include "ops.h"

#include <math.h>

/* ---- scratch ------------------------------------------------------------ */

struct moe_sizes {
    size_t probs, sel, grp, off, used, rows; /* element counts */
};

static struct moe_sizes moe_sizes(const struct sp_model *m, uint32_t n_batch) {
    const struct sp_hparams *hp = &m->mf->hp;
    struct moe_sizes s;
    s.probs = (size_t)n_batch * hp->n_experts;
    s.sel = (size_t)n_batch * hp->n_experts_used;
    s.grp = s.sel;
    s.off = (size_t)hp->n_experts + 1;
    s.used = hp->n_experts;
    s.rows = (size_t)n_batch * hp->n_embd;
    return s;
}

uint64_t sp_moe_fwd_bytes(const struct sp_model *m, uint32_t n_batch) {
    if (m->mf->hp.n_experts == 0) return 0;
    struct moe_sizes s = moe_sizes(m, n_batch);
    return (uint64_t)(s.probs + 2 * s.rows) * sizeof(float) + (uint64_t)s.sel * (sizeof(int32_t) + sizeof(float)) +
           (uint64_t)s.grp * (sizeof(uint32_t) + sizeof(float)) + (uint64_t)s.off * sizeof(uint32_t) + s.used;
}

sp_status sp_moe_fwd_init(const struct sp_model *m, struct sp_fwd *f) {
    if (m->mf->hp.n_experts == 0) return SP_OK;
    struct moe_sizes s = moe_sizes(m, f->n_batch);
    f->probs = sp_malloc_aligned(s.probs * sizeof(float), 64);
    f->sel = sp_malloc(s.sel * sizeof(int32_t));
    f->sel_w = sp_malloc(s.sel * sizeof(float));
    f->grp_off = sp_malloc(s.off * sizeof(uint32_t));
    f->grp_tok = sp_malloc(s.grp * sizeof(uint32_t));
    f->grp_w = sp_malloc(s.grp * sizeof(float));
    f->used = sp_malloc(s.used);
    f->xg = sp_malloc_aligned(s.rows * sizeof(float), 64);
    f->yg = sp_malloc_aligned(s.rows * sizeof(float), 64);
    if (!f->probs || !f->sel || !f->sel_w || !f->grp_off || !f->grp_tok || !f->grp_w || !f->used || !f->xg ||
        !f->yg) {
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %llu bytes of expert scratch", __func__,
                      (unsigned long long)sp_moe_fwd_bytes(m, f->n_batch));
    }
    return SP_OK;
}

void sp_moe_fwd_free(struct sp_fwd *f) {
    (void)sp_moe_trace_enable(NULL, f, false);
    sp_free_aligned(f->probs);
    sp_free(f->sel);
    sp_free(f->sel_w);
    sp_free(f->grp_off);
    sp_free(f->grp_tok);
    sp_free(f->grp_w);
    sp_free(f->used);
    sp_free_aligned(f->xg);
    sp_free_aligned(f->yg);
}

/* Experts per token this pass: the governor's f->n_expert_used when set
 * (1..the model's), else the model's expert_used_count. */
static uint32_t fwd_k(const struct sp_hparams *hp, const struct sp_fwd *f) {
    const uint32_t K = hp->n_experts_used;
    return f->n_expert_used >= 1 && f->n_expert_used < K ? f->n_expert_used : K;
}

/* ---- routing trace ------------------------------------------------------ */

struct sp_moe_trace {
    uint32_t n_layers, n_ctx, n_experts, n_used;
    uint8_t *seen;    /* (n_layers, n_ctx) 1 where a decision is recorded */
    int32_t *experts; /* (n_layers, n_ctx, n_used) */
    float *weights;   /* (n_layers, n_ctx, n_used) */
    float *probs;     /* (n_layers, n_ctx, n_experts) */
};

static void trace_free(struct sp_moe_trace *tr) {
    if (!tr) return;
    sp_free(tr->seen);
    sp_free(tr->experts);
    sp_free(tr->weights);
    sp_free(tr->probs);
    sp_free(tr);
}

sp_status sp_moe_trace_enable(const struct sp_model *m, struct sp_fwd *f, bool on) {
    if (!on) {
        trace_free(f->trace);
        f->trace = NULL;
        return SP_OK;
    }
    const struct sp_hparams *hp = &m->mf->hp;
    if (hp->n_experts == 0) return sp_err(SP_E_INVALID, "%s: the model has no experts to trace", __func__);
    if (f->trace) return SP_OK;
    struct sp_moe_trace *tr = sp_calloc(1, sizeof(*tr));
    if (!tr) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    tr->n_layers = hp->n_layers;
    tr->n_ctx = f->n_ctx;
    tr->n_experts = hp->n_experts;
    tr->n_used = hp->n_experts_used;
    const size_t cells = (size_t)tr->n_layers * tr->n_ctx;
    tr->seen = sp_calloc(cells, 1);
    tr->experts = sp_malloc(cells * tr->n_used * sizeof(int32_t));
    tr->weights = sp_malloc(cells * tr->n_used * sizeof(float));
    tr->probs = sp_malloc(cells * tr->n_experts * sizeof(float));
    if (!tr->seen || !tr->experts || !tr->weights || !tr->probs) {
        trace_free(tr);
        return sp_err(SP_E_NOMEM, "%s: cannot allocate the routing trace for %zu positions", __func__, cells);
    }
    f->trace = tr;
    return SP_OK;
}

void sp_moe_trace_clear(struct sp_fwd *f) {
    struct sp_moe_trace *tr = f->trace;
    if (tr) memset(tr->seen, 0, (size_t)tr->n_layers * tr->n_ctx);
}

bool sp_moe_trace_get(const struct sp_fwd *f, uint32_t il, uint32_t pos, struct sp_moe_route *out) {
    const struct sp_moe_trace *tr = f->trace;
    if (!tr || il >= tr->n_layers || pos >= tr->n_ctx) return false;
    const size_t c = (size_t)il * tr->n_ctx + pos;
    if (!tr->seen[c]) return false;
    out->experts = tr->experts + c * tr->n_used;
    out->weights = tr->weights + c * tr->n_used;
    out->probs = tr->probs + c * tr->n_experts;
    out->n_used = tr->n_used;
    out->n_experts = tr->n_experts;
    return true;
}

/* k experts per token this pass (fewer than the record's n_used when the
 * governor cut them: the rest of a record is -1 with weight 0). */
static void trace_record(struct sp_moe_trace *tr, const struct sp_fwd *f, uint32_t il, uint32_t n_tok,
                         uint32_t pos0, uint32_t k) {
    const uint32_t K = tr->n_used, X = tr->n_experts;
    for (uint32_t t = 0; t < n_tok && pos0 + t < tr->n_ctx; t++) {
        const size_t c = (size_t)il * tr->n_ctx + pos0 + t;
        memcpy(tr->experts + c * K, f->sel + (size_t)t * k, k * sizeof(int32_t));
        memcpy(tr->weights + c * K, f->sel_w + (size_t)t * k, k * sizeof(float));
        for (uint32_t j = k; j < K; j++) {
            tr->experts[c * K + j] = -1;
            tr->weights[c * K + j] = 0.0f;
        }
        memcpy(tr->probs + c * X, f->probs + (size_t)t * X, X * sizeof(float));
        tr->seen[c] = 1;
    }
}

/* ---- routing ------------------------------------------------------------ */

/* p = softmax(p) in place, as ggml: exp(x - max), the sum in double. */
static void softmax(float *p, uint32_t n) {
    float mx = p[0];
    for (uint32_t i = 1; i < n; i++) mx = p[i] > mx ? p[i] : mx;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = expf(p[i] - mx);
        sum += (double)p[i];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++) p[i] *= inv;
}

/* The k most probable of n experts, in descending probability, ties to the
 * lower id: pick j is the best of those ranked after pick j-1 in the order
 * (p descending, id ascending).  O(k n), no scratch.  NaN probabilities
 * (only from NaN weights) fall back to the lowest unused ids, so the ids are
 * always distinct and in range. */
static void top_k(const float *p, uint32_t n, uint32_t k, int32_t *sel) {
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n; e++) {
            if (j > 0) {
                const float pp = p[sel[j - 1]];
                const bool after = p[e] < pp || (p[e] == pp && (int32_t)e > sel[j - 1]);
                if (!after) continue;
            }
            if (best < 0 || p[e] > p[best]) best = (int32_t)e;
        }
        for (uint32_t e = 0; best < 0 && e < n; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j; i++) taken |= sel[i] == (int32_t)e;
            if (!taken) best = (int32_t)e;
        }
        sel[j] = best;
    }
}

/* Router probabilities -> per-token experts and weights (f->sel, f->sel_w).
 * With fewer experts than the model's K (the governor's knob) the k most
 * probable are kept and their weights renormalised: to sum to 1 when the
 * model normalises its top-K, else to the sum the full top-K would have had,
 * so the block's output keeps its scale. */
static void route(const struct sp_hparams *hp, struct sp_fwd *f, uint32_t n_tok) {
    const uint32_t X = hp->n_experts, K = hp->n_experts_used, k = fwd_k(hp, f);
    if (k < K) {
        for (uint32_t t = 0; t < n_tok; t++) {
            float *p = f->probs + (size_t)t * X;
            int32_t *sel = f->sel + (size_t)t * k; /* K ids fit: t*k + K <= n_batch*K */
            float *w = f->sel_w + (size_t)t * k;
            softmax(p, X);
            top_k(p, X, K, sel);
            double full = 0.0, part = 0.0;
            for (uint32_t j = 0; j < K; j++) full += (double)p[sel[j]];
            for (uint32_t j = 0; j < k; j++) part += (double)p[sel[j]];
            const double to = hp->expert_weights_norm ? 1.0 : full;
            const double sc = to / SP_MAX(part, 6.103515625e-5);
            for (uint32_t j = 0; j < k; j++) w[j] = (float)(p[sel[j]] * sc);
        }
        return;
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        float *p = f->probs + (size_t)t * X;
        int32_t *sel = f->sel + (size_t)t * K;
        float *w = f->sel_w + (size_t)t * K;
        softmax(p, X);
        top_k(p, X, K, sel);
        double sum = 0.0;
        for (uint32_t j = 0; j < K; j++) {
            w[j] = p[sel[j]];
            sum += (double)w[j];
        }
        if (hp->expert_weights_norm) {
            /* The floor (the smallest normal F16, as llama.cpp) only guards a division by ~0. */
            const float s = SP_MAX((float)sum, 6.103515625e-5f);
            for (uint32_t j = 0; j < K; j++) w[j] /= s;
        }
    }
}

/* Counting sort of the (token, expert) pairs by expert: grp_off, grp_tok,
 * grp_w, and the used mask.  Tokens stay ascending within a group. */
static void group(const struct sp_hparams *hp, struct sp_fwd *f, uint32_t n_tok) {
    const uint32_t X = hp->n_experts, K = fwd_k(hp, f);
    memset(f->grp_off, 0, ((size_t)X + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < (size_t)n_tok * K; i++) f->grp_off[f->sel[i] + 1]++;
    for (uint32_t e = 0; e < X; e++) {
        f->used[e] = f->grp_off[e + 1] > 0;
        f->grp_off[e + 1] += f->grp_off[e];
    }
    /* Fill using grp_off[e] as a cursor, then shift the offsets back. */
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t j = 0; j < K; j++) {
            const int32_t e = f->sel[(size_t)t * K + j];
            const uint32_t at = f->grp_off[e]++;
            f->grp_tok[at] = t;
            f->grp_w[at] = f->sel_w[(size_t)t * K + j];
        }
    }
    for (uint32_t e = X; e > 0; e--) f->grp_off[e] = f->grp_off[e - 1];
    f->grp_off[0] = 0;
}

/* Expert e's slice of the 3-D tensor t: its byte range. */
static void expert_range(const struct sp_tensor_desc *t, uint32_t e, uint64_t *off, uint64_t *n) {
    *n = t->size / (uint64_t)t->ne[2];
    *off = (uint64_t)e * *n;
}

/* Tell the pager the three slices of expert e of layer L may be needed soon
 * (a guess). */
static void guess_expert(struct sp_pager *pg, const struct sp_layer_weights *L, uint32_t e) {
    const struct sp_tensor_desc *ts[3] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps};
    for (int k = 0; k < 3; k++) {
        uint64_t off, n;
        expert_range(ts[k], e, &off, &n);
        sp_pager_prefetch(pg, ts[k], off, n);
    }
}

/* The experts of layer il are known for the whole batch (f->used): every
 * slice they need is requested at once, so the reads run in parallel while
 * the first experts compute.  Then, when the experts stream and this is a
 * one-token decode, guess layer il+1's experts by applying its router to the
 * current residual stream (normalised with its ffn_norm) and prefetch them:
 * the residual changes little from one layer to the next, so the guess is
 * often right, and its reads overlap this layer's work.  Uses f->xb2 (row 0)
 * and f->probs as scratch: both are free here (sp_moe_ffn clears xb2 next;
 * the routing has been grouped and traced). */
static void experts_chosen(struct sp_model *m, struct sp_fwd *f, uint32_t il, uint32_t n_tok) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    if (!sp_pager_streams(m->pager, L->ffn_gate_exps)) return;
    /* every chosen slice in one call (in batches of 32 experts): the pager
     * keeps the resident ones before it reads the missing ones */
    struct sp_pager_span need[96];
    uint32_t n_need = 0;
    const struct sp_tensor_desc *ts[3] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps};
    for (uint32_t e = 0; e < hp->n_experts; e++) {
        if (!f->used[e]) continue;
        for (int k = 0; k < 3; k++) {
            need[n_need].t = ts[k];
            expert_range(ts[k], e, &need[n_need].off, &need[n_need].n);
            n_need++;
        }
        if (n_need == SP_ARRAY_LEN(need)) {
            sp_pager_need_spans(m->pager, need, n_need);
            n_need = 0;
        }
    }
    if (n_need) sp_pager_need_spans(m->pager, need, n_need);
    if (n_tok != 1 || il + 1 >= hp->n_layers) return;
    const struct sp_layer_weights *N = &m->layers[il + 1];
    if (!N->ffn_gate_inp || !N->ffn_norm || !N->ffn_gate_exps) return;
    const uint32_t E = hp->n_embd, K = fwd_k(hp, f);
    const void *nw;
    if (sp_pager_pin(m->pager, N->ffn_norm, &nw) != SP_OK) return;
    sp_rmsnorm(f->xb2, f->x, nw, N->ffn_norm->type, E, hp->rms_eps);
    sp_pager_unpin(m->pager, N->ffn_norm, nw);
    if (sp_fwd_matmul(m, f, N->ffn_gate_inp, f->xb2, E, 1, f->probs, hp->n_experts) != SP_OK) return;
    int32_t guess[64];
    const uint32_t k = SP_MIN(K, (uint32_t)SP_ARRAY_LEN(guess));
    top_k(f->probs, hp->n_experts, k, guess); /* logits rank as probabilities do */
    for (uint32_t j = 0; j < k; j++) guess_expert(m->pager, N, (uint32_t)guess[j]);
}

/* ---- experts ------------------------------------------------------------ */

/* Y = X W_e^T for expert `expert` of the 3-D tensor t (ne = {n_in, n_out, X}):
 * n_tok rows of x (x_ld apart) give n_tok rows of y (y_ld apart).  The only
 * access to routed-expert weights: pins just that expert's bytes. */
static sp_status expert_matmul(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, uint32_t expert,
                               const float *x, int64_t x_ld, uint32_t n_tok, float *y, int64_t y_ld) {
    const uint32_t rows = (uint32_t)t->ne[1];
    return sp_matmul_rows(m, f, t, (uint64_t)expert * rows, rows, x, x_ld, n_tok, y, y_ld);
}

/* ---- one-token decode: all chosen experts at once ---------------------------- */

#define MAX_PARTS 192 /* pinned units per pass; more falls back to one expert at a time */

struct pinned {
    const struct sp_tensor_desc *t;
    const void *w;
};

static void unpin_all(struct sp_pager *pg, struct pinned *p, int n) {
    for (int i = 0; i < n; i++) sp_pager_unpin(pg, p[i].t, p[i].w);
}

/* Pin expert e's slice of t unit by unit and describe one product per unit:
 * x (already converted, x_stride) times the slice, into y (n_out floats). */
static sp_status add_parts(struct sp_model *m, const struct sp_tensor_desc *t, uint32_t e, const void *xc,
                           size_t x_stride, float *y, struct sp_mm_part *parts, struct pinned *pins, int *n) {
    const uint32_t rows = (uint32_t)t->ne[1], unit = sp_pager_unit_rows(m->pager, t);
    const uint32_t wt = sp_pager_wtype(m->pager, t);
    const uint64_t row_bytes = sp_qtype_row_bytes(wt, t->ne[0]);
    for (uint32_t r = 0; r < rows; r += unit) {
        const uint32_t nr = SP_MIN(unit, rows - r);
        if (*n == MAX_PARTS) return SP_E_BUFFER;
        const void *w;
        sp_status rc = sp_pager_pin_range(m->pager, t, ((uint64_t)e * rows + r) * row_bytes, (uint64_t)nr * row_bytes, &w);
        if (rc) return rc;
        pins[*n] = (struct pinned){t, w};
        parts[*n] = (struct sp_mm_part){wt, w, t->ne[0], nr, xc, x_stride, 1, y + r, (int64_t)rows};
        ++*n;
    }
    return SP_OK;
}

/* One token, K experts: the gate and up products of all of them in one
 * parallel pass, then all down products in another -- two wake-ups of the
 * thread pool per layer instead of 3K.  Returns SP_E_BUFFER (nothing done)
 * when the batch scratch or the part table is too small: the caller then runs
 * the experts one by one.  Same arithmetic as run_expert. */
static sp_status decode_experts(struct sp_model *m, struct sp_fwd *f, const struct sp_layer_weights *L) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t E = hp->n_embd, FE = hp->n_ff_exp, K = fwd_k(hp, f);
    const struct sp_tensor_desc *G = L->ffn_gate_exps, *U = L->ffn_up_exps, *D = L->ffn_down_exps;
    const uint32_t gt = sp_pager_wtype(m->pager, G);
    if (K > f->n_batch || gt != sp_pager_wtype(m->pager, U)) return SP_E_BUFFER;
    struct sp_mm_part parts[MAX_PARTS];
    struct pinned pins[MAX_PARTS];
    int n = 0;
    size_t stride;
    const void *xc = sp_act_convert(gt, f->xb, E, E, 1, f->xq, &stride);
    sp_status rc = SP_OK;
    for (uint32_t k = 0; k < K && rc == SP_OK; k++) {
        const uint32_t e = (uint32_t)f->sel[k];
        rc = add_parts(m, G, e, xc, stride, f->hb + (size_t)k * FE, parts, pins, &n);
        if (rc == SP_OK) rc = add_parts(m, U, e, xc, stride, f->hb2 + (size_t)k * FE, parts, pins, &n);
    }
    if (rc == SP_OK) sp_matmul_multi(f->pool, parts, n);
    unpin_all(m->pager, pins, n);
    if (rc) return rc;
    sp_silu_mul(f->hb, f->hb2, (int64_t)K * FE);
    const void *hc = sp_act_convert(sp_pager_wtype(m->pager, D), f->hb, FE, FE, K, f->xq, &stride);
    n = 0;
    for (uint32_t k = 0; k < K && rc == SP_OK; k++) {
        rc = add_parts(m, D, (uint32_t)f->sel[k], (const uint8_t *)hc + k * stride, stride, f->yg + (size_t)k * E,
                       parts, pins, &n);
    }
    if (rc == SP_OK) sp_matmul_multi(f->pool, parts, n);
    unpin_all(m->pager, pins, n);
    if (rc) return rc;
    /* the weighted sum in ascending expert id, as run_expert adds them */
    float *out = f->xb2;
    for (uint32_t done = 0, last = 0; done < K; done++) {
        uint32_t k = K;
        for (uint32_t j = 0; j < K; j++) {
            const uint32_t e = (uint32_t)f->sel[j];
            if ((done == 0 || e > last) && (k == K || e < (uint32_t)f->sel[k])) k = j;
        }
        last = (uint32_t)f->sel[k];
        const float wk = f->sel_w[k], *y = f->yg + (size_t)k * E;
        for (uint32_t i = 0; i < E; i++) out[i] += wk * y[i];
    }
    return SP_OK;
}

/* Expert e on its group of n tokens: gather their rows of xb, SwiGLU, and
 * add w * output into their rows of xb2. */
static sp_status run_expert(struct sp_model *m, struct sp_fwd *f, const struct sp_layer_weights *L, uint32_t e,
                            const uint32_t *tok, const float *w, uint32_t n, uint32_t n_tok) {
    const uint32_t E = m->mf->hp.n_embd, FE = m->mf->hp.n_ff_exp;
    const float *x = f->xb; /* n == n_tok: every token, in order (invariant 3) */
    if (n < n_tok) {
        for (uint32_t j = 0; j < n; j++) memcpy(f->xg + (size_t)j * E, f->xb + (size_t)tok[j] * E, E * sizeof(float));
        x = f->xg;
    }
    sp_status rc;
    if ((rc = expert_matmul(m, f, L->ffn_gate_exps, e, x, E, n, f->hb, FE))) return rc;
    if ((rc = expert_matmul(m, f, L->ffn_up_exps, e, x, E, n, f->hb2, FE))) return rc;
    sp_silu_mul(f->hb, f->hb2, (int64_t)n * FE);
    if ((rc = expert_matmul(m, f, L->ffn_down_exps, e, f->hb, FE, n, f->yg, E))) return rc;
    for (uint32_t j = 0; j < n; j++) {
        float *out = f->xb2 + (size_t)tok[j] * E;
        const float *y = f->yg + (size_t)j * E;
        for (uint32_t i = 0; i < E; i++) out[i] += w[j] * y[i];
    }
    return SP_OK;
}

/* The shared expert (every token), scaled by sigmoid(gate_inp_shexp . h)
 * when the gate exists, added to xb2.  Uses f->probs for the gate values:
 * the routing is done by then. */
static sp_status shared_expert(struct sp_model *m, struct sp_fwd *f, const struct sp_layer_weights *L,
                               uint32_t n_tok) {
    const uint32_t E = m->mf->hp.n_embd, FS = (uint32_t)L->ffn_gate_shexp->ne[1];
    sp_status rc;
    if ((rc = sp_fwd_matmul(m, f, L->ffn_gate_shexp, f->xb, E, n_tok, f->hb, FS))) return rc;
    if ((rc = sp_fwd_matmul(m, f, L->ffn_up_shexp, f->xb, E, n_tok, f->hb2, FS))) return rc;
    sp_silu_mul(f->hb, f->hb2, (int64_t)n_tok * FS);
    if ((rc = sp_fwd_matmul(m, f, L->ffn_down_shexp, f->hb, FS, n_tok, f->yg, E))) return rc;
    float *gate = f->probs; /* (n_tok) */
    if (L->ffn_gate_inp_shexp && (rc = sp_fwd_matmul(m, f, L->ffn_gate_inp_shexp, f->xb, E, n_tok, gate, 1)))
        return rc;
    for (uint32_t t = 0; t < n_tok; t++) {
        const float g = L->ffn_gate_inp_shexp ? 1.0f / (1.0f + expf(-gate[t])) : 1.0f;
        float *out = f->xb2 + (size_t)t * E;
        const float *y = f->yg + (size_t)t * E;
        for (uint32_t i = 0; i < E; i++) out[i] += g * y[i];
    }
    return SP_OK;
}

sp_status sp_moe_ffn(struct sp_model *m, struct sp_fwd *f, uint32_t il, uint32_t n_tok, uint32_t pos0) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    const uint32_t E = hp->n_embd, X = hp->n_experts;
    sp_status rc;
    SP_ASSERT(n_tok >= 1 && n_tok <= f->n_batch && L->ffn_gate_inp);

    if ((rc = sp_fwd_matmul(m, f, L->ffn_gate_inp, f->xb, E, n_tok, f->probs, X))) return rc;
    route(hp, f, n_tok);
    if (f->trace) trace_record(f->trace, f, il, n_tok, pos0, fwd_k(hp, f));
    group(hp, f, n_tok);
    experts_chosen(m, f, il, n_tok);

    memset(f->xb2, 0, (size_t)n_tok * E * sizeof(float));
    rc = n_tok == 1 ? decode_experts(m, f, L) : SP_E_BUFFER;
    if (rc == SP_E_BUFFER) {
        for (uint32_t e = 0; e < X; e++) {
            const uint32_t a = f->grp_off[e], n = f->grp_off[e + 1] - a;
            if (n && (rc = run_expert(m, f, L, e, f->grp_tok + a, f->grp_w + a, n, n_tok))) return rc;
        }
    } else if (rc) {
        return rc;
    }
    if (L->ffn_gate_shexp && (rc = shared_expert(m, f, L, n_tok))) return rc;
    return SP_OK;
}
