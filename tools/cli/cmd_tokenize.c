/*
 * cmd_tokenize.c -- `sparrow tokenize`: the token ids of a text.
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

void help_tokenize(FILE *f) {
    fprintf(f, "usage: sparrow tokenize -m MODEL [OPTIONS] (TEXT | --file FILE)\n"
               "\n"
               "Print the token ids of TEXT (or of FILE's bytes, read as they are) on one line,\n"
               "separated by single spaces and ended by a newline; an empty line if there are\n"
               "none.  BOS is prepended when the vocabulary asks for it; EOS never is.  Special-\n"
               "token text in the input is not parsed as special unless --special is given.\n"
               "Only the vocabulary is loaded, so vocabulary-only GGUF files work.\n"
               "\n"
               "options:\n"
               "  -m, --model FILE        model or vocabulary file (GGUF or llama2.c .bin); required\n"
               "      --file FILE         tokenize FILE's bytes ('-' = stdin); excludes TEXT\n"
               "      --no-bos            never prepend BOS (default: prepend it when the\n"
               "                          vocabulary asks for it)\n"
               "      --special           the text of special tokens (\"<|im_start|>\", \"</s>\")\n"
               "                          becomes those tokens, as for a rendered chat template\n"
               CLI_HELP_TOKENIZER
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "  --                      end of options: the next argument is TEXT\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

/* ---- tokenize --------------------------------------------------------------------- */

int cmd_tokenize(int argc, char **argv) {
    struct argp a = {.cmd = "tokenize", .argc = argc, .argv = argv};
    const char *model_path = NULL, *text = NULL, *file = NULL, *tokenizer = NULL;
    bool add_bos = true, special = false, opts_done = false;

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
        } else if (opt_is(&a, NULL, "--special")) {
            opt_no_value(&a);
            special = true;
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
    rc = load_model(model_path, tokenizer, true, 0, NULL, &model);
    if (rc != SP_OK) {
        ret = lib_error("loading the vocabulary", rc);
        goto done;
    }
    rc = tokenize_all(model, text, len, (add_bos ? SP_TOKENIZE_ADD_BOS : 0u) | (special ? SP_TOKENIZE_PARSE_SPECIAL : 0u),
                      &toks, &n);
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
