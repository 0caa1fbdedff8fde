/*
 * cmd_update.c -- `sparrow update MODEL PATCH` (in place) and `sparrow patch
 * OLD PATCH -o NEW` (beside it): the same call, sp_package_apply, so one file.
 */
#include "cmds.h"

#include <stdio.h>

static void help_common(FILE *f) {
    fprintf(f, "The patch's old model must be this one (its content id; a patch for another\n"
               "model is refused before anything is written), and every new shard's SHA-256\n"
               "is checked before the new file is renamed into place: at every instant the\n"
               "model on disk is the old one or the new one, whole, and an interrupted run\n"
               "can simply be run again.  A GGUF gives a GGUF, a package a package.\n"
               "\n"
               "options:\n");
}

void help_update(FILE *f) {
    fprintf(f, "usage: sparrow update MODEL PATCH.spkd [OPTIONS]\n"
               "\n"
               "Update MODEL (a GGUF file or a package) in place with a patch from\n"
               "'sparrow diff'.\n");
    help_common(f);
    pkg_help_common(f, false);
    fprintf(f, "\nexit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

void help_patch(FILE *f) {
    fprintf(f, "usage: sparrow patch OLD PATCH.spkd -o NEW [OPTIONS]\n"
               "\n"
               "Apply a patch from 'sparrow diff' to OLD (a GGUF file or a package), writing\n"
               "the new model to NEW and leaving OLD as it is.\n");
    help_common(f);
    fprintf(f, "  -o, --output FILE       the new model; required\n");
    pkg_help_common(f, false);
    fprintf(f, "\nexit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static sp_status do_apply(struct pkg_cli *c) {
    return sp_package_apply(c->in[0], c->in[1], c->out, &c->p, &c->st);
}

int cmd_update(int argc, char **argv) {
    struct pkg_cli c;
    pkg_init(&c, "update");
    c.level_ok = false;
    pkg_args(&c, argc, argv, 2, help_update, "usage: sparrow update MODEL PATCH.spkd");
    if (c.out) usage_error(c.cmd, "-o: update replaces MODEL; use 'sparrow patch OLD PATCH -o NEW' to write elsewhere");
    return pkg_run(&c, do_apply, c.in[0]);
}

int cmd_patch(int argc, char **argv) {
    struct pkg_cli c;
    pkg_init(&c, "patch");
    c.level_ok = false;
    pkg_args(&c, argc, argv, 2, help_patch, "usage: sparrow patch OLD PATCH.spkd -o NEW");
    if (!c.out) usage_error(c.cmd, "-o NEW is required");
    return pkg_run(&c, do_apply, c.out);
}
