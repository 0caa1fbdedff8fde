/*
 * llama.c -- the forward pass for the Llama family (llama, qwen2, qwen3,
 * qwen3moe, Mixtral-style llama) over a batch of tokens, in llama2.c's order:
 *   embed -> per layer: rmsnorm -> q,k,v (+bias) -> (q/k norm) -> rope ->
 *   attention over the KV cache -> wo -> residual -> rmsnorm -> SwiGLU FFN
 *   (or the MoE block, moe.c) -> residual -> final rmsnorm -> output head (the
 *   last token, or every token of the batch when the caller asks for all
 *   logits, e.g. for perplexity).
 * Each weight is pinned through the pager right before use, multiplied with
 * all tokens of the batch at once (one pass over the weight), and unpinned.
 * Nothing here allocates: all scratch is in struct sp_fwd (sp_fwd_init).
 */
#include "model.h"

#include "moe.h"
#include "ops.h"

#include <math.h>
#include <time.h>

/* ---- scratch ------------------------------------------------------------ */

struct fwd_sizes {
    size_t x, q, k, v, attn, att, hb, xq; /* per-token widths (att: bytes, per batch) */
};

/* The geometry of a cache of the given types for this model. */
struct sp_kv_geom sp_model_kv_geom(const struct sp_model *m, enum sp_kv_type type_k, enum sp_kv_type type_v) {
    const struct sp_hparams *hp = &m->mf->hp;
    return (struct sp_kv_geom){hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim_k, hp->head_dim_v, type_k,
                               type_v};
}

static struct fwd_sizes fwd_sizes(const struct sp_model *m, uint32_t n_batch, int n_threads) {
    const struct sp_hparams *hp = &m->mf->hp;
    struct fwd_sizes s;
    s.x = hp->n_embd;
    s.q = (size_t)hp->n_heads * hp->head_dim_k;
    s.k = (size_t)hp->n_kv_heads * hp->head_dim_k;
    s.v = (size_t)hp->n_kv_heads * hp->head_dim_v;
    s.attn = (size_t)hp->n_heads * hp->head_dim_v;
    const struct sp_kv_geom g = sp_model_kv_geom(m, SP_KV_F32, SP_KV_F32); /* scratch does not depend on types */
    s.att = sp_kv_attend_scratch_bytes(&g, n_threads < 1 ? 1 : n_threads);
    s.hb = m->n_ff_max; /* covers the dense, expert and shared-expert widths */
    int64_t widest = SP_MAX(SP_MAX((int64_t)s.x, (int64_t)s.attn), (int64_t)s.hb);
    s.xq = sp_act_bytes(widest, n_batch);
    return s;
}

uint64_t sp_fwd_bytes(const struct sp_model *m, uint32_t n_batch, int n_threads) {
    struct fwd_sizes s = fwd_sizes(m, n_batch, n_threads);
    return (uint64_t)((3 * s.x + s.q + s.k + s.v + s.attn + 2 * s.hb) * n_batch) * sizeof(float) + s.att + s.xq +
           sp_moe_fwd_bytes(m, n_batch);
}

sp_status sp_fwd_init(const struct sp_model *m, uint32_t n_ctx, uint32_t n_batch, int n_threads,
                      struct sp_fwd **out) {
    *out = NULL;
    SP_ASSERT(n_batch >= 1);
    struct fwd_sizes s = fwd_sizes(m, n_batch, n_threads);
    struct sp_fwd *f = sp_calloc(1, sizeof(*f));
    if (!f) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    f->n_ctx = n_ctx;
    f->n_batch = n_batch;
    const size_t B = n_batch * sizeof(float);
    f->x = sp_malloc_aligned(s.x * B, 64);
    f->xb = sp_malloc_aligned(s.x * B, 64);
    f->xb2 = sp_malloc_aligned(s.x * B, 64);
    f->q = sp_malloc_aligned(s.q * B, 64);
    f->k = sp_malloc_aligned(s.k * B, 64);
    f->v = sp_malloc_aligned(s.v * B, 64);
    f->attn = sp_malloc_aligned(s.attn * B, 64);
    f->att = sp_malloc_aligned(s.att, 64);
    f->hb = sp_malloc_aligned(s.hb * B, 64);
    f->hb2 = sp_malloc_aligned(s.hb * B, 64);
    f->xq_bytes = s.xq;
    f->xq = sp_malloc_aligned(s.xq, 64);
    if (!f->x || !f->xb || !f->xb2 || !f->q || !f->k || !f->v || !f->attn || !f->att || !f->hb || !f->hb2 ||
        !f->xq) {
        sp_fwd_free(f);
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %llu bytes of scratch", __func__,
                      (unsigned long long)sp_fwd_bytes(m, n_batch, n_threads));
    }
    sp_status rc = sp_moe_fwd_init(m, f);
    if (!rc) rc = sp_pool_init(n_threads < 1 ? 1 : n_threads, &f->pool);
    if (rc) {
        sp_fwd_free(f);
        return rc;
    }
    *out = f;
    return SP_OK;
}

