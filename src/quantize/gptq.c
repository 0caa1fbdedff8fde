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
 * Per row, on top of that: every block's grid (scale, and min for the
 * asymmetric kinds) is chosen when the pass reaches the block, among the
 * block quantizer's own choice (sp_quantize_rows on the compensated values)
 * and a few multiples of its scale, by the error the block adds after
 * feedback, sum ((x_j - q_j) / U_jj)^2 -- exactly its share of the row's
 * output error.  Then, codes fixed, the block scales are refit by least
 * squares on (w - q)^T H (w - q) (they interact through H), the row is
 * rounded again on the refit grids, and refit once more; the one of the
 * four with the least output error is then improved by a greedy search over
 * single codes (local_search) and a last refit, and written.  Blocks are encoded from
 * their codes and grid (sp_native_pack_block), so the file holds exactly the
 * values the feedback assumed.  Only native types: ggml blocks have
 * sub-block scales this does not model.
 */
#include "quantize.h"

#include "quant/native.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>

#define GPTQ_DAMP 0.01 /* of the mean diagonal, added to H's diagonal (0.001 and 0.1 measured worse) */

struct sp_gptq {
    int64_t n;
    double *u;      /* (n, n) upper Cholesky factor of (P (H + damp I) P^T)^-1, row-major */
    double *h;      /* (n, n) P (H + damp I) P^T itself, full, scaled to a mean diagonal of 1 */
    uint32_t *perm; /* (n) processing order: position k holds channel perm[k] */
};

