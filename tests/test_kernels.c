/*
 * test_kernels.c -- the SIMD kernels (quant/x86/) against the reference
 * kernels (quant/ref.c), for every ISA level the CPU has: each level's
 * table is built by calling its registration hook on a copy of the
 * reference table.  Checks: activation quantizers (from_float) byte for
 * byte, vec_dot against the reference within named tolerances, gemm
 * against the same level's vec_dot (bit for bit, no allocation) for many
 * token and row counts, and the SPARROW_ISA override.  Levels the CPU
 * lacks are reported as skipped.  Not a benchmark (bench/kernels.c is).
 */
#include "core/core.h"
#include "core/cpu.h"
#include "quant/isa.h"
#include "quant/native.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "test_isa.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- named tolerances -------------------------------------------------------
 * Errors are measured against M = sum |w_i * x_i| over the dequantized
 * values, the natural scale of a dot product's rounding error.
 * TOL_VEC_DOT: SIMD vec_dot vs reference.  The reference accumulates floats
 *   in double (F32/F16/BF16) or in one float in block order; the SIMD ones
 *   in 8-lane float partial sums.  Worst seen ~1e-7.
 * TOL_GEMM: gemm vs the same level's vec_dot.  The x86 kernels are stricter
 *   than this: each (row, token) pair sums in vec_dot's order, so a batch
 *   gives the same bits as one token at a time, and that is checked too
 *   (the engine's results must not depend on how tokens are batched).
 * gemm must not allocate (sp_alloc_count): the token path never does. */
#define TOL_VEC_DOT 1e-5
#define TOL_GEMM 1e-5

static void rng_seed(uint64_t s) {
    *test_rng() = s * 0x9e3779b97f4a7c15ull + 1;
}

/* ---- ISA levels ------------------------------------------------------------ */

static int n_levels;
static struct test_level levels[TEST_ISA_MAX];
static struct sp_qtraits level_tabs[TEST_ISA_MAX][SP_QTYPE_COUNT];

static void register_level(struct sp_qtraits *tab, const struct test_isa_level *lv) {
#if defined(__x86_64__)
    sp_quant_register_avx2(tab, &lv->feat);
    if (lv->isa == TEST_ISA_AVX512) sp_quant_register_avx512(tab, &lv->feat);
#elif defined(__aarch64__)
    sp_quant_register_neon(tab, &lv->feat);
#else
    (void)tab;
    (void)lv;
#endif
}

static void setup_levels(void) {
    n_levels = test_setup_levels(levels, &level_tabs[0][0], 0, SP_QTYPE_COUNT, register_level);
}

/* ---- random rows -------------------------------------------------------------- */

static const enum sp_qtype weight_types[] = {SP_QTYPE_F32,  SP_QTYPE_F16,  SP_QTYPE_BF16, SP_QTYPE_Q4_0, SP_QTYPE_Q4_1,
                                             SP_QTYPE_Q5_0, SP_QTYPE_Q5_1, SP_QTYPE_Q8_0, SP_QTYPE_Q2_K, SP_QTYPE_Q3_K,
                                             SP_QTYPE_Q4_K, SP_QTYPE_Q5_K, SP_QTYPE_Q6_K};

/* A random fp16 scale in [lo, 2 lo). */
static uint16_t rand_scale(float lo) {
    return sp_fp32_to_fp16(lo * (float)(1 + rng_unit()));
}

static void put16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}

