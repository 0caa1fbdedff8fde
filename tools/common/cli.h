/*
 * cli.h -- helpers shared by the commands of the `sparrow` tool (tools/cli/)
 * and its server (tools/server/): exit codes, defaults the help texts print,
 * strict option parsing ("-x VALUE", "--long VALUE", "--long=VALUE"; values
 * parsed whole and range-checked), errors, files, tokens, JSON.  A thin
 * client layer over include/sparrow.h; only tools may exit(), and only here
 * (usage_error) or in a command's main.
 */
#ifndef SP_TOOLS_CLI_H
#define SP_TOOLS_CLI_H

#include "sparrow.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define SPARROW_CLI_VERSION SPARROW_VERSION

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 /* 128 + SIGINT, as shells report */ };

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

/* ---- errors and logging ---------------------------------------------------- */

/* "sparrow: CMD: message" on stderr, then exit(EXIT_USAGE). */
void usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* One line for a failed library call (sp_last_error(), or what + the status
 * name); returns EXIT_RUNTIME. */
int lib_error(const char *what, sp_status st);
/* The log callback every command installs: warnings, or everything with -v
 * (user points at log_verbose). */
void cli_log(enum sp_log_level level, const char *msg, void *user);
extern int log_verbose;

/* ---- option parsing ---------------------------------------------------------- */

struct argp {
    const char *cmd;
    int argc;
    char **argv;
    int i;               /* index of the current argument */
    const char *inl;     /* the VALUE of "--long=VALUE", else NULL */
    char name[64];       /* the option as written, without "=VALUE" */
};

/* Does argv[i] name this option?  Sets name/inl. */
int opt_is(struct argp *a, const char *short_name, const char *long_name);
void opt_no_value(struct argp *a);  /* reject "--flag=VALUE" */
const char *opt_value(struct argp *a);
long long parse_int(struct argp *a, const char *s, long long lo, long long hi);
uint64_t parse_u64(struct argp *a, const char *s);
/* A memory size with an optional binary unit (K, M, G, T; KiB...): > 0;
 * without a unit, a whole number of bytes, at least 1 MiB (less is taken
 * for a forgotten unit and refused, as 0 is, with a hint). */
uint64_t parse_size(struct argp *a, const char *s);
/* A finite number in [lo, hi], or in (lo, hi] when lo_open. */
double parse_num(struct argp *a, const char *s, double lo, double hi, int lo_open);
void unknown_option(struct argp *a) __attribute__((noreturn));
int is_option(const char *arg);
/* A command's positional IN and OUT (quantize, convert): arg fills *in, then
 * *out; an option or a third argument is a usage error (exits). */
void in_out_arg(struct argp *a, const char *arg, const char **in, const char **out);
/* -q / --quiet (sets *quiet) and -v / --verbose (log_verbose): 1 when argv[i] was one. */
int quiet_verbose_opt(struct argp *a, int *quiet);
/* Ctrl-C and SIGTERM set cli_interrupted instead of ending the process, for
 * commands whose library call polls it (a progress callback) and cleans up. */
extern volatile sig_atomic_t cli_interrupted;
void catch_interrupts(void);
/* The session options run, bench, plan share: -t, -c, -b, -ctk, -ctv,
 * --kv-type (both).
 * Returns 1 when argv[i] was one of them. */
int session_opt(struct argp *a, struct sp_session_params *sp);
/* The generation options run and chat share: -n, the sampling flags
 * (--temp, --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty,
 * --frequency-penalty, --repeat-last-n, --seed), session_opt's, --mem-budget, --context-shift, --keep and
 * --prompt-cache FILE.  gen_opts_init sets the defaults the help prints;
 * gen_opt returns 1 when argv[i] was one of them; gen_opts_seed draws a
 * seed from the clock when --seed was not given. */
/* The governor's options run, chat, bench and serve share (docs/GOVERNOR.md):
 * --governor (the switch; the others need it), --target-ms MS, --target-ttft S,
 * --thermal-file F, --battery-file F, --trace FILE, --governor-policy FILE.
 * gov_opt returns 1 when argv[i] was one of them; gov_opts_check refuses the
 * others without --governor; gov_create makes the governor when it is on
 * (*out NULL otherwise; a library error is printed and EXIT_RUNTIME
 * returned). */
struct gov_opts {
    bool on;
    double target_ms, target_ttft_s;
    const char *thermal_file, *battery_file, *trace, *policy;
    char first_without[64];    /* an option given (before --governor was known), "" none */
};
int gov_opt(struct argp *a, struct gov_opts *o);
void gov_opts_check(const char *cmd, const struct gov_opts *o);
int gov_create(const struct gov_opts *o, struct sp_governor **out);
/* One "sparrow: governor: ..." line of its counters on stderr. */
void gov_report(const struct sp_governor *g);
/* ", \"governor\": {...}" (its counters) on stdout; null when off. */
void gov_json(const struct sp_governor *g);
#define CLI_HELP_GOVERNOR                                                                                              \
    "      --governor          hold a latency target through heat, a low battery and\n"                                 \
    "                          a busy device: threads, pacing, MoE experts and the\n"                                   \
    "                          prompt chunk follow the sensors (docs/GOVERNOR.md);\n"                                   \
    "                          off by default.  The options below need it:\n"                                           \
    "      --target-ms MS      per-token latency to hold (ms)\n"                                                        \
    "      --target-ttft S     time to first token to hold (s)\n"                                                       \
    "      --thermal-file F    read the temperature (millidegrees C) from F instead\n"                                  \
    "                          of the hottest /sys/class/thermal zone\n"                                                \
    "      --battery-file F    read the battery from F (line 1 percent, line 2 the\n"                                   \
    "                          status: Charging, Discharging, Full, Not charging;\n"                                    \
    "                          none = discharging) instead of /sys/class/power_supply\n"                                \
    "      --trace FILE        write each decision as a JSON line to FILE\n"                                            \
    "      --governor-policy F override the state table from F (key = value lines)\n"

