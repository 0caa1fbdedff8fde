/*
 * native.h -- Sparrow's own block types (contract; docs/FORMAT.md is the
 * byte-level spec).
 *
 * Signed INT3 / INT4 / INT6 / INT8 weights in blocks of 32, 64 or 128, with a
 * per-block scale stored as FP16 or as an 8-bit exponent-only power of two
 * (E8M0, as OCP Microscaling), plus asymmetric (scale + min) variants of the
 * low-bit types.  A block's scale and quants are contiguous.  A row whose
 * length is not a multiple of the block ends in a zero-padded last block, so
 * sp_qtype_row_bytes(t, n) = ceil(n / block) * block_bytes for these types.
 *
 * Ids start at SP_QTYPE_NATIVE_FIRST, far above ggml's, and are stable once
 * released (files carry them).  A file that holds any of them says so in its
 * metadata (sparrow.requires = "native-types-1").
 *
 * Names: "i<bits>[a]_b<block>[_e8]": i4_b32 (INT4, 32-blocks, FP16 scale),
 * i4_b32_e8 (E8M0 scale), i3a_b64 (asymmetric INT3, FP16 scale + FP16 min).
 */
#ifndef SP_QUANT_NATIVE_H
#define SP_QUANT_NATIVE_H

#include "core/core.h"

#include <stdint.h>

#define SP_QTYPE_NATIVE_FIRST 1024u

/* Type id for a name: native names as above, and ggml names ("F32", "F16",
 * "BF16", "Q8_0", "Q4_K", ... case-insensitive).  -1 if unknown. */
int32_t sp_qtype_from_name(const char *name);

/* True for ids in the native range that name a type. */
bool sp_qtype_is_native(uint32_t t);

/* Quantize n_rows rows of n_per_row floats (row-major) into type t.  With imp
 * != NULL (n_per_row non-negative weights, one per input channel), scales and
 * rounding minimise sum_i imp[i] * (w_i - q_i)^2 per block; with NULL, the
 * plain squared error.  dst holds n_rows * sp_qtype_row_bytes(t, n_per_row)
 * bytes.  Works for native types and for every ggml type with a quantizer.
 * SP_E_UNSUPPORTED if t cannot be quantized to; SP_E_INVALID on bad sizes. */
sp_status sp_quantize_rows(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, const float *imp,
                           void *dst);

#endif /* SP_QUANT_NATIVE_H */
