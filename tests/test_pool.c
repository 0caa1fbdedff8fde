/*
 * test_pool.c -- the thread pool: every index runs exactly once per job,
 * results are visible to the caller after sp_pool_run, many back-to-back jobs
 * (the decode pattern) and jobs after the workers fell asleep all complete.
 */
#include "sched/pool.h"
#include "test_util.h"

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

int main(void) {
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
