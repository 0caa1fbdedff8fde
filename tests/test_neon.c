/*
 * test_neon.c -- what tests/test_kernels.c does not cover for the AArch64
 * kernels (quant/arm/): that the live dispatch table holds the level CPU
 * detection and SPARROW_ISA select (and, under qemu, that detection reports
 * what the emulated CPU has: SPARROW_EXPECT_DOTPROD=0|1), the activation
 * quantizers byte for byte on hand-made blocks (exact ties, both signs of
 * the maximum, zeros, subnormal scales, inf and NaN, which fall back to
 * ref.c), and vec_dot on activation blocks from_float never makes (-128,
 * random bsums).  Levels: "neon" and "dotprod", built by calling
 * sp_quant_register_neon() on copies of the reference table.  On other
 * architectures it checks nothing and says so.
 */
#include "core/core.h"
#include "core/cpu.h"
#include "quant/isa.h"
#include "quant/quant.h"
#include "quant/ref.h"
#include "quant/types.h"
#include "test_util.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__)

/* ---- named thresholds ------------------------------------------------------
 * Quantized types: the integer sums are exact and the per-block float steps
 * are ref.c's, so only float summation order may differ (none with GCC);
 * error relative to sum |w_i * x_i| of the dequantized rows.
 * Float types: ref.c accumulates in double, the kernels in 16 float lanes
 * with fused multiply-adds. */
#define QDOT_REL_TOL 1e-5
#define FDOT_REL_TOL 1e-5

/* ---- data ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [-1, 1) */
static float rnd_unit(void) {
    return (float)((double)rnd_u32() / 2147483648.0 - 1.0);
}

static void fill_floats(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_unit() * scale;
}

static void fill_bytes(void *p, size_t n) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd_u32();
}

/* A finite fp16 scale in +-[2^-10, 2^-4). */
static uint16_t rnd_scale16(void) {
    return sp_fp32_to_fp16((float)((rnd_u32() & 1) ? 1 : -1) * ldexpf(1.0f + rnd_unit() * 0.5f, -5 - (int)(rnd_u32() % 5)));
}

/* Random weight row of type t: every quant bit random, fp16 scale fields
 * finite (the byte offsets of d/dmin/m per layout in types.h). */
static void random_row(uint32_t t, void *row, int64_t n) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    const int64_t nb = n / tr->block_elems;
    fill_bytes(row, (size_t)nb * tr->block_bytes);
    uint8_t *b = row;
    if (t == SP_QTYPE_F32) {
        fill_floats(row, n, 1.0f);
        return;
    }
    if (t == SP_QTYPE_F16 || t == SP_QTYPE_BF16) {
        uint16_t *h = row;
        for (int64_t i = 0; i < n; i++) {
            const float v = rnd_unit();
            h[i] = t == SP_QTYPE_F16 ? sp_fp32_to_fp16(v) : sp_fp32_to_bf16(v);
        }
        return;
    }
    for (int64_t i = 0; i < nb; i++, b += tr->block_bytes) {
        uint16_t s[2] = {rnd_scale16(), rnd_scale16()};
        switch (t) {
        case SP_QTYPE_Q4_0: case SP_QTYPE_Q5_0: case SP_QTYPE_Q8_0: memcpy(b, s, 2); break;
        case SP_QTYPE_Q4_1: case SP_QTYPE_Q5_1: case SP_QTYPE_Q4_K: case SP_QTYPE_Q5_K: memcpy(b, s, 4); break;
        case SP_QTYPE_Q2_K: memcpy(b + offsetof(struct sp_block_q2_k, d), s, 4); break;
        case SP_QTYPE_Q3_K: memcpy(b + offsetof(struct sp_block_q3_k, d), s, 2); break;
        case SP_QTYPE_Q6_K: memcpy(b + offsetof(struct sp_block_q6_k, d), s, 2); break;
        default: break;
        }
    }
}

/* Random activation row of type t: random quants (including -128), finite
 * scales; Q8_K bsums random too (both sides read them as given). */
static void random_act(uint32_t t, void *row, int64_t n) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    const int64_t nb = n / tr->block_elems;
    fill_bytes(row, (size_t)nb * tr->block_bytes);
    uint8_t *b = row;
    for (int64_t i = 0; i < nb; i++, b += tr->block_bytes) {
        if (t == SP_QTYPE_Q8_K) {
            const float d = rnd_unit() * 0.01f;
            memcpy(b, &d, 4);
            struct sp_block_q8_k *k = (void *)b;
            for (int g = 0; g < 16; g++) k->bsums[g] = (int16_t)((int)(rnd_u32() % 4097) - 2048);
        } else {
            const uint16_t s[2] = {rnd_scale16(), rnd_scale16()};
            memcpy(b, s, t == SP_QTYPE_Q8_1 ? 4 : 2);
        }
    }
}

