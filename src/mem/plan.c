/*
 * plan.c -- the placement planner (see plan.h for the policy).  Pure: the
 * same input gives the same plan; nothing here reads files or touches the
 * memory it plans.
 */
#include "plan.h"

#include <stdio.h>

#define MiB ((uint64_t)1 << 20)
#define DEFAULT_UNIT (8 * MiB)
#define RING_SLOTS_MAX 16u
#define RING_SLOTS_MIN 2u
#define ROW_SLOTS 8u

/* "7.50 GiB", "312.4 MiB", "96.0 KiB" */
static const char *size_str(uint64_t n, char *buf, size_t cap) {
    if (n >= ((uint64_t)1 << 30)) snprintf(buf, cap, "%.2f GiB", n / 1073741824.0);
    else if (n >= MiB) snprintf(buf, cap, "%.1f MiB", n / 1048576.0);
    else snprintf(buf, cap, "%.1f KiB", n / 1024.0);
    return buf;
}

static uint64_t round_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

uint64_t sp_plan_span_bytes(uint64_t n) {
    /* a span starting anywhere inside a page covers at most one extra page */
    return round_up(n, SP_PLAN_IO_ALIGN) + SP_PLAN_IO_ALIGN;
}

static uint64_t n_rows(const struct sp_tensor_desc *t) {
    return (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
}

static uint64_t tensor_bytes(const struct sp_model_file *mf) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) n += mf->tensors[i].size;
    return n;
}

/* Always pinned below this: SP_PLAN_SMALL_BYTES, or 1/64 of the model's
 * tensor bytes when that is less (a model of a few MiB has no tensor of
 * 1 MiB: it could never stream, and tests could not stream it). */
static uint64_t small_bytes(const struct sp_plan_input *in) {
    if (in->small_bytes) return in->small_bytes;
    return SP_MIN(SP_PLAN_SMALL_BYTES, SP_MAX(tensor_bytes(in->mf) / 64, (uint64_t)SP_PLAN_IO_ALIGN));
}

/* The safety margin's fixed part, for what the process touches besides the
 * planned buffers (thread stacks, code pages, allocator slack): 32 MiB, or
 * 4 MiB + 1/8 of the model's tensor bytes when that is less -- models under
 * 224 MiB, whose processes were measured at well under 1 MiB past their
 * plans (docs/MEMORY.md).  The budget-proportional part (page tables, 0.2%
 * of what is mapped) is margin_var. */
static uint64_t margin_fixed(const struct sp_plan_input *in) {
    if (in->margin_set) return in->margin_bytes;
    return SP_MIN(32 * MiB, 4 * MiB + tensor_bytes(in->mf) / 8);
}

static uint64_t margin_var(const struct sp_plan_input *in, uint64_t budget) {
    return in->margin_set ? 0 : budget / 200;
}

/* The least budget B with B >= need + margin_var(B): what a plan needing
 * `need` bytes besides the proportional margin can run in -- the same
 * whatever budget was asked for. */
static uint64_t least_budget(const struct sp_plan_input *in, uint64_t need) {
    uint64_t b = in->margin_set ? need : need + need / 199;
    while (b - margin_var(in, b) < need) b++;
    while (b > need && b - 1 - margin_var(in, b - 1) >= need) b--;
    return b;
}

enum sp_tclass sp_plan_classify(const struct sp_plan_input *in, const struct sp_tensor_desc *t) {
    if (t == in->embed && t->size >= small_bytes(in)) return SP_TC_EMBED;
    if (t->size < small_bytes(in)) return SP_TC_SMALL;
    if (in->n_experts > 1 && t->ne[2] == (int64_t)in->n_experts && t->ne[3] == 1) return SP_TC_EXPERT;
    return SP_TC_DENSE;
}

/* Cut tensor t into units of about `target` bytes along its rows; an expert
 * tensor is cut per expert, so no unit spans two experts. */
