/*
 * kernels.c -- single-thread kernel benchmark: for each weight type and each
 * kernel table (reference, every ISA level the CPU has, and the table
 * sp_quant_init() picked), the decode matrix-vector product as GB/s of
 * weights streamed (a matrix larger than the last-level cache, and one that
 * fits in L2), and the prefill product (gemm, 128 tokens) as GFLOP/s.
 * Each figure is the median of several runs, timed in thread CPU time
 * (CLOCK_THREAD_CPUTIME_ID) so that time spent descheduled on a shared
 * machine does not count; memory bandwidth taken by other processes still
 * does.  Then, for the active table, decode through sp_matmul (the
 * engine's threaded split) with every online CPU, timed in wall-clock time:
 * GB/s of weights for all threads together, to set against bench/membw's
 * read bandwidth with the same thread count.  Not a test: nothing is
 * checked here (tests/test_kernels.c does that).
 *
 *   build/bench/kernels [TYPE...]      e.g. build/bench/kernels Q4_0 Q8_0 i4_b64
 * Sparrow's native types (quant/native.h) are listed after ggml's; with no
 * TYPE arguments a representative few of them run.  The resident layouts
 * (Q4_0_g8, Q4_K_g8, i3/i4/i6_b64_g4: repacks the engine multiplies, quant.h
 * and native.h) run in the single-thread table when named, in the threaded
 * one also with no TYPE arguments.
 *   SPARROW_BENCH_MB=64                size of the streamed matrix (default 256)
 *   SPARROW_BENCH_THREADS=2            threads of the last table (default: online CPUs)
 *   SPARROW_BENCH_GEMM_ROWS=8192       rows of the prefill product (default 512: its weights stay in
 *                                      L2; 8192 rows of Q4_0 are 18 MB, streamed from memory as in a
 *                                      model's prefill)
 *   SPARROW_BENCH_DECODE_TOK=4         the threaded decode also with 2..4 tokens a step (a batch of
 *                                      sequences, issue 17): each step's time against one token's
 */