/* ---- levels ----------------------------------------------------------------- */

struct level {
    const char *name;
    struct sp_qtraits table[SP_QTYPE_COUNT];
};

static void build_level(struct level *lv, const char *name, bool dotprod) {
    lv->name = name;
    memset(lv->table, 0, sizeof lv->table);
    for (uint32_t t = 0; t < SP_QTYPE_COUNT; t++) {
        const struct sp_qtraits *r = sp_qtraits_ref(t);
        if (r) lv->table[t] = *r;
    }
    const struct sp_cpu_features f = {.neon = true, .dotprod = dotprod};
    sp_quant_register_neon(lv->table, &f);
}

static const uint32_t weight_types[] = {SP_QTYPE_F32,  SP_QTYPE_F16,  SP_QTYPE_BF16, SP_QTYPE_Q4_0, SP_QTYPE_Q4_1,
                                        SP_QTYPE_Q5_0, SP_QTYPE_Q5_1, SP_QTYPE_Q8_0, SP_QTYPE_Q2_K, SP_QTYPE_Q3_K,
                                        SP_QTYPE_Q4_K, SP_QTYPE_Q5_K, SP_QTYPE_Q6_K};
static const uint32_t act_types[] = {SP_QTYPE_F16, SP_QTYPE_BF16, SP_QTYPE_Q8_0, SP_QTYPE_Q8_1, SP_QTYPE_Q8_K};

static bool is_float_type(uint32_t t) {
    return t == SP_QTYPE_F32 || t == SP_QTYPE_F16 || t == SP_QTYPE_BF16;
}

/* ---- from_float: bytes equal to ref.c ---------------------------------------- */

static int n_exact_rows;

static void check_from_float_row(const struct level *lv, uint32_t t, const float *x, int64_t n, const char *what) {
    const size_t rb = sp_qtype_row_bytes(t, n);
    uint8_t *a = malloc(rb), *b = malloc(rb);
    memset(a, 0xa5, rb);
    memset(b, 0x5a, rb);
    sp_qtraits_ref(t)->from_float(x, a, n);
    lv->table[t].from_float(x, b, n);
    size_t first = rb;
    for (size_t i = 0; i < rb && first == rb; i++)
        if (a[i] != b[i]) first = i;
    CHECKF(first == rb, "%s %s from_float (%s, n=%lld): byte %zu differs: ref %02x got %02x", lv->name,
           sp_qtype_name(t), what, (long long)n, first, first < rb ? a[first] : 0, first < rb ? b[first] : 0);
    n_exact_rows += first == rb;
    free(a);
    free(b);
}

/* Block contents that stress the rounding and the fall-back paths; n is a
 * multiple of 256.  Variant v picks the pattern. */
static void special_floats(float *x, int64_t n, int v) {
    const float tiny = 1e-39f; /* subnormal */
    for (int64_t i = 0; i < n; i++) {
        const int64_t j = i % 32;
        switch (v) {
        case 0: x[i] = 0.0f; break;                                     /* all zero */
        case 1: x[i] = j == 0 ? 127.0f : (float)(j - 16) + 0.5f; break; /* id = 1: exact ties */
        case 2: x[i] = j == 5 ? -127.0f : (float)(16 - j) - 0.5f; break; /* max negative, ties */
        case 3: x[i] = (i % 7 == 0) ? -3.0f : ((i % 7 == 3) ? 3.0f : rnd_unit()); break; /* +-max both */
        case 4: x[i] = rnd_unit() * tiny; break;                         /* subnormal: scale overflows */
        case 5: x[i] = i % 97 == 3 ? INFINITY : rnd_unit(); break;
        case 6: x[i] = i % 89 == 1 ? NAN : rnd_unit() * 100; break;
        case 7: x[i] = i % 61 == 60 ? -INFINITY : rnd_unit() * 1e-20f; break;
        case 8: x[i] = rnd_unit() * 70000.0f; break;                     /* past fp16 range */
        case 9: x[i] = (float)((int)(rnd_u32() % 255) - 127) * 0.5f; break; /* many ties */
        case 10: x[i] = (i % 2) ? -0.0f : 0.0f; break;
        default: x[i] = rnd_unit() * ldexpf(1.0f, (int)(rnd_u32() % 60) - 30); break; /* mixed magnitudes */
        }
    }
}