static void cut_units(const struct sp_tensor_desc *t, enum sp_tclass cls, uint64_t target, struct sp_plan_tensor *pt) {
    const uint64_t rows = n_rows(t), row_bytes = rows ? t->size / rows : 0;
    if (cls == SP_TC_EMBED) {
        pt->unit_rows = 1;
        pt->units_per_expert = 1;
        pt->n_units = (uint32_t)rows;
    } else if (cls == SP_TC_EXPERT) {
        const uint64_t rows_e = (uint64_t)t->ne[1], eb = rows_e * row_bytes;
        const uint64_t k = SP_MAX((uint64_t)1, (eb + target - 1) / target);
        pt->unit_rows = (uint32_t)((rows_e + k - 1) / k);
        pt->units_per_expert = (uint32_t)((rows_e + pt->unit_rows - 1) / pt->unit_rows);
        pt->n_units = pt->units_per_expert * (uint32_t)t->ne[2];
    } else {
        pt->unit_rows = (uint32_t)SP_MIN(rows, SP_MAX((uint64_t)1, target / SP_MAX(row_bytes, (uint64_t)1)));
        pt->units_per_expert = 1;
        pt->n_units = (uint32_t)((rows + pt->unit_rows - 1) / pt->unit_rows);
    }
    pt->unit_bytes = (uint64_t)pt->unit_rows * row_bytes;
}

static void predict(const struct sp_plan_input *in, struct sp_plan *p) {
    const struct sp_model_file *mf = in->mf;
    const double used = in->n_experts ? (double)in->n_experts_used / in->n_experts : 0;
    double touched = 0, read_dense = 0, read_expert = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        const struct sp_plan_tensor *pt = &p->t[i];
        const double row_bytes = (double)t->size / (double)SP_MAX(n_rows(t), (uint64_t)1);
        switch (pt->cls) {
        case SP_TC_EMBED:
            touched += row_bytes;
            if (pt->place != SP_PLACE_PINNED) read_dense += (double)sp_plan_span_bytes((uint64_t)row_bytes);
            break;
        case SP_TC_EXPERT:
            touched += used * (double)t->size;
            if (pt->place != SP_PLACE_PINNED) {
                read_expert += (1.0 - p->expert_hit_rate) * used *
                               ((double)t->size + (double)pt->n_units * SP_PLAN_IO_ALIGN);
            }
            break;
        default:
            touched += (double)t->size;
            if (pt->place == SP_PLACE_RING) read_dense += (double)t->size + (double)pt->n_units * SP_PLAN_IO_ALIGN;
            break;
        }
    }
    if (p->resident) read_dense = read_expert = 0;
    p->touched_bytes = touched;
    p->read_bytes = read_dense + read_expert;
    const double rbps = in->read_bps > 0 ? in->read_bps : 1e9, mbps = in->mem_bps > 0 ? in->mem_bps : 1e10;
    p->compute_s = touched / mbps;
    /* Dense streaming runs ahead of the forward pass (the ring), so its I/O
     * overlaps compute; expert misses are known only when the router has
     * chosen, so they add to the time (prefetch of guessed experts helps, and
     * is not counted here). */
    const double io_dense = read_dense / rbps, io_expert = read_expert / rbps;
    p->io_s = io_dense + io_expert;
    const double t = SP_MAX(p->compute_s, io_dense) + io_expert;
    p->predicted_tps = t > 0 ? 1.0 / t : 0;
}

