/*
 * bind.c -- tensor name -> weight slot, with every shape and type checked
 * against the hyper-parameters before the first token, so the forward pass
 * can trust the slots.  Also computes the byte counts `inspect` reports.
 */
#include "model.h"

#include "quant/quant.h"

#include <stdio.h>

static sp_status check_shape(const struct sp_tensor_desc *t, int64_t ne0, int64_t ne1) {
    const int64_t ne2 = t->ne[2] * t->ne[3];
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || ne2 != 1) {
        return sp_err(SP_E_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]", t->name,
                      (long long)t->ne[0], (long long)t->ne[1], (long long)ne2, (long long)ne0, (long long)ne1);
    }
    return SP_OK;
}

/* Find a tensor "<prefix><name>" (prefix "" or "blk.N."), check its shape;
 * ne1 = 1 for vectors.  matmul: must have a dot-product kernel; otherwise F32. */
static sp_status bind_one(const struct sp_model_file *mf, const char *prefix, const char *name, bool required,
                          int64_t ne0, int64_t ne1, bool matmul, const struct sp_tensor_desc **out) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const struct sp_tensor_desc *t = sp_model_file_find(mf, full);
    *out = t;
    if (!t) {
        return required ? sp_err(SP_E_FORMAT, "%s: required tensor '%s' is missing", mf->path, full) : SP_OK;
    }
    sp_status rc = check_shape(t, ne0, ne1);
    if (rc) return rc;
    const struct sp_qtraits *tr = sp_qtraits_get(t->type);
    if (matmul) {
        if (!tr || !tr->vec_dot) {
            return sp_err(SP_E_UNSUPPORTED, "tensor '%s': type %s has no dot-product kernel", full,
                          sp_qtype_name(t->type) ? sp_qtype_name(t->type) : "?");
        }
    } else if (t->type != SP_QTYPE_F32) {
        return sp_err(SP_E_UNSUPPORTED, "tensor '%s': type %s, expected F32 for a norm/bias vector", full,
                      sp_qtype_name(t->type) ? sp_qtype_name(t->type) : "?");
    }
    return SP_OK;
}

