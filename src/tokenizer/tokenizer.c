/*
 * tokenizer.c -- the parts both vocabulary families share: building the
 * tokenizer over a borrowed struct sp_vocab_data (token map, attributes, the
 * end-of-generation set), splitting user-defined tokens out of raw text,
 * BOS/EOS, token -> piece and detokenization.  The merge algorithms live in
 * spm.c and bpe.c, the pre-tokenizer regexes in pretok.c.
 * Reference: llama.cpp src/llama-vocab.cpp (llama_vocab::impl::load,
 * tokenize, token_to_piece, detokenize) at commit 3f545bec.
 */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- hash map ------------------------------------------------------------ */

/* Hash of n bytes: FNV-1a, then a final avalanche so the low bits (the slot)
 * mix well.  Pure. */
uint32_t sp_tok_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    return h;
}

/* Builds the map: keys are borrowed, only indices are stored.  Empty keys are
 * not inserted (llama.cpp renames empty tokens, so no text can match them). */
sp_status sp_tok_map_build(struct sp_tok_map *m, const char *const *keys, const uint32_t *lens, uint32_t n,
                           int32_t *dup_first, int32_t *dup_second) {
    memset(m, 0, sizeof *m);
    *dup_first = *dup_second = -1;
    size_t n_slots = 2;
    while (n_slots < (size_t)n * 2) n_slots <<= 1;
    m->hash = sp_malloc(n_slots * sizeof *m->hash);
    m->idx = sp_malloc(n_slots * sizeof *m->idx);
    if (!m->hash || !m->idx) {
        sp_tok_map_free(m);
        return sp_err(SP_E_NOMEM, "%s: %zu slots", __func__, n_slots);
    }
    m->mask = (uint32_t)(n_slots - 1);
    m->keys = keys;
    m->lens = lens;
    for (size_t i = 0; i < n_slots; i++) m->idx[i] = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (lens[i] == 0) continue;
        const uint32_t h = sp_tok_hash(keys[i], lens[i]);
        uint32_t s = h & m->mask;
        bool dup = false;
        while (m->idx[s] >= 0) {
            const int32_t j = m->idx[s];
            if (m->hash[s] == h && lens[j] == lens[i] && memcmp(keys[j], keys[i], lens[i]) == 0) {
                if (*dup_first < 0) {
                    *dup_first = j;
                    *dup_second = (int32_t)i;
                }
                dup = true;
                break;
            }
            s = (s + 1) & m->mask;
        }
        if (dup) continue;
        m->hash[s] = h;
        m->idx[s] = (int32_t)i;
    }
    return SP_OK;
}

/* Frees the slot arrays (not the borrowed keys); NULL or a zeroed map is a no-op. */
void sp_tok_map_free(struct sp_tok_map *m) {
    if (!m) return;
    sp_free(m->hash);
    sp_free(m->idx);
    m->hash = NULL;
    m->idx = NULL;
}

/* Lookup by content; -1 when absent.  Read-only, so thread-safe. */
int32_t sp_tok_map_find(const struct sp_tok_map *m, const char *s, size_t n) {
    if (!m->idx || n == 0) return -1;
    const uint32_t h = sp_tok_hash(s, n);
    uint32_t slot = h & m->mask;
    for (;;) {
        const int32_t j = m->idx[slot];
        if (j < 0) return -1;
        if (m->hash[slot] == h && m->lens[j] == n && memcmp(m->keys[j], s, n) == 0) return j;
        slot = (slot + 1) & m->mask;
    }
}

/* ---- id vector ----------------------------------------------------------- */