void sp_fwd_free(struct sp_fwd *f) {
    if (!f) return;
    sp_pool_free(f->pool);
    sp_free_aligned(f->x);
    sp_free_aligned(f->xb);
    sp_free_aligned(f->xb2);
    sp_free_aligned(f->q);
    sp_free_aligned(f->k);
    sp_free_aligned(f->v);
    sp_free_aligned(f->attn);
    sp_free_aligned(f->att);
    sp_free_aligned(f->hb);
    sp_free_aligned(f->hb2);
    sp_free_aligned(f->xq);
    sp_moe_fwd_free(f);
    sp_free(f);
}

/* ---- pinned weight helpers ---------------------------------------------- */

/* Y = X W^T for rows [row0, row0 + n_rows) of weight t (ne = {n_in, ...}):
 * n_tok rows of x (n_in floats, x_ld apart) give n_tok rows of y (n_rows
 * floats, y_ld apart).  The weight is pinned one pager unit at a time, so a
 * streamed tensor never needs to be resident whole; row0 must start a unit
 * (0, or an expert's first row). */
/* sp_matmul_rows with the activations already converted (xc, stride). */
static sp_status matmul_rows_xc(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, uint64_t row0,
                                uint32_t n_rows, const void *xc, size_t stride, uint32_t n_tok, float *y, int64_t y_ld) {
    const uint32_t wt = sp_pager_wtype(m->pager, t);
    const uint64_t row_bytes = sp_qtype_row_bytes(wt, t->ne[0]);
    const uint32_t unit = sp_pager_unit_rows(m->pager, t);
    for (uint32_t r = 0; r < n_rows; r += unit) {
        const uint32_t nr = SP_MIN(unit, n_rows - r);
        const void *w;
        sp_status rc = sp_pager_pin_range(m->pager, t, (row0 + r) * row_bytes, (uint64_t)nr * row_bytes, &w);
        if (rc) return rc;
        sp_matmul(f->pool, wt, w, t->ne[0], nr, xc, stride, n_tok, y + r, y_ld);
        sp_pager_unpin(m->pager, t, w);
    }
    return SP_OK;
}

sp_status sp_matmul_rows(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, uint64_t row0,
                         uint32_t n_rows, const float *x, int64_t x_ld, uint32_t n_tok, float *y, int64_t y_ld) {
    if (f->observe) f->observe(f->observe_ctx, t, x, x_ld, n_tok);
    size_t stride;
    const void *xc = sp_act_convert(sp_pager_wtype(m->pager, t), x, t->ne[0], x_ld, n_tok, f->xq, &stride);
    return matmul_rows_xc(m, f, t, row0, n_rows, xc, stride, n_tok, y, y_ld);
}

/* Y = X W^T over all rows of a 2-D weight t (model.h). */
sp_status sp_fwd_matmul(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, const float *x,
                        int64_t x_ld, uint32_t n_tok, float *y, int64_t y_ld) {
    return sp_matmul_rows(m, f, t, 0, (uint32_t)t->ne[1], x, x_ld, n_tok, y, y_ld);
}

/* Products of one activation with n weights (Q, K, V; gate, up), all rows
 * of each, into y[i] (t[i]->ne[1] floats per token): in one parallel pass
 * when every weight is resident and they take the same activation type --
 * one conversion of x and one wake-up of the pool instead of n, and each
 * thread's rows one stream across the weights -- else one after another.
 * The same results either way. */
static sp_status fwd_matmul_n(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *const *t, float *const *y,
                              int n, const float *x, int64_t x_ld, uint32_t n_tok) {
    enum { MAX_N = 4 };
    SP_ASSERT(n >= 1 && n <= MAX_N);
    uint32_t wt[MAX_N];
    for (int i = 0; i < n; i++)
        wt[i] = sp_pager_wtype(m->pager, t[i]);
    const uint32_t at = sp_qtraits_get(wt[0])->vec_dot_type;
    bool one_pass = !f->observe;
    for (int i = 0; i < n && one_pass; i++)
        one_pass = t[i]->ne[0] == t[0]->ne[0] && sp_qtraits_get(wt[i])->vec_dot_type == at &&
                   !sp_pager_streams(m->pager, t[i]);
    if (!one_pass) {
        for (int i = 0; i < n; i++) {
            const sp_status rc = sp_fwd_matmul(m, f, t[i], x, x_ld, n_tok, y[i], t[i]->ne[1]);
            if (rc) return rc;
        }
        return SP_OK;
    }
    size_t stride;
    const void *xc = sp_act_convert(wt[0], x, t[0]->ne[0], x_ld, n_tok, f->xq, &stride);
    struct sp_mm_part parts[MAX_N];
    sp_status rc = SP_OK;
    int pinned = 0;
    for (; pinned < n; pinned++) {
        const void *w;
        if ((rc = sp_pager_pin(m->pager, t[pinned], &w))) break;
        parts[pinned] = (struct sp_mm_part){wt[pinned], w, t[pinned]->ne[0], t[pinned]->ne[1], xc, stride, n_tok,
                                            y[pinned], t[pinned]->ne[1]};
    }
    if (rc == SP_OK) sp_matmul_multi(f->pool, parts, n);
    for (int i = 0; i < pinned; i++) sp_pager_unpin(m->pager, t[i], parts[i].w);
    return rc;
}

