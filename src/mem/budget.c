/*
 * budget.c -- the memory account (budget.h).  Invariant: with a limit,
 * used = sum of owner[] <= limit at all times (a reservation that would pass
 * it is refused whole); releases never go below zero (SP_ASSERT).
 */
#include "budget.h"

#include <pthread.h>

struct sp_budget {
    pthread_mutex_t mu;
    struct sp_budget_stats st;
};

static const char *const owner_names[SP_BUDGET_OWNER_COUNT] = {"the process", "weights", "KV cache", "scratch"};

const char *sp_budget_owner_name(enum sp_budget_owner o) {
    return (unsigned)o < SP_BUDGET_OWNER_COUNT ? owner_names[o] : "?";
}

sp_status sp_budget_init(uint64_t limit, struct sp_budget **out) {
    *out = NULL;
    struct sp_budget *b = sp_calloc(1, sizeof *b);
    if (!b) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        sp_free(b);
        return sp_err(SP_E_NOMEM, "%s: cannot create a mutex", __func__);
    }
    b->st.limit = limit;
    *out = b;
    return SP_OK;
}

void sp_budget_free(struct sp_budget *b) {
    if (!b) return;
    pthread_mutex_destroy(&b->mu);
    sp_free(b);
}

sp_status sp_budget_reserve(struct sp_budget *b, enum sp_budget_owner owner, uint64_t bytes, const char *what) {
    SP_ASSERT((unsigned)owner < SP_BUDGET_OWNER_COUNT);
    if (!b || bytes == 0) return SP_OK;
    pthread_mutex_lock(&b->mu);
    struct sp_budget_stats *s = &b->st;
    if (s->limit && (bytes > s->limit || s->used > s->limit - bytes)) {
        const double M = 1048576.0;
        const uint64_t left = s->limit - SP_MIN(s->used, s->limit);
        const struct sp_budget_stats c = *s;
        pthread_mutex_unlock(&b->mu);
        return sp_err(SP_E_NOMEM,
                      "%s needs %.1f MiB, but the memory budget of %.1f MiB has %.1f MiB left (weights %.1f MiB, KV "
                      "caches %.1f MiB, scratch %.1f MiB, the process %.1f MiB): free a session, use a smaller "
                      "context (-c) or cache type (-ctk/-ctv), or raise --mem-budget",
                      what, bytes / M, c.limit / M, left / M, c.owner[SP_BUDGET_WEIGHTS] / M, c.owner[SP_BUDGET_KV] / M,
                      c.owner[SP_BUDGET_SCRATCH] / M, c.owner[SP_BUDGET_BASE] / M);
    }
    s->owner[owner] += bytes;
    s->used += bytes;
    if (s->used > s->peak) s->peak = s->used;
    pthread_mutex_unlock(&b->mu);
    return SP_OK;
}

void sp_budget_release(struct sp_budget *b, enum sp_budget_owner owner, uint64_t bytes) {
    SP_ASSERT((unsigned)owner < SP_BUDGET_OWNER_COUNT);
    if (!b || bytes == 0) return;
    pthread_mutex_lock(&b->mu);
    SP_ASSERT(b->st.owner[owner] >= bytes && b->st.used >= bytes);
    b->st.owner[owner] -= bytes;
    b->st.used -= bytes;
    pthread_mutex_unlock(&b->mu);
}

void sp_budget_get(const struct sp_budget *b, struct sp_budget_stats *out) {
    memset(out, 0, sizeof *out);
    if (!b) return;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    *out = b->st;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
}