/* Appends one id, doubling the capacity as needed. */
sp_status sp_tok_vec_push(struct sp_tok_vec *v, int32_t id) {
    if (v->n == v->cap) {
        const size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = sp_realloc(v->ids, cap * sizeof *p);
        if (!p) return sp_err(SP_E_NOMEM, "%s: %zu ids", __func__, cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return SP_OK;
}

/* ---- init ---------------------------------------------------------------- */

static uint8_t attr_from_type(int32_t type) {
    switch (type) {
    case SP_TOKEN_NORMAL: return SP_TOK_ATTR_NORMAL;
    case SP_TOKEN_UNKNOWN: return SP_TOK_ATTR_UNKNOWN;
    case SP_TOKEN_CONTROL: return SP_TOK_ATTR_CONTROL;
    case SP_TOKEN_USER_DEFINED: return SP_TOK_ATTR_USER_DEFINED;
    case SP_TOKEN_UNUSED: return SP_TOK_ATTR_UNUSED;
    case SP_TOKEN_BYTE: return SP_TOK_ATTR_BYTE;
    default: return 0; /* undefined */
    }
}

static int32_t find_text(const struct sp_tokenizer *t, const char *s) {
    return sp_tok_map_find(&t->tokens, s, strlen(s));
}

/* Token texts llama.cpp's loader recognises (llama_vocab::impl::load): they
 * become control tokens, and some of them end generation. */
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "<end_of_utterance>",
};
static const char *const k_fim_texts[] = {
    /* pre */ "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>",
    /* suf */ "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>",
    /* mid */ "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>",
};
/* FIM pad / repo / file-separator tokens: control, and end of generation. */
static const char *const k_fim_eog_texts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
};
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[",
};

/* Mirrors the text-based fix-ups of llama.cpp's loader: EOT/EOM/FIM tokens
 * become control tokens, the EOG set is built from eos, eot and the texts
 * above, and the gpt-oss / gemma4 work-arounds are applied. */
static void mark_special_texts(struct sp_tokenizer *t, int32_t eot) {
    for (size_t i = 0; i < SP_ARRAY_LEN(k_eot_texts); i++) {
        const int32_t id = find_text(t, k_eot_texts[i]);
        if (id >= 0) t->attr[id] |= SP_TOK_ATTR_CONTROL;
    }
    const int32_t eom = find_text(t, "<|eom_id|>");
    if (eom >= 0) t->attr[eom] |= SP_TOK_ATTR_CONTROL | SP_TOK_ATTR_EOG;
    for (size_t i = 0; i < SP_ARRAY_LEN(k_fim_texts); i++) {
        const int32_t id = find_text(t, k_fim_texts[i]);
        if (id >= 0) t->attr[id] |= SP_TOK_ATTR_CONTROL;
    }
    for (size_t i = 0; i < SP_ARRAY_LEN(k_fim_eog_texts); i++) {
        const int32_t id = find_text(t, k_fim_eog_texts[i]);
        if (id >= 0) t->attr[id] |= SP_TOK_ATTR_CONTROL | SP_TOK_ATTR_EOG;
    }
    for (size_t i = 0; i < SP_ARRAY_LEN(k_eog_texts); i++) {
        const int32_t id = find_text(t, k_eog_texts[i]);
        if (id >= 0) t->attr[id] |= SP_TOK_ATTR_CONTROL | SP_TOK_ATTR_EOG;
    }
    static const char *const k_gptoss_user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t i = 0; i < SP_ARRAY_LEN(k_gptoss_user); i++) {
        const int32_t id = find_text(t, k_gptoss_user[i]);
        if (id >= 0) t->attr[id] = (uint8_t)((t->attr[id] & SP_TOK_ATTR_EOG) | SP_TOK_ATTR_USER_DEFINED);
    }
    if (t->eos >= 0) t->attr[t->eos] |= SP_TOK_ATTR_EOG;
    if (eot >= 0) t->attr[eot] |= SP_TOK_ATTR_EOG;

    /* o200k_harmony / solar-open: "<|end|>" is not an end of generation when
     * "<|return|>" + "<|call|>" (or "<|calls|>" + "<|flush|>") exist. */
    const int32_t end = find_text(t, "<|end|>");
    const int32_t ret = find_text(t, "<|return|>");
    const int32_t call = find_text(t, "<|call|>"), calls = find_text(t, "<|calls|>");
    const int32_t flush = find_text(t, "<|flush|>");
    const bool has_call = call >= 0 || calls >= 0;
    if (end >= 0 && ((ret >= 0 && has_call) || (has_call && flush >= 0))) {
        t->attr[end] = SP_TOK_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is a plain token when "<|tool_response>" exists. */
    const int32_t s_end = find_text(t, "</s>");
    if (s_end >= 0 && find_text(t, "<|tool_response>") >= 0) t->attr[s_end] = SP_TOK_ATTR_NORMAL;
}

