/*
 * cache.c -- KV storage in blocks and streaming attention over cells (see
 * cache.h).
 *
 * Invariants:
 *  1. Block b's data is pages[b / PTR_PAGE][b % PTR_PAGE] (block_bytes,
 *     64-byte aligned), inside one of the chunks; entries are written before
 *     the block is put on the free list and pages never move, so a decode
 *     on another thread never reads a stale table.
 *  2. granted <= blocks.n: every live sequence's quota has storage.
 *  3. Only rows of cells a sequence holds are read; a row is written only
 *     by the sequence whose tail block holds it (cells.h invariant 3).
 */
#include "cache.h"

#include <math.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define PTR_PAGE 4096u  /* block pointers per page of the two-level table */
#define PTR_PAGES 4096u /* pages: up to 16 M blocks */

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

sp_status sp_kv_geom_check(const struct sp_kv_geom *g) {
    const enum sp_kv_type types[2] = {g->type_k, g->type_v};
    const uint32_t hds[2] = {g->hd_k, g->hd_v};
    for (int i = 0; i < 2; i++) {
        const struct sp_kv_type_info *ti = sp_kv_type_get(types[i]);
        if (!ti) return sp_err(SP_E_INVALID, "KV cache: unknown %s type %d", i ? "value" : "key", (int)types[i]);
        if (hds[i] == 0 || hds[i] > SP_KV_MAX_HEAD_DIM || hds[i] % (uint32_t)ti->block != 0) {
            return sp_err(SP_E_INVALID,
                          "KV cache: %s type %s stores rows in blocks of %d values, but this model's %s heads have "
                          "%u (use f16 or f32 for this model)",
                          i ? "value" : "key", ti->name, ti->block, i ? "value" : "key", hds[i]);
        }
    }
    if (!g->n_layers || !g->n_kv_heads || !g->n_heads || g->n_heads % g->n_kv_heads)
        return sp_err(SP_E_INVALID, "KV cache: bad geometry (%u layers, %u heads, %u KV heads)", g->n_layers,
                      g->n_heads, g->n_kv_heads);
    return SP_OK;
}

uint64_t sp_kv_cell_bytes(const struct sp_kv_geom *g) {
    return (uint64_t)g->n_layers * g->n_kv_heads * (sp_kv_row_bytes(g->type_k, (int32_t)g->hd_k) +
                                                    sp_kv_row_bytes(sp_kv_value_rows(g->type_v), (int32_t)g->hd_v));
}

static size_t head_bytes(const struct sp_kv_geom *g) {
    return SP_KV_BLOCK * (sp_kv_row_bytes(g->type_k, (int32_t)g->hd_k) +
                          sp_kv_row_bytes(sp_kv_value_rows(g->type_v), (int32_t)g->hd_v));
}

static size_t block_bytes(const struct sp_kv_geom *g) {
    return align64((size_t)g->n_layers * g->n_kv_heads * head_bytes(g));
}

uint64_t sp_kv_seq_bytes(const struct sp_kv_geom *g, uint32_t n_ctx) {
    return (uint64_t)sp_kv_cells_quota(n_ctx) * block_bytes(g);
}

