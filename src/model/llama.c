/*
 * llama.c -- the forward pass for the Llama family (llama, qwen2, qwen3),
 * one token at a time, in llama2.c's order:
 *   embed -> per layer: rmsnorm -> q,k,v (+bias) -> (q/k norm) -> rope ->
 *   attention over the KV cache -> wo -> residual -> rmsnorm -> SwiGLU FFN ->
 *   residual -> final rmsnorm -> output head.
 * Weights are pinned through the pager right before use and unpinned after.
 * Nothing here allocates: all scratch is in struct sp_fwd (sp_fwd_init).
 */
#include "model.h"

#include "ops.h"

#include <math.h>

/* ---- scratch ------------------------------------------------------------ */

struct fwd_sizes {
    size_t x, q, k, v, attn, att, hb, xq;
};

static struct fwd_sizes fwd_sizes(const struct sp_hparams *hp, uint32_t n_ctx) {
    struct fwd_sizes s;
    s.x = hp->n_embd;
    s.q = (size_t)hp->n_heads * hp->head_dim_k;
    s.k = (size_t)hp->n_kv_heads * hp->head_dim_k;
    s.v = (size_t)hp->n_kv_heads * hp->head_dim_v;
    s.attn = (size_t)hp->n_heads * hp->head_dim_v;
    s.att = (size_t)hp->n_heads * n_ctx;
    s.hb = hp->n_ff;
    int64_t widest = SP_MAX(SP_MAX((int64_t)s.x, (int64_t)s.attn), (int64_t)s.hb);
    s.xq = sp_act_bytes(widest);
    return s;
}

uint64_t sp_fwd_bytes(const struct sp_model *m, uint32_t n_ctx) {
    struct fwd_sizes s = fwd_sizes(&m->mf->hp, n_ctx);
    return (uint64_t)(3 * s.x + s.q + s.k + s.v + s.attn + s.att + 2 * s.hb) * sizeof(float) + s.xq;
}

sp_status sp_fwd_init(const struct sp_model *m, uint32_t n_ctx, int n_threads, struct sp_fwd **out) {
    *out = NULL;
    struct fwd_sizes s = fwd_sizes(&m->mf->hp, n_ctx);
    struct sp_fwd *f = sp_calloc(1, sizeof(*f));
    if (!f) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    f->n_ctx = n_ctx;
    f->x = sp_malloc(s.x * sizeof(float));
    f->xb = sp_malloc(s.x * sizeof(float));
    f->xb2 = sp_malloc(s.x * sizeof(float));
    f->q = sp_malloc(s.q * sizeof(float));
    f->k = sp_malloc(s.k * sizeof(float));
    f->v = sp_malloc(s.v * sizeof(float));
    f->attn = sp_malloc(s.attn * sizeof(float));
    f->att = sp_malloc(s.att * sizeof(float));
    f->hb = sp_malloc(s.hb * sizeof(float));
    f->hb2 = sp_malloc(s.hb * sizeof(float));
    f->xq_bytes = s.xq;
    f->xq = sp_malloc_aligned(s.xq, 64);
    if (!f->x || !f->xb || !f->xb2 || !f->q || !f->k || !f->v || !f->attn || !f->att || !f->hb || !f->hb2 ||
        !f->xq) {
        sp_fwd_free(f);
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %llu bytes of scratch", __func__,
                      (unsigned long long)sp_fwd_bytes(m, n_ctx));
    }
    sp_status rc = sp_pool_init(n_threads < 1 ? 1 : n_threads, &f->pool);
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
    sp_free(f->x);
    sp_free(f->xb);
    sp_free(f->xb2);
    sp_free(f->q);
    sp_free(f->k);
    sp_free(f->v);
    sp_free(f->attn);
    sp_free(f->att);
    sp_free(f->hb);
    sp_free(f->hb2);
    sp_free_aligned(f->xq);
    sp_free(f);
}

/* ---- pinned weight helpers ---------------------------------------------- */

/* y = W x for weight t (ne = {n_in, n_out}); pins t for the duration. */
static sp_status matmul(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, const float *x,
                        float *y) {
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    const void *xc = sp_act_convert(t->type, x, t->ne[0], f->xq);
    sp_matvec(f->pool, t->type, w, t->ne[0], t->ne[1], xc, y);
    sp_pager_unpin(m->pager, t);
    return SP_OK;
}

