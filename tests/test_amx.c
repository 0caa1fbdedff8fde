/*
 * test_amx.c -- the AMX batched-product kernels (quant/x86/amx.c) against
 * the reference vec_dot loop, on random blocks: every AMX type, token counts
 * around the 16-token tile (including the fallback below 16 and both tail
 * rules) and past one 128-token block, row counts that exercise 32-row
 * panels, a 16-row panel and a row tail, long rows, a ldy wider than the
 * row range, and a call from a second thread (tile configuration is per
 * thread).
 *
 * Two kernels per type: the emulated one (same code, tile instructions in
 * plain C; runs on any AVX2 machine, smaller sizes since it is slow) and,
 * when the CPU and OS allow AMX, the real one (full sizes).  Without AMX the
 * real half is skipped with a message.  Not a benchmark (bench/amx.c is).
 */
#include "core/core.h"
#include "core/cpu.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include "quant/x86/amx.h"

/* ---- named thresholds ------------------------------------------------------
 * The kernels take the same exact int32 dot per step as vec_dot and differ
 * only in float rounding and summation order (per-sub-block float scaling
 * for the K-quants, FMA in the fold).  Measured worst |y - ref| / max|ref|
 * over a product is about 1e-7..1e-6; a lost or misplaced block costs about
 * 1/sqrt(blocks) of max|ref|, i.e. > 1e-2 here. */
#define MAX_ERR_REL 1e-4 /* |y - y_ref| <= MAX_ERR_REL * max|y_ref| over the product */
#define GUARD 12345.0f   /* y columns beyond the row range must keep this value */

static const uint32_t amx_types[] = {SP_QTYPE_Q4_0, SP_QTYPE_Q4_1, SP_QTYPE_Q5_0, SP_QTYPE_Q5_1, SP_QTYPE_Q8_0,
                                     SP_QTYPE_Q2_K, SP_QTYPE_Q3_K, SP_QTYPE_Q4_K, SP_QTYPE_Q5_K, SP_QTYPE_Q6_K};
/* 144 and 150: a second block of token tiles (the kernel works on 128 at a time) */
static const int64_t tok_counts[] = {16, 17, 31, 32, 48, 64, 128, 144, 150};
#define MAX_TOK 150

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; } /* [-1, 1] */

static bool is_kquant(uint32_t t) { return t >= SP_QTYPE_Q2_K && t <= SP_QTYPE_Q6_K; }

/* Random weight rows: random bytes (every bit pattern of quants and
 * sub-scales), with the fp16 super-scales set to sane positive values. */
static void random_weights(uint32_t t, uint8_t *w, size_t bytes) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    int dpos[2] = {-1, -1};
    switch (t) {
    case SP_QTYPE_Q4_0:
    case SP_QTYPE_Q5_0:
    case SP_QTYPE_Q8_0:
    case SP_QTYPE_Q6_K: dpos[0] = t == SP_QTYPE_Q6_K ? 208 : 0; break;
    case SP_QTYPE_Q4_1:
    case SP_QTYPE_Q5_1:
    case SP_QTYPE_Q4_K:
    case SP_QTYPE_Q5_K: dpos[0] = 0, dpos[1] = 2; break;
    case SP_QTYPE_Q3_K: dpos[0] = 108; break;
    case SP_QTYPE_Q2_K: dpos[0] = 80, dpos[1] = 82; break;
    default: SP_ASSERT(0);
    }
    for (size_t b = 0; b < bytes / tr->block_bytes; b++) {
        for (int k = 0; k < 2; k++) {
            if (dpos[k] < 0) continue;
            const uint16_t h = sp_fp32_to_fp16(0.001f + 0.009f * (rndf() + 1) / 2);
            memcpy(w + b * tr->block_bytes + dpos[k], &h, 2);
        }
    }
}

/* Activation rows quantized by the reference quantizer of vec_dot_type. */
static void random_acts(uint32_t t, int64_t n, int64_t n_tok, uint8_t *x, size_t xs) {
    const struct sp_qtraits *ta = sp_qtraits_ref(sp_qtraits_ref(t)->vec_dot_type);
    float *f = malloc((size_t)n * sizeof(float));
    SP_ASSERT(f);
    for (int64_t i = 0; i < n_tok; i++) {
        for (int64_t j = 0; j < n; j++) f[j] = rndf();
        ta->from_float(f, x + (size_t)i * xs, n);
    }
    free(f);
}

