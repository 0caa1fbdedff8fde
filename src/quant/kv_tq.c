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

/* The least-squares scale for fixed codes (0 if every level is 0). */
static float tq_refit(const struct sp_kv_tq_code *q, const float *x, const uint8_t *code) {
    float a = 0.0f, b = 0.0f;
    for (int j = 0; j < TQ_N; j++) {
        const float l = q->lev[j][(j ? (uint32_t)code[j - 1] : 0u) << q->bits[j] | code[j]];
        a += x[j] * l;
        b += l * l;
    }
    return b > 0.0f ? a / b : 0.0f;
}

/* Scale candidates: the block's largest value mapped to the lowest and the
 * highest level of position 0, times 1 + (k - 3) / 14 for k = 0..6, each
 * searched and refitted twice; the best scale is then rounded to the two
 * neighbouring scale codes, and the better of the two is stored.
 *
 * A chain of search and refit is a function of its scale alone, so chains
 * that meet (two starts refitted to the same float, common: they end on
 * the same codes) would repeat each other's searches from there on, with
 * the same errors, which change nothing (only a strictly smaller error
 * does).  The encoder remembers each scale it searched with how many
 * searches its chain ran from it, and ends a chain that reaches one it has
 * run at least as far: the same bytes as running every chain out. */
#define TQ_CANDIDATES 7
#define TQ_CHAIN 3 /* searches per chain */

struct tq_seen {
    uint32_t n;
    uint32_t d[2 * TQ_CANDIDATES * TQ_CHAIN]; /* a scale's bits */
    int8_t left[2 * TQ_CANDIDATES * TQ_CHAIN]; /* searches its chain ran from it, its own included */
};

/* Whether a chain with `left` searches to go from d repeats one already run;
 * records d otherwise. */
static bool tq_seen(struct tq_seen *m, float d, int left) {
    uint32_t u;
    memcpy(&u, &d, 4);
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->d[i] != u) continue;
        if (m->left[i] >= left) return true;
        m->left[i] = (int8_t)left;
        return false;
    }
    if (m->n < SP_ARRAY_LEN(m->d)) {
        m->d[m->n] = u;
        m->left[m->n++] = (int8_t)left;
    }
    return false;
}

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
    uint8_t code[TQ_N], tmp[TQ_N];
    memset(code, 0, sizeof code);
    uint32_t scode = 0;
    if (amax > 0.0f && isfinite(amax)) {
        const uint32_t n0 = 1u << q->bits[0];
        float lo = q->lev[0][0], hi = q->lev[0][0];
        for (uint32_t c = 1; c < n0; c++) {
            lo = fminf(lo, q->lev[0][c]);
            hi = fmaxf(hi, q->lev[0][c]);
        }
        float best = INFINITY, bd = xm / hi;
        struct tq_seen seen;
        seen.n = 0;
        for (int end = 0; end < 2; end++) {
            for (int k = 0; k < TQ_CANDIDATES; k++) {
                float d = xm / ((end ? hi : lo) * (1.0f + (float)(k - TQ_CANDIDATES / 2) / (2.0f * TQ_CANDIDATES)));
                for (int it = 0; it < TQ_CHAIN; it++) {
                    if (tq_seen(&seen, d, TQ_CHAIN - it)) break;
                    /* the last one's codes are not refitted */
                    const float e = search(q, x, d, it < TQ_CHAIN - 1 ? tmp : NULL);
                    if (e < best) {
                        best = e;
                        bd = d;
                    }
                    if (it == TQ_CHAIN - 1) break;
                    const float dn = tq_refit(q, x, tmp);
                    if (!(dn != 0.0f) || !isfinite(dn)) break;
                    d = dn;
                }
            }
        }
        best = INFINITY;
        for (int up = 0; up < 2; up++) {
            const uint32_t sc = tq_scale_code(bd, up);
            const float e = search(q, x, sp_kv_tq_scale(sc), tmp);
            if (e < best) {
                best = e;
                scode = sc;
                memcpy(code, tmp, sizeof tmp);
            }
        }
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