sp_status sp_kv_cache_init(const struct sp_kv_geom *g, struct sp_kv_cache **out) {
    *out = NULL;
    sp_status rc = sp_kv_geom_check(g);
    if (rc) return rc;
    struct sp_kv_cache *kv = sp_calloc(1, sizeof *kv);
    if (!kv) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    kv->g = *g;
    kv->rb_k = sp_kv_row_bytes(g->type_k, (int32_t)g->hd_k);
    kv->rb_v = sp_kv_row_bytes(sp_kv_value_rows(g->type_v), (int32_t)g->hd_v);
    kv->head_bytes = head_bytes(g);
    kv->block_bytes = block_bytes(g);
    kv->pages = sp_calloc(PTR_PAGES, sizeof *kv->pages);
    if (!kv->pages || (rc = sp_kv_blocks_init(&kv->blocks))) {
        sp_free(kv->pages);
        sp_free(kv);
        return rc ? rc : sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    if (pthread_mutex_init(&kv->mu, NULL) != 0) {
        sp_kv_blocks_destroy(&kv->blocks);
        sp_free(kv->pages);
        sp_free(kv);
        return sp_err(SP_E_NOMEM, "%s: cannot create a mutex", __func__);
    }
    *out = kv;
    return SP_OK;
}

/* Free every chunk and page (no sequence left, every block free). */
static void release_storage(struct sp_kv_cache *kv) {
    for (uint32_t i = 0; i < kv->n_chunks; i++) sp_free_aligned(kv->chunks[i]);
    sp_free(kv->chunks);
    kv->chunks = NULL;
    kv->n_chunks = kv->chunks_cap = 0;
    uint8_t ***pages = kv->pages;
    for (uint32_t p = 0; p < PTR_PAGES; p++) {
        sp_free(pages[p]);
        pages[p] = NULL;
    }
    sp_kv_blocks_destroy(&kv->blocks);
    (void)sp_kv_blocks_init(&kv->blocks); /* cannot fail after a first success on Linux */
}

void sp_kv_cache_free(struct sp_kv_cache *kv) {
    if (!kv) return;
    release_storage(kv);
    sp_kv_blocks_destroy(&kv->blocks);
    pthread_mutex_destroy(&kv->mu);
    sp_free(kv->pages);
    sp_free(kv);
}

/* Add n blocks of storage: one chunk, its block pointers, then the ids. */
static sp_status grow(struct sp_kv_cache *kv, uint32_t n) {
    const uint32_t first = kv->blocks.n;
    if ((uint64_t)first + n > (uint64_t)PTR_PAGE * PTR_PAGES)
        return sp_err(SP_E_NOMEM, "KV cache: %u blocks exceed the cache's limit", first + n);
    uint64_t bytes;
    if (sp_mul_overflow_u64(n, kv->block_bytes, &bytes) || bytes > SIZE_MAX)
        return sp_err(SP_E_NOMEM, "KV cache: %u blocks of %zu bytes overflow", n, kv->block_bytes);
    if (kv->n_chunks == kv->chunks_cap) {
        const uint32_t cap = kv->chunks_cap ? kv->chunks_cap * 2 : 8;
        uint8_t **c = sp_realloc(kv->chunks, cap * sizeof *c);
        if (!c) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        kv->chunks = c;
        kv->chunks_cap = cap;
    }
    uint8_t *chunk = sp_malloc_aligned((size_t)bytes, 4096);
    if (!chunk)
        return sp_err(SP_E_NOMEM, "KV cache: cannot allocate %.1f MiB for %u blocks of %u tokens",
                      (double)bytes / 1048576.0, n, SP_KV_BLOCK);
    uint8_t ***pages = kv->pages;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t id = first + i, p = id / PTR_PAGE;
        if (!pages[p] && !(pages[p] = sp_calloc(PTR_PAGE, sizeof(uint8_t *)))) {
            sp_free_aligned(chunk);
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        }
        pages[p][id % PTR_PAGE] = chunk + (size_t)i * kv->block_bytes;
    }
    sp_status rc = sp_kv_blocks_add(&kv->blocks, n);
    if (rc) {
        sp_free_aligned(chunk);
        return rc;
    }
    kv->chunks[kv->n_chunks++] = chunk;
    return SP_OK;
}

static void copy_cb(void *user, uint32_t from, uint32_t to) {
    sp_kv_copy_slot(user, from, to);
}

sp_status sp_kv_seq_init(struct sp_kv_cache *kv, uint32_t n_ctx, struct sp_kv_cells *c) {
    sp_status rc = sp_kv_cells_init(c, &kv->blocks, n_ctx, copy_cb, kv);
    if (rc) return rc;
    pthread_mutex_lock(&kv->mu);
    const uint64_t avail = kv->blocks.n - SP_MIN(kv->granted, (uint64_t)kv->blocks.n);
    if (c->quota > avail) rc = grow(kv, (uint32_t)(c->quota - avail));
    if (!rc) {
        kv->granted += c->quota;
        kv->n_seq++;
    } else if (kv->n_seq == 0) {
        release_storage(kv); /* what a failed grow left behind */
    }
    pthread_mutex_unlock(&kv->mu);
    if (rc) {
        c->blocks = NULL; /* holds nothing */
        sp_kv_cells_destroy(c);
    }
    return rc;
}

static inline uint8_t *block_data(const struct sp_kv_cache *kv, uint32_t b);

/* Give the pages of every free block back to the OS (whole pages inside
 * the block): they read as zeros when next used, and a free block is
 * written before it is read (invariant 3), so nothing sees the difference.
 * The resident memory then follows the blocks held.  Called with kv->mu. */
static void trim_free_blocks(struct sp_kv_cache *kv) {
    const uintptr_t page = 4096;
    pthread_mutex_lock(&kv->blocks.mu);
    for (uint32_t i = 0; i < kv->blocks.n_free; i++) {
        const uintptr_t a = (uintptr_t)block_data(kv, kv->blocks.free_list[i]);
        const uintptr_t b = (a + page - 1) & ~(page - 1), e = (a + kv->block_bytes) & ~(page - 1);
        if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
    }
    pthread_mutex_unlock(&kv->blocks.mu);
}

