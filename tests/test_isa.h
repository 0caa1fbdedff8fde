/*
 * test_isa.h -- the SIMD levels the kernel tests (test_kernels, test_native)
 * run their tables at: AVX2 and AVX-512 on x86-64 (AVX-512 under SIMDe when
 * built with SP_TEST_EMULATED_AVX512, by tests/test_avx512_emu.sh), NEON
 * without and with SDOT on arm64.  Each level carries the CPU features its
 * registration hooks are called with; a level the CPU lacks is reported as
 * skipped.
 */
#ifndef SP_TEST_ISA_H
#define SP_TEST_ISA_H

#include "core/cpu.h"
#include "quant/isa.h"
#include "quant/quant.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

enum test_isa { TEST_ISA_AVX2, TEST_ISA_AVX512, TEST_ISA_NEON, TEST_ISA_DOTPROD };

struct test_isa_level {
    const char *name;
    enum test_isa isa;
    bool have;                   /* runs here (and is not covered by another test binary) */
    struct sp_cpu_features feat; /* what to register the level's kernels with */
};

#define TEST_ISA_MAX 2

/* Fills lv with this build's levels and returns how many there are. */
static inline int test_isa_levels(struct test_isa_level lv[TEST_ISA_MAX]) {
    int n = 0;
#if defined(__x86_64__)
    const struct sp_cpu_features *f = sp_cpu_features();
    lv[n++] = (struct test_isa_level){"avx2", TEST_ISA_AVX2, f->avx2 && f->fma && f->f16c, *f};
    lv[n++] = (struct test_isa_level){"avx512", TEST_ISA_AVX512,
                                      f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni && f->fma && f->f16c, *f};
#if defined(SP_TEST_EMULATED_AVX512)
    /* avx512.c built with SIMDe runs anywhere; the native binary covers AVX2 */
    struct sp_cpu_features *e = &lv[1].feat;
    e->avx512f = e->avx512bw = e->avx512vl = e->avx512vnni = e->avx512bf16 = e->fma = e->f16c = true;
    lv[1].name = "avx512(emulated)";
    lv[1].have = true;
    lv[0].have = false;
#endif
#elif defined(__aarch64__)
    /* neon: plain Advanced SIMD even where SDOT exists; dotprod: with SDOT */
    const struct sp_cpu_features *f = sp_cpu_features();
    lv[n] = (struct test_isa_level){"neon", TEST_ISA_NEON, f->neon, *f};
    lv[n++].feat.dotprod = false;
    lv[n++] = (struct test_isa_level){"dotprod", TEST_ISA_DOTPROD, f->neon && f->dotprod, *f};
#endif
    for (int i = 0; i < n; i++) {
        printf("level %-16s %s\n", lv[i].name, lv[i].have ? "tested" : "skipped (CPU lacks it, or tested by another binary)");
    }
    return n;
}

/* Registers level lv's native-type kernels (and the resident layouts')
 * in tab, a table of native ids (test_setup_levels' reg). */
static inline void test_isa_register_native(struct sp_qtraits *tab, const struct test_isa_level *lv) {
#if defined(__x86_64__)
    if (lv->isa == TEST_ISA_AVX512) sp_quant_register_native_avx512(tab, &lv->feat);
    else sp_quant_register_native_avx2(tab, &lv->feat);
#elif defined(__aarch64__)
    sp_quant_register_native_neon(tab, &lv->feat);
#else
    (void)tab;
    (void)lv;
#endif
}

/* A level's dispatch table for the types [first, first + count). */
struct test_level {
    const char *name;
    bool have;
    struct sp_qtraits *tab; /* tab[t - first] */
};

/* Registers a level's kernels (lv says which) in tab. */
typedef void (*test_isa_register_fn)(struct sp_qtraits *tab, const struct test_isa_level *lv);

/* Fills levels[0..n) (n returned) with tables tabs[k * count ..], each a
 * copy of the reference traits of [first, first + count) plus, for levels
 * that run here, what reg registers. */
static inline int test_setup_levels(struct test_level levels[TEST_ISA_MAX], struct sp_qtraits *tabs, uint32_t first,
                                    uint32_t count, test_isa_register_fn reg) {
    struct test_isa_level isa[TEST_ISA_MAX];
    const int n = test_isa_levels(isa);
    for (int k = 0; k < n; k++) {
        struct test_level *l = &levels[k];
        l->name = isa[k].name;
        l->have = isa[k].have;
        l->tab = tabs + (size_t)k * count;
        memset(l->tab, 0, sizeof(struct sp_qtraits) * count);
        for (uint32_t i = 0; i < count; i++) {
            const struct sp_qtraits *r = sp_qtraits_ref(first + i);
            if (r) l->tab[i] = *r;
        }
        if (l->have) reg(l->tab, &isa[k]);
    }
    return n;
}

#endif
