/*
 * model_file.c -- opens a model file (GGUF or llama2.c) and hands the rest of
 * the engine plain structs: hyper-parameters, vocabulary, tensor directory
 * and metadata (model_file.h).  For GGUF it maps the `<arch>.*` and
 * `tokenizer.ggml.*` keys to those structs with llama.cpp's defaults, and
 * checks types and ranges of every key it reads.
 *
 * It is not a model: it computes nothing from weights, reads no tensor data
 * and keeps no file open.  Byte-level parsing lives in gguf.c and llama2c.c.
 */
#include "model_file.h"

#include "core/file.h"
#include "gguf.h"
#include "quant/native.h"
#include "llama2c.h"
#include "pack.h"

#include <math.h>
#include <stdio.h>

#define META_MAX_DEPTH 8

static const char *const arch_names[SP_ARCH_COUNT] = {
    [SP_ARCH_LLAMA] = "llama",
    [SP_ARCH_QWEN2] = "qwen2",
    [SP_ARCH_QWEN3] = "qwen3",
    [SP_ARCH_QWEN3MOE] = "qwen3moe",
};

static const char *const meta_type_names[SP_META_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* "llama", "qwen2", "qwen3", "qwen3moe"; "unknown" for ids out of range. */
const char *sp_arch_name(enum sp_arch a) {
    return (unsigned)a < SP_ARCH_COUNT ? arch_names[a] : "unknown";
}

static const char *type_name(const struct sp_meta_value *v) {
    return (unsigned)v->type < SP_META_TYPE_COUNT ? meta_type_names[v->type] : "invalid";
}

/* ---- metadata values --------------------------------------------------- */

/* Free what v owns and zero it.  Safe on zeroed and partially read values
 * (arrays whose trailing items are still zero). */
void sp_meta_value_clear(struct sp_meta_value *v) {
    if (!v) return;
    if (v->type == SP_META_STRING) {
        sp_free(v->v.str.ptr);
    } else if (v->type == SP_META_ARRAY && v->v.arr.items) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) sp_meta_value_clear(&v->v.arr.items[i]);
        sp_free(v->v.arr.items);
    }
    memset(v, 0, sizeof(*v));
}

static sp_status copy_value(struct sp_meta_value *dst, const struct sp_meta_value *src, int depth) {
    memset(dst, 0, sizeof(*dst));
    if ((unsigned)src->type >= SP_META_TYPE_COUNT) {
        return sp_err(SP_E_INVALID, "sp_meta_value_copy: unknown value type %d", (int)src->type);
    }
    if (src->type == SP_META_STRING) {
        if (src->v.str.len >= SIZE_MAX || (src->v.str.len && !src->v.str.ptr)) {
            return sp_err(SP_E_INVALID, "sp_meta_value_copy: malformed string");
        }
        char *s = sp_malloc((size_t)src->v.str.len + 1);
        if (!s) return sp_err(SP_E_NOMEM, "sp_meta_value_copy: out of memory");
        if (src->v.str.len) memcpy(s, src->v.str.ptr, (size_t)src->v.str.len);
        s[src->v.str.len] = '\0';
        dst->type = SP_META_STRING;
        dst->v.str.ptr = s;
        dst->v.str.len = src->v.str.len;
        return SP_OK;
    }
    if (src->type != SP_META_ARRAY) {
        *dst = *src;
        return SP_OK;
    }
    if (depth >= META_MAX_DEPTH) return sp_err(SP_E_INVALID, "sp_meta_value_copy: arrays nested deeper than %d", META_MAX_DEPTH);
    if ((src->v.arr.n && !src->v.arr.items) || (unsigned)src->v.arr.elem_type >= SP_META_TYPE_COUNT) {
        return sp_err(SP_E_INVALID, "sp_meta_value_copy: malformed array");
    }
    dst->type = SP_META_ARRAY;
    dst->v.arr.elem_type = src->v.arr.elem_type;
    if (src->v.arr.n == 0) return SP_OK;
    if (src->v.arr.n > SIZE_MAX / sizeof(struct sp_meta_value)) return sp_err(SP_E_NOMEM, "sp_meta_value_copy: array too large");
    dst->v.arr.items = sp_calloc((size_t)src->v.arr.n, sizeof(struct sp_meta_value));
    if (!dst->v.arr.items) return sp_err(SP_E_NOMEM, "sp_meta_value_copy: out of memory");
    dst->v.arr.n = src->v.arr.n;
    for (uint64_t i = 0; i < src->v.arr.n; i++) {
        sp_status rc = copy_value(&dst->v.arr.items[i], &src->v.arr.items[i], depth + 1);
        if (rc) {
            sp_meta_value_clear(dst);
            return rc;
        }
    }
    return SP_OK;
}