/* n elements of weight type t at dst: random bits with sane fp16 scales. */
static void rand_weights(enum sp_qtype t, uint8_t *dst, int64_t n) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    if (t == SP_QTYPE_F32 || t == SP_QTYPE_F16 || t == SP_QTYPE_BF16) {
        float *f = malloc((size_t)n * sizeof *f);
        for (int64_t i = 0; i < n; i++) f[i] = rng_normal();
        tr->from_float(f, dst, n);
        free(f);
        return;
    }
    const int64_t nb = n / tr->block_elems;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *b = dst + (size_t)i * tr->block_bytes;
        for (size_t k = 0; k < tr->block_bytes; k++) b[k] = (uint8_t)rng_u64();
        switch (t) {
        case SP_QTYPE_Q4_0: case SP_QTYPE_Q5_0: put16(b, rand_scale(0.01f)); break;
        case SP_QTYPE_Q4_1: case SP_QTYPE_Q5_1: put16(b, rand_scale(0.01f)); put16(b + 2, rand_scale(0.05f) | 0x8000); break;
        case SP_QTYPE_Q8_0:
            put16(b, rand_scale(0.001f));
            for (int k = 2; k < 34; k++) if (b[k] == 0x80) b[k] = 0x81; /* -128 is never produced */
            break;
        case SP_QTYPE_Q2_K: put16(b + 80, rand_scale(0.01f)); put16(b + 82, rand_scale(0.01f)); break;
        case SP_QTYPE_Q3_K: put16(b + 108, rand_scale(0.01f)); break;
        case SP_QTYPE_Q4_K: case SP_QTYPE_Q5_K: put16(b, rand_scale(0.001f)); put16(b + 2, rand_scale(0.001f)); break;
        case SP_QTYPE_Q6_K: put16(b + 208, rand_scale(0.001f)); break;
        default: break;
        }
    }
}

/* sum |w_i x_i| over the dequantized rows (x in vec_dot_type of wt). */
static double dot_magnitude(enum sp_qtype wt, const void *w, const void *x, int64_t n, float *fa, float *fb) {
    const struct sp_qtraits *tw = sp_qtraits_ref(wt), *tx = sp_qtraits_ref(tw->vec_dot_type);
    tw->to_float(w, fa, n);
    tx->to_float(x, fb, n);
    double m = 0;
    for (int64_t i = 0; i < n; i++) m += fabs((double)fa[i] * fb[i]);
    return m;
}

/* ---- from_float: byte for byte -------------------------------------------------- */

/* Fills x[0..n) with one of several patterns (by kind) for activation type at. */
static void rand_act(enum sp_qtype at, float *x, int64_t n, int kind) {
    const int64_t blk = at == SP_QTYPE_Q8_K ? 256 : 32;
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * (float)exp(rng_normal() * 2);
    switch (kind) {
    case 0: break;                                  /* wide-range normals */
    case 1:                                         /* x*id lands on .5 ties */
        for (int64_t b = 0; b + blk <= n; b += blk) {
            for (int64_t j = 0; j < blk; j++) x[b + j] = (float)((int)(rng_u64() % 254) - 127) + 0.5f;
            for (int64_t j = 0; j < blk; j++) x[b + j] = SP_MAX(-126.5f, SP_MIN(126.5f, x[b + j]));
            x[b + (int64_t)(rng_u64() % (uint64_t)blk)] = (rng_u64() & 1) ? 127.0f : -127.0f;
        }
        break;
    case 2:                                         /* zero blocks, single values, +-max ties */
        for (int64_t b = 0; b + blk <= n; b += blk) {
            const int r = (int)(rng_u64() % 4);
            if (r == 0) memset(x + b, 0, (size_t)blk * sizeof *x);
            if (r == 1) {
                memset(x + b, 0, (size_t)blk * sizeof *x);
                x[b + (int64_t)(rng_u64() % (uint64_t)blk)] = rng_normal();
            }
            if (r == 2) {
                const float v = fabsf(rng_normal()) + 0.1f;
                x[b + (int64_t)(rng_u64() % (uint64_t)blk)] = v;
                x[b + (int64_t)(rng_u64() % (uint64_t)blk)] = -v;
            }
        }
        break;
    case 3:                                         /* tiny: subnormal halves/floats */
        for (int64_t i = 0; i < n; i++) x[i] *= 1e-6f * (float)(rng_unit() < 0.5 ? 1e-33 : 1);
        break;
    default:                                        /* random bit patterns incl. inf/NaN */
        for (int64_t i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)rng_u64();
            memcpy(&x[i], &u, 4);
        }
        break;
    }
}

