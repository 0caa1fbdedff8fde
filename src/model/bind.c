/*
 * bind.c -- tensor name -> weight slot, with every shape and type checked
 * against the hyper-parameters before the first token, so the forward pass
 * can trust the slots: dense SwiGLU layers, or Mixture-of-Experts layers
 * (router + experts merged in 3-D tensors, expert-major, + optional shared
 * expert).  Also computes the byte counts `inspect` reports.
 */
#include "model.h"

#include "quant/quant.h"

#include <stdio.h>

/* t must have ne = {ne0, ne1, ne2} (ne2 = 1: a matrix or, with ne1 = 1, a vector). */
static sp_status check_shape(const struct sp_tensor_desc *t, int64_t ne0, int64_t ne1, int64_t ne2) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
        return sp_err(SP_E_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                      t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                      (long long)ne0, (long long)ne1, (long long)ne2);
    }
    return SP_OK;
}

/* Find a tensor "<prefix><name>" (prefix "" or "blk.N."), check its shape
 * {ne0, ne1, ne2}.  matmul: must have a dot-product kernel; otherwise F32. */
static sp_status bind3(const struct sp_model_file *mf, const char *prefix, const char *name, bool required,
                       int64_t ne0, int64_t ne1, int64_t ne2, bool matmul, const struct sp_tensor_desc **out) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const struct sp_tensor_desc *t = sp_model_file_find(mf, full);
    *out = t;
    if (!t) {
        return required ? sp_err(SP_E_FORMAT, "%s: required tensor '%s' is missing", mf->path, full) : SP_OK;
    }
    sp_status rc = check_shape(t, ne0, ne1, ne2);
    if (rc) return rc;
    const struct sp_qtraits *tr = sp_qtraits_get(t->type);
    if (matmul) {
        if (!tr || !tr->vec_dot) {
            return sp_err(SP_E_UNSUPPORTED, "tensor '%s': type %s has no dot-product kernel", full,
                          sp_qtype_name(t->type) ? sp_qtype_name(t->type) : "?");
        }
    } else if (t->type != SP_QTYPE_F32 && t->type != SP_QTYPE_F16) {
        return sp_err(SP_E_UNSUPPORTED, "tensor '%s': type %s, expected F32 or F16 for a norm/bias vector", full,
                      sp_qtype_name(t->type) ? sp_qtype_name(t->type) : "?");
    }
    return SP_OK;
}

/* A vector (ne1 = 1) or a matrix. */
static sp_status bind_one(const struct sp_model_file *mf, const char *prefix, const char *name, bool required,
                          int64_t ne0, int64_t ne1, bool matmul, const struct sp_tensor_desc **out) {
    return bind3(mf, prefix, name, required, ne0, ne1, 1, matmul, out);
}

/* The FFN of a dense layer: SwiGLU of width n_ff. */
static sp_status bind_dense_ffn(const struct sp_model_file *mf, const char *pre, struct sp_layer_weights *L) {
    const int64_t E = mf->hp.n_embd, F = mf->hp.n_ff;
    sp_status rc;
    if ((rc = bind_one(mf, pre, "ffn_gate.weight", true, E, F, true, &L->ffn_gate))) return rc;
    if ((rc = bind_one(mf, pre, "ffn_up.weight", true, E, F, true, &L->ffn_up))) return rc;
    return bind_one(mf, pre, "ffn_down.weight", true, F, E, true, &L->ffn_down);
}

/* The FFN of a MoE layer: router, routed experts merged into 3-D *_exps
 * tensors (one expert = one contiguous slice), and an optional shared expert
 * whose width is read from its gate tensor.  *n_ff_max grows to cover the
 * expert and shared-expert widths. */
