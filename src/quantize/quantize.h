/*
 * quantize.h -- the pieces of `sparrow quantize` (sp_quantize in sparrow.h),
 * internal to src/quantize/ and its tests:
 *   policy.c   tensor name -> element type: named policies and policy files
 *   calib.c    activation statistics from running the model on a text
 *   prune.c    which FFN neurons and attention heads to keep, per layer
 *   fold.c     which KV heads are mean-pooled into one (--merge-kv-heads)
 *   scale.c    activation-aware channel scaling, folded into the model
 *   gptq.c     rounding with error feedback over the input covariance
 *   quantize.c the driver: reads the input through the pager, cuts, scales,
 *              quantizes and streams the GGUF writer (format/gguf.h).
 *   convert.c  sp_convert: the same tensors out, matrices in the resident
 *              layouts the kernels read, to be mapped in place.
 * docs/QUANT.md describes policies, calibration, pruning, folding and the
 * output file.
 */
#ifndef SP_QUANTIZE_H
#define SP_QUANTIZE_H

#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

/* Seconds of a monotonic clock (timings in reports). */
double sp_quantize_now_s(void);

/* Write the metadata the GGUF loader reads for a llama2.c checkpoint mf
 * (architecture, hyper-parameters, vocabulary), which has none of its own. */
struct sp_gguf_writer;
sp_status sp_quantize_meta_llama2c(struct sp_gguf_writer *w, const struct sp_model_file *mf);

/* ---- policies ------------------------------------------------------------
 * A policy is an ordered list of rules "PATTERN TYPE": the first rule whose
 * glob pattern (fnmatch: * ? [...], '*' also matches '.') matches a tensor's
 * name gives its type.  Named policies are written in the same syntax. */

struct sp_qrule {
    char *pattern;
    uint32_t type;  /* sp_qtype_from_name of the TYPE field */
    uint32_t line;  /* 1-based line in the source text */
};

struct sp_qpolicy {
    char name[32];  /* the policy's name, or "file" */
    char *origin;   /* where the rules came from (a path, or "policy NAME") */
    struct sp_qrule *rules; /* (n_rules) in order */
    uint32_t n_rules;
};

/* Parse policy text (len bytes): one rule per line, fields separated by
 * blanks, '#' starts a comment, blank lines ignored.  origin names the text
 * in messages.  SP_E_FORMAT naming origin and the line for: a line without
 * exactly two fields, an unknown type, a type that cannot be quantized to, a
 * pattern longer than 255 bytes, or no rules at all.  SP_E_NOMEM. */
sp_status sp_qpolicy_parse(const char *text, size_t len, const char *origin, struct sp_qpolicy **out);

/* Read and parse a policy file (at most 1 MiB).  SP_E_IO, SP_E_FORMAT,
 * SP_E_NOMEM. */
sp_status sp_qpolicy_load(const char *path, struct sp_qpolicy **out);

/* A named policy ("mem4", "mem3", "q8", ...).  SP_E_INVALID for an unknown
 * name (the message lists the known ones). */
sp_status sp_qpolicy_named(const char *name, struct sp_qpolicy **out);

/* The rule text of named policy i (static), or NULL out of range. */
const char *sp_qpolicy_text(int32_t i);

void sp_qpolicy_free(struct sp_qpolicy *p);

/* The first rule matching name, or NULL. */
const struct sp_qrule *sp_qpolicy_match(const struct sp_qpolicy *p, const char *name);

/* ---- calibration ---------------------------------------------------------
 * For every tensor a matrix product reads (by index into the model file's
 * tensor directory): the sum over observed tokens of x_i^2 for each input
 * channel i, and the number of tokens.  The output head is observed on every
 * token (not only the last of a batch). */

