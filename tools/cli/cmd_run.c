/*
 * cmd_run.c -- `sparrow run`: generate text from a prompt.
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

void help_run(FILE *f) {
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
            "  -c, --ctx-size N        context length in tokens, 0 = the model's trained\n"
            "                          context (default: 0); more is accepted with a warning\n"
            "  -b, --batch N           tokens per forward pass when feeding the prompt,\n"
            "                          1..%d; 0 = the library's default (128)\n"
            CLI_HELP_CACHE_TYPES
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
            DEF_REPEAT_LAST_N, MAX_THREADS, default_threads(), MAX_BATCH);
}

/* ---- run ------------------------------------------------------------------------ */

int cmd_run(int argc, char **argv) {
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
        if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-h", "--help")) {
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
            /* -t, -c, -b, -ctk, -ctv, --kv-type */
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
