/*
 * kv_tq.h -- the inside of q4h's trellis code (kv_tq.c), for the ISA files
 * that vectorise its search and its decoding (x86/kv_tq_avx2.inc) and for
 * their tests.  Everything else uses kv.h's sp_kv_tq_encode / _decode.
 *
 * A code is the bit sizes of its 32 positions and, per position, the table
 * of levels lev[j][prev << bits[j] | code] (prev = the previous position's
 * code, 0 for position 0).  The encoder (kv_tq.c) tries a few scales and, for
 * each, runs the search below; the search is the only dispatched part, so a
 * variant that returns the reference's error and codes bit for bit gives
 * the reference's bytes.
 */
#ifndef SP_QUANT_KV_TQ_H
#define SP_QUANT_KV_TQ_H

#include <stdint.h>

#define SP_KV_TQ_N 32          /* values per block */
#define SP_KV_TQ_SCALE_BITS 10 /* the scale's bits, first in the block */
#define SP_KV_TQ_MAXC 32       /* codes per position at most (5 bits) */

struct sp_kv_tq_code {
    int32_t bytes;                 /* bytes per block */
    uint8_t bits[SP_KV_TQ_N];      /* code bits of position j (3..5) */
    const float *lev[SP_KV_TQ_N];  /* levels of position j: lev[j][prev << bits[j] | code] */
    const float *base;             /* every table of both codes, one array: */
    uint16_t off[SP_KV_TQ_N];      /* lev[j] = base + off[j] */
};

/* The key code (value = 0) or the value code (value = 1). */
const struct sp_kv_tq_code *sp_kv_tq_code_get(int value);

/* The scale a block's first SP_KV_TQ_SCALE_BITS bits stand for (kv_tq.c). */
float sp_kv_tq_scale(uint32_t s);

/* The Viterbi search: the codes of the least squared error
 * sum_j (x[j] - d * lev[j][code[j-1] << bits[j] | code[j]])^2 at scale d,
 * into code (SP_KV_TQ_N entries; NULL: the error alone is wanted); returns
 * that error.  Ties go to the lowest previous code, then the lowest final
 * code; each term is computed as the reference does (d * level, then the
 * difference, its square, the sum: no FMA), so every variant gives the
 * reference's error and codes bit for bit, infinities and NaNs included. */
typedef float (*sp_kv_tq_search_fn)(const struct sp_kv_tq_code *q, const float *x, float d, uint8_t *code);
float sp_kv_tq_search_ref(const struct sp_kv_tq_code *q, const float *x, float d, uint8_t *code);

/* Decode n consecutive blocks of code q (a row's blocks) into y (32 * n
 * floats): the same floats as sp_kv_tq_decode block by block. */
typedef void (*sp_kv_tq_decode_fn)(const struct sp_kv_tq_code *q, const uint8_t *src, float *y, int32_t n);
void sp_kv_tq_decode_ref(const struct sp_kv_tq_code *q, const uint8_t *src, float *y, int32_t n);

/* sp_kv_tq_encode with a given search (tests: the reference against a
 * variant, byte for byte). */
void sp_kv_tq_encode_with(sp_kv_tq_search_fn search, int value, const float *x, uint8_t *dst);

#endif /* SP_QUANT_KV_TQ_H */
