/*
 * sampler.c -- logits -> next token.  The pipeline, in order:
 *   repetition penalty (llama.cpp style, each distinct recent token once),
 *   then OpenAI's frequency and presence penalties over the same tokens
 *   -> temp == 0: argmax, lowest id on ties
 *   -> else temperature, top-k (selection), softmax, top-p, min-p, renormalise,
 *      and one draw from xoshiro256** (seeded through splitmix64).
 * Not here: the logits themselves (model/), the public wrapper (api.c).
 * All scratch (candidate array, penalty ring, counts) is allocated in
 * sp_sampler_init; sp_sampler_sample never allocates and never modifies logits.
 */
#include "sample/sampler.h"

#include <float.h>
#include <math.h>

/* The longest penalty window accepted: the ring is allocated up front, and a
 * window longer than any context is a mistake, not a request for gigabytes. */
#define SP_SAMPLER_MAX_LAST_N (1 << 20)

struct cand {
    int32_t id;
    float logit; /* after the penalty; NaN became -inf, +inf became FLT_MAX */
    float p;     /* unnormalised probability exp((logit - max) / temp) */
};

struct sp_sampler {
    struct sp_sampling_params params;
    int32_t n_vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    struct cand *cand;   /* (n_vocab) scratch */
    int32_t *count;      /* (n_vocab) a token's occurrences in the history while the
                            penalties are applied; else 0 */
    int32_t *hist;       /* (repeat_last_n) ring of accepted tokens */
    int32_t hist_len;    /* tokens in the ring, <= repeat_last_n */
    int32_t hist_next;   /* ring slot the next accepted token goes to */
};

