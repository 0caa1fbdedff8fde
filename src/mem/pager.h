/*
 * pager.h -- the weight pager: the only way the forward pass reaches tensor
 * data.  Contract as SQLite's page cache: sp_pager_pin_range() returns a
 * pointer to resident bytes of a tensor that stays valid until the matching
 * sp_pager_unpin() with that pointer; "one unpin per successful pin".
 *
 * Two back ends behind the same calls:
 *  - resident (no budget, or a budget the whole model fits in): a read-only
 *    mapping of the file, or one anonymous region the weights are read into;
 *  - budgeted: a plan (plan.h) pins what the budget allows and streams the
 *    rest through fixed pools of slots, reading exact spans of the file with
 *    O_DIRECT on I/O threads, prefetching dense weights in forward order and
 *    caching expert slices (next-use or LRU: xcache.h).  Nothing is allocated after the plan is
 *    applied; all residency is accounted against the budget.
 *
 * Streamed tensors are cut into units of rows; a pin must lie inside one
 * unit.  Callers ask sp_pager_unit_rows() and pin at most that many rows at a
 * time, at multiples of it (for 3-D expert tensors: relative to the start of
 * the expert's slice).  For resident tensors that is every row.
 */
#ifndef SP_PAGER_H
#define SP_PAGER_H

#include "format/model_file.h"
#include "mem/budget.h"
#include "mem/plan.h"

struct sp_pager;

struct sp_pager_stats {
    uint64_t pins;        /* successful pins since open */
    uint64_t unpins;
    uint64_t outstanding; /* pins - unpins: must be 0 between tokens */
    uint64_t mapped_bytes;/* resident weight bytes (region or pinned + pools) */
    enum sp_weight_mode mode; /* MMAP or LOAD (never AUTO) */
    bool budgeted;        /* a budget plan is applied and something streams */
    /* budgeted back end only (zero otherwise) */
    uint64_t bytes_read;      /* bytes the pager read from storage after the plan was applied */
    uint64_t hits, misses;    /* pins of streamed units found resident / read on demand */
    uint64_t waits;           /* pins that found their unit still loading */
    uint64_t expert_pins, expert_hits; /* expert units needed (once per use), and of those found resident
                                          or already being read when first needed */
    uint64_t prefetch_issued, prefetch_used; /* prefetched units; of those, pinned before eviction */
    double wait_s;            /* time pins spent waiting for reads */
    uint64_t pinned_waits;    /* pins of pinned tensors that found them still being read (start-up) */
    double pinned_wait_s;     /* time those pins waited */
};

struct sp_pager_config {
    enum sp_weight_mode mode;  /* resident back end: MMAP or LOAD; AUTO = MMAP for a file
                                  written to be used in place (mf->in_place: `sparrow
                                  convert`), else LOAD.  A file storing resident layouts
                                  the kernel table lacks here is always LOADed, those
                                  tensors un-repacked to their file types (one warning) */
    uint64_t budget;           /* bytes; 0 = no budget (resident) */
    const struct sp_tensor_desc *embed; /* input embedding when untied (read by rows), else NULL */
    uint32_t n_experts, n_experts_used;
    const struct sp_tensor_desc *const *order; /* forward order of the dense tensors (ring schedule) */
    uint32_t n_order;
    uint32_t io_threads;       /* 0 = default (8) */
    enum sp_expert_cache expert_cache; /* the expert pool's policy (xcache.h); AUTO = NEXT_USE */
    /* resident LOAD back end: repack matrices to their resident layouts
     * (quant.h) in place where the kernel table has the layout's gemm
     * (sp_pager_wtype says which) */
    bool repack;
    const struct sp_tensor_desc *by_rows; /* read by rows (the input embedding, tied or not): never repacked */
    struct sp_budget *account; /* the model's memory account (budget.h), or NULL */
    /* Where the resident LOAD back end gets the file's bytes: NULL = pread of
     * mf->path; else fill(fill_user, dst, off, n) writes file bytes
     * [off, off + n) to dst (a model package decompressing its shards
     * straight into the region, package/).  With fill, MMAP becomes LOAD and
     * a budget is SP_E_INVALID (streaming reads spans of a plain file). */
    sp_status (*fill)(void *user, void *dst, uint64_t off, uint64_t n);
    void *fill_user;
};

/* Open mf's file for weight access.  mf must outlive the pager.  Checks the
 * file still has the size the directory was validated against.  With a
 * budget nothing is read until sp_pager_apply().
 * SP_E_IO (message names the path), SP_E_FORMAT, SP_E_NOMEM. */
sp_status sp_pager_open(const struct sp_model_file *mf, const struct sp_pager_config *cfg, struct sp_pager **out);
void sp_pager_close(struct sp_pager *pg);

/* Tests and experiments: override the planner's unit size, small-tensor
 * threshold, safety margin and the measured process size (base), so tiny
 * models stream like big ones.  Zero fields keep the defaults.  Call before
 * the first sp_pager_apply. */
struct sp_pager_tuning {
    uint64_t unit_bytes, small_bytes;
    bool margin_set, base_set;
    uint64_t margin_bytes, base_bytes;
    double read_bps, mem_bps; /* > 0: use instead of measuring */
    uint32_t pinned_stall_ms; /* tests: the start-up reads of the last 3 pinned tensors in forward order (the
                                 output end) first sleep this long: the first pass runs the layers before
                                 them and waits for what is still being read */
};
void sp_pager_tune(struct sp_pager *pg, const struct sp_pager_tuning *t);

