/*
 * tokenizer.h -- text <-> token ids for the two vocabulary families:
 *  - SPM (SentencePiece-style BPE with scores; GGUF tokenizer.ggml.model =
 *    "llama" and llama2.c tokenizer.bin): spaces -> U+2581, optional leading
 *    space, highest-score bigram merges, byte fallback to <0xXX> tokens.
 *  - BPE (byte-level, GGUF model "gpt2"): a pre-tokenizer regex chosen by
 *    tokenizer.ggml.pre (PCRE2 with Unicode properties), bytes mapped to
 *    printable code points, merges applied by rank.
 * Behaviour is llama.cpp's (src/llama-vocab.cpp, commit 3f545bec).  With
 * parse_special = false control-token text in the input ("<s>", "<|im_end|>")
 * is plain text, but user-defined tokens (added words such as Qwen3's
 * "<think>") are still matched whole, as llama.cpp does; with parse_special
 * the text of every control, user-defined and unknown token becomes that
 * token (longest first), as a rendered chat template needs.  (llama.cpp's
 * per-model lstrip/rstrip token attributes -- phi-3's, some BERT masks' --
 * are not applied.)
 * Files: tokenizer.c (common), spm.c, bpe.c, pretok.c (regex table).
 */
#ifndef SP_TOKENIZER_H
#define SP_TOKENIZER_H

#include "format/model_file.h"

struct sp_tokenizer;

/* Build a tokenizer over v.  v must outlive the tokenizer (it is borrowed).
 * SP_E_UNSUPPORTED for an unknown vocabulary kind or pre-tokenizer name (the
 * message names it), SP_E_FORMAT for an inconsistent vocabulary (a token text
 * appearing twice, a missing token or merge string), SP_E_NOMEM.  Merges
 * naming tokens that do not exist are accepted, as llama.cpp accepts them
 * (they can never apply).  Special ids outside the vocabulary are ignored
 * with a warning.  Takes a few ms for a 150k-token vocabulary. */
sp_status sp_tokenizer_init(const struct sp_vocab_data *v, struct sp_tokenizer **out);
void sp_tokenizer_free(struct sp_tokenizer *t); /* NULL is a no-op */

/* Encode len bytes of text (need not be NUL-terminated; invalid UTF-8 is
 * handled as llama.cpp handles it).  parse_special: llama_tokenize's (see
 * above).  add_bos is llama_tokenize's add_special:
 * prepend BOS if the vocabulary has one and asks for it (add_bos flag), and
 * append EOS for the rare vocabularies whose add_eos flag is set.  Writes up
 * to cap ids and the total count to *n_out; SP_E_BUFFER when cap is too small
 * (with *n_out = needed; out may be NULL when cap is 0).  SP_E_NOMEM,
 * SP_E_INVALID for bad arguments.  Thread-safe on a shared tokenizer
 * (scratch is allocated per call). */
sp_status sp_tokenizer_encode(const struct sp_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *out, int32_t cap, int32_t *n_out);

/* The raw bytes of one token (llama_token_to_piece with special = false):
 * byte tokens give their byte, SPM U+2581 gives a space, BPE code points map
 * back to bytes, control and unknown tokens give "", user-defined tokens
 * their text.  Writes up to cap bytes (no NUL); *n_out = full length;
 * SP_E_BUFFER if cap is too small (buf may be NULL when cap is 0);
 * SP_E_INVALID for an id out of range. */
sp_status sp_tokenizer_piece(const struct sp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *n_out);

/* Concatenate pieces, as llama_detokenize(remove_special = true,
 * unparse_special = false): a leading BOS and a trailing EOS are skipped when
 * the vocabulary adds them, control tokens render as "", and with
 * add_space_prefix (SPM) one leading space of the first remaining piece is
 * dropped, so decode(encode(x, add_bos)) == x.  Two differences from
 * llama.cpp: it keeps that space when it skipped a BOS (its golden
 * "full_detokenized" strings start with " "), and its clean_spaces pass for
 * BPE vocabularies (" ," -> ",", " 's" -> "'s") is not applied, as streamed
 * pieces never get it either.  Same buffer contract as sp_tokenizer_piece;
 * SP_E_INVALID names the first id out of range. */
sp_status sp_tokenizer_decode(const struct sp_tokenizer *t, const int32_t *ids, int32_t n, char *buf, size_t cap,
                              size_t *n_out);

/* EOS, EOT and the other end-of-generation ids llama.cpp recognises by text
 * ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eom_id|>", ...). */
bool sp_tokenizer_is_eog(const struct sp_tokenizer *t, int32_t id);

#endif /* SP_TOKENIZER_H */
