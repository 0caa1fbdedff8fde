/*
 * xcache.h -- the replacement policy of the pager's expert pool (pager.c
 * asks it which cached expert slice to give up).
 *
 * The forward pass visits the layers in a cycle and, at each visit of a
 * layer, uses a few of its experts.  Least-recently-used is a poor fit for
 * that cycle: when layer l misses, the least recently used slices are the
 * ones of the layers just ahead (l+1, l+2, ...), i.e. the next to be needed,
 * so LRU evicts exactly what comes next -- on uniform routing it hits less
 * often than the cache's share of the experts.  The next-use policy evicts
 * the slice whose next use is expected furthest away:
 *
 *     next use (in layer visits) = d + n_layers * (1/p - 1)
 *
 * where d is the number of layer visits until its layer comes round again
 * (1 for the next layer, n_layers for the current one), and p the
 * probability that its expert is chosen at that visit.  p is learned online,
 * over all layers, for each cell of a small table: how many visits ago the
 * expert was last used (1, 2, 3, 4-7, 8-15, more or never) by its use count
 * decayed by GAMMA per visit (6 buckets) -- at every visit of a layer, each
 * of its experts counts as seen in its cell, and as chosen if it was.  So
 * the policy measures whether recency (experts reused from one token to the
 * next) and popularity (experts chosen often) predict the routing, rather
 * than assuming either: on uniform routing every cell learns the same rate,
 * d alone decides, and each layer keeps its share of the cache (the hit rate
 * is then the cache's share of the experts, which LRU's cycle falls short
 * of); where recency or popularity predict, the cells rank the experts.
 * A prefetched slice nobody has used yet counts with at least the measured
 * accuracy of the guesses.  Ties go to the least recently used.
 *
 * Not thread-safe: the pager calls it under its lock.  Memory: a few bytes
 * per (layer, expert), allocated once.
 */
#ifndef SP_XCACHE_H
#define SP_XCACHE_H
#include "core/core.h"

struct sp_xcache;

/* Policy state for n_layers x n_experts experts.  SP_E_NOMEM, SP_E_INVALID. */
sp_status sp_xcache_new(uint32_t n_layers, uint32_t n_experts, struct sp_xcache **out);
void sp_xcache_free(struct sp_xcache *x);

/* Expert e of layer l is used (the router chose it): counted once per visit
 * of the layer however many of its slices are pinned.  A use of a layer other
 * than the last one used starts a new visit of l. */
void sp_xcache_use(struct sp_xcache *x, uint32_t l, uint32_t e);

/* Visits of layer l so far (a guess prefetched for its next visit is still
 * pending while this is below that visit's number). */
uint64_t sp_xcache_visits(const struct sp_xcache *x, uint32_t l);

/* How strongly to evict a slice of expert e of layer l now, the layer of the
 * last use being the one served (also while the next layer's experts are
 * prefetched on a guess): larger = evict first.  fresh: the slice was
 * prefetched on a guess for a visit still to come, guess_rate the fraction
 * of guesses used. */
double sp_xcache_evict_score(const struct sp_xcache *x, uint32_t l, uint32_t e, bool fresh, double guess_rate);

/* The learned chance that an expert last used gap visits ago (>= 1) whose
 * decayed use count is f is chosen at its layer's next visit (tests,
 * reports); -1 for gap 0. */
double sp_xcache_rate(const struct sp_xcache *x, uint32_t gap, double f);
#endif /* SP_XCACHE_H */
