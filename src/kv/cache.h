/*
 * cache.h -- the KV cache storage: for each layer, n_ctx rows of keys
 * (n_kv_heads * head_dim_k) and values (n_kv_heads * head_dim_v), as F32 or
 * F16.  One contiguous allocation made at session init; storing and reading
 * never allocate.  Paged/quantized storage comes with the memory-wall work;
 * callers only use these functions, never the layout.
 */
#ifndef SP_KV_CACHE_H
#define SP_KV_CACHE_H

#include "core/core.h"

struct sp_kv_cache;

/* Largest head size attention supports (stack scratch for an F16 query). */
#define SP_KV_MAX_HEAD_DIM 1024

/* SP_E_INVALID for a zero dimension or an unknown type, SP_E_NOMEM (message
 * states the bytes asked for). */
sp_status sp_kv_init(uint32_t n_layers, uint32_t n_ctx, uint32_t k_dim, uint32_t v_dim, enum sp_kv_type type,
                     struct sp_kv_cache **out);
void sp_kv_free(struct sp_kv_cache *kv);
uint64_t sp_kv_bytes(const struct sp_kv_cache *kv);

/* Store the key and value rows (k_dim, v_dim floats) of position pos in layer il.
 * note: call only with il < n_layers and pos < n_ctx (asserted). */
void sp_kv_store(struct sp_kv_cache *kv, uint32_t il, uint32_t pos, const float *k, const float *v);

/* Attention of one query head over positions [0, n_pos) of layer il:
 *   out[0..hd_v) = sum_p softmax_p(scale * <q, K[p] head kh>) * V[p] head kh
 * where head kh of a key row spans [kh*hd_k, (kh+1)*hd_k) (values: hd_v).
 * q (hd_k floats), att (n_pos floats) scratch that receives the attention
 * weights, out (hd_v floats).  Sums in F32 (F16 entries are widened). */
void sp_kv_attend(const struct sp_kv_cache *kv, uint32_t il, uint32_t kh, uint32_t hd_k, uint32_t hd_v,
                  uint32_t n_pos, const float *q, float scale, float *att, float *out);

#endif /* SP_KV_CACHE_H */
