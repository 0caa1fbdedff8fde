/*
 * cmd_quantize.c -- `sparrow quantize`: Sparrow's mixed-precision files.
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

/* ---- quantize --------------------------------------------------------------------- */

void help_quantize(FILE *f) {
    fprintf(f, "usage: sparrow quantize IN OUT [--policy NAME | --policy-file F] [--calib TEXT_FILE]\n"
               "                       [--prune-ffn FRACTION] [--prune-heads N] [--merge-kv-heads G]\n"
               "                       [OPTIONS]\n"
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
               "      --merge-kv-heads G  fold the KV heads (those left after pruning) into G:\n"
               "                          each of G contiguous groups of heads becomes one\n"
               "                          whose K and V projections are the mean of the\n"
               "                          group's; G must divide the KV heads; shrinks the KV\n"
               "                          cache by their count / G (no retraining: the model\n"
               "                          changes; --policy f32 measures the fold alone)\n"
               "      --layout L          none: the types as chosen (default); auto / resident:\n"
               "                          matrices stored in resident layouts, to be mapped and\n"
               "                          used in place ('sparrow convert --help')\n"
               "      --tokenizer FILE    llama2.c input: its tokenizer (default: tokenizer.bin\n"
               "                          beside it); a GGUF input has its own: refused\n"
               "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
               "  -q, --quiet             no progress or per-tensor lines on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error (a malformed policy file,\n"
               "             an input it cannot read, a full disk), 2 usage error.\n",
            MAX_THREADS, default_threads());
}

struct quantize_ui {
    int quiet, tty;
    bool line_open; /* a '\r' progress line waits for its end */
    double last;    /* when the last progress line was printed */
};

/* Calibration and scale search before the first tensor: on a terminal one
 * line redrawn per step, otherwise a line a second at most (and the last). */
static bool quantize_progress(const char *stage, int32_t done, int32_t total, void *user) {
    struct quantize_ui *ui = user;
    if (cli_interrupted) return false;
    if (ui->quiet) return true;
    const double t = now_s();
    if (ui->tty) {
        fprintf(stderr, "\r%s: %d of %d %s  ", stage, (int)done, (int)total,
                strcmp(stage, "calibrating") == 0 ? "chunks of the text" : "layers");
        ui->line_open = done < total;
        if (done == total) fputc('\n', stderr);
    } else if (done == total || t - ui->last >= 1.0) {
        fprintf(stderr, "%s: %d of %d %s\n", stage, (int)done, (int)total,
                strcmp(stage, "calibrating") == 0 ? "chunks of the text" : "layers");
        ui->last = t;
    }
    return true;
}

static bool quantize_report(const struct sp_quantize_tensor_report *r, void *user) {
    struct quantize_ui *ui = user;
    if (cli_interrupted) return false;
    if (ui->quiet) return true;
    if (ui->line_open) fputc('\n', stderr);
    ui->line_open = false;
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

int cmd_quantize(int argc, char **argv) {
    struct argp a = {.cmd = "quantize", .argc = argc, .argv = argv};
    struct sp_quantize_params p = sp_quantize_default_params();
    struct quantize_ui ui = {.tty = isatty(STDERR_FILENO), .last = now_s()};
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
        } else if (opt_is(&a, NULL, "--merge-kv-heads")) {
            p.merge_kv_heads = (int32_t)parse_int(&a, opt_value(&a), 1, 1 << 20);
        } else if (opt_is(&a, NULL, "--layout")) {
            p.layout = parse_layout(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            p.tokenizer_path = opt_value(&a);
        } else if (opt_is(&a, "-t", "--threads")) {
            p.n_threads = (int32_t)parse_int(&a, opt_value(&a), 1, MAX_THREADS);
        } else if (!quiet_verbose_opt(&a, &ui.quiet)) {
            in_out_arg(&a, arg, &p.input, &p.output);
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
    catch_interrupts();
    p.on_tensor = quantize_report;
    p.on_progress = quantize_progress;
    p.user = &ui;

    struct sp_quantize_result res;
    sp_status rc = sp_quantize(&p, &res);
    if (rc != SP_OK) {
        if (cli_interrupted) {
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

