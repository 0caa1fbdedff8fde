/*
 * calib.c -- calibration: run the model on a text and record, for every
 * weight a matrix product reads, the mean square of each input channel
 * (E[x_i^2] over tokens).  Weighted by it, quantization error is measured
 * where activations are large -- the diagonal of the layer's output-error
 * Hessian, as importance-matrix quantizers use it.
 *
 * Statistics come from the forward pass's observer hook (struct sp_fwd,
 * model/model.h), which sees each weight's input rows right before the
 * product.  The output head is the exception: the forward pass multiplies
 * it for the last token of a batch only, so it is skipped there and its
 * input (the final RMSNorm of every token's residual) is computed here.
 */
#include "quantize.h"

#include "core/file.h"
#include "model/ops.h"
#include "model/seq.h"

#include <math.h>

#define CALIB_TEXT_MAX ((uint64_t)64 << 20)
#define CALIB_SAMPLES 128                          /* input rows kept per distinct input */
#define CALIB_SAMPLE_BUDGET ((uint64_t)512 << 20)  /* bytes of them, all inputs together */

#define ROWCOV_TOKENS 1024  /* tokens sampled for the row Hessians */
#define ROWCOV_PMIN 1e-5    /* output rows of tokens less likely than this skip a token */

struct observer {
    const struct sp_model *m;
    const struct sp_model_file *mf;
    struct sp_calib *c;
    double *xx;   /* (n (n + 1) / 2) the current token's x x^T, lower triangle */
    float *act;   /* (max(2 n_ff, n_vocab)) row outputs */
};

static void add_scaled(double *restrict dst, const double *restrict src, double s, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] += s * src[k];
}

/* The row Hessians' share of one observed token x (n wide) of tensor i:
 * for an FFN gate, the rows of gate and up weighted by the SwiGLU product's
 * sensitivity to them (silu'(g) u for gate, silu(g) for up); for the output
 * head, the rows weighted by the token probabilities p_v (the diagonal of the
 * softmax's Fisher information, so that KL(ref || model) ~ sum_v p_v dz_v^2 / 2
 * up to the mean shift). */
static void observe_rows(struct observer *o, uint32_t i, const float *x, int64_t n) {
    struct sp_calib *c = o->c;
    const int64_t nt = n * (n + 1) / 2;
    for (int64_t a = 0, k = 0; a < n; a++) {
        for (int64_t b = 0; b <= a; b++) o->xx[k++] = (double)x[a] * x[b];
    }
    const int32_t il = c->rowcov_layer[i];
    if (il < (int32_t)o->mf->hp.n_layers) {
        const uint32_t iu = (uint32_t)(o->m->layers[il].ffn_up - o->mf->tensors);
        const int64_t nff = o->mf->tensors[i].ne[1];
        const float *wg = c->rowcov_w[i], *wu = c->rowcov_w[iu];
        for (int64_t j = 0; j < nff; j++) {
            float g = 0, u = 0;
            for (int64_t k = 0; k < n; k++) {
                g += wg[j * n + k] * x[k];
                u += wu[j * n + k] * x[k];
            }
            const double sg = 1.0 / (1.0 + exp(-(double)g)), silu = g * sg, dsilu = sg * (1.0 + g * (1.0 - sg));
            add_scaled(c->rowcov[i] + (size_t)(j * nt), o->xx, dsilu * dsilu * u * u, nt);
            add_scaled(c->rowcov[iu] + (size_t)(j * nt), o->xx, silu * silu, nt);
        }
        return;
    }
    const int64_t nv = o->mf->tensors[i].ne[1];
    const float *w = c->rowcov_w[i];
    float *z = o->act, zmax = -INFINITY;
    for (int64_t v = 0; v < nv; v++) {
        float s = 0;
        for (int64_t k = 0; k < n; k++) s += w[v * n + k] * x[k];
        z[v] = s;
        zmax = SP_MAX(zmax, s);
    }
    double sum = 0;
    for (int64_t v = 0; v < nv; v++) sum += exp((double)z[v] - zmax);
    for (int64_t v = 0; v < nv; v++) {
        const double p = exp((double)z[v] - zmax) / sum;
        if (p >= ROWCOV_PMIN) add_scaled(c->rowcov[i] + (size_t)(v * nt), o->xx, p, nt);
    }
}

/* sp_fwd_observe_fn: accumulate x^2 per input channel of t; when t owns
 * its input's extra statistics, x x^T (lower triangle) and every
 * sample_stride-th row as a sample. */
