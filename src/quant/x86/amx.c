/*
 * amx.c -- AMX int8 (TMUL) kernels for the batched product of prefill
 * (sp_gemm_fn in quant.h), for weights Q4_0, Q5_0, Q8_0 (activations Q8_0),
 * Q4_1, Q5_1 (Q8_1) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (Q8_K).  Not for
 * decode: fewer than 16 tokens, and tails, go to the table entry this file
 * replaced.
 *
 * Numerics follow ref.c: each step (32 elements, 16 for the K-quants with
 * 16-element scales) is one exact int32 dot from TDPBSSD, then scaled in
 * float by (weight scale) x (activation scale) and summed; mins use Q8_K's
 * bsums or Q8_1's block sums.  Results equal vec_dot up to float rounding
 * and summation order.
 *
 * Compiled twice: as itself with -mamx-* (the real kernels, installed by
 * sp_quant_register_amx), and from amx_emu.c with SP_AMX_EMU, where the tile
 * instructions are emulated in plain C so tests check the same packing and
 * scaling code on machines without AMX.  Hooks for tests: x86/amx.h.
 */
#include "quant/x86/amx.h"

#include "core/core.h"
#include "quant/isa.h"
#include "quant/types.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#ifndef SP_AMX_EMU
#define SP_AMX_EMU 0
#endif

#if !SP_AMX_EMU
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---- tiles ----------------------------------------------------------------
 * One configuration per step size ks (32 or 16 elements):
 *   tmm0..3  C: 16 tokens x 16 weight rows int32; C[tt*2 + rt]
 *   tmm4,5   A: 16 tokens x ks int8, read straight from the activation rows
 *   tmm6,7   B: ks/4 rows x (16 weight rows x 4 int8), the VNNI layout the
 *            packer writes: B[k4][4*r + j] = w[r][4*k4 + j]
 * LDTILECFG is per thread; tls_ks remembers what this thread has loaded. */

struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static_assert(sizeof(struct tilecfg) == 64, "tile config is 64 bytes");

static _Thread_local int tls_ks;

static struct tilecfg make_cfg(int ks) {
    struct tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) c.rows[i] = 16, c.colsb[i] = 64;
    for (int i = 4; i < 6; i++) c.rows[i] = 16, c.colsb[i] = (uint16_t)ks;
    for (int i = 6; i < 8; i++) c.rows[i] = (uint8_t)(ks / 4), c.colsb[i] = 64;
    return c;
}

#if SP_AMX_EMU
/* Plain-C tiles with the instructions' semantics (Intel SDM): loads fill
 * rows x colsb and zero the rest, TDPBSSD checks the shapes it would #UD on
 * and wraps int32 sums. */
struct emu_tile {
    int rows, colsb;
    uint8_t d[16][64];
};
static _Thread_local struct emu_tile emu[8];

static void emu_cfg(const struct tilecfg *c) {
    /* what LDTILECFG would #GP on (palette 1: 8 tiles of <= 16 rows x 64 bytes) */
    SP_ASSERT(c->palette == 1 && c->start_row == 0);
    for (int i = 0; i < 14; i++) SP_ASSERT(c->reserved[i] == 0);
    for (int i = 0; i < 16; i++) {
        SP_ASSERT(i < 8 || (c->rows[i] == 0 && c->colsb[i] == 0));
        SP_ASSERT(c->rows[i] <= 16 && c->colsb[i] <= 64 && (c->rows[i] == 0) == (c->colsb[i] == 0));
    }
    for (int i = 0; i < 8; i++) {
        emu[i].rows = c->rows[i];
        emu[i].colsb = c->colsb[i];
        memset(emu[i].d, 0, sizeof emu[i].d);
    }
}

static void emu_load(int t, const void *base, int64_t stride) {
    struct emu_tile *e = &emu[t];
    SP_ASSERT(e->rows > 0 && e->colsb > 0);
    memset(e->d, 0, sizeof e->d);
    for (int r = 0; r < e->rows; r++) memcpy(e->d[r], (const uint8_t *)base + r * stride, (size_t)e->colsb);
}

static void emu_store(int t, void *base, int64_t stride) {
    const struct emu_tile *e = &emu[t];
    SP_ASSERT(e->rows > 0 && e->colsb > 0);
    for (int r = 0; r < e->rows; r++) memcpy((uint8_t *)base + r * stride, e->d[r], (size_t)e->colsb);
}

static void emu_zero(int t) { memset(emu[t].d, 0, sizeof emu[t].d); }

