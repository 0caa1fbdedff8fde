/*
 * eval.c -- model quality over a token sequence: perplexity the way
 * llama.cpp's llama-perplexity computes it, and against a reference model the
 * KL divergence of the next-token distributions and top-1 agreement
 * (sp_eval); and a text sampled from a model, for quality figures without a
 * dataset (sp_eval_generate).  The method is stated in include/sparrow.h.
 *
 * A client of the public session API, like the CLI: it owns its sessions
 * (logits_all, so one decode gives every position's logits) and all its
 * scratch, allocated once before the first chunk.  Invariants: positions are
 * scored in text order and every statistic accumulates in double, so the
 * figures depend on the logits alone (not on n_batch or thread count); the
 * model and the reference always see the same tokens at the same positions.
 */
#include "sparrow.h"

#include "core/core.h"
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_MAX_DEFAULT_CTX 512u /* n_ctx = 0: the model's context, capped here */
#define EVAL_MAX_DEFAULT_BATCH 512u
#define EVAL_MIN_CTX 4            /* the second half must hold a scored position */
#define EVAL_KL_PERCENTILE 0.99

struct sp_eval_params sp_eval_default_params(void) {
    return (struct sp_eval_params){.n_ctx = 0, .n_batch = 0, .n_threads = 0, .kv_type_k = SP_KV_F32,
                                   .kv_type_v = SP_KV_F32, .ref_kv_type_k = SP_KV_F32, .ref_kv_type_v = SP_KV_F32,
                                   .stream = false, .n_keep = 0, .n_discard = 0, .progress = NULL,
                                   .progress_user = NULL};
}

/* ---- per-position statistics -------------------------------------------- */

/* Running sums over the scored positions. */
struct eval_acc {
    int64_t n;
    double nll, nll2;         /* model: sum of NLL and of NLL^2 */
    double ref_nll, ref_nll2; /* reference: the same */
    double kl, kl2, kl_max;
    int64_t agree;
    double *kls;              /* (capacity) every position's KL, for the percentile */
};

/* log(sum_v exp(x_v)) of one row of logits, in double, and the argmax
 * (lowest id among equal maxima). */
static double row_logsumexp(const float *x, int32_t n, int32_t *argmax) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++) {
        if (x[v] > x[best]) best = v;
    }
    const double mx = x[best];
    double sum = 0.0;
    for (int32_t v = 0; v < n; v++) sum += exp((double)x[v] - mx);
    *argmax = best;
    return mx + log(sum);
}

/* KL(ref || model) of one position from the two rows and their log-sum-exps. */
static double row_kl(const float *ref, double lse_ref, const float *model, double lse_model, int32_t n) {
    double kl = 0.0;
    for (int32_t v = 0; v < n; v++) {
        const double lp_ref = (double)ref[v] - lse_ref;
        const double lp_model = (double)model[v] - lse_model;
        kl += exp(lp_ref) * (lp_ref - lp_model);
    }
    return kl;
}

/* Score one position: model (and reference, when ref_row != NULL) logits
 * predicting token next. */
static void score(struct eval_acc *a, const float *row, const float *ref_row, int32_t n_vocab, int32_t next) {
    int32_t top, ref_top;
    const double lse = row_logsumexp(row, n_vocab, &top);
    const double nll = lse - (double)row[next];
    a->nll += nll;
    a->nll2 += nll * nll;
    if (ref_row) {
        const double ref_lse = row_logsumexp(ref_row, n_vocab, &ref_top);
        const double ref_nll = ref_lse - (double)ref_row[next];
        a->ref_nll += ref_nll;
        a->ref_nll2 += ref_nll * ref_nll;
        const double kl = row_kl(ref_row, ref_lse, row, lse, n_vocab);
        a->kl += kl;
        a->kl2 += kl * kl;
        if (a->n == 0 || kl > a->kl_max) a->kl_max = kl;
        a->kls[a->n] = kl;
        a->agree += top == ref_top;
    }
    a->n++;
}

/* The standard error of a mean from the sums of x and x^2 over n samples
 * (llama-perplexity's estimate): sqrt((E[x^2] - E[x]^2) / (n - 1)). */