/* qsort has no context argument in C11, so sort (length, id) pairs. */
struct len_id {
    uint32_t len;
    int32_t id;
};

static int cmp_len_id(const void *a, const void *b) {
    const struct len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The tokens partition() cuts out of raw text (llama.cpp's
 * cache_special_tokens, filtered by tokenizer_st_partition), longest text
 * first: with parse_special (all = true) every control, user-defined and
 * unknown token; without it only the user-defined ones that are not also
 * control or unknown. */
static bool partition_kind(uint8_t a, bool all) {
    if (all) return (a & (SP_TOK_ATTR_CONTROL | SP_TOK_ATTR_USER_DEFINED | SP_TOK_ATTR_UNKNOWN)) != 0;
    return (a & SP_TOK_ATTR_USER_DEFINED) && !(a & (SP_TOK_ATTR_CONTROL | SP_TOK_ATTR_UNKNOWN));
}

static sp_status collect_partition(struct sp_tokenizer *t, bool all, int32_t **ids, uint32_t *n_ids) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_tokens; i++)
        if (partition_kind(t->attr[i], all) && t->tokens.lens[i] > 0) n++;
    if (n == 0) return SP_OK;
    struct len_id *tmp = sp_malloc(n * sizeof *tmp);
    *ids = sp_malloc(n * sizeof **ids);
    if (!tmp || !*ids) {
        sp_free(tmp);
        return sp_err(SP_E_NOMEM, "%s: %u special tokens", __func__, n);
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->n_tokens; i++)
        if (partition_kind(t->attr[i], all) && t->tokens.lens[i] > 0)
            tmp[k++] = (struct len_id){t->tokens.lens[i], (int32_t)i};
    qsort(tmp, n, sizeof *tmp, cmp_len_id);
    for (uint32_t i = 0; i < n; i++) (*ids)[i] = tmp[i].id;
    *n_ids = n;
    sp_free(tmp);
    return SP_OK;
}

static int32_t checked_id(const struct sp_vocab_data *v, int32_t id, const char *what) {
    if (id < 0) return -1;
    if ((uint32_t)id >= v->n_tokens) {
        SP_LOG_W("sp_tokenizer_init: %s id %d is outside the vocabulary (%u tokens); ignored", what, id, v->n_tokens);
        return -1;
    }
    return id;
}

static sp_status init_bpe(struct sp_tokenizer *t) {
    const struct sp_vocab_data *v = t->v;
    sp_status rc;
    struct sp_pretok_info info = {0};
    const char *pre = v->pre ? v->pre : "";
    rc = sp_pretok_init(pre, &t->pre, &info);
    if (rc != SP_OK) return rc;
    t->ignore_merges = info.ignore_merges;
    if (info.no_bos) t->bos = -1;
    sp_bpe_init_bytes(t);

    if (v->n_merges == 0) return SP_OK;
    if (!v->merges) return sp_err(SP_E_FORMAT, "%s: %u merges but no merge list", __func__, v->n_merges);
    t->merge_lens = sp_malloc((size_t)v->n_merges * sizeof *t->merge_lens);
    t->merge_split = sp_malloc((size_t)v->n_merges * sizeof *t->merge_split);
    if (!t->merge_lens || !t->merge_split) return sp_err(SP_E_NOMEM, "%s: %u merges", __func__, v->n_merges);
    for (uint32_t i = 0; i < v->n_merges; i++) {
        const char *m = v->merges[i];
        if (!m) return sp_err(SP_E_FORMAT, "%s: merge %u is missing", __func__, i);
        const size_t n = strlen(m);
        if (n > UINT32_MAX) return sp_err(SP_E_FORMAT, "%s: merge %u is too long", __func__, i);
        t->merge_lens[i] = (uint32_t)n;
        /* llama.cpp splits at the first space at index >= 1; a line without
         * one gives the pair ("", "") that nothing can look up. */
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        t->merge_split[i] = sp ? (uint32_t)(sp - m) : 0;
    }
    int32_t d1, d2;
    rc = sp_tok_map_build(&t->merges, (const char *const *)v->merges, t->merge_lens, v->n_merges, &d1, &d2);
    if (rc != SP_OK) return rc;
    /* A repeated merge line keeps its first rank, as std::unordered_map::emplace does. */
    return SP_OK;
}

