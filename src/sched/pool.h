/*
 * pool.h -- a small pthread pool for splitting one kernel call across
 * threads (decode matvecs split by output rows, so each thread streams its
 * own slice of the weights).  Threads are created once at session init;
 * running a job never allocates.
 */
#ifndef SP_POOL_H
#define SP_POOL_H

#include "core/core.h"

struct sp_pool;

/* fn(arg, ith, nth) is called once for each ith in [0, nth). */
typedef void (*sp_pool_task_fn)(void *arg, int ith, int nth);

/* The least stack a worker thread gets (more where the C library's default
 * is more): the kernels' stack buffers reach ~160 KB, and the caller's
 * thread runs jobs too (sparrow.h says so to the embedder). */
#define SP_POOL_STACK ((size_t)1 << 20)

/* n_threads >= 1 (1 = no worker threads; jobs run on the caller).
 * SP_E_NOMEM / SP_E_INVALID. */
sp_status sp_pool_init(int n_threads, struct sp_pool **out);
void sp_pool_free(struct sp_pool *p);
/* Threads a run uses now (sp_pool_set_active; at first all of them). */
int sp_pool_n_threads(const struct sp_pool *p);
/* Threads the pool was made with. */
int sp_pool_max_threads(const struct sp_pool *p);
/* Use only n of the threads (clamped to 1..max) from the next run on; the
 * others sleep (parked on a condition variable, no spinning) until asked
 * back.  Only from the owner, between runs.  Never allocates. */
void sp_pool_set_active(struct sp_pool *p, int n);
/* The caller is about to leave the pool unused for a while (between slices
 * of a step decode): the workers sleep now instead of spinning first. */
void sp_pool_idle(struct sp_pool *p);

/* Run fn on all threads (the caller is thread 0) and wait for all of them.
 * note: call only from the thread that owns the pool (not reentrant). */
void sp_pool_run(struct sp_pool *p, sp_pool_task_fn fn, void *arg);

#endif /* SP_POOL_H */
