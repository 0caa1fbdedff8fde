/*
 * api.c -- implements include/sparrow.h on top of the internal modules.  The
 * only place that turns internal state into public results; the CLI and
 * future server are clients of this file.
 */
#include "sparrow.h"

#include "api_internal.h"
#include "chat/chat.h"
#include "core/core.h"
#include "core/cpu.h"
#include "core/file.h"
#include "core/hash.h"
#include "format/session.h"
#include "mem/budget.h"
#include "mem/pager.h"
#include "model/model.h"
#include "model/seq.h"
#include "package/package.h"
#include "quant/kv.h"
#include "quant/quant.h"
#include "sample/sampler.h"
#include "sched/governor.h"
#include "sched/pool.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <unistd.h>

void sp_init(void) {
    (void)sp_cpu_features();
    sp_quant_init();
}

/* ---- model -------------------------------------------------------------- */

struct sp_model_params sp_model_default_params(void) {
    return (struct sp_model_params){.tokenizer_path = NULL, .vocab_only = false, .weights = SP_WEIGHTS_AUTO,
                                    .mem_budget = 0, .n_ctx = 0, .n_seq = 0, .n_batch = 0, .n_threads = 0,
                                    .kv_type_k = SP_KV_F16, .kv_type_v = SP_KV_F16};
}

/* The dense tensors in the order the forward pass reads them: the pager's
 * read-ahead schedule.  Tensors not listed stream in file order after. */
static sp_status forward_order(struct sp_model *m) {
    const struct sp_hparams *hp = &m->mf->hp;
    const uint32_t per_layer = 20;
    m->order = sp_calloc((size_t)hp->n_layers * per_layer + 4, sizeof *m->order);
    if (!m->order) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    uint32_t n = 0;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct sp_layer_weights *L = &m->layers[il];
        const struct sp_tensor_desc *seq[] = {L->attn_norm,      L->wq,          L->wk,
                                              L->wv,             L->bq,          L->bk,
                                              L->bv,             L->q_norm,      L->k_norm,
                                              L->wo,             L->ffn_norm,    L->ffn_gate_inp,
                                              L->ffn_gate,       L->ffn_up,      L->ffn_down,
                                              L->ffn_gate_shexp, L->ffn_up_shexp, L->ffn_down_shexp,
                                              L->ffn_gate_inp_shexp};
        static_assert(SP_ARRAY_LEN(seq) <= 20, "per_layer too small");
        for (size_t k = 0; k < SP_ARRAY_LEN(seq); k++)
            if (seq[k]) m->order[n++] = seq[k];
    }
    m->order[n++] = m->output_norm;
    m->order[n++] = m->output;
    m->n_order = n;
    return SP_OK;
}

sp_status sp_model_load(const char *path, const struct sp_model_params *params, struct sp_model **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!path) return sp_err(SP_E_INVALID, "%s: path is NULL", __func__);
    sp_init();
    struct sp_model_params p = params ? *params : sp_model_default_params();
    struct sp_model *m = sp_calloc(1, sizeof(*m));
    if (!m) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    if (pthread_mutex_init(&m->kv_mu, NULL) != 0) {
        sp_free(m);
        return sp_err(SP_E_NOMEM, "%s: cannot create a mutex", __func__);
    }
    m->vocab_only = p.vocab_only;
    sp_status rc = sp_model_file_open(path, p.tokenizer_path, p.vocab_only, &m->mf);
    if (rc) goto fail;
    /* A package (package/): resident weights decompress straight into the
     * pager's region; a budget streams spans of a plain file, so it runs from
     * a copy installed once into the cache folder. */
    const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    const int unpack_threads = n_cpu > 0 ? (int)SP_MIN(n_cpu, 8L) : 1;
    if (m->mf->packed && !p.vocab_only && p.mem_budget) {
        char *cached = NULL;
        bool installed = false;
        if ((rc = sp_package_cache_install(path, unpack_threads, &cached, &installed))) goto fail;
        SP_LOG_W("'%s': a budgeted run streams from a plain file: %s '%s'", path,
                 installed ? "installed the package once into" : "running from its copy installed in", cached);
        sp_model_file_free(m->mf);
        m->mf = NULL;
        rc = sp_model_file_open(cached, p.tokenizer_path, p.vocab_only, &m->mf);
        sp_free(cached);
        if (rc) goto fail;
    }
    if (m->mf->packed) {
        snprintf(m->file_format, sizeof m->file_format, "gguf v%u package", m->mf->version);
    } else if (m->mf->kind == SP_FILE_GGUF) {
        snprintf(m->file_format, sizeof m->file_format, "gguf v%u", m->mf->version);
    } else {
        snprintf(m->file_format, sizeof m->file_format, "llama2.c");
    }
    if (!p.vocab_only && !m->mf->has_hparams) {
        rc = sp_err(SP_E_FORMAT, "%s: no model hyper-parameters (a vocab-only file?)", path);
        goto fail;
    }
    if (m->mf->has_hparams && (rc = sp_model_bind(m))) goto fail;
    if (m->mf->vocab.kind == SP_VOCAB_NONE) {
        rc = sp_err(SP_E_FORMAT, "%s: no tokenizer in the file", path);
        goto fail;
    }
    if ((rc = sp_tokenizer_init(&m->mf->vocab, &m->tok))) goto fail;
    if ((unsigned)p.expert_cache >= SP_EXPERT_CACHE_COUNT) {
        rc = sp_err(SP_E_INVALID, "%s: unknown expert cache policy %d", __func__, (int)p.expert_cache);
        goto fail;
    }
    if ((unsigned)p.weights >= SP_WEIGHTS_MODE_COUNT) {
        rc = sp_err(SP_E_INVALID, "%s: unknown weight mode %d", __func__, (int)p.weights);
        goto fail;
    }
    if ((rc = sp_budget_init(p.mem_budget, &m->budget))) goto fail;
    if (p.n_ctx < 0 || p.n_seq < 0 || p.n_batch < 0 || p.n_threads < 0 || !sp_kv_type_get(p.kv_type_k) ||
        !sp_kv_type_get(p.kv_type_v) || p.batch_tokens < 0 || p.batch_tokens > 65536) {
        rc = sp_err(SP_E_INVALID,
                    "%s: bad envelope (n_ctx %d, n_seq %d, n_batch %d, n_threads %d, cache types %d/%d, batch_tokens %d)",
                    __func__, p.n_ctx, p.n_seq, p.n_batch, p.n_threads, (int)p.kv_type_k, (int)p.kv_type_v,
                    p.batch_tokens);
        goto fail;
    }
    m->envelope = sp_session_default_params();
    m->envelope.n_ctx = p.n_ctx;
    m->envelope.n_batch = p.n_batch;
    m->envelope.n_threads = p.n_threads;
    m->envelope.kv_type_k = p.kv_type_k;
    m->envelope.kv_type_v = p.kv_type_v;
    m->envelope_n_seq = p.n_seq ? (uint32_t)p.n_seq : 1;
    m->envelope_batch_tokens = (uint32_t)p.batch_tokens;
    if (!p.vocab_only) {
        if ((rc = forward_order(m))) goto fail;
        struct sp_pager_config pc = {
            .mode = p.weights,
            .budget = p.mem_budget,
            .account = m->budget,
            .embed = m->output != m->tok_embd ? m->tok_embd : NULL,
            .n_experts = m->mf->hp.n_experts,
            .n_experts_used = m->mf->hp.n_experts_used,
            .order = m->order,
            .n_order = m->n_order,
            .expert_cache = p.expert_cache,
            .repack = true,
            .by_rows = m->tok_embd,
        };
        struct sp_package_reader *pkg = NULL;
        if (m->mf->packed) {
            if ((rc = sp_package_reader_open(path, unpack_threads, &pkg))) goto fail;
            pc.fill = sp_package_fill;
            pc.fill_user = pkg;
        }
        rc = sp_pager_open(m->mf, &pc, &m->pager);
        sp_package_reader_close(pkg);
        if (rc) goto fail;
    }
    *out = m;
    return SP_OK;
fail:
    sp_model_free(m);
    return rc;
}

void sp_model_free(struct sp_model *m) {
    if (!m) return;
    for (int k = 0; k < SP_KV_TYPE_COUNT; k++)
        for (int v = 0; v < SP_KV_TYPE_COUNT; v++) sp_kv_cache_free(m->kv[k][v]);
    pthread_mutex_destroy(&m->kv_mu);
    sp_pager_close(m->pager); /* releases the weights' share of the account */
    m->pager = NULL;
    sp_budget_free(m->budget);
    sp_tokenizer_free(m->tok);
    sp_free(m->layers);
    sp_free(m->order);
    sp_model_file_free(m->mf);
    sp_free(m);
}

