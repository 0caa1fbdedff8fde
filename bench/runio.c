/*
 * runio.c -- run a command and report what it cost the machine: wall time,
 * bytes it (and its children) read from storage, and its peak resident set.
 * For measuring a peer engine whose own output does not report them
 * (bench/memwall.sh).  A standalone tool: it does not use the library.
 *
 *   runio [-o FILE] -- COMMAND [ARGS...]
 *
 * The command's stdout and stderr pass through.  When it ends, one JSON line
 * goes to FILE (default stderr):
 *   {"exit": N, "wall_s": S, "read_bytes": B, "max_rss_bytes": R}
 * read_bytes is getrusage(RUSAGE_CHILDREN).ru_inblock x 512 (block input
 * operations: reads that reached storage, page-cache hits excluded); max_rss
 * is ru_maxrss of the largest child.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *out = NULL;
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "-o") == 0) {
        out = argv[i + 1];
        i += 2;
    }
    if (i < argc && strcmp(argv[i], "--") == 0) i++;
    if (i >= argc) {
        fprintf(stderr, "usage: runio [-o FILE] -- COMMAND [ARGS...]\n");
        return 2;
    }
    const double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "runio: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        execvp(argv[i], argv + i);
        fprintf(stderr, "runio: cannot run '%s': %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "runio: waitpid: %s\n", strerror(errno));
            return 1;
        }
    }
    const double wall = now_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = out ? fopen(out, "w") : stderr;
    if (!f) {
        fprintf(stderr, "runio: cannot write '%s': %s\n", out, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"exit\": %d, \"wall_s\": %.3f, \"read_bytes\": %llu, \"max_rss_bytes\": %llu}\n", code, wall,
            (unsigned long long)ru.ru_inblock * 512ull, (unsigned long long)ru.ru_maxrss * 1024ull);
    if (out) fclose(f);
    return code;
}
