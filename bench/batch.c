/*
 * batch.c -- what a batched decode step costs against a single one: N
 * sessions of one model decode one token each per step with sp_batch_decode
 * (N = 1, 2, 4, ... up to MAX), after a short prompt each; prints, per N, the
 * step time and the aggregate tokens/s, and the ratio to N = 1.  Decode is
 * bound by memory bandwidth when the weights are read once per step for
 * every row, so the aggregate should grow nearly with N until compute
 * takes over.  A client of sparrow.h only.
 *
 *   batch MODEL [MAX_N=4] [STEPS=8] [THREADS=cores]
 */
#include "sparrow.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: batch MODEL [MAX_N=4] [STEPS=8] [THREADS=cores]\n");
        return 2;
    }
    const int max_n = argc > 2 ? atoi(argv[2]) : 4, steps = argc > 3 ? atoi(argv[3]) : 8;
    const int threads = argc > 4 ? atoi(argv[4]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (max_n < 1 || max_n > 64 || steps < 1) return 2;
    sp_init();
    struct sp_model_params mp = sp_model_default_params();
    mp.n_seq = max_n;
    mp.n_ctx = 256;
    struct sp_model *m = NULL;
    if (sp_model_load(argv[1], &mp, &m)) return fprintf(stderr, "load: %s\n", sp_last_error()), 1;
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = 1;
    sp.sampling.temp = 0;
    struct sp_session *s[64];
    for (int i = 0; i < max_n; i++)
        if (sp_session_init(m, &sp, &s[i])) return fprintf(stderr, "session: %s\n", sp_last_error()), 1;
    struct sp_batch *b = NULL;
    if (sp_batch_init(m, max_n, 64, threads, &b)) return fprintf(stderr, "batch: %s\n", sp_last_error()), 1;
    double base = 0;
    for (int n = 1; n <= max_n; n *= 2) {
        const int32_t prompt[4] = {1, 100, 200, 300};
        int32_t last[64], nt[64];
        const int32_t *tk[64];
        for (int i = 0; i < n; i++) {
            sp_session_reset(s[i]);
            tk[i] = prompt, nt[i] = 4;
        }
        if (sp_batch_decode(b, s, tk, nt, n)) return fprintf(stderr, "decode: %s\n", sp_last_error()), 1;
        double t0 = 0;
        for (int k = 0; k <= steps; k++) {
            if (k == 1) t0 = now(); /* the first step warms up */
            for (int i = 0; i < n; i++) {
                sp_sample(s[i], &last[i]);
                tk[i] = &last[i], nt[i] = 1;
            }
            if (sp_batch_decode(b, s, tk, nt, n)) return fprintf(stderr, "decode: %s\n", sp_last_error()), 1;
        }
        const double step = (now() - t0) / steps, agg = n / step;
        if (n == 1) base = agg;
        printf("{\"n_seq\": %d, \"step_ms\": %.1f, \"aggregate_tok_s\": %.3f, \"vs_one\": %.2f}\n", n, step * 1e3, agg,
               agg / base);
        fflush(stdout);
    }
    sp_batch_free(b);
    for (int i = 0; i < max_n; i++) sp_session_free(s[i]);
    sp_model_free(m);
    return 0;
}
