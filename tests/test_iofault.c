/*
 * test_iofault.c -- storage faults while weights stream (core/file.h's fault
 * hook; issue 20, acceptance 1).
 *
 *  1. The retry policy on a plain file (sp_file_read_at, sp_file_pread_all):
 *     SP_FILE_RETRIES failed tries in a row are survived, one more is an
 *     SP_E_IO naming the file and the offset; EINTR likewise with its own
 *     bound; short counts and stalls only cost time.
 *  2. Faults while opening a budgeted MoE model and creating its session
 *     (parsing, planning, reading the pinned weights), each kind at every
 *     read it makes: the open or the session fails cleanly (SP_E_IO naming
 *     the file and an offset) or works; a session the faults refused is made
 *     again on the same model, and its logits are the unbudgeted ones.
 *  3. Faults while streaming: stories260K-moe and tiny-qwen3moe under a
 *     budget that streams nearly every weight through a few 4 KiB slots;
 *     a greedy run (a prompt, then five tokens) with one fault per run, of
 *     each kind, at each of the first 200 reads and at 200 reads drawn from
 *     the rest of a run:
 *       eio    odd reads: fails until the test disarms the hook ("hard"):
 *              sp_decode fails with SP_E_IO naming the file and an offset,
 *              leaves no logits, and the same call on the same session,
 *              reads working again, continues the run; even reads: fails
 *              once (the retry gets past it);
 *       short  returns half of what was asked;
 *       eintr  fails with EINTR;
 *       stall  sleeps 1 ms first.
 *     Every pass of every run must give the unbudgeted logits bit for bit
 *     (not just the tokens); a run stops one whole pass after the pass its
 *     fault came in, so what a fault could have left in a cached slot is
 *     read back once more.  No pin may be left outstanding.
 *
 * The runs read a copy of the fixture in /dev/shm (else $SPARROW_SCRATCH),
 * removed at the end: thousands of runs of hundreds of 4 KiB O_DIRECT reads
 * cost minutes from a VM's disk, seconds from memory, through the same code
 * (tmpfs takes O_DIRECT since Linux 6.6; before that the pager falls back to
 * buffered reads, also a path worth faulting).  test_pager streams from the
 * fixtures themselves.
 *
 *   test_iofault          the suite's version
 *   test_iofault --all    every read of a run, not 200 + 200 (bench/iofault.sh)
 */
#include "sparrow.h"
#include "test_util.h"

#include "core/file.h"
#include "mem/pager.h"
#include "model/model.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>

enum { N_PROMPT = 4, N_PASSES = 6, N_FIRST = 200, N_RANDOM = 200 };

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static void arm(enum sp_fault_kind kind, uint64_t at, uint64_t count) {
    const struct sp_file_fault f = {.kind = kind, .at = at, .count = count, .stall_ms = 1};
    sp_file_fault_set(&f);
}

/* Counting without misbehaving: a fault that never comes. */
static void count_reads(void) {
    arm(SP_FAULT_EIO, UINT64_MAX, 1);
}

static double cpu_s(void) {
    return (double)clock() / CLOCKS_PER_SEC;
}

/* Copy src into a fresh folder on a RAM-backed file system (else scratch);
 * the copy's path in out, the folder in dir.  False (counted) on failure. */
