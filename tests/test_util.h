/*
 * test_util.h -- the tiny harness every test binary uses: CHECK macros that
 * count failures and keep going, and fixture paths under $SPARROW_SHARED
 * (default ../shared).  A missing fixture is a failure that names the file.
 */
#ifndef SP_TEST_UTIL_H
#define SP_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int test_failures;
static int test_checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        test_checks++;                                                                     \
        if (!(cond)) {                                                                     \
            test_failures++;                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECKF(cond, ...)                                                                  \
    do {                                                                                   \
        test_checks++;                                                                     \
        if (!(cond)) {                                                                     \
            test_failures++;                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Path of a fixture under $SPARROW_SHARED into a static buffer (one at a time). */
static inline const char *fixture(const char *rel) {
    static char buf[4096];
    const char *root = getenv("SPARROW_SHARED");
    if (!root || !*root) root = "../shared";
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

/* Like fixture(), but a missing file counts as a failure naming it; returns NULL. */
static inline const char *need_fixture(const char *rel) {
    const char *p = fixture(rel);
    if (access(p, R_OK) != 0) {
        test_failures++;
        fprintf(stderr, "missing fixture: %s (set SPARROW_SHARED to the shared/ folder)\n", p);
        return NULL;
    }
    return p;
}

/* Scratch directory for files a test writes: $SPARROW_SCRATCH or /tmp. */
static inline const char *scratch_dir(void) {
    const char *d = getenv("SPARROW_SCRATCH");
    return (d && *d) ? d : "/tmp";
}

static inline int test_report(const char *name) {
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

#endif /* SP_TEST_UTIL_H */
