/*
 * cli.c -- what every command of the `sparrow` tool (and the server) shares:
 * errors and exit codes, the library's log callback, strict option parsing,
 * reading files, tokenizing into growable arrays, human-readable sizes and
 * JSON output helpers.  Includes only "sparrow.h" and the C/POSIX library.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    return (int)n;
}

const char *kv_type_name(enum sp_kv_type t) {
    const char *n = sp_kv_type_name(t);
    return n ? n : "?";
}

int list_cache_types(void) {
    for (int t = 0; t < SP_KV_TYPE_COUNT; t++) printf("%s %g\n", sp_kv_type_name((enum sp_kv_type)t), sp_kv_type_bits((enum sp_kv_type)t));
    return fflush(stdout) == 0 ? EXIT_OK : EXIT_RUNTIME;
}

enum sp_kv_type parse_cache_type(struct argp *a, const char *v) {
    enum sp_kv_type t;
    if (sp_kv_type_from_name(v, &t) != SP_OK)
        usage_error(a->cmd, "%s: unknown cache type '%s' (f32, f16, q8_0, q4_0, q4h; see --list-cache-types)", a->name,
                    v);
    return t;
}

/* ---- errors ----------------------------------------------------------------- */

void usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fputs("sparrow: ", stderr);
    if (cmd) fprintf(stderr, "%s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_USAGE);
}

/* One line for a failed library call: its message (which names the file,
 * tensor or key), or the status name if the library left none. */
int lib_error(const char *what, sp_status st) {
    const char *msg = sp_last_error();
    if (msg && *msg) {
        fprintf(stderr, "sparrow: %s\n", msg);
    } else {
        fprintf(stderr, "sparrow: %s: %s\n", what, sp_status_str(st));
    }
    return EXIT_RUNTIME;
}

/* Library log messages.  Failures come back as a status plus sp_last_error(),
 * which the CLI prints once; so by default only warnings are shown, and with
 * -v everything. */
void cli_log(enum sp_log_level level, const char *msg, void *user) {
    const int verbose = *(const int *)user;
    if (verbose) {
        static const char *const names[] = {"error", "warning", "info", "debug"};
        fprintf(stderr, "sparrow: [%s] %s\n", (unsigned)level < 4 ? names[level] : "log", msg);
    } else if (level == SP_LOG_WARN) {
        fprintf(stderr, "sparrow: warning: %s\n", msg);
    }
}
int log_verbose;

/* ---- option parsing -----------------------------------------------------------
 * Options are "-x VALUE", "--long VALUE" or "--long=VALUE"; "--" ends them.
 * Values are parsed strictly: the whole string must be a number in range. */


