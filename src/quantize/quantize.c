/*
 * quantize.c -- sp_quantize (sparrow.h): a model file in, a GGUF with
 * mixed-precision weights out, in this order:
 *   load the input (GGUF F32/F16/BF16/Q8_0 or llama2.c) through the model
 *   loader, weights memory-mapped -> policy (policy.c) -> optional
 *   calibration on a text (calib.c) -> optional pruning plan (prune.c) ->
 *   optional KV head folding (fold.c) -> per tensor: type, output shape ->
 *   channel scaling (scale.c) -> importance -> GGUF writer: metadata and
 *   directory, then tensor data streamed in slabs of rows (dequantize
 *   through the pager, cut, scale, pool folded heads, quantize on the
 *   thread pool -- with error feedback, gptq.c, where the
 *   input covariance is known -- and measure the error) -> rename into place
 *   -> reopen the output and measure bits per weight.
 *
 * Invariants:
 *  1. Nothing appears at the output path unless the whole file was written
 *     (the writer's temporary file + rename); any failure or a cancel leaves
 *     an existing file there untouched.
 *  2. Memory is bounded by one slab (QUANT_SLAB_BYTES of floats plus its
 *     quantized bytes) and the pruning/calibration tables, never by the model.
 *  3. Every tensor of the input is in the output, in the same order; 1-D
 *     tensors are F16 (norms) or F32 (biases, RoPE factors).
 */
#include "quantize.h"

#include "core/file.h"
#include "format/gguf.h"
#include "quant/native.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <time.h>

#define QUANT_ALIGNMENT 4096u
#define QUANT_SLAB_BYTES ((size_t)16 << 20) /* floats of source rows per slab */
#define QUANT_DEFAULT_POLICY "mem4"
#define QUANT_DEFAULT_CHUNKS 16
#define QUANT_DEFAULT_CTX 128
#define QUANT_COV_BUDGET ((uint64_t)256 << 20) /* input covariances for GPTQ rounding */

struct sp_quantize_params sp_quantize_default_params(void) {
    return (struct sp_quantize_params){.policy = NULL, .calib_chunks = 0, .calib_ctx = 0, .prune_ffn = 0.0f,
                                       .prune_heads = 0, .merge_kv_heads = 0, .n_threads = 0};
}

double sp_quantize_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *type_name(uint32_t t) {
    const char *n = sp_qtype_name(t);
    return n ? n : "?";
}

/* ---- reading the input ------------------------------------------------------ */

/* Rows [row0, row0 + n) of tensor t (rows of ne[0] elements over all its
 * higher dimensions) as floats into dst, through the pager. */
sp_status sp_qread_rows(struct sp_model *m, const struct sp_tensor_desc *t, int64_t row0, int64_t n, float *dst) {
    const uint32_t wt = sp_pager_wtype(m->pager, t);
    const size_t rb = sp_qtype_row_bytes(wt, t->ne[0]);
    const void *p;
    sp_status rc = sp_pager_pin_range(m->pager, t, (uint64_t)row0 * rb, (uint64_t)n * rb, &p);
    if (rc) return rc;
    sp_qtraits_get(wt)->to_float(p, dst, n * t->ne[0]);
    sp_pager_unpin(m->pager, t, p);
    return SP_OK;
}

static bool source_type_ok(uint32_t t) {
    return t == SP_QTYPE_F32 || t == SP_QTYPE_F16 || t == SP_QTYPE_BF16 || t == SP_QTYPE_Q8_0;
}

/* ---- the plan: what each output tensor is ------------------------------------- */

struct qtensor {
    const struct sp_tensor_desc *src;
    uint32_t type;
    uint32_t store;         /* the type written: type, or its resident layout (params.layout) */
    uint32_t n_dims;
    int64_t ne[4];          /* output shape */
    int64_t rows;           /* ne[1] * ne[2] * ne[3] */
    size_t row_bytes;       /* of one output row */
    struct sp_prune_cut cut;
    struct sp_fold_cut fold; /* after the cut: heads pooled into one */
    float *imp;             /* (ne[0]) importance after the cut, or NULL */
    char note[256];
};

struct job {
    const struct sp_quantize_params *P;
    struct sp_model *m;
    struct sp_qpolicy *policy;
    struct sp_calib *calib;
    struct sp_prune_plan *prune;
    struct sp_fold_plan fold;
    struct sp_scale_plan *scale;
    struct qtensor *q;      /* (n) */
    uint32_t n;
    bool native, ggml_quant;
    int requires;           /* sparrow.requires level of the stored types (sp_native_requires_level) */
    uint64_t n_params, bytes;
    int32_t n_gptq;         /* tensors rounded with error feedback */
};

/* Element size rules: native types pad a row's last block; ggml types need
 * rows that are a multiple of their block, else the tensor falls back to F16
 * (noted in its report). */