#include "core/core.h"
#include "core/cpu.h"
#include "model/ops.h"
#include "quant/isa.h"
#include "quant/native.h"
#include "quant/quant.h"
#include "sched/pool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#define N_COLS 4096 /* row length of every product (a 7B model's hidden size) */
#define GEMM_TOK 128
#define GEMM_ROWS 512

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_float(void) { /* roughly normal */
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(rng_u64() >> 40) / (float)(1 << 24);
    return (s - 2.0f) * 1.7f;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

struct table {
    const char *name;
    struct sp_qtraits tab[SP_QTYPE_COUNT];
    struct sp_qtraits ntab[SP_QTYPE_NATIVE_COUNT]; /* native ids - SP_QTYPE_NATIVE_FIRST */
};

static void ref_copy(struct table *tb) {
    memset(tb->tab, 0, sizeof tb->tab);
    memset(tb->ntab, 0, sizeof tb->ntab);
    for (int t = 0; t < SP_QTYPE_COUNT; t++) {
        const struct sp_qtraits *r = sp_qtraits_ref((uint32_t)t);
        if (r) tb->tab[t] = *r;
    }
    for (uint32_t i = 0; i < SP_QTYPE_NATIVE_COUNT; i++) {
        const struct sp_qtraits *r = sp_qtraits_ref(SP_QTYPE_NATIVE_FIRST + i);
        if (r) tb->ntab[i] = *r;
    }
}

/* Table entry of type t (ggml or native id). */
static struct sp_qtraits *entry(struct table *tb, uint32_t t) {
    return t >= SP_QTYPE_NATIVE_FIRST ? &tb->ntab[t - SP_QTYPE_NATIVE_FIRST] : &tb->tab[t];
}

/* Rows of real quantized data: a 1 MiB pattern of blocks quantized from
 * random floats by the reference quantizer, repeated (a resident layout:
 * its file type's, repacked). */
static void fill_weights(uint32_t t, uint8_t *w, size_t bytes) {
    const uint32_t from = sp_qtype_resident_from(t); /* a resident layout: its file type's blocks, repacked */
    const struct sp_qtraits *tr = sp_qtraits_ref(from ? from : t);
    const size_t pat_rows = (1u << 20) / sp_qtype_row_bytes(t, N_COLS) + 1;
    const size_t rb = sp_qtype_row_bytes(t, N_COLS), pat = pat_rows * rb;
    float *f = sp_malloc(N_COLS * sizeof *f);
    uint8_t *p = sp_malloc(pat);
    for (size_t r = 0; r < pat_rows; r++) {
        for (int i = 0; i < N_COLS; i++) f[i] = rng_float();
        tr->from_float(f, p + r * rb, N_COLS);
    }
    if (from) sp_qtype_repack(t, p, (int64_t)pat_rows, N_COLS, rb);
    for (size_t off = 0; off < bytes; off += pat) memcpy(w + off, p, SP_MIN(pat, bytes - off));
    sp_free(p);
    sp_free(f);
}

/* Whether type name tn is one of names[0..n). */
static bool in_list(const char *tn, const char *const *names, size_t n) {
    for (size_t a = 0; a < n; a++) {
        if (!strcmp(names[a], tn)) return true;
    }
    return false;
}

/* Whether type name tn is on the command line (all types when none is). */
static bool wanted(const char *tn, int argc, char **argv) {
    return argc <= 1 || in_list(tn, (const char *const *)argv + 1, (size_t)argc - 1);
}

/* The engine's decode path: gemm with one token if the table has one. */
static void matvec(const struct sp_qtraits *tr, uint32_t t, const uint8_t *w, int64_t rows, const void *x, float *y) {
    const size_t rb = sp_qtype_row_bytes(t, N_COLS);
    if (tr->gemm) {
        tr->gemm(N_COLS, w, rb, rows, x, 0, 1, y, rows);
    } else {
        for (int64_t r = 0; r < rows; r++) tr->vec_dot(N_COLS, &y[r], w + (size_t)r * rb, x);
    }
}

static void gemm(const struct sp_qtraits *tr, uint32_t t, const uint8_t *w, int64_t rows, const uint8_t *x,
                 size_t x_stride, int64_t n_tok, float *y) {
    const size_t rb = sp_qtype_row_bytes(t, N_COLS);
    if (tr->gemm) {
        tr->gemm(N_COLS, w, rb, rows, x, x_stride, n_tok, y, rows);
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n_tok; i++) tr->vec_dot(N_COLS, &y[i * rows + r], w + (size_t)r * rb, x + i * x_stride);
    }
}

int main(int argc, char **argv) {
    static const uint32_t types[] = {SP_QTYPE_Q4_0, SP_QTYPE_Q8_0, SP_QTYPE_Q4_K, SP_QTYPE_Q6_K, SP_QTYPE_F16,
                                     SP_QTYPE_BF16, SP_QTYPE_F32,  SP_QTYPE_Q4_1, SP_QTYPE_Q5_0, SP_QTYPE_Q5_1,
                                     SP_QTYPE_Q2_K, SP_QTYPE_Q3_K, SP_QTYPE_Q5_K};
    /* native: every id is looked at; without arguments only these run */
    static const char *const native_default[] = {"i4_b32", "i4_b64", "i4_b128", "i4_b128_e8", "i3_b64",
                                                 "i3_b128", "i6_b64", "i8_b32", "i4a_b64", "i3a_b64", "i4n_b64"};
    const char *mb_env = getenv("SPARROW_BENCH_MB");
    const size_t big = (size_t)(mb_env ? atoi(mb_env) : 256) << 20, small = 256u << 10;
    sp_quant_init();

    static struct table tables[5];
    int nt = 0;
    tables[nt].name = "ref";
    ref_copy(&tables[nt++]);
#if defined(__x86_64__)
    const struct sp_cpu_features *f = sp_cpu_features();
    if (f->avx2 && f->fma && f->f16c) {
        tables[nt].name = "avx2";
        ref_copy(&tables[nt]);
        sp_quant_register_avx2(tables[nt].tab, f);
        sp_quant_register_native_avx2(tables[nt++].ntab, f);
    }
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) {
        tables[nt].name = "avx512";
        ref_copy(&tables[nt]);
        sp_quant_register_avx2(tables[nt].tab, f);
        sp_quant_register_avx512(tables[nt].tab, f);
        sp_quant_register_native_avx2(tables[nt].ntab, f);
        sp_quant_register_native_avx512(tables[nt++].ntab, f);
    }