struct sp_calib {
    uint32_t n_tensors;
    double **sumsq;     /* (n_tensors) each (ne[0]) or NULL when no product reads it */
    uint64_t *count;    /* (n_tensors) token rows observed */
    int64_t *width;     /* (n_tensors) input channels (ne[0]) */
    double **cov;       /* (n_tensors) (ne[0], ne[0]) sums of x x^T for the tensors
                           that own one, else NULL (see cov_of) */
    int32_t *cov_of;    /* (n_tensors) the tensor whose input (and covariance) this
                           one shares -- itself for owners -- or -1 when none */
    float **sample;     /* (n_tensors) owners: up to sample_cap input rows (ne[0]
                           floats each), every sample_stride-th token; else NULL */
    int32_t *n_sample;  /* (n_tensors) rows held */
    int32_t sample_cap, sample_stride;
    /* Row Hessians: for tensors whose rows matter unequally to
     * the model's output -- FFN gate and up (through the SwiGLU product) and
     * the output head (through the softmax) -- per row j the sum over sampled
     * tokens of c_j^2 x x^T (lower triangle), c_j the sensitivity of the
     * model to that row's output on the token; NULL when not collected. */
    double **rowcov;    /* (n_tensors) each ne[1] packed lower triangles, or NULL */
    float **rowcov_w;   /* (n_tensors) the tensor's F32 weights while collecting */
    int32_t *rowcov_layer; /* (n_tensors) layer of an FFN gate, n_layers for the head, else -1 */
    int32_t rowcov_stride; /* every rowcov_stride-th token is sampled */
    int32_t n_tokens;   /* tokens run through the model */
    int32_t n_chunks;
};

/* Run model m on the text in path: tokenized once with BOS, cut into at most
 * n_chunks chunks of ctx tokens (the first of each replaced by BOS), each run
 * as one batch from an empty cache.  Input covariances (for gptq.c) are
 * collected too when all of them fit cov_budget bytes (0: never), and a
 * sample of input rows (for scale.c) when they fit 512 MiB; tensors that
 * read the same input (attn_q/k/v, ffn_gate/up) share them.  SP_E_IO,
 * SP_E_INVALID (a text shorter than 2 tokens), SP_E_NOMEM. */
sp_status sp_calib_run(struct sp_model *m, const char *path, int32_t n_chunks, int32_t ctx, int n_threads,
                       uint64_t cov_budget, const struct sp_quantize_params *progress, struct sp_calib **out);

/* Report progress through P->on_progress (sparrow.h) when P has one:
 * SP_E_STATE ("cancelled") when it says stop, else SP_OK.  P may be NULL. */
sp_status sp_quantize_progress(const struct sp_quantize_params *P, const char *stage, int32_t done, int32_t total);

/* The covariance (width x width sums of x x^T) of tensor i's input, or NULL. */
const double *sp_calib_cov(const struct sp_calib *c, uint32_t i);

/* The row Hessians of tensor i, or NULL: ne[1] packed lower triangles of
 * ne[0] x ne[0] (row a's elements 0..a, rows in order: ne[0] (ne[0] + 1) / 2
 * doubles per tensor row). */
const double *sp_calib_rowcov(const struct sp_calib *c, uint32_t i);

/* Sampled input rows of tensor i (*n of them, width floats each), or NULL. */
const float *sp_calib_samples(const struct sp_calib *c, uint32_t i, int32_t *n);

void sp_calib_free(struct sp_calib *c);

/* Mean of x_i^2 per input channel of tensor i into imp (its ne[0] floats),
 * with a small floor (calib.c).  False (imp untouched) when c is NULL or
 * nothing observed that tensor. */
bool sp_calib_importance(const struct sp_calib *c, uint32_t i, float *imp);

/* ---- pruning -------------------------------------------------------------
 * Which FFN neurons and attention heads each layer keeps.  Every layer keeps
 * the same counts (GGUF's llama keys hold one count for all layers). */

struct sp_prune_layer {
    uint32_t *ff;       /* (n_ff) kept neurons, ascending; NULL = all */
    uint32_t *q_rows;   /* (n_heads * hd_k) kept rows of attn_q; NULL = all */
    uint32_t *k_rows;   /* (n_kv_heads * hd_k) kept rows of attn_k */
    uint32_t *v_rows;   /* (n_kv_heads * hd_v) kept rows of attn_v */
    uint32_t *o_cols;   /* (n_heads * hd_v) kept columns of attn_output */
};