void sp_kv_seq_free(struct sp_kv_cache *kv, struct sp_kv_cells *c) {
    if (!c->blocks) return;
    const uint32_t quota = c->quota;
    sp_kv_cells_destroy(c);
    pthread_mutex_lock(&kv->mu);
    kv->granted -= quota;
    if (--kv->n_seq == 0) {
        SP_ASSERT(kv->blocks.n_free == kv->blocks.n);
        release_storage(kv);
        kv->granted = 0;
    } else {
        trim_free_blocks(kv);
    }
    pthread_mutex_unlock(&kv->mu);
}

uint64_t sp_kv_cache_bytes(const struct sp_kv_cache *kv) {
    return (uint64_t)kv->blocks.n * kv->block_bytes;
}

static inline uint8_t *block_data(const struct sp_kv_cache *kv, uint32_t b) {
    return kv->pages[b / PTR_PAGE][b % PTR_PAGE];
}

static inline uint8_t *k_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh) {
    return block_data(kv, slot / SP_KV_BLOCK) + ((size_t)il * kv->g.n_kv_heads + kh) * kv->head_bytes +
           (size_t)(slot % SP_KV_BLOCK) * kv->rb_k;
}

static inline uint8_t *v_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh) {
    return block_data(kv, slot / SP_KV_BLOCK) + ((size_t)il * kv->g.n_kv_heads + kh) * kv->head_bytes +
           SP_KV_BLOCK * kv->rb_k + (size_t)(slot % SP_KV_BLOCK) * kv->rb_v;
}

uint8_t *sp_kv_key_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh) {
    return k_row(kv, slot, il, kh);
}

uint8_t *sp_kv_value_row(const struct sp_kv_cache *kv, uint32_t slot, uint32_t il, uint32_t kh) {
    return v_row(kv, slot, il, kh);
}

/* ---- store ---------------------------------------------------------------- */

struct store_job {
    struct sp_kv_cache *kv;
    const struct sp_kv_cells *c;
    uint32_t c0, n, il;
    const float *k, *v;
};

static void store_task(void *arg, int ith, int nth) {
    const struct store_job *j = arg;
    const struct sp_kv_geom *g = &j->kv->g;
    const uint32_t items = j->n * g->n_kv_heads;
    for (uint32_t it = (uint32_t)ith; it < items; it += (uint32_t)nth) {
        const uint32_t t = it / g->n_kv_heads, kh = it % g->n_kv_heads;
        const uint32_t slot = j->c->slot[j->c0 + t];
        sp_kv_row_store(g->type_k, j->k + ((size_t)t * g->n_kv_heads + kh) * g->hd_k,
                        k_row(j->kv, slot, j->il, kh), (int32_t)g->hd_k);
        sp_kv_row_store(sp_kv_value_rows(g->type_v), j->v + ((size_t)t * g->n_kv_heads + kh) * g->hd_v,
                        v_row(j->kv, slot, j->il, kh), (int32_t)g->hd_v);
    }
}

void sp_kv_store(struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t c0, uint32_t n, uint32_t il,
                 const float *k, const float *v, struct sp_pool *pool) {
    SP_ASSERT(c0 + n <= c->n && il < kv->g.n_layers);
    struct store_job j = {kv, c, c0, n, il, k, v};
    /* quantizing a row costs far more than copying it: threads pay off
     * from a few dozen rows of a quantized type, and from two of q4h's
     * (its trellis search: tens of microseconds per block of 32) */
    const bool quantized = kv->g.type_k > SP_KV_F16 || kv->g.type_v > SP_KV_F16;
    const bool trellis = kv->g.type_k == SP_KV_Q4H || kv->g.type_v == SP_KV_Q4H;
    const uint32_t min_rows = trellis ? 2u : quantized ? 16u : 512u;
    if (pool && sp_pool_n_threads(pool) > 1 && n * kv->g.n_kv_heads >= min_rows) {
        sp_pool_run(pool, store_task, &j);
    } else {
        store_task(&j, 0, 1);
    }
}

void sp_kv_copy_slot(struct sp_kv_cache *kv, uint32_t from, uint32_t to) {
    for (uint32_t il = 0; il < kv->g.n_layers; il++) {
        for (uint32_t kh = 0; kh < kv->g.n_kv_heads; kh++) {
            memcpy(k_row(kv, to, il, kh), k_row(kv, from, il, kh), kv->rb_k);
            memcpy(v_row(kv, to, il, kh), v_row(kv, from, il, kh), kv->rb_v);
        }
    }
}

/* ---- attention -------------------------------------------------------------- */

#define QROWS 64u /* query rows per work item (GQA heads x tokens), at least one token's heads */
#ifndef WIDE_MIN_ROWS
#define WIDE_MIN_ROWS 16u /* query rows from which a job takes the wide path */
#endif

static uint32_t group_size(const struct sp_kv_geom *g) {
    return g->n_heads / g->n_kv_heads;
}

