/*
 * test_sampler.c -- the sampler against its contract (src/sample/sampler.h):
 * greedy and its tie rule, top-k / top-p / min-p support and frequencies,
 * temperature, repetition penalty, OpenAI's presence and frequency penalties,
 * seeding, reset, parameter validation and
 * "sampling never allocates".  Needs no fixtures; every draw is seeded.
 */
#include "sample/sampler.h"

#include "test_util.h"

#include <math.h>

static struct sp_sampling_params params(float temp, int32_t top_k, float top_p, float min_p) {
    struct sp_sampling_params p = {
        .temp = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p, .repeat_penalty = 1.0f, .repeat_last_n = 64};
    return p;
}

static struct sp_sampler *make(const struct sp_sampling_params *p, uint64_t seed, int32_t n_vocab) {
    struct sp_sampler *s = NULL;
    sp_status rc = sp_sampler_init(p, seed, n_vocab, &s);
    CHECKF(rc == SP_OK && s, "init: %s", sp_last_error());
    return s;
}

/* Deterministic pseudo-random logits in [-scale, scale) (an LCG, not the sampler's RNG). */
static void fill_logits(float *l, int n, uint32_t seed, float scale) {
    uint32_t x = seed * 2654435761u + 1u;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = ((float)(x >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

/* Logits whose softmax (temp 1) is exactly probs (up to float rounding). */
static void logits_from_probs(float *l, const double *probs, int n) {
    for (int i = 0; i < n; i++) l[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Draw n_draws times and count per id; returns how many fell outside [0, n_vocab). */
static int histogram(struct sp_sampler *s, const float *logits, int n_vocab, int n_draws, int *counts) {
    int bad = 0;
    memset(counts, 0, sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < n_draws; i++) {
        int32_t t = sp_sampler_sample(s, logits);
        if (t < 0 || t >= n_vocab) bad++;
        else counts[t]++;
    }
    return bad;
}

/* Pearson chi-square of counts against expected probabilities (ids with
 * expected 0 must have count 0, checked separately). */
static double chi_square(const int *counts, const double *expect, int n, int n_draws) {
    double chi = 0;
    for (int i = 0; i < n; i++) {
        if (expect[i] <= 0) continue;
        double e = expect[i] * n_draws;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_invalid(void) {
    struct sp_sampler *s = (struct sp_sampler *)&s; /* must be overwritten with NULL */
    struct sp_sampling_params ok = params(0.8f, 40, 0.95f, 0.05f);
    CHECK(sp_sampler_init(&ok, 1, 10, &s) == SP_OK && s);
    sp_sampler_free(s);
    sp_sampler_free(NULL); /* no-op */

    CHECK(sp_sampler_init(NULL, 1, 10, &s) == SP_E_INVALID && s == NULL);
    CHECK(sp_sampler_init(&ok, 1, 10, NULL) == SP_E_INVALID);
    s = (struct sp_sampler *)&s;
    CHECK(sp_sampler_init(&ok, 1, 0, &s) == SP_E_INVALID && s == NULL);
    CHECK(sp_sampler_init(&ok, 1, -5, &s) == SP_E_INVALID);

    struct {
        const char *what;
        struct sp_sampling_params p;
    } bad[] = {
        {"temp", params(-0.1f, 0, 1, 0)},
        {"temp", params(NAN, 0, 1, 0)},
        {"temp", params(INFINITY, 0, 1, 0)},
        {"top_p", params(1, 0, 0.0f, 0)},
        {"top_p", params(1, 0, -0.5f, 0)},
        {"top_p", params(1, 0, 1.5f, 0)},
        {"top_p", params(1, 0, NAN, 0)},
        {"min_p", params(1, 0, 1, 1.5f)},
        {"min_p", params(1, 0, 1, NAN)},
        {"repeat_penalty", params(1, 0, 1, 0)},
        {"repeat_penalty", params(1, 0, 1, 0)},
        {"repeat_penalty", params(1, 0, 1, 0)},
        {"repeat_last_n", params(1, 0, 1, 0)},
        {"presence_penalty", params(1, 0, 1, 0)},
        {"presence_penalty", params(1, 0, 1, 0)},
        {"frequency_penalty", params(1, 0, 1, 0)},
        {"frequency_penalty", params(1, 0, 1, 0)},
    };
    bad[9].p.repeat_penalty = 0.0f;
    bad[10].p.repeat_penalty = -1.0f;
    bad[11].p.repeat_penalty = NAN;
    bad[12].p.repeat_last_n = -1;
    bad[13].p.presence_penalty = NAN;
    bad[14].p.presence_penalty = -INFINITY;
    bad[15].p.frequency_penalty = INFINITY;
    bad[16].p.frequency_penalty = NAN;
    for (size_t i = 0; i < SP_ARRAY_LEN(bad); i++) {
        s = (struct sp_sampler *)&s;
        sp_err_clear();
        sp_status rc = sp_sampler_init(&bad[i].p, 1, 10, &s);
        CHECKF(rc == SP_E_INVALID && s == NULL, "case %zu (%s): rc %d", i, bad[i].what, (int)rc);
        CHECKF(strstr(sp_last_error(), bad[i].what) != NULL, "case %zu: message '%s' should name %s", i,
               sp_last_error(), bad[i].what);
    }

    /* Disabled-but-valid values are accepted. */
    struct sp_sampling_params edge = params(0, -3, 1.0f, -1.0f);
    edge.repeat_last_n = 0;
    CHECK(sp_sampler_init(&edge, 1, 1, &s) == SP_OK);
    float one = 0.5f;
    CHECK(sp_sampler_sample(s, &one) == 0);
    sp_sampler_free(s);
}

static void test_greedy(void) {
    struct sp_sampling_params p = params(0.0f, 40, 0.95f, 0.05f);
    struct sp_sampler *s = make(&p, 7, 8);
    if (!s) return;
    float l[8] = {0.1f, -2, 3.5f, 1, 3.4f, -INFINITY, 0, 2};
    CHECK(sp_sampler_sample(s, l) == 2);
    CHECK(sp_sampler_sample(s, l) == 2); /* greedy ignores the RNG */
    float ties[8] = {1, 5, 2, 5, 5, 0, 0, 5};
    CHECK(sp_sampler_sample(s, ties) == 1);
    float all_eq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(sp_sampler_sample(s, all_eq) == 0);
    float nan_first[8] = {NAN, 1, NAN, 2, 0, 0, 0, 0};
    CHECK(sp_sampler_sample(s, nan_first) == 3);
    float inf[8] = {1, INFINITY, 2, INFINITY, 0, 0, 0, 0};
    CHECK(sp_sampler_sample(s, inf) == 1);
    float neg[8] = {-9, -8, -7, -3, -3, -4, -100, -5};
    CHECK(sp_sampler_sample(s, neg) == 3);
    sp_sampler_free(s);

    /* Logits are not modified, with every stage and the penalty active. */
    struct sp_sampling_params q = params(0.9f, 3, 0.9f, 0.05f);
    q.repeat_penalty = 1.3f;
    s = make(&q, 7, 8);
    if (!s) return;
    sp_sampler_accept(s, 2);
    sp_sampler_accept(s, 4);
    float copy[8];
    memcpy(copy, l, sizeof l);
    for (int i = 0; i < 100; i++) (void)sp_sampler_sample(s, l);
    CHECK(memcmp(copy, l, sizeof l) == 0);
    sp_sampler_free(s);
}

static void test_top_k(void) {
    enum { N = 1000, K = 10, DRAWS = 20000 };
    static float l[N];
    static int counts[N];
    fill_logits(l, N, 3, 4.0f);
    /* the K best ids by a naive scan */
    int top[K];
    bool in_top[N] = {0};
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int i = 0; i < N; i++)
            if (!in_top[i] && (best < 0 || l[i] > l[best])) best = i;
        top[j] = best;
        in_top[best] = true;
    }
    /* a flat temperature so that, without top-k, most mass would lie outside */
    struct sp_sampling_params p = params(5.0f, K, 1.0f, 0.0f);
    struct sp_sampler *s = make(&p, 42, N);
    if (!s) return;
    CHECK(histogram(s, l, N, DRAWS, counts) == 0);
    int outside = 0, seen = 0;
    for (int i = 0; i < N; i++) {
        if (!in_top[i]) outside += counts[i];
        else if (counts[i] > 0) seen++;
    }
    CHECKF(outside == 0, "%d draws outside the top %d", outside, K);
    CHECKF(seen == K, "only %d of the top %d ids drawn", seen, K);
    /* frequencies follow softmax(l / 5) over the top K */
    double expect[N] = {0}, z = 0;
    for (int j = 0; j < K; j++) z += exp(l[top[j]] / 5.0);
    for (int j = 0; j < K; j++) expect[top[j]] = exp(l[top[j]] / 5.0) / z;
    double chi = chi_square(counts, expect, N, DRAWS);
    CHECKF(chi < 40.0, "top-k chi-square %.1f (9 dof)", chi); /* p < 1e-5 for a correct sampler */
    sp_sampler_free(s);

    /* k = 1 is greedy; k >= n_vocab is no filter */
    p = params(1.0f, 1, 1.0f, 0.0f);
    s = make(&p, 1, N);
    if (s) {
        int best = top[0], wrong = 0;
        for (int i = 0; i < 500; i++) wrong += sp_sampler_sample(s, l) != best;
        CHECK(wrong == 0);
        sp_sampler_free(s);
    }
    p = params(50.0f, N + 5, 1.0f, 0.0f);
    s = make(&p, 1, N);
    if (s) {
        CHECK(histogram(s, l, N, DRAWS, counts) == 0);
        int distinct = 0;
        for (int i = 0; i < N; i++) distinct += counts[i] > 0;
        CHECKF(distinct > N / 2, "top-k above n_vocab should not filter: %d distinct", distinct);
        sp_sampler_free(s);
    }
}

static void test_top_p(void) {
    enum { N = 6, DRAWS = 30000 };
    const double probs[N] = {0.05, 0.4, 0.1, 0.3, 0.15, 0.0};
    float l[N];
    int counts[N];
    logits_from_probs(l, probs, N);
    /* sorted: 0.4 (id1), 0.3 (id3), 0.15 (id4) -> 0.85 >= 0.8; ids 0, 2, 5 out */
    struct sp_sampling_params p = params(1.0f, 0, 0.8f, 0.0f);
    struct sp_sampler *s = make(&p, 1234, N);
    if (!s) return;
    CHECK(histogram(s, l, N, DRAWS, counts) == 0);
    CHECKF(counts[0] == 0 && counts[2] == 0 && counts[5] == 0, "outside the nucleus: %d %d %d", counts[0],
           counts[2], counts[5]);
    double expect[N] = {0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85, 0};
    double chi = chi_square(counts, expect, N, DRAWS);
    CHECKF(chi < 25.0, "top-p chi-square %.1f (2 dof): %d %d %d", chi, counts[1], counts[3], counts[4]);
    sp_sampler_free(s);

    /* the first token alone reaches top_p: always chosen */
    p = params(1.0f, 0, 0.3f, 0.0f);
    s = make(&p, 99, N);
    if (s) {
        CHECK(histogram(s, l, N, 2000, counts) == 0);
        CHECK(counts[1] == 2000);
        sp_sampler_free(s);
    }

    /* the full-sort path on a large vocabulary: compare with a naive nucleus */
    enum { V = 5000 };
    static float lv[V];
    static int cv[V];
    static double pv[V];
    fill_logits(lv, V, 11, 6.0f);
    double z = 0, mx = -1e30;
    for (int i = 0; i < V; i++) mx = lv[i] > mx ? lv[i] : mx;
    for (int i = 0; i < V; i++) z += pv[i] = exp(lv[i] - mx);
    /* nucleus by repeated max extraction until the mass reaches 0.5 */
    static bool in[V];
    double cum = 0;
    int n_in = 0;
    while (cum < 0.5 * z) {
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!in[i] && (best < 0 || lv[i] > lv[best])) best = i;
        in[best] = true;
        cum += pv[best];
        n_in++;
    }
    p = params(1.0f, 0, 0.5f, 0.0f);
    s = make(&p, 5, V);
    if (s) {
        CHECK(histogram(s, lv, V, 2000, cv) == 0);
        int outside = 0, distinct = 0;
        for (int i = 0; i < V; i++) {
            if (!in[i]) outside += cv[i];
            distinct += cv[i] > 0;
        }
        CHECKF(outside == 0, "%d draws outside a %d-token nucleus", outside, n_in);
        CHECKF(distinct > n_in / 2, "%d distinct of %d in the nucleus", distinct, n_in);
        sp_sampler_free(s);
    }
}

static void test_min_p(void) {
    enum { N = 5, DRAWS = 30000 };
    const double probs[N] = {0.06, 0.5, 0.1, 0.3, 0.04};
    float l[N];
    int counts[N];
    logits_from_probs(l, probs, N);
    /* threshold 0.15 * 0.5 = 0.075: ids 1, 3, 2 stay */
    struct sp_sampling_params p = params(1.0f, 0, 1.0f, 0.15f);
    struct sp_sampler *s = make(&p, 77, N);
    if (!s) return;
    CHECK(histogram(s, l, N, DRAWS, counts) == 0);
    CHECKF(counts[0] == 0 && counts[4] == 0, "below min-p drawn: %d %d", counts[0], counts[4]);
    double expect[N] = {0, 0.5 / 0.9, 0.1 / 0.9, 0.3 / 0.9, 0};
    double chi = chi_square(counts, expect, N, DRAWS);
    CHECKF(chi < 25.0, "min-p chi-square %.1f: %d %d %d", chi, counts[1], counts[2], counts[3]);
    sp_sampler_free(s);

    /* min_p = 1 keeps only the maximum */
    p = params(1.0f, 0, 1.0f, 1.0f);
    s = make(&p, 77, N);
    if (s) {
        CHECK(histogram(s, l, N, 1000, counts) == 0);
        CHECK(counts[1] == 1000);
        sp_sampler_free(s);
    }

    /* all three filters together: top-k 4 -> {1,3,2,0}, top-p 0.9 -> {1,3,2}
     * (0.5+0.3+0.1 = 0.9 of 0.96), min-p 0.25 -> {1,3} */
    p = params(1.0f, 4, 0.9f, 0.25f);
    s = make(&p, 3, N);
    if (s) {
        CHECK(histogram(s, l, N, DRAWS, counts) == 0);
        CHECKF(counts[0] == 0 && counts[2] == 0 && counts[4] == 0, "chain: %d %d %d %d %d", counts[0], counts[1],
               counts[2], counts[3], counts[4]);
        double e2[N] = {0, 0.5 / 0.8, 0, 0.3 / 0.8, 0};
        chi = chi_square(counts, e2, N, DRAWS);
        CHECKF(chi < 20.0, "chain chi-square %.1f", chi);
        sp_sampler_free(s);
    }
}

static void test_temperature(void) {
    enum { N = 3, DRAWS = 40000 };
    const float l[N] = {2.0f, 1.0f, 0.0f};
    int counts[N];
    const float temps[] = {0.25f, 0.5f, 1.0f, 2.0f, 8.0f};
    double prev_top = 2.0;
    for (size_t k = 0; k < SP_ARRAY_LEN(temps); k++) {
        struct sp_sampling_params p = params(temps[k], 0, 1.0f, 0.0f);
        struct sp_sampler *s = make(&p, 100 + k, N);
        if (!s) return;
        CHECK(histogram(s, l, N, DRAWS, counts) == 0);
        double z = 0, e[N];
        for (int i = 0; i < N; i++) z += e[i] = exp(l[i] / temps[k]);
        for (int i = 0; i < N; i++) e[i] /= z;
        double chi = chi_square(counts, e, N, DRAWS);
        CHECKF(chi < 25.0, "temp %.2f: chi-square %.1f (%d %d %d)", (double)temps[k], chi, counts[0], counts[1],
               counts[2]);
        double top = (double)counts[0] / DRAWS;
        CHECKF(top < prev_top, "temp %.2f: top share %.3f did not drop (was %.3f)", (double)temps[k], top,
               prev_top);
        prev_top = top;
        sp_sampler_free(s);
    }
    /* a tiny temperature behaves as greedy without overflowing */
    struct sp_sampling_params p = params(1e-30f, 0, 1.0f, 0.0f);
    struct sp_sampler *s = make(&p, 1, N);
    if (s) {
        CHECK(histogram(s, l, N, 1000, counts) == 0);
        CHECK(counts[0] == 1000);
        sp_sampler_free(s);
    }
    /* -inf and NaN logits are never drawn */
    const float odd[4] = {-INFINITY, 0.0f, NAN, 0.0f};
    int c4[4];
    p = params(3.0f, 0, 1.0f, 0.0f);
    s = make(&p, 1, 4);
    if (s) {
        CHECK(histogram(s, odd, 4, 4000, c4) == 0);
        CHECK(c4[0] == 0 && c4[2] == 0 && c4[1] > 1500 && c4[3] > 1500);
        sp_sampler_free(s);
    }
}

static void test_penalty(void) {
    struct sp_sampling_params p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.2f;
    p.repeat_last_n = 3;
    struct sp_sampler *s = make(&p, 1, 6);
    if (!s) return;
    float l[6] = {3.0f, 2.9f, 1.0f, -1.0f, -1.1f, -5.0f};
    CHECK(sp_sampler_sample(s, l) == 0);
    sp_sampler_accept(s, 0); /* 3.0 / 1.2 = 2.5 < 2.9 */
    CHECK(sp_sampler_sample(s, l) == 1);

    /* each distinct token once: 2.4 < 3/1.2 = 2.5 but > 3/1.44 */
    float l2[6] = {3.0f, 2.4f, 0, 0, 0, 0};
    CHECK(sp_sampler_sample(s, l2) == 0);
    sp_sampler_accept(s, 0);
    CHECK(sp_sampler_sample(s, l2) == 0);

    /* negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1 */
    float l3[6] = {-5, -5, -5, -1.0f, -1.1f, -5};
    CHECK(sp_sampler_sample(s, l3) == 3);
    sp_sampler_accept(s, 3);
    CHECK(sp_sampler_sample(s, l3) == 4);

    /* the window: history is now {0, 0, 3}; two more push both 0s out */
    sp_sampler_accept(s, 5);
    CHECK(sp_sampler_sample(s, l) == 1); /* 0 still in {0, 3, 5} */
    sp_sampler_accept(s, 5);
    CHECK(sp_sampler_sample(s, l) == 0); /* {3, 5, 5} */

    /* reset empties the history */
    sp_sampler_accept(s, 0);
    CHECK(sp_sampler_sample(s, l) == 1);
    sp_sampler_reset(s, 1);
    CHECK(sp_sampler_sample(s, l) == 0);
    sp_sampler_accept(s, -1); /* out of range ids are ignored */
    sp_sampler_accept(s, 6);
    CHECK(sp_sampler_sample(s, l) == 0);
    sp_sampler_free(s);

    /* penalty < 1 boosts, penalty 1 and repeat_last_n 0 do nothing */
    p.repeat_penalty = 0.5f;
    s = make(&p, 1, 6);
    if (s) {
        sp_sampler_accept(s, 2); /* 1.0 / 0.5 = 2.0 < 3 */
        CHECK(sp_sampler_sample(s, l) == 0);
        sp_sampler_accept(s, 1); /* 2.9 / 0.5 = 5.8 */
        CHECK(sp_sampler_sample(s, l) == 1);
        sp_sampler_free(s);
    }
    p.repeat_penalty = 5.0f;
    p.repeat_last_n = 0;
    s = make(&p, 1, 6);
    if (s) {
        sp_sampler_accept(s, 0);
        CHECK(sp_sampler_sample(s, l) == 0);
        sp_sampler_free(s);
    }
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 8;
    s = make(&p, 1, 6);
    if (s) {
        sp_sampler_accept(s, 0);
        CHECK(sp_sampler_sample(s, l) == 0);
        sp_sampler_free(s);
    }
}

/* OpenAI's penalties: logit -= count * frequency_penalty + (count > 0) *
 * presence_penalty over the last repeat_last_n tokens, after the repetition
 * penalty.  Greedy picks between a penalised token and a rival placed just
 * above or just below the value the formula gives. */
static int32_t pick(const struct sp_sampling_params *p, const int32_t *hist, int n_hist, const float *l, int n) {
    struct sp_sampler *s = make(p, 1, n);
    if (!s) return -1;
    for (int i = 0; i < n_hist; i++) sp_sampler_accept(s, hist[i]);
    const int32_t t = sp_sampler_sample(s, l);
    sp_sampler_free(s);
    return t;
}

static void test_presence_frequency(void) {
    struct sp_sampling_params p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_last_n = 8;
    const int32_t zero2[] = {0, 0}, zero3[] = {0, 2, 0, 0}, one0[] = {0};
    /* frequency 0.5, presence 0.3: token 0 seen twice: 3.0 - 2 x 0.5 - 0.3 = 1.7 */
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.3f;
    CHECK(pick(&p, zero2, 2, (const float[]){3.0f, 1.71f, 0, 0}, 4) == 1);
    CHECK(pick(&p, zero2, 2, (const float[]){3.0f, 1.69f, 0, 0}, 4) == 0);
    /* seen once: 3.0 - 0.5 - 0.3 = 2.2 */
    CHECK(pick(&p, one0, 1, (const float[]){3.0f, 2.21f, 0, 0}, 4) == 1);
    CHECK(pick(&p, one0, 1, (const float[]){3.0f, 2.19f, 0, 0}, 4) == 0);
    /* not seen: untouched */
    CHECK(pick(&p, one0, 1, (const float[]){0, 3.0f, 2.99f, 0}, 4) == 1);
    /* presence alone does not count: seen three times, 3.0 - 0.5 = 2.5 */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.5f;
    CHECK(pick(&p, zero3, 4, (const float[]){3.0f, 2.51f, 0, 0}, 4) == 1);
    CHECK(pick(&p, zero3, 4, (const float[]){3.0f, 2.49f, 0, 0}, 4) == 0);
    /* frequency alone counts: 3.0 - 3 x 0.25 = 2.25; token 2 (seen once) 2.3 - 0.25 = 2.05 */
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.0f;
    CHECK(pick(&p, zero3, 4, (const float[]){3.0f, 2.26f, 2.3f, 0}, 4) == 1);
    CHECK(pick(&p, zero3, 4, (const float[]){3.0f, 2.24f, 2.3f, 0}, 4) == 0);
    /* negative values favour repeats: 1.0 + 2 x 0.5 + 0.5 = 2.5 */
    p.frequency_penalty = -0.5f;
    p.presence_penalty = -0.5f;
    CHECK(pick(&p, zero2, 2, (const float[]){1.0f, 2.49f, 0, 0}, 4) == 0);
    CHECK(pick(&p, zero2, 2, (const float[]){1.0f, 2.51f, 0, 0}, 4) == 1);
    /* after the repetition penalty: 3.0 / 1.5 - 0.5 = 1.5 (the other order gives 1.67) */
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.0f;
    CHECK(pick(&p, one0, 1, (const float[]){3.0f, 1.6f, 0, 0}, 4) == 1);
    CHECK(pick(&p, one0, 1, (const float[]){3.0f, 1.45f, 0, 0}, 4) == 0);
    p.repeat_penalty = 1.0f;
    /* only the window counts: 0 seen 5 times but 3 of them pushed out of a window of 4 */
    p.repeat_last_n = 4;
    p.frequency_penalty = 1.0f;
    const int32_t win[] = {0, 0, 0, 1, 1, 0, 0};
    CHECK(pick(&p, win, 7, (const float[]){3.0f, 0, 1.01f, 0}, 4) == 2); /* 3 - 2 = 1.0 */
    CHECK(pick(&p, win, 7, (const float[]){3.0f, 0, 0.99f, 0}, 4) == 0);
    /* -inf stays impossible, however negative the penalty; huge products saturate */
    p.repeat_last_n = 8;
    p.frequency_penalty = -1e38f;
    p.presence_penalty = -1e38f;
    const int32_t inf_hist[] = {1, 1, 1, 0};
    CHECK(pick(&p, inf_hist, 4, (const float[]){-50.0f, -INFINITY, -60.0f, -70.0f}, 4) == 0);
    p.frequency_penalty = 1e38f;
    p.presence_penalty = 1e38f;
    CHECK(pick(&p, inf_hist, 4, (const float[]){50.0f, 40.0f, -60.0f, -70.0f}, 4) == 2);
    /* sampled (temp 1): the draws follow softmax of the penalised logits.
     * logits {0, 0}, token 0 seen once, frequency ln 3: p0 = 1/4 */
    p = params(1.0f, 0, 1.0f, 0.0f);
    p.frequency_penalty = (float)log(3.0);
    struct sp_sampler *s = make(&p, 11, 2);
    if (s) {
        sp_sampler_accept(s, 0);
        int c[2];
        CHECK(histogram(s, (const float[]){0, 0}, 2, 20000, c) == 0);
        CHECKF(c[0] > 4600 && c[0] < 5400, "p(token 0) should be 1/4: %d of 20000", c[0]);
        sp_sampler_free(s);
    }
    /* set_params turns them on and off between draws; the history stays */
    p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_last_n = 8;
    s = make(&p, 1, 4);
    if (s) {
        const float l[4] = {3.0f, 2.5f, 0, 0};
        sp_sampler_accept(s, 0);
        CHECK(sp_sampler_sample(s, l) == 0);
        p.presence_penalty = 1.0f;
        CHECK(sp_sampler_set_params(s, &p) == SP_OK);
        CHECK(sp_sampler_sample(s, l) == 1);
        CHECK(sp_sampler_sample(s, l) == 1); /* sampling leaves the counts as they were */
        p.presence_penalty = 0.0f;
        CHECK(sp_sampler_set_params(s, &p) == SP_OK);
        CHECK(sp_sampler_sample(s, l) == 0);
        p.frequency_penalty = NAN;
        CHECK(sp_sampler_set_params(s, &p) == SP_E_INVALID);
        sp_sampler_free(s);
    }
}

static void test_seeding(void) {
    enum { N = 64, DRAWS = 2000 };
    float l[N];
    fill_logits(l, N, 5, 2.0f);
    struct sp_sampling_params p = params(1.0f, 0, 1.0f, 0.0f);
    struct sp_sampler *a = make(&p, 12345, N), *b = make(&p, 12345, N), *c = make(&p, 12346, N);
    if (!a || !b || !c) goto done;
    static int32_t seq_a[DRAWS];
    int same_ab = 1, diff_ac = 0;
    for (int i = 0; i < DRAWS; i++) {
        int32_t ta = sp_sampler_sample(a, l), tb = sp_sampler_sample(b, l), tc = sp_sampler_sample(c, l);
        seq_a[i] = ta;
        same_ab &= ta == tb;
        diff_ac += ta != tc;
    }
    CHECK(same_ab);
    CHECKF(diff_ac > DRAWS / 2, "seeds 12345 and 12346 agree on %d of %d draws", DRAWS - diff_ac, DRAWS);

    /* reset replays the same sequence */
    sp_sampler_reset(a, 12345);
    int replay = 1;
    for (int i = 0; i < DRAWS; i++) replay &= sp_sampler_sample(a, l) == seq_a[i];
    CHECK(replay);

    /* seed 0 is a valid seed and differs from seed 1 */
    sp_sampler_reset(a, 0);
    sp_sampler_reset(b, 1);
    int diff01 = 0;
    for (int i = 0; i < 100; i++) diff01 += sp_sampler_sample(a, l) != sp_sampler_sample(b, l);
    CHECK(diff01 > 10);

    /* sp_sampler_rand: in [0, 1), mean 1/2, variance 1/12, deterministic */
    sp_sampler_reset(a, 9);
    sp_sampler_reset(b, 9);
    double sum = 0, sq = 0;
    int in_range = 1, equal = 1;
    for (int i = 0; i < 100000; i++) {
        float u = sp_sampler_rand(a);
        in_range &= u >= 0.0f && u < 1.0f;
        equal &= u == sp_sampler_rand(b);
        sum += u;
        sq += (double)u * u;
    }
    double mean = sum / 100000, var = sq / 100000 - mean * mean;
    CHECK(in_range);
    CHECK(equal);
    CHECKF(fabs(mean - 0.5) < 0.005, "mean %.4f", mean);
    CHECKF(fabs(var - 1.0 / 12) < 0.002, "variance %.4f", var);
done:
    sp_sampler_free(a);
    sp_sampler_free(b);
    sp_sampler_free(c);
}

static void test_no_alloc(void) {
    enum { V = 32000 };
    static float l[V];
    fill_logits(l, V, 17, 8.0f);
    struct sp_sampling_params cfg[] = {
        params(0.8f, 40, 0.95f, 0.05f), /* the CLI defaults */
        params(1.0f, 0, 0.9f, 0.0f),    /* full sort */
        params(0.7f, 0, 1.0f, 0.1f),    /* no sort */
        params(0.0f, 0, 1.0f, 0.0f),    /* greedy */
    };
    cfg[0].repeat_penalty = 1.1f;
    cfg[1].presence_penalty = 0.6f;
    cfg[1].frequency_penalty = 0.4f;
    cfg[3].repeat_penalty = 1.3f;
    cfg[3].frequency_penalty = -0.2f;
    for (size_t k = 0; k < SP_ARRAY_LEN(cfg); k++) {
        struct sp_sampler *s = make(&cfg[k], 3, V);
        if (!s) continue;
        for (int i = 0; i < 100; i++) sp_sampler_accept(s, (i * 7919) % V);
        uint64_t before = sp_alloc_count();
        for (int i = 0; i < 50; i++) {
            int32_t t = sp_sampler_sample(s, l);
            CHECK(t >= 0 && t < V);
            sp_sampler_accept(s, t);
        }
        sp_sampler_reset(s, 4);
        (void)sp_sampler_rand(s);
        CHECKF(sp_alloc_count() == before, "config %zu allocated %llu times while sampling", k,
               (unsigned long long)(sp_alloc_count() - before));
        sp_sampler_free(s);
    }
}

int main(void) {
    test_invalid();
    test_greedy();
    test_top_k();
    test_top_p();
    test_min_p();
    test_temperature();
    test_penalty();
    test_presence_frequency();
    test_seeding();
    test_no_alloc();
    return test_report("test_sampler");
}
