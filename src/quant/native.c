/*
 * native.c -- Sparrow's native block types (native.h; docs/FORMAT.md is the
 * byte-level spec): the id/name/layout table, the plain-C reference kernels
 * (to_float, vec_dot against x8_b128 activations, the x8_b128 activation
 * quantizer) and the weight quantizers behind sp_quantize_rows().
 *
 * The reference kernels are the specification and the test oracle of the
 * SIMD variants (x86/native_kernels.inc, arm/native_kernels.h); they favour
 * clarity over speed.  Rows need not fill their last block: weights and
 * activations are zero-padded, and to_float writes exactly n values.
 *
 * The weight quantizers are deterministic (no randomness, a fixed float
 * evaluation order): symmetric FP16 scales come from a small grid search
 * around max|x| / 2^(bits-1) with a least-squares refit, E8M0 scales from the
 * nearest powers of two, asymmetric (d, m) from a few starting ranges each
 * refined by weighted least squares.  Not here: threading, calibration.
 */
#include "native.h"

#include "quant.h"

#include <assert.h>
#include <math.h>
#include <stdalign.h>
#include <string.h>
#include <strings.h>

static_assert(sizeof(struct sp_x8_run) == 40 && sizeof(struct sp_block_x8) == 160, "x8_b128 block size");
static_assert(SP_QTYPE_X8 < SP_QTYPE_NATIVE_FIRST + SP_QTYPE_NATIVE_COUNT, "x8 id in range");

/* ========================================================================
 * Layouts
 * ======================================================================== */

#define KIND_BITS(k) SP_NATIVE_KIND_BITS(k)
#define KIND_ASYM(k) SP_NATIVE_KIND_ASYM(k)
#define KIND_NL(k) SP_NATIVE_KIND_NL(k)
#define BLK_ELEMS(b) (32 << (b))
#define HEAD_BYTES(k, sc) (KIND_ASYM(k) ? 4 : SP_NATIVE_SCALE_BYTES(sc))

#define LAYOUT_ENTRY(name, K, BL, SC)                                                                                  \
    [SP_NATIVE_ID(K, BL, SC) - SP_QTYPE_NATIVE_FIRST] = {                                                              \
        .kind = K, .bits = KIND_BITS(K), .asym = KIND_ASYM(K), .nl = KIND_NL(K), .e8 = (SC) == SP_NS_E8,               \
        .l8 = (SC) == SP_NS_L8, .l8_shift = SP_NATIVE_L8_SHIFT(K), .block = BLK_ELEMS(BL), .head = HEAD_BYTES(K, SC),   \
        .bytes = HEAD_BYTES(K, SC) + BLK_ELEMS(BL) * KIND_BITS(K) / 8},
static const struct sp_native_layout layouts[SP_QTYPE_NATIVE_COUNT] = {SP_NATIVE_TYPES(LAYOUT_ENTRY)};

/* Lloyd's algorithm on 640k Gaussian weights in blocks of 32, alternating
 * each block's least-squares scale (over both signs) and the levels as
 * centroids, scaled to put the lowest at -127 and rounded (docs/FORMAT.md).
 * Against INT4 at the same block and scale search: 19% less squared error
 * on Gaussian weights, 21% on stories260K's, 40% on Student-t(5) ones. */
const int8_t sp_native_nl4[16] = {-127, -99, -79, -62, -48, -35, -23, -11, 1, 13, 24, 36, 50, 65, 83, 105};

const struct sp_native_layout *sp_native_layout(uint32_t t) {
    if (t < SP_QTYPE_NATIVE_FIRST || t - SP_QTYPE_NATIVE_FIRST >= SP_QTYPE_NATIVE_COUNT) return NULL;
    const struct sp_native_layout *l = &layouts[t - SP_QTYPE_NATIVE_FIRST];
    return l->block ? l : NULL;
}

/* ---- bit planes -----------------------------------------------------------
 * A w-bit plane of a block of B elements is P = B * w / 8 bytes; element
 * k * P + j (j < P) is bits [w k, w k + w) of byte j. */

static inline unsigned plane_get(const uint8_t *p, int w, int B, int i) {
    const int P = B * w / 8;
    return (p[i % P] >> (w * (i / P))) & ((1u << w) - 1);
}

static inline void plane_set(uint8_t *p, int w, int B, int i, unsigned v) {
    const int P = B * w / 8, sh = w * (i / P);
    p[i % P] = (uint8_t)((p[i % P] & ~(((1u << w) - 1) << sh)) | (v << sh));
}

/* The unsigned code u of element i (INT8: the byte, as two's complement q). */
static inline unsigned code_get(const struct sp_native_layout *L, const uint8_t *planes, int i) {
    const int B = L->block;
    switch (L->bits) {
    case 3: return plane_get(planes, 2, B, i) | plane_get(planes + B / 4, 1, B, i) << 2;
    case 4: return plane_get(planes, 4, B, i);
    case 6: return plane_get(planes, 4, B, i) | plane_get(planes + B / 2, 2, B, i) << 4;
    default: return planes[i];
    }
}

static inline void code_set(const struct sp_native_layout *L, uint8_t *planes, int i, unsigned u) {
    const int B = L->block;
    switch (L->bits) {
    case 3:
        plane_set(planes, 2, B, i, u & 3);
        plane_set(planes + B / 4, 1, B, i, u >> 2);
        break;
    case 4: plane_set(planes, 4, B, i, u); break;
    case 6:
        plane_set(planes, 4, B, i, u & 15);
        plane_set(planes + B / 2, 2, B, i, u >> 4);
        break;
    default: planes[i] = (uint8_t)u; break;
    }
}