sp_status sp_model_get_info(const struct sp_model *m, struct sp_model_info *out) {
    if (!m || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    const struct sp_hparams *hp = &m->mf->hp;
    const struct sp_vocab_data *v = &m->mf->vocab;
    memset(out, 0, sizeof(*out));
    out->arch = m->mf->has_hparams ? sp_arch_name(hp->arch) : "";
    out->name = m->mf->name ? m->mf->name : "";
    out->file_format = m->file_format;
    out->tokenizer = v->kind == SP_VOCAB_SPM ? "spm" : v->kind == SP_VOCAB_BPE ? "bpe" : "none";
    out->tokenizer_pre = v->kind == SP_VOCAB_BPE && v->pre ? v->pre : "";
    out->n_vocab = (int32_t)(m->mf->has_hparams ? hp->n_vocab : v->n_tokens);
    if (m->mf->has_hparams) {
        out->n_ctx_train = (int32_t)hp->n_ctx_train;
        out->n_embd = (int32_t)hp->n_embd;
        out->n_layers = (int32_t)hp->n_layers;
        out->n_heads = (int32_t)hp->n_heads;
        out->n_kv_heads = (int32_t)hp->n_kv_heads;
        out->head_dim_k = (int32_t)hp->head_dim_k;
        out->head_dim_v = (int32_t)hp->head_dim_v;
        out->n_ff = (int32_t)hp->n_ff;
        out->n_experts = (int32_t)hp->n_experts;
        out->n_experts_used = (int32_t)hp->n_experts_used;
        out->n_ff_exp = (int32_t)(hp->n_experts ? hp->n_ff_exp : 0);
        out->rope_theta = hp->rope_theta;
        out->rope_dims = (int32_t)hp->rope_dims;
        out->rope_neox = hp->rope_neox;
        out->rms_eps = hp->rms_eps;
    }
    out->tied_output = m->output && m->output == m->tok_embd;
    out->bos = v->bos;
    out->eos = v->eos;
    out->add_bos = v->add_bos;
    out->n_params = m->n_params;
    out->tensor_bytes = m->tensor_bytes;
    out->bytes_per_token = m->bytes_per_token;
    out->file_size = m->mf->file_size;
    return SP_OK;
}

int32_t sp_model_n_tensors(const struct sp_model *m) {
    return m ? (int32_t)m->mf->n_tensors : 0;
}

sp_status sp_model_get_tensor(const struct sp_model *m, int32_t i, struct sp_tensor_info *out) {
    if (!m || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    if (i < 0 || (uint32_t)i >= m->mf->n_tensors) return sp_err(SP_E_INVALID, "%s: index %d out of range", __func__, i);
    const struct sp_tensor_desc *t = &m->mf->tensors[i];
    out->name = t->name;
    out->type = sp_qtype_name(t->type) ? sp_qtype_name(t->type) : "?";
    out->n_dims = (int32_t)t->n_dims;
    for (int d = 0; d < 4; d++) out->ne[d] = t->ne[d];
    out->offset = t->offset;
    out->size = t->size;
    return SP_OK;
}

int32_t sp_model_n_meta(const struct sp_model *m) {
    return m ? (int32_t)m->mf->n_meta : 0;
}

/* Render a metadata value into buf, abbreviating arrays to a few items. */
static void render_value(const struct sp_meta_value *v, char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    switch (v->type) {
    case SP_META_U8: case SP_META_U16: case SP_META_U32: case SP_META_U64:
        snprintf(buf, cap, "%llu", (unsigned long long)v->v.u64);
        break;
    case SP_META_I8: case SP_META_I16: case SP_META_I32: case SP_META_I64:
        snprintf(buf, cap, "%lld", (long long)v->v.i64);
        break;
    case SP_META_F32: case SP_META_F64:
        snprintf(buf, cap, "%g", v->v.f64);
        break;
    case SP_META_BOOL:
        snprintf(buf, cap, "%s", v->v.u64 ? "true" : "false");
        break;
    case SP_META_STRING:
        snprintf(buf, cap, "%.*s", (int)SP_MIN(v->v.str.len, (uint64_t)200), v->v.str.ptr);
        break;
    case SP_META_ARRAY: {
        size_t len = (size_t)snprintf(buf, cap, "[%llu items]", (unsigned long long)v->v.arr.n);
        for (uint64_t i = 0; i < v->v.arr.n && i < 4 && len + 4 < cap; i++) {
            char item[64];
            render_value(&v->v.arr.items[i], item, sizeof item);
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : " ", item);
        }
        if (v->v.arr.n > 4 && len + 5 < cap) snprintf(buf + len, cap - len, ", ...");
        break;
    }
    default:
        snprintf(buf, cap, "?");
    }
}

sp_status sp_model_get_meta(const struct sp_model *m, int32_t i, char *key, size_t key_cap, char *val,
                            size_t val_cap) {
    if (!m) return sp_err(SP_E_INVALID, "%s: NULL model", __func__);
    if (i < 0 || (uint64_t)i >= m->mf->n_meta) return sp_err(SP_E_INVALID, "%s: index %d out of range", __func__, i);
    const struct sp_meta_kv *kv = &m->mf->meta[i];
    if (key && key_cap) snprintf(key, key_cap, "%s", kv->key);
    if (val && val_cap) render_value(&kv->value, val, val_cap);
    return SP_OK;
}

/* ---- tokenizer ---------------------------------------------------------- */

sp_status sp_tokenize(const struct sp_model *m, const char *text, size_t len, unsigned flags, int32_t *tokens,
                      int32_t cap, int32_t *n_out) {
    if (!m || (!text && len) || !n_out || (cap > 0 && !tokens) || cap < 0) {
        return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    }
    return sp_tokenizer_encode(m->tok, text ? text : "", len, (flags & SP_TOKENIZE_ADD_BOS) != 0,
                               (flags & SP_TOKENIZE_PARSE_SPECIAL) != 0, tokens, cap, n_out);
}

sp_status sp_token_to_piece(const struct sp_model *m, int32_t token, char *buf, size_t cap, size_t *n_out) {
    if (!m || !n_out || (cap && !buf)) return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    return sp_tokenizer_piece(m->tok, token, buf, cap, n_out);
}

sp_status sp_detokenize(const struct sp_model *m, const int32_t *tokens, int32_t n, char *buf, size_t cap,
                        size_t *n_out) {
    if (!m || !n_out || (n > 0 && !tokens) || n < 0 || (cap && !buf)) {
        return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    }
    return sp_tokenizer_decode(m->tok, tokens, n, buf, cap, n_out);
}

bool sp_token_is_eog(const struct sp_model *m, int32_t token) {
    return m && sp_tokenizer_is_eog(m->tok, token);
}

/* ---- chat templates ------------------------------------------------------ */

/* Copy text[0..n) and a NUL into buf, or SP_E_BUFFER; *len = n either way. */
static sp_status put_text(const char *text, size_t n, char *buf, size_t cap, size_t *len) {
    *len = n;
    if (cap < n + 1 || !buf) return SP_E_BUFFER; /* a size query, not a failure worth logging */
    memcpy(buf, text, n);
    buf[n] = '\0';
    return SP_OK;
}

sp_status sp_model_meta_str(const struct sp_model *m, const char *key, char *buf, size_t cap, size_t *len) {
    if (!m || !key || !len || (cap && !buf)) return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    *len = 0;
    const struct sp_meta_value *v = sp_model_file_meta(m->mf, key);
    if (!v) return sp_err(SP_E_INVALID, "%s: the model has no metadata key '%s'", __func__, key);
    if (v->type == SP_META_STRING) return put_text(v->v.str.ptr, (size_t)v->v.str.len, buf, cap, len);
    if (v->type == SP_META_ARRAY) return sp_err(SP_E_INVALID, "%s: '%s' is an array", __func__, key);
    char tmp[64];
    render_value(v, tmp, sizeof tmp);
    return put_text(tmp, strlen(tmp), buf, cap, len);
}

struct sp_chat_params sp_chat_default_params(void) {
    return (struct sp_chat_params){.tmpl = NULL, .engine = SP_CHAT_JINJA, .add_assistant = true};
}

/* The text of a special token of the vocabulary, "" for none. */
static const char *token_text(const struct sp_model *m, int32_t id) {
    const struct sp_vocab_data *v = &m->mf->vocab;
    return id >= 0 && (uint32_t)id < v->n_tokens && v->tokens[id] ? v->tokens[id] : "";
}

sp_status sp_chat_apply(const struct sp_model *m, const struct sp_chat_params *params,
                        const struct sp_chat_message *msgs, size_t n, char *buf, size_t cap, size_t *len) {
    if (!len || (cap && !buf) || (n && !msgs)) return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    *len = 0;
    const struct sp_chat_params p = params ? *params : sp_chat_default_params();
    if ((unsigned)p.engine >= SP_CHAT_ENGINE_COUNT)
        return sp_err(SP_E_INVALID, "%s: unknown engine %d", __func__, (int)p.engine);
    const struct sp_meta_value *mt = m ? sp_model_file_meta(m->mf, "tokenizer.chat_template") : NULL;
    char *model_tmpl = NULL;
    const char *tmpl = p.tmpl;
    if (!tmpl) {
        if (!m) return sp_err(SP_E_INVALID, "%s: no template and no model", __func__);
        if (!mt || mt->type != SP_META_STRING)
            return sp_err(SP_E_UNSUPPORTED, "%s: the model has no chat template (tokenizer.chat_template)", __func__);
        if (!(model_tmpl = sp_strndup(mt->v.str.ptr, (size_t)mt->v.str.len)))
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        tmpl = model_tmpl;
    }
    const struct sp_vocab_data *v = m ? &m->mf->vocab : NULL;
    struct sp_chat_request r = {
        .tmpl = tmpl,
        .use_jinja = p.engine == SP_CHAT_JINJA,
        .msgs = msgs,
        .n_msgs = n,
        .messages_json = p.messages_json,
        .vars_json = p.vars_json,
        .bos = p.bos_token ? p.bos_token : m ? token_text(m, v->bos) : "",
        .eos = p.eos_token ? p.eos_token : m ? token_text(m, v->eos) : "",
        .add_assistant = p.add_assistant,
        .strip_bos = m && !p.keep_bos && v->add_bos,
        .strip_eos = m && !p.keep_bos && v->add_eos,
        .lim = sp_jinja_limits_or_default(&(struct sp_jinja_limits){.max_output = p.max_output,
                                                                     .max_iterations = p.max_iterations}),
    };
    char *out = NULL;
    size_t out_len = 0;
    sp_status rc = sp_chat_render(&r, &out, &out_len);
    sp_free(model_tmpl);
    if (rc != SP_OK) return rc;
    rc = put_text(out, out_len, buf, cap, len);
    sp_free(out);
    return rc;
}

sp_status sp_chat_apply_template(const struct sp_model *m, const char *tmpl, const struct sp_chat_message *msgs,
                                 size_t n, bool add_assistant, char *buf, size_t cap, size_t *len) {
    struct sp_chat_params p = sp_chat_default_params();
    p.tmpl = tmpl;
    p.add_assistant = add_assistant;
    return sp_chat_apply(m, &p, msgs, n, buf, cap, len);
}

int32_t sp_chat_builtin_templates(const char **names, size_t cap) {
    const int n = sp_chat_named_count();
    for (int i = 0; names && (size_t)i < cap && i < n; i++) names[i] = sp_chat_named_name(i);
    return n;
}

const char *sp_chat_detect_template(const char *tmpl) {
    return tmpl ? sp_chat_named_name(sp_chat_named_detect(tmpl, strlen(tmpl))) : NULL;
}

/* ---- session ------------------------------------------------------------ */

const char *sp_kv_type_name(enum sp_kv_type t) {
    const struct sp_kv_type_info *ti = sp_kv_type_get(t);
    return ti ? ti->name : NULL;
}

double sp_kv_type_bits(enum sp_kv_type t) {
    const struct sp_kv_type_info *ti = sp_kv_type_get(t);
    return ti ? ti->bits : 0.0;
}

sp_status sp_kv_type_from_name(const char *name, enum sp_kv_type *out) {
    if (!name || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    for (int t = 0; t < SP_KV_TYPE_COUNT; t++) {
        if (strcmp(name, sp_kv_type_get((enum sp_kv_type)t)->name) == 0) {
            *out = (enum sp_kv_type)t;
            return SP_OK;
        }
    }
    return sp_err(SP_E_INVALID, "unknown KV cache type '%s' (f32, f16, q8_0, q4_0, q4h)", name);
}

struct sp_session {
    struct sp_model *model;
    struct sp_session_params p;
    struct sp_seq *seq;
    float *logits;   /* (n_rows, n_vocab): n_rows = n_batch with logits_all, else 1 */
    uint32_t n_rows;
    uint32_t n_logits; /* rows written by the last sp_decode (0: none yet) */
    uint32_t n_last;   /* tokens fed by the last sp_decode; its last n_logits have rows */
    struct sp_sampler *sampler;
    uint64_t kv_reserved, scratch_reserved; /* this session's shares of the model's memory account */
    char *swap_path;    /* swapped out (sp_session_swap_out): its KV cache is in this file */
    int32_t swap_n;     /* tokens it held then */
    struct sp_governor *gov; /* sp_session_set_governor; NULL = flat out */
    bool gov_prompt;    /* sp_decode is feeding a prompt: its passes are the governor's */
    bool stepping;      /* between sp_decode_begin and done */
    int32_t step_n;     /* tokens of the step decode */
    const int32_t *step_tokens;
};

static sp_status swap_in(struct sp_session *s, const char *fn);

struct sp_session_params sp_session_default_params(void) {
    return (struct sp_session_params){
        .n_ctx = 0,
        .n_threads = 0,
        .n_batch = 0,
        .seed = 0,
        .kv_type_k = SP_KV_F16,
        .kv_type_v = SP_KV_F16,
        .sampling = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                     .repeat_last_n = 64},
        .logits_all = false,
        .ctx_shift = false,
        .n_keep = 0,
        .n_discard = 0,
    };
}

/* Check session params and turn them into a sequence's. */
static sp_status session_shape(const struct sp_model *m, const struct sp_session_params *p, struct sp_seq_params *q) {
    const struct sp_hparams *hp = &m->mf->hp;
    if (p->n_ctx < 0) return sp_err(SP_E_INVALID, "sp_session_init: n_ctx %d is negative", p->n_ctx);
    if (p->n_threads < 0 || p->n_threads > 1024) {
        return sp_err(SP_E_INVALID, "sp_session_init: n_threads %d out of range [0, 1024]", p->n_threads);
    }
    if (p->n_batch < 0) return sp_err(SP_E_INVALID, "sp_session_init: n_batch %d is negative", p->n_batch);
    if (!sp_kv_type_get(p->kv_type_k)) {
        return sp_err(SP_E_INVALID, "sp_session_init: unknown kv_type_k %d", (int)p->kv_type_k);
    }
    if (!sp_kv_type_get(p->kv_type_v)) {
        return sp_err(SP_E_INVALID, "sp_session_init: unknown kv_type_v %d", (int)p->kv_type_v);
    }
    uint32_t n_ctx = (uint32_t)p->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train ? hp->n_ctx_train : 4096u;
    if (n_ctx > (1u << 24)) return sp_err(SP_E_INVALID, "sp_session_init: n_ctx %u too large (at most 2^24)", n_ctx);
    if (p->n_keep < 0 || (uint32_t)p->n_keep >= n_ctx) {
        return sp_err(SP_E_INVALID, "sp_session_init: n_keep %d out of range [0, n_ctx %u)", p->n_keep, n_ctx);
    }
    if (p->n_discard < 0 || (uint32_t)p->n_discard > n_ctx - (uint32_t)p->n_keep) {
        return sp_err(SP_E_INVALID, "sp_session_init: n_discard %d out of range [0, n_ctx - n_keep = %u]",
                      p->n_discard, n_ctx - (uint32_t)p->n_keep);
    }
    *q = (struct sp_seq_params){
        .n_ctx = n_ctx,
        .n_batch = SP_MIN(p->n_batch ? (uint32_t)p->n_batch : 128u, n_ctx),
        .n_threads = p->n_threads ? p->n_threads : 1,
        .type_k = p->kv_type_k,
        .type_v = p->kv_type_v,
        .ctx_shift = p->ctx_shift,
        .n_keep = (uint32_t)p->n_keep,
        .n_discard = (uint32_t)p->n_discard,
    };
    return SP_OK;
}

/* Bytes a session of this shape allocates: its KV quota, and its scratch
 * and logits. */
static void session_bytes2(const struct sp_model *m, const struct sp_session_params *p, const struct sp_seq_params *q,
                           uint64_t *kv, uint64_t *scratch) {
    const struct sp_kv_geom g = sp_model_kv_geom(m, q->type_k, q->type_v);
    const uint64_t rows = p->logits_all ? q->n_batch : 1;
    *kv = sp_kv_seq_bytes(&g, q->n_ctx);
    *scratch = sp_seq_bytes(m, q) - *kv + rows * m->mf->hp.n_vocab * sizeof(float);
}

static uint64_t session_bytes(const struct sp_model *m, const struct sp_session_params *p,
                              const struct sp_seq_params *q) {
    uint64_t kv, scratch;
    session_bytes2(m, p, q, &kv, &scratch);
    return kv + scratch;
}

static uint64_t batch_bytes(const struct sp_model *m, uint32_t n_seq_max, uint32_t n_tokens, int n_threads);

/* Bytes the declared envelope's sessions (and batch) need: what a budget plans room for. */
static sp_status envelope_bytes(const struct sp_model *m, uint64_t *out) {
    struct sp_seq_params q;
    sp_status rc = session_shape(m, &m->envelope, &q);
    if (rc) return rc;
    *out = (uint64_t)m->envelope_n_seq * session_bytes(m, &m->envelope, &q);
    if (m->envelope_batch_tokens)
        *out += batch_bytes(m, m->envelope_n_seq, SP_MAX(m->envelope_batch_tokens, m->envelope_n_seq),
                            m->envelope.n_threads ? m->envelope.n_threads : 1);
    return SP_OK;
}

sp_status sp_session_init(struct sp_model *m, const struct sp_session_params *params, struct sp_session **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!m) return sp_err(SP_E_INVALID, "%s: model is NULL", __func__);
    if (m->vocab_only) return sp_err(SP_E_STATE, "%s: the model was loaded vocab-only; it cannot run", __func__);
    struct sp_session_params p = params ? *params : sp_session_default_params();
    const struct sp_hparams *hp = &m->mf->hp;
    struct sp_seq_params q;
    sp_status rc = session_shape(m, &p, &q);
    if (rc) return rc;
    const struct sp_kv_geom g = sp_model_kv_geom(m, q.type_k, q.type_v);
    if ((rc = sp_kv_geom_check(&g))) return rc;
    if (hp->n_ctx_train && q.n_ctx > hp->n_ctx_train) {
        SP_LOG_W("n_ctx %u is larger than the %u tokens the model was trained on: expect worse output past it", q.n_ctx,
                 hp->n_ctx_train);
    }
    /* With a memory budget the first session applies the plan made for the
     * model's envelope (and reads what stays resident); every session takes
     * its bytes from the model's account, or is refused with the numbers. */
    uint64_t env, kv_bytes, scratch_bytes;
    if ((rc = envelope_bytes(m, &env)) || (rc = sp_pager_apply(m->pager, env))) return rc;
    session_bytes2(m, &p, &q, &kv_bytes, &scratch_bytes);
    char what[96];
    snprintf(what, sizeof what, "a session's KV cache (%u tokens, %s/%s)", q.n_ctx, sp_kv_type_name(q.type_k),
             sp_kv_type_name(q.type_v));
    if ((rc = sp_budget_reserve(m->budget, SP_BUDGET_KV, kv_bytes, what))) return rc;
    if ((rc = sp_budget_reserve(m->budget, SP_BUDGET_SCRATCH, scratch_bytes, "a session's scratch and logits"))) {
        sp_budget_release(m->budget, SP_BUDGET_KV, kv_bytes);
        return rc;
    }
    struct sp_session *s = sp_calloc(1, sizeof(*s));
    if (!s) {
        sp_budget_release(m->budget, SP_BUDGET_KV, kv_bytes);
        sp_budget_release(m->budget, SP_BUDGET_SCRATCH, scratch_bytes);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    s->model = m;
    s->p = p;
    s->kv_reserved = kv_bytes;
    s->scratch_reserved = scratch_bytes;
    if ((rc = sp_sampler_init(&p.sampling, p.seed, (int32_t)hp->n_vocab, &s->sampler))) goto fail;
    if ((rc = sp_seq_init(m, &q, &s->seq))) goto fail;
    s->n_rows = p.logits_all ? q.n_batch : 1;
    s->logits = sp_malloc((size_t)s->n_rows * hp->n_vocab * sizeof(float));
    if (!s->logits) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    *out = s;
    return SP_OK;
fail:
    sp_session_free(s);
    return rc;
}

void sp_session_free(struct sp_session *s) {
    if (!s) return;
    if (s->gov) sp_gov_detach(s->gov, s);
    if (s->swap_path) {
        (void)unlink(s->swap_path);
        sp_free(s->swap_path);
    }
    sp_budget_release(s->model->budget, SP_BUDGET_KV, s->kv_reserved);
    sp_budget_release(s->model->budget, SP_BUDGET_SCRATCH, s->scratch_reserved);
    sp_sampler_free(s->sampler);
    sp_seq_free(s->seq);
    sp_free(s->logits);
    sp_free(s);
}

void sp_session_reset(struct sp_session *s) {
    if (!s) return;
    sp_decode_cancel(s);
    if (s->swap_path && swap_in(s, __func__) != SP_OK) return; /* stays swapped out; the message says why */
    sp_seq_reset(s->seq);
    s->n_logits = 0;
    sp_sampler_reset(s->sampler, s->p.seed);
    sp_moe_trace_clear(s->seq->fwd);
}

/* ---- the governor's knobs -------------------------------------------------- */

static void fwd_knobs(struct sp_fwd *f, const struct sp_gov_knobs *k) {
    sp_pool_set_active(f->pool, k->threads);
    f->n_expert_used = k->n_expert_used;
}

static void session_knobs(struct sp_session *s, const struct sp_gov_knobs *k) {
    fwd_knobs(s->seq->fwd, k);
    s->seq->chunk = k->chunk;
}

/* After each prompt pass: new knobs, then the pacing. */
static void gov_pass_done(void *user, uint32_t n, double work_s, bool last) {
    struct sp_session *s = user;
    if (!s->gov_prompt) return; /* a one-token decode: sp_decode reports it */
    struct sp_gov_knobs k;
    const double pace = sp_gov_prefill_pass(s->gov, n, work_s, last, &k);
    session_knobs(s, &k);
    if (pace > 0) {
        sp_pool_idle(s->seq->fwd->pool);
        sp_gov_sleep(pace);
        sp_gov_paced(s->gov, pace);
    }
}

sp_status sp_session_set_governor(struct sp_session *s, struct sp_governor *g) {
    if (!s) return sp_err(SP_E_INVALID, "%s: session is NULL", __func__);
    if (s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way", __func__);
    if (g == s->gov) return SP_OK;
    struct sp_fwd *f = s->seq->fwd;
    struct sp_gov_knobs k = {sp_pool_max_threads(f->pool), 0, 0};
    if (g) {
        sp_status rc = sp_gov_attach(g, s, sp_pool_max_threads(f->pool), s->model->mf->hp.n_experts_used,
                                     s->seq->p.n_batch, &k);
        if (rc) return rc;
    }
    if (s->gov) sp_gov_detach(s->gov, s);
    s->gov = g;
    session_knobs(s, &k);
    if (!g) s->seq->chunk = 0;
    s->seq->pass_done = g ? gov_pass_done : NULL;
    s->seq->pass_user = g ? s : NULL;
    return SP_OK;
}

static double api_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* sp_decode's checks: ids in the vocabulary, logits_all's limit. */
static sp_status decode_args(const struct sp_session *s, const int32_t *tokens, int32_t n, const char *fn) {
    if (!s || !tokens || n <= 0) return sp_err(SP_E_INVALID, "%s: need a session and n > 0 tokens", fn);
    if (s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way (sp_decode_step / sp_decode_cancel)", fn);
    const uint32_t n_vocab = s->model->mf->hp.n_vocab;
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= n_vocab) {
            return sp_err(SP_E_INVALID, "%s: token %d at index %d is outside the vocabulary (%u)", fn, tokens[i], i,
                          n_vocab);
        }
    }
    if (s->p.logits_all && (uint32_t)n > s->seq->p.n_batch) {
        return sp_err(SP_E_INVALID, "%s: %d tokens with logits_all: one call takes at most n_batch = %u", fn, n,
                      s->seq->p.n_batch);
    }
    return SP_OK;
}

sp_status sp_decode(struct sp_session *s, const int32_t *tokens, int32_t n) {
    if (!s || !tokens || n <= 0) return sp_err(SP_E_INVALID, "%s: need a session and n > 0 tokens", __func__);
    if (s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way (sp_decode_step / sp_decode_cancel)", __func__);
    const uint32_t n_vocab = s->model->mf->hp.n_vocab;
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= n_vocab) {
            return sp_err(SP_E_INVALID, "%s: token %d at index %d is outside the vocabulary (%u)", __func__,
                          tokens[i], i, n_vocab);
        }
    }
    if (s->p.logits_all && (uint32_t)n > s->seq->p.n_batch) {
        return sp_err(SP_E_INVALID, "%s: %d tokens with logits_all: one call takes at most n_batch = %u", __func__, n,
                      s->seq->p.n_batch);
    }
    sp_status rs = s->swap_path ? swap_in(s, __func__) : SP_OK;
    if (rs) return rs;
    sp_moe_trace_clear(s->seq->fwd);
    uint32_t done = 0;
    struct sp_gov_knobs k;
    double t0 = 0;
    if (s->gov) {
        if (n == 1) {
            sp_gov_token_begin(s->gov);
            t0 = api_mono_s();
        } else {
            sp_gov_prefill_begin(s->gov, (uint32_t)n, &k);
            session_knobs(s, &k);
        }
    }
    s->gov_prompt = s->gov && n > 1;
    const sp_status rc = sp_seq_decode(s->seq, tokens, (uint32_t)n, s->logits, s->p.logits_all, &done);
    s->gov_prompt = false;
    if (s->gov && n == 1) {
        const double pace = sp_gov_token_end(s->gov, api_mono_s() - t0, &k);
        session_knobs(s, &k);
        if (pace > 0 && rc == SP_OK) {
            sp_pool_idle(s->seq->fwd->pool);
            sp_gov_sleep(pace);
            sp_gov_paced(s->gov, pace);
        }
    }
    for (uint32_t j = 0; j < done; j++) sp_sampler_accept(s->sampler, tokens[j]);
    if (rc) {
        s->n_logits = 0;
        return rc;
    }
    s->n_last = (uint32_t)n;
    s->n_logits = s->p.logits_all ? (uint32_t)n : 1;
    return SP_OK;
}