static void init_spm_bytes(struct sp_tokenizer *t) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        int32_t id = sp_tok_map_find(&t->tokens, buf, 6);
        if (id < 0) {
            const char c = (char)b;
            id = sp_tok_map_find(&t->tokens, &c, 1);
        }
        t->byte_token[b] = id;
    }
}

/* Build a tokenizer over v (borrowed: v must outlive it).  See tokenizer.h. */
sp_status sp_tokenizer_init(const struct sp_vocab_data *v, struct sp_tokenizer **out) {
    sp_status rc;
    *out = NULL;
    if (!v) return sp_err(SP_E_INVALID, "%s: no vocabulary", __func__);
    if (v->kind != SP_VOCAB_SPM && v->kind != SP_VOCAB_BPE)
        return sp_err(SP_E_UNSUPPORTED, "%s: vocabulary kind %d is not supported (SPM or BPE only)", __func__,
                      (int)v->kind);
    if (v->n_tokens == 0 || !v->tokens || v->n_tokens > (uint32_t)INT32_MAX)
        return sp_err(SP_E_FORMAT, "%s: vocabulary has %u tokens", __func__, v->n_tokens);

    struct sp_tokenizer *t = sp_calloc(1, sizeof *t);
    if (!t) return sp_err(SP_E_NOMEM, "%s: tokenizer", __func__);
    t->v = v;
    t->kind = v->kind;
    t->n_tokens = v->n_tokens;

    uint32_t *own_lens = NULL;
    const uint32_t *lens = v->token_len;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!v->tokens[i]) {
            rc = sp_err(SP_E_FORMAT, "%s: token %u has no text", __func__, i);
            goto fail;
        }
    }
    if (!lens) {
        /* Not expected from format/, but cheap to tolerate. */
        own_lens = sp_malloc((size_t)v->n_tokens * sizeof *own_lens);
        if (!own_lens) {
            rc = sp_err(SP_E_NOMEM, "%s: token lengths", __func__);
            goto fail;
        }
        for (uint32_t i = 0; i < v->n_tokens; i++) own_lens[i] = (uint32_t)strlen(v->tokens[i]);
        lens = own_lens;
    }
    int32_t d1, d2;
    rc = sp_tok_map_build(&t->tokens, (const char *const *)v->tokens, lens, v->n_tokens, &d1, &d2);
    if (rc != SP_OK) goto fail;
    if (d1 >= 0) {
        rc = sp_err(SP_E_FORMAT, "%s: duplicate token in vocabulary: '%s' has ids %d and %d", __func__,
                    v->tokens[d1], d1, d2);
        goto fail;
    }

    t->attr = sp_malloc(v->n_tokens);
    if (!t->attr) {
        rc = sp_err(SP_E_NOMEM, "%s: token attributes", __func__);
        goto fail;
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) t->attr[i] = v->types ? attr_from_type(v->types[i]) : SP_TOK_ATTR_NORMAL;

    t->bos = checked_id(v, v->bos, "BOS");
    t->eos = checked_id(v, v->eos, "EOS");
    t->unk = checked_id(v, v->unk, "UNK");
    int32_t eot = checked_id(v, v->eot, "EOT");
    t->add_bos = v->add_bos;
    t->add_eos = v->add_eos;
    t->add_space_prefix = v->add_space_prefix;
    if (eot < 0) {
        for (size_t i = 0; i < SP_ARRAY_LEN(k_eot_texts) && eot < 0; i++) eot = find_text(t, k_eot_texts[i]);
    }
    mark_special_texts(t, eot);

    if (t->kind == SP_VOCAB_BPE) {
        rc = init_bpe(t);
        if (rc != SP_OK) goto fail;
    } else {
        init_spm_bytes(t);
    }
    rc = collect_partition(t, false, &t->user_defined, &t->n_user_defined);
    if (rc == SP_OK) rc = collect_partition(t, true, &t->special, &t->n_special);
    if (rc != SP_OK) goto fail;

    t->own_lens = own_lens; /* the token map points into it */
    *out = t;
    return SP_OK;

