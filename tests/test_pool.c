/*
 * test_pool.c -- the thread pool: every index runs exactly once per job,
 * results are visible to the caller after sp_pool_run, many back-to-back jobs
 * (the decode pattern) and jobs after the workers fell asleep all complete.
 * And the products split on it (sp_matmul, sp_matmul_multi: each thread a
 * range of row chunks, the backs of the ranges shared): every row computed
 * once, bit for bit as on one thread, for any thread count.
 * Worker threads have at least SP_POOL_STACK of stack.
 * Indexes are claimed, not assigned: a run whose workers are still asleep is
 * done by the caller (any index, each once) instead of waiting for them.
 */
#include "model/ops.h"
#include "quant/quant.h"
#include "sched/pool.h"
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

struct job {
    atomic_int hits[16];
    int data[16];
    int round;
};

static void task(void *arg, int ith, int nth) {
    struct job *j = arg;
    (void)nth;
    atomic_fetch_add(&j->hits[ith], 1);
    j->data[ith] = j->round * 100 + ith; /* plain write, must be visible after run */
}

/* Products of several types, row counts that are not multiples of 16 and
 * one and three tokens: sp_matmul and sp_matmul_multi on pools of n threads
 * against sp_matmul without a pool. */
static void check_split(void) {
    enum { N_COLS = 512, N_PARTS = 4 };
    static const uint32_t types[N_PARTS] = {SP_QTYPE_Q4_0, SP_QTYPE_Q8_0, SP_QTYPE_Q4_0, SP_QTYPE_Q4_K};
    static const int64_t rows[N_PARTS] = {1000, 333, 17, 250};
    static const int threads[] = {2, 3, 7, 70}; /* 70: more threads than ranges (ops.c) */
    sp_quant_init();
    *test_rng() = 5;
    float *xf = malloc(sizeof(float) * N_COLS * 3);
    for (int i = 0; i < N_COLS * 3; i++) xf[i] = rng_normal();
    for (int64_t n_tok = 1; n_tok <= 3; n_tok += 2) {
        struct sp_mm_part parts[N_PARTS];
        uint8_t *w[N_PARTS], *xq[N_PARTS];
        float *want[N_PARTS];
        for (int k = 0; k < N_PARTS; k++) {
            const size_t rb = sp_qtype_row_bytes(types[k], N_COLS);
            float *wf = malloc(sizeof(float) * N_COLS * (size_t)rows[k]);
            for (int64_t i = 0; i < N_COLS * rows[k]; i++) wf[i] = rng_normal();
            w[k] = malloc(rb * (size_t)rows[k]);
            for (int64_t r = 0; r < rows[k]; r++)
                sp_qtraits_ref(types[k])->from_float(wf + r * N_COLS, w[k] + (size_t)r * rb, N_COLS);
            free(wf);
            xq[k] = malloc(sp_act_bytes(N_COLS, n_tok));
            size_t stride;
            const void *xc = sp_act_convert(types[k], xf, N_COLS, N_COLS, n_tok, xq[k], &stride);
            want[k] = malloc(sizeof(float) * (size_t)(rows[k] * n_tok));
            sp_matmul(NULL, types[k], w[k], N_COLS, rows[k], xc, stride, n_tok, want[k], rows[k]);
            parts[k] = (struct sp_mm_part){types[k], w[k], N_COLS, rows[k], xc, stride, n_tok,
                                           malloc(sizeof(float) * (size_t)(rows[k] * n_tok)), rows[k]};
        }
        for (size_t ti = 0; ti < SP_ARRAY_LEN(threads); ti++) {
            struct sp_pool *p = NULL;
            CHECK(sp_pool_init(threads[ti], &p) == SP_OK);
            if (!p) continue;
            for (int round = 0; round < 3; round++) {
                for (int k = 0; k < N_PARTS; k++) memset(parts[k].y, 0xff, sizeof(float) * (size_t)(rows[k] * n_tok));
                if (round == 0) {
                    for (int k = 0; k < N_PARTS; k++)
                        sp_matmul(p, types[k], w[k], N_COLS, rows[k], parts[k].xc, parts[k].x_stride, n_tok, parts[k].y,
                                  rows[k]);
                } else {
                    sp_matmul_multi(p, parts, N_PARTS);
                }
                for (int k = 0; k < N_PARTS; k++)
                    CHECKF(memcmp(parts[k].y, want[k], sizeof(float) * (size_t)(rows[k] * n_tok)) == 0,
                           "%d threads, %lld tokens, %s: part %d differs from one thread", threads[ti],
                           (long long)n_tok, round ? "sp_matmul_multi" : "sp_matmul", k);
            }
            sp_pool_free(p);
        }
        for (int k = 0; k < N_PARTS; k++) {
            free(w[k]);
            free(xq[k]);
            free(want[k]);
            free(parts[k].y);
        }
    }
    free(xf);
}