static void test_from_float(const struct test_level *l) {
    static const enum sp_qtype act[] = {SP_QTYPE_F16, SP_QTYPE_BF16, SP_QTYPE_Q8_0, SP_QTYPE_Q8_1, SP_QTYPE_Q8_K};
    const int64_t n = 1 << 18; /* 5 kinds x 2 seeds x 256K = 2.6M values per type */
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    for (size_t k = 0; k < SP_ARRAY_LEN(act); k++) {
        const enum sp_qtype at = act[k];
        const struct sp_qtraits *ref = sp_qtraits_ref(at), *got = &l->tab[at];
        /* NaN inputs: ref.c matches ggml's x86 code only for F16/BF16/Q8_K */
        const int kinds = (at == SP_QTYPE_Q8_0 || at == SP_QTYPE_Q8_1) ? 4 : 5;
        int bad = 0;
        for (int kind = 0; kind < kinds; kind++) {
            for (uint64_t seed = 1; seed <= 2; seed++) {
                rng_seed(seed * 100 + (uint64_t)kind);
                /* odd lengths exercise the F16/BF16 tails */
                const int64_t len = ref->block_elems == 1 ? n - (int64_t)(seed * 3 + (uint64_t)kind) : n;
                rand_act(at, x, len, kind);
                const size_t bytes = sp_qtype_row_bytes(at, len);
                memset(a, 0x55, bytes);
                memset(b, 0xaa, bytes);
                ref->from_float(x, a, len);
                got->from_float(x, b, len);
                if (memcmp(a, b, bytes) != 0) {
                    size_t i = 0;
                    while (a[i] == b[i]) i++;
                    if (bad++ < 3) {
                        fprintf(stderr, "%s %s from_float kind %d seed %llu: byte %zu differs (ref %02x, got %02x)\n",
                                l->name, ref->name, kind, (unsigned long long)seed, i, a[i], b[i]);
                    }
                }
            }
        }
        CHECKF(bad == 0, "%s %s from_float not bit-identical (%d runs)", l->name, ref->name, bad);
    }
    free(x);
    free(a);
    free(b);
}

/* ---- to_float vs reference --------------------------------------------------------- */

/* Every F16 bit pattern, at every start alignment and tail length. */
static void test_to_float(const struct test_level *l) {
    const sp_to_float_fn got = l->tab[SP_QTYPE_F16].to_float, ref = sp_qtraits_ref(SP_QTYPE_F16)->to_float;
    if (got == ref) return;
    enum { N = 65536 + 16 };
    uint16_t *h = malloc(N * sizeof *h);
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    int bad = 0;
    for (int off = 0; off < 9; off++) {
        const int64_t n = 65536 - off;
        ref(h + off, a, n);
        got(h + off, b, n);
        bad += memcmp(a, b, (size_t)n * sizeof *a) != 0;
    }
    CHECKF(bad == 0, "%s F16 to_float not bit-identical to the reference (%d of 9 offsets)", l->name, bad);
    free(h);
    free(a);
    free(b);
}

/* ---- vec_dot vs reference -------------------------------------------------------- */

static void test_vec_dot(const struct test_level *l) {
    static const int64_t sizes32[] = {32, 96, 224, 4096, 11008, 14336};
    static const int64_t sizesk[] = {256, 768, 4096, 11008, 14336};
    static const int64_t sizesf[] = {1, 7, 31, 33, 100, 4096, 11008, 14336};
    const int64_t nmax = 14336;
    uint8_t *w = malloc((size_t)nmax * 4), *xq = malloc((size_t)nmax * 4);
    float *xf = malloc((size_t)nmax * sizeof *xf), *fa = malloc((size_t)nmax * 4), *fb = malloc((size_t)nmax * 4);
    for (size_t k = 0; k < SP_ARRAY_LEN(weight_types); k++) {
        const enum sp_qtype t = weight_types[k];
        const struct sp_qtraits *ref = sp_qtraits_ref(t), *got = &l->tab[t];
        const struct sp_qtraits *xt = sp_qtraits_ref(ref->vec_dot_type);
        const int64_t *sizes = ref->block_elems == 1 ? sizesf : ref->block_elems == 32 ? sizes32 : sizesk;
        const size_t ns = ref->block_elems == 1 ? SP_ARRAY_LEN(sizesf)
                          : ref->block_elems == 32 ? SP_ARRAY_LEN(sizes32) : SP_ARRAY_LEN(sizesk);
        double worst = 0;
        int inexact = 0;
        for (size_t si = 0; si < ns; si++) {
            const int64_t n = sizes[si];
            for (uint64_t seed = 1; seed <= 3; seed++) {
                rng_seed(seed * 7919 + (uint64_t)n + 1000 * (uint64_t)t);
                rand_weights(t, w, n);
                for (int64_t i = 0; i < n; i++) xf[i] = rng_normal();
                xt->from_float(xf, xq, n);
                float s_ref = 0, s_got = 0;
                ref->vec_dot(n, &s_ref, w, xq);
                got->vec_dot(n, &s_got, w, xq);
                const double m = dot_magnitude(t, w, xq, n, fa, fb);
                const double err = fabs((double)s_got - s_ref) / (m > 0 ? m : 1);
                if (err > worst) worst = err;
                if (s_got != s_ref) inexact++;
                CHECKF(err <= TOL_VEC_DOT, "%s %s vec_dot n=%lld seed %llu: ref %.9g got %.9g (rel %.3g)", l->name,
                       ref->name, (long long)n, (unsigned long long)seed, s_ref, s_got, err);
            }
        }
        printf("  %-6s %-5s vec_dot worst rel err %.2e%s\n", l->name, ref->name, worst,
               inexact ? "" : " (bit-exact)");
    }
    free(w);
    free(xq);
    free(xf);
    free(fa);
    free(fb);
}

