/*
 * fold.c -- spatial folding of the KV heads ("head sharing",
 * `sparrow quantize --merge-kv-heads G`): the KV heads become G groups, each
 * the mean of the K and V projections of the heads in it.  This is the
 * conversion from multi-head to grouped-query attention that Ainslie et al.
 * ("GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
 * Checkpoints", 2023) start from; they uptrain afterwards, Sparrow does not,
 * so the folded model computes a different function (docs/QUANT.md, "KV
 * head folding", measures how far).  The KV cache shrinks by n_kv / G.
 *
 * Groups are contiguous: query head h read KV head h / (n_heads / n_kv) and
 * now reads pooled head h / (n_heads / G), which is the pool that KV head
 * belongs to, so the query side (attn_q, attn_output, attn_q_norm) and the
 * shared per-head attn_k_norm are unchanged.  After head pruning the groups
 * are contiguous among the kept heads, in the pruned model's numbering.
 *
 * The plan is counts and an index rule; quantize.c pools while it streams.
 */
#include "quantize.h"

#include <assert.h>
#include <stdio.h>

sp_status sp_fold_plan_make(const struct sp_model *m, const struct sp_prune_plan *p, int32_t n_groups,
                            struct sp_fold_plan *out) {
    memset(out, 0, sizeof(*out));
    if (n_groups == 0) return SP_OK;
    const uint32_t n_kv = p && p->heads ? p->n_kv_heads : m->mf->hp.n_kv_heads;
    const char *after = p && p->heads ? " after pruning" : "";
    if (n_groups < 0 || (uint32_t)n_groups > n_kv || n_kv % (uint32_t)n_groups != 0) {
        char list[128] = "";
        size_t n = 0;
        for (uint32_t d = 1; d <= n_kv && n < sizeof list; d++) {
            if (n_kv % d == 0) n += (size_t)snprintf(list + n, sizeof list - n, "%s%u", n ? ", " : "", d);
        }
        return sp_err(SP_E_INVALID, "sp_quantize: --merge-kv-heads %d: the model has %u KV heads%s, and they fold "
                      "into groups of equal size: G must divide %u (one of %s)", (int)n_groups, n_kv, after, n_kv,
                      list);
    }
    out->n_kv_in = n_kv;
    out->n_kv_out = (uint32_t)n_groups;
    out->factor = n_kv / (uint32_t)n_groups;
    return SP_OK;
}

void sp_fold_cut_of(const struct sp_fold_plan *f, const struct sp_model *m, const struct sp_tensor_desc *t,
                    struct sp_fold_cut *out) {
    memset(out, 0, sizeof(*out));
    if (!f || !f->factor) return;
    const struct sp_hparams *hp = &m->mf->hp;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        if (t != L->wk && t != L->bk && t != L->wv && t != L->bv) continue;
        out->factor = f->factor;
        out->rows = t == L->wk || t == L->wv;
        out->head_dim = t == L->wk || t == L->bk ? hp->head_dim_k : hp->head_dim_v;
        return;
    }
}

int64_t sp_fold_source(const struct sp_fold_cut *c, int64_t o, uint32_t j) {
    assert(j < c->factor);
    return ((o / c->head_dim) * c->factor + j) * c->head_dim + o % c->head_dim;
}

int32_t sp_fold_kv_head(const struct sp_fold_plan *f, const struct sp_prune_plan *p, const struct sp_model *m,
                        uint32_t il, uint32_t kh) {
    const uint32_t factor = f && f->factor ? f->factor : 1;
    const struct sp_prune_layer *L = p && p->heads ? &p->layers[il] : NULL;
    if (!L) return (int32_t)(kh / factor);
    const uint32_t hdk = m->mf->hp.head_dim_k;
    for (uint32_t i = 0; i < p->n_kv_heads; i++) { /* kept heads, ascending */
        if (L->k_rows[(size_t)i * hdk] / hdk == kh) return (int32_t)(i / factor);
    }
    return -1;
}