/* Deep copy src into *dst; see model_file.h. */
sp_status sp_meta_value_copy(struct sp_meta_value *dst, const struct sp_meta_value *src) {
    if (!dst || !src) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    return copy_value(dst, src, 0);
}

/* ---- lookups ------------------------------------------------------------ */

/* The tensor named name, or NULL.  Linear: directories hold hundreds of
 * tensors and lookups happen once, when weights are bound. */
const struct sp_tensor_desc *sp_model_file_find(const struct sp_model_file *mf, const char *name) {
    if (!mf || !name) return NULL;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    }
    return NULL;
}

/* The value of metadata key, or NULL.  Owned by mf. */
const struct sp_meta_value *sp_model_file_meta(const struct sp_model_file *mf, const char *key) {
    if (!mf || !key) return NULL;
    for (uint64_t i = 0; i < mf->n_meta; i++) {
        if (strcmp(mf->meta[i].key, key) == 0) return &mf->meta[i].value;
    }
    return NULL;
}

bool sp_model_file_layout_key(const char *key) {
    return !strcmp(key, "general.alignment") || !strcmp(key, "sparrow.requires") || !strcmp(key, "sparrow.layout");
}

#define FN "sp_model_file_open" /* what messages from the static helpers below name */

/* ---- typed key access ---------------------------------------------------
 * Files in the wild store integers under any integer type, so every integer
 * reader accepts u8..i64 and range-checks; any other type is SP_E_FORMAT
 * naming the key. */

static bool is_int_type(enum sp_meta_type t) {
    return t <= SP_META_I32 || t == SP_META_U64 || t == SP_META_I64;
}

static bool is_signed_type(enum sp_meta_type t) {
    return t == SP_META_I8 || t == SP_META_I16 || t == SP_META_I32 || t == SP_META_I64;
}

/* An integer scalar as int64, with *too_big set for u64 values > INT64_MAX. */
static int64_t int_of(const struct sp_meta_value *v, bool *too_big) {
    *too_big = false;
    if (is_signed_type(v->type)) return v->v.i64;
    if (v->v.u64 > (uint64_t)INT64_MAX) {
        *too_big = true;
        return INT64_MAX;
    }
    return (int64_t)v->v.u64;
}

/* Read integer key into *out when present (*found says whether it was).
 * per_layer: an array of integers with one value per layer is accepted when
 * all values are equal (Sparrow has no per-layer head counts).  Values
 * outside [lo, hi] are SP_E_FORMAT. */
static sp_status get_int(const struct sp_model_file *mf, const char *key, bool per_layer, int64_t lo, int64_t hi,
                         int64_t *out, bool *found) {
    const struct sp_meta_value *v = sp_model_file_meta(mf, key);
    *found = false;
    if (!v) return SP_OK;
    bool too_big;
    int64_t x;
    if (is_int_type(v->type)) {
        x = int_of(v, &too_big);
    } else if (per_layer && v->type == SP_META_ARRAY && is_int_type(v->v.arr.elem_type) && v->v.arr.n > 0) {
        x = int_of(&v->v.arr.items[0], &too_big);
        for (uint64_t i = 1; i < v->v.arr.n; i++) {
            bool tb;
            const int64_t y = int_of(&v->v.arr.items[i], &tb);
            if (y != x || tb != too_big) {
                return sp_err(SP_E_UNSUPPORTED, "%s: '%s': key '%s' has per-layer values that differ (%lld for layer 0, %lld for layer %llu)",
                              FN, mf->path, key, (long long)x, (long long)y, (unsigned long long)i);
            }
        }
    } else {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has type %s, expected an integer", FN, mf->path, key, type_name(v));
    }
    if (too_big || x < lo || x > hi) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' = %s%lld is out of range [%lld, %lld]", FN, mf->path, key,
                      too_big ? ">" : "", (long long)x, (long long)lo, (long long)hi);
    }
    *out = x;
    *found = true;
    return SP_OK;
}

/* A u32 key; required: absence is SP_E_FORMAT naming the key.  *out keeps
 * its value when the key is absent. */
static sp_status get_u32(const struct sp_model_file *mf, const char *key, bool required, bool per_layer, uint32_t *out) {
    int64_t x;
    bool found;
    sp_status rc = get_int(mf, key, per_layer, 0, UINT32_MAX, &x, &found);
    if (rc) return rc;
    if (!found) {
        if (required) return sp_err(SP_E_FORMAT, "%s: '%s': missing required key '%s'", FN, mf->path, key);
        return SP_OK;
    }
    *out = (uint32_t)x;
    return SP_OK;
}

