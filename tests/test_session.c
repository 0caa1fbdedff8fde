/*
 * test_session.c -- the conversation-memory API: saved sessions continue bit
 * for bit (greedy and sampled, every cache type, after context shifts), a
 * truncation re-decodes to a fresh decode's bits, foreign / truncated /
 * corrupt / mismatched files are refused with a message and leave the
 * session untouched, a context shift equals attention over the same cells
 * without one (RoPE's relative positions), the abort callback, sampling
 * changes between calls and the tokens the session holds.
 */
#include "test_util.h"

#include "sparrow.h"

#include "core/hash.h"
#include "kv/cells.h"
#include "mem/pager.h"
#include "model/seq.h"

#include <float.h>
#include <sys/stat.h>

#define QWEN3 "models/tiny-qwen/tiny-qwen3-f32.gguf"
#define QWEN2 "models/tiny-qwen/tiny-qwen2-f32.gguf"
#define STORIES "models/stories260K/stories260K-f32.gguf"

static struct sp_model *load(const char *rel) {
    const char *p = need_fixture(rel);
    struct sp_model *m = NULL;
    if (p && sp_model_load(p, NULL, &m) != SP_OK) {
        fprintf(stderr, "load %s: %s\n", p, sp_last_error());
        test_failures++;
    }
    return m;
}

static struct sp_session_params params(int32_t n_ctx, enum sp_kv_type t, float temp) {
    struct sp_session_params p = sp_session_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.seed = 42;
    p.kv_type_k = p.kv_type_v = t;
    p.sampling.temp = temp;
    p.sampling.repeat_penalty = 1.1f;
    p.sampling.repeat_last_n = 16;
    return p;
}

static struct sp_session *session(struct sp_model *m, const struct sp_session_params *p) {
    struct sp_session *s = NULL;
    sp_status st = m ? sp_session_init(m, p, &s) : SP_E_INVALID;
    CHECKF(st == SP_OK, "session: %s", sp_last_error());
    return s;
}

/* A pseudo-random prompt of n ids below n_vocab (BOS first). */
static void prompt(int32_t *t, int n, int32_t n_vocab) {
    uint32_t x = 777;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)((x >> 8) % (uint32_t)n_vocab);
    }
    t[0] = 1;
}

static const char *tmp_path(const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/sp_test_session_%d_%s", scratch_dir(), (int)getpid(), name);
    return buf[k];
}

/* Generate n tokens (sample, decode), recording every step's logits. */
static sp_status gen(struct sp_session *s, int n, int32_t n_vocab, float *logits, int32_t *toks) {
    for (int i = 0; i < n; i++) {
        int32_t t;
        sp_status st = sp_sample(s, &t);
        if (!st) st = sp_decode(s, &t, 1);
        if (st) return st;
        toks[i] = t;
        memcpy(logits + (size_t)i * n_vocab, sp_get_logits(s), (size_t)n_vocab * sizeof(float));
    }
    return SP_OK;
}

