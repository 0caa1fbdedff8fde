/*
 * cmd_inspect.c -- `sparrow inspect`: describe a model file without reading its weights.
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

void help_inspect(FILE *f) {
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

int cmd_inspect(int argc, char **argv) {
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
