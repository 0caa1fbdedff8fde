/*
 * util.h -- small helpers the bench programs share: a repeatable, roughly
 * normal random source, clocks and a qsort comparison.  Header-only: each
 * bench program is built from its one .c file.
 */
#ifndef SP_BENCH_UTIL_H
#define SP_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

/* Roughly normal values (a sum of four uniforms, scaled), the same sequence
 * in every run: xorshift64 from a fixed seed. */
static uint64_t bench_rng_state = 88172645463325252ull;

static inline float bench_gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        bench_rng_state ^= bench_rng_state << 13;
        bench_rng_state ^= bench_rng_state >> 7;
        bench_rng_state ^= bench_rng_state << 17;
        s += (float)(bench_rng_state >> 40) / (float)(1 << 24);
    }
    return (s - 2.0f) * 1.7f;
}

static inline double bench_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wall time (the threads of a run in parallel) and this thread's CPU time
 * (time spent descheduled does not count). */
static inline double bench_wall_s(void) { return bench_clock(CLOCK_MONOTONIC); }
static inline double bench_cpu_s(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }

static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif /* SP_BENCH_UTIL_H */