/* ---- gemm vs the same level's vec_dot -------------------------------------------- */

/* One gemm configuration set for type t at row length n; small: every token
 * and row count, else a few (long rows cross the kernels' K chunks). */
/* One gemm call of tr into y (max_tok rows of ldy floats, filled with a
 * sentinel first) for nr rows and nt tokens: checks that it allocated
 * nothing and wrote nothing outside the nt x nr corner (counted in *bad);
 * the caller checks the corner. */
#define GEMM_SENTINEL (-12345.0f)
static void run_gemm(const struct test_level *l, const struct sp_qtraits *tr, int64_t n, const uint8_t *w,
                     size_t w_stride, int64_t nr, const uint8_t *x, size_t x_stride, int64_t nt, float *y, int64_t ldy,
                     int64_t max_tok, int *bad) {
    for (int64_t i = 0; i < max_tok * ldy; i++) y[i] = GEMM_SENTINEL;
    const uint64_t allocs = sp_alloc_count();
    tr->gemm(n, w, w_stride, nr, x, x_stride, nt, y, ldy);
    /* the token path never allocates (DESIGN.md) */
    CHECKF(sp_alloc_count() == allocs, "%s %s gemm n %lld tok %lld allocated", l->name, tr->name, (long long)n,
           (long long)nt);
    for (int64_t i = 0; i < max_tok; i++)
        for (int64_t r = 0; r < ldy; r++)
            if ((i >= nt || r >= nr) && y[i * ldy + r] != GEMM_SENTINEL) (*bad)++;
}

