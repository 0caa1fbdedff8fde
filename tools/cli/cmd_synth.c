/*
 * cmd_synth.c -- `sparrow synth`: random-weight models in real shapes.
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

/* ---- synth ------------------------------------------------------------------------ */

void help_synth(FILE *f) {
    fprintf(f, "usage: sparrow synth --shape NAME (--type TYPE | --policy NAME | --policy-file F) -o FILE [OPTIONS]\n"
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
               "                          ffn_down in half the layers); or instead:\n"
               "      --policy NAME       a quantize policy (sparrow quantize --help: q4, moe3, ...):\n"
               "                          Sparrow's native types written directly, each tensor\n"
               "                          quantized as 'sparrow quantize' does (no calibration)\n"
               "      --policy-file F     a policy file (docs/QUANT.md)\n"
               "  -o, --output FILE       the file to write; required\n"
               "      --seed S            seed, 0..2^64-1; the same shape, type (or policy) and seed give\n"
               "                          the same bytes (default: 0)\n"
               "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here);\n"
               "                          the output does not depend on it\n"
               "      --list              list the shapes with their sizes for each type and for\n"
               "                          the policies q4 and moe3, then exit\n"
               "  -q, --quiet             no progress on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error (e.g. a full disk),\n"
               "             2 usage error (including an unknown shape or type).\n",
            MAX_THREADS, default_threads());
}

/* Policies --list shows a column for, beside the file types. */
static const char *const list_policies[] = {"q4", "moe3"};

static int synth_list(void) {
    char b[64];
    const int32_t nt = sp_synth_n_types();
    printf("%-14s %-9s %6s %6s %7s %6s %7s %8s %7s %-9s", "shape", "arch", "layers", "embd", "heads", "ffn",
           "vocab", "ctx", "experts", "params");
    for (int32_t k = 0; k < nt; k++) printf(" %10s", sp_synth_type_name(k));
    for (size_t k = 0; k < sizeof list_policies / sizeof *list_policies; k++) printf(" %10s", list_policies[k]);
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
        for (size_t k = 0; k < sizeof list_policies / sizeof *list_policies; k++) {
            struct sp_synth_params q = sp_synth_default_params();
            uint64_t bytes = 0;
            q.shape = si.name;
            q.policy = list_policies[k];
            (void)sp_synth_params_size(&q, NULL, &bytes);
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

/* Progress bar state: on a terminal the line is redrawn with '\r' a few
 * times a second; otherwise a line is printed every 10%. */
struct synth_progress {
    struct progress bar;
};

static bool synth_progress_cb(uint64_t done, uint64_t total, void *user) {
    struct synth_progress *pr = user;
    if (cli_interrupted) return false;
    progress_draw(&pr->bar, done, total);
    return true;
}

int cmd_synth(int argc, char **argv) {
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
        } else if (opt_is(&a, NULL, "--policy")) {
            p.policy = opt_value(&a);
        } else if (opt_is(&a, NULL, "--policy-file")) {
            p.policy_file = opt_value(&a);
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
    const int n_sel = (p.type != NULL) + (p.policy != NULL) + (p.policy_file != NULL);
    if (n_sel == 0) {
        usage_error(a.cmd, "--type TYPE (f16, bf16, q8_0, q4_0, q4_k_m), --policy NAME or --policy-file F is required");
    }
    if (n_sel > 1) usage_error(a.cmd, "--type, --policy and --policy-file exclude each other");
    if (!p.path || !*p.path) usage_error(a.cmd, "-o FILE is required");
    bool shape_ok = false;
    for (int32_t i = 0; p.shape && i < sp_synth_n_shapes(); i++) {
        struct sp_synth_shape_info si;
        if (sp_synth_get_shape(i, &si) == SP_OK && strcmp(si.name, p.shape) == 0) shape_ok = true;
    }
    if (!shape_ok) usage_error(a.cmd, "--shape: unknown shape '%s' (see 'sparrow synth --list')", p.shape);
    if (p.policy) {
        bool known = false;
        for (int32_t i = 0; i < sp_quantize_n_policies(); i++) {
            const char *name = NULL;
            if (sp_quantize_policy_info(i, &name, NULL) == SP_OK && strcmp(name, p.policy) == 0) known = true;
        }
        if (!known) usage_error(a.cmd, "--policy: unknown policy '%s' (see 'sparrow quantize --help')", p.policy);
    }
    uint64_t n_params = 0, bytes = 0;
    if (p.type && sp_synth_size(p.shape, p.type, &n_params, &bytes) != SP_OK) {
        usage_error(a.cmd, "--type: unknown type '%s' (f16, bf16, q8_0, q4_0, q4_k_m)", p.type);
    }
    if (!p.type) {
        const sp_status st = sp_synth_params_size(&p, &n_params, &bytes);
        if (st != SP_OK) return lib_error("reading the policy", st); /* a policy file: unreadable or malformed */
    }
    const char *what = p.type ? p.type : p.policy ? p.policy : p.policy_file;

    sp_log_set(cli_log, &log_verbose);
    catch_interrupts();

    struct synth_progress pr;
    progress_init(&pr.bar, quiet);
    char b1[64], b2[64];
    if (!quiet) {
        fprintf(stderr, "sparrow: synth %s %s seed %" PRIu64 ": %s parameters, %s of tensor data -> %s\n", p.shape,
                what, p.seed, human_count(n_params, b1, sizeof b1), human_bytes(bytes, b2, sizeof b2), p.path);
    }
    p.progress = synth_progress_cb;
    p.progress_user = &pr;
    sp_status rc = sp_synth(&p);
    progress_done(&pr.bar);
    if (rc != SP_OK) {
        if (cli_interrupted) {
            fprintf(stderr, "sparrow: synth: interrupted; '%s' was not written\n", p.path);
            return EXIT_RUNTIME;
        }
        return lib_error("writing the model", rc);
    }
    const double el = now_s() - pr.bar.t0;
    if (!quiet) {
        fprintf(stderr, "sparrow: wrote %s (%s) in %.1f s, %.1f MB/s\n", p.path, human_bytes(bytes, b1, sizeof b1),
                el, el > 0 ? (double)bytes / 1e6 / el : 0.0);
    }
    return EXIT_OK;
}
