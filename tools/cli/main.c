/*
 * main.c -- the `sparrow` command: its entry point, the list of commands and
 * the top-level help.  Each command lives in its own file
 * (tools/cli/cmd_<name>.c); what they share -- option parsing, errors, JSON
 * output -- is tools/common/cli.c.  A thin client of the public API in
 * include/sparrow.h: it parses argv, prints, and chooses exit codes;
 * everything else is the library's.  It includes only "sparrow.h" and the
 * C/POSIX library, like lua.c or SQLite's shell.  Exit codes: 0 ok, 1 runtime
 * or library error, 2 usage error.  Usage errors and failures are one line
 * on stderr, starting "sparrow: ".
 */
#include "cmds.h"

#include <stdio.h>
#include <string.h>

/* ---- help ------------------------------------------------------------------ */

static void help_main(FILE *f) {
    fprintf(f,
            "sparrow %s -- LLM inference for devices whose memory is smaller than the model\n"
            "\n"
            "usage: sparrow COMMAND [OPTIONS]\n"
            "\n"
            "commands:\n"
            "  run        generate text from a prompt\n"
            "  chat       hold a conversation: a terminal, a pipe or JSON lines, the model's\n"
            "             chat template, each turn decoding only what it adds\n"
            "  tokenize   print the token ids of a text\n"
            "  inspect    describe a model file: hyper-parameters, tokenizer, metadata, tensors\n"
            "  bench      measure load time, time to first token, prefill and decode speed,\n"
            "             peak memory and bytes read (a table, or JSON)\n"
            "  synth      write a model file with random weights in a real model's shape\n"
            "  plan       show how a model's weights would be placed under a memory budget\n"
            "  eval       measure quality: perplexity on a text, KL divergence and top-1\n"
            "             agreement against a reference model\n"
            "  quantize   write a smaller model: mixed-precision types, calibration, pruning\n"
            "  convert    write a model in the layouts this CPU's kernels read, to be mapped\n"
            "             and used in place (start-up without copying the weights)\n"
            "  pack       pack a GGUF into a model package (.spk): zstd shards, SHA-256 manifest\n"
            "  install    install a package as the GGUF that was packed\n"
            "  diff       write the patch (.spkd) from one model to another\n"
            "  update     apply a patch to a model in place, atomically\n"
            "  patch      apply a patch to a model, writing the new one elsewhere\n"
            "  edit       set metadata keys of a GGUF in place\n"
            "  template   render a conversation with a chat template (the model's, a Jinja\n"
            "             file or a named formatter) and print the prompt\n"
            "  serve      serve the model over HTTP with OpenAI's API (batched slots)\n"
            "  help [COMMAND]  this text, or a command's options\n"
            "\n"
            "options:\n"
            "  -h, --help     print this help and exit\n"
            "  --version      print the version and exit\n"
            "\n"
            "Run 'sparrow COMMAND --help' for the options of a command.\n"
            "Model files: GGUF (v2/v3), model packages (.spk) or llama2.c checkpoints (.bin,\n"
            "with a tokenizer.bin).\n"
            "\n"
            "exit status: 0 success, 1 runtime or library error (message on stderr),\n"
            "             2 usage error (bad command, option or value).\n",
            SPARROW_CLI_VERSION);
}

/* ---- main ------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    void (*help)(FILE *f);
} commands[] = {
    {"run", cmd_run, help_run},
    {"chat", cmd_chat, help_chat},
    {"tokenize", cmd_tokenize, help_tokenize},
    {"inspect", cmd_inspect, help_inspect},
    {"synth", cmd_synth, help_synth},
    {"bench", cmd_bench, help_bench},
    {"plan", cmd_plan, help_plan},
    {"eval", cmd_eval, help_eval},
    {"quantize", cmd_quantize, help_quantize},
    {"convert", cmd_convert, help_convert},
    {"pack", cmd_pack, help_pack},
    {"install", cmd_install, help_install},
    {"diff", cmd_diff, help_diff},
    {"update", cmd_update, help_update},
    {"patch", cmd_patch, help_patch},
    {"edit", cmd_edit, help_edit},
    {"template", cmd_template, help_template},
    {"serve", cmd_serve, help_serve},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "sparrow: missing command (see 'sparrow --help')\n");
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        help_main(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("sparrow %s\n", SPARROW_CLI_VERSION);
        return EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc == 2) {
            help_main(stdout);
            return EXIT_OK;
        }
        if (argc > 3) usage_error("help", "unexpected argument '%s'", argv[3]);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
            if (strcmp(argv[2], commands[i].name) == 0) {
                commands[i].help(stdout);
                return EXIT_OK;
            }
        }
        usage_error("help", "unknown command '%s' (see 'sparrow --help')", argv[2]);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    }
    if (cmd[0] == '-') usage_error(NULL, "unknown option '%s' (see 'sparrow --help')", cmd);
    usage_error(NULL, "unknown command '%s' (see 'sparrow --help')", cmd);
}

