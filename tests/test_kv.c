/*
 * test_kv.c -- the KV cache: its element types (store/load, q4h's rotation,
 * quality against q4_0), the attention kernels of every ISA variant against
 * their references, the cell bookkeeping (blocks, refcounts, forks, holes)
 * against a shadow model, and streaming attention over cells against a
 * plain double-precision softmax -- with quantized types, shifts, shared
 * blocks and split decodes, and bit-identical results whatever the slots.
 */
#include "test_util.h"

#include "kv/cache.h"
#include "kv/cells.h"
#include "core/cpu.h"
#include "quant/kv.h"
#include "quant/quant.h"
#include "sched/pool.h"

#include <float.h>

/* test_tq's hashes of decoded blocks (see there) */
#define TQ_HASH_KEYS 0x86cdf1b88ec3f7c8ull
#define TQ_HASH_VALUES 0xdcd6b5ad1150395full

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;
}
static float gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += frand();
    return s * 0.8660254f; /* variance 4/3 * 3/4 = 1 */
}

/* ---- types ------------------------------------------------------------------ */

/* Relative RMS error of store+load over rows of hd values; offsets adds a
 * fixed per-channel offset (a bias: what q4h's rotation is for). */
static double roundtrip_err(enum sp_kv_type t, int32_t hd, int rows, bool offsets) {
    float x[256], y[256], off[256];
    uint8_t buf[1200];
    for (int c = 0; c < hd; c++) off[c] = offsets && c % 13 == 5 ? 6.0f * (c % 2 ? 1 : -1) : 0.0f;
    double e = 0, n = 0;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < hd; c++) x[c] = gauss() + off[c];
        sp_kv_row_store(t, x, buf, hd);
        sp_kv_row_load(t, buf, y, hd);
        for (int c = 0; c < hd; c++) {
            e += (double)(x[c] - y[c]) * (x[c] - y[c]);
            n += (double)x[c] * x[c];
        }
    }
    return sqrt(e / n);
}

