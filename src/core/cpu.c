/*
 * cpu.c -- CPU feature detection.  x86 uses GCC's __builtin_cpu_supports
 * (which also checks that the OS saves the wide registers); ARM reads the
 * compile-time feature macros for now.
 */
#include "cpu.h"

#include <stdatomic.h>

static struct sp_cpu_features feats;
static atomic_int done;

const struct sp_cpu_features *sp_cpu_features(void) {
    if (atomic_load(&done)) return &feats;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    feats.avx2 = __builtin_cpu_supports("avx2");
    feats.fma = __builtin_cpu_supports("fma");
    feats.avx512f = __builtin_cpu_supports("avx512f");
    feats.avx512bw = __builtin_cpu_supports("avx512bw");
    feats.avx512vl = __builtin_cpu_supports("avx512vl");
    feats.avx512vnni = __builtin_cpu_supports("avx512vnni");
    feats.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    feats.f16c = feats.avx2; /* every AVX2 CPU we target has F16C */
#elif defined(__aarch64__)
    feats.neon = true;
#if defined(__ARM_FEATURE_DOTPROD)
    feats.dotprod = true;
#endif
#endif
    atomic_store(&done, 1);
    return &feats;
}
