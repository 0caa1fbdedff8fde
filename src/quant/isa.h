/*
 * isa.h -- registration hooks of the ISA kernel files.  sp_quant_init()
 * calls each one whose instruction set the CPU supports; a hook replaces
 * entries of the dispatch table with its variants.  Every variant it installs
 * is tested against the reference kernels in tests/test_kernels.c.
 */
#ifndef SP_QUANT_ISA_H
#define SP_QUANT_ISA_H

#include "core/cpu.h"
#include "quant.h"

#if defined(__x86_64__)
void sp_quant_register_avx2(struct sp_qtraits *table, const struct sp_cpu_features *f);
void sp_quant_register_avx512(struct sp_qtraits *table, const struct sp_cpu_features *f);
void sp_quant_register_amx(struct sp_qtraits *table, const struct sp_cpu_features *f);
/* Native types (x86/native_kernels.inc): ntable is indexed by id -
 * SP_QTYPE_NATIVE_FIRST (native.h). */
void sp_quant_register_native_avx2(struct sp_qtraits *ntable, const struct sp_cpu_features *f);
void sp_quant_register_native_avx512(struct sp_qtraits *ntable, const struct sp_cpu_features *f);
#endif
#if defined(__aarch64__)
void sp_quant_register_neon(struct sp_qtraits *table, const struct sp_cpu_features *f);
/* arm/dotprod.c; called by sp_quant_register_neon() when f->dotprod. */
void sp_quant_register_dotprod(struct sp_qtraits *table, const struct sp_cpu_features *f);
/* Native types (arm/native_kernels.h), ntable as on x86; calls the dotprod
 * variant when f->dotprod. */
void sp_quant_register_native_neon(struct sp_qtraits *ntable, const struct sp_cpu_features *f);
void sp_quant_register_native_dotprod(struct sp_qtraits *ntable, const struct sp_cpu_features *f);
#endif

#endif /* SP_QUANT_ISA_H */