static void test_save_load(void) {
    struct sp_model *m = load(QWEN3), *m2 = load(QWEN3), *other = load(QWEN2);
    if (!m || !m2 || !other) goto out;
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    const int32_t V = mi.n_vocab;
    enum { NP = 100, NG = 24 };
    int32_t p[NP];
    prompt(p, NP, V);
    static float la[NG * 512], lb[NG * 512];
    int32_t ta[NG], tb[NG];
    const enum sp_kv_type types[] = {SP_KV_F32, SP_KV_F16, SP_KV_Q8_0, SP_KV_Q4_0, SP_KV_Q4H};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (int shift = 0; shift <= 1; shift++) {
            const float temp = ti % 2 ? 0.0f : 0.9f; /* greedy and sampled */
            struct sp_session_params sp = params(shift ? 110 : 128, types[ti], temp);
            sp.ctx_shift = shift;
            sp.n_keep = 4;
            struct sp_session *a = session(m, &sp), *b = NULL;
            if (!a) continue;
            CHECK(sp_decode(a, p, NP) == SP_OK);
            const char *path = tmp_path("a.session");
            CHECKF(sp_session_save(a, path) == SP_OK, "save: %s", sp_last_error());
            /* the unbroken run goes on; a new model object and session resume from the file */
            CHECK(gen(a, NG, V, la, ta) == SP_OK);
            b = session(m2, &sp);
            if (b) {
                CHECKF(sp_session_load(b, path) == SP_OK, "load: %s", sp_last_error());
                CHECK(sp_session_n_past(b) == NP);
                CHECK(memcmp(sp_session_tokens(b), p, sizeof p) == 0);
                CHECK(gen(b, NG, V, lb, tb) == SP_OK);
                CHECKF(memcmp(la, lb, sizeof(float) * NG * V) == 0 && memcmp(ta, tb, sizeof ta) == 0,
                       "%s cache%s: the loaded session's logits differ from the unbroken run's",
                       sp_kv_type_name(types[ti]), shift ? " with shifts" : "");
                struct sp_kv_info ka, kb;
                sp_session_kv_info(a, &ka);
                sp_session_kv_info(b, &kb);
                CHECK(ka.n_shifts == kb.n_shifts && ka.next_pos == kb.next_pos && (!shift || ka.n_shifts > 0));
            }
            struct stat st;
            const long size = stat(path, &st) == 0 ? (long)st.st_size : -1;
            printf("  save/load %-4s %s: %ld bytes, %d generated tokens bit for bit\n", sp_kv_type_name(types[ti]),
                   shift ? "(shifting)" : "          ", size, NG);
            unlink(path);
            sp_session_free(a);
            sp_session_free(b);
        }
    }

    /* refusals: each leaves the session as it was */
    struct sp_session_params sp = params(128, SP_KV_F16, 0.0f);
    struct sp_session *a = session(m, &sp), *b = session(m2, &sp), *c = session(other, &sp);
    struct sp_session_params sq = params(128, SP_KV_Q8_0, 0.0f), small = params(50, SP_KV_F16, 0.0f);
    struct sp_session *d = session(m2, &sq), *e = session(m2, &small);
    if (!a || !b || !c || !d || !e) goto out2;
    CHECK(sp_decode(a, p, NP) == SP_OK);
    char path[512], bad[512]; /* copies: tmp_path's buffers are reused by later calls */
    snprintf(path, sizeof path, "%s", tmp_path("r.session"));
    snprintf(bad, sizeof bad, "%s", tmp_path("bad.session"));
    CHECK(sp_session_save(a, path) == SP_OK);
    size_t n = 0;
    unsigned char *bytes = (unsigned char *)test_read_file(path, &n);
    CHECK(bytes && n > 1000);
    CHECK(sp_decode(b, p, 7) == SP_OK); /* b holds 7 tokens: refusals keep them */
    struct {
        const char *what;
        struct sp_session *s;
        long cut;     /* write only this many bytes (-1: all) */
        long flip;    /* flip a bit at this offset (-1: none) */
        sp_status want;
        const char *needle;
    } cases[] = {
        {"another model", c, -1, -1, SP_E_INVALID, "another model"},
        {"other cache types", d, -1, -1, SP_E_INVALID, "q8_0"},
        {"a context too small", e, -1, -1, SP_E_INVALID, "context"},
        {"truncated in the header", b, 60, -1, SP_E_FORMAT, "short"},
        {"truncated in the KV rows", b, (long)n - 1000, -1, SP_E_FORMAT, "truncated"},
        {"truncated by one byte", b, (long)n - 1, -1, SP_E_FORMAT, "truncated"},
        {"a flipped bit in the KV rows", b, -1, (long)n - 500, SP_E_FORMAT, "checksum"},
        {"a flipped bit in a token", b, -1, 130, SP_E_FORMAT, "checksum"},
        {"a flipped bit in the magic", b, -1, 3, SP_E_FORMAT, "magic"},
        {"a flipped bit in the count", b, -1, 77, SP_E_FORMAT, ""},
        {"trailing bytes", b, (long)n + 5, -1, SP_E_FORMAT, "trailing"},
    };
    for (size_t k = 0; bytes && k < sizeof cases / sizeof cases[0]; k++) {
        FILE *f = fopen(bad, "wb");
        if (!f) break;
        const size_t len = cases[k].cut < 0 ? n : (size_t)cases[k].cut;
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = i < n ? bytes[i] : 0;
            if ((long)i == cases[k].flip) ch ^= 0x10;
            fputc(ch, f);
        }
        fclose(f);
        const int32_t before = sp_session_n_past(cases[k].s);
        const sp_status st = sp_session_load(cases[k].s, bad);
        CHECKF(st == cases[k].want && strstr(sp_last_error(), cases[k].needle) &&
                   sp_session_n_past(cases[k].s) == before,
               "%s: %s (%s), n_past %d -> %d", cases[k].what, sp_status_str(st), sp_last_error(), before,
               sp_session_n_past(cases[k].s));
        printf("  refused, %s: %s\n", cases[k].what, sp_last_error());
    }
    CHECK(sp_session_load(b, tmp_path("missing.session")) == SP_E_IO);
    /* versions 1 (before q4h's value-bias and key-balance rewrites) and 2
     * (q4h as 4-bit levels, before its trellis code): read for f16,
     * refused for q4h with a message */
    for (int ver = 1; ver <= 2; ver++) {
        for (int q = 0; bytes && q < 2; q++) {
            struct sp_session_params sh = params(128, SP_KV_Q4H, 0.0f);
            struct sp_session *src = q ? session(m, &sh) : a, *dst = q ? session(m2, &sh) : b;
            size_t nv = n;
            unsigned char *v1 = bytes;
            if (q && src && dst && sp_decode(src, p, NP) == SP_OK && sp_session_save(src, path) == SP_OK)
                v1 = (unsigned char *)test_read_file(path, &nv);
            if (src && dst && v1 && nv > 40) {
                CHECK(v1[8] == 3 || (v1 == bytes && ver == 2 && v1[8] == 1)); /* bytes: set to 1 before */
                v1[8] = (unsigned char)ver;
                CHECK(sp_sha256(v1, nv - SP_SHA256_BYTES, v1 + nv - SP_SHA256_BYTES) == SP_OK);
                FILE *f = fopen(bad, "wb");
                CHECK(f && fwrite(v1, 1, nv, f) == nv);
                if (f) fclose(f);
                const sp_status st = sp_session_load(dst, bad);
                if (q) {
                    CHECKF(st == SP_E_FORMAT && strstr(sp_last_error(), "q4h"), "version %d q4h: %s (%s)", ver,
                           sp_status_str(st), sp_last_error());
                    printf("  refused, a version %d q4h file: %s\n", ver, sp_last_error());
                } else {
                    CHECKF(st == SP_OK && sp_session_n_past(dst) == NP, "version %d f16: %s (%s)", ver,
                           sp_status_str(st), sp_last_error());
                }
            }
            if (q) {
                if (v1 != bytes) free(v1);
                sp_session_free(src);
                sp_session_free(dst);
            }
        }
    }
    free(bytes);
    unlink(bad);
    unlink(path);
