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
            "(a message on stderr; exit status 0) unless --context-shift makes room.  The prompt is preceded by BOS when the\n"
            "vocabulary asks for it; an empty prompt is BOS alone.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file (GGUF or llama2.c .bin); required\n"
            "  -p, --prompt TEXT       prompt text (default: empty)\n"
            "  -f, --file FILE         read the prompt from FILE ('-' = stdin); excludes -p\n"
            "  -n, --n-predict N       tokens to generate, -1 = until end of generation or\n"
            "                          a full context (default: %d)\n",
            DEF_N_PREDICT);
    help_gen_opts(f);
    fputs("      --prompt-cache FILE reuse the part of the prompt FILE holds (a session\n"
          "                          saved by an earlier run with the same model and cache\n"
          "                          types), then save the session after the prompt to FILE\n"
          "      --prompt-cache-ro   use --prompt-cache's file but do not update it\n"
          CLI_HELP_MEM_BUDGET
          CLI_HELP_TOKENIZER
          "  -v, --verbose           print the library's log messages on stderr\n"
          "  -h, --help              print this help and exit\n"
          "\n"
          "Sampling order: repetition penalty, then greedy if T = 0, else temperature,\n"
          "top-k, top-p, min-p, and a draw from the seeded RNG.  The same model, prompt,\n"
          "options and seed give the same output.\n"
          "\n"
          "Ctrl-C stops the generation after the current token: the line is ended, the\n"
          "timings printed, and the exit status is 130 (a second Ctrl-C kills at once).\n"
          "\n"
          "exit status: 0 success (also when the context fills up), 1 runtime or library\n"
          "error (e.g. a missing file, a prompt longer than the context), 2 usage error,\n"
          "130 interrupted (Ctrl-C).\n",
          f);
}

/* ---- run ------------------------------------------------------------------------ */

/* Ctrl-C stops the generation between tokens (or the prompt between batches):
 * the line is ended, the summary printed, and the exit status is 130 (as a
 * shell reports a process SIGINT killed).  A second Ctrl-C kills at once. */
static volatile sig_atomic_t run_interrupted;
static void run_on_sigint(int sig) {
    run_interrupted = 1;
    signal(sig, SIG_DFL);
}
static bool run_abort(void *user) {
    (void)user;
    return run_interrupted != 0;
}

/* stdout gets each token's own bytes (the help promises exactly those, so
 * not sp_generate's UTF-8-repaired text); a write error stops the loop. */
struct run_out {
    struct piece_buf pb;
    const struct sp_model *model;
    char last; /* the last byte written to stdout */
    int failed;
};
static bool run_token(const char *text, size_t n, int32_t tok, void *user) {
    struct run_out *o = user;
    size_t len = 0;
    (void)text;
    (void)n;
    if (tok < 0) return true;
    sp_status rc = piece_of(o->model, tok, &o->pb, &len);
    if (rc != SP_OK) {
        lib_error("rendering a token", rc);
        o->failed = 1;
        return false;
    }
    if ((len && fwrite(o->pb.p, 1, len, stdout) != len) || fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: run: cannot write to stdout: %s\n", strerror(errno));
        o->failed = 1;
        return false;
    }
    if (len) o->last = o->pb.p[len - 1];
    return !run_interrupted;
}

