/*
 * governor.c -- the measurements behind issue 19's acceptance items 1 and 4
 * (docs/GOVERNOR.md), a client of sparrow.h only:
 *
 *   governor latency MODEL [THREADS=2] [PHASE=100] [FACTOR=1.5] [OUT_PREFIX]
 *     The unloaded median ms/token U (64 greedy tokens), target T = FACTOR x U;
 *     then, with the governor (--target-ms T) and without, in one run: 5
 *     phases of PHASE tokens, a CPU-hog process (a child spinning) on during
 *     phases 2 and 4 -- it starts and stops twice.  For each of the 4
 *     changes: the median ms/token of the 50 tokens starting 20 after it,
 *     and whether it is within +-15% of T.  One JSON object on stdout; with
 *     OUT_PREFIX, OUT_PREFIX.gov.tsv / .none.tsv hold "token ms hog" per
 *     token (and OUT_PREFIX.trace.jsonl the governor's trace).
 *
 *   governor slices MODEL [THREADS=2] [PROMPT=512] [BUDGET_MS=10] [N_BATCH=128]
 *     One unsliced sp_decode of PROMPT token ids, then the same through
 *     sp_decode_begin / sp_decode_step(BUDGET_MS) on a fresh session: each
 *     step's wall time, the 99th percentile, the total against the unsliced
 *     call, and whether the logits are the same bit for bit.  JSON on stdout.
 *
 * Run on a quiet machine: the figures are the point.
 */
#include "sparrow.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int imin(int a, int b) {
    return a < b ? a : b;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    if (n <= 0) return NAN;
    double *t = malloc((size_t)n * sizeof *t);
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    const double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

