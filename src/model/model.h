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

#define SP_MAX_EXPERTS 1024 /* expert_count accepted (the largest published models have 512) */

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
    const struct sp_tensor_desc *ffn_gate;  /* (n_ff, n_embd); NULL in MoE layers */
    const struct sp_tensor_desc *ffn_up;    /* (n_ff, n_embd) */
    const struct sp_tensor_desc *ffn_down;  /* (n_embd, n_ff) */
    /* Mixture of experts (n_experts > 0), else NULL.  X = n_experts, FE = n_ff_exp; expert e of an
     * _exps tensor is its bytes [e * size/X, (e+1) * size/X): a (FE, n_embd) or (n_embd, FE) matrix. */
    const struct sp_tensor_desc *ffn_gate_inp;  /* router (X, n_embd): ne = {n_embd, X} */
    const struct sp_tensor_desc *ffn_gate_exps; /* (X, FE, n_embd): ne = {n_embd, FE, X} */
    const struct sp_tensor_desc *ffn_up_exps;   /* (X, FE, n_embd) */
    const struct sp_tensor_desc *ffn_down_exps; /* (X, n_embd, FE): ne = {FE, n_embd, X} */
    /* Shared expert (qwen2moe style; optional, all three or none), run for every token. */
    const struct sp_tensor_desc *ffn_gate_shexp;     /* (n_ff_shexp, n_embd) */
    const struct sp_tensor_desc *ffn_up_shexp;       /* (n_ff_shexp, n_embd) */
    const struct sp_tensor_desc *ffn_down_shexp;     /* (n_embd, n_ff_shexp) */
    const struct sp_tensor_desc *ffn_gate_inp_shexp; /* (1, n_embd): sigmoid gate of the shared expert, or NULL */
};

struct sp_model {
    struct sp_model_file *mf;
    /* KV caches, one per (key type, value type), made by the first sequence
     * that asks (seq.c); shared by every sequence of those types */
    struct sp_kv_cache *kv[SP_KV_TYPE_COUNT][SP_KV_TYPE_COUNT];
    pthread_mutex_t kv_mu;
    struct sp_budget *budget; /* the memory account (mem/budget.h): the pager, every session */
    struct sp_session_params envelope; /* what the budget plans room for, n_seq times (api.c) */
    uint32_t envelope_n_seq;
    uint32_t envelope_batch_tokens; /* a batch the envelope holds (sp_batch_init n_tokens; 0 = none) */
    uint8_t fingerprint[32];  /* what a saved session must match (api.c); valid when has_fingerprint */
    bool has_fingerprint;
    struct sp_pager *pager;        /* NULL for vocab-only models */
    struct sp_tokenizer *tok;
    bool vocab_only;
    const struct sp_tensor_desc *tok_embd;    /* (n_vocab, n_embd) */
    const struct sp_tensor_desc *output_norm; /* (n_embd) */
    const struct sp_tensor_desc *output;      /* (n_vocab, n_embd); == tok_embd when tied */
    const struct sp_tensor_desc *rope_freqs;  /* (rope_dims/2) Llama 3.1 frequency factors, or NULL */
    struct sp_layer_weights *layers;          /* (n_layers) */
    const struct sp_tensor_desc **order;      /* dense tensors in forward order (the pager's schedule) */
    uint32_t n_order;
    uint32_t n_ff_max;       /* widest FFN hidden layer: dense, expert or shared expert (scratch width) */
    uint64_t n_params;
    uint64_t tensor_bytes;
    uint64_t bytes_per_token;/* non-expert bytes + n_used/n_experts of expert_bytes (see bind.c) */
    char file_format[32];
};

/* Bind the tensor directory to weight slots, checking every shape and type
 * against the hyper-parameters (messages name the tensor).  Dense layers and
 * Mixture-of-Experts layers (qwen3moe, and llama with expert_count > 0: the
 * Mixtral layout with merged *_exps tensors).  SP_E_UNSUPPORTED for weight
 * types without a dot-product kernel and for the older per-expert tensor
 * layout; SP_E_FORMAT for missing tensors or wrong shapes. */
sp_status sp_model_bind(struct sp_model *m);

/* ---- forward pass ------------------------------------------------------- */

struct sp_moe_trace; /* moe.h */

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
    void *att;     /* attention's scratch (sp_kv_attend_scratch_bytes for the pool's threads) */
    float *hb;     /* (n_batch, n_ff_max) FFN hidden layer (experts: rows of n_ff_exp) */
    float *hb2;    /* (n_batch, n_ff_max) */
    void *xq;      /* activations converted to a weight's vec_dot_type */
    size_t xq_bytes;
    /* Mixture of experts (all NULL for dense models); X = n_experts, K = n_experts_used. */
    float *probs;       /* (n_batch, X) router logits, then their softmax */
    int32_t *sel;       /* (n_batch, K) chosen experts per token, descending probability */
    float *sel_w;       /* (n_batch, K) their weights */
    uint32_t *grp_off;  /* (X + 1) expert e's entries are grp_*[grp_off[e], grp_off[e+1]) */
    uint32_t *grp_tok;  /* (n_batch * K) token index, grouped by expert, ascending within a group */
    float *grp_w;       /* (n_batch * K) that token's weight for the expert */
    uint8_t *used;      /* (X) 1 if some token of the batch chose the expert */
    float *xg;          /* (n_batch, n_embd) input rows of one expert's tokens, gathered */
    float *yg;          /* (n_batch, n_embd) that expert's output rows */
    struct sp_moe_trace *trace; /* routing record for tests (moe.h); NULL when off */
    struct sp_pool *pool;
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_expert_used;    /* MoE experts per token; 0 = the model's (the governor lowers it) */
    sp_fwd_observe_fn observe; /* NULL except while calibrating (src/quantize/calib.c) */
    void *observe_ctx;
};

