/*
 * bpe.c -- byte-level BPE (GGUF model "gpt2"): the text is cleaned of invalid
 * UTF-8 the way llama.cpp does it, cut into words by the pre-tokenizer
 * (pretok.c), every byte of a word is mapped to a printable code point
 * (GPT-2 bytes_to_unicode), and adjacent symbols are merged by merge rank
 * (lowest first, leftmost on ties) until no ranked pair is left.
 * Reference: llama.cpp llm_tokenizer_bpe_session (src/llama-vocab.cpp) and
 * unicode_regex_split / unicode_byte_to_utf8 (src/unicode.cpp).
 */
#include "tokenizer/tok_internal.h"

#include <string.h>

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
void sp_bpe_init_bytes(struct sp_tokenizer *t) {
    for (size_t i = 0; i < SP_ARRAY_LEN(t->cpt_byte); i++) t->cpt_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        const int c = printable ? b : 256 + n++;
        if (c < 0x80) {
            t->byte_utf8[b][0] = (char)c;
            t->byte_utf8_len[b] = 1;
        } else {
            t->byte_utf8[b][0] = (char)(0xc0 | (c >> 6));
            t->byte_utf8[b][1] = (char)(0x80 | (c & 0x3f));
            t->byte_utf8_len[b] = 2;
        }
        t->cpt_byte[c] = (int16_t)b;
    }
}

/* llama.cpp's view of the input (unicode_cpts_from_utf8, then back to UTF-8):
 * a lax decoder without overlong/surrogate checks, one U+FFFD per byte it
 * cannot decode.  out needs 3 * n bytes.  Returns the length written. */
static size_t clean_utf8(const uint8_t *in, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const uint8_t b = in[i];
        uint32_t c = 0;
        size_t k = 0;
        if (b < 0x80) {
            out[o++] = b;
            i++;
            continue;
        }
        if ((b & 0xe0) == 0xc0) k = 2;
        else if ((b & 0xf0) == 0xe0) k = 3;
        else if ((b & 0xf8) == 0xf0) k = 4;
        bool ok = k > 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++) ok = (in[i + j] & 0xc0) == 0x80;
        if (ok) {
            c = k == 2 ? (uint32_t)(b & 0x1f) : k == 3 ? (uint32_t)(b & 0x0f) : (uint32_t)(b & 0x07);
            for (size_t j = 1; j < k; j++) c = (c << 6) | (in[i + j] & 0x3f);
            i += k;
            if (c > 0x10FFFF) c = 0xFFFD; /* llama.cpp throws on re-encoding these */
        } else {
            c = 0xFFFD;
            i++;
        }
        if (c < 0x80) {
            out[o++] = (uint8_t)c;
        } else if (c < 0x800) {
            out[o++] = (uint8_t)(0xc0 | (c >> 6));
            out[o++] = (uint8_t)(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            out[o++] = (uint8_t)(0xe0 | (c >> 12));
            out[o++] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            out[o++] = (uint8_t)(0x80 | (c & 0x3f));
        } else {
            out[o++] = (uint8_t)(0xf0 | (c >> 18));
            out[o++] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
            out[o++] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            out[o++] = (uint8_t)(0x80 | (c & 0x3f));
        }
    }
    return o;
}

struct sym {
    int32_t prev, next;
    uint32_t off, n; /* bytes in the encoded word; n == 0 once merged away */
};

/* Per-call scratch, grown as words need it. */
struct work {
    char *enc;     /* the byte-encoded word */
    char *key;     /* "left right" lookup key */
    struct sym *s; /* one per byte of the word */
    size_t cap;    /* bytes of the longest word seen */
    struct sp_tok_heap h;
};

static sp_status work_reserve(struct work *w, size_t n_bytes) {
    if (n_bytes <= w->cap) return SP_OK;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n_bytes) cap *= 2;
    char *enc = sp_realloc(w->enc, 2 * cap);
    if (enc) w->enc = enc;
    char *key = sp_realloc(w->key, 2 * cap + 1);
    if (key) w->key = key;
    struct sym *s = sp_realloc(w->s, cap * sizeof *s);
    if (s) w->s = s;
    if (!enc || !key || !s) return sp_err(SP_E_NOMEM, "sp_bpe_encode: word of %zu bytes", n_bytes);
    w->cap = cap;
    return SP_OK;
}

