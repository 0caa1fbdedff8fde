/*
 * cmd_diff.c -- `sparrow diff`: the patch from one model to another.
 */
#include "cmds.h"

#include <stdio.h>

void help_diff(FILE *f) {
    fprintf(f, "usage: sparrow diff OLD NEW -o PATCH.spkd [OPTIONS]\n"
               "\n"
               "Write the patch that turns OLD into NEW; each may be a GGUF file or a package.\n"
               "Shards are matched by content, so a metadata edit (which moves every data\n"
               "offset of a GGUF) costs a new manifest only; each changed shard travels as\n"
               "the smaller of the shard compressed whole and a zstd delta against the old\n"
               "shard holding the same tensor bytes.  Apply it with 'sparrow update' or\n"
               "'sparrow patch'.\n"
               "\n"
               "options:\n"
               "  -o, --output FILE       the patch to write; required\n");
    pkg_help_common(f, true);
    fprintf(f, "      (--shard-size applies when OLD is a GGUF file; a package keeps its own)\n"
               "\nexit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static sp_status do_diff(struct pkg_cli *c) {
    return sp_package_diff(c->in[0], c->in[1], c->out, &c->p, &c->st);
}

int cmd_diff(int argc, char **argv) {
    struct pkg_cli c;
    pkg_init(&c, "diff");
    pkg_args(&c, argc, argv, 2, help_diff, "usage: sparrow diff OLD NEW -o PATCH.spkd");
    if (!c.out) usage_error(c.cmd, "-o PATCH.spkd is required");
    return pkg_run(&c, do_diff, c.out);
}