fail:
    t->own_lens = own_lens;
    sp_tokenizer_free(t);
    return rc;
}

/* Frees everything the tokenizer owns; the vocabulary stays with its owner.
 * NULL is a no-op. */
void sp_tokenizer_free(struct sp_tokenizer *t) {
    if (!t) return;
    sp_tok_map_free(&t->tokens);
    sp_tok_map_free(&t->merges);
    sp_free(t->attr);
    sp_free(t->user_defined);
    sp_free(t->special);
    sp_free(t->merge_lens);
    sp_free(t->merge_split);
    sp_free(t->own_lens);
    sp_pretok_free(t->pre);
    sp_free(t);
}

/* ---- encode -------------------------------------------------------------- */

/* A piece of the input: raw text [off, off+len), or a whole token. */
struct frag {
    int32_t token; /* -1 for raw text */
    size_t off, len;
};

struct frag_vec {
    struct frag *f;
    size_t n, cap;
};

static sp_status frag_push(struct frag_vec *v, int32_t token, size_t off, size_t len) {
    if (v->n == v->cap) {
        const size_t cap = v->cap ? v->cap * 2 : 16;
        struct frag *p = sp_realloc(v->f, cap * sizeof *p);
        if (!p) return sp_err(SP_E_NOMEM, "%s: %zu fragments", __func__, cap);
        v->f = p;
        v->cap = cap;
    }
    v->f[v->n++] = (struct frag){token, off, len};
    return SP_OK;
}

/* llama.cpp tokenizer_st_partition: every token of the partition list
 * (see collect_partition), longest first, is cut out of the raw fragments.
 * *out holds the result (caller frees out->f). */
static sp_status partition(const struct sp_tokenizer *t, const char *text, size_t len, bool parse_special,
                           struct frag_vec *out) {
    struct frag_vec cur = {0}, next = {0};
    sp_status rc = frag_push(&cur, -1, 0, len);
    const int32_t *list = parse_special ? t->special : t->user_defined;
    const uint32_t n_list = parse_special ? t->n_special : t->n_user_defined;
    for (uint32_t k = 0; rc == SP_OK && k < n_list; k++) {
        const int32_t id = list[k];
        const char *tok = t->v->tokens[id];
        const size_t tl = t->tokens.lens[id];
        next.n = 0;
        for (size_t i = 0; rc == SP_OK && i < cur.n; i++) {
            const struct frag f = cur.f[i];
            if (f.token >= 0 || f.len < tl) {
                rc = frag_push(&next, f.token, f.off, f.len);
                continue;
            }
            size_t off = f.off, end = f.off + f.len;
            while (rc == SP_OK && off < end) {
                const char *m = memmem(text + off, end - off, tok, tl);
                if (!m) break;
                const size_t at = (size_t)(m - text);
                if (at > off) rc = frag_push(&next, -1, off, at - off);
                if (rc == SP_OK) rc = frag_push(&next, id, 0, 0);
                off = at + tl;
            }
            if (rc == SP_OK && off < end) rc = frag_push(&next, -1, off, end - off);
        }
        const struct frag_vec tmp = cur;
        cur = next;
        next = tmp;
    }
    sp_free(next.f);
    if (rc != SP_OK) {
        sp_free(cur.f);
        return rc;
    }
    *out = cur;
    return SP_OK;
}

