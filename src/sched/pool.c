/*
 * pool.c -- pthread pool with a generation counter.
 *
 * Invariants:
 *  1. Workers 1..n-1 sleep on `wake` until `gen` changes, run the current
 *     job with their index, then decrement `pending`; the caller runs index 0
 *     and waits on `done` until pending == 0.
 *  2. Only one job is in flight; the job fields are written before gen is
 *     bumped under the mutex and read after it is observed under the mutex.
 *  3. stop is set only in sp_pool_free, after which workers exit.
 * States: IDLE --sp_pool_run--> RUNNING --last worker done--> IDLE;
 *         IDLE --sp_pool_free--> STOPPED.
 */
#include "pool.h"

#include <pthread.h>

struct sp_pool {
    int n;
    pthread_t *threads; /* (n - 1) workers */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t gen;
    int pending;
    int stop;
    sp_pool_task_fn fn;
    void *arg;
};

struct worker_arg {
    struct sp_pool *p;
    int ith;
};

static void *worker(void *a) {
    struct sp_pool *p = ((struct worker_arg *)a)->p;
    const int ith = ((struct worker_arg *)a)->ith;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        sp_pool_task_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Worker args live in one block after the pool struct's thread array. */
sp_status sp_pool_init(int n_threads, struct sp_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return sp_err(SP_E_INVALID, "%s: bad thread count %d", __func__, n_threads);
    struct sp_pool *p = sp_calloc(1, sizeof(*p));
    if (!p) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
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
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    sp_free(p->threads);
    sp_free(p);
}

int sp_pool_n_threads(const struct sp_pool *p) {
    return p->n;
}

void sp_pool_run(struct sp_pool *p, sp_pool_task_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
