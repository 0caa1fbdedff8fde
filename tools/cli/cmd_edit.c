/*
 * cmd_edit.c -- `sparrow edit FILE --set KEY=VALUE`: a GGUF's metadata in place.
 */
#include "cmds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void help_edit(FILE *f) {
    fprintf(f, "usage: sparrow edit MODEL.gguf --set KEY=VALUE [--set ...]\n"
               "\n"
               "Edit a GGUF file's metadata in place, atomically (a temporary file renamed\n"
               "over it): each --set adds or replaces a key.  KEY=VALUE stores a string (the\n"
               "value is everything after the first '='); KEY:TYPE=VALUE a typed value, TYPE\n"
               "one of str, bool (true/false/1/0), u8, i8, u16, i16, u32, i32, u64, i64, f32,\n"
               "f64.  Tensor data is copied unchanged, e.g.\n"
               "  sparrow edit m.gguf --set tokenizer.chat_template=\"$(cat t.jinja)\"\n"
               "  sparrow edit m.gguf --set llama.rope.freq_base:f32=500000\n"
               "\n"
               "options:\n"
               "      --set KEY[:TYPE]=VALUE  the key to set; at least one\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\nexit status: 0 success, 1 runtime or library error (a malformed value names\n"
               "             the assignment), 2 usage error.\n");
}

int cmd_edit(int argc, char **argv) {
    struct argp a = {.cmd = "edit", .argc = argc, .argv = argv};
    const char *path = NULL;
    const char **set = calloc((size_t)argc + 1, sizeof *set);
    int32_t n = 0;
    if (!set) return lib_error("edit", SP_E_NOMEM);
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help_edit(stdout);
            free(set);
            return EXIT_OK;
        } else if (opt_is(&a, NULL, "--set")) {
            set[n++] = opt_value(&a);
        } else if (!is_option(argv[a.i])) {
            if (path) usage_error(a.cmd, "unexpected argument '%s' (one model file)", argv[a.i]);
            path = argv[a.i];
        } else {
            last_opt(&a, "usage: sparrow edit MODEL.gguf --set KEY=VALUE");
        }
    }
    if (!path) usage_error(a.cmd, "usage: sparrow edit MODEL.gguf --set KEY=VALUE");
    if (n == 0) usage_error(a.cmd, "at least one --set KEY=VALUE is required");
    sp_log_set(cli_log, &log_verbose);
    const sp_status rc = sp_model_edit(path, set, n);
    free(set);
    if (rc) return lib_error("edit", rc);
    return EXIT_OK;
}
