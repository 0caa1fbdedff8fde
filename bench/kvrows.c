/*
 * kvrows.c -- single-thread benchmark of the KV cache's row codes: for each
 * cache type, how many values per second a store (sp_kv_row_store: what
 * every decoded token pays per layer and KV head) and a read
 * (sp_kv_rows_to_float: attention's tile conversion, per cell and token)
 * take, on rows of Gaussian values with a few channel offsets (what keys
 * with a bias look like).  Timed in thread CPU time
 * (CLOCK_THREAD_CPUTIME_ID), the median of 5 runs of at least 0.1 s each,
 * so that time spent descheduled on a shared machine does not count.  Not
 * a test: nothing is checked here (tests/test_kv.c does that).
 *
 *   build/bench/kvrows [TYPE...]         e.g. build/bench/kvrows q8_0 q4h
 *   SPARROW_ISA=ref build/bench/kvrows   the plain-C kernels (as for every table)
 *   SPARROW_BENCH_HD=64                  head size (default 128)
 * q4h's key rows and value rows are two codes (4.75 and 4.25 bits): both
 * are listed, as "q4h" and "q4h-v".
 */
#include "core/core.h"
#include "util.h"
#include "quant/kv.h"
#include "quant/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_ROWS 256 /* rows stored and read per pass (a few tiles, in L2) */


struct job {
    enum sp_kv_type t;
    int32_t hd;
    const float *x;
    uint8_t *rows;
    size_t rb;
    const void **ptrs;
    float *out;
};

static void do_store(const struct job *j) {
    for (int r = 0; r < N_ROWS; r++) sp_kv_row_store(j->t, j->x + (size_t)r * j->hd, j->rows + (size_t)r * j->rb, j->hd);
}

static void do_read(const struct job *j) {
    for (int r = 0; r < N_ROWS; r += SP_KV_TILE) sp_kv_rows_to_float(j->t, j->ptrs + r, SP_KV_TILE, j->hd, j->out);
}

/* Values per second of fn over N_ROWS rows: the median of 5 runs. */
static double rate(void (*fn)(const struct job *), const struct job *j) {
    double r[5];
    for (int k = 0; k < 5; k++) {
        long reps = 0;
        const double t0 = bench_cpu_s();
        double t = t0;
        do {
            fn(j);
            reps++;
            t = bench_cpu_s();
        } while (t - t0 < 0.1);
        r[k] = (double)reps * N_ROWS * j->hd / (t - t0);
    }
    qsort(r, 5, sizeof r[0], bench_cmp_double);
    return r[2];
}

int main(int argc, char **argv) {
    sp_quant_init();
    const char *hs = getenv("SPARROW_BENCH_HD");
    const int32_t hd = hs ? (int32_t)atoi(hs) : 128;
    if (hd <= 0 || hd % 32 || hd > SP_KV_MAX_HEAD_DIM) {
        fprintf(stderr, "kvrows: SPARROW_BENCH_HD must be a multiple of 32 up to %d\n", SP_KV_MAX_HEAD_DIM);
        return 2;
    }
    const char *isa = getenv("SPARROW_ISA");
    printf("kvrows: head size %d, %d rows per pass, one thread, SPARROW_ISA=%s\n", hd, N_ROWS, isa ? isa : "(best)");
    printf("%-6s %8s %14s %14s %12s %12s\n", "type", "bits", "store Mval/s", "read Mval/s", "store ns/blk", "read ns/blk");
    float *x = malloc((size_t)N_ROWS * hd * sizeof(float));
    uint8_t *rows = malloc((size_t)N_ROWS * hd * sizeof(float));
    float *out = malloc((size_t)SP_KV_TILE * hd * sizeof(float));
    const void **ptrs = malloc(N_ROWS * sizeof(void *));
    if (!x || !rows || !out || !ptrs) return 1;
    for (int r = 0; r < N_ROWS; r++)
        for (int c = 0; c < hd; c++) x[(size_t)r * hd + c] = bench_gauss() + (c % 13 == 5 ? 4.0f : 0.0f);
    const struct {
        const char *name;
        enum sp_kv_type t;
    } types[] = {{"f16", SP_KV_F16}, {"q8_0", SP_KV_Q8_0}, {"q4_0", SP_KV_Q4_0}, {"q4h", SP_KV_Q4H}, {"q4h-v", SP_KV_Q4H_V}};
    for (size_t i = 0; i < SP_ARRAY_LEN(types); i++) {
        bool want = argc <= 1;
        for (int a = 1; a < argc; a++) want = want || !strcmp(argv[a], types[i].name);
        if (!want) continue;
        const size_t rb = sp_kv_row_bytes(types[i].t, hd);
        struct job j = {types[i].t, hd, x, rows, rb, ptrs, out};
        for (int r = 0; r < N_ROWS; r++) ptrs[r] = rows + (size_t)r * rb;
        const double st = rate(do_store, &j), rd = rate(do_read, &j);
        printf("%-6s %8.3f %14.2f %14.1f %12.1f %12.2f\n", types[i].name, (double)rb * 8 / hd, st / 1e6, rd / 1e6,
               32e9 / st, 32e9 / rd);
    }
    free(x);
    free(rows);
    free(out);
    free(ptrs);
    return 0;
}
