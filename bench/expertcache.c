/*
 * expertcache.c -- the expert cache's policies on routing traces (issue 21,
 * acceptance 4): bytes read per token and hit rates of the pager's expert
 * pool under LRU and under the next-use policy (mem/xcache.h), replaying the
 * same routing through the real pager and plan of a MoE model under a
 * memory budget.
 *
 *   expertcache MODEL BUDGET [--tokens N] [--warmup N] [--seed S]
 *               [--reuse R] [--zipf Z] [--guess A] [--json]
 *
 * For each token and each layer the forward pass would run, the trace picks
 * the layer's experts_used experts; the tool tells the pager they are needed
 * (sp_pager_need_spans, as the forward pass does once the router has chosen), then
 * pins and unpins every unit of their gate, up and down slices (at most 64
 * experts a layer).  With
 * --guess A it first prefetches a guess of the next layer's experts, each
 * guess right with probability A (the forward pass guesses from the next
 * layer's router).  No arithmetic is done: only the pager's reads.
 * Traces:
 *   uniform   experts drawn uniformly (distinct within a layer)
 *   locality  each of the previous token's experts of the layer chosen again
 *             with probability R (default 0.4), the rest drawn from a
 *             Zipf(Z) popularity (default 1.0) over a random order of the
 *             layer's experts -- popular experts and reuse from token to
 *             token, as measured routing shows
 * The first --warmup tokens (default 20% of --tokens, 200) fill the cache and
 * are not counted.  BUDGET takes binary units (96M, 7.5G).  The model file
 * is read with O_DIRECT: copy it to /dev/shm to make the run take seconds
 * (the figures are counts, not times).
 */
#include "core/core.h"
#include "format/model_file.h"
#include "mem/pager.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct xtensors {
    const struct sp_tensor_desc *t[3]; /* gate, up, down */
};