/* Query rows a work item holds: whole tokens, about QROWS rows. */
static uint32_t rows_per_item(const struct sp_kv_geom *g) {
    const uint32_t G = group_size(g);
    return SP_MAX(1u, QROWS / G) * G;
}

/* One thread's scratch, carved from its slice. */
struct attn_scratch {
    float *qp;   /* (rows, hd_k) queries in the key type's domain */
    float *s;    /* (rows, SP_KV_TILE) scores, then numerators */
    float *m;    /* (rows) running max */
    double *l;   /* (rows) running sum */
    float *acc;  /* (rows, hd_v) */
    float *kt;   /* (SP_KV_TILE, hd_k) a key tile in F32 */
    float *vt;   /* (SP_KV_TILE, hd_v) */
    const void **kp, **vp; /* (SP_KV_TILE) row pointers */
    /* the wide path (many query rows: a prefill), queries across lanes */
    float *qt;   /* (hd_k, nqp) the prepped queries transposed, padding columns 0 */
    float *st;   /* (SP_KV_TILE, nqp) scores, then weights */
    float *mw, *lw, *keep; /* (nqp) running max, running sum, rescale factor */
};

/* Query rows a work item's wide path holds, padding included. */
static size_t wide_cols(const struct sp_kv_geom *g) {
    return (rows_per_item(g) + SP_KV_WIDE_PAD_MAX - 1) / SP_KV_WIDE_PAD_MAX * SP_KV_WIDE_PAD_MAX;
}

static size_t thread_scratch_bytes(const struct sp_kv_geom *g) {
    const size_t R = rows_per_item(g);
    return align64(R * g->hd_k * 4) + align64(R * SP_KV_TILE * 4) + align64(R * 4) + align64(R * 8) + align64(R * g->hd_v * 4) +
           align64(SP_KV_TILE * g->hd_k * 4) + align64(SP_KV_TILE * g->hd_v * 4) +
           2 * align64(SP_KV_TILE * sizeof(void *)) + align64(wide_cols(g) * g->hd_k * 4) +
           align64(wide_cols(g) * SP_KV_TILE * 4) + 3 * align64(wide_cols(g) * 4);
}

/* Partial softmax states of split one-token decodes: at most 2 * nth +
 * n_kv_heads of them, G rows each. */
static size_t partial_count(const struct sp_kv_geom *g, int n_threads) {
    return 2u * (size_t)n_threads + g->n_kv_heads;
}

size_t sp_kv_attend_scratch_bytes(const struct sp_kv_geom *g, int n_threads) {
    const size_t G = group_size(g);
    return (size_t)n_threads * thread_scratch_bytes(g) + partial_count(g, n_threads) * G * (2 + g->hd_v) * 4 + 64;
}

static struct attn_scratch carve(const struct sp_kv_geom *g, uint8_t *p) {
    const size_t R = rows_per_item(g);
    struct attn_scratch s;
    s.qp = (float *)p, p += align64(R * g->hd_k * 4);
    s.s = (float *)p, p += align64(R * SP_KV_TILE * 4);
    s.m = (float *)p, p += align64(R * 4);
    s.l = (double *)p, p += align64(R * 8);
    s.acc = (float *)p, p += align64(R * g->hd_v * 4);
    s.kt = (float *)p, p += align64(SP_KV_TILE * g->hd_k * 4);
    s.vt = (float *)p, p += align64(SP_KV_TILE * g->hd_v * 4);
    s.kp = (const void **)p, p += align64(SP_KV_TILE * sizeof(void *));
    s.vp = (const void **)p, p += align64(SP_KV_TILE * sizeof(void *));
    const size_t W = wide_cols(g);
    s.qt = (float *)p, p += align64(W * g->hd_k * 4);
    s.st = (float *)p, p += align64(W * SP_KV_TILE * 4);
    s.mw = (float *)p, p += align64(W * 4);
    s.lw = (float *)p, p += align64(W * 4);
    s.keep = (float *)p;
    return s;
}

struct attn_job {
    const struct sp_kv_cache *kv;
    const struct sp_kv_cells *c;
    const struct sp_attn_kernels *kern;
    uint32_t il, n_tok, n_vis0;
    float scale;
    const float *q;
    float *out;
    uint8_t *scratch;
    float *part;        /* split decodes: (n_items, G, 2 + hd_v) */
    uint32_t tok_per_item, n_ttiles, n_split, split_cells;
    uint32_t n_items;
    bool wide; /* run_wide: query tiles of many rows (a prefill) */
    atomic_uint next;
};

/* Work item it -> KV head, query tile, cell chunk.  Query tiles run last
 * first: later tokens see more cells (causal), so the long items start
 * early. */