/* Does argv[i] name this option?  Sets name/inl. */
int opt_is(struct argp *a, const char *short_name, const char *long_name) {
    const char *arg = a->argv[a->i];
    if (short_name && strcmp(arg, short_name) == 0) {
        snprintf(a->name, sizeof a->name, "%s", arg);
        a->inl = NULL;
        return 1;
    }
    if (!long_name) return 0;
    size_t n = strlen(long_name);
    if (strncmp(arg, long_name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) {
        snprintf(a->name, sizeof a->name, "%s", long_name);
        a->inl = arg[n] == '=' ? arg + n + 1 : NULL;
        return 1;
    }
    return 0;
}

/* For an option without a value: reject "--flag=VALUE". */
void opt_no_value(struct argp *a) {
    if (a->inl) usage_error(a->cmd, "%s: takes no value, got '%s'", a->name, a->inl);
}

const char *opt_value(struct argp *a) {
    if (a->inl) return a->inl;
    if (a->i + 1 >= a->argc) usage_error(a->cmd, "%s: missing value", a->name);
    return a->argv[++a->i];
}

long long parse_int(struct argp *a, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r'))
        usage_error(a->cmd, "%s: expected an integer, got '%s'", a->name, s);
    if (errno == ERANGE || v < lo || v > hi)
        usage_error(a->cmd, "%s: expected an integer in [%lld, %lld], got '%s'", a->name, lo, hi, s);
    return v;
}

uint64_t parse_u64(struct argp *a, const char *s) {
    char *end;
    errno = 0;
    if (!(s[0] >= '0' && s[0] <= '9')) usage_error(a->cmd, "%s: expected an unsigned integer, got '%s'", a->name, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0') usage_error(a->cmd, "%s: expected an unsigned integer, got '%s'", a->name, s);
    if (errno == ERANGE) usage_error(a->cmd, "%s: expected an integer in [0, 2^64-1], got '%s'", a->name, s);
    return (uint64_t)v;
}

/* A memory size: a number with an optional binary unit -- K, M, G, T (also
 * KiB, MiB, GiB, TiB; case-insensitive): "7.5G" = 7.5 GiB, "512M", or plain
 * bytes.  Must be > 0. */
uint64_t parse_size(struct argp *a, const char *s) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || !(s[0] >= '0' && s[0] <= '9') || errno == ERANGE || !(v >= 0)) {
        usage_error(a->cmd, "%s: expected a size such as 7.5G, 512M or 1048576, got '%s'", a->name, s);
    }
    if (v == 0) {
        usage_error(a->cmd, "%s: a size of 0 is no budget: leave the option out to keep every weight resident, or "
                    "give a size such as 7.5G or 512M", a->name);
    }
    double mul = 1;
    const char *u = end;
    switch (*u) {
    case 'k': case 'K': mul = 1024.0; u++; break;
    case 'm': case 'M': mul = 1048576.0; u++; break;
    case 'g': case 'G': mul = 1073741824.0; u++; break;
    case 't': case 'T': mul = 1099511627776.0; u++; break;
    default: break;
    }
    if (mul > 1 && (u[0] == 'i' || u[0] == 'I') && (u[1] == 'b' || u[1] == 'B')) u += 2;
    else if (mul > 1 && (u[0] == 'b' || u[0] == 'B')) u++;
    if (*u != '\0') usage_error(a->cmd, "%s: unknown unit in '%s' (use K, M, G or T: binary units)", a->name, s);
    /* a number without a unit is bytes: a fraction of a byte, or a budget
     * no model runs in, is a forgotten unit */
    if (mul == 1 && v != (double)(uint64_t)v) {
        usage_error(a->cmd, "%s: '%s' has no unit, and a number of bytes is whole: did you mean %sG or %sM?", a->name,
                    s, s, s);
    }
    if (mul == 1 && v < 1048576.0) {
        usage_error(a->cmd, "%s: '%s' without a unit is %s bytes, too few to run any model: did you mean %sM or %sG?",
                    a->name, s, s, s, s);
    }
    const double bytes = v * mul;
    if (bytes < 1 || bytes > 1.8e19) usage_error(a->cmd, "%s: size out of range: '%s'", a->name, s);
    return (uint64_t)bytes;
}

/* A finite number in [lo, hi], or in (lo, hi] when lo_open. */
double parse_num(struct argp *a, const char *s, double lo, double hi, int lo_open) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || !isfinite(v))
        usage_error(a->cmd, "%s: expected a number, got '%s'", a->name, s);
    if (errno == ERANGE || (lo_open ? v <= lo : v < lo) || v > hi) {
        if (hi >= 1e30)
            usage_error(a->cmd, "%s: expected a number %s %g, got '%s'", a->name, lo_open ? ">" : ">=", lo, s);
        usage_error(a->cmd, "%s: expected a number in %c%g, %g], got '%s'", a->name, lo_open ? '(' : '[', lo, hi, s);
    }
    return v;
}

void unknown_option(struct argp *a) {
    usage_error(a->cmd, "unknown option '%s' (see 'sparrow %s --help')", a->argv[a->i], a->cmd);
}

int is_option(const char *arg) {
    return arg[0] == '-' && arg[1] != '\0'; /* "-" alone is an argument (stdin) */
}