out2:
    sp_session_free(a);
    sp_session_free(b);
    sp_session_free(c);
    sp_session_free(d);
    sp_session_free(e);
out:
    sp_model_free(m);
    sp_model_free(m2);
    sp_model_free(other);
}

/* Truncate to n and decode the rest again: the logits of a fresh session fed
 * the same tokens the same way, bit for bit. */
static void test_truncate(void) {
    struct sp_model *m = load(QWEN3);
    if (!m) return;
    enum { N = 90 };
    int32_t p[N];
    prompt(p, N, 512);
    static float want[512];
    const enum sp_kv_type types[] = {SP_KV_F16, SP_KV_Q4H};
    const int32_t cuts[] = {1, 31, 32, 33, 60, 89};
    for (size_t ti = 0; ti < 2; ti++) {
        struct sp_session_params sp = params(128, types[ti], 0.0f);
        struct sp_session *a = session(m, &sp), *b = session(m, &sp);
        if (!a || !b) continue;
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            const int32_t n = cuts[k];
            sp_session_reset(a);
            sp_session_reset(b);
            CHECK(sp_decode(a, p, N) == SP_OK);
            CHECK(sp_session_truncate(a, n) == SP_OK && sp_session_n_past(a) == n && sp_get_logits(a) == NULL);
            int32_t t;
            CHECK(sp_sample(a, &t) == SP_E_STATE);
            CHECK(sp_decode(a, p + n, N - n) == SP_OK);
            CHECK(sp_decode(b, p, n) == SP_OK && sp_decode(b, p + n, N - n) == SP_OK);
            memcpy(want, sp_get_logits(b), sizeof want);
            CHECKF(memcmp(want, sp_get_logits(a), sizeof want) == 0, "%s: truncate to %d and re-decode: other bits",
                   sp_kv_type_name(types[ti]), n);
            /* and the penalty history follows the held tokens */
            CHECK(sp_session_truncate(a, n) == SP_OK && sp_session_truncate(b, n) == SP_OK);
            struct sp_sampling_params smp = sp.sampling;
            smp.temp = 0.7f;
            CHECK(sp_session_set_sampling(a, &smp) == SP_OK && sp_session_set_sampling(b, &smp) == SP_OK);
            CHECK(sp_decode(a, &p[n], 1) == SP_OK && sp_decode(b, &p[n], 1) == SP_OK);
            CHECK(memcmp(sp_get_logits(a), sp_get_logits(b), sizeof want) == 0);
        }
        CHECK(sp_session_truncate(a, sp_session_n_past(a) + 1) == SP_E_INVALID);
        CHECK(sp_session_truncate(a, -1) == SP_E_INVALID);
        printf("  truncate + re-decode, %s: bit for bit at %zu cut points\n", sp_kv_type_name(types[ti]),
               sizeof cuts / sizeof cuts[0]);
        sp_session_free(a);
        sp_session_free(b);
    }
    sp_model_free(m);
}