static sp_status bind_moe_ffn(const struct sp_model_file *mf, const char *pre, struct sp_layer_weights *L,
                              uint32_t *n_ff_max) {
    const struct sp_hparams *hp = &mf->hp;
    const int64_t E = hp->n_embd, X = hp->n_experts, FE = hp->n_ff_exp;
    char name[128];
    sp_status rc;
    snprintf(name, sizeof name, "%sffn_gate_exps.weight", pre);
    if (!sp_model_file_find(mf, name)) {
        snprintf(name, sizeof name, "%sffn_gate.0.weight", pre);
        if (sp_model_file_find(mf, name)) {
            return sp_err(SP_E_UNSUPPORTED, "%s: tensor '%s': experts stored one tensor each (an older Mixtral "
                          "conversion) are not supported; convert the model again so the experts are merged into "
                          "'%sffn_gate_exps.weight' and its siblings", mf->path, name, pre);
        }
    }
    if ((rc = bind_one(mf, pre, "ffn_gate_inp.weight", true, E, X, true, &L->ffn_gate_inp))) return rc;
    if ((rc = bind3(mf, pre, "ffn_gate_exps.weight", true, E, FE, X, true, &L->ffn_gate_exps))) return rc;
    if ((rc = bind3(mf, pre, "ffn_up_exps.weight", true, E, FE, X, true, &L->ffn_up_exps))) return rc;
    if ((rc = bind3(mf, pre, "ffn_down_exps.weight", true, FE, E, X, true, &L->ffn_down_exps))) return rc;
    *n_ff_max = SP_MAX(*n_ff_max, (uint32_t)FE);

    snprintf(name, sizeof name, "%sffn_gate_shexp.weight", pre);
    const struct sp_tensor_desc *g = sp_model_file_find(mf, name);
    const int64_t FS = g ? g->ne[1] : 0;
    const bool shexp = g != NULL;
    if (shexp && (FS <= 0 || FS > UINT32_MAX)) {
        return sp_err(SP_E_FORMAT, "%s: tensor '%s' has an invalid width %lld", mf->path, name, (long long)FS);
    }
    if (!shexp) {
        static const char *const others[] = {"ffn_up_shexp.weight", "ffn_down_shexp.weight",
                                             "ffn_gate_inp_shexp.weight"};
        for (size_t i = 0; i < SP_ARRAY_LEN(others); i++) {
            snprintf(name, sizeof name, "%s%s", pre, others[i]);
            if (sp_model_file_find(mf, name)) {
                return sp_err(SP_E_FORMAT, "%s: tensor '%s' belongs to a shared expert, but '%sffn_gate_shexp.weight' "
                              "is missing", mf->path, name, pre);
            }
        }
        return SP_OK;
    }
    if ((rc = bind_one(mf, pre, "ffn_gate_shexp.weight", true, E, FS, true, &L->ffn_gate_shexp))) return rc;
    if ((rc = bind_one(mf, pre, "ffn_up_shexp.weight", true, E, FS, true, &L->ffn_up_shexp))) return rc;
    if ((rc = bind_one(mf, pre, "ffn_down_shexp.weight", true, FS, E, true, &L->ffn_down_shexp))) return rc;
    if ((rc = bind_one(mf, pre, "ffn_gate_inp_shexp.weight", false, E, 1, true, &L->ffn_gate_inp_shexp))) return rc;
    *n_ff_max = SP_MAX(*n_ff_max, (uint32_t)FS);
    return SP_OK;
}

/* Check the expert hyper-parameters before any tensor is bound. */
static sp_status check_experts(const struct sp_model_file *mf) {
    const struct sp_hparams *hp = &mf->hp;
    if (hp->n_experts == 0 && hp->arch != SP_ARCH_QWEN3MOE) return SP_OK;
    if (hp->arch != SP_ARCH_LLAMA && hp->arch != SP_ARCH_QWEN3MOE) {
        return sp_err(SP_E_UNSUPPORTED, "%s: expert_count %u in a '%s' file: experts are supported for llama "
                      "(Mixtral layout) and qwen3moe only", mf->path, hp->n_experts, sp_arch_name(hp->arch));
    }
    if (hp->n_experts == 0 || hp->n_experts_used < 1 || hp->n_experts_used > hp->n_experts) {
        return sp_err(SP_E_FORMAT, "%s: expert_used_count %u must be in 1..expert_count (%u)", mf->path,
                      hp->n_experts_used, hp->n_experts);
    }
    if (hp->n_experts > SP_MAX_EXPERTS) {
        return sp_err(SP_E_UNSUPPORTED, "%s: expert_count %u exceeds the supported %d", mf->path, hp->n_experts,
                      SP_MAX_EXPERTS);
    }
    if (hp->n_ff_exp == 0) return sp_err(SP_E_FORMAT, "%s: the expert FFN width is 0", mf->path);
    return SP_OK;
}