struct who {
    atomic_int hits[8];
    pthread_t by[8];
};

static void who_task(void *arg, int ith, int nth) {
    struct who *w = arg;
    (void)nth;
    atomic_fetch_add(&w->hits[ith], 1);
    w->by[ith] = pthread_self();
}

/* Runs right after the workers fell asleep: the caller claims what the
 * workers have not woken for yet (with fixed indexes it ran only index 0, and
 * waited for each sleeping worker to be scheduled). */
static void check_claims(void) {
    enum { N = 4, TRIALS = 20 };
    struct sp_pool *p = NULL;
    CHECK(sp_pool_init(N, &p) == SP_OK);
    if (!p) return;
    int caller_more = 0, bad = 0;
    for (int t = 0; t < TRIALS; t++) {
        struct timespec ts = {0, 20 * 1000 * 1000}; /* past the workers' spin */
        nanosleep(&ts, NULL);
        struct who w;
        memset(&w, 0, sizeof w);
        sp_pool_run(p, who_task, &w);
        for (int i = 0; i < N; i++) bad += atomic_load(&w.hits[i]) != 1;
        CHECK(pthread_equal(w.by[0], pthread_self()));
        int mine = 0;
        for (int i = 1; i < N; i++) mine += pthread_equal(w.by[i], pthread_self()) != 0;
        caller_more += mine > 0;
    }
    CHECKF(bad == 0, "%d indexes not run exactly once", bad);
    CHECKF(caller_more > 0, "in %d runs after the workers slept, the caller never took a sleeping worker's index",
           TRIALS);
    sp_pool_free(p);
}

struct stacks {
    size_t least; /* the smallest worker stack seen */
    atomic_int seen;
    pthread_t caller;
};

static void stack_task(void *arg, int ith, int nth) {
    struct stacks *st = arg;
    (void)ith;
    (void)nth;
    pthread_attr_t a;
    size_t ss = 0;
    if (pthread_equal(pthread_self(), st->caller) || pthread_getattr_np(pthread_self(), &a) != 0) return;
    pthread_attr_getstacksize(&a, &ss);
    pthread_attr_destroy(&a);
    if (ss < SP_POOL_STACK) st->least = ss; /* one worker: no other writer */
    atomic_fetch_add(&st->seen, 1);
}

/* Worker threads get at least SP_POOL_STACK of stack: the kernels' frames
 * reach ~160 KB, more than some C libraries' default thread stack. */
static void check_stacks(void) {
    struct sp_pool *p = NULL;
    CHECK(sp_pool_init(2, &p) == SP_OK);
    if (!p) return;
    struct stacks st = {.least = SP_POOL_STACK, .caller = pthread_self()};
    for (int r = 0; r < 100000 && atomic_load(&st.seen) == 0; r++) sp_pool_run(p, stack_task, &st);
    CHECKF(atomic_load(&st.seen) > 0, "no job ran on a worker thread");
    CHECKF(st.least >= SP_POOL_STACK, "a worker's stack is %zu bytes, under %zu", st.least, (size_t)SP_POOL_STACK);
    sp_pool_free(p);
}

int main(void) {
    check_split();
    check_stacks();
    check_claims();
    for (int n = 1; n <= 4; n++) {
        struct sp_pool *p = NULL;
        CHECK(sp_pool_init(n, &p) == SP_OK);
        if (!p) continue;
        CHECK(sp_pool_n_threads(p) == n);
        struct job j;
        memset(&j, 0, sizeof j);
        int bad = 0;
        for (int r = 1; r <= 3000; r++) {
            j.round = r;
            sp_pool_run(p, task, &j);
            for (int i = 0; i < n; i++) bad += j.data[i] != r * 100 + i;
            if (r == 1500) { /* let the workers go to sleep, then wake them */
                struct timespec ts = {0, 50 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
        CHECKF(bad == 0, "n=%d: %d stale results", n, bad);
        for (int i = 0; i < n; i++) CHECKF(atomic_load(&j.hits[i]) == 3000, "n=%d thread %d ran %d times", n, i,
                                           atomic_load(&j.hits[i]));
        for (int i = n; i < 16; i++) CHECK(atomic_load(&j.hits[i]) == 0);
        sp_pool_free(p);
    }
    struct sp_pool *p = NULL;
    CHECK(sp_pool_init(0, &p) == SP_E_INVALID && p == NULL);
    sp_pool_free(NULL);
    return test_report("test_pool");
}