static uint64_t rng_state;
static double rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static int parse_size(const char *s, uint64_t *out) {
    char *end;
    const double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (end == s || *end || !(v > 0)) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

struct trace {
    int kind; /* 0 uniform, 1 locality */
    uint32_t L, X, K;
    double reuse, zipf;
    uint32_t *perm;  /* (L * X) popularity order per layer */
    double *cdf;     /* (X) Zipf cumulative weights */
    uint32_t *prev;  /* (L * K) the previous token's choice */
    bool have_prev;
};

static void pick(struct trace *tr, uint32_t l, uint32_t *out) {
    uint32_t n = 0;
    if (tr->kind == 1 && tr->have_prev)
        for (uint32_t j = 0; j < tr->K; j++)
            if (rnd() < tr->reuse) out[n++] = tr->prev[(size_t)l * tr->K + j];
    while (n < tr->K) {
        uint32_t e;
        if (tr->kind == 0) {
            e = (uint32_t)(rnd() * tr->X) % tr->X;
        } else {
            const double u = rnd() * tr->cdf[tr->X - 1];
            uint32_t lo = 0, hi = tr->X - 1;
            while (lo < hi) {
                const uint32_t mid = (lo + hi) / 2;
                if (tr->cdf[mid] < u) lo = mid + 1;
                else hi = mid;
            }
            e = tr->perm[(size_t)l * tr->X + lo];
        }
        bool dup = false;
        for (uint32_t j = 0; j < n; j++) dup |= out[j] == e;
        if (!dup) out[n++] = e;
    }
    memcpy(tr->prev + (size_t)l * tr->K, out, tr->K * sizeof *out);
}

/* Pin and unpin every unit of expert e's slice of t. */
static sp_status touch(struct sp_pager *pg, const struct sp_tensor_desc *t, uint32_t e) {
    const uint64_t slice = t->size / (uint64_t)t->ne[2], rows = (uint64_t)t->ne[1], row = slice / rows;
    const uint64_t step = sp_pager_unit_rows(pg, t);
    for (uint64_t r = 0; r < rows; r += step) {
        const void *w;
        const uint64_t nr = SP_MIN(step, rows - r);
        sp_status rc = sp_pager_pin_range(pg, t, (uint64_t)e * slice + r * row, nr * row, &w);
        if (rc) return rc;
        sp_pager_unpin(pg, t, w);
    }
    return SP_OK;
}

static void slice_of(const struct sp_tensor_desc *t, uint32_t e, uint64_t *off, uint64_t *n) {
    *n = t->size / (uint64_t)t->ne[2];
    *off = (uint64_t)e * *n;
}

struct result {
    double hit, mib_per_token, predicted, guess_used;
    uint32_t slots, units;
};

static int run(const struct sp_model_file *mf, const struct xtensors *xt, uint32_t L, uint64_t budget,
               enum sp_expert_cache policy, int kind, uint32_t tokens, uint32_t warm, uint64_t seed, double reuse,
               double zipf, double guess, struct result *res) {
    const uint32_t X = mf->hp.n_experts, K = mf->hp.n_experts_used;
    struct sp_pager_config cfg = {.mode = SP_WEIGHTS_LOAD, .budget = budget, .n_experts = X, .n_experts_used = K,
                                  .expert_cache = policy};
    struct sp_pager *pg = NULL;
    sp_status rc = sp_pager_open(mf, &cfg, &pg);
    if (!rc) {
        /* counts, not times: no speed measurement, no process-size guess */
        const struct sp_pager_tuning tu = {.margin_set = true, .base_set = true, .read_bps = 1e9, .mem_bps = 1e10};
        sp_pager_tune(pg, &tu);
        rc = sp_pager_apply(pg, 0);
    }
    if (rc) {
        fprintf(stderr, "expertcache: %s\n", sp_last_error());
        sp_pager_close(pg);
        return 1;
    }
    const struct sp_plan *p = sp_pager_plan(pg);
    if (!p || !p->expert_slots) {
        fprintf(stderr, "expertcache: the experts do not stream under this budget (nothing to measure)\n");
        sp_pager_close(pg);
        return 1;
    }
    res->predicted = p->expert_hit_rate;
    res->slots = p->expert_slots;
    res->units = (uint32_t)p->expert_units;
    struct trace tr = {.kind = kind, .L = L, .X = X, .K = K, .reuse = reuse, .zipf = zipf};
    tr.perm = sp_malloc((size_t)L * X * sizeof *tr.perm);
    tr.cdf = sp_malloc(X * sizeof *tr.cdf);
    tr.prev = sp_calloc((size_t)L * K, sizeof *tr.prev);
    uint32_t *cur = sp_malloc((size_t)L * K * sizeof *cur);
    if (!tr.perm || !tr.cdf || !tr.prev || !cur) {
        fprintf(stderr, "expertcache: out of memory\n");
        return 1;
    }
    rng_state = seed * 2654435761u + 88172645463325252ull;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t *pm = tr.perm + (size_t)l * X;
        for (uint32_t e = 0; e < X; e++) pm[e] = e;
        for (uint32_t e = X - 1; e > 0; e--) {
            const uint32_t j = (uint32_t)(rnd() * (e + 1)) % (e + 1), t = pm[e];
            pm[e] = pm[j];
            pm[j] = t;
        }
    }
    double acc = 0;
    for (uint32_t e = 0; e < X; e++) tr.cdf[e] = acc += 1.0 / pow(e + 1.0, zipf);
    struct sp_pager_stats s0 = {0}, s1;
    int ret = 0;
    for (uint32_t tok = 0; tok < tokens + warm && !ret; tok++) {
        if (tok == warm) sp_pager_get_stats(pg, &s0);
        for (uint32_t l = 0; l < L; l++) pick(&tr, l, cur + (size_t)l * K); /* the token's routing */
        tr.have_prev = true;
        for (uint32_t l = 0; l < L && !ret; l++) {
            const uint32_t *ch = cur + (size_t)l * K;
            struct sp_pager_span need[3 * 64];
            uint32_t nn = 0;
            for (uint32_t j = 0; j < K && nn + 3 <= SP_ARRAY_LEN(need); j++)
                for (int k = 0; k < 3; k++, nn++) {
                    need[nn].t = xt[l].t[k];
                    slice_of(xt[l].t[k], ch[j], &need[nn].off, &need[nn].n);
                }
            sp_pager_need_spans(pg, need, nn); /* as the forward pass does */
            if (guess > 0 && l + 1 < L) { /* the next layer's experts, guessed */
                for (uint32_t j = 0; j < K; j++) {
                    const uint32_t e = rnd() < guess ? cur[(size_t)(l + 1) * K + j] : (uint32_t)(rnd() * X) % X;
                    for (int k = 0; k < 3; k++) {
                        uint64_t off, n;
                        slice_of(xt[l + 1].t[k], e, &off, &n);
                        sp_pager_prefetch(pg, xt[l + 1].t[k], off, n);
                    }
                }
            }
            for (uint32_t j = 0; j < K && !ret; j++)
                for (int k = 0; k < 3 && !ret; k++)
                    if (touch(pg, xt[l].t[k], ch[j])) {
                        fprintf(stderr, "expertcache: %s\n", sp_last_error());
                        ret = 1;
                    }
        }
    }
    sp_pager_get_stats(pg, &s1);
    const double pins = (double)(s1.expert_pins - s0.expert_pins);
    res->hit = pins > 0 ? (double)(s1.expert_hits - s0.expert_hits) / pins : NAN;
    res->mib_per_token = (double)(s1.bytes_read - s0.bytes_read) / tokens / 1048576.0;
    const double issued = (double)(s1.prefetch_issued - s0.prefetch_issued);
    res->guess_used = issued > 0 ? (double)(s1.prefetch_used - s0.prefetch_used) / issued : NAN;
    sp_free(tr.perm);
    sp_free(tr.cdf);
    sp_free(tr.prev);
    sp_free(cur);
    sp_pager_close(pg);
    return ret;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: expertcache MODEL BUDGET [--tokens N] [--warmup N] [--seed S] [--reuse R] [--zipf Z] "
                        "[--guess A] [--json]\n");
        return 2;
    }
    uint64_t budget;
    if (parse_size(argv[2], &budget)) {
        fprintf(stderr, "expertcache: bad budget '%s' (e.g. 96M, 7.5G)\n", argv[2]);
        return 2;
    }
    uint32_t tokens = 1000, warm = UINT32_MAX;
    uint64_t seed = 1;
    double reuse = 0.4, zipf = 1.0, guess = 0;
    bool json = false;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!v) { fprintf(stderr, "expertcache: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--tokens")) tokens = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--warmup")) warm = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--reuse")) reuse = atof(v);
        else if (!strcmp(a, "--zipf")) zipf = atof(v);
        else if (!strcmp(a, "--guess")) guess = atof(v);
        else { fprintf(stderr, "expertcache: unknown option '%s'\n", a); return 2; }
        i++;
    }
    if (!tokens || reuse < 0 || reuse > 1 || zipf < 0 || guess < 0 || guess > 1) {
        fprintf(stderr, "expertcache: --tokens > 0, --reuse and --guess in [0, 1], --zipf >= 0\n");
        return 2;
    }
    if (warm == UINT32_MAX) warm = SP_MIN(tokens / 5, 200u);
    struct sp_model_file *mf;
    if (sp_model_file_open(argv[1], NULL, false, &mf)) {
        fprintf(stderr, "expertcache: %s\n", sp_last_error());
        return 1;
    }
    const uint32_t L = mf->hp.n_layers;
    struct xtensors *xt = sp_calloc(L ? L : 1, sizeof *xt);
    static const char *const names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    for (uint32_t i = 0; xt && i < mf->n_tensors; i++) {
        unsigned l;
        int at = 0;
        const char *nm = mf->tensors[i].name;
        if (sscanf(nm, "blk.%u.%n", &l, &at) != 1 || !at || l >= L) continue;
        for (int k = 0; k < 3; k++)
            if (!strcmp(nm + at, names[k])) xt[l].t[k] = &mf->tensors[i];
    }
    for (uint32_t l = 0; xt && l < L; l++)
        for (int k = 0; k < 3; k++)
            if (!xt[l].t[k]) {
                fprintf(stderr, "expertcache: %s: layer %u has no %s (a MoE model with separate gate/up/down "
                                "experts is needed)\n", argv[1], l, names[k]);
                return 1;
            }
    if (!xt || mf->hp.n_experts < 2) {
        fprintf(stderr, "expertcache: %s is not a MoE model\n", argv[1]);
        return 1;
    }
    static const char *const kinds[2] = {"uniform", "locality"};
    static const char *const pols[2] = {"lru", "next-use"};
    const enum sp_expert_cache pv[2] = {SP_EXPERT_CACHE_LRU, SP_EXPERT_CACHE_NEXT_USE};
    struct result r[2][2];
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 2; q++)
            if (run(mf, xt, L, budget, pv[q], k, tokens, warm, seed, reuse, zipf, guess, &r[k][q])) return 1;
    if (json) {
        printf("{\"model\": \"%s\", \"budget_bytes\": %llu, \"tokens\": %u, \"warmup\": %u, \"reuse\": %g, "
               "\"zipf\": %g, \"guess\": %g, \"expert_slots\": %u, \"expert_units\": %u, \"predicted_hit_rate\": %.4f, "
               "\"runs\": [", argv[1], (unsigned long long)budget, tokens, warm, reuse, zipf, guess, r[0][0].slots,
               r[0][0].units, r[0][0].predicted);
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 2; q++)
                printf("%s{\"trace\": \"%s\", \"policy\": \"%s\", \"hit_rate\": %.4f, \"mib_per_token\": %.4f}",
                       k || q ? ", " : "", kinds[k], pols[q], r[k][q].hit, r[k][q].mib_per_token);
        printf("]}\n");
    } else {
        printf("expertcache: %s, budget %.1f MiB: %u expert slots for %u units (plan's hit rate %.3f), %u layers x "
               "%u experts, %u used; %u tokens after %u of warm-up, seed %llu%s\n",
               argv[1], budget / 1048576.0, r[0][0].slots, r[0][0].units, r[0][0].predicted, L, mf->hp.n_experts,
               mf->hp.n_experts_used, tokens, warm, (unsigned long long)seed, guess > 0 ? ", with guesses" : "");
        printf("| trace | policy | expert hit rate | MiB read per token | vs LRU |\n|---|---|---:|---:|---:|\n");
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 2; q++)
                printf("| %s | %s | %.4f | %.3f | %.3f |\n", kinds[k], pols[q], r[k][q].hit, r[k][q].mib_per_token,
                       r[k][q].mib_per_token / r[k][0].mib_per_token);
        printf("locality: reuse %.2f, zipf %.2f\n", reuse, zipf);
    }
    sp_free(xt);
    sp_model_file_free(mf);
    return 0;
}