void sp_gptq_free(struct sp_gptq *g) {
    if (!g) return;
    sp_free(g->u);
    sp_free(g->h);
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
        !(g->perm = sp_malloc((size_t)n * sizeof(uint32_t))) || !(g->h = sp_malloc((size_t)(n * n) * sizeof(double)))) {
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
        for (int64_t i = 0; i < n; i++) { /* the damped H, mirrored, for measuring errors */
            for (int64_t j = 0; j <= i; j++) g->h[i * n + j] = g->h[j * n + i] = a[i * n + j] / mean;
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

/* ---- rounding a row ------------------------------------------------------------
 * A block's grid: value = d * q + m for integer codes q in [lo, hi] (m = 0 for
 * the symmetric kinds); for the non-uniform kind, value = d * lv[q] with q the
 * index of a level.  d and m are always values the block header can hold
 * (FP16, or a power of two for E8M0 scales), so that the encoded block
 * decodes to exactly the values the error feedback assumed. */
struct grid {
    float d, m;
    float lo, hi;
    const int8_t *lv; /* the levels of a non-uniform kind, else NULL */
};

/* Scale candidates tried for each block around the block quantizer's own
 * choice, as factors of its d: the block quantizer minimises the block's own
 * (importance-weighted) error, while after error feedback the block's cost is
 * the feedback-weighted error below, whose optimum sits a little off it. */
static const float cand_f[] = {1.0f, 0.80f, 0.85f, 0.90f, 0.95f, 1.05f, 1.10f, 1.15f, 1.20f};
#define N_CAND ((int)(sizeof cand_f / sizeof cand_f[0]))
/* L8 scales: the three stored values on either side, 2^(k/8) for k = -3..3
 * (cand_f's factors, rounded to L8's 9% steps, would repeat some and miss
 * others: q4's mean KL on stories260K 0.0372 with them, 0.0365 with these). */
static const float cand_l8[] = {1.0f, 0.917004f, 1.090508f, 0.840896f, 1.189207f, 0.771105f, 1.296840f};
#define N_CAND_L8 ((int)(sizeof cand_l8 / sizeof cand_l8[0]))

static float store_m(const struct sp_native_layout *L, float m) {
    return L->asym ? sp_fp16_to_fp32(sp_fp32_to_fp16(m)) : 0.0f;
}

static struct grid make_grid(const struct sp_native_layout *L, float d, float m) {
    struct grid g = {sp_native_scale_round(L, d), store_m(L, m), 0, 0, NULL};
    if (L->nl) {
        g.hi = 15.0f;
        g.lv = sp_native_nl4;
    } else if (L->asym) {
        g.hi = (float)((1 << L->bits) - 1);
    } else {
        g.lo = (float)-(1 << (L->bits - 1));
        g.hi = (float)((1 << (L->bits - 1)) - 1);
    }
    return g;
}

/* The grid sp_quantize_rows chose for an encoded block. */
static struct grid header_grid(const struct sp_native_layout *L, const uint8_t *blk) {
    uint16_t h;
    const float d = sp_native_scale_get(L, blk);
    float m = 0;
    if (L->asym) {
        memcpy(&h, blk + 2, 2);
        m = sp_fp16_to_fp32(h);
    }
    return make_grid(L, d, m);
}

static float grid_code(const struct grid *g, float x) {
    if (!(g->d != 0) || !isfinite(g->d)) return 0.0f; /* a zero block: every value is m */
    const float v = (x - g->m) / g->d;
    if (g->lv) return (float)sp_native_nl4_index(v); /* the nearest level (NaN: the lowest) */
    const float c = v < g->lo ? g->lo : v > g->hi ? g->hi : v; /* NaN -> hi */
    return rintf(c);
}

/* The multiple of d that code q stands for. */
static float grid_level(const struct grid *g, float q) {
    return g->lv ? (float)g->lv[(int)q] : q;
}

static float grid_value(const struct grid *g, float q) {
    return g->d * grid_level(g, q) + g->m;
}

/* The feedback-weighted error of one block [j0, j1) rounded to grid g,
 * without touching x: sum_j ((x_j - q_j) / U_jj)^2, which is exactly what
 * the block adds to (w - q)^T H (w - q) given the blocks before it. */
static double block_cost(const struct sp_gptq *g, const float *x, int64_t j0, int64_t j1, const struct grid *gr,
                         float *tmp) {
    const int64_t n = g->n;
    memcpy(tmp, x + j0, (size_t)(j1 - j0) * sizeof(float));
    double cost = 0;
    for (int64_t j = j0; j < j1; j++) {
        const float q = grid_value(gr, grid_code(gr, tmp[j - j0]));
        const double e = ((double)tmp[j - j0] - q) / g->u[j * n + j];
        cost += e * e;
        const double *uj = g->u + (size_t)(j * n);
        for (int64_t k = j + 1; k < j1; k++) tmp[k - j0] -= (float)(e * uj[k]);
    }
    return cost;
}

/* One GPTQ pass over a row (processing order): x0 the weights, pimp their
 * importance (or NULL), grids of every block -- chosen here when choose is
 * set, else taken as given -- and the codes out.  x is scratch (n), tmp a
 * block, enc a block's bytes. */
static sp_status gptq_pass(const struct sp_gptq *g, const struct sp_native_layout *L, uint32_t t, const float *x0,
                           const float *pimp, bool choose, struct grid *grids, float *codes, float *x, float *tmp,
                           uint8_t *enc) {
    const int64_t n = g->n;
    memcpy(x, x0, (size_t)n * sizeof(float));
    for (int64_t j0 = 0, b = 0; j0 < n; j0 += L->block, b++) {
        const int64_t j1 = SP_MIN(j0 + (int64_t)L->block, n);
        if (choose) {
            sp_status rc = sp_quantize_rows(t, x + j0, 1, j1 - j0, pimp ? pimp + j0 : NULL, enc);
            if (rc) return rc;
            const struct grid base = header_grid(L, enc);
            double best = INFINITY;
            grids[b] = base; /* kept if no candidate's cost is a number */
            const float *cf = L->l8 ? cand_l8 : cand_f;
            for (int c = 0; c < (L->l8 ? N_CAND_L8 : N_CAND); c++) {
                struct grid cg = base;
                if (c > 0) {
                    if (L->e8) break; /* powers of two: the block quantizer already compared its neighbours */
                    /* asymmetric: scale about the middle of the range, so it stays covered */
                    const float mid = base.m + base.d * 0.5f * base.hi;
                    cg = make_grid(L, base.d * cf[c], L->asym ? mid - base.d * cf[c] * 0.5f * base.hi : 0.0f);
                }
                const double cost = block_cost(g, x, j0, j1, &cg, tmp);
                if (cost < best) {
                    best = cost;
                    grids[b] = cg;
                }
            }
        }
        const struct grid *gr = &grids[b];
        for (int64_t j = j0; j < j1; j++) {
            codes[j] = grid_code(gr, x[j]);
            const float q = grid_value(gr, codes[j]);
            const double e = ((double)x[j] - q) / g->u[j * n + j];
            x[j] = q;
            const double *uj = g->u + (size_t)(j * n);
            for (int64_t k = j + 1; k < n; k++) x[k] -= (float)(e * uj[k]);
        }
    }
    return SP_OK;
}

/* r = x0 - values, hr = H r; returns r^T H r. */
static double row_error(const struct sp_gptq *g, const struct sp_native_layout *L, const float *x0,
                        const struct grid *grids, const float *codes, double *r, double *hr) {
    const int64_t n = g->n;
    for (int64_t j = 0; j < n; j++) r[j] = (double)x0[j] - grid_value(&grids[j / L->block], codes[j]);
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        const double *hi = g->h + (size_t)(i * n);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += hi[j] * r[j];
        hr[i] = s;
        e += r[i] * s;
    }
    return e;
}

/* With the codes fixed, refit every block's d (and m) to minimise the row's
 * output error r^T H r: block coordinate descent, two sweeps (each block's
 * 1 x 1 or 2 x 2 least-squares step given the others), then rounding to
 * what the headers hold.  r, hr as row_error left them. */
static void refit(const struct sp_gptq *g, const struct sp_native_layout *L, const float *codes, struct grid *grids,
                  double *r, double *hr) {
    const int64_t n = g->n, nb = (n + L->block - 1) / L->block;
    for (int sweep = 0; sweep < 2; sweep++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t j0 = b * L->block, j1 = SP_MIN(j0 + (int64_t)L->block, n);
            /* columns: a = codes (for d), o = ones (for m) */
            const struct grid *gb = &grids[b];
            double aha = 0, aho = 0, oho = 0, ahr = 0, ohr = 0;
            for (int64_t i = j0; i < j1; i++) {
                const double *hi = g->h + (size_t)(i * n);
                double ha = 0, ho = 0;
                for (int64_t j = j0; j < j1; j++) {
                    ha += hi[j] * grid_level(gb, codes[j]);
                    ho += hi[j];
                }
                const double ai = grid_level(gb, codes[i]);
                aha += ai * ha;
                aho += ai * ho;
                oho += ho;
                ahr += ai * hr[i];
                ohr += hr[i];
            }
            double dd = 0, dm = 0;
            if (L->asym) {
                const double det = aha * oho - aho * aho;
                if (!(det > 1e-12 * aha * oho)) continue;
                dd = (oho * ahr - aho * ohr) / det;
                dm = (aha * ohr - aho * ahr) / det;
            } else {
                if (!(aha > 0)) continue;
                dd = ahr / aha;
            }
            if (!isfinite(dd) || !isfinite(dm)) continue;
            grids[b].d += (float)dd;
            grids[b].m += (float)dm;
            for (int64_t j = j0; j < j1; j++) { /* r -= delta, hr -= H delta */
                const double dj = dd * grid_level(gb, codes[j]) + dm;
                r[j] -= dj;
                for (int64_t i = 0; i < n; i++) hr[i] -= g->h[i * n + j] * dj;
            }
        }
    }
    for (int64_t b = 0; b < nb; b++) grids[b] = make_grid(L, grids[b].d, grids[b].m);
}

