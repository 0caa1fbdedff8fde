/*
 * cmd_convert.c -- `sparrow convert`: a model file stored in the layouts the
 * kernels read, to be mapped and used in place.
 */
#include "cmds.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void help_convert(FILE *f) {
    fprintf(f, "usage: sparrow convert IN OUT [--layout auto|resident|none] [OPTIONS]\n"
               "\n"
               "Write OUT, the model IN (a GGUF, a Sparrow-native file, a model package or a\n"
               "llama2.c checkpoint) with the same tensors, types and metadata, its matrices\n"
               "stored in the layouts this CPU's kernels read (Q4_0_g8, Q4_K_g8, the native\n"
               "g4 layouts: docs/FORMAT.md) and every tensor on a 4 KiB page.  A resident\n"
               "load then maps OUT and uses it where it lies -- no copy, no repack, the pages\n"
               "shared by every process that runs it -- so start-up is the page cache's.\n"
               "Where another CPU's kernels lack a stored layout, loading OUT there converts\n"
               "those tensors back (a note on stderr).  OUT appears only when complete; a\n"
               "failure or Ctrl-C leaves nothing behind.  Progress goes to stderr, the summary\n"
               "to stdout.\n"
               "\n"
               "options:\n"
               "      --layout L          auto: the layouts this CPU's kernels read (default;\n"
               "                          none of them on AArch64, whose kernels read the file\n"
               "                          types); resident: every layout a matrix has, for\n"
               "                          another x86 machine; none: the file types, stored\n"
               "                          layouts converted back (a file other readers of\n"
               "                          those types read)\n"
               "      --tokenizer FILE    llama2.c input: its tokenizer (default: tokenizer.bin\n"
               "                          beside it); a GGUF input has its own: refused\n"
               "  -q, --quiet             no progress on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n"
               "\n"
               "exit status: 0 success, 1 runtime or library error (an input it cannot read,\n"
               "             a full disk), 2 usage error.\n");
}

static bool convert_progress(uint64_t done, uint64_t total, void *user) {
    if (cli_interrupted) return false;
    progress_draw(user, done, total);
    return true;
}

/* --layout's value, shared with `sparrow quantize`. */
enum sp_layout parse_layout(struct argp *a, const char *v) {
    for (int l = 0; l < SP_LAYOUT_COUNT; l++)
        if (strcmp(v, sp_layout_name((enum sp_layout)l)) == 0) return (enum sp_layout)l;
    usage_error(a->cmd, "%s: unknown layout '%s' (auto, resident, none)", a->name, v);
}

int cmd_convert(int argc, char **argv) {
    struct argp a = {.cmd = "convert", .argc = argc, .argv = argv};
    struct sp_convert_params p = sp_convert_default_params();
    int quiet = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *arg = argv[a.i];
        if (opt_is(&a, "-h", "--help")) {
            help_convert(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, NULL, "--layout")) {
            p.layout = parse_layout(&a, opt_value(&a));
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            p.tokenizer_path = opt_value(&a);
        } else if (!quiet_verbose_opt(&a, &quiet)) {
            in_out_arg(&a, arg, &p.input, &p.output);
        }
    }
    if (!p.input || !p.output) usage_error(a.cmd, "IN and OUT are required (see 'sparrow convert --help')");

    sp_log_set(cli_log, &log_verbose);
    catch_interrupts();
    struct progress bar;
    progress_init(&bar, quiet);
    p.progress = convert_progress;
    p.progress_user = &bar;
    struct sp_convert_result res;
    const sp_status rc = sp_convert(&p, &res);
    progress_done(&bar);
    if (rc != SP_OK) {
        if (cli_interrupted) {
            fprintf(stderr, "sparrow: convert: interrupted; '%s' was not written\n", p.output);
            return EXIT_RUNTIME;
        }
        return lib_error("converting the model", rc);
    }
    char b1[32], b2[32], b3[32];
    printf("output        %s\n", p.output);
    printf("layout        %s\n", sp_layout_name(p.layout));
    printf("tensors       %d (%d in resident layouts, %s)\n", (int)res.n_tensors, (int)res.n_layout,
           human_bytes(res.layout_bytes, b1, sizeof b1));
    printf("tensor_bytes  %" PRIu64 " (%s)\n", res.tensor_bytes, human_bytes(res.tensor_bytes, b2, sizeof b2));
    printf("file_size     %" PRIu64 " (%s)\n", res.file_size, human_bytes(res.file_size, b3, sizeof b3));
    printf("seconds       %.2f\n", res.seconds);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "sparrow: convert: cannot write to stdout: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    return EXIT_OK;
}