#endif
    tables[nt].name = "active";
    ref_copy(&tables[nt]);
    for (int t = 0; t < SP_QTYPE_COUNT; t++) {
        const struct sp_qtraits *a = sp_qtraits_get((uint32_t)t);
        memset(&tables[nt].tab[t], 0, sizeof tables[nt].tab[t]);
        if (a) tables[nt].tab[t] = *a;
    }
    for (uint32_t i = 0; i < SP_QTYPE_NATIVE_COUNT; i++) {
        const struct sp_qtraits *a = sp_qtraits_get(SP_QTYPE_NATIVE_FIRST + i);
        if (a) tables[nt].ntab[i] = *a;
    }
    nt++;

    /* 2 MiB aligned and huge pages where allowed, as the pager holds loaded weights */
    uint8_t *w = sp_malloc_aligned(big, 2u << 20);
#ifdef MADV_HUGEPAGE
    if (w) (void)madvise(w, big, MADV_HUGEPAGE);
#endif
    float *xf = sp_malloc(N_COLS * sizeof *xf);
    uint8_t *xq = sp_malloc(sp_qtype_row_bytes(SP_QTYPE_F32, N_COLS) * GEMM_TOK);
    const char *gr_env = getenv("SPARROW_BENCH_GEMM_ROWS");
    const int64_t gemm_rows = gr_env ? SP_MAX(8, atoll(gr_env)) : GEMM_ROWS;
    float *y = sp_malloc(sizeof(float) * SP_MAX((size_t)GEMM_TOK * (size_t)gemm_rows, big / 64));
    if (!w || !xf || !xq || !y) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    printf("single thread, rows of %d; decode = 1 token (GB/s of weights), prefill = gemm of %d tokens x %d rows "
           "(GFLOP/s); medians\n",
           N_COLS, GEMM_TOK, (int)gemm_rows);
    printf("%-10s %-7s %12s %12s %14s\n", "type", "table", "decode-DRAM", "decode-L2", "prefill");
    const size_t n_ggml = SP_ARRAY_LEN(types);
    for (size_t k = 0; k < n_ggml + SP_QTYPE_NATIVE_COUNT; k++) {
        const uint32_t t = k < n_ggml ? types[k] : SP_QTYPE_NATIVE_FIRST + (uint32_t)(k - n_ggml);
        const char *tn = sp_qtype_name(t);
        if (!tn || !sp_qtraits_ref(t)->vec_dot) continue;
        if (argc > 1 ? !wanted(tn, argc, argv) : k >= n_ggml && !in_list(tn, native_default, SP_ARRAY_LEN(native_default)))
            continue;
        const struct sp_qtraits *ref = sp_qtraits_ref(t), *xt = sp_qtraits_ref(ref->vec_dot_type);
        const size_t rb = sp_qtype_row_bytes(t, N_COLS), xrb = sp_qtype_row_bytes(ref->vec_dot_type, N_COLS);
        const int64_t rows_big = (int64_t)(big / rb), rows_small = (int64_t)(small / rb);
        fill_weights(t, w, (size_t)rows_big * rb);
        for (int i = 0; i < GEMM_TOK; i++) {
            for (int j = 0; j < N_COLS; j++) xf[j] = rng_float();
            xt->from_float(xf, xq + (size_t)i * xrb, N_COLS);
        }
        for (int ti = 0; ti < nt; ti++) {
            const struct sp_qtraits *tr = entry(&tables[ti], t);
            if (!tr->vec_dot) continue;
            if (ti == nt - 1 && memcmp(tr, entry(&tables[nt - 2], t), sizeof *tr) == 0) continue; /* same as last */
            const bool is_ref = ti == 0;
            double v[9];
            const int reps = is_ref ? 3 : 7;
            for (int i = 0; i < reps; i++) {
                const double t0 = now();
                matvec(tr, t, w, rows_big, xq, y);
                v[i] = (double)rows_big * rb / (now() - t0) / 1e9;
            }
            const double dram = median(v, reps);
            const int inner = is_ref ? 4 : 64;
            for (int i = 0; i < reps; i++) {
                const double t0 = now();
                for (int j = 0; j < inner; j++) matvec(tr, t, w, rows_small, xq, y);
                v[i] = (double)rows_small * rb * inner / (now() - t0) / 1e9;
            }
            const double l2 = median(v, reps);
            const int64_t grows = SP_MIN(rows_big, is_ref ? SP_MAX(8, gemm_rows / 8) : gemm_rows);
            for (int i = 0; i < reps; i++) {
                const double t0 = now();
                gemm(tr, t, w, grows, xq, xrb, GEMM_TOK, y);
                v[i] = 2.0 * N_COLS * grows * GEMM_TOK / (now() - t0) / 1e9;
            }
            const double gf = median(v, reps);
            printf("%-10s %-7s %9.2f GB/s %7.2f GB/s %8.1f GFLOP/s%s\n", tn, tables[ti].name, dram, l2, gf,
                   tr->gemm ? "" : " (vec_dot loop)");
            fflush(stdout);
        }
    }
    /* Decode with the engine's threaded split, wall clock. */
    const char *th_env = getenv("SPARROW_BENCH_THREADS");
    const int n_threads = th_env ? atoi(th_env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *dt_env = getenv("SPARROW_BENCH_DECODE_TOK");
    const int dec_tok = dt_env ? SP_MAX(1, SP_MIN(GEMM_TOK, atoi(dt_env))) : 1;
    struct sp_pool *pool = NULL;
    if (n_threads >= 1 && sp_pool_init(n_threads, &pool) == SP_OK) {
        printf("\ndecode through sp_matmul, %d threads, %zu MiB matrix: GB/s of weights, all threads (wall clock, median of 7)\n",
               n_threads, big >> 20);
        for (size_t k = 0; k < n_ggml + SP_QTYPE_NATIVE_COUNT; k++) { /* ggml's, then the native ids named */
            const uint32_t t = k < n_ggml ? types[k] : SP_QTYPE_NATIVE_FIRST + (uint32_t)(k - n_ggml);
            const char *tn = sp_qtype_name(t);
            if (!tn || !sp_qtraits_ref(t)->vec_dot || (k >= n_ggml && argc <= 1 && !sp_qtype_resident_from(t)) ||
                !wanted(tn, argc, argv))
                continue;
            const struct sp_qtraits *ref = sp_qtraits_ref(t), *xt = sp_qtraits_ref(ref->vec_dot_type);
            const size_t rb = sp_qtype_row_bytes(t, N_COLS), xrb = sp_qtype_row_bytes(ref->vec_dot_type, N_COLS);
            const int64_t rows = (int64_t)(big / rb);
            fill_weights(t, w, (size_t)rows * rb);
            for (int j = 0; j < N_COLS; j++) xf[j] = rng_float();
            xt->from_float(xf, xq, N_COLS);
            double v[7], one = 0;
            for (int nt_ = 1; nt_ <= dec_tok; nt_++) {
                for (int j = 1; j < nt_; j++) memcpy(xq + (size_t)j * xrb, xq, xrb); /* values do not matter */
                for (int i = 0; i < 7; i++) {
                    const double t0 = wall();
                    sp_matmul(pool, t, w, N_COLS, rows, xq, xrb, nt_, y, rows);
                    v[i] = wall() - t0;
                }
                const double s = median(v, 7);
                if (nt_ == 1) {
                    one = s;
                    printf("%-5s %9.2f GB/s\n", tn, (double)rows * rb / s / 1e9);
                } else {
                    printf("%-5s %9.2f GB/s with %d tokens a step: %.2fx one token's time\n", tn,
                           (double)rows * rb / s / 1e9, nt_, s / one);
                }
                fflush(stdout);
            }
        }
        sp_pool_free(pool);
    }
    sp_free_aligned(w);
    sp_free(xf);
    sp_free(xq);
    sp_free(y);
    return 0;
}