static void observe(void *ctx, const struct sp_tensor_desc *t, const float *x, int64_t x_ld, uint32_t n_tok) {
    struct observer *o = ctx;
    struct sp_calib *c = o->c;
    const ptrdiff_t i = t - o->mf->tensors;
    if (i < 0 || (uint32_t)i >= c->n_tensors || !c->sumsq[i]) return;
    double *s = c->sumsq[i], *cov = c->cov ? c->cov[i] : NULL;
    float *smp = c->sample ? c->sample[i] : NULL;
    const int64_t n = t->ne[0];
    const bool rows = c->rowcov && c->rowcov_layer[i] >= 0 && c->rowcov[i];
    for (uint32_t r = 0; r < n_tok; r++) {
        const float *xr = x + (size_t)r * (size_t)x_ld;
        if (rows && (c->count[i] + r) % (uint64_t)c->rowcov_stride == 0) observe_rows(o, (uint32_t)i, xr, n);
        for (int64_t k = 0; k < n; k++) s[k] += (double)xr[k] * xr[k];
        for (int64_t a = 0; cov && a < n; a++) {
            const double xa = xr[a];
            double *row = cov + (size_t)(a * n);
            for (int64_t b = 0; b <= a; b++) row[b] += xa * xr[b];
        }
        if (smp && (c->count[i] + r) % (uint64_t)c->sample_stride == 0 && c->n_sample[i] < c->sample_cap) {
            memcpy(smp + (size_t)c->n_sample[i]++ * (size_t)n, xr, (size_t)n * sizeof(float));
        }
    }
    c->count[i] += n_tok;
}

/* The tensors that own their input's extra statistics: one per distinct
 * input of a product (attn_k/v read attn_q's input, ffn_up ffn_gate's). */
static int owners_of(const struct sp_model *m, uint32_t il, const struct sp_tensor_desc **own) {
    if (il == m->mf->hp.n_layers) {
        own[0] = m->output;
        return 1;
    }
    const struct sp_layer_weights *L = &m->layers[il];
    own[0] = L->wq, own[1] = L->wo, own[2] = L->ffn_gate, own[3] = L->ffn_down;
    return 4;
}

/* Covariances and samples for the owners, each kind if all of it fits its
 * budget (all or nothing, so that every layer is treated alike). */