/* Encode as llama.cpp's llama_tokenize(text, add_special = add_bos,
 * parse_special).  See tokenizer.h. */
sp_status sp_tokenizer_encode(const struct sp_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *out, int32_t cap, int32_t *n_out) {
    sp_status rc = SP_OK;
    struct sp_tok_vec ids = {0};
    struct frag_vec frags = {0};
    char *buf = NULL;
    *n_out = 0;
    if (!text && len) return sp_err(SP_E_INVALID, "%s: NULL text of %zu bytes", __func__, len);
    if (cap < 0 || (cap > 0 && !out)) return sp_err(SP_E_INVALID, "%s: bad output buffer (cap %d)", __func__, cap);

    if (add_bos && t->add_bos && t->bos >= 0) rc = sp_tok_vec_push(&ids, t->bos);
    if (rc == SP_OK && len > 0) rc = partition(t, text, len, parse_special, &frags);
    if (rc == SP_OK && len > 0 && t->kind == SP_VOCAB_SPM) {
        /* prefix space (3 bytes once escaped) + every space escaped to U+2581 */
        if (len > (SIZE_MAX - 3) / 3) {
            rc = sp_err(SP_E_INVALID, "%s: text of %zu bytes is too long", __func__, len);
            goto done;
        }
        buf = sp_malloc(3 * len + 3);
        if (!buf) {
            rc = sp_err(SP_E_NOMEM, "%s: %zu bytes of scratch", __func__, 3 * len + 3);
            goto done;
        }
        bool prev_special = true; /* the first fragment gets the prefix space */
        for (size_t i = 0; rc == SP_OK && i < frags.n; i++) {
            const struct frag f = frags.f[i];
            if (f.token >= 0) {
                rc = sp_tok_vec_push(&ids, f.token);
                prev_special = true;
                continue;
            }
            size_t n = 0;
            if (t->add_space_prefix && prev_special) {
                memcpy(buf, "\xe2\x96\x81", 3);
                n = 3;
            }
            for (size_t j = 0; j < f.len; j++) {
                const char c = text[f.off + j];
                if (c == ' ') {
                    memcpy(buf + n, "\xe2\x96\x81", 3);
                    n += 3;
                } else {
                    buf[n++] = c;
                }
            }
            rc = sp_spm_encode(t, buf, n, &ids);
            prev_special = false;
        }
    } else if (rc == SP_OK && len > 0) {
        for (size_t i = 0; rc == SP_OK && i < frags.n; i++) {
            const struct frag f = frags.f[i];
            rc = f.token >= 0 ? sp_tok_vec_push(&ids, f.token) : sp_bpe_encode(t, text + f.off, f.len, &ids);
        }
    }
    /* llama.cpp's add_special also appends EOS for vocabularies that ask for it. */
    if (rc == SP_OK && add_bos && t->add_eos && t->eos >= 0) rc = sp_tok_vec_push(&ids, t->eos);
    if (rc != SP_OK) goto done;

    if (ids.n > (size_t)INT32_MAX) {
        rc = sp_err(SP_E_INVALID, "%s: %zu tokens do not fit an int32_t count", __func__, ids.n);
        goto done;
    }
    *n_out = (int32_t)ids.n;
    if (ids.n > (size_t)cap) {
        rc = SP_E_BUFFER; /* a size query, not a failure worth logging */
        goto done;
    }
    if (ids.n) memcpy(out, ids.ids, ids.n * sizeof *out);

done:
    sp_free(ids.ids);
    sp_free(frags.f);
    sp_free(buf);
    return rc;
}

