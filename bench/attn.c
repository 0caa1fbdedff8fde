/*
 * attn.c -- decode attention alone: one query token against a context of
 * CELLS cells, every layer in turn (what one decoded token pays for
 * attention), through sp_kv_attend on THREADS threads.  Prints the time per
 * token and the KV bytes it reads per second, to compare with the memory
 * bandwidth (build/bench/membw): a decode at depth is bound by that read.
 * Wall time (the threads run in parallel), the median of REPS tokens after
 * one untimed.  Not a test: nothing is checked here (tests/test_kv.c does).
 *
 *   build/bench/attn [CELLS [HEADS KV_HEADS HD [TYPE_K [TYPE_V [LAYERS [THREADS [REPS]]]]]]]
 *   build/bench/attn 2048 32 32 128 f16 f16 32 2    # llama-7b at depth 2048, f16 cache
 *   SPARROW_ISA=avx2 build/bench/attn ...          a lower kernel table
 * Defaults: 2048 cells, 32 heads, 32 KV heads, head size 128, f16/f16,
 * 32 layers, 2 threads, 9 tokens.
 */
#include "core/core.h"
#include "util.h"
#include "kv/cache.h"
#include "sparrow.h"
#include "sched/pool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static long arg_long(int argc, char **argv, int i, long def) {
    if (i >= argc) return def;
    char *end;
    const long v = strtol(argv[i], &end, 10);
    if (*end || v <= 0) {
        fprintf(stderr, "attn: argument %d ('%s') must be a positive integer\n", i, argv[i]);
        exit(2);
    }
    return v;
}

static enum sp_kv_type arg_type(int argc, char **argv, int i, enum sp_kv_type def) {
    if (i >= argc) return def;
    enum sp_kv_type t;
    if (sp_kv_type_from_name(argv[i], &t) != SP_OK) {
        fprintf(stderr, "attn: %s\n", sp_last_error());
        exit(2);
    }
    return t;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: attn [CELLS [HEADS KV_HEADS HD [TYPE_K [TYPE_V [LAYERS [THREADS [REPS]]]]]]]\n");
        return 0;
    }
    const uint32_t n_cells = (uint32_t)arg_long(argc, argv, 1, 2048);
    const uint32_t heads = (uint32_t)arg_long(argc, argv, 2, 32), kv_heads = (uint32_t)arg_long(argc, argv, 3, 32);
    const uint32_t hd = (uint32_t)arg_long(argc, argv, 4, 128);
    const enum sp_kv_type tk = arg_type(argc, argv, 5, SP_KV_F16), tv = arg_type(argc, argv, 6, SP_KV_F16);
    const uint32_t layers = (uint32_t)arg_long(argc, argv, 7, 32);
    const int threads = (int)arg_long(argc, argv, 8, 2);
    const int reps = (int)arg_long(argc, argv, 9, 9);
    if (heads % kv_heads) {
        fprintf(stderr, "attn: HEADS (%u) must be a multiple of KV_HEADS (%u)\n", heads, kv_heads);
        return 2;
    }
    const struct sp_kv_geom g = {layers, heads, kv_heads, hd, hd, tk, tv};
    struct sp_kv_cache *kv = NULL;
    struct sp_pool *pool = NULL;
    struct sp_kv_cells c;
    if (sp_kv_cache_init(&g, &kv) || sp_pool_init(threads, &pool) || sp_kv_seq_init(kv, n_cells + 1, &c) ||
        sp_kv_cells_append(&c, NULL, n_cells, 0)) {
        fprintf(stderr, "attn: %s\n", sp_last_error());
        return 1;
    }
    /* fill the cells layer by layer, in chunks of 256 */
    const size_t kd = (size_t)kv_heads * hd;
    float *k = malloc(256 * kd * sizeof *k), *v = malloc(256 * kd * sizeof *v);
    float *q = malloc((size_t)heads * hd * sizeof *q), *o = malloc((size_t)heads * hd * sizeof *o);
    void *scr = malloc(sp_kv_attend_scratch_bytes(&g, threads));
    if (!k || !v || !q || !o || !scr) {
        fprintf(stderr, "attn: out of memory\n");
        return 1;
    }
    for (uint32_t il = 0; il < layers; il++) {
        for (uint32_t c0 = 0; c0 < n_cells; c0 += 256) {
            const uint32_t n = SP_MIN(256u, n_cells - c0);
            for (size_t i = 0; i < n * kd; i++) k[i] = 2.0f * bench_gauss() + (i % 7 == 3 ? 3.0f : 0.0f);
            for (size_t i = 0; i < n * kd; i++) v[i] = bench_gauss();
            sp_kv_store(kv, &c, c0, n, il, k, v, pool);
        }
    }
    for (size_t i = 0; i < (size_t)heads * hd; i++) q[i] = bench_gauss();
    const float scale = 1.0f / sqrtf((float)hd);
    double *t = malloc((size_t)reps * sizeof *t);
    double sink = 0;
    for (int r = -1; r < reps; r++) {
        const double t0 = bench_wall_s();
        for (uint32_t il = 0; il < layers; il++) sp_kv_attend(kv, &c, il, q, 1, n_cells, scale, o, pool, scr);
        if (r >= 0) t[r] = bench_wall_s() - t0;
        sink += o[0];
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    const double med = t[reps / 2];
    const double bytes = (double)layers * kv_heads * n_cells *
                         (double)(sp_kv_row_bytes(tk, (int32_t)hd) + sp_kv_row_bytes(tv, (int32_t)hd));
    printf("attn: %u cells, %u/%u heads hd %u, %s/%s, %u layers, %d threads: %.3f ms per token "
           "(min %.3f), %.1f MiB of KV, %.2f GB/s%s\n",
           n_cells, heads, kv_heads, hd, sp_kv_type_name(tk), sp_kv_type_name(tv), layers, threads, med * 1e3,
           t[0] * 1e3, bytes / 1048576.0, bytes / med / 1e9, sink == sink ? "" : " (NaN)");
    free(t);
    free(scr);
    free(q);
    free(o);
    free(k);
    free(v);
    sp_kv_seq_free(kv, &c);
    sp_kv_cache_free(kv);
    sp_pool_free(pool);
    return 0;
}