sp_status sp_model_bind(struct sp_model *m) {
    const struct sp_model_file *mf = m->mf;
    const struct sp_hparams *hp = &mf->hp;
    sp_status rc;
    if (hp->n_experts > 0 || hp->arch == SP_ARCH_QWEN3MOE) {
        return sp_err(SP_E_UNSUPPORTED,
                      "%s: Mixture-of-Experts model (expert_count = %u, arch %s) is not supported yet", mf->path,
                      hp->n_experts, sp_arch_name(hp->arch));
    }
    if (!hp->n_embd || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads || !hp->head_dim_k || !hp->head_dim_v ||
        !hp->n_ff || !hp->n_vocab) {
        return sp_err(SP_E_FORMAT, "%s: a hyper-parameter is zero (embd %u, layers %u, heads %u/%u, head dims %u/%u, "
                      "ffn %u, vocab %u)", mf->path, hp->n_embd, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                      hp->head_dim_k, hp->head_dim_v, hp->n_ff, hp->n_vocab);
    }
    if (hp->n_heads % hp->n_kv_heads != 0) {
        return sp_err(SP_E_FORMAT, "%s: head_count %u is not a multiple of head_count_kv %u", mf->path, hp->n_heads,
                      hp->n_kv_heads);
    }
    if (hp->head_dim_k > SP_KV_MAX_HEAD_DIM || hp->head_dim_v > SP_KV_MAX_HEAD_DIM) {
        return sp_err(SP_E_UNSUPPORTED, "%s: head size %u/%u exceeds the supported %d", mf->path, hp->head_dim_k,
                      hp->head_dim_v, SP_KV_MAX_HEAD_DIM);
    }
    if (hp->rope_dims == 0 || hp->rope_dims > hp->head_dim_k || hp->rope_dims % 2) {
        return sp_err(SP_E_FORMAT, "%s: rope dimension count %u invalid for head size %u", mf->path, hp->rope_dims,
                      hp->head_dim_k);
    }
    if (m->vocab_only) return SP_OK;
    if (mf->vocab.n_tokens && mf->vocab.n_tokens != hp->n_vocab) {
        return sp_err(SP_E_FORMAT, "%s: tokenizer has %u tokens but token_embd has %u rows", mf->path,
                      mf->vocab.n_tokens, hp->n_vocab);
    }
    const int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
    const int64_t QD = (int64_t)hp->n_heads * hp->head_dim_k, KD = (int64_t)hp->n_kv_heads * hp->head_dim_k;
    const int64_t VD = (int64_t)hp->n_kv_heads * hp->head_dim_v, OD = (int64_t)hp->n_heads * hp->head_dim_v;

    if ((rc = bind_one(mf, "", "token_embd.weight", true, E, V, true, &m->tok_embd))) return rc;
    if ((rc = bind_one(mf, "", "output_norm.weight", true, E, 1, false, &m->output_norm))) return rc;
    if ((rc = bind_one(mf, "", "output.weight", false, E, V, true, &m->output))) return rc;
    if (!m->output) m->output = m->tok_embd; /* tied embeddings */
    if ((rc = bind_one(mf, "", "rope_freqs.weight", false, hp->rope_dims / 2, 1, false, &m->rope_freqs))) return rc;

    m->layers = sp_calloc(hp->n_layers, sizeof(*m->layers));
    if (!m->layers) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    const bool qwen2 = hp->arch == SP_ARCH_QWEN2, qwen3 = hp->arch == SP_ARCH_QWEN3;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        struct sp_layer_weights *L = &m->layers[il];
        char pre[32];
        snprintf(pre, sizeof pre, "blk.%u.", il);
        if ((rc = bind_one(mf, pre, "attn_norm.weight", true, E, 1, false, &L->attn_norm))) return rc;
        if ((rc = bind_one(mf, pre, "attn_q.weight", true, E, QD, true, &L->wq))) return rc;
        if ((rc = bind_one(mf, pre, "attn_k.weight", true, E, KD, true, &L->wk))) return rc;
        if ((rc = bind_one(mf, pre, "attn_v.weight", true, E, VD, true, &L->wv))) return rc;
        if ((rc = bind_one(mf, pre, "attn_output.weight", true, OD, E, true, &L->wo))) return rc;
        if ((rc = bind_one(mf, pre, "attn_q.bias", qwen2, QD, 1, false, &L->bq))) return rc;
        if ((rc = bind_one(mf, pre, "attn_k.bias", qwen2, KD, 1, false, &L->bk))) return rc;
        if ((rc = bind_one(mf, pre, "attn_v.bias", qwen2, VD, 1, false, &L->bv))) return rc;
        if ((rc = bind_one(mf, pre, "attn_q_norm.weight", qwen3, hp->head_dim_k, 1, false, &L->q_norm))) return rc;
        if ((rc = bind_one(mf, pre, "attn_k_norm.weight", qwen3, hp->head_dim_k, 1, false, &L->k_norm))) return rc;
        if ((rc = bind_one(mf, pre, "ffn_norm.weight", true, E, 1, false, &L->ffn_norm))) return rc;
        if ((rc = bind_one(mf, pre, "ffn_gate.weight", true, E, F, true, &L->ffn_gate))) return rc;
        if ((rc = bind_one(mf, pre, "ffn_up.weight", true, E, F, true, &L->ffn_up))) return rc;
        if ((rc = bind_one(mf, pre, "ffn_down.weight", true, F, E, true, &L->ffn_down))) return rc;
    }

    /* Byte accounting: every tensor is read once per token, except the
     * embedding table, of which one row is read -- unless it is also the
     * output head, which reads all of it. */
    m->n_params = 0;
    m->tensor_bytes = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        m->n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        m->tensor_bytes += t->size;
    }
    m->bytes_per_token = m->tensor_bytes;
    if (m->output != m->tok_embd) {
        m->bytes_per_token -= m->tok_embd->size;
        m->bytes_per_token += sp_qtype_row_bytes(m->tok_embd->type, E);
    }
    return SP_OK;
}