struct gen_opts {
    struct gov_opts gov;
    struct sp_session_params sp;
    long long n_predict;
    bool have_seed;
    uint64_t mem_budget;
    const char *prompt_cache;
};
void gen_opts_init(struct gen_opts *g);
int gen_opt(struct argp *a, struct gen_opts *g);
void gen_opts_seed(struct gen_opts *g);
/* --prompt-cache: load FILE (if it exists) into the empty session s and keep
 * the longest prefix of toks[0..n) it holds, at most n - 1 tokens (the last
 * one is decoded again, for its logits); the sampler is reseeded with seed.
 * Returns the tokens kept, or -1 when FILE is absent or refused (a warning
 * names it then; the session stays empty). */
int32_t prompt_cache_reuse(const char *cmd, struct sp_session *s, const char *file, const int32_t *toks, int32_t n,
                           uint64_t seed);
/* The help lines of gen_opt's options from --temp to --keep (-n,
 * --prompt-cache and --mem-budget are worded by each command). */
void help_gen_opts(FILE *f);
/* The help lines of --mem-budget as run and chat have it. */
#define CLI_HELP_MEM_BUDGET                                                                                            \
    "      --mem-budget SIZE   keep at most SIZE resident (weights, KV cache, scratch);\n"                              \
    "                          binary units: 7.5G = 7.5 GiB, 512M.  What does not fit\n"                                \
    "                          streams from storage (see 'sparrow plan').  Default:\n"                                  \
    "                          no budget, every weight resident\n"

/* The end of every command's option chain: -v, else a usage error. */
void last_opt(struct argp *a, const char *hint);

/* The help lines of the cache options session_opt parses (defaults: the
 * library's, f16). */
#define CLI_HELP_CACHE_TYPES                                                                                           \
    "  -ctk, --cache-type-k T  KV cache type of keys: f32, f16, q8_0, q4_0 or q4h\n"                                 \
    "                          (Sparrow's 4.5-bit type; see --list-cache-types)\n"                                   \
    "                          (default: f16)\n"                                                                     \
    "  -ctv, --cache-type-v T  KV cache type of values, as -ctk (default: f16)\n"                                    \
    "      --kv-type T         both at once\n"                                                                       \
    "      --list-cache-types  print each cache type and its bits per value, then exit\n"

/* The help lines of --tokenizer (run, bench, plan, eval, inspect, tokenize). */
#define CLI_HELP_TOKENIZER                                                                                             \
    "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"                               \
    "                          beside the model); a GGUF file has its own: refused\n"

/* ---- utilities ------------------------------------------------------------------ */

int default_threads(void);
const char *kv_type_name(enum sp_kv_type t);
/* --list-cache-types: "NAME BITS" per line on stdout; returns an exit status. */
int list_cache_types(void);
/* A cache type name, else a usage error. */
enum sp_kv_type parse_cache_type(struct argp *a, const char *v);
double now_s(void);
/* stdout and stderr are the same file (a terminal, `>f 2>&1`, one pipe). */
bool stdout_is_stderr(void);
/* Read a whole file ('-' = stdin); 0, or -1 with a message printed. */
int read_all(const char *cmd, const char *path, char **out, size_t *len);
/* Tokenize into a malloc'd array. */
sp_status tokenize_all(const struct sp_model *m, const char *text, size_t len, unsigned flags, int32_t **out,
                       int32_t *n_out);

/* A growable byte buffer for token pieces. */
struct piece_buf {
    char *p;
    size_t cap;
};
sp_status piece_of(const struct sp_model *m, int32_t tok, struct piece_buf *b, size_t *n);
/* Load with a memory budget planned for one session like *env (NULL: the
 * library's defaults): its context, batch, threads and cache types. */
sp_status load_model(const char *path, const char *tokenizer, bool vocab_only, uint64_t mem_budget,
                     const struct sp_session_params *env, struct sp_model **out);
/* The envelope of model params from the session's params. */
void envelope_from(struct sp_model_params *mp, const struct sp_session_params *sp);
/* "1.13 MiB", "7.24 B" into buf. */
const char *human_bytes(uint64_t n, char *buf, size_t cap);
const char *human_count(uint64_t n, char *buf, size_t cap);

/* ---- a progress bar on stderr ---------------------------------------------------
 * "[####....]  42.0%  1234.5 / 3000.0 MB  250.0 MB/s  ETA 7 s": redrawn in
 * place at most 5 times a second on a terminal, one line per tenth otherwise;
 * nothing when quiet.  progress_done ends a redrawn line. */
struct progress {
    double t0, last;
    int tty, last_decile, quiet, drawn;
};
void progress_init(struct progress *p, int quiet);
void progress_draw(struct progress *p, uint64_t done, uint64_t total);
void progress_done(struct progress *p);

/* ---- JSON output on stdout ---------------------------------------------------- */

void json_string(const char *s);
/* integers as integers, others %.6g; non-finite as null */
void json_number(double v, int integer);
/* ", \"key\": value" */
void json_key_str(const char *key, const char *v);
void json_key_num(const char *key, double v, int integer);

#endif /* SP_TOOLS_CLI_H */