struct problem {
    uint32_t t;
    int64_t n, n_rows;
    uint8_t *w, *x;
    size_t ws, xs;
    int64_t n_tok;  /* activation rows (and reference rows) made */
    float *ref;     /* [n_tok][n_rows] */
    float ref_max;
};

static void problem_init(struct problem *p, uint32_t t, int64_t n, int64_t n_rows, int64_t n_tok) {
    p->t = t, p->n = n, p->n_rows = n_rows, p->n_tok = n_tok;
    p->ws = sp_qtype_row_bytes(t, n);
    p->xs = sp_qtype_row_bytes(sp_qtraits_ref(t)->vec_dot_type, n);
    p->w = malloc(p->ws * (size_t)n_rows);
    p->x = malloc(p->xs * (size_t)n_tok);
    p->ref = malloc(sizeof(float) * (size_t)(n_tok * n_rows));
    SP_ASSERT(p->w && p->x && p->ref);
    random_weights(t, p->w, p->ws * (size_t)n_rows);
    random_acts(t, n, n_tok, p->x, p->xs);
    const sp_vec_dot_fn dot = sp_qtraits_ref(t)->vec_dot;
    p->ref_max = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t i = 0; i < n_tok; i++) {
            float *o = &p->ref[i * n_rows + r];
            dot(n, o, p->w + (size_t)r * p->ws, p->x + (size_t)i * p->xs);
            p->ref_max = fmaxf(p->ref_max, fabsf(*o));
        }
    }
}

static void problem_free(struct problem *p) {
    free(p->w);
    free(p->x);
    free(p->ref);
}

static double worst_err = 0; /* over everything checked, relative to max|ref| */

/* Runs k on tokens [0, n_tok) of p into a y with guard columns, and checks
 * it against the reference.  Returns false on the first mismatch. */
static bool check_kernel(const char *what, sp_gemm_fn k, const struct problem *p, int64_t n_tok) {
    SP_ASSERT(n_tok <= p->n_tok);
    const int64_t ldy = p->n_rows + 5;
    float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok));
    SP_ASSERT(y);
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = GUARD;
    k(p->n, p->w, p->ws, p->n_rows, p->x, p->xs, n_tok, y, ldy);
    bool ok = true;
    double worst = 0;
    for (int64_t i = 0; i < n_tok && ok; i++) {
        for (int64_t r = 0; r < ldy; r++) {
            const float v = y[i * ldy + r];
            if (r >= p->n_rows) {
                if (v != GUARD) {
                    CHECKF(0, "%s %s n=%lld rows=%lld tok=%lld: wrote column %lld past the rows", what,
                           sp_qtype_name(p->t), (long long)p->n, (long long)p->n_rows, (long long)n_tok,
                           (long long)r);
                    ok = false;
                    break;
                }
                continue;
            }
            const float ref = p->ref[i * p->n_rows + r];
            const double e = fabs((double)v - ref) / (p->ref_max > 0 ? p->ref_max : 1);
            if (!(e <= MAX_ERR_REL)) {
                CHECKF(0, "%s %s n=%lld rows=%lld tok=%lld: y[%lld][%lld] = %g, ref %g (max|ref| %g)", what,
                       sp_qtype_name(p->t), (long long)p->n, (long long)p->n_rows, (long long)n_tok, (long long)i,
                       (long long)r, v, ref, p->ref_max);
                ok = false;
                break;
            }
            if (e > worst) worst = e;
        }
    }
    if (ok) CHECK(1);
    if (worst > worst_err) worst_err = worst;
    free(y);
    return ok;
}

/* ---- second thread: tile configuration is per thread ---------------------- */
struct thread_arg {
    const char *what;
    sp_gemm_fn k;
    const struct problem *p;
    bool ok;
};
static void *thread_main(void *a) {
    struct thread_arg *ta = a;
    ta->ok = check_kernel(ta->what, ta->k, ta->p, 32);
    return NULL;
}

