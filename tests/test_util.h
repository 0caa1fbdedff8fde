/*
 * test_util.h -- the tiny harness every test binary uses: CHECK macros that
 * count failures and keep going, and fixture paths under $SPARROW_SHARED
 * (default ../shared).  A missing fixture is a failure that names the file.
 */
#ifndef SP_TEST_UTIL_H
#define SP_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
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

/* A whole file in malloc'd memory with a NUL after it (len may be NULL);
 * NULL if it cannot be read. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return buf;
}

/* dir/name in one of 4 rotating static buffers: a result stays valid
 * through the next three calls. */
static inline const char *test_path(const char *dir, const char *name) {
    static char buf[4][4200];
    static int k;
    k = (k + 1) % 4;
    if (snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name) >= (int)sizeof buf[k]) buf[k][0] = '\0'; /* too long: no file */
    return buf[k];
}

/* Whether files a and b both read and hold the same bytes. */
static inline int test_same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    const int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Scratch directory for files a test writes: $SPARROW_SCRATCH or /tmp. */
static inline const char *scratch_dir(void) {
    const char *d = getenv("SPARROW_SCRATCH");
    return (d && *d) ? d : "/tmp";
}

/* Test data generator: xorshift64* over one per-binary state word.  Each test
 * seeds *test_rng() its own way (so its data stays what its thresholds were
 * measured on); the draws below are shared. */
static inline uint64_t *test_rng(void) {
    static uint64_t state = 0x9e3779b97f4a7c15ull;
    return &state;
}

static inline uint64_t rng_u64(void) {
    uint64_t *s = test_rng();
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* Uniform in (0, 1). */
static inline double rng_unit(void) {
    return ((rng_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller). */
static inline float rng_normal(void) {
    return (float)(sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()));
}

static inline int test_report(const char *name) {
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

#endif /* SP_TEST_UTIL_H */