static sp_status choose_type(struct job *J, struct qtensor *q) {
    const struct sp_model *m = J->m;
    const struct sp_tensor_desc *t = q->src;
    const bool tied = m->output == m->tok_embd && t == m->tok_embd;
    if (q->n_dims == 1 || q->rows == 1) {
        /* Norm weights default to F16 (the forward pass reads F32 or F16),
         * other vectors (biases, RoPE factors) to F32; a rule that names a
         * vector may choose between the two. */
        const bool is_norm = strstr(t->name, "norm") != NULL;
        q->type = is_norm ? SP_QTYPE_F16 : SP_QTYPE_F32;
        const struct sp_qrule *r = sp_qpolicy_match(J->policy, t->name);
        if (!r || strcmp(r->pattern, "*") == 0) return SP_OK; /* a catch-all is for matrices */
        if (r->type == SP_QTYPE_F32 || (r->type == SP_QTYPE_F16 && is_norm)) {
            q->type = r->type;
        } else {
            snprintf(q->note, sizeof q->note, "%s, not %s: the forward pass reads %s", type_name(q->type),
                     type_name(r->type), is_norm ? "norms as F32 or F16" : "this vector as F32");
        }
        return SP_OK;
    }
    /* The embedding table that is also the output head takes the head's rule. */
    const struct sp_qrule *r = sp_qpolicy_match(J->policy, tied ? "output.weight" : t->name);
    if (!r && tied) r = sp_qpolicy_match(J->policy, t->name);
    if (!r) {
        return sp_err(SP_E_FORMAT, "sp_quantize: '%s': no rule matches tensor '%s' (end the policy with a catch-all "
                      "'* TYPE')", J->policy->origin, t->name);
    }
    q->type = r->type;
    if (tied) snprintf(q->note, sizeof q->note, "tied to the output head: its rule (line %u)", r->line);
    if (!sp_qtype_is_native(q->type)) {
        const struct sp_qtraits *tr = sp_qtraits_get(q->type);
        if (q->ne[0] % tr->block_elems != 0) {
            snprintf(q->note, sizeof q->note, "F16, not %s: rows of %lld are not a multiple of its block of %lld",
                     tr->name, (long long)q->ne[0], (long long)tr->block_elems);
            q->type = SP_QTYPE_F16;
        }
    }
    return SP_OK;
}

static sp_status plan_tensors(struct job *J) {
    const struct sp_model_file *mf = J->m->mf;
    J->q = sp_calloc(mf->n_tensors, sizeof(*J->q));
    if (!J->q) return sp_err(SP_E_NOMEM, "sp_quantize: out of memory");
    J->n = mf->n_tensors;
    sp_status rc = SP_OK;
    for (uint32_t i = 0; i < mf->n_tensors && !rc; i++) {
        struct qtensor *q = &J->q[i];
        const struct sp_tensor_desc *t = &mf->tensors[i];
        q->src = t;
        q->n_dims = t->n_dims;
        for (int d = 0; d < 4; d++) q->ne[d] = t->ne[d];
        sp_prune_cut_of(J->prune, J->m, t, &q->cut);
        if (q->cut.rows) q->ne[1] = q->cut.n_rows;
        if (q->cut.cols) q->ne[0] = q->cut.n_cols;
        sp_fold_cut_of(&J->fold, J->m, t, &q->fold);
        if (q->fold.factor) {
            int64_t *ne = &q->ne[q->fold.rows ? 1 : 0];
            SP_ASSERT(*ne % ((int64_t)q->fold.factor * q->fold.head_dim) == 0);
            *ne /= q->fold.factor;
        }
        q->rows = q->ne[1] * q->ne[2] * q->ne[3];
        if ((rc = choose_type(J, q))) break;
        q->row_bytes = sp_qtype_row_bytes(q->type, q->ne[0]);
        SP_ASSERT(q->row_bytes > 0);
        /* matrices in the resident layout asked for; never the input embedding, read by rows */
        const bool matrix = q->n_dims >= 2 && q->rows > 1 && t != J->m->tok_embd;
        q->store = matrix ? sp_qtype_stored(q->type, q->ne[0], J->P->layout) : q->type;
        SP_ASSERT(sp_qtype_row_bytes(q->store, q->ne[0]) == q->row_bytes);
        J->native |= sp_qtype_is_native(q->type);
        J->requires = SP_MAX(J->requires, sp_native_requires_level(q->store));
        J->ggml_quant |= !sp_qtype_is_native(q->type) && q->type != SP_QTYPE_F32 && q->type != SP_QTYPE_F16 &&
                         q->type != SP_QTYPE_BF16;
        J->n_params += (uint64_t)(q->rows * q->ne[0]);
        J->bytes += (uint64_t)q->rows * q->row_bytes;
    }
    return rc;
}

/* Multipliers of tensor i's source columns / rows (scale.c), or NULL. */
static const float *col_mul(const struct job *J, uint32_t i) {
    return J->scale ? J->scale->col[i] : NULL;
}

static const float *row_mul(const struct job *J, uint32_t i) {
    return J->scale ? J->scale->row[i] : NULL;
}

/* Importance of each quantized tensor's input channels that remain after
 * the cut, divided by the square of their scaling. */
static sp_status plan_importance(struct job *J) {
    float *imp = NULL;
    sp_status rc = SP_OK;
    for (uint32_t i = 0; i < J->n && J->calib; i++) {
        struct qtensor *q = &J->q[i];
        if (q->type == SP_QTYPE_F32) continue;
        sp_free(imp);
        if (!(imp = sp_malloc((size_t)q->src->ne[0] * sizeof(float)))) {
            rc = sp_err(SP_E_NOMEM, "sp_quantize: out of memory");
            break;
        }
        if (!sp_calib_importance(J->calib, i, imp)) continue;
        if (!(q->imp = sp_malloc((size_t)q->ne[0] * sizeof(float)))) {
            rc = sp_err(SP_E_NOMEM, "sp_quantize: out of memory");
            break;
        }
        const float *cm = col_mul(J, i);
        for (int64_t k = 0; k < q->ne[0]; k++) {
            const uint32_t c = q->cut.cols ? q->cut.cols[k] : (uint32_t)k;
            q->imp[k] = cm ? imp[c] / (cm[c] * cm[c]) : imp[c];
        }
    }
    sp_free(imp);
    return rc;
}