/* A shift (keys re-rotated to positions n less) against the same cells
 * dropped without one (keys as computed, positions unchanged): RoPE scores
 * depend on relative positions only, so with no sinks kept (every cell and
 * the next query move alike) the next token's logits agree to rounding. */
static void test_shift_equivalence(void) {
    const char *models[] = {QWEN3, QWEN2, STORIES};
    for (size_t mi = 0; mi < 3; mi++) {
        struct sp_model *m = load(models[mi]);
        if (!m) continue;
        struct sp_seq_params q = {.n_ctx = 96, .n_batch = 64, .n_threads = 2, .type_k = SP_KV_F32,
                                  .type_v = SP_KV_F32, .ctx_shift = true, .n_keep = 0};
        struct sp_seq *a = NULL, *b = NULL;
        CHECK(sp_seq_init(m, &q, &a) == SP_OK && sp_seq_init(m, &q, &b) == SP_OK);
        if (!a || !b) goto next;
        enum { N = 80, D = 30 };
        int32_t p[N + 1];
        prompt(p, N + 1, 512);
        static float la[512], lb[512];
        CHECK(sp_seq_decode(a, p, N, NULL, false, NULL) == SP_OK);
        CHECK(sp_seq_decode(b, p, N, NULL, false, NULL) == SP_OK);
        CHECK(sp_seq_shift(a, D) == SP_OK);                 /* re-rotated, next position N - D */
        sp_kv_cells_remove(&b->cells, q.n_keep, D);         /* dropped, next position still N */
        CHECK(a->next_pos == N - D && b->next_pos == N && a->cells.n == b->cells.n);
        CHECK(sp_seq_decode(a, &p[N], 1, la, false, NULL) == SP_OK);
        CHECK(sp_seq_decode(b, &p[N], 1, lb, false, NULL) == SP_OK);
        float md = 0, mx = 0;
        for (int v = 0; v < 512; v++) md = fmaxf(md, fabsf(la[v] - lb[v])), mx = fmaxf(mx, fabsf(lb[v]));
        CHECKF(md < 1e-3f * fmaxf(1.0f, mx), "%s: shifted vs dropped logits differ by %g (max |logit| %g)",
               models[mi], md, mx);
        printf("  shift vs drop, %s: max |dlogit| %.3g of %.3g\n", models[mi], md, mx);
    next:
        sp_seq_free(a);
        sp_seq_free(b);
        sp_model_free(m);
    }
}