struct sp_prune_plan {
    uint32_t n_layers;
    uint32_t n_ff, n_heads, n_kv_heads;  /* after pruning */
    bool ffn, heads;                     /* what is cut */
    struct sp_prune_layer *layers;       /* (n_layers) */
};

/* Choose what to drop: ffn_frac of each layer's FFN neurons (rounded to the
 * nearest count; at least one neuron stays) and n_heads query heads per
 * layer, lowest importance first.  Importance of neuron j is |ffn_down
 * column j|^2 * E[h_j^2] (calibrated), or |gate row j| |up row j| |down
 * column j| (squared) without calibration; of a head, the sum over its
 * attn_output columns of |column|^2 * E[x^2] (calibrated), or |attn_output
 * columns|^2 * |attn_v rows of its KV head|^2 without.  With grouped-query
 * attention heads go in whole KV groups: n_heads must be a multiple of the
 * group size and leave a group, else SP_E_INVALID saying so.
 * SP_E_UNSUPPORTED for MoE models. */
sp_status sp_prune_plan_build(struct sp_model *m, const struct sp_calib *c, float ffn_frac, int32_t n_heads,
                              struct sp_prune_plan **out);
void sp_prune_plan_free(struct sp_prune_plan *p);

/* How tensor t of m is cut by plan p: kept rows (indices into its ne[1]) and
 * kept columns (into ne[0]; for a 1-D bias, its elements), NULL = all. */
struct sp_prune_cut {
    const uint32_t *rows;
    int64_t n_rows;
    const uint32_t *cols;
    int64_t n_cols;
};
void sp_prune_cut_of(const struct sp_prune_plan *p, const struct sp_model *m, const struct sp_tensor_desc *t,
                     struct sp_prune_cut *out);

/* ---- folding KV heads (fold.c) --------------------------------------------
 * The KV heads that remain after pruning (all of them without) become G
 * heads: head g's K and V projections (rows of attn_k / attn_v, elements of
 * their biases) are the mean of those of heads g*f .. g*f + f - 1, f = the
 * heads before / G.  Query heads keep their order, so query head h, which
 * read KV head h / (n_heads / n_kv), reads the pooled head of that head's
 * group: h / (n_heads / G).  Per-head norms (attn_k_norm) are shared by all
 * heads and stay as they are. */

struct sp_fold_plan {
    uint32_t n_kv_in;   /* KV heads before folding (after pruning) */
    uint32_t n_kv_out;  /* G */
    uint32_t factor;    /* n_kv_in / n_kv_out heads pooled into each; 0 = no folding */
};

/* The plan for n_groups (0: none, *out zeroed) over m after pruning p (or
 * NULL).  SP_E_INVALID, saying which counts would do, when n_groups is
 * negative, larger than the KV heads or does not divide them. */
sp_status sp_fold_plan_make(const struct sp_model *m, const struct sp_prune_plan *p, int32_t n_groups,
                            struct sp_fold_plan *out);

/* How tensor t is folded: its rows (attn_k, attn_v) or its elements (their
 * biases) are heads of head_dim; factor of them (in the numbering after the
 * pruning cut) are pooled into each output head.  factor 0: not folded. */
struct sp_fold_cut {
    uint32_t factor;
    bool rows;
    int64_t head_dim;
};
void sp_fold_cut_of(const struct sp_fold_plan *f, const struct sp_model *m, const struct sp_tensor_desc *t,
                    struct sp_fold_cut *out);

/* Index (after the pruning cut) of the j-th (j < factor) of the rows or
 * elements pooled into output row or element o of a folded tensor. */
int64_t sp_fold_source(const struct sp_fold_cut *c, int64_t o, uint32_t j);

/* The output KV head that source KV head kh of layer il feeds after pruning
 * p (or NULL) and folding f (or NULL: none), or -1 when pruning drops it. */
int32_t sp_fold_kv_head(const struct sp_fold_plan *f, const struct sp_prune_plan *p, const struct sp_model *m,
                        uint32_t il, uint32_t kh);

/* ---- calibrated rounding with error feedback (gptq.c) ----------------------
 * For tensors whose input covariance H = sum x x^T calibration collected:
 * each row is quantized channel by channel and the rounding error is pushed
 * onto the channels not yet quantized, minimising the error of the layer's
 * output (w - q)^T H (w - q) instead of each weight's own. */