/* Greedy coordinate descent on the codes: each code in turn moves by +-1
 * (within its range) when that lowers the row's output error r^T H r, until
 * a sweep moves none (at most LS_SWEEPS).  GPTQ rounds each channel once,
 * given the ones before it; a later channel's rounding can make an earlier
 * choice worse, which this repairs.  r and hr are recomputed first and kept
 * current; returns the error. */
#define LS_SWEEPS 8

static double local_search(const struct sp_gptq *g, const struct sp_native_layout *L, const float *x0,
                           const struct grid *grids, float *codes, double *r, double *hr) {
    const int64_t n = g->n;
    double e = row_error(g, L, x0, grids, codes, r, hr);
    for (int sweep = 0; sweep < LS_SWEEPS; sweep++) {
        int64_t moved = 0;
        for (int64_t j = 0; j < n; j++) {
            const struct grid *gr = &grids[j / L->block];
            const double hjj = g->h[j * n + j];
            for (int sgn = -1; sgn <= 1; sgn += 2) {
                const float qn = codes[j] + (float)sgn;
                if (qn < gr->lo || qn > gr->hi) continue;
                const double dv = (double)grid_value(gr, qn) - grid_value(gr, codes[j]); /* r_j -= dv */
                const double de = -2.0 * dv * hr[j] + dv * dv * hjj;
                if (!(de < -1e-12 * e)) continue;
                codes[j] = qn;
                r[j] -= dv;
                const double *hj = g->h + (size_t)(j * n);
                for (int64_t k = 0; k < n; k++) hr[k] -= hj[k] * dv;
                e += de;
                moved++;
                break;
            }
        }
        if (!moved) break;
    }
    return e;
}