static void test_types(void) {
    for (int t = 0; t < SP_KV_TYPE_COUNT; t++) {
        const struct sp_kv_type_info *ti = sp_kv_type_get((enum sp_kv_type)t);
        CHECK(ti && ti->name && ti->bits > 0);
        enum sp_kv_type back;
        CHECK(sp_kv_type_from_name(ti->name, &back) == SP_OK && back == (enum sp_kv_type)t);
        /* bits per value as stored, a key row and a value row together = nominal */
        const size_t rb = sp_kv_row_bytes((enum sp_kv_type)t, 128) +
                          sp_kv_row_bytes(sp_kv_value_rows((enum sp_kv_type)t), 128);
        CHECKF(fabs((double)rb * 8 / 256 - ti->bits) < 1e-9, "%s: %zu bytes per 2 x 128 values vs %g bits", ti->name,
               rb, ti->bits);
        CHECK(ti->block == 1 || sp_kv_row_bytes((enum sp_kv_type)t, 8) == 0);
    }
    CHECK(sp_kv_type_get(SP_KV_TYPE_COUNT) == NULL);
    /* q4h: keys 19 bytes per 32 values, values 17; the other types' value
     * rows are their key rows */
    CHECK(sp_kv_value_rows(SP_KV_Q4H) == SP_KV_Q4H_V && sp_kv_value_rows(SP_KV_Q8_0) == SP_KV_Q8_0);
    CHECK(sp_kv_row_bytes(SP_KV_Q4H, 64) == 38 && sp_kv_row_bytes(SP_KV_Q4H_V, 64) == 34);
    CHECK(sp_kv_row_bytes(SP_KV_Q4H, 48) == 0 && sp_kv_row_bytes(SP_KV_Q4H_V, 16) == 0);
    enum sp_kv_type dummy;
    CHECK(sp_kv_type_from_name("q3_z", &dummy) == SP_E_INVALID && strstr(sp_last_error(), "q3_z"));
    CHECK(strcmp(sp_kv_type_name(SP_KV_Q4H), "q4h") == 0 && sp_kv_type_bits(SP_KV_Q4_0) == 4.5);

    /* the rotation is orthonormal: inverse, norm and dot products kept */
    float a[32], b[32], a0[32], b0[32];
    for (int i = 0; i < 32; i++) a[i] = a0[i] = gauss(), b[i] = b0[i] = gauss();
    double dot0 = 0, dot1 = 0, n0 = 0, n1 = 0;
    for (int i = 0; i < 32; i++) dot0 += (double)a[i] * b[i], n0 += (double)a[i] * a[i];
    sp_kv_rotate(a);
    sp_kv_rotate(b);
    for (int i = 0; i < 32; i++) dot1 += (double)a[i] * b[i], n1 += (double)a[i] * a[i];
    CHECKF(fabs(dot0 - dot1) < 1e-4 && fabs(n0 - n1) < 1e-4, "rotation keeps dots: %g vs %g", dot0, dot1);
    sp_kv_unrotate(a);
    float md = 0;
    for (int i = 0; i < 32; i++) md = fmaxf(md, fabsf(a[i] - a0[i]));
    CHECKF(md < 1e-5f, "unrotate(rotate(x)) off by %g", md);
    /* a one-hot row spreads over the whole block */
    float h[32] = {0};
    h[7] = 1.0f;
    sp_kv_rotate(h);
    for (int i = 0; i < 32; i++) CHECK(fabsf(fabsf(h[i]) - 0.17677669f) < 1e-6f);

    /* round trips: exact for f32, small for the rest; q4h beats q4_0 */
    const double e32 = roundtrip_err(SP_KV_F32, 128, 16, false), e16 = roundtrip_err(SP_KV_F16, 128, 16, false);
    const double e8 = roundtrip_err(SP_KV_Q8_0, 128, 64, false), e4 = roundtrip_err(SP_KV_Q4_0, 128, 64, false);
    const double eh = roundtrip_err(SP_KV_Q4H, 128, 64, false), ehv = roundtrip_err(SP_KV_Q4H_V, 128, 64, false);
    const double e4o = roundtrip_err(SP_KV_Q4_0, 128, 64, true), eho = roundtrip_err(SP_KV_Q4H, 128, 64, true);
    const double ehvo = roundtrip_err(SP_KV_Q4H_V, 128, 64, true);
    printf("  row round trips, relative RMS: f32 %.2g f16 %.2g q8_0 %.3g q4_0 %.3g q4h keys %.3g values %.3g; with "
           "channel offsets q4_0 %.3g q4h keys %.3g values %.3g\n",
           e32, e16, e8, e4, eh, ehv, e4o, eho, ehvo);
    CHECK(e32 == 0.0);
    CHECK(e16 < 1e-3 && e8 < 0.01 && e4 < 0.15 && eh < 0.15 && ehv < 0.15);
    /* relative RMS on these rows (sums of 4 uniforms): q4_0 0.082, the
     * trellis codes 0.053 (keys) and 0.072 (values) */
    CHECKF(eh < 0.7 * e4, "q4h keys %.4f vs q4_0 %.4f on Gaussian rows", eh, e4);
    CHECKF(ehv < 0.92 * e4, "q4h values %.4f vs q4_0 %.4f on Gaussian rows", ehv, e4);
    CHECKF(eh < 0.8 * ehv, "q4h keys %.4f (4.75 bits) vs values %.4f (4.25 bits)", eh, ehv);
    CHECKF(eho < 0.45 * e4o && ehvo < 0.6 * e4o, "q4h %.4f / %.4f vs q4_0 %.4f with channel offsets", eho, ehvo, e4o);
    /* the scale's range: rows of 1e-5 .. 2e4 keep their relative error; a
     * zero row stays zero; NaN and infinity give a finite row */
    for (int k = 0; k < 2; k++) {
        const enum sp_kv_type t = k ? SP_KV_Q4H_V : SP_KV_Q4H;
        const float mags[] = {1e-5f, 3e-3f, 1.0f, 700.0f, 2e4f};
        for (size_t mi = 0; mi < SP_ARRAY_LEN(mags); mi++) {
            float xs[32], ys[32];
            uint8_t bs[32];
            double e = 0, n = 0;
            for (int c = 0; c < 32; c++) xs[c] = mags[mi] * gauss();
            sp_kv_row_store(t, xs, bs, 32);
            sp_kv_row_load(t, bs, ys, 32);
            for (int c = 0; c < 32; c++) e += (double)(xs[c] - ys[c]) * (xs[c] - ys[c]), n += (double)xs[c] * xs[c];
            CHECKF(sqrt(e / n) < 0.12, "q4h %s at magnitude %g: relative RMS %g", k ? "values" : "keys",
                   (double)mags[mi], sqrt(e / n));
        }
        float xs[32] = {0}, ys[32];
        uint8_t bs[32];
        sp_kv_row_store(t, xs, bs, 32);
        sp_kv_row_load(t, bs, ys, 32);
        bool zero = true, finite = true;
        for (int c = 0; c < 32; c++) zero = zero && ys[c] == 0.0f;
        CHECK(zero);
        xs[3] = NAN;
        xs[9] = INFINITY;
        sp_kv_row_store(t, xs, bs, 32);
        sp_kv_row_load(t, bs, ys, 32);
        for (int c = 0; c < 32; c++) finite = finite && isfinite(ys[c]);
        CHECK(finite);
    }
    /* q4h's domain: rows_to_float gives the rotated row, query_prep rotates
     * the query alike, so dots agree with the original basis */
    float x[64], q[64], qr[64], xr[64], back[64];
    uint8_t buf[64];
    for (int c = 0; c < 64; c++) x[c] = gauss(), q[c] = gauss();
    sp_kv_row_store(SP_KV_Q4H, x, buf, 64);
    const void *rows[1] = {buf};
    sp_kv_rows_to_float(SP_KV_Q4H, rows, 1, 64, xr);
    sp_kv_row_load(SP_KV_Q4H, buf, back, 64);
    sp_kv_query_prep(SP_KV_Q4H, q, qr, 64);
    double d_rot = 0, d_orig = 0;
    for (int c = 0; c < 64; c++) d_rot += (double)qr[c] * xr[c], d_orig += (double)q[c] * back[c];
    CHECKF(fabs(d_rot - d_orig) < 1e-4, "q4h dot in the rotated basis %g vs original %g", d_rot, d_orig);
    memcpy(back, xr, sizeof xr);
    sp_kv_output_fix(SP_KV_Q4H, back, 64);
    float back2[64];
    sp_kv_row_load(SP_KV_Q4H, buf, back2, 64);
    md = 0;
    for (int c = 0; c < 64; c++) md = fmaxf(md, fabsf(back[c] - back2[c]));
    CHECKF(md < 1e-5f, "output_fix(rows_to_float) vs row_load: %g", md);
}

/* ---- q4h's trellis code: the vector variants against the reference ---------------- */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* FNV-1a over the bits of n floats. */
static uint64_t hash_floats(const float *y, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        const uint32_t u = bits_of(y[i]);
        for (int k = 0; k < 4; k++) h = (h ^ (u >> 8 * k & 0xffu)) * 0x100000001b3ull;
    }
    return h;
}