/* Signed value q of element i: u - 2^(bits-1) for the symmetric kinds, u for
 * the asymmetric ones, the int8 for INT8, the level for the non-uniform. */
static inline int q_get(const struct sp_native_layout *L, const uint8_t *planes, int i) {
    const unsigned u = code_get(L, planes, i);
    if (L->asym) return (int)u;
    if (L->nl) return sp_native_nl4[u & 15];
    if (L->bits == 8) return (int8_t)u;
    return (int)u - (1 << (L->bits - 1));
}

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Block scale d (and min m for the asymmetric kinds, else 0). */
static inline float block_d(const struct sp_native_layout *L, const uint8_t *blk) {
    return L->e8 ? sp_e8m0_to_fp32(blk[0]) : L->l8 ? sp_l8_to_fp32(blk[0], L->l8_shift) : sp_fp16_to_fp32(rd16(blk));
}

float sp_native_scale_get(const struct sp_native_layout *L, const void *blk) {
    return block_d(L, blk);
}

uint8_t sp_fp32_to_l8(float d, int sh) {
    const float a = fabsf(d);
    if (!(a > 0)) return 0; /* 0 or NaN */
    const uint8_t sign = d < 0 ? 128 : 0;
    /* log2 picks the neighbourhood; the linear distance to the two
     * neighbours decides, so libm's last bit cannot change the byte */
    long m0 = isfinite(a) ? lrintf(8.0f * (log2f(a) - (float)sh)) + 144 : 127;
    m0 = m0 < 1 ? 1 : m0 > 127 ? 127 : m0;
    uint8_t best = (uint8_t)m0;
    for (long m = m0 - 1; m <= m0 + 1; m += 2) {
        if (m < 1 || m > 127) continue;
        if (fabsf(sp_l8_to_fp32((uint8_t)m, sh) - a) < fabsf(sp_l8_to_fp32(best, sh) - a)) best = (uint8_t)m;
    }
    return (uint8_t)(sign | best);
}

float sp_native_reach(const struct sp_native_layout *L) {
    const float qmax = L->nl ? 127.0f : (float)(1 << (L->bits - 1));
    if (L->l8) return sp_l8_to_fp32(127, L->l8_shift) * qmax;
    if (L->e8) return sp_e8m0_to_fp32(254) * qmax;
    return INFINITY;
}

float sp_native_scale_round(const struct sp_native_layout *L, float d) {
    if (L->l8) return sp_l8_to_fp32(sp_fp32_to_l8(d, L->l8_shift), L->l8_shift);
    if (!L->e8) return sp_fp16_to_fp32(sp_fp32_to_fp16(d));
    if (!(d > 0) || !isfinite(d)) return 0.0f;
    int e;
    const float fr = frexpf(d, &e); /* d = fr 2^e, fr in [0.5, 1) */
    if (fr > 0.70710678f) e++;      /* nearest power of two in the log domain */
    e -= 1;                         /* 2^e as the E8M0 byte e + 127 */
    if (e < -126) e = -126;
    if (e > 127) e = 127;
    return ldexpf(1.0f, e);
}

static inline float block_m(const struct sp_native_layout *L, const uint8_t *blk) {
    return L->asym ? sp_fp16_to_fp32(rd16(blk + 2)) : 0.0f;
}

/* ========================================================================
 * Reference kernels
 * ======================================================================== */

/* x[i] = d * q for i < n (symmetric), d * u + m (asymmetric). */
static void native_to_float(const struct sp_native_layout *L, const void *restrict src, float *restrict dst,
                            int64_t n) {
    const uint8_t *p = src;
    for (int64_t i0 = 0; i0 < n; i0 += L->block, p += L->bytes) {
        const float d = block_d(L, p), m = block_m(L, p);
        const int64_t nv = SP_MIN((int64_t)L->block, n - i0);
        for (int i = 0; i < nv; i++) {
            const float q = (float)q_get(L, p + L->head, i);
            dst[i0 + i] = L->asym ? d * q + m : d * q;
        }
    }
}

/* Per weight block b, in order: for each of its 32-element runs j (one
 * activation block each), sum += (d_w * d_x,j) * isum_j with isum_j the
 * exact int32 sum of q_w * q_x over the run; then, asymmetric kinds only,
 * sum += m_w * (s_x,0 + s_x,1 + ...) (the activation blocks' scaled sums,
 * added in order). */
static float native_dot_acc(const struct sp_native_layout *L, int64_t n, float sum, const uint8_t *p,
                            const struct sp_x8_run *a) {
    const int B = L->block;
    for (int64_t i0 = 0; i0 < n; i0 += B, p += L->bytes) {
        const float d = block_d(L, p);
        float sx = 0;
        for (int j = 0; j < B / SP_QR_X8; j++, a++) {
            int32_t isum = 0;
            for (int i = 0; i < SP_QR_X8; i++) isum += q_get(L, p + L->head, SP_QR_X8 * j + i) * a->qs[i];
            sum += (d * a->d) * (float)isum;
            sx = j ? sx + a->s : a->s;
        }
        if (L->asym) sum += block_m(L, p) * sx;
    }
    return sum;
}

static void native_vec_dot(const struct sp_native_layout *L, int64_t n, float *restrict s, const void *restrict w,
                           const void *restrict x) {
    *s = native_dot_acc(L, n, 0.0f, w, x); /* a row of activations is a sequence of runs */
}

