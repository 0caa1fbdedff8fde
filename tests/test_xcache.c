/*
 * test_xcache.c -- the expert cache's next-use policy (mem/xcache.h) against
 * LRU, on a cache of expert items driven the way the pager drives its expert
 * pool: a 48-layer, 128-expert, 8-used layout (qwen3-30b-a3b's), each layer
 * visited in turn, the visit's experts kept while the misses are read.
 *  1. Uniform routing: the next-use policy hits at least the cache's share
 *     of the experts (less 5%) and no less often than LRU, which falls short
 *     of that share (its cycle evicts the layers just ahead).
 *  2. Routing with reuse and popular experts: next-use hits more often than
 *     LRU, and the rates it learned rank recently used experts above ones
 *     not seen for long.
 *  3. Bad arguments are refused; use of out-of-range experts is ignored.
 * bench/expertcache.c measures the same through the real pager.
 */
#include "mem/xcache.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

enum { NL = 48, NX = 128, NK = 8, NI = NL * NX };

static uint64_t rs;
static double rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}

/* One token's routing of layer l: uniform, or (reuse > 0) each of the
 * previous token's experts again with probability reuse, the rest from a
 * Zipf(1) popularity over a fixed order of the layer's experts. */
static void route(int l, double reuse, const int *perm, const double *cdf, int prev[NL][NK], int *out) {
    int n = 0;
    if (reuse > 0)
        for (int j = 0; j < NK; j++)
            if (rnd() < reuse) out[n++] = prev[l][j];
    while (n < NK) {
        int e;
        if (reuse <= 0) {
            e = (int)(rnd() * NX) % NX;
        } else {
            const double u = rnd() * cdf[NX - 1];
            int lo = 0, hi = NX - 1;
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (cdf[mid] < u) lo = mid + 1;
                else hi = mid;
            }
            e = perm[l * NX + lo];
        }
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= out[j] == e;
        if (!dup) out[n++] = e;
    }
    memcpy(prev[l], out, sizeof prev[l]);
}

/* Hit rate of a cache of C items over T tokens (the first fifth not
 * counted); next_use or LRU.  *xo receives the policy state (caller frees). */
static double replay(int C, int T, double reuse, bool next_use, struct sp_xcache **xo) {
    static int perm[NI], slot_item[NI], where[NI], prev[NL][NK];
    static uint64_t last[NI];
    static double cdf[NX];
    struct sp_xcache *x = NULL;
    CHECK(sp_xcache_new(NL, NX, &x) == SP_OK);
    rs = 0x9e3779b97f4a7c15ull;
    for (int l = 0; l < NL; l++) {
        for (int e = 0; e < NX; e++) perm[l * NX + e] = e;
        for (int e = NX - 1; e > 0; e--) {
            const int j = (int)(rnd() * (e + 1)) % (e + 1), t = perm[l * NX + e];
            perm[l * NX + e] = perm[l * NX + j];
            perm[l * NX + j] = t;
        }
    }
    double acc = 0;
    for (int e = 0; e < NX; e++) cdf[e] = acc += 1.0 / (e + 1);
    for (int i = 0; i < NI; i++) where[i] = -1;
    memset(prev, 0, sizeof prev);
    int used = 0;
    uint64_t tick = 0;
    long hits = 0, total = 0;
    for (int t = 0; t < T; t++) {
        for (int l = 0; l < NL; l++) {
            int ch[NK];
            route(l, t ? reuse : 0, perm, cdf, prev, ch);
            for (int j = 0; j < NK; j++) sp_xcache_use(x, (uint32_t)l, (uint32_t)ch[j]);
            for (int j = 0; j < NK; j++) {
                const int it = l * NX + ch[j];
                if (t >= T / 5) total++;
                if (where[it] >= 0) {
                    if (t >= T / 5) hits++;
                    last[where[it]] = ++tick;
                    continue;
                }
                int s = used < C ? used++ : -1;
                if (s < 0) { /* evict: never one of this visit's experts; ties to the least recent */
                    double best = -INFINITY;
                    uint64_t best_last = 0;
                    for (int k = 0; k < C; k++) {
                        const int v = slot_item[k];
                        bool now = false;
                        for (int q = 0; q < NK; q++) now |= v == l * NX + ch[q];
                        if (now) continue;
                        const double sc = next_use ? sp_xcache_evict_score(x, (uint32_t)(v / NX), (uint32_t)(v % NX),
                                                                           false, 0)
                                                   : 0;
                        if (sc > best || (sc == best && last[k] < best_last)) {
                            best = sc;
                            best_last = last[k];
                            s = k;
                        }
                    }
                    where[slot_item[s]] = -1;
                }
                slot_item[s] = it;
                where[it] = s;
                last[s] = ++tick;
            }
        }
    }
    if (xo) *xo = x;
    else sp_xcache_free(x);
    return total ? (double)hits / (double)total : 0;
}

int main(void) {
    sp_init();
    const double fracs[2] = {0.10, 0.25};
    for (int f = 0; f < 2; f++) {
        const int C = (int)(fracs[f] * NI);
        const double lru = replay(C, 150, 0, false, NULL), nu = replay(C, 150, 0, true, NULL);
        printf("  uniform, cache %.0f%% of the experts: hit rate LRU %.4f, next-use %.4f\n", fracs[f] * 100, lru, nu);
        CHECKF(nu >= 0.95 * fracs[f], "next-use %.4f below the cache's share %.2f", nu, fracs[f]);
        CHECKF(nu >= lru, "next-use %.4f below LRU %.4f on uniform routing", nu, lru);
    }
    for (int f = 0; f < 2; f++) {
        const int C = (int)(fracs[f] * NI);
        struct sp_xcache *x = NULL;
        const double lru = replay(C, 150, 0.4, false, NULL), nu = replay(C, 150, 0.4, true, &x);
        printf("  reuse 0.4 + Zipf(1), cache %.0f%%: hit rate LRU %.4f, next-use %.4f (learned: chosen again at "
               "the next visit %.3f, after 16+ visits unused %.3f)\n",
               fracs[f] * 100, lru, nu, sp_xcache_rate(x, 1, 1.0), sp_xcache_rate(x, 20, 0.05));
        CHECKF(nu > lru, "next-use %.4f not above LRU %.4f with reuse", nu, lru);
        CHECK(sp_xcache_rate(x, 1, 1.0) > 2 * sp_xcache_rate(x, 20, 0.05));
        sp_xcache_free(x);
    }
    struct sp_xcache *x = NULL;
    CHECK(sp_xcache_new(0, 8, &x) == SP_E_INVALID && !x);
    CHECK(sp_xcache_new(4, 0, &x) == SP_E_INVALID && !x);
    CHECK(sp_xcache_new(4, 8, &x) == SP_OK && x);
    sp_xcache_use(x, 4, 0); /* out of range: ignored */
    sp_xcache_use(x, 0, 8);
    CHECK(sp_xcache_rate(x, 0, 1) == -1);
    CHECK(sp_xcache_evict_score(x, 9, 0, false, 0) == 0);
    sp_xcache_free(x);
    sp_xcache_free(NULL);
    return test_report("test_xcache");
}