static void item_of(const struct attn_job *j, uint32_t it, uint32_t *kh, uint32_t *tt, uint32_t *ch) {
    const uint32_t per_tile = j->kv->g.n_kv_heads * j->n_split;
    *tt = j->n_ttiles - 1 - it / per_tile;
    *kh = it % per_tile / j->n_split;
    *ch = it % j->n_split;
}

/* Ask for the rows of tile [x, x + nt) of KV head kh ahead of their use: a
 * tile's rows are a run of a block (a page or two), the next tile's are in
 * another block, so the hardware prefetcher, which stops at page
 * boundaries, would start every tile from a cold miss.  Into L2, not L1
 * (prefetcht1): a tile's 256 lines asked into L1 at once wait on its few
 * miss buffers, and the kernels' own loads queue behind them -- bench/attn
 * 4096 32 8 128 f16 f16 32 T (llama3-8b at depth 4096), AMD EPYC Zen 4,
 * quiet, medians of 9 tokens in 3 interleaved rounds: one thread 101-108
 * ms a token with prefetcht0, 78-80 with prefetcht1; two threads 51-60 and
 * 44-50.  (Beside a llama.cpp run, one thread: prefetcht2 as prefetcht1,
 * no prefetch at all as prefetcht0.) */
static inline void prefetch_line(const void *p) {
    /* an asm statement: GCC treats __builtin_prefetch as free of effects and
     * dropped the whole loop (a function of nothing but prefetches is
     * "const" to it, and its calls went) */
#if defined(__x86_64__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#elif defined(__aarch64__)
    __asm__ volatile("prfm pldl1keep, %0" : : "Q"(*(const char *)p));
#else
    __builtin_prefetch(p);
#endif
}

/* Whether the tile's rows are one run of one block (the usual case: the
 * cells of a sequence written in order); then *k0 and *v0 are its first key
 * and value rows, and the rest follow at rb_k and rb_v. */
static bool tile_run(const struct attn_job *j, uint32_t kh, uint32_t x, uint32_t nt, const uint8_t **k0,
                     const uint8_t **v0) {
    const uint32_t s0 = j->c->slot[x];
    if (j->c->slot[x + nt - 1] != s0 + nt - 1 || s0 / SP_KV_BLOCK != (s0 + nt - 1) / SP_KV_BLOCK) return false;
    for (uint32_t r = 1; r + 1 < nt; r++) {
        if (j->c->slot[x + r] != s0 + r) return false;
    }
    *k0 = k_row(j->kv, s0, j->il, kh);
    *v0 = v_row(j->kv, s0, j->il, kh);
    return true;
}

static void prefetch_span(const uint8_t *p, size_t n) {
    for (size_t b = 0; b < n; b += 64) prefetch_line(p + b);
}

/* Row by row, a key row then its value row: measured faster (bench/attn,
 * Zen 5) than the same lines as two runs, keys then values, or the two runs
 * interleaved line by line -- by ~20% for a Q8_0 cache of grouped heads. */
static void prefetch_tile(const struct attn_job *j, uint32_t kh, uint32_t x, uint32_t nt) {
    const struct sp_kv_cache *kv = j->kv;
    for (uint32_t r = 0; r < nt; r++) {
        const uint32_t slot = j->c->slot[x + r];
        prefetch_span(k_row(kv, slot, j->il, kh), kv->rb_k);
        prefetch_span(v_row(kv, slot, j->il, kh), kv->rb_v);
    }
}

/* The row pointers of tile [x, min(x + SP_KV_TILE, ce)) of KV head kh in
 * s->kp / s->vp, the next tile's rows asked for; returns the tile's rows. */
static uint32_t tile_rows(const struct attn_job *j, struct attn_scratch *s, uint32_t kh, uint32_t x, uint32_t ce) {
    const uint32_t nt = SP_MIN(SP_KV_TILE, ce - x);
    if (x + SP_KV_TILE < ce) prefetch_tile(j, kh, x + SP_KV_TILE, SP_MIN(SP_KV_TILE, ce - x - SP_KV_TILE));
    const uint8_t *k0, *v0;
    if (tile_run(j, kh, x, nt, &k0, &v0)) {
        for (uint32_t r = 0; r < nt; r++) {
            s->kp[r] = k0 + r * j->kv->rb_k;
            s->vp[r] = v0 + r * j->kv->rb_v;
        }
        return nt;
    }
    for (uint32_t r = 0; r < nt; r++) {
        const uint32_t slot = j->c->slot[x + r];
        s->kp[r] = k_row(j->kv, slot, j->il, kh);
        s->vp[r] = v_row(j->kv, slot, j->il, kh);
    }
    return nt;
}

/* The wide path of run_item for nq query rows (t0's first, G per token)
 * over cells [cb, ce): the queries are transposed once, and each tile's
 * scores, softmax and weighted sum run with the queries across the vector
 * lanes, a causal mask written as -inf.  The same online softmax as the
 * narrow path in another summation order (FMA, float sums): equal to a few
 * ulp, not bit for bit. */
