/*
 * tok_internal.h -- what the tokenizer files share and nobody else sees: the
 * tokenizer object, the string -> id hash map, token attribute bits, a growable
 * id vector, and the entry points of spm.c, bpe.c and pretok.c.
 * The reference behaviour is llama.cpp's src/llama-vocab.cpp and
 * src/unicode.cpp (commit 3f545bec); comments name the llama.cpp function a
 * piece of logic mirrors.  Not a public header: include tokenizer.h instead.
 */
#ifndef SP_TOK_INTERNAL_H
#define SP_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- token attributes (llama.cpp llama_token_attr, as a bit set) -------- */
enum {
    SP_TOK_ATTR_UNKNOWN = 1u << 0,
    SP_TOK_ATTR_UNUSED = 1u << 1,
    SP_TOK_ATTR_NORMAL = 1u << 2,
    SP_TOK_ATTR_CONTROL = 1u << 3,
    SP_TOK_ATTR_USER_DEFINED = 1u << 4,
    SP_TOK_ATTR_BYTE = 1u << 5,
    SP_TOK_ATTR_EOG = 1u << 6, /* Sparrow's: ends generation (llama.cpp keeps a set) */
};

/* ---- string -> index map -------------------------------------------------
 * Open addressing over borrowed keys (keys[i], lens[i]); the map stores only
 * indices and hashes.  The first insert of a key wins (later duplicates are
 * reported, not stored). */
struct sp_tok_map {
    uint32_t mask;         /* n_slots - 1; n_slots is a power of two >= 2 * n */
    uint32_t *hash;        /* (n_slots) full hash of the key in the slot */
    int32_t *idx;          /* (n_slots) key index, -1 = empty */
    const char *const *keys;
    const uint32_t *lens;
};

uint32_t sp_tok_hash(const char *s, size_t n);

/* Build a map over n keys.  *dup_first / *dup_second receive the first
 * duplicate pair found (-1 if none).  SP_E_NOMEM. */
sp_status sp_tok_map_build(struct sp_tok_map *m, const char *const *keys, const uint32_t *lens, uint32_t n,
                           int32_t *dup_first, int32_t *dup_second);
void sp_tok_map_free(struct sp_tok_map *m);

/* Index of the key equal to s[0..n), or -1. */
int32_t sp_tok_map_find(const struct sp_tok_map *m, const char *s, size_t n);

/* ---- growable id vector (per call scratch) ------------------------------ */
struct sp_tok_vec {
    int32_t *ids;
    size_t n, cap;
};

/* Append id; SP_E_NOMEM on failure (the vector is unchanged). */
sp_status sp_tok_vec_push(struct sp_tok_vec *v, int32_t id);

/* ---- pre-tokenizer (pretok.c) -------------------------------------------
 * One byte range of the text a regex pass produced. */
struct sp_span {
    size_t off, len;
};

struct sp_span_vec {
    struct sp_span *s;
    size_t n, cap;
};

struct sp_pretok;

/* What a tokenizer.ggml.pre name implies besides its regexes. */
struct sp_pretok_info {
    bool ignore_merges; /* a word that is a whole token skips the merges (llama3, tekken) */
    bool no_bos;        /* llama.cpp drops the BOS id for this pre-tokenizer (chatglm) */
};

/* Compile the regex list for a pre-tokenizer name ("" = "default").
 * SP_E_UNSUPPORTED for an unknown name, SP_E_NOMEM, SP_E_FORMAT if PCRE2
 * rejects a pattern (a bug in the table). */
sp_status sp_pretok_init(const char *name, struct sp_pretok **out, struct sp_pretok_info *info);
void sp_pretok_free(struct sp_pretok *p);

/* Split text[0..len) (valid UTF-8 apart from lone surrogates) into words:
 * each regex splits every current piece into its matches and the gaps
 * between them (llama.cpp unicode_regex_split).  Spans go to *out (cleared
 * first).  Thread-safe.  SP_E_NOMEM, SP_E_INVALID when PCRE2 fails. */
sp_status sp_pretok_split(const struct sp_pretok *p, const char *text, size_t len, struct sp_span_vec *out);


/* A candidate merge of adjacent symbols left and right, as both tokenizers
 * queue them: the highest prio comes first (SPM: the merged token's score;
 * BPE: minus the merge rank), then the leftmost pair, as llama.cpp orders
 * them.  size is the bytes of left + right when queued; a popped pair whose
 * symbols changed size since is stale and skipped. */
struct sp_tok_bigram {
    double prio;
    int32_t left, right;
    uint32_t size;
};

/* Binary heap of bigrams; {0} is empty; free b with sp_free. */
struct sp_tok_heap {
    struct sp_tok_bigram *b;
    size_t n, cap;
};

/* SP_E_NOMEM when growing fails (the heap is unchanged). */
sp_status sp_tok_heap_push(struct sp_tok_heap *h, struct sp_tok_bigram x);
/* note: call only with h->n > 0. */
struct sp_tok_bigram sp_tok_heap_pop(struct sp_tok_heap *h);

/* ---- the tokenizer object ------------------------------------------------ */
struct sp_tokenizer {
    const struct sp_vocab_data *v; /* borrowed */
    enum sp_vocab_kind kind;
    uint32_t n_tokens;
    uint8_t *attr;                 /* (n_tokens) SP_TOK_ATTR_* bits */
    struct sp_tok_map tokens;      /* token text -> id */
    uint32_t *own_lens;            /* token lengths when the vocabulary has none, else NULL */
    int32_t bos, eos, unk;         /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix;

    int32_t *user_defined;         /* ids partitioned out of raw text, longest first */
    uint32_t n_user_defined;
    int32_t *special;              /* ... with parse_special: control, user-defined and
                                      unknown tokens, longest first */
    uint32_t n_special;

    /* SPM */
    int32_t byte_token[256];       /* byte -> "<0xXX>" (or the 1-char token), -1 if none */

    /* BPE */
    struct sp_tok_map merges;      /* "left right" -> rank */
    uint32_t *merge_lens;          /* (n_merges) */
    uint32_t *merge_split;         /* (n_merges) where llama.cpp splits the line (first ' ' at >= 1), 0 = none */
    struct sp_pretok *pre;
    bool ignore_merges;
    char byte_utf8[256][2];        /* GPT-2 byte -> printable code point, UTF-8 */
    uint8_t byte_utf8_len[256];
    int16_t cpt_byte[324];         /* inverse: code point (< 324) -> byte, -1 if unmapped */
};

/* SPM: tokenize one fragment (spaces already escaped to U+2581, prefix space
 * added) by llama.cpp's llm_tokenizer_spm_session.  Appends to *out. */
sp_status sp_spm_encode(const struct sp_tokenizer *t, const char *text, size_t len, struct sp_tok_vec *out);

/* BPE: llama.cpp's llm_tokenizer_bpe_session on one raw fragment: UTF-8
 * clean-up, regex pre-tokenization, byte mapping, merges.  Appends to *out. */
sp_status sp_bpe_encode(const struct sp_tokenizer *t, const char *text, size_t len, struct sp_tok_vec *out);

/* Fill byte_utf8 / cpt_byte (GPT-2 bytes_to_unicode). */
void sp_bpe_init_bytes(struct sp_tokenizer *t);

#endif /* SP_TOK_INTERNAL_H */
