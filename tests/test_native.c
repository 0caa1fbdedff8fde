/*
 * test_native.c -- Sparrow's native block types (quant/native.h,
 * docs/FORMAT.md): names and ids, the byte layout of every type against
 * blocks packed here from the written spec, quantize -> dequantize error
 * bounds per bit width, padded rows (n = 1, 33, 172, 200), E8M0 against FP16
 * scales, importance weighting, the reference dot product against a float
 * dot of the dequantized rows, the x8_b128 activations (per-32 runs,
 * padding, sums, SIMD quantizer byte for byte), every SIMD vec_dot against the reference and
 * every gemm against its vec_dot (bit for bit, no allocation), the model
 * ops (sp_act_convert + sp_matmul) on padded rows, sp_quantize_rows for
 * ggml types, and real weights: stories260K's F32 tensors quantized in
 * memory.  Levels the CPU lacks are reported as skipped.
 */
#include "core/core.h"
#include "core/cpu.h"
#include "format/model_file.h"
#include "model/ops.h"
#include "quant/isa.h"
#include "quant/native.h"
#include "quant/quant.h"
#include "test_isa.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- named thresholds -------------------------------------------------------
 * Dot products: errors relative to M = sum |w_i x_i| over the dequantized
 * values.  The reference and the SIMD kernels sum exact int32 block sums in
 * float, in different orders, and the SIMD ones take the symmetric offset
 * out of the block sum (sum u y - o sum y): a few float roundings of M.
 * TOL_DOT_FLOAT: reference vec_dot against a double dot of the dequantized
 *   weight and activation rows (checks the offset / min terms).
 * TOL_MATMUL_FLOAT: sp_matmul against float weights x float activations:
 *   the x8 rounding of the activations (|e| <= amax / 254 per element).
 * Round-trip errors: relative RMS sqrt(sum (x - q)^2 / sum x^2) over
 * standard-normal rows of 4096, bounds in rt_bound() (measured values
 * printed; bounds ~15% above them). */
#define TOL_DOT_SIMD 2e-6
#define TOL_DOT_FLOAT 2e-6
#define TOL_MATMUL_FLOAT 2e-2

static void rng_seed(uint64_t s) {
    *test_rng() = s * 0x9e3779b97f4a7c15ull + 1;
}

/* ---- the types ---------------------------------------------------------------- */

struct ntype {
    const char *name;
    uint32_t id;
    int bits, block;
    bool asym, e8, nl, l8;
};

#define NT_ENTRY(nm, kind, blk, sc) \
    {#nm, SP_NATIVE_ID(kind, blk, sc), SP_NATIVE_KIND_BITS(kind), 32 << (blk), SP_NATIVE_KIND_ASYM(kind),              \
     (sc) == SP_NS_E8, SP_NATIVE_KIND_NL(kind), (sc) == SP_NS_L8},
static const struct ntype types[] = {SP_NATIVE_TYPES(NT_ENTRY)};
#define N_TYPES ((int)SP_ARRAY_LEN(types))

/* Bytes per block from the spec: scale (2, 1, or 4 for d + m) + planes. */
static int spec_bytes(const struct ntype *t) {
    return (t->asym ? 4 : t->e8 || t->l8 ? 1 : 2) + t->block * t->bits / 8;
}

/* The L8 shift of t's kind (docs/FORMAT.md): 8 - bits for INT3/4/6. */
static int spec_l8_shift(const struct ntype *t) {
    return t->nl || t->bits == 8 || t->asym ? 0 : 8 - t->bits;
}

/* docs/FORMAT.md's words for an L8 byte: bit 7 the sign, m the low 7 bits,
 * d = +-2^(m / 8 - 18 + shift), 0 for m = 0 (computed in double, rounded
 * once to float). */
static float spec_l8(uint8_t c, int sh) {
    const int m = c & 127;
    const double v = m ? exp2((double)m / 8.0 - 18.0 + sh) : 0.0;
    return (float)((c & 128) ? -v : v);
}

/* The block scale d of block p by the spec. */
static double spec_d(const struct ntype *t, const uint8_t *p) {
    if (t->e8) return sp_e8m0_to_fp32(p[0]);
    if (t->l8) return spec_l8(p[0], spec_l8_shift(t));
    uint16_t h;
    memcpy(&h, p, 2);
    return sp_fp16_to_fp32(h);
}

/* ---- names, ids, sizes ------------------------------------------------------------ */

static void test_names(void) {
    CHECK(N_TYPES == 51);
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        CHECKF(sp_qtype_from_name(t->name) == (int32_t)t->id, "%s", t->name);
        char up[32];
        snprintf(up, sizeof up, "%s", t->name);
        for (char *c = up; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
        CHECKF(sp_qtype_from_name(up) == (int32_t)t->id, "%s", up);
        CHECKF(sp_qtype_is_native(t->id), "%s", t->name);
        const struct sp_qtraits *r = sp_qtraits_ref(t->id), *g = sp_qtraits_get(t->id);
        CHECKF(r && g && strcmp(sp_qtype_name(t->id), t->name) == 0, "%s", t->name);
        if (!r || !g) continue;
        CHECKF(r->block_elems == t->block && (int)r->block_bytes == spec_bytes(t), "%s: %lld elems %zu bytes", t->name,
               (long long)r->block_elems, r->block_bytes);
        CHECKF(g->vec_dot && g->to_float && g->from_float && g->vec_dot_type == (enum sp_qtype)SP_QTYPE_X8, "%s", t->name);
        /* padded rows: ceil(n / block) blocks */
        for (int64_t n = 0; n <= 300; n += 43) {
            CHECKF(sp_qtype_row_bytes(t->id, n) == (size_t)((n + t->block - 1) / t->block * spec_bytes(t)), "%s n %lld",
                   t->name, (long long)n);
        }
        const struct sp_native_layout *L = sp_native_layout(t->id);
        CHECKF(L && L->bits == t->bits && L->block == t->block && L->asym == t->asym && L->e8 == t->e8 && L->nl == t->nl &&
                   L->l8 == t->l8,
               "%s layout", t->name);
    }
    /* the ids of docs/FORMAT.md, spelled out */
    CHECK(sp_qtype_from_name("i3_b32") == 1024 && sp_qtype_from_name("i3_b64_e8") == 1027);
    CHECK(sp_qtype_from_name("i4_b32") == 1032 && sp_qtype_from_name("i4_b128_e8") == 1037);
    CHECK(sp_qtype_from_name("i6_b64") == 1042 && sp_qtype_from_name("i8_b128") == 1052);
    CHECK(sp_qtype_from_name("i3a_b64") == 1058 && sp_qtype_from_name("i4a_b128") == 1068);
    CHECK(sp_qtype_from_name("i4n_b32") == 1072 && sp_qtype_from_name("i4n_b128_e8") == 1077);
    CHECK(sp_qtype_from_name("i3_b32_l8") == 1088 && sp_qtype_from_name("i4_b64_l8") == 1093);
    CHECK(sp_qtype_from_name("i8_b128_l8") == 1102 && sp_qtype_from_name("i4n_b32_l8") == 1112);
    CHECK(sp_qtype_from_name("x8_b128") == 1151 && sp_qtype_is_native(1151));
    CHECK(sp_qtype_row_bytes(sp_qtype_from_name("i4_b32"), 172) == 6 * 18);
    CHECK(sp_qtype_row_bytes(sp_qtype_from_name("i3_b64"), 172) == 3 * 26);
    CHECK(sp_qtype_row_bytes(SP_QTYPE_X8, 172) == 2 * 160);
    /* ggml names, any case; ggml rows still need whole blocks */
    CHECK(sp_qtype_from_name("F32") == SP_QTYPE_F32 && sp_qtype_from_name("bf16") == SP_QTYPE_BF16);
    CHECK(sp_qtype_from_name("q4_0") == SP_QTYPE_Q4_0 && sp_qtype_from_name("Q6_K") == SP_QTYPE_Q6_K);
    CHECK(sp_qtype_row_bytes(SP_QTYPE_Q4_0, 172) == 0 && sp_qtype_row_bytes(SP_QTYPE_Q4_0, 160) == 5 * 18);
    static const char *const bad[] = {"", "i4", "i5_b32", "i4_b16", "i4_b256", "i4_b32_e9", "i3a_b32_e8", "i4a_b64_e8",
                                      "i4_b32 ", " i4_b32", "i4_b32_e8x", "q4_0x", "Q4_2", "x8", "i8a_b32", "F64",
                                      "i3a_b32_l8", "i4_b32_l9", "i4_b32_e8_l8", "i4a_b64_l8"};
    for (size_t i = 0; i < SP_ARRAY_LEN(bad); i++) CHECKF(sp_qtype_from_name(bad[i]) == -1, "'%s'", bad[i]);
    CHECK(sp_qtype_from_name(NULL) == -1);
    /* holes in the id range are not types */
    static const uint32_t holes[] = {1030, 1031, 1057, 1059, 1061, 1069, 1078, 1079, 1080, 1087, 1091,
                                     1104, 1111, 1115, 1150, 1152, 1023, 31, 4};
    for (size_t i = 0; i < SP_ARRAY_LEN(holes); i++) {
        CHECKF(!sp_qtype_is_native(holes[i]) && !sp_qtraits_get(holes[i]) && !sp_native_layout(holes[i]) &&
                   sp_qtype_row_bytes(holes[i], 64) == 0,
               "id %u", holes[i]);
    }
    CHECK(!sp_qtype_is_native(SP_QTYPE_Q4_0) && !sp_native_layout(SP_QTYPE_X8));
}

