/*
 * amx.c -- single-thread benchmark of the AMX prefill kernels (quant/x86/
 * amx.c) against what they replace (the previous table entry: the AVX-512
 * or AVX2 gemm, or the vec_dot loop): GOP/s (2 * rows * n * tokens per
 * second) of a 4096x4096 and an 11008x4096 weight times 128 tokens.  Each
 * figure is the median of 3 runs in thread CPU time.  Without AMX only the
 * fallback column is measured.  Not a test: nothing is checked here
 * (tests/test_amx.c does that).
 *
 *   build/bench/amx [TYPE...]       default: Q4_0 Q8_0 Q4_K Q6_K
 *   SPARROW_AMX=0                   measure with AMX off (both columns the fallback)
 */
#include "core/core.h"
#include "core/cpu.h"
#include "quant/quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include "quant/x86/amx.h"

#define N_TOK 128
#define RUNS 3

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Byte offsets of the fp16 super-scales in a weight block of type t (the
 * rest of the block is random bytes: speed does not depend on values). */
static void scale_offsets(uint32_t t, int off[2]) {
    off[0] = off[1] = -1;
    switch (t) {
    case SP_QTYPE_Q4_K:
    case SP_QTYPE_Q5_K: off[0] = 0, off[1] = 2; break;
    case SP_QTYPE_Q6_K: off[0] = 208; break;
    case SP_QTYPE_Q3_K: off[0] = 108; break;
    case SP_QTYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    default: off[0] = 0; break;
    }
}

typedef void (*gemm_call)(uint32_t t, sp_gemm_fn k, int64_t n, const void *w, size_t ws, int64_t rows,
                          const void *x, size_t xs, float *y);

static void call_kernel(uint32_t t, sp_gemm_fn k, int64_t n, const void *w, size_t ws, int64_t rows, const void *x,
                        size_t xs, float *y) {
    (void)t;
    k(n, w, ws, rows, x, xs, N_TOK, y, rows);
}

static void call_fallback(uint32_t t, sp_gemm_fn k, int64_t n, const void *w, size_t ws, int64_t rows,
                          const void *x, size_t xs, float *y) {
    (void)k;
    sp_quant_amx_fallback(t, n, w, ws, rows, x, xs, N_TOK, y, rows);
}

static double gops(gemm_call call, uint32_t t, sp_gemm_fn k, int64_t n, const void *w, size_t ws, int64_t rows,
                   const void *x, size_t xs, float *y) {
    double best[RUNS];
    for (int i = 0; i < RUNS; i++) {
        const double t0 = now();
        call(t, k, n, w, ws, rows, x, xs, y);
        best[i] = 2.0 * (double)rows * (double)n * N_TOK / (now() - t0) / 1e9;
    }
    /* median of 3 */
    double a = best[0], b = best[1], c = best[2];
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

int main(int argc, char **argv) {
    sp_quant_init();
    const struct sp_cpu_features *f = sp_cpu_features();
    const char *def[] = {"Q4_0", "Q8_0", "Q4_K", "Q6_K"};
    const char **names = argc > 1 ? (const char **)argv + 1 : def;
    const int n_names = argc > 1 ? argc - 1 : 4;
    printf("AMX int8 %s (cpu amx_tile=%d amx_int8=%d); %d tokens, single thread, GOP/s\n",
           sp_quant_amx_kernel(SP_QTYPE_Q4_0) ? "on" : "off", f->amx_tile, f->amx_int8, N_TOK);
    printf("%-5s %14s %10s %10s %8s\n", "type", "rows x n", "fallback", "AMX", "speedup");
    const int64_t shapes[2][2] = {{4096, 4096}, {11008, 4096}};
    for (int i = 0; i < n_names; i++) {
        uint32_t t = SP_QTYPE_COUNT;
        for (uint32_t j = 0; j < SP_QTYPE_COUNT; j++) {
            if (sp_qtype_name(j) && !strcmp(sp_qtype_name(j), names[i])) t = j;
        }
        const struct sp_qtraits *tr = t < SP_QTYPE_COUNT ? sp_qtraits_get(t) : NULL;
        if (!tr || !tr->vec_dot) {
            fprintf(stderr, "unknown weight type %s\n", names[i]);
            return 2;
        }
        for (int s = 0; s < 2; s++) {
            const int64_t rows = shapes[s][0], n = shapes[s][1];
            const size_t ws = sp_qtype_row_bytes(t, n), xs = sp_qtype_row_bytes(tr->vec_dot_type, n);
            uint8_t *w = sp_malloc(ws * (size_t)rows), *x = sp_malloc(xs * N_TOK);
            float *y = sp_malloc(sizeof(float) * (size_t)(rows * N_TOK)), *fx = sp_malloc(sizeof(float) * (size_t)n);
            if (!w || !x || !y || !fx) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            for (size_t b = 0; b < ws * (size_t)rows; b++) w[b] = (uint8_t)rnd();
            int off[2];
            scale_offsets(t, off);
            for (size_t b = 0; b < ws * (size_t)rows / tr->block_bytes; b++) {
                for (int k = 0; k < 2; k++) {
                    if (off[k] < 0) continue;
                    const uint16_t h = sp_fp32_to_fp16(0.001f + (float)(rnd() % 1000) * 1e-5f);
                    memcpy(w + b * tr->block_bytes + off[k], &h, 2);
                }
            }
            for (int tk = 0; tk < N_TOK; tk++) {
                for (int64_t j = 0; j < n; j++) fx[j] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
                sp_qtraits_get(tr->vec_dot_type)->from_float(fx, x + (size_t)tk * xs, n);
            }
            const double g_fb = gops(call_fallback, t, NULL, n, w, ws, rows, x, xs, y);
            const sp_gemm_fn k = sp_quant_amx_kernel(t);
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)n);
            if (k) {
                const double g_amx = gops(call_kernel, t, k, n, w, ws, rows, x, xs, y);
                printf("%-5s %14s %10.1f %10.1f %7.2fx\n", names[i], shape, g_fb, g_amx, g_amx / g_fb);
            } else {
                printf("%-5s %14s %10.1f %10s %8s\n", names[i], shape, g_fb, "-", "-");
            }
            fflush(stdout);
            sp_free(w);
            sp_free(x);
            sp_free(y);
            sp_free(fx);
        }
    }
    return 0;
}

#else
int main(void) {
    printf("not x86-64: no AMX kernels\n");
    return 0;
}
#endif
