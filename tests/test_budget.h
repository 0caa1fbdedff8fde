/*
 * test_budget.h -- running a model under a memory budget that streams nearly
 * everything, for tests: the tight planner tuning (one-page units, no margin),
 * a loader that plans one session like that, and the check that the forward
 * pass under it gives the unbudgeted logits bit for bit (test_pager.c, and
 * test_convert.c on files that store resident layouts).
 */
#ifndef SP_TEST_BUDGET_H
#define SP_TEST_BUDGET_H

#include "sparrow.h"
#include "test_util.h"

#include "mem/pager.h"
#include "mem/plan.h"
#include "model/model.h"
#include "quant/quant.h"

static const struct sp_pager_tuning tight = {.unit_bytes = 4096, .small_bytes = 1024, .margin_set = true,
                                             .margin_bytes = 0, .base_set = true, .base_bytes = 0,
                                             .read_bps = 1e9, .mem_bps = 1e10};

static inline struct sp_session_params test_session(void) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 128;
    sp.sampling.temp = 0;
    return sp;
}

/* llama2.c checkpoints need their tokenizer. */
static inline const char *tokenizer_for(const char *path) {
    static char tok[4096];
    const size_t n = strlen(path);
    if (n < 4 || strcmp(path + n - 4, ".bin") != 0) return NULL;
    snprintf(tok, sizeof tok, "%s", path);
    char *slash = strrchr(tok, '/');
    snprintf(slash ? slash + 1 : tok, sizeof tok - (size_t)(slash ? slash + 1 - tok : 0), "tok512.bin");
    return tok;
}

/* Load path with a budget of (n_seq sessions + `weights` bytes) under the
 * tight tuning, the envelope declaring those sessions, and create one
 * session.  NULL on failure (counted). */
static enum sp_expert_cache expert_cache; /* the policy budgeted loads use */
static uint32_t pinned_stall_ms; /* > 0: a slow start-up reader (sp_pager_tuning), the forward pass waits */

static inline struct sp_model *load_tight_n(const char *path, uint64_t weights, struct sp_session **sess, int32_t n_seq) {
    struct sp_session_params sp = test_session();
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tokenizer_for(path);
    mp.expert_cache = expert_cache;
    mp.n_ctx = sp.n_ctx;
    mp.n_seq = n_seq;
    struct sp_model *m = NULL;
    struct sp_plan_info pi;
    *sess = NULL;
    mp.mem_budget = (uint64_t)1 << 40; /* first only to learn the session's size */
    sp_status rc = sp_model_load(path, &mp, &m);
    CHECKF(rc == SP_OK, "load %s: %s", path, sp_last_error());
    if (rc) return NULL;
    sp_pager_tune(m->pager, &tight);
    rc = sp_model_plan(m, &sp, &pi);
    CHECKF(rc == SP_OK, "plan %s: %s", path, sp_last_error());
    sp_model_free(m);
    m = NULL;
    if (rc) return NULL;
    mp.mem_budget = (uint64_t)n_seq * pi.session_bytes + weights;
    if ((rc = sp_model_load(path, &mp, &m)) == SP_OK) {
        struct sp_pager_tuning tu = tight;
        tu.pinned_stall_ms = pinned_stall_ms;
        sp_pager_tune(m->pager, &tu);
        rc = sp_session_init(m, &sp, sess);
    }
    CHECKF(rc == SP_OK, "budgeted session on %s (%llu weight bytes): %s", path, (unsigned long long)weights,
           sp_last_error());
    if (rc) {
        sp_model_free(m);
        return NULL;
    }
    return m;
}

static inline struct sp_model *load_tight(const char *path, uint64_t weights, struct sp_session **sess) {
    return load_tight_n(path, weights, sess, 1);
}

/* The forward pass of path (named rel in messages) under a budget of one
 * session + weights bytes gives the unbudgeted logits, 24 greedy steps. */
