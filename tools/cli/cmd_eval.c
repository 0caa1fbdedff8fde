/*
 * cmd_eval.c -- `sparrow eval`: perplexity, KL divergence and top-1 agreement.
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

/* ---- eval ------------------------------------------------------------------------- */

#define DEF_EVAL_SEED 1234     /* --gen's sampler seed */
#define DEF_EVAL_CTX_CAP 512   /* -c 0: the model's context length, capped here */
#define MAX_EVAL_CTX 1048576

void help_eval(FILE *f) {
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
            "  -ctk, --cache-type-k T  MODEL's KV cache type of keys: f32, f16, q8_0, q4_0,\n"
            "                          q4h (default: f32)\n"
            "  -ctv, --cache-type-v T  MODEL's KV cache type of values (default: f32)\n"
            "      --ref-ctk T         the reference's KV cache types (default: f32), so that\n"
            "      --ref-ctv T         -m M --ref M -ctk q4_0 -ctv q4_0 measures what the\n"
            "                          cache alone costs\n"
            "      --list-cache-types  print each cache type and its bits per value, then exit\n"
            "      --stream            instead of chunks, stream the whole text through one\n"
            "                          context of CTX tokens that shifts when full (each\n"
            "                          prediction sees the last tokens that fit), scoring\n"
            "                          every position from CTX/2 on\n"
            "      --keep N            --stream: the first N tokens never leave (attention\n"
            "                          sinks; llama.cpp's --keep) (default: 0)\n"
            "      --discard N         --stream: tokens one shift drops (default: 1, a\n"
            "                          sliding window)\n"
            "      --json              print one JSON object on stdout instead of the summary\n"
            "  -t, --threads N         threads, 1..%d (default: the online CPUs, %d here)\n"
            "      --tokenizer FILE    llama2.c models: the tokenizer (default: tokenizer.bin\n"
            "                          beside the model)\n"
            "  -v, --verbose           print the library's log messages on stderr\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "JSON keys: model, ref, text, gen, seed, ctx, n_tokens, n_chunks, n_scored, ppl,\n"
            "ppl_err, ref_ppl, ref_ppl_err, kl_mean, kl_mean_err, kl_p99, kl_max, top1_agree,\n"
            "bpw, n_params, tensor_bytes, file_size, cache_type_k, cache_type_v,\n"
            "ref_cache_type_k, ref_cache_type_v, kv_bits_per_value (MODEL's cache: bytes\n"
            "stored x 8 / values stored, with CTX tokens held), stream, keep; null where\n"
            "they do not apply.\n"
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


static void eval_print_json(const char *model_path, const char *ref_path, const char *text_path, long long gen,
                            uint64_t seed, const struct sp_model_info *mi, double bpw, const struct sp_eval_result *r,
                            const struct sp_eval_params *ep) {
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
    json_key_str("cache_type_k", sp_kv_type_name(ep->kv_type_k));
    json_key_str("cache_type_v", sp_kv_type_name(ep->kv_type_v));
    json_key_str("ref_cache_type_k", ref_path ? sp_kv_type_name(ep->ref_kv_type_k) : NULL);
    json_key_str("ref_cache_type_v", ref_path ? sp_kv_type_name(ep->ref_kv_type_v) : NULL);
    json_key_num("kv_bits_per_value", r->kv_bits_per_value, 0);
    printf(", \"stream\": %s", ep->stream ? "true" : "false");
    json_key_num("keep", ep->stream ? ep->n_keep : NAN, 1);
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
    if (isfinite(r->kv_bits_per_value)) printf("kv cache    %.3f bits per value as stored\n", r->kv_bits_per_value);
    if (!ref_path) return;
    printf("reference   %s\n", ref_path);
    printf("ref_ppl     %.4f +/- %.5f\n", r->ref_ppl, r->ref_ppl_err);
    printf("kl_mean     %.6f +/- %.6f nats\n", r->kl_mean, r->kl_mean_err);
    printf("kl_p99      %.6f nats\n", r->kl_p99);
    printf("kl_max      %.6f nats\n", r->kl_max);
    printf("top1_agree  %.4f\n", r->top1_agree);
}

int cmd_eval(int argc, char **argv) {
    struct argp a = {.cmd = "eval", .argc = argc, .argv = argv};
    const char *model_path = NULL, *ref_path = NULL, *text_path = NULL, *tokenizer = NULL;
    long long gen = 0, ctx = 0;
    uint64_t seed = DEF_EVAL_SEED;
    bool json = false, have_seed = false, have_keep = false;
    struct sp_eval_params ep = sp_eval_default_params();
    ep.n_threads = default_threads();

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-h", "--help")) {
            help_eval(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-ctk", "--cache-type-k")) {
            ep.kv_type_k = parse_cache_type(&a, opt_value(&a));
        } else if (opt_is(&a, "-ctv", "--cache-type-v")) {
            ep.kv_type_v = parse_cache_type(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--ref-ctk")) {
            ep.ref_kv_type_k = parse_cache_type(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--ref-ctv")) {
            ep.ref_kv_type_v = parse_cache_type(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--stream")) {
            opt_no_value(&a);
            ep.stream = true;
        } else if (opt_is(&a, NULL, "--keep")) {
            ep.n_keep = (int32_t)parse_int(&a, opt_value(&a), 0, MAX_EVAL_CTX);
            have_keep = true;
        } else if (opt_is(&a, NULL, "--discard")) {
            ep.n_discard = (int32_t)parse_int(&a, opt_value(&a), 1, MAX_EVAL_CTX);
            have_keep = true;
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
    if (have_keep && !ep.stream) usage_error(a.cmd, "--keep and --discard apply to --stream only");
    if (ep.stream && ctx > 0 && ep.n_keep >= ctx) usage_error(a.cmd, "--keep %d leaves no room in a context of %lld", (int)ep.n_keep, ctx);

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
    if (json) eval_print_json(model_path, ref_path, text_path, gen, seed, &mi, bpw, &r, &ep);
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