/* out row i = rmsnorm(x row i) * weight t, for n_rows rows of n floats. */
static sp_status norm(struct sp_model *m, const struct sp_tensor_desc *t, const float *x, float *out, int64_t n,
                      uint32_t n_rows) {
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    for (uint32_t i = 0; i < n_rows; i++) sp_rmsnorm(out + i * n, x + i * n, w, t->type, n, m->mf->hp.rms_eps);
    sp_pager_unpin(m->pager, t, w);
    return SP_OK;
}

/* x row i += bias, when the tensor exists. */
static sp_status add_bias(struct sp_model *m, const struct sp_tensor_desc *t, float *x, uint32_t n_rows) {
    if (!t) return SP_OK;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    const int64_t n = t->ne[0];
    for (uint32_t r = 0; r < n_rows; r++) {
        for (int64_t i = 0; i < n; i++) x[r * n + i] += sp_vec_get(w, t->type, i);
    }
    sp_pager_unpin(m->pager, t, w);
    return SP_OK;
}

/* Per-head RMSNorm (qwen3 q_norm / k_norm) over n_heads * n_rows heads of hd. */
static sp_status head_norm(struct sp_model *m, const struct sp_tensor_desc *t, float *x, uint32_t n_heads,
                           uint32_t hd) {
    if (!t) return SP_OK;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    for (uint32_t h = 0; h < n_heads; h++) sp_rmsnorm(x + (size_t)h * hd, x + (size_t)h * hd, w, t->type, hd, m->mf->hp.rms_eps);
    sp_pager_unpin(m->pager, t, w);
    return SP_OK;
}

/* One row of the embedding table, dequantized into x. */
static sp_status embed(struct sp_model *m, int32_t token, float *x) {
    const struct sp_tensor_desc *t = m->tok_embd;
    const size_t row = sp_qtype_row_bytes(t->type, t->ne[0]);
    const void *w;
    sp_status rc = sp_pager_pin_range(m->pager, t, (uint64_t)token * row, row, &w);
    if (rc) return rc;
    sp_qtraits_get(t->type)->to_float(w, x, t->ne[0]);
    sp_pager_unpin(m->pager, t, w);
    return SP_OK;
}

/* The SwiGLU gate over a batch, elements split across threads (exp per
 * element: ~2% of a 128-token prefill on one thread). */
struct silu_job {
    float *g;
    const float *u;
    int64_t n;
};

static void silu_task(void *arg, int ith, int nth) {
    const struct silu_job *j = arg;
    const int64_t per = (j->n + nth - 1) / nth;
    const int64_t i0 = SP_MIN(j->n, per * ith), i1 = SP_MIN(j->n, i0 + per);
    sp_silu_mul(j->g + i0, j->u + i0, i1 - i0);
}

static void add_rows(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}


/* ---- rotated cache types: two exact rewrites of attention -----------------
 * With a rotated cache type (q4h, quant/kv.h) attention is rewritten in two
 * ways that leave its result unchanged in exact arithmetic but give the
 * 4-bit code less to carry (docs/MEMORY.md, "KV cache types"):
 *  - values without their bias (qwen2's attn_v.bias): the softmax weights
 *    of a query sum to one, so sum_t p_t (v_t + b) = sum_t p_t v_t + b; the
 *    cache stores W_v x and b is added to the attention output.
 *  - keys balanced against queries per channel (qwen3's per-head q_norm and
 *    k_norm): k_c * d_c and q_c / d_c leave q . k unchanged.  After those
 *    norms a channel's energy is about w_c^2 (the norm weight squared), and
 *    d_c = (Q_c / K_c)^(1/4) minimises E|q'|^2 E|k'|^2, which the error of
 *    a rotated block, spread evenly over its channels, is proportional to.
 *    Q and K are summed over each RoPE pair, so d is equal within a pair and
 *    commutes with RoPE (and with a context shift's re-rotation of the
 *    stored keys). */

/* The RoPE partner of channel c: neox pairs c with c +- rope_dims / 2, the
 * original layout 2i with 2i + 1; channels past rope_dims are their own. */
static uint32_t rope_partner(uint32_t c, uint32_t rope_dims, bool neox) {
    if (c >= rope_dims) return c;
    if (neox) return c < rope_dims / 2 ? c + rope_dims / 2 : c - rope_dims / 2;
    return c ^ 1u;
}

