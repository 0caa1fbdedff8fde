/*
 * dotprod.c -- the integer vec_dot and gemm kernels of kernels.h built with
 * the Armv8.2 dot product instruction (SDOT: four int8 products summed into
 * each int32 lane).  This file alone is compiled with
 * -march=armv8.2-a+dotprod; sp_quant_register_neon() calls its hook only
 * when the CPU reports the extension (HWCAP_ASIMDDP on Linux), so nothing
 * here runs on a CPU without it.  Results equal neon.c's exactly.
 */
#include "quant/isa.h"

#include <arm_neon.h>

#if !defined(__ARM_FEATURE_DOTPROD)
#error "dotprod.c must be compiled with -march=armv8.2-a+dotprod (see the Makefile)"
#endif

static inline __attribute__((always_inline)) int32x4_t arm_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    return vdotq_s32(acc, a, b);
}

#include "kernels.h"
#include "native_kernels.h"

/* Replace the integer vec_dot/gemm entries of table with the SDOT ones.
 * Call only if f->dotprod (the CPU has FEAT_DotProd). */
void sp_quant_register_dotprod(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!f->dotprod) return;
    arm_install_int(table);
}

/* The native types' vec_dot with SDOT.  Call only if f->dotprod. */
void sp_quant_register_native_dotprod(struct sp_qtraits *ntable, const struct sp_cpu_features *f) {
    if (!f->dotprod) return;
    armn_install(ntable);
}