/* ---- cooperative slices ---------------------------------------------------- */

sp_status sp_decode_begin(struct sp_session *s, const int32_t *tokens, int32_t n) {
    sp_status rc = decode_args(s, tokens, n, __func__);
    if (rc) return rc;
    if (s->swap_path && (rc = swap_in(s, __func__))) return rc;
    sp_moe_trace_clear(s->seq->fwd);
    if (s->gov) {
        struct sp_gov_knobs k;
        if (n == 1) sp_gov_token_begin(s->gov);
        else sp_gov_prefill_begin(s->gov, (uint32_t)n, &k), session_knobs(s, &k);
    }
    if ((rc = sp_seq_step_begin(s->seq, tokens, (uint32_t)n, s->logits, s->p.logits_all))) return rc;
    s->n_logits = 0;
    s->stepping = true;
    s->step_n = n;
    s->step_tokens = tokens;
    return SP_OK;
}

sp_status sp_decode_step(struct sp_session *s, double budget_ms, bool *done) {
    if (!s || !done) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    *done = false;
    if (!s->stepping) return sp_err(SP_E_STATE, "%s: no step decode under way (sp_decode_begin)", __func__);
    if (!(budget_ms > 0)) budget_ms = 10;
    const uint32_t before = s->seq->step.i;
    const double t0 = api_mono_s();
    uint32_t got = 0;
    const sp_status rc = sp_seq_step(s->seq, budget_ms * 1e-3, done, &got);
    sp_pool_idle(s->seq->fwd->pool); /* the threads sleep until the next step */
    for (uint32_t j = before; j < got; j++) sp_sampler_accept(s->sampler, s->step_tokens[j]);
    if (s->gov) {
        struct sp_gov_knobs k;
        /* the governor sees the work, not the caller's time between steps; no pacing here */
        if (s->step_n == 1) {
            if (*done || rc) sp_gov_token_end(s->gov, api_mono_s() - t0, &k), session_knobs(s, &k);
        } else if (got > before || *done) {
            sp_gov_prefill_pass(s->gov, got - before, api_mono_s() - t0, *done, &k);
            session_knobs(s, &k);
        }
    }
    if (rc || *done) {
        s->stepping = false;
        if (rc) return rc;
        s->n_last = (uint32_t)s->step_n;
        s->n_logits = s->p.logits_all ? (uint32_t)s->step_n : 1;
    }
    return SP_OK;
}