/* d (hd floats) from the layer's q_norm and k_norm weights. */
static sp_status qk_balance(struct sp_model *m, const struct sp_layer_weights *L, float *d) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t hd = hp->head_dim_k, rd = SP_MIN(hp->rope_dims, hd);
    const void *wq, *wk;
    sp_status rc = sp_pager_pin(m->pager, L->q_norm, &wq);
    if (rc) return rc;
    if ((rc = sp_pager_pin(m->pager, L->k_norm, &wk))) {
        sp_pager_unpin(m->pager, L->q_norm, wq);
        return rc;
    }
    for (uint32_t c = 0; c < hd; c++) {
        const uint32_t p = rope_partner(c, rd, hp->rope_neox);
        float q2 = 0.0f, k2 = 0.0f;
        for (int s = 0; s < (p == c ? 1 : 2); s++) {
            const float a = sp_vec_get(wq, L->q_norm->type, s ? p : c), b = sp_vec_get(wk, L->k_norm->type, s ? p : c);
            q2 += a * a;
            k2 += b * b;
        }
        const float dc = q2 > 0.0f && k2 > 0.0f ? sqrtf(sqrtf(q2 / k2)) : 1.0f;
        d[c] = isfinite(dc) ? SP_MAX(1.0f / 64, SP_MIN(64.0f, dc)) : 1.0f;
    }
    sp_pager_unpin(m->pager, L->q_norm, wq);
    sp_pager_unpin(m->pager, L->k_norm, wk);
    return SP_OK;
}

/* Each of n rows of hd: x[c] *= d[c] (div: x[c] /= d[c]). */
static void scale_channels(float *x, uint32_t n, uint32_t hd, const float *d, bool div) {
    for (uint32_t r = 0; r < n; r++, x += hd) {
        for (uint32_t c = 0; c < hd; c++) x[c] = div ? x[c] / d[c] : x[c] * d[c];
    }
}

/* The value bias added to the attention output: n_tok rows of n_heads heads
 * of hdv, head h reading KV head h / G's part of b. */
static sp_status add_value_bias(struct sp_model *m, const struct sp_tensor_desc *t, float *o, uint32_t n_tok) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t G = hp->n_heads / hp->n_kv_heads, hdv = hp->head_dim_v;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    for (uint32_t r = 0; r < n_tok * hp->n_heads; r++) {
        const uint32_t kh = r % hp->n_heads / G;
        for (uint32_t c = 0; c < hdv; c++) o[(size_t)r * hdv + c] += sp_vec_get(w, t->type, (int64_t)kh * hdv + c);
    }
    sp_pager_unpin(m->pager, t, w);
    return SP_OK;
}

/* Attention's first part over the whole batch: biases and head norms of Q and K. */
static sp_status attn_qk(struct sp_model *m, struct sp_fwd *f, uint32_t il, uint32_t n_tok) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    sp_status rc;
    if ((rc = add_bias(m, L->bq, f->q, n_tok)) || (rc = add_bias(m, L->bk, f->k, n_tok)) ||
        (rc = head_norm(m, L->q_norm, f->q, hp->n_heads * n_tok, hp->head_dim_k)))
        return rc;
    return head_norm(m, L->k_norm, f->k, hp->n_kv_heads * n_tok, hp->head_dim_k);
}

/* One sequence's positions and cache writes: rows [r, r + g->n_tok) of the
 * batch are segment g's.  A rotated (q4h) cache takes the exact rewrites
 * that leave its code less to carry: keys balanced against queries per
 * channel, the value bias added to the output instead of to each value. */
static sp_status attn_seg_store(struct sp_model *m, struct sp_fwd *f, uint32_t il, const struct sp_fwd_seg *g,
                                uint32_t r, const float *freq_factors) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    const uint32_t hdk = hp->head_dim_k;
    const uint32_t QD = hp->n_heads * hdk, KD = hp->n_kv_heads * hdk, VD = hp->n_kv_heads * hp->head_dim_v;
    float kd[SP_KV_MAX_HEAD_DIM]; /* a q4h key cache: the layer's key channel balance */
    sp_status rc;
    const int32_t *pos = g->c->pos + g->c0;
    const bool rot_k = sp_kv_type_get(g->kv->g.type_k)->rotated;
    const bool rot_v = sp_kv_type_get(g->kv->g.type_v)->rotated;
    if (!rot_v && L->bv && (rc = add_bias(m, L->bv, f->v + (size_t)r * VD, g->n_tok))) return rc;
    if (rot_k && L->q_norm && L->k_norm && hdk <= SP_KV_MAX_HEAD_DIM) {
        if ((rc = qk_balance(m, L, kd))) return rc;
        scale_channels(f->q + (size_t)r * QD, hp->n_heads * g->n_tok, hdk, kd, true);
        scale_channels(f->k + (size_t)r * KD, hp->n_kv_heads * g->n_tok, hdk, kd, false);
    }
    for (uint32_t t = 0; t < g->n_tok; t++) {
        sp_rope(f->q + (size_t)(r + t) * QD, hp->n_heads, hdk, hp->rope_dims, (float)pos[t], hp->rope_theta,
                hp->rope_freq_scale, hp->rope_neox, freq_factors);
        sp_rope(f->k + (size_t)(r + t) * KD, hp->n_kv_heads, hdk, hp->rope_dims, (float)pos[t], hp->rope_theta,
                hp->rope_freq_scale, hp->rope_neox, freq_factors);
    }
    sp_kv_store(g->kv, g->c, g->c0, g->n_tok, il, f->k + (size_t)r * KD, f->v + (size_t)r * VD, f->pool);
    return SP_OK;
}