/* Budgeted pagers: make the plan for sessions needing session_bytes (KV +
 * scratch), measuring storage and memory speed when something streams.
 * Does not apply it.  SP_E_NOMEM with the minimum budget in the message. */
sp_status sp_pager_make_plan(struct sp_pager *pg, uint64_t session_bytes, struct sp_plan *out);

/* Budgeted pagers: make the plan for sessions that need envelope_bytes at
 * most (the model's declared envelope: KV caches, scratch, logits) and apply
 * it -- map the pinned region and the pools, start the I/O threads, start
 * reading the pinned tensors in forward order and touching and locking the
 * memory on a thread of its own, without waiting for either -- reserving
 * the process's and the weights' shares in cfg.account (the sessions reserve
 * their own).  Once: later calls return SP_OK.  No-op without a budget.
 * SP_E_NOMEM (the message states the minimum budget), SP_E_IO. */
sp_status sp_pager_apply(struct sp_pager *pg, uint64_t envelope_bytes);

/* Budgeted pagers: wait until every pinned tensor is read (sp_pager_apply
 * only starts those reads: each pin waits for its own tensor).  SP_OK, or
 * SP_E_IO naming the file and the offset of a read that failed (the next pin
 * of that tensor reads it again).  SP_OK without a budget or before apply. */
sp_status sp_pager_wait_pinned(struct sp_pager *pg);

/* Budgeted pagers: forward passes on one model take turns.  One pass holds
 * at most a few pins per pool at once, and the plan gives every pool enough
 * slots for that, so a pass always finishes; two passes at once (two
 * sessions on one model, on two threads) could each hold slots the other
 * waits for.  No-op without a budget (resident weights need no slots). */
void sp_pager_turn_begin(struct sp_pager *pg);
void sp_pager_turn_end(struct sp_pager *pg);

/* Rows of t one pin may cover (see above). */
uint32_t sp_pager_unit_rows(const struct sp_pager *pg, const struct sp_tensor_desc *t);

/* Pin nbytes of tensor t starting at byte off within it (off + nbytes <=
 * t->size, checked).  *out points at the bytes; valid until the unpin.
 * t must belong to the pager's model file.  May wait for I/O: SP_E_IO when a
 * read fails, SP_E_STATE before a budgeted pager is applied. */
sp_status sp_pager_pin_range(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes,
                             const void **out);

/* Pin a whole tensor (only for tensors whose unit is the whole tensor). */
static inline sp_status sp_pager_pin(struct sp_pager *pg, const struct sp_tensor_desc *t, const void **out) {
    return sp_pager_pin_range(pg, t, 0, t->size, out);
}

/* Release the pin that returned p (p exactly as returned). */
void sp_pager_unpin(struct sp_pager *pg, const struct sp_tensor_desc *t, const void *p);

/* Hint, a guess: [off, off + nbytes) of t may be pinned soon.  Starts reads
 * of the units it covers when slots nobody needs are free; never waits,
 * never fails.  Counted in prefetch_issued / prefetch_used. */
void sp_pager_prefetch(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes);

/* Hint, certain: [off, off + nbytes) of t will be pinned next (e.g. the
 * experts a router just chose).  Starts every missing read now, so they run
 * in parallel; for expert tensors this is where hits and misses are counted
 * (resident or already in flight = hit).  Never waits, never fails. */
void sp_pager_need(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes);
/* sp_pager_need for several ranges at once (e.g. every slice of every expert
 * the router chose for a layer): the ones already resident are counted and
 * kept first, then the missing ones are read, so that no miss of the batch
 * evicts a unit another range of the batch needs. */
struct sp_pager_span {
    const struct sp_tensor_desc *t;
    uint64_t off, n;
};
void sp_pager_need_spans(struct sp_pager *pg, const struct sp_pager_span *spans, uint32_t n);

/* The type the forward pass multiplies t as: its resident layout (quant.h)
 * where the resident LOAD back end repacked it (cfg.repack), the layout's
 * file type where the file stores a layout the kernel table lacks (every
 * back end un-repacks those), else t->type.  MMAP and the budgeted back
 * end's streamed units keep every other file layout: a file that stores
 * resident layouts is read in them, mapped or streamed. */
uint32_t sp_pager_wtype(const struct sp_pager *pg, const struct sp_tensor_desc *t);

/* True when t is streamed (not resident) under an applied budget plan. */
bool sp_pager_streams(const struct sp_pager *pg, const struct sp_tensor_desc *t);

void sp_pager_get_stats(const struct sp_pager *pg, struct sp_pager_stats *out);

/* The applied plan, or NULL (no budget, or not applied yet). */
const struct sp_plan *sp_pager_plan(const struct sp_pager *pg);

/* Measured speeds used by the planner (bytes/s); 0 before measured. */
double sp_pager_read_bps(const struct sp_pager *pg);
double sp_pager_mem_bps(const struct sp_pager *pg);
uint64_t sp_pager_budget(const struct sp_pager *pg);

#endif /* SP_PAGER_H */
