/*
 * test_soak.c -- continuous generation over many turns under a memory
 * budget, sampling the process's resident set, open descriptors and threads
 * (issue 20, "soak").  Turns go in cycles of eight:
 *   - four turns of a conversation: one session with context shift on, the
 *     first turn's prompt filling the context but one cell (so the KV
 *     cache's pages are all touched at once: its resident set grows with
 *     the cells used, not with time), each turn appending a prompt and
 *     generating into it, shifting the context when it is full;
 *   - then four turns of a fresh session each (created, used, freed: what a
 *     server does per request), also tokenizing and detokenizing its text.
 * One session at a time: under a budget the plan gives all that the first
 * session leaves to the weights, so a second at once would not fit.
 * A sample is taken after a decode once `every` seconds have passed (so a
 * session is always alive at a sample, as are its threads).  The warm-up
 * counts from the end of the first turn (its prompt fills the context: on a
 * 7B model that alone is minutes).  After the warm-up, descriptors and threads must not change at all and the resident
 * set must not grow by 1% or more: its highest value in the second half of
 * the samples against its highest in the first half (a sample's value
 * depends on the turn it falls in -- a fresh session's memory comes and goes
 * -- so the envelope is compared, not single samples; falling is no leak).  Under AddressSanitizer
 * the resident set is not checked (its quarantine holds freed memory on
 * purpose); LeakSanitizer checks at exit that nothing leaked.
 *
 *   test_soak                       the suite's version: stories260K-moe
 *                                   under a budget that streams its experts,
 *                                   8 s (every 0.5 s, 3 s warm-up)
 *   test_soak --model F --budget B --seconds S [--every S] [--warmup S]
 *             [--ctx N] [--tokens N] [--threads N]      (bench/soak.sh)
 * Prints one line per sample: seconds, turns, tokens, RSS KiB, fds, threads.
 */
#include "sparrow.h"
#include "test_util.h"

#include "mem/pager.h"
#include "model/model.h"

#include <dirent.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct sample {
    double t;
    long rss_kib, fds, threads;
    int turns;
    long tokens;
};

static long status_field(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = atol(line + n + 1);
            break;
        }
    }
    fclose(f);
    return v;
}

static long count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the one opendir holds */
}

struct soak {
    struct sp_model *m;
    struct sp_session_params sp;
    int n_gen;
    double t0, every, next, seconds;
    double t_first; /* the end of the first turn (seconds from t0) */
    struct sample *s;
    int n, cap;
    int turns;
    long tokens;
};

static void maybe_sample(struct soak *k) {
    const double t = now_s() - k->t0;
    if (t < k->next) return;
    k->next = t + k->every;
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 256;
        k->s = realloc(k->s, (size_t)k->cap * sizeof *k->s);
    }
    struct sample *x = &k->s[k->n++];
    *x = (struct sample){t, status_field("VmRSS"), count_fds(), status_field("Threads"), k->turns, k->tokens};
    printf("soak %8.1f s  turns %5d  tokens %7ld  rss %8ld KiB  fds %3ld  threads %3ld\n", x->t, x->turns, x->tokens,
           x->rss_kib, x->fds, x->threads);
    fflush(stdout);
}

static const char *const prompts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "The dog ran to the park.",
    "Tom had a big red ball. He",
    "One day, a bird",
};

/* Feed a prompt (BOS first if `bos`; with `fill`, repeated to fill the
 * context but one cell) and generate up to n_gen tokens into s; false on a
 * failure. */
static bool turn(struct soak *k, struct sp_session *s, const char *text, bool bos, bool fill) {
    enum { CAP = 4096 };
    static int32_t ids[CAP];
    int32_t n = 0, m = 0;
    if (sp_tokenize(k->m, text, strlen(text), bos ? SP_TOKENIZE_ADD_BOS : 0, ids, CAP, &n) != SP_OK) return false;
    const int32_t want = fill ? SP_MIN(k->sp.n_ctx - 1, CAP) : n;
    while (n < want && sp_tokenize(k->m, text, strlen(text), 0, ids + n, CAP - n, &m) == SP_OK && m > 0)
        n = SP_MIN(n + m, want);
    if (sp_decode(s, ids, n) != SP_OK) return false;
    k->tokens += n;
    maybe_sample(k);
    for (int i = 0; i < k->n_gen; i++) {
        int32_t t;
        if (sp_sample(s, &t) != SP_OK) return false;
        if (sp_token_is_eog(k->m, t)) break;
        if (sp_decode(s, &t, 1) != SP_OK) return false;
        k->tokens++;
        maybe_sample(k);
    }
    return true;
}

static bool fresh_session_turn(struct soak *k, const char *text) {
    struct sp_session *s = NULL;
    if (sp_session_init(k->m, &k->sp, &s) != SP_OK) return false;
    bool ok = turn(k, s, text, true, false);
    /* the text through the tokenizer and back */
    int32_t ids[256], n = 0;
    char back[1024];
    size_t len = 0;
    ok = ok && sp_tokenize(k->m, text, strlen(text), 0, ids, 256, &n) == SP_OK &&
         sp_detokenize(k->m, ids, n, back, sizeof back, &len) == SP_OK;
    sp_session_free(s);
    return ok;
}