/* ---- resident g4 layouts (native.h) ---------------------------------------
 * A group is a permutation of its 4 file blocks' bytes (and, for INT3, of
 * the bits of their 1-bit planes): g4_pack / g4_unpack, and the reference
 * reads a group by unpacking it. */

#define G4_BLOCKS (SP_QK_G4 / 64)
#define G4_MAX_BYTES (G4_BLOCKS * (2 + 8 * 6)) /* a group of INT6, the widest */

/* 4 file blocks (2 + 8 * bits bytes each) -> group g. */
static void g4_pack(int bits, const uint8_t *blk, uint8_t *g) {
    const int bb = 2 + 8 * bits, nch = bits == 3 ? 1 : bits / 2;
    for (int k = 0; k < G4_BLOCKS; k++) memcpy(g + 2 * k, blk + k * bb, 2);
    for (int pr = 0; pr < 2; pr++) {
        uint8_t *q = g + 2 * G4_BLOCKS + 16 * bits * pr;
        const uint8_t *a = blk + pr * bb + 2, *b = blk + (pr + 2) * bb + 2;
        for (int c = 0; c < nch; c++) {
            memcpy(q + 32 * c, a + 16 * c, 16);
            memcpy(q + 32 * c + 16, b + 16 * c, 16);
        }
        if (bits != 3) continue;
        /* file: element 16f + j's high bit is bit 2f + j / 8 of byte j % 8 */
        for (int j = 0; j < 16; j++) {
            unsigned v = 0;
            for (int f = 0; f < 4; f++) {
                const int sh = 2 * f + j / 8;
                v |= ((a[16 + j % 8] >> sh) & 1u) << (2 * f) | ((b[16 + j % 8] >> sh) & 1u) << (2 * f + 1);
            }
            q[32 + j] = (uint8_t)v;
        }
    }
}

/* Group g -> its 4 file blocks. */
static void g4_unpack(int bits, const uint8_t *g, uint8_t *blk) {
    const int bb = 2 + 8 * bits, nch = bits == 3 ? 1 : bits / 2;
    for (int k = 0; k < G4_BLOCKS; k++) memcpy(blk + k * bb, g + 2 * k, 2);
    for (int pr = 0; pr < 2; pr++) {
        const uint8_t *q = g + 2 * G4_BLOCKS + 16 * bits * pr;
        uint8_t *a = blk + pr * bb + 2, *b = blk + (pr + 2) * bb + 2;
        for (int c = 0; c < nch; c++) {
            memcpy(a + 16 * c, q + 32 * c, 16);
            memcpy(b + 16 * c, q + 32 * c + 16, 16);
        }
        if (bits != 3) continue;
        memset(a + 16, 0, 8);
        memset(b + 16, 0, 8);
        for (int j = 0; j < 16; j++) {
            for (int f = 0; f < 4; f++) {
                const int sh = 2 * f + j / 8;
                a[16 + j % 8] |= (uint8_t)(((q[32 + j] >> (2 * f)) & 1u) << sh);
                b[16 + j % 8] |= (uint8_t)(((q[32 + j] >> (2 * f + 1)) & 1u) << sh);
            }
        }
    }
}

static const struct sp_native_layout *g4_file(int bits) {
    const enum sp_native_kind k = bits == 3 ? SP_NK_I3 : bits == 4 ? SP_NK_I4 : SP_NK_I6;
    return &layouts[SP_NATIVE_ID(k, 1, SP_NS_F16) - SP_QTYPE_NATIVE_FIRST];
}

/* Bytes of a group: those of its 4 file blocks. */
static size_t g4_bytes(int bits) {
    return (size_t)G4_BLOCKS * g4_file(bits)->bytes;
}

/* Rows of the file type regrouped in place: into groups (pack), or back. */
static void g4_regroup(int bits, bool pack, void *rows, int64_t n_rows, int64_t n, size_t stride) {
    const size_t gb = g4_bytes(bits);
    uint8_t tmp[G4_MAX_BYTES];
    assert(n % SP_QK_G4 == 0);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *g = (uint8_t *)rows + (size_t)r * stride;
        for (int64_t i = 0; i < n / SP_QK_G4; i++, g += gb) {
            memcpy(tmp, g, gb);
            if (pack) g4_pack(bits, tmp, g);
            else g4_unpack(bits, tmp, g);
        }
    }
}

static void g4_to_float(int bits, const void *restrict src, float *restrict dst, int64_t n) {
    const size_t gb = g4_bytes(bits);
    uint8_t tmp[G4_MAX_BYTES];
    assert(n % SP_QK_G4 == 0);
    const uint8_t *g = src;
    for (int64_t i = 0; i < n / SP_QK_G4; i++, g += gb, dst += SP_QK_G4) {
        g4_unpack(bits, g, tmp);
        native_to_float(g4_file(bits), tmp, dst, SP_QK_G4);
    }
}

/* The file type's reference order: one running sum over the row's blocks. */
static void g4_vec_dot(int bits, int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {
    const size_t gb = g4_bytes(bits);
    uint8_t tmp[G4_MAX_BYTES];
    assert(n % SP_QK_G4 == 0);
    const uint8_t *g = w;
    const struct sp_x8_run *a = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SP_QK_G4; i++, g += gb, a += SP_QK_G4 / SP_QR_X8) {
        g4_unpack(bits, g, tmp);
        sum = native_dot_acc(g4_file(bits), SP_QK_G4, sum, tmp, a);
    }
    *s = sum;
}

