/*
 * repack_k.c -- Q4_K_g8 and Q6_K_g8 (quant.h): the K-quants with each
 * super-block's quant bits turned for the decode kernels, made by the pager
 * from the file's layout at load time.  The reference kernels turn a
 * super-block back and run the file type's reference (ref.c) on it, so both
 * layouts give the same bits by construction.
 */
#include "quant.h"
#include "ref.h"

#include "core/core.h"
#include "types.h"

#include <assert.h>
#include <string.h>

static_assert(sizeof(struct sp_block_q4_k) == 144 && sizeof(struct sp_block_q6_k) == 210, "K-quant super-blocks");

/* Element e (0..31) of sub-block k (0..7) in the turned quant bytes: byte
 * 32 * ((e % 16) / 4) + 4k + e % 4, low nibble for e < 16, high above. */
static inline int g8k_byte(int k, int e) {
    return 32 * ((e % 16) / 4) + 4 * k + e % 4;
}

/* Q4_K's qs: element e of sub-block k is nibble k % 2 of byte 32 (k / 2) + e. */
static inline int q4k_get(const uint8_t *qs, int k, int e) {
    return (qs[32 * (k / 2) + e] >> (4 * (k % 2))) & 0x0f;
}

void sp_q4_k_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    assert(n % SP_QK_K == 0);
    for (int64_t r = 0; r < n_rows; r++) {
        struct sp_block_q4_k *b = (struct sp_block_q4_k *)((uint8_t *)rows + (size_t)r * stride);
        for (int64_t i = 0; i < n / SP_QK_K; i++) {
            uint8_t t[SP_QK_K / 2] = {0};
            for (int k = 0; k < 8; k++)
                for (int e = 0; e < 32; e++) t[g8k_byte(k, e)] |= (uint8_t)(q4k_get(b[i].qs, k, e) << (4 * (e / 16)));
            memcpy(b[i].qs, t, sizeof t);
        }
    }
}

/* Super-block g of Q4_K_g8 back in Q4_K's layout. */
static void g8k_unturn(const struct sp_block_q4_k *g, struct sp_block_q4_k *out) {
    *out = *g;
    memset(out->qs, 0, sizeof out->qs);
    for (int k = 0; k < 8; k++) {
        for (int e = 0; e < 32; e++) {
            const int u = (g->qs[g8k_byte(k, e)] >> (4 * (e / 16))) & 0x0f;
            out->qs[32 * (k / 2) + e] |= (uint8_t)(u << (4 * (k % 2)));
        }
    }
}

void sp_q4_k_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q4_k *g = src;
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        struct sp_block_q4_k b;
        g8k_unturn(&g[i], &b);
        sp_q4_k_to_float_ref(&b, dst, SP_QK_K);
    }
}

/* Q4_K's reference order: sum = sum + (term of super-block i), the term
 * being what Q4_K's vec_dot of that one super-block returns. */
void sp_vec_dot_q4_k_g8_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q4_k *g = w;
    const struct sp_block_q8_k *y = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        struct sp_block_q4_k b;
        float t;
        g8k_unturn(&g[i], &b);
        sp_vec_dot_q4_k_q8_k_ref(SP_QK_K, &t, &b, &y[i]);
        sum += t;
    }
    *s = sum;
}

/* ---- Q6_K_g8 ---------------------------------------------------------------- */

/* Q6_K's q + 32 (0..63) of element i (ref.c's q6_k_unpack). */
static inline int q6k_get(const struct sp_block_q6_k *b, int i) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t lb = b->ql[64 * h + 32 * (k & 1) + l];
    return (k < 2 ? lb & 0x0f : lb >> 4) | ((b->qh[32 * h + l] >> (2 * k)) & 3) << 4;
}

/* Element i of a super-block in the turned layout: vector j, dword k, byte
 * b (quant.h). */
static inline void g8k6_pos(int i, int *j, int *k, int *b) {
    const int s = i / 16, e = i % 16;
    *j = e / 2;
    *k = s / 2;
    *b = 2 * (s % 2) + e % 2;
}

void sp_q6_k_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    assert(n % SP_QK_K == 0);
    for (int64_t r = 0; r < n_rows; r++) {
        struct sp_block_q6_k *b = (struct sp_block_q6_k *)((uint8_t *)rows + (size_t)r * stride);
        for (int64_t i = 0; i < n / SP_QK_K; i++) {
            uint8_t ql[SP_QK_K / 2] = {0}, qh[SP_QK_K / 4] = {0};
            for (int e = 0; e < SP_QK_K; e++) {
                int j, k, bb;
                g8k6_pos(e, &j, &k, &bb);
                const int u = q6k_get(&b[i], e);
                ql[32 * (j / 2) + 4 * k + bb] |= (uint8_t)((u & 0x0f) << (4 * (j % 2)));
                qh[32 * (j / 4) + 4 * k + bb] |= (uint8_t)((u >> 4) << (2 * (j % 4)));
            }
            memcpy(b[i].ql, ql, sizeof ql);
            memcpy(b[i].qh, qh, sizeof qh);
        }
    }
}

static void g8k6_unturn(const struct sp_block_q6_k *g, struct sp_block_q6_k *out) {
    *out = *g;
    memset(out->ql, 0, sizeof out->ql);
    memset(out->qh, 0, sizeof out->qh);
    for (int e = 0; e < SP_QK_K; e++) {
        int j, k, bb;
        g8k6_pos(e, &j, &k, &bb);
        const int u = ((g->ql[32 * (j / 2) + 4 * k + bb] >> (4 * (j % 2))) & 0x0f) |
                      ((g->qh[32 * (j / 4) + 4 * k + bb] >> (2 * (j % 4))) & 3) << 4;
        const int h = e / 128, q = (e % 128) / 32, l = e % 32;
        out->ql[64 * h + 32 * (q & 1) + l] |= (uint8_t)((u & 0x0f) << (q < 2 ? 0 : 4));
        out->qh[32 * h + l] |= (uint8_t)((u >> 4) << (2 * q));
    }
}

void sp_q6_k_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q6_k *g = src;
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        struct sp_block_q6_k b;
        g8k6_unturn(&g[i], &b);
        sp_q6_k_to_float_ref(&b, dst, SP_QK_K);
    }
}

void sp_vec_dot_q6_k_g8_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_K == 0);
    const struct sp_block_q6_k *g = w;
    const struct sp_block_q8_k *y = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        struct sp_block_q6_k b;
        float t;
        g8k6_unturn(&g[i], &b);
        sp_vec_dot_q6_k_q8_k_ref(SP_QK_K, &t, &b, &y[i]);
        sum += t;
    }
    *s = sum;
}
