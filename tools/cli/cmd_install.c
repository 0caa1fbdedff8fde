/*
 * cmd_install.c -- `sparrow install`: a package back into the GGUF it holds.
 */
#include "cmds.h"

#include <stdio.h>

void help_install(FILE *f) {
    fprintf(f, "usage: sparrow install PKG.spk -o MODEL.gguf [OPTIONS]\n"
               "\n"
               "Install a model package as the GGUF file that was packed, byte for byte.\n"
               "Every shard's SHA-256 is checked before it is used (a damaged package is\n"
               "refused, naming the shard); shards decompress on several threads.  MODEL.gguf\n"
               "is replaced only when the new file is complete and checked.  Running a\n"
               "package needs no install: every command takes -m PKG.spk.\n"
               "\n"
               "options:\n"
               "  -o, --output FILE       the GGUF file to write; required\n");
    pkg_help_common(f, false);
    fprintf(f, "\nexit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static sp_status do_install(struct pkg_cli *c) {
    return sp_package_install(c->in[0], c->out, &c->p, &c->st);
}

int cmd_install(int argc, char **argv) {
    struct pkg_cli c;
    pkg_init(&c, "install");
    c.level_ok = false;
    pkg_args(&c, argc, argv, 1, help_install, "usage: sparrow install PKG.spk -o MODEL.gguf");
    if (!c.out) usage_error(c.cmd, "-o MODEL.gguf is required");
    return pkg_run(&c, do_install, c.out);
}