void in_out_arg(struct argp *a, const char *arg, const char **in, const char **out) {
    if (is_option(arg)) unknown_option(a);
    if (!*in) *in = arg;
    else if (!*out) *out = arg;
    else usage_error(a->cmd, "unexpected argument '%s' (one IN and one OUT)", arg);
}

int quiet_verbose_opt(struct argp *a, int *quiet) {
    if (opt_is(a, "-q", "--quiet")) {
        opt_no_value(a);
        *quiet = 1;
        return 1;
    }
    if (opt_is(a, "-v", "--verbose")) {
        opt_no_value(a);
        log_verbose = 1;
        return 1;
    }
    return 0;
}

volatile sig_atomic_t cli_interrupted;

static void on_interrupt(int sig) {
    (void)sig;
    cli_interrupted = 1;
}

void catch_interrupts(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- small utilities ----------------------------------------------------------- */

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool stdout_is_stderr(void) {
    struct stat o, e;
    return fstat(STDOUT_FILENO, &o) == 0 && fstat(STDERR_FILENO, &e) == 0 && o.st_dev == e.st_dev && o.st_ino == e.st_ino;
}

/* Read a whole file ('-' = stdin) into malloc'd memory; *len = bytes.
 * Returns 0, or -1 with a one-line message printed. */
int read_all(const char *cmd, const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f) {
        fprintf(stderr, "sparrow: %s: cannot open '%s': %s\n", cmd, path, strerror(errno));
        return -1;
    }
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                fprintf(stderr, "sparrow: %s: out of memory reading '%s'\n", cmd, path);
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        fprintf(stderr, "sparrow: %s: cannot read '%s': %s\n", cmd, path, strerror(errno));
        goto fail;
    }
    if (f != stdin) fclose(f);
    if (!buf) buf = malloc(1);
    if (!buf) {
        fprintf(stderr, "sparrow: %s: out of memory reading '%s'\n", cmd, path);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
fail:
    if (f != stdin) fclose(f);
    free(buf);
    return -1;
}

/* Tokenize into a malloc'd array (grown on SP_E_BUFFER). */
sp_status tokenize_all(const struct sp_model *m, const char *text, size_t len, unsigned flags,
                              int32_t **out, int32_t *n_out) {
    int32_t cap = len < ((size_t)1 << 20) ? (int32_t)len + 16 : (1 << 20); /* grown on SP_E_BUFFER */
    int32_t *toks = malloc((size_t)cap * sizeof(*toks));
    int32_t n = 0;
    if (!toks) return SP_E_NOMEM;
    sp_status rc = sp_tokenize(m, text, len, flags, toks, cap, &n);
    if (rc == SP_E_BUFFER && n > cap) {
        int32_t *nt = realloc(toks, (size_t)n * sizeof(*toks));
        if (!nt) {
            free(toks);
            return SP_E_NOMEM;
        }
        toks = nt;
        cap = n;
        rc = sp_tokenize(m, text, len, flags, toks, cap, &n);
    }
    if (rc != SP_OK) {
        free(toks);
        return rc;
    }
    *out = toks;
    *n_out = n;
    return SP_OK;
}

/* A growable byte buffer for token pieces. */


sp_status piece_of(const struct sp_model *m, int32_t tok, struct piece_buf *b, size_t *n) {
    sp_status rc = sp_token_to_piece(m, tok, b->p, b->cap, n);
    if (rc == SP_E_BUFFER) {
        char *np = realloc(b->p, *n + 1);
        if (!np) return SP_E_NOMEM;
        b->p = np;
        b->cap = *n + 1;
        rc = sp_token_to_piece(m, tok, b->p, b->cap, n);
    }
    return rc;
}

void envelope_from(struct sp_model_params *mp, const struct sp_session_params *sp) {
    if (!sp) return;
    mp->n_ctx = sp->n_ctx;
    mp->n_batch = sp->n_batch;
    mp->n_threads = sp->n_threads;
    mp->kv_type_k = sp->kv_type_k;
    mp->kv_type_v = sp->kv_type_v;
}

