/*
 * seq.c -- sequences (see seq.h): cells in the model's shared KV cache, the
 * decode loop in batches, context shifts and truncation.
 *
 * Invariants:
 *  1. cells.n <= n_ctx; cells hold the tokens decoded (minus those shifts
 *     dropped), in order, at increasing positions; next_pos = last
 *     position + 1 (0 when empty).
 *  2. A batch's cells exist only once its forward pass succeeded: a failed
 *     pass truncates them again, so every held cell has its K/V.
 */
#include "seq.h"

#include "ops.h"

#include <time.h>

/* The model's cache for these types, made on first use. */
static sp_status model_cache(struct sp_model *m, enum sp_kv_type tk, enum sp_kv_type tv, struct sp_kv_cache **out) {
    pthread_mutex_lock(&m->kv_mu);
    sp_status rc = SP_OK;
    if (!m->kv[tk][tv]) {
        const struct sp_kv_geom g = sp_model_kv_geom(m, tk, tv);
        rc = sp_kv_cache_init(&g, &m->kv[tk][tv]);
    }
    *out = m->kv[tk][tv];
    pthread_mutex_unlock(&m->kv_mu);
    return rc;
}

uint64_t sp_seq_bytes(const struct sp_model *m, const struct sp_seq_params *p) {
    const struct sp_kv_geom g = sp_model_kv_geom(m, p->type_k, p->type_v);
    return sp_kv_seq_bytes(&g, p->n_ctx) + sp_fwd_bytes(m, p->n_batch, p->n_threads);
}

sp_status sp_seq_init(struct sp_model *m, const struct sp_seq_params *p, struct sp_seq **out) {
    *out = NULL;
    SP_ASSERT(p->n_ctx >= 1 && p->n_batch >= 1 && p->n_batch <= p->n_ctx && p->n_threads >= 1);
    const struct sp_kv_geom g = sp_model_kv_geom(m, p->type_k, p->type_v);
    sp_status rc = sp_kv_geom_check(&g);
    if (rc) return rc;
    struct sp_seq *s = sp_calloc(1, sizeof *s);
    if (!s) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    s->m = m;
    s->p = *p;
    if ((rc = model_cache(m, p->type_k, p->type_v, &s->kv))) goto fail;
    if ((rc = sp_kv_seq_init(s->kv, p->n_ctx, &s->cells))) goto fail;
    if ((rc = sp_fwd_init(m, p->n_ctx, p->n_batch, p->n_threads, &s->fwd))) goto fail;
    *out = s;
    return SP_OK;
fail:
    sp_seq_free(s);
    return rc;
}

void sp_seq_free(struct sp_seq *s) {
    if (!s) return;
    if (s->kv) sp_kv_seq_free(s->kv, &s->cells);
    sp_fwd_free(s->fwd);
    sp_free(s);
}

void sp_seq_kv_release(struct sp_seq *s) {
    sp_kv_seq_free(s->kv, &s->cells); /* the cells are empty and hold no blocks after it */
    s->next_pos = 0;
    s->n_discarded = 0;
    s->n_shifts = 0;
}

sp_status sp_seq_kv_regain(struct sp_seq *s) {
    SP_ASSERT(sp_seq_kv_released(s));
    return sp_kv_seq_init(s->kv, s->p.n_ctx, &s->cells);
}

void sp_seq_reset(struct sp_seq *s) {
    sp_kv_cells_truncate(&s->cells, 0);
    s->next_pos = 0;
    s->n_discarded = 0;
    s->n_shifts = 0;
}

void sp_seq_truncate(struct sp_seq *s, uint32_t n) {
    SP_ASSERT(n <= s->cells.n);
    sp_kv_cells_truncate(&s->cells, n);
    s->next_pos = n ? s->cells.pos[n - 1] + 1 : 0;
}

uint64_t sp_seq_kv_bytes(const struct sp_seq *s) {
    return (uint64_t)s->cells.n * sp_kv_cell_bytes(&s->kv->g);
}

/* ---- context shift ---------------------------------------------------------- */

struct shift_job {
    struct sp_seq *s;
    int32_t delta;           /* positions to move by (negative) */
    const float *freq_factors;
};