/* A block of kind k (adversarial ones first): x (32 floats). */
static void tq_block(int k, int value, float *x) {
    const float mags[] = {1.0f, 1e-3f, 40.0f, 1e-38f, 3e18f, 1e30f};
    switch (k) {
    case 0: /* zeros */
        memset(x, 0, 32 * sizeof *x);
        break;
    case 1: /* one hot */
        memset(x, 0, 32 * sizeof *x);
        x[rnd() % 32] = (rnd() & 1 ? -1.0f : 1.0f) * (0.5f + fabsf(gauss()));
        break;
    case 2: /* a constant */
        for (int j = 0; j < 32; j++) x[j] = 0.75f;
        break;
    case 3: /* alternating signs */
        for (int j = 0; j < 32; j++) x[j] = j % 2 ? -1.0f : 1.0f;
        break;
    case 4: /* exactly a code's levels: ties everywhere */
    case 5: { /* and a hair off them */
        uint8_t b[32];
        for (int i = 0; i < 32; i++) b[i] = (uint8_t)rnd();
        b[0] = (uint8_t)(b[0] | 0x80u), b[1] = (uint8_t)(b[1] & 0xfcu) | 1u; /* a scale near 1 */
        sp_kv_tq_decode(value, b, x);
        if (k == 5)
            for (int j = 0; j < 32; j++) x[j] += 1e-4f * gauss();
        break;
    }
    case 6: /* repeated values */
        for (int j = 0; j < 32; j++) x[j] = (float)(int)(3.0f * gauss()) * 0.25f;
        break;
    case 7: /* a NaN among finite values */
        for (int j = 0; j < 32; j++) x[j] = gauss();
        x[rnd() % 32] = NAN;
        break;
    default: { /* Gaussian at magnitudes whose squares underflow or overflow, an outlier sometimes */
        const float m = mags[(unsigned)k % SP_ARRAY_LEN(mags)];
        for (int j = 0; j < 32; j++) x[j] = m * gauss();
        if (k % 3 == 0) x[rnd() % 32] *= 8.0f;
        break;
    }
    }
}

/* A variant's search, decoding and (through the search) encoding against
 * the reference's: the same bits. */
static void tq_check(const char *name, const struct sp_attn_kernels *k) {
    const struct sp_attn_kernels *r = sp_attn_kernels_ref();
    int searches = 0, encodes = 0, decodes = 0;
    for (int value = 0; value < 2; value++) {
        const struct sp_kv_tq_code *q = sp_kv_tq_code_get(value);
        /* decoding: random bytes (every bit string is a block), 1..5 blocks */
        static uint8_t src[5 * 32];
        static float y1[5 * 32], y2[5 * 32];
        for (int it = 0; it < 400; it++) {
            const int n = 1 + it % 5;
            for (int i = 0; i < n * q->bytes; i++) src[i] = it == 0 ? 0 : it == 1 ? 0xff : (uint8_t)rnd();
            r->tq_decode(q, src, y1, n);
            k->tq_decode(q, src, y2, n);
            CHECKF(memcmp(y1, y2, (size_t)n * 32 * sizeof *y1) == 0, "%s tq_decode %s, %d blocks (case %d): not the "
                   "reference's floats", name, value ? "values" : "keys", n, it);
            decodes += n;
        }
        /* the search at scales an encoder tries, and odd ones */
        for (int it = 0; it < 600; it++) {
            float x[32];
            tq_block(it < 8 ? it : 8 + (int)(rnd() % 40), value, x);
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            const float base = amax > 0 && isfinite(amax) ? amax / 100.0f : 1.0f;
            const float ds[] = {base, -base * 0.9f, base * (0.5f + fabsf(frand())), 0.0f, INFINITY, NAN, 1e-30f, 3e38f};
            for (size_t di = 0; di < (it < 50 ? SP_ARRAY_LEN(ds) : 3); di++) {
                uint8_t c1[32], c2[32];
                memset(c1, 0xee, sizeof c1), memset(c2, 0xdd, sizeof c2);
                const float e1 = r->tq_search(q, x, ds[di], c1), e2 = k->tq_search(q, x, ds[di], c2);
                const float e3 = k->tq_search(q, x, ds[di], NULL);
                CHECKF(bits_of(e1) == bits_of(e2) && bits_of(e1) == bits_of(e3) && memcmp(c1, c2, 32) == 0,
                       "%s tq_search %s, block %d, d %g: error %g / %g / %g (codes %s)", name,
                       value ? "values" : "keys", it, (double)ds[di], (double)e1, (double)e2, (double)e3,
                       memcmp(c1, c2, 32) ? "differ" : "equal");
                searches++;
            }
            if (it < 100 || it % 10 == 0) {
                uint8_t b1[32], b2[32];
                sp_kv_tq_encode_with(r->tq_search, value, x, b1);
                sp_kv_tq_encode_with(k->tq_search, value, x, b2);
                CHECKF(memcmp(b1, b2, (size_t)q->bytes) == 0, "%s encode %s, block %d: not the reference's bytes",
                       name, value ? "values" : "keys", it);
                encodes++;
            }
        }
    }
    printf("  q4h's trellis code, %s: %d searches, %d encodes, %d decoded blocks as the reference\n", name, searches,
           encodes, decodes);
}