static void emu_dpbssd(int tc, int ta, int tb) {
    struct emu_tile *c = &emu[tc];
    const struct emu_tile *a = &emu[ta], *b = &emu[tb];
    SP_ASSERT(c->rows == a->rows && a->colsb == b->rows * 4 && c->colsb == b->colsb && c->colsb % 4 == 0);
    for (int m = 0; m < c->rows; m++) {
        for (int nn = 0; nn < c->colsb / 4; nn++) {
            uint32_t acc;
            memcpy(&acc, &c->d[m][4 * nn], 4);
            for (int k = 0; k < a->colsb / 4; k++) {
                for (int j = 0; j < 4; j++) {
                    acc += (uint32_t)((int32_t)(int8_t)a->d[m][4 * k + j] * (int8_t)b->d[k][4 * nn + j]);
                }
            }
            memcpy(&c->d[m][4 * nn], &acc, 4);
        }
    }
}

#define TILE_CFG(cfg) emu_cfg(cfg)
#define TILE_LOAD(t, base, stride) emu_load(t, base, (int64_t)(stride))
#define TILE_STORE(t, base, stride) emu_store(t, base, (int64_t)(stride))
#define TILE_ZERO(t) emu_zero(t)
#define TILE_DP(c, a, b) emu_dpbssd(c, a, b)
#else
/* Own asm rather than the compiler's intrinsics: GCC's _tile_loadd and
 * _tile_loadconfig do not tell the compiler they read memory, so stores into
 * the packed buffer could be moved past them. */
#define TILE_CFG(cfg) __asm__ volatile("ldtilecfg (%0)" ::"r"(cfg) : "memory")
#define TILE_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((int64_t)(stride)) : "memory")
#define TILE_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((int64_t)(stride)) : "memory")
#define TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_DP(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#endif

static void tiles_config(int ks) {
    if (tls_ks == ks) return;
    const struct tilecfg c = make_cfg(ks);
    TILE_CFG(&c);
    tls_ks = ks;
}

/* ---- 16-lane float vectors (GCC vector extensions: zmm in the real build,
 * pairs of ymm in the emulated one, so both run the same source) ---------- */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16f_u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i_u __attribute__((vector_size(64), aligned(4), may_alias));

#if SP_AMX_EMU
#define VFMA(a, b, c) ((a) * (b) + (c))
#else
#define VFMA(a, b, c) ((v16f)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#endif

/* Macros, not functions: 64-byte vectors never cross a call (no ABI question
 * in the AVX2-only emulated build). */
#define LDF(p) (*(const v16f_u *)(p))
#define STF(p, v) (*(v16f_u *)(p) = (v))
static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- per-type shape -------------------------------------------------------
 * A chunk is 256 elements (one K-quant super-block, eight 32-blocks); the
 * packer works on 32-element groups, a step is ks elements. */
#define CHUNK 256
#define MAX_STEPS 16
#define TAIL_MIN 4 /* token tails shorter than this go to the fallback; longer ones get an overlapping tile */

static inline int step_elems(int type) {
    return (type == SP_QTYPE_Q6_K || type == SP_QTYPE_Q3_K || type == SP_QTYPE_Q2_K) ? 16 : 32;
}
static inline bool act_q8k(int type) { return type >= SP_QTYPE_Q2_K; }
static inline bool act_q81(int type) { return type == SP_QTYPE_Q4_1 || type == SP_QTYPE_Q5_1; }
/* Bytes of one 32-element activation block (Q8_0 / Q8_1) and where its
 * quants start. */
static inline size_t ablock_bytes(int type) { return act_q81(type) ? 36 : 34; }
static inline size_t aqs_off(int type) { return act_q81(type) ? 4 : 2; }
/* Mins per chunk: 8 per 32 elements against bsum pairs, 16 per 16 against bsums. */
static inline int n_mins(int type) {
    return (type == SP_QTYPE_Q4_K || type == SP_QTYPE_Q5_K) ? 8 : type == SP_QTYPE_Q2_K ? 16 : 0;
}
static inline size_t wblock_bytes(int type) {
    switch (type) {
    case SP_QTYPE_Q4_0: return sizeof(struct sp_block_q4_0);
    case SP_QTYPE_Q4_1: return sizeof(struct sp_block_q4_1);
    case SP_QTYPE_Q5_0: return sizeof(struct sp_block_q5_0);
    case SP_QTYPE_Q5_1: return sizeof(struct sp_block_q5_1);
    case SP_QTYPE_Q8_0: return sizeof(struct sp_block_q8_0);
    case SP_QTYPE_Q2_K: return sizeof(struct sp_block_q2_k);
    case SP_QTYPE_Q3_K: return sizeof(struct sp_block_q3_k);
    case SP_QTYPE_Q4_K: return sizeof(struct sp_block_q4_k);
    case SP_QTYPE_Q5_K: return sizeof(struct sp_block_q5_k);
    default: return sizeof(struct sp_block_q6_k);
    }
}
/* Bytes of one row's chunk c: 8 blocks of 32, or one super-block. */
static inline size_t chunk_bytes(int type) { return act_q8k(type) ? wblock_bytes(type) : 8 * wblock_bytes(type); }

