/*
 * kv_tq.c -- q4h's row codes (kv.h): each rotated block of 32 values is a
 * path through a trellis whose state is the previous code.
 *
 * A block is a little-endian bit string: a 10-bit scale, then the codes of
 * the 32 positions, code j in bits[j] bits.  Value j is
 *     d * level_j[prev][code_j]     (prev = code_{j-1}; 0 for j = 0)
 * with level_j one of a few fixed tables (kv_tq_tables.inc), chosen by the
 * code sizes of positions j - 1 and j.  Because the levels a position offers
 * depend on the previous code, a block's 32 choices are made together (the
 * Viterbi search below, for the least squared error at a given scale), and
 * the offered levels of consecutive positions interleave: the code is a
 * trellis-coded quantizer, whose error on Gaussian blocks is about that of
 * a scalar quantizer with 0.2 - 0.3 more bits per value.  Decoding is a
 * table lookup per value, independent of the other values' decoding.
 *
 * Keys take 4.44 code bits per value (14 positions of 5 bits, 18 of 4),
 * values 3.94 (30 of 4, 2 of 3): with the scales, 19 and 17 bytes per 32,
 * 4.75 and 4.25 bits per value, 4.5 for the pair -- q4_0's size.  Keys get
 * the larger share because a key's error reaches every score it enters,
 * a value's is averaged over the attended positions (on the tiny-qwen
 * models keys' errors cost about twice the KL of values' at equal bits).
 *
 * The scale: bit 9 its sign, bits 0..8 m, |d| = 2^((m - 369) / 16) for m >=
 * 1 (2^-23 .. 2^8.875, steps of 4.4%), m = 0 gives d = 0.  The sign picks
 * which end of the (slightly asymmetric) tables gets the block's largest
 * value.  The tables were fitted offline to Gaussian blocks (what rotated
 * rows look like) by alternating the Viterbi search and least-squares
 * levels (scripts/kv_tq_train.c).
 */
#include "kv.h"
#include "kv_tq.h"

#include <math.h>
#include <string.h>

#include "kv_tq_tables.inc"

#define TQ_N SP_KV_TQ_N
#define TQ_SCALE_BITS SP_KV_TQ_SCALE_BITS
#define TQ_SCALE_BIAS 369
#define TQ_MAXC SP_KV_TQ_MAXC

/* The positions' code sizes and tables of the two codes. */
static const struct sp_kv_tq_code tq_codes[2] = {
    {19,
     {5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 4, 4, 4, 4},
     {tq_k_05, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54,
      tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_45, tq_k_54,
      tq_k_45, tq_k_54, tq_k_45, tq_k_54, tq_k_44, tq_k_44, tq_k_44, tq_k_44},
     tq_levels,
     {TQ_K_05_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF,
      TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF,
      TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF,
      TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_45_OFF, TQ_K_54_OFF, TQ_K_44_OFF, TQ_K_44_OFF, TQ_K_44_OFF, TQ_K_44_OFF}},
    {17,
     {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3},
     {tq_v_04, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44,
      tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44,
      tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_44, tq_v_43, tq_v_33},
     tq_levels,
     {TQ_V_04_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF,
      TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF,
      TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF,
      TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_44_OFF, TQ_V_43_OFF, TQ_V_33_OFF}}
};

size_t sp_kv_tq_block_bytes(int value) {
    return (size_t)tq_codes[value ? 1 : 0].bytes;
}

const struct sp_kv_tq_code *sp_kv_tq_code_get(int value) {
    return &tq_codes[value ? 1 : 0];
}

/* 2^(k / 16), k = 0..15, as float bits (the mantissa of the scale). */
static const uint32_t tq_frac16[16] = {0x3f800000u, 0x3f85aac3u, 0x3f8b95c2u, 0x3f91c3d3u, 0x3f9837f0u, 0x3f9ef532u,
                                       0x3fa5fed7u, 0x3fad583fu, 0x3fb504f3u, 0x3fbd08a4u, 0x3fc5672au, 0x3fce248cu,
                                       0x3fd744fdu, 0x3fe0ccdfu, 0x3feac0c7u, 0x3ff5257du};

