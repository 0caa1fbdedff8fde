/*
 * spm.c -- SentencePiece-style BPE over token scores (GGUF model "llama",
 * llama2.c tokenizer.bin): the text, already space-escaped to U+2581, starts
 * as one symbol per UTF-8 character; the adjacent pair whose concatenation is
 * the best-scoring token is merged until none is left; each final symbol is
 * its token, or its bytes as <0xXX> byte tokens.
 * Reference: llama.cpp llm_tokenizer_spm_session (src/llama-vocab.cpp).
 * Not here: the prefix space and escaping (tokenizer.c), decoding.
 */
#include "tokenizer/tok_internal.h"

#include <string.h>

struct sym {
    int32_t prev, next; /* neighbours in the live chain, -1 at the ends */
    uint32_t off, n;    /* bytes of the symbol in the text; n == 0 once merged away */
};

/* Queue the pair (left, right) if its concatenation is a token. */
static sp_status try_pair(const struct sp_tokenizer *t, const char *text, const struct sym *s, int32_t left,
                          int32_t right, struct sp_tok_heap *h) {
    if (left < 0 || right < 0) return SP_OK;
    const uint32_t size = s[left].n + s[right].n;
    const int32_t id = sp_tok_map_find(&t->tokens, text + s[left].off, size);
    if (id < 0) return SP_OK;
    const float score = t->v->scores ? t->v->scores[id] : 0.0f;
    return sp_tok_heap_push(h, (struct sp_tok_bigram){score, left, right, size});
}

/* Tokenize one fragment; see tok_internal.h.  Per-call scratch only. */
sp_status sp_spm_encode(const struct sp_tokenizer *t, const char *text, size_t len, struct sp_tok_vec *out) {
    static const uint8_t utf8_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    sp_status rc = SP_OK;
    struct sp_tok_heap h = {0};
    if (len == 0) return SP_OK;
    if (len > (size_t)INT32_MAX) return sp_err(SP_E_INVALID, "%s: fragment of %zu bytes is too long", __func__, len);
    struct sym *s = sp_malloc(len * sizeof *s);
    if (!s) return sp_err(SP_E_NOMEM, "%s: %zu symbols", __func__, len);

    /* one symbol per UTF-8 character, judged by its lead byte only */
    int32_t n_sym = 0;
    for (size_t off = 0; off < len;) {
        size_t n = utf8_len[(uint8_t)text[off] >> 4];
        if (n > len - off) n = len - off;
        s[n_sym] = (struct sym){n_sym - 1, off + n == len ? -1 : n_sym + 1, (uint32_t)off, (uint32_t)n};
        n_sym++;
        off += n;
    }

    for (int32_t i = 1; rc == SP_OK && i < n_sym; i++) rc = try_pair(t, text, s, i - 1, i, &h);
    while (rc == SP_OK && h.n > 0) {
        const struct sp_tok_bigram b = sp_tok_heap_pop(&h);
        struct sym *l = &s[b.left], *r = &s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        rc = try_pair(t, text, s, l->prev, b.left, &h);
        if (rc == SP_OK) rc = try_pair(t, text, s, b.left, l->next, &h);
    }

    /* Resegment.  Merged symbols are always tokens, so a symbol without a
     * token is a single character: emit its bytes (llama.cpp's rev_merge
     * lookup can only miss there). */
    for (int32_t i = 0; rc == SP_OK && i != -1; i = s[i].next) {
        const int32_t id = sp_tok_map_find(&t->tokens, text + s[i].off, s[i].n);
        if (id >= 0) {
            rc = sp_tok_vec_push(out, id);
            continue;
        }
        for (uint32_t j = 0; rc == SP_OK && j < s[i].n; j++) {
            int32_t b = t->byte_token[(uint8_t)text[s[i].off + j]];
            if (b < 0) b = t->unk; /* llama.cpp throws here; <unk> is the sane stand-in */
            if (b >= 0) rc = sp_tok_vec_push(out, b);
        }
    }
    sp_free(h.b);
    sp_free(s);
    return rc;
}