void sp_decode_cancel(struct sp_session *s) {
    if (!s || !s->stepping) return;
    /* the sampler has accepted the tokens of the finished passes (sp_decode_step) */
    sp_seq_step_cancel(s->seq);
    s->stepping = false;
    s->n_logits = 0;
}

const float *sp_get_logits(const struct sp_session *s) {
    return sp_get_logits_ith(s, -1);
}

const float *sp_get_logits_ith(const struct sp_session *s, int32_t i) {
    if (!s || s->n_logits == 0) return NULL;
    /* Row r of the buffer holds token (n - n_logits + r) of the last call. */
    const int64_t n = s->n_last, idx = i < 0 ? n + i : i;
    const int64_t row = idx - (n - (int64_t)s->n_logits);
    if (idx < 0 || idx >= n || row < 0) return NULL;
    return s->logits + (size_t)row * s->model->mf->hp.n_vocab;
}

sp_status sp_sample(struct sp_session *s, int32_t *out_token) {
    if (!s || !out_token) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    sp_status rs = s->swap_path ? swap_in(s, __func__) : SP_OK;
    if (rs) return rs;
    const float *logits = sp_get_logits(s);
    if (!logits) return sp_err(SP_E_STATE, "%s: no logits yet: decode a token first", __func__);
    *out_token = sp_sampler_sample(s->sampler, logits);
    return SP_OK;
}