static void test_tq(void) {
    for (int value = 0; value < 2; value++) {
        const struct sp_kv_tq_code *q = sp_kv_tq_code_get(value);
        int bits = SP_KV_TQ_SCALE_BITS;
        for (int j = 0; j < SP_KV_TQ_N; j++) {
            CHECK(q->lev[j] == q->base + q->off[j]);
            bits += q->bits[j];
        }
        CHECK(bits == 8 * q->bytes && (size_t)q->bytes == sp_kv_tq_block_bytes(value));
    }
    /* decoding never changes: saved sessions hold the codes.  The hashes of
     * blocks of pseudo-random bytes decoded by the code of 2026-12-02 (the
     * first trellis code, session file version 3). */
    static const uint64_t want[2] = {TQ_HASH_KEYS, TQ_HASH_VALUES};
    for (int value = 0; value < 2; value++) {
        uint64_t st = 0x2545f4914f6cdd1dull, h = 0;
        for (int b = 0; b < 64; b++) {
            uint8_t src[32];
            float y[32];
            for (int i = 0; i < 32; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                src[i] = (uint8_t)(st >> 56);
            }
            sp_kv_tq_decode(value, src, y);
            h ^= hash_floats(y, 32) + (uint64_t)b;
        }
        CHECKF(h == want[value], "q4h %s: decoding changed (hash %016llx, want %016llx)", value ? "values" : "keys",
               (unsigned long long)h, (unsigned long long)want[value]);
    }
    tq_check("ref", sp_attn_kernels_ref()); /* the harness itself */
    const struct sp_cpu_features *f = sp_cpu_features();
    struct sp_attn_kernels t = *sp_attn_kernels_ref();
#if defined(__x86_64__)
    if (f->avx2 && f->fma) {
        sp_attn_register_avx2(&t, f);
        CHECK(t.tq_search != sp_attn_kernels_ref()->tq_search && t.tq_decode != sp_attn_kernels_ref()->tq_decode);
        tq_check("avx2", &t);
    }
#elif defined(__aarch64__)
    sp_attn_register_neon(&t, f);
    if (t.tq_search != sp_attn_kernels_ref()->tq_search || t.tq_decode != sp_attn_kernels_ref()->tq_decode)
        tq_check("neon", &t);
#else
    (void)f;
    (void)t;
#endif
}

/* ---- kernels --------------------------------------------------------------------- */

static void test_kernels(void) {
    const struct sp_attn_kernels *k = sp_attn_kernels_get(), *r = sp_attn_kernels_ref();
    printf("  attention kernels: scores %s, accum %s, exp %s\n", k->scores == r->scores ? "ref" : "simd",
           k->accum == r->accum ? "ref" : "simd", k->exp == r->exp ? "ref" : "simd");
    static float q[16 * 300], kk[32 * 300], s1[16 * 32], s2[16 * 32], o1[16 * 300], o2[16 * 300], p[16 * 32];
    const int32_t hds[] = {8, 16, 32, 33, 64, 96, 128, 256, 300};
    for (size_t h = 0; h < SP_ARRAY_LEN(hds); h++) {
        const int32_t hd = hds[h];
        for (int32_t nq = 1; nq <= 16; nq += 5) {
            for (int32_t n = 1; n <= 32; n += 7) {
                for (int i = 0; i < nq * hd; i++) q[i] = gauss();
                for (int i = 0; i < n * hd; i++) kk[i] = gauss();
                r->scores(q, hd, nq, kk, n, hd, 0.125f, s1);
                k->scores(q, hd, nq, kk, n, hd, 0.125f, s2);
                float md = 0;
                for (int i = 0; i < nq * n; i++) md = fmaxf(md, fabsf(s1[i] - s2[i]));
                CHECKF(md < 1e-5f * sqrtf((float)hd), "scores hd %d nq %d n %d: max diff %g", hd, nq, n, md);
                for (int i = 0; i < nq * n; i++) p[i] = fabsf(frand());
                for (int i = 0; i < nq * hd; i++) o1[i] = o2[i] = frand();
                float ps[16], kp[16];
                for (int i = 0; i < nq; i++) ps[i] = 0.5f + fabsf(frand()), kp[i] = i % 3 ? fabsf(frand()) : 1.0f;
                r->accum(p, nq, ps, kp, kk, n, hd, o1, hd);
                k->accum(p, nq, ps, kp, kk, n, hd, o2, hd);
                CHECKF(memcmp(o1, o2, (size_t)nq * hd * sizeof(float)) == 0, "accum hd %d nq %d n %d: not the "
                       "reference's bits", hd, nq, n);
            }
        }
    }
    /* exp: within a few ulp of expf over the range softmax uses; -inf and
     * far-negative inputs give 0 */
    static float xs[1000], ys[1000];
    for (int i = 0; i < 1000; i++) xs[i] = ys[i] = -90.0f * (float)i / 999.0f;
    xs[999] = ys[999] = -INFINITY;
    xs[998] = ys[998] = -1e30f;
    r->exp(xs, 1000, 0.0f);
    k->exp(ys, 1000, 0.0f);
    float mrel = 0;
    for (int i = 0; i < 998; i++) {
        if (xs[i] > 1e-37f) mrel = fmaxf(mrel, fabsf(ys[i] - xs[i]) / xs[i]);
    }
    CHECKF(mrel < 5e-7f, "exp: max relative error %g", mrel);
    CHECK(ys[999] == 0.0f && ys[998] == 0.0f && xs[999] == 0.0f);
    ys[0] = 3.0f;
    k->exp(ys, 1, 3.0f);
    CHECK(ys[0] == 1.0f);
}


/* The wide path's kernels of every level this CPU runs (not only the one
 * dispatched), against the references: scores and weighted sums within a
 * float tolerance (FMA, other order), the softmax's state within a few ulp,
 * masked (-inf) columns and rows included. */