#define G4_FNS(b)                                                                                                    \
    void sp_native_g4_repack_i##b(void *rows, int64_t n_rows, int64_t n, size_t stride) {                           \
        g4_regroup(b, true, rows, n_rows, n, stride);                                                                   \
    }                                                                                                              \
    void sp_native_g4_unrepack_i##b(void *rows, int64_t n_rows, int64_t n, size_t stride) {                         \
        g4_regroup(b, false, rows, n_rows, n, stride);                                                                   \
    }                                                                                                              \
    void sp_native_g4_to_float_i##b(const void *restrict src, float *restrict dst, int64_t n) {                    \
        g4_to_float(b, src, dst, n);                                                                                \
    }                                                                                                              \
    void sp_native_g4_vec_dot_i##b(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) { \
        g4_vec_dot(b, n, s, w, x);                                                                                  \
    }
G4_FNS(3)
G4_FNS(4)
G4_FNS(6)

/* ---- x8_b128 activations ------------------------------------------------ */

/* Round to nearest, ties to even; +-2^30 saturation and NaN -> -2^30 keep the
 * clamps that follow defined on garbage input. */
static inline int round_even(float v) {
    if (!(v > -1073741824.0f && v < 1073741824.0f)) return v > 0 ? 1073741824 : -1073741824;
    return (int)rintf(v);
}

/* Per run of 32: d = amax / 127, q = round_even(x * (127 / amax)) clamped to
 * +-127 (NaN gives -127), s = d * sum(q); elements past n are 0 up to the
 * end of the last 128-block.  NaN is ignored by amax; a run with amax below
 * 2^-100 (zero, subnormal) is stored as zeros (d = 0), so 127 / amax never
 * overflows. */
void sp_x8_from_float_ref(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_x8_run *y = dst;
    const int64_t n_runs = (n + SP_QK_X8 - 1) / SP_QK_X8 * (SP_QK_X8 / SP_QR_X8);
    for (int64_t r = 0; r < n_runs; r++, y++) {
        const int64_t i0 = r * SP_QR_X8, nv = SP_MAX((int64_t)0, SP_MIN((int64_t)SP_QR_X8, n - i0));
        float amax = 0;
        for (int64_t i = 0; i < nv; i++) {
            const float a = fabsf(src[i0 + i]);
            if (a > amax) amax = a; /* NaN is skipped (as max_ps(|x|, m) does) */
        }
        const bool zero = !(amax >= 0x1p-100f);
        const float id = zero ? 0.0f : 127.f / amax;
        y->d = zero ? 0.0f : amax / 127.f;
        int sum = 0;
        for (int i = 0; i < SP_QR_X8; i++) {
            const int q = i < nv && !zero ? round_even(src[i0 + i] * id) : 0;
            y->qs[i] = (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
            sum += y->qs[i];
        }
        y->s = y->d * (float)sum;
    }
}

static void x8_to_float(const void *restrict src, float *restrict dst, int64_t n) {
    const struct sp_x8_run *y = src;
    for (int64_t i = 0; i < n; i++) dst[i] = y[i / SP_QR_X8].d * (float)y[i / SP_QR_X8].qs[i % SP_QR_X8];
}

/* ========================================================================
 * Weight quantizers
 * ======================================================================== */

/* v clamped to [lo, hi], NaN -> lo (two branch-free max / min). */
static inline float clampf(float v, float lo, float hi) {
    const float a = v > lo ? v : lo;
    return a < hi ? a : hi;
}

/* Nearest integer to v clamped to [lo, hi] (|lo|, |hi| < 2^22), ties to
 * even, as a float: adding and removing 1.5 * 2^23 rounds in the default FP
 * environment without a libm call.  NaN gives lo. */
static inline float qrf(float v, float lo, float hi) {
    return (clampf(v, lo, hi) + 0x1.8p23f) - 0x1.8p23f;
}

static inline int qround(float v, int lo, int hi) {
    return (int)qrf(v, (float)lo, (float)hi);
}

/* The code value nearest v: an integer in [lo, hi], or for the non-uniform
 * kind (nl) a level of sp_native_nl4. */
static inline float level_round(float v, float lo, float hi, bool nl) {
    return nl ? (float)sp_native_nl4[sp_native_nl4_index(v)] : qrf(v, lo, hi);
}

/* sum_i w_i (x_i - d q_i)^2 for q_i = round(x_i / d) in [lo, hi] (nl: the
 * nearest level); d != 0.  Sums here are float, in element order: blocks are
 * at most 128 long. */
static float sym_err(const float *x, const float *w, int nv, float d, int lo, int hi, bool nl) {
    const float id = 1.0f / d;
    float e[4] = {0, 0, 0, 0}; /* four partial sums (independent chains), i % 4 */
    for (int i = 0; i < nv; i++) {
        const float r = x[i] - d * level_round(x[i] * id, (float)lo, (float)hi, nl);
        e[i & 3] += w[i] * r * r;
    }
    return (e[0] + e[1]) + (e[2] + e[3]);
}

/* For codes q_i = round(x_i * id) in [lo, hi] (nl: levels): the
 * least-squares scale sum w x q / sum w q^2 (0 if all codes are 0); *gain =
 * (sum w x q)^2 / sum w q^2, by which the error drops below sum w x^2. */
static float sym_fit(const float *x, const float *w, int nv, float id, int lo, int hi, bool nl, float *gain) {
    float a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0}; /* partial sums, i % 4 */
    for (int i = 0; i < nv; i++) {
        const float q = level_round(x[i] * id, (float)lo, (float)hi, nl);
        a[i & 3] += w[i] * x[i] * q;
        b[i & 3] += w[i] * q * q;
    }
    const float sxq = (a[0] + a[1]) + (a[2] + a[3]), sqq = (b[0] + b[1]) + (b[2] + b[3]);
    *gain = sqq > 0 ? sxq * sxq / sqq : -1;
    return sqq > 0 ? sxq / sqq : 0;
}