sp_status sp_session_trace_routing(struct sp_session *s, bool on) {
    if (!s) return sp_err(SP_E_INVALID, "%s: NULL session", __func__);
    return sp_moe_trace_enable(s->model, s->seq->fwd, on);
}

bool sp_session_routing(const struct sp_session *s, uint32_t il, uint32_t pos, struct sp_moe_route *out) {
    return s && out && sp_moe_trace_get(s->seq->fwd, il, pos, out);
}

const struct sp_model *sp_session_model(const struct sp_session *s) {
    return s ? s->model : NULL;
}

int32_t sp_session_n_past(const struct sp_session *s) {
    return !s ? 0 : s->swap_path ? s->swap_n : (int32_t)sp_seq_n(s->seq);
}

int32_t sp_session_n_ctx(const struct sp_session *s) {
    return s ? (int32_t)s->seq->p.n_ctx : 0;
}

const int32_t *sp_session_tokens(const struct sp_session *s) {
    return s && !s->swap_path ? s->seq->cells.tok : NULL;
}

sp_status sp_session_truncate(struct sp_session *s, int32_t n) {
    if (s && s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way", __func__);
    if (!s) return sp_err(SP_E_INVALID, "%s: NULL session", __func__);
    sp_status rs = s->swap_path ? swap_in(s, __func__) : SP_OK;
    if (rs) return rs;
    const uint32_t held = sp_seq_n(s->seq);
    if (n < 0 || (uint32_t)n > held)
        return sp_err(SP_E_INVALID, "%s: cannot keep %d tokens of %u held", __func__, n, held);
    sp_seq_truncate(s->seq, (uint32_t)n);
    /* the penalty history is the tokens held, in order */
    sp_sampler_history_set(s->sampler, s->seq->cells.tok, (int32_t)n);
    s->n_logits = 0;
    return SP_OK;
}

sp_status sp_session_set_sampling(struct sp_session *s, const struct sp_sampling_params *p) {
    if (!s || !p) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    sp_status rs = s->swap_path ? swap_in(s, __func__) : SP_OK; /* the file holds the sampler's state */
    if (rs) return rs;
    sp_status rc = sp_sampler_set_params(s->sampler, p);
    if (!rc) s->p.sampling = *p;
    return rc;
}

void sp_session_set_seed(struct sp_session *s, uint64_t seed) {
    if (!s) return;
    if (s->swap_path && swap_in(s, __func__) != SP_OK) return;
    s->p.seed = seed;
    sp_sampler_seed(s->sampler, seed);
}

void sp_session_set_abort(struct sp_session *s, sp_abort_fn fn, void *user) {
    if (!s) return;
    s->seq->abort_fn = fn;
    s->seq->abort_user = user;
}

sp_status sp_session_kv_info(const struct sp_session *s, struct sp_kv_info *out) {
    if (!s || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    const struct sp_seq *q = s->seq;
    const struct sp_hparams *hp = &s->model->mf->hp;
    memset(out, 0, sizeof *out);
    out->type_k = q->p.type_k;
    out->type_v = q->p.type_v;
    out->n_ctx = (int32_t)q->p.n_ctx;
    out->pool_bytes = sp_kv_cache_bytes(q->kv);
    out->swapped = s->swap_path != NULL;
    if (s->swap_path) { /* in the swap file: the session holds no KV memory */
        out->n_cells = s->swap_n;
        return SP_OK;
    }
    out->n_cells = (int32_t)q->cells.n;
    out->bytes_stored = sp_seq_kv_bytes(q);
    out->values_stored = (uint64_t)q->cells.n * hp->n_layers * hp->n_kv_heads * (hp->head_dim_k + hp->head_dim_v);
    out->bits_per_value = out->values_stored ? (double)out->bytes_stored * 8.0 / (double)out->values_stored : 0.0;
    out->bytes_reserved = sp_kv_seq_bytes(&q->kv->g, q->p.n_ctx);
    out->n_discarded = (int64_t)q->n_discarded;
    out->n_shifts = (int32_t)q->n_shifts;
    out->next_pos = q->next_pos;
    return SP_OK;
}

uint64_t sp_session_memory_bytes(const struct sp_session *s) {
    if (!s) return 0;
    return sp_seq_bytes(s->model, &s->seq->p) + (uint64_t)s->n_rows * s->model->mf->hp.n_vocab * sizeof(float);
}

/* ---- batches --------------------------------------------------------------- */

struct sp_batch {
    struct sp_model *model;
    struct sp_fwd *fwd;        /* scratch for n_tokens rows, and the pool the batch runs on */
    uint32_t n_seq_max, n_tokens;
    int32_t *tok;              /* (n_tokens) the step's tokens, concatenated */
    uint32_t *n;               /* (n_seq_max) tokens per sequence */
    struct sp_seq **seqs;      /* (n_seq_max) */
    struct sp_fwd_seg *segs;   /* (n_seq_max) */
    float *logits;             /* (n_seq_max, n_vocab) */
    uint64_t reserved;         /* its share of the model's memory account */
    struct sp_governor *gov;   /* sp_batch_set_governor: each step is a token */
};

static uint64_t batch_bytes(const struct sp_model *m, uint32_t n_seq_max, uint32_t n_tokens, int n_threads) {
    return sp_fwd_bytes(m, n_tokens, n_threads) + (uint64_t)n_tokens * sizeof(int32_t) +
           (uint64_t)n_seq_max * (sizeof(uint32_t) + sizeof(struct sp_seq *) + sizeof(struct sp_fwd_seg) +
                                  (uint64_t)m->mf->hp.n_vocab * sizeof(float));
}

sp_status sp_batch_init(struct sp_model *m, int32_t n_seq_max, int32_t n_tokens, int32_t n_threads,
                        struct sp_batch **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!m) return sp_err(SP_E_INVALID, "%s: model is NULL", __func__);
    if (m->vocab_only) return sp_err(SP_E_STATE, "%s: the model was loaded vocab-only; it cannot run", __func__);
    if (n_seq_max < 1 || n_seq_max > 4096)
        return sp_err(SP_E_INVALID, "%s: n_seq_max %d out of range [1, 4096]", __func__, n_seq_max);
    if (n_tokens < 0 || n_tokens > 65536)
        return sp_err(SP_E_INVALID, "%s: n_tokens %d out of range [0, 65536]", __func__, n_tokens);
    if (n_threads < 0 || n_threads > 1024)
        return sp_err(SP_E_INVALID, "%s: n_threads %d out of range [0, 1024]", __func__, n_threads);
    const uint32_t nt = n_tokens ? (uint32_t)n_tokens : SP_MAX(128u, (uint32_t)n_seq_max);
    if (nt < (uint32_t)n_seq_max)
        return sp_err(SP_E_INVALID, "%s: n_tokens %u is fewer than n_seq_max %d (one token each)", __func__, nt,
                      n_seq_max);
    const int th = n_threads ? n_threads : 1;
    uint64_t env;
    sp_status rc;
    if ((rc = envelope_bytes(m, &env)) || (rc = sp_pager_apply(m->pager, env))) return rc;
    const uint64_t bytes = batch_bytes(m, (uint32_t)n_seq_max, nt, th);
    if ((rc = sp_budget_reserve(m->budget, SP_BUDGET_SCRATCH, bytes, "a batch's scratch and logits"))) return rc;
    struct sp_batch *b = sp_calloc(1, sizeof *b);
    if (!b) {
        sp_budget_release(m->budget, SP_BUDGET_SCRATCH, bytes);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    b->model = m;
    b->reserved = bytes;
    b->n_seq_max = (uint32_t)n_seq_max;
    b->n_tokens = nt;
    b->tok = sp_malloc(nt * sizeof *b->tok);
    b->n = sp_malloc(b->n_seq_max * sizeof *b->n);
    b->seqs = sp_malloc(b->n_seq_max * sizeof *b->seqs);
    b->segs = sp_malloc(b->n_seq_max * sizeof *b->segs);
    b->logits = sp_malloc((size_t)b->n_seq_max * m->mf->hp.n_vocab * sizeof(float));
    if (!b->tok || !b->n || !b->seqs || !b->segs || !b->logits) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    if ((rc = sp_fwd_init(m, 1, nt, th, &b->fwd))) goto fail;
    *out = b;
    return SP_OK;
fail:
    sp_batch_free(b);
    return rc;
}

sp_status sp_batch_set_governor(struct sp_batch *b, struct sp_governor *g) {
    if (!b) return sp_err(SP_E_INVALID, "%s: batch is NULL", __func__);
    if (g == b->gov) return SP_OK;
    struct sp_gov_knobs k = {sp_pool_max_threads(b->fwd->pool), 0, 0};
    if (g) {
        sp_status rc = sp_gov_attach(g, b, sp_pool_max_threads(b->fwd->pool), b->model->mf->hp.n_experts_used,
                                     b->n_tokens, &k);
        if (rc) return rc;
    }
    if (b->gov) sp_gov_detach(b->gov, b);
    b->gov = g;
    fwd_knobs(b->fwd, &k);
    return SP_OK;
}

void sp_batch_free(struct sp_batch *b) {
    if (!b) return;
    if (b->gov) sp_gov_detach(b->gov, b);
    sp_budget_release(b->model->budget, SP_BUDGET_SCRATCH, b->reserved);
    sp_fwd_free(b->fwd);
    sp_free(b->tok);
    sp_free(b->n);
    sp_free(b->seqs);
    sp_free(b->segs);
    sp_free(b->logits);
    sp_free(b);
}

int32_t sp_batch_n_tokens(const struct sp_batch *b) {
    return b ? (int32_t)b->n_tokens : 0;
}

sp_status sp_batch_decode(struct sp_batch *b, struct sp_session *const *sessions, const int32_t *const *tokens,
                          const int32_t *n_tokens, int32_t n_seq) {
    if (!b || !sessions || !tokens || !n_tokens)
        return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    if (n_seq < 1 || (uint32_t)n_seq > b->n_seq_max)
        return sp_err(SP_E_INVALID, "%s: %d sequences; the batch takes 1..%u", __func__, n_seq, b->n_seq_max);
    const uint32_t n_vocab = b->model->mf->hp.n_vocab;
    uint32_t total = 0;
    for (int32_t i = 0; i < n_seq; i++) {
        const struct sp_session *s = sessions[i];
        if (!s || !tokens[i] || n_tokens[i] <= 0)
            return sp_err(SP_E_INVALID, "%s: sequence %d: need a session and n > 0 tokens", __func__, i);
        if (s->model != b->model)
            return sp_err(SP_E_INVALID, "%s: sequence %d: the session is of another model", __func__, i);
        if (s->stepping)
            return sp_err(SP_E_STATE, "%s: sequence %d: a step decode is under way on the session", __func__, i);
        for (int32_t j = 0; j < i; j++)
            if (sessions[j] == s) return sp_err(SP_E_INVALID, "%s: sequences %d and %d are one session", __func__, j, i);
        if ((uint64_t)total + (uint32_t)n_tokens[i] > b->n_tokens)
            return sp_err(SP_E_INVALID, "%s: more than the batch's %u tokens in one step", __func__, b->n_tokens);
        for (int32_t k = 0; k < n_tokens[i]; k++) {
            const int32_t t = tokens[i][k];
            if (t < 0 || (uint32_t)t >= n_vocab)
                return sp_err(SP_E_INVALID, "%s: sequence %d: token %d at index %d is outside the vocabulary (%u)",
                              __func__, i, t, k, n_vocab);
            b->tok[total + (uint32_t)k] = t;
        }
        b->n[i] = (uint32_t)n_tokens[i];
        b->seqs[i] = s->seq;
        total += (uint32_t)n_tokens[i];
    }
    double t0 = 0;
    if (b->gov) {
        sp_gov_token_begin(b->gov);
        t0 = api_mono_s();
    }
    const sp_status rc = sp_seq_decode_batch(b->fwd, b->segs, b->seqs, b->tok, b->n, (uint32_t)n_seq, b->logits);
    if (b->gov) {
        struct sp_gov_knobs k;
        const double pace = sp_gov_token_end(b->gov, api_mono_s() - t0, &k);
        fwd_knobs(b->fwd, &k);
        if (pace > 0 && rc == SP_OK) {
            sp_pool_idle(b->fwd->pool);
            sp_gov_sleep(pace);
            sp_gov_paced(b->gov, pace);
        }
    }
    for (int32_t i = 0; i < n_seq; i++) {
        struct sp_session *s = sessions[i];
        if (rc) {
            s->n_logits = 0;
            continue;
        }
        sp_moe_trace_clear(s->seq->fwd);
        for (int32_t k = 0; k < n_tokens[i]; k++) sp_sampler_accept(s->sampler, tokens[i][k]);
        memcpy(s->logits, b->logits + (size_t)i * n_vocab, n_vocab * sizeof(float));
        s->n_last = (uint32_t)n_tokens[i];
        s->n_logits = 1;
    }
    return rc;
}

/* ---- saved sessions ------------------------------------------------------ */

/* What a saved session must match: the architecture, the hyper-parameters,
 * the tensor directory (names, types, shapes, sizes) and the bytes of the
 * output norm (tiny, always resident: two fine-tunes of one shape differ in
 * it).  SHA-256, computed once per model. */
static sp_status model_fingerprint(struct sp_model *m, uint8_t out[SP_SHA256_BYTES]) {
    pthread_mutex_lock(&m->kv_mu);
    sp_status rc = SP_OK;
    if (!m->has_fingerprint) {
        const struct sp_hparams *hp = &m->mf->hp;
        struct sp_sha256_ctx *c = NULL;
        if ((rc = sp_sha256_init(&c))) goto out;
        char buf[512];
        int n = snprintf(buf, sizeof buf, "sparrow-model-1 %s v%u e%u l%u h%u/%u d%u/%u ff%u x%u/%u/%u t%.9g s%.9g r%u%c e%.9g",
                         sp_arch_name(hp->arch), hp->n_vocab, hp->n_embd, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                         hp->head_dim_k, hp->head_dim_v, hp->n_ff, hp->n_experts, hp->n_experts_used, hp->n_ff_exp,
                         (double)hp->rope_theta, (double)hp->rope_freq_scale, hp->rope_dims,
                         hp->rope_neox ? 'n' : 'a', (double)hp->rms_eps);
        rc = sp_sha256_update(c, buf, (size_t)n);
        for (uint32_t i = 0; i < m->mf->n_tensors && !rc; i++) {
            const struct sp_tensor_desc *t = &m->mf->tensors[i];
            n = snprintf(buf, sizeof buf, "|%s %u %lld %lld %lld %lld %llu", t->name, t->type, (long long)t->ne[0],
                         (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (unsigned long long)t->size);
            rc = sp_sha256_update(c, buf, (size_t)n);
        }
        const void *w = NULL;
        if (!rc && (rc = sp_pager_pin(m->pager, m->output_norm, &w)) == SP_OK) {
            rc = sp_sha256_update(c, w, (size_t)m->output_norm->size);
            sp_pager_unpin(m->pager, m->output_norm, w);
        }
        if (!rc) {
            rc = sp_sha256_final(c, m->fingerprint);
            c = NULL;
        }
        sp_sha256_free(c);
        m->has_fingerprint = rc == SP_OK;
    }
    if (!rc) memcpy(out, m->fingerprint, SP_SHA256_BYTES);
out:
    pthread_mutex_unlock(&m->kv_mu);
    return rc;
}

/* Buffered writes to the temporary file, hashing as they go. */
struct save_out {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t n, cap;
    struct sp_sha256_ctx *hash;
    sp_status rc;
};

static void out_flush(struct save_out *o) {
    for (size_t done = 0; o->rc == SP_OK && done < o->n;) {
        const ssize_t w = write(o->fd, o->buf + done, o->n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            o->rc = sp_err(SP_E_IO, "sp_session_save: writing '%s' failed: %s", o->path, w < 0 ? strerror(errno) : "no progress");
            break;
        }
        done += (size_t)w;
    }
    o->n = 0;
}

static void out_put(struct save_out *o, const void *p, size_t n, bool hash) {
    if (o->rc) return;
    if (hash && (o->rc = sp_sha256_update(o->hash, p, n))) return;
    while (n > 0 && o->rc == SP_OK) {
        const size_t k = SP_MIN(n, o->cap - o->n);
        memcpy(o->buf + o->n, p, k);
        o->n += k;
        p = (const uint8_t *)p + k;
        n -= k;
        if (o->n == o->cap) out_flush(o);
    }
}

static void out_u32(struct save_out *o, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    out_put(o, b, 4, true);
}

sp_status sp_session_save(struct sp_session *s, const char *path) {
    if (s && s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way", __func__);
    if (s && s->swap_path) {
        sp_status rs = swap_in(s, __func__);
        if (rs) return rs;
    }
    if (!s || !path) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    struct sp_model *m = s->model;
    const struct sp_seq *q = s->seq;
    const struct sp_hparams *hp = &m->mf->hp;
    struct sp_session_file h = {0};
    sp_status rc = model_fingerprint(m, h.fingerprint);
    if (rc) return rc;
    h.n_ctx = q->p.n_ctx;
    h.type_k = q->p.type_k;
    h.type_v = q->p.type_v;
    h.n_layers = hp->n_layers;
    h.n_kv_heads = hp->n_kv_heads;
    h.hd_k = hp->head_dim_k;
    h.hd_v = hp->head_dim_v;
    h.n_cells = q->cells.n;
    h.next_pos = q->next_pos;
    h.n_discarded = q->n_discarded;
    h.n_shifts = q->n_shifts;
    sp_sampler_rng_get(s->sampler, h.rng);
    int32_t *hist = sp_malloc((size_t)SP_MAX(1, s->p.sampling.repeat_last_n) * sizeof *hist);
    struct save_out o = {.fd = -1, .path = path, .cap = 1 << 20};
    o.buf = sp_malloc(o.cap);
    char *tmp = NULL;
    if (!hist || !o.buf) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    const uint32_t n_hist = (uint32_t)sp_sampler_history(s->sampler, hist);
    if ((rc = sp_sha256_init(&o.hash))) goto done;
    if ((rc = sp_file_tmp_create(path, &tmp, &o.fd))) goto done;
    uint8_t hdr[SP_SESSION_HEADER_BYTES];
    sp_session_file_header(&h, hdr);
    out_put(&o, hdr, sizeof hdr, true);
    for (uint32_t i = 0; i < h.n_cells; i++) out_u32(&o, (uint32_t)q->cells.tok[i]);
    for (uint32_t i = 0; i < h.n_cells; i++) out_u32(&o, (uint32_t)q->cells.pos[i]);
    out_u32(&o, n_hist);
    for (uint32_t i = 0; i < n_hist; i++) out_u32(&o, (uint32_t)hist[i]);
    const float *logits = sp_get_logits(s);
    out_u32(&o, logits ? hp->n_vocab : 0);
    for (uint32_t v = 0; logits && v < hp->n_vocab; v++) {
        uint32_t bits;
        memcpy(&bits, &logits[v], 4);
        out_u32(&o, bits);
    }
    for (uint32_t i = 0; i < h.n_cells; i++) {
        for (uint32_t il = 0; il < hp->n_layers; il++) {
            for (uint32_t kh = 0; kh < hp->n_kv_heads; kh++) {
                out_put(&o, sp_kv_key_row(q->kv, q->cells.slot[i], il, kh), q->kv->rb_k, true);
                out_put(&o, sp_kv_value_row(q->kv, q->cells.slot[i], il, kh), q->kv->rb_v, true);
            }
        }
    }
    uint8_t digest[SP_SHA256_BYTES];
    if (!o.rc) {
        o.rc = sp_sha256_final(o.hash, digest);
        o.hash = NULL;
    }
    out_put(&o, digest, sizeof digest, false);
    if (!o.rc) out_flush(&o);
    if ((rc = o.rc)) goto done;
    rc = sp_file_tmp_commit(o.fd, tmp, path);
done:
    if (o.fd >= 0) close(o.fd);
    if (rc && tmp) unlink(tmp);
    sp_free(tmp);
    sp_sha256_free(o.hash);
    sp_free(o.buf);
    sp_free(hist);
    return rc;
}

static size_t session_row_bytes(uint32_t type, uint32_t hd, bool value) {
    if (type >= SP_KV_TYPE_COUNT) return 0;
    const enum sp_kv_type t = (enum sp_kv_type)type;
    return sp_kv_row_bytes(value ? sp_kv_value_rows(t) : t, (int32_t)hd);
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Read n u32s at off into out (a section of the session file). */
static sp_status read_u32s(struct sp_file *f, uint64_t off, uint32_t n, void *out) {
    sp_status rc = sp_file_read_at(f, off, out, (size_t)n * 4);
    if (rc) return rc;
    uint8_t *b = out;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t v = rd_u32(b + 4 * i);
        memcpy(b + 4 * i, &v, 4);
    }
    return SP_OK;
}

sp_status sp_session_load(struct sp_session *s, const char *path) {
    if (!s || !path) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    sp_status rs = s->swap_path ? swap_in(s, __func__) : SP_OK; /* a refused file leaves the session as it was */
    if (rs) return rs;
    struct sp_file *f = NULL;
    sp_status rc = sp_file_open(path, &f);
    if (!rc) rc = sp_session_load_from(s, f, true);
    sp_file_close(f);
    return rc;
}

sp_status sp_session_load_from(struct sp_session *s, struct sp_file *f, bool verify) {
    if (s && s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way", __func__);
    struct sp_model *m = s->model;
    struct sp_seq *q = s->seq;
    const struct sp_hparams *hp = &m->mf->hp;
    const char *path = sp_file_path(f);
    struct sp_session_file h;
    int32_t *tok = NULL, *pos = NULL, *hist = NULL;
    uint8_t fp[SP_SHA256_BYTES];
    sp_status rc = model_fingerprint(m, fp);
    if (rc || (rc = sp_session_file_parse(f, session_row_bytes, &h))) goto done;
    if (!sp_sha256_eq(h.fingerprint, fp)) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' was saved from another model (its fingerprint differs from this one's)",
                    "sp_session_load", path);
        goto done;
    }
    if (h.n_layers != hp->n_layers || h.n_kv_heads != hp->n_kv_heads || h.hd_k != hp->head_dim_k ||
        h.hd_v != hp->head_dim_v) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' has a KV geometry (%u layers, %u KV heads of %u/%u) unlike this model's",
                    "sp_session_load", path, h.n_layers, h.n_kv_heads, h.hd_k, h.hd_v);
        goto done;
    }
    if (h.type_k != (uint32_t)q->p.type_k || h.type_v != (uint32_t)q->p.type_v) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' holds a %s/%s KV cache; this session's is %s/%s (-ctk/-ctv)", "sp_session_load", path,
                    sp_kv_type_name((enum sp_kv_type)h.type_k), sp_kv_type_name((enum sp_kv_type)h.type_v),
                    sp_kv_type_name(q->p.type_k), sp_kv_type_name(q->p.type_v));
        goto done;
    }
    if (h.n_cells > q->p.n_ctx) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' holds %u tokens; this session's context is %u", "sp_session_load", path, h.n_cells,
                    q->p.n_ctx);
        goto done;
    }
    if (h.n_logits != 0 && h.n_logits != hp->n_vocab) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' holds %u logits for a vocabulary of %u", "sp_session_load", path, h.n_logits,
                    hp->n_vocab);
        goto done;
    }
    /* the whole file is checked before any of it is used */
    if (verify && (rc = sp_session_file_verify(f, &h))) goto done;
    tok = sp_malloc((size_t)SP_MAX(1u, h.n_cells) * 4);
    pos = sp_malloc((size_t)SP_MAX(1u, h.n_cells) * 4);
    hist = sp_malloc((size_t)SP_MAX(1u, h.n_hist) * 4);
    if (!tok || !pos || !hist) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", "sp_session_load");
        goto done;
    }
    if ((rc = read_u32s(f, h.tok_off, h.n_cells, tok)) || (rc = read_u32s(f, h.pos_off, h.n_cells, pos)) ||
        (rc = read_u32s(f, h.hist_off + 4, h.n_hist, hist)))
        goto done;
    for (uint32_t i = 0; i < h.n_cells; i++) {
        if (tok[i] < 0 || (uint32_t)tok[i] >= hp->n_vocab || (i > 0 && pos[i] <= pos[i - 1]) || pos[i] < 0 ||
            pos[i] >= h.next_pos) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': cell %u holds token %d at position %d, which is not valid here",
                        "sp_session_load", path, i, tok[i], pos[i]);
            goto done;
        }
    }
    for (uint32_t i = 0; i < h.n_hist; i++) {
        if (hist[i] < 0 || (uint32_t)hist[i] >= hp->n_vocab) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': penalty history token %d is outside the vocabulary", "sp_session_load", path,
                        hist[i]);
            goto done;
        }
    }
    /* from here on the session changes: nothing below can fail but a read */
    sp_session_reset(s);
    for (uint32_t i = 0; i < h.n_cells; i++) {
        if ((rc = sp_kv_cells_append(&q->cells, &tok[i], 1, pos[i]))) goto undo;
    }
    uint64_t off = h.kv_off;
    for (uint32_t i = 0; i < h.n_cells; i++) {
        for (uint32_t il = 0; il < hp->n_layers; il++) {
            for (uint32_t kh = 0; kh < hp->n_kv_heads; kh++) {
                if ((rc = sp_file_read_at(f, off, sp_kv_key_row(q->kv, q->cells.slot[i], il, kh), q->kv->rb_k)))
                    goto undo;
                off += q->kv->rb_k;
                if ((rc = sp_file_read_at(f, off, sp_kv_value_row(q->kv, q->cells.slot[i], il, kh), q->kv->rb_v)))
                    goto undo;
                off += q->kv->rb_v;
            }
        }
    }
    if (h.n_logits) {
        if ((rc = read_u32s(f, h.logits_off + 4, h.n_logits, s->logits))) goto undo;
        s->n_last = 1;
        s->n_logits = 1;
    }
    q->next_pos = h.next_pos;
    q->n_discarded = h.n_discarded;
    q->n_shifts = h.n_shifts;
    sp_sampler_rng_set(s->sampler, h.rng);
    sp_sampler_history_set(s->sampler, hist, (int32_t)h.n_hist);
    goto done;
