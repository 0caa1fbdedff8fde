/*
 * cmds.h -- the commands of the `sparrow` tool, one file each
 * (tools/cli/cmd_<name>.c): cmd_<name>(argc, argv) with argv[0] the command
 * name, returning an exit status; help_<name>(f) prints its --help.
 */
#ifndef SP_TOOLS_CMDS_H
#define SP_TOOLS_CMDS_H

#include "../common/cli.h"

#define SP_CLI_COMMAND(name) int cmd_##name(int argc, char **argv); void help_##name(FILE *f)
SP_CLI_COMMAND(run);
SP_CLI_COMMAND(chat);
SP_CLI_COMMAND(tokenize);
SP_CLI_COMMAND(inspect);
SP_CLI_COMMAND(synth);
SP_CLI_COMMAND(bench);
SP_CLI_COMMAND(plan);
SP_CLI_COMMAND(eval);
SP_CLI_COMMAND(quantize);
SP_CLI_COMMAND(convert);
SP_CLI_COMMAND(pack);
SP_CLI_COMMAND(install);
SP_CLI_COMMAND(diff);
SP_CLI_COMMAND(update);
SP_CLI_COMMAND(patch);
SP_CLI_COMMAND(edit);
SP_CLI_COMMAND(template);
SP_CLI_COMMAND(serve);
#undef SP_CLI_COMMAND

/* --layout auto|resident|none (cmd_convert.c; quantize takes it too): exits on an unknown name. */
enum sp_layout parse_layout(struct argp *a, const char *v);

/* ---- what the package commands share (cmd_pack.c) ---------------------------- */
struct pkg_cli {
    const char *cmd;
    const char *in[2];        /* positional arguments */
    const char *out;          /* -o */
    bool json, quiet, level_ok; /* level_ok: --level and --shard-size accepted */
    struct sp_package_params p;
    struct sp_package_stats st;
    int (*extra)(struct pkg_cli *c, struct argp *a); /* more options; NULL = none */
};
void pkg_init(struct pkg_cli *c, const char *cmd);
/* Parse argv: n_pos positional arguments, the common options; exits on --help or a usage error. */
int pkg_args(struct pkg_cli *c, int argc, char **argv, int n_pos, void (*help)(FILE *f), const char *usage);
int pkg_option(struct pkg_cli *c, struct argp *a);
void pkg_help_common(FILE *f, bool level);
/* Run fn with a progress bar and Ctrl-C handling; print the summary (and --json). */
int pkg_run(struct pkg_cli *c, sp_status (*fn)(struct pkg_cli *c), const char *target);

#endif /* SP_TOOLS_CMDS_H */