/* ---- byte layout against the spec --------------------------------------------------
 * pack_spec() writes a block from docs/FORMAT.md's words: a w-bit plane of
 * P = block * w / 8 bytes holds element k P + j in bits [w k, w k + w) of
 * byte j; INT3 = 2-bit plane + 1-bit plane, INT6 = 4-bit + 2-bit, INT8 =
 * bytes; the scale (fp16 d | E8M0 byte | fp16 d, fp16 m) comes first. */

static void plane_put(uint8_t *p, int w, int B, int i, unsigned v) {
    const int P = B * w / 8;
    p[i % P] |= (uint8_t)(v << (w * (i / P)));
}

static void pack_spec(const struct ntype *t, const unsigned *u, uint8_t *blk) {
    const int B = t->block, head = t->asym ? 4 : t->e8 || t->l8 ? 1 : 2;
    memset(blk + head, 0, (size_t)(B * t->bits / 8));
    uint8_t *p = blk + head;
    for (int i = 0; i < B; i++) {
        switch (t->bits) {
        case 3:
            plane_put(p, 2, B, i, u[i] & 3);
            plane_put(p + B / 4, 1, B, i, u[i] >> 2);
            break;
        case 4: plane_put(p, 4, B, i, u[i]); break;
        case 6:
            plane_put(p, 4, B, i, u[i] & 15);
            plane_put(p + B / 2, 2, B, i, u[i] >> 4);
            break;
        default: p[i] = (uint8_t)u[i]; break;
        }
    }
}

static void test_layouts(void) {
    uint8_t blk[256];
    unsigned u[128];
    float out[128];
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        const unsigned umask = (1u << t->bits) - 1;
        for (int i = 0; i < t->block; i++) u[i] = ((unsigned)i * 5u + 3u + (unsigned)(i / 7)) & umask;
        memset(blk, 0, sizeof blk);
        float d = 0.5f, m = 0;
        if (t->e8) {
            blk[0] = 126; /* 2^-1 */
        } else if (t->l8) {
            /* sign set, m = 100: d = -2^(100 / 8 - 18 + sh) = -sqrt(2) 2^(12 - 18 + sh) */
            blk[0] = 0x80 | 100;
            d = -ldexpf(sqrtf(2.0f), 12 - 18 + spec_l8_shift(t));
        } else {
            const uint16_t h = sp_fp32_to_fp16(d);
            memcpy(blk, &h, 2);
        }
        if (t->asym) {
            m = -1.25f;
            const uint16_t h = sp_fp32_to_fp16(m);
            memcpy(blk + 2, &h, 2);
        }
        pack_spec(t, u, blk);
        sp_qtraits_ref(t->id)->to_float(blk, out, t->block);
        int bad = 0;
        for (int i = 0; i < t->block; i++) {
            const float q = t->asym     ? (float)u[i]
                            : t->nl     ? (float)sp_native_nl4[u[i]]
                            : t->bits == 8 ? (float)(int8_t)u[i]
                                           : (float)u[i] - (float)(1 << (t->bits - 1));
            const float want = t->asym ? d * q + m : d * q;
            if (out[i] != want && bad++ < 2) fprintf(stderr, "%s element %d: %g, spec %g\n", t->name, i, out[i], want);
        }
        CHECKF(bad == 0, "%s: to_float disagrees with the spec layout", t->name);
    }
    /* a few bytes written out by hand */
    const struct ntype *i4 = &types[6], *i3 = &types[2];
    CHECK(i4->id == SP_NATIVE_ID(SP_NK_I4, 0, 0) && i3->id == SP_NATIVE_ID(SP_NK_I3, 1, 0));
    for (int i = 0; i < 64; i++) u[i] = (unsigned)i & 15;
    pack_spec(i4, u, blk); /* i4_b32: byte 2 + j = u[j] | u[j + 16] << 4 */
    CHECK(blk[2] == 0x00 && blk[3] == 0x11 && blk[17] == 0xff);
    for (int i = 0; i < 64; i++) u[i] = (unsigned)(i >> 4); /* i3_b64: u = 0,..,0 (16), 1.. (16), 2.., 3.. */
    pack_spec(i3, u, blk); /* 2-bit plane: byte j = 0 | 1 << 2 | 2 << 4 | 3 << 6 = 0xe4; 1-bit plane zero */
    CHECK(blk[2] == 0xe4 && blk[17] == 0xe4 && blk[18] == 0 && blk[25] == 0);
    /* E8M0: the float with bits e << 23 */
    CHECK(sp_e8m0_to_fp32(127) == 1.0f && sp_e8m0_to_fp32(130) == 8.0f && sp_e8m0_to_fp32(1) == ldexpf(1.0f, -126));
    CHECK(sp_e8m0_to_fp32(0) == 0.0f && isinf(sp_e8m0_to_fp32(255)));
}

/* ---- round trips --------------------------------------------------------------------- */

/* Relative RMS error bound of type t on standard-normal rows (measured value
 * + ~15%; printed by test_roundtrip). */
static double rt_bound(const struct ntype *t) {
    /* [bits][blk], FP16 scale; E8M0 and asymmetric below */
    static const double sym[4][3] = {{0.205, 0.22, 0.235}, {0.096, 0.104, 0.112}, {0.0235, 0.0255, 0.0275}, {0.0059, 0.0064, 0.0069}};
    static const double e8[4][3] = {{0.24, 0.25, 0.255}, {0.133, 0.144, 0.152}, {0.037, 0.040, 0.042}, {0.0095, 0.0103, 0.0106}};
    static const double asym[2][3] = {{0.175, 0.195, 0.21}, {0.083, 0.091, 0.098}};
    static const double l8[4][3] = {{0.19, 0.205, 0.215}, {0.096, 0.106, 0.113}, {0.025, 0.028, 0.030}, {0.0065, 0.0071, 0.0077}};
    static const double nl[3][3] = {{0.084, 0.093, 0.100}, {0.119, 0.126, 0.130}, {0.087, 0.095, 0.101}}; /* FP16, E8M0, L8 */
    const int bi = t->bits == 3 ? 0 : t->bits == 4 ? 1 : t->bits == 6 ? 2 : 3;
    const int li = t->block == 32 ? 0 : t->block == 64 ? 1 : 2;
    if (t->nl) return nl[t->l8 ? 2 : t->e8][li];
    if (t->asym) return asym[bi][li];
    return t->e8 ? e8[bi][li] : t->l8 ? l8[bi][li] : sym[bi][li];
}

/* sum (x - q)^2 and sum x^2 of n_rows rows quantized to t (imp may be NULL). */
static void rt_error(uint32_t t, const float *x, int64_t n_rows, int64_t n, const float *imp, const float *wimp,
                     double *err, double *ref) {
    const size_t rb = sp_qtype_row_bytes(t, n);
    uint8_t *q = malloc(rb * (size_t)n_rows);
    float *y = malloc((size_t)n * sizeof *y);
    CHECK(sp_quantize_rows(t, x, n_rows, n, imp, q) == SP_OK);
    *err = *ref = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        sp_qtraits_ref(t)->to_float(q + (size_t)r * rb, y, n);
        for (int64_t i = 0; i < n; i++) {
            const double e = (double)x[r * n + i] - y[i], w = wimp ? wimp[i] : 1.0;
            *err += w * e * e;
            *ref += w * (double)x[r * n + i] * x[r * n + i];
        }
    }
    free(q);
    free(y);
}

