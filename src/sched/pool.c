/*
 * pool.c -- pthread pool with low-latency hand-off for decode.
 *
 * A decoded token runs a few hundred small jobs (one per weight matrix), so
 * waking sleeping threads through a condition variable for each would cost
 * more than some jobs.  Workers therefore spin on the job generation for a
 * short while (SPIN_ITERS pauses, tens of microseconds) before sleeping.
 *
 * The indexes of a run are claimed, not assigned: whoever is running -- the
 * caller first, then any worker that has woken -- takes the next unclaimed
 * index, and the caller waits only for indexes that were claimed.  On a busy
 * device (another process on one of the cores) a worker that the kernel has
 * not scheduled yet no longer holds up a run: the caller does its index too.
 * (With fixed indexes each of a token's few hundred runs waited for the
 * slowest thread to be scheduled; a 7B decode on 2 threads with one CPU hog
 * took as long as on 1 thread.)
 *
 * Invariants:
 *  1. tick packs (generation, n, next index): the caller writes fn/arg and
 *     done = 0, then publishes a new tick (seq_cst) with next = 1 (index 0 is
 *     its own).  An index is claimed by a CAS that increments next; the
 *     claimer reads fn/arg after the CAS (acquire), runs the index, and adds
 *     1 to done (release).
 *  2. The caller returns only when done == n (acquire): every index ran
 *     exactly once and its writes are visible.  fn/arg do not change before
 *     then, so a claim (which succeeds only while next < n, i.e. before the
 *     run is complete) always reads the run's own fn/arg; a late worker whose
 *     CAS fails on a newer tick touches nothing of the old run.
 *  3. Lost wake-ups are impossible: a worker increments `sleeping` and then
 *     re-checks the generation under the mutex before waiting; the caller
 *     publishes tick and then reads `sleeping` (both seq_cst), and broadcasts
 *     under the mutex if anyone may be asleep (Dekker-style ordering).
 *  4. stop is set only in sp_pool_free, after which workers exit.
 *  5. active (1..n) is changed only between runs, by the owner
 *     (sp_pool_set_active).  A run has active indexes; workers ith >= active
 *     park on `park` and claim nothing (correctness does not depend on it: any
 *     thread may run any index, each exactly once by invariant 1).
 *  6. sp_pool_idle asks spinning workers to sleep now instead of after
 *     their spin; the next run clears the request before it publishes.
 * States: IDLE --sp_pool_run--> RUNNING --done reaches n--> IDLE;
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
    atomic_uint_fast64_t tick; /* generation << 32 | n << 16 | next index (invariant 1) */
    atomic_int done;       /* indexes of the current run completed */
    atomic_int sleeping;
    atomic_int stop;
    atomic_int active;     /* threads taking part in runs (invariant 5) */
    atomic_int idle_req;   /* sleep now (invariant 6) */
    pthread_cond_t park;
    sp_pool_task_fn fn;
    void *arg;
};

struct worker_arg {
    struct sp_pool *p;
    int ith;
};

static inline uint32_t tick_gen(uint64_t t) { return (uint32_t)(t >> 32); }
static inline int tick_n(uint64_t t) { return (int)((t >> 16) & 0xffff); }
static inline int tick_next(uint64_t t) { return (int)(t & 0xffff); }

/* Claim and run indexes of the run whose generation is g until none is left
 * (invariant 1). */
static void claim_and_run(struct sp_pool *p, uint32_t g) {
    uint64_t t = atomic_load_explicit(&p->tick, memory_order_acquire);
    for (;;) {
        if (tick_gen(t) != g || tick_next(t) >= tick_n(t)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->tick, &t, t + 1, memory_order_acquire, memory_order_acquire))
            continue; /* t reloaded */
        p->fn(p->arg, tick_next(t), tick_n(t));
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        t = atomic_load_explicit(&p->tick, memory_order_acquire);
    }
}

/* Wait until the generation differs from seen (or stop); returns the new one. */
static uint32_t wait_job(struct sp_pool *p, uint32_t seen, int ith) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        const uint32_t g = tick_gen(atomic_load_explicit(&p->tick, memory_order_acquire));
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
        if (atomic_load_explicit(&p->idle_req, memory_order_relaxed) ||
            ith >= atomic_load_explicit(&p->active, memory_order_relaxed))
            break;
        backoff(i);
    }
    pthread_mutex_lock(&p->mu);
    uint32_t g;
    for (;;) {
        /* parked: not one of the active threads (invariant 5) */
        while (ith >= atomic_load(&p->active) && !atomic_load(&p->stop)) pthread_cond_wait(&p->park, &p->mu);
        atomic_fetch_add(&p->sleeping, 1);
        while ((g = tick_gen(atomic_load(&p->tick))) == seen && !atomic_load(&p->stop) && ith < atomic_load(&p->active))
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
    uint32_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen, ith);
        if (atomic_load(&p->stop)) return NULL;
        /* a worker that was parked or late finds the run's indexes all
         * claimed (or a newer generation) and runs nothing (invariant 2) */
        if (ith < atomic_load_explicit(&p->active, memory_order_relaxed)) claim_and_run(p, seen);
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
        /* The kernels keep up to ~160 KB on the stack (the multi-token
         * decodes' activations and terms, docs/KERNELS.md): more than some
         * C libraries give a thread by default (musl: 128 KB). */
        pthread_attr_t attr;
        size_t ss = 0;
        const bool have_attr = pthread_attr_init(&attr) == 0;
        if (have_attr && pthread_attr_getstacksize(&attr, &ss) == 0 && ss < SP_POOL_STACK)
            pthread_attr_setstacksize(&attr, SP_POOL_STACK);
        for (int i = 1; i < n_threads; i++) {
            wa[i - 1] = (struct worker_arg){p, i};
            if (pthread_create(&p->threads[i - 1], have_attr ? &attr : NULL, worker, &wa[i - 1]) != 0) {
                if (have_attr) pthread_attr_destroy(&attr);
                sp_pool_free(p);
                return sp_err(SP_E_NOMEM, "%s: cannot start thread %d", __func__, i);
            }
            p->n_started++;
        }
        if (have_attr) pthread_attr_destroy(&attr);
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
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t g = tick_gen(atomic_load_explicit(&p->tick, memory_order_relaxed)) + 1;
    /* seq_cst: publishes fn/arg/done; index 0 is the caller's */
    atomic_store(&p->tick, (uint64_t)g << 32 | (uint64_t)n << 16 | 1u);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, n);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    claim_and_run(p, g); /* the indexes no worker has taken yet */
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; i++) backoff(i);
}