/* ---- pieces -------------------------------------------------------------- */

/* Output cursor: counts every byte, stores those that fit.  lstrip drops one
 * leading space of the current piece (llama.cpp token_to_piece lstrip). */
struct emit {
    char *buf;
    size_t cap, n;
    bool lstrip;
};

static void emit_bytes(struct emit *e, const char *s, size_t n) {
    if (n == 0) return;
    if (e->lstrip) {
        e->lstrip = false;
        if (s[0] == ' ') {
            s++;
            n--;
        }
    }
    if (e->n < e->cap) {
        const size_t k = SP_MIN(n, e->cap - e->n);
        memcpy(e->buf + e->n, s, k);
    }
    e->n += n;
}

/* llama.cpp's lax UTF-8 decoder (unicode_cpt_from_utf8): no overlong or
 * surrogate checks; an invalid lead or truncated sequence gives U+FFFD and
 * consumes one byte. */
static uint32_t lax_cpt(const uint8_t *s, size_t n, size_t *used) {
    const uint8_t b = s[0];
    *used = 1;
    if (b < 0x80) return b;
    if (!(b & 0x40)) return 0xFFFD;
    if (!(b & 0x20)) {
        if (n < 2 || (s[1] & 0xc0) != 0x80) return 0xFFFD;
        *used = 2;
        return ((uint32_t)(b & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if (!(b & 0x10)) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0xFFFD;
        *used = 3;
        return ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    if (!(b & 0x08)) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) return 0xFFFD;
        *used = 4;
        return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) | ((uint32_t)(s[2] & 0x3f) << 6) |
               (s[3] & 0x3f);
    }
    return 0xFFFD;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* llama.cpp token_to_piece(special = false) of one valid id. */
static void piece_emit(const struct sp_tokenizer *t, int32_t id, struct emit *e) {
    const uint8_t a = t->attr[id];
    const char *s = t->v->tokens[id];
    const size_t n = t->tokens.lens[id];
    if (a & (SP_TOK_ATTR_UNKNOWN | SP_TOK_ATTR_CONTROL)) return;
    if (a & SP_TOK_ATTR_USER_DEFINED) {
        emit_bytes(e, s, n);
    } else if ((a & SP_TOK_ATTR_NORMAL) && t->kind == SP_VOCAB_SPM) {
        size_t i = 0, run = 0; /* U+2581 -> ' ' */
        while (i < n) {
            if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                emit_bytes(e, s + run, i - run);
                emit_bytes(e, " ", 1);
                i += 3;
                run = i;
            } else {
                i++;
            }
        }
        emit_bytes(e, s + run, n - run);
    } else if (a & SP_TOK_ATTR_NORMAL) {
        /* GPT-2 byte decoding (llama_decode_text), with its odd marker for a
         * code point outside the 256 byte mapping. */
        size_t i = 0;
        while (i < n) {
            size_t used;
            const uint32_t c = lax_cpt((const uint8_t *)s + i, n - i, &used);
            i += used;
            if (c < SP_ARRAY_LEN(t->cpt_byte) && t->cpt_byte[c] >= 0) {
                const char b = (char)t->cpt_byte[c];
                emit_bytes(e, &b, 1);
            } else {
                char u[4], hx[9];
                const size_t k = sp_utf8_put(c, u);
                for (size_t j = 0; j < k; j++) {
                    static const char digits[] = "0123456789abcdef";
                    hx[2 * j] = digits[(uint8_t)u[j] >> 4];
                    hx[2 * j + 1] = digits[(uint8_t)u[j] & 15];
                }
                emit_bytes(e, "[UNK_BYTE_0x", 12);
                emit_bytes(e, hx, 2 * k);
                emit_bytes(e, s, n);
                emit_bytes(e, "]", 1);
            }
        }
    } else if (a & SP_TOK_ATTR_BYTE) {
        /* "<0xXX>": strtol of the two characters after "<0x" */
        int v = 0;
        for (size_t j = 3; j < 5 && j < n && hexval(s[j]) >= 0; j++) v = v * 16 + hexval(s[j]);
        const char b = (char)v;
        emit_bytes(e, &b, 1);
    }
    /* unused / undefined tokens render as nothing */
}