/* n_ctx bounds only the MoE routing trace (positions it records). */
sp_status sp_fwd_init(const struct sp_model *m, uint32_t n_ctx, uint32_t n_batch, int n_threads,
                      struct sp_fwd **out);
void sp_fwd_free(struct sp_fwd *f);
uint64_t sp_fwd_bytes(const struct sp_model *m, uint32_t n_batch, int n_threads);

/* The KV cache geometry of this model with the given element types. */
struct sp_kv_geom sp_model_kv_geom(const struct sp_model *m, enum sp_kv_type type_k, enum sp_kv_type type_v);

/* Y = X W^T for weight t (ne = {n_in, n_out}), pinned whole through the
 * pager: n_tok rows of x (n_in floats, x_ld apart) give n_tok rows of y
 * (n_out floats, y_ld apart).  Shared by llama.c and moe.c. */
sp_status sp_fwd_matmul(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, const float *x,
                        int64_t x_ld, uint32_t n_tok, float *y, int64_t y_ld);

/* Run n_tok (1..n_batch) tokens through the model as one batch: they are
 * cells [c0, c0 + n_tok) of the sequence c (appended by the caller, at the
 * positions c->pos gives), their K/V are stored in kv, and token t attends
 * to cells [0, c0 + t].  If logits != NULL write the n_vocab logits of the
 * last token -- or, with all_logits, of every token: n_tok rows of n_vocab,
 * token t's at logits + t*n_vocab.  Never allocates.  SP_E_IO if the pager
 * cannot provide a weight (the cells' K/V are then incomplete: the caller
 * drops them). */
sp_status sp_forward(struct sp_model *m, struct sp_fwd *f, struct sp_kv_cache *kv, const struct sp_kv_cells *c,
                     uint32_t c0, const int32_t *tokens, uint32_t n_tok, float *logits, bool all_logits);

/* One sequence's part of a batch: its n_tok tokens are cells [c0, c0 +
 * n_tok) of c (appended by the caller), stored in and attending over kv. */
struct sp_fwd_seg {
    struct sp_kv_cache *kv;
    const struct sp_kv_cells *c;
    uint32_t c0;
    uint32_t n_tok;
};

/* sp_forward over several sequences at once: segs[0]'s tokens first, then
 * segs[1]'s, ... (tokens holds them all, at most n_batch in total).  Every
 * weight product runs over all the rows together -- one pass over each
 * weight for every sequence -- while positions, K/V stores and attention go
 * per sequence over its own cells.  logits (or NULL) receives each
 * sequence's last row, sequence s's at logits + s*n_vocab; all_logits (every
 * row, as sp_forward) only with n_seg == 1.  With one segment it is
 * sp_forward, bit for bit.  Never allocates; SP_E_IO as sp_forward (the
 * cells of every segment are then incomplete). */
sp_status sp_forward_batch(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *segs, uint32_t n_seg,
                           const int32_t *tokens, float *logits, bool all_logits);
/* Part of that pass: layers [il0, il1) (the embedding first when il0 is 0,
 * the output head last when il1 is n_layers), the residual stream carried
 * in f->x from one part to the next.  Parts run in order over the same
 * segments give sp_forward_batch's result bit for bit (the step decode,
 * sp_decode_step, slices a pass this way). */
sp_status sp_forward_layers(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *segs, uint32_t n_seg,
                            const int32_t *tokens, float *logits, bool all_logits, uint32_t il0, uint32_t il1);

/* Where a pass in slices is: layer il (n_layers = the output head), its
 * stage, the next row of the stage's product; s_per_unit the measured cost
 * of a weight row x column x token (seconds; 0 = none yet) of one-token
 * [0] and batch [1] products, kept across passes.  Zero the rest to start
 * a pass. */
struct sp_fwd_cursor {
    uint32_t il, stage;
    uint64_t row;
    bool embedded;
    double s_per_unit[3]; /* seconds per unit of cost: vector products, matrix products, attention */
    double stage_s[12];   /* last seconds of each stage that runs whole (llama.c) */
    /* the current product's converted activations (in sp_fwd's scratch or
     * the activations themselves), kept across slices; NULL = not yet */
    const void *xq;
    uint32_t xq_type;
    size_t xq_stride;
};
/* sp_forward of one segment resumed from *cur until t_end (CLOCK_MONOTONIC
 * seconds; at least one step of work is done) or the end of the pass
 * (*pass_done).  Same result as sp_forward, bit for bit.  SP_E_IO as it. */
sp_status sp_forward_slice(struct sp_model *m, struct sp_fwd *f, const struct sp_fwd_seg *seg, const int32_t *tokens,
                           float *logits, bool all_logits, struct sp_fwd_cursor *cur, double t_end, bool *pass_done);

/* Y = X W^T for rows [row0, row0 + n_rows) of weight t, pinned one pager
 * unit at a time (row0: 0 or the first row of an expert's slice). */
sp_status sp_matmul_rows(struct sp_model *m, struct sp_fwd *f, const struct sp_tensor_desc *t, uint64_t row0,
                         uint32_t n_rows, const float *x, int64_t x_ld, uint32_t n_tok, float *y, int64_t y_ld);

#endif /* SP_MODEL_H */