/* ---- weight unpacking -------------------------------------------------------
 * Group g (32 elements) of chunk c of one weight row as 32 int8 in element
 * order; layouts in types.h.  Q4_1/Q5_1/Q4_K/Q5_K/Q2_K values are unsigned
 * (their mins are applied separately), the rest are centred. */

static inline __m256i srl16(__m256i v, int s) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(s)); }

static inline __attribute__((always_inline)) __m256i unpack_group(const int type, const uint8_t *row, int64_t c,
                                                                  int g) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    switch (type) {
    case SP_QTYPE_Q8_0: return _mm256_loadu_si256((const __m256i *)(row + (size_t)(c * 8 + g) * 34 + 2));
    case SP_QTYPE_Q4_0:
    case SP_QTYPE_Q4_1:
    case SP_QTYPE_Q5_0:
    case SP_QTYPE_Q5_1: {
        const size_t bb = wblock_bytes(type);
        const uint8_t *b = row + (size_t)(c * 8 + g) * bb;
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + bb - 16)); /* qs is the block's tail */
        const __m128i m = _mm_set1_epi8(0x0f);
        const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
        if (type == SP_QTYPE_Q4_0) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        if (type == SP_QTYPE_Q4_1) return v;
        /* bit 4 of element j is bit j of qh: byte j tests bit j % 8 of qh byte j / 8 */
        uint32_t qh;
        memcpy(&qh, b + (type == SP_QTYPE_Q5_0 ? 2 : 4), 4);
        const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                             3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ull);
        const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)qh), sel);
        const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(16));
        if (type == SP_QTYPE_Q5_1) return _mm256_or_si256(v, h);
        return _mm256_sub_epi8(_mm256_or_si256(v, h), _mm256_set1_epi8(16));
    }
    case SP_QTYPE_Q4_K:
    case SP_QTYPE_Q5_K: {
        const uint8_t *sb = row + (size_t)c * wblock_bytes(type);
        const uint8_t *qs = sb + (type == SP_QTYPE_Q4_K ? 16 : 48);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g >> 1)));
        const __m256i lo = _mm256_and_si256((g & 1) ? srl16(v, 4) : v, m4);
        if (type == SP_QTYPE_Q4_K) return lo;
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(sb + 16));
        return _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(srl16(hb, g), m1), 4));
    }
    case SP_QTYPE_Q6_K: {
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q6_k);
        const int h = g >> 2, k = g & 3;
        const __m256i lb = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32 * (k & 1)));
        const __m256i lo = _mm256_and_si256(k < 2 ? lb : srl16(lb, 4), m4);
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(srl16(hb, 2 * k), m2), 4);
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    }
    case SP_QTYPE_Q3_K: {
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q3_k);
        const int h = g >> 2, j = g & 3;
        const __m256i lo = _mm256_and_si256(srl16(_mm256_loadu_si256((const __m256i *)(sb + 32 + 32 * h)), 2 * j), m2);
        const __m256i hm = _mm256_and_si256(srl16(_mm256_loadu_si256((const __m256i *)sb), g), m1);
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hm, 2)), _mm256_set1_epi8(4));
    }
    default: { /* Q2_K */
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q2_k);
        const int h = g >> 2, j = g & 3;
        return _mm256_and_si256(srl16(_mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * h)), 2 * j), m2);
    }
    }
}

/* 8x8 transpose of 32-bit lanes: v[r] holds dwords d0..d7 of row r; after,
 * v[k] holds dword k of rows 0..7. */
static inline void transpose8(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* One panel of up to 32 weight rows x one chunk, ready for tile loads. */
struct pack {
    _Alignas(64) int8_t b[2][8 * 512]; /* [row tile][group * 512 + k4 * 64 + 4 * row + j] (VNNI) */
    float dw[MAX_STEPS][32];           /* [step][row]: scale of the step's int32 dot (d, or d * sub-scale) */
    float mn[16][32];                  /* [min][row]: integer mins (n_mins(type) > 0); Q4_1/Q5_1: m per step */
    float dmin[32];                    /* [row]: super-block min scale */
};

/* 6-bit scale and min s of a Q4_K/Q5_K super-block (types.h). */
static inline void k4_scale_min(const uint8_t *q, int s, int *sc, int *m) {
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 0x0f) | (q[s - 4] >> 6) << 4;
        *m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
    }
}