/* The bytes of one token (special = false semantics).  See tokenizer.h. */
sp_status sp_tokenizer_piece(const struct sp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (id < 0 || (uint32_t)id >= t->n_tokens)
        return sp_err(SP_E_INVALID, "%s: token id %d outside the vocabulary (%u tokens)", __func__, id, t->n_tokens);
    struct emit e = {buf, buf ? cap : 0, 0, false};
    piece_emit(t, id, &e);
    *n_out = e.n;
    return e.n > cap ? SP_E_BUFFER : SP_OK;
}

/* llama.cpp llama_detokenize(remove_special = true, unparse_special = false)
 * without the clean_spaces pass, and with the space after a BOS dropped.
 * See tokenizer.h. */
sp_status sp_tokenizer_decode(const struct sp_tokenizer *t, const int32_t *ids, int32_t n, char *buf, size_t cap,
                              size_t *n_out) {
    *n_out = 0;
    if (n < 0 || (n > 0 && !ids)) return sp_err(SP_E_INVALID, "%s: %d ids", __func__, n);
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_tokens)
            return sp_err(SP_E_INVALID, "%s: ids[%d] = %d outside the vocabulary (%u tokens)", __func__, i, ids[i],
                          t->n_tokens);
    }
    struct emit e = {buf, buf ? cap : 0, 0, false};
    bool remove_space = t->add_space_prefix;
    int32_t i0 = 0, i1 = n;
    /* llama.cpp keeps the space when a BOS is skipped (remove_space = false);
     * Sparrow's contract drops it there too, so decode inverts encode with
     * or without BOS. */
    if (t->add_bos && n > 0 && ids[0] == t->bos) i0 = 1;
    if (t->add_eos && i1 > i0 && ids[i1 - 1] == t->eos) i1--;
    for (int32_t i = i0; i < i1; i++) {
        e.lstrip = remove_space;
        piece_emit(t, ids[i], &e);
        e.lstrip = false;
        remove_space = false;
    }
    *n_out = e.n;
    return e.n > cap ? SP_E_BUFFER : SP_OK;
}

/* EOS, EOT and the other end-of-generation tokens llama.cpp recognises. */
bool sp_tokenizer_is_eog(const struct sp_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_tokens && (t->attr[id] & SP_TOK_ATTR_EOG);
}

/* ---- bigram heap shared by the SPM and BPE merge loops ----------------- */

static bool heap_before(const struct sp_tok_bigram *a, const struct sp_tok_bigram *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

sp_status sp_tok_heap_push(struct sp_tok_heap *h, struct sp_tok_bigram x) {
    if (h->n == h->cap) {
        const size_t cap = h->cap ? h->cap * 2 : 64;
        struct sp_tok_bigram *p = sp_realloc(h->b, cap * sizeof *p);
        if (!p) return sp_err(SP_E_NOMEM, "%s: %zu queued pairs", __func__, cap);
        h->b = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!heap_before(&x, &h->b[parent])) break;
        h->b[i] = h->b[parent];
        i = parent;
    }
    h->b[i] = x;
    return SP_OK;
}

struct sp_tok_bigram sp_tok_heap_pop(struct sp_tok_heap *h) {
    const struct sp_tok_bigram top = h->b[0];
    const struct sp_tok_bigram last = h->b[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_before(&h->b[c + 1], &h->b[c])) c++;
        if (!heap_before(&h->b[c], &last)) break;
        h->b[i] = h->b[c];
        i = c;
    }
    if (h->n) h->b[i] = last;
    return top;
}