static bool ram_copy(const char *src, char *out, size_t cap, char *dir, size_t dir_cap) {
    snprintf(dir, dir_cap, "%s/sparrow-iofault-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : scratch_dir());
    if (!mkdtemp(dir)) {
        CHECKF(0, "cannot make a folder %s: %s", dir, strerror(errno));
        return false;
    }
    const char *base = strrchr(src, '/');
    if ((size_t)snprintf(out, cap, "%s/%s", dir, base ? base + 1 : src) >= cap) {
        CHECKF(0, "path too long: %s", src);
        rmdir(dir);
        return false;
    }
    size_t n = 0;
    char *data = test_read_file(src, &n);
    FILE *f = data ? fopen(out, "wb") : NULL;
    bool ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = false;
    free(data);
    CHECKF(ok, "cannot copy %s to %s", src, out);
    return ok;
}

/* ---- 1. the retry policy -------------------------------------------------- */

static void test_retry_policy(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/sparrow-iofault-%ld.bin", scratch_dir(), (long)getpid());
    enum { N = 3 * 4096 + 100 };
    static uint8_t data[N], got[N];
    for (int i = 0; i < N; i++) data[i] = (uint8_t)(i * 7 + 3);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(data, 1, N, fp) == N);
    if (fp) fclose(fp);
    struct sp_file *f = NULL;
    CHECK(sp_file_open(path, &f) == SP_OK);
    if (!f) return;
    const struct {
        enum sp_fault_kind kind;
        uint64_t count;
        bool ok;
    } cases[] = {
        {SP_FAULT_EIO, SP_FILE_RETRIES, true},       {SP_FAULT_EIO, SP_FILE_RETRIES + 1, false},
        {SP_FAULT_EIO, 0, false},                    {SP_FAULT_EINTR, SP_FILE_RETRIES_INTR, true},
        {SP_FAULT_EINTR, SP_FILE_RETRIES_INTR + 1, false}, {SP_FAULT_SHORT, 0, true},
        {SP_FAULT_STALL, 3, true},
    };
    for (size_t c = 0; c < SP_ARRAY_LEN(cases); c++) {
        memset(got, 0, sizeof got);
        arm(cases[c].kind, 1, cases[c].count);
        /* a read that starts inside the file and needs several tries */
        const sp_status rc = sp_file_read_at(f, 100, got, N - 100);
        const uint64_t hits = sp_file_fault_hits();
        sp_file_fault_set(NULL);
        CHECKF(hits > 0, "case %zu: the fault never came", c);
        if (cases[c].ok) {
            CHECKF(rc == SP_OK && memcmp(got, data + 100, N - 100) == 0, "case %zu (kind %d x %llu): %s", c,
                   (int)cases[c].kind, (unsigned long long)cases[c].count, rc ? sp_last_error() : "other bytes");
        } else {
            CHECKF(rc == SP_E_IO && strstr(sp_last_error(), path) && strstr(sp_last_error(), "at offset "),
                   "case %zu (kind %d x %llu): status %d, '%s'", c, (int)cases[c].kind,
                   (unsigned long long)cases[c].count, rc, sp_last_error());
        }
    }
    /* the first try fails: the offset named is where the read began */
    arm(SP_FAULT_EIO, 1, 0);
    sp_status rc = sp_file_read_at(f, 4096, got, 10);
    sp_file_fault_set(NULL);
    CHECKF(rc == SP_E_IO && strstr(sp_last_error(), "at offset 4096"), "'%s'", sp_last_error());
    /* a short count at the end of the file is the end, not an error */
    const int fd = open(path, O_RDONLY);
    size_t n = 0;
    CHECK(fd >= 0 && sp_file_pread_all(fd, got, 8192, N - 50, &n) == 0 && n == 50);
    if (fd >= 0) close(fd);
    sp_file_close(f);
    unlink(path);
}

/* ---- the runs ------------------------------------------------------------- */

/* Streams nearly everything: units of unit_bytes (test_model), a weight
 * budget of 512 KiB. */
static struct sp_pager_tuning tight = {.small_bytes = 1024, .margin_set = true, .margin_bytes = 0,
                                       .base_set = true, .base_bytes = 0, .read_bps = 1e9, .mem_bps = 1e10};
#define WEIGHT_BUDGET (448u * 1024)

static struct sp_session_params session_params(void) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 2; /* the prompt in two passes: a failure in the second keeps the first */
    sp.sampling.temp = 0;
    return sp;
}

/* What the unbudgeted model does: pass 0 feeds the prompt, pass p >= 1 the
 * token pass p-1 chose; logits row p and token toks[p] of each. */
struct ref {
    const char *path;
    int32_t prompt[N_PROMPT];
    int32_t toks[N_PASSES];
    float *logits; /* (N_PASSES, n_vocab) */
    int32_t n_vocab;
};

struct outcome {
    sp_status rc;   /* the first failure seen (SP_OK: none) */
    char err[512];  /* its message */
    bool hit;       /* the fault came */
    int passes;     /* passes done */
    int bad;        /* passes whose logits or token differ from the reference */
};

/* Run the passes on s.  A failed pass must leave no logits, and the tokens
 * of the batches before it decoded (sp_session_n_past); the hook is then
 * disarmed and the tokens not consumed fed again (once).  stop_early: stop
 * one whole pass after the pass the fault came in. */