/* ---- RNG ------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4]) {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform float in [0, 1): the top 24 bits, so every value is exact. */
float sp_sampler_rand(struct sp_sampler *s) {
    return (float)(xoshiro_next(s->rng) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform double in [0, 1) with 53 bits, for the draw itself. */
static double rand_double(struct sp_sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- ordering ---------------------------------------------------------------
 * "a before b" is a strict total order: higher logit first, lower id on equal
 * logits.  Every key is distinct, so selection and sorting are deterministic
 * and cannot degrade on runs of equal logits. */

static inline int before(const struct cand *a, const struct cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static inline void swap(struct cand *a, struct cand *b) {
    struct cand t = *a;
    *a = *b;
    *b = t;
}

static void sift_down(struct cand *a, size_t root, size_t n) {
    /* A heap whose root is the element that sorts last. */
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && before(&a[child], &a[child + 1])) child++;
        if (!before(&a[root], &a[child])) return;
        swap(&a[root], &a[child]);
        root = child;
    }
}

static void heap_sort(struct cand *a, size_t n) {
    if (n < 2) return;
    for (size_t i = n / 2; i-- > 0;) sift_down(a, i, n);
    for (size_t end = n - 1; end > 0; end--) {
        swap(&a[0], &a[end]);
        sift_down(a, 0, end);
    }
}

static void insertion_sort(struct cand *a, size_t n) {
    for (size_t i = 1; i < n; i++) {
        struct cand x = a[i];
        size_t j = i;
        while (j > 0 && before(&x, &a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Median-of-three pivot moved to a[0], then a Lomuto-style partition around
 * it.  Returns the pivot's final index p: a[<p] before pivot, a[>p] after. */
static size_t partition(struct cand *a, size_t n) {
    size_t mid = n / 2, last = n - 1;
    if (before(&a[mid], &a[0])) swap(&a[mid], &a[0]);
    if (before(&a[last], &a[0])) swap(&a[last], &a[0]);
    if (before(&a[last], &a[mid])) swap(&a[last], &a[mid]);
    swap(&a[0], &a[mid]); /* the median is the pivot */
    size_t store = 0;
    for (size_t i = 1; i < n; i++) {
        if (before(&a[i], &a[0])) swap(&a[++store], &a[i]);
    }
    swap(&a[0], &a[store]);
    return store;
}

/* Introsort: quicksort on the larger side iteratively, recursion on the
 * smaller (stack depth O(log n)), heapsort once depth runs out. */
static void intro_sort(struct cand *a, size_t n, int depth) {
    while (n > 16) {
        if (depth-- == 0) {
            heap_sort(a, n);
            return;
        }
        size_t p = partition(a, n);
        size_t nl = p, nr = n - p - 1;
        if (nl < nr) {
            intro_sort(a, nl, depth);
            a += p + 1;
            n = nr;
        } else {
            intro_sort(a + p + 1, nr, depth);
            n = nl;
        }
    }
    insertion_sort(a, n);
}

static void cand_sort(struct cand *a, size_t n) {
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    intro_sort(a, n, depth);
}

/* Rearrange a[0..n) so that its k first elements are the k that sort first
 * (in no particular order).  Quickselect, heapsort of the rest as fallback. */
static void cand_select(struct cand *a, size_t n, size_t k) {
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (n > 16 && k > 0 && k < n) {
        if (depth-- == 0) {
            heap_sort(a, n);
            return;
        }
        size_t p = partition(a, n);
        if (p == k || p + 1 == k) return;
        if (p > k) {
            n = p;
        } else {
            a += p + 1;
            n -= p + 1;
            k -= p + 1;
        }
    }
    insertion_sort(a, n);
}

/* ---- lifecycle ----------------------------------------------------------- */

static sp_status check_params(const struct sp_sampling_params *p) {
    if (!isfinite(p->temp) || p->temp < 0.0f)
        return sp_err(SP_E_INVALID, "sampler: temp must be a finite number >= 0, got %g", (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return sp_err(SP_E_INVALID, "sampler: top_p must be in (0, 1] (1 disables it), got %g", (double)p->top_p);
    if (isnan(p->min_p) || p->min_p > 1.0f)
        return sp_err(SP_E_INVALID, "sampler: min_p must be <= 1 (<= 0 disables it), got %g", (double)p->min_p);
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0.0f)
        return sp_err(SP_E_INVALID, "sampler: repeat_penalty must be a finite number > 0 (1 disables it), got %g",
                      (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty))
        return sp_err(SP_E_INVALID, "sampler: presence_penalty must be a finite number (0 disables it), got %g",
                      (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return sp_err(SP_E_INVALID, "sampler: frequency_penalty must be a finite number (0 disables it), got %g",
                      (double)p->frequency_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > SP_SAMPLER_MAX_LAST_N)
        return sp_err(SP_E_INVALID, "sampler: repeat_last_n must be in [0, %d], got %d", SP_SAMPLER_MAX_LAST_N,
                      (int)p->repeat_last_n);
    return SP_OK;
}

/* Create a sampler for n_vocab logits.  params is copied.  Returns SP_OK and
 * *out, or SP_E_INVALID (NULL argument, n_vocab <= 0, a parameter out of
 * range: the message names it) / SP_E_NOMEM, with *out = NULL.  Free with
 * sp_sampler_free. */
sp_status sp_sampler_init(const struct sp_sampling_params *params, uint64_t seed, int32_t n_vocab,
                          struct sp_sampler **out) {
    struct sp_sampler *s = NULL;
    sp_status rc;
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!params) return sp_err(SP_E_INVALID, "%s: params is NULL", __func__);
    if (n_vocab <= 0) return sp_err(SP_E_INVALID, "%s: n_vocab must be > 0, got %d", __func__, (int)n_vocab);
    rc = check_params(params);
    if (rc != SP_OK) return rc;

    s = sp_calloc(1, sizeof(*s));
    if (!s) goto nomem;
    s->params = *params;
    s->n_vocab = n_vocab;
    s->cand = sp_calloc((size_t)n_vocab, sizeof(*s->cand));
    s->count = sp_calloc((size_t)n_vocab, sizeof(*s->count));
    if (!s->cand || !s->count) goto nomem;
    if (params->repeat_last_n > 0) {
        s->hist = sp_calloc((size_t)params->repeat_last_n, sizeof(*s->hist));
        if (!s->hist) goto nomem;
    }
    sp_sampler_reset(s, seed);
    *out = s;
    return SP_OK;

nomem:
    sp_sampler_free(s);
    return sp_err(SP_E_NOMEM, "%s: out of memory for a sampler over %d tokens", __func__, (int)n_vocab);
}

/* Free a sampler and its scratch.  NULL is a no-op. */
void sp_sampler_free(struct sp_sampler *s) {
    if (!s) return;
    sp_free(s->cand);
    sp_free(s->count);
    sp_free(s->hist);
    sp_free(s);
}

/* Reseed the RNG from seed (every seed, 0 included, gives a valid state) and
 * empty the penalty history. */
void sp_sampler_seed(struct sp_sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

void sp_sampler_reset(struct sp_sampler *s, uint64_t seed) {
    sp_sampler_seed(s, seed);
    s->hist_len = 0;
    s->hist_next = 0;
}

/* Append token to the penalty history; the oldest falls out once
 * repeat_last_n are held.  With repeat_last_n == 0 nothing is kept.  Ids
 * outside [0, n_vocab) are ignored (they cannot be penalised). */
void sp_sampler_accept(struct sp_sampler *s, int32_t token) {
    const int32_t cap = s->params.repeat_last_n;
    if (cap <= 0 || token < 0 || token >= s->n_vocab) return;
    s->hist[s->hist_next] = token;
    s->hist_next = s->hist_next + 1 == cap ? 0 : s->hist_next + 1;
    if (s->hist_len < cap) s->hist_len++;
}

void sp_sampler_history_set(struct sp_sampler *s, const int32_t *tokens, int32_t n) {
    s->hist_len = 0;
    s->hist_next = 0;
    const int32_t cap = s->params.repeat_last_n;
    for (int32_t i = n > cap ? n - cap : 0; i < n; i++) sp_sampler_accept(s, tokens[i]);
}

int32_t sp_sampler_history(const struct sp_sampler *s, int32_t *out) {
    const int32_t cap = s->params.repeat_last_n;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t k = s->hist_next - s->hist_len + i; /* oldest first */
        if (k < 0) k += cap;
        out[i] = s->hist[k];
    }
    return s->hist_len;
}

sp_status sp_sampler_set_params(struct sp_sampler *s, const struct sp_sampling_params *p) {
    sp_status rc = check_params(p);
    if (rc != SP_OK) return rc;
    if (p->repeat_last_n != s->params.repeat_last_n) {
        /* a new ring, keeping the most recent tokens that fit */
        int32_t *old = NULL, n = s->hist_len;
        if (n > 0 && !(old = sp_malloc((size_t)n * sizeof *old)))
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        if (n > 0) sp_sampler_history(s, old);
        int32_t *ring = p->repeat_last_n > 0 ? sp_calloc((size_t)p->repeat_last_n, sizeof *ring) : NULL;
        if (p->repeat_last_n > 0 && !ring) {
            sp_free(old);
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        }
        sp_free(s->hist);
        s->hist = ring;
        s->params = *p;
        sp_sampler_history_set(s, old, n);
        sp_free(old);
    }
    s->params = *p;
    return SP_OK;
}

void sp_sampler_rng_get(const struct sp_sampler *s, uint64_t rng[4]) {
    memcpy(rng, s->rng, sizeof s->rng);
}

void sp_sampler_rng_set(struct sp_sampler *s, const uint64_t rng[4]) {
    memcpy(s->rng, rng, sizeof s->rng);
}

/* ---- sampling ------------------------------------------------------------ */

/* cand[i] = {i, logits[i]} with non-finite values made orderable, then the
 * penalties applied to each distinct token in the history once: the
 * repetition penalty (divide a positive logit, multiply a negative one),
 * then logit -= count * frequency_penalty + presence_penalty. */
static void load_candidates(struct sp_sampler *s, const float *logits) {
    struct cand *c = s->cand;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float l = logits[i];
        if (isnan(l)) l = -INFINITY;
        else if (l > FLT_MAX) l = FLT_MAX;
        c[i].id = i;
        c[i].logit = l;
        c[i].p = 0.0f;
    }
    const float pen = s->params.repeat_penalty, freq = s->params.frequency_penalty, pres = s->params.presence_penalty;
    if ((pen == 1.0f && freq == 0.0f && pres == 0.0f) || s->hist_len == 0) return;
    for (int32_t j = 0; j < s->hist_len; j++) s->count[s->hist[j]]++;
    for (int32_t j = 0; j < s->hist_len; j++) {
        const int32_t t = s->hist[j];
        const int32_t k = s->count[t];
        if (!k) continue; /* applied already (the count is cleared as it is) */
        s->count[t] = 0;
        float l = c[t].logit;
        if (pen != 1.0f) l = l > 0.0f ? l / pen : l * pen;
        if (freq != 0.0f || pres != 0.0f) {
            l -= (float)k * freq + pres;
            if (isnan(l)) l = -INFINITY; /* -inf - (-x) stays -inf; keep it orderable anyway */
            else if (l > FLT_MAX) l = FLT_MAX;
        }
        c[t].logit = l;
    }
}

/* Choose the next token from n_vocab logits (read, never written).  Greedy
 * (temp 0) returns the lowest id among the maxima; otherwise a draw from the
 * filtered, renormalised distribution.  Never allocates; always returns an id
 * in [0, n_vocab). */
int32_t sp_sampler_sample(struct sp_sampler *s, const float *logits) {
    const struct sp_sampling_params *p = &s->params;
    struct cand *c = s->cand;
    size_t n = (size_t)s->n_vocab;

    load_candidates(s, logits);

    if (p->temp == 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++) {
            if (c[i].logit > c[best].logit) best = i;
        }
        return c[best].id;
    }

    /* top-k: keep the k best, sorted only if top-p needs the order. */
    const bool use_top_p = p->top_p < 1.0f;
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        cand_select(c, n, (size_t)p->top_k);
        n = (size_t)p->top_k;
    }
    if (use_top_p) {
        cand_sort(c, n);
    }

    /* softmax with temperature.  Subtracting the maximum before dividing by
     * temp keeps a tiny temp from overflowing: exponents are all <= 0 and the
     * best candidate gets exactly 1. */
    size_t imax = 0;
    for (size_t i = 1; i < n; i++) {
        if (before(&c[i], &c[imax])) imax = i;
    }
    const float lmax = c[imax].logit;
    if (lmax == -INFINITY) return c[imax].id; /* nothing is possible; stay defined */
    const float inv_t = 1.0f / p->temp;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        float e = expf((c[i].logit - lmax) * inv_t);
        if (!(e >= 0.0f)) e = 0.0f; /* NaN from inf*0 cannot occur, but stay safe */
        c[i].p = e;
        sum += e;
    }
    const float pmax = c[imax].p; /* 1, but read it rather than assume */

    /* top-p: the smallest prefix (in sorted order) whose mass reaches top_p. */
    if (use_top_p) {
        const double target = (double)p->top_p * sum;
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    /* min-p: drop candidates below min_p times the most likely one.  Ratios
     * are unchanged by renormalisation, so unnormalised values do. */
    if (p->min_p > 0.0f) {
        const float thr = p->min_p * pmax;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (c[i].p >= thr) c[m++] = c[i];
        }
        if (m == 0) { /* cannot happen (the maximum passes); keep one anyway */
            c[0] = c[imax];
            c[0].p = 1.0f;
            m = 1;
        }
        n = m;
    }

    /* renormalise implicitly: draw r in [0, total) and walk the cumulative sum. */
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += c[i].p;
    const double r = rand_double(s) * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    /* rounding put r at the very top: the last candidate with mass wins */
    for (size_t i = n; i-- > 0;) {
        if (c[i].p > 0.0f) return c[i].id;
    }
    return c[0].id;
}
