/*
 * pool.c -- pthread pool with low-latency hand-off for decode.
 *
 * A decoded token runs a few hundred small jobs (one per weight matrix), so
 * waking sleeping threads through a condition variable for each would cost
 * more than some jobs.  Workers therefore spin on the job generation for a
 * short while (SPIN_ITERS pauses, tens of microseconds) before sleeping.
 *
 * Invariants:
 *  1. The caller writes fn/arg and pending = n-1, then bumps gen (seq_cst);
 *     a worker that observes the new gen reads fn/arg after it (acquire).
 *  2. A worker runs each generation exactly once, then decrements pending
 *     (release); the caller returns only when pending == 0 (acquire), so
 *     the job's writes are visible to it.
 *  3. Lost wake-ups are impossible: a worker increments `sleeping` and then
 *     re-checks gen under the mutex before waiting; the caller bumps gen and
 *     then reads `sleeping` (both seq_cst), and broadcasts under the mutex
 *     if anyone may be asleep (Dekker-style ordering).
 *  4. stop is set only in sp_pool_free, after which workers exit.
 *  5. active (1..n) is changed only between runs, by the owner
 *     (sp_pool_set_active), under mu: resume_gen = gen first (every run up
 *     to it is complete), then active.  Workers ith >= active park on
 *     `park` and take no part in runs; a run waits for active - 1 workers.
 *     A worker that sees a generation g takes part only if g > resume_gen
 *     and ith < active, both read after g (so a worker that was parked, or
 *     late, never repeats a finished run, and misses none after it).
 *  6. sp_pool_idle asks spinning workers to sleep now instead of after
 *     their spin; the next run clears the request before it publishes.
 * States: IDLE --sp_pool_run--> RUNNING --pending reaches 0--> IDLE;
 *         IDLE --sp_pool_free--> STOPPED.
 */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spin this many pauses before yielding the CPU on each further check: with
 * more threads than free cores a spinning thread would otherwise hold the
 * core that the thread it waits for needs.  Then sleep: 1000 yields (~1 ms)
 * cover the gaps between the products of a token; longer gaps (the pager
 * waiting for a read, serial work of the MoE router) are better slept
 * through -- each yield is a system call that, with I/O threads and other
 * processes runnable, becomes a context switch (perf: ~30% of a budgeted
 * MoE decode went to sched_yield with 18000 yields before sleeping). */
enum { SPIN_ITERS = 3000, SPIN_BEFORE_YIELD = 2000 };

static inline void backoff(int i) {
    if (i < SPIN_BEFORE_YIELD) {
        cpu_relax();
    } else {
        sched_yield();
    }
}

struct sp_pool {
    int n;
    pthread_t *threads; /* (n - 1) workers */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint_fast64_t gen;
    atomic_int pending;
    atomic_int sleeping;
    atomic_int stop;
    atomic_int active;     /* threads taking part in runs (invariant 5) */
    atomic_int idle_req;   /* sleep now (invariant 6) */
    atomic_uint_fast64_t resume_gen; /* invariant 5 */
    pthread_cond_t park;
    sp_pool_task_fn fn;
    void *arg;
};

struct worker_arg {
    struct sp_pool *p;
    int ith;
};

/* Wait until gen differs from seen (or stop); returns the new gen. */
static uint64_t wait_job(struct sp_pool *p, uint64_t seen, int ith) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
        if (atomic_load_explicit(&p->idle_req, memory_order_relaxed) ||
            ith >= atomic_load_explicit(&p->active, memory_order_relaxed))
            break;
        backoff(i);
    }
    pthread_mutex_lock(&p->mu);
    uint64_t g;
    for (;;) {
        /* parked: not one of the active threads (invariant 5) */
        while (ith >= atomic_load(&p->active) && !atomic_load(&p->stop)) pthread_cond_wait(&p->park, &p->mu);
        const uint64_t rg = atomic_load(&p->resume_gen);
        if (rg > seen) seen = rg; /* runs up to rg are finished */
        atomic_fetch_add(&p->sleeping, 1);
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop) && ith < atomic_load(&p->active))
            pthread_cond_wait(&p->wake, &p->mu);
        atomic_fetch_sub(&p->sleeping, 1);
        if (g != seen || atomic_load(&p->stop)) break;
    }
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker(void *a) {
    struct sp_pool *p = ((struct worker_arg *)a)->p;
    const int ith = ((struct worker_arg *)a)->ith;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen, ith);
        if (atomic_load(&p->stop)) return NULL;
        /* invariant 5: a worker that saw a new gen while spinning (or late)
         * may not be one of its threads, or the run may be long finished */
        const int n = atomic_load(&p->active);
        const uint64_t rg = atomic_load(&p->resume_gen);
        if (ith >= n || seen <= rg) {
            if (rg > seen) seen = rg;
            continue;
        }
        p->fn(p->arg, ith, n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

sp_status sp_pool_init(int n_threads, struct sp_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return sp_err(SP_E_INVALID, "%s: bad thread count %d", __func__, n_threads);
    struct sp_pool *p = sp_calloc(1, sizeof(*p));
    if (!p) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    p->n = n_threads;
    atomic_store(&p->active, n_threads);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->park, NULL);
    if (n_threads > 1) {
        /* Worker args live in the same block, after the thread array. */
        p->threads = sp_calloc((size_t)n_threads - 1, sizeof(pthread_t) + sizeof(struct worker_arg));
        if (!p->threads) {
            sp_pool_free(p);
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        }
        struct worker_arg *wa = (struct worker_arg *)(p->threads + (n_threads - 1));
        for (int i = 1; i < n_threads; i++) {
            wa[i - 1] = (struct worker_arg){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker, &wa[i - 1]) != 0) {
                sp_pool_free(p);
                return sp_err(SP_E_NOMEM, "%s: cannot start thread %d", __func__, i);
            }
            p->n_started++;
        }
    }
    *out = p;
    return SP_OK;
}

void sp_pool_free(struct sp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_cond_broadcast(&p->park);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->park);
    sp_free(p->threads);
    sp_free(p);
}

int sp_pool_n_threads(const struct sp_pool *p) {
    return atomic_load_explicit(&p->active, memory_order_relaxed);
}

int sp_pool_max_threads(const struct sp_pool *p) {
    return p->n;
}

void sp_pool_set_active(struct sp_pool *p, int n) {
    n = n < 1 ? 1 : n > p->n ? p->n : n;
    if (n == atomic_load(&p->active)) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->resume_gen, atomic_load(&p->gen));
    atomic_store(&p->active, n);
    pthread_cond_broadcast(&p->park); /* re-activated ones resume */
    pthread_cond_broadcast(&p->wake); /* sleeping ones that are now inactive park */
    pthread_mutex_unlock(&p->mu);
}

void sp_pool_idle(struct sp_pool *p) {
    atomic_store_explicit(&p->idle_req, 1, memory_order_relaxed);
}

void sp_pool_run(struct sp_pool *p, sp_pool_task_fn fn, void *arg) {
    const int n = atomic_load_explicit(&p->active, memory_order_relaxed);
    if (n == 1) {
        fn(arg, 0, 1);
        return;
    }
    atomic_store_explicit(&p->idle_req, 0, memory_order_relaxed);
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/arg/pending */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, n);
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) backoff(i);
}