sp_status load_model(const char *path, const char *tokenizer, bool vocab_only, uint64_t mem_budget,
                     const struct sp_session_params *env, struct sp_model **out) {
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.vocab_only = vocab_only;
    mp.mem_budget = mem_budget;
    envelope_from(&mp, env);
    return sp_model_load(path, &mp, out);
}

/* The session options run and bench share: -t, -c, -b, --kv-type.  Returns
 * 1 when argv[i] was one of them (and stores its value in sp), else 0. */
int session_opt(struct argp *a, struct sp_session_params *sp) {
    if (opt_is(a, "-t", "--threads")) {
        sp->n_threads = (int32_t)parse_int(a, opt_value(a), 1, MAX_THREADS);
    } else if (opt_is(a, "-c", "--ctx-size")) {
        sp->n_ctx = (int32_t)parse_int(a, opt_value(a), 0, INT32_MAX);
    } else if (opt_is(a, "-b", "--batch")) {
        sp->n_batch = (int32_t)parse_int(a, opt_value(a), 0, MAX_BATCH);
    } else if (opt_is(a, "-ctk", "--cache-type-k")) {
        sp->kv_type_k = parse_cache_type(a, opt_value(a));
    } else if (opt_is(a, "-ctv", "--cache-type-v")) {
        sp->kv_type_v = parse_cache_type(a, opt_value(a));
    } else if (opt_is(a, NULL, "--kv-type")) {
        sp->kv_type_k = sp->kv_type_v = parse_cache_type(a, opt_value(a));
    } else {
        return 0;
    }
    return 1;
}

/* ---- the generation options of run and chat ------------------------------------ */

void gen_opts_init(struct gen_opts *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = DEF_N_PREDICT;
    g->sp = sp_session_default_params();
    g->sp.sampling.temp = (float)DEF_TEMP;
    g->sp.sampling.top_k = DEF_TOP_K;
    g->sp.sampling.top_p = (float)DEF_TOP_P;
    g->sp.sampling.min_p = (float)DEF_MIN_P;
    g->sp.sampling.repeat_penalty = (float)DEF_REPEAT_PENALTY;
    g->sp.sampling.repeat_last_n = DEF_REPEAT_LAST_N;
    g->sp.n_ctx = 0;
    g->sp.n_threads = default_threads();
}

int gen_opt(struct argp *a, struct gen_opts *g) {
    struct sp_sampling_params *s = &g->sp.sampling;
    if (opt_is(a, "-n", "--n-predict")) {
        g->n_predict = parse_int(a, opt_value(a), -1, INT32_MAX);
    } else if (opt_is(a, NULL, "--temp")) {
        s->temp = (float)parse_num(a, opt_value(a), 0, 1e38, 0);
    } else if (opt_is(a, NULL, "--top-k")) {
        s->top_k = (int32_t)parse_int(a, opt_value(a), 0, INT32_MAX);
    } else if (opt_is(a, NULL, "--top-p")) {
        s->top_p = (float)parse_num(a, opt_value(a), 0, 1, 1);
    } else if (opt_is(a, NULL, "--min-p")) {
        s->min_p = (float)parse_num(a, opt_value(a), 0, 1, 0);
    } else if (opt_is(a, NULL, "--repeat-penalty")) {
        s->repeat_penalty = (float)parse_num(a, opt_value(a), 0, 1e38, 1);
    } else if (opt_is(a, NULL, "--presence-penalty")) {
        s->presence_penalty = (float)parse_num(a, opt_value(a), -1e38, 1e38, 0);
    } else if (opt_is(a, NULL, "--frequency-penalty")) {
        s->frequency_penalty = (float)parse_num(a, opt_value(a), -1e38, 1e38, 0);
    } else if (opt_is(a, NULL, "--repeat-last-n")) {
        s->repeat_last_n = (int32_t)parse_int(a, opt_value(a), 0, MAX_REPEAT_LAST_N);
    } else if (opt_is(a, NULL, "--seed")) {
        g->sp.seed = parse_u64(a, opt_value(a));
        g->have_seed = true;
    } else if (session_opt(a, &g->sp)) {
        /* -t, -c, -b, -ctk, -ctv, --kv-type */
    } else if (opt_is(a, NULL, "--mem-budget")) {
        g->mem_budget = parse_size(a, opt_value(a));
    } else if (opt_is(a, NULL, "--context-shift")) {
        opt_no_value(a);
        g->sp.ctx_shift = true;
    } else if (opt_is(a, NULL, "--keep")) {
        g->sp.n_keep = (int32_t)parse_int(a, opt_value(a), 0, INT32_MAX);
    } else if (opt_is(a, NULL, "--prompt-cache")) {
        g->prompt_cache = opt_value(a);
    } else if (gov_opt(a, &g->gov)) {
        /* --governor and its options */
    } else {
        return 0;
    }
    return 1;
}