/* out = rmsnorm(x) * weight t */
static sp_status norm(struct sp_model *m, const struct sp_tensor_desc *t, const float *x, float *out, int64_t n) {
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    sp_rmsnorm(out, x, w, n, m->mf->hp.rms_eps);
    sp_pager_unpin(m->pager, t);
    return SP_OK;
}

/* x[i] += bias[i] when the tensor exists */
static sp_status add_bias(struct sp_model *m, const struct sp_tensor_desc *t, float *x) {
    if (!t) return SP_OK;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    const float *b = w;
    for (int64_t i = 0; i < t->ne[0]; i++) x[i] += b[i];
    sp_pager_unpin(m->pager, t);
    return SP_OK;
}

/* Per-head RMSNorm (qwen3 q_norm / k_norm) over n_heads heads of hd. */
static sp_status head_norm(struct sp_model *m, const struct sp_tensor_desc *t, float *x, uint32_t n_heads,
                           uint32_t hd) {
    if (!t) return SP_OK;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, t, &w);
    if (rc) return rc;
    for (uint32_t h = 0; h < n_heads; h++) sp_rmsnorm(x + (size_t)h * hd, x + (size_t)h * hd, w, hd, m->mf->hp.rms_eps);
    sp_pager_unpin(m->pager, t);
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
    sp_pager_unpin(m->pager, t);
    return SP_OK;
}

/* ---- the forward pass --------------------------------------------------- */

sp_status sp_forward(struct sp_model *m, struct sp_fwd *f, struct sp_kv_cache *kv, int32_t token, uint32_t pos,
                     float *logits) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t E = hp->n_embd, hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    const uint32_t n_rep = hp->n_heads / hp->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hdk);
    sp_status rc = SP_OK;
    SP_ASSERT(pos < f->n_ctx && token >= 0 && (uint32_t)token < hp->n_vocab);

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

    TRY(embed(m, token, f->x));
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        /* attention */
        TRY(norm(m, L->attn_norm, f->x, f->xb, E));
        TRY(matmul(m, f, L->wq, f->xb, f->q));
        TRY(matmul(m, f, L->wk, f->xb, f->k));
        TRY(matmul(m, f, L->wv, f->xb, f->v));
        TRY(add_bias(m, L->bq, f->q));
        TRY(add_bias(m, L->bk, f->k));
        TRY(add_bias(m, L->bv, f->v));
        TRY(head_norm(m, L->q_norm, f->q, hp->n_heads, hdk));
        TRY(head_norm(m, L->k_norm, f->k, hp->n_kv_heads, hdk));
        sp_rope(f->q, hp->n_heads, hdk, hp->rope_dims, pos, hp->rope_theta, hp->rope_freq_scale, hp->rope_neox,
                freq_factors);
        sp_rope(f->k, hp->n_kv_heads, hdk, hp->rope_dims, pos, hp->rope_theta, hp->rope_freq_scale, hp->rope_neox,
                freq_factors);
        sp_kv_store(kv, il, pos, f->k, f->v);
        for (uint32_t h = 0; h < hp->n_heads; h++) {
            sp_kv_attend(kv, il, h / n_rep, hdk, hdv, pos + 1, f->q + (size_t)h * hdk, scale,
                         f->att + (size_t)h * f->n_ctx, f->attn + (size_t)h * hdv);
        }
        TRY(matmul(m, f, L->wo, f->attn, f->xb2));
        for (uint32_t i = 0; i < E; i++) f->x[i] += f->xb2[i];
        /* feed-forward (SwiGLU) */
        TRY(norm(m, L->ffn_norm, f->x, f->xb, E));
        TRY(matmul(m, f, L->ffn_gate, f->xb, f->hb));
        TRY(matmul(m, f, L->ffn_up, f->xb, f->hb2));
        sp_silu_mul(f->hb, f->hb2, hp->n_ff);
        TRY(matmul(m, f, L->ffn_down, f->hb, f->xb2));
        for (uint32_t i = 0; i < E; i++) f->x[i] += f->xb2[i];
    }
    if (logits) {
        TRY(norm(m, m->output_norm, f->x, f->xb, E));
        TRY(matmul(m, f, m->output, f->xb, logits));
    }
#undef TRY
out:
    if (m->rope_freqs) sp_pager_unpin(m->pager, m->rope_freqs);
    return rc;
}
