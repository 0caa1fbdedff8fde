/*
 * test_gen.c -- the streaming filters of src/gen/stream.h: the UTF-8
 * assembler (characters split across pieces at every byte, invalid bytes as
 * U+FFFD per maximal subpart, flush) and the stop-string matcher (held-back
 * prefixes, the earliest match, every split of a text into pieces giving the
 * same result as the whole).  Needs no fixtures.
 */
#include "core/core.h"
#include "gen/stream.h"

#include "test_util.h"

/* Feed s through a fresh assembler in pieces cut at the given points (sorted,
 * in 0..n); the output (NUL-terminated) goes to out. */
static size_t utf8_pieces(const char *s, size_t n, const size_t *cuts, int n_cuts, char *out) {
    struct sp_utf8_stream u;
    sp_utf8_stream_init(&u);
    size_t o = 0, at = 0;
    for (int c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : n;
        o += sp_utf8_stream_push(&u, s + at, end - at, out + o);
        at = end;
    }
    o += sp_utf8_stream_flush(&u, out + o);
    out[o] = '\0';
    return o;
}

static void test_utf8_splits(void) {
    /* ASCII, 2-, 3- and 4-byte characters: cut at every byte, and at every pair */
    const char *s = "a\xC3\xA9z\xE2\x82\xAC\xF0\x9F\x98\x80!";
    size_t n = strlen(s);
    char out[256];
    for (size_t i = 0; i <= n; i++) {
        size_t cut[1] = {i};
        size_t o = utf8_pieces(s, n, cut, 1, out);
        CHECKF(o == n && memcmp(out, s, n) == 0, "cut at %zu: got %zu bytes", i, o);
        for (size_t j = i; j <= n; j++) {
            size_t cuts[2] = {i, j};
            o = utf8_pieces(s, n, cuts, 2, out);
            CHECKF(o == n && memcmp(out, s, n) == 0, "cuts %zu,%zu", i, j);
        }
    }
    /* a character waits for its last byte: nothing comes out until it is complete */
    struct sp_utf8_stream u;
    sp_utf8_stream_init(&u);
    char o8[64];
    CHECK(sp_utf8_stream_push(&u, "\xF0", 1, o8) == 0);
    CHECK(sp_utf8_stream_push(&u, "\x9F\x98", 2, o8) == 0);
    CHECK(sp_utf8_stream_push(&u, "\x80", 1, o8) == 4 && memcmp(o8, "\xF0\x9F\x98\x80", 4) == 0);
    CHECK(sp_utf8_stream_flush(&u, o8) == 0);
}

static void test_utf8_invalid(void) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"\x80", "\xEF\xBF\xBD"},                                 /* a lone continuation byte */
        {"a\xFF" "b", "a\xEF\xBF\xBD" "b"},                       /* never valid */
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                 /* overlong lead: two subparts */
        {"\xE0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* overlong 3-byte */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"\xF0\x9F\x98" "A", "\xEF\xBF\xBD" "A"},                 /* cut short: one U+FFFD */
        {"\xE2\x82" "\xE2\x82\xAC", "\xEF\xBF\xBD\xE2\x82\xAC"},  /* cut short by a new lead */
        {"x\xE2\x82", "x\xEF\xBF\xBD"},                           /* incomplete at the end: flush */
    };
    char out[256];
    for (size_t c = 0; c < SP_ARRAY_LEN(cases); c++) {
        size_t n = strlen(cases[c].in);
        size_t o = utf8_pieces(cases[c].in, n, NULL, 0, out);
        CHECKF(o == strlen(cases[c].want) && memcmp(out, cases[c].want, o) == 0, "case %zu: %zu bytes", c, o);
        /* the same with the input fed one byte at a time */
        size_t cuts[8];
        for (size_t i = 1; i < n; i++) cuts[i - 1] = i;
        o = utf8_pieces(cases[c].in, n, cuts, (int)n - 1, out);
        CHECKF(o == strlen(cases[c].want) && memcmp(out, cases[c].want, o) == 0, "case %zu bytewise", c);
    }
    CHECK(!sp_utf8_valid("\xC3", 1) && sp_utf8_valid("\xC3\xA9", 2) && !sp_utf8_valid("\xED\xA0\x80", 3));
}

/* Random bytes in random pieces: the output is always valid and never
 * longer than the bound; valid input comes out unchanged. */
static void test_utf8_random(void) {
    *test_rng() = 16;
    static const char *alpha[] = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\x80", "\xFF", "\xE2", "\xF0\x9F"};
    char in[512], out[SP_UTF8_STREAM_OUT_MAX(512)];
    for (int iter = 0; iter < 400; iter++) {
        bool valid_only = iter % 2 == 0;
        size_t n = 0;
        while (n < 480) {
            const char *a = alpha[rng_u64() % (valid_only ? 4 : SP_ARRAY_LEN(alpha))];
            memcpy(in + n, a, strlen(a));
            n += strlen(a);
        }
        struct sp_utf8_stream u;
        sp_utf8_stream_init(&u);
        size_t o = 0, at = 0;
        while (at < n) {
            size_t r = (size_t)(rng_u64() % 7), k = SP_MIN(n - at, r);
            size_t w = sp_utf8_stream_push(&u, in + at, k, out + o);
            CHECK(w <= SP_UTF8_STREAM_OUT_MAX(k));
            CHECK(sp_utf8_valid(out + o, w)); /* each piece on its own is valid */
            o += w;
            at += k;
        }
        o += sp_utf8_stream_flush(&u, out + o);
        CHECK(sp_utf8_valid(out, o));
        if (valid_only) CHECKF(o == n && memcmp(out, in, n) == 0, "iteration %d changed valid text", iter);
    }
}