static void gemm_case(const struct test_level *l, enum sp_qtype t, int64_t n, bool small, double *worst, int *bad) {
    /* 70 tokens: more than one token group (32 tokens; 64 in the Q4_0/Q8_0 gemms) */
    static const int64_t toks_all[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 70}, toks_few[] = {1, 3, 33};
    /* 77 rows: more than one row block of the x86 strip gemms (64 rows), and a partial strip;
     * 141: more than two, and rows past a 16-row strip's first half */
    static const int64_t rows_all[] = {1, 5, 13, 41, 77, 141}, rows_few[] = {5};
    const int64_t *toks = small ? toks_all : toks_few, *rows = small ? rows_all : rows_few;
    const size_t n_toks = small ? SP_ARRAY_LEN(toks_all) : SP_ARRAY_LEN(toks_few);
    const size_t n_rowss = small ? SP_ARRAY_LEN(rows_all) : SP_ARRAY_LEN(rows_few);
    const struct sp_qtraits *tr = &l->tab[t], *xt = sp_qtraits_ref(tr->vec_dot_type);
    const size_t wrb = sp_qtype_row_bytes(t, n), xrb = sp_qtype_row_bytes(tr->vec_dot_type, n);
    const size_t w_stride = wrb + 20, x_stride = xrb + 12; /* padded rows (block structs stay aligned) */
    const int64_t max_rows = 141, max_tok = 70, ldy = max_rows + 3;
    uint8_t *w = calloc((size_t)max_rows, w_stride), *x = calloc((size_t)max_tok, x_stride);
    float *xf = malloc((size_t)n * sizeof *xf), *fa = malloc((size_t)n * 4), *fb = malloc((size_t)n * 4);
    float *y = malloc((size_t)(max_tok * ldy) * sizeof *y);
    rng_seed(4242 + (uint64_t)t + (uint64_t)n);
    for (int64_t r = 0; r < max_rows; r++) rand_weights(t, w + (size_t)r * w_stride, n);
    for (int64_t i = 0; i < max_tok; i++) {
        for (int64_t j = 0; j < n; j++) xf[j] = rng_normal();
        xt->from_float(xf, x + (size_t)i * x_stride, n);
    }
    for (size_t ri = 0; ri < n_rowss; ri++) {
        for (size_t ti = 0; ti < n_toks; ti++) {
            const int64_t nr = rows[ri], nt = toks[ti];
            run_gemm(l, tr, n, w, w_stride, nr, x, x_stride, nt, y, ldy, max_tok, bad);
            for (int64_t i = 0; i < nt; i++) {
                for (int64_t r = 0; r < nr; r++) {
                    const float v = y[i * ldy + r];
                    float s = 0;
                    tr->vec_dot(n, &s, w + (size_t)r * w_stride, x + (size_t)i * x_stride);
                    const double m = dot_magnitude(t, w + (size_t)r * w_stride, x + (size_t)i * x_stride, n, fa, fb);
                    const double err = fabs((double)v - s) / (m > 0 ? m : 1);
                    if (err > *worst) *worst = err;
                    if (!(err <= TOL_GEMM) && (*bad)++ < 3) {
                        fprintf(stderr, "%s %s gemm n %lld rows %lld tok %lld: y[%lld][%lld] %.9g vs vec_dot %.9g\n",
                                l->name, tr->name, (long long)n, (long long)nr, (long long)nt, (long long)i,
                                (long long)r, v, s);
                    }
                }
            }
        }
    }
    free(w);
    free(x);
    free(xf);
    free(fa);
    free(fb);
    free(y);
}

static void test_gemm(const struct test_level *l) {
    for (size_t k = 0; k < SP_ARRAY_LEN(weight_types); k++) {
        const enum sp_qtype t = weight_types[k];
        const struct sp_qtraits *tr = &l->tab[t];
        if (!tr->gemm) continue;
        /* odd block counts, and an odd length for the float types (SIMD
         * tails); the long rows span several K chunks of the x86 kernels
         * (32-element types: two of the 512-block decode chunks too, the
         * second with 13 groups of 8 and 3 blocks over) */
        const int64_t be = tr->block_elems;
        const int64_t n_small = be == 256 ? 768 : be == 32 ? 224 : 229;
        const int64_t n_long = be == 256 ? 256 * 19 : be == 32 ? 32 * 619 : 2 * 1024 + 13;
        double worst = 0;
        int bad = 0;
        gemm_case(l, t, n_small, true, &worst, &bad);
        gemm_case(l, t, n_long, false, &worst, &bad);
        CHECKF(bad == 0, "%s %s gemm: %d values off (or written outside the output)", l->name, tr->name, bad);
        /* a batch must give the same bits as one token at a time */
        CHECKF(worst == 0, "%s %s gemm differs from vec_dot (rel %.3g): not the same summation order", l->name,
               tr->name, worst);
        printf("  %-6s %-5s gemm    worst rel err %.2e%s\n", l->name, tr->name, worst, worst == 0 ? " (bit-exact)" : "");
    }
}

/* ---- resident layouts (quant.h): repacks of a file type ------------------------
 * Their kernels live in the native table (sp_quant_register_native_*).
 * Rows of random blocks of the file type, repacked: to_float gives the file
 * type's floats, and vec_dot (reference and the level's) and gemm (decode
 * and batches, row counts around the 8-row strips, rows across the
 * decode's K chunks) give the file type's reference dot bit for bit; the
 * un-repack gives the file type's bytes back. */

static struct test_level res_levels[TEST_ISA_MAX];
static struct sp_qtraits res_tabs[TEST_ISA_MAX][SP_QTYPE_NATIVE_COUNT];