static void run_passes(struct sp_session *s, const struct ref *r, bool stop_early, struct outcome *o) {
    memset(o, 0, sizeof *o);
    int hit_pass = -1;
    for (int p = 0; p < N_PASSES; p++) {
        const int32_t *in = p ? &r->toks[p - 1] : r->prompt;
        const int32_t n_in = p ? 1 : N_PROMPT, n_past0 = p ? N_PROMPT + p - 1 : 0;
        CHECK(sp_session_n_past(s) == n_past0);
        sp_status rc = sp_decode(s, in, n_in);
        if (rc) {
            if (!o->rc) {
                o->rc = rc;
                snprintf(o->err, sizeof o->err, "%s", sp_last_error());
            }
            int32_t t;
            CHECKF(sp_sample(s, &t) == SP_E_STATE, "a failed decode left logits to sample from");
            /* whole batches of the prompt (n_batch 2) may have gone in */
            const int32_t done = sp_session_n_past(s) - n_past0;
            CHECKF(done >= 0 && done < n_in && done % 2 == 0, "a failed decode of %d tokens consumed %d", n_in, done);
            sp_file_fault_set(NULL);
            if ((rc = sp_decode(s, in + done, n_in - done)) != SP_OK) {
                snprintf(o->err, sizeof o->err, "the call again, reads working: %s", sp_last_error());
                o->rc = rc;
                return;
            }
        }
        o->passes++;
        const float *l = sp_get_logits(s);
        int32_t t = -1;
        const bool same = l && memcmp(l, r->logits + (size_t)p * r->n_vocab, (size_t)r->n_vocab * sizeof(float)) == 0;
        o->bad += !same || sp_sample(s, &t) != SP_OK || t != r->toks[p];
        if (hit_pass < 0 && sp_file_fault_hits() > 0) hit_pass = p;
        if (stop_early && hit_pass >= 0 && p > hit_pass) break;
    }
    o->hit = sp_file_fault_hits() > 0;
}

static struct sp_model *load(const char *path, uint64_t budget, sp_status *rc) {
    struct sp_model_params mp = sp_model_default_params();
    mp.mem_budget = budget;
    mp.n_ctx = 64; /* the envelope: the sessions below (session_params) */
    mp.n_batch = 2;
    struct sp_model *m = NULL;
    *rc = sp_model_load(path, &mp, &m);
    if (*rc == SP_OK && budget) sp_pager_tune(m->pager, &tight);
    return m;
}

/* An SP_E_IO whose message names the file and an offset. */
static bool clean_io_error(sp_status rc, const char *msg, const char *path) {
    return rc == SP_E_IO && strstr(msg, path) && strstr(msg, "offset ");
}

static bool make_ref(const char *path, struct ref *r) {
    struct sp_session_params sp = session_params();
    sp_status rc;
    struct sp_model *m = load(path, 0, &rc);
    struct sp_session *s = NULL;
    if (rc == SP_OK) rc = sp_session_init(m, &sp, &s);
    CHECKF(rc == SP_OK, "unbudgeted %s: %s", path, sp_last_error());
    bool ok = rc == SP_OK;
    if (ok) {
        struct sp_model_info info;
        sp_model_get_info(m, &info);
        r->path = path;
        r->n_vocab = info.n_vocab;
        const int32_t prompt[N_PROMPT] = {1, 403, 407, 261};
        for (int i = 0; i < N_PROMPT; i++) r->prompt[i] = prompt[i] % info.n_vocab;
        r->logits = malloc((size_t)N_PASSES * info.n_vocab * sizeof(float));
        for (int p = 0; p < N_PASSES && ok; p++) {
            ok = sp_decode(s, p ? &r->toks[p - 1] : r->prompt, p ? 1 : N_PROMPT) == SP_OK &&
                 sp_sample(s, &r->toks[p]) == SP_OK;
            if (ok) memcpy(r->logits + (size_t)p * info.n_vocab, sp_get_logits(s), (size_t)info.n_vocab * sizeof(float));
        }
        CHECKF(ok, "unbudgeted run: %s", sp_last_error());
    }
    sp_session_free(s);
    sp_model_free(m);
    return ok;
}

/* ---- 2. faults while loading ---------------------------------------------- */