static bool abort_after(void *user) {
    int *n = user;
    return (*n)-- <= 0;
}

static void test_abort_and_context(void) {
    struct sp_model *m = load(QWEN3);
    if (!m) return;
    struct sp_session_params sp = params(128, SP_KV_F16, 0.0f);
    sp.n_batch = 16;
    struct sp_session *s = session(m, &sp);
    if (!s) goto out;
    int32_t p[100];
    prompt(p, 100, 512);
    int budget = 3; /* three batches, then stop */
    sp_session_set_abort(s, abort_after, &budget);
    const sp_status st = sp_decode(s, p, 100);
    CHECKF(st == SP_E_ABORTED && sp_session_n_past(s) == 48 && sp_get_logits(s) == NULL,
           "abort: %s, n_past %d", sp_status_str(st), sp_session_n_past(s));
    sp_session_set_abort(s, NULL, NULL);
    CHECK(sp_decode(s, p + 48, 52) == SP_OK && sp_session_n_past(s) == 100);
    CHECK(memcmp(sp_session_tokens(s), p, sizeof p) == 0);
    /* without a shift a full context refuses and consumes nothing */
    struct sp_session_params small = params(64, SP_KV_F16, 0.0f);
    struct sp_session *t = session(m, &small);
    if (t) {
        CHECK(sp_decode(t, p, 60) == SP_OK);
        CHECK(sp_decode(t, p, 5) == SP_E_CONTEXT_FULL && sp_session_n_past(t) == 60);
        sp_session_free(t);
    }
    /* the trained context is the default */
    struct sp_session_params dflt = sp_session_default_params();
    struct sp_session *u = session(m, &dflt);
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    CHECK(u && sp_session_n_ctx(u) == mi.n_ctx_train);
    sp_session_free(u);
    /* a cache type the head size cannot take, by name */
    struct sp_model *st260 = load(STORIES);
    struct sp_session_params q4 = params(64, SP_KV_Q4_0, 0.0f);
    struct sp_session *w = NULL;
    CHECK(st260 && sp_session_init(st260, &q4, &w) == SP_E_INVALID && !w && strstr(sp_last_error(), "q4_0"));
    sp_model_free(st260);
out:
    sp_session_free(s);
    sp_model_free(m);
}

/* One account: with a budget planned for an envelope of one session, that
 * session fits, a second is refused with the numbers (nothing allocated),
 * and fits again once the first is gone; the account says who holds what. */