sp_status sp_model_bind(struct sp_model *m) {
    const struct sp_model_file *mf = m->mf;
    const struct sp_hparams *hp = &mf->hp;
    sp_status rc;
    if ((rc = check_experts(mf))) return rc;
    const bool moe = hp->n_experts > 0;
    const uint32_t ffn = moe ? hp->n_ff_exp : hp->n_ff;
    if (!hp->n_embd || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads || !hp->head_dim_k || !hp->head_dim_v ||
        !ffn || !hp->n_vocab) {
        return sp_err(SP_E_FORMAT, "%s: a hyper-parameter is zero (embd %u, layers %u, heads %u/%u, head dims %u/%u, "
                      "ffn %u, vocab %u)", mf->path, hp->n_embd, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                      hp->head_dim_k, hp->head_dim_v, ffn, hp->n_vocab);
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
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const int64_t QD = (int64_t)hp->n_heads * hp->head_dim_k, KD = (int64_t)hp->n_kv_heads * hp->head_dim_k;
    const int64_t VD = (int64_t)hp->n_kv_heads * hp->head_dim_v, OD = (int64_t)hp->n_heads * hp->head_dim_v;

    if ((rc = bind_one(mf, "", "token_embd.weight", true, E, V, true, &m->tok_embd))) return rc;
    if ((rc = bind_one(mf, "", "output_norm.weight", true, E, 1, false, &m->output_norm))) return rc;
    if ((rc = bind_one(mf, "", "output.weight", false, E, V, true, &m->output))) return rc;
    if (!m->output) m->output = m->tok_embd; /* tied embeddings */
    if ((rc = bind_one(mf, "", "rope_freqs.weight", false, hp->rope_dims / 2, 1, false, &m->rope_freqs))) return rc;
    if (m->rope_freqs && m->rope_freqs->type != SP_QTYPE_F32) { /* RoPE reads it as floats */
        return sp_err(SP_E_UNSUPPORTED, "tensor 'rope_freqs.weight': type %s, expected F32",
                      sp_qtype_name(m->rope_freqs->type) ? sp_qtype_name(m->rope_freqs->type) : "?");
    }

    m->layers = sp_calloc(hp->n_layers, sizeof(*m->layers));
    if (!m->layers) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    const bool qwen2 = hp->arch == SP_ARCH_QWEN2;
    const bool qk_norm = hp->arch == SP_ARCH_QWEN3 || hp->arch == SP_ARCH_QWEN3MOE;
    m->n_ff_max = moe ? 0 : hp->n_ff;
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
        if ((rc = bind_one(mf, pre, "attn_q_norm.weight", qk_norm, hp->head_dim_k, 1, false, &L->q_norm))) return rc;
        if ((rc = bind_one(mf, pre, "attn_k_norm.weight", qk_norm, hp->head_dim_k, 1, false, &L->k_norm))) return rc;
        if ((rc = bind_one(mf, pre, "ffn_norm.weight", true, E, 1, false, &L->ffn_norm))) return rc;
        rc = moe ? bind_moe_ffn(mf, pre, L, &m->n_ff_max) : bind_dense_ffn(mf, pre, L);
        if (rc) return rc;
    }

    /* Byte accounting: every tensor is read once per token, except
     *  - the embedding table, of which one row is read -- unless it is also
     *    the output head, which reads all of it;
     *  - routed experts: a token reads n_used of the n_experts experts of each
     *    layer, so it counts n_used/n_experts of the expert bytes (exact for
     *    one token; a batch whose tokens choose different experts reads more
     *    per batch but the same per token).  Routers and shared experts are
     *    read by every token. */
    m->n_params = 0;
    m->tensor_bytes = 0;
    uint64_t expert_bytes = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        m->n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        m->tensor_bytes += t->size;
    }
    for (uint32_t il = 0; moe && il < hp->n_layers; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        expert_bytes += L->ffn_gate_exps->size + L->ffn_up_exps->size + L->ffn_down_exps->size;
    }
    m->bytes_per_token = m->tensor_bytes - expert_bytes;
    if (moe) m->bytes_per_token += expert_bytes / hp->n_experts * hp->n_experts_used;
    if (m->output != m->tok_embd) {
        m->bytes_per_token -= m->tok_embd->size;
        m->bytes_per_token += sp_qtype_row_bytes(m->tok_embd->type, E);
    }
    return SP_OK;
}