static inline __attribute__((always_inline)) void unpack_scales(const int type, const uint8_t *row, int64_t c, int ng,
                                                                struct pack *pk, int ri) {
    switch (type) {
    case SP_QTYPE_Q4_0:
    case SP_QTYPE_Q5_0:
    case SP_QTYPE_Q8_0:
        for (int g = 0; g < ng; g++) pk->dw[g][ri] = f16(row + (size_t)(c * 8 + g) * wblock_bytes(type));
        break;
    case SP_QTYPE_Q4_1:
    case SP_QTYPE_Q5_1:
        for (int g = 0; g < ng; g++) {
            const uint8_t *b = row + (size_t)(c * 8 + g) * wblock_bytes(type);
            pk->dw[g][ri] = f16(b);
            pk->mn[g][ri] = f16(b + 2);
        }
        break;
    case SP_QTYPE_Q4_K:
    case SP_QTYPE_Q5_K: {
        const uint8_t *sb = row + (size_t)c * wblock_bytes(type);
        const float d = f16(sb);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(sb + 4, j, &sc, &m);
            pk->dw[j][ri] = d * (float)sc;
            pk->mn[j][ri] = (float)m;
        }
        pk->dmin[ri] = f16(sb + 2);
        break;
    }
    case SP_QTYPE_Q6_K: {
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q6_k);
        const float d = f16(sb + 208);
        for (int s = 0; s < 16; s++) pk->dw[s][ri] = d * (float)(int8_t)sb[192 + s];
        break;
    }
    case SP_QTYPE_Q3_K: {
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q3_k);
        const uint8_t *q = sb + 96;
        const float d = f16(sb + 108);
        for (int s = 0; s < 16; s++) {
            const int lo = s < 8 ? q[s] & 0x0f : q[s - 8] >> 4;
            const int hi = (q[8 + s % 4] >> (2 * (s / 4))) & 3;
            pk->dw[s][ri] = d * (float)((lo | hi << 4) - 32);
        }
        break;
    }
    default: { /* Q2_K */
        const uint8_t *sb = row + (size_t)c * sizeof(struct sp_block_q2_k);
        const float d = f16(sb + 80);
        for (int s = 0; s < 16; s++) {
            pk->dw[s][ri] = d * (float)(sb[s] & 0x0f);
            pk->mn[s][ri] = (float)(sb[s] >> 4);
        }
        pk->dmin[ri] = f16(sb + 82);
        break;
    }
    }
}

/* Pack chunk c (ng groups) of nrt row tiles starting at w; prefetch chunk
 * c + 1 of the same rows. */
static inline __attribute__((always_inline)) void pack_panel(const int type, struct pack *pk, const uint8_t *w,
                                                             size_t ws, int nrt, int64_t c, int ng, bool more) {
    const size_t cb = chunk_bytes(type);
    for (int rt = 0; rt < nrt; rt++) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *rows[8];
            for (int r = 0; r < 8; r++) rows[r] = w + (size_t)(rt * 16 + h * 8 + r) * ws;
            for (int g = 0; g < ng; g++) {
                __m256i v[8];
                for (int r = 0; r < 8; r++) v[r] = unpack_group(type, rows[r], c, g);
                transpose8(v);
                int8_t *dst = pk->b[rt] + g * 512 + h * 32;
                for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(dst + k * 64), v[k]);
            }
            for (int r = 0; r < 8; r++) {
                unpack_scales(type, rows[r], c, ng, pk, rt * 16 + h * 8 + r);
                if (more) {
                    const char *nx = (const char *)rows[r] + (size_t)(c + 1) * cb;
                    for (size_t o = 0; o < cb; o += 64) _mm_prefetch(nx + o, _MM_HINT_T0);
                }
            }
        }
    }
}

/* ---- activations ------------------------------------------------------------ */

/* Activation side of one chunk for up to two token tiles. */
struct acts {
    float dx[2][MAX_STEPS][16]; /* [tile][step][token]: Q8_0/Q8_1 d per step; Q8_K d in step 0 */
    float bs[2][16][16];        /* [tile][min][token]: bsums (pairs for Q4_K/Q5_K) as floats; Q8_1 s per step */
};

