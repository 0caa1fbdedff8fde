/*
 * ref.h -- the plain-C reference kernels (ref.c): dequantize, quantize and
 * dot product for every type in quant.h.  They are the specification and the
 * oracle that SIMD variants are tested against; traits.c puts them in the
 * reference dispatch table.  Most callers should go through sp_qtraits_get()
 * rather than call these directly.
 *
 * Signatures match sp_to_float_fn / sp_from_float_fn / sp_vec_dot_fn:
 *   to_float(src blocks, dst floats, n)     n a multiple of the block size
 *   from_float(src floats, dst blocks, n)
 *   vec_dot(n, &s, w row, x row)            x already in w's vec_dot_type
 */
#ifndef SP_QUANT_REF_H
#define SP_QUANT_REF_H

#include <stddef.h>
#include <stdint.h>

/* ---- to_float (dequantize) ----------------------------------------------
 * Arithmetic order follows ggml's dequantize_row_* so results are bit-equal
 * when neither side contracts multiply-adds into FMA. */
void sp_f32_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_f16_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_bf16_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q4_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q4_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q5_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q5_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q8_0_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q8_1_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q2_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q3_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q4_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q5_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q6_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_q8_k_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);

/* ---- from_float (quantize) ----------------------------------------------
 * Activation types (F32, F16, BF16, Q8_0, Q8_1, Q8_K) round exactly as
 * ggml's x86 CPU backend does when it converts activations for a matmul;
 * the golden tests depend on this.  Q8_0 therefore follows the activation
 * rule (id = 127/amax, round half to even), not llama-quantize's file rule
 * (id = 1/d, round half away from zero).
 * Weight quantizers (Q4_0, Q4_1, Q5_0, Q5_1) follow ggml's simple *_ref
 * rules, so they reproduce llama-quantize's output without an imatrix.
 * K-quant quantizers are Sparrow's own scale search (not ggml's): valid
 * blocks with reasonable error, but not byte-identical to llama-quantize. */
void sp_f32_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_f16_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_bf16_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q4_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q4_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q5_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q5_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q8_0_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q8_1_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q2_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q3_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q4_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q5_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q6_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);
void sp_q8_k_from_float_ref(const float *restrict src, void *restrict dst, int64_t n);

/* ---- vec_dot --------------------------------------------------------------
 * Quantized types: exact int32 sums inside each block (sub-block scales are
 * applied in integers for the K-quants), then a float accumulation over
 * blocks in order.  F32/F16/BF16 accumulate in double. */
void sp_vec_dot_f32_f32_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_f16_f16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_bf16_bf16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q4_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q4_1_q8_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q5_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q5_1_q8_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q8_0_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q2_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q3_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q4_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
/* Q4_K_g8 (quant.h, repack_k.c): Q4_K's values and float order */
void sp_q4_k_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_vec_dot_q4_k_g8_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
/* The repacks into the resident layouts (sp_qtype_repack calls them): n_rows
 * rows of n elements (a multiple of 256), stride bytes apart, in place. */
void sp_q4_0_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_q4_k_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride);
/* Their inverses (sp_qtype_unrepack): the file type's bytes back, exactly. */
void sp_q4_0_g8_unrepack(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_q4_k_g8_unrepack(void *rows, int64_t n_rows, int64_t n, size_t stride);
void sp_vec_dot_q5_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);
void sp_vec_dot_q6_k_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);

/* ---- resident layouts (repack.c) -------------------------------------------
 * Q4_0_g8 (quant.h): the same values and the same float order as Q4_0. */
void sp_q4_0_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n);
void sp_vec_dot_q4_0_g8_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x);

#endif /* SP_QUANT_REF_H */