static void test_roundtrip(void) {
    const int64_t n = 4096, rows = 16;
    float *x = malloc((size_t)(n * rows) * sizeof *x);
    rng_seed(11);
    for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal();
    printf("round trip, standard-normal rows of %lld: relative RMS error (bound)\n", (long long)n);
    double fp16_err[4][3] = {{0}}, nl_err[3] = {0};
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        double e, s;
        rt_error(t->id, x, rows, n, NULL, NULL, &e, &s);
        const double rel = sqrt(e / s), bpw = 8.0 * spec_bytes(t) / t->block;
        printf("  %-11s %6.4f bpw  rel RMS %.4f  (<= %.4f)\n", t->name, bpw, rel, rt_bound(t));
        CHECKF(rel <= rt_bound(t), "%s: rel RMS %.4f > %.4f", t->name, rel, rt_bound(t));
        const int bi = t->bits == 3 ? 0 : t->bits == 4 ? 1 : t->bits == 6 ? 2 : 3, li = t->block / 64;
        double *fp16 = t->nl ? &nl_err[li] : &fp16_err[bi][li]; /* this kind's FP16 error */
        if (!t->asym && !t->e8 && !t->l8) *fp16 = rel;
        /* E8M0 costs accuracy (the step is rounded up to a power of two): at
         * most 1.75x FP16's error at the same kind and block */
        if (t->e8) CHECKF(rel > *fp16 && rel < 1.75 * *fp16, "%s vs fp16 %.4f", t->name, *fp16);
        /* the non-uniform levels: at most 0.92x INT4's RMS error (0.85x its
         * squared error) on the same block, Gaussian weights */
        /* L8 rounds the scale to 2^(1/8) steps: at most 1.2x FP16's error
         * (measured 1.01x for INT3 .. 1.14x for INT8, whose own error is
         * smallest) */
        if (t->l8) CHECKF(rel < 1.2 * *fp16, "%s vs fp16 %.4f", t->name, *fp16);
        if (t->nl && !t->e8 && !t->l8) CHECKF(rel < 0.92 * fp16_err[1][li], "%s vs i4 %.4f", t->name, fp16_err[1][li]);
        /* asymmetric INT3 beats symmetric INT3 on the same block */
        if (t->asym && t->bits == 3) CHECKF(rel < fp16_err[0][li], "%s vs i3 %.4f", t->name, fp16_err[0][li]);
        /* deterministic: the same bytes twice */
        const size_t rb = sp_qtype_row_bytes(t->id, n);
        uint8_t *a = malloc(rb * 2), *b = malloc(rb * 2);
        sp_quantize_rows(t->id, x, 2, n, NULL, a);
        sp_quantize_rows(t->id, x, 2, n, NULL, b);
        CHECKF(memcmp(a, b, rb * 2) == 0, "%s: quantizer not deterministic", t->name);
        /* from_float is the unweighted quantizer */
        sp_qtraits_ref(t->id)->from_float(x, b, n);
        CHECKF(memcmp(a, b, rb) == 0, "%s: from_float differs from sp_quantize_rows", t->name);
        free(a);
        free(b);
    }
    free(x);
}

/* sp_quantize_rows_fast: every type decodes back within a bounded factor of
 * the searching quantizer's error (and not below it: the searches start
 * from the same scale), deterministically, on rows that end in a padded
 * block; a ggml type gives the same bytes as sp_quantize_rows. */
static double fast_rel(uint32_t t, const float *x, int64_t rows, int64_t n, bool fast) {
    const size_t rb = sp_qtype_row_bytes(t, n);
    uint8_t *q = malloc(rb * (size_t)rows), *q2 = malloc(rb * (size_t)rows);
    float *y = malloc((size_t)n * sizeof *y);
    CHECK((fast ? sp_quantize_rows_fast(t, x, rows, n, q) : sp_quantize_rows(t, x, rows, n, NULL, q)) == SP_OK);
    if (fast) {
        CHECK(sp_quantize_rows_fast(t, x, rows, n, q2) == SP_OK);
        CHECKF(memcmp(q, q2, rb * (size_t)rows) == 0, "type %u: fast quantizer not deterministic", (unsigned)t);
    }
    double e = 0, ss = 0;
    for (int64_t r = 0; r < rows; r++) {
        sp_qtraits_ref(t)->to_float(q + (size_t)r * rb, y, n);
        for (int64_t i = 0; i < n; i++) {
            const double d = (double)x[r * n + i] - y[i];
            CHECKF(isfinite(y[i]), "type %u: non-finite decode", (unsigned)t);
            e += d * d;
            ss += (double)x[r * n + i] * x[r * n + i];
        }
    }
    free(q);
    free(q2);
    free(y);
    return sqrt(e / ss);
}

static void test_fast(void) {
    const int64_t n = 4096 + 40, rows = 8;
    float *x = malloc((size_t)(n * rows) * sizeof *x);
    rng_seed(12);
    for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal();
    x[5] = 0; /* an all-zero block */
    memset(x + 64, 0, 128 * sizeof *x);
    printf("fast quantizer, standard-normal rows of %lld: relative RMS error, fast / searched\n", (long long)n);
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        const double ef = fast_rel(t->id, x, rows, n, true), es = fast_rel(t->id, x, rows, n, false);
        printf("  %-11s %.4f / %.4f = %.3f\n", t->name, ef, es, ef / es);
        /* the E8M0 scale rounds the step up to a power of two where the
         * search may clip: up to 1.85x at 3 bits (measured 1.85 for i3_b128_e8) */
        const double bound = t->e8 ? 2.0 : 1.3;
        CHECKF(ef >= 0.995 * es && ef <= bound * es, "%s: fast %.4f, searched %.4f", t->name, ef, es);
    }
    const size_t rb = sp_qtype_row_bytes(SP_QTYPE_Q4_0, 4096);
    uint8_t *a = malloc(rb), *b = malloc(rb);
    CHECK(sp_quantize_rows_fast(SP_QTYPE_Q4_0, x, 1, 4096, a) == SP_OK);
    CHECK(sp_quantize_rows(SP_QTYPE_Q4_0, x, 1, 4096, NULL, b) == SP_OK);
    CHECK(memcmp(a, b, rb) == 0);
    CHECK(sp_quantize_rows_fast(SP_QTYPE_Q4_0, x, 1, 4010, a) == SP_E_INVALID);
    free(a);
    free(b);
    free(x);
}

/* Rows of n that do not fill their last block: sizes, no writes past the
 * row, to_float writes exactly n values, and error within bounds. */
static void test_padded(void) {
    static const int64_t sizes[] = {1, 33, 172, 200};
    for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
        const int64_t n = sizes[si], rows = 5;
        float *x = malloc((size_t)(n * rows) * sizeof *x), *y = malloc((size_t)(n + 8) * sizeof *y);
        rng_seed(100 + (uint64_t)n);
        for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal();
        for (int k = 0; k < N_TYPES; k++) {
            const struct ntype *t = &types[k];
            const size_t rb = sp_qtype_row_bytes(t->id, n);
            CHECK(rb == (size_t)((n + t->block - 1) / t->block * spec_bytes(t)));
            uint8_t *q = malloc(rb * (size_t)rows + 64);
            memset(q, 0xa5, rb * (size_t)rows + 64);
            CHECK(sp_quantize_rows(t->id, x, rows, n, NULL, q) == SP_OK);
            bool intact = true;
            for (int i = 0; i < 64; i++) intact &= q[rb * (size_t)rows + (size_t)i] == 0xa5;
            CHECKF(intact, "%s n %lld: wrote past the rows", t->name, (long long)n);
            double e = 0, s = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int i = 0; i < 8; i++) y[n + i] = 1234.5f;
                sp_qtraits_ref(t->id)->to_float(q + (size_t)r * rb, y, n);
                for (int i = 0; i < 8; i++) intact &= y[n + i] == 1234.5f;
                for (int64_t i = 0; i < n; i++) {
                    e += (double)(x[r * n + i] - y[i]) * (x[r * n + i] - y[i]);
                    s += (double)x[r * n + i] * x[r * n + i];
                }
            }
            CHECKF(intact, "%s n %lld: to_float wrote past n", t->name, (long long)n);
            /* short rows have fewer values per scale: the 4096 bound + 25% */
            CHECKF(sqrt(e / s) <= 1.25 * rt_bound(t), "%s n %lld: rel RMS %.4f", t->name, (long long)n, sqrt(e / s));
            free(q);
        }
        free(x);
        free(y);
    }
}

/* The level of sp_native_nl4 nearest v (by distance, ties to the lower). */
static float nl_nearest(float v) {
    int best = 0;
    for (int k = 1; k < 16; k++) {
        if (fabsf(v - (float)sp_native_nl4[k]) < fabsf(v - (float)sp_native_nl4[best])) best = k;
    }
    return (float)sp_native_nl4[best];
}