static sp_status extra_alloc(struct sp_model *m, struct sp_calib *c, uint64_t cov_budget, int32_t n_tokens) {
    const struct sp_model_file *mf = m->mf;
    const struct sp_tensor_desc *own[4];
    if (!(c->cov_of = sp_malloc(mf->n_tensors * sizeof(int32_t)))) {
        return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory");
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) c->cov_of[i] = -1;
    if (mf->hp.n_experts > 0) return SP_OK; /* expert inputs are routed: not modelled */
#define IDX(t) ((int32_t)((t) - mf->tensors))
    uint64_t cov_bytes = 0, smp_bytes = 0;
    for (uint32_t il = 0; il <= mf->hp.n_layers; il++) {
        const int n_own = owners_of(m, il, own);
        for (int k = 0; k < n_own; k++) {
            const uint64_t w = (uint64_t)own[k]->ne[0];
            cov_bytes += w * w * sizeof(double);
            smp_bytes += w * CALIB_SAMPLES * sizeof(float);
            c->cov_of[IDX(own[k])] = IDX(own[k]);
        }
        if (il < mf->hp.n_layers) {
            const struct sp_layer_weights *L = &m->layers[il];
            c->cov_of[IDX(L->wk)] = c->cov_of[IDX(L->wv)] = IDX(L->wq);
            c->cov_of[IDX(L->ffn_up)] = IDX(L->ffn_gate);
        }
    }
    /* row Hessians: FFN gate and up of every layer, and the output head */
    uint64_t row_bytes = 0;
    for (uint32_t il = 0; il <= mf->hp.n_layers; il++) {
        const struct sp_tensor_desc *t[2] = {il < mf->hp.n_layers ? m->layers[il].ffn_gate : m->output,
                                             il < mf->hp.n_layers ? m->layers[il].ffn_up : NULL};
        if (!t[0] || (!t[1] && il < mf->hp.n_layers)) continue;
        for (int k = 0; k < 2 && t[k]; k++) {
            const uint64_t w = (uint64_t)t[k]->ne[0];
            row_bytes += (uint64_t)t[k]->ne[1] * (w * (w + 1) / 2 * sizeof(double) + w * sizeof(float));
        }
    }
    const bool want_rows = cov_budget && cov_bytes + row_bytes <= cov_budget;
    const bool want_cov = cov_budget && cov_bytes <= cov_budget, want_smp = smp_bytes <= CALIB_SAMPLE_BUDGET;
    if (!want_cov) {
        SP_LOG_I("sp_calib_run: input covariances need %llu bytes: per-channel statistics only",
                 (unsigned long long)cov_bytes);
    }
    c->sample_cap = CALIB_SAMPLES;
    c->sample_stride = SP_MAX(1, n_tokens / CALIB_SAMPLES);
    if ((want_cov && !(c->cov = sp_calloc(mf->n_tensors, sizeof(*c->cov)))) ||
        (want_smp && (!(c->sample = sp_calloc(mf->n_tensors, sizeof(*c->sample))) ||
                      !(c->n_sample = sp_calloc(mf->n_tensors, sizeof(*c->n_sample)))))) {
        return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory");
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (c->cov_of[i] != (int32_t)i) continue;
        const size_t w = (size_t)mf->tensors[i].ne[0];
        if ((want_cov && !(c->cov[i] = sp_calloc(w * w, sizeof(double)))) ||
            (want_smp && !(c->sample[i] = sp_malloc(w * CALIB_SAMPLES * sizeof(float))))) {
            return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory for activation statistics");
        }
    }
    if (want_rows) {
        if (!(c->rowcov = sp_calloc(mf->n_tensors, sizeof(*c->rowcov))) ||
            !(c->rowcov_w = sp_calloc(mf->n_tensors, sizeof(*c->rowcov_w))) ||
            !(c->rowcov_layer = sp_malloc(mf->n_tensors * sizeof(int32_t)))) {
            return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory");
        }
        for (uint32_t i = 0; i < mf->n_tensors; i++) c->rowcov_layer[i] = -1;
        c->rowcov_stride = SP_MAX(1, n_tokens / ROWCOV_TOKENS);
        for (uint32_t il = 0; il <= mf->hp.n_layers; il++) {
            const struct sp_tensor_desc *t[2] = {il < mf->hp.n_layers ? m->layers[il].ffn_gate : m->output,
                                                 il < mf->hp.n_layers ? m->layers[il].ffn_up : NULL};
            if (!t[0] || (!t[1] && il < mf->hp.n_layers)) continue;
            c->rowcov_layer[IDX(t[0])] = (int32_t)il;
            for (int k = 0; k < 2 && t[k]; k++) {
                const size_t w = (size_t)t[k]->ne[0], nr = (size_t)t[k]->ne[1];
                if (!(c->rowcov[IDX(t[k])] = sp_calloc(nr * w * (w + 1) / 2, sizeof(double))) ||
                    !(c->rowcov_w[IDX(t[k])] = sp_malloc(nr * w * sizeof(float)))) {
                    return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory for row Hessians");
                }
                sp_status rc = sp_qread_rows(m, t[k], 0, (int64_t)nr, c->rowcov_w[IDX(t[k])]);
                if (rc) return rc;
            }
        }
    }
#undef IDX
    return SP_OK;
}

/* The covariance of tensor i's input, the lower triangle mirrored. */
const double *sp_calib_cov(const struct sp_calib *c, uint32_t i) {
    if (!c || !c->cov || i >= c->n_tensors || c->cov_of[i] < 0) return NULL;
    return c->cov[c->cov_of[i]];
}

const double *sp_calib_rowcov(const struct sp_calib *c, uint32_t i) {
    return c && c->rowcov && i < c->n_tensors ? c->rowcov[i] : NULL;
}

const float *sp_calib_samples(const struct sp_calib *c, uint32_t i, int32_t *n) {
    *n = 0;
    if (!c || !c->sample || i >= c->n_tensors || c->cov_of[i] < 0 || !c->sample[c->cov_of[i]]) return NULL;
    *n = c->n_sample[c->cov_of[i]];
    return c->sample[c->cov_of[i]];
}

void sp_calib_free(struct sp_calib *c) {
    if (!c) return;
    for (uint32_t i = 0; c->sumsq && i < c->n_tensors; i++) sp_free(c->sumsq[i]);
    sp_free(c->sumsq);
    sp_free(c->count);
    sp_free(c->width);
    for (uint32_t i = 0; c->cov && i < c->n_tensors; i++) sp_free(c->cov[i]);
    for (uint32_t i = 0; c->sample && i < c->n_tensors; i++) sp_free(c->sample[i]);
    sp_free(c->cov);
    sp_free(c->cov_of);
    for (uint32_t i = 0; c->rowcov && i < c->n_tensors; i++) sp_free(c->rowcov[i]);
    for (uint32_t i = 0; c->rowcov_w && i < c->n_tensors; i++) sp_free(c->rowcov_w[i]);
    sp_free(c->rowcov);
    sp_free(c->rowcov_w);
    sp_free(c->rowcov_layer);
    sp_free(c->sample);
    sp_free(c->n_sample);
    sp_free(c);
}

