/*
 * cmd_serve.c -- `sparrow serve`: runs sparrow-server, the OpenAI-compatible
 * HTTP server (tools/server/, docs/SERVER.md), from the folder this binary
 * is in, with the same arguments.  It is a binary of its own so that the
 * HTTP library and its dependencies load only into the server.
 */
#include "cmds.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

void help_serve(FILE *f) {
    fprintf(f,
            "usage: sparrow serve -m MODEL [--host 127.0.0.1] [--port 8080] [-np N] [-c CTX] [options]\n"
            "\n"
            "Serve the model over HTTP with OpenAI's API (chat completions, completions,\n"
            "models, health, slots), N slots decoded together in batched forward passes.\n"
            "Runs sparrow-server from this binary's folder; `sparrow serve --help` lists\n"
            "its options.\n");
}

int cmd_serve(int argc, char **argv) {
    char path[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
    if (n <= 0) {
        fprintf(stderr, "sparrow: serve: cannot find this binary's folder: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    strcpy(slash ? slash + 1 : path, "sparrow-server");
    argv[0] = path;
    (void)argc;
    execv(path, argv);
    fprintf(stderr, "sparrow: serve: cannot run %s: %s\n", path, strerror(errno));
    return EXIT_RUNTIME;
}
