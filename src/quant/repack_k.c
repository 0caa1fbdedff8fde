/*
 * repack_k.c -- Q4_K_g8 (quant.h): Q4_K with each super-block's quant
 * bytes turned for the decode kernels, made by the pager from Q4_K at load
 * time.  The reference kernels turn a super-block back and run Q4_K's
 * reference (ref.c) on it, so both layouts give the same bits by
 * construction.
 */
#include "quant.h"
#include "ref.h"

#include "core/core.h"
#include "types.h"

#include <assert.h>
#include <string.h>

static_assert(sizeof(struct sp_block_q4_k) == 144, "Q4_K super-block");

/* Element e (0..31) of sub-block k (0..7) in the turned quant bytes: byte
 * 32 * ((e % 16) / 4) + 4k + e % 4, low nibble for e < 16, high above. */
static inline int g8k_byte(int k, int e) {
    return 32 * ((e % 16) / 4) + 4 * k + e % 4;
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

/* The inverse of sp_q4_k_g8_repack, in place: a permutation of nibbles. */
void sp_q4_k_g8_unrepack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    assert(n % SP_QK_K == 0);
    for (int64_t r = 0; r < n_rows; r++) {
        struct sp_block_q4_k *b = (struct sp_block_q4_k *)((uint8_t *)rows + (size_t)r * stride);
        for (int64_t i = 0; i < n / SP_QK_K; i++) {
            struct sp_block_q4_k t;
            g8k_unturn(&b[i], &t);
            b[i] = t;
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