/* The largest magnitude of x[0..nv) (NaNs skipped), *xm the element that
 * has it (0 for an all-zero block). */
static float abs_peak(const float *x, int nv, float *xm) {
    float amax = 0;
    *xm = 0;
    for (int i = 0; i < nv; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            *xm = x[i];
        }
    }
    return amax;
}

/* x[0..nv)'s smallest and largest elements (INFINITY, -INFINITY if nv = 0). */
static void min_max(const float *x, int nv, float *xmin, float *xmax) {
    *xmin = INFINITY;
    *xmax = -INFINITY;
    for (int i = 0; i < nv; i++) {
        *xmin = SP_MIN(*xmin, x[i]);
        *xmax = SP_MAX(*xmax, x[i]);
    }
}

/* Symmetric scale, before its rounding to the header: for each of 13
 * candidates 1/d mapping the element of largest magnitude to -(2^(bits-1) +
 * delta), delta in [-2, 2] by 1/3 (negative d when that element is
 * positive), round the codes and refit d by weighted least squares; keep the
 * best fit and refine it twice.  (A finer or wider grid changed the errors
 * of test_native by < 0.5%.)  The non-uniform kind (nl) tries both ends of
 * its levels, -127 and +105, each scaled by 0.75 ... 1.25 in steps of 1/24. */
static float search_sym(const float *x, const float *w, int nv, int lo, int hi, bool nl) {
    float xm;
    const float amax = abs_peak(x, nv, &xm);
    if (amax == 0 || !isfinite(amax)) return amax == 0 ? 0.0f : xm / (float)lo;
    float best = -1, best_d = xm / (float)lo;
    for (int end = 0; end < (nl ? 2 : 1); end++) {
        for (int k = 0; k <= 12; k++) {
            float gain;
            const float id = nl ? (float)sp_native_nl4[end ? 15 : 0] * (1.0f + (float)(6 - k) / 24.0f) / xm
                                : ((float)lo - 2.0f + (float)k / 3.0f) / xm;
            const float d = sym_fit(x, w, nv, id, lo, hi, nl, &gain);
            if (gain > best) {
                best = gain;
                best_d = d;
            }
        }
    }
    /* refine: re-round against the fitted d and refit, twice (each step
     * lowers the error, for fixed codes and then for fixed d) */
    for (int it = 0; it < 2 && best_d != 0; it++) {
        float gain;
        const float d = sym_fit(x, w, nv, 1.0f / best_d, lo, hi, nl, &gain);
        if (!(gain > 0)) break;
        best_d = d;
    }
    return best_d;
}

/* Symmetric FP16 scale: search_sym's d and its two fp16 neighbours, the
 * best error wins (the rounding moves the optimum a little). */
static uint16_t search_fp16(const float *x, const float *w, int nv, int lo, int hi, bool nl) {
    const uint16_t h = sp_fp32_to_fp16(search_sym(x, w, nv, lo, hi, nl));
    uint16_t best = h;
    const float d = sp_fp16_to_fp32(h);
    float e = d != 0 ? sym_err(x, w, nv, d, lo, hi, nl) : INFINITY;
    for (int s = -1; s <= 1; s += 2) {
        const float dn = sp_fp16_to_fp32((uint16_t)(h + s));
        if (dn == 0 || !isfinite(dn) || (dn > 0) != (d > 0)) continue;
        const float en = sym_err(x, w, nv, dn, lo, hi, nl);
        if (en < e) {
            e = en;
            best = (uint16_t)(h + s);
        }
    }
    return best;
}

/* L8 scale: the same with L8's neighbours, 2^(1/8) apart (the rounding
 * costs more here, so comparing them matters more). */
static uint8_t search_l8(const float *x, const float *w, int nv, int lo, int hi, bool nl, int sh) {
    const uint8_t c = sp_fp32_to_l8(search_sym(x, w, nv, lo, hi, nl), sh);
    uint8_t best = c;
    if (!(c & 127)) return c;
    float e = sym_err(x, w, nv, sp_l8_to_fp32(c, sh), lo, hi, nl);
    for (int s = -1; s <= 1; s += 2) {
        const int m = (c & 127) + s;
        if (m < 1 || m > 127) continue;
        const uint8_t cn = (uint8_t)((c & 128) | m);
        const float en = sym_err(x, w, nv, sp_l8_to_fp32(cn, sh), lo, hi, nl);
        if (en < e) {
            e = en;
            best = cn;
        }
    }
    return best;
}

/* E8M0 scale: the powers of two around amax / 2^(bits-1), best error wins.
 * Returns the exponent byte (0: zero block). */
static uint8_t search_e8(const float *x, const float *w, int nv, int lo, int hi, bool nl) {
    float amax = 0;
    for (int i = 0; i < nv; i++) amax = SP_MAX(amax, fabsf(x[i]));
    if (amax == 0 || !isfinite(amax)) return amax == 0 ? 0 : 254;
    int k0;
    (void)frexpf(amax / (float)hi, &k0); /* amax / hi in [2^(k0-1), 2^k0) */
    float best = INFINITY;
    int best_e = 0;
    for (int k = k0 - 2; k <= k0; k++) {
        const int e = k + 127 < 1 ? 1 : k + 127 > 254 ? 254 : k + 127;
        const float err = sym_err(x, w, nv, sp_e8m0_to_fp32((uint8_t)e), lo, hi, nl);
        if (err < best) {
            best = err;
            best_e = e;
        }
    }
    return (uint8_t)best_e;
}