#define N_SPECIAL 12

static void test_from_float(const struct level *lv) {
    static const int64_t sizes[] = {256, 512, 4096};
    float *x = malloc(4096 * sizeof(float));
    for (size_t k = 0; k < SP_ARRAY_LEN(act_types); k++) {
        const uint32_t t = act_types[k];
        for (size_t s = 0; s < SP_ARRAY_LEN(sizes); s++) {
            for (int rep = 0; rep < 4; rep++) {
                fill_floats(x, sizes[s], rep == 0 ? 1.0f : rep == 1 ? 1e-3f : rep == 2 ? 300.0f : 1e6f);
                check_from_float_row(lv, t, x, sizes[s], "random");
            }
        }
        for (int v = 0; v < N_SPECIAL; v++) {
            char what[32];
            snprintf(what, sizeof what, "pattern %d", v);
            special_floats(x, 512, v);
            check_from_float_row(lv, t, x, 512, what);
        }
        /* Odd lengths for the element types (vector body + scalar tail). */
        if (t == SP_QTYPE_F16 || t == SP_QTYPE_BF16) {
            static const int64_t odd[] = {1, 3, 7, 8, 9, 15, 17, 33, 100};
            for (size_t s = 0; s < SP_ARRAY_LEN(odd); s++) {
                special_floats(x, 256, 11);
                check_from_float_row(lv, t, x, odd[s], "odd length");
            }
        }
    }
    free(x);
}

/* ---- vec_dot on activation blocks from_float never makes ------------------- */

static double worst_rel[SP_QTYPE_COUNT];
static int n_bit_equal[SP_QTYPE_COUNT], n_dots[SP_QTYPE_COUNT];

/* sum |w_i * x_i| over the dequantized rows: the scale errors are measured against. */
static double abs_dot(uint32_t t, const void *w, const void *x, int64_t n) {
    const uint32_t xt = sp_qtraits_ref(t)->vec_dot_type;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    sp_qtraits_ref(t)->to_float(w, a, n);
    sp_qtraits_ref(xt)->to_float(x, b, n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)a[i] * b[i]);
    free(a);
    free(b);
    return s;
}

static void check_dot(const struct level *lv, uint32_t t, const void *w, const void *x, int64_t n, const char *what) {
    float want = 0, got = 0;
    sp_qtraits_ref(t)->vec_dot(n, &want, w, x);
    lv->table[t].vec_dot(n, &got, w, x);
    const double scale = abs_dot(t, w, x, n) + 1e-30;
    const double rel = fabs((double)got - want) / scale;
    const double tol = is_float_type(t) ? FDOT_REL_TOL : QDOT_REL_TOL;
    CHECKF(rel <= tol && isfinite(got), "%s %s vec_dot (%s, n=%lld): got %.9g want %.9g (rel err %.3g > %.3g)",
           lv->name, sp_qtype_name(t), what, (long long)n, got, want, rel, tol);
    if (rel > worst_rel[t]) worst_rel[t] = rel;
    n_bit_equal[t] += memcmp(&got, &want, sizeof got) == 0;
    n_dots[t]++;
}

static void test_vec_dot(const struct level *lv) {
    static const int64_t q32_sizes[] = {32, 64, 96, 224, 4096};
    static const int64_t qk_sizes[] = {256, 512, 768, 4096};
    static const int64_t f_sizes[] = {1, 3, 4, 15, 16, 17, 33, 100, 4096};
    const size_t cap = 4096 * 4 + 64;
    uint8_t *w = malloc(cap), *x = malloc(cap);
    for (size_t k = 0; k < SP_ARRAY_LEN(weight_types); k++) {
        const uint32_t t = weight_types[k];
        const struct sp_qtraits *tr = sp_qtraits_ref(t);
        const uint32_t xt = tr->vec_dot_type;
        const int64_t *sizes = is_float_type(t) ? f_sizes : tr->block_elems == 32 ? q32_sizes : qk_sizes;
        const size_t n_sizes = is_float_type(t) ? SP_ARRAY_LEN(f_sizes)
                               : tr->block_elems == 32 ? SP_ARRAY_LEN(q32_sizes) : SP_ARRAY_LEN(qk_sizes);
        for (size_t s = 0; s < n_sizes; s++) {
            const int64_t n = sizes[s];
            for (int rep = 0; rep < 3; rep++) {
                /* random bits in every quant field */
                random_row(t, w, n);
                if (is_float_type(t))
                    random_row(xt, x, n);
                else
                    random_act(xt, x, n);
                check_dot(lv, t, w, x, n, "random blocks");
            }
        }
    }
    free(w);
    free(x);
}