/* ---- stop strings --------------------------------------------------------- */

/* Feed text in pieces of the given size (0 = whole); the released text goes
 * to out; returns the index matched or -1 (after flushing). */
static int32_t stop_run(struct sp_stop_matcher *m, const char *text, size_t piece, char *out, size_t *o) {
    size_t n = strlen(text), at = 0;
    *o = 0;
    sp_stop_reset(m);
    while (at < n) {
        size_t k = piece ? SP_MIN(piece, n - at) : n - at;
        const char *r;
        size_t rn;
        int32_t matched;
        CHECK(sp_stop_push(m, text + at, k, &r, &rn, &matched) == SP_OK);
        memcpy(out + *o, r, rn);
        *o += rn;
        at += k;
        if (matched >= 0) {
            out[*o] = '\0';
            return matched;
        }
    }
    const char *r;
    size_t rn;
    sp_stop_flush(m, &r, &rn);
    memcpy(out + *o, r, rn);
    *o += rn;
    out[*o] = '\0';
    return -1;
}

static void test_stop_basic(void) {
    const char *stops[] = {"<|end|>", "User:", "\n\n"};
    struct sp_stop_matcher m;
    CHECK(sp_stop_init(&m, stops, 3) == SP_OK);
    char out[512];
    size_t o;
    for (size_t piece = 0; piece <= 9; piece++) {
        CHECKF(stop_run(&m, "Hello there<|end|>more", piece, out, &o) == 0 && strcmp(out, "Hello there") == 0,
               "piece %zu: '%s'", piece, out);
        CHECKF(stop_run(&m, "a <|en b User: c", piece, out, &o) == 1 && strcmp(out, "a <|en b ") == 0, "piece %zu", piece);
        CHECKF(stop_run(&m, "no stop <|end| here <", piece, out, &o) == -1 &&
                   strcmp(out, "no stop <|end| here <") == 0, "piece %zu: '%s'", piece, out);
        CHECKF(stop_run(&m, "x\n\nUser:", piece, out, &o) == 2 && strcmp(out, "x") == 0, "piece %zu", piece);
    }
    /* holding back: a possible start waits, and is released once it cannot be one */
    const char *r;
    size_t rn;
    int32_t matched;
    sp_stop_reset(&m);
    CHECK(sp_stop_push(&m, "ab<|e", 5, &r, &rn, &matched) == SP_OK && matched == -1 && rn == 2 && !memcmp(r, "ab", 2));
    CHECK(sp_stop_push(&m, "x", 1, &r, &rn, &matched) == SP_OK && matched == -1 && rn == 4 && !memcmp(r, "<|ex", 4));
    CHECK(sp_stop_push(&m, "Use", 3, &r, &rn, &matched) == SP_OK && rn == 0);
    sp_stop_flush(&m, &r, &rn);
    CHECK(rn == 3 && !memcmp(r, "Use", 3));
    /* the earliest stop string wins, even when a later-listed one ends first */
    const char *two[] = {"abcdef", "cd"};
    struct sp_stop_matcher m2;
    CHECK(sp_stop_init(&m2, two, 2) == SP_OK);
    CHECK(stop_run(&m2, "xxabcdefyy", 0, out, &o) == 0 && strcmp(out, "xx") == 0);
    CHECK(stop_run(&m2, "xxabcdzz", 0, out, &o) == 1 && strcmp(out, "xxab") == 0);
    sp_stop_free(&m2);
    /* a long piece grows the buffer; no stop strings: straight through */
    static char big[5000];
    memset(big, 'q', sizeof big - 1);
    static char bigout[6000];
    CHECK(stop_run(&m, big, 0, bigout, &o) == -1 && o == sizeof big - 1);
    sp_stop_free(&m);
    CHECK(sp_stop_init(&m, NULL, 0) == SP_OK);
    CHECK(stop_run(&m, "<|end|>", 1, out, &o) == -1 && strcmp(out, "<|end|>") == 0);
    sp_stop_free(&m);
    /* bad stop strings are refused */
    const char *bad1[] = {""}, *bad2[] = {"\xC3"};
    CHECK(sp_stop_init(&m, bad1, 1) == SP_E_INVALID);
    CHECK(sp_stop_init(&m, bad2, 1) == SP_E_INVALID);
    sp_stop_free(&m);
    sp_stop_free(NULL);
}

/* Random text over a small alphabet with random pieces: the released text
 * is exactly the text before the first occurrence of any stop string. */
static void test_stop_random(void) {
    *test_rng() = 1616;
    const char *stops[] = {"aab", "ba", "abba"};
    struct sp_stop_matcher m;
    CHECK(sp_stop_init(&m, stops, 3) == SP_OK);
    char text[64], out[256];
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = 1 + rng_u64() % 40;
        for (size_t i = 0; i < n; i++) text[i] = "abc"[rng_u64() % 3];
        text[n] = '\0';
        size_t first = n;
        int32_t want = -1;
        for (int32_t s = 0; s < 3; s++) {
            const char *p = strstr(text, stops[s]);
            if (p && (size_t)(p - text) < first) first = (size_t)(p - text), want = s;
        }
        size_t o;
        size_t piece = 1 + (size_t)(rng_u64() % 5);
        int32_t got = stop_run(&m, text, piece, out, &o);
        CHECKF(got == want && o == first && memcmp(out, text, first) == 0, "'%s': got %d '%s', want %d", text,
               (int)got, out, (int)want);
    }
    sp_stop_free(&m);
}

int main(void) {
    test_utf8_splits();
    test_utf8_invalid();
    test_utf8_random();
    test_stop_basic();
    test_stop_random();
    return test_report("test_gen");
}
