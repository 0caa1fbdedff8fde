/*
 * cmd_plan.c -- `sparrow plan`: weight placement under a memory budget.
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

/* ---- plan ----------------------------------------------------------------------- */

void help_plan(FILE *f) {
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
            "                          model's trained context (default: 0)\n"
            "  -b, --batch N           prompt batch of that session (default: 128)\n"
            "  -t, --threads N         accepted for symmetry with run; does not change the plan\n"
            CLI_HELP_CACHE_TYPES
            "      --json              print one JSON object instead of the table\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static const char *const wclass_names[SP_WCLASS_COUNT] = {"small (norms, routers)", "dense (attention, FFN, output)",
                                                          "routed experts", "input embedding"};
static const char *const wclass_keys[SP_WCLASS_COUNT] = {"small", "dense", "expert", "embed"};

int cmd_plan(int argc, char **argv) {
    struct argp a = {.cmd = "plan", .argc = argc, .argv = argv};
    const char *model_path = NULL;
    uint64_t mem_budget = 0;
    bool json = false;
    struct sp_session_params sp = sp_session_default_params();
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-h", "--help")) {
            help_plan(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, NULL, "--mem-budget")) {
            mem_budget = parse_size(&a, opt_value(&a));
        } else if (session_opt(&a, &sp)) {
            /* -t, -c, -b, -ctk, -ctv, --kv-type */
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