/* Accumulators for every matrix (2-D tensor): the ones a product reads get
 * filled, the rest are freed at the end. */
static sp_status calib_alloc(const struct sp_model_file *mf, struct sp_calib **out) {
    struct sp_calib *c = sp_calloc(1, sizeof(*c));
    if (!c) return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory");
    c->n_tensors = mf->n_tensors;
    c->sumsq = sp_calloc(mf->n_tensors, sizeof(*c->sumsq));
    c->count = sp_calloc(mf->n_tensors, sizeof(*c->count));
    c->width = sp_calloc(mf->n_tensors, sizeof(*c->width));
    if (!c->sumsq || !c->count || !c->width) goto nomem;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        c->width[i] = t->ne[0];
        if (t->n_dims != 2) continue;
        if (!(c->sumsq[i] = sp_calloc((size_t)t->ne[0], sizeof(double)))) goto nomem;
    }
    *out = c;
    return SP_OK;
nomem:
    sp_calib_free(c);
    return sp_err(SP_E_NOMEM, "sp_calib_run: out of memory for activation statistics");
}

/* The text of path, tokenized with BOS, into *toks (sp_malloc'd). */
static sp_status tokenize_file(const struct sp_model *m, const char *path, int32_t **toks, int32_t *n_out) {
    struct sp_file *f = NULL;
    char *text = NULL;
    int32_t *t = NULL;
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    const uint64_t size = sp_file_size(f);
    if (size > CALIB_TEXT_MAX) {
        rc = sp_err(SP_E_INVALID, "sp_calib_run: '%s' is %llu bytes; calibration reads at most %llu", path,
                    (unsigned long long)size, (unsigned long long)CALIB_TEXT_MAX);
        goto done;
    }
    if (!(text = sp_malloc((size_t)size + 1))) goto nomem;
    if ((rc = sp_file_read_at(f, 0, text, (size_t)size))) goto done;
    int32_t cap = (int32_t)size + 8, n = 0; /* SPM: at most one token per byte, plus BOS and the space prefix */
    if (!(t = sp_malloc((size_t)cap * sizeof(*t)))) goto nomem;
    rc = sp_tokenize(m, text, (size_t)size, SP_TOKENIZE_ADD_BOS, t, cap, &n);
    if (rc == SP_E_BUFFER) { /* a BPE vocabulary can in principle need more */
        int32_t *t2 = sp_realloc(t, (size_t)n * sizeof(*t));
        if (!t2) goto nomem;
        t = t2;
        rc = sp_tokenize(m, text, (size_t)size, SP_TOKENIZE_ADD_BOS, t, n, &n);
    }
    if (rc) goto done;
    *toks = t;
    *n_out = n;
    t = NULL;
    goto done;
nomem:
    rc = sp_err(SP_E_NOMEM, "sp_calib_run: out of memory reading '%s'", path);
done:
    sp_free(t);
    sp_free(text);
    sp_file_close(f);
    return rc;
}

/* Add the output head's input for n_tok tokens: rmsnorm(residual) * output_norm. */
static sp_status observe_output(struct sp_model *m, struct sp_fwd *f, uint32_t n_tok, struct observer *o) {
    const struct sp_hparams *hp = &m->mf->hp;
    const void *w;
    sp_status rc = sp_pager_pin(m->pager, m->output_norm, &w);
    if (rc) return rc;
    for (uint32_t t = 0; t < n_tok; t++) {
        sp_rmsnorm(f->xb, f->x + (size_t)t * hp->n_embd, w, m->output_norm->type, hp->n_embd, hp->rms_eps);
        observe(o, m->output, f->xb, hp->n_embd, 1);
    }
    sp_pager_unpin(m->pager, m->output_norm, w);
    return SP_OK;
}

