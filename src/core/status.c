/*
 * status.c -- status names and the per-thread error message behind
 * sp_last_error().  The message buffer is thread-local so that two threads
 * failing at once do not overwrite each other's text (like errno).
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const status_names[SP_STATUS_COUNT] = {
    [0] = "ok",
    [1] = "invalid argument",
    [2] = "i/o error",
    [3] = "format error",
    [4] = "unsupported",
    [5] = "out of memory",
    [6] = "context full",
    [7] = "buffer too small",
    [8] = "invalid state",
    [9] = "aborted",
};

const char *sp_status_str(sp_status st) {
    int i = -(int)st;
    if (i < 0 || i >= SP_STATUS_COUNT) return "unknown status";
    return status_names[i];
}

static _Thread_local char err_buf[1024];

const char *sp_last_error(void) {
    return err_buf;
}

void sp_err_clear(void) {
    err_buf[0] = '\0';
}

sp_status sp_err(sp_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof(err_buf), fmt, ap);
    va_end(ap);
    sp_log(SP_LOG_DEBUG, "%s", err_buf);
    return st;
}

void sp_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