/* Attention of segment g's query tokens [t0, t1) (after attn_seg_store). */
static sp_status attn_seg_rows(struct sp_model *m, struct sp_fwd *f, uint32_t il, const struct sp_fwd_seg *g,
                               uint32_t r, uint32_t t0, uint32_t t1) {
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_layer_weights *L = &m->layers[il];
    const uint32_t QD = hp->n_heads * hp->head_dim_k, OD = hp->n_heads * hp->head_dim_v;
    sp_kv_attend_rows(g->kv, g->c, il, f->q + (size_t)r * QD, g->n_tok, t0, t1, g->c0 + 1,
                      1.0f / sqrtf((float)hp->head_dim_k), f->attn + (size_t)r * OD, f->pool, f->att);
    if (sp_kv_type_get(g->kv->g.type_v)->rotated && L->bv)
        return add_value_bias(m, L->bv, f->attn + (size_t)(r + t0) * OD, t1 - t0);
    return SP_OK;
}

/* The middle of a layer: Q/K/V of the batch (f->q, f->k, f->v) to f->attn. */
static sp_status attn_mid(struct sp_model *m, struct sp_fwd *f, uint32_t il, const struct sp_fwd_seg *segs,
                          uint32_t n_seg, uint32_t n_tok, const float *freq_factors) {
    sp_status rc = attn_qk(m, f, il, n_tok);
    for (uint32_t s = 0, r = 0; s < n_seg && !rc; r += segs[s].n_tok, s++) {
        if (!(rc = attn_seg_store(m, f, il, &segs[s], r, freq_factors)))
            rc = attn_seg_rows(m, f, il, &segs[s], r, 0, segs[s].n_tok);
    }
    return rc;
}

/* ---- the forward pass --------------------------------------------------- */

sp_status sp_forward(struct sp_model *m, struct sp_fwd *f, struct sp_kv_cache *kv, const struct sp_kv_cells *c,
                     uint32_t c0, const int32_t *tokens, uint32_t n_tok, float *logits, bool all_logits) {
    const struct sp_fwd_seg seg = {kv, c, c0, n_tok};
    return sp_forward_batch(m, f, &seg, 1, tokens, logits, all_logits);
}

sp_status sp_forward_batch(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *segs, uint32_t n_seg,
                           const int32_t *tokens, float *logits, bool all_logits) {
    return sp_forward_layers(m, f, segs, n_seg, tokens, logits, all_logits, 0, m->mf->hp.n_layers);
}

sp_status sp_forward_layers(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *segs, uint32_t n_seg,
                            const int32_t *tokens, float *logits, bool all_logits, uint32_t il0, uint32_t il1) {
    const struct sp_hparams *hp = &m->mf->hp;
    SP_ASSERT(il0 < il1 && il1 <= hp->n_layers);
    const uint32_t E = hp->n_embd, F = hp->n_ff, OD = hp->n_heads * hp->head_dim_v;
    sp_status rc = SP_OK;
    SP_ASSERT(n_seg >= 1 && (!all_logits || n_seg == 1));
    uint32_t n_tok = 0;
    for (uint32_t s = 0; s < n_seg; s++) {
        SP_ASSERT(segs[s].n_tok >= 1 && segs[s].c0 + segs[s].n_tok <= segs[s].c->n);
        n_tok += segs[s].n_tok;
    }
    SP_ASSERT(n_tok <= f->n_batch);

    const float *freq_factors = NULL;
    if (m->rope_freqs) {
        const void *p;
        if ((rc = sp_pager_pin(m->pager, m->rope_freqs, &p))) return rc;
        freq_factors = p;
    }
#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((rc = (x)) != SP_OK) goto out;                                                                         \
    } while (0)

    for (uint32_t t = 0; il0 == 0 && t < n_tok; t++) {
        SP_ASSERT(tokens[t] >= 0 && (uint32_t)tokens[t] < hp->n_vocab);
        TRY(embed(m, tokens[t], f->x + (size_t)t * E));
    }
    for (uint32_t il = il0; il < il1; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        /* attention: the products over every row of the batch at once ... */
        TRY(norm(m, L->attn_norm, f->x, f->xb, E, n_tok));
        {
            const struct sp_tensor_desc *const qkv[] = {L->wq, L->wk, L->wv};
            float *const out[] = {f->q, f->k, f->v};
            TRY(fwd_matmul_n(m, f, qkv, out, 3, f->xb, E, n_tok));
        }
        TRY(attn_mid(m, f, il, segs, n_seg, n_tok, freq_factors));
        TRY(sp_fwd_matmul(m, f, L->wo, f->attn, OD, n_tok, f->xb2, E));
        add_rows(f->x, f->xb2, (size_t)n_tok * E);
        /* feed-forward: SwiGLU, or the experts */
        TRY(norm(m, L->ffn_norm, f->x, f->xb, E, n_tok));
        if (L->ffn_gate_inp) {
            TRY(sp_moe_ffn(m, f, il, n_tok, (uint32_t)segs[0].c->pos[segs[0].c0]));
        } else {
            const struct sp_tensor_desc *const gu[] = {L->ffn_gate, L->ffn_up};
            float *const out[] = {f->hb, f->hb2};
            TRY(fwd_matmul_n(m, f, gu, out, 2, f->xb, E, n_tok));
            struct silu_job sj = {f->hb, f->hb2, (int64_t)n_tok * F};
            if (n_tok > 1) {
                sp_pool_run(f->pool, silu_task, &sj);
            } else {
                silu_task(&sj, 0, 1);
            }
            TRY(sp_fwd_matmul(m, f, L->ffn_down, f->hb, F, n_tok, f->xb2, E));
        }
        add_rows(f->x, f->xb2, (size_t)n_tok * E);
    }
    if (logits && il1 == hp->n_layers) {
        /* Output head, one pass over the weight for every row asked for:
         * with all_logits (one sequence) each row, row r at logits +
         * r*n_vocab; else each sequence's last row, sequence s's at logits +
         * s*n_vocab. */
        uint32_t n_out;
        if (all_logits) {
            n_out = n_tok;
            TRY(norm(m, m->output_norm, f->x, f->xb, E, n_out));
        } else {
            n_out = n_seg;
            for (uint32_t s = 0, r = 0; s < n_seg; s++) {
                r += segs[s].n_tok;
                TRY(norm(m, m->output_norm, f->x + (size_t)(r - 1) * E, f->xb + (size_t)s * E, E, 1));
            }
        }
        TRY(sp_fwd_matmul(m, f, m->output, f->xb, E, n_out, logits, hp->n_vocab));
    }