/* Weighted error of x ~ d * u + m with u = round((x - m) / d) in [0, umax]. */
static float asym_err(const float *x, const float *w, int nv, float d, float m, int umax) {
    float e = 0;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < nv; i++) {
        const float r = x[i] - (d * qrf((x[i] - m) * id, 0.0f, (float)umax) + m);
        e += w[i] * r * r;
    }
    return e;
}

/* Asymmetric (d, m): from several starting ranges [min, min + (umax + t) d],
 * codes are rounded and (d, m) refit by weighted least squares, twice; the
 * best fit after fp16 rounding wins. */
static void search_asym(const float *x, const float *w, int nv, int umax, float *d_out, float *m_out) {
    float xmin, xmax;
    min_max(x, nv, &xmin, &xmax);
    if (!(xmax > xmin) || !isfinite(xmax - xmin)) {
        *d_out = 0;
        *m_out = isfinite(xmin) ? xmin : 0;
        return;
    }
    float sw = 0, sx = 0; /* the same for every fit */
    for (int i = 0; i < nv; i++) {
        sw += w[i];
        sx += w[i] * x[i];
    }
    float best = INFINITY, bd = (xmax - xmin) / (float)umax, bm = xmin;
    for (int t = 0; t <= 6; t++) {
        float d = (xmax - xmin) / ((float)umax - 0.5f + 0.25f * (float)t), m = xmin;
        if (t == 6) m = xmin + 0.5f * (xmax - xmin) / (float)umax, d = (xmax - xmin) / (float)umax; /* centred */
        for (int it = 0; it < 2; it++) {
            const float id = 1.0f / d;
            float su = 0, suu = 0, sux = 0;
            for (int i = 0; i < nv; i++) {
                const float u = qrf((x[i] - m) * id, 0.0f, (float)umax);
                su += w[i] * u;
                suu += w[i] * u * u;
                sux += w[i] * u * x[i];
            }
            /* the 2 x 2 normal equations, solved in double */
            const double det = (double)sw * suu - (double)su * su;
            if (!(det > 0)) break;
            const double nd = ((double)sw * sux - (double)su * sx) / det, nm = ((double)suu * sx - (double)su * sux) / det;
            if (!(nd > 0)) break;
            d = (float)nd;
            m = (float)nm;
        }
        const float d16 = sp_fp16_to_fp32(sp_fp32_to_fp16(d)), m16 = sp_fp16_to_fp32(sp_fp32_to_fp16(m));
        if (!(d16 > 0) || !isfinite(d16) || !isfinite(m16)) continue;
        const float e = asym_err(x, w, nv, d16, m16, umax);
        if (e < best) {
            best = e;
            bd = d16;
            bm = m16;
        }
    }
    *d_out = bd;
    *m_out = bm;
}

/* The one-pass scales (sp_quantize_rows_fast): the symmetric d maps the
 * block's element of largest magnitude to the code range's negative end lo
 * (the non-uniform kind: its level -127), as Q4_0 does; 0 for an all-zero
 * block. */
static float fast_sym(const float *x, int nv, int lo) {
    float xm;
    const float amax = abs_peak(x, nv, &xm);
    return amax == 0 ? 0.0f : xm / (float)lo;
}

/* E8M0: the smallest power of two d with amax / d <= hi. */
static uint8_t fast_e8(const float *x, int nv, int hi) {
    float amax = 0;
    for (int i = 0; i < nv; i++) amax = SP_MAX(amax, fabsf(x[i]));
    if (amax == 0 || !isfinite(amax)) return amax == 0 ? 0 : 254;
    int k0;
    (void)frexpf(amax / (float)hi, &k0); /* amax / hi in [2^(k0-1), 2^k0) */
    return (uint8_t)(k0 + 127 < 1 ? 1 : k0 + 127 > 254 ? 254 : k0 + 127);
}

/* L8: the nearest code to d, one step larger in magnitude where the nearest
 * is smaller (then the largest element would clip). */
static uint8_t fast_l8(float d, int sh) {
    uint8_t c = sp_fp32_to_l8(d, sh);
    if ((c & 127) && (c & 127) < 127 && fabsf(sp_l8_to_fp32(c, sh)) < fabsf(d)) c++;
    return c;
}

/* Asymmetric: the block's [min, max] in umax steps. */
static void fast_asym(const float *x, int nv, int umax, float *d_out, float *m_out) {
    float xmin, xmax;
    min_max(x, nv, &xmin, &xmax);
    const bool ok = xmax > xmin && isfinite(xmax - xmin);
    *d_out = ok ? (xmax - xmin) / (float)umax : 0.0f;
    *m_out = isfinite(xmin) ? xmin : 0.0f;
}

/* One block: x[0..nv) with importance w[0..nv) (nv <= block; the rest is
 * padding, stored as code 0 value), into blk; fast: the one-pass scales
 * above instead of the searches (w unused: may be NULL). */