/* ---- the governor's options ------------------------------------------------------ */

int gov_opt(struct argp *a, struct gov_opts *o) {
    bool needs = true;
    if (opt_is(a, NULL, "--governor")) {
        opt_no_value(a);
        o->on = true;
        needs = false;
    } else if (opt_is(a, NULL, "--target-ms")) {
        o->target_ms = parse_num(a, opt_value(a), 0, 1e6, 1);
    } else if (opt_is(a, NULL, "--target-ttft")) {
        o->target_ttft_s = parse_num(a, opt_value(a), 0, 1e4, 1);
    } else if (opt_is(a, NULL, "--thermal-file")) {
        o->thermal_file = opt_value(a);
    } else if (opt_is(a, NULL, "--battery-file")) {
        o->battery_file = opt_value(a);
    } else if (opt_is(a, NULL, "--trace")) {
        o->trace = opt_value(a);
    } else if (opt_is(a, NULL, "--governor-policy")) {
        o->policy = opt_value(a);
    } else {
        return 0;
    }
    if (needs && !o->first_without[0]) snprintf(o->first_without, sizeof o->first_without, "%s", a->name);
    return 1;
}

void gov_opts_check(const char *cmd, const struct gov_opts *o) {
    if (!o->on && o->first_without[0]) usage_error(cmd, "%s needs --governor (the governor is off unless asked for)", o->first_without);
}

int gov_create(const struct gov_opts *o, struct sp_governor **out) {
    *out = NULL;
    if (!o->on) return EXIT_OK;
    struct sp_governor_params gp = sp_governor_default_params();
    gp.target_ms = o->target_ms;
    gp.target_ttft_s = o->target_ttft_s;
    gp.thermal_file = o->thermal_file;
    gp.battery_file = o->battery_file;
    gp.trace_path = o->trace;
    gp.policy_file = o->policy;
    sp_status rc = sp_governor_init(&gp, out);
    return rc == SP_OK ? EXIT_OK : lib_error("starting the governor", rc);
}

void gov_report(const struct sp_governor *g) {
    struct sp_governor_stats st;
    if (!g || sp_governor_get_stats(g, &st) != SP_OK) return;
    fprintf(stderr,
            "sparrow: governor: state %s%s, threads %d, experts %d, pacing %.2f ms | %lld plans, %lld state "
            "changes, paced %.3f s | s normal/warm/hot/critical %.2f/%.2f/%.2f/%.2f, saver %.2f\n",
            sp_gov_state_name(st.state), st.saver ? " + battery saver" : "", (int)st.threads, (int)st.n_expert_used,
            st.pacing_ms, (long long)st.n_plans, (long long)st.n_state_changes, st.paced_s, st.state_s[0],
            st.state_s[1], st.state_s[2], st.state_s[3], st.saver_s);
}