#undef TRY
out:
    if (m->rope_freqs) sp_pager_unpin(m->pager, m->rope_freqs, freq_factors);
    return rc;
}

/* ---- one pass in slices ---------------------------------------------------
 * sp_forward_layers' work for one sequence, resumable at a product's row
 * block: a layer's stages (below) run in order, and each weight product
 * (QKV, wo, gate/up, down, the output head) goes in blocks of rows --
 * multiples of 64, the largest the time left holds at the cost measured so
 * far -- so a slice can end inside a layer.  A row of a product is computed
 * by the same kernel whatever block holds it (ops.c splits rows across
 * threads in 16-row groups anywhere), so the result is sp_forward's bit for
 * bit.  Products over a streamed weight, and MoE blocks, run whole. */

enum {
    ST_IN = 0, /* (embedding on layer 0) attn_norm */
    ST_QKV,
    ST_ATTN,   /* Q/K biases and norms, positions, the cache writes */
    ST_ATTEND, /* attention, a few query tokens at a time */
    ST_WO,
    ST_FFN_IN, /* residual, ffn_norm; the MoE block whole */
    ST_GU,
    ST_SILU,
    ST_DOWN,
    ST_OUT, /* residual; next layer */
    ST_HEAD_IN = 0,
    ST_HEAD,
    SK_HEAD_IN = ST_OUT + 1, /* the head's norm in sp_fwd_cursor.stage_s */
};

/* Stages of a layer that run whole (the others are products and attention,
 * cut into pieces). */
static bool stage_whole(uint32_t st) {
    return st == ST_IN || st == ST_ATTN || st == ST_FFN_IN || st == ST_SILU || st == ST_OUT;
}

static double slice_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct slice_prod {
    const struct sp_tensor_desc *t[3];
    float *y[3];
    int n;
    const float *x;
    int64_t x_ld;
};

static uint64_t prod_rows_total(const struct slice_prod *p) {
    uint64_t r = 0;
    for (int i = 0; i < p->n; i++) r += (uint64_t)p->t[i]->ne[1];
    return r;
}

/* Rows [r0, r1) of the products' concatenated rows.  The activations are
 * converted once per product and activation type (cur->xq_*), not once per
 * slice: a prompt's 128 rows converted on one thread for each block of rows
 * cost ~15% of a sliced prefill. */
static sp_status prod_rows(struct sp_model *m, struct sp_fwd *f, const struct slice_prod *p, uint32_t n_tok,
                           struct sp_fwd_cursor *cur, uint64_t r0, uint64_t r1) {
    uint64_t base = 0;
    for (int i = 0; i < p->n; i++) {
        const uint64_t rows = (uint64_t)p->t[i]->ne[1], a = SP_MAX(r0, base), b = SP_MIN(r1, base + rows);
        if (b > a) {
            sp_status rc;
            if (f->observe) {
                rc = sp_matmul_rows(m, f, p->t[i], a - base, (uint32_t)(b - a), p->x, p->x_ld, n_tok,
                                    p->y[i] + (a - base), (int64_t)rows);
            } else {
                const uint32_t wt = sp_pager_wtype(m->pager, p->t[i]), at = sp_qtraits_get(wt)->vec_dot_type;
                if (!cur->xq || cur->xq_type != at) {
                    cur->xq = sp_act_convert(wt, p->x, p->t[i]->ne[0], p->x_ld, n_tok, f->xq, &cur->xq_stride);
                    cur->xq_type = at;
                }
                rc = matmul_rows_xc(m, f, p->t[i], a - base, (uint32_t)(b - a), cur->xq, cur->xq_stride, n_tok,
                                    p->y[i] + (a - base), (int64_t)rows);
            }
            if (rc) return rc;
        }
        base += rows;
    }
    return SP_OK;
}