struct resident {
    enum sp_qtype from;
    uint32_t to;
};

static void resident_case(const struct test_level *l, const struct resident *rs, int64_t n, const int64_t *rows,
                          size_t n_rows, const int64_t *toks, size_t n_toks, int *bad) {
    const struct sp_qtraits *fr = sp_qtraits_ref(rs->from), *ref = sp_qtraits_ref(rs->to);
    const struct sp_qtraits *got = &l->tab[rs->to - SP_QTYPE_NATIVE_FIRST];
    const enum sp_qtype xt = fr->vec_dot_type;
    const size_t wrb = sp_qtype_row_bytes(rs->to, n), xrb = sp_qtype_row_bytes(xt, n);
    const size_t w_stride = wrb + 20, x_stride = xrb + 12;
    const int64_t max_rows = 77, max_tok = 70, ldy = max_rows + 3;
    uint8_t *w = calloc((size_t)max_rows, w_stride), *wg = calloc((size_t)max_rows, w_stride);
    uint8_t *x = calloc((size_t)max_tok, x_stride);
    float *fa = malloc((size_t)n * 4), *fb = malloc((size_t)n * 4), *y = malloc((size_t)(max_tok * ldy) * sizeof *y);
    float *s0 = malloc((size_t)(max_tok * max_rows) * sizeof *s0);
    rng_seed(777 + (uint64_t)n + rs->to);
    for (int64_t r = 0; r < max_rows; r++) rand_weights(rs->from, w + (size_t)r * w_stride, n);
    for (int64_t i = 0; i < max_tok; i++) {
        for (int64_t j = 0; j < n; j++) fa[j] = rng_normal();
        sp_qtraits_ref(xt)->from_float(fa, x + (size_t)i * x_stride, n);
    }
    memcpy(wg, w, (size_t)max_rows * w_stride);
    sp_qtype_repack(rs->to, wg, max_rows, n, w_stride);
    { /* the inverse gives the file type's bytes back (a stored layout's fallback) */
        uint8_t *wu = malloc((size_t)max_rows * w_stride);
        memcpy(wu, wg, (size_t)max_rows * w_stride);
        sp_qtype_unrepack(rs->to, wu, max_rows, n, w_stride);
        if (memcmp(wu, w, (size_t)max_rows * w_stride) && (*bad)++ < 3)
            fprintf(stderr, "%s unrepack n %lld: not %s's bytes\n", ref->name, (long long)n, fr->name);
        free(wu);
    }
    for (int64_t r = 0; r < max_rows; r++) {
        fr->to_float(w + (size_t)r * w_stride, fa, n);
        got->to_float(wg + (size_t)r * w_stride, fb, n);
        if (memcmp(fa, fb, (size_t)n * sizeof *fa) && (*bad)++ < 3)
            fprintf(stderr, "%s to_float n %lld row %lld\n", ref->name, (long long)n, (long long)r);
        for (int64_t i = 0; i < max_tok; i++) {
            float a = 0, b = 0;
            fr->vec_dot(n, &s0[i * max_rows + r], w + (size_t)r * w_stride, x + (size_t)i * x_stride);
            ref->vec_dot(n, &a, wg + (size_t)r * w_stride, x + (size_t)i * x_stride);
            got->vec_dot(n, &b, wg + (size_t)r * w_stride, x + (size_t)i * x_stride);
            if ((a != s0[i * max_rows + r] || b != a) && (*bad)++ < 3) {
                fprintf(stderr, "%s %s vec_dot n %lld row %lld tok %lld: %.9g %.9g vs %s %.9g\n", l->name, ref->name,
                        (long long)n, (long long)r, (long long)i, a, b, fr->name, s0[i * max_rows + r]);
            }
        }
    }
    for (size_t ri = 0; ri < n_rows; ri++) {
        for (size_t ti = 0; ti < n_toks; ti++) {
            const int64_t nr = rows[ri], nt = toks[ti];
            run_gemm(l, got, n, wg, w_stride, nr, x, x_stride, nt, y, ldy, max_tok, bad);
            for (int64_t i = 0; i < nt; i++) {
                for (int64_t r = 0; r < nr; r++) {
                    const float v = y[i * ldy + r];
                    if (v != s0[i * max_rows + r] && (*bad)++ < 3) {
                        fprintf(stderr, "%s %s gemm n %lld rows %lld tok %lld: y[%lld][%lld] %.9g vs %.9g\n", l->name,
                                ref->name, (long long)n, (long long)nr, (long long)nt, (long long)i, (long long)r, v,
                                s0[i * max_rows + r]);
                    }
                }
            }
        }
    }
    free(w);
    free(wg);
    free(x);
    free(fa);
    free(fb);
    free(y);
    free(s0);
}

