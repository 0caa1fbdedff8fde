/*
 * cells.c -- KV cache bookkeeping (see cells.h for the invariants): the block
 * allocator with refcounts and each sequence's cells.
 */
#include "cells.h"

/* ---- blocks ------------------------------------------------------------------ */

sp_status sp_kv_blocks_init(struct sp_kv_blocks *b) {
    memset(b, 0, sizeof *b);
    if (pthread_mutex_init(&b->mu, NULL) != 0) return sp_err(SP_E_NOMEM, "%s: cannot create a mutex", __func__);
    return SP_OK;
}

void sp_kv_blocks_destroy(struct sp_kv_blocks *b) {
    sp_free(b->refs);
    sp_free(b->free_list);
    pthread_mutex_destroy(&b->mu);
    memset(b, 0, sizeof *b);
}

sp_status sp_kv_blocks_add(struct sp_kv_blocks *b, uint32_t n) {
    pthread_mutex_lock(&b->mu);
    sp_status rc = SP_OK;
    if (b->n + n > b->cap) {
        const uint32_t cap = SP_MAX(b->n + n, b->cap * 2);
        uint32_t *refs = sp_realloc(b->refs, (size_t)cap * sizeof *refs);
        if (refs) b->refs = refs;
        uint32_t *fl = refs ? sp_realloc(b->free_list, (size_t)cap * sizeof *fl) : NULL;
        if (fl) b->free_list = fl;
        if (!refs || !fl) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory for %u KV blocks", __func__, cap);
            goto out;
        }
        b->cap = cap;
    }
    /* pushed highest first, so that the lowest ids are taken first */
    for (uint32_t i = n; i-- > 0;) {
        b->refs[b->n + i] = 0;
        b->free_list[b->n_free++] = b->n + i;
    }
    b->n += n;
out:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

uint32_t sp_kv_blocks_used(struct sp_kv_blocks *b) {
    pthread_mutex_lock(&b->mu);
    const uint32_t used = b->n - b->n_free;
    pthread_mutex_unlock(&b->mu);
    return used;
}

/* Take a free block (refcount 1), or -1. */
static int64_t block_take(struct sp_kv_blocks *b) {
    pthread_mutex_lock(&b->mu);
    int64_t id = -1;
    if (b->n_free) {
        id = b->free_list[--b->n_free];
        b->refs[id] = 1;
    }
    pthread_mutex_unlock(&b->mu);
    return id;
}

static void block_ref(struct sp_kv_blocks *b, uint32_t id) {
    pthread_mutex_lock(&b->mu);
    SP_ASSERT(id < b->n && b->refs[id] > 0);
    b->refs[id]++;
    pthread_mutex_unlock(&b->mu);
}

static void block_unref(struct sp_kv_blocks *b, uint32_t id) {
    pthread_mutex_lock(&b->mu);
    SP_ASSERT(id < b->n && b->refs[id] > 0);
    if (--b->refs[id] == 0) b->free_list[b->n_free++] = id;
    pthread_mutex_unlock(&b->mu);
}

static uint32_t block_refs(struct sp_kv_blocks *b, uint32_t id) {
    pthread_mutex_lock(&b->mu);
    const uint32_t r = b->refs[id];
    pthread_mutex_unlock(&b->mu);
    return r;
}

/* ---- cells ---------------------------------------------------------------------- */

uint32_t sp_kv_cells_quota(uint32_t cap) {
    /* full blocks, plus the partial ones: the sinks' block, the front a
     * shift leaves, the tail (invariant 4) */
    return (cap + SP_KV_BLOCK - 1) / SP_KV_BLOCK + 3;
}

sp_status sp_kv_cells_init(struct sp_kv_cells *c, struct sp_kv_blocks *b, uint32_t cap, sp_kv_copy_fn copy,
                           void *copy_user) {
    memset(c, 0, sizeof *c);
    c->blocks = b;
    c->copy = copy;
    c->copy_user = copy_user;
    c->cap = cap;
    c->tail = -1;
    c->quota = sp_kv_cells_quota(cap);
    c->slot = sp_malloc((size_t)cap * sizeof *c->slot);
    c->pos = sp_malloc((size_t)cap * sizeof *c->pos);
    c->tok = sp_malloc((size_t)cap * sizeof *c->tok);
    if (!c->slot || !c->pos || !c->tok) {
        sp_kv_cells_destroy(c);
        return sp_err(SP_E_NOMEM, "%s: out of memory for %u cells", __func__, cap);
    }
    return SP_OK;
}

void sp_kv_cells_destroy(struct sp_kv_cells *c) {
    if (c->blocks) sp_kv_cells_truncate(c, 0);
    sp_free(c->slot);
    sp_free(c->pos);
    sp_free(c->tok);
    memset(c, 0, sizeof *c);
    c->tail = -1;
}

static inline uint32_t slot_block(uint32_t slot) {
    return slot / SP_KV_BLOCK;
}

/* Move cells [i, j) (one run of one block) into a fresh block, at offsets
 * from 0 on; -1 when the pool has none. */
static int64_t move_run(struct sp_kv_cells *c, uint32_t i, uint32_t j) {
    const int64_t nb = block_take(c->blocks);
    if (nb < 0) return -1;
    const uint32_t old = slot_block(c->slot[i]);
    for (uint32_t k = i; k < j; k++) {
        const uint32_t to = (uint32_t)nb * SP_KV_BLOCK + (k - i);
        c->copy(c->copy_user, c->slot[k], to);
        c->slot[k] = to;
    }
    if (c->tail == (int64_t)old) c->tail = nb;
    block_unref(c->blocks, old);
    return nb;
}