/* Run product p from cur->row on, in blocks, until done (true) or t_end. */
static sp_status prod_slice(struct sp_model *m, struct sp_fwd *f, const struct slice_prod *p, uint32_t n_tok,
                            struct sp_fwd_cursor *cur, double t_end, bool *did, bool *finished) {
    const uint64_t total = prod_rows_total(p);
    bool whole = false;
    for (int i = 0; i < p->n; i++) whole |= sp_pager_streams(m->pager, p->t[i]);
    const double per_row = (double)p->t[0]->ne[0] * n_tok; /* units of cost per row */
    double *spu = &cur->s_per_unit[n_tok > 1]; /* a matrix-vector product costs more per unit */
    *finished = false;
    if (cur->row == 0) cur->xq = NULL; /* a new product: its activations are not converted yet */
    while (cur->row < total) {
        const double now = slice_now();
        if (*did && now >= t_end) return SP_OK;
        uint64_t n = total - cur->row;
        if (!whole) {
            uint64_t fit = 64;
            if (*spu > 0) {
                const double rows = (t_end - now) / (*spu * per_row);
                fit = rows > 64 ? (uint64_t)rows / 64 * 64 : 64;
            }
            n = SP_MIN(n, fit);
            /* never leave a sliver: a block ending within 64 rows of the end takes them */
            if (total - (cur->row + n) < 64) n = total - cur->row;
        }
        const double t0 = slice_now();
        sp_status rc = prod_rows(m, f, p, n_tok, cur, cur->row, cur->row + n);
        if (rc) return rc;
        const double su = (slice_now() - t0) / ((double)n * per_row);
        *spu = *spu > 0 ? 0.7 * *spu + 0.3 * su : su;
        cur->row += n;
        *did = true;
    }
    *finished = true;
    return SP_OK;
}

/* Attention of the segment's query tokens from cur->row on, in pieces
 * (multiples of 16 tokens, the rest of the prompt's attention in one piece
 * when it fits) until done or t_end: a 128-token piece of a 7B prompt at 400
 * cells took ~14 ms, more than a 10 ms slice.  The cost of a token is taken
 * as proportional to the cells it sees. */
static sp_status attend_slice(struct sp_model *m, struct sp_fwd *f, uint32_t il, const struct sp_fwd_seg *g,
                              struct sp_fwd_cursor *cur, double t_end, bool *did, bool *finished) {
    const uint32_t n = g->n_tok;
    double *spu = &cur->s_per_unit[2];
    *finished = false;
    while (cur->row < n) {
        const double now = slice_now();
        if (*did && now >= t_end) return SP_OK;
        const uint32_t t0 = (uint32_t)cur->row;
        uint32_t t1 = n;
        if (*spu > 0) {
            /* the most tokens whose cells fit in the time left */
            const double units = (t_end - now) / *spu;
            uint32_t t = t0;
            double u = 0;
            while (t < n && u + (double)(g->c0 + t + 1) <= units) {
                u += (double)(g->c0 + t + 1);
                t++;
            }
            t1 = SP_MAX(t0 + 16, (t - t0) / 16 * 16 + t0);
            if (n - t1 < 16) t1 = n; /* never leave a sliver */
            t1 = SP_MIN(t1, n);
        }
        double units = 0;
        for (uint32_t t = t0; t < t1; t++) units += (double)(g->c0 + t + 1);
        const double ts = slice_now();
        sp_status rc = attn_seg_rows(m, f, il, g, 0, t0, t1);
        if (rc) return rc;
        const double su = (slice_now() - ts) / units;
        *spu = *spu > 0 ? 0.7 * *spu + 0.3 * su : su;
        cur->row = t1;
        *did = true;
    }
    *finished = true;
    return SP_OK;
}

sp_status sp_forward_slice(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *seg, const int32_t *tokens,
                           float *logits, bool all_logits, struct sp_fwd_cursor *cur, double t_end, bool *pass_done) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t E = hp->n_embd, F = hp->n_ff, OD = hp->n_heads * hp->head_dim_v, n_tok = seg->n_tok;
    SP_ASSERT(n_tok >= 1 && n_tok <= f->n_batch && seg->c0 + n_tok <= seg->c->n);
    *pass_done = false;
    sp_status rc = SP_OK;
    const float *freq_factors = NULL;
    if (m->rope_freqs) {
        const void *p;
        if ((rc = sp_pager_pin(m->pager, m->rope_freqs, &p))) return rc;
        freq_factors = p;
    }