/* E8M0 blocks hold powers of two; the quantizer picks the best of its
 * candidates, so it is never worse than the plain rule 2^ceil(log2(amax/qmax)). */
static void test_e8m0(void) {
    const int64_t n = 4096;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    rng_seed(5);
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * (float)exp(rng_normal());
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        if (!t->e8) continue;
        const size_t rb = sp_qtype_row_bytes(t->id, n);
        uint8_t *q = malloc(rb);
        sp_quantize_rows(t->id, x, 1, n, NULL, q);
        sp_qtraits_ref(t->id)->to_float(q, y, n);
        /* the non-uniform kind: its levels, in units of d, reach 127 */
        const int qmax = t->nl ? 127 : (1 << (t->bits - 1)) - 1, spb = spec_bytes(t);
        double e = 0, e_plain = 0;
        bool ok = true;
        for (int64_t b = 0; b < n / t->block; b++) {
            const uint8_t eb = q[(size_t)b * (size_t)spb];
            ok &= eb >= 1 && eb <= 254;
            float amax = 0;
            for (int i = 0; i < t->block; i++) amax = fmaxf(amax, fabsf(x[b * t->block + i]));
            const float d = ldexpf(1.0f, (int)ceilf(log2f(amax / (float)qmax)));
            for (int i = 0; i < t->block; i++) {
                const float v = x[b * t->block + i];
                const float qv = t->nl ? nl_nearest(v / d) : fminf(fmaxf(rintf(v / d), (float)(-qmax - 1)), (float)qmax);
                e_plain += (double)(v - d * qv) * (v - d * qv);
                e += (double)(v - y[b * t->block + i]) * (v - y[b * t->block + i]);
                /* every value is a signed multiple of the block's power of two
                 * (the non-uniform kind: a level times it) */
                const float r = y[b * t->block + i] / sp_e8m0_to_fp32(eb);
                ok &= t->nl ? r == nl_nearest(r) : r == rintf(r) && r >= (float)(-qmax - 1) && r <= (float)qmax;
            }
        }
        CHECKF(ok, "%s: scale bytes or values off the E8M0 grid", t->name);
        CHECKF(e <= e_plain, "%s: error %.4g above the plain power-of-two rule %.4g", t->name, e, e_plain);
        free(q);
    }
    free(x);
    free(y);
}

/* L8: the library's decoding is the spec's (every byte, every shift), the
 * encoder picks the nearest value, and quantized blocks hold multiples of
 * their decoded scale (levels for the non-uniform kind). */
static void test_l8(void) {
    bool ok = true;
    for (int sh = 0; sh <= 5; sh++) {
        for (int c = 0; c < 256; c++) ok &= sp_l8_to_fp32((uint8_t)c, sh) == spec_l8((uint8_t)c, sh);
    }
    CHECK(ok);
    CHECK(sp_l8_to_fp32(0, 0) == 0.0f && sp_l8_to_fp32(128, 3) == 0.0f && sp_l8_to_fp32(0x80 | 16, 0) == -0x1p-16f);
    CHECK(sp_fp32_to_l8(0.0f, 0) == 0 && sp_fp32_to_l8(NAN, 0) == 0 && sp_fp32_to_l8(1e30f, 0) == 127 &&
          sp_fp32_to_l8(-1e-30f, 0) == (0x80 | 1) && sp_fp32_to_l8(INFINITY, 2) == 127);
    rng_seed(9);
    for (int k = 0; k < 2000; k++) {
        const int sh = k % 6;
        const float d = (float)(exp2(-18.5 + 17.0 * rng_unit() + sh) * (rng_unit() < 0.5 ? -1 : 1));
        const uint8_t c = sp_fp32_to_l8(d, sh);
        for (int m = 1; m < 128; m++) {
            const float v = spec_l8((uint8_t)((c & 128) | m), sh);
            ok &= fabsf(v - d) >= fabsf(spec_l8(c, sh) - d);
        }
        ok &= (c & 128) == (d < 0 ? 128 : 0);
    }
    CHECKF(ok, "sp_fp32_to_l8 is not the nearest L8 value");
    /* reach: the same block maxima for every kind, about 29; beyond, values
     * clamp to it (finite, sign kept) */
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        if (!t->l8) continue;
        const float reach = sp_native_reach(sp_native_layout(t->id));
        CHECKF(reach > 29.0f && reach < 30.0f, "%s: reach %g", t->name, reach);
        float big[128], back[128];
        for (int i = 0; i < t->block; i++) big[i] = (i % 3 ? -1000.0f : 1000.0f) * (float)(i + 1) / (float)t->block;
        uint8_t blk[256];
        CHECK(sp_quantize_rows(t->id, big, 1, t->block, NULL, blk) == SP_OK);
        sp_qtraits_ref(t->id)->to_float(blk, back, t->block);
        float amax = 0;
        for (int i = 0; i < t->block; i++) amax = fmaxf(amax, fabsf(back[i]));
        CHECKF(amax <= reach && amax > 0.5f * reach, "%s: a block of maxima 1000 decodes to max %g", t->name, amax);
    }
    CHECK(isinf(sp_native_reach(sp_native_layout((uint32_t)sp_qtype_from_name("i4_b32")))));
    const int64_t n = 4096;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    rng_seed(6);
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * (float)exp(rng_normal());
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        if (!t->l8) continue;
        const size_t rb = sp_qtype_row_bytes(t->id, n);
        uint8_t *q = malloc(rb);
        sp_quantize_rows(t->id, x, 1, n, NULL, q);
        sp_qtraits_ref(t->id)->to_float(q, y, n);
        const int qmax = t->nl ? 127 : (1 << (t->bits - 1)) - 1;
        ok = true;
        for (int64_t b = 0; b < n / t->block; b++) {
            const float d = spec_l8(q[(size_t)b * (size_t)spec_bytes(t)], spec_l8_shift(t));
            ok &= d != 0;
            for (int i = 0; i < t->block; i++) {
                /* d q is rounded to float: q back within a few ulp */
                const float r = y[b * t->block + i] / d, g = t->nl ? nl_nearest(r) : rintf(r);
                ok &= fabsf(r - g) <= 1e-6f * fabsf(g) && g >= (float)(-qmax - 1) && g <= (float)qmax;
            }
        }
        CHECKF(ok, "%s: values off the L8 scale's grid", t->name);
        free(q);
    }
    free(x);
    free(y);
}

/* Importance: with imp, the imp-weighted error must drop against the
 * unweighted fit, for every type (rows of 256, a log-normal importance
 * vector spanning ~3 decades). */
static void test_importance(void) {
    const int64_t n = 256, rows = 64;
    float *x = malloc((size_t)(n * rows) * sizeof *x), *imp = malloc((size_t)n * sizeof *imp);
    rng_seed(77);
    for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal();
    for (int64_t i = 0; i < n; i++) imp[i] = (float)exp(2.0 * rng_normal());
    printf("importance-weighted error, weighted fit / plain fit:\n ");
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        double ew, eu, s;
        rt_error(t->id, x, rows, n, imp, imp, &ew, &s);
        rt_error(t->id, x, rows, n, NULL, imp, &eu, &s);
        printf(" %s %.3f", t->name, ew / eu);
        CHECKF(ew < eu, "%s: weighted fit %.4g not below plain fit %.4g", t->name, ew, eu);
    }
    printf("\n");
    /* all-zero importance is the plain fit; NULL == all ones */
    float *zero = calloc((size_t)n, sizeof *zero), *ones = malloc((size_t)n * sizeof *ones);
    for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
    const uint32_t t = types[8].id;
    const size_t rb = sp_qtype_row_bytes(t, n);
    uint8_t *a = malloc(rb * 4), *b = malloc(rb * 4), *c = malloc(rb * 4);
    sp_quantize_rows(t, x, 4, n, NULL, a);
    sp_quantize_rows(t, x, 4, n, zero, b);
    sp_quantize_rows(t, x, 4, n, ones, c);
    CHECK(memcmp(a, b, rb * 4) == 0 && memcmp(a, c, rb * 4) == 0);
    free(a);
    free(b);
    free(c);
    free(zero);
    free(ones);
    free(x);
    free(imp);
}

/* ---- x8_b128 activations and the reference dot ------------------------------------ */