/* Re-rotate the keys of cells [n_keep, n) by delta: items (layer, KV head). */
static void shift_task(void *arg, int ith, int nth) {
    const struct shift_job *j = arg;
    const struct sp_seq *s = j->s;
    const struct sp_hparams *hp = &s->m->mf->hp;
    const struct sp_kv_cache *kv = s->kv;
    const uint32_t items = hp->n_layers * hp->n_kv_heads, hd = hp->head_dim_k;
    float row[SP_KV_MAX_HEAD_DIM];
    for (uint32_t it = (uint32_t)ith; it < items; it += (uint32_t)nth) {
        const uint32_t il = it / hp->n_kv_heads, kh = it % hp->n_kv_heads;
        for (uint32_t i = s->p.n_keep; i < s->cells.n; i++) {
            uint8_t *k = sp_kv_key_row(kv, s->cells.slot[i], il, kh);
            sp_kv_row_load(kv->g.type_k, k, row, (int32_t)hd);
            sp_rope(row, 1, (int)hd, (int)hp->rope_dims, (float)j->delta, hp->rope_theta, hp->rope_freq_scale,
                    hp->rope_neox, j->freq_factors);
            sp_kv_row_store(kv->g.type_k, row, k, (int32_t)hd);
        }
    }
}

sp_status sp_seq_shift(struct sp_seq *s, uint32_t n) {
    struct sp_kv_cells *c = &s->cells;
    if (n == 0) return SP_OK;
    if ((uint64_t)s->p.n_keep + n > c->n)
        return sp_err(SP_E_INVALID, "context shift: cannot drop %u tokens after the first %u of %u", n, s->p.n_keep,
                      c->n);
    const void *ff = NULL;
    sp_status rc;
    if (s->m->rope_freqs && (rc = sp_pager_pin(s->m->pager, s->m->rope_freqs, &ff))) return rc;
    sp_kv_cells_remove(c, s->p.n_keep, n);
    for (uint32_t i = s->p.n_keep; i < c->n; i++) c->pos[i] -= (int32_t)n;
    /* keys are rewritten in place: blocks another sequence shares are copied first */
    rc = sp_kv_cells_unshare(c, s->p.n_keep);
    if (!rc) {
        struct shift_job j = {s, -(int32_t)n, ff};
        const uint64_t rows = (uint64_t)(c->n - s->p.n_keep) * s->m->mf->hp.n_layers * s->m->mf->hp.n_kv_heads;
        if (rows >= 256 && sp_pool_n_threads(s->fwd->pool) > 1) {
            sp_pool_run(s->fwd->pool, shift_task, &j);
        } else {
            shift_task(&j, 0, 1);
        }
        s->next_pos -= (int32_t)n;
        s->n_discarded += n;
        s->n_shifts++;
    }
    if (ff) sp_pager_unpin(s->m->pager, s->m->rope_freqs, ff);
    return rc;
}

/* ---- decode ------------------------------------------------------------------ */

/* The context shift that makes room for nb more tokens (the cells are full):
 * n_discard tokens after the sinks, or half of them, and at least enough. */
static sp_status shift_for(struct sp_seq *s, uint32_t nb) {
    const struct sp_seq_params *p = &s->p;
    const struct sp_kv_cells *c = &s->cells;
    const uint32_t after = c->n - SP_MIN(p->n_keep, c->n);
    uint32_t d = p->n_discard ? p->n_discard : after / 2;
    d = SP_MAX(d, c->n + nb - p->n_ctx);
    d = SP_MIN(d, after);
    return sp_seq_shift(s, d);
}