static void run_wide(const struct attn_job *j, struct attn_scratch *s, uint32_t kh, uint32_t t0, uint32_t nq,
                     uint32_t cb, uint32_t ce) {
    const struct sp_kv_geom *g = &j->kv->g;
    const uint32_t G = group_size(g), hdk = g->hd_k, hdv = g->hd_v;
    const uint32_t pad = (uint32_t)j->kern->wide_pad, nqp = (nq + pad - 1) / pad * pad;
    for (uint32_t i = 0; i < nq; i++) {
        const uint32_t t = t0 + i / G, h = kh * G + i % G;
        sp_kv_query_prep(g->type_k, j->q + ((size_t)t * g->n_heads + h) * hdk, s->qp, (int32_t)hdk);
        for (uint32_t c = 0; c < hdk; c++) s->qt[(size_t)c * nqp + i] = s->qp[c];
    }
    for (uint32_t c = 0; c < hdk; c++) {
        for (uint32_t i = nq; i < nqp; i++) s->qt[(size_t)c * nqp + i] = 0.0f;
    }
    for (uint32_t i = 0; i < nqp; i++) {
        s->mw[i] = -INFINITY;
        s->lw[i] = 0.0f;
    }
    memset(s->acc, 0, (size_t)nq * hdv * sizeof(float));
    if (cb < ce) prefetch_tile(j, kh, cb, SP_MIN(SP_KV_TILE, ce - cb));
    for (uint32_t x = cb; x < ce; x += SP_KV_TILE) {
        const uint32_t nt = tile_rows(j, s, kh, x, ce);
        sp_kv_rows_to_float(g->type_k, s->kp, (int32_t)nt, (int32_t)hdk, s->kt);
        j->kern->scores_t(s->qt, (int32_t)nqp, s->kt, (int32_t)nt, (int32_t)hdk, j->scale, s->st);
        /* cell x + r is visible to token t when x + r < n_vis0 + t: the
         * rows of tokens before t_min(r) = x + r + 1 - n_vis0 are masked */
        for (uint32_t r = 0; r < nt; r++) {
            const uint32_t need = x + r + 1; /* n_vis0 + t >= need */
            if (need <= j->n_vis0 + t0) continue; /* visible to every token of the item */
            const uint32_t hide = SP_MIN(nq, (need - j->n_vis0 - t0) * G);
            float *sr = s->st + (size_t)r * nqp;
            for (uint32_t i = 0; i < hide; i++) sr[i] = -INFINITY;
        }
        j->kern->softmax_t(s->st, (int32_t)nt, (int32_t)nqp, s->mw, s->lw, s->keep);
        sp_kv_rows_to_float(sp_kv_value_rows(g->type_v), s->vp, (int32_t)nt, (int32_t)hdv, s->vt);
        j->kern->accum_t(s->st, (int32_t)nqp, (int32_t)nq, s->keep, s->vt, (int32_t)nt, (int32_t)hdv, s->acc,
                         (int32_t)hdv);
    }
}