/* The cells of the run that ends the sequence: [first, c->n). */
static uint32_t last_run(const struct sp_kv_cells *c) {
    const uint32_t b = slot_block(c->slot[c->n - 1]);
    uint32_t i = c->n - 1;
    while (i > 0 && slot_block(c->slot[i - 1]) == b) i--;
    return i;
}

sp_status sp_kv_cells_append(struct sp_kv_cells *c, const int32_t *tok, uint32_t n, int32_t pos0) {
    SP_ASSERT(c->n + n <= c->cap);
    const uint32_t n0 = c->n;
    if (n > 0 && c->tail < 0 && c->n > 0) {
        /* no tail: the last block is ours again (resume after its last
         * cell), or shared (copy our run of it first) */
        const uint32_t s = c->slot[c->n - 1], b = slot_block(s);
        if (block_refs(c->blocks, b) == 1) {
            c->tail = b;
            c->tail_next = s % SP_KV_BLOCK + 1;
        } else if (s % SP_KV_BLOCK + 1 < SP_KV_BLOCK) {
            const uint32_t first = last_run(c);
            const int64_t nb = move_run(c, first, c->n);
            if (nb < 0) return sp_err(SP_E_NOMEM, "%s: no free KV block to copy a shared one into", __func__);
            c->tail = nb;
            c->tail_next = c->n - first;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (c->tail < 0 || c->tail_next == SP_KV_BLOCK) {
            const int64_t b = c->held < c->quota ? block_take(c->blocks) : -1;
            if (b < 0) {
                sp_kv_cells_truncate(c, n0);
                return sp_err(SP_E_NOMEM, "%s: no free KV block (%u of a quota of %u held)", __func__, c->held,
                              c->quota);
            }
            c->tail = b;
            c->tail_next = 0;
            c->held++;
        }
        c->slot[c->n] = (uint32_t)c->tail * SP_KV_BLOCK + c->tail_next++;
        c->pos[c->n] = pos0 + (int32_t)i;
        c->tok[c->n] = tok ? tok[i] : -1;
        c->n++;
    }
    return SP_OK;
}

void sp_kv_cells_remove(struct sp_kv_cells *c, uint32_t first, uint32_t n) {
    SP_ASSERT(first + n <= c->n);
    if (n == 0) return;
    const uint32_t end = first + n;
    /* the blocks of the removed run that no kept cell shares (invariant 2:
     * only the cells just before and just after the run can) */
    const int64_t keep_lo = first > 0 ? (int64_t)slot_block(c->slot[first - 1]) : -1;
    const int64_t keep_hi = end < c->n ? (int64_t)slot_block(c->slot[end]) : -1;
    int64_t last = -1;
    for (uint32_t i = first; i < end; i++) {
        const int64_t b = slot_block(c->slot[i]);
        if (b == last) continue;
        last = b;
        if (b == keep_lo || b == keep_hi) continue;
        if (b == c->tail) c->tail = -1;
        block_unref(c->blocks, (uint32_t)b);
        c->held--;
    }
    memmove(c->slot + first, c->slot + end, (c->n - end) * sizeof *c->slot);
    memmove(c->pos + first, c->pos + end, (c->n - end) * sizeof *c->pos);
    memmove(c->tok + first, c->tok + end, (c->n - end) * sizeof *c->tok);
    c->n -= n;
    /* the tail: the block of the last cell, writable after its slot if no
     * other sequence shares it; else fresh blocks from the next append */
    /* a truncation: the next append decides where the tail goes */
    if (end >= c->n + n || c->n == 0) c->tail = -1;
}

void sp_kv_cells_fork(struct sp_kv_cells *dst, const struct sp_kv_cells *src, uint32_t n) {
    SP_ASSERT(dst->n == 0 && dst->blocks == src->blocks && n <= src->n && n <= dst->cap);
    int64_t last = -1;
    for (uint32_t i = 0; i < n; i++) {
        const int64_t b = slot_block(src->slot[i]);
        if (b != last) {
            block_ref(dst->blocks, (uint32_t)b);
            dst->held++;
            last = b;
        }
    }
    memcpy(dst->slot, src->slot, n * sizeof *dst->slot);
    memcpy(dst->pos, src->pos, n * sizeof *dst->pos);
    memcpy(dst->tok, src->tok, n * sizeof *dst->tok);
    dst->n = n;
    dst->tail = -1;
}

sp_status sp_kv_cells_unshare(struct sp_kv_cells *c, uint32_t first) {
    uint32_t i = first;
    while (i < c->n) {
        const uint32_t b = slot_block(c->slot[i]);
        uint32_t j = i + 1;
        while (j < c->n && slot_block(c->slot[j]) == b) j++;
        if (block_refs(c->blocks, b) > 1) {
            const bool was_tail = c->tail == (int64_t)b;
            const int64_t nb = move_run(c, i, j);
            if (nb < 0) return sp_err(SP_E_NOMEM, "%s: no free KV block to copy a shared one into", __func__);
            if (was_tail) c->tail_next = j - i;
        }
        i = j;
    }
    return SP_OK;
}