static void test_budget(void) {
    const char *path = need_fixture(STORIES);
    if (!path) return;
    const struct sp_pager_tuning tight = {.small_bytes = 1024, .margin_set = true, .margin_bytes = 0,
                                          .base_set = true, .base_bytes = 0, .read_bps = 1e9, .mem_bps = 1e10};
    struct sp_session_params sp = params(64, SP_KV_F16, 0.0f);
    sp.n_threads = 1;
    struct sp_model_params mp = sp_model_default_params();
    mp.n_ctx = 64;
    mp.mem_budget = (uint64_t)1 << 40;
    struct sp_model *m = NULL;
    struct sp_plan_info pi;
    CHECK(sp_model_load(path, &mp, &m) == SP_OK);
    if (!m) return;
    sp_pager_tune(m->pager, &tight);
    CHECK(sp_model_plan(m, &sp, &pi) == SP_OK);
    sp_model_free(m);
    m = NULL;
    mp.mem_budget = pi.total_bytes + 1024; /* room for the envelope's one session, not two */
    CHECK(sp_model_load(path, &mp, &m) == SP_OK);
    if (!m) return;
    sp_pager_tune(m->pager, &tight);
    struct sp_session *a = NULL, *b = NULL;
    CHECKF(sp_session_init(m, &sp, &a) == SP_OK, "the envelope's session: %s", sp_last_error());
    struct sp_mem_stats ms;
    CHECK(sp_model_get_mem_stats(m, &ms) == SP_OK);
    CHECKF(ms.account_limit == mp.mem_budget && ms.account_used <= ms.account_limit && ms.account_kv > 0 &&
               ms.account_scratch > 0 && ms.account_weights > 0 && ms.account_used ==
               ms.account_base + ms.account_weights + ms.account_kv + ms.account_scratch,
           "account: limit %llu used %llu (weights %llu kv %llu scratch %llu base %llu)",
           (unsigned long long)ms.account_limit, (unsigned long long)ms.account_used,
           (unsigned long long)ms.account_weights, (unsigned long long)ms.account_kv,
           (unsigned long long)ms.account_scratch, (unsigned long long)ms.account_base);
    const sp_status st = sp_session_init(m, &sp, &b);
    CHECKF(st == SP_E_NOMEM && !b && strstr(sp_last_error(), "KV cache") && strstr(sp_last_error(), "left"),
           "a second session: %s (%s)", sp_status_str(st), sp_last_error());
    printf("  budget: a second session is refused: %s\n", sp_last_error());
    struct sp_mem_stats ms2;
    sp_model_get_mem_stats(m, &ms2);
    CHECK(ms2.account_used == ms.account_used); /* the refusal holds nothing */
    sp_session_free(a);
    sp_model_get_mem_stats(m, &ms2);
    CHECK(ms2.account_kv == 0 && ms2.account_scratch == 0);
    CHECKF(sp_session_init(m, &sp, &b) == SP_OK, "after the first is gone: %s", sp_last_error());
    sp_session_free(b);
    sp_model_free(m);
}

/* Swap: an idle session goes to a file and gives its KV memory back; it
 * comes back bit for bit, whichever call brings it; a damaged file empties
 * it with a message; a folder it cannot write keeps it resident. */
