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
SP_CLI_COMMAND(tokenize);
SP_CLI_COMMAND(inspect);
SP_CLI_COMMAND(synth);
SP_CLI_COMMAND(bench);
SP_CLI_COMMAND(plan);
SP_CLI_COMMAND(eval);
SP_CLI_COMMAND(quantize);
SP_CLI_COMMAND(template);
#undef SP_CLI_COMMAND

#endif /* SP_TOOLS_CMDS_H */