int cmd_run(int argc, char **argv) {
    struct argp a = {.cmd = "run", .argc = argc, .argv = argv};
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *tokenizer = NULL;
    struct gen_opts g;
    gen_opts_init(&g);
    bool prompt_cache_ro = false;

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
        } else if (gen_opt(&a, &g)) {
            /* -n, sampling, -t -c -b -ctk -ctv, --mem-budget, --context-shift, --keep, --prompt-cache */
        } else if (opt_is(&a, NULL, "--prompt-cache-ro")) {
            opt_no_value(&a);
            prompt_cache_ro = true;
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else {
            last_opt(&a, "the prompt goes after -p");
        }
    }
    struct sp_session_params sp = g.sp;
    const long long n_predict = g.n_predict;
    const uint64_t mem_budget = g.mem_budget;
    const char *prompt_cache = g.prompt_cache;
    gov_opts_check(a.cmd, &g.gov);
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow run --help')");
    if (prompt && prompt_file) usage_error(a.cmd, "-p and -f exclude each other");

    int ret = EXIT_RUNTIME;
    sp_status rc;
    struct sp_model *model = NULL;
    struct sp_session *sess = NULL;
    struct sp_governor *gov = NULL;
    char *file_text = NULL;
    int32_t *toks = NULL, n_toks = 0;
    struct run_out ro = {{NULL, 0}, NULL, '\n', 0};
    size_t prompt_len = 0;

    if (prompt_file) {
        if (read_all(a.cmd, prompt_file, &file_text, &prompt_len) != 0) goto done;
        prompt = file_text;
    } else if (prompt) {
        prompt_len = strlen(prompt);
    } else {
        prompt = "";
    }
    gen_opts_seed(&g);
    sp.seed = g.sp.seed;

    sp_log_set(cli_log, &log_verbose);
    const double t_load0 = now_s();
    rc = load_model(model_path, tokenizer, false, mem_budget, &sp, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    ro.model = model;
    rc = sp_session_init(model, &sp, &sess);
    if (rc != SP_OK) {
        ret = lib_error("creating the session", rc);
        goto done;
    }
    if ((ret = gov_create(&g.gov, &gov)) != EXIT_OK) goto done;
    ret = EXIT_RUNTIME;
    if (gov && (rc = sp_session_set_governor(sess, gov)) != SP_OK) {
        ret = lib_error("attaching the governor", rc);
        goto done;
    }
    const double t_load = now_s() - t_load0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = run_on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sp_session_set_abort(sess, run_abort, NULL);

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

    /* --prompt-cache: keep the longest prefix of the prompt the file holds
     * (at least the last prompt token is decoded again, for its logits) */
    int32_t reuse = prompt_cache_reuse(a.cmd, sess, prompt_cache, toks, n_toks, sp.seed);
    if (reuse >= 0)
        fprintf(stderr, "sparrow: prompt cache %s: %d of %d prompt tokens reused\n", prompt_cache, (int)reuse,
                (int)n_toks);
    else
        reuse = 0;
    enum { STOP_N, STOP_EOG, STOP_CTX, STOP_INT } stop = STOP_N;
    /* the prompt alone first, so that --prompt-cache saves the session after it */
    struct sp_generate_params gp = sp_generate_default_params();
    struct sp_generate_result pr, gr;
    memset(&gr, 0, sizeof gr);
    gp.n_predict = 0;
    rc = sp_generate(sess, toks + reuse, n_toks - reuse, &gp, NULL, NULL, &pr);
    if (rc != SP_OK) {
        ret = lib_error("decoding the prompt", rc);
        goto done;
    }
    if (pr.stop == SP_STOP_ABORTED) stop = STOP_INT;
    const double t_prompt = pr.t_prompt_s;
    if (stop != STOP_INT && prompt_cache && !prompt_cache_ro && (rc = sp_session_save(sess, prompt_cache)) != SP_OK)
        fprintf(stderr, "sparrow: run: warning: cannot save the prompt cache: %s\n", sp_last_error());

    if (stop != STOP_INT && n_predict != 0) {
        gp.n_predict = (int32_t)n_predict;
        gp.decode_last = false; /* the last token needs no decode */
        rc = sp_generate(sess, NULL, 0, &gp, run_token, &ro, &gr);
        if (ro.failed) goto done;
        if (rc != SP_OK) {
            ret = lib_error(gr.n_generated ? "decoding" : "sampling", rc);
            goto done;
        }
        if (gr.stop == SP_STOP_EOG) stop = STOP_EOG;
        if (gr.stop == SP_STOP_CONTEXT) stop = STOP_CTX;
        if (gr.stop == SP_STOP_CALLBACK || gr.stop == SP_STOP_ABORTED) stop = STOP_INT;
    }
    const long long n_gen = gr.n_generated, n_dec = gr.n_decoded;
    const double t_dec = gr.t_decode_s, t_gen = gr.t_total_s;
    const char last = ro.last;

    /* keep the stats off the text's line where both are seen together: a
     * terminal, or stdout and stderr the same file (2>&1) */
    if (last != '\n' && (isatty(STDOUT_FILENO) || stdout_is_stderr())) fputc('\n', stderr);
    if (stop == STOP_INT)
        fprintf(stderr, "sparrow: run: interrupted after %lld generated tokens\n", n_gen);
    if (stop == STOP_CTX)
        fprintf(stderr, "sparrow: run: context full (%d tokens); stopped after %lld generated tokens\n",
                (int)n_ctx, n_gen);
    fprintf(stderr,
            "sparrow: load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | decode %lld tokens in %.3f s "
            "(%.1f tok/s) | generated %lld tokens in %.3f s%s\n",
            t_load, (int)(n_toks - reuse), t_prompt, t_prompt > 0 ? (n_toks - reuse) / t_prompt : 0.0, n_dec, t_dec,
            t_dec > 0 ? n_dec / t_dec : 0.0, n_gen, t_gen, stop == STOP_EOG ? " | stopped at end of generation" : "");
    gov_report(gov);
    ret = stop == STOP_INT ? EXIT_INTERRUPTED : EXIT_OK;

done:
    free(ro.pb.p);
    free(toks);
    free(file_text);
    sp_session_free(sess);
    sp_governor_free(gov); /* after the session: it detaches; the trace is renamed into place */
    sp_model_free(model);
    return ret;
}