static inline __attribute__((always_inline)) void load_acts(const int type, struct acts *ac, const uint8_t *x,
                                                            size_t xs, const int64_t ts[2], int ntt, int64_t c,
                                                            int ng) {
    for (int tt = 0; tt < ntt; tt++) {
        const uint8_t *xt = x + (size_t)ts[tt] * xs;
        if (!act_q8k(type)) {
            for (int g = 0; g < ng; g++) {
                _Alignas(32) uint16_t h[2][16];
                const size_t bo = (size_t)(c * 8 + g) * ablock_bytes(type);
                for (int i = 0; i < 16; i++) memcpy(h[0] + i, xt + i * xs + bo, 2);
                _mm256_storeu_ps(ac->dx[tt][g], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)h[0])));
                _mm256_storeu_ps(ac->dx[tt][g] + 8, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h[0] + 8))));
                if (!act_q81(type)) continue;
                for (int i = 0; i < 16; i++) memcpy(h[1] + i, xt + i * xs + bo + 2, 2);
                _mm256_storeu_ps(ac->bs[tt][g], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)h[1])));
                _mm256_storeu_ps(ac->bs[tt][g] + 8, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h[1] + 8))));
            }
            continue;
        }
        for (int i = 0; i < 16; i++) {
            const uint8_t *p = xt + i * xs + (size_t)c * sizeof(struct sp_block_q8_k);
            memcpy(&ac->dx[tt][0][i], p, 4);
            int16_t bsum[16];
            memcpy(bsum, p + 4 + SP_QK_K, sizeof bsum);
            if (n_mins(type) == 8) {
                for (int j = 0; j < 8; j++) ac->bs[tt][j][i] = (float)(bsum[2 * j] + bsum[2 * j + 1]);
            } else if (n_mins(type) == 16) {
                for (int j = 0; j < 16; j++) ac->bs[tt][j][i] = (float)bsum[j];
            }
        }
    }
}

/* ---- folding int32 tiles into the float sums ------------------------------------
 * Sums of one tile: yb[i * ldy + 0..15] for its 16 tokens i. */

/* One row: y += (dw * d_x) * c, plus m_w * s_x for Q4_1/Q5_1 (mw != NULL). */
static inline __attribute__((always_inline)) void fold(float *yb, int64_t ldy, const int32_t (*c)[16],
                                                       const float *dw, const float *dx, const float *mw,
                                                       const float *sx) {
    const v16f dwv = LDF(dw), mwv = mw ? (v16f)LDF(mw) : (v16f){0};
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        float *yr = yb + i * ldy;
        const v16f cf = __builtin_convertvector(*(const v16i_u *)c[i], v16f);
        v16f sum = VFMA(cf, dwv * dx[i], LDF(yr));
        if (mw) sum = VFMA(mwv, (v16f){0} + sx[i], sum);
        STF(yr, sum);
    }
}

/* y -= dmin * d_x * sum_j mins_j * bsums_j (the products and their sum are
 * integers below 2^24, exact in float). */
static inline __attribute__((always_inline)) void fold_mins(float *yb, int64_t ldy, const struct pack *pk, int rt,
                                                            const float (*bs)[16], int nm, const float *dx) {
    const v16f dmin = LDF(pk->dmin + 16 * rt);
    for (int i = 0; i < 16; i++) {
        v16f m = LDF(pk->mn[0] + 16 * rt) * bs[0][i];
        for (int j = 1; j < nm; j++) m = VFMA(LDF(pk->mn[j] + 16 * rt), (v16f){0} + bs[j][i], m);
        float *yr = yb + i * ldy;
        STF(yr, VFMA(m, dmin * -dx[i], LDF(yr)));
    }
}

/* ---- the kernel ---------------------------------------------------------------
 * n_rows a multiple of 16, n_tok >= 16.  Loops: row panels of 32 (2 B
 * tiles); blocks of up to 8 token tiles (128 tokens); chunks of 256
 * elements (packed once, reused by every token tile of the block); pairs of
 * 16-token tiles; steps.  A token count that is not a multiple of 16 ends
 * with a tile overlapping the previous one (its first `lo` tokens are not
 * written back).  Sums go to acc, contiguous, and reach y once per panel and
 * block: y rows are ldy floats apart, and a power-of-two ldy (4096) would
 * put a tile's 16 rows in one L1 set. */
#define BLOCK_TILES 8