static void load_faults(const struct ref *r, uint64_t budget) {
    struct sp_session_params sp = session_params();
    count_reads();
    sp_status rc;
    struct sp_model *m = load(r->path, budget, &rc);
    struct sp_session *s = NULL;
    if (rc == SP_OK) rc = sp_session_init(m, &sp, &s);
    if (rc == SP_OK) rc = sp_pager_wait_pinned(m->pager); /* the start-up reads run on after the session is made */
    const uint64_t n_reads = sp_file_fault_calls();
    sp_file_fault_set(NULL);
    CHECKF(rc == SP_OK, "fault-free open of %s: %s", r->path, sp_last_error());
    sp_session_free(s);
    sp_model_free(m);
    int runs = 0, open_err = 0, init_err = 0, late_err = 0;
    for (enum sp_fault_kind kind = SP_FAULT_EIO; kind < SP_FAULT_COUNT; kind++) {
        for (uint64_t at = 1; at <= n_reads; at++) {
            arm(kind, at, kind == SP_FAULT_EIO ? 0 : 1);
            m = load(r->path, budget, &rc);
            s = NULL;
            char err[512] = "";
            if (rc) {
                snprintf(err, sizeof err, "%s", sp_last_error());
                open_err++;
            } else if ((rc = sp_session_init(m, &sp, &s)) != SP_OK) {
                snprintf(err, sizeof err, "%s", sp_last_error());
                init_err++;
            }
            sp_file_fault_set(NULL);
            runs++;
            if (rc) {
                CHECKF(kind == SP_FAULT_EIO, "kind %d at load read %llu: %s", (int)kind, (unsigned long long)at, err);
                CHECKF(clean_io_error(rc, err, r->path), "kind %d at load read %llu: status %d, '%s'", (int)kind,
                       (unsigned long long)at, rc, err);
            }
            if (m && !s && (rc = sp_session_init(m, &sp, &s)) != SP_OK) {
                CHECKF(0, "load read %llu: the session again, reads working: %s", (unsigned long long)at,
                       sp_last_error());
            }
            if (s) {
                /* a pinned tensor's read that failed after the session was
                 * made (the start-up reads do not hold it up) fails the first
                 * pin of it -- a clean SP_E_IO from sp_decode -- and the call
                 * again, reads working, reads it afresh */
                struct outcome o;
                run_passes(s, r, false, &o);
                CHECKF((o.rc == SP_OK || (kind == SP_FAULT_EIO && clean_io_error(o.rc, o.err, r->path))) && o.bad == 0,
                       "kind %d at load read %llu: %d passes differ (status %d: %s)", (int)kind, (unsigned long long)at,
                       o.bad, o.rc, o.err);
                late_err += o.rc != SP_OK;
            }
            sp_session_free(s);
            sp_model_free(m);
        }
    }
    printf("  load: %llu reads to open, plan and pin; %d runs: %d opens and %d sessions refused cleanly (then "
           "made again), %d first decodes failed cleanly on a pinned read (then went on), every run's logits right\n",
           (unsigned long long)n_reads, runs, open_err, init_err, late_err);
}

/* ---- 3. faults while streaming -------------------------------------------- */

static const char *const kind_name[SP_FAULT_COUNT] = {"none", "eio", "short", "eintr", "stall"};