/* A finite float key (f32 or f64; integers are accepted too). */
static sp_status get_f32(const struct sp_model_file *mf, const char *key, bool required, float *out) {
    const struct sp_meta_value *v = sp_model_file_meta(mf, key);
    if (!v) {
        if (required) return sp_err(SP_E_FORMAT, "%s: '%s': missing required key '%s'", FN, mf->path, key);
        return SP_OK;
    }
    double x;
    bool too_big;
    if (v->type == SP_META_F32 || v->type == SP_META_F64) {
        x = v->v.f64;
    } else if (is_int_type(v->type)) {
        x = (double)int_of(v, &too_big);
    } else {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has type %s, expected a float", FN, mf->path, key, type_name(v));
    }
    if (!isfinite(x) || fabs(x) > 3.4e38) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' = %g is not a finite float", FN, mf->path, key, x);
    }
    *out = (float)x;
    return SP_OK;
}

static sp_status get_bool(const struct sp_model_file *mf, const char *key, bool *out) {
    const struct sp_meta_value *v = sp_model_file_meta(mf, key);
    if (!v) return SP_OK;
    if (v->type != SP_META_BOOL) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has type %s, expected bool", FN, mf->path, key, type_name(v));
    }
    *out = v->v.u64 != 0;
    return SP_OK;
}

/* A string key; *out borrows mf's copy (NULL when absent). */
static sp_status get_str(const struct sp_model_file *mf, const char *key, const char **out) {
    const struct sp_meta_value *v = sp_model_file_meta(mf, key);
    *out = NULL;
    if (!v) return SP_OK;
    if (v->type != SP_META_STRING) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has type %s, expected string", FN, mf->path, key, type_name(v));
    }
    *out = v->v.str.ptr;
    return SP_OK;
}

/* An array key whose elements must have one of the given types; *out is
 * NULL when absent.  n_expect (when nonzero) is the required length. */
static sp_status get_arr(const struct sp_model_file *mf, const char *key, const enum sp_meta_type *types, int n_types,
                         uint64_t n_expect, const struct sp_meta_value **out) {
    const struct sp_meta_value *v = sp_model_file_meta(mf, key);
    *out = NULL;
    if (!v) return SP_OK;
    bool ok = v->type == SP_META_ARRAY;
    if (ok) {
        ok = false;
        for (int i = 0; i < n_types; i++) ok |= v->v.arr.elem_type == types[i];
    }
    if (!ok) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has type %s%s%s, expected an array of %s", FN, mf->path, key,
                      type_name(v), v->type == SP_META_ARRAY ? " of " : "",
                      v->type == SP_META_ARRAY ? meta_type_names[v->v.arr.elem_type % SP_META_TYPE_COUNT] : "",
                      meta_type_names[types[0]]);
    }
    if (n_expect && v->v.arr.n != n_expect) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' has %llu values, expected %llu (one per token)", FN, mf->path, key,
                      (unsigned long long)v->v.arr.n, (unsigned long long)n_expect);
    }
    *out = v;
    return SP_OK;
}

/* ---- hyper-parameters ------------------------------------------------- */

/* Fill mf->hp from the `<arch>.` keys with llama.cpp's defaults.  Missing or
 * unknown general.architecture is fine for vocab_only (has_hparams = false). */
