/*
 * xcache.c -- the expert pool's next-use replacement policy (see xcache.h).
 */
#include "xcache.h"

#define GAMMA 0.9 /* decay of an expert's use count per visit of its layer */
#define N_POW 64  /* GAMMA^64 ~ 0.001: older uses count as nothing */
#define GAP_B 6   /* gap buckets: last used 1, 2, 3, 4-7, 8-15 visits before, or longer / never */
#define FREQ_B 6  /* decayed-count buckets: < 0.1, < 0.5, < 1, < 2, < 4, more */
#define P_MIN 1e-3

struct sp_xcache {
    uint32_t n_layers, n_experts, words; /* words: 64-bit words of one layer's expert set */
    uint32_t last;                       /* layer of the last use, UINT32_MAX before any */
    uint64_t *visits;                    /* (n_layers) visits of each layer so far */
    float *freq;                         /* (n_layers * n_experts) decayed use count, as of fvisit */
    uint64_t *fvisit, *lastv;            /* visit of the count's update / of the last use (0: never) */
    uint8_t *cell;                       /* (n_layers * n_experts) its cell at the start of the current visit */
    uint8_t *ncell;                      /* (n_layers * n_experts) its cell at the layer's next visit */
    uint64_t *cur;                       /* (n_layers * words) experts used at the layer's current visit */
    double hits[GAP_B * FREQ_B], seen[GAP_B * FREQ_B]; /* per cell: chosen at a visit / visits seen */
    double gpow[N_POW];
    double tab[GAP_B * FREQ_B];          /* n_layers * (1/p - 1) per cell, as of the last visit */
};
sp_status sp_xcache_new(uint32_t n_layers, uint32_t n_experts, struct sp_xcache **out) {
    *out = NULL;
    if (!n_layers || !n_experts || n_layers > 4096 || n_experts > 65536)
        return sp_err(SP_E_INVALID, "%s: %u layers x %u experts", __func__, n_layers, n_experts);
    struct sp_xcache *x = sp_calloc(1, sizeof *x);
    if (!x) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    const size_t items = (size_t)n_layers * n_experts;
    x->n_layers = n_layers;
    x->n_experts = n_experts;
    x->words = (n_experts + 63) / 64;
    x->last = UINT32_MAX;
    x->visits = sp_calloc(n_layers, sizeof *x->visits);
    x->freq = sp_calloc(items, sizeof *x->freq);
    x->fvisit = sp_calloc(items, sizeof *x->fvisit);
    x->lastv = sp_calloc(items, sizeof *x->lastv);
    x->cell = sp_calloc(items, 1);
    x->ncell = sp_calloc(items, 1);
    x->cur = sp_calloc((size_t)n_layers * x->words, sizeof *x->cur);
    if (!x->visits || !x->freq || !x->fvisit || !x->lastv || !x->cell || !x->ncell || !x->cur) {
        sp_xcache_free(x);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    double g = 1;
    for (int i = 0; i < N_POW; i++, g *= GAMMA) x->gpow[i] = g;
    /* a weak prior: every cell starts at the uniform rate, 1 / n_experts per
     * expert used (unknown here: 1/16), worth 4 observations */
    for (int c = 0; c < GAP_B * FREQ_B; c++) {
        x->hits[c] = 0.25;
        x->seen[c] = 4;
        x->tab[c] = n_layers * (1.0 / 0.0625 - 1.0);
    }
    memset(x->ncell, (GAP_B - 1) * FREQ_B, items); /* never used */
    *out = x;
    return SP_OK;
}

void sp_xcache_free(struct sp_xcache *x) {
    if (!x) return;
    sp_free(x->visits);
    sp_free(x->freq);
    sp_free(x->fvisit);
    sp_free(x->lastv);
    sp_free(x->cell);
    sp_free(x->ncell);
    sp_free(x->cur);
    sp_free(x);
}

/* The cell of expert item it at layer visit v (v > the visit of its last
 * use): how long ago it was last used, and its decayed use count then. */
static uint32_t cell_at(const struct sp_xcache *x, size_t it, uint64_t v) {
    uint32_t g = GAP_B - 1;
    if (x->lastv[it]) {
        const uint64_t gap = v - x->lastv[it];
        g = gap <= 3 ? (uint32_t)gap - 1 : gap <= 7 ? 3 : gap <= 15 ? 4 : GAP_B - 1;
    }
    const uint64_t age = v - x->fvisit[it];
    const double f = x->freq[it] * (age < N_POW ? x->gpow[age] : 0.0);
    const uint32_t b = f < 0.1 ? 0 : f < 0.5 ? 1 : f < 1 ? 2 : f < 2 ? 3 : f < 4 ? 4 : FREQ_B - 1;
    return g * FREQ_B + b;
}

void sp_xcache_use(struct sp_xcache *x, uint32_t l, uint32_t e) {
    if (!x || l >= x->n_layers || e >= x->n_experts) return;
    const size_t base = (size_t)l * x->n_experts;
    uint64_t *S = x->cur + (size_t)l * x->words;
    if (l != x->last) { /* a new visit of layer l */
        const uint64_t v = ++x->visits[l];
        for (uint32_t k = 0; k < x->n_experts; k++) {
            if (v > 1) { /* what the visit before taught: each cell's rate of being chosen */
                const uint32_t c = x->cell[base + k];
                x->seen[c] += 1;
                x->hits[c] += (double)((S[k / 64] >> (k % 64)) & 1);
            }
            x->cell[base + k] = (uint8_t)cell_at(x, base + k, v);
            x->ncell[base + k] = (uint8_t)cell_at(x, base + k, v + 1);
        }
        memset(S, 0, (size_t)x->words * sizeof *S);
        x->last = l;
        for (int c = 0; c < GAP_B * FREQ_B; c++) {
            const double p = SP_MIN(SP_MAX(x->hits[c] / x->seen[c], P_MIN), 1.0);
            x->tab[c] = x->n_layers * (1.0 / p - 1.0);
        }
    }
    const size_t it = base + e;
    const uint64_t v = x->visits[l];
    S[e / 64] |= 1ull << (e % 64);
    if (x->lastv[it] == v) return; /* counted at this visit already */
    const uint64_t age = v - x->fvisit[it];
    x->freq[it] = (float)(x->freq[it] * (age < N_POW ? x->gpow[age] : 0.0) + 1.0);
    x->fvisit[it] = x->lastv[it] = v;
    x->ncell[it] = (uint8_t)cell_at(x, it, v + 1);
}

double sp_xcache_rate(const struct sp_xcache *x, uint32_t gap, double f) {
    if (!x || gap < 1) return -1;
    const uint32_t g = gap <= 3 ? gap - 1 : gap <= 7 ? 3 : gap <= 15 ? 4 : GAP_B - 1;
    const uint32_t b = f < 0.1 ? 0 : f < 0.5 ? 1 : f < 1 ? 2 : f < 2 ? 3 : f < 4 ? 4 : FREQ_B - 1;
    return x->hits[g * FREQ_B + b] / x->seen[g * FREQ_B + b];
}

uint64_t sp_xcache_visits(const struct sp_xcache *x, uint32_t l) {
    return x && l < x->n_layers ? x->visits[l] : 0;
}

double sp_xcache_evict_score(const struct sp_xcache *x, uint32_t l, uint32_t e, bool fresh, double guess_rate) {
    if (!x || l >= x->n_layers || e >= x->n_experts) return 0;
    const uint32_t L = x->n_layers, cur = x->last == UINT32_MAX ? 0 : x->last;
    const uint32_t d = (l + L - cur - 1) % L + 1; /* visits until layer l comes round */
    double t = x->tab[x->ncell[(size_t)l * x->n_experts + e]]; /* n_layers * (1/p - 1), p its chance then */
    if (fresh) t = SP_MIN(t, L * (1.0 / SP_MIN(SP_MAX(guess_rate, P_MIN), 1.0) - 1.0));
    return (double)d + t;
}
