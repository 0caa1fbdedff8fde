/*
 * amx.h -- test and benchmark hooks of the AMX int8 batched-product kernels
 * (x86/amx.c).  The engine never calls these: it reaches the kernels through
 * the dispatch table (sp_quant_register_amx in isa.h).  The "emu" kernels are
 * the same code with the tile instructions emulated in plain C (amx_emu.c),
 * so the packing and scaling logic is tested on any AVX2 machine.
 */
#ifndef SP_QUANT_AMX_H
#define SP_QUANT_AMX_H

#include "quant/quant.h"

#include <stdbool.h>

/* The AMX kernel for weight type t, or NULL when t has none or AMX is not
 * usable in this process (no CPU support, OS refused tile state, or
 * SPARROW_AMX=0).  Valid after sp_quant_init(). */
sp_gemm_fn sp_quant_amx_kernel(uint32_t t);

/* The emulated-tile twin of the kernel for t, or NULL when t has none.
 * Needs AVX2+FMA+F16C (the caller checks); slow: for tests only. */
sp_gemm_fn sp_quant_amx_emu_kernel(uint32_t t);

/* What the AMX kernel for t falls back to (n_tok < 16, tails): the table
 * entry it replaced, or the current table's path when AMX is not installed.
 * Same contract as sp_gemm_fn. */
void sp_quant_amx_fallback(uint32_t t, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                           size_t x_stride, int64_t n_tok, float *y, int64_t ldy);

#endif /* SP_QUANT_AMX_H */