static sp_status read_hparams(struct sp_model_file *mf, bool vocab_only) {
    struct sp_hparams *hp = &mf->hp;
    const char *arch;
    char key[128];
    sp_status rc;
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)

    if ((rc = get_str(mf, "general.architecture", &arch))) return rc;
    if (!arch) {
        if (vocab_only) return SP_OK;
        return sp_err(SP_E_FORMAT, "%s: '%s': missing required key 'general.architecture'", FN, mf->path);
    }
    int a = 0;
    while (a < SP_ARCH_COUNT && strcmp(arch, arch_names[a]) != 0) a++;
    if (a == SP_ARCH_COUNT) {
        if (vocab_only) return SP_OK;
        return sp_err(SP_E_UNSUPPORTED, "%s: '%s': key 'general.architecture' = '%.64s' is not a supported architecture (llama, qwen2, qwen3, qwen3moe)",
                      FN, mf->path, arch);
    }
    memset(hp, 0, sizeof(*hp));
    hp->arch = (enum sp_arch)a;
    hp->rope_neox = hp->arch != SP_ARCH_LLAMA;
    hp->rope_theta = 10000.0f;
    hp->rope_freq_scale = 1.0f;

    if ((rc = get_u32(mf, K("context_length"), true, false, &hp->n_ctx_train)) ||
        (rc = get_u32(mf, K("embedding_length"), true, false, &hp->n_embd)) ||
        (rc = get_u32(mf, K("block_count"), true, false, &hp->n_layers)) ||
        (rc = get_u32(mf, K("feed_forward_length"), hp->arch != SP_ARCH_QWEN3MOE, true, &hp->n_ff)) ||
        (rc = get_u32(mf, K("attention.head_count"), true, true, &hp->n_heads)) ||
        (rc = get_u32(mf, K("expert_count"), hp->arch == SP_ARCH_QWEN3MOE, false, &hp->n_experts)) ||
        (rc = get_u32(mf, K("expert_used_count"), hp->arch == SP_ARCH_QWEN3MOE, false, &hp->n_experts_used)) ||
        (rc = get_u32(mf, K("expert_feed_forward_length"), false, false, &hp->n_ff_exp)) ||
        (rc = get_f32(mf, K("attention.layer_norm_rms_epsilon"), true, &hp->rms_eps)) ||
        (rc = get_f32(mf, K("rope.freq_base"), false, &hp->rope_theta))) {
        return rc;
    }
    if (hp->n_heads == 0) return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' is 0", FN, mf->path, K("attention.head_count"));
    hp->n_kv_heads = hp->n_heads;
    if ((rc = get_u32(mf, K("attention.head_count_kv"), false, true, &hp->n_kv_heads))) return rc;
    if (hp->n_embd % hp->n_heads == 0) hp->head_dim_k = hp->head_dim_v = hp->n_embd / hp->n_heads;
    if ((rc = get_u32(mf, K("attention.key_length"), false, false, &hp->head_dim_k)) ||
        (rc = get_u32(mf, K("attention.value_length"), false, false, &hp->head_dim_v))) {
        return rc;
    }
    hp->rope_dims = hp->head_dim_k;
    if ((rc = get_u32(mf, K("rope.dimension_count"), false, false, &hp->rope_dims))) return rc;

    /* RoPE scaling: none or linear (factor f -> positions scaled by 1/f).
     * As in llama.cpp the factor applies whatever the type says. */
    const char *scaling;
    if ((rc = get_str(mf, K("rope.scaling.type"), &scaling))) return rc;
    if (scaling && strcmp(scaling, "none") != 0 && strcmp(scaling, "linear") != 0) {
        return sp_err(SP_E_UNSUPPORTED, "%s: '%s': key '%s' = '%.64s': only linear RoPE scaling is supported", FN, mf->path, key,
                      scaling);
    }
    float factor = 0.0f;
    if ((rc = get_f32(mf, K("rope.scaling.factor"), false, &factor))) return rc;
    if (!sp_model_file_meta(mf, key) && (rc = get_f32(mf, K("rope.scale_linear"), false, &factor))) return rc;
    if (factor < 0.0f) return sp_err(SP_E_FORMAT, "%s: '%s': RoPE scaling factor %g is negative", FN, mf->path, factor);
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;

    /* qwen3moe experts default to feed_forward_length / expert_used_count, as llama.cpp.  The Mixtral
     * layout (llama with experts) has no key of its own: each expert is a feed_forward_length FFN. */
    if (hp->arch == SP_ARCH_QWEN3MOE && hp->n_ff_exp == 0 && hp->n_experts_used) hp->n_ff_exp = hp->n_ff / hp->n_experts_used;
    if (hp->arch == SP_ARCH_LLAMA && hp->n_experts > 0) hp->n_ff_exp = hp->n_ff;
    /* Both MoE architectures gate with a softmax over all experts and renormalize the top-k weights
     * (Mixtral; Qwen3-MoE's norm_topk_prob).  No GGUF key says so: llama.cpp hard-codes it too. */
    hp->expert_weights_norm = hp->n_experts > 0;

    /* Consistency, so that later layers can size buffers from these. */
    const char *bad = NULL;
    if (hp->n_ctx_train == 0) bad = "context_length is 0";
    else if (hp->n_ctx_train > SP_MAX_CTX_TRAIN) bad = "context_length is absurd (more than 16777216 positions)";
    else if (hp->n_embd == 0) bad = "embedding_length is 0";
    else if (hp->n_layers == 0) bad = "block_count is 0";
    else if (hp->n_kv_heads == 0 || hp->n_heads % hp->n_kv_heads != 0) bad = "attention.head_count is not a multiple of attention.head_count_kv";
    else if (hp->head_dim_k == 0 || hp->head_dim_v == 0) bad = "no head size: embedding_length is not a multiple of attention.head_count and attention.key_length/value_length are absent";
    else if (hp->rope_dims > hp->head_dim_k || hp->rope_dims % 2 != 0) bad = "rope.dimension_count is odd or larger than the head size";
    else if (hp->arch == SP_ARCH_LLAMA && hp->rope_dims != hp->head_dim_k) bad = "rope.dimension_count differs from the head size (llama rotates whole heads)";
    else if (hp->n_experts_used > hp->n_experts) bad = "expert_used_count exceeds expert_count";
    else if (hp->n_experts > 0 && hp->n_experts_used == 0) bad = "expert_used_count is 0 while expert_count is not";
    else if (hp->n_experts == 0 && hp->n_ff == 0) bad = "feed_forward_length is 0";
    else if (hp->n_experts > 0 && hp->n_ff_exp == 0) bad = "expert_feed_forward_length (feed_forward_length for llama) is 0";
    else if (!(hp->rms_eps > 0.0f)) bad = "attention.layer_norm_rms_epsilon is not positive";
    else if (!(hp->rope_theta > 0.0f)) bad = "rope.freq_base is not positive";
    if (bad) return sp_err(SP_E_FORMAT, "%s: '%s': inconsistent %s hyper-parameters: %s", FN, mf->path, arch, bad);
    mf->has_hparams = true;
    return SP_OK;
