/*
 * budget.h -- the one memory account of a model: every byte Sparrow keeps
 * resident under --mem-budget is reserved here by its owner before it is
 * allocated -- the process itself at plan time, the weights (pinned region,
 * streaming pools, bookkeeping), each session's KV cache quota and its
 * scratch -- so that the sum never passes the budget and a refusal can say
 * what takes the memory.  Thread-safe (sessions of one model may be created
 * on several threads).  Without a budget the account only counts.
 */
#ifndef SP_MEM_BUDGET_H
#define SP_MEM_BUDGET_H

#include "core/core.h"

enum sp_budget_owner {
    SP_BUDGET_BASE = 0, /* the process before weights: code, heap, tokenizer */
    SP_BUDGET_WEIGHTS,  /* pinned weights, streaming pools, pager bookkeeping and margin */
    SP_BUDGET_KV,       /* KV cache block quotas of the sessions */
    SP_BUDGET_SCRATCH,  /* forward-pass scratch and logits of the sessions */
    SP_BUDGET_OWNER_COUNT
};

struct sp_budget_stats {
    uint64_t limit;                          /* 0 = no budget */
    uint64_t used;                           /* sum over the owners */
    uint64_t peak;                           /* the most used at once */
    uint64_t owner[SP_BUDGET_OWNER_COUNT];
};

struct sp_budget;

/* limit 0: no budget (every reservation succeeds, all are counted). */
sp_status sp_budget_init(uint64_t limit, struct sp_budget **out);
void sp_budget_free(struct sp_budget *b);

/* Reserve bytes for owner: SP_E_NOMEM when they would pass the limit, the
 * message naming `what`, the bytes asked for, what is left and what each
 * owner holds. */
sp_status sp_budget_reserve(struct sp_budget *b, enum sp_budget_owner owner, uint64_t bytes, const char *what);
void sp_budget_release(struct sp_budget *b, enum sp_budget_owner owner, uint64_t bytes);

void sp_budget_get(const struct sp_budget *b, struct sp_budget_stats *out);

/* "weights", "KV cache", ... */
const char *sp_budget_owner_name(enum sp_budget_owner o);

#endif /* SP_MEM_BUDGET_H */