int main(int argc, char **argv) {
    const char *model = NULL;
    uint64_t budget = 0;
    double seconds = 8, every = 0.5, warmup = 3;
    int ctx = 128, n_gen = 24, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--budget")) budget = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--every")) every = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) n_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "test_soak: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    sp_init();
    sp_log_set(NULL, NULL);
    const bool suite = model == NULL;
    if (suite && !(model = need_fixture("models/stories260K-moe/stories260K-moe-q8_0.gguf"))) return test_report("test_soak");
    struct soak k = {.n_gen = n_gen, .every = every, .seconds = seconds};
    k.sp = sp_session_default_params();
    k.sp.n_ctx = ctx;
    k.sp.n_threads = threads;
    k.sp.seed = 7;
    k.sp.ctx_shift = true; /* the conversation never ends */
    k.sp.n_keep = 4;
    struct sp_model_params mp = sp_model_default_params();
    /* the suite's budget: the sessions and 512 KiB of weights, so the
     * experts stream (planned with the test tuning of test_pager) */
    const struct sp_pager_tuning tight = {.unit_bytes = 16384, .small_bytes = 1024, .margin_set = true,
                                          .base_set = true, .read_bps = 1e9, .mem_bps = 1e10};
    sp_status rc = SP_OK;
    if (suite) {
        mp.mem_budget = (uint64_t)1 << 40;
        if ((rc = sp_model_load(model, &mp, &k.m)) == SP_OK) {
            struct sp_plan_info pi;
            sp_pager_tune(k.m->pager, &tight);
            if ((rc = sp_model_plan(k.m, &k.sp, &pi)) == SP_OK) budget = pi.session_bytes + (512u << 10);
            sp_model_free(k.m);
            k.m = NULL;
        }
    }
    mp.mem_budget = budget;
    if (rc == SP_OK) rc = sp_model_load(model, &mp, &k.m);
    if (rc == SP_OK && suite) sp_pager_tune(k.m->pager, &tight);
    struct sp_session *conv = NULL;
    if (rc == SP_OK) rc = sp_session_init(k.m, &k.sp, &conv);
    CHECKF(rc == SP_OK, "%s under a budget of %llu bytes: %s", model, (unsigned long long)budget, sp_last_error());
    if (rc) {
        sp_model_free(k.m);
        return test_report("test_soak");
    }
    const struct sp_plan *pl = sp_pager_plan(k.m->pager);
    printf("soak: %s, budget %.1f MiB (%s), %g s, a sample every %g s after a %g s warm-up%s\n", model,
           budget / 1048576.0, pl && !pl->resident ? "weights stream" : "weights resident", seconds, every, warmup,
           SOAK_ASAN ? " (AddressSanitizer: resident set not checked)" : "");
    k.t0 = now_s();
    bool ok = true;
    while (ok && now_s() - k.t0 < seconds) {
        const char *text = prompts[k.turns % SP_ARRAY_LEN(prompts)];
        const int phase = k.turns % 8;
        if (phase == 0 && !conv) ok = sp_session_init(k.m, &k.sp, &conv) == SP_OK;
        if (phase < 4) {
            ok = ok && turn(&k, conv, text, phase == 0, phase == 0);
        } else {
            sp_session_free(conv);
            conv = NULL;
            ok = fresh_session_turn(&k, text);
        }
        k.turns++;
        if (k.turns == 1) k.t_first = now_s() - k.t0;
    }
    CHECKF(ok, "turn %d: %s", k.turns, sp_last_error());
    sp_session_free(conv);
    sp_model_free(k.m);

    /* flat after the warm-up */
    int first = 0;
    while (first < k.n && k.s[first].t < k.t_first + warmup) first++;
    CHECKF(k.n - first >= 3, "only %d samples after the warm-up", k.n - first);
    if (k.n - first >= 3) {
        const int q = (k.n - first) / 2;
        const struct sample *a = &k.s[first], *z = &k.s[k.n - 1];
        long head = 0, tail = 0, fd_lo = a->fds, fd_hi = a->fds, th_lo = a->threads, th_hi = a->threads;
        for (int i = first; i < k.n; i++) {
            if (i < first + q) head = SP_MAX(head, k.s[i].rss_kib);
            else tail = SP_MAX(tail, k.s[i].rss_kib);
            fd_lo = SP_MIN(fd_lo, k.s[i].fds), fd_hi = SP_MAX(fd_hi, k.s[i].fds);
            th_lo = SP_MIN(th_lo, k.s[i].threads), th_hi = SP_MAX(th_hi, k.s[i].threads);
        }
        const double drift = (double)(tail - head) / (double)head;
        printf("soak: %d turns, %ld tokens in %.0f s; the first turn took %.0f s; after the warm-up (%d samples from "
               "%.0f s): highest rss %ld KiB "
               "in the first half, %ld in the second (drift %+.3f%%), fds %ld..%ld, threads %ld..%ld\n",
               k.turns, k.tokens, z->t, k.t_first, k.n - first, a->t, head, tail, 100 * drift, fd_lo, fd_hi, th_lo,
               th_hi);
        CHECKF(fd_lo == fd_hi, "open descriptors changed after the warm-up: %ld..%ld", fd_lo, fd_hi);
        CHECKF(th_lo == th_hi, "threads changed after the warm-up: %ld..%ld", th_lo, th_hi);
        if (!SOAK_ASAN) {
            CHECKF(drift < 0.01, "resident set grew %+.3f%% after the warm-up", 100 * drift);
        }
    }
    free(k.s);
    return test_report("test_soak");
}