undo:
    sp_session_reset(s);
done:
    sp_free(tok);
    sp_free(pos);
    sp_free(hist);
    return rc;
}

/* ---- swap ------------------------------------------------------------------ */

sp_status sp_session_swap_out(struct sp_session *s, const char *dir) {
    if (s && s->stepping) return sp_err(SP_E_STATE, "%s: a step decode is under way", __func__);
    if (!s || !dir || !*dir) return sp_err(SP_E_INVALID, "%s: need a session and a folder", __func__);
    if (s->swap_path) return SP_OK; /* already out */
    if (s->p.logits_all) {
        return sp_err(SP_E_STATE, "%s: a session with logits_all keeps a batch of logits rows: it cannot swap",
                      __func__);
    }
    static atomic_uint serial;
    const size_t n = strlen(dir) + 64;
    char *path = sp_malloc(n);
    if (!path) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    snprintf(path, n, "%s/sparrow-swap.%ld.%u.session", dir, (long)getpid(), atomic_fetch_add(&serial, 1));
    sp_status rc = sp_session_save(s, path);
    if (rc) {
        sp_free(path);
        return rc;
    }
    s->swap_n = (int32_t)sp_seq_n(s->seq);
    s->swap_path = path;
    sp_seq_kv_release(s->seq);
    sp_budget_release(s->model->budget, SP_BUDGET_KV, s->kv_reserved);
    s->kv_reserved = 0;
    SP_LOG_I("session swapped out: %d tokens to '%s'", (int)s->swap_n, path);
    return SP_OK;
}