sp_status sp_plan_make(const struct sp_plan_input *in, struct sp_plan *p) {
    memset(p, 0, sizeof *p);
    const struct sp_model_file *mf = in->mf;
    if (!mf || mf->n_tensors == 0) return sp_err(SP_E_INVALID, "%s: no tensors to plan", __func__);
    if (in->budget == 0) return sp_err(SP_E_INVALID, "%s: budget is 0", __func__);
    p->t = sp_calloc(mf->n_tensors, sizeof *p->t);
    if (!p->t) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    p->base_bytes = in->base_bytes;
    p->session_bytes = in->session_bytes;
    const uint64_t target = in->ring_unit_bytes ? in->ring_unit_bytes : DEFAULT_UNIT;

    /* Classify, cut into units, and total up. */
    uint64_t small = 0, dense_span = 0, first_off = UINT64_MAX, n_units_all = 0;
    uint64_t ring_unit = 0, expert_unit = 0, row_unit = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        struct sp_plan_tensor *pt = &p->t[i];
        pt->cls = sp_plan_classify(in, t);
        first_off = SP_MIN(first_off, t->offset);
        p->class_bytes[pt->cls] += t->size;
        cut_units(t, pt->cls, target, pt);
        n_units_all += pt->n_units;
        switch (pt->cls) {
        case SP_TC_SMALL: small += sp_plan_span_bytes(t->size); break;
        case SP_TC_DENSE:
            dense_span += sp_plan_span_bytes(t->size);
            ring_unit = SP_MAX(ring_unit, pt->unit_bytes);
            break;
        case SP_TC_EXPERT:
            expert_unit = SP_MAX(expert_unit, pt->unit_bytes);
            p->expert_units += pt->n_units;
            break;
        case SP_TC_EMBED: row_unit = SP_MAX(row_unit, pt->unit_bytes); break;
        default: break;
        }
    }
    p->expert_unit_bytes = expert_unit;
    p->ring_slot_bytes = ring_unit ? sp_plan_span_bytes(ring_unit) : 0;
    p->expert_slot_bytes = expert_unit ? sp_plan_span_bytes(expert_unit) : 0;
    p->row_slot_bytes = row_unit ? sp_plan_span_bytes(row_unit) : 0;
    /* bookkeeping: a slot index per unit, slot records, plus a margin for
     * what the process touches besides the planned buffers */
    p->overhead_bytes = n_units_all * 8 + margin_fixed(in) + margin_var(in, in->budget);
    const uint64_t fixed_need = in->base_bytes + in->session_bytes + n_units_all * 8 + margin_fixed(in);
    const uint64_t fixed = fixed_need + margin_var(in, in->budget);

    /* The smallest working set, streaming: small tensors pinned, two ring
     * slots, expert slots for the gate and up slices of every chosen expert
     * (and one more), the row pool. */
    const uint64_t row_pool = row_unit ? ROW_SLOTS * p->row_slot_bytes : 0;
    uint32_t upe_max = 1;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (p->t[i].cls == SP_TC_EXPERT) upe_max = SP_MAX(upe_max, p->t[i].units_per_expert);
    }
    /* a one-token decode pins the gate and up slices of all chosen experts at once */
    const uint64_t expert_min = expert_unit ? (2ull * SP_MAX(in->n_experts_used, 1u) + 1) * upe_max : 0;
    const uint64_t ring_min = ring_unit ? RING_SLOTS_MIN : 0;
    const uint64_t stream_min = least_budget(
        in, fixed_need + small + row_pool + ring_min * p->ring_slot_bytes + expert_min * p->expert_slot_bytes);

    /* Everything fits: the whole tensor section is loaded once (as without a
     * budget) and nothing is streamed.  The minimum is the lesser of the two
     * ways to run, so it does not depend on the budget asked for. */
    const uint64_t whole = round_up(mf->file_size - (first_off & ~(uint64_t)(SP_PLAN_IO_ALIGN - 1)), SP_PLAN_IO_ALIGN);
    const uint64_t resident_min = least_budget(in, fixed_need + whole);
    p->min_budget = SP_MIN(stream_min, resident_min);
    if (in->budget >= resident_min) {
        p->resident = true;
        for (uint32_t i = 0; i < mf->n_tensors; i++) {
            p->t[i].place = SP_PLACE_PINNED;
            p->class_pinned[p->t[i].cls] += mf->tensors[i].size;
        }
        p->pinned_bytes = whole;
        p->total_bytes = fixed + whole;
        p->expert_hit_rate = 1.0;
        predict(in, p);
        return SP_OK;
    }

    if (in->budget < stream_min) {
        const uint64_t need = p->min_budget;
        char b1[32], b2[32], b3[32];
        sp_plan_free(p);
        return sp_err(SP_E_NOMEM,
                      "%s: a memory budget of %s cannot run this model; the minimum is %s "
                      "(%s for the process, KV cache and scratch, the rest for weights and buffers)",
                      mf->path, size_str(in->budget, b1, sizeof b1), size_str(need, b2, sizeof b2),
                      size_str(in->base_bytes + in->session_bytes, b3, sizeof b3));
    }
    uint64_t avail = in->budget - fixed - small - row_pool;

    /* Dense weights first (each pinned byte saves a read every token), in
     * file order, first fit; the ring gets up to RING_SLOTS_MAX slots of what
     * is left for prefetch depth.  Experts get the rest. */
    const uint64_t expert_min_bytes = expert_min * p->expert_slot_bytes;
    uint64_t pinned = small;
    bool all_dense = dense_span + expert_min_bytes <= avail;
    if (all_dense) {
        avail -= dense_span;
        pinned += dense_span;
    } else {
        uint64_t ring_bytes = (uint64_t)RING_SLOTS_MAX * p->ring_slot_bytes;
        while (ring_bytes > ring_min * p->ring_slot_bytes && ring_bytes + expert_min_bytes > avail / 4)
            ring_bytes -= p->ring_slot_bytes;
        p->ring_slots = (uint32_t)(ring_bytes / p->ring_slot_bytes);
        avail -= ring_bytes;
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        struct sp_plan_tensor *pt = &p->t[i];
        switch (pt->cls) {
        case SP_TC_SMALL: pt->place = SP_PLACE_PINNED; break;
        case SP_TC_DENSE:
            if (all_dense) {
                pt->place = SP_PLACE_PINNED;
            } else if (sp_plan_span_bytes(t->size) + expert_min_bytes <= avail) {
                pt->place = SP_PLACE_PINNED;
                avail -= sp_plan_span_bytes(t->size);
                pinned += sp_plan_span_bytes(t->size);
            } else {
                pt->place = SP_PLACE_RING;
            }
            break;
        case SP_TC_EXPERT: pt->place = SP_PLACE_EXPERT; break;
        case SP_TC_EMBED: pt->place = SP_PLACE_ROWS; break;
        default: break;
        }
        if (pt->place == SP_PLACE_PINNED) {
            pt->unit_rows = (uint32_t)SP_MIN(n_rows(t), (uint64_t)UINT32_MAX);
            pt->n_units = 1;
            pt->units_per_expert = 1;
            pt->unit_bytes = t->size;
            p->class_pinned[pt->cls] += t->size;
        }
    }
    if (!all_dense && p->ring_slots == 0 && ring_unit) p->ring_slots = RING_SLOTS_MIN;
    bool any_ring = false;
    for (uint32_t i = 0; i < mf->n_tensors; i++) any_ring |= p->t[i].place == SP_PLACE_RING;
    if (!any_ring) {
        avail += (uint64_t)p->ring_slots * p->ring_slot_bytes; /* nothing streams through it */
        p->ring_slots = 0;
    }
    if (expert_unit) {
        const uint64_t slots = SP_MIN(avail / p->expert_slot_bytes, p->expert_units);
        p->expert_slots = (uint32_t)SP_MAX(slots, expert_min);
        p->expert_hit_rate = p->expert_units ? (double)p->expert_slots / (double)p->expert_units : 1.0;
    } else {
        p->expert_hit_rate = 1.0;
    }
    p->row_slots = row_unit ? ROW_SLOTS : 0;
    p->pinned_bytes = pinned;
    p->total_bytes = fixed + pinned + (uint64_t)p->ring_slots * p->ring_slot_bytes +
                     (uint64_t)p->expert_slots * p->expert_slot_bytes + row_pool;
    SP_ASSERT(p->total_bytes <= in->budget);
    predict(in, p);
    return SP_OK;
}

void sp_plan_free(struct sp_plan *p) {
    if (!p) return;
    sp_free(p->t);
    p->t = NULL;
}
