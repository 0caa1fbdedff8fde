/*
 * cpu.h -- CPU feature detection, done once at sp_init() and read-only after.
 * The kernel dispatch table (quant/traits.c) chooses ISA variants from it.
 */
#ifndef SP_CPU_H
#define SP_CPU_H

#include <stdbool.h>

struct sp_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16, avxvnni;
    bool amx_tile, amx_int8, amx_bf16;
    bool neon, dotprod;
};

/* Features of the running CPU (and what the OS enabled).  Cached after the
 * first call; safe to call from any thread after sp_init(). */
const struct sp_cpu_features *sp_cpu_features(void);

#endif /* SP_CPU_H */