static double std_error(double sum, double sum2, int64_t n) {
    if (n < 2) return 0.0;
    const double mean = sum / (double)n, var = sum2 / (double)n - mean * mean;
    return var > 0.0 ? sqrt(var / (double)(n - 1)) : 0.0;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The p-quantile of v[0..n) by linear interpolation between order
 * statistics (sorts v). */
static double percentile(double *v, int64_t n, double p) {
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    const double pos = p * (double)(n - 1);
    const int64_t lo = (int64_t)pos;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

static void fill_result(const struct eval_acc *a, bool with_ref, struct sp_eval_result *r) {
    const double n = (double)a->n;
    r->n_scored = a->n;
    r->ppl = exp(a->nll / n);
    r->ppl_err = r->ppl * std_error(a->nll, a->nll2, a->n);
    r->ref_ppl = r->ref_ppl_err = r->kl_mean = r->kl_mean_err = r->kl_p99 = r->kl_max = r->top1_agree = NAN;
    if (!with_ref) return;
    r->ref_ppl = exp(a->ref_nll / n);
    r->ref_ppl_err = r->ref_ppl * std_error(a->ref_nll, a->ref_nll2, a->n);
    r->kl_mean = a->kl / n;
    r->kl_mean_err = std_error(a->kl, a->kl2, a->n);
    r->kl_max = a->kl_max;
    r->top1_agree = (double)a->agree / n;
}

/* ---- sp_eval --------------------------------------------------------------- */

/* Chunk c through both sessions, n_batch tokens per decode, scoring the
 * positions first .. n_ctx-2 as their logits arrive. */
static sp_status eval_chunk(struct sp_session *sm, struct sp_session *sr, const int32_t *chunk, int32_t n_ctx,
                            int32_t n_batch, int32_t bos, int32_t n_vocab, int32_t *batch, struct eval_acc *a,
                            double *kv_bits) {
    const int32_t first = n_ctx / 2;
    sp_status rc;
    sp_session_reset(sm);
    if (sr) sp_session_reset(sr);
    for (int32_t b0 = 0; b0 < n_ctx; b0 += n_batch) {
        const int32_t nb = SP_MIN(n_batch, n_ctx - b0);
        for (int32_t i = 0; i < nb; i++) batch[i] = chunk[b0 + i];
        if (b0 == 0 && bos >= 0) batch[0] = bos;
        if ((rc = sp_decode(sm, batch, nb))) return rc;
        if (sr && (rc = sp_decode(sr, batch, nb))) return rc;
        for (int32_t j = SP_MAX(b0, first); j < SP_MIN(b0 + nb, n_ctx - 1); j++) {
            const float *row = sp_get_logits_ith(sm, j - b0);
            const float *ref_row = sr ? sp_get_logits_ith(sr, j - b0) : NULL;
            score(a, row, ref_row, n_vocab, chunk[j + 1]);
        }
    }
    struct sp_kv_info ki;
    if (sp_session_kv_info(sm, &ki) == SP_OK) *kv_bits = ki.bits_per_value;
    return SP_OK;
}

/* Streaming: every token through one shifting session per model, one
 * decode each; positions first .. n-2 scored. */
static sp_status eval_stream(struct sp_session *sm, struct sp_session *sr, const int32_t *toks, int32_t n, int32_t first,
                             int32_t bos, int32_t n_vocab, struct eval_acc *a, double *kv_bits) {
    sp_status rc;
    for (int32_t j = 0; j < n - 1; j++) {
        const int32_t t = j == 0 && bos >= 0 ? bos : toks[j];
        if ((rc = sp_decode(sm, &t, 1))) return rc;
        if (sr && (rc = sp_decode(sr, &t, 1))) return rc;
        if (j >= first) score(a, sp_get_logits(sm), sr ? sp_get_logits(sr) : NULL, n_vocab, toks[j + 1]);
        struct sp_kv_info ki;
        if (sp_session_n_past(sm) == sp_session_n_ctx(sm) && sp_session_kv_info(sm, &ki) == SP_OK)
            *kv_bits = ki.bits_per_value;
    }
    return SP_OK;
}

/* The models' shared facts: n_vocab and the BOS that replaces each chunk's
 * first token (-1 when the vocabulary adds none). */
static sp_status check_models(struct sp_model *model, struct sp_model *ref, int32_t *n_vocab, int32_t *bos,
                              int32_t *n_ctx_train) {
    struct sp_model_info mi, ri;
    sp_status rc = sp_model_get_info(model, &mi);
    if (rc) return rc;
    if (ref) {
        if ((rc = sp_model_get_info(ref, &ri))) return rc;
        if (ri.n_vocab != mi.n_vocab) {
            return sp_err(SP_E_INVALID, "eval: the model's vocabulary has %d tokens but the reference's has %d: "
                          "comparing distributions needs a shared vocabulary", mi.n_vocab, ri.n_vocab);
        }
        if (ri.bos != mi.bos) {
            return sp_err(SP_E_INVALID, "eval: the model's BOS is token %d but the reference's is %d: "
                          "comparing distributions needs a shared vocabulary", mi.bos, ri.bos);
        }
    }
    *n_vocab = mi.n_vocab;
    *bos = mi.add_bos ? mi.bos : -1;
    *n_ctx_train = mi.n_ctx_train;
    return SP_OK;
}

sp_status sp_eval(struct sp_model *model, struct sp_model *ref, const int32_t *tokens, int32_t n_tokens,
                  const struct sp_eval_params *params, struct sp_eval_result *out) {
    if (!model || !out || (!tokens && n_tokens > 0) || n_tokens < 0) {
        return sp_err(SP_E_INVALID, "%s: invalid argument", __func__);
    }
    const struct sp_eval_params p = params ? *params : sp_eval_default_params();
    int32_t n_vocab = 0, bos = -1, n_ctx_train = 0;
    sp_status rc = check_models(model, ref, &n_vocab, &bos, &n_ctx_train);
    if (rc) return rc;
    int32_t n_ctx = p.n_ctx;
    if (n_ctx == 0) n_ctx = n_ctx_train > 0 ? (int32_t)SP_MIN((uint32_t)n_ctx_train, EVAL_MAX_DEFAULT_CTX) : 512;
    if (n_ctx < EVAL_MIN_CTX) {
        return sp_err(SP_E_INVALID, "%s: n_ctx %d is too small: chunks need at least %d tokens", __func__, n_ctx,
                      EVAL_MIN_CTX);
    }
    if (p.n_batch < 0) return sp_err(SP_E_INVALID, "%s: n_batch %d is negative", __func__, p.n_batch);
    if ((int64_t)n_tokens < 2 * (int64_t)n_ctx) {
        return sp_err(SP_E_INVALID, "%s: %d tokens are too few for chunks of %d: need at least %lld (2 x the context)",
                      __func__, n_tokens, n_ctx, 2 * (long long)n_ctx);
    }
    const int32_t n_batch = SP_MIN(p.n_batch ? p.n_batch : (int32_t)EVAL_MAX_DEFAULT_BATCH, n_ctx);
    const int32_t n_chunks = p.stream ? 1 : n_tokens / n_ctx;
    const int64_t per_chunk = p.stream ? n_tokens - 1 - n_ctx / 2 : n_ctx - 1 - n_ctx / 2;
    if (p.stream && (p.n_keep < 0 || p.n_keep >= n_ctx || p.n_discard < 0 || p.n_discard > n_ctx - p.n_keep)) {
        return sp_err(SP_E_INVALID, "%s: streaming needs 0 <= n_keep < n_ctx and 0 <= n_discard <= n_ctx - n_keep "
                      "(got keep %d, discard %d, ctx %d)", __func__, p.n_keep, p.n_discard, n_ctx);
    }

    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.n_threads = p.n_threads;
    sp.kv_type_k = p.kv_type_k;
    sp.kv_type_v = p.kv_type_v;
    sp.logits_all = !p.stream;
    if (p.stream) {
        sp.ctx_shift = true;
        sp.n_keep = p.n_keep;
        sp.n_discard = p.n_discard ? p.n_discard : 1;
        sp.n_batch = 1;
    }
    struct sp_session_params sp_ref = sp;
    sp_ref.kv_type_k = p.ref_kv_type_k;
    sp_ref.kv_type_v = p.ref_kv_type_v;
    struct sp_session *sm = NULL, *sr = NULL;
    struct eval_acc a = {0};
    int32_t *batch = sp_malloc((size_t)n_batch * sizeof(*batch));
    if (ref) a.kls = sp_malloc((size_t)(per_chunk * n_chunks) * sizeof(*a.kls));
    if (!batch || (ref && !a.kls)) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    if ((rc = sp_session_init(model, &sp, &sm))) goto done;
    if (ref && (rc = sp_session_init(ref, &sp_ref, &sr))) goto done;

    memset(out, 0, sizeof(*out));
    out->n_tokens = n_tokens;
    out->n_ctx = n_ctx;
    out->n_chunks = n_chunks;
    out->kv_bits_per_value = NAN;
    for (int32_t c = 0; c < n_chunks; c++) {
        rc = p.stream ? eval_stream(sm, sr, tokens, n_tokens, n_ctx / 2, bos, n_vocab, &a, &out->kv_bits_per_value)
                      : eval_chunk(sm, sr, tokens + (size_t)c * (size_t)n_ctx, n_ctx, n_batch, bos, n_vocab, batch,
                                   &a, &out->kv_bits_per_value);
        if (rc) goto done;
        out->n_done = c + 1;
        fill_result(&a, ref != NULL, out);
        if (p.progress && !p.progress(out, p.progress_user)) {
            rc = sp_err(SP_E_STATE, "%s: cancelled after chunk %d of %d", __func__, c + 1, n_chunks);
            goto done;
        }
    }
    if (ref) out->kl_p99 = percentile(a.kls, a.n, EVAL_KL_PERCENTILE);
done:
    sp_session_free(sm);
    sp_session_free(sr);
    sp_free(a.kls);
    sp_free(batch);
    return rc;
}

/* ---- sp_eval_generate --------------------------------------------------------- */

sp_status sp_eval_generate(struct sp_model *model, int32_t n_tokens, int32_t seg_len, uint64_t seed,
                           int32_t n_threads, int32_t *tokens) {
    if (!model || !tokens || n_tokens < 1 || seg_len < 2) {
        return sp_err(SP_E_INVALID, "%s: need a model, an output buffer, n_tokens >= 1 and seg_len >= 2", __func__);
    }
    struct sp_model_info mi;
    sp_status rc = sp_model_get_info(model, &mi);
    if (rc) return rc;
    if (mi.bos < 0) return sp_err(SP_E_UNSUPPORTED, "%s: the vocabulary has no BOS token to start from", __func__);

    /* Temperature 1 over the full distribution: every filter off. */
    const struct sp_sampling_params plain = {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                             .repeat_penalty = 1.0f, .repeat_last_n = 0};
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = seg_len;
    sp.n_threads = n_threads;
    sp.kv_type_k = sp.kv_type_v = SP_KV_F32; /* the sampled text must not depend on the session default */
    struct sp_session *s = NULL;
    struct sp_sampler *smp = NULL;
    if ((rc = sp_sampler_init(&plain, seed, mi.n_vocab, &smp))) goto done;
    if ((rc = sp_session_init(model, &sp, &s))) goto done;
    for (int32_t pos = 0; pos < n_tokens; pos += seg_len) {
        const int32_t len = SP_MIN(seg_len, n_tokens - pos);
        int32_t *seg = tokens + pos;
        sp_session_reset(s);
        seg[0] = mi.bos;
        for (int32_t k = 1; k < len; k++) {
            if ((rc = sp_decode(s, &seg[k - 1], 1))) goto done;
            seg[k] = sp_sampler_sample(smp, sp_get_logits(s));
        }
    }
done:
    sp_session_free(s);
    sp_sampler_free(smp);
    return rc;
}