/* Take the KV memory again and read the swap file back: the session goes on
 * bit for bit.  On failure it stays swapped out (SP_E_NOMEM: the account or
 * the storage had no room, the numbers in the message), or, when the file
 * cannot be read back, it is empty and resident (SP_E_IO / SP_E_FORMAT). */
static sp_status swap_in(struct sp_session *s, const char *fn) {
    struct sp_model *m = s->model;
    const struct sp_seq_params *q = &s->seq->p;
    const uint64_t kv_bytes = sp_kv_seq_bytes(&s->seq->kv->g, q->n_ctx);
    char what[96];
    snprintf(what, sizeof what, "a swapped-out session's KV cache (%u tokens, %s/%s)", q->n_ctx,
             sp_kv_type_name(q->type_k), sp_kv_type_name(q->type_v));
    sp_status rc = sp_budget_reserve(m->budget, SP_BUDGET_KV, kv_bytes, what);
    if (rc) return rc;
    if ((rc = sp_seq_kv_regain(s->seq))) {
        sp_budget_release(m->budget, SP_BUDGET_KV, kv_bytes);
        return rc;
    }
    s->kv_reserved = kv_bytes;
    char *path = s->swap_path;
    s->swap_path = NULL;
    /* the logits and the sampler never left: keep this session's rows */
    const uint32_t n_last = s->n_last, n_logits = s->n_logits;
    rc = sp_session_load(s, path);
    (void)unlink(path);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", sp_last_error());
        sp_session_reset(s);
        rc = sp_err(rc, "%s: reading the session back from its swap file failed (the session is empty now): %s", fn,
                    why);
    } else {
        s->n_last = n_last;
        s->n_logits = n_logits;
        SP_LOG_I("session swapped in: %d tokens from '%s'", (int)sp_seq_n(s->seq), path);
    }
    sp_free(path);
    return rc;
}

