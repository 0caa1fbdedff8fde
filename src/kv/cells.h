/*
 * cells.h -- the KV cache's bookkeeping, apart from its storage (cache.h),
 * as llama.cpp keeps llama-kv-cells.h apart from the cache: which block
 * slots hold a sequence's tokens, at which positions, and how many
 * sequences share each block.  No tensor data here.
 *
 * Storage is cut into blocks of SP_KV_BLOCK token slots.  A sequence is an
 * ordered list of cells (cell i = its i-th held token, oldest first), each
 * naming a global slot (block * SP_KV_BLOCK + offset), a position (what RoPE
 * rotated its key by) and a token id.  Positions increase along the cells.
 *
 * Invariants:
 *  1. A block's refcount is the number of sequences with a cell in it; a
 *     block with refcount 0 is on the free list.
 *  2. The cells of one sequence that lie in one block are consecutive in
 *     the cell order (appends fill a block's slots in order, and removals
 *     cut whole runs), so a removal can tell whether the sequence still
 *     uses a block from the cells beside the removed range.
 *  3. Only a sequence's tail block is written (its next free slot), and
 *     only while no other sequence shares it: a sequence whose last block is
 *     shared (after a fork, or a truncation into a forked prefix) copies its
 *     run of that block into a fresh block of its own before appending
 *     (copy on write, through the copy callback), so shared slots are never
 *     rewritten and no half-empty shared blocks pile up.
 *  4. A sequence's runs are whole blocks but for three: the sinks' block
 *     and the front a shift leaves, and the tail; so it never holds more
 *     than its quota of blocks, and the pool always has quota - held free
 *     blocks for each sequence (it grows by every quota it grants), so
 *     appends within the quota never fail.
 */
#ifndef SP_KV_CELLS_H
#define SP_KV_CELLS_H

#include "core/core.h"

#include <pthread.h>

#define SP_KV_BLOCK 32u /* token slots per block */

/* ---- the block allocator (shared by the sequences of one cache) --------- */

struct sp_kv_blocks {
    pthread_mutex_t mu;   /* allocations come from several sessions' threads */
    uint32_t n, cap;      /* blocks that exist / entries allocated */
    uint32_t *refs;       /* (cap) */
    uint32_t *free_list;  /* (cap) free block ids, a stack */
    uint32_t n_free;
    uint64_t n_granted;   /* sum of the quotas granted (bookkeeping) */
};

sp_status sp_kv_blocks_init(struct sp_kv_blocks *b);
void sp_kv_blocks_destroy(struct sp_kv_blocks *b);
/* Add n fresh blocks (ids n_old .. n_old + n - 1) to the free list. */
sp_status sp_kv_blocks_add(struct sp_kv_blocks *b, uint32_t n);

/* ---- one sequence ---------------------------------------------------------- */

/* Copy one slot's rows (every layer) to another (cache.c's sp_kv_copy_slot). */
typedef void (*sp_kv_copy_fn)(void *user, uint32_t from_slot, uint32_t to_slot);

struct sp_kv_cells {
    struct sp_kv_blocks *blocks;
    sp_kv_copy_fn copy;
    void *copy_user;
    uint32_t cap;       /* cells it may hold (the context) */
    uint32_t n;         /* cells held */
    uint32_t *slot;     /* (cap) global slot of cell i */
    int32_t *pos;       /* (cap) position of cell i */
    int32_t *tok;       /* (cap) token id of cell i */
    int64_t tail;       /* block being filled, -1 none */
    uint32_t tail_next; /* its next free slot offset */
    uint32_t quota;     /* blocks it may hold */
    uint32_t held;      /* distinct blocks it holds now */
};

/* The blocks a sequence of cap cells may need: every cell in its own run
 * of a block, plus the partial blocks a shift, a fork and the tail leave. */
uint32_t sp_kv_cells_quota(uint32_t cap);

sp_status sp_kv_cells_init(struct sp_kv_cells *c, struct sp_kv_blocks *b, uint32_t cap, sp_kv_copy_fn copy,
                           void *copy_user);
/* Releases every block; the pool keeps them for others. */
void sp_kv_cells_destroy(struct sp_kv_cells *c);

/* Append n cells (tokens tok[0..n), positions pos0, pos0+1, ...), choosing
 * their slots.  SP_E_NOMEM (nothing appended) if the pool has no free block,
 * which the quota rules out.  note: call only with c->n + n <= c->cap. */
sp_status sp_kv_cells_append(struct sp_kv_cells *c, const int32_t *tok, uint32_t n, int32_t pos0);

/* Drop cells [first, first + n) and close the gap: later cells move down by
 * n (their positions are unchanged: the caller shifts them). */
void sp_kv_cells_remove(struct sp_kv_cells *c, uint32_t first, uint32_t n);

/* Keep cells [0, n) (n <= c->n). */
static inline void sp_kv_cells_truncate(struct sp_kv_cells *c, uint32_t n) {
    if (n < c->n) sp_kv_cells_remove(c, n, c->n - n);
}

/* Make dst (empty, same pool) hold src's cells [0, n): the same slots, the
 * blocks shared (refcounts up); dst copies its last run before appending. */
void sp_kv_cells_fork(struct sp_kv_cells *dst, const struct sp_kv_cells *src, uint32_t n);

/* Cells [first, c->n) that lie in blocks shared with another sequence:
 * give each such run a fresh block of its own (copying its cells through
 * the copy callback), so that the caller can rewrite them in place (a
 * context shift re-rotates keys).  Returns SP_E_NOMEM if the pool has no
 * block (cannot happen within the quota). */
sp_status sp_kv_cells_unshare(struct sp_kv_cells *c, uint32_t first);

/* Distinct blocks in the pool / in use. */
uint32_t sp_kv_blocks_used(struct sp_kv_blocks *b);

#endif /* SP_KV_CELLS_H */