static inline __attribute__((always_inline)) void amx_body(const int type, int64_t n, const uint8_t *w, size_t ws,
                                                           int64_t n_rows, const uint8_t *x, size_t xs,
                                                           int64_t n_tok, float *y, int64_t ldy) {
    const int ks = step_elems(type), nm = n_mins(type);
    const size_t a_step = act_q8k(type) ? (size_t)ks : ablock_bytes(type);
    struct pack pk;
    struct acts ac;
    _Alignas(64) int32_t cb[4][16][16];
    _Alignas(64) float acc[BLOCK_TILES][16][32]; /* [tile][token][row] */
    const int64_t n_chunks = (n + CHUNK - 1) / CHUNK, n_tt = (n_tok + 15) / 16;

    for (int64_t r0 = 0; r0 < n_rows; r0 += 32) {
        const int nrt = n_rows - r0 >= 32 ? 2 : 1;
        for (int64_t b0 = 0; b0 < n_tt; b0 += BLOCK_TILES) {
            const int nbt = (int)SP_MIN(BLOCK_TILES, n_tt - b0);
            int64_t ts[BLOCK_TILES]; /* first token of each tile */
            int lo[BLOCK_TILES];     /* tokens of an overlapping last tile already done by the one before */
            for (int k = 0; k < nbt; k++) {
                ts[k] = (b0 + k) * 16, lo[k] = 0;
                if (ts[k] + 16 > n_tok) lo[k] = (int)(ts[k] + 16 - n_tok), ts[k] = n_tok - 16;
            }
            memset(acc, 0, sizeof acc);
            for (int64_t c = 0; c < n_chunks; c++) {
                const int ng = (int)SP_MIN(8, (n - c * CHUNK) / 32), n_steps = ng * 32 / ks;
                pack_panel(type, &pk, w + (size_t)r0 * ws, ws, nrt, c, ng, c + 1 < n_chunks);
                const size_t a_off = act_q8k(type) ? (size_t)c * sizeof(struct sp_block_q8_k) + 4
                                                   : (size_t)c * 8 * ablock_bytes(type) + aqs_off(type);
                for (int k = 0; k < nbt; k += 2) {
                    const int ntt = nbt - k >= 2 ? 2 : 1;
                    load_acts(type, &ac, x, xs, ts + k, ntt, c, ng);
                    const uint8_t *a0 = x + (size_t)ts[k] * xs + a_off;
                    const uint8_t *a1 = x + (size_t)ts[k + ntt - 1] * xs + a_off;
                    for (int s = 0; s < n_steps; s++) {
                        TILE_LOAD(4, a0 + s * a_step, xs);
                        TILE_LOAD(6, pk.b[0] + s * ks * 16, 64);
                        TILE_ZERO(0);
                        TILE_DP(0, 4, 6);
                        if (nrt == 2) {
                            TILE_LOAD(7, pk.b[1] + s * ks * 16, 64);
                            TILE_ZERO(1);
                            TILE_DP(1, 4, 7);
                        }
                        if (ntt == 2) {
                            TILE_LOAD(5, a1 + s * a_step, xs);
                            TILE_ZERO(2);
                            TILE_DP(2, 5, 6);
                            if (nrt == 2) {
                                TILE_ZERO(3);
                                TILE_DP(3, 5, 7);
                            }
                        }
                        TILE_STORE(0, cb[0], 64);
                        if (nrt == 2) TILE_STORE(1, cb[1], 64);
                        if (ntt == 2) {
                            TILE_STORE(2, cb[2], 64);
                            if (nrt == 2) TILE_STORE(3, cb[3], 64);
                        }
                        const int sx = act_q8k(type) ? 0 : s;
                        for (int tt = 0; tt < ntt; tt++) {
                            for (int rt = 0; rt < nrt; rt++) {
                                fold(acc[k + tt][0] + 16 * rt, 32, cb[2 * tt + rt], pk.dw[s] + 16 * rt,
                                     ac.dx[tt][sx], act_q81(type) ? pk.mn[s] + 16 * rt : NULL, ac.bs[tt][s]);
                            }
                        }
                    }
                    if (nm) {
                        for (int tt = 0; tt < ntt; tt++) {
                            for (int rt = 0; rt < nrt; rt++) {
                                fold_mins(acc[k + tt][0] + 16 * rt, 32, &pk, rt, ac.bs[tt], nm, ac.dx[tt][0]);
                            }
                        }
                    }
                }
            }
            for (int k = 0; k < nbt; k++) {
                for (int i = lo[k]; i < 16; i++) {
                    memcpy(y + (ts[k] + i) * ldy + r0, acc[k][i], (size_t)nrt * 16 * sizeof(float));
                }
            }
        }
    }
}

/* ---- fallback and entry points ------------------------------------------------ */

/* The table entries the kernels replaced (written once at registration). */
struct fallback {
    sp_gemm_fn gemm;
    sp_vec_dot_fn vec_dot;
};
static struct fallback fb[SP_QTYPE_COUNT];