/* ---- the live table -------------------------------------------------------------- */

static bool same_entries(const struct sp_qtraits *a, const struct sp_qtraits *b) {
    return a->vec_dot == b->vec_dot && a->from_float == b->from_float && a->gemm == b->gemm;
}

/* sp_qtraits_get() must hold the level that detection and SPARROW_ISA
 * select; SPARROW_EXPECT_DOTPROD=0|1 (set by scripts/arm64-test.sh per
 * emulated CPU) pins what detection must report. */
static void test_dispatch(const struct level *neon, const struct level *dot) {
    const struct sp_cpu_features *f = sp_cpu_features();
    const char *expect = getenv("SPARROW_EXPECT_DOTPROD");
    if (expect && *expect)
        CHECKF(f->dotprod == (atoi(expect) != 0), "detected dotprod=%d, SPARROW_EXPECT_DOTPROD=%s", f->dotprod,
               expect);
    const char *isa = getenv("SPARROW_ISA");
    const char *want = "neon";
    if (isa && !strcmp(isa, "ref")) want = "ref";
    else if (f->dotprod && !(isa && !strcmp(isa, "neon"))) want = "dotprod";
    printf("dispatch: cpu neon=%d dotprod=%d, SPARROW_ISA=%s -> expect %s\n", f->neon, f->dotprod, isa ? isa : "(unset)",
           want);
    for (size_t k = 0; k < SP_ARRAY_LEN(weight_types); k++) {
        const uint32_t t = weight_types[k];
        const struct sp_qtraits *live = sp_qtraits_get(t);
        const struct sp_qtraits *sel = !strcmp(want, "ref") ? sp_qtraits_ref(t)
                                       : !strcmp(want, "dotprod") ? &dot->table[t] : &neon->table[t];
        CHECKF(same_entries(live, sel), "live table entry %s is not the %s level's", sp_qtype_name(t), want);
    }
    for (size_t k = 0; k < SP_ARRAY_LEN(act_types); k++) {
        const uint32_t t = act_types[k];
        const struct sp_qtraits *sel = !strcmp(want, "ref") ? sp_qtraits_ref(t) : &neon->table[t];
        CHECKF(sp_qtraits_get(t)->from_float == sel->from_float, "live from_float %s is not the %s level's",
               sp_qtype_name(t), want);
    }
}

static void run_level(const struct level *lv) {
    memset(worst_rel, 0, sizeof worst_rel);
    memset(n_bit_equal, 0, sizeof n_bit_equal);
    memset(n_dots, 0, sizeof n_dots);
    n_exact_rows = 0;
    const int before = test_failures;
    test_from_float(lv);
    test_vec_dot(lv);
    printf("level %s: from_float %d rows byte-identical to ref\n", lv->name, n_exact_rows);
    printf("  %-5s %12s %10s %s\n", "type", "worst rel", "limit", "bit-equal dots");
    for (size_t k = 0; k < SP_ARRAY_LEN(weight_types); k++) {
        const uint32_t t = weight_types[k];
        printf("  %-5s %12.3g %10.3g %d/%d\n", sp_qtype_name(t), worst_rel[t],
               is_float_type(t) ? FDOT_REL_TOL : QDOT_REL_TOL, n_bit_equal[t], n_dots[t]);
    }
    printf("level %s: %s\n", lv->name, test_failures == before ? "ok" : "FAILED");
}

int main(void) {
    sp_quant_init();
    static struct level neon, dot;
    build_level(&neon, "neon", false);
    build_level(&dot, "dotprod", true);
    const bool have_dot = sp_cpu_features()->dotprod;
    test_dispatch(&neon, &dot);
    run_level(&neon);
    if (have_dot) {
        run_level(&dot);
    } else {
        printf("level dotprod: skipped (the CPU does not report FEAT_DotProd)\n");
    }
    return test_report("test_neon");
}

#else

int main(void) {
    printf("test_neon: not an AArch64 build, nothing to check (scripts/arm64-test.sh runs it under qemu)\n");
    return test_report("test_neon");
}

#endif