float sp_kv_tq_scale(uint32_t s) {
    const uint32_t m = s & 511u;
    if (m == 0) return 0.0f;
    /* (m - 369) / 16 = (m - 1) / 16 - 23: exponent and sixteenths */
    const uint32_t e = (m - 1u) >> 4, f = (m - 1u) & 15u;
    const uint32_t bits = (tq_frac16[f] - (23u << 23) + (e << 23)) | (s >> 9 & 1u) << 31;
    float d;
    memcpy(&d, &bits, 4);
    return d;
}

/* The scale field nearest d above (up) or below it, in magnitude. */
static uint32_t tq_scale_code(float d, int up) {
    const float a = fabsf(d);
    if (!(a > 0.0f)) return 0;
    float k = floorf(log2f(a) * 16.0f) + (float)TQ_SCALE_BIAS + (up ? 1.0f : 0.0f);
    k = k < 1.0f ? 1.0f : k > 511.0f ? 511.0f : k;
    return (uint32_t)k | (d < 0.0f ? 512u : 0u);
}

static uint32_t get_bits(const uint8_t *b, uint32_t off, uint32_t n) {
    const uint32_t i = off >> 3, sh = off & 7u;
    uint32_t v = b[i];
    if (sh + n > 8) v |= (uint32_t)b[i + 1] << 8;
    return v >> sh & ((1u << n) - 1u);
}

static void put_bits(uint8_t *b, uint32_t off, uint32_t n, uint32_t v) {
    for (uint32_t k = 0; k < n; k++, off++) {
        if (v >> k & 1u) b[off >> 3] |= (uint8_t)(1u << (off & 7u));
    }
}

void sp_kv_tq_decode_ref(const struct sp_kv_tq_code *q, const uint8_t *src, float *y, int32_t n) {
    for (int32_t b = 0; b < n; b++, src += q->bytes, y += TQ_N) {
        const float d = sp_kv_tq_scale(get_bits(src, 0, 8) | get_bits(src, 8, 2) << 8);
        uint32_t off = TQ_SCALE_BITS, prev = 0;
        for (int j = 0; j < TQ_N; j++) {
            const uint32_t nb = q->bits[j], c = get_bits(src, off, nb);
            y[j] = d * q->lev[j][prev << nb | c];
            off += nb;
            prev = c;
        }
    }
}

void sp_kv_tq_decode(int value, const uint8_t *src, float *y) {
    sp_kv_tq_decode_ref(&tq_codes[value ? 1 : 0], src, y, 1);
}

/* The codes of the least squared error at scale d (a Viterbi search over
 * the trellis); returns that error (kv_tq.h).  Each term is its own
 * statements (d * level, difference, square, sum), so that no compiler
 * contracts them into an FMA the vector variants do not use. */
float sp_kv_tq_search_ref(const struct sp_kv_tq_code *q, const float *x, float d, uint8_t *code) {
    float cost[TQ_MAXC], nc[TQ_MAXC];
    uint8_t from[TQ_N][TQ_MAXC];
    const uint32_t n0 = 1u << q->bits[0];
    for (uint32_t c = 0; c < n0; c++) {
        const float t = d * q->lev[0][c];
        const float r = x[0] - t;
        cost[c] = r * r;
    }
    for (int j = 1; j < TQ_N; j++) {
        const uint32_t np = 1u << q->bits[j - 1], nb = q->bits[j], n = 1u << nb;
        const float *lev = q->lev[j];
        for (uint32_t c = 0; c < n; c++) {
            float best = INFINITY;
            uint32_t bs = 0;
            for (uint32_t s = 0; s < np; s++) {
                const float t = d * lev[s << nb | c];
                const float r = x[j] - t;
                const float r2 = r * r;
                const float v = cost[s] + r2;
                if (v < best) {
                    best = v;
                    bs = s;
                }
            }
            nc[c] = best;
            from[j][c] = (uint8_t)bs;
        }
        memcpy(cost, nc, n * sizeof(float));
    }
    const uint32_t n = 1u << q->bits[TQ_N - 1];
    uint32_t bc = 0;
    for (uint32_t c = 1; c < n; c++)
        if (cost[c] < cost[bc]) bc = c;
    const float e = cost[bc];
    if (!code) return e;
    for (int j = TQ_N - 1; j >= 0; j--) {
        code[j] = (uint8_t)bc;
        bc = j ? from[j][bc] : 0;
    }
    return e;
}