static void run_item(const struct attn_job *j, struct attn_scratch *s, uint32_t it) {
    const struct sp_kv_geom *g = &j->kv->g;
    const uint32_t G = group_size(g), hdk = g->hd_k, hdv = g->hd_v;
    uint32_t kh, tt, ch;
    item_of(j, it, &kh, &tt, &ch);
    const uint32_t t0 = tt * j->tok_per_item, t1 = SP_MIN(j->n_tok, t0 + j->tok_per_item);
    const uint32_t nq = (t1 - t0) * G;
    /* the cells this item covers: [cb, ce) */
    const uint32_t vis_max = j->n_vis0 + t1 - 1;
    const uint32_t cb = ch * j->split_cells, ce = j->n_split > 1 ? SP_MIN(vis_max, cb + j->split_cells) : vis_max;
    if (j->wide) {
        run_wide(j, s, kh, t0, nq, cb, ce);
        goto out;
    }
    /* queries: row i = token t0 + i / G, head kh * G + i % G */
    for (uint32_t i = 0; i < nq; i++) {
        const uint32_t t = t0 + i / G, h = kh * G + i % G;
        sp_kv_query_prep(g->type_k, j->q + ((size_t)t * g->n_heads + h) * hdk, s->qp + (size_t)i * hdk,
                         (int32_t)hdk);
        s->m[i] = -INFINITY;
        s->l[i] = 0.0f;
    }
    memset(s->acc, 0, (size_t)nq * hdv * sizeof(float));
    if (cb < ce) prefetch_tile(j, kh, cb, SP_MIN(SP_KV_TILE, ce - cb));
    for (uint32_t x = cb; x < ce; x += SP_KV_TILE) {
        const uint32_t nt = tile_rows(j, s, kh, x, ce);
        if (!j->kern->scores_rows || !j->kern->scores_rows(g->type_k, s->qp, (int32_t)hdk, (int32_t)nq, s->kp,
                                                           (int32_t)nt, (int32_t)hdk, j->scale, s->s)) {
            sp_kv_rows_to_float(g->type_k, s->kp, (int32_t)nt, (int32_t)hdk, s->kt);
            j->kern->scores(s->qp, (int32_t)hdk, (int32_t)nq, s->kt, (int32_t)nt, (int32_t)hdk, j->scale, s->s);
        }
        for (uint32_t i = 0; i < nq; i++) {
            float *si = s->s + (size_t)i * nt;
            const uint32_t vis = j->n_vis0 + t0 + i / G; /* cells [0, vis) */
            const uint32_t nv = vis > x ? SP_MIN(nt, vis - x) : 0;
            float mx = -INFINITY;
            for (uint32_t r = 0; r < nv; r++) mx = si[r] > mx ? si[r] : mx;
            for (uint32_t r = nv; r < nt; r++) si[r] = 0.0f;
            if (nv == 0 || mx == -INFINITY) {
                for (uint32_t r = 0; r < nv; r++) si[r] = 0.0f;
                s->keep[i] = s->lw[i] = 1.0f;
                continue;
            }
            /* the accumulator stays normalised: acc = sum p v / l over the
             * cells so far, so that a context of one tile gives exactly the
             * two-pass softmax (weights normalised, then summed); accum
             * rescales it by keep and weighs the new rows by p / l' */
            const float m_new = mx > s->m[i] ? mx : s->m[i];
            const double kept = s->l[i] * (double)expf(s->m[i] - m_new); /* 0 for the first tile */
            j->kern->exp(si, (int32_t)nv, m_new);
            double sum = 0.0;
            for (uint32_t r = 0; r < nv; r++) sum += si[r];
            const double l_new = kept + sum;
            s->lw[i] = (float)(1.0 / l_new);
            s->keep[i] = (float)(kept / l_new);
            s->l[i] = l_new;
            s->m[i] = m_new;
        }
        if (!j->kern->accum_rows ||
            !j->kern->accum_rows(g->type_v, s->s, (int32_t)nq, s->lw, s->keep, s->vp, (int32_t)nt, (int32_t)hdv,
                                 s->acc, (int32_t)hdv)) {
            sp_kv_rows_to_float(sp_kv_value_rows(g->type_v), s->vp, (int32_t)nt, (int32_t)hdv, s->vt);
            j->kern->accum(s->s, (int32_t)nq, s->lw, s->keep, s->vt, (int32_t)nt, (int32_t)hdv, s->acc, (int32_t)hdv);
        }
    }
out:
    if (j->n_split > 1) { /* a one-token decode's chunk: keep the partial state */
        float *p = j->part + (size_t)(kh * j->n_split + ch) * G * (2 + hdv);
        for (uint32_t i = 0; i < nq; i++, p += 2 + hdv) {
            p[0] = j->wide ? s->mw[i] : s->m[i];
            p[1] = j->wide ? s->lw[i] : (float)s->l[i];
            memcpy(p + 2, s->acc + (size_t)i * hdv, hdv * sizeof(float));
        }
        return;
    }
    for (uint32_t i = 0; i < nq; i++) {
        const uint32_t t = t0 + i / G, h = kh * G + i % G;
        float *o = j->out + ((size_t)t * g->n_heads + h) * hdv;
        memcpy(o, s->acc + (size_t)i * hdv, hdv * sizeof(float));
        sp_kv_output_fix(g->type_v, o, (int32_t)hdv);
    }
}

static void attn_task(void *arg, int ith, int nth) {
    struct attn_job *j = arg;
    (void)nth;
    struct attn_scratch s = carve(&j->kv->g, j->scratch + (size_t)ith * thread_scratch_bytes(&j->kv->g));
    for (;;) {
        const uint32_t it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items) break;
        run_item(j, &s, it);
    }
}

