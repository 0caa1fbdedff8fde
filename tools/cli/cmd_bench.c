/*
 * cmd_bench.c -- `sparrow bench`: load time, TTFT, prefill/decode speed, peak memory, bytes read.
 */
#include "cmds.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- bench ------------------------------------------------------------------------ */

#define DEF_BENCH_PROMPT 128
#define DEF_BENCH_GEN 32
#define DEF_BENCH_REPS 3

void help_bench(FILE *f) {
    fprintf(f,
            "usage: sparrow bench -m MODEL [OPTIONS]\n"
            "\n"
            "Measure the model as llama-bench does, in Sparrow's own terms.  Each\n"
            "repetition loads the model afresh, fills the context with D token ids\n"
            "(untimed; BOS then fixed pseudo-random ids, not text), decodes a prompt of P\n"
            "more as one batch, samples greedily, then goes back to depth D and decodes N\n"
            "tokens one at a time (llama-bench's pp and tg tests at -d D).  Per repetition\n"
            "it reports:\n"
            "  load_s               sp_model_load + sp_session_init\n"
            "  ttft_s               prompt decode + the first sample (time to first token)\n"
            "  prefill_tps          P / prompt decode time\n"
            "  decode_tps, decode_ms_per_token   over the N one-token decodes\n"
            "  peak_rss_bytes       VmHWM (/proc/self/status), reset before each repetition\n"
            "  bytes_read, rchar    storage bytes read (read_bytes of /proc/self/io) and\n"
            "                       bytes through read calls (rchar), over the repetition\n"
            "  bytes_read_per_token storage bytes read during the N decodes / N\n"
            "  model_bytes_per_token  weight bytes a decoded token touches (tensor sizes)\n"
            "  kv_bytes_per_token   KV cache bytes a decode reads, averaged over the N\n"
            "--json adds first_token_from_start_s at the top level: from the process's start\n"
            "(its start time in /proc/self/stat) to the first sampled token of the first\n"
            "repetition -- exec, the load, the session, the prompt, with --cold the eviction\n"
            "A page-cache-warm file reads ~0 bytes from storage; --cold drops the file's\n"
            "pages from the cache before each repetition.  The summary is the median.  The\n"
            "table starts once the first repetition has finished (a failure prints none).\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file; required\n"
            "  -d, --n-depth D         tokens in the context before the tests (default: 0)\n"
            "  -p, --n-prompt P        prompt tokens, 1..%d (default: %d)\n"
            "  -n, --n-gen N           generated tokens, 0..%d (default: %d)\n"
            "  -r, --reps R            repetitions, 1..1000 (default: %d)\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "  -c, --ctx-size N        context length, 0 = D + max(P, N + 1) (default: 0)\n"
            "  -b, --batch N           tokens per forward pass, 1..%d; 0 = the library's\n"
            "                          default (128)\n"
            CLI_HELP_CACHE_TYPES
            "      --weights MODE      how resident weights are held: auto, mmap (pointers\n"
            "                          into the file mapping) or load (read into anonymous,\n"
            "                          huge-page memory) (default: auto: mmap for a file\n"
            "                          'sparrow convert' wrote, load for others)\n"
            "      --mem-budget SIZE   keep at most SIZE resident (binary units: 7.5G); adds\n"
            "                          mem_budget_bytes to the JSON.  expert_hit_rate (MoE:\n"
            "                          expert slices found cached) and prefetch_accuracy\n"
            "                          (prefetched units used before eviction) are measured\n"
            "                          over the decodes; null where they do not apply;\n"
            "                          io_wait_s_per_token: time a decode waited for reads\n"
            "      --expert-cache P    with --mem-budget, how the cache of streamed MoE\n"
            "                          experts chooses what to give up: next-use (evict the\n"
            "                          slice needed furthest ahead, learned from the\n"
            "                          routing) or lru (default: next-use); adds\n"
            "                          expert_cache to the JSON\n"
            CLI_HELP_TOKENIZER
            CLI_HELP_GOVERNOR
            "                          (one governor across the repetitions; --json adds\n"
            "                          its counters as \"governor\", null without it)\n"
            "      --cold              evict the model file from the page cache before each\n"
            "                          repetition (posix_fadvise DONTNEED)\n"
            "      --json              print one JSON object on stdout instead of the table:\n"
            "                          the medians at top level, and a \"runs\" array\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error, 2 usage error.\n",
            MAX_BATCH, DEF_BENCH_PROMPT, MAX_BATCH, DEF_BENCH_GEN, DEF_BENCH_REPS, MAX_THREADS, default_threads(),
            MAX_BATCH);
}