static void test_x8(void) {
    const struct sp_qtraits *xt = sp_qtraits_ref(SP_QTYPE_X8);
    static const int64_t sizes[] = {1, 33, 128, 172, 200, 4096};
    for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
        const int64_t n = sizes[si], nr = (n + 127) / 128 * 4; /* runs: whole 128-blocks */
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        struct sp_x8_run *b = malloc((size_t)nr * sizeof *b + 64);
        CHECK(sp_qtype_row_bytes(SP_QTYPE_X8, n) == (size_t)nr * sizeof *b);
        rng_seed(3 + (uint64_t)n);
        for (int64_t i = 0; i < n; i++) x[i] = rng_normal();
        memset(b, 0x77, (size_t)nr * sizeof *b + 64);
        xt->from_float(x, b, n);
        xt->to_float(b, y, n);
        bool ok = true;
        for (int64_t k = 0; k < nr; k++) {
            int s = 0;
            float amax = 0;
            for (int i = 0; i < 32; i++) {
                ok &= k * 32 + i < n || b[k].qs[i] == 0; /* padding is zero */
                ok &= b[k].qs[i] >= -127;
                s += b[k].qs[i];
                if (k * 32 + i < n) amax = fmaxf(amax, fabsf(x[k * 32 + i]));
            }
            ok &= b[k].s == b[k].d * (float)s && b[k].d == amax / 127.0f;
        }
        for (int i = 0; i < 64; i++) ok &= ((uint8_t *)(b + nr))[i] == 0x77;
        for (int64_t i = 0; i < n; i++) ok &= fabsf(x[i] - y[i]) <= b[i / 32].d * 0.5f * 1.0001f;
        CHECKF(ok, "x8_b128 n %lld: padding, sums, rounding, or a write past the row", (long long)n);
        free(x);
        free(y);
        free(b);
    }
}

/* Reference vec_dot against a double dot of the dequantized rows, for
 * random quantized rows (random codes, random scales: not just what the
 * quantizer makes) and padded lengths. */
static void random_row(const struct ntype *t, uint8_t *w, int64_t n) {
    const int spb = spec_bytes(t);
    const int64_t nb = (n + t->block - 1) / t->block;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * spb;
        for (int i = 0; i < spb; i++) p[i] = (uint8_t)rng_u64();
        if (t->e8) {
            p[0] = (uint8_t)(120 + rng_u64() % 8);
        } else if (t->l8) {
            p[0] = (uint8_t)((rng_u64() & 128) | (72 + rng_u64() % 16)); /* +-2^(-9..-7 + shift) */
        } else {
            const uint16_t h = sp_fp32_to_fp16((float)((rng_unit() - 0.5) * 0.02));
            memcpy(p, &h, 2);
        }
        if (t->asym) {
            const uint16_t h = sp_fp32_to_fp16((float)((rng_unit() - 0.7) * 0.1));
            memcpy(p + 2, &h, 2);
        }
    }
}

/* The dot of the dequantized rows in double; *mag = the scale its rounding
 * errors are measured against: sum |w_i x_i| plus, per block, |c| sum |x_i|
 * with c the block's min (asymmetric) or offset times scale (symmetric INT3
 * to INT6), which kernels may take out of the block sum separately. */
static double dot_float(const struct ntype *t, const uint8_t *w, const void *x, int64_t n, float *fa, float *fb,
                        double *mag) {
    sp_qtraits_ref(t->id)->to_float(w, fa, n);
    sp_qtraits_ref(SP_QTYPE_X8)->to_float(x, fb, n);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = w + (i / t->block) * spec_bytes(t);
        uint16_t mh;
        memcpy(&mh, p + 2, 2);
        const double d = t->asym ? sp_fp16_to_fp32(mh) : spec_d(t, p); /* asymmetric: the min */
        const double c = t->asym ? fabs(d) : t->bits == 8 ? 0 : fabs(d) * (1 << (t->bits - 1));
        s += (double)fa[i] * fb[i];
        m += fabs((double)fa[i] * fb[i]) + c * fabs((double)fb[i]);
    }
    *mag = m > 0 ? m : 1;
    return s;
}

static const int64_t dot_sizes[] = {1, 31, 32, 33, 64, 100, 127, 128, 129, 172, 200, 256, 4096, 11008};

static void test_ref_dot(void) {
    const int64_t nmax = 11008;
    uint8_t *w = malloc((size_t)nmax * 2), *xq = malloc((size_t)nmax * 2);
    float *xf = malloc((size_t)nmax * sizeof *xf), *fa = malloc((size_t)nmax * 4), *fb = malloc((size_t)nmax * 4);
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        double worst = 0;
        for (size_t si = 0; si < SP_ARRAY_LEN(dot_sizes); si++) {
            const int64_t n = dot_sizes[si];
            rng_seed(31 * (uint64_t)n + (uint64_t)k);
            random_row(t, w, n);
            for (int64_t i = 0; i < n; i++) xf[i] = rng_normal() + 0.5f; /* a mean: the offset terms matter */
            sp_qtraits_ref(SP_QTYPE_X8)->from_float(xf, xq, n);
            float s;
            sp_qtraits_ref(t->id)->vec_dot(n, &s, w, xq);
            double mag;
            const double want = dot_float(t, w, xq, n, fa, fb, &mag);
            worst = fmax(worst, fabs(s - want) / mag);
        }
        CHECKF(worst <= TOL_DOT_FLOAT, "%s: reference vec_dot vs float dot, rel %.3g", t->name, worst);
    }
    free(w);
    free(xq);
    free(xf);
    free(fa);
    free(fb);
}

/* ---- SIMD levels ------------------------------------------------------------------- */

static int n_levels;
static struct test_level levels[TEST_ISA_MAX];
static struct sp_qtraits level_tabs[TEST_ISA_MAX][SP_QTYPE_NATIVE_COUNT];

static void setup_levels(void) {
    n_levels = test_setup_levels(levels, &level_tabs[0][0], SP_QTYPE_NATIVE_FIRST, SP_QTYPE_NATIVE_COUNT, test_isa_register_native);
}

static const struct sp_qtraits *lvl(const struct test_level *l, uint32_t t) {
    return &l->tab[t - SP_QTYPE_NATIVE_FIRST];
}

/* Activation patterns for the x8 quantizer: normals, ties, zero blocks,
 * tiny values, raw bit patterns (inf, NaN). */
static void rand_act(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * (float)exp(rng_normal() * 2);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 1: x[i] = (float)((int)(rng_u64() % 254) - 127) + 0.5f; break;
        case 2: if ((i / 32) % 2 == 0) x[i] = 0; break;
        case 3: x[i] *= 1e-38f; break;
        case 4: {
            const uint32_t u = (uint32_t)rng_u64();
            memcpy(&x[i], &u, 4);
            break;
        }
        default: break;
        }
    }
}

static void test_simd_x8(const struct test_level *l) {
    const struct sp_qtraits *ref = sp_qtraits_ref(SP_QTYPE_X8), *got = lvl(l, SP_QTYPE_X8);
    static const int64_t sizes[] = {1, 5, 31, 32, 33, 127, 172, 200, 4096, 65536 + 77};
    const int64_t nmax = 65536 + 77;
    float *x = malloc((size_t)nmax * sizeof *x);
    uint8_t *a = malloc((size_t)nmax * 2), *b = malloc((size_t)nmax * 2);
    int bad = 0;
    for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
        for (int kind = 0; kind < 5; kind++) {
            const int64_t n = sizes[si];
            rng_seed(9000 + (uint64_t)n * 7 + (uint64_t)kind);
            rand_act(x, n, kind);
            const size_t bytes = sp_qtype_row_bytes(SP_QTYPE_X8, n);
            memset(a, 0x55, bytes);
            memset(b, 0xaa, bytes);
            ref->from_float(x, a, n);
            got->from_float(x, b, n);
            if (memcmp(a, b, bytes) != 0 && bad++ < 3) {
                size_t i = 0;
                while (a[i] == b[i]) i++;
                fprintf(stderr, "%s x8 from_float n %lld kind %d: byte %zu (ref %02x, got %02x)\n", l->name,
                        (long long)n, kind, i, a[i], b[i]);
            }
        }
    }
    CHECKF(bad == 0, "%s x8_b128 from_float not bit-identical (%d runs)", l->name, bad);
    free(x);
    free(a);
    free(b);
}