/* Rank of the merge "left right", or -1 (llama_vocab::find_bpe_rank). */
static int32_t pair_rank(const struct sp_tokenizer *t, struct work *w, const struct sym *l, const struct sym *r) {
    memcpy(w->key, w->enc + l->off, l->n);
    w->key[l->n] = ' ';
    memcpy(w->key + l->n + 1, w->enc + r->off, r->n);
    const int32_t rank = sp_tok_map_find(&t->merges, w->key, (size_t)l->n + 1 + r->n);
    /* the line must split where llama.cpp split it (first space at >= 1) */
    if (rank < 0 || t->merge_split[rank] != l->n) return -1;
    return rank;
}

static sp_status add_pair(const struct sp_tokenizer *t, struct work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return SP_OK;
    const int32_t rank = pair_rank(t, w, &w->s[left], &w->s[right]);
    if (rank < 0) return SP_OK;
    return sp_tok_heap_push(&w->h, (struct sp_tok_bigram){-(double)rank, left, right, w->s[left].n + w->s[right].n});
}

/* Merge one pre-tokenized word and append its tokens. */
static sp_status encode_word(const struct sp_tokenizer *t, struct work *w, const uint8_t *word, size_t len,
                             struct sp_tok_vec *out) {
    sp_status rc = work_reserve(w, len);
    if (rc != SP_OK) return rc;
    size_t n_enc = 0;
    for (size_t i = 0; i < len; i++) {
        const uint8_t b = word[i];
        w->s[i] = (struct sym){(int32_t)i - 1, i + 1 == len ? -1 : (int32_t)i + 1, (uint32_t)n_enc,
                               t->byte_utf8_len[b]};
        memcpy(w->enc + n_enc, t->byte_utf8[b], t->byte_utf8_len[b]);
        n_enc += t->byte_utf8_len[b];
    }
    if (t->ignore_merges) {
        const int32_t id = sp_tok_map_find(&t->tokens, w->enc, n_enc);
        if (id >= 0) return sp_tok_vec_push(out, id);
    }

    w->h.n = 0;
    for (size_t i = 1; rc == SP_OK && i < len; i++) rc = add_pair(t, w, (int32_t)i - 1, (int32_t)i);
    while (rc == SP_OK && w->h.n > 0) {
        const struct sp_tok_bigram b = sp_tok_heap_pop(&w->h);
        struct sym *l = &w->s[b.left], *r = &w->s[b.right];
        /* Both alive means adjacent, so equal size means equal text: the
         * same test as llama.cpp's string compare. */
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->s[r->next].prev = b.left;
        rc = add_pair(t, w, l->prev, b.left);
        if (rc == SP_OK) rc = add_pair(t, w, b.left, l->next);
    }

    for (int32_t i = 0; rc == SP_OK && i != -1; i = w->s[i].next) {
        const struct sym *s = &w->s[i];
        const int32_t id = sp_tok_map_find(&t->tokens, w->enc + s->off, s->n);
        if (id >= 0) {
            rc = sp_tok_vec_push(out, id);
            continue;
        }
        /* llama.cpp falls back to single bytes of the encoded text; bytes of a
         * two-byte code point find nothing and are dropped, as there. */
        for (uint32_t j = 0; rc == SP_OK && j < s->n; j++) {
            const int32_t b = sp_tok_map_find(&t->tokens, w->enc + s->off + j, 1);
            if (b >= 0) rc = sp_tok_vec_push(out, b);
        }
    }
    return rc;
}

/* Encode one raw fragment; see tok_internal.h.  Per-call scratch only. */
sp_status sp_bpe_encode(const struct sp_tokenizer *t, const char *text, size_t len, struct sp_tok_vec *out) {
    sp_status rc;
    struct work w = {0};
    struct sp_span_vec spans = {0};
    if (len == 0) return SP_OK;
    if (len > (size_t)INT32_MAX / 3)
        return sp_err(SP_E_INVALID, "%s: fragment of %zu bytes is too long", __func__, len);
    uint8_t *clean = sp_malloc(3 * len);
    if (!clean) return sp_err(SP_E_NOMEM, "%s: %zu bytes of scratch", __func__, 3 * len);
    const size_t n_clean = clean_utf8((const uint8_t *)text, len, clean);

    rc = sp_pretok_split(t->pre, (const char *)clean, n_clean, &spans);
    for (size_t i = 0; rc == SP_OK && i < spans.n; i++) {
        if (spans.s[i].len == 0) continue;
        rc = encode_word(t, &w, clean + spans.s[i].off, spans.s[i].len, out);
    }
    sp_free(spans.s);
    sp_free(w.enc);
    sp_free(w.key);
    sp_free(w.s);
    sp_free(w.h.b);
    sp_free(clean);
    return rc;
}
