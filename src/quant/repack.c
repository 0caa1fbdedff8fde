/*
 * repack.c -- Q4_0_g8 (quant.h), a resident weight layout made from Q4_0 by
 * the pager at load time or stored by `sparrow convert`, its inverse (the
 * fallback where the kernels lack the layout), and its reference
 * kernels (the specification the SIMD ones in x86/ are tested against).
 * Values and float order are Q4_0's (ref.c): a row gives the same bits in
 * either layout.
 */
#include "quant.h"
#include "ref.h"

#include "core/core.h"
#include "types.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define G8_BLOCKS (SP_QK_G8 / SP_QK4_0)
#define G8_BYTES (G8_BLOCKS * sizeof(struct sp_block_q4_0))
static_assert(G8_BYTES == 144, "a group is 8 Q4_0 blocks");

/* Offset in a group of byte j (0..15) of block k's qs: vector j / 4,
 * dword k, byte j % 4. */
static inline size_t g8_qs(int k, int j) {
    return 2 * G8_BLOCKS + 32 * (size_t)(j / 4) + 4 * (size_t)k + (size_t)(j % 4);
}

static inline float g8_d(const uint8_t *g, int k) {
    uint16_t h;
    memcpy(&h, g + 2 * k, 2);
    return sp_fp16_to_fp32(h);
}

/* Rows of Q4_0 regrouped in place: into groups of 8 blocks (pack), or back. */
static void g8_regroup(bool pack, void *rows, int64_t n_rows, int64_t n, size_t stride) {
    assert(n % SP_QK_G8 == 0);
    const size_t bb = sizeof(struct sp_block_q4_0), d = offsetof(struct sp_block_q4_0, d),
                 qs = offsetof(struct sp_block_q4_0, qs);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *g = (uint8_t *)rows + (size_t)r * stride;
        for (int64_t i = 0; i < n / SP_QK_G8; i++, g += G8_BYTES) {
            uint8_t src[G8_BYTES];
            memcpy(src, g, sizeof src);
            for (int k = 0; k < G8_BLOCKS; k++) {
                const size_t fd = k * bb + d, gd = 2 * (size_t)k; /* the scale in the file block, in the group */
                memcpy(g + (pack ? gd : fd), src + (pack ? fd : gd), 2);
                for (int j = 0; j < SP_QK4_0 / 2; j += 4) {
                    const size_t fq = k * bb + qs + (size_t)j, gq = g8_qs(k, j);
                    memcpy(g + (pack ? gq : fq), src + (pack ? fq : gq), 4);
                }
            }
        }
    }
}

void sp_q4_0_g8_repack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    g8_regroup(true, rows, n_rows, n, stride);
}

/* The inverse of sp_q4_0_g8_repack: a permutation of bytes, so exact. */
void sp_q4_0_g8_unrepack(void *rows, int64_t n_rows, int64_t n, size_t stride) {
    g8_regroup(false, rows, n_rows, n, stride);
}

void sp_q4_0_g8_to_float_ref(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % SP_QK_G8 == 0);
    const uint8_t *g = src;
    for (int64_t i = 0; i < n / SP_QK_G8; i++, g += G8_BYTES) {
        for (int k = 0; k < G8_BLOCKS; k++, dst += SP_QK4_0) {
            const float d = g8_d(g, k);
            for (int j = 0; j < SP_QK4_0 / 2; j++) {
                dst[j] = ((g[g8_qs(k, j)] & 0x0f) - 8) * d;
                dst[j + SP_QK4_0 / 2] = ((g[g8_qs(k, j)] >> 4) - 8) * d;
            }
        }
    }
}

void sp_vec_dot_q4_0_g8_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    assert(n % SP_QK_G8 == 0);
    const uint8_t *g = w;
    const struct sp_block_q8_0 *b = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_G8; i++, g += G8_BYTES) {
        for (int k = 0; k < G8_BLOCKS; k++, b++) {
            int32_t isum = 0;
            for (int j = 0; j < SP_QK4_0 / 2; j++) {
                isum += ((g[g8_qs(k, j)] & 0x0f) - 8) * b->qs[j];
                isum += ((g[g8_qs(k, j)] >> 4) - 8) * b->qs[j + SP_QK4_0 / 2];
            }
            sum += (g8_d(g, k) * sp_fp16_to_fp32(b->d)) * (float)isum;
        }
    }
    *s = sum;
}