static pid_t hog_start(void) {
    pid_t p = fork();
    if (p == 0) {
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    return p;
}

static void hog_stop(pid_t p) {
    if (p <= 0) return;
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

static struct sp_session *new_session(struct sp_model *m, int threads, int n_batch) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 2048;
    sp.n_threads = threads;
    sp.n_batch = n_batch;
    sp.sampling.temp = 0;
    sp.ctx_shift = true;
    sp.n_keep = 4;
    struct sp_session *s = NULL;
    if (sp_session_init(m, &sp, &s)) fprintf(stderr, "session: %s\n", sp_last_error());
    return s;
}

/* n greedy tokens after the prompt already decoded; ms[i] = wall time from
 * token i's sample to token i+1's (sampling, decode and pacing). */
static int gen(struct sp_session *s, int n, double *ms, int phase, pid_t *hog, bool with_hog) {
    double t_last = now();
    for (int i = 0; i < n; i++) {
        if (with_hog && i % phase == 0) {
            const int ph = i / phase; /* hog during phases 1 and 3 (0-based) */
            if (ph % 2 == 1 && *hog <= 0) *hog = hog_start();
            if (ph % 2 == 0 && *hog > 0) {
                hog_stop(*hog);
                *hog = 0;
            }
        }
        int32_t t;
        if (sp_sample(s, &t) || sp_decode(s, &t, 1)) return fprintf(stderr, "decode: %s\n", sp_last_error()), -1;
        const double tn = now();
        ms[i] = (tn - t_last) * 1e3;
        t_last = tn;
    }
    if (*hog > 0) hog_stop(*hog), *hog = 0;
    return 0;
}

static void write_tsv(const char *prefix, const char *tag, const double *ms, int n, int phase) {
    if (!prefix) return;
    char p[4096];
    snprintf(p, sizeof p, "%s.%s.tsv", prefix, tag);
    FILE *f = fopen(p, "w");
    if (!f) return;
    fprintf(f, "token\tms\thog\n");
    for (int i = 0; i < n; i++) fprintf(f, "%d\t%.3f\t%d\n", i, ms[i], (i / phase) % 2);
    fclose(f);
}

static int latency(const char *path, int threads, int phase, double factor, const char *prefix) {
    struct sp_model *m = NULL;
    if (sp_model_load(path, NULL, &m)) return fprintf(stderr, "load: %s\n", sp_last_error()), 1;
    struct sp_session *s = new_session(m, threads, 0);
    if (!s) return 1;
    int32_t prompt[64]; /* a synthetic model's byte-level vocabulary spells the prompt in ~18 tokens */
    int32_t np = 0;
    if (sp_tokenize(m, "Once upon a time", 16, SP_TOKENIZE_ADD_BOS, prompt, 64, &np))
        return fprintf(stderr, "tokenize: %s\n", sp_last_error()), 1;
    const int n = 5 * phase;
    double *ms = calloc((size_t)n + 64, sizeof *ms);
    pid_t hog = 0;
    /* unloaded */
    if (sp_decode(s, prompt, np) || gen(s, 64, ms, phase, &hog, false)) return fprintf(stderr, "decode: %s\n", sp_last_error()), 1;
    const double U = median(ms + 8, 56), T = factor * U;
    printf("{\"model\": \"%s\", \"threads\": %d, \"unloaded_ms\": %.3f, \"target_ms\": %.3f, \"phase_tokens\": %d",
           path, threads, U, T, phase);
    for (int mode = 0; mode < 2; mode++) {
        struct sp_governor *g = NULL;
        if (mode == 0) {
            struct sp_governor_params gp = sp_governor_default_params();
            gp.target_ms = T;
            char tp[4096];
            if (prefix) snprintf(tp, sizeof tp, "%s.trace.jsonl", prefix);
            gp.trace_path = prefix ? tp : NULL;
            gp.thermal_file = "/nonexistent"; /* latency only: no heat on a test box */
            if (sp_governor_init(&gp, &g) || sp_session_set_governor(s, g)) return fprintf(stderr, "%s\n", sp_last_error()), 1;
        }
        sp_session_reset(s);
        if (sp_decode(s, prompt, np) || gen(s, n, ms, phase, &hog, true)) return fprintf(stderr, "decode: %s\n", sp_last_error()), 1;
        write_tsv(prefix, mode == 0 ? "gov" : "none", ms, n, phase);
        printf(", \"%s\": {\"changes\": [", mode == 0 ? "governor" : "no_governor");
        int within = 0;
        for (int c = 1; c <= 4; c++) {
            const int a = c * phase + 20, b = imin(a + 50, n);
            const double med = median(ms + a, b - a);
            const bool ok = fabs(med - T) <= 0.15 * T;
            within += ok;
            printf("%s{\"at_token\": %d, \"hog\": %s, \"median_ms\": %.3f, \"within_15pct\": %s}", c > 1 ? ", " : "",
                   c * phase, c % 2 ? "\"started\"" : "\"stopped\"", med, ok ? "true" : "false");
        }
        printf("], \"within\": %d}", within);
        if (g) {
            sp_session_set_governor(s, NULL);
            sp_governor_free(g);
        }
    }
    printf("}\n");
    free(ms);
    sp_session_free(s);
    sp_model_free(m);
    return 0;
}

static int slices(const char *path, int threads, int n_prompt, double budget, int n_batch) {
    struct sp_model *m = NULL;
    if (sp_model_load(path, NULL, &m)) return fprintf(stderr, "load: %s\n", sp_last_error()), 1;
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    uint32_t x = 12345u;
    for (int i = 0; i < n_prompt; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)mi.n_vocab);
    }
    if (mi.bos >= 0) ids[0] = mi.bos;
    struct sp_session *a = new_session(m, threads, n_batch), *b = new_session(m, threads, n_batch);
    if (!a || !b) return 1;
    /* a warm-up decode on b, so that the step decode has a cost measured
     * (the first pass of a session's first step decode is n_batch tokens) */
    int32_t w = ids[0];
    if (sp_decode_begin(b, &w, 1)) return 1;
    for (bool done = false; !done;)
        if (sp_decode_step(b, budget, &done)) return 1;
    sp_session_reset(b);
    const double t0 = now();
    if (sp_decode(a, ids, n_prompt)) return fprintf(stderr, "decode: %s\n", sp_last_error()), 1;
    const double t_unsliced = now() - t0;
    int cap = 1 << 20, n = 0;
    double *st = malloc((size_t)cap * sizeof *st);
    const double t1 = now();
    if (sp_decode_begin(b, ids, n_prompt)) return fprintf(stderr, "begin: %s\n", sp_last_error()), 1;
    for (bool done = false; !done && n < cap;) {
        const double ts = now();
        if (sp_decode_step(b, budget, &done)) return fprintf(stderr, "step: %s\n", sp_last_error()), 1;
        st[n++] = (now() - ts) * 1e3;
    }
    const double t_sliced = now() - t1;
    const bool same = memcmp(sp_get_logits(a), sp_get_logits(b), (size_t)mi.n_vocab * sizeof(float)) == 0;
    qsort(st, (size_t)n, sizeof *st, cmp_d);
    const double p99 = st[imin((int)ceil(0.99 * n) - 1, n - 1)], p50 = st[n / 2], mx = st[n - 1];
    printf("{\"model\": \"%s\", \"threads\": %d, \"n_prompt\": %d, \"n_batch\": %d, \"budget_ms\": %g, \"steps\": %d, "
           "\"step_p50_ms\": %.3f, \"step_p99_ms\": %.3f, \"step_max_ms\": %.3f, \"unsliced_s\": %.4f, "
           "\"sliced_s\": %.4f, \"ratio\": %.4f, \"p99_ok\": %s, \"total_ok\": %s, \"logits_identical\": %s}\n",
           path, threads, n_prompt, n_batch, budget, n, p50, p99, mx, t_unsliced, t_sliced, t_sliced / t_unsliced,
           p99 <= 1.2 * budget ? "true" : "false", t_sliced <= 1.1 * t_unsliced ? "true" : "false",
           same ? "true" : "false");
    free(st);
    free(ids);
    sp_session_free(a);
    sp_session_free(b);
    sp_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: governor latency MODEL [THREADS=2] [PHASE=100] [FACTOR=1.5] [OUT_PREFIX]\n"
                        "       governor slices MODEL [THREADS=2] [PROMPT=512] [BUDGET_MS=10] [N_BATCH=128]\n");
        return 2;
    }
    sp_init();
    const int threads = argc > 3 ? atoi(argv[3]) : 2;
    if (!strcmp(argv[1], "latency"))
        return latency(argv[2], threads, argc > 4 ? atoi(argv[4]) : 100, argc > 5 ? atof(argv[5]) : 1.5,
                       argc > 6 ? argv[6] : NULL);
    if (!strcmp(argv[1], "slices"))
        return slices(argv[2], threads, argc > 4 ? atoi(argv[4]) : 512, argc > 5 ? atof(argv[5]) : 10,
                      argc > 6 ? atoi(argv[6]) : 128);
    fprintf(stderr, "governor: unknown mode '%s'\n", argv[1]);
    return 2;
}