void gov_json(const struct sp_governor *g) {
    struct sp_governor_stats st;
    printf(", \"governor\": ");
    if (!g || sp_governor_get_stats(g, &st) != SP_OK) {
        printf("null");
        return;
    }
    printf("{\"state\": \"%s\", \"saver\": %s", sp_gov_state_name(st.state), st.saver ? "true" : "false");
    json_key_num("tokens", (double)st.n_tokens, 1);
    json_key_num("prefill_tokens", (double)st.n_prefill_tokens, 1);
    json_key_num("plans", (double)st.n_plans, 1);
    json_key_num("state_changes", (double)st.n_state_changes, 1);
    json_key_num("saver_changes", (double)st.n_saver_changes, 1);
    json_key_num("thread_changes", (double)st.n_thread_changes, 1);
    json_key_num("expert_changes", (double)st.n_expert_changes, 1);
    json_key_num("chunk_changes", (double)st.n_chunk_changes, 1);
    json_key_num("paced_s", st.paced_s, 0);
    json_key_num("normal_s", st.state_s[SP_GOV_NORMAL], 0);
    json_key_num("warm_s", st.state_s[SP_GOV_WARM], 0);
    json_key_num("hot_s", st.state_s[SP_GOV_HOT], 0);
    json_key_num("critical_s", st.state_s[SP_GOV_CRITICAL], 0);
    json_key_num("saver_s", st.saver_s, 0);
    json_key_num("max_temp_c", st.max_temp_c, 0);
    json_key_num("threads", st.threads, 1);
    json_key_num("n_expert_used", st.n_expert_used, 1);
    json_key_num("chunk", st.chunk, 1);
    json_key_num("pacing_ms", st.pacing_ms, 0);
    json_key_num("ms_per_token", st.ms_per_token, 0);
    putchar('}');
}

void gen_opts_seed(struct gen_opts *g) {
    if (g->have_seed) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->sp.seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
}

int32_t prompt_cache_reuse(const char *cmd, struct sp_session *s, const char *file, const int32_t *toks, int32_t n,
                           uint64_t seed) {
    int32_t reuse = 0;
    if (!file || access(file, F_OK) != 0) return -1;
    if (sp_session_load(s, file) != SP_OK) {
        fprintf(stderr, "sparrow: %s: warning: prompt cache not used: %s\n", cmd, sp_last_error());
        return -1;
    }
    const int32_t held = sp_session_n_past(s), *ht = sp_session_tokens(s);
    while (reuse < held && reuse < n - 1 && ht[reuse] == toks[reuse]) reuse++;
    sp_session_truncate(s, reuse);
    sp_session_set_seed(s, seed);
    return reuse;
}

void help_gen_opts(FILE *f) {
    fprintf(f,
            "      --temp T            temperature, >= 0; 0 = greedy (default: %g)\n"
            "      --top-k K           keep the K most likely tokens, 0 = off (default: %d)\n"
            "      --top-p P           keep the smallest set with probability >= P, in (0, 1];\n"
            "                          1 = off (default: %g)\n"
            "      --min-p P           drop tokens below P x the most likely one's\n"
            "                          probability, in [0, 1]; 0 = off (default: %g)\n"
            "      --repeat-penalty R  penalise the last N tokens: logit / R if > 0, else\n"
            "                          logit x R; R > 0, 1 = off (default: %g)\n"
            "      --presence-penalty P\n"
            "                          subtract P from the logit of each token among the\n"
            "                          last N (OpenAI's presence_penalty); 0 = off (default: 0)\n"
            "      --frequency-penalty F\n"
            "                          subtract F x its count among the last N from a\n"
            "                          token's logit (OpenAI's frequency_penalty); 0 = off\n"
            "                          (default: 0)\n"
            "      --repeat-last-n N   tokens the penalties look back at, 0..%d\n"
            "                          (default: %d)\n"
            "      --seed S            sampler seed, 0..2^64-1 (default: from the clock,\n"
            "                          printed on stderr)\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "  -c, --ctx-size N        context length in tokens, 0 = the model's trained\n"
            "                          context (default: 0); more is accepted with a warning\n"
            "  -b, --batch N           tokens per forward pass when feeding the prompt,\n"
            "                          1..%d; 0 = the library's default (128)\n"
            CLI_HELP_CACHE_TYPES
            "      --context-shift     when the context is full, drop the oldest tokens after\n"
            "                          the first --keep and go on (default: stop there)\n"
            "      --keep N            tokens at the start a context shift keeps (attention\n"
            "                          sinks), 0..CTX-1 (default: 0)\n"
            CLI_HELP_GOVERNOR,
            DEF_TEMP, DEF_TOP_K, DEF_TOP_P, DEF_MIN_P, DEF_REPEAT_PENALTY, MAX_REPEAT_LAST_N, DEF_REPEAT_LAST_N,
            MAX_THREADS, default_threads(), MAX_BATCH);
}