static void test_swap(void) {
    struct sp_model *m = load(QWEN3);
    if (!m) return;
    struct sp_model_info mi;
    sp_model_get_info(m, &mi);
    const int32_t V = mi.n_vocab;
    enum { NP = 60, NG = 16 };
    int32_t p[NP];
    prompt(p, NP, V);
    static float lr[NG * 512], la[NG * 512], lb[NG * 512];
    int32_t tr[NG], ta[NG], tb[NG];
    const enum sp_kv_type types[] = {SP_KV_F16, SP_KV_Q8_0, SP_KV_Q4H};
    for (size_t ti = 0; ti < SP_ARRAY_LEN(types); ti++) {
        struct sp_session_params sp = params(128, types[ti], 0.9f);
        struct sp_session *r = session(m, &sp), *a = session(m, &sp), *b = NULL;
        if (!r || !a) goto next;
        CHECK(sp_decode(r, p, NP) == SP_OK && sp_decode(a, p, NP) == SP_OK);
        CHECK(gen(r, 4, V, lr, tr) == SP_OK && gen(a, 4, V, la, ta) == SP_OK);
        struct sp_mem_stats m0, m1, m2;
        sp_model_get_mem_stats(m, &m0);
        CHECKF(sp_session_swap_out(a, scratch_dir()) == SP_OK, "swap out: %s", sp_last_error());
        sp_model_get_mem_stats(m, &m1);
        struct sp_kv_info ki;
        sp_session_kv_info(a, &ki);
        CHECK(sp_session_swapped(a) && ki.swapped && ki.n_cells == NP + 4 && ki.bytes_reserved == 0 &&
              sp_session_n_past(a) == NP + 4 && sp_session_tokens(a) == NULL);
        CHECKF(m1.account_kv < m0.account_kv, "the account's KV share: %llu before, %llu swapped out",
               (unsigned long long)m0.account_kv, (unsigned long long)m1.account_kv);
        CHECK(sp_session_swap_out(a, scratch_dir()) == SP_OK); /* already out: nothing to do */
        /* another session works in the blocks it gave back */
        b = session(m, &sp);
        if (b) CHECK(sp_decode(b, p + 7, 40) == SP_OK && gen(b, NG, V, lb, tb) == SP_OK);
        /* the first sample swaps it in; both go on as one */
        CHECK(gen(r, NG, V, lr, tr) == SP_OK);
        CHECKF(gen(a, NG, V, la, ta) == SP_OK, "after the swap: %s", sp_last_error());
        CHECKF(memcmp(lr, la, sizeof(float) * NG * V) == 0 && memcmp(tr, ta, sizeof tr) == 0,
               "%s: the swapped session's logits differ from the unbroken run's", sp_kv_type_name(types[ti]));
        sp_model_get_mem_stats(m, &m2);
        CHECK(!sp_session_swapped(a) && sp_session_n_past(a) == NP + 4 + NG && m2.account_kv > m1.account_kv);
        /* a damaged swap file: the call that needs it fails and says so, the session is empty */
        CHECK(sp_session_swap_out(a, scratch_dir()) == SP_OK);
        char path[600] = "";
        {
            char cmd[700];
            snprintf(cmd, sizeof cmd, "ls %s/sparrow-swap.%d.*.session 2>/dev/null | head -n 1", scratch_dir(),
                     (int)getpid());
            FILE *f = popen(cmd, "r");
            if (f) {
                if (fgets(path, sizeof path, f)) path[strcspn(path, "\n")] = 0;
                pclose(f);
            }
        }
        CHECKF(path[0] && truncate(path, 100) == 0, "the swap file '%s'", path);
        const int32_t t0 = p[1];
        const sp_status st = sp_decode(a, &t0, 1);
        CHECKF(st == SP_E_FORMAT && strstr(sp_last_error(), "swap file") && sp_session_n_past(a) == 0 &&
                   !sp_session_swapped(a),
               "a damaged swap file: %s (%s)", sp_status_str(st), sp_last_error());
        CHECK(access(path, F_OK) != 0); /* removed */
        CHECK(sp_decode(a, p, 8) == SP_OK);
        /* a folder it cannot write: refused, still resident */
        CHECK(sp_session_swap_out(a, "/nonexistent-sparrow-dir") == SP_E_IO && !sp_session_swapped(a) &&
              sp_session_n_past(a) == 8);
        printf("  swap %-4s: out and in bit for bit, the account's KV share %llu -> %llu bytes while out\n",
               sp_kv_type_name(types[ti]), (unsigned long long)m0.account_kv, (unsigned long long)m1.account_kv);
        /* freed while out: the file goes too */
        CHECK(sp_session_swap_out(a, scratch_dir()) == SP_OK);
    next:
        sp_session_free(a);
        sp_session_free(b);
        sp_session_free(r);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/sparrow-swap.%d.*.session >/dev/null 2>&1", scratch_dir(), (int)getpid());
    CHECK(system(cmd) != 0); /* no swap file left */
    sp_model_free(m);
}

int main(void) {
    test_save_load();
    test_truncate();
    test_shift_equivalence();
    test_abort_and_context();
    test_budget();
    test_swap();
    printf("test_session: %d checks, %d failed\n", test_checks, test_failures);
    return test_failures != 0;
}