static const char *weights_name(enum sp_weight_mode w) {
    return w == SP_WEIGHTS_MMAP ? "mmap" : w == SP_WEIGHTS_LOAD ? "load" : "auto";
}

struct bench_run {
    double load_s, ttft_s, prefill_tps, decode_tps, decode_ms_per_token;
    double peak_rss_bytes, bytes_read, rchar, bytes_read_per_token;
    double expert_hit_rate, prefetch_accuracy; /* over the decodes; NaN (null) when not applicable */
    double io_wait_s_per_token; /* time the decodes waited for weight reads / N (0 without a budget) */
    double kv_bytes_per_token; /* KV cache bytes a decode reads, on average over the decodes */
};

/* The fields a repetition reports, in output order (a table keeps the JSON
 * and the medians in step). */
static const struct {
    const char *key;
    size_t off;
    int integer;
} bench_fields[] = {
    {"load_s", offsetof(struct bench_run, load_s), 0},
    {"ttft_s", offsetof(struct bench_run, ttft_s), 0},
    {"prefill_tps", offsetof(struct bench_run, prefill_tps), 0},
    {"decode_tps", offsetof(struct bench_run, decode_tps), 0},
    {"decode_ms_per_token", offsetof(struct bench_run, decode_ms_per_token), 0},
    {"peak_rss_bytes", offsetof(struct bench_run, peak_rss_bytes), 1},
    {"bytes_read", offsetof(struct bench_run, bytes_read), 1},
    {"rchar", offsetof(struct bench_run, rchar), 1},
    {"bytes_read_per_token", offsetof(struct bench_run, bytes_read_per_token), 1},
    {"expert_hit_rate", offsetof(struct bench_run, expert_hit_rate), 0},
    {"prefetch_accuracy", offsetof(struct bench_run, prefetch_accuracy), 0},
    {"io_wait_s_per_token", offsetof(struct bench_run, io_wait_s_per_token), 0},
    {"kv_bytes_per_token", offsetof(struct bench_run, kv_bytes_per_token), 1},
};

static double *bench_field(struct bench_run *r, size_t i) {
    return (double *)((char *)r + bench_fields[i].off);
}

/* read_bytes and rchar of this process, or -1 when /proc/self/io is absent. */
static void proc_io(double *read_bytes, double *rchar) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    *read_bytes = *rchar = -1;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (sscanf(line, "rchar: %llu", &v) == 1) *rchar = (double)v;
        else if (sscanf(line, "read_bytes: %llu", &v) == 1) *read_bytes = (double)v;
    }
    fclose(f);
}

/* VmHWM in bytes, or -1. */
static double proc_hwm(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    double v = -1;
    if (!f) return v;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) v = (double)kb * 1024.0;
    }
    fclose(f);
    return v;
}

/* Reset VmHWM to the current RSS (Linux >= 4.0); 0 on success. */
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int bad = fputs("5", f) < 0;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