static void run_fallback(uint32_t t, int64_t n, const void *w, size_t ws, int64_t n_rows, const void *x, size_t xs,
                         int64_t n_tok, float *y, int64_t ldy) {
    if (n_rows <= 0 || n_tok <= 0) return;
    if (fb[t].gemm) {
        fb[t].gemm(n, w, ws, n_rows, x, xs, n_tok, y, ldy);
    } else if (fb[t].vec_dot) {
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t i = 0; i < n_tok; i++) {
                fb[t].vec_dot(n, &y[i * ldy + r], (const uint8_t *)w + (size_t)r * ws,
                              (const uint8_t *)x + (size_t)i * xs);
            }
        }
    } else {
        sp_gemm_generic(t, n, w, ws, n_rows, x, xs, n_tok, y, ldy);
    }
}

static inline __attribute__((always_inline)) void amx_gemm(const int type, int64_t n, const void *w, size_t ws,
                                                           int64_t n_rows, const void *x, size_t xs, int64_t n_tok,
                                                           float *y, int64_t ldy) {
    const int64_t nr = n_rows & ~(int64_t)15;
    if (n_tok < 16 || nr == 0) {
        run_fallback((uint32_t)type, n, w, ws, n_rows, x, xs, n_tok, y, ldy);
        return;
    }
    const int64_t nt = n_tok % 16 != 0 && n_tok % 16 < TAIL_MIN ? n_tok - n_tok % 16 : n_tok;
    tiles_config(step_elems(type));
    amx_body(type, n, w, ws, nr, x, xs, nt, y, ldy);
    run_fallback((uint32_t)type, n, w, ws, nr, (const uint8_t *)x + (size_t)nt * xs, xs, n_tok - nt, y + nt * ldy,
                 ldy);
    run_fallback((uint32_t)type, n, (const uint8_t *)w + (size_t)nr * ws, ws, n_rows - nr, x, xs, n_tok, y + nr,
                 ldy);
}

#define AMX_KERNEL(name, type)                                                                                   \
    static void name(int64_t n, const void *restrict w, size_t ws, int64_t n_rows, const void *restrict x,      \
                     size_t xs, int64_t n_tok, float *restrict y, int64_t ldy) {                                 \
        amx_gemm(type, n, w, ws, n_rows, x, xs, n_tok, y, ldy);                                                 \
    }
AMX_KERNEL(gemm_q4_0, SP_QTYPE_Q4_0)
AMX_KERNEL(gemm_q4_1, SP_QTYPE_Q4_1)
AMX_KERNEL(gemm_q5_0, SP_QTYPE_Q5_0)
AMX_KERNEL(gemm_q5_1, SP_QTYPE_Q5_1)
AMX_KERNEL(gemm_q8_0, SP_QTYPE_Q8_0)
AMX_KERNEL(gemm_q2_k, SP_QTYPE_Q2_K)
AMX_KERNEL(gemm_q3_k, SP_QTYPE_Q3_K)
AMX_KERNEL(gemm_q4_k, SP_QTYPE_Q4_K)
AMX_KERNEL(gemm_q5_k, SP_QTYPE_Q5_K)
AMX_KERNEL(gemm_q6_k, SP_QTYPE_Q6_K)

static sp_gemm_fn kernel_of(uint32_t t) {
    switch (t) {
    case SP_QTYPE_Q4_0: return gemm_q4_0;
    case SP_QTYPE_Q4_1: return gemm_q4_1;
    case SP_QTYPE_Q5_0: return gemm_q5_0;
    case SP_QTYPE_Q5_1: return gemm_q5_1;
    case SP_QTYPE_Q8_0: return gemm_q8_0;
    case SP_QTYPE_Q2_K: return gemm_q2_k;
    case SP_QTYPE_Q3_K: return gemm_q3_k;
    case SP_QTYPE_Q4_K: return gemm_q4_k;
    case SP_QTYPE_Q5_K: return gemm_q5_k;
    case SP_QTYPE_Q6_K: return gemm_q6_k;
    default: return NULL;
    }
}

#if SP_AMX_EMU

/* Emulated twin of the kernel for t (tests only); its fallback is the
 * current table's vec_dot loop. */
sp_gemm_fn sp_quant_amx_emu_kernel(uint32_t t) { return kernel_of(t); }

#else /* the real kernels */

static bool amx_on; /* written once at registration, before threads start */

/* Ask Linux for permission to use AMX tile data (XFEATURE_XTILEDATA = 18);
 * without it the first tile instruction faults. */
static bool os_enable_amx(void) {
#if defined(__linux__)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) != 0) return false;
    return (bits >> XFEATURE_XTILEDATA) & 1;
#else
    return false;
#endif
}

/* Run kernel k on 32 rows x 32 tokens x 256 elements of pseudo-random data
 * quantized by the reference quantizers and compare with the reference
 * vec_dot: a last guard that the tile code works on this CPU before the
 * engine trusts it. */