/* Run m on the text at path; see quantize.h. */
sp_status sp_calib_run(struct sp_model *m, const char *path, int32_t n_chunks, int32_t ctx, int n_threads,
                       uint64_t cov_budget, struct sp_calib **out) {
    *out = NULL;
    const struct sp_hparams *hp = &m->mf->hp;
    struct sp_calib *c = NULL;
    struct sp_seq *seq = NULL;
    int32_t *toks = NULL, n_toks = 0;
    double *obs_xx = NULL;
    float *obs_act = NULL;
    sp_status rc;
    if (n_chunks <= 0 || ctx < 2) return sp_err(SP_E_INVALID, "%s: need chunks > 0 and ctx >= 2", __func__);
    if (hp->n_ctx_train && (uint32_t)ctx > hp->n_ctx_train) ctx = (int32_t)hp->n_ctx_train;
    if ((rc = tokenize_file(m, path, &toks, &n_toks))) goto done;
    if (n_toks < 2) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' gives %d token%s; calibration needs a text", __func__, path, n_toks,
                    n_toks == 1 ? "" : "s");
        goto done;
    }
    if (n_toks < ctx) ctx = n_toks;
    const int32_t avail = n_toks / ctx;
    if (n_chunks > avail) n_chunks = avail;
    if ((rc = calib_alloc(m->mf, &c)) || (rc = extra_alloc(m, c, cov_budget, n_chunks * ctx))) goto done;
    /* the same sequence object sessions decode with, F32 cache, one batch per chunk */
    const struct sp_seq_params sq = {.n_ctx = (uint32_t)ctx, .n_batch = (uint32_t)ctx, .n_threads = n_threads < 1 ? 1 : n_threads,
                                     .type_k = SP_KV_F32, .type_v = SP_KV_F32};
    if ((rc = sp_seq_init(m, &sq, &seq))) goto done;
    struct sp_fwd *f = seq->fwd;
    if (c->rowcov) {
        const int64_t w = hp->n_embd;
        if (!(obs_xx = sp_malloc((size_t)(w * (w + 1) / 2) * sizeof(double))) ||
            !(obs_act = sp_malloc((size_t)SP_MAX((int64_t)m->mf->vocab.n_tokens, 2 * (int64_t)m->n_ff_max) *
                                  sizeof(float)))) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            goto done;
        }
    }
    struct observer o = {m, m->mf, c, obs_xx, obs_act};
    f->observe = observe;
    f->observe_ctx = &o;
    const int32_t bos = m->mf->vocab.bos;
    for (int32_t k = 0; k < n_chunks; k++) {
        int32_t *chunk = toks + (size_t)k * (size_t)ctx;
        if (bos >= 0) chunk[0] = bos;
        /* each chunk from an empty sequence */
        sp_seq_reset(seq);
        if ((rc = sp_seq_decode(seq, chunk, (uint32_t)ctx, NULL, false, NULL))) goto done;
        if ((rc = observe_output(m, f, (uint32_t)ctx, &o))) goto done;
        c->n_tokens += ctx;
        c->n_chunks++;
    }
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        if (c->count[i] == 0) {
            sp_free(c->sumsq[i]);
            c->sumsq[i] = NULL;
        }
        double *cov = c->cov ? c->cov[i] : NULL;
        for (int64_t a = 0; cov && a < c->width[i]; a++) { /* mirror the lower triangle */
            for (int64_t b = 0; b < a; b++) cov[b * c->width[i] + a] = cov[a * c->width[i] + b];
        }
        if (c->rowcov_w) { /* the weights were only needed while observing */
            sp_free(c->rowcov_w[i]);
            c->rowcov_w[i] = NULL;
        }
    }
    *out = c;
    c = NULL;
done:
    sp_seq_free(seq);
    sp_free(toks);
    sp_free(obs_xx);
    sp_free(obs_act);
    sp_calib_free(c);
    return rc;
}

/* Mean x^2 per channel, floored at CALIB_FLOOR times the mean over channels:
 * a channel the calibration text never excited still counts a little, so a
 * text unlike the calibration one does not meet weights nobody fitted. */
#define CALIB_FLOOR 0.01

bool sp_calib_importance(const struct sp_calib *c, uint32_t i, float *imp) {
    if (!c || i >= c->n_tensors || !c->sumsq[i] || c->count[i] == 0) return false;
    const int64_t n = c->width[i];
    const double inv = 1.0 / (double)c->count[i];
    double mean = 0;
    for (int64_t k = 0; k < n; k++) mean += c->sumsq[i][k] * inv;
    mean /= (double)n;
    for (int64_t k = 0; k < n; k++) imp[k] = (float)(c->sumsq[i][k] * inv + CALIB_FLOOR * mean);
    return true;
}