static void test_resident(const struct test_level *l) {
    static const struct resident layouts[] = {
        {SP_QTYPE_Q4_0, SP_QTYPE_Q4_0_G8},
        {SP_QTYPE_Q4_K, SP_QTYPE_Q4_K_G8},
    };
    static const int64_t toks_all[] = {1, 2, 3, 4, 5, 8, 16, 33, 70}, toks_few[] = {1, 3, 17};
    static const int64_t rows_all[] = {1, 5, 8, 13, 16, 41, 77}, rows_few[] = {5, 13};
    for (size_t k = 0; k < SP_ARRAY_LEN(layouts); k++) {
        const struct resident *rs = &layouts[k];
        const struct sp_qtraits *got = &l->tab[rs->to - SP_QTYPE_NATIVE_FIRST];
        CHECKF(sp_qtype_resident(rs->from) == rs->to && sp_qtype_resident_from(rs->to) == rs->from,
               "%s: not %s's resident layout", got->name, sp_qtype_name(rs->from));
#if defined(__x86_64__)
        CHECKF(got->gemm && got->vec_dot != sp_qtraits_ref(rs->to)->vec_dot, "%s: no %s kernels", l->name, got->name);
#endif
        if (!got->gemm) continue; /* the pager keeps the file layout where the table has none */
        int bad = 0;
        resident_case(l, rs, 256, rows_all, SP_ARRAY_LEN(rows_all), toks_all, SP_ARRAY_LEN(toks_all), &bad);
        resident_case(l, rs, 256 * 11, rows_all, SP_ARRAY_LEN(rows_all), toks_all, SP_ARRAY_LEN(toks_all), &bad);
        /* rows of 77 and 130 groups of 256: two and three decode K chunks, the last partial */
        resident_case(l, rs, 256 * 77, rows_few, SP_ARRAY_LEN(rows_few), toks_few, SP_ARRAY_LEN(toks_few), &bad);
        resident_case(l, rs, 256 * 130, rows_few, SP_ARRAY_LEN(rows_few), toks_few, SP_ARRAY_LEN(toks_few), &bad);
        CHECKF(bad == 0, "%s %s: %d values differ from the reference of %s", l->name, got->name, bad,
               sp_qtype_name(rs->from));
        printf("  %-6s %-7s to_float, vec_dot, gemm: %s's reference bits\n", l->name, got->name, sp_qtype_name(rs->from));
    }
}

/* ---- SPARROW_ISA ------------------------------------------------------------------ */

static void test_isa_override(void) {
    /* Runs before anything else calls sp_quant_init(): the table must stay
     * the reference one. */
    setenv("SPARROW_ISA", "ref", 1);
    sp_quant_init();
    for (int t = 0; t < SP_QTYPE_COUNT; t++) {
        const struct sp_qtraits *a = sp_qtraits_get((uint32_t)t), *r = sp_qtraits_ref((uint32_t)t);
        if (!r) continue;
        CHECKF(a->vec_dot == r->vec_dot && a->from_float == r->from_float && a->gemm == r->gemm,
               "SPARROW_ISA=ref left a SIMD kernel in %s", r->name);
    }
}

int main(void) {
    test_isa_override();
    setup_levels();
    test_setup_levels(res_levels, &res_tabs[0][0], SP_QTYPE_NATIVE_FIRST, SP_QTYPE_NATIVE_COUNT, test_isa_register_native);
    for (int i = 0; i < n_levels; i++) {
        if (!levels[i].have) continue;
        test_from_float(&levels[i]);
        test_to_float(&levels[i]);
        test_vec_dot(&levels[i]);
        test_gemm(&levels[i]);
        test_resident(&res_levels[i]);
    }
    return test_report("test_kernels");
}