static void quantize_block(const struct sp_native_layout *L, const float *x, const float *w, int nv, bool fast,
                           uint8_t *blk) {
    memset(blk, 0, L->bytes);
    uint8_t *planes = blk + L->head;
    const int B = L->block;
    if (L->asym) {
        const int umax = (1 << L->bits) - 1;
        float d, m;
        if (fast) fast_asym(x, nv, umax, &d, &m);
        else search_asym(x, w, nv, umax, &d, &m);
        const uint16_t dh = sp_fp32_to_fp16(d), mh = sp_fp32_to_fp16(m);
        memcpy(blk, &dh, 2);
        memcpy(blk + 2, &mh, 2);
        const float df = sp_fp16_to_fp32(dh), mf = sp_fp16_to_fp32(mh), id = df != 0 ? 1.0f / df : 0.0f;
        for (int i = 0; i < B; i++) code_set(L, planes, i, (unsigned)qround(i < nv ? (x[i] - mf) * id : -mf * id, 0, umax));
        return;
    }
    /* the non-uniform kind's range in units of d, for the starting scales */
    const int lo = L->nl ? -127 : -(1 << (L->bits - 1)), hi = L->nl ? 127 : (1 << (L->bits - 1)) - 1;
    float d;
    if (L->e8) {
        blk[0] = fast ? fast_e8(x, nv, hi) : search_e8(x, w, nv, lo, hi, L->nl);
    } else if (L->l8) {
        blk[0] = fast ? fast_l8(fast_sym(x, nv, lo), L->l8_shift) : search_l8(x, w, nv, lo, hi, L->nl, L->l8_shift);
    } else {
        const uint16_t dh = fast ? sp_fp32_to_fp16(fast_sym(x, nv, lo)) : search_fp16(x, w, nv, lo, hi, L->nl);
        memcpy(blk, &dh, 2);
    }
    d = block_d(L, blk);
    const float id = d != 0 && isfinite(d) ? 1.0f / d : 0.0f;
    for (int i = 0; i < B; i++) {
        if (L->nl) {
            code_set(L, planes, i, (unsigned)sp_native_nl4_index(i < nv ? x[i] * id : 0.0f));
            continue;
        }
        const int q = i < nv ? qround(x[i] * id, lo, hi) : 0;
        code_set(L, planes, i, L->bits == 8 ? (unsigned)(uint8_t)(int8_t)q : (unsigned)(q - lo));
    }
}

/* One row of n values; imp (n) or NULL for equal importance.  Blocks whose
 * importance is all zero are fitted unweighted.  fast: no importance (the
 * one-pass scales do not weigh). */
static void quantize_row(const struct sp_native_layout *L, const float *src, int64_t n, const float *imp, bool fast,
                         uint8_t *dst) {
    alignas(32) float w[128];
    for (int64_t i0 = 0; i0 < n; i0 += L->block, dst += L->bytes) {
        const int nv = (int)SP_MIN((int64_t)L->block, n - i0);
        if (fast) {
            quantize_block(L, src + i0, NULL, nv, true, dst);
            continue;
        }
        float wsum = 0;
        for (int i = 0; i < nv; i++) {
            w[i] = imp ? SP_MAX(imp[i0 + i], 0.0f) : 1.0f;
            if (!isfinite(w[i])) w[i] = 0;
            wsum += w[i];
        }
        if (!(wsum > 0)) {
            for (int i = 0; i < nv; i++) w[i] = 1.0f;
        }
        quantize_block(L, src + i0, w, nv, false, dst);
    }
}

sp_status sp_native_pack_block(uint32_t t, const int32_t *code, int nv, float d, float m, void *blk) {
    const struct sp_native_layout *L = sp_native_layout(t);
    if (!L || nv < 0 || nv > L->block) {
        return sp_err(SP_E_INVALID, "%s: type %u is not a native weight type, or %d values do not fit its block",
                      __func__, (unsigned)t, nv);
    }
    uint8_t *b = blk;
    memset(b, 0, L->bytes);
    uint8_t *planes = b + L->head;
    if (L->e8) {
        uint32_t bits;
        memcpy(&bits, &d, 4);
        b[0] = (uint8_t)((bits >> 23) & 0xff); /* the exponent of a power of two */
    } else if (L->l8) {
        b[0] = sp_fp32_to_l8(d, L->l8_shift);
    } else {
        const uint16_t dh = sp_fp32_to_fp16(d);
        memcpy(b, &dh, 2);
    }
    if (L->asym) {
        const int umax = (1 << L->bits) - 1;
        const uint16_t mh = sp_fp32_to_fp16(m);
        memcpy(b + 2, &mh, 2);
        const float df = sp_fp16_to_fp32(sp_fp32_to_fp16(d)), mf = sp_fp16_to_fp32(mh);
        const int pad = df != 0 ? qround(-mf / df, 0, umax) : 0;
        for (int i = 0; i < L->block; i++) {
            code_set(L, planes, i, (unsigned)(i < nv ? SP_MAX(0, SP_MIN(umax, code[i])) : pad));
        }
        return SP_OK;
    }
    if (L->nl) {
        for (int i = 0; i < L->block; i++) {
            code_set(L, planes, i, (unsigned)(i < nv ? SP_MAX(0, SP_MIN(15, code[i])) : sp_native_nl4_index(0.0f)));
        }
        return SP_OK;
    }
    const int lo = -(1 << (L->bits - 1)), hi = (1 << (L->bits - 1)) - 1;
    for (int i = 0; i < L->block; i++) {
        const int q = i < nv ? SP_MAX(lo, SP_MIN(hi, code[i])) : 0;
        code_set(L, planes, i, L->bits == 8 ? (unsigned)(uint8_t)(int8_t)q : (unsigned)(q - lo));
    }
    return SP_OK;
}

/* ========================================================================
 * The reference traits table
 * ======================================================================== */

