/*
 * cpu.c -- CPU feature detection.  x86 uses GCC's __builtin_cpu_supports
 * (which also checks that the OS saves the wide registers); AArch64 has
 * Advanced SIMD always and asks the OS about the dot product extension
 * (getauxval on Linux, sysctl on macOS).  SPARROW_ISA caps are applied by
 * quant/traits.c, not here: this file reports the hardware.
 */
#include "cpu.h"

#include <stdatomic.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#if defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

static struct sp_cpu_features feats;
static atomic_int done;

#if defined(__x86_64__)
/* AMX: CPUID leaf 7 subleaf 0 EDX bits 22 (bf16), 24 (tile), 25 (int8), and
 * the OS must enable tile state in XCR0 (bits 17 XTILECFG, 18 XTILEDATA).
 * __builtin_cpu_supports has no AMX names in older compilers.  Linux also
 * wants a per-process arch_prctl before tile data is used: quant/x86/amx.c
 * asks for it. */
static void x86_amx(struct sp_cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return; /* no OSXSAVE: no xgetbv */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    if (((xlo >> 17) & 3) != 3) return;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    f->amx_bf16 = (d >> 22) & 1;
    f->amx_tile = (d >> 24) & 1;
    f->amx_int8 = (d >> 25) & 1;
}
#endif

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
#if defined(__x86_64__)
    x86_amx(&feats);
#endif
#elif defined(__aarch64__)
    feats.neon = true; /* Advanced SIMD is part of the base A64 instruction set */
#if defined(__linux__)
    feats.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int dp = 0;
    size_t dp_len = sizeof dp;
    feats.dotprod = sysctlbyname("hw.optional.arm.FEAT_DotProd", &dp, &dp_len, NULL, 0) == 0 && dp != 0;
#elif defined(__ARM_FEATURE_DOTPROD)
    feats.dotprod = true; /* no OS query known here: trust the compiler's target */
#endif
#endif
    atomic_store(&done, 1);
    return &feats;
}