static void wide_check(const char *name, const struct sp_attn_kernels *k) {
    const struct sp_attn_kernels *r = sp_attn_kernels_ref();
    enum { MAXQ = 64, MAXN = SP_KV_TILE, MAXHD = 300 };
    static float qt[MAXHD * MAXQ], kk[MAXN * MAXHD], st1[MAXN * MAXQ], st2[MAXN * MAXQ], v[MAXN * MAXHD];
    static float o1[MAXQ * MAXHD], o2[MAXQ * MAXHD];
    float m1[MAXQ], m2[MAXQ], l1[MAXQ], l2[MAXQ], k1[MAXQ], k2[MAXQ];
    CHECKF(k->wide_pad >= 1 && k->wide_pad <= SP_KV_WIDE_PAD_MAX && MAXQ % k->wide_pad == 0, "%s: wide_pad %d",
           name, k->wide_pad);
    const int32_t hds[] = {8, 32, 33, 64, 128, 300};
    int cases = 0;
    for (size_t h = 0; h < SP_ARRAY_LEN(hds); h++) {
        const int32_t hd = hds[h];
        for (int32_t nqp = k->wide_pad; nqp <= MAXQ; nqp += k->wide_pad * (nqp < 16 ? 1 : 3)) {
            for (int32_t n = 1; n <= MAXN; n += 10) {
                const int32_t nq = nqp - (nqp > 1 ? (int32_t)(h % 3) : 0); /* padding columns */
                for (int i = 0; i < hd * nqp; i++) qt[i] = (i % nqp) < nq ? gauss() : 0.0f;
                for (int i = 0; i < n * hd; i++) kk[i] = gauss(), v[i] = gauss();
                r->scores_t(qt, nqp, kk, n, hd, 0.125f, st1);
                k->scores_t(qt, nqp, kk, n, hd, 0.125f, st2);
                float md = 0;
                for (int i = 0; i < n * nqp; i++) md = fmaxf(md, fabsf(st1[i] - st2[i]));
                CHECKF(md < 1e-5f * sqrtf((float)hd), "%s scores_t hd %d nqp %d n %d: max diff %g", name, hd, nqp,
                       n, md);
                /* a causal mask: column i sees rows r < i % (n + 1); column 0 none */
                for (int32_t rr = 0; rr < n; rr++) {
                    for (int32_t i = 0; i < nqp; i++) {
                        if (rr >= i % (n + 1)) st1[rr * nqp + i] = -INFINITY;
                        st2[rr * nqp + i] = st1[rr * nqp + i];
                    }
                }
                for (int32_t i = 0; i < nqp; i++) {
                    const bool fresh = (i + (int)h) % 3 == 0; /* the first tile: m = -inf, l = 0 */
                    m1[i] = m2[i] = fresh ? -INFINITY : 0.5f * gauss();
                    l1[i] = l2[i] = fresh ? 0.0f : 1.0f + fabsf(gauss());
                }
                r->softmax_t(st1, n, nqp, m1, l1, k1);
                k->softmax_t(st2, n, nqp, m2, l2, k2);
                float dm = 0, dl = 0, dk = 0, dp = 0;
                for (int32_t i = 0; i < nqp; i++) {
                    dm = fmaxf(dm, m1[i] == m2[i] ? 0.0f : fabsf(m1[i] - m2[i]));
                    dl = fmaxf(dl, fabsf(l1[i] - l2[i]) / fmaxf(1.0f, l1[i]));
                    dk = fmaxf(dk, fabsf(k1[i] - k2[i]));
                }
                for (int i = 0; i < n * nqp; i++) dp = fmaxf(dp, fabsf(st1[i] - st2[i]));
                CHECKF(dm == 0 && dl < 1e-5f && dk < 1e-5f && dp < 1e-5f,
                       "%s softmax_t nqp %d n %d: max diff m %g, l %g, keep %g, weights %g", name, nqp, n, dm, dl, dk,
                       dp);
                for (int i = 0; i < nq * hd; i++) o1[i] = o2[i] = frand();
                r->accum_t(st1, nqp, nq, k1, v, n, hd, o1, hd);
                k->accum_t(st1, nqp, nq, k1, v, n, hd, o2, hd);
                float da = 0;
                for (int i = 0; i < nq * hd; i++) da = fmaxf(da, fabsf(o1[i] - o2[i]));
                CHECKF(da < 1e-5f * sqrtf((float)n), "%s accum_t hd %d nq %d n %d: max diff %g", name, hd, nq, n,
                       da);
                cases++;
            }
        }
    }
    printf("  wide attention kernels, %s (pad %d): %d cases\n", name, k->wide_pad, cases);
}

/* The narrow path's kernels straight from stored rows (F16, Q8_0) against
 * the F32 kernels on the converted tile: scores within the same tolerance,
 * accum bit for bit; a type they do not take is declined. */
static void rows_check(const char *name, const struct sp_attn_kernels *k) {
    if (!k->scores_rows || !k->accum_rows) return;
    const struct sp_attn_kernels *r = sp_attn_kernels_ref();
    enum { HD = 128, N = SP_KV_TILE };
    static float q[8 * HD], rows_f[N * HD], s1[8 * N], s2[8 * N], o1[8 * HD], o2[8 * HD], src[N * HD];
    static uint8_t store[N][HD * 4];
    const void *rp[N];
    const enum sp_kv_type types[] = {SP_KV_F16, SP_KV_Q8_0};
    int cases = 0;
    for (size_t ti = 0; ti < SP_ARRAY_LEN(types); ti++) {
        for (int32_t hd = 32; hd <= HD; hd += 96) {
            for (int32_t nq = 1; nq <= 8; nq += 3) {
                for (int32_t n = 1; n <= N; n += 15) {
                    for (int i = 0; i < n * hd; i++) src[i] = gauss();
                    for (int32_t rr = 0; rr < n; rr++) {
                        sp_kv_row_store(types[ti], src + (size_t)rr * hd, store[rr], hd);
                        rp[rr] = store[rr];
                    }
                    sp_kv_rows_to_float(types[ti], rp, n, hd, rows_f);
                    for (int i = 0; i < nq * hd; i++) q[i] = gauss();
                    r->scores(q, hd, nq, rows_f, n, hd, 0.125f, s1);
                    CHECK(k->scores_rows(types[ti], q, hd, nq, rp, n, hd, 0.125f, s2));
                    float md = 0;
                    for (int i = 0; i < nq * n; i++) md = fmaxf(md, fabsf(s1[i] - s2[i]));
                    CHECKF(md < 1e-5f * sqrtf((float)hd), "%s scores_rows %s hd %d nq %d n %d: max diff %g", name,
                           sp_kv_type_name(types[ti]), hd, nq, n, md);
                    float ps[8], kp[8];
                    for (int i = 0; i < nq; i++) ps[i] = 0.5f + fabsf(frand()), kp[i] = i % 2 ? fabsf(frand()) : 1.0f;
                    for (int i = 0; i < nq * n; i++) s1[i] = fabsf(frand());
                    for (int i = 0; i < nq * hd; i++) o1[i] = o2[i] = frand();
                    r->accum(s1, nq, ps, kp, rows_f, n, hd, o1, hd);
                    CHECK(k->accum_rows(types[ti], s1, nq, ps, kp, rp, n, hd, o2, hd));
                    CHECKF(memcmp(o1, o2, (size_t)nq * hd * sizeof(float)) == 0,
                           "%s accum_rows %s hd %d nq %d n %d: not the reference's bits", name,
                           sp_kv_type_name(types[ti]), hd, nq, n);
                    cases++;
                }
            }
        }
    }
    CHECK(!k->scores_rows(SP_KV_Q4_0, q, 32, 1, rp, 1, 32, 1.0f, s2)); /* declined: the caller converts */
    printf("  attention kernels from stored rows, %s: %d cases\n", name, cases);
}