/* The scale: the encoder searches (error only) a window of consecutive
 * scale codes around each of two starts, the code of the block's largest
 * value mapped to the lowest and to the highest level of position 0 (the
 * two signs of d), and stores the codes of the best one found.  The
 * windows (code steps from a start, per code and start) cover where the
 * best scale of Gaussian blocks lies.  Before 2026-12-02 the encoder ran
 * 44 searches with codes (14 starts, each searched and least-squares
 * refitted twice, the best scale rounded both ways); these 23 (keys) and
 * 21 (values) searches, all but one without codes, find a scale code at
 * least as good on average: relative squared error on Gaussian blocks
 * 0.002593 / 0.005068 against 0.002602 / 0.005080, in half the searches
 * (and error-only searches are the cheaper ones). */
static const int8_t tq_window[2][2][2] = {
    {{-2, 7}, {-5, 6}}, /* keys: from xm / lowest level, from xm / highest */
    {{-4, 7}, {-6, 1}}, /* values */
};

void sp_kv_tq_encode_with(sp_kv_tq_search_fn search, int value, const float *x, uint8_t *dst) {
    const struct sp_kv_tq_code *q = &tq_codes[value ? 1 : 0];
    memset(dst, 0, (size_t)q->bytes);
    float amax = 0.0f, xm = 0.0f;
    for (int j = 0; j < TQ_N; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            xm = x[j];
        }
    }
    uint8_t code[TQ_N];
    memset(code, 0, sizeof code);
    uint32_t scode = 0;
    if (amax > 0.0f && isfinite(amax)) {
        const uint32_t n0 = 1u << q->bits[0];
        float lo = q->lev[0][0], hi = q->lev[0][0];
        for (uint32_t c = 1; c < n0; c++) {
            lo = fminf(lo, q->lev[0][c]);
            hi = fmaxf(hi, q->lev[0][c]);
        }
        float best = INFINITY;
        for (int end = 0; end < 2; end++) {
            const uint32_t c0 = tq_scale_code(xm / (end ? hi : lo), 0);
            const int32_t m0 = (int32_t)(c0 & 511u);
            for (int32_t o = tq_window[value ? 1 : 0][end][0]; o <= tq_window[value ? 1 : 0][end][1]; o++) {
                const int32_t m = m0 + o;
                if (m < 1 || m > 511) continue;
                const uint32_t sc = (uint32_t)m | (c0 & 512u);
                if (!scode) scode = sc; /* something, should every error be NaN */
                const float e = search(q, x, sp_kv_tq_scale(sc), NULL);
                if (e < best) {
                    best = e;
                    scode = sc;
                }
            }
        }
        if (scode) search(q, x, sp_kv_tq_scale(scode), code);
    }
    put_bits(dst, 0, TQ_SCALE_BITS, scode);
    uint32_t off = TQ_SCALE_BITS;
    for (int j = 0; j < TQ_N; j++) {
        put_bits(dst, off, q->bits[j], code[j]);
        off += q->bits[j];
    }
}

void sp_kv_tq_encode(int value, const float *x, uint8_t *dst) {
    sp_kv_tq_encode_with(sp_attn_kernels_get()->tq_search, value, x, dst);
}