/* ---- metadata ------------------------------------------------------------------ */

/* Keys the output sets itself, never copied from the input. */
static bool own_key(const char *k) {
    return sp_model_file_layout_key(k) || !strcmp(k, "general.file_type") || !strcmp(k, "general.quantization_version") ||
           !strncmp(k, "sparrow.quant.", 14) || !strncmp(k, "sparrow.prune.", 14) || !strncmp(k, "sparrow.fold.", 13);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((rc = (x))) return rc;                                                                                 \
    } while (0)

/* A llama2.c checkpoint has no metadata: write what the GGUF loader reads. */
sp_status sp_quantize_meta_llama2c(struct sp_gguf_writer *w, const struct sp_model_file *mf) {
    const struct sp_hparams *hp = &mf->hp;
    const struct sp_vocab_data *vd = &mf->vocab;
    sp_status rc;
    char name[128];
    snprintf(name, sizeof name, "%s", base_name(mf->path));
    char *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = '\0';
    TRY(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(sp_gguf_writer_set_str(w, "general.name", name));
    TRY(sp_gguf_writer_set_u32(w, "llama.context_length", hp->n_ctx_train));
    TRY(sp_gguf_writer_set_u32(w, "llama.embedding_length", hp->n_embd));
    TRY(sp_gguf_writer_set_u32(w, "llama.block_count", hp->n_layers));
    TRY(sp_gguf_writer_set_u32(w, "llama.feed_forward_length", hp->n_ff));
    TRY(sp_gguf_writer_set_u32(w, "llama.attention.head_count", hp->n_heads));
    TRY(sp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", hp->n_kv_heads));
    TRY(sp_gguf_writer_set_u32(w, "llama.rope.dimension_count", hp->rope_dims));
    TRY(sp_gguf_writer_set_f32(w, "llama.rope.freq_base", hp->rope_theta));
    TRY(sp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", hp->rms_eps));

    struct sp_meta_value *tok = sp_calloc(vd->n_tokens, sizeof(*tok));
    struct sp_meta_value *score = sp_calloc(vd->n_tokens, sizeof(*score));
    struct sp_meta_value *type = sp_calloc(vd->n_tokens, sizeof(*type));
    rc = SP_OK;
    if (!tok || !score || !type) rc = sp_err(SP_E_NOMEM, "sp_quantize: out of memory");
    for (uint32_t i = 0; !rc && i < vd->n_tokens; i++) {
        tok[i] = (struct sp_meta_value){.type = SP_META_STRING, .v.str = {vd->tokens[i], vd->token_len[i]}};
        score[i] = (struct sp_meta_value){.type = SP_META_F32, .v.f64 = vd->scores ? vd->scores[i] : 0.0};
        type[i] = (struct sp_meta_value){.type = SP_META_I32, .v.i64 = vd->types ? vd->types[i] : SP_TOKEN_NORMAL};
    }
    struct sp_meta_value arr = {.type = SP_META_ARRAY};
    arr.v.arr.n = vd->n_tokens;
    if (!rc) rc = sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    arr.v.arr.elem_type = SP_META_STRING, arr.v.arr.items = tok;
    if (!rc) rc = sp_gguf_writer_set(w, "tokenizer.ggml.tokens", &arr);
    arr.v.arr.elem_type = SP_META_F32, arr.v.arr.items = score;
    if (!rc) rc = sp_gguf_writer_set(w, "tokenizer.ggml.scores", &arr);
    arr.v.arr.elem_type = SP_META_I32, arr.v.arr.items = type;
    if (!rc) rc = sp_gguf_writer_set(w, "tokenizer.ggml.token_type", &arr);
    sp_free(tok);
    sp_free(score);
    sp_free(type);
    if (rc) return rc;
    if (vd->bos >= 0) TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)vd->bos));
    if (vd->eos >= 0) TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)vd->eos));
    if (vd->unk >= 0) TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)vd->unk));
    TRY(sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", vd->add_bos));
    TRY(sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", vd->add_eos));
    TRY(sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", vd->add_space_prefix));
    return SP_OK;
}

static sp_status write_meta(struct sp_gguf_writer *w, const struct job *J) {
    const struct sp_model_file *mf = J->m->mf;
    const struct sp_hparams *hp = &mf->hp;
    sp_status rc = SP_OK;
    if (mf->kind == SP_FILE_LLAMA2C) {
        TRY(sp_quantize_meta_llama2c(w, mf));
    } else {
        for (uint64_t i = 0; i < mf->n_meta; i++) {
            if (own_key(mf->meta[i].key)) continue;
            TRY(sp_gguf_writer_set(w, mf->meta[i].key, &mf->meta[i].value));
        }
    }
    char key[96];
    const char *arch = sp_arch_name(hp->arch);
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    if (J->prune && J->prune->ffn) TRY(sp_gguf_writer_set_u32(w, K("feed_forward_length"), J->prune->n_ff));
    if (J->prune && J->prune->heads) {
        /* the head size no longer follows from embedding_length / head_count */
        TRY(sp_gguf_writer_set_u32(w, K("attention.head_count"), J->prune->n_heads));
        TRY(sp_gguf_writer_set_u32(w, K("attention.head_count_kv"), J->prune->n_kv_heads));
        TRY(sp_gguf_writer_set_u32(w, K("attention.key_length"), hp->head_dim_k));
        TRY(sp_gguf_writer_set_u32(w, K("attention.value_length"), hp->head_dim_v));
    }
    if (J->fold.factor) TRY(sp_gguf_writer_set_u32(w, K("attention.head_count_kv"), J->fold.n_kv_out));
#undef K
    if (J->requires) TRY(sp_gguf_writer_set_str(w, "sparrow.requires", sp_native_requires_name(J->requires)));
    if (J->P->layout != SP_LAYOUT_NONE) TRY(sp_gguf_writer_set_str(w, "sparrow.layout", "resident"));
    if (J->ggml_quant) TRY(sp_gguf_writer_set_u32(w, "general.quantization_version", 2));
    TRY(sp_gguf_writer_set_str(w, "sparrow.quant.policy", J->policy->name));
    TRY(sp_gguf_writer_set_f32(w, "sparrow.quant.bpw", (float)((double)J->bytes * 8.0 / (double)J->n_params)));
    TRY(sp_gguf_writer_set_str(w, "sparrow.quant.source", base_name(J->P->input)));
    if (J->calib) {
        TRY(sp_gguf_writer_set_str(w, "sparrow.quant.calib_text", base_name(J->P->calib_path)));
        TRY(sp_gguf_writer_set_u32(w, "sparrow.quant.calib_tokens", (uint32_t)J->calib->n_tokens));
    }
    if (J->prune && J->prune->ffn) TRY(sp_gguf_writer_set_f32(w, "sparrow.prune.ffn", J->P->prune_ffn));
    if (J->prune && J->prune->heads) TRY(sp_gguf_writer_set_u32(w, "sparrow.prune.heads", (uint32_t)J->P->prune_heads));
    if (J->fold.factor) TRY(sp_gguf_writer_set_u32(w, "sparrow.fold.source_kv_heads", J->fold.n_kv_in));
#undef TRY
    return SP_OK;
}

/* ---- quantizing a slab of rows on the pool -------------------------------------- */

struct err_acc {
    double se, s2, wse, ws2; /* sum (w-q)^2, sum w^2, and the same weighted by imp */
    struct sp_gptq_stats gs; /* GPTQ rows, and those whose scales the refit set */
    int64_t clamped;         /* weights beyond what the type's scale can reach */
    sp_status rc;
    char pad[16];            /* keep threads' accumulators on separate cache lines */
};

struct slab {
    const struct qtensor *q;
    const struct sp_gptq *gptq; /* error-feedback rounding, or NULL */
    const struct job *J;     /* for the row Hessians */
    uint32_t ti;             /* the tensor's index */
    bool rows;               /* error feedback on row Hessians (row_factor) */
    int64_t row0;            /* the slab's first row in the tensor */
    const float *src;        /* (n_rows, ne[0]) */
    uint8_t *dst;            /* (n_rows, row_bytes) */
    int64_t n_rows;
    float **deq;             /* (n_threads) rows of the padded width */
    struct err_acc *acc;     /* (n_threads) */
};

/* Elements a dequantized row of type t holds for n logical ones (the padded
 * last block of native types). */
static int64_t padded_width(uint32_t t, int64_t n) {
    const struct sp_qtraits *tr = sp_qtraits_get(t);
    return (n + tr->block_elems - 1) / tr->block_elems * tr->block_elems;
}

static sp_status row_factor(const struct job *J, uint32_t i, int64_t r, double *hb, struct sp_gptq **out);

static void slab_task(void *arg, int ith, int nth) {
    const struct slab *s = arg;
    const struct qtensor *q = s->q;
    const int64_t a = s->n_rows * ith / nth, b = s->n_rows * (ith + 1) / nth, n = q->ne[0];
    struct err_acc *acc = &s->acc[ith];
    if (a >= b) return;
    const sp_to_float_fn to_float = sp_qtraits_get(q->type)->to_float;
    float *d = s->deq[ith];
    const int64_t np = padded_width(q->type, n);
    const float reach = sp_native_layout(q->type) ? sp_native_reach(sp_native_layout(q->type)) : INFINITY;
    sp_status rc = SP_OK;
    double *hb = NULL;
    if (s->rows && !(hb = sp_malloc((size_t)(q->src->ne[0] * q->src->ne[0]) * sizeof(double)))) {
        rc = sp_err(SP_E_NOMEM, "sp_quantize: out of memory for a row Hessian");
    }
    if (!rc && !s->gptq && !s->rows) {
        rc = sp_quantize_rows(q->type, s->src + (size_t)(a * n), b - a, n, q->imp, s->dst + (size_t)a * q->row_bytes);
    }
    for (int64_t r = a; r < b && !rc; r++) {
        const float *w = s->src + (size_t)(r * n);
        uint8_t *out = s->dst + (size_t)r * q->row_bytes;
        if (s->rows) { /* d ends up holding the row's values */
            struct sp_gptq *g = NULL;
            memcpy(d, w, (size_t)n * sizeof(float));
            rc = row_factor(s->J, s->ti, s->row0 + r, hb, &g);
            if (!rc) rc = sp_gptq_rows(g, q->type, d, 1, q->imp, out, &acc->gs);
            sp_gptq_free(g);
        } else if (s->gptq) {
            memcpy(d, w, (size_t)n * sizeof(float));
            rc = sp_gptq_rows(s->gptq, q->type, d, 1, q->imp, out, &acc->gs);
        } else {
            to_float(out, d, np);
        }
        for (int64_t k = 0; k < n; k++) {
            const double e = (double)w[k] - d[k], w2 = (double)w[k] * w[k];
            acc->clamped += fabsf(w[k]) > reach;
            acc->se += e * e;
            acc->s2 += w2;
            if (q->imp) {
                acc->wse += q->imp[k] * e * e;
                acc->ws2 += q->imp[k] * w2;
            }
        }
    }
    sp_free(hb);
    acc->rc = rc;
}

/* Rows [r0, r0 + n) of the output tensor into dst: the source rows after
 * the cut, with the scaling's multipliers, and where heads fold, the mean
 * of the rows (or elements) pooled into each (summed in double in source
 * order, then divided: a fold of one head gives the row itself, bit for
 * bit).  row: a source row of scratch; sum: ne[0] doubles. */
static sp_status gather_rows(const struct job *J, uint32_t i, int64_t r0, int64_t n, float *dst, float *row,
                             double *sum) {
    const struct qtensor *q = &J->q[i];
    const struct sp_tensor_desc *t = q->src;
    const float *cm = col_mul(J, i), *rm = row_mul(J, i);
    const struct sp_fold_cut *F = &q->fold;
    if (!q->cut.rows && !q->cut.cols && !cm && !rm && !F->factor) return sp_qread_rows(J->m, t, r0, n, dst);
    const uint32_t n_fr = F->factor && F->rows ? F->factor : 1, n_fc = F->factor && !F->rows ? F->factor : 1;
    for (int64_t r = 0; r < n; r++) {
        for (uint32_t jr = 0; jr < n_fr; jr++) {
            const int64_t cr = F->factor && F->rows ? sp_fold_source(F, r0 + r, jr) : r0 + r;
            const int64_t sr = q->cut.rows ? q->cut.rows[cr] : cr;
            sp_status rc = sp_qread_rows(J->m, t, sr, 1, row);
            if (rc) return rc;
            const float f = rm ? rm[sr] : 1.0f;
            for (int64_t k = 0; k < q->ne[0]; k++) {
                for (uint32_t jc = 0; jc < n_fc; jc++) {
                    const int64_t cc = n_fc > 1 ? sp_fold_source(F, k, jc) : k;
                    const uint32_t c = q->cut.cols ? q->cut.cols[cc] : (uint32_t)cc;
                    const double v = row[c] * f * (cm ? cm[c] : 1.0f);
                    sum[k] = jr == 0 && jc == 0 ? v : sum[k] + v; /* not 0 + v: keeps -0 */
                }
            }
        }
        float *o = dst + (size_t)(r * q->ne[0]);
        for (int64_t k = 0; k < q->ne[0]; k++) o[k] = (float)(sum[k] / (double)(n_fr * n_fc));
    }
    return SP_OK;
}

struct buffers {
    float *src, *row;
    double *sum;
    uint8_t *dst;
    float **deq;
    struct err_acc *acc;
    int nth;
};

static void buffers_free(struct buffers *b) {
    sp_free(b->src);
    sp_free(b->row);
    sp_free(b->sum);
    sp_free(b->dst);
    for (int i = 0; b->deq && i < b->nth; i++) sp_free(b->deq[i]);
    sp_free(b->deq);
    sp_free(b->acc);
}

/* Buffers for the widest tensor: one slab of floats and its quantized bytes,
 * a source row and its sums (gather_rows), and a padded row per thread. */
static sp_status buffers_alloc(const struct job *J, int nth, struct buffers *b) {
    int64_t max_src = 1, max_pad = 1;
    size_t max_slab = 1, max_dst = 1;
    for (uint32_t i = 0; i < J->n; i++) {
        const struct qtensor *q = &J->q[i];
        const int64_t per = SP_MAX((int64_t)1, (int64_t)(QUANT_SLAB_BYTES / sizeof(float)) / q->ne[0]);
        const int64_t nr = SP_MIN(per, q->rows);
        max_src = SP_MAX(max_src, q->src->ne[0]);
        max_pad = SP_MAX(max_pad, padded_width(q->type, q->ne[0]));
        max_slab = SP_MAX(max_slab, (size_t)(nr * q->ne[0]));
        max_dst = SP_MAX(max_dst, (size_t)nr * q->row_bytes);
    }
    memset(b, 0, sizeof(*b));
    b->nth = nth;
    b->src = sp_malloc(max_slab * sizeof(float));
    b->row = sp_malloc((size_t)max_src * sizeof(float));
    b->sum = sp_malloc((size_t)max_src * sizeof(double));
    b->dst = sp_malloc(max_dst);
    b->deq = sp_calloc((size_t)nth, sizeof(*b->deq));
    b->acc = sp_calloc((size_t)nth, sizeof(*b->acc));
    if (!b->src || !b->row || !b->sum || !b->dst || !b->deq || !b->acc) goto nomem;
    for (int i = 0; i < nth; i++) {
        if (!(b->deq[i] = sp_malloc((size_t)max_pad * sizeof(float)))) goto nomem;
    }
    return SP_OK;
nomem:
    buffers_free(b);
    return sp_err(SP_E_NOMEM, "sp_quantize: out of memory for the slab buffers");
}

/* The error-feedback factor for tensor i when calibration collected its
 * input covariance and its type is native; else *out = NULL. */
static sp_status tensor_gptq(const struct job *J, uint32_t i, struct sp_gptq **out) {
    const struct qtensor *q = &J->q[i];
    *out = NULL;
    const double *h = sp_calib_cov(J->calib, i);
    if (!h || !sp_qtype_is_native(q->type)) return SP_OK;
    return sp_gptq_init(h, q->src->ne[0], col_mul(J, i), q->cut.cols, q->ne[0], sp_qtraits_get(q->type)->block_elems,
                        out);
}

/* Weight of the tensor's shared input covariance H in each row's Hessian:
 * H_j + ROW_BLEND * (tr H_j / tr H) * H.  The row Hessians come from a
 * sample of calibration tokens (calib.c); the shared part keeps directions
 * that sample rarely excited from being left to chance. */
#define ROW_BLEND 1.0 /* measured on stories260K: 0.03, 0.3, 3 worse */

/* Does tensor i get error feedback on row Hessians (FFN gate/up, output
 * head, when calibration collected them)? */
static bool has_row_hessians(const struct job *J, uint32_t i) {
    const struct qtensor *q = &J->q[i];
    return sp_calib_rowcov(J->calib, i) && sp_calib_cov(J->calib, i) && sp_qtype_is_native(q->type) && q->n_dims == 2 &&
           !q->fold.factor; /* row Hessians are per source row */
}

/* The error-feedback factor of output row r of tensor i: its row Hessian
 * blended with the shared covariance, built in hb (ne[0]^2 doubles).  One
 * row at a time, so that memory stays at the packed row Hessians. */
static sp_status row_factor(const struct job *J, uint32_t i, int64_t r, double *hb, struct sp_gptq **out) {
    const struct qtensor *q = &J->q[i];
    const double *h = sp_calib_cov(J->calib, i);
    const int64_t nf = q->src->ne[0], nt = nf * (nf + 1) / 2, sr = q->cut.rows ? q->cut.rows[r] : r;
    const double *p = sp_calib_rowcov(J->calib, i) + (size_t)(sr * nt);
    double tr = 0, trh = 0;
    for (int64_t a = 0, k = 0; a < nf; a++) {
        for (int64_t b = 0; b <= a; b++, k++) hb[a * nf + b] = hb[b * nf + a] = p[k];
        tr += hb[a * nf + a];
        trh += h[a * nf + a];
    }
    if (!(tr > 0)) memset(hb, 0, (size_t)(nf * nf) * sizeof(double)); /* a row the sample never weighted */
    const double f = tr > 0 && trh > 0 ? ROW_BLEND * tr / trh : 1.0;
    for (int64_t k = 0; k < nf * nf; k++) hb[k] += f * h[k];
    return sp_gptq_init(hb, nf, col_mul(J, i), q->cut.cols, q->ne[0], sp_qtraits_get(q->type)->block_elems, out);
}

/* Quantize and write tensor i; report it.  SP_E_STATE when cancelled. */
static sp_status write_tensor(struct job *J, uint32_t i, struct sp_gguf_writer *w, struct sp_pool *pool,
                              struct buffers *b) {
    struct qtensor *q = &J->q[i];
    const int64_t per = SP_MAX((int64_t)1, (int64_t)(QUANT_SLAB_BYTES / sizeof(float)) / q->ne[0]);
    memset(b->acc, 0, (size_t)b->nth * sizeof(*b->acc));
    struct sp_gptq *g = NULL;
    const bool rows = has_row_hessians(J, i);
    sp_status rc = rows ? SP_OK : tensor_gptq(J, i, &g);
    for (int64_t r0 = 0; !rc && r0 < q->rows; r0 += per) {
        const int64_t nr = SP_MIN(per, q->rows - r0);
        if ((rc = gather_rows(J, i, r0, nr, b->src, b->row, b->sum))) break;
        struct slab s = {.q = q, .gptq = g, .J = J, .ti = i, .rows = rows, .row0 = r0, .src = b->src, .dst = b->dst, .n_rows = nr,
                         .deq = b->deq, .acc = b->acc};
        sp_pool_run(pool, slab_task, &s);
        for (int k = 0; k < b->nth && !rc; k++) rc = b->acc[k].rc;
        if (!rc && q->store != q->type) sp_qtype_repack(q->store, b->dst, nr, q->ne[0], q->row_bytes);
        if (!rc) rc = sp_gguf_writer_write(w, b->dst, (size_t)nr * q->row_bytes);
    }
    const bool fed_back = g != NULL || rows;
    J->n_gptq += fed_back;
    sp_gptq_free(g);
    if (rc) return rc;
    struct err_acc tot = {0};
    for (int k = 0; k < b->nth; k++) {
        tot.se += b->acc[k].se, tot.s2 += b->acc[k].s2, tot.wse += b->acc[k].wse, tot.ws2 += b->acc[k].ws2;
        tot.gs.n_rows += b->acc[k].gs.n_rows;
        tot.gs.n_refit += b->acc[k].gs.n_refit;
        tot.clamped += b->acc[k].clamped;
    }
    if (tot.clamped) { /* L8's range: say so, the error alone would not say why */
        const size_t used = strlen(q->note);
        snprintf(q->note + used, sizeof q->note - used, "%s%lld weights beyond the %s scale's reach (|w| > %.3g), "
                 "clamped: an FP16-scale type fits them", used ? "; " : "", (long long)tot.clamped, type_name(q->type),
                 (double)sp_native_reach(sp_native_layout(q->type)));
    }
    if (fed_back) {
        const size_t used = strlen(q->note);
        snprintf(q->note + used, sizeof q->note - used, "%serror feedback%s", used ? "; " : "",
                 rows ? " on row Hessians" : "");
        const size_t u2 = strlen(q->note);
        snprintf(q->note + u2, sizeof q->note - u2, " (%lld of %lld rows refit)", (long long)tot.gs.n_refit,
                 (long long)tot.gs.n_rows);
    }
    if (!J->P->on_tensor) return SP_OK;
    struct sp_quantize_tensor_report rep = {
        .index = (int32_t)i, .count = (int32_t)J->n, .name = q->src->name, .type = type_name(q->store),
        .n_dims = (int32_t)q->n_dims, .bytes = (uint64_t)q->rows * q->row_bytes,
        .rel_rmse = tot.s2 > 0 ? sqrt(tot.se / tot.s2) : 0.0,
        .rel_rmse_imp = q->imp && tot.ws2 > 0 ? sqrt(tot.wse / tot.ws2) : -1.0, .note = q->note};
    for (int d = 0; d < 4; d++) rep.ne[d] = q->ne[d];
    if (!J->P->on_tensor(&rep, J->P->user)) {
        return sp_err(SP_E_STATE, "sp_quantize: '%s': cancelled; nothing was written", J->P->output);
    }
    return SP_OK;
}

/* ---- the driver ------------------------------------------------------------------- */

sp_status sp_quantize_progress(const struct sp_quantize_params *P, const char *stage, int32_t done, int32_t total) {
    if (!P || !P->on_progress || P->on_progress(stage, done, total, P->user)) return SP_OK;
    return sp_err(SP_E_STATE, "sp_quantize: cancelled while %s (%d of %d)", stage, (int)done, (int)total);
}

static sp_status check_params(const struct sp_quantize_params *P) {
    if (!P || !P->input || !*P->input || !P->output || !*P->output) {
        return sp_err(SP_E_INVALID, "sp_quantize: input and output paths are required");
    }
    if ((unsigned)P->layout >= SP_LAYOUT_COUNT) return sp_err(SP_E_INVALID, "sp_quantize: unknown layout %d", (int)P->layout);
    if (P->n_threads < 0 || P->n_threads > 1024) {
        return sp_err(SP_E_INVALID, "sp_quantize: n_threads %d out of range [0, 1024]", (int)P->n_threads);
    }
    if (P->calib_chunks < 0 || P->calib_ctx < 0 || P->calib_ctx == 1) {
        return sp_err(SP_E_INVALID, "sp_quantize: calib_chunks %d / calib_ctx %d out of range", (int)P->calib_chunks,
                      (int)P->calib_ctx);
    }
    if (!(P->prune_ffn >= 0.0f && P->prune_ffn < 1.0f)) {
        return sp_err(SP_E_INVALID, "sp_quantize: prune_ffn %g is not in [0, 1)", (double)P->prune_ffn);
    }
    if (P->prune_heads < 0) return sp_err(SP_E_INVALID, "sp_quantize: prune_heads %d is negative", (int)P->prune_heads);
    if (P->merge_kv_heads < 0) {
        return sp_err(SP_E_INVALID, "sp_quantize: merge_kv_heads %d is negative", (int)P->merge_kv_heads);
    }
    /* Writing over a file the run reads would replace it (the rename) with
     * what was computed from it -- or, for the model, leave a mapping of a
     * file that is gone.  By inode: hard and symbolic links are the file. */
    const char *const reads[] = {P->input, P->tokenizer_path, P->calib_path, P->policy_file};
    const char *const what[] = {"input", "tokenizer", "calibration text", "policy file"};
    for (size_t k = 0; k < SP_ARRAY_LEN(reads); k++) {
        if (reads[k] && sp_file_same(reads[k], P->output)) {
            return sp_err(SP_E_INVALID, "sp_quantize: the output '%s' is the %s file '%s'; choose another output path",
                          P->output, what[k], reads[k]);
        }
    }
    return SP_OK;
}

/* Measure the written file: parameters, tensor bytes, size. */
static sp_status measure_output(const char *path, struct sp_quantize_result *r) {
    struct sp_model_file *mf = NULL;
    sp_status rc = sp_model_file_open(path, NULL, false, &mf);
    if (rc) return rc;
    r->n_params = r->tensor_bytes = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        r->n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        r->tensor_bytes += t->size;
    }
    r->bpw = r->n_params ? (double)r->tensor_bytes * 8.0 / (double)r->n_params : 0.0;
    r->file_size = mf->file_size;
    r->n_ff = (int32_t)mf->hp.n_ff;
    r->n_heads = (int32_t)mf->hp.n_heads;
    r->n_kv_heads = (int32_t)mf->hp.n_kv_heads;
    sp_model_file_free(mf);
    return SP_OK;
}

sp_status sp_quantize(const struct sp_quantize_params *params, struct sp_quantize_result *out) {
    const double t0 = sp_quantize_now_s();
    sp_status rc = check_params(params);
    if (rc) return rc;
    const struct sp_quantize_params *P = params;
    sp_init();
    struct job J = {.P = P};
    struct sp_gguf_writer *w = NULL;
    struct sp_pool *pool = NULL;
    struct buffers b = {0};
    const int nth = P->n_threads ? P->n_threads : 1;

    if (P->policy_file) rc = sp_qpolicy_load(P->policy_file, &J.policy);
    else rc = sp_qpolicy_named(P->policy ? P->policy : QUANT_DEFAULT_POLICY, &J.policy);
    if (rc) goto done;

    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = P->tokenizer_path;
    mp.weights = SP_WEIGHTS_MMAP; /* read each weight once, straight from the page cache */
    if ((rc = sp_model_load(P->input, &mp, &J.m))) goto done;
    for (uint32_t i = 0; i < J.m->mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &J.m->mf->tensors[i];
        if (!source_type_ok(t->type)) {
            rc = sp_err(SP_E_UNSUPPORTED, "sp_quantize: '%s': tensor '%s' is %s; the quantizer reads F32, F16, BF16 "
                        "or Q8_0 (quantizing a quantized file again compounds its error)", P->input, t->name,
                        type_name(t->type));
            goto done;
        }
    }
    if (P->calib_path) {
        const int32_t chunks = P->calib_chunks ? P->calib_chunks : QUANT_DEFAULT_CHUNKS;
        const int32_t ctx = P->calib_ctx ? P->calib_ctx : QUANT_DEFAULT_CTX;
        const uint64_t budget = (P->calib_skip & SP_CALIB_GPTQ) ? 0 : QUANT_COV_BUDGET;
        if ((rc = sp_calib_run(J.m, P->calib_path, chunks, ctx, nth, budget, P, &J.calib))) goto done;
    }
    if ((P->prune_ffn > 0.0f || P->prune_heads > 0) &&
        (rc = sp_prune_plan_build(J.m, J.calib, P->prune_ffn, P->prune_heads, &J.prune))) {
        goto done;
    }
    if ((rc = sp_fold_plan_make(J.m, J.prune, P->merge_kv_heads, &J.fold))) goto done;
    if ((rc = plan_tensors(&J))) goto done;
    if (J.calib && !(P->calib_skip & SP_CALIB_SCALE)) {
        uint32_t *types = sp_malloc(J.n * sizeof(uint32_t));
        if (!types) {
            rc = sp_err(SP_E_NOMEM, "sp_quantize: out of memory");
            goto done;
        }
        for (uint32_t i = 0; i < J.n; i++) types[i] = J.q[i].type;
        rc = sp_scale_plan_build(J.m, J.calib, types, J.prune, &J.fold, P, &J.scale);
        if (!rc) rc = sp_quantize_progress(P, "scaling", (int32_t)J.m->mf->hp.n_layers + 1, (int32_t)J.m->mf->hp.n_layers + 1);
        sp_free(types);
        if (rc) goto done;
    }
    if ((rc = plan_importance(&J))) goto done;

    if ((rc = sp_gguf_writer_open(P->output, QUANT_ALIGNMENT, &w))) goto done;
    if ((rc = write_meta(w, &J))) goto done;
    for (uint32_t i = 0; i < J.n; i++) {
        const struct qtensor *q = &J.q[i];
        if ((rc = sp_gguf_writer_add_tensor(w, q->src->name, q->store, q->n_dims, q->ne))) goto done;
    }
    if ((rc = sp_pool_init(nth, &pool)) || (rc = buffers_alloc(&J, nth, &b))) goto done;
    for (uint32_t i = 0; i < J.n; i++) {
        if ((rc = write_tensor(&J, i, w, pool, &b))) goto done;
    }
    if ((rc = sp_gguf_writer_finish(w))) goto done;

    struct sp_quantize_result res = {0};
    snprintf(res.policy, sizeof res.policy, "%s", J.policy->name);
    res.native = J.native;
    res.calib_tokens = J.calib ? J.calib->n_tokens : 0;
    res.n_scaled = J.scale ? J.scale->n_scaled : 0;
    res.n_gptq = J.n_gptq;
    if ((rc = measure_output(P->output, &res))) goto done;
    res.seconds = sp_quantize_now_s() - t0;
    if (out) *out = res;

done:
    sp_gguf_writer_free(w); /* removes the temporary file unless finished */
    buffers_free(&b);
    sp_pool_free(pool);
    for (uint32_t i = 0; J.q && i < J.n; i++) sp_free(J.q[i].imp);
    sp_free(J.q);
    sp_prune_plan_free(J.prune);
    sp_scale_plan_free(J.scale);
    sp_calib_free(J.calib);
    sp_model_free(J.m);
    sp_qpolicy_free(J.policy);
    return rc;
}
