/*
 * main.c -- the `sparrow` command: run (generate text), tokenize, inspect,
 * bench (speed and memory), synth (random-weight models in real shapes),
 * plan (weight placement under a memory budget), eval (perplexity, KL
 * divergence against a reference), quantize (mixed-precision files,
 * calibrated and pruned).
 * A thin client of the public API in include/sparrow.h: it parses argv,
 * prints, and chooses exit codes; everything else is the library's.  It
 * includes only "sparrow.h" and the C/POSIX library, like lua.c or SQLite's
 * shell.  Exit codes: 0 ok, 1 runtime or library error, 2 usage error.
 * Usage errors and failures are one line on stderr, starting "sparrow: ".
 */
#include "sparrow.h"

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

#define SPARROW_CLI_VERSION SPARROW_VERSION

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* ---- defaults (the help text prints these very values) -------------------- */
#define DEF_N_PREDICT 128
#define DEF_TEMP 0.8
#define DEF_TOP_K 40
#define DEF_TOP_P 0.95
#define DEF_MIN_P 0.05
#define DEF_REPEAT_PENALTY 1.0
#define DEF_REPEAT_LAST_N 64
#define MAX_REPEAT_LAST_N 1048576
#define MAX_THREADS 1024
#define MAX_BATCH 65536

/* ---- help ------------------------------------------------------------------ */

static void help_main(FILE *f) {
    fprintf(f,
            "sparrow %s -- LLM inference for devices whose memory is smaller than the model\n"
            "\n"
            "usage: sparrow COMMAND [OPTIONS]\n"
            "\n"
            "commands:\n"
            "  run        generate text from a prompt\n"
            "  tokenize   print the token ids of a text\n"
            "  inspect    describe a model file: hyper-parameters, tokenizer, metadata, tensors\n"
            "  bench      measure load time, time to first token, prefill and decode speed,\n"
            "             peak memory and bytes read (a table, or JSON)\n"
            "  synth      write a model file with random weights in a real model's shape\n"
            "  plan       show how a model's weights would be placed under a memory budget\n"
            "  eval       measure quality: perplexity on a text, KL divergence and top-1\n"
            "             agreement against a reference model\n"
            "  quantize   write a smaller model: mixed-precision types, calibration, pruning\n"
            "  help [COMMAND]  this text, or a command's options\n"
            "\n"
            "options:\n"
            "  -h, --help     print this help and exit\n"
            "  --version      print the version and exit\n"
            "\n"
            "Run 'sparrow COMMAND --help' for the options of a command.\n"
            "Model files: GGUF (v2/v3) or llama2.c checkpoints (.bin, with a tokenizer.bin).\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error (message on stderr),\n"
            "             2 usage error (bad command, option or value).\n",
            SPARROW_CLI_VERSION);
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    return (int)n;
}

static const char *kv_type_name(enum sp_kv_type t) {
    return t == SP_KV_F16 ? "f16" : t == SP_KV_F32 ? "f32" : "?";
}

static void help_run(FILE *f) {
    struct sp_session_params sp = sp_session_default_params();
    fprintf(f,
            "usage: sparrow run -m MODEL [-p PROMPT | -f FILE] [OPTIONS]\n"
            "\n"
            "Generate a continuation of PROMPT.  stdout receives exactly the bytes of the\n"
            "generated tokens, as they are produced (not the prompt, no added newline);\n"
            "the seed, timings and errors go to stderr.  Generation stops after N tokens,\n"
            "at an end-of-generation token (not printed), or when the context is full\n"
            "(a message on stderr; exit status 0).  The prompt is preceded by BOS when the\n"
            "vocabulary asks for it; an empty prompt is BOS alone.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file (GGUF or llama2.c .bin); required\n"
            "  -p, --prompt TEXT       prompt text (default: empty)\n"
            "  -f, --file FILE         read the prompt from FILE ('-' = stdin); excludes -p\n"
            "  -n, --n-predict N       tokens to generate, -1 = until end of generation or\n"
            "                          a full context (default: %d)\n"
            "      --temp T            temperature, >= 0; 0 = greedy (default: %g)\n"
            "      --top-k K           keep the K most likely tokens, 0 = off (default: %d)\n"
            "      --top-p P           keep the smallest set with probability >= P, in (0, 1];\n"
            "                          1 = off (default: %g)\n"
            "      --min-p P           drop tokens below P x the most likely one's\n"
            "                          probability, in [0, 1]; 0 = off (default: %g)\n"
            "      --repeat-penalty R  penalise the last N tokens: logit / R if > 0, else\n"
            "                          logit x R; R > 0, 1 = off (default: %g)\n"
            "      --repeat-last-n N   tokens the penalty looks back at, 0..%d\n"
            "                          (default: %d)\n"
            "      --seed S            sampler seed, 0..2^64-1 (default: from the clock,\n"
            "                          printed on stderr)\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "  -c, --ctx-size N        context length in tokens, 0 = the model's, capped at\n"
            "                          4096 (default: 0)\n"
            "  -b, --batch N           tokens per forward pass when feeding the prompt,\n"
            "                          1..%d; 0 = the library's default (128)\n"
            "      --kv-type TYPE      KV cache element type: f32 or f16 (default: %s)\n"
            "      --mem-budget SIZE   keep at most SIZE resident (weights, KV cache, scratch);\n"
            "                          binary units: 7.5G = 7.5 GiB, 512M.  What does not fit\n"
            "                          streams from storage (see 'sparrow plan').  Default:\n"
            "                          no budget, every weight resident\n"
            "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"
            "                          beside the model)\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "Sampling order: repetition penalty, then greedy if T = 0, else temperature,\n"
            "top-k, top-p, min-p, and a draw from the seeded RNG.  The same model, prompt,\n"
            "options and seed give the same output.\n"
            "\n"
            "exit status: 0 success (also when the context fills up), 1 runtime or library\n"
            "error (e.g. a missing file, a prompt longer than the context), 2 usage error.\n",
            DEF_N_PREDICT, DEF_TEMP, DEF_TOP_K, DEF_TOP_P, DEF_MIN_P, DEF_REPEAT_PENALTY, MAX_REPEAT_LAST_N,
            DEF_REPEAT_LAST_N, MAX_THREADS, default_threads(), MAX_BATCH, kv_type_name(sp.kv_type));
}