/* One kernel (emulated or real) of type t over a set of sizes. */
static void run_type(const char *what, uint32_t t, sp_gemm_fn k, bool full) {
    const bool kq = is_kquant(t);
    /* (n, rows, tokens up to): every size runs the token counts up to its
     * limit.  The emulated kernel is slow: its long rows get 17, 31, 48 and 150
     * tokens only, and it skips the 4096-row sizes (the reference loop
     * bounds the real kernel's run time there). */
    const int64_t long_n = kq ? 14336 : 11008;
    struct {
        int64_t n, rows, max_tok;
    } sizes[] = {{256, 16, MAX_TOK},   {256, 32, MAX_TOK},    {256, 48, MAX_TOK},   {256, 100, MAX_TOK},
                 {4096, 48, MAX_TOK},  {long_n, 100, 48},      {256, 4096, MAX_TOK}, {4096, 4096, 16},
                 {long_n, 32, MAX_TOK}};
    const size_t n_sizes = full ? SP_ARRAY_LEN(sizes) : 6;
    int fails = 0;
    for (size_t s = 0; s < n_sizes && fails < 3; s++) {
        struct problem p;
        problem_init(&p, t, sizes[s].n, sizes[s].rows, sizes[s].max_tok);
        for (size_t i = 0; i < SP_ARRAY_LEN(tok_counts); i++) {
            if (tok_counts[i] > sizes[s].max_tok) continue;
            if (!full && sizes[s].n > 256 && tok_counts[i] != 17 && tok_counts[i] != 31 && tok_counts[i] != 48 &&
                tok_counts[i] != 150)
                continue;
            if (!check_kernel(what, k, &p, tok_counts[i])) fails++;
        }
        if (s == 0) {
            /* below one tile: the fallback */
            for (int64_t nt = 1; nt < 16; nt += 7) {
                if (!check_kernel(what, k, &p, nt)) fails++;
            }
        }
        if (s == 3) {
            struct thread_arg ta = {what, k, &p, false};
            pthread_t th;
            CHECK(pthread_create(&th, NULL, thread_main, &ta) == 0);
            pthread_join(th, NULL);
            CHECKF(ta.ok, "%s %s: call from a second thread", what, sp_qtype_name(t));
        }
        problem_free(&p);
    }
}

int main(void) {
    sp_quant_init();
    const struct sp_cpu_features *f = sp_cpu_features();
    printf("cpu: amx_tile=%d amx_int8=%d amx_bf16=%d avx512f=%d avx2=%d\n", f->amx_tile, f->amx_int8, f->amx_bf16,
           f->avx512f, f->avx2);

    /* SPARROW_AMX_TEST_FULL=1: the emulated kernels get the real kernels'
     * full size list too (minutes). */
    const bool emu_full = getenv("SPARROW_AMX_TEST_FULL") && !strcmp(getenv("SPARROW_AMX_TEST_FULL"), "1");
    if (f->avx2 && f->fma && f->f16c) {
        for (size_t i = 0; i < SP_ARRAY_LEN(amx_types); i++) {
            const clock_t t0 = clock();
            sp_gemm_fn k = sp_quant_amx_emu_kernel(amx_types[i]);
            CHECK(k != NULL);
            if (k) run_type("emu", amx_types[i], k, emu_full);
            printf("emulated %-5s checked (%.1f s)\n", sp_qtype_name(amx_types[i]),
                   (double)(clock() - t0) / CLOCKS_PER_SEC);
        }
    } else {
        printf("no AVX2/FMA/F16C: emulated AMX kernels skipped\n");
    }
    CHECK(sp_quant_amx_emu_kernel(SP_QTYPE_F32) == NULL);

    bool any_real = false;
    for (size_t i = 0; i < SP_ARRAY_LEN(amx_types); i++) {
        sp_gemm_fn k = sp_quant_amx_kernel(amx_types[i]);
        if (!k) continue;
        any_real = true;
        const clock_t t0 = clock();
        run_type("amx", amx_types[i], k, true);
        printf("AMX %-5s checked (%.1f s)\n", sp_qtype_name(amx_types[i]), (double)(clock() - t0) / CLOCKS_PER_SEC);
    }
    if (!any_real) {
        const char *env = getenv("SPARROW_AMX");
        printf("AMX kernels not installed (%s): real kernels skipped\n",
               env && strcmp(env, "0") == 0 ? "SPARROW_AMX=0"
               : f->amx_tile && f->amx_int8 ? "OS refused tile data or self-test failed"
                                            : "CPU has no AMX int8");
    }
    printf("worst |y - ref| / max|ref| = %.3g (limit %.0e)\n", worst_err, MAX_ERR_REL);
    return test_report("test_amx");
}

#else
int main(void) {
    printf("not x86-64: no AMX kernels\n");
    return test_report("test_amx");
}
#endif