/* The end of every command's option chain: -v/--verbose, else an unknown
 * option or a stray argument is a usage error; `hint` says where arguments
 * go ("the model goes after -m"). */
void last_opt(struct argp *a, const char *hint) {
    const char *arg = a->argv[a->i];
    if (opt_is(a, "-v", "--verbose")) {
        opt_no_value(a);
        log_verbose = 1;
    } else if (is_option(arg)) {
        unknown_option(a);
    } else {
        usage_error(a->cmd, "unexpected argument '%s' (%s)", arg, hint);
    }
}


/* "1.13 MiB" style, into a static buffer (one use per printf). */
const char *human_bytes(uint64_t n, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%" PRIu64 " B", n);
    else snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

const char *human_count(uint64_t n, char *buf, size_t cap) {
    if (n >= 1000000000ull) snprintf(buf, cap, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000ull) snprintf(buf, cap, "%.2f M", (double)n / 1e6);
    else if (n >= 1000ull) snprintf(buf, cap, "%.1f K", (double)n / 1e3);
    else snprintf(buf, cap, "%" PRIu64, n);
    return buf;
}

void json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

/* A number JSON can hold: integers as integers, others with 6 significant
 * digits; non-finite values (a run too short to time) as null. */
void json_number(double v, int integer) {
    if (!isfinite(v)) printf("null");
    else if (integer) printf("%.0f", v);
    else printf("%.6g", v);
}

void json_key_str(const char *key, const char *v) {
    printf(", \"%s\": ", key);
    if (v) json_string(v);
    else printf("null");
}

void json_key_num(const char *key, double v, int integer) {
    printf(", \"%s\": ", key);
    json_number(v, integer);
}


/* ---- progress bar ------------------------------------------------------------------ */

void progress_init(struct progress *p, int quiet) {
    *p = (struct progress){.t0 = now_s(), .tty = isatty(STDERR_FILENO), .last_decile = -1, .quiet = quiet};
}

void progress_draw(struct progress *p, uint64_t done, uint64_t total) {
    if (p->quiet) return;
    const double t = now_s(), el = t - p->t0;
    const double frac = total ? (double)done / (double)total : 1.0;
    const int decile = (int)(frac * 10.0);
    if (p->tty) {
        if (done != total && t - p->last < 0.2) return;
    } else if (decile == p->last_decile && done != total) {
        return;
    }
    p->last = t;
    p->last_decile = decile;
    const double mb = (double)done / 1e6, rate = el > 0 ? mb / el : 0.0;
    const double eta = rate > 0 ? ((double)(total - done) / 1e6) / rate : 0.0;
    char bar[31];
    const int fill = (int)(frac * 30.0);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "%s[%s] %5.1f%%  %9.1f / %.1f MB  %6.1f MB/s  ETA %4.0f s%s", p->tty ? "\r" : "", bar,
            frac * 100.0, mb, (double)total / 1e6, rate, eta, p->tty ? "  " : "\n");
    p->drawn = 1;
}

void progress_done(struct progress *p) {
    if (p->drawn && p->tty) fputc('\n', stderr);
}
