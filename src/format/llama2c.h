/*
 * llama2c.h -- karpathy/llama2.c checkpoints (.bin, legacy version 0 export)
 * and their tokenizer.bin.  Only format/ includes this header.
 *
 * .bin: 7 × i32 config {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 *   vocab_size (negative = unshared classifier), seq_len}, then F32 tensors:
 *   token_embedding (vocab, dim), rms_att (L, dim), wq (L, dim, dim),
 *   wk (L, kv_dim, dim), wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn (L, dim),
 *   w1 (L, hidden, dim), w2 (L, dim, hidden), w3 (L, hidden, dim),
 *   rms_final (dim), freq_cis_real/imag (seq_len, head_size/2 each, skipped),
 *   wcls (vocab, dim) when unshared.
 * tokenizer.bin: i32 max_token_length, then per token: f32 score, i32 len, bytes.
 */
#ifndef SP_LLAMA2C_H
#define SP_LLAMA2C_H

#include "core/file.h"
#include "model_file.h"

/* Fill mf from a llama2.c checkpoint: hparams (llama arch, adjacent-pair RoPE,
 * theta 10000, eps 1e-5) and a tensor directory under GGUF names
 * (token_embd.weight, blk.N.attn_q.weight, ..., output.weight only when
 * unshared) pointing into the .bin.  vocab_only skips the size check of the
 * tensor section. */
sp_status sp_llama2c_read(struct sp_file *f, struct sp_model_file *mf, bool vocab_only);

/* Read tokenizer.bin into mf->vocab as an SPM vocabulary (spaces become
 * U+2581, "<0xXX>" tokens typed as bytes, ids 0/1/2 unk/bos/eos), checking
 * that it has hp.n_vocab tokens when hparams are present. */
sp_status sp_llama2c_read_tokenizer(const char *path, struct sp_model_file *mf);
sp_status sp_llama2c_read_tokenizer_file(struct sp_file *f, struct sp_model_file *mf);

#endif /* SP_LLAMA2C_H */
