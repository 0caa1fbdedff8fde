/*
 * gptq.c -- calibrated rounding with error feedback (the GPTQ method:
 * Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
 * Pre-trained Transformers", 2022), on top of the native block quantizer.
 *
 * A weight row w is quantized one input channel j at a time; the rounding
 * error of channel j is spread over the channels not yet quantized so that
 * the layer's output error E[(w x - q x)^2] = (w - q)^T H (w - q), with H =
 * E[x x^T] from calibration, stays small -- not just each weight's own
 * error.  With U the upper Cholesky factor of H^-1 (channels in processing
 * order) the update after channel j is
 *     w[k] -= (w[j] - q[j]) / U[j][j] * U[j][k]    for every later k.
 * Blocks are processed in order; inside a block, channels go in order of
 * decreasing activation energy H[j][j] ("act-order" restricted to the block,
 * so that each block's scale can be chosen before any of its channels is
 * rounded).
 *
 * The block format stays the block quantizer's business (quant/native.c): at
 * the start of each block its scale (and min) is chosen by sp_quantize_rows
 * from the current, already compensated values; channels are then rounded to
 * that block's grid; the finished block is encoded again by sp_quantize_rows,
 * which finds the same grid (the values lie on it; a block where it does not
 * is counted and kept as encoded).  Only the documented block header
 * (docs/FORMAT.md: fp16 d, E8M0 exponent, fp16 d + fp16 m) is read here, to
 * know the grid.  Only native types: ggml blocks have sub-block scales this
 * does not model.
 */
#include "quantize.h"

#include "quant/native.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>

#define GPTQ_DAMP 0.01 /* of the mean diagonal, added to H's diagonal */

struct sp_gptq {
    int64_t n;
    double *u;      /* (n, n) upper Cholesky factor of (P (H + damp I) P^T)^-1, row-major */
    uint32_t *perm; /* (n) processing order: position k holds channel perm[k] */
};

void sp_gptq_free(struct sp_gptq *g) {
    if (!g) return;
    sp_free(g->u);
    sp_free(g->perm);
    sp_free(g);
}

/* In-place lower Cholesky factor of the n x n matrix a (only the lower
 * triangle is read and written).  False if a is not positive definite. */
static bool cholesky(double *a, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (int64_t k = 0; k < j; k++) s -= a[j * n + k] * a[j * n + k];
        if (!(s > 0)) return false;
        const double d = sqrt(s);
        a[j * n + j] = d;
        for (int64_t i = j + 1; i < n; i++) {
            double t = a[i * n + j];
            for (int64_t k = 0; k < j; k++) t -= a[i * n + k] * a[j * n + k];
            a[i * n + j] = t / d;
        }
    }
    return true;
}

/* U (upper) with (L L^T)^-1 = U^T U, from the lower factor L: invert L
 * (into tmp), form S = L^-T L^-1 (lower triangle, into l), factor S = C C^T
 * and return U = C^T. */
static bool inverse_upper_factor(double *l, int64_t n, double *tmp, double *u) {
    memset(tmp, 0, (size_t)(n * n) * sizeof(double));
    for (int64_t j = 0; j < n; j++) { /* forward substitution, column by column */
        tmp[j * n + j] = 1.0 / l[j * n + j];
        for (int64_t i = j + 1; i < n; i++) {
            double s = 0;
            for (int64_t k = j; k < i; k++) s -= l[i * n + k] * tmp[k * n + j];
            tmp[i * n + j] = s / l[i * n + i];
        }
    }
    for (int64_t i = 0; i < n; i++) { /* S[i][j] = sum_k Linv[k][i] Linv[k][j], k >= i >= j */
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t k = i; k < n; k++) s += tmp[k * n + i] * tmp[k * n + j];
            l[i * n + j] = s;
        }
    }
    if (!cholesky(l, n)) return false;
    memset(u, 0, (size_t)(n * n) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j <= i; j++) u[j * n + i] = l[i * n + j];
    }
    return true;
}

/* qsort key for the act-order sort: H's diagonal, descending, then index. */
struct keyed {
    double key;
    uint32_t idx;
};