static inline void forward_under_budget(const char *path, const char *rel, uint64_t weights) {
    struct sp_session_params sp = test_session();
    struct sp_model *ref = NULL;
    struct sp_session *rs = NULL, *bs = NULL;
    struct sp_model_params rp = sp_model_default_params();
    rp.tokenizer_path = tokenizer_for(path);
    if (sp_model_load(path, &rp, &ref) || sp_session_init(ref, &sp, &rs)) {
        CHECKF(0, "unbudgeted %s: %s", path, sp_last_error());
        sp_model_free(ref);
        return;
    }
    struct sp_model *m = load_tight(path, weights, &bs);
    if (!m) {
        sp_session_free(rs);
        sp_model_free(ref);
        return;
    }
    struct sp_model_info info;
    sp_model_get_info(m, &info);
    int32_t prompt[8] = {1, 403, 407, 261, 378, 13, 60, 29};
    for (int i = 1; i < 8; i++) prompt[i] %= info.n_vocab;
    int diff = 0, steps = 0;
    int32_t tr = 0, tb = 0;
    sp_status r1 = sp_decode(rs, prompt, 8), r2 = sp_decode(bs, prompt, 8);
    CHECKF(r1 == SP_OK && r2 == SP_OK, "prompt: %s", sp_last_error());
    for (int step = 0; step < 24 && r1 == SP_OK && r2 == SP_OK; step++) {
        const float *a = sp_get_logits(rs), *b = sp_get_logits(bs);
        diff += memcmp(a, b, (size_t)info.n_vocab * sizeof(float)) != 0;
        steps++;
        sp_sample(rs, &tr);
        sp_sample(bs, &tb);
        CHECK(tr == tb);
        r1 = sp_decode(rs, &tr, 1);
        r2 = sp_decode(bs, &tb, 1);
    }
    CHECKF(diff == 0, "%s: logits differ at %d of %d steps under the budget", rel, diff, steps);
    struct sp_mem_stats ms;
    sp_model_get_mem_stats(m, &ms);
    const struct sp_plan *pl = sp_pager_plan(m->pager);
    printf("  %s: %d steps bit-identical under a %.0f KiB weight budget (%.0f KiB pinned, %u ring + %u expert "
           "slots); %.1f KiB read, %llu misses, prefetch %llu/%llu\n",
           rel, steps, weights / 1024.0, pl ? pl->pinned_bytes / 1024.0 : 0, pl ? pl->ring_slots : 0,
           pl ? pl->expert_slots : 0, ms.bytes_read / 1024.0, (unsigned long long)ms.misses,
           (unsigned long long)ms.prefetch_used, (unsigned long long)ms.prefetch_issued);
    CHECK(ms.budgeted && ms.bytes_read > (uint64_t)info.tensor_bytes / 2);
    struct sp_pager_stats ps;
    sp_pager_get_stats(m->pager, &ps);
    if (pinned_stall_ms) { /* the first pass met tensors still being read, and waited for them */
        CHECKF(ps.pinned_waits > 0, "%s: a slow start-up reader, yet no pin waited for a pinned tensor", rel);
        printf("  %s: the last pinned tensors read %u ms late: %llu pins waited %.3f s for their pinned tensors\n", rel,
               pinned_stall_ms, (unsigned long long)ps.pinned_waits, ps.pinned_wait_s);
    }
    /* pinned tensors take their resident layout (quant.h) where the table
     * has one, streamed ones keep the file's; the logits above did not move */
    uint32_t relaid = 0, relaid_streamed = 0;
    bool q4_k = false; /* pinned matrices in Q4_K's file layout: they are repacked */
    for (uint32_t i = 0; i < m->mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &m->mf->tensors[i];
        q4_k |= t->type == SP_QTYPE_Q4_K && t != m->tok_embd && !sp_pager_streams(m->pager, t);
        const uint32_t wt = sp_pager_wtype(m->pager, t);
        if (wt == t->type || !sp_qtype_resident_from(wt)) continue; /* not repacked (a stored layout read back: its file type) */
        relaid++;
        relaid_streamed += sp_pager_streams(m->pager, t);
    }
    if (relaid) printf("    %u pinned tensors in their resident layouts\n", relaid);
    CHECKF(relaid_streamed == 0, "%s: %u streamed tensors report a resident layout", rel, relaid_streamed);
#if defined(__x86_64__)
    if (q4_k && sp_qtraits_get(SP_QTYPE_Q4_K_G8)->gemm) CHECKF(relaid > 0, "%s: nothing pinned was repacked", rel);
#endif
    if (info.n_experts > 0) {
        /* the experts were evicted and read again, token after token */
        printf("    experts: %llu slices needed, %.3f found cached\n", (unsigned long long)ms.expert_pins,
               ms.expert_pins ? (double)ms.expert_hits / ms.expert_pins : 0.0);
        CHECK(ms.expert_pins > 0 && ms.expert_hits < ms.expert_pins / 2);
    }
    sp_session_free(bs);
    sp_model_free(m);
    sp_session_free(rs);
    sp_model_free(ref);
}

#endif /* SP_TEST_BUDGET_H */
