/*
 * cache.h -- KV cache storage in blocks, and attention over a sequence's
 * cells (cells.h keeps the bookkeeping).
 *
 * A cache holds blocks of SP_KV_BLOCK token slots for every layer and KV
 * head of one model, keys as type_k and values as type_v (quant/kv.h).  In a
 * block, layer il and KV head kh own SP_KV_BLOCK key rows then SP_KV_BLOCK
 * value rows, each row one head's head_dim values in its type; blocks live
 * in chunks allocated when a sequence is granted its quota (never on the
 * token path) and the OS maps a chunk's pages when they are first written.
 * One cache serves every sequence of its model with those types, so
 * sequences can share the blocks of a common prefix (cells.h).
 *
 * Attention (sp_kv_attend) reads, for each KV head, every K and V tile of
 * the sequence once for all the query heads that share it (GQA) and all the
 * batch's tokens in a tile of queries, keeping the softmax online (a running
 * max and sum per query, no context-sized score buffer); work items (KV
 * head x query tile, and for one-token decodes KV head x run of cells, the
 * partial softmax states merged after) are spread over the pool's threads.
 * Tiles are logical (32 consecutive cells, gathered by slot), so results
 * depend on the cells' contents and order only, not on where they are
 * stored: a saved and loaded session decodes bit for bit as the original.
 */
#ifndef SP_KV_CACHE_H
#define SP_KV_CACHE_H

#include "core/core.h"
#include "kv/cells.h"
#include "quant/kv.h"
#include "sched/pool.h"

struct sp_kv_geom {
    uint32_t n_layers, n_heads, n_kv_heads, hd_k, hd_v;
    enum sp_kv_type type_k, type_v;
};

struct sp_kv_cache {
    struct sp_kv_geom g;
    size_t rb_k, rb_v;        /* bytes of a key / value row */
    size_t head_bytes;        /* one (layer, head) of a block: SP_KV_BLOCK * (rb_k + rb_v) */
    size_t block_bytes;       /* n_layers * n_kv_heads * head_bytes */
    struct sp_kv_blocks blocks;
    uint8_t ***pages;         /* block b's data: pages[b / 4096][b % 4096] (pages never move) */
    uint8_t **chunks;         /* allocations holding the blocks */
    uint32_t n_chunks, chunks_cap;
    uint64_t granted;         /* quota blocks granted to live sequences */
    uint32_t n_seq;           /* live sequences */
    pthread_mutex_t mu;       /* grants and releases */
};

/* Check that a model of this geometry can use these cache types: head sizes
 * a multiple of each type's block (q8_0, q4_0, q4h: 32).  SP_E_INVALID with
 * a message naming the type and the head size. */
sp_status sp_kv_geom_check(const struct sp_kv_geom *g);

/* Bytes one cell (token) takes in a cache of this geometry. */
uint64_t sp_kv_cell_bytes(const struct sp_kv_geom *g);
/* Bytes the quota of a sequence of n_ctx cells reserves (whole blocks). */
uint64_t sp_kv_seq_bytes(const struct sp_kv_geom *g, uint32_t n_ctx);

sp_status sp_kv_cache_init(const struct sp_kv_geom *g, struct sp_kv_cache **out);
void sp_kv_cache_free(struct sp_kv_cache *kv);

/* Start a sequence of up to n_ctx cells: grants its quota of blocks, adding
 * storage when the free blocks do not cover it (SP_E_NOMEM with the bytes
 * asked for).  The cache must outlive the cells. */
sp_status sp_kv_seq_init(struct sp_kv_cache *kv, uint32_t n_ctx, struct sp_kv_cells *c);
/* End it: its blocks go back to the pool (and the storage, once no sequence
 * is left). */
void sp_kv_seq_free(struct sp_kv_cache *kv, struct sp_kv_cells *c);

/* Bytes of storage allocated (all chunks). */
uint64_t sp_kv_cache_bytes(const struct sp_kv_cache *kv);

/* The key / value row (rb_k / rb_v bytes) of (slot, layer il, KV head kh). */
uint8_t *sp_kv_key_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh);
uint8_t *sp_kv_value_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh);

/* Store the key and value rows of cells [c0, c0 + n) of layer il: token t's
 * rows are k + t * n_kv_heads * hd_k and v + t * n_kv_heads * hd_v (every
 * head, original basis).  Rows are quantized on the pool's threads. */
void sp_kv_store(struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t c0, uint32_t n, uint32_t il,
                 const float *k, const float *v, struct sp_pool *pool);

/* Copy every layer's rows of one slot to another (copy on write). */
void sp_kv_copy_slot(struct sp_kv_cache *kv, uint32_t from, uint32_t to);

/* Per-thread scratch attention needs, in bytes (sp_kv_attend's scratch). */
size_t sp_kv_attend_scratch_bytes(const struct sp_kv_geom *g, int n_threads);

/* Attention of n_tok query tokens over the sequence in layer il: token t
 * (rows q + t * n_heads * hd_k, every head) sees cells [0, n_vis0 + t) and
 * writes out + t * n_heads * hd_v (every head):
 *   out = sum over visible cells p of softmax_p(scale * q . k_p) v_p
 * with query head h reading KV head h / (n_heads / n_kv_heads).  scratch
 * holds sp_kv_attend_scratch_bytes(g, n_threads of pool).  Never allocates.
 * note: call only with n_vis0 >= 1 and n_vis0 + n_tok - 1 <= c->n. */
void sp_kv_attend(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                  uint32_t n_tok, uint32_t n_vis0, float scale, float *out, struct sp_pool *pool, void *scratch);
/* Query tokens [t0, t1) of such a call of n_tok tokens (q, n_vis0 and out as
 * for the whole call): the same results for those rows, bit for bit, so a
 * prompt's attention can be done a few rows at a time (sp_forward_slice). */
void sp_kv_attend_rows(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                       uint32_t n_tok, uint32_t t0, uint32_t t1, uint32_t n_vis0, float scale, float *out,
                       struct sp_pool *pool, void *scratch);

#endif /* SP_KV_CACHE_H */
