/*
 * log.c -- the log callback.  One of the three pieces of mutable global state
 * the house rules allow: set it before loading models or starting threads.
 */
#include "core.h"

#include <stdio.h>

static void default_log(enum sp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level <= SP_LOG_WARN) fprintf(stderr, "sparrow: %s\n", msg);
}

static sp_log_fn log_fn = default_log;
static void *log_user;

void sp_log_set(sp_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void sp_log(enum sp_log_level level, const char *fmt, ...) {
    if (!log_fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log_fn(level, buf, log_user);
}