static bool self_test(uint32_t t, sp_gemm_fn k) {
    enum { N = 256, R = 32, T = 32 };
    const struct sp_qtraits *tw = sp_qtraits_ref(t), *ta = sp_qtraits_ref(tw->vec_dot_type);
    const size_t wrb = sp_qtype_row_bytes(t, N), xrb = sp_qtype_row_bytes(tw->vec_dot_type, N);
    uint8_t wq[R * 8 * 34], xq[T * sizeof(struct sp_block_q8_k)];
    float f[N], y[T * R];
    SP_ASSERT(wrb * R <= sizeof wq && xrb * T <= sizeof xq);
    uint32_t s = 12345u + t;
    for (int i = 0; i < R + T; i++) {
        for (int j = 0; j < N; j++) {
            s = s * 1664525u + 1013904223u;
            f[j] = (float)((int32_t)(s >> 8) - (1 << 23)) / (float)(1 << 23);
        }
        if (i < R) tw->from_float(f, wq + (size_t)i * wrb, N);
        else ta->from_float(f, xq + (size_t)(i - R) * xrb, N);
    }
    k(N, wq, wrb, R, xq, xrb, T, y, R);
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < T; i++) {
            float ref;
            tw->vec_dot(N, &ref, wq + (size_t)r * wrb, xq + (size_t)i * xrb);
            const float err = y[i * R + r] - ref;
            if (!(err <= 1e-3f * (1 + SP_MAX(ref, -ref)) && -err <= 1e-3f * (1 + SP_MAX(ref, -ref)))) return false;
        }
    }
    return true;
}

/* Installs the AMX kernels as table[t].gemm for the types above, keeping
 * the entries they replace as the fallback for short batches.  Needs AMX
 * tile+int8 and AVX-512 (F, BW, VL) from CPUID/XCR0, the OS's permission for
 * tile data, SPARROW_AMX unset or not "0", and a passing self-test per type;
 * otherwise leaves the table alone (debug log).  Call once, before threads. */
void sp_quant_register_amx(struct sp_qtraits *table, const struct sp_cpu_features *f) {
    if (!(f->amx_tile && f->amx_int8 && f->avx512f && f->avx512bw && f->avx512vl && f->fma && f->f16c)) return;
    const char *env = getenv("SPARROW_AMX");
    if (env && strcmp(env, "0") == 0) {
        SP_LOG_D("%s: AMX disabled by SPARROW_AMX=0", __func__);
        return;
    }
    if (!os_enable_amx()) {
        SP_LOG_D("%s: the OS refused AMX tile data (arch_prctl); AMX kernels not used", __func__);
        return;
    }
    static const uint32_t types[] = {SP_QTYPE_Q4_0, SP_QTYPE_Q4_1, SP_QTYPE_Q5_0, SP_QTYPE_Q5_1, SP_QTYPE_Q8_0,
                                     SP_QTYPE_Q2_K, SP_QTYPE_Q3_K, SP_QTYPE_Q4_K, SP_QTYPE_Q5_K, SP_QTYPE_Q6_K};
    for (size_t i = 0; i < SP_ARRAY_LEN(types); i++) {
        const uint32_t t = types[i];
        fb[t].gemm = table[t].gemm;
        fb[t].vec_dot = table[t].vec_dot;
        if (!self_test(t, kernel_of(t))) {
            SP_LOG_W("%s: AMX %s kernel failed its self-test; not used", __func__, table[t].name);
            continue;
        }
        table[t].gemm = kernel_of(t);
        amx_on = true;
    }
    if (amx_on) SP_LOG_D("%s: AMX int8 kernels installed", __func__);
}

/* See amx.h. */
sp_gemm_fn sp_quant_amx_kernel(uint32_t t) {
    if (!amx_on || t >= SP_QTYPE_COUNT) return NULL;
    const sp_gemm_fn k = kernel_of(t);
    return k && sp_qtraits_get(t)->gemm == k ? k : NULL;
}

/* See amx.h. */
void sp_quant_amx_fallback(uint32_t t, int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *x,
                           size_t x_stride, int64_t n_tok, float *y, int64_t ldy) {
    SP_ASSERT(t < SP_QTYPE_COUNT);
    if (sp_quant_amx_kernel(t)) {
        run_fallback(t, n, w, w_stride, n_rows, x, x_stride, n_tok, y, ldy);
    } else if (sp_qtraits_get(t)->gemm) {
        sp_qtraits_get(t)->gemm(n, w, w_stride, n_rows, x, x_stride, n_tok, y, ldy);
    } else {
        sp_gemm_generic(t, n, w, w_stride, n_rows, x, x_stride, n_tok, y, ldy);
    }
}

#endif /* SP_AMX_EMU */