#undef K
}

/* ---- vocabulary --------------------------------------------------------- */

/* Copy a GGUF string that must not contain NUL (token or merge text). */
static sp_status copy_token(const struct sp_model_file *mf, const char *key, uint64_t i, const struct sp_meta_value *v,
                            char **out, uint32_t *len) {
    if (v->v.str.len > UINT32_MAX || memchr(v->v.str.ptr, '\0', (size_t)v->v.str.len)) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key '%s' value %llu contains a NUL byte or is too long", FN, mf->path, key,
                      (unsigned long long)i);
    }
    if (!(*out = sp_strndup(v->v.str.ptr, (size_t)v->v.str.len))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
    if (len) *len = (uint32_t)v->v.str.len;
    return SP_OK;
}

/* A special-token id: present and in range replaces *id; -1 / 0xFFFFFFFF
 * (how converters write "none") is ignored; other out-of-range ids are
 * ignored with a warning, keeping the default (as llama.cpp does). */
static sp_status get_token_id(const struct sp_model_file *mf, const char *key, uint32_t n_tokens, int32_t *id) {
    int64_t x;
    bool found;
    sp_status rc = get_int(mf, key, false, INT64_MIN, INT64_MAX, &x, &found);
    if (rc || !found) return rc;
    if (x == -1 || x == UINT32_MAX) return SP_OK;
    if (x < 0 || x >= (int64_t)n_tokens) {
        SP_LOG_W("%s: '%s': key '%s' = %lld is not a token id (vocabulary of %u), using %d", FN, mf->path, key,
                 (long long)x, n_tokens, *id);
        return SP_OK;
    }
    *id = (int32_t)x;
    return SP_OK;
}

/* BPE pre-tokenizers for which llama.cpp adds BOS by default. */
static bool bpe_pre_adds_bos(const char *pre) {
    static const char *const names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                        "midm-2.0", "lfm2", "tekken", "chameleon"};
    for (size_t i = 0; i < SP_ARRAY_LEN(names); i++) {
        if (strcmp(pre, names[i]) == 0) return true;
    }
    return false;
}

/* Fill mf->vocab from tokenizer.ggml.*.  No tokenizer.ggml.model (or
 * "none"/"no_vocab") leaves SP_VOCAB_NONE, which vocab_only refuses. */