static void test_simd_dot(const struct test_level *l) {
    const int64_t nmax = 11008;
    uint8_t *w = malloc((size_t)nmax * 2), *xq = malloc((size_t)nmax * 2);
    float *xf = malloc((size_t)nmax * sizeof *xf), *fa = malloc((size_t)nmax * 4), *fb = malloc((size_t)nmax * 4);
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        const struct sp_qtraits *ref = sp_qtraits_ref(t->id), *got = lvl(l, t->id);
        double worst = 0;
        int exact = 0, runs = 0;
        for (size_t si = 0; si < SP_ARRAY_LEN(dot_sizes); si++) {
            for (uint64_t seed = 1; seed <= 2; seed++) {
                const int64_t n = dot_sizes[si];
                rng_seed(seed * 7919 + (uint64_t)n + 1000 * (uint64_t)k);
                random_row(t, w, n);
                for (int64_t i = 0; i < n; i++) xf[i] = rng_normal() + (seed == 2 ? 1.0f : 0.0f);
                sp_qtraits_ref(SP_QTYPE_X8)->from_float(xf, xq, n);
                float s_ref = 0, s_got = 0;
                ref->vec_dot(n, &s_ref, w, xq);
                got->vec_dot(n, &s_got, w, xq);
                double mag;
                (void)dot_float(t, w, xq, n, fa, fb, &mag);
                const double err = fabs((double)s_got - s_ref) / mag;
                worst = fmax(worst, err);
                exact += s_got == s_ref;
                runs++;
                CHECKF(err <= TOL_DOT_SIMD, "%s %s vec_dot n %lld: ref %.9g got %.9g (rel %.3g)", l->name, t->name,
                       (long long)n, s_ref, s_got, err);
            }
        }
        printf("  %-8s %-11s vec_dot worst rel err %.2e%s\n", l->name, t->name, worst,
               exact == runs ? " (bit-exact)" : "");
    }
    free(w);
    free(xq);
    free(xf);
    free(fa);
    free(fb);
}

/* y[0 .. max_tok * ldy) set to a sentinel, then tr's gemm of nr rows and nt
 * tokens: checks that it allocated nothing and returns how many values
 * outside the nt x nr output it changed. */
static int gemm_fenced(const struct sp_qtraits *tr, const char *what, int64_t n, const uint8_t *w, size_t ws, int64_t nr,
                       const uint8_t *x, size_t xs, int64_t nt, float *y, int64_t ldy, int64_t max_tok) {
    for (int64_t i = 0; i < max_tok * ldy; i++) y[i] = -12345.0f;
    const uint64_t allocs = sp_alloc_count();
    tr->gemm(n, w, ws, nr, x, xs, nt, y, ldy);
    CHECKF(sp_alloc_count() == allocs, "%s gemm allocated", what);
    int outside = 0;
    for (int64_t i = 0; i < max_tok; i++)
        for (int64_t r = 0; r < ldy; r++) outside += (i >= nt || r >= nr) && y[i * ldy + r] != -12345.0f;
    return outside;
}

/* gemm against the same level's vec_dot (batches of the symmetric and
 * non-uniform kinds, which take the Q8_0 gemm's tiles: against the
 * reference vec_dot): every (row, token) bit for bit,
 * nothing written outside the output, no allocation.  One token takes the
 * decode path where a type has one (x86: the symmetric 64-blocks), which
 * sums the same exact run sums in another float order: within
 * TOL_DOT_SIMD of vec_dot there.  Sizes: a padded block alone, 3 blocks
 * (no whole group of 4), one group, 3 groups and 4 blocks the last padded,
 * 16 groups and 1 block, and rows over two of decode's K chunks (16384
 * elements) ending in a padded block; row counts below, at and past the
 * 8-row strips. */
static void test_simd_gemm(const struct test_level *l) {
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 9}, rows[] = {1, 3, 6, 8, 11};
    static const int64_t sizes[] = {33, 172, 256, 1017, 4096 + 64, 16384 + 3 * 256 + 64 + 33};
    enum { max_rows = 11, max_tok = 9, ldy = max_rows + 2 };
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        const struct sp_qtraits *tr = lvl(l, t->id);
        if (!tr->gemm) continue;
        int bad = 0;
        for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
            const int64_t n = sizes[si];
            const size_t wrb = sp_qtype_row_bytes(t->id, n), xrb = sp_qtype_row_bytes(SP_QTYPE_X8, n);
            const size_t ws = wrb + 7, xs = xrb + 12;
            uint8_t *w = calloc((size_t)max_rows, ws), *x = calloc((size_t)max_tok, xs);
            float *xf = malloc((size_t)n * sizeof *xf), *y = malloc((size_t)(max_tok * ldy) * sizeof *y);
            float *fa = malloc((size_t)n * sizeof *fa), *fb = malloc((size_t)n * sizeof *fb);
            rng_seed(4242 + (uint64_t)k + (uint64_t)n);
            for (int64_t r = 0; r < max_rows; r++) random_row(t, w + (size_t)r * ws, n);
            for (int64_t i = 0; i < max_tok; i++) {
                for (int64_t j = 0; j < n; j++) xf[j] = rng_normal();
                sp_qtraits_ref(SP_QTYPE_X8)->from_float(xf, x + (size_t)i * xs, n);
            }
            /* each (row, token)'s dots once: the level's, and the reference's (slow under ASan) */
            float sl[max_tok][max_rows], sr[max_tok][max_rows];
            for (int64_t i = 0; i < max_tok; i++) {
                for (int64_t r = 0; r < max_rows; r++) {
                    tr->vec_dot(n, &sl[i][r], w + (size_t)r * ws, x + (size_t)i * xs);
                    sr[i][r] = sl[i][r];
                    if (!t->asym) sp_qtraits_ref(t->id)->vec_dot(n, &sr[i][r], w + (size_t)r * ws, x + (size_t)i * xs);
                }
            }
            for (size_t ri = 0; ri < SP_ARRAY_LEN(rows); ri++) {
                for (size_t ti = 0; ti < SP_ARRAY_LEN(toks); ti++) {
                    const int64_t nr = rows[ri], nt = toks[ti];
                    bad += gemm_fenced(tr, t->name, n, w, ws, nr, x, xs, nt, y, ldy, max_tok);
                    for (int64_t i = 0; i < nt; i++) {
                        for (int64_t r = 0; r < nr; r++) {
                            const float v = y[i * ldy + r];
                            /* batches of the symmetric and non-uniform kinds: the reference's order */
                            const float s = nt > 1 ? sr[i][r] : sl[i][r];
                            bool ok = v == s;
                            if (!ok && nt == 1) {
                                double mag;
                                (void)dot_float(t, w + (size_t)r * ws, x + (size_t)i * xs, n, fa, fb, &mag);
                                ok = fabs((double)v - s) <= TOL_DOT_SIMD * mag;
                            }
                            if (!ok && bad++ < 3) {
                                fprintf(stderr, "%s %s gemm n %lld rows %lld tok %lld: y[%lld][%lld] %.9g vs %.9g\n",
                                        l->name, t->name, (long long)n, (long long)nr, (long long)nt, (long long)i,
                                        (long long)r, v, s);
                            }
                        }
                    }
                }
            }
            free(w);
            free(x);
            free(xf);
            free(y);
            free(fa);
            free(fb);
        }
        CHECKF(bad == 0, "%s %s gemm: %d values differ from vec_dot or were written outside", l->name, t->name, bad);
    }
}

/* ---- resident g4 layouts (native.h) ---------------------------------------------------
 * Rows of random blocks of i3_b64 / i4_b64 / i6_b64, repacked in place:
 * the layout's reference reads the file type's floats and dot bits; the
 * level's vec_dot is within TOL_DOT_SIMD of them (the decode path's float
 * order); its gemm gives, for every (row, token), the level's vec_dot bits
 * for one token and the reference's for a batch (the Q8_0 gemm's order),
 * writing nothing else.  Sizes: one group, 3,
 * Llama's 4096 and 11008, and rows over two of decode's K chunks; row
 * counts around the gemm's 16-row strips. */