sp_status sp_session_swap_in(struct sp_session *s) {
    if (!s) return sp_err(SP_E_INVALID, "%s: NULL session", __func__);
    return s->swap_path ? swap_in(s, __func__) : SP_OK;
}

bool sp_session_swapped(const struct sp_session *s) {
    return s && s->swap_path;
}

/* ---- memory budget -------------------------------------------------------- */

sp_status sp_model_plan(struct sp_model *m, const struct sp_session_params *params, struct sp_plan_info *out) {
    if (!m || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    memset(out, 0, sizeof *out);
    if (m->vocab_only) return sp_err(SP_E_STATE, "%s: the model was loaded vocab-only", __func__);
    struct sp_session_params p = params ? *params : sp_session_default_params();
    struct sp_seq_params q;
    sp_status rc = session_shape(m, &p, &q);
    if (rc) return rc;
    const uint64_t sbytes = session_bytes(m, &p, &q);
    struct sp_plan pl;
    if ((rc = sp_pager_make_plan(m->pager, sbytes, &pl))) return rc;
    out->resident = pl.resident;
    out->session_bytes = sbytes;
    out->pinned_bytes = pl.pinned_bytes;
    out->ring_bytes = (uint64_t)pl.ring_slots * pl.ring_slot_bytes;
    out->expert_cache_bytes = (uint64_t)pl.expert_slots * pl.expert_slot_bytes;
    out->row_bytes = (uint64_t)pl.row_slots * pl.row_slot_bytes;
    out->overhead_bytes = pl.overhead_bytes;
    out->total_bytes = pl.total_bytes;
    out->base_bytes = pl.base_bytes;
    out->min_budget = pl.min_budget;
    out->ring_slots = pl.ring_slots;
    out->expert_slots = pl.expert_slots;
    out->expert_units = pl.expert_units;
    static_assert((int)SP_WCLASS_COUNT == (int)SP_TC_COUNT, "weight classes differ");
    for (int k = 0; k < SP_WCLASS_COUNT; k++) {
        out->class_bytes[k] = pl.class_bytes[k];
        out->class_pinned[k] = pl.class_pinned[k];
    }
    out->read_bps = sp_pager_read_bps(m->pager);
    out->mem_bps = sp_pager_mem_bps(m->pager);
    out->touched_bytes_per_token = pl.touched_bytes;
    out->read_bytes_per_token = pl.read_bytes;
    out->expert_hit_rate = pl.expert_hit_rate;
    out->predicted_tps = pl.predicted_tps;
    sp_plan_free(&pl);
    out->budget = sp_pager_budget(m->pager);
    return SP_OK;
}

sp_status sp_model_get_mem_stats(const struct sp_model *m, struct sp_mem_stats *out) {
    if (!m || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    memset(out, 0, sizeof *out);
    struct sp_budget_stats bs;
    sp_budget_get(m->budget, &bs);
    out->account_limit = bs.limit;
    out->account_used = bs.used;
    out->account_peak = bs.peak;
    out->account_weights = bs.owner[SP_BUDGET_WEIGHTS];
    out->account_kv = bs.owner[SP_BUDGET_KV];
    out->account_scratch = bs.owner[SP_BUDGET_SCRATCH];
    out->account_base = bs.owner[SP_BUDGET_BASE];
    if (!m->pager) return SP_OK;
    struct sp_pager_stats st;
    sp_pager_get_stats(m->pager, &st);
    out->budgeted = st.budgeted;
    out->resident_weight_bytes = st.mapped_bytes;
    out->bytes_read = st.bytes_read;
    out->pins = st.pins;
    out->hits = st.hits;
    out->misses = st.misses;
    out->waits = st.waits;
    out->expert_pins = st.expert_pins;
    out->expert_hits = st.expert_hits;
    out->prefetch_issued = st.prefetch_issued;
    out->prefetch_used = st.prefetch_used;
    out->wait_s = st.wait_s;
    return SP_OK;
}
