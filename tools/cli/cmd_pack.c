/*
 * cmd_pack.c -- `sparrow pack`, and what the package commands (pack,
 * install, diff, update, patch: cmd_install.c, cmd_diff.c, cmd_update.c)
 * share: their common options, the progress bar, Ctrl-C, and the summary
 * line / --json object.
 */
#include "cmds.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct pkg_progress {
    struct progress bar;
};

static bool pkg_progress_cb(uint64_t done, uint64_t total, void *user) {
    struct pkg_progress *pr = user;
    if (cli_interrupted) return false;
    progress_draw(&pr->bar, done, total);
    return true;
}

int pkg_option(struct pkg_cli *c, struct argp *a) {
    if (opt_is(a, "-t", "--threads")) {
        c->p.n_threads = (int32_t)parse_int(a, opt_value(a), 1, 256);
    } else if (c->level_ok && opt_is(a, NULL, "--level")) {
        c->p.level = (int32_t)parse_int(a, opt_value(a), 1, 19);
    } else if (c->level_ok && opt_is(a, NULL, "--shard-size")) {
        c->p.shard_size = parse_size(a, opt_value(a));
    } else if (opt_is(a, "-o", "--output")) {
        c->out = opt_value(a);
    } else if (opt_is(a, NULL, "--json")) {
        opt_no_value(a);
        c->json = true;
    } else if (opt_is(a, "-q", "--quiet")) {
        opt_no_value(a);
        c->quiet = true;
    } else {
        return 0;
    }
    return 1;
}

void pkg_help_common(FILE *f, bool level) {
    if (level) {
        fprintf(f, "      --level N           zstd level 1..19 (default: 3)\n"
                   "      --shard-size SIZE   bytes a shard holds at most, e.g. 16M (64K..1G; default:\n"
                   "                          16M); a row or an expert larger than it stays whole\n");
    }
    fprintf(f, "  -t, --threads N         threads, 1..256 (default: the online CPUs, %d here); the\n"
               "                          output does not depend on it\n"
               "      --json              print the figures as one JSON object on stdout\n"
               "  -q, --quiet             no progress bar or summary on stderr\n"
               "  -v, --verbose           print the library's log messages on stderr\n"
               "  -h, --help              print this help and exit\n",
            default_threads());
}

void pkg_init(struct pkg_cli *c, const char *cmd) {
    memset(c, 0, sizeof *c);
    c->cmd = cmd;
    c->p = sp_package_default_params();
    c->p.n_threads = default_threads();
    c->level_ok = true;
}

int pkg_run(struct pkg_cli *c, sp_status (*fn)(struct pkg_cli *c), const char *target) {
    sp_log_set(cli_log, &log_verbose);
    catch_interrupts();
    struct pkg_progress pr;
    progress_init(&pr.bar, c->quiet);
    c->p.progress = pkg_progress_cb;
    c->p.progress_user = &pr;
    memset(&c->st, 0, sizeof c->st);
    const sp_status rc = fn(c);
    progress_done(&pr.bar);
    if (rc != SP_OK) {
        if (cli_interrupted) {
            fprintf(stderr, "sparrow: %s: interrupted; '%s' was left as it was\n", c->cmd, target);
            return EXIT_RUNTIME;
        }
        return lib_error(c->cmd, rc);
    }
    const struct sp_package_stats *st = &c->st;
    char b1[64], b2[64], b3[64];
    if (!c->quiet) {
        const double mbs = st->seconds > 0 ? (double)st->model_bytes / 1e6 / st->seconds : 0.0;
        fprintf(stderr, "sparrow: %s: %s: model %s", c->cmd, target, human_bytes(st->model_bytes, b1, sizeof b1));
        if (st->package_bytes) {
            fprintf(stderr, ", package %s (%.4f of the model)", human_bytes(st->package_bytes, b2, sizeof b2),
                    st->model_bytes ? (double)st->package_bytes / (double)st->model_bytes : 0.0);
        }
        if (st->patch_bytes) fprintf(stderr, ", patch %s", human_bytes(st->patch_bytes, b3, sizeof b3));
        fprintf(stderr, ", %u shards", st->n_shards);
        if (st->n_ref + st->n_whole + st->n_delta) {
            fprintf(stderr, " (%u unchanged, %u whole, %u delta)", st->n_ref, st->n_whole, st->n_delta);
        }
        fprintf(stderr, ", %.2f s, %.0f MB/s of model\n", st->seconds, mbs);
    }
    if (c->json) {
        printf("{\"command\": ");
        json_string(c->cmd);
        json_key_str("target", target);
        json_key_num("model_bytes", (double)st->model_bytes, 1);
        json_key_num("package_bytes", (double)st->package_bytes, 1);
        json_key_num("patch_bytes", (double)st->patch_bytes, 1);
        json_key_num("n_shards", st->n_shards, 1);
        json_key_num("n_ref", st->n_ref, 1);
        json_key_num("n_whole", st->n_whole, 1);
        json_key_num("n_delta", st->n_delta, 1);
        json_key_num("changed_comp_bytes", (double)st->changed_comp_bytes, 1);
        json_key_str("content_id", st->content_id);
        json_key_num("seconds", st->seconds, 0);
        json_key_num("threads", c->p.n_threads, 1);
        printf("}\n");
    }
    return EXIT_OK;
}

/* ---- pack ------------------------------------------------------------------------ */

void help_pack(FILE *f) {
    fprintf(f, "usage: sparrow pack MODEL.gguf -o OUT.spk [OPTIONS]\n"
               "\n"
               "Pack a GGUF file (standard or Sparrow-native) into a model package: zstd-\n"
               "compressed shards cut at tensor boundaries (a large tensor is split at rows,\n"
               "small ones of a layer are grouped, experts stay whole) and a manifest with the\n"
               "GGUF's header and the SHA-256 of every shard.  The same file and options give\n"
               "the same bytes.  'sparrow install' gives the GGUF back byte for byte, and\n"
               "every command reads a package with -m PKG.spk.  OUT.spk appears only when it\n"
               "is complete (docs/PACKAGES.md).\n"
               "\n"
               "options:\n"
               "  -o, --output FILE       the package to write; required\n");
    pkg_help_common(f, true);
    fprintf(f, "\nexit status: 0 success, 1 runtime or library error, 2 usage error.\n");
}

static sp_status do_pack(struct pkg_cli *c) {
    return sp_package_pack(c->in[0], c->out, &c->p, &c->st);
}

int pkg_args(struct pkg_cli *c, int argc, char **argv, int n_pos, void (*help)(FILE *f), const char *usage) {
    struct argp a = {.cmd = c->cmd, .argc = argc, .argv = argv};
    int got = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, "-h", "--help")) {
            help(stdout);
            exit(EXIT_OK);
        } else if (pkg_option(c, &a)) {
            continue;
        } else if (!is_option(argv[a.i])) {
            if (got == n_pos) usage_error(c->cmd, "unexpected argument '%s' (%s)", argv[a.i], usage);
            c->in[got++] = argv[a.i];
        } else if (c->extra && c->extra(c, &a)) {
            continue;
        } else {
            last_opt(&a, usage);
        }
    }
    if (got < n_pos) usage_error(c->cmd, "%s", usage);
    return got;
}

int cmd_pack(int argc, char **argv) {
    struct pkg_cli c;
    pkg_init(&c, "pack");
    pkg_args(&c, argc, argv, 1, help_pack, "usage: sparrow pack MODEL.gguf -o OUT.spk");
    if (!c.out) usage_error(c.cmd, "-o OUT.spk is required");
    return pkg_run(&c, do_pack, c.out);
}