/* A split decode: merge each head's chunks in chunk order. */
static void merge_partials(const struct attn_job *j) {
    const struct sp_kv_geom *g = &j->kv->g;
    const uint32_t G = group_size(g), hdv = g->hd_v, stride = 2 + hdv;
    for (uint32_t kh = 0; kh < g->n_kv_heads; kh++) {
        for (uint32_t i = 0; i < G; i++) {
            const float *p0 = j->part + ((size_t)kh * j->n_split * G + i) * stride;
            float m = -INFINITY;
            for (uint32_t ch = 0; ch < j->n_split; ch++) {
                const float mc = p0[(size_t)ch * G * stride];
                m = mc > m ? mc : m;
            }
            /* each chunk's accumulator is normalised by its own sum: weigh
             * it by that sum at the common max */
            float *o = j->out + ((size_t)kh * G + i) * hdv;
            double l = 0.0;
            for (uint32_t ch = 0; ch < j->n_split; ch++) {
                const float *p = p0 + (size_t)ch * G * stride;
                if (p[1] > 0.0f) l += (double)p[1] * expf(p[0] - m);
            }
            for (uint32_t d = 0; d < hdv; d++) o[d] = 0.0f;
            for (uint32_t ch = 0; ch < j->n_split; ch++) {
                const float *p = p0 + (size_t)ch * G * stride;
                if (!(p[1] > 0.0f)) continue;
                const float w = (float)((double)p[1] * expf(p[0] - m) / l);
                for (uint32_t d = 0; d < hdv; d++) o[d] += p[2 + d] * w;
            }
            sp_kv_output_fix(g->type_v, o, (int32_t)hdv);
        }
    }
}

/* n_tok query tokens from n_vis0 on, as part of a call of n_all tokens: the
 * path (wide or narrow) is the whole call's, so a part's rows come out as
 * they would in the whole (each row's arithmetic depends on nothing else). */
static void attend(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                   uint32_t n_tok, uint32_t n_all, uint32_t n_vis0, float scale, float *out, struct sp_pool *pool,
                   void *scratch) {
    const struct sp_kv_geom *g = &kv->g;
    SP_ASSERT(n_tok >= 1 && n_vis0 >= 1 && n_vis0 + n_tok - 1 <= c->n && il < g->n_layers);
    const uint32_t G = group_size(g);
    int nth = pool ? sp_pool_n_threads(pool) : 1;
    /* small work is not worth waking threads for */
    const uint64_t work = (uint64_t)n_tok * (n_vis0 + n_tok) * g->n_heads * (g->hd_k + g->hd_v);
    if (work < 65536) nth = 1;
    struct attn_job j = {.kv = kv, .c = c, .kern = sp_attn_kernels_get(), .il = il, .n_tok = n_tok, .n_vis0 = n_vis0,
                         .scale = scale, .q = q, .out = out, .scratch = scratch};
    j.tok_per_item = rows_per_item(g) / G;
    j.n_ttiles = (n_tok + j.tok_per_item - 1) / j.tok_per_item;
    j.n_split = 1;
    j.split_cells = 0;
    const uint32_t base_items = g->n_kv_heads * j.n_ttiles;
    if (n_all == 1 && nth > 1 && base_items < 2u * (uint32_t)nth && n_vis0 >= 8 * SP_KV_TILE) {
        /* too few heads for the threads: cut each head's cells into runs of
         * whole tiles, merged after */
        uint32_t want = (2u * (uint32_t)nth + g->n_kv_heads - 1) / g->n_kv_heads;
        const uint32_t tiles = (n_vis0 + SP_KV_TILE - 1) / SP_KV_TILE;
        want = SP_MIN(want, tiles);
        j.split_cells = (tiles + want - 1) / want * SP_KV_TILE;
        j.n_split = (n_vis0 + j.split_cells - 1) / j.split_cells;
        SP_ASSERT(g->n_kv_heads * j.n_split <= partial_count(g, nth));
        j.part = (float *)((uint8_t *)scratch + (size_t)nth * thread_scratch_bytes(g));
    }
    j.n_items = base_items * j.n_split;
    /* the wide path pays from a few lanes' worth of query rows; a decode
     * (G rows) and short prompts keep the narrow one */
    j.wide = (uint64_t)n_all * G >= WIDE_MIN_ROWS;
    atomic_init(&j.next, 0);
    if (nth > 1) {
        sp_pool_run(pool, attn_task, &j);
    } else {
        attn_task(&j, 0, 1);
    }
    if (j.n_split > 1) merge_partials(&j);
}

void sp_kv_attend(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                  uint32_t n_tok, uint32_t n_vis0, float scale, float *out, struct sp_pool *pool, void *scratch) {
    attend(kv, c, il, q, n_tok, n_tok, n_vis0, scale, out, pool, scratch);
}

void sp_kv_attend_rows(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                       uint32_t n_tok, uint32_t t0, uint32_t t1, uint32_t n_vis0, float scale, float *out,
                       struct sp_pool *pool, void *scratch) {
    SP_ASSERT(t0 < t1 && t1 <= n_tok);
    const struct sp_kv_geom *g = &kv->g;
    attend(kv, c, il, q + (size_t)t0 * g->n_heads * g->hd_k, t1 - t0, n_tok, n_vis0 + t0, scale,
           out + (size_t)t0 * g->n_heads * g->hd_v, pool, scratch);
}
