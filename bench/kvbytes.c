/*
 * kvbytes.c -- the KV cache bytes a session of a model allocates, measured
 * three ways and set against the formula
 *   n_layers x n_ctx x n_kv_heads x (head_dim_k + head_dim_v) x bytes per element
 * (bench/fold.sh compares a model with its KV heads folded and the original).
 * A client of sparrow.h only; nothing is decoded and no weight is read (the
 * file is mapped, not loaded).
 *
 *   kvbytes MODEL [N_CTX]      (N_CTX default 4096)
 *
 * The session's KV cache is read three ways, for an F16 cache:
 *   kv_bytes_reserved  sp_session_kv_info's bytes_reserved: the blocks the
 *                      session's quota holds in the model's block pool;
 *   kv_bytes_session   sp_session_memory_bytes (KV quota + scratch + logits)
 *                      of a session with an F32 cache minus that of one with
 *                      an F16 cache: they differ only in the element size, so
 *                      the difference is the F16 cache's bytes;
 *   kv_bytes_heap      the same difference in the bytes sp_session_init asked
 *                      the allocator for (a counting allocator hook).
 * The blocked cache reserves whole blocks, and a few beyond n_ctx for
 * context shifts, so the bytes are the formula's per position times
 * kv_cells, the positions reserved (kv_bytes_reserved / bytes per position;
 * 4192 for n_ctx 4096 on main at this writing); kv_bytes_formula is the
 * formula at n_ctx itself.  One JSON line on stdout:
 *   {"model", "n_layers", "n_ctx", "n_kv_heads", "head_dim_k", "head_dim_v",
 *    "kv_bytes_per_position", "kv_cells", "kv_bytes_formula",
 *    "kv_bytes_reserved", "kv_bytes_session", "kv_bytes_heap",
 *    "session_bytes", "session_heap"}
 */
#include "sparrow.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A counting allocator: each block carries its size in a 16-byte header. */
static uint64_t live_bytes;

static void *count_malloc(size_t n, void *user) {
    (void)user;
    uint64_t *p = malloc(n + 16);
    if (!p) return NULL;
    p[0] = n;
    live_bytes += n;
    return (char *)p + 16;
}

static void count_free(void *ptr, void *user) {
    (void)user;
    if (!ptr) return;
    uint64_t *p = (uint64_t *)((char *)ptr - 16);
    live_bytes -= p[0];
    free(p);
}

static void *count_realloc(void *ptr, size_t n, void *user) {
    if (!ptr) return count_malloc(n, user);
    uint64_t *p = (uint64_t *)((char *)ptr - 16);
    const uint64_t old = p[0];
    uint64_t *q = realloc(p, n + 16);
    if (!q) return NULL;
    q[0] = n;
    live_bytes = live_bytes - old + n;
    return (char *)q + 16;
}

/* A session of m with cache type t: the library's count, the heap bytes its
 * init asked for, and its KV reservation.  Exits on failure (a tool, not the
 * library). */
static void session_bytes(struct sp_model *m, int32_t n_ctx, enum sp_kv_type t, uint64_t *lib, uint64_t *heap,
                          uint64_t *reserved) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_threads = 1;
    sp.kv_type_k = sp.kv_type_v = t;
    struct sp_session *s = NULL;
    const uint64_t before = live_bytes;
    if (sp_session_init(m, &sp, &s) != SP_OK) {
        fprintf(stderr, "kvbytes: session of %d positions: %s\n", (int)n_ctx, sp_last_error());
        exit(1);
    }
    *heap = live_bytes - before;
    *lib = sp_session_memory_bytes(s);
    struct sp_kv_info ki;
    if (sp_session_kv_info(s, &ki) != SP_OK) {
        fprintf(stderr, "kvbytes: %s\n", sp_last_error());
        exit(1);
    }
    *reserved = ki.bytes_reserved;
    sp_session_free(s);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: kvbytes MODEL [N_CTX]\n");
        return 2;
    }
    const int32_t n_ctx = argc > 2 ? (int32_t)atoi(argv[2]) : 4096;
    if (n_ctx < 1) {
        fprintf(stderr, "kvbytes: N_CTX must be a positive integer, got '%s'\n", argv[2]);
        return 2;
    }
    const struct sp_allocator a = {count_malloc, count_realloc, count_free, NULL};
    sp_set_allocator(&a);
    struct sp_model_params mp = sp_model_default_params();
    mp.weights = SP_WEIGHTS_MMAP;
    struct sp_model *m = NULL;
    if (sp_model_load(argv[1], &mp, &m) != SP_OK) {
        fprintf(stderr, "kvbytes: %s\n", sp_last_error());
        return 1;
    }
    struct sp_model_info i;
    sp_model_get_info(m, &i);
    uint64_t lib16, heap16, res16, lib32, heap32, res32;
    session_bytes(m, n_ctx, SP_KV_F16, &lib16, &heap16, &res16);
    session_bytes(m, n_ctx, SP_KV_F32, &lib32, &heap32, &res32);
    const uint64_t per_pos = (uint64_t)i.n_layers * (uint64_t)i.n_kv_heads * (uint64_t)(i.head_dim_k + i.head_dim_v) * 2;
    printf("{\"model\": \"%s\", \"n_layers\": %d, \"n_ctx\": %d, \"n_kv_heads\": %d, \"head_dim_k\": %d, "
           "\"head_dim_v\": %d, \"kv_bytes_per_position\": %" PRIu64 ", \"kv_cells\": %.2f, "
           "\"kv_bytes_formula\": %" PRIu64 ", \"kv_bytes_reserved\": %" PRIu64 ", \"kv_bytes_session\": %" PRIu64
           ", \"kv_bytes_heap\": %" PRIu64 ", \"session_bytes\": %" PRIu64 ", \"session_heap\": %" PRIu64 "}\n",
           argv[1], (int)i.n_layers, (int)n_ctx, (int)i.n_kv_heads, (int)i.head_dim_k, (int)i.head_dim_v, per_pos,
           (double)res16 / (double)per_pos, per_pos * (uint64_t)n_ctx, res16, lib32 - lib16, heap32 - heap16, lib16,
           heap16);
    sp_model_free(m);
    sp_set_allocator(NULL);
    return 0;
}