static void test_wide_kernels(void) {
    struct sp_attn_kernels t = *sp_attn_kernels_ref();
    wide_check("ref", &t);
    const struct sp_cpu_features *f = sp_cpu_features();
#if defined(__x86_64__)
    if (f->avx2 && f->fma) {
        sp_attn_register_avx2(&t, f);
        wide_check("avx2", &t);
        rows_check("avx2", &t);
    }
    t = *sp_attn_kernels_ref();
    sp_attn_register_avx512(&t, f);
    if (t.scores_t != sp_attn_kernels_ref()->scores_t) wide_check("avx512", &t), rows_check("avx512", &t);
#elif defined(__aarch64__)
    sp_attn_register_neon(&t, f);
    if (t.scores_t != sp_attn_kernels_ref()->scores_t) wide_check("neon", &t), rows_check("neon", &t);
#else
    (void)f;
#endif
}

/* ---- cells ------------------------------------------------------------------------- */

static void check_refs(struct sp_kv_blocks *b, struct sp_kv_cells *const *seqs, int n_seqs) {
    /* every block's refcount = the sequences with a cell in it; cells of a
     * block consecutive in each sequence; held = distinct blocks */
    static uint32_t refs[4096];
    memset(refs, 0, sizeof refs);
    for (int s = 0; s < n_seqs; s++) {
        const struct sp_kv_cells *c = seqs[s];
        static uint8_t seen[4096];
        memset(seen, 0, sizeof seen);
        uint32_t held = 0;
        int64_t last = -1;
        for (uint32_t i = 0; i < c->n; i++) {
            const uint32_t blk = c->slot[i] / SP_KV_BLOCK;
            if ((int64_t)blk != last) {
                CHECKF(!seen[blk], "seq %d: block %u's cells are not consecutive", s, blk);
                seen[blk] = 1;
                refs[blk]++;
                held++;
                last = blk;
            }
            if (i) CHECK(c->pos[i] > c->pos[i - 1]);
        }
        CHECKF(held == c->held, "seq %d holds %u blocks, counted %u", s, c->held, held);
        CHECK(held <= c->quota);
    }
    uint32_t used = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        CHECKF(refs[i] == b->refs[i], "block %u: refcount %u, %u sequences use it", i, b->refs[i], refs[i]);
        used += refs[i] > 0;
    }
    CHECK(used == b->n - b->n_free);
}

static int n_copies;
static void copy_count(void *u, uint32_t from, uint32_t to) {
    (void)from;
    (void)to;
    (*(int *)u)++;
}