/* Quantize rows with error feedback; see quantize.h. */
sp_status sp_gptq_rows(const struct sp_gptq *g, uint32_t t, float *w, int64_t n_rows, const float *imp, void *dst,
                       struct sp_gptq_stats *st) {
    const struct sp_native_layout *L = sp_native_layout(t);
    if (!L) return sp_err(SP_E_INVALID, "sp_gptq_rows: type %s is not a native type", sp_qtype_name(t));
    const int64_t n = g->n, nb = (n + L->block - 1) / L->block;
    const size_t rb = sp_qtype_row_bytes(t, n);
    /* scratch: x0, pimp, x, codes, best codes (n floats each), a block, r and hr (n doubles), grids, codes */
    float *f = sp_malloc((size_t)(5 * n + L->block) * sizeof(float));
    double *r = sp_malloc((size_t)(2 * n) * sizeof(double));
    struct grid *grids = sp_malloc((size_t)(2 * nb) * sizeof(*grids));
    int32_t *ic = sp_malloc((size_t)L->block * sizeof(int32_t));
    uint8_t *enc = sp_malloc(L->bytes);
    sp_status rc = SP_OK;
    if (!f || !r || !grids || !ic || !enc) {
        rc = sp_err(SP_E_NOMEM, "sp_gptq_rows: out of memory");
        goto done;
    }
    float *x0 = f, *pimp = f + n, *x = f + 2 * n, *codes = f + 3 * n, *bcodes = f + 4 * n, *tmp = f + 5 * n;
    double *hr = r + n;
    struct grid *bgrids = grids + nb;
    for (int64_t row = 0; row < n_rows; row++) {
        float *wr = w + (size_t)(row * n);
        uint8_t *out = (uint8_t *)dst + (size_t)row * rb;
        for (int64_t k = 0; k < n; k++) {
            x0[k] = wr[g->perm[k]];
            pimp[k] = imp ? imp[g->perm[k]] : 1.0f;
        }
        /* GPTQ with per-block scale choice; then alternately refit the scales
         * for the codes and re-round with the refit scales; the candidate
         * with the least output error goes on to the local search. */
        double best = INFINITY;
        int best_step = 0;
        for (int step = 0; step < 4 && !rc; step++) {
            if (step == 0 || step == 2) {
                rc = gptq_pass(g, L, t, x0, imp ? pimp : NULL, step == 0, grids, codes, x, tmp, enc);
                if (rc) break;
            } else {
                refit(g, L, codes, grids, r, hr);
            }
            const double e = row_error(g, L, x0, grids, codes, r, hr);
            if (e < best) {
                best = e;
                memcpy(bcodes, codes, (size_t)n * sizeof(float));
                memcpy(bgrids, grids, (size_t)nb * sizeof(*grids));
                best_step = step;
            }
        }
        if (rc) break;
        /* single-code moves, then the scales refit for the moved codes (kept
         * only if that helps) */
        double e = local_search(g, L, x0, bgrids, bcodes, r, hr);
        memcpy(grids, bgrids, (size_t)nb * sizeof(*grids));
        refit(g, L, bcodes, grids, r, hr);
        if (row_error(g, L, x0, grids, bcodes, r, hr) < e) {
            memcpy(bgrids, grids, (size_t)nb * sizeof(*grids));
            best_step = 1;
        }
        /* back in channel order: encode each block from its codes */
        for (int64_t k = 0; k < n; k++) x[g->perm[k]] = bcodes[k];
        for (int64_t j0 = 0, b = 0; j0 < n; j0 += L->block, b++, out += L->bytes) {
            const int nv = (int)SP_MIN((int64_t)L->block, n - j0);
            for (int i = 0; i < nv; i++) ic[i] = (int32_t)x[j0 + i];
            if ((rc = sp_native_pack_block(t, ic, nv, bgrids[b].d, bgrids[b].m, out))) break;
            for (int i = 0; i < nv; i++) wr[j0 + i] = grid_value(&bgrids[b], x[j0 + i]);
        }
        if (st) {
            st->n_rows++;
            st->n_refit += best_step > 0;
        }
    }
done:
    sp_free(f);
    sp_free(r);
    sp_free(grids);
    sp_free(ic);
    sp_free(enc);
    return rc;
}