#define REF_FNS(name, kind, blk, sc)                                                                                 \
    static void to_float_##name(const void *restrict src, float *restrict dst, int64_t n) {                        \
        native_to_float(&layouts[SP_NATIVE_ID(kind, blk, sc) - SP_QTYPE_NATIVE_FIRST], src, dst, n);                \
    }                                                                                                              \
    static void from_float_##name(const float *restrict src, void *restrict dst, int64_t n) {                      \
        quantize_row(&layouts[SP_NATIVE_ID(kind, blk, sc) - SP_QTYPE_NATIVE_FIRST], src, n, NULL, false, dst);             \
    }                                                                                                              \
    static void vec_dot_##name(int64_t n, float *restrict s, const void *restrict w, const void *restrict x) {    \
        native_vec_dot(&layouts[SP_NATIVE_ID(kind, blk, sc) - SP_QTYPE_NATIVE_FIRST], n, s, w, x);                  \
    }
SP_NATIVE_TYPES(REF_FNS)

#define REF_ENTRY(nm, kind, blk, sc)                                                                                 \
    [SP_NATIVE_ID(kind, blk, sc) - SP_QTYPE_NATIVE_FIRST] = {                                                        \
        .name = #nm, .block_elems = BLK_ELEMS(blk), .block_bytes = HEAD_BYTES(kind, sc) + BLK_ELEMS(blk) * KIND_BITS(kind) / 8, \
        .to_float = to_float_##nm, .from_float = from_float_##nm, .vec_dot = vec_dot_##nm,                         \
        .vec_dot_type = (enum sp_qtype)SP_QTYPE_X8},
static const struct sp_qtraits ref_traits[SP_QTYPE_NATIVE_COUNT] = {
    SP_NATIVE_TYPES(REF_ENTRY)
    [SP_QTYPE_X8 - SP_QTYPE_NATIVE_FIRST] = {.name = "x8_b128", .block_elems = SP_QK_X8,
                                             .block_bytes = sizeof(struct sp_block_x8), .to_float = x8_to_float,
                                             .from_float = sp_x8_from_float_ref,
                                             .vec_dot_type = (enum sp_qtype)SP_QTYPE_X8},
};

const struct sp_qtraits *sp_native_ref_traits(uint32_t t) {
    if (t < SP_QTYPE_NATIVE_FIRST || t - SP_QTYPE_NATIVE_FIRST >= SP_QTYPE_NATIVE_COUNT) return NULL;
    const struct sp_qtraits *r = &ref_traits[t - SP_QTYPE_NATIVE_FIRST];
    return r->name ? r : NULL;
}

/* ========================================================================
 * Names and the quantize entry point
 * ======================================================================== */

bool sp_qtype_is_native(uint32_t t) {
    return sp_native_ref_traits(t) != NULL;
}

static const char *const requires_names[] = {"native-types-1", "native-types-2", "native-types-3"};

int sp_native_requires_level(uint32_t t) {
    if (sp_qtype_resident_from(t)) return 3;
    const struct sp_native_layout *L = sp_native_layout(t);
    return L ? (L->l8 ? 2 : 1) : 0;
}

const char *sp_native_requires_name(int level) {
    return level >= 1 && level <= (int)SP_ARRAY_LEN(requires_names) ? requires_names[level - 1] : NULL;
}

int sp_native_requires_parse(const char *value) {
    for (size_t i = 0; value && i < SP_ARRAY_LEN(requires_names); i++)
        if (!strcmp(value, requires_names[i])) return (int)i + 1;
    return -1;
}

int32_t sp_qtype_from_name(const char *name) {
    if (!name) return -1;
    for (uint32_t t = 0; t < SP_QTYPE_COUNT; t++) {
        const char *n = sp_qtype_name(t);
        if (n && strcasecmp(n, name) == 0) return (int32_t)t;
    }
    for (uint32_t t = SP_QTYPE_NATIVE_FIRST; t < SP_QTYPE_NATIVE_FIRST + SP_QTYPE_NATIVE_COUNT; t++) {
        const struct sp_qtraits *r = sp_native_ref_traits(t);
        if (r && strcasecmp(r->name, name) == 0) return (int32_t)t;
    }
    return -1;
}

static sp_status quantize_rows(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, const float *imp,
                               bool fast, void *dst) {
    const struct sp_qtraits *tr = sp_qtraits_ref(t);
    if (!tr || !tr->from_float) {
        return sp_err(SP_E_UNSUPPORTED, "sp_quantize_rows: type %s (id %u) has no quantizer",
                      tr ? tr->name : "?", (unsigned)t);
    }
    if (n_rows < 0 || n_per_row <= 0 || (!sp_qtype_is_native(t) && n_per_row % tr->block_elems != 0)) {
        return sp_err(SP_E_INVALID, "sp_quantize_rows: %lld rows of %lld elements cannot be stored as %s (block %lld)",
                      (long long)n_rows, (long long)n_per_row, tr->name, (long long)tr->block_elems);
    }
    const size_t rb = sp_qtype_row_bytes(t, n_per_row);
    const struct sp_native_layout *L = sp_native_layout(t);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *row = src + r * n_per_row;
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        if (L) {
            quantize_row(L, row, n_per_row, imp, fast, out);
        } else {
            tr->from_float(row, out, n_per_row);
        }
    }
    return SP_OK;
}

sp_status sp_quantize_rows(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, const float *imp,
                           void *dst) {
    return quantize_rows(t, src, n_rows, n_per_row, imp, false, dst);
}

sp_status sp_quantize_rows_fast(uint32_t t, const float *src, int64_t n_rows, int64_t n_per_row, void *dst) {
    return quantize_rows(t, src, n_rows, n_per_row, NULL, true, dst);
}