static void test_cells(void) {
    struct sp_kv_blocks b;
    CHECK(sp_kv_blocks_init(&b) == SP_OK);
    enum { NS = 3, CAP = 200 };
    struct sp_kv_cells c[NS];
    struct sp_kv_cells *ptr[NS];
    for (int s = 0; s < NS; s++) {
        CHECK(sp_kv_blocks_add(&b, sp_kv_cells_quota(CAP)) == SP_OK);
        CHECK(sp_kv_cells_init(&c[s], &b, CAP, copy_count, &n_copies) == SP_OK);
        ptr[s] = &c[s];
    }
    /* shadow: the token ids each sequence should hold */
    static int32_t shadow[NS][CAP];
    uint32_t sn[NS] = {0};
    int32_t next_tok = 1;
    uint32_t written[4096 * 1];
    memset(written, 0, sizeof written);
    for (int step = 0; step < 4000; step++) {
        const int s = (int)(rnd() % NS);
        const uint32_t op = rnd() % 10;
        if (op < 5) { /* append */
            const uint32_t want = 1 + rnd() % 40, n = SP_MIN(want, CAP - c[s].n);
            int32_t toks[40];
            for (uint32_t i = 0; i < n; i++) toks[i] = next_tok++;
            const int32_t pos0 = c[s].n ? c[s].pos[c[s].n - 1] + 1 : 0;
            const uint32_t n0 = c[s].n;
            if (sp_kv_cells_append(&c[s], toks, n, pos0) != SP_OK) {
                CHECKF(0, "step %d: %s (held %u %u %u, free %u of %u)", step, sp_last_error(), c[0].held, c[1].held,
                       c[2].held, b.n_free, b.n);
                check_refs(&b, ptr, NS);
                break;
            }
            /* a written slot belongs to no other sequence */
            for (uint32_t i = n0; i < c[s].n; i++) {
                for (int o = 0; o < NS; o++) {
                    if (o == s) continue;
                    for (uint32_t k = 0; k < c[o].n; k++)
                        if (c[o].slot[k] == c[s].slot[i]) {
                            CHECKF(0, "seq %d wrote slot %u that seq %d holds", s, c[s].slot[i], o);
                            k = c[o].n;
                        }
                }
                for (uint32_t k = 0; k < i; k++) CHECK(c[s].slot[k] != c[s].slot[i]);
            }
            memcpy(&shadow[s][sn[s]], toks, n * sizeof *toks);
            sn[s] += n;
        } else if (op < 7 && c[s].n) { /* truncate */
            const uint32_t keep = rnd() % (c[s].n + 1);
            sp_kv_cells_truncate(&c[s], keep);
            sn[s] = keep;
        } else if (op < 9 && c[s].n > 4) { /* a shift: drop a run after 4 sinks */
            const uint32_t d = 1 + rnd() % (c[s].n - 4);
            sp_kv_cells_remove(&c[s], 4, d);
            memmove(&shadow[s][4], &shadow[s][4 + d], (sn[s] - 4 - d) * sizeof(int32_t));
            sn[s] -= d;
            for (uint32_t i = 4; i < c[s].n; i++) c[s].pos[i] -= (int32_t)d;
        } else { /* fork from another sequence */
            const int o = (s + 1) % NS;
            sp_kv_cells_truncate(&c[s], 0);
            const uint32_t n = c[o].n ? rnd() % (c[o].n + 1) : 0;
            sp_kv_cells_fork(&c[s], &c[o], n);
            memcpy(shadow[s], shadow[o], n * sizeof(int32_t));
            sn[s] = n;
        }
        CHECK(c[s].n == sn[s]);
        for (uint32_t i = 0; i < c[s].n; i++) CHECK(c[s].tok[i] == shadow[s][i]);
        if (step % 50 == 0) check_refs(&b, ptr, NS);
    }
    check_refs(&b, ptr, NS);
    /* unshare gives a sequence blocks of its own, cells and offsets kept */
    sp_kv_cells_truncate(&c[1], 0);
    sp_kv_cells_fork(&c[1], &c[0], c[0].n);
    uint32_t before[CAP];
    memcpy(before, c[1].slot, c[1].n * sizeof *before);
    n_copies = 0;
    CHECK(sp_kv_cells_unshare(&c[1], 0) == SP_OK);
    CHECKF(n_copies == (int)c[1].n, "unshare copied %d of %u cells", n_copies, c[1].n);
    for (uint32_t i = 0; i < c[1].n; i++) CHECK(c[1].slot[i] != before[i]);
    check_refs(&b, ptr, NS);
    for (int s = 0; s < NS; s++) sp_kv_cells_destroy(&c[s]);
    CHECK(b.n_free == b.n);
    sp_kv_blocks_destroy(&b);
}

/* ---- attention ----------------------------------------------------------------- */

/* The plain reference: for each query token and head, a double-precision
 * softmax over the visible cells of the rows as stored (loaded back to the
 * original basis). */
static void naive_attend(const struct sp_kv_cache *kv, const struct sp_kv_cells *c, uint32_t il, const float *q,
                         uint32_t n_tok, uint32_t n_vis0, float scale, float *out) {
    const struct sp_kv_geom *g = &kv->g;
    const uint32_t G = g->n_heads / g->n_kv_heads;
    static float kr[SP_KV_MAX_HEAD_DIM], vr[SP_KV_MAX_HEAD_DIM];
    static double sc[4096], acc[SP_KV_MAX_HEAD_DIM];
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t h = 0; h < g->n_heads; h++) {
            const uint32_t kh = h / G, vis = n_vis0 + t;
            const float *qh = q + ((size_t)t * g->n_heads + h) * g->hd_k;
            double mx = -DBL_MAX;
            for (uint32_t p = 0; p < vis; p++) {
                sp_kv_row_load(g->type_k, sp_kv_key_row(kv, c->slot[p], il, kh), kr, (int32_t)g->hd_k);
                double d = 0;
                for (uint32_t e = 0; e < g->hd_k; e++) d += (double)qh[e] * kr[e];
                sc[p] = d * scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            double sum = 0;
            for (uint32_t p = 0; p < vis; p++) sum += sc[p] = exp(sc[p] - mx);
            for (uint32_t e = 0; e < g->hd_v; e++) acc[e] = 0;
            for (uint32_t p = 0; p < vis; p++) {
                sp_kv_row_load(sp_kv_value_rows(g->type_v), sp_kv_value_row(kv, c->slot[p], il, kh), vr,
                               (int32_t)g->hd_v);
                for (uint32_t e = 0; e < g->hd_v; e++) acc[e] += sc[p] / sum * vr[e];
            }
            for (uint32_t e = 0; e < g->hd_v; e++) out[((size_t)t * g->n_heads + h) * g->hd_v + e] = (float)acc[e];
        }
    }
}

static void fill_rows(struct sp_kv_cache *kv, struct sp_kv_cells *c, uint32_t c0, uint32_t n, struct sp_pool *pool) {
    const struct sp_kv_geom *g = &kv->g;
    const size_t kd = (size_t)g->n_kv_heads * g->hd_k, vd = (size_t)g->n_kv_heads * g->hd_v;
    float *k = malloc(n * kd * sizeof *k), *v = malloc(n * vd * sizeof *v);
    for (uint32_t il = 0; il < g->n_layers; il++) {
        for (size_t i = 0; i < n * kd; i++) k[i] = 2.0f * gauss() + (i % 7 == 3 ? 3.0f : 0.0f);
        for (size_t i = 0; i < n * vd; i++) v[i] = gauss();
        sp_kv_store(kv, c, c0, n, il, k, v, pool);
    }
    free(k);
    free(v);
}