static sp_status read_vocab(struct sp_model_file *mf, bool vocab_only) {
    struct sp_vocab_data *vd = &mf->vocab;
    const char *model, *pre;
    sp_status rc;
    vd->bos = vd->eos = vd->unk = vd->pad = vd->eot = -1;
    if ((rc = get_str(mf, "tokenizer.ggml.model", &model)) || (rc = get_str(mf, "tokenizer.ggml.pre", &pre))) return rc;
    if (!model || strcmp(model, "none") == 0 || strcmp(model, "no_vocab") == 0) {
        if (vocab_only) {
            return sp_err(SP_E_FORMAT, "%s: '%s': no vocabulary (key 'tokenizer.ggml.model' is %s)", FN, mf->path,
                          model ? model : "absent");
        }
        vd->kind = SP_VOCAB_NONE;
        return (vd->pre = sp_strdup("")) ? SP_OK : sp_err(SP_E_NOMEM, "%s: out of memory", FN);
    }
    if (strcmp(model, "llama") == 0) {
        vd->kind = SP_VOCAB_SPM;
        vd->bos = 1, vd->eos = 2, vd->unk = 0;
        vd->add_bos = true;
        vd->add_space_prefix = true;
        if (!pre) pre = "";
    } else if (strcmp(model, "gpt2") == 0) {
        vd->kind = SP_VOCAB_BPE;
        vd->bos = 11, vd->eos = 11; /* llama.cpp's BPE defaults */
        if (!pre) pre = "default";
        vd->add_bos = bpe_pre_adds_bos(pre);
        vd->add_space_prefix = false;
    } else {
        return sp_err(SP_E_UNSUPPORTED, "%s: '%s': key 'tokenizer.ggml.model' = '%.64s' is not a supported tokenizer (llama, gpt2)",
                      FN, mf->path, model);
    }
    if (!(vd->pre = sp_strdup(pre))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);

    static const enum sp_meta_type str_t[] = {SP_META_STRING};
    static const enum sp_meta_type float_t[] = {SP_META_F32, SP_META_F64};
    static const enum sp_meta_type int_t[] = {SP_META_I32, SP_META_U32, SP_META_I8, SP_META_U8, SP_META_I16,
                                              SP_META_U16, SP_META_I64, SP_META_U64};
    const struct sp_meta_value *tokens, *scores, *types, *merges;
    if ((rc = get_arr(mf, "tokenizer.ggml.tokens", str_t, 1, 0, &tokens))) return rc;
    if (!tokens || tokens->v.arr.n == 0) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key 'tokenizer.ggml.tokens' is %s", FN, mf->path, tokens ? "empty" : "missing");
    }
    if (tokens->v.arr.n > INT32_MAX) {
        return sp_err(SP_E_FORMAT, "%s: '%s': key 'tokenizer.ggml.tokens' has %llu tokens, more than token ids can number",
                      FN, mf->path, (unsigned long long)tokens->v.arr.n);
    }
    const uint32_t n = (uint32_t)tokens->v.arr.n;
    if ((rc = get_arr(mf, "tokenizer.ggml.scores", float_t, 2, n, &scores)) ||
        (rc = get_arr(mf, "tokenizer.ggml.token_type", int_t, (int)SP_ARRAY_LEN(int_t), n, &types)) ||
        (rc = get_arr(mf, "tokenizer.ggml.merges", str_t, 1, 0, &merges))) {
        return rc;
    }
    vd->tokens = sp_calloc(n, sizeof(*vd->tokens));
    vd->token_len = sp_calloc(n, sizeof(*vd->token_len));
    if (!vd->tokens || !vd->token_len) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
    for (uint32_t i = 0; i < n; i++) {
        if ((rc = copy_token(mf, "tokenizer.ggml.tokens", i, &tokens->v.arr.items[i], &vd->tokens[i], &vd->token_len[i]))) return rc;
        vd->n_tokens = i + 1;
    }
    if (scores) {
        if (!(vd->scores = sp_calloc(n, sizeof(*vd->scores)))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
        for (uint32_t i = 0; i < n; i++) vd->scores[i] = (float)scores->v.arr.items[i].v.f64;
    }
    if (types) {
        if (!(vd->types = sp_calloc(n, sizeof(*vd->types)))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
        for (uint32_t i = 0; i < n; i++) {
            bool too_big;
            const int64_t t = int_of(&types->v.arr.items[i], &too_big);
            /* llama.cpp reads unknown types as "undefined" */
            vd->types[i] = (!too_big && t >= SP_TOKEN_NORMAL && t <= SP_TOKEN_BYTE) ? (int32_t)t : SP_TOKEN_UNDEFINED;
        }
    }
    if (vd->kind == SP_VOCAB_BPE) {
        if (!merges) return sp_err(SP_E_FORMAT, "%s: '%s': BPE vocabulary without key 'tokenizer.ggml.merges'", FN, mf->path);
        if (merges->v.arr.n > UINT32_MAX) return sp_err(SP_E_FORMAT, "%s: '%s': too many merges", FN, mf->path);
        const uint32_t nm = (uint32_t)merges->v.arr.n;
        if (nm && !(vd->merges = sp_calloc(nm, sizeof(*vd->merges)))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
        for (uint32_t i = 0; i < nm; i++) {
            if ((rc = copy_token(mf, "tokenizer.ggml.merges", i, &merges->v.arr.items[i], &vd->merges[i], NULL))) return rc;
            vd->n_merges = i + 1;
        }
    }

    /* Defaults that do not exist in this vocabulary become "none". */
    int32_t *ids[] = {&vd->bos, &vd->eos, &vd->unk, &vd->pad, &vd->eot};
    for (size_t i = 0; i < SP_ARRAY_LEN(ids); i++) {
        if (*ids[i] >= (int32_t)n) *ids[i] = -1;
    }
    if ((rc = get_token_id(mf, "tokenizer.ggml.bos_token_id", n, &vd->bos)) ||
        (rc = get_token_id(mf, "tokenizer.ggml.eos_token_id", n, &vd->eos)) ||
        (rc = get_token_id(mf, "tokenizer.ggml.unknown_token_id", n, &vd->unk)) ||
        (rc = get_token_id(mf, "tokenizer.ggml.padding_token_id", n, &vd->pad)) ||
        (rc = get_token_id(mf, "tokenizer.ggml.eot_token_id", n, &vd->eot)) ||
        (rc = get_bool(mf, "tokenizer.ggml.add_bos_token", &vd->add_bos)) ||
        (rc = get_bool(mf, "tokenizer.ggml.add_eos_token", &vd->add_eos)) ||
        (rc = get_bool(mf, "tokenizer.ggml.add_space_prefix", &vd->add_space_prefix))) {
        return rc;
    }
    return SP_OK;
}

/* GGUF: interpret the metadata read by sp_gguf_read. */
static sp_status interpret_gguf(struct sp_model_file *mf, bool vocab_only) {
    sp_status rc;
    const char *name;
    if ((rc = get_str(mf, "general.name", &name))) return rc;
    if (name && !(mf->name = sp_strdup(name))) return sp_err(SP_E_NOMEM, "%s: out of memory", FN);
    /* sparrow.requires names what a reader must know (docs/FORMAT.md) */
    const char *req, *layout;
    if ((rc = get_str(mf, "sparrow.requires", &req)) || (rc = get_str(mf, "sparrow.layout", &layout))) return rc;
    const int level = req ? sp_native_requires_parse(req) : 0;
    if (level < 0) {
        return sp_err(SP_E_UNSUPPORTED, "%s: '%s' requires '%.64s' (key sparrow.requires), which this version of "
                      "Sparrow does not know (it reads native-types-1 to native-types-3): a newer Sparrow wrote it",
                      FN, mf->path, req);
    }
    /* a tensor in a resident layout is only read by a reader that knows them */
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const uint32_t t = mf->tensors[i].type;
        if (sp_native_requires_level(t) == 3 && level < 3) {
            return sp_err(SP_E_FORMAT, "%s: '%s': tensor '%s' is stored in the resident layout %s, but key "
                          "sparrow.requires is %s%s%s (a file holding one must say native-types-3)", FN, mf->path,
                          mf->tensors[i].name, sp_qtype_name(t), req ? "'" : "", req ? req : "absent", req ? "'" : "");
        }
    }
    if (layout && strcmp(layout, "resident") == 0) {
        mf->in_place = true;
    } else if (layout) {
        SP_LOG_W("%s: '%s': key sparrow.layout = '%.64s' is not one this version knows (resident); the file is "
                 "read as an ordinary GGUF", FN, mf->path, layout);
    }
    if ((rc = read_hparams(mf, vocab_only)) || (rc = read_vocab(mf, vocab_only))) return rc;
    if (!vocab_only && mf->n_tensors == 0) {
        return sp_err(SP_E_FORMAT, "%s: '%s' has no tensors (a vocabulary-only file? open it with vocab_only)", FN, mf->path);
    }
    if (!mf->has_hparams) return SP_OK;
    /* n_vocab: rows of the embedding table, else the tokenizer's size. */
    const struct sp_tensor_desc *emb = sp_model_file_find(mf, "token_embd.weight");
    if (emb) {
        if (emb->n_dims < 2 || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX || emb->ne[2] != 1 || emb->ne[3] != 1) {
            return sp_err(SP_E_FORMAT, "%s: '%s': tensor 'token_embd.weight' has shape [%lld, %lld, %lld, %lld], expected [n_embd, n_vocab]",
                          FN, mf->path, (long long)emb->ne[0], (long long)emb->ne[1], (long long)emb->ne[2], (long long)emb->ne[3]);
        }
        mf->hp.n_vocab = (uint32_t)emb->ne[1];
    } else {
        mf->hp.n_vocab = mf->vocab.n_tokens;
    }
    if (mf->hp.n_vocab == 0) {
        return sp_err(SP_E_FORMAT, "%s: '%s': unknown vocabulary size: no tensor 'token_embd.weight' and no key 'tokenizer.ggml.tokens'",
                      FN, mf->path);
    }
    return SP_OK;
}

/* "tokenizer.bin" in the directory of path (heap string). */
static char *sibling_tokenizer(const char *path) {
    const char *slash = strrchr(path, '/');
    const size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    char *p = sp_malloc(dir + sizeof("tokenizer.bin"));
    if (!p) return NULL;
    memcpy(p, path, dir);
    memcpy(p + dir, "tokenizer.bin", sizeof("tokenizer.bin"));
    return p;
}

/* Open a model file; see model_file.h for the contract.  The file is closed
 * again before returning: the directory holds offsets, not data. */
sp_status sp_model_file_open(const char *path, const char *tokenizer_path, bool vocab_only, struct sp_model_file **out) {
    struct sp_file *f = NULL;
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!path) return sp_err(SP_E_INVALID, "%s: path is NULL", __func__);
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    rc = sp_model_file_open_file(f, tokenizer_path, vocab_only, out);
    sp_file_close(f);
    return rc;
}

