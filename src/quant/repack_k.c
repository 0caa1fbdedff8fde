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

static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void st64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
}

#define NIB 0x0f0f0f0f0f0f0f0full

/* Eight bytes at a time: the pager repacks gigabytes at load. */
void sp_q4_k_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    assert(n % SP_QK_K == 0);
    for (int64_t r = 0; r < n_rows; r++) {
        struct sp_block_q4_k *b = (struct sp_block_q4_k *)((uint8_t *)rows + (size_t)r * stride);
        for (int64_t i = 0; i < n / SP_QK_K; i++) {
            uint8_t s[8][16]; /* sub-block k: byte j = element j | element 16 + j << 4 */
            for (int k = 0; k < 8; k++) {
                const uint8_t *q = b[i].qs + 32 * (k / 2);
                const int sh = 4 * (k % 2);
                for (int j = 0; j < 16; j += 8)
                    st64(s[k] + j, ((ld64(q + j) >> sh) & NIB) | ((ld64(q + 16 + j) >> sh) & NIB) << 4);
            }
            for (int k = 0; k < 8; k++)
                for (int m = 0; m < 4; m++) memcpy(b[i].qs + g8k_byte(k, 4 * m), s[k] + 4 * m, 4);
        }
    }
}

/* Super-block g of Q4_K_g8 back in Q4_K's layout. */
static void g8k_unturn(const void *gv, void *outv) {
    const struct sp_block_q4_k *g = gv;
    struct sp_block_q4_k *out = outv;
    *out = *g;
    memset(out->qs, 0, sizeof out->qs);
    for (int k = 0; k < 8; k++) {
        for (int e = 0; e < 32; e++) {
            const int u = (g->qs[g8k_byte(k, e)] >> (4 * (e / 16))) & 0x0f;
            out->qs[32 * (k / 2) + e] |= (uint8_t)(u << (4 * (k % 2)));
        }
    }
}

/* A turned layout's reference: each super-block turned back (unturn, into
 * a block of bb bytes) and handed to the file type's reference.  vec_dot
 * keeps the file type's order: sum = sum + (term of super-block i), the
 * term being what its vec_dot of that one super-block returns. */
typedef void (*unturn_fn)(const void *g, void *out);

static void turned_to_float(unturn_fn unturn, size_t bb, sp_to_float_fn to_float, const void *src, float *dst,
                            int64_t n) {
    assert(n % SP_QK_K == 0 && bb <= 256);
    _Alignas(16) uint8_t b[256];
    for (int64_t i = 0; i < n / SP_QK_K; i++, dst += SP_QK_K) {
        unturn((const uint8_t *)src + (size_t)i * bb, b);
        to_float(b, dst, SP_QK_K);
    }
}

static void turned_vec_dot(unturn_fn unturn, size_t bb, sp_vec_dot_fn dot, int64_t n, float *s, const void *w,
                           const void *x) {
    assert(n % SP_QK_K == 0 && bb <= 256);
    const struct sp_block_q8_k *y = x;
    _Alignas(16) uint8_t b[256];
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_K; i++) {
        float t;
        unturn((const uint8_t *)w + (size_t)i * bb, b);
        dot(SP_QK_K, &t, b, &y[i]);
        sum += t;
    }
    *s = sum;
}

void sp_q4_k_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    turned_to_float(g8k_unturn, sizeof(struct sp_block_q4_k), sp_q4_k_to_float_ref, src, dst, n);
}

void sp_vec_dot_q4_k_g8_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    turned_vec_dot(g8k_unturn, sizeof(struct sp_block_q4_k), sp_vec_dot_q4_k_q8_k_ref, n, s, w, x);
}

/* ---- Q6_K_g8 ---------------------------------------------------------------- */

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
            /* q + 32 (0..63) of every element in order, 8 at a time (ref.c's q6_k_unpack) */
            uint8_t u[SP_QK_K], v[8][32];
            for (int h = 0; h < 2; h++) {
                for (int k = 0; k < 4; k++) {
                    const uint8_t *ql = b[i].ql + 64 * h + 32 * (k & 1), *qh = b[i].qh + 32 * h;
                    for (int l = 0; l < 32; l += 8) {
                        const uint64_t lo = (ld64(ql + l) >> (k < 2 ? 0 : 4)) & NIB;
                        const uint64_t hi = (ld64(qh + l) >> (2 * k)) & 0x0303030303030303ull;
                        st64(u + 128 * h + 32 * k + l, lo | hi << 4);
                    }
                }
            }
            /* vector j, dword k: elements 2j, 2j+1 of sub-blocks 2k and 2k+1 */
            for (int j = 0; j < 8; j++) {
                for (int k = 0; k < 8; k++) {
                    memcpy(v[j] + 4 * k, u + 32 * k + 2 * j, 2);
                    memcpy(v[j] + 4 * k + 2, u + 32 * k + 16 + 2 * j, 2);
                }
            }
            for (int l = 0; l < 32; l += 8) {
                for (int c = 0; c < 4; c++)
                    st64(b[i].ql + 32 * c + l, (ld64(v[2 * c] + l) & NIB) | (ld64(v[2 * c + 1] + l) & NIB) << 4);
                for (int h = 0; h < 2; h++) {
                    uint64_t w = 0;
                    for (int f = 0; f < 4; f++) w |= ((ld64(v[4 * h + f] + l) >> 4) & 0x0303030303030303ull) << (2 * f);
                    st64(b[i].qh + 32 * h + l, w);
                }
            }
        }
    }
}

static void g8k6_unturn(const void *gv, void *outv) {
    const struct sp_block_q6_k *g = gv;
    struct sp_block_q6_k *out = outv;
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
    turned_to_float(g8k6_unturn, sizeof(struct sp_block_q6_k), sp_q6_k_to_float_ref, src, dst, n);
}

void sp_vec_dot_q6_k_g8_q8_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    turned_vec_dot(g8k6_unturn, sizeof(struct sp_block_q6_k), sp_vec_dot_q6_k_q8_k_ref, n, s, w, x);
}
