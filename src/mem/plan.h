/*
 * plan.h -- the placement planner: given a model's tensors, a memory budget
 * and measured speeds, decide which weights stay resident ("pinned"), which
 * are streamed through fixed pools of slots, and how large the pools are.
 *
 * The planner is a pure function of its input (no I/O, no allocation beyond
 * the plan's own arrays), so `sparrow plan` prints exactly what the pager
 * will do, and a property test can run it over many shapes and budgets.
 *
 * Invariant (checked by sp_plan_check and the property test): when a plan
 * is returned, base + session + pinned + pools + overhead <= budget.
 *
 * Value of a resident byte, highest first -- what each pinned byte saves in
 * storage reads per token:
 *   small tensors (norms, biases, routers)  always pinned: needed every token
 *   dense per-token weights (attention, FFN, output head, shared experts): 1
 *   routed experts: n_used / n_experts (uniform routing), kept in an LRU cache
 *   the input embedding (untied): one row per token, read on demand
 */
#ifndef SP_PLAN_H
#define SP_PLAN_H

#include "format/model_file.h"

enum sp_place {
    SP_PLACE_PINNED = 0, /* resident for the life of the pager */
    SP_PLACE_RING,       /* streamed in forward order through the ring pool, prefetched ahead */
    SP_PLACE_EXPERT,     /* one unit per expert slice, cached in the expert pool (LRU) */
    SP_PLACE_ROWS,       /* rows read on demand into the row pool (input embedding) */
};

enum sp_tclass {
    SP_TC_SMALL = 0, /* under the small-tensor threshold: always pinned */
    SP_TC_DENSE,     /* read in full every token */
    SP_TC_EXPERT,    /* 3-D [n_in, n_out, n_experts]: one slice per chosen expert */
    SP_TC_EMBED,     /* input embedding, not shared with the output head */
    SP_TC_COUNT
};

struct sp_plan_tensor {
    enum sp_tclass cls;
    enum sp_place place;
    uint32_t unit_rows;        /* rows per unit (streamed); all rows when pinned */
    uint32_t units_per_expert; /* EXPERT: units an expert slice is cut into (1 usually) */
    uint32_t n_units;          /* streamed: units of this tensor */
    uint64_t unit_bytes;       /* bytes of a full unit */
};

struct sp_plan_input {
    const struct sp_model_file *mf;
    const struct sp_tensor_desc *embed; /* token_embd when it is NOT the output head, else NULL */
    uint64_t budget;          /* bytes; must be > 0 */
    uint64_t base_bytes;      /* resident before the pager (code, heap, tokenizer) */
    uint64_t session_bytes;   /* KV cache + scratch of the sessions to be served */
    double read_bps;          /* measured storage read speed, bytes/s */
    double mem_bps;           /* measured memory read speed, bytes/s */
    uint32_t n_experts, n_experts_used;
    uint64_t ring_unit_bytes; /* target unit size for streamed tensors; 0 = default (8 MiB) */
    uint64_t small_bytes;     /* always-pinned threshold; 0 = SP_PLAN_SMALL_BYTES */
    bool margin_set;          /* use margin_bytes instead of the default safety margin */
    uint64_t margin_bytes;
};

struct sp_plan {
    bool resident;            /* everything fits: load the whole file (no streaming) */
    struct sp_plan_tensor *t; /* (mf->n_tensors) */
    uint64_t pinned_bytes;    /* resident weights (with alignment slack) */
    uint32_t ring_slots, expert_slots, row_slots;
    uint64_t ring_slot_bytes, expert_slot_bytes, row_slot_bytes;
    uint64_t overhead_bytes;  /* pager bookkeeping + safety margin */
    uint64_t base_bytes, session_bytes; /* from the input */
    uint64_t total_bytes;     /* base + session + pinned + pools + overhead */
    uint64_t min_budget;      /* the smallest budget that can run this model with this session */
    /* per class: tensor bytes, bytes pinned, bytes touched per token */
    uint64_t class_bytes[SP_TC_COUNT], class_pinned[SP_TC_COUNT];
    uint64_t expert_units, expert_unit_bytes; /* all expert units; bytes of one */
    /* predictions per decoded token */
    double touched_bytes;     /* weight bytes a token touches */
    double read_bytes;        /* expected storage reads */
    double expert_hit_rate;   /* expected fraction of expert units found resident (uniform routing) */
    double io_s, compute_s, predicted_tps;
};

/* Make a plan.  SP_E_NOMEM (message states the minimum budget) when the
 * budget cannot run the model at all; SP_E_INVALID on bad input.  Free with
 * sp_plan_free. */
sp_status sp_plan_make(const struct sp_plan_input *in, struct sp_plan *out);
void sp_plan_free(struct sp_plan *p);

/* Bytes of the aligned file span a range [off, off + n) needs when read with
 * O_DIRECT (4 KiB granularity): the slot size for a unit of n bytes. */
uint64_t sp_plan_span_bytes(uint64_t n);

/* Classify tensor t of in->mf. */
enum sp_tclass sp_plan_classify(const struct sp_plan_input *in, const struct sp_tensor_desc *t);

#define SP_PLAN_SMALL_BYTES ((uint64_t)1 << 20) /* tensors below this are always pinned */
#define SP_PLAN_IO_ALIGN 4096u

#endif /* SP_PLAN_H */