struct sp_gptq;

/* Factor H (n_full x n_full, row-major sums of x x^T), for weights whose
 * columns were multiplied by col_mul (n_full, or NULL: the input is divided
 * by it), restricted to the channels cols[0..n) (all when cols is NULL, then
 * n == n_full), with 1% of its mean diagonal added (more if needed) for
 * stability.  Within each block of the type (block channels), channels are
 * processed in order of decreasing activation energy.  SP_E_NOMEM,
 * SP_E_INVALID when no damping makes it positive definite. */
sp_status sp_gptq_init(const double *h, int64_t n_full, const float *col_mul, const uint32_t *cols, int64_t n,
                       int64_t block, struct sp_gptq **out);
void sp_gptq_free(struct sp_gptq *g);

/* What sp_gptq_rows did: rows quantized, and of those the rows whose final
 * scales came from a least-squares refit rather than the first pass. */
struct sp_gptq_stats {
    int64_t n_rows, n_refit;
};

/* Quantize n_rows rows of w (n floats each, n = the factor's size) into
 * native type t at dst (n_rows * row_bytes).  Each row: one GPTQ pass in
 * which every block's grid is chosen as it is reached (the block quantizer's
 * scale with importance imp, or NULL, and a few multiples of it; the one
 * whose rounding adds the least output error wins); then, codes fixed, the
 * blocks' scales (and mins) are refit by least squares on the output error
 * (w - q)^T H (w - q), the row re-rounded with those grids, and refit once
 * more; whichever of the four has the least output error is improved by a
 * greedy search over single codes (+-1 while the output error drops) and a
 * last refit of the scales, and written.  w is
 * overwritten with the values the rows now hold.  *st (or NULL) is added to.
 * Thread-safe for disjoint rows.  SP_E_NOMEM, SP_E_INVALID (not native). */
sp_status sp_gptq_rows(const struct sp_gptq *g, uint32_t t, float *w, int64_t n_rows, const float *imp, void *dst,
                       struct sp_gptq_stats *st);

/* ---- activation-aware channel scaling (scale.c) ----------------------------
 * Per tensor, multipliers for its input channels (col, source ne[0]) and its
 * rows (row, source ne[1]; for a 1-D tensor col holds its elements), NULL =
 * all ones.  Applying them leaves the model's function unchanged: every
 * column scale is divided out of the operation that produces the input. */

struct sp_scale_plan {
    uint32_t n_tensors;
    float **col;        /* (n_tensors) */
    float **row;        /* (n_tensors) */
    int32_t n_scaled;   /* groups that got a scaling */
    double alpha_sum;   /* sum of their exponents (reporting) */
};

/* Choose the scalings from calibration c for the planned tensor types
 * (types[i] for tensor i of m's file).  Groups without statistics, with no
 * quantized tensor, or whose best exponent is 0 stay unscaled.  MoE models
 * get an empty plan.  attn_v's rows take the scale of the query heads that
 * read them, so the query heads that share an output KV head after pruning
 * p and folding f (either may be NULL) share one scale, and the V rows that
 * are pooled into one head carry the same multipliers.  SP_E_NOMEM, SP_E_IO. */
sp_status sp_scale_plan_build(struct sp_model *m, const struct sp_calib *c, const uint32_t *types,
                              const struct sp_prune_plan *p, const struct sp_fold_plan *f,
                              const struct sp_quantize_params *progress, struct sp_scale_plan **out);
void sp_scale_plan_free(struct sp_scale_plan *p);

/* ---- reading the input (quantize.c) ---------------------------------------- */

/* Rows [row0, row0 + n) of tensor t (rows of ne[0] elements over all higher
 * dimensions) as floats into dst (n * ne[0]), through m's pager.  t has a
 * type with to_float and whole blocks per row.  SP_E_IO from the pager. */
sp_status sp_qread_rows(struct sp_model *m, const struct sp_tensor_desc *t, int64_t row0, int64_t n, float *dst);

#endif /* SP_QUANTIZE_H */