static int by_key_desc(const void *pa, const void *pb) {
    const struct keyed *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? 1 : -1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* Build the factor; see quantize.h. */
sp_status sp_gptq_init(const double *h, int64_t n_full, const float *col_mul, const uint32_t *cols, int64_t n,
                       int64_t block, struct sp_gptq **out) {
    *out = NULL;
    struct sp_gptq *g = sp_calloc(1, sizeof(*g));
    double *a = sp_malloc((size_t)(n * n) * sizeof(double)), *tmp = sp_malloc((size_t)(n * n) * sizeof(double));
    struct keyed *kd = sp_malloc((size_t)n * sizeof(*kd));
    sp_status rc = SP_OK;
    if (!g || !a || !tmp || !kd || !(g->u = sp_malloc((size_t)(n * n) * sizeof(double))) ||
        !(g->perm = sp_malloc((size_t)n * sizeof(uint32_t)))) {
        rc = sp_err(SP_E_NOMEM, "sp_gptq_init: out of memory for a %lld x %lld factor", (long long)n, (long long)n);
        goto done;
    }
    g->n = n;
    /* H of the channels kept, for inputs divided by col_mul */
#define SRC(i) (cols ? cols[i] : (uint32_t)(i))
#define HS(x, y) (h[(int64_t)(x) * n_full + (y)] / (col_mul ? (double)col_mul[x] * col_mul[y] : 1.0))
    double mean = 0;
    for (int64_t i = 0; i < n; i++) {
        kd[i] = (struct keyed){HS(SRC(i), SRC(i)), (uint32_t)i};
        mean += kd[i].key;
    }
    mean = mean > 0 ? mean / (double)n : 1.0;
    for (int64_t j0 = 0; j0 < n; j0 += block) qsort(kd + j0, (size_t)SP_MIN(block, n - j0), sizeof(*kd), by_key_desc);
    for (int64_t i = 0; i < n; i++) g->perm[i] = kd[i].idx;
    bool ok = false;
    for (double damp = GPTQ_DAMP; !ok && damp < 10.0; damp *= 10.0) {
        for (int64_t i = 0; i < n; i++) {
            const uint32_t ci = SRC(g->perm[i]);
            for (int64_t j = 0; j <= i; j++) a[i * n + j] = HS(ci, SRC(g->perm[j]));
            if (a[i * n + i] <= 0) a[i * n + i] = mean; /* a channel calibration never excited */
            a[i * n + i] += damp * mean;
        }
        ok = cholesky(a, n) && inverse_upper_factor(a, n, tmp, g->u);
    }
#undef SRC
#undef HS
    if (!ok) rc = sp_err(SP_E_INVALID, "sp_gptq_init: the activation covariance is not positive definite");
done:
    sp_free(a);
    sp_free(tmp);
    sp_free(kd);
    if (rc) {
        sp_gptq_free(g);
        return rc;
    }
    *out = g;
    return SP_OK;
}

/* The grid of a block as the native quantizer encoded it: x -> its nearest
 * representable value, computed the way native.c's to_float computes values
 * (so that the encoded block reproduces it exactly). */
struct grid {
    float d, m, id;
    int lo, hi;
    bool asym;
};

static struct grid block_grid(const struct sp_native_layout *L, const uint8_t *blk) {
    struct grid g = {0};
    uint16_t h;
    g.asym = L->asym;
    if (L->e8) {
        g.d = sp_e8m0_to_fp32(blk[0]);
    } else {
        memcpy(&h, blk, 2);
        g.d = sp_fp16_to_fp32(h);
    }
    if (L->asym) {
        memcpy(&h, blk + 2, 2);
        g.m = sp_fp16_to_fp32(h);
        g.lo = 0;
        g.hi = (1 << L->bits) - 1;
    } else {
        g.lo = -(1 << (L->bits - 1));
        g.hi = (1 << (L->bits - 1)) - 1;
    }
    g.id = g.d != 0 && isfinite(g.d) ? 1.0f / g.d : 0.0f;
    return g;
}

static float grid_round(const struct grid *g, float x) {
    const float v = g->asym ? (x - g->m) * g->id : x * g->id;
    const float c = v < (float)g->lo ? (float)g->lo : v > (float)g->hi ? (float)g->hi : v; /* NaN -> hi */
    const float q = rintf(c);
    return g->asym ? g->d * q + g->m : g->d * q;
}

/* Quantize rows with error feedback; see quantize.h.  work: 3 * n + block
 * floats. */
sp_status sp_gptq_rows(const struct sp_gptq *g, uint32_t t, float *w, int64_t n_rows, const float *imp, void *dst,
                       float *work, int64_t *n_regrid) {
    const struct sp_native_layout *L = sp_native_layout(t);
    const int64_t n = g->n;
    if (!L) return sp_err(SP_E_INVALID, "sp_gptq_rows: type %s is not a native type", sp_qtype_name(t));
    const size_t rb = sp_qtype_row_bytes(t, n);
    const sp_to_float_fn to_float = sp_qtraits_get(t)->to_float;
    float *x = work, *pimp = work + n, *blk = work + 2 * n, *deq = work + 3 * n; /* x, imp in processing order */
    for (int64_t r = 0; r < n_rows; r++) {
        float *row = w + (size_t)(r * n);
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        for (int64_t k = 0; k < n; k++) {
            x[k] = row[g->perm[k]];
            pimp[k] = imp ? imp[g->perm[k]] : 1.0f;
        }
        for (int64_t j0 = 0; j0 < n; j0 += L->block, out += L->bytes) {
            const int64_t nv = SP_MIN((int64_t)L->block, n - j0);
            /* the block's grid, from its current values (order within a block does not matter) */
            sp_status rc = sp_quantize_rows(t, x + j0, 1, nv, imp ? pimp + j0 : NULL, out);
            if (rc) return rc;
            const struct grid gr = block_grid(L, out);
            for (int64_t j = j0; j < j0 + nv; j++) {
                const float q = grid_round(&gr, x[j]);
                const double e = ((double)x[j] - q) / g->u[j * n + j];
                x[j] = q;
                const double *uj = g->u + (size_t)(j * n);
                for (int64_t k = j + 1; k < n; k++) x[k] -= (float)(e * uj[k]);
            }
            /* back in channel order, encode the finished block */
            for (int64_t j = j0; j < j0 + nv; j++) row[g->perm[j]] = x[j];
            memcpy(blk, row + j0, (size_t)nv * sizeof(float));
            if ((rc = sp_quantize_rows(t, blk, 1, nv, imp ? imp + j0 : NULL, out))) return rc;
            to_float(out, deq, L->block);
            bool same = true;
            for (int64_t j = 0; j < nv; j++) same &= deq[j] == blk[j];
            if (!same) {
                (*n_regrid)++;
                memcpy(row + j0, deq, (size_t)nv * sizeof(float)); /* what the file holds */
            }
        }
    }
    return SP_OK;
}