static void test_simd_g4(const struct test_level *l) {
    static const uint32_t g4[] = {SP_QTYPE_I3_B64_G4, SP_QTYPE_I4_B64_G4, SP_QTYPE_I6_B64_G4};
    static const int64_t sizes[] = {256, 768, 4096, 11008, 16384 + 3 * 256}, toks[] = {1, 2, 5, 67};
    static const int64_t rows[] = {1, 7, 16, 19, 70};
    const int64_t max_rows = 70, max_tok = 67, ldy = max_rows + 2;
    for (size_t k = 0; k < SP_ARRAY_LEN(g4); k++) {
        const uint32_t ft = sp_qtype_resident_from(g4[k]);
        const struct ntype *t = NULL;
        for (int i = 0; i < N_TYPES; i++)
            if (types[i].id == ft) t = &types[i];
        CHECKF(t && sp_qtype_resident(ft) == g4[k] && t->block == 64 && !t->e8 && !t->l8 && !t->asym && !t->nl,
               "resident id %u: not the g4 layout of a symmetric FP16 64-block type", (unsigned)g4[k]);
        if (!t) continue;
        const struct sp_qtraits *fr = sp_qtraits_ref(ft), *ref = sp_qtraits_ref(g4[k]), *got = lvl(l, g4[k]);
        CHECKF(ref && ref->block_elems == SP_QK_G4 && ref->block_bytes == 4 * fr->block_bytes,
               "%s: a group is not 4 blocks of %s", ref ? ref->name : "?", fr->name);
#if defined(__x86_64__)
        CHECKF(got->gemm && got->vec_dot != ref->vec_dot, "%s: no %s kernels", l->name, ref->name);
#endif
        int bad = 0;
        double worst = 0;
        for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
            const int64_t n = sizes[si];
            const size_t rb = sp_qtype_row_bytes(ft, n), ws = rb + 9, xs = sp_qtype_row_bytes(SP_QTYPE_X8, n) + 12;
            CHECK(sp_qtype_row_bytes(g4[k], n) == rb);
            uint8_t *w = calloc((size_t)max_rows, ws), *wg = calloc((size_t)max_rows, ws);
            uint8_t *x = calloc((size_t)max_tok, xs);
            float *fa = malloc((size_t)n * sizeof *fa), *fb = malloc((size_t)n * sizeof *fb);
            float *y = malloc((size_t)(max_tok * ldy) * sizeof *y), *sv = malloc((size_t)(max_tok * max_rows) * sizeof *sv);
            float *sr = malloc((size_t)(max_tok * max_rows) * sizeof *sr);
            rng_seed(6060 + k * 131 + (uint64_t)n);
            for (int64_t r = 0; r < max_rows; r++) random_row(t, w + (size_t)r * ws, n);
            for (int64_t i = 0; i < max_tok; i++) {
                for (int64_t j = 0; j < n; j++) fa[j] = rng_normal();
                sp_qtraits_ref(SP_QTYPE_X8)->from_float(fa, x + (size_t)i * xs, n);
            }
            memcpy(wg, w, (size_t)max_rows * ws);
            sp_qtype_repack(g4[k], wg, max_rows, n, ws);
            { /* the inverse gives the file blocks back, byte for byte (a stored layout's fallback) */
                uint8_t *wu = malloc((size_t)max_rows * ws);
                memcpy(wu, wg, (size_t)max_rows * ws);
                sp_qtype_unrepack(g4[k], wu, max_rows, n, ws);
                CHECKF(memcmp(wu, w, (size_t)max_rows * ws) == 0, "%s: un-repacked rows of %lld differ from %s's",
                       ref->name, (long long)n, fr->name);
                free(wu);
            }
            const int64_t ntk = n <= 768 ? max_tok : 5; /* two token groups on the short rows only (ASan time) */
            for (int64_t r = 0; r < max_rows; r++) {
                const uint8_t *wr = w + (size_t)r * ws, *gr = wg + (size_t)r * ws;
                CHECK(memcmp(wg + (size_t)r * ws + rb, w + (size_t)r * ws + rb, ws - rb) == 0); /* row gaps untouched */
                fr->to_float(wr, fa, n);
                ref->to_float(gr, fb, n);
                if (memcmp(fa, fb, (size_t)n * sizeof *fa) && bad++ < 3)
                    fprintf(stderr, "%s to_float n %lld row %lld differs from %s\n", ref->name, (long long)n, (long long)r, fr->name);
                for (int64_t i = 0; i < ntk; i++) {
                    const uint8_t *xi = x + (size_t)i * xs;
                    float a = 0, b = 0, c = 0;
                    fr->vec_dot(n, &a, wr, xi);
                    ref->vec_dot(n, &b, gr, xi);
                    sr[i * max_rows + r] = b;
                    double err = 0;
                    if (i < 3) { /* the level's vec_dot: a few tokens are enough */
                        got->vec_dot(n, &c, gr, xi);
                        sv[i * max_rows + r] = c;
                        double mag;
                        (void)dot_float(t, wr, xi, n, fa, fb, &mag);
                        err = fabs((double)c - a) / mag;
                        worst = fmax(worst, err);
                    }
                    if ((b != a || err > TOL_DOT_SIMD) && bad++ < 3)
                        fprintf(stderr, "%s %s vec_dot n %lld row %lld: ref %.9g got %.9g, %s %.9g\n", l->name,
                                ref->name, (long long)n, (long long)r, b, c, fr->name, a);
                }
            }
            for (size_t ri = 0; ri < SP_ARRAY_LEN(rows) && got->gemm; ri++) {
                for (size_t ti = 0; ti < SP_ARRAY_LEN(toks) && toks[ti] <= ntk; ti++) {
                    const int64_t nr = rows[ri], nt = toks[ti];
                    bad += gemm_fenced(got, ref->name, n, wg, ws, nr, x, xs, nt, y, ldy, max_tok);
                    for (int64_t i = 0; i < nt; i++) {
                        for (int64_t r = 0; r < nr; r++) {
                            const float v = y[i * ldy + r];
                            if (v != (nt == 1 ? sv : sr)[i * max_rows + r] && bad++ < 3)
                                fprintf(stderr, "%s %s gemm n %lld rows %lld tok %lld: y[%lld][%lld] %.9g\n", l->name,
                                        ref->name, (long long)n, (long long)nr, (long long)nt, (long long)i,
                                        (long long)r, v);
                        }
                    }
                }
            }
            free(w);
            free(wg);
            free(x);
            free(fa);
            free(fb);
            free(y);
            free(sv);
            free(sr);
        }
        CHECKF(bad == 0, "%s %s: %d values differ", l->name, ref->name, bad);
        printf("  %-8s %-11s to_float and reference dot: %s's bits; vec_dot worst rel err %.2e; gemm: vec_dot's bits "
               "(1 token), the reference's (batches)\n",
               l->name, ref->name, fr->name, worst);
    }
}

/* ---- the model's ops on padded rows ------------------------------------------------ */

static void test_matmul(void) {
    static const int64_t sizes[] = {172, 200, 33};
    const int64_t n_rows = 20, n_tok = 3;
    for (size_t si = 0; si < SP_ARRAY_LEN(sizes); si++) {
        const int64_t n = sizes[si];
        float *wf = malloc((size_t)(n * n_rows) * sizeof *wf), *x = malloc((size_t)(n * n_tok) * sizeof *x);
        float *wd = malloc((size_t)n * sizeof *wd), *y = malloc((size_t)(n_rows * n_tok) * sizeof *y);
        rng_seed(600 + (uint64_t)n);
        for (int64_t i = 0; i < n * n_rows; i++) wf[i] = rng_normal();
        for (int64_t i = 0; i < n * n_tok; i++) x[i] = rng_normal();
        const size_t act = sp_act_bytes(n, n_tok);
        CHECK(act >= sp_qtype_row_bytes(SP_QTYPE_X8, n) * (size_t)n_tok);
        uint8_t *buf = malloc(act);
        for (int k = 0; k < N_TYPES; k += 3) {
            const struct ntype *t = &types[k];
            const size_t rb = sp_qtype_row_bytes(t->id, n);
            uint8_t *w = malloc(rb * (size_t)n_rows);
            sp_quantize_rows(t->id, wf, n_rows, n, NULL, w);
            size_t stride;
            const void *xc = sp_act_convert(t->id, x, n, n, n_tok, buf, &stride);
            CHECK(stride == sp_qtype_row_bytes(SP_QTYPE_X8, n));
            sp_matmul(NULL, t->id, w, n, n_rows, xc, stride, n_tok, y, n_rows);
            double worst = 0;
            for (int64_t r = 0; r < n_rows; r++) {
                sp_qtraits_ref(t->id)->to_float(w + (size_t)r * rb, wd, n);
                for (int64_t i = 0; i < n_tok; i++) {
                    double s = 0, m = 0;
                    for (int64_t j = 0; j < n; j++) {
                        s += (double)wd[j] * x[i * n + j];
                        m += fabs((double)wd[j] * x[i * n + j]);
                    }
                    worst = fmax(worst, fabs(y[i * n_rows + r] - s) / m);
                }
            }
            CHECKF(worst <= TOL_MATMUL_FLOAT, "%s n %lld: sp_matmul vs float rel %.3g", t->name, (long long)n, worst);
            free(w);
        }
        free(buf);
        free(wf);
        free(x);
        free(wd);
        free(y);
    }
}