static void help_tokenize(FILE *f) {
    fprintf(f, "usage: sparrow tokenize -m MODEL [OPTIONS] (TEXT | --file FILE)\n"
               "\n"
               "Print the token ids of TEXT (or of FILE's bytes, read as they are) on one line,\n"
               "separated by single spaces and ended by a newline; an empty line if there are\n"
               "none.  BOS is prepended when the vocabulary asks for it; EOS never is.  Special-\n"
               "token text in the input is not parsed as special.  Only the vocabulary is\n"
               "loaded, so vocabulary-only GGUF files work.\n"
               "\n"
               "options:\n"
               "  -m, --model FILE        model or vocabulary file (GGUF or llama2.c .bin); required\n"
               "      --file FILE         tokenize FILE's bytes ('-' = stdin); excludes TEXT\n"
               "      --no-bos            never prepend BOS (default: prepend it when the\n"
               "                          vocabulary asks for it)\n"
               "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"
               "                          beside the model)\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "  --                      end of options: the next argument is TEXT\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static void help_inspect(FILE *f) {
    fprintf(f, "usage: sparrow inspect [OPTIONS] MODEL\n"
               "\n"
               "Describe a model file without reading its weights: file format, architecture,\n"
               "hyper-parameters, tokenizer (kind, pre-tokenizer, vocabulary size, BOS/EOS),\n"
               "every metadata key, and every tensor (name, type, shape, file offset, bytes),\n"
               "then totals: tensor bytes, parameter count and the bytes read per decoded token.\n"
               "\n"
               "options:\n"
               "  -m, --model FILE        the model (instead of the MODEL argument)\n"
               "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"
               "                          beside the model)\n"
               "      --vocab-only        load only the vocabulary (for vocabulary-only GGUF files)\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

/* ---- errors ----------------------------------------------------------------- */

static void usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void usage_error(const char *cmd, const char *fmt, ...) {
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
static int lib_error(const char *what, sp_status st) {
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
static void cli_log(enum sp_log_level level, const char *msg, void *user) {
    const int verbose = *(const int *)user;
    if (verbose) {
        static const char *const names[] = {"error", "warning", "info", "debug"};
        fprintf(stderr, "sparrow: [%s] %s\n", (unsigned)level < 4 ? names[level] : "log", msg);
    } else if (level == SP_LOG_WARN) {
        fprintf(stderr, "sparrow: warning: %s\n", msg);
    }
}
static int log_verbose;

/* ---- option parsing -----------------------------------------------------------
 * Options are "-x VALUE", "--long VALUE" or "--long=VALUE"; "--" ends them.
 * Values are parsed strictly: the whole string must be a number in range. */

struct argp {
    const char *cmd;
    int argc;
    char **argv;
    int i;               /* index of the current argument */
    const char *inl;     /* the VALUE of "--long=VALUE", else NULL */
    char name[64];       /* the option as written, without "=VALUE" */
};

/* Does argv[i] name this option?  Sets name/inl. */
static int opt_is(struct argp *a, const char *short_name, const char *long_name) {
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
static void opt_no_value(struct argp *a) {
    if (a->inl) usage_error(a->cmd, "%s: takes no value, got '%s'", a->name, a->inl);
}

static const char *opt_value(struct argp *a) {
    if (a->inl) return a->inl;
    if (a->i + 1 >= a->argc) usage_error(a->cmd, "%s: missing value", a->name);
    return a->argv[++a->i];
}

static long long parse_int(struct argp *a, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r'))
        usage_error(a->cmd, "%s: expected an integer, got '%s'", a->name, s);
    if (errno == ERANGE || v < lo || v > hi)
        usage_error(a->cmd, "%s: expected an integer in [%lld, %lld], got '%s'", a->name, lo, hi, s);
    return v;
}

static uint64_t parse_u64(struct argp *a, const char *s) {
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
static uint64_t parse_size(struct argp *a, const char *s) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || !(s[0] >= '0' && s[0] <= '9') || errno == ERANGE || !(v > 0)) {
        usage_error(a->cmd, "%s: expected a size such as 7.5G, 512M or 1048576, got '%s'", a->name, s);
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
    const double bytes = v * mul;
    if (bytes < 1 || bytes > 1.8e19) usage_error(a->cmd, "%s: size out of range: '%s'", a->name, s);
    return (uint64_t)bytes;
}

/* A finite number in [lo, hi], or in (lo, hi] when lo_open. */
static double parse_num(struct argp *a, const char *s, double lo, double hi, int lo_open) {
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

static void unknown_option(struct argp *a) {
    usage_error(a->cmd, "unknown option '%s' (see 'sparrow %s --help')", a->argv[a->i], a->cmd);
}

static int is_option(const char *arg) {
    return arg[0] == '-' && arg[1] != '\0'; /* "-" alone is an argument (stdin) */
}

/* ---- small utilities ----------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Read a whole file ('-' = stdin) into malloc'd memory; *len = bytes.
 * Returns 0, or -1 with a one-line message printed. */
static int read_all(const char *cmd, const char *path, char **out, size_t *len) {
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
static sp_status tokenize_all(const struct sp_model *m, const char *text, size_t len, unsigned flags,
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
struct piece_buf {
    char *p;
    size_t cap;
};

static sp_status piece_of(const struct sp_model *m, int32_t tok, struct piece_buf *b, size_t *n) {
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

static sp_status load_model(const char *path, const char *tokenizer, bool vocab_only, uint64_t mem_budget,
                            struct sp_model **out) {
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.vocab_only = vocab_only;
    mp.mem_budget = mem_budget;
    return sp_model_load(path, &mp, out);
}

/* The session options run and bench share: -t, -c, -b, --kv-type.  Returns
 * 1 when argv[i] was one of them (and stores its value in sp), else 0. */
static int session_opt(struct argp *a, struct sp_session_params *sp) {
    if (opt_is(a, "-t", "--threads")) {
        sp->n_threads = (int32_t)parse_int(a, opt_value(a), 1, MAX_THREADS);
    } else if (opt_is(a, "-c", "--ctx-size")) {
        sp->n_ctx = (int32_t)parse_int(a, opt_value(a), 0, INT32_MAX);
    } else if (opt_is(a, "-b", "--batch")) {
        sp->n_batch = (int32_t)parse_int(a, opt_value(a), 0, MAX_BATCH);
    } else if (opt_is(a, NULL, "--kv-type")) {
        const char *v = opt_value(a);
        if (strcmp(v, "f32") == 0) sp->kv_type = SP_KV_F32;
        else if (strcmp(v, "f16") == 0) sp->kv_type = SP_KV_F16;
        else usage_error(a->cmd, "%s: expected f32 or f16, got '%s'", a->name, v);
    } else {
        return 0;
    }
    return 1;
}

/* The end of every command's option chain: -v/--verbose, else an unknown
 * option or a stray argument is a usage error; `hint` says where arguments
 * go ("the model goes after -m"). */
static void last_opt(struct argp *a, const char *hint) {
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

/* ---- run ------------------------------------------------------------------------ */

static int cmd_run(int argc, char **argv) {
    struct argp a = {.cmd = "run", .argc = argc, .argv = argv};
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *tokenizer = NULL;
    long long n_predict = DEF_N_PREDICT;
    struct sp_session_params sp = sp_session_default_params();
    bool have_seed = false;
    sp.sampling.temp = (float)DEF_TEMP;
    sp.sampling.top_k = DEF_TOP_K;
    sp.sampling.top_p = (float)DEF_TOP_P;
    sp.sampling.min_p = (float)DEF_MIN_P;
    sp.sampling.repeat_penalty = (float)DEF_REPEAT_PENALTY;
    sp.sampling.repeat_last_n = DEF_REPEAT_LAST_N;
    sp.n_ctx = 0;
    sp.n_threads = default_threads();
    uint64_t mem_budget = 0;

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_run(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, "-p", "--prompt")) {
            prompt = opt_value(&a);
        } else if (opt_is(&a, "-f", "--file")) {
            prompt_file = opt_value(&a);
        } else if (opt_is(&a, "-n", "--n-predict")) {
            n_predict = parse_int(&a, opt_value(&a), -1, INT32_MAX);
        } else if (opt_is(&a, NULL, "--temp")) {
            sp.sampling.temp = (float)parse_num(&a, opt_value(&a), 0, 1e38, 0);
        } else if (opt_is(&a, NULL, "--top-k")) {
            sp.sampling.top_k = (int32_t)parse_int(&a, opt_value(&a), 0, INT32_MAX);
        } else if (opt_is(&a, NULL, "--top-p")) {
            sp.sampling.top_p = (float)parse_num(&a, opt_value(&a), 0, 1, 1);
        } else if (opt_is(&a, NULL, "--min-p")) {
            sp.sampling.min_p = (float)parse_num(&a, opt_value(&a), 0, 1, 0);
        } else if (opt_is(&a, NULL, "--repeat-penalty")) {
            sp.sampling.repeat_penalty = (float)parse_num(&a, opt_value(&a), 0, 1e38, 1);
        } else if (opt_is(&a, NULL, "--repeat-last-n")) {
            sp.sampling.repeat_last_n = (int32_t)parse_int(&a, opt_value(&a), 0, MAX_REPEAT_LAST_N);
        } else if (opt_is(&a, NULL, "--seed")) {
            sp.seed = parse_u64(&a, opt_value(&a));
            have_seed = true;
        } else if (session_opt(&a, &sp)) {
            /* -t, -c, -b, --kv-type */
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            mem_budget = parse_size(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else {
            last_opt(&a, "the prompt goes after -p");
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow run --help')");
    if (prompt && prompt_file) usage_error(a.cmd, "-p and -f exclude each other");

    int ret = EXIT_RUNTIME;
    sp_status rc;
    struct sp_model *model = NULL;
    struct sp_session *sess = NULL;
    char *file_text = NULL;
    int32_t *toks = NULL, n_toks = 0;
    struct piece_buf pb = {NULL, 0};
    size_t prompt_len = 0;

    if (prompt_file) {
        if (read_all(a.cmd, prompt_file, &file_text, &prompt_len) != 0) goto done;
        prompt = file_text;
    } else if (prompt) {
        prompt_len = strlen(prompt);
    } else {
        prompt = "";
    }
    if (!have_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp.seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    }

    sp_log_set(cli_log, &log_verbose);
    const double t_load0 = now_s();
    rc = load_model(model_path, tokenizer, false, mem_budget, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    rc = sp_session_init(model, &sp, &sess);
    if (rc != SP_OK) {
        ret = lib_error("creating the session", rc);
        goto done;
    }
    const double t_load = now_s() - t_load0;

    rc = tokenize_all(model, prompt, prompt_len, SP_TOKENIZE_ADD_BOS, &toks, &n_toks);
    if (rc != SP_OK) {
        ret = lib_error("tokenizing the prompt", rc);
        goto done;
    }
    const int32_t n_ctx = sp_session_n_ctx(sess);
    if (n_toks == 0) {
        fprintf(stderr, "sparrow: run: the prompt is empty and the vocabulary adds no BOS token: nothing to "
                        "decode\n");
        goto done;
    }
    if (n_toks > n_ctx) {
        fprintf(stderr, "sparrow: run: the prompt is %d tokens, longer than the context of %d tokens (-c)\n",
                (int)n_toks, (int)n_ctx);
        goto done;
    }
    fprintf(stderr, "sparrow: seed %" PRIu64 ", n_ctx %d, threads %d, prompt %d tokens\n", sp.seed, (int)n_ctx,
            (int)sp.n_threads, (int)n_toks);

    const double t_p0 = now_s();
    rc = sp_decode(sess, toks, n_toks);
    if (rc != SP_OK) {
        ret = lib_error("decoding the prompt", rc);
        goto done;
    }
    const double t_prompt = now_s() - t_p0;

    enum { STOP_N, STOP_EOG, STOP_CTX } stop = STOP_N;
    long long n_gen = 0, n_dec = 0;
    double t_dec = 0;
    const double t_g0 = now_s();
    while (n_predict < 0 || n_gen < n_predict) {
        int32_t tok;
        size_t len = 0;
        rc = sp_sample(sess, &tok);
        if (rc != SP_OK) {
            ret = lib_error("sampling", rc);
            goto done;
        }
        if (sp_token_is_eog(model, tok)) {
            stop = STOP_EOG;
            break;
        }
        rc = piece_of(model, tok, &pb, &len);
        if (rc != SP_OK) {
            ret = lib_error("rendering a token", rc);
            goto done;
        }
        if ((len && fwrite(pb.p, 1, len, stdout) != len) || fflush(stdout) != 0) {
            fprintf(stderr, "sparrow: run: cannot write to stdout: %s\n", strerror(errno));
            goto done;
        }
        n_gen++;
        if (n_predict >= 0 && n_gen >= n_predict) break; /* the last token needs no decode */
        const double t0 = now_s();
        rc = sp_decode(sess, &tok, 1);
        t_dec += now_s() - t0;
        if (rc == SP_E_CONTEXT_FULL) {
            stop = STOP_CTX;
            break;
        }
        if (rc != SP_OK) {
            ret = lib_error("decoding", rc);
            goto done;
        }
        n_dec++;
    }
    const double t_gen = now_s() - t_g0;

    if (n_gen > 0 && isatty(STDOUT_FILENO)) fputc('\n', stderr); /* keep the stats off the text's line */
    if (stop == STOP_CTX)
        fprintf(stderr, "sparrow: run: context full (%d tokens); stopped after %lld generated tokens\n",
                (int)n_ctx, n_gen);
    fprintf(stderr,
            "sparrow: load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | decode %lld tokens in %.3f s "
            "(%.1f tok/s) | generated %lld tokens in %.3f s%s\n",
            t_load, (int)n_toks, t_prompt, t_prompt > 0 ? n_toks / t_prompt : 0.0, n_dec, t_dec,
            t_dec > 0 ? n_dec / t_dec : 0.0, n_gen, t_gen, stop == STOP_EOG ? " | stopped at end of generation" : "");
    ret = EXIT_OK;

done:
    free(pb.p);
    free(toks);
    free(file_text);
    sp_session_free(sess);
    sp_model_free(model);
    return ret;
}

/* ---- tokenize --------------------------------------------------------------------- */

static int cmd_tokenize(int argc, char **argv) {
    struct argp a = {.cmd = "tokenize", .argc = argc, .argv = argv};
    const char *model_path = NULL, *text = NULL, *file = NULL, *tokenizer = NULL;
    bool add_bos = true, opts_done = false;

    for (a.i = 1; a.i < argc; a.i++) {
        const char *arg = argv[a.i];
        if (opts_done || !is_option(arg)) {
            if (text) usage_error(a.cmd, "unexpected argument '%s' (quote the text as one argument)", arg);
            text = arg;
        } else if (strcmp(arg, "--") == 0) {
            opts_done = true;
        } else if (opt_is(&a, "-h", "--help")) {
            help_tokenize(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--file")) {
            file = opt_value(&a);
        } else if (opt_is(&a, NULL, "--no-bos")) {
            opt_no_value(&a);
            add_bos = false;
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else if (opt_is(&a, "-v", "--verbose")) {
            opt_no_value(&a);
            log_verbose = 1;
        } else {
            unknown_option(&a);
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow tokenize --help')");
    if (text && file) usage_error(a.cmd, "TEXT and --file exclude each other");
    if (!text && !file) usage_error(a.cmd, "nothing to tokenize: give TEXT or --file FILE");

    int ret = EXIT_RUNTIME;
    struct sp_model *model = NULL;
    char *buf = NULL;
    int32_t *toks = NULL, n = 0;
    size_t len;
    sp_status rc;

    if (file) {
        if (read_all(a.cmd, file, &buf, &len) != 0) goto done;
        text = buf;
    } else {
        len = strlen(text);
    }
    sp_log_set(cli_log, &log_verbose);
    rc = load_model(model_path, tokenizer, true, 0, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the vocabulary", rc);
        goto done;
    }
    rc = tokenize_all(model, text, len, add_bos ? SP_TOKENIZE_ADD_BOS : 0u, &toks, &n);
    if (rc != SP_OK) {
        ret = lib_error("tokenizing", rc);
        goto done;
    }
    for (int32_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)toks[i]);
    putchar('\n');
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: tokenize: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    ret = EXIT_OK;
done:
    free(toks);
    free(buf);
    sp_model_free(model);
    return ret;
}

/* ---- inspect ---------------------------------------------------------------------- */

/* "1.13 MiB" style, into a static buffer (one use per printf). */
static const char *human_bytes(uint64_t n, char *buf, size_t cap) {
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

static const char *human_count(uint64_t n, char *buf, size_t cap) {
    if (n >= 1000000000ull) snprintf(buf, cap, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000ull) snprintf(buf, cap, "%.2f M", (double)n / 1e6);
    else if (n >= 1000ull) snprintf(buf, cap, "%.1f K", (double)n / 1e3);
    else snprintf(buf, cap, "%" PRIu64, n);
    return buf;
}

/* Metadata values may hold newlines or other control bytes (chat templates):
 * print them escaped so that each key stays on one line. */
static void print_escaped(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '\t') fputs("\\t", stdout);
        else if (*p == '\r') fputs("\\r", stdout);
        else if (*p < 0x20 || *p == 0x7f) printf("\\x%02x", *p);
        else putchar(*p);
    }
}

#define ROW(label, ...)                                                                                      \
    do {                                                                                                     \
        printf("  %-16s ", label);                                                                           \
        printf(__VA_ARGS__);                                                                                 \
        putchar('\n');                                                                                       \
    } while (0)

static int cmd_inspect(int argc, char **argv) {
    struct argp a = {.cmd = "inspect", .argc = argc, .argv = argv};
    const char *model_path = NULL, *tokenizer = NULL;
    bool vocab_only = false;

    for (a.i = 1; a.i < argc; a.i++) {
        const char *arg = argv[a.i];
        if (!is_option(arg)) {
            if (model_path) usage_error(a.cmd, "unexpected argument '%s' (one MODEL at a time)", arg);
            model_path = arg;
        } else if (opt_is(&a, "-h", "--help")) {
            help_inspect(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            if (model_path) usage_error(a.cmd, "%s: a MODEL was already given", a.name);
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else if (opt_is(&a, NULL, "--vocab-only")) {
            opt_no_value(&a);
            vocab_only = true;
        } else if (opt_is(&a, "-v", "--verbose")) {
            opt_no_value(&a);
            log_verbose = 1;
        } else {
            unknown_option(&a);
        }
    }
    if (!model_path) usage_error(a.cmd, "MODEL is required (see 'sparrow inspect --help')");

    struct sp_model *model = NULL;
    struct sp_model_info mi;
    char b1[64], b2[64];
    sp_status rc;
    sp_log_set(cli_log, &log_verbose);
    rc = load_model(model_path, tokenizer, vocab_only, 0, &model);
    if (rc != SP_OK) return lib_error("loading the model", rc);
    rc = sp_model_get_info(model, &mi);
    if (rc != SP_OK) {
        int ret = lib_error("reading the model info", rc);
        sp_model_free(model);
        return ret;
    }
#define S(x) ((x) && *(x) ? (x) : "-")
    printf("model\n");
    ROW("file", "%s", model_path);
    ROW("format", "%s", S(mi.file_format));
    ROW("file size", "%" PRIu64 " bytes (%s)", mi.file_size, human_bytes(mi.file_size, b1, sizeof b1));
    ROW("architecture", "%s", S(mi.arch));
    ROW("name", "%s", S(mi.name));

    printf("\nhyper-parameters\n");
    ROW("n_vocab", "%d", (int)mi.n_vocab);
    ROW("n_ctx_train", "%d", (int)mi.n_ctx_train);
    ROW("n_embd", "%d", (int)mi.n_embd);
    ROW("n_layers", "%d", (int)mi.n_layers);
    ROW("n_heads", "%d", (int)mi.n_heads);
    ROW("n_kv_heads", "%d", (int)mi.n_kv_heads);
    ROW("head_dim_k", "%d", (int)mi.head_dim_k);
    ROW("head_dim_v", "%d", (int)mi.head_dim_v);
    ROW("n_ff", "%d", (int)mi.n_ff);
    ROW("n_experts", "%d", (int)mi.n_experts);
    ROW("n_experts_used", "%d", (int)mi.n_experts_used);
    if (mi.n_experts) ROW("n_ff_exp", "%d", (int)mi.n_ff_exp);
    ROW("rope_theta", "%g", (double)mi.rope_theta);
    ROW("rope_dims", "%d", (int)mi.rope_dims);
    ROW("rope_neox", "%s", mi.rope_neox ? "yes" : "no");
    ROW("rms_eps", "%g", (double)mi.rms_eps);
    ROW("tied_output", "%s", mi.tied_output ? "yes" : "no");

    printf("\ntokenizer\n");
    ROW("kind", "%s", S(mi.tokenizer));
    ROW("pre", "%s", S(mi.tokenizer_pre));
    ROW("n_vocab", "%d", (int)mi.n_vocab);
    if (mi.bos >= 0) ROW("bos", "%d", (int)mi.bos);
    else ROW("bos", "none");
    if (mi.eos >= 0) ROW("eos", "%d", (int)mi.eos);
    else ROW("eos", "none");
    ROW("add_bos", "%s", mi.add_bos ? "yes" : "no");

    /* metadata: keys padded to the longest */
    const int32_t n_meta = sp_model_n_meta(model);
    char key[256], val[512];
    int kw = 3;
    for (int32_t i = 0; i < n_meta; i++) {
        if (sp_model_get_meta(model, i, key, sizeof key, val, sizeof val) != SP_OK) continue;
        int l = (int)strlen(key);
        if (l > kw) kw = l;
    }
    printf("\nmetadata (%d keys)\n", (int)n_meta);
    for (int32_t i = 0; i < n_meta; i++) {
        rc = sp_model_get_meta(model, i, key, sizeof key, val, sizeof val);
        if (rc != SP_OK) {
            printf("  #%d: %s\n", (int)i, sp_status_str(rc));
            continue;
        }
        printf("  %-*s  ", kw, key);
        print_escaped(val);
        putchar('\n');
    }

    /* tensors: name column as wide as the longest name */
    const int32_t n_t = sp_model_n_tensors(model);
    int nw = 4, tw = 4, sw = 5;
    uint64_t sum = 0;
    for (int32_t i = 0; i < n_t; i++) {
        struct sp_tensor_info ti;
        if (sp_model_get_tensor(model, i, &ti) != SP_OK) continue;
        int l = ti.name ? (int)strlen(ti.name) : 1;
        if (l > nw) nw = l;
        l = ti.type ? (int)strlen(ti.type) : 1;
        if (l > tw) tw = l;
        char shape[96];
        int k = 0;
        for (int d = 0; d < ti.n_dims && d < 4; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, d ? " x %" PRId64 : "%" PRId64, ti.ne[d]);
        if (k > sw) sw = k;
    }
    printf("\ntensors (%d)\n", (int)n_t);
    if (n_t > 0)
        printf("  %5s  %-*s  %-*s  %-*s  %12s  %12s\n", "#", nw, "name", tw, "type", sw, "shape", "offset", "bytes");
    for (int32_t i = 0; i < n_t; i++) {
        struct sp_tensor_info ti;
        rc = sp_model_get_tensor(model, i, &ti);
        if (rc != SP_OK) {
            printf("  %5d  %s\n", (int)i, sp_status_str(rc));
            continue;
        }
        char shape[96];
        int k = 0;
        shape[0] = '\0';
        for (int d = 0; d < ti.n_dims && d < 4; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, d ? " x %" PRId64 : "%" PRId64, ti.ne[d]);
        printf("  %5d  %-*s  %-*s  %-*s  %12" PRIu64 "  %12" PRIu64 "\n", (int)i, nw, S(ti.name), tw, S(ti.type), sw,
               shape, ti.offset, ti.size);
        sum += ti.size;
    }

    printf("\ntotals\n");
    ROW("tensors", "%d", (int)n_t);
    ROW("tensor bytes", "%" PRIu64 " (%s)", mi.tensor_bytes, human_bytes(mi.tensor_bytes, b1, sizeof b1));
    if (sum != mi.tensor_bytes) ROW("listed bytes", "%" PRIu64 " (sum of the rows above)", sum);
    ROW("parameters", "%" PRIu64 " (%s)", mi.n_params, human_count(mi.n_params, b2, sizeof b2));
    if (mi.n_experts) {
        ROW("bytes/token", "%" PRIu64 " (%s read per decoded token: %d of %d experts per layer)", mi.bytes_per_token,
            human_bytes(mi.bytes_per_token, b1, sizeof b1), (int)mi.n_experts_used, (int)mi.n_experts);
    } else {
        ROW("bytes/token", "%" PRIu64 " (%s read per decoded token)", mi.bytes_per_token,
            human_bytes(mi.bytes_per_token, b1, sizeof b1));
    }
#undef S
    sp_model_free(model);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: inspect: cannot write to stdout: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    return EXIT_OK;
}

/* ---- synth ------------------------------------------------------------------------ */

static void help_synth(FILE *f) {
    fprintf(f, "usage: sparrow synth --shape NAME --type TYPE -o FILE [OPTIONS]\n"
               "       sparrow synth --list\n"
               "\n"
               "Write a GGUF model with seeded random weights in the exact shapes of a real\n"
               "model (tensor names, shapes, per-tensor types, hyper-parameters, and a\n"
               "SentencePiece-style vocabulary of the right size), for speed and memory\n"
               "measurements without downloading weights.  The text it generates is\n"
               "gibberish.  llama.cpp loads these files too.  FILE appears only when it is\n"
               "complete; a failure or Ctrl-C leaves nothing behind.  Progress goes to stderr.\n"
               "\n"
               "options:\n"
               "      --shape NAME        model shape (see --list), e.g. llama-7b; required\n"
               "      --type TYPE         f16, bf16, q8_0, q4_0 or q4_k_m (Q4_K, with Q6_K for\n"
               "                          the output and, as llama.cpp's Q4_K_M, attn_v and\n"
               "                          ffn_down in half the layers); required\n"
               "  -o, --output FILE       the file to write; required\n"
               "      --seed S            seed, 0..2^64-1; the same shape, type and seed give\n"
               "                          the same bytes (default: 0)\n"
               "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here);\n"
               "                          the output does not depend on it\n"
               "      --list              list the shapes and types with their sizes, then exit\n"
               "  -q, --quiet             no progress on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error (e.g. a full disk),\n"
               "             2 usage error (including an unknown shape or type).\n",
            MAX_THREADS, default_threads());
}

static int synth_list(void) {
    char b[64];
    const int32_t nt = sp_synth_n_types();
    printf("%-14s %-9s %6s %6s %7s %6s %7s %8s %7s %-9s", "shape", "arch", "layers", "embd", "heads", "ffn",
           "vocab", "ctx", "experts", "params");
    for (int32_t k = 0; k < nt; k++) printf(" %10s", sp_synth_type_name(k));
    putchar('\n');
    for (int32_t i = 0; i < sp_synth_n_shapes(); i++) {
        struct sp_synth_shape_info si;
        uint64_t n_params = 0;
        if (sp_synth_get_shape(i, &si) != SP_OK) continue;
        char heads[32], experts[32], ffn[32];
        snprintf(heads, sizeof heads, "%d/%d", (int)si.n_heads, (int)si.n_kv_heads);
        if (si.n_experts) {
            snprintf(experts, sizeof experts, "%d/%d", (int)si.n_experts_used, (int)si.n_experts);
            snprintf(ffn, sizeof ffn, "%d", (int)si.n_ff_exp);
        } else {
            snprintf(experts, sizeof experts, "-");
            snprintf(ffn, sizeof ffn, "%d", (int)si.n_ff);
        }
        (void)sp_synth_size(si.name, sp_synth_type_name(0), &n_params, NULL);
        printf("%-14s %-9s %6d %6d %7s %6s %7d %8d %7s %-9s", si.name, si.arch, (int)si.n_layers, (int)si.n_embd,
               heads, ffn, (int)si.n_vocab, (int)si.n_ctx, experts, human_count(n_params, b, sizeof b));
        for (int32_t k = 0; k < nt; k++) {
            uint64_t bytes = 0;
            (void)sp_synth_size(si.name, sp_synth_type_name(k), NULL, &bytes);
            printf(" %10s", human_bytes(bytes, b, sizeof b));
        }
        printf("\n%-14s %s\n", "", si.about);
    }
    printf("\nsizes are tensor data; a file adds its metadata (a few MiB for large vocabularies).\n"
           "experts: active/total; ffn: the expert FFN width for MoE shapes.\n");
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: synth: cannot write to stdout: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    return EXIT_OK;
}

static volatile sig_atomic_t synth_interrupted;
static void synth_on_signal(int sig) {
    (void)sig;
    synth_interrupted = 1;
}

/* Progress bar state: on a terminal the line is redrawn with '\r' a few
 * times a second; otherwise a line is printed every 10%. */
struct synth_progress {
    double t0, last;
    int tty, last_decile, quiet, drawn;
};

static bool synth_progress_cb(uint64_t done, uint64_t total, void *user) {
    struct synth_progress *pr = user;
    if (synth_interrupted) return false;
    if (pr->quiet) return true;
    const double t = now_s(), el = t - pr->t0;
    const double frac = total ? (double)done / (double)total : 1.0;
    const int decile = (int)(frac * 10.0);
    if (pr->tty) {
        if (done != total && t - pr->last < 0.2) return true;
    } else if (decile == pr->last_decile && done != total) {
        return true;
    }
    pr->last = t;
    pr->last_decile = decile;
    const double mb = (double)done / 1e6, rate = el > 0 ? mb / el : 0.0;
    const double eta = rate > 0 ? ((double)(total - done) / 1e6) / rate : 0.0;
    char bar[31];
    const int fill = (int)(frac * 30.0);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "%s[%s] %5.1f%%  %9.1f / %.1f MB  %6.1f MB/s  ETA %4.0f s%s", pr->tty ? "\r" : "", bar,
            frac * 100.0, mb, (double)total / 1e6, rate, eta, pr->tty ? "  " : "\n");
    pr->drawn = 1;
    return true;
}

static int cmd_synth(int argc, char **argv) {
    struct argp a = {.cmd = "synth", .argc = argc, .argv = argv};
    struct sp_synth_params p = sp_synth_default_params();
    bool list = false, quiet = false;
    p.n_threads = default_threads();

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_synth(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, NULL, "--shape")) {
            p.shape = opt_value(&a);
        } else if (opt_is(&a, NULL, "--type")) {
            p.type = opt_value(&a);
        } else if (opt_is(&a, "-o", "--output")) {
            p.path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--seed")) {
            p.seed = parse_u64(&a, opt_value(&a));
        } else if (opt_is(&a, "-t", "--threads")) {
            p.n_threads = (int32_t)parse_int(&a, opt_value(&a), 1, MAX_THREADS);
        } else if (opt_is(&a, NULL, "--list")) {
            opt_no_value(&a);
            list = true;
        } else if (opt_is(&a, "-q", "--quiet")) {
            opt_no_value(&a);
            quiet = true;
        } else {
            last_opt(&a, "the output file goes after -o");
        }
    }
    if (list) return synth_list();
    if (!p.shape) usage_error(a.cmd, "--shape NAME is required (see 'sparrow synth --list')");
    if (!p.type) usage_error(a.cmd, "--type TYPE is required (f16, bf16, q8_0, q4_0, q4_k_m)");
    if (!p.path || !*p.path) usage_error(a.cmd, "-o FILE is required");
    uint64_t n_params = 0, bytes = 0;
    if (sp_synth_size(p.shape, p.type, &n_params, &bytes) != SP_OK) {
        bool shape_ok = false;
        for (int32_t i = 0; i < sp_synth_n_shapes(); i++) {
            struct sp_synth_shape_info si;
            if (sp_synth_get_shape(i, &si) == SP_OK && strcmp(si.name, p.shape) == 0) shape_ok = true;
        }
        if (!shape_ok) usage_error(a.cmd, "--shape: unknown shape '%s' (see 'sparrow synth --list')", p.shape);
        usage_error(a.cmd, "--type: unknown type '%s' (f16, bf16, q8_0, q4_0, q4_k_m)", p.type);
    }

    sp_log_set(cli_log, &log_verbose);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = synth_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    struct synth_progress pr = {.t0 = now_s(), .tty = isatty(STDERR_FILENO), .last_decile = -1, .quiet = quiet};
    char b1[64], b2[64];
    if (!quiet) {
        fprintf(stderr, "sparrow: synth %s %s seed %" PRIu64 ": %s parameters, %s of tensor data -> %s\n", p.shape,
                p.type, p.seed, human_count(n_params, b1, sizeof b1), human_bytes(bytes, b2, sizeof b2), p.path);
    }
    p.progress = synth_progress_cb;
    p.progress_user = &pr;
    sp_status rc = sp_synth(&p);
    if (pr.drawn && pr.tty) fputc('\n', stderr);
    if (rc != SP_OK) {
        if (synth_interrupted) {
            fprintf(stderr, "sparrow: synth: interrupted; '%s' was not written\n", p.path);
            return EXIT_RUNTIME;
        }
        return lib_error("writing the model", rc);
    }
    const double el = now_s() - pr.t0;
    if (!quiet) {
        fprintf(stderr, "sparrow: wrote %s (%s) in %.1f s, %.1f MB/s\n", p.path, human_bytes(bytes, b1, sizeof b1),
                el, el > 0 ? (double)bytes / 1e6 / el : 0.0);
    }
    return EXIT_OK;
}

/* ---- bench ------------------------------------------------------------------------ */

#define DEF_BENCH_PROMPT 128
#define DEF_BENCH_GEN 32
#define DEF_BENCH_REPS 3

static void help_bench(FILE *f) {
    fprintf(f,
            "usage: sparrow bench -m MODEL [OPTIONS]\n"
            "\n"
            "Measure the model as llama-bench does, in Sparrow's own terms.  Each\n"
            "repetition loads the model afresh, decodes a prompt of P token ids (BOS then\n"
            "fixed pseudo-random ids, not text) as one batch, samples greedily, then decodes\n"
            "N more tokens one at a time.  Per repetition it reports:\n"
            "  load_s               sp_model_load + sp_session_init\n"
            "  ttft_s               prompt decode + the first sample (time to first token)\n"
            "  prefill_tps          P / prompt decode time\n"
            "  decode_tps, decode_ms_per_token   over the N one-token decodes\n"
            "  peak_rss_bytes       VmHWM (/proc/self/status), reset before each repetition\n"
            "  bytes_read, rchar    storage bytes read (read_bytes of /proc/self/io) and\n"
            "                       bytes through read calls (rchar), over the repetition\n"
            "  bytes_read_per_token storage bytes read during the N decodes / N\n"
            "  model_bytes_per_token  bytes a decoded token touches (from the tensor sizes)\n"
            "A page-cache-warm file reads ~0 bytes from storage; --cold drops the file's\n"
            "pages from the cache before each repetition.  The summary is the median.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file; required\n"
            "  -p, --n-prompt P        prompt tokens, 1..%d (default: %d)\n"
            "  -n, --n-gen N           generated tokens, 0..%d (default: %d)\n"
            "  -r, --reps R            repetitions, 1..1000 (default: %d)\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "  -c, --ctx-size N        context length, 0 = P + N (default: 0)\n"
            "  -b, --batch N           tokens per forward pass, 1..%d; 0 = the library's\n"
            "                          default (128)\n"
            "      --kv-type TYPE      KV cache element type: f32 or f16 (default: f16, as llama.cpp)\n"
            "      --weights MODE      how resident weights are held: auto, mmap (pointers\n"
            "                          into the file mapping) or load (read into anonymous,\n"
            "                          huge-page memory) (default: auto)\n"
            "      --mem-budget SIZE   keep at most SIZE resident (binary units: 7.5G); adds\n"
            "                          mem_budget_bytes to the JSON.  expert_hit_rate (MoE:\n"
            "                          expert slices found cached) and prefetch_accuracy\n"
            "                          (prefetched units used before eviction) are measured\n"
            "                          over the decodes; null where they do not apply;\n"
            "                          io_wait_s_per_token: time a decode waited for reads\n"
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

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void json_string(const char *s) {
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
static void json_number(double v, int integer) {
    if (!isfinite(v)) printf("null");
    else if (integer) printf("%.0f", v);
    else printf("%.6g", v);
}

static void json_fields(struct bench_run *r) {
    for (size_t i = 0; i < sizeof bench_fields / sizeof bench_fields[0]; i++) {
        printf("%s\"%s\": ", i ? ", " : "", bench_fields[i].key);
        json_number(*bench_field(r, i), bench_fields[i].integer);
    }
}

/* One repetition: load, prompt, n_gen decodes; fills r.  Returns an exit
 * code (EXIT_OK or EXIT_RUNTIME, message printed). */
static int bench_once(const char *path, enum sp_weight_mode weights, uint64_t mem_budget, struct sp_session_params sp,
                      int n_prompt, int n_gen, struct bench_run *r, struct sp_model_info *info) {
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
    mp.weights = weights;
    mp.mem_budget = mem_budget;
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
    r->load_s = now_s() - t0;
    if ((rc = sp_model_get_info(model, info)) != SP_OK) {
        ret = lib_error("reading the model info", rc);
        goto done;
    }

    /* BOS, then ids from a fixed LCG over the whole vocabulary: the same
     * prompt in every repetition and every run. */
    toks = malloc((size_t)n_prompt * sizeof *toks);
    if (!toks) {
        fprintf(stderr, "sparrow: bench: out of memory\n");
        goto done;
    }
    uint32_t x = 12345u;
    for (int i = 0; i < n_prompt; i++) {
        x = x * 1664525u + 1013904223u;
        toks[i] = (int32_t)((x >> 8) % (uint32_t)info->n_vocab);
    }
    if (info->bos >= 0) toks[0] = info->bos;

    int32_t tok;
    const double tp0 = now_s();
    if ((rc = sp_decode(sess, toks, n_prompt)) != SP_OK) {
        ret = lib_error("decoding the prompt", rc);
        goto done;
    }
    const double tp1 = now_s();
    if ((rc = sp_sample(sess, &tok)) != SP_OK) {
        ret = lib_error("sampling", rc);
        goto done;
    }
    const double tp2 = now_s();
    r->ttft_s = tp2 - tp0;
    r->prefill_tps = n_prompt / (tp1 - tp0);
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

static int cmd_bench(int argc, char **argv) {
    struct argp a = {.cmd = "bench", .argc = argc, .argv = argv};
    const char *model_path = NULL;
    long long n_prompt = DEF_BENCH_PROMPT, n_gen = DEF_BENCH_GEN, reps = DEF_BENCH_REPS;
    bool json = false, cold = false;
    uint64_t mem_budget = 0;
    enum sp_weight_mode weights = SP_WEIGHTS_AUTO;
    struct sp_session_params sp = sp_session_default_params();
    sp.n_threads = default_threads();
    sp.sampling.temp = 0.0f; /* greedy */
    sp.sampling.repeat_penalty = 1.0f;

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_bench(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, "-p", "--n-prompt")) {
            n_prompt = parse_int(&a, opt_value(&a), 1, MAX_BATCH);
        } else if (opt_is(&a, "-n", "--n-gen")) {
            n_gen = parse_int(&a, opt_value(&a), 0, MAX_BATCH);
        } else if (opt_is(&a, "-r", "--reps")) {
            reps = parse_int(&a, opt_value(&a), 1, 1000);
        } else if (session_opt(&a, &sp)) {
            /* -t, -c, -b, --kv-type */
        } else if (opt_is(&a, NULL, "--weights")) {
            const char *v = opt_value(&a);
            if (strcmp(v, "auto") == 0) weights = SP_WEIGHTS_AUTO;
            else if (strcmp(v, "mmap") == 0) weights = SP_WEIGHTS_MMAP;
            else if (strcmp(v, "load") == 0) weights = SP_WEIGHTS_LOAD;
            else usage_error(a.cmd, "%s: expected auto, mmap or load, got '%s'", a.name, v);
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            mem_budget = parse_size(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--cold")) {
            opt_no_value(&a);
            cold = true;
        } else if (opt_is(&a, NULL, "--json")) {
            opt_no_value(&a);
            json = true;
        } else {
            last_opt(&a, "the model goes after -m");
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow bench --help')");
    if (sp.n_ctx == 0) sp.n_ctx = (int32_t)(n_prompt + n_gen);
    if (n_prompt + n_gen > sp.n_ctx) {
        usage_error(a.cmd, "-c %d is smaller than P + N = %lld tokens", (int)sp.n_ctx, n_prompt + n_gen);
    }

    sp_log_set(cli_log, &log_verbose);
    struct bench_run *runs = calloc((size_t)reps, sizeof *runs);
    double *col = calloc((size_t)reps, sizeof *col);
    struct sp_model_info info;
    int ret = EXIT_RUNTIME;
    if (!runs || !col) {
        fprintf(stderr, "sparrow: bench: out of memory\n");
        goto done;
    }
    if (!json) {
        char batch[16];
        snprintf(batch, sizeof batch, sp.n_batch ? "%d" : "default", (int)sp.n_batch);
        char budget[32] = "";
        if (mem_budget) snprintf(budget, sizeof budget, ", budget %.2f GiB", mem_budget / 1073741824.0);
        printf("model %s: threads %d, prompt %lld, gen %lld, ctx %d, batch %s, weights %s%s%s\n", model_path,
               (int)sp.n_threads, n_prompt, n_gen, (int)sp.n_ctx, batch, weights_name(weights), budget,
               cold ? ", cold page cache" : "");
        printf("%4s %8s %8s %11s %10s %9s %12s %12s %12s\n", "rep", "load s", "ttft s", "prefill t/s", "decode t/s",
               "ms/token", "peak RSS MiB", "read MiB", "read/token");
        fflush(stdout);
    }
    for (long long i = 0; i < reps; i++) {
        if (cold && evict_file(model_path) != 0 && i == 0) {
            fprintf(stderr, "sparrow: bench: warning: cannot evict '%s' from the page cache\n", model_path);
        }
        if ((ret = bench_once(model_path, weights, mem_budget, sp, (int)n_prompt, (int)n_gen, &runs[i], &info)) != EXIT_OK) {
            goto done;
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
        printf(", \"engine\": \"sparrow\", \"version\": \"%s\", \"threads\": %d, \"n_prompt\": %lld, \"n_gen\": %lld, "
               "\"n_ctx\": %d, \"n_batch\": %d, \"reps\": %lld, \"cold\": %s, \"kv_type\": \"%s\", "
               "\"weights\": \"%s\", ",
               SPARROW_VERSION, (int)sp.n_threads, n_prompt, n_gen, (int)sp.n_ctx, (int)sp.n_batch, reps,
               cold ? "true" : "false", kv_type_name(sp.kv_type), weights_name(weights));
        printf("\"mem_budget_bytes\": ");
        json_number(mem_budget ? (double)mem_budget : NAN, 1);
        printf(", \"n_experts\": %d, \"n_experts_used\": %d, ", (int)info.n_experts, (int)info.n_experts_used);
        printf("\"model_file_size\": %" PRIu64 ", \"model_tensor_bytes\": %" PRIu64
               ", \"model_bytes_per_token\": %" PRIu64 ", \"model_params\": %" PRIu64 ", ",
               info.file_size, info.tensor_bytes, info.bytes_per_token, info.n_params);
        json_fields(&med);
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
    return ret;
}


/* ---- plan ----------------------------------------------------------------------- */

static void help_plan(FILE *f) {
    fprintf(f,
            "usage: sparrow plan -m MODEL --mem-budget SIZE [OPTIONS]\n"
            "\n"
            "Print how Sparrow would place MODEL's weights under a memory budget, without\n"
            "running it: what stays resident (pinned), what streams from storage and through\n"
            "which buffers, the expert cache, the bytes a decoded token touches and reads,\n"
            "and the predicted decode speed.  Storage and memory read speeds are measured\n"
            "(~0.2 s) when something must stream.  A budget too small to run the model is\n"
            "refused with the minimum (exit status 1).\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file; required\n"
            "      --mem-budget SIZE   the budget, binary units (7.5G = 7.5 GiB); required\n"
            "  -c, --ctx-size N        context length of the session planned for, 0 = the\n"
            "                          model's, capped at 4096 (default: 0)\n"
            "  -b, --batch N           prompt batch of that session (default: 128)\n"
            "  -t, --threads N         accepted for symmetry with run; does not change the plan\n"
            "      --kv-type TYPE      KV cache element type: f32 or f16 (default: f32)\n"
            "      --json              print one JSON object instead of the table\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static const char *const wclass_names[SP_WCLASS_COUNT] = {"small (norms, routers)", "dense (attention, FFN, output)",
                                                          "routed experts", "input embedding"};
static const char *const wclass_keys[SP_WCLASS_COUNT] = {"small", "dense", "expert", "embed"};

static int cmd_plan(int argc, char **argv) {
    struct argp a = {.cmd = "plan", .argc = argc, .argv = argv};
    const char *model_path = NULL;
    uint64_t mem_budget = 0;
    bool json = false;
    struct sp_session_params sp = sp_session_default_params();
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_plan(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            mem_budget = parse_size(&a, opt_value(&a));
        } else if (session_opt(&a, &sp)) {
            /* -t, -c, -b, --kv-type */
        } else if (opt_is(&a, NULL, "--json")) {
            opt_no_value(&a);
            json = true;
        } else {
            last_opt(&a, "the model goes after -m");
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow plan --help')");
    if (!mem_budget) usage_error(a.cmd, "--mem-budget SIZE is required (see 'sparrow plan --help')");
    sp_log_set(cli_log, &log_verbose);
    struct sp_model *model = NULL;
    struct sp_model_info mi;
    struct sp_plan_info pi;
    int ret = EXIT_RUNTIME;
    sp_status rc = load_model(model_path, NULL, false, mem_budget, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    if ((rc = sp_model_get_info(model, &mi)) != SP_OK || (rc = sp_model_plan(model, &sp, &pi)) != SP_OK) {
        ret = lib_error("planning", rc);
        goto done;
    }
    const double G = 1073741824.0, M = 1048576.0;
    if (json) {
        printf("{\"model\": ");
        json_string(model_path);
        printf(", \"mem_budget_bytes\": %" PRIu64 ", \"resident\": %s, \"base_bytes\": %" PRIu64
               ", \"session_bytes\": %" PRIu64 ", \"pinned_bytes\": %" PRIu64 ", \"ring_bytes\": %" PRIu64
               ", \"ring_slots\": %u, \"expert_cache_bytes\": %" PRIu64 ", \"expert_slots\": %u, \"expert_units\": %" PRIu64
               ", \"row_bytes\": %" PRIu64 ", \"overhead_bytes\": %" PRIu64 ", \"total_bytes\": %" PRIu64
               ", \"min_budget_bytes\": %" PRIu64 ", ",
               pi.budget, pi.resident ? "true" : "false", pi.base_bytes, pi.session_bytes, pi.pinned_bytes, pi.ring_bytes,
               pi.ring_slots, pi.expert_cache_bytes, pi.expert_slots, pi.expert_units, pi.row_bytes, pi.overhead_bytes,
               pi.total_bytes, pi.min_budget);
        printf("\"read_bps\": ");
        json_number(pi.read_bps > 0 ? pi.read_bps : NAN, 1);
        printf(", \"mem_bps\": ");
        json_number(pi.mem_bps > 0 ? pi.mem_bps : NAN, 1);
        printf(", \"touched_bytes_per_token\": %.0f, \"read_bytes_per_token\": %.0f, \"expert_hit_rate\": ",
               pi.touched_bytes_per_token, pi.read_bytes_per_token);
        json_number(mi.n_experts > 0 ? pi.expert_hit_rate : NAN, 0);
        printf(", \"predicted_tps\": ");
        json_number(pi.predicted_tps, 0);
        printf(", \"classes\": {");
        for (int k = 0; k < SP_WCLASS_COUNT; k++) {
            printf("%s\"%s\": {\"bytes\": %" PRIu64 ", \"pinned_bytes\": %" PRIu64 "}", k ? ", " : "", wclass_keys[k],
                   pi.class_bytes[k], pi.class_pinned[k]);
        }
        printf("}}\n");
    } else {
        printf("model %s: %.2f GiB of tensors, budget %.2f GiB\n", model_path, mi.tensor_bytes / G, pi.budget / G);
        if (pi.resident) {
            printf("placement: everything resident (the model fits); nothing streams\n");
        } else {
            printf("placement: %.2f GiB pinned, the rest streams from storage\n", pi.pinned_bytes / G);
        }
        printf("\n%-32s %12s %12s %12s\n", "weights", "MiB", "pinned MiB", "streamed MiB");
        for (int k = 0; k < SP_WCLASS_COUNT; k++) {
            if (!pi.class_bytes[k]) continue;
            printf("%-32s %12.1f %12.1f %12.1f\n", wclass_names[k], pi.class_bytes[k] / M, pi.class_pinned[k] / M,
                   (pi.class_bytes[k] - pi.class_pinned[k]) / M);
        }
        printf("\n%-32s %12s\n", "memory", "MiB");
        printf("%-32s %12.1f\n", "process (code, heap, tokenizer)", pi.base_bytes / M);
        printf("%-32s %12.1f\n", "session (KV cache, scratch)", pi.session_bytes / M);
        printf("%-32s %12.1f\n", "pinned weights", pi.pinned_bytes / M);
        if (pi.ring_slots) printf("%-32s %12.1f  (%u slots, read ahead in forward order)\n", "streaming ring",
                                  pi.ring_bytes / M, pi.ring_slots);
        if (pi.expert_slots) printf("%-32s %12.1f  (%u of %" PRIu64 " expert slices)\n", "expert cache",
                                    pi.expert_cache_bytes / M, pi.expert_slots, pi.expert_units);
        if (pi.row_bytes) printf("%-32s %12.1f\n", "embedding row buffers", pi.row_bytes / M);
        printf("%-32s %12.1f\n", "bookkeeping and margin", pi.overhead_bytes / M);
        printf("%-32s %12.1f  (budget %.1f, minimum %.1f)\n", "total", pi.total_bytes / M, pi.budget / M,
               pi.min_budget / M);
        printf("\nper decoded token: %.1f MiB touched, %.1f MiB read from storage", pi.touched_bytes_per_token / M,
               pi.read_bytes_per_token / M);
        if (mi.n_experts > 0) printf(", expert hit rate %.3f (uniform routing)", pi.expert_hit_rate);
        printf("\n");
        if (pi.read_bps > 0) {
            printf("measured: storage %.2f GB/s, memory %.2f GB/s (one thread)\n", pi.read_bps / 1e9, pi.mem_bps / 1e9);
        }
        if (pi.predicted_tps > 0 && !pi.resident) printf("predicted decode: %.2f tok/s\n", pi.predicted_tps);
        else printf("predicted decode: as without a budget (see 'sparrow bench')\n");
    }
    ret = fflush(stdout) == 0 ? EXIT_OK : EXIT_RUNTIME;
done:
    sp_model_free(model);
    return ret;
}

/* ---- eval ------------------------------------------------------------------------- */

#define DEF_EVAL_SEED 1234     /* --gen's sampler seed */
#define DEF_EVAL_CTX_CAP 512   /* -c 0: the model's context length, capped here */
#define MAX_EVAL_CTX 1048576

static void help_eval(FILE *f) {
    fprintf(f,
            "usage: sparrow eval -m MODEL [--ref REFERENCE_MODEL] (--text FILE | --gen N)\n"
            "                    [-c CTX] [--json] [OPTIONS]\n"
            "\n"
            "Measure a model's quality: its perplexity on a text, computed the way\n"
            "llama.cpp's llama-perplexity does, and with --ref how far its next-token\n"
            "distributions are from a reference model's (e.g. a quantized file against\n"
            "its F32 original).  The text is tokenized once with BOS and cut into chunks\n"
            "of CTX tokens (the remainder is dropped; at least 2 x CTX tokens are needed).\n"
            "Each chunk is evaluated from an empty cache with its first token replaced by\n"
            "BOS, and only its second half is scored: the logits at positions CTX/2 ..\n"
            "CTX-2 predict the next token.\n"
            "  ppl         exp(mean negative log-likelihood), with llama-perplexity's +/-\n"
            "  ref_ppl     the reference's perplexity on the same positions\n"
            "  kl_mean     mean KL(reference || model) in nats (double, log-softmax),\n"
            "  kl_p99      and its 99th percentile over the scored positions\n"
            "  top1_agree  fraction of positions where both models' most likely token agree\n"
            "  bpw         MODEL's tensor bytes x 8 / its parameter count (all tensors, as\n"
            "              stored)\n"
            "Progress goes to stderr, one line per chunk; the summary to stdout.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        the model to measure (GGUF or llama2.c .bin); required\n"
            "      --ref FILE          a reference model with the same vocabulary\n"
            "      --text FILE         the text ('-' = stdin)\n"
            "      --gen N             instead of a text, N tokens sampled from the reference\n"
            "                          (needs --ref): segments of CTX tokens, each BOS then\n"
            "                          tokens drawn at temperature 1 from the full\n"
            "                          distribution, from an empty cache\n"
            "      --seed S            --gen's sampler seed (default: %d)\n"
            "  -c, --ctx-size N        chunk length CTX, >= 4; 0 = the model's context\n"
            "                          length capped at %d (default: 0)\n"
            "      --json              print one JSON object on stdout instead of the summary\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"
            "                          beside the model)\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "JSON keys: model, ref, text, gen, seed, ctx, n_tokens, n_chunks, n_scored, ppl,\n"
            "ppl_err, ref_ppl, ref_ppl_err, kl_mean, kl_mean_err, kl_p99, kl_max, top1_agree,\n"
            "bpw, n_params, tensor_bytes, file_size; null where they do not apply.\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error (e.g. a text shorter than\n"
            "2 x CTX tokens, models with different vocabularies), 2 usage error.\n",
            DEF_EVAL_SEED, DEF_EVAL_CTX_CAP, MAX_THREADS, default_threads());
}

/* Per-chunk progress on stderr: "[3/55] ppl 3.8402" (+ the running mean KL),
 * after a line saying what is evaluated (printed with the first chunk, so
 * that a refused text gets a one-line error). */
static bool eval_progress(const struct sp_eval_result *r, void *user) {
    const int n_threads = *(const int *)user;
    if (r->n_done == 1)
        fprintf(stderr, "sparrow: eval: %d tokens, %d chunks of %d, threads %d\n", (int)r->n_tokens, (int)r->n_chunks,
                (int)r->n_ctx, n_threads);
    if (isnan(r->kl_mean)) fprintf(stderr, "[%d/%d] ppl %.4f\n", (int)r->n_done, (int)r->n_chunks, r->ppl);
    else fprintf(stderr, "[%d/%d] ppl %.4f kl %.6f\n", (int)r->n_done, (int)r->n_chunks, r->ppl, r->kl_mean);
    return true;
}

static void json_key_str(const char *key, const char *v) {
    printf(", \"%s\": ", key);
    if (v) json_string(v);
    else printf("null");
}

static void json_key_num(const char *key, double v, int integer) {
    printf(", \"%s\": ", key);
    json_number(v, integer);
}

static void eval_print_json(const char *model_path, const char *ref_path, const char *text_path, long long gen,
                            uint64_t seed, const struct sp_model_info *mi, double bpw, const struct sp_eval_result *r) {
    printf("{\"model\": ");
    json_string(model_path);
    json_key_str("ref", ref_path);
    json_key_str("text", text_path);
    json_key_num("gen", gen > 0 ? (double)gen : NAN, 1);
    json_key_num("seed", gen > 0 ? (double)seed : NAN, 1);
    json_key_num("ctx", r->n_ctx, 1);
    json_key_num("n_tokens", r->n_tokens, 1);
    json_key_num("n_chunks", r->n_chunks, 1);
    json_key_num("n_scored", (double)r->n_scored, 1);
    json_key_num("ppl", r->ppl, 0);
    json_key_num("ppl_err", r->ppl_err, 0);
    json_key_num("ref_ppl", r->ref_ppl, 0);
    json_key_num("ref_ppl_err", r->ref_ppl_err, 0);
    json_key_num("kl_mean", r->kl_mean, 0);
    json_key_num("kl_mean_err", r->kl_mean_err, 0);
    json_key_num("kl_p99", r->kl_p99, 0);
    json_key_num("kl_max", r->kl_max, 0);
    json_key_num("top1_agree", r->top1_agree, 0);
    json_key_num("bpw", bpw, 0);
    json_key_num("n_params", (double)mi->n_params, 1);
    json_key_num("tensor_bytes", (double)mi->tensor_bytes, 1);
    json_key_num("file_size", (double)mi->file_size, 1);
    printf("}\n");
}

static void eval_print_summary(const char *model_path, const char *ref_path, const char *text_path, long long gen,
                               uint64_t seed, const struct sp_model_info *mi, double bpw,
                               const struct sp_eval_result *r) {
    char b1[32], b2[32], b3[32];
    printf("model       %s\n", model_path);
    printf("bpw         %.4f (%s of tensors, %s parameters, file %s)\n", bpw,
           human_bytes(mi->tensor_bytes, b1, sizeof b1), human_count(mi->n_params, b2, sizeof b2),
           human_bytes(mi->file_size, b3, sizeof b3));
    if (text_path) printf("text        %s\n", strcmp(text_path, "-") == 0 ? "(stdin)" : text_path);
    else printf("text        %lld tokens sampled from the reference (seed %" PRIu64 ")\n", gen, seed);
    printf("tokens      %d: %d chunks of %d, %lld positions scored\n", (int)r->n_tokens, (int)r->n_chunks,
           (int)r->n_ctx, (long long)r->n_scored);
    printf("ppl         %.4f +/- %.5f\n", r->ppl, r->ppl_err);
    if (!ref_path) return;
    printf("reference   %s\n", ref_path);
    printf("ref_ppl     %.4f +/- %.5f\n", r->ref_ppl, r->ref_ppl_err);
    printf("kl_mean     %.6f +/- %.6f nats\n", r->kl_mean, r->kl_mean_err);
    printf("kl_p99      %.6f nats\n", r->kl_p99);
    printf("kl_max      %.6f nats\n", r->kl_max);
    printf("top1_agree  %.4f\n", r->top1_agree);
}

static int cmd_eval(int argc, char **argv) {
    struct argp a = {.cmd = "eval", .argc = argc, .argv = argv};
    const char *model_path = NULL, *ref_path = NULL, *text_path = NULL, *tokenizer = NULL;
    long long gen = 0, ctx = 0;
    uint64_t seed = DEF_EVAL_SEED;
    bool json = false, have_seed = false;
    struct sp_eval_params ep = sp_eval_default_params();
    ep.n_threads = default_threads();

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_eval(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--ref")) {
            ref_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--text")) {
            text_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--gen")) {
            gen = parse_int(&a, opt_value(&a), 1, INT32_MAX);
        } else if (opt_is(&a, NULL, "--seed")) {
            seed = parse_u64(&a, opt_value(&a));
            have_seed = true;
        } else if (opt_is(&a, "-c", "--ctx-size")) {
            ctx = parse_int(&a, opt_value(&a), 0, MAX_EVAL_CTX);
            if (ctx > 0 && ctx < 4) usage_error(a.cmd, "%s: a chunk needs at least 4 tokens, got %lld", a.name, ctx);
        } else if (opt_is(&a, "-t", "--threads")) {
            ep.n_threads = (int32_t)parse_int(&a, opt_value(&a), 1, MAX_THREADS);
        } else if (opt_is(&a, NULL, "--json")) {
            opt_no_value(&a);
            json = true;
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else {
            last_opt(&a, "the model goes after -m, the text after --text");
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow eval --help')");
    if (text_path && gen) usage_error(a.cmd, "--text and --gen exclude each other");
    if (!text_path && !gen) usage_error(a.cmd, "nothing to evaluate on: give --text FILE or --gen N");
    if (gen && !ref_path) usage_error(a.cmd, "--gen samples from the reference: it needs --ref");
    if (have_seed && !gen) usage_error(a.cmd, "--seed applies to --gen only");

    int ret = EXIT_RUNTIME;
    sp_status rc;
    struct sp_model *model = NULL, *ref = NULL;
    struct sp_model_info mi;
    struct sp_eval_result r;
    char *text = NULL;
    size_t text_len = 0;
    int32_t *toks = NULL, n_toks = 0;

    sp_log_set(cli_log, &log_verbose);
    if (text_path && read_all(a.cmd, text_path, &text, &text_len) != 0) goto done;
    if ((rc = load_model(model_path, tokenizer, false, 0, &model)) != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    if (ref_path && (rc = load_model(ref_path, tokenizer, false, 0, &ref)) != SP_OK) {
        ret = lib_error("loading the reference", rc);
        goto done;
    }
    sp_model_get_info(model, &mi);
    if (ctx == 0) ctx = mi.n_ctx_train > 0 && mi.n_ctx_train < DEF_EVAL_CTX_CAP ? mi.n_ctx_train : DEF_EVAL_CTX_CAP;
    ep.n_ctx = (int32_t)ctx;
    if (text_path) {
        if ((rc = tokenize_all(model, text, text_len, SP_TOKENIZE_ADD_BOS, &toks, &n_toks)) != SP_OK) {
            ret = lib_error("tokenizing the text", rc);
            goto done;
        }
    } else {
        if (gen < 2 * ctx) {
            fprintf(stderr, "sparrow: eval: --gen %lld is too few tokens for chunks of %lld: need at least %lld "
                            "(2 x the context)\n", gen, ctx, 2 * ctx);
            goto done;
        }
        n_toks = (int32_t)gen;
        if (!(toks = malloc((size_t)n_toks * sizeof *toks))) {
            fprintf(stderr, "sparrow: eval: out of memory for %d tokens\n", (int)n_toks);
            goto done;
        }
        fprintf(stderr, "sparrow: eval: sampling %d tokens from %s (seed %" PRIu64 ")\n", (int)n_toks, ref_path,
                seed);
        if ((rc = sp_eval_generate(ref, n_toks, (int32_t)ctx, seed, ep.n_threads, toks)) != SP_OK) {
            ret = lib_error("sampling from the reference", rc);
            goto done;
        }
    }
    int n_threads = (int)ep.n_threads;
    ep.progress = eval_progress;
    ep.progress_user = &n_threads;
    if ((rc = sp_eval(model, ref, toks, n_toks, &ep, &r)) != SP_OK) {
        ret = lib_error("evaluating", rc);
        goto done;
    }
    const double bpw = mi.n_params ? (double)mi.tensor_bytes * 8.0 / (double)mi.n_params : NAN;
    if (json) eval_print_json(model_path, ref_path, text_path, gen, seed, &mi, bpw, &r);
    else eval_print_summary(model_path, ref_path, text_path, gen, seed, &mi, bpw, &r);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: eval: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    ret = EXIT_OK;
done:
    free(toks);
    free(text);
    sp_model_free(ref);
    sp_model_free(model);
    return ret;
}

/* ---- quantize --------------------------------------------------------------------- */

static void help_quantize(FILE *f) {
    fprintf(f, "usage: sparrow quantize IN OUT [--policy NAME | --policy-file F] [--calib TEXT_FILE]\n"
               "                       [--prune-ffn FRACTION] [--prune-heads N] [OPTIONS]\n"
               "\n"
               "Write OUT, a GGUF with Sparrow's mixed-precision block types, from IN: a GGUF\n"
               "whose tensors are F32, F16, BF16 or Q8_0, or a llama2.c checkpoint.  OUT\n"
               "appears only when complete; a failure or Ctrl-C leaves nothing behind.  Each\n"
               "tensor is reported on stderr (type, relative RMS error); the summary (bits per\n"
               "weight measured on OUT, sizes, time) goes to stdout.  docs/QUANT.md has more.\n"
               "\n"
               "options:\n"
               "      --policy NAME       which type each tensor gets (default: mem4):\n");
    for (int32_t i = 0; i < sp_quantize_n_policies(); i++) {
        const char *name, *about;
        if (sp_quantize_policy_info(i, &name, &about) == SP_OK) fprintf(f, "                            %-6s %s\n", name, about);
    }
    fprintf(f, "      --policy-file F     rules 'PATTERN TYPE', one per line, first match wins;\n"
               "                          PATTERN is a glob on tensor names ('*' matches '.'),\n"
               "                          TYPE a native type (i3/i4/i6/i8 [a], i4n: non-uniform\n"
               "                          levels; _b32/_b64/_b128; scale FP16, or one byte:\n"
               "                          _e8 power of two, _l8 eighths of an octave; e.g.\n"
               "                          i4n_b32_l8) or ggml's (F16, Q8_0, ...); '#' starts\n"
               "                          a comment.  Norms are stored as F16 (a rule naming\n"
               "                          them may say F32), other 1-D tensors as F32\n"
               "      --calib TEXT_FILE   run the model on this text and weight each input\n"
               "                          channel's error by its mean squared activation\n"
               "      --calib-chunks N    at most N chunks of the text (default: 16)\n"
               "      --calib-ctx N       tokens per chunk (default: 128, at most the model's\n"
               "                          context)\n"
               "      --calib-skip LIST   calibration methods to leave out, comma-separated:\n"
               "                          scale (activation-aware channel scaling), gptq\n"
               "                          (rounding with error feedback; small models only)\n"
               "      --prune-ffn FRAC    drop this fraction of each layer's FFN neurons, the\n"
               "                          least important first, in [0, 1) (default: 0)\n"
               "      --prune-heads N     drop N attention heads per layer; with grouped-query\n"
               "                          attention whole KV groups go, so N must be a multiple\n"
               "                          of the group size (default: 0)\n"
               "      --tokenizer FILE    llama2.c input: its tokenizer (default: tokenizer.bin\n"
               "                          beside it)\n"
               "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
               "  -q, --quiet             no per-tensor lines on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error (a malformed policy file,\n"
               "             an input it cannot read, a full disk), 2 usage error.\n",
            MAX_THREADS, default_threads());
}

static volatile sig_atomic_t quantize_interrupted;
static void quantize_on_signal(int sig) {
    (void)sig;
    quantize_interrupted = 1;
}

static bool quantize_report(const struct sp_quantize_tensor_report *r, void *user) {
    const int quiet = *(const int *)user;
    if (quantize_interrupted) return false;
    if (quiet) return true;
    char shape[64], b[32], imp[32] = "";
    int n = snprintf(shape, sizeof shape, "[%" PRId64, r->ne[0]);
    for (int d = 1; d < r->n_dims && n > 0 && (size_t)n < sizeof shape; d++) {
        n += snprintf(shape + n, sizeof shape - (size_t)n, ", %" PRId64, r->ne[d]);
    }
    if (n > 0 && (size_t)n < sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
    if (r->rel_rmse_imp >= 0) snprintf(imp, sizeof imp, "  weighted %.4f", r->rel_rmse_imp);
    fprintf(stderr, "[%3d/%3d] %-28s %-10s %-14s %10s  rmse %.4f%s%s%s\n", r->index + 1, r->count, r->name, r->type,
            shape, human_bytes(r->bytes, b, sizeof b), r->rel_rmse, imp, *r->note ? "  " : "", r->note);
    return true;
}

#define SP_CLI_MIN(a, b) ((a) < (b) ? (a) : (b))

static int cmd_quantize(int argc, char **argv) {
    struct argp a = {.cmd = "quantize", .argc = argc, .argv = argv};
    struct sp_quantize_params p = sp_quantize_default_params();
    int quiet = 0;
    p.n_threads = default_threads();

    for (a.i = 1; a.i < argc; a.i++) {
        const char *arg = argv[a.i];
        if (opt_is(&a, "-h", "--help")) {
            help_quantize(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, NULL, "--policy")) {
            p.policy = opt_value(&a);
        } else if (opt_is(&a, NULL, "--policy-file")) {
            p.policy_file = opt_value(&a);
        } else if (opt_is(&a, NULL, "--calib")) {
            p.calib_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--calib-chunks")) {
            p.calib_chunks = (int32_t)parse_int(&a, opt_value(&a), 1, 1 << 20);
        } else if (opt_is(&a, NULL, "--calib-ctx")) {
            p.calib_ctx = (int32_t)parse_int(&a, opt_value(&a), 2, 1 << 20);
        } else if (opt_is(&a, NULL, "--calib-skip")) {
            const char *v = opt_value(&a);
            char item[32];
            for (const char *s = v; *s;) {
                const size_t len = strcspn(s, ",");
                snprintf(item, sizeof item, "%.*s", (int)SP_CLI_MIN(len, sizeof item - 1), s);
                if (strcmp(item, "scale") == 0) p.calib_skip |= SP_CALIB_SCALE;
                else if (strcmp(item, "gptq") == 0) p.calib_skip |= SP_CALIB_GPTQ;
                else usage_error(a.cmd, "%s: unknown method '%s' (scale, gptq)", a.name, item);
                s += len + (s[len] == ',');
            }
        } else if (opt_is(&a, NULL, "--prune-ffn")) {
            const double v = parse_num(&a, opt_value(&a), 0.0, 1.0, 0);
            if (v >= 1.0) usage_error(a.cmd, "%s: expected a number in [0, 1), got '%s'", a.name, argv[a.i]);
            p.prune_ffn = (float)v;
        } else if (opt_is(&a, NULL, "--prune-heads")) {
            p.prune_heads = (int32_t)parse_int(&a, opt_value(&a), 0, 1 << 20);
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            p.tokenizer_path = opt_value(&a);
        } else if (opt_is(&a, "-t", "--threads")) {
            p.n_threads = (int32_t)parse_int(&a, opt_value(&a), 1, MAX_THREADS);
        } else if (opt_is(&a, "-q", "--quiet")) {
            opt_no_value(&a);
            quiet = 1;
        } else if (opt_is(&a, "-v", "--verbose")) {
            opt_no_value(&a);
            log_verbose = 1;
        } else if (is_option(arg)) {
            unknown_option(&a);
        } else if (!p.input) {
            p.input = arg;
        } else if (!p.output) {
            p.output = arg;
        } else {
            usage_error(a.cmd, "unexpected argument '%s' (one IN and one OUT)", arg);
        }
    }
    if (!p.input || !p.output) usage_error(a.cmd, "IN and OUT are required (see 'sparrow quantize --help')");
    if (p.policy && p.policy_file) usage_error(a.cmd, "--policy and --policy-file exclude each other");
    if (p.policy) {
        bool known = false;
        for (int32_t i = 0; i < sp_quantize_n_policies(); i++) {
            const char *name;
            if (sp_quantize_policy_info(i, &name, NULL) == SP_OK && strcmp(name, p.policy) == 0) known = true;
        }
        if (!known) usage_error(a.cmd, "--policy: unknown policy '%s' (see 'sparrow quantize --help')", p.policy);
    }

    sp_log_set(cli_log, &log_verbose);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = quantize_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    p.on_tensor = quantize_report;
    p.user = &quiet;

    struct sp_quantize_result res;
    sp_status rc = sp_quantize(&p, &res);
    if (rc != SP_OK) {
        if (quantize_interrupted) {
            fprintf(stderr, "sparrow: quantize: interrupted; '%s' was not written\n", p.output);
            return EXIT_RUNTIME;
        }
        return lib_error("quantizing the model", rc);
    }
    char b1[32], b2[32];
    printf("output        %s\n", p.output);
    printf("policy        %s\n", res.policy);
    printf("bpw           %.3f\n", res.bpw);
    printf("params        %" PRIu64 "\n", res.n_params);
    printf("tensor_bytes  %" PRIu64 " (%s)\n", res.tensor_bytes, human_bytes(res.tensor_bytes, b1, sizeof b1));
    printf("file_size     %" PRIu64 " (%s)\n", res.file_size, human_bytes(res.file_size, b2, sizeof b2));
    printf("native_types  %s\n", res.native ? "yes (sparrow.requires = native-types-1)" : "no");
    printf("calib_tokens  %d (channel scaling on %d inputs, error feedback on %d tensors)\n",
           (int)res.calib_tokens, (int)res.n_scaled, (int)res.n_gptq);
    printf("n_ff          %d\n", (int)res.n_ff);
    printf("heads         %d (kv %d)\n", (int)res.n_heads, (int)res.n_kv_heads);
    printf("seconds       %.2f\n", res.seconds);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: quantize: cannot write to stdout: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    return EXIT_OK;
}

/* ---- main ------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    void (*help)(FILE *f);
} commands[] = {
    {"run", cmd_run, help_run},
    {"tokenize", cmd_tokenize, help_tokenize},
    {"inspect", cmd_inspect, help_inspect},
    {"synth", cmd_synth, help_synth},
    {"bench", cmd_bench, help_bench},
    {"plan", cmd_plan, help_plan},
    {"eval", cmd_eval, help_eval},
    {"quantize", cmd_quantize, help_quantize},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "sparrow: missing command (see 'sparrow --help')\n");
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        help_main(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("sparrow %s\n", SPARROW_CLI_VERSION);
        return EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc == 2) {
            help_main(stdout);
            return EXIT_OK;
        }
        if (argc > 3) usage_error("help", "unexpected argument '%s'", argv[3]);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
            if (strcmp(argv[2], commands[i].name) == 0) {
                commands[i].help(stdout);
                return EXIT_OK;
            }
        }
        usage_error("help", "unknown command '%s' (see 'sparrow --help')", argv[2]);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    }
    if (cmd[0] == '-') usage_error(NULL, "unknown option '%s' (see 'sparrow --help')", cmd);
    usage_error(NULL, "unknown command '%s' (see 'sparrow --help')", cmd);
}