/* As sp_model_file_open, from an open byte source (tests and fuzzing use
 * memory buffers); f stays owned by the caller and is not kept. */
sp_status sp_model_file_open_file(struct sp_file *f, const char *tokenizer_path, bool vocab_only, struct sp_model_file **out) {
    struct sp_model_file *mf = NULL;
    char *tok_path = NULL;
    sp_status rc;
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!f) return sp_err(SP_E_INVALID, "%s: f is NULL", __func__);
    const char *path = sp_file_path(f);

    mf = sp_calloc(1, sizeof(*mf));
    if (!mf || !(mf->path = sp_strdup(path))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    mf->file_size = sp_file_size(f);
    uint8_t magic[4] = {0};
    if (mf->file_size == 0) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' is empty", __func__, path);
        goto fail;
    }
    uint8_t magic8[8] = {0};
    if (mf->file_size >= 4 && (rc = sp_file_read_at(f, 0, magic, 4))) goto fail;
    if (mf->file_size >= 8 && (rc = sp_file_read_at(f, 0, magic8, 8))) goto fail;
    if (sp_pack_is_package(magic8, sizeof magic8)) {
        /* a package: the GGUF it holds, from the header bytes in its manifest */
        struct sp_pack_manifest pm;
        struct sp_file *hf = NULL;
        sp_model_file_free(mf);
        mf = NULL;
        if ((rc = sp_pack_read_manifest(f, &pm, NULL))) goto fail;
        rc = sp_file_from_prefix(pm.header, (size_t)pm.header_size, pm.file_size, path, &hf);
        if (!rc) rc = sp_model_file_open_file(hf, tokenizer_path, vocab_only, &mf);
        sp_file_close(hf);
        sp_pack_manifest_clear(&pm);
        if (rc) goto fail;
        mf->packed = true;
        *out = mf;
        return SP_OK;
    }
    if (memcmp(magic, "GGUF", 4) == 0) {
        if (tokenizer_path) { /* it would be ignored: say so rather than run with another vocabulary */
            rc = sp_err(SP_E_INVALID, "%s: '%s' is a GGUF file, which carries its own vocabulary; a separate "
                        "tokenizer ('%s') is only for llama2.c checkpoints", __func__, path, tokenizer_path);
            goto fail;
        }
        if ((rc = sp_gguf_read(f, mf)) || (rc = interpret_gguf(mf, vocab_only))) goto fail;
    } else {
        if ((rc = sp_llama2c_read(f, mf, vocab_only))) goto fail;
        if (!tokenizer_path && sp_file_fd(f) < 0) {
            rc = sp_err(SP_E_INVALID, "%s: a llama2.c checkpoint in memory needs an explicit tokenizer path", __func__);
            goto fail;
        }
        tok_path = tokenizer_path ? sp_strdup(tokenizer_path) : sibling_tokenizer(path);
        if (!tok_path) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            goto fail;
        }
        if ((rc = sp_llama2c_read_tokenizer(tok_path, mf))) goto fail;
    }
    if (!mf->name && !(mf->name = sp_strdup(""))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    sp_free(tok_path);
    *out = mf;
    return SP_OK;

fail:
    sp_free(tok_path);
    sp_model_file_free(mf);
    return rc;
}

/* Free mf and everything it owns; safe on partially filled files (what a
 * failed sp_gguf_read leaves).  NULL is a no-op. */
void sp_model_file_free(struct sp_model_file *mf) {
    if (!mf) return;
    struct sp_vocab_data *vd = &mf->vocab;
    if (vd->tokens) {
        for (uint32_t i = 0; i < vd->n_tokens; i++) sp_free(vd->tokens[i]);
    }
    if (vd->merges) {
        for (uint32_t i = 0; i < vd->n_merges; i++) sp_free(vd->merges[i]);
    }
    sp_free(vd->tokens);
    sp_free(vd->token_len);
    sp_free(vd->scores);
    sp_free(vd->types);
    sp_free(vd->merges);
    sp_free(vd->pre);
    for (uint32_t i = 0; i < mf->n_tensors; i++) sp_free(mf->tensors[i].name);
    sp_free(mf->tensors);
    for (uint64_t i = 0; i < mf->n_meta; i++) {
        sp_free(mf->meta[i].key);
        sp_meta_value_clear(&mf->meta[i].value);
    }
    sp_free(mf->meta);
    sp_free(mf->path);
    sp_free(mf->name);
    sp_free(mf->tokenizer_path);
    sp_free(mf);
}
