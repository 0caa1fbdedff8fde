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

/* n_threads >= 1 (1 = no worker threads; jobs run on the caller).
 * SP_E_NOMEM / SP_E_INVALID. */
sp_status sp_pool_init(int n_threads, struct sp_pool **out);
void sp_pool_free(struct sp_pool *p);
int sp_pool_n_threads(const struct sp_pool *p);

/* Run fn on all threads (the caller is thread 0) and wait for all of them.
 * note: call only from the thread that owns the pool (not reentrant). */
void sp_pool_run(struct sp_pool *p, sp_pool_task_fn fn, void *arg);

#endif /* SP_POOL_H */