static int evict_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc == 0 ? 0 : -1;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Seconds since this process started: now (CLOCK_BOOTTIME) less its start
 * time in /proc/self/stat (field 22, clock ticks since boot: 10 ms steps);
 * so exec, the dynamic loader and everything before main count.  Where that
 * is unreadable, since main_t0 (cmd_bench's entry). */
static double main_t0;

static double process_age_s(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long start = 0;
    int field = 2;
    for (; p && *p && field < 22; p++)
        if (*p == ' ') field++;
    struct timespec ts;
    const long tck = sysconf(_SC_CLK_TCK);
    if (p && field == 22 && sscanf(p, "%llu", &start) == 1 && tck > 0 && clock_gettime(CLOCK_BOOTTIME, &ts) == 0) {
        const double age = (double)ts.tv_sec + ts.tv_nsec * 1e-9 - (double)start / (double)tck;
        if (age >= 0) return age;
    }
    return now_s() - main_t0;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}



static void json_fields(struct bench_run *r) {
    for (size_t i = 0; i < sizeof bench_fields / sizeof bench_fields[0]; i++) {
        printf("%s\"%s\": ", i ? ", " : "", bench_fields[i].key);
        json_number(*bench_field(r, i), bench_fields[i].integer);
    }
}

static enum sp_expert_cache expert_cache = SP_EXPERT_CACHE_AUTO; /* --expert-cache */

/* One repetition: load, prompt, n_gen decodes; fills r.  Returns an exit
 * code (EXIT_OK or EXIT_RUNTIME, message printed). */
static int bench_once(const char *path, const char *tokenizer, enum sp_weight_mode weights, uint64_t mem_budget,
                      struct sp_session_params sp, int n_depth, int n_prompt, int n_gen, struct bench_run *r,
                      struct sp_model_info *info, struct sp_governor *gov, double *first_token_s) {
    struct sp_model *model = NULL;
    struct sp_session *sess = NULL;
    int32_t *toks = NULL;
    int ret = EXIT_RUNTIME;
    sp_status rc;
    double io0, io1, io2, rc0, rc1, rc2;

    memset(r, 0, sizeof *r);
    reset_hwm();
    proc_io(&io0, &rc0);
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.weights = weights;
    mp.mem_budget = mem_budget;
    mp.expert_cache = expert_cache;
    envelope_from(&mp, &sp);
    struct sp_mem_stats ms1, ms2;
    const double t0 = now_s();
    rc = sp_model_load(path, &mp, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    rc = sp_session_init(model, &sp, &sess);
    if (rc != SP_OK) {
        ret = lib_error("creating the session", rc);
        goto done;
    }
    if (gov && (rc = sp_session_set_governor(sess, gov)) != SP_OK) {
        ret = lib_error("attaching the governor", rc);
        goto done;
    }
    r->load_s = now_s() - t0;
    if ((rc = sp_model_get_info(model, info)) != SP_OK) {
        ret = lib_error("reading the model info", rc);
        goto done;
    }

    /* BOS, then ids from a fixed LCG over the whole vocabulary: the same
     * depth and prompt in every repetition and every run. */
    const int n_all = n_depth + n_prompt;
    toks = malloc((size_t)n_all * sizeof *toks);
    if (!toks) {
        fprintf(stderr, "sparrow: bench: out of memory\n");
        goto done;
    }
    uint32_t x = 12345u;
    for (int i = 0; i < n_all; i++) {
        x = x * 1664525u + 1013904223u;
        toks[i] = (int32_t)((x >> 8) % (uint32_t)info->n_vocab);
    }
    if (info->bos >= 0) toks[0] = info->bos;
    /* the depth: context already held when the prompt comes (untimed) */
    if (n_depth > 0 && (rc = sp_decode(sess, toks, n_depth)) != SP_OK) {
        ret = lib_error("filling the context to the depth", rc);
        goto done;
    }

    int32_t tok;
    const double tp0 = now_s();
    if ((rc = sp_decode(sess, toks + n_depth, n_prompt)) != SP_OK) {
        ret = lib_error("decoding the prompt", rc);
        goto done;
    }
    const double tp1 = now_s();
    if ((rc = sp_sample(sess, &tok)) != SP_OK) {
        ret = lib_error("sampling", rc);
        goto done;
    }
    const double tp2 = now_s();
    if (first_token_s) *first_token_s = process_age_s();
    r->ttft_s = tp2 - tp0;
    r->prefill_tps = n_prompt / (tp1 - tp0);
    /* the decodes run at the depth, as llama-bench's tg tests do: the prompt
     * is dropped again and the first prompt token follows the depth */
    struct sp_kv_info ki;
    if ((rc = sp_session_kv_info(sess, &ki)) != SP_OK || (rc = sp_session_truncate(sess, n_depth)) != SP_OK) {
        ret = lib_error("going back to the depth", rc);
        goto done;
    }
    const double cell_bytes = ki.n_cells ? (double)ki.bytes_stored / ki.n_cells : 0.0;
    r->kv_bytes_per_token = n_gen > 0 ? cell_bytes * (n_depth + (n_gen + 1) / 2.0) : NAN;
    tok = toks[n_depth];
    proc_io(&io1, &rc1);
    (void)sp_model_get_mem_stats(model, &ms1);

    double t_dec = 0;
    for (int i = 0; i < n_gen; i++) {
        const double td = now_s();
        if ((rc = sp_decode(sess, &tok, 1)) != SP_OK) {
            ret = lib_error("decoding", rc);
            goto done;
        }
        if ((rc = sp_sample(sess, &tok)) != SP_OK) {
            ret = lib_error("sampling", rc);
            goto done;
        }
        t_dec += now_s() - td;
    }
    r->decode_tps = n_gen > 0 ? n_gen / t_dec : NAN;
    r->decode_ms_per_token = n_gen > 0 ? t_dec * 1000.0 / n_gen : NAN;
    proc_io(&io2, &rc2);
    (void)sp_model_get_mem_stats(model, &ms2);
    const uint64_t e_pins = ms2.expert_pins - ms1.expert_pins, pf = ms2.prefetch_issued - ms1.prefetch_issued;
    r->expert_hit_rate = info->n_experts > 0 && e_pins ? (double)(ms2.expert_hits - ms1.expert_hits) / e_pins
                         : info->n_experts > 0 && n_gen > 0 ? 1.0
                                                            : NAN;
    r->prefetch_accuracy = pf ? (double)(ms2.prefetch_used - ms1.prefetch_used) / pf : NAN;
    r->io_wait_s_per_token = n_gen > 0 ? (ms2.wait_s - ms1.wait_s) / n_gen : NAN;
    r->peak_rss_bytes = proc_hwm();
    r->bytes_read = io0 >= 0 && io2 >= 0 ? io2 - io0 : NAN;
    r->rchar = rc0 >= 0 && rc2 >= 0 ? rc2 - rc0 : NAN;
    r->bytes_read_per_token = n_gen > 0 && io1 >= 0 && io2 >= 0 ? (io2 - io1) / n_gen : NAN;
    ret = EXIT_OK;
done:
    free(toks);
    sp_session_free(sess);
    sp_model_free(model);
    return ret;
}

int cmd_bench(int argc, char **argv) {
    main_t0 = now_s();
    struct argp a = {.cmd = "bench", .argc = argc, .argv = argv};
    const char *model_path = NULL, *tokenizer = NULL;
    long long n_prompt = DEF_BENCH_PROMPT, n_gen = DEF_BENCH_GEN, reps = DEF_BENCH_REPS, n_depth = 0;
    bool json = false, cold = false;
    uint64_t mem_budget = 0;
    enum sp_weight_mode weights = SP_WEIGHTS_AUTO;
    struct gov_opts go = {0};
    struct sp_governor *gov = NULL;
    struct sp_session_params sp = sp_session_default_params();
    sp.n_threads = default_threads();
    sp.sampling.temp = 0.0f; /* greedy */
    sp.sampling.repeat_penalty = 1.0f;

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-h", "--help")) {
            help_bench(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, "-d", "--n-depth")) {
            n_depth = parse_int(&a, opt_value(&a), 0, 1 << 24);
        } else if (opt_is(&a, "-p", "--n-prompt")) {
            n_prompt = parse_int(&a, opt_value(&a), 1, MAX_BATCH);
        } else if (opt_is(&a, "-n", "--n-gen")) {
            n_gen = parse_int(&a, opt_value(&a), 0, MAX_BATCH);
        } else if (opt_is(&a, "-r", "--reps")) {
            reps = parse_int(&a, opt_value(&a), 1, 1000);
        } else if (session_opt(&a, &sp)) {
            /* -t, -c, -b, -ctk, -ctv, --kv-type */
        } else if (opt_is(&a, NULL, "--weights")) {
            const char *v = opt_value(&a);
            if (strcmp(v, "auto") == 0) weights = SP_WEIGHTS_AUTO;
            else if (strcmp(v, "mmap") == 0) weights = SP_WEIGHTS_MMAP;
            else if (strcmp(v, "load") == 0) weights = SP_WEIGHTS_LOAD;
            else usage_error(a.cmd, "%s: expected auto, mmap or load, got '%s'", a.name, v);
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            mem_budget = parse_size(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--expert-cache")) {
            const char *v = opt_value(&a);
            if (strcmp(v, "next-use") == 0) expert_cache = SP_EXPERT_CACHE_NEXT_USE;
            else if (strcmp(v, "lru") == 0) expert_cache = SP_EXPERT_CACHE_LRU;
            else usage_error(a.cmd, "%s: expected next-use or lru, got '%s'", a.name, v);
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else if (opt_is(&a, NULL, "--cold")) {
            opt_no_value(&a);
            cold = true;
        } else if (opt_is(&a, NULL, "--json")) {
            opt_no_value(&a);
            json = true;
        } else if (gov_opt(&a, &go)) {
            /* --governor and its options */
        } else {
            last_opt(&a, "the model goes after -m");
        }
    }
    gov_opts_check(a.cmd, &go);
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow bench --help')");
    const long long need = n_depth + (n_prompt > n_gen + 1 ? n_prompt : n_gen + 1);
    if (sp.n_ctx == 0) sp.n_ctx = (int32_t)need;
    if (need > sp.n_ctx) {
        usage_error(a.cmd, "-c %d is smaller than D + max(P, N + 1) = %lld tokens", (int)sp.n_ctx, need);
    }

    sp_log_set(cli_log, &log_verbose);
    struct bench_run *runs = calloc((size_t)reps, sizeof *runs);
    double *col = calloc((size_t)reps, sizeof *col);
    struct sp_model_info info;
    int ret = EXIT_RUNTIME;
    double first_token = NAN; /* process start to the first repetition's first sampled token */
    if (!runs || !col) {
        fprintf(stderr, "sparrow: bench: out of memory\n");
        goto done;
    }
    if ((ret = gov_create(&go, &gov)) != EXIT_OK) goto done;
    ret = EXIT_RUNTIME;
    for (long long i = 0; i < reps; i++) {
        if (cold && evict_file(model_path) != 0 && i == 0) {
            fprintf(stderr, "sparrow: bench: warning: cannot evict '%s' from the page cache\n", model_path);
        }
        if ((ret = bench_once(model_path, tokenizer, weights, mem_budget, sp, (int)n_depth, (int)n_prompt, (int)n_gen,
                              &runs[i], &info, gov, i == 0 ? &first_token : NULL)) != EXIT_OK) {
            goto done;
        }
        if (!json && i == 0) { /* the header once a repetition worked: a failure prints no table */
            char batch[16];
            snprintf(batch, sizeof batch, sp.n_batch ? "%d" : "default", (int)sp.n_batch);
            char budget[32] = "";
            if (mem_budget) snprintf(budget, sizeof budget, ", budget %.2f GiB", mem_budget / 1073741824.0);
            char depth[32] = "";
            if (n_depth) snprintf(depth, sizeof depth, "depth %lld, ", n_depth);
            printf("model %s: threads %d, %sprompt %lld, gen %lld, ctx %d, batch %s, weights %s%s%s\n", model_path,
                   (int)sp.n_threads, depth, n_prompt, n_gen, (int)sp.n_ctx, batch, weights_name(weights), budget,
                   cold ? ", cold page cache" : "");
            printf("%4s %8s %8s %11s %10s %9s %12s %12s %12s\n", "rep", "load s", "ttft s", "prefill t/s",
                   "decode t/s", "ms/token", "peak RSS MiB", "read MiB", "read/token");
        }
        if (!json) {
            const struct bench_run *r = &runs[i];
            printf("%4lld %8.3f %8.3f %11.2f %10.2f %9.1f %12.1f %12.1f %12.0f\n", i + 1, r->load_s, r->ttft_s,
                   r->prefill_tps, r->decode_tps, r->decode_ms_per_token, r->peak_rss_bytes / 1048576.0,
                   r->bytes_read / 1048576.0, r->bytes_read_per_token);
            fflush(stdout);
        }
    }
    struct bench_run med;
    for (size_t k = 0; k < sizeof bench_fields / sizeof bench_fields[0]; k++) {
        for (long long i = 0; i < reps; i++) col[i] = *bench_field(&runs[i], k);
        *bench_field(&med, k) = median_of(col, (int)reps);
    }
    if (json) {
        printf("{\"model\": ");
        json_string(model_path);
        printf(", \"engine\": \"sparrow\", \"version\": \"%s\", \"threads\": %d, \"n_depth\": %lld, \"n_prompt\": %lld, \"n_gen\": %lld, "
               "\"n_ctx\": %d, \"n_batch\": %d, \"reps\": %lld, \"cold\": %s, \"kv_type\": \"%s\", "
               "\"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", "
               "\"weights\": \"%s\", ",
               SPARROW_VERSION, (int)sp.n_threads, n_depth, n_prompt, n_gen, (int)sp.n_ctx, (int)sp.n_batch, reps,
               cold ? "true" : "false", sp.kv_type_k == sp.kv_type_v ? kv_type_name(sp.kv_type_k) : "mixed",
               kv_type_name(sp.kv_type_k), kv_type_name(sp.kv_type_v), weights_name(weights));
        printf("\"mem_budget_bytes\": ");
        json_number(mem_budget ? (double)mem_budget : NAN, 1);
        printf(", \"expert_cache\": \"%s\"", expert_cache == SP_EXPERT_CACHE_LRU ? "lru" : "next-use");
        printf(", \"n_experts\": %d, \"n_experts_used\": %d, ", (int)info.n_experts, (int)info.n_experts_used);
        printf("\"model_file_size\": %" PRIu64 ", \"model_tensor_bytes\": %" PRIu64
               ", \"model_bytes_per_token\": %" PRIu64 ", \"model_params\": %" PRIu64 ", ",
               info.file_size, info.tensor_bytes, info.bytes_per_token, info.n_params);
        json_fields(&med);
        printf(", \"first_token_from_start_s\": ");
        json_number(first_token, 0);
        gov_json(gov);
        printf(", \"runs\": [");
        for (long long i = 0; i < reps; i++) {
            printf("%s{", i ? ", " : "");
            json_fields(&runs[i]);
            putchar('}');
        }
        printf("]}\n");
    } else {
        const struct bench_run *r = &med;
        printf("%4s %8.3f %8.3f %11.2f %10.2f %9.1f %12.1f %12.1f %12.0f\n", "med", r->load_s, r->ttft_s,
               r->prefill_tps, r->decode_tps, r->decode_ms_per_token, r->peak_rss_bytes / 1048576.0,
               r->bytes_read / 1048576.0, r->bytes_read_per_token);
        printf("model: %.2f GiB of tensors, %.1f MiB touched per decoded token\n",
               (double)info.tensor_bytes / 1073741824.0, (double)info.bytes_per_token / 1048576.0);
        if (gov) gov_report(gov);
        if (isfinite(r->expert_hit_rate) || isfinite(r->prefetch_accuracy)) {
            printf("experts: hit rate %.3f, prefetch accuracy %.3f; waited for reads %.3f s per token (medians over "
                   "the decodes)\n", r->expert_hit_rate, r->prefetch_accuracy, r->io_wait_s_per_token);
        }
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: bench: cannot write to stdout: %s\n", strerror(errno));
        ret = EXIT_RUNTIME;
        goto done;
    }
    ret = EXIT_OK;
done:
    free(runs);
    free(col);
    sp_governor_free(gov);
    return ret;
}