#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((rc = (x)) != SP_OK) goto out;                                                                         \
    } while (0)
    bool did = false, fin;
    /* A stage that runs whole starts only if its last measured time fits in
     * the slice (or nothing was done yet): started 1 ms before the deadline,
     * a 128-token prompt's cache writes or SiLU overran it. */
    int last_sk = -1;
    double last_t = 0;
    while (!*pass_done) {
        const double now = slice_now();
        if (last_sk >= 0) {
            double *e = &cur->stage_s[last_sk];
            *e = *e > 0 ? 0.7 * *e + 0.3 * (now - last_t) : now - last_t;
            last_sk = -1;
        }
        if (did && now >= t_end) break;
        const int sk = cur->il == hp->n_layers ? (cur->stage == ST_HEAD_IN ? SK_HEAD_IN : -1)
                       : stage_whole(cur->stage) ? (int)cur->stage
                                                 : -1;
        if (sk >= 0) {
            if (did && now + cur->stage_s[sk] > t_end) break;
            last_sk = sk;
            last_t = now;
        }
        if (cur->il == hp->n_layers) {
            /* the output head: every row with all_logits, else the last */
            const uint32_t n_out = all_logits ? n_tok : 1;
            const float *xo = all_logits ? f->x : f->x + (size_t)(n_tok - 1) * E;
            if (!logits) {
                *pass_done = true;
                break;
            }
            if (cur->stage == ST_HEAD_IN) {
                TRY(norm(m, m->output_norm, xo, f->xb, E, n_out));
                cur->stage = ST_HEAD;
                cur->row = 0;
                did = true;
                continue;
            }
            const struct slice_prod hd = {{m->output}, {logits}, 1, f->xb, E};
            TRY(prod_slice(m, f, &hd, n_out, cur, t_end, &did, &fin));
            if (fin) *pass_done = true;
            continue;
        }
        const uint32_t il = cur->il;
        const struct sp_layer_weights *L = &m->layers[il];
        switch (cur->stage) {
        case ST_IN:
            if (il == 0 && !cur->embedded) {
                for (uint32_t t = 0; t < n_tok; t++) {
                    SP_ASSERT(tokens[t] >= 0 && (uint32_t)tokens[t] < hp->n_vocab);
                    TRY(embed(m, tokens[t], f->x + (size_t)t * E));
                }
                cur->embedded = true;
            }
            TRY(norm(m, L->attn_norm, f->x, f->xb, E, n_tok));
            cur->stage = ST_QKV;
            cur->row = 0;
            did = true;
            break;
        case ST_QKV: {
            const struct slice_prod pr = {{L->wq, L->wk, L->wv}, {f->q, f->k, f->v}, 3, f->xb, E};
            TRY(prod_slice(m, f, &pr, n_tok, cur, t_end, &did, &fin));
            if (fin) cur->stage = ST_ATTN;
            break;
        }
        case ST_ATTN:
            TRY(attn_qk(m, f, il, n_tok));
            TRY(attn_seg_store(m, f, il, seg, 0, freq_factors));
            cur->stage = ST_ATTEND;
            cur->row = 0;
            did = true;
            break;
        case ST_ATTEND:
            TRY(attend_slice(m, f, il, seg, cur, t_end, &did, &fin));
            if (fin) {
                cur->stage = ST_WO;
                cur->row = 0;
            }
            break;
        case ST_WO: {
            const struct slice_prod pr = {{L->wo}, {f->xb2}, 1, f->attn, OD};
            TRY(prod_slice(m, f, &pr, n_tok, cur, t_end, &did, &fin));
            if (fin) cur->stage = ST_FFN_IN;
            break;
        }
        case ST_FFN_IN:
            add_rows(f->x, f->xb2, (size_t)n_tok * E);
            TRY(norm(m, L->ffn_norm, f->x, f->xb, E, n_tok));
            if (L->ffn_gate_inp) {
                TRY(sp_moe_ffn(m, f, il, n_tok, (uint32_t)seg->c->pos[seg->c0]));
                cur->stage = ST_OUT;
            } else {
                cur->stage = ST_GU;
                cur->row = 0;
            }
            did = true;
            break;
        case ST_GU: {
            const struct slice_prod pr = {{L->ffn_gate, L->ffn_up}, {f->hb, f->hb2}, 2, f->xb, E};
            TRY(prod_slice(m, f, &pr, n_tok, cur, t_end, &did, &fin));
            if (fin) cur->stage = ST_SILU;
            break;
        }
        case ST_SILU: {
            struct silu_job sj = {f->hb, f->hb2, (int64_t)n_tok * F};
            if (n_tok > 1) sp_pool_run(f->pool, silu_task, &sj);
            else silu_task(&sj, 0, 1);
            cur->stage = ST_DOWN;
            cur->row = 0;
            did = true;
            break;
        }
        case ST_DOWN: {
            const struct slice_prod pr = {{L->ffn_down}, {f->xb2}, 1, f->hb, F};
            TRY(prod_slice(m, f, &pr, n_tok, cur, t_end, &did, &fin));
            if (fin) cur->stage = ST_OUT;
            break;
        }
        case ST_OUT:
            add_rows(f->x, f->xb2, (size_t)n_tok * E);
            cur->il++;
            cur->stage = cur->il == hp->n_layers ? (uint32_t)ST_HEAD_IN : (uint32_t)ST_IN;
            cur->row = 0;
            did = true;
            break;
        default:
            SP_ASSERT(0);
        }
    }
#undef TRY
out:
    if (last_sk >= 0) {
        double *e = &cur->stage_s[last_sk];
        const double d = slice_now() - last_t;
        *e = *e > 0 ? 0.7 * *e + 0.3 * d : d;
    }
    if (m->rope_freqs) sp_pager_unpin(m->pager, m->rope_freqs, freq_factors);
    return rc;
}
