/*
 * model.h -- the loaded model (file directory + pager + tokenizer + weight
 * slots) and the forward pass over it.  Weight slots are tensor descriptors,
 * never pointers to data: the forward pass pins each weight through the pager
 * right before it uses it and unpins it right after.
 */
#ifndef SP_MODEL_H
#define SP_MODEL_H

#include "format/model_file.h"
#include "kv/cache.h"
#include "mem/pager.h"
#include "sched/pool.h"
#include "tokenizer/tokenizer.h"

struct sp_layer_weights {
    const struct sp_tensor_desc *attn_norm; /* (n_embd) F32 */
    const struct sp_tensor_desc *wq;        /* (n_heads*hd_k, n_embd): ne = {n_embd, n_heads*hd_k} */
    const struct sp_tensor_desc *wk;        /* (n_kv_heads*hd_k, n_embd) */
    const struct sp_tensor_desc *wv;        /* (n_kv_heads*hd_v, n_embd) */
    const struct sp_tensor_desc *wo;        /* (n_embd, n_heads*hd_v) */
    const struct sp_tensor_desc *bq, *bk, *bv; /* qwen2 biases (rows of wq/wk/wv), else NULL */
    const struct sp_tensor_desc *q_norm;    /* qwen3 (hd_k), else NULL */
    const struct sp_tensor_desc *k_norm;    /* qwen3 (hd_k), else NULL */
    const struct sp_tensor_desc *ffn_norm;  /* (n_embd) */
    const struct sp_tensor_desc *ffn_gate;  /* (n_ff, n_embd) */
    const struct sp_tensor_desc *ffn_up;    /* (n_ff, n_embd) */
    const struct sp_tensor_desc *ffn_down;  /* (n_embd, n_ff) */
};

struct sp_model {
    struct sp_model_file *mf;
    struct sp_pager *pager;        /* NULL for vocab-only models */
    struct sp_tokenizer *tok;
    bool vocab_only;
    const struct sp_tensor_desc *tok_embd;    /* (n_vocab, n_embd) */
    const struct sp_tensor_desc *output_norm; /* (n_embd) */
    const struct sp_tensor_desc *output;      /* (n_vocab, n_embd); == tok_embd when tied */
    const struct sp_tensor_desc *rope_freqs;  /* (rope_dims/2) Llama 3.1 frequency factors, or NULL */
    struct sp_layer_weights *layers;          /* (n_layers) */
    uint64_t n_params;
    uint64_t tensor_bytes;
    uint64_t bytes_per_token;
    char file_format[32];
};

/* Bind the tensor directory to weight slots, checking every shape and type
 * against the hyper-parameters (messages name the tensor).  SP_E_UNSUPPORTED
 * for Mixture-of-Experts files (not yet supported) and weight types without a
 * dot-product kernel; SP_E_FORMAT for missing tensors or wrong shapes. */
sp_status sp_model_bind(struct sp_model *m);

/* ---- forward pass ------------------------------------------------------- */

/* Called with a weight's n_tok input rows (x_ld floats apart) right before
 * every matrix product, when set in struct sp_fwd: how the quantizer collects
 * activation statistics.  Must not allocate or touch the pager. */
typedef void (*sp_fwd_observe_fn)(void *ctx, const struct sp_tensor_desc *t, const float *x, int64_t x_ld,
                                  uint32_t n_tok);

/* Per-session scratch for the forward pass, sized from the hparams for up
 * to n_batch tokens at once.  Row-major: token t's row of x is x + t*n_embd. */
struct sp_fwd {
    float *x;      /* (n_batch, n_embd) residual stream */
    float *xb;     /* (n_batch, n_embd) normed input of a block */
    float *xb2;    /* (n_batch, n_embd) block output */
    float *q;      /* (n_batch, n_heads*hd_k) */
    float *k;      /* (n_batch, n_kv_heads*hd_k) */
    float *v;      /* (n_batch, n_kv_heads*hd_v) */
    float *attn;   /* (n_batch, n_heads*hd_v) attention output */
    float *att;    /* (n_heads, n_ctx) attention weights of one token */
    float *hb;     /* (n_batch, n_ff) */
    float *hb2;    /* (n_batch, n_ff) */
    void *xq;      /* activations converted to a weight's vec_dot_type */
    size_t xq_bytes;
    struct sp_pool *pool;
    uint32_t n_ctx;
    uint32_t n_batch;
    sp_fwd_observe_fn observe; /* NULL except while calibrating (src/quantize/calib.c) */
    void *observe_ctx;
};

sp_status sp_fwd_init(const struct sp_model *m, uint32_t n_ctx, uint32_t n_batch, int n_threads,
                      struct sp_fwd **out);
void sp_fwd_free(struct sp_fwd *f);
uint64_t sp_fwd_bytes(const struct sp_model *m, uint32_t n_ctx, uint32_t n_batch);

/* Run n_tok (1..n_batch) tokens at positions pos0.. through the model as one
 * batch, storing their K/V in kv, and (if logits != NULL) write the n_vocab
 * logits of the last token.  Never allocates.  SP_E_IO if the pager cannot
 * provide a weight. */
sp_status sp_forward(struct sp_model *m, struct sp_fwd *f, struct sp_kv_cache *kv, const int32_t *tokens,
                     uint32_t n_tok, uint32_t pos0, float *logits);

#endif /* SP_MODEL_H */
