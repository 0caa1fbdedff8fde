/*
 * work.c -- the shard loop (package.h): items taken in increasing order by
 * a few threads, an optional in-order section per item, the first failure
 * kept with its message, progress reported on the caller's thread.  Also
 * the per-thread scratch buffers and the zstd compression call.
 */
#include "package.h"

#include "sched/pool.h"

#include <stdio.h>

#include <zstd.h>

int sp_package_threads(int n_threads) {
    return n_threads <= 0 ? 1 : SP_MIN(n_threads, 256);
}

double sp_package_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sp_package_count_kinds(const struct sp_patch_record *recs, uint32_t n, struct sp_package_stats *st) {
    st->n_ref = st->n_whole = st->n_delta = 0;
    for (uint32_t i = 0; i < n; i++) {
        st->n_ref += recs[i].kind == SP_PATCH_REF;
        st->n_whole += recs[i].kind == SP_PATCH_WHOLE;
        st->n_delta += recs[i].kind == SP_PATCH_DELTA;
    }
}

static void fail_with(struct sp_work *w, sp_status rc, const char *msg) {
    pthread_mutex_lock(&w->mu);
    if (!w->rc) {
        w->rc = rc;
        snprintf(w->msg, sizeof w->msg, "%s", msg && *msg ? msg : sp_status_str(rc));
    }
    atomic_store(&w->failed, 1);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

bool sp_work_turn(struct sp_work *w, uint32_t i) {
    pthread_mutex_lock(&w->mu);
    while (w->turn != i && !atomic_load(&w->failed)) pthread_cond_wait(&w->cv, &w->mu);
    const bool ok = !atomic_load(&w->failed);
    pthread_mutex_unlock(&w->mu);
    return ok;
}

void sp_work_add(struct sp_work *w, uint64_t units) {
    atomic_fetch_add(&w->done, units);
}

static void task(void *arg, int ith, int nth) {
    (void)nth;
    struct sp_work *w = arg;
    for (;;) {
        if (atomic_load(&w->failed)) return;
        const uint32_t i = atomic_fetch_add(&w->next, 1u);
        if (i >= w->n_items) return;
        sp_status rc = w->fn(w->ctx, i, ith);
        if (rc) {
            fail_with(w, rc, sp_last_error());
            return;
        }
        if (w->ordered) { /* close item i's turn (fn may not have waited for it) */
            if (!sp_work_turn(w, i)) return;
            pthread_mutex_lock(&w->mu);
            w->turn = i + 1;
            pthread_cond_broadcast(&w->cv);
            pthread_mutex_unlock(&w->mu);
        }
        if (ith == 0 && w->progress && !w->progress(atomic_load(&w->done), w->total, w->progress_user)) {
            fail_with(w, SP_E_STATE, "cancelled");
            return;
        }
    }
}

sp_status sp_work_run(struct sp_work *w) {
    atomic_init(&w->next, 0u);
    atomic_init(&w->done, 0u);
    atomic_init(&w->failed, 0);
    w->turn = 0;
    w->rc = SP_OK;
    w->msg[0] = '\0';
    if (w->n_items == 0) return SP_OK;
    const int nth = (int)SP_MIN((uint32_t)sp_package_threads(w->n_threads), w->n_items);
    struct sp_pool *pool = NULL;
    sp_status rc = sp_pool_init(nth, &pool);
    if (rc) return rc;
    if (pthread_mutex_init(&w->mu, NULL) || pthread_cond_init(&w->cv, NULL)) {
        sp_pool_free(pool);
        return sp_err(SP_E_NOMEM, "%s: cannot create locks", __func__);
    }
    sp_pool_run(pool, task, w);
    sp_pool_free(pool);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    if (w->rc) return sp_err(w->rc, "%s", w->msg);
    if (w->progress) (void)w->progress(atomic_load(&w->done), w->total, w->progress_user);
    return SP_OK;
}

/* ---- scratch ---------------------------------------------------------------- */

sp_status sp_scratch_grow(uint8_t **buf, size_t *cap, size_t n) {
    if (n <= *cap && *buf) return SP_OK;
    sp_free(*buf);
    *cap = 0;
    if (!(*buf = sp_malloc(n ? n : 1))) return sp_err(SP_E_NOMEM, "out of memory for a %zu-byte shard buffer", n);
    *cap = n;
    return SP_OK;
}

sp_status sp_scratch_ctx(struct sp_scratch *s) {
    if (!s->cctx) s->cctx = ZSTD_createCCtx();
    if (!s->dctx) s->dctx = ZSTD_createDCtx();
    if (!s->cctx || !s->dctx) return sp_err(SP_E_NOMEM, "out of memory for zstd contexts");
    return SP_OK;
}

struct sp_scratch *sp_scratch_array(int n) {
    struct sp_scratch *sc = sp_calloc((size_t)(n > 0 ? n : 1), sizeof *sc);
    if (!sc) (void)sp_err(SP_E_NOMEM, "out of memory for %d shard buffers", n);
    return sc;
}

void sp_scratch_array_free(struct sp_scratch *sc, int n) {
    if (!sc) return;
    for (int t = 0; t < n; t++) sp_scratch_free(&sc[t]);
    sp_free(sc);
}

void sp_scratch_free(struct sp_scratch *s) {
    sp_free(s->raw);
    sp_free(s->comp);
    sp_free(s->old);
    sp_free(s->delta);
    ZSTD_freeCCtx(s->cctx);
    ZSTD_freeDCtx(s->dctx);
    memset(s, 0, sizeof *s);
}

static unsigned ceil_log2(uint64_t x) {
    unsigned l = 0;
    while (l < 63 && ((uint64_t)1 << l) < x) l++;
    return l;
}

sp_status sp_zcompress(struct sp_scratch *s, uint8_t **buf, size_t *cap, const void *src, size_t n, int level,
                       const void *prefix, size_t prefix_n, size_t *out_n) {
    sp_status rc = sp_scratch_ctx(s);
    if (rc) return rc;
    if ((rc = sp_scratch_grow(buf, cap, ZSTD_compressBound(n)))) return rc;
    ZSTD_CCtx *c = s->cctx;
    ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
    size_t r = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    if (prefix && !ZSTD_isError(r)) {
        const unsigned wlog = SP_MAX(10u, SP_MIN(31u, ceil_log2((uint64_t)prefix_n + n)));
        r = ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, (int)wlog);
        if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(c, ZSTD_c_enableLongDistanceMatching, 1);
        if (!ZSTD_isError(r)) r = ZSTD_CCtx_refPrefix(c, prefix, prefix_n);
    }
    if (!ZSTD_isError(r)) r = ZSTD_compress2(c, *buf, *cap, src, n);
    if (ZSTD_isError(r)) return sp_err(SP_E_NOMEM, "zstd compression failed: %s", ZSTD_getErrorName(r));
    *out_n = r;
    return SP_OK;
}