static void stream_faults(const struct ref *r, uint64_t budget, bool all) {
    struct sp_session_params sp = session_params();
    sp_status rc;
    struct sp_model *m = load(r->path, budget, &rc);
    struct sp_session *s = NULL;
    if (rc == SP_OK) rc = sp_session_init(m, &sp, &s);
    CHECKF(rc == SP_OK, "budgeted session: %s", sp_last_error());
    if (rc) {
        sp_model_free(m);
        return;
    }
    const struct sp_plan *pl = sp_pager_plan(m->pager);
    CHECK(pl && !pl->resident && pl->expert_slots > 0);
    /* Reads in a whole run, after a first run (the pager's caches carry over
     * between runs, as in a long-lived session); the fewest of three. */
    struct outcome o;
    run_passes(s, r, false, &o);
    uint64_t n_reads = UINT64_MAX;
    for (int k = 0; k < 3; k++) {
        sp_session_reset(s);
        count_reads();
        run_passes(s, r, false, &o);
        n_reads = SP_MIN(n_reads, sp_file_fault_calls());
        sp_file_fault_set(NULL);
        CHECKF(o.rc == SP_OK && o.bad == 0, "budgeted run without faults: %d passes differ (%s)", o.bad, o.err);
    }
    CHECKF(n_reads > N_FIRST + N_FIRST / 4, "only %llu reads in a run: the budget does not stream enough",
           (unsigned long long)n_reads);
    /* the later reads are drawn from the first 3/4 of a run: runs differ in
     * length (what the prefetches found cached depends on timing) */
    const uint64_t later = SP_MAX(n_reads * 3 / 4, (uint64_t)N_FIRST + 1);
    *test_rng() = 0x10fa17;
    for (enum sp_fault_kind kind = SP_FAULT_EIO; kind < SP_FAULT_COUNT; kind++) {
        int runs = 0, hits = 0, errors = 0, bad = 0;
        const uint64_t last = all ? n_reads : N_FIRST + N_RANDOM;
        const double t0 = cpu_s();
        for (uint64_t k = 1; k <= last; k++) {
            const uint64_t at = all || k <= N_FIRST ? k : N_FIRST + 1 + rng_u64() % (later - N_FIRST);
            const bool hard = kind == SP_FAULT_EIO && at % 2;
            sp_session_reset(s);
            arm(kind, at, hard ? 0 : 1);
            run_passes(s, r, true, &o);
            sp_file_fault_set(NULL);
            runs++;
            hits += o.hit;
            bad += o.bad > 0;
            CHECKF(o.bad == 0, "%s at read %llu: %d of %d passes differ from the unbudgeted ones", kind_name[kind],
                   (unsigned long long)at, o.bad, o.passes);
            if (o.rc) {
                errors++;
                CHECKF(hard, "%s at read %llu: %s", kind_name[kind], (unsigned long long)at, o.err);
                CHECKF(clean_io_error(o.rc, o.err, r->path), "%s at read %llu: status %d, '%s'", kind_name[kind],
                       (unsigned long long)at, o.rc, o.err);
            }
            struct sp_pager_stats ps;
            sp_pager_get_stats(m->pager, &ps);
            CHECKF(ps.outstanding == 0, "%s at read %llu: %llu pins outstanding", kind_name[kind],
                   (unsigned long long)at, (unsigned long long)ps.outstanding);
        }
        printf("  %-6s %d runs, %d reached their read; %d failed cleanly (SP_E_IO, file and offset) and went on; "
               "%d runs with other logits; %.1f s CPU\n",
               kind_name[kind], runs, hits, errors, bad, cpu_s() - t0);
        CHECKF(hits >= runs * 9 / 10, "%s: only %d of %d faults came", kind_name[kind], hits, runs);
        if (kind == SP_FAULT_EIO) CHECKF(errors >= runs / 4, "eio: only %d of %d runs failed", errors, runs);
    }
    printf("  %llu reads in a run of %d passes\n", (unsigned long long)n_reads, N_PASSES);
    sp_session_free(s);
    sp_model_free(m);
}

static void test_model(const char *rel, uint64_t unit_bytes, bool all) {
    const char *fix = need_fixture(rel);
    if (!fix) return;
    char path[8192], dir[4096];
    if (!ram_copy(fix, path, sizeof path, dir, sizeof dir)) return;
    struct ref r = {0};
    tight.unit_bytes = unit_bytes;
    if (make_ref(path, &r)) {
        /* the budget: the session plus WEIGHT_BUDGET */
        struct sp_session_params sp = session_params();
        struct sp_plan_info pi;
        sp_status rc;
        struct sp_model *m = load(path, (uint64_t)1 << 40, &rc);
        if (rc == SP_OK) rc = sp_model_plan(m, &sp, &pi);
        CHECKF(rc == SP_OK, "plan: %s", sp_last_error());
        sp_model_free(m);
        if (rc == SP_OK) {
            printf("%s, %.0f KiB of weights under a budget of the session + %.0f KiB, %.0f KiB units:\n", rel,
                   (double)(pi.class_bytes[0] + pi.class_bytes[1] + pi.class_bytes[2] + pi.class_bytes[3]) / 1024.0,
                   WEIGHT_BUDGET / 1024.0, unit_bytes / 1024.0);
            load_faults(&r, pi.session_bytes + WEIGHT_BUDGET);
            stream_faults(&r, pi.session_bytes + WEIGHT_BUDGET, all);
        }
    }
    free(r.logits);
    unlink(path);
    rmdir(dir);
}

int main(int argc, char **argv) {
    const bool all = argc > 1 && strcmp(argv[1], "--all") == 0;
    sp_init();
    sp_log_set(quiet, NULL); /* the refused reads are expected; their messages are checked */
    const double t0 = cpu_s();
    test_retry_policy();
    /* units that give each a few hundred reads a run: fewer reads per run
     * would leave no "later" reads, more would only cost time */
    test_model("models/stories260K-moe/stories260K-moe-q8_0.gguf", 16384, all);
    test_model("models/tiny-qwen/tiny-qwen3moe-q8_0.gguf", 4096, all);
    printf("%.1f s CPU in all\n", cpu_s() - t0);
    return test_report("test_iofault");
}