sp_status sp_seq_fits(const struct sp_seq *s, uint32_t n) {
    const struct sp_kv_cells *c = &s->cells;
    const struct sp_seq_params *p = &s->p;
    if ((uint64_t)c->n + n > p->n_ctx) {
        if (!p->ctx_shift)
            return sp_err(SP_E_CONTEXT_FULL, "%u tokens do not fit: %u of %u context positions are used", n, c->n,
                          p->n_ctx);
        if (n > p->n_ctx - SP_MIN(p->n_keep, p->n_ctx))
            return sp_err(SP_E_CONTEXT_FULL,
                          "%u tokens do not fit even after a context shift: the context holds %u, %u of them kept", n,
                          p->n_ctx, p->n_keep);
    }
    return SP_OK;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

sp_status sp_seq_decode(struct sp_seq *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                        uint32_t *n_done) {
    struct sp_kv_cells *c = &s->cells;
    const struct sp_seq_params *p = &s->p;
    if (n_done) *n_done = 0;
    SP_ASSERT(!all_logits || n <= p->n_batch);
    sp_status rc = sp_seq_fits(s, n);
    if (rc) return rc;
    /* the governor's chunk (not with all_logits: every row is wanted from one pass) */
    const uint32_t per = s->chunk && s->chunk < p->n_batch && !all_logits ? s->chunk : p->n_batch;
    for (uint32_t i = 0; i < n;) {
        const uint32_t nb = SP_MIN(per, n - i);
        if (s->abort_fn && s->abort_fn(s->abort_user))
            return sp_err(SP_E_ABORTED, "decode aborted by the caller after %u of %u tokens", i, n);
        if (c->n + nb > p->n_ctx && (rc = shift_for(s, nb))) return rc;
        const uint32_t c0 = c->n;
        if ((rc = sp_kv_cells_append(c, tokens + i, nb, s->next_pos))) return rc;
        const bool last = i + nb == n;
        const double t0 = s->pass_done ? mono_s() : 0;
        sp_pager_turn_begin(s->m->pager);
        rc = sp_forward(s->m, s->fwd, s->kv, c, c0, tokens + i, nb, last ? logits : NULL, all_logits);
        sp_pager_turn_end(s->m->pager);
        if (rc) {
            sp_kv_cells_truncate(c, c0);
            return rc;
        }
        s->next_pos += (int32_t)nb;
        i += nb;
        if (n_done) *n_done = i;
        if (s->pass_done) s->pass_done(s->pass_user, nb, mono_s() - t0, last);
    }
    return SP_OK;
}

/* ---- decode in slices ----------------------------------------------------------- */

sp_status sp_seq_step_begin(struct sp_seq *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits) {
    SP_ASSERT(!s->step.active && n >= 1 && (!all_logits || n <= s->p.n_batch));
    sp_status rc = sp_seq_fits(s, n);
    if (rc) return rc;
    const struct sp_seq_step old = s->step;
    s->step = (struct sp_seq_step){.tokens = tokens, .n = n, .logits = logits, .all_logits = all_logits,
                                   .active = true, .layer_ms_tok = old.layer_ms_tok};
    s->step.cur.s_per_unit[0] = old.cur.s_per_unit[0];
    s->step.cur.s_per_unit[1] = old.cur.s_per_unit[1];
    s->step.cur.s_per_unit[2] = old.cur.s_per_unit[2];
    memcpy(s->step.cur.stage_s, old.cur.stage_s, sizeof old.cur.stage_s);
    return SP_OK;
}

void sp_seq_step_cancel(struct sp_seq *s) {
    struct sp_seq_step *st = &s->step;
    if (!st->active) return;
    if (st->in_pass) {
        sp_pager_turn_end(s->m->pager);
        sp_kv_cells_truncate(&s->cells, st->c0);
    }
    st->active = st->in_pass = false;
}

/* Tokens of the next pass: n_batch (or the governor's chunk); with experts
 * (a layer's MoE block runs whole) what one layer of budget_ms holds at the
 * measured cost, n_batch until a cost is known. */
static uint32_t step_tokens(const struct sp_seq *s, double budget_ms) {
    const struct sp_seq_step *st = &s->step;
    if (st->all_logits) return st->n;
    const uint32_t cap = s->chunk && s->chunk < s->p.n_batch ? s->chunk : s->p.n_batch;
    uint32_t nb = cap;
    if (s->m->mf->hp.n_experts > 0 && st->layer_ms_tok > 0) {
        const double fit = budget_ms / st->layer_ms_tok;
        nb = fit < 1 ? 1 : fit > cap ? cap : (uint32_t)fit;
    }
    return SP_MIN(nb, st->n - st->i);
}

sp_status sp_seq_step(struct sp_seq *s, double budget_s, bool *done, uint32_t *n_done) {
    struct sp_seq_step *st = &s->step;
    struct sp_kv_cells *c = &s->cells;
    const uint32_t L = s->m->mf->hp.n_layers;
    const double t0 = mono_s(), t_end = t0 + budget_s;
    *done = false;
    st->n_slices = 0;
    if (!st->active) {
        *done = true;
        return SP_OK;
    }
    sp_status rc = SP_OK;
    for (;;) {
        if (!st->in_pass) {
            if (st->i == st->n) {
                st->active = false;
                *done = true;
                break;
            }
            if (st->n_slices > 0 && mono_s() >= t_end) break;
            if (s->abort_fn && s->abort_fn(s->abort_user)) {
                st->active = false;
                return sp_err(SP_E_ABORTED, "decode aborted by the caller after %u of %u tokens", st->i, st->n);
            }
            const uint32_t nb = step_tokens(s, budget_s * 1e3);
            if (c->n + nb > s->p.n_ctx && (rc = shift_for(s, nb))) break;
            st->c0 = c->n;
            if ((rc = sp_kv_cells_append(c, st->tokens + st->i, nb, s->next_pos))) break;
            st->nb = nb;
            st->cur.il = st->cur.stage = 0;
            st->cur.row = 0;
            st->cur.embedded = false;
            st->pass_s = 0;
            st->in_pass = true;
            sp_pager_turn_begin(s->m->pager);
        } else if (st->n_slices > 0) {
            break; /* the slice below ran to the deadline */
        }
        const bool last = st->i + st->nb == st->n;
        const struct sp_fwd_seg seg = {s->kv, c, st->c0, st->nb};
        bool pass_done = false;
        const double ts = mono_s();
        rc = sp_forward_slice(s->m, s->fwd, &seg, st->tokens + st->i, last ? st->logits : NULL, st->all_logits, &st->cur,
                              t_end, &pass_done);
        st->pass_s += mono_s() - ts;
        st->n_slices++;
        if (rc) {
            sp_pager_turn_end(s->m->pager);
            sp_kv_cells_truncate(c, st->c0);
            st->in_pass = false;
            break;
        }
        if (pass_done) {
            sp_pager_turn_end(s->m->pager);
            st->in_pass = false;
            s->next_pos += (int32_t)st->nb;
            st->i += st->nb;
            const double per = st->pass_s * 1e3 / ((double)st->nb * L);
            st->layer_ms_tok = st->layer_ms_tok > 0 ? 0.7 * st->layer_ms_tok + 0.3 * per : per;
        }
    }
    if (n_done) *n_done = st->i;
    if (rc) st->active = false;
    return rc;
}

/* ---- several sequences in one pass ------------------------------------------ */

/* Make room for nb more tokens in s: SP_E_CONTEXT_FULL as sp_seq_decode, or
 * a context shift when it is on. */
static sp_status seq_room(struct sp_seq *s, uint32_t nb) {
    const struct sp_seq_params *p = &s->p;
    const struct sp_kv_cells *c = &s->cells;
    if ((uint64_t)c->n + nb <= p->n_ctx) return SP_OK;
    if (!p->ctx_shift || nb > p->n_ctx - SP_MIN(p->n_keep, p->n_ctx))
        return sp_err(SP_E_CONTEXT_FULL, "%u tokens do not fit: %u of %u context positions are used", nb, c->n,
                      p->n_ctx);
    return shift_for(s, nb);
}

sp_status sp_seq_decode_batch(struct sp_fwd *f, struct sp_fwd_seg *segs, struct sp_seq *const *seqs,
                              const int32_t *tokens, const uint32_t *n, uint32_t n_seq, float *logits) {
    SP_ASSERT(n_seq >= 1);
    uint32_t total = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        SP_ASSERT(n[i] >= 1 && seqs[i]->m == seqs[0]->m);
        total += n[i];
    }
    SP_ASSERT(total <= f->n_batch);
    sp_status rc = SP_OK;
    /* every sequence must take its tokens before any cell is appended */
    for (uint32_t i = 0; i < n_seq; i++)
        if ((rc = seq_room(seqs[i], n[i]))) return rc;
    uint32_t appended = 0;
    for (uint32_t i = 0, off = 0; i < n_seq; off += n[i], i++, appended = i) {
        struct sp_seq *s = seqs[i];
        segs[i] = (struct sp_fwd_seg){s->kv, &s->cells, s->cells.n, n[i]};
        if ((rc = sp_kv_cells_append(&s->cells, tokens + off, n[i], s->next_pos))) break;
    }
    struct sp_model *m = seqs[0]->m;
    if (!rc) {
        sp_pager_turn_begin(m->pager);
        rc = sp_forward_batch(m, f, segs, n_seq, tokens, logits, false);
        sp_pager_turn_end(m->pager);
    }
    if (rc) {
        for (uint32_t i = 0; i < appended; i++) sp_kv_cells_truncate(&seqs[i]->cells, segs[i].c0);
        return rc;
    }
    for (uint32_t i = 0; i < n_seq; i++) seqs[i]->next_pos += (int32_t)n[i];
    return SP_OK;
}