static void test_attention(void) {
    struct sp_pool *pool2 = NULL;
    CHECK(sp_pool_init(2, &pool2) == SP_OK);
    const struct {
        uint32_t heads, kv_heads, hd;
        enum sp_kv_type tk, tv;
        uint32_t n;      /* cells */
        uint32_t n_tok;  /* query tokens (the last n_tok cells) */
    } cases[] = {
        {4, 4, 32, SP_KV_F32, SP_KV_F32, 40, 1},   {8, 2, 64, SP_KV_F16, SP_KV_F16, 100, 7},
        {8, 2, 32, SP_KV_Q8_0, SP_KV_Q4_0, 70, 70}, {4, 1, 64, SP_KV_Q4H, SP_KV_Q4H, 600, 1},
        {8, 8, 32, SP_KV_Q4H, SP_KV_F16, 300, 3},  {16, 2, 32, SP_KV_F32, SP_KV_Q4H, 257, 1},
        {2, 1, 8, SP_KV_F32, SP_KV_F16, 33, 2},    {8, 4, 8, SP_KV_F32, SP_KV_F32, 64, 16},
        {8, 4, 8, SP_KV_F16, SP_KV_F16, 40, 40},   {32, 8, 128, SP_KV_F16, SP_KV_F16, 300, 20},
        {8, 4, 8, SP_KV_F32, SP_KV_F32, 16, 16},   {8, 4, 8, SP_KV_F32, SP_KV_F32, 100, 100},
    };
    for (size_t ci = 0; ci < SP_ARRAY_LEN(cases); ci++) {
        const struct sp_kv_geom g = {2, cases[ci].heads, cases[ci].kv_heads, cases[ci].hd, cases[ci].hd,
                                     cases[ci].tk, cases[ci].tv};
        struct sp_kv_cache *kv = NULL;
        CHECK(sp_kv_cache_init(&g, &kv) == SP_OK);
        if (!kv) continue;
        const uint32_t n = cases[ci].n, n_tok = cases[ci].n_tok;
        struct sp_kv_cells c, c2;
        CHECK(sp_kv_seq_init(kv, n + 64, &c) == SP_OK);
        CHECK(sp_kv_seq_init(kv, n + 64, &c2) == SP_OK);
        /* holes: append more, drop a run after 3 sinks, like a shift */
        const uint32_t extra = 40;
        CHECK(sp_kv_cells_append(&c, NULL, n + extra, 0) == SP_OK);
        fill_rows(kv, &c, 0, n + extra, pool2);
        sp_kv_cells_remove(&c, 3, extra);
        const size_t qn = (size_t)n_tok * g.n_heads * g.hd_k, on = (size_t)n_tok * g.n_heads * g.hd_v;
        float *q = malloc(qn * sizeof *q), *o1 = malloc(on * sizeof *o1), *o2 = malloc(on * sizeof *o2);
        float *o3 = malloc(on * sizeof *o3), *want = malloc(on * sizeof *want);
        for (size_t i = 0; i < qn; i++) q[i] = gauss();
        void *scr = malloc(sp_kv_attend_scratch_bytes(&g, 2));
        const float scale = 1.0f / sqrtf((float)g.hd_k);
        const uint32_t vis0 = n - n_tok + 1;
        sp_kv_attend(kv, &c, 1, q, n_tok, vis0, scale, o1, NULL, scr);
        sp_kv_attend(kv, &c, 1, q, n_tok, vis0, scale, o2, pool2, scr);
        naive_attend(kv, &c, 1, q, n_tok, vis0, scale, want);
        float md = 0, mw = 0;
        for (size_t i = 0; i < on; i++) md = fmaxf(md, fabsf(o1[i] - want[i])), mw = fmaxf(mw, fabsf(want[i]));
        CHECKF(md < 2e-5f * fmaxf(1.0f, mw), "case %zu (%s/%s, %u cells, %u tokens): max diff %g vs naive", ci,
               sp_kv_type_name(g.type_k), sp_kv_type_name(g.type_v), n, n_tok, md);
        float m12 = 0;
        for (size_t i = 0; i < on; i++) m12 = fmaxf(m12, fabsf(o1[i] - o2[i]));
        /* one thread vs two: the same items; a split decode merges chunks */
        CHECKF(m12 < 2e-5f * fmaxf(1.0f, mw), "case %zu: 1 vs 2 threads differ by %g", ci, m12);
        /* the same cells in other slots (a fork, then copied): the same bits */
        sp_kv_cells_fork(&c2, &c, c.n);
        CHECK(sp_kv_cells_unshare(&c2, 0) == SP_OK);
        bool moved = false;
        for (uint32_t i = 0; i < c.n; i++) moved |= c.slot[i] != c2.slot[i];
        CHECK(moved);
        sp_kv_attend(kv, &c2, 1, q, n_tok, vis0, scale, o3, pool2, scr);
        CHECKF(memcmp(o2, o3, on * sizeof *o2) == 0, "case %zu: other slots, other bits", ci);
        printf("  attention %-4s/%-4s %2u/%u heads hd %3u: %3u cells, %2u tokens: max diff vs double %.2g\n",
               sp_kv_type_name(g.type_k), sp_kv_type_name(g.type_v), g.n_heads, g.n_kv_heads, g.hd_k, n, n_tok, md);
        free(scr);
        free(q);
        free(o1);
        free(o2);
        free(o3);
        free(want);
        sp_kv_seq_free(kv, &c2);
        sp_kv_seq_free(kv, &c);
        CHECK(sp_kv_cache_bytes(kv) == 0); /* storage goes when no sequence is left */
        sp_kv_cache_free(kv);
    }
    /* a head size a type cannot take is refused by name */
    const struct sp_kv_geom bad = {1, 8, 4, 8, 8, SP_KV_Q4_0, SP_KV_F16};
    struct sp_kv_cache *kv = NULL;
    CHECK(sp_kv_cache_init(&bad, &kv) == SP_E_INVALID && kv == NULL && strstr(sp_last_error(), "q4_0") &&
          strstr(sp_last_error(), "8"));
    sp_pool_free(pool2);
}

int main(void) {
    sp_quant_init();
    test_types();
    test_tq();
    test_kernels();
    test_wide_kernels();
    test_cells();
    test_attention();
    printf("test_kv: %d checks, %d failed\n", test_checks, test_failures);
    return test_failures != 0;
}