/* ---- sp_quantize_rows for ggml types ----------------------------------------------- */

static void test_quantize_ggml(void) {
    const int64_t n = 512;
    float *x = malloc((size_t)(n * 2) * sizeof *x);
    rng_seed(8);
    for (int64_t i = 0; i < n * 2; i++) x[i] = rng_normal();
    static const uint32_t ts[] = {SP_QTYPE_F32, SP_QTYPE_F16, SP_QTYPE_BF16, SP_QTYPE_Q4_0, SP_QTYPE_Q5_1,
                                  SP_QTYPE_Q8_0, SP_QTYPE_Q4_K, SP_QTYPE_Q6_K};
    for (size_t k = 0; k < SP_ARRAY_LEN(ts); k++) {
        const size_t rb = sp_qtype_row_bytes(ts[k], n);
        uint8_t *a = malloc(rb * 2), *b = malloc(rb * 2);
        CHECK(sp_quantize_rows(ts[k], x, 2, n, NULL, a) == SP_OK);
        sp_qtraits_ref(ts[k])->from_float(x, b, n);
        sp_qtraits_ref(ts[k])->from_float(x + n, b + rb, n);
        CHECKF(memcmp(a, b, rb * 2) == 0, "%s: sp_quantize_rows differs from the reference from_float", sp_qtype_name(ts[k]));
        free(a);
        free(b);
    }
    uint8_t dst[1024];
    CHECK(sp_quantize_rows(SP_QTYPE_Q4_K, x, 1, 200, NULL, dst) == SP_E_INVALID);
    CHECK(sp_quantize_rows(SP_QTYPE_Q4_0, x, 1, 33, NULL, dst) == SP_E_INVALID);
    CHECK(sp_quantize_rows(4, x, 1, 32, NULL, dst) == SP_E_UNSUPPORTED);
    CHECK(sp_quantize_rows(1030, x, 1, 32, NULL, dst) == SP_E_UNSUPPORTED);
    CHECK(sp_quantize_rows(types[0].id, x, 1, 0, NULL, dst) == SP_E_INVALID);
    CHECK(sp_quantize_rows(types[0].id, x, -1, 32, NULL, dst) == SP_E_INVALID);
    CHECK(sp_quantize_rows(types[0].id, x, 0, 32, NULL, dst) == SP_OK);
    free(x);
}

/* ---- real weights: stories260K ---------------------------------------------------------
 * Every 2-D F32 tensor of the F32 GGUF (FFN rows of 172 use padded blocks)
 * quantized in memory, dequantized, and the error summed per type. */

static void test_stories260k(void) {
    const char *path = need_fixture("models/stories260K/stories260K-f32.gguf");
    if (!path) return;
    struct sp_model_file *mf = NULL;
    CHECK(sp_model_file_open(path, NULL, false, &mf) == SP_OK);
    if (!mf) return;
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    static const char *const names[] = {"i8_b32", "i6_b64", "i4_b32", "i4_b64", "i4_b128_e8", "i4a_b64", "i3_b64", "i3a_b64"};
    /* relative RMS bounds: measured + ~15% (same order as names) */
    static const double bound[] = {0.0058, 0.025, 0.093, 0.104, 0.131, 0.096, 0.21, 0.20};
    double err[SP_ARRAY_LEN(names)] = {0}, ref = 0;
    uint64_t n_params = 0, bytes[SP_ARRAY_LEN(names)] = {0};
    int n_padded = 0;
    for (uint32_t i = 0; i < mf->n_tensors && fp; i++) {
        const struct sp_tensor_desc *td = &mf->tensors[i];
        if (td->type != SP_QTYPE_F32 || td->n_dims < 2) continue;
        const int64_t n = td->ne[0], rows = (int64_t)(td->size / 4) / n;
        float *x = malloc(td->size), *y = malloc((size_t)n * sizeof *y);
        CHECK(fseek(fp, (long)td->offset, SEEK_SET) == 0 && fread(x, 1, td->size, fp) == td->size);
        n_padded += n % 32 != 0;
        n_params += (uint64_t)(n * rows);
        for (int64_t j = 0; j < n * rows; j++) ref += (double)x[j] * x[j];
        for (size_t k = 0; k < SP_ARRAY_LEN(names); k++) {
            const uint32_t t = (uint32_t)sp_qtype_from_name(names[k]);
            const size_t rb = sp_qtype_row_bytes(t, n);
            uint8_t *q = malloc(rb * (size_t)rows);
            CHECK(sp_quantize_rows(t, x, rows, n, NULL, q) == SP_OK);
            bytes[k] += rb * (uint64_t)rows;
            for (int64_t r = 0; r < rows; r++) {
                sp_qtraits_get(t)->to_float(q + (size_t)r * rb, y, n);
                for (int64_t j = 0; j < n; j++) err[k] += (double)(x[r * n + j] - y[j]) * (x[r * n + j] - y[j]);
            }
            free(q);
        }
        free(x);
        free(y);
    }
    if (fp) fclose(fp);
    CHECKF(n_padded >= 5, "expected the FFN-down tensors (rows of 172) among the weights, found %d padded", n_padded);
    printf("stories260K, %llu weights in 2-D tensors (%d with padded rows):\n", (unsigned long long)n_params, n_padded);
    for (size_t k = 0; k < SP_ARRAY_LEN(names); k++) {
        const double rel = sqrt(err[k] / ref);
        printf("  %-11s %.3f bpw  rel RMS %.4f (<= %.4f)\n", names[k], 8.0 * (double)bytes[k] / (double)n_params, rel,
               bound[k]);
        CHECKF(rel <= bound[k], "stories260K %s: rel RMS %.4f > %.4f", names[k], rel, bound[k]);
    }
    sp_model_file_free(mf);
}

/* sp_native_pack_block: given codes, scale and min, every type decodes to
 * d * q (+ m) with d and m as stored, out-of-range codes are clamped, and a
 * padded block's tail decodes to (about) zero. */
static void test_pack(void) {
    for (int k = 0; k < N_TYPES; k++) {
        const struct ntype *t = &types[k];
        const bool u = t->asym || t->nl; /* unsigned codes */
        const int lo = u ? 0 : -(1 << (t->bits - 1)), hi = u ? (1 << t->bits) - 1 : (1 << (t->bits - 1)) - 1;
        const int nv = t->block - 5; /* a padded block */
        int32_t code[128];
        for (int i = 0; i < nv; i++) code[i] = lo + (i * 7) % (hi - lo + 3) - 1; /* a few outside [lo, hi] */
        const float d = t->e8 ? 0.0078125f : t->l8 ? spec_l8(100, spec_l8_shift(t)) : 0.0123f, m = t->asym ? -0.09f : 0.0f;
        uint8_t blk[256];
        float out[128];
        CHECK(sp_native_pack_block(t->id, code, nv, d, m, blk) == SP_OK);
        sp_qtraits_ref(t->id)->to_float(blk, out, t->block);
        const float ds = t->e8 || t->l8 ? d : sp_fp16_to_fp32(sp_fp32_to_fp16(d)), ms = sp_fp16_to_fp32(sp_fp32_to_fp16(m));
        bool ok = true;
        for (int i = 0; i < nv; i++) {
            const int q = code[i] < lo ? lo : code[i] > hi ? hi : code[i];
            ok &= out[i] == (t->asym ? ds * (float)q + ms : t->nl ? ds * (float)sp_native_nl4[q] : ds * (float)q);
        }
        /* the tail: the code nearest zero (the non-uniform kind's is 1) */
        for (int i = nv; i < t->block; i++) ok &= fabsf(out[i]) <= (t->nl ? 1.0f : 0.5f) * ds;
        CHECKF(ok, "%s: packed block does not decode to its codes", t->name);
    }
    CHECK(sp_native_pack_block(SP_QTYPE_Q8_0, NULL, 0, 1.0f, 0.0f, NULL) == SP_E_INVALID);
}

int main(void) {
    sp_quant_init();
    test_pack();
    test_names();
    test_layouts();
    test_roundtrip();
    test_fast();
    test_padded();
    test_e8m0();
    test_l8();
    test_importance();
    test_x8();
    test_ref_dot();
    setup_levels();
    for (int i = 0; i < n_levels; i++) {
        if (!levels[i].have) continue;
        test_simd_x8(&levels[i]);
        test_simd_dot(&levels[i]);
        test_simd_gemm(&levels[i]);
        test_simd_g4(&levels[i]);
    }
    test_matmul();
    test_quantize_ggml();
    test_stories260k();
    return test_report("test_native");
}
