/*
 * test_batch.c -- batches (sparrow.h "Batches"): several sessions of one
 * model decoded together in one forward pass give what each gives decoded
 * alone with sp_decode -- the same greedy tokens and logits within a float
 * tolerance -- while prompts of different lengths share a step, sessions
 * join and leave between steps, and the token path allocates nothing.
 * Uses only sparrow.h, like test_api.c.
 */
#include "sparrow.h"
#include "test_util.h"

#include <stdatomic.h>

#define N_SEQ 4
#define N_GEN 12
#define MAX_VOCAB 200000

/* ---- a counting allocator (calls while armed) ---------------------------- */

static atomic_long n_alloc;
static atomic_bool counting;

static void *cnt_malloc(size_t n, void *u) {
    (void)u;
    if (atomic_load(&counting)) atomic_fetch_add(&n_alloc, 1);
    return malloc(n);
}
static void *cnt_realloc(void *p, size_t n, void *u) {
    (void)u;
    if (atomic_load(&counting)) atomic_fetch_add(&n_alloc, 1);
    return realloc(p, n);
}
static void cnt_free(void *p, void *u) {
    (void)u;
    free(p);
}
static const struct sp_allocator cnt_alloc = {cnt_malloc, cnt_realloc, cnt_free, NULL};

/* ---- reference: each sequence alone ---------------------------------------- */

static const char *const prompts[N_SEQ] = {
    "Once upon a time",
    "The little dog ran to the park and saw a big red ball",
    "Lily",
    "One day, Tom and his mom went to the store to buy some",
};

struct run {
    int32_t prompt[64];
    int32_t n_prompt;
    int32_t gen[N_GEN];     /* greedy tokens */
    float *logits;          /* (N_GEN, n_vocab): the logits each token was chosen from */
};

static struct sp_session *new_session(struct sp_model *m) {
    struct sp_session_params p = sp_session_default_params();
    p.n_ctx = 128;
    p.n_threads = 2;
    p.sampling.temp = 0.0f;
    struct sp_session *s = NULL;
    sp_status st = sp_session_init(m, &p, &s);
    CHECKF(st == SP_OK, "sp_session_init: %s (%s)", sp_status_str(st), sp_last_error());
    return s;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void run_alone(struct sp_model *m, struct run *r, int32_t n_vocab, int32_t n_gen) {
    struct sp_session *s = new_session(m);
    if (!s) return;
    sp_status st = sp_decode(s, r->prompt, r->n_prompt);
    CHECKF(st == SP_OK, "sp_decode: %s", sp_last_error());
    for (int32_t i = 0; i < n_gen && st == SP_OK; i++) {
        const float *l = sp_get_logits(s);
        memcpy(r->logits + (size_t)i * n_vocab, l, (size_t)n_vocab * sizeof(float));
        r->gen[i] = argmax(l, n_vocab);
        st = sp_decode(s, &r->gen[i], 1);
    }
    sp_session_free(s);
}

/* ---- the batch ----------------------------------------------------------------- */

/* Sequence i decodes n_gen[i] tokens (so they leave at different steps);
 * sequence 3 joins one step late.  Returns the largest |logit difference|
 * relative to the row's largest |logit|, and whether all were identical. */
static double run_batch(struct sp_model *m, struct run *r, int32_t n_vocab, const int32_t *n_gen, bool *exact,
                        long *allocs) {
    struct sp_batch *b = NULL;
    sp_status st = sp_batch_init(m, N_SEQ, 0, 2, &b);
    CHECKF(st == SP_OK, "sp_batch_init: %s (%s)", sp_status_str(st), sp_last_error());
    if (!b) return 1e9;
    struct sp_session *s[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) s[i] = new_session(m);
    int32_t done[N_SEQ] = {0}, last[N_SEQ];
    bool fed[N_SEQ] = {false};
    double worst = 0.0;
    *exact = true;
    atomic_store(&n_alloc, 0);
    for (int step = 0; step < N_GEN + 2; step++) {
        struct sp_session *ss[N_SEQ];
        const int32_t *tk[N_SEQ];
        int32_t nt[N_SEQ], idx[N_SEQ];
        int n = 0;
        for (int i = 0; i < N_SEQ; i++) {
            if (i == 3 && step == 0) continue; /* joins late */
            if (fed[i] && done[i] >= n_gen[i]) continue;
            ss[n] = s[i];
            tk[n] = fed[i] ? &last[i] : r[i].prompt;
            nt[n] = fed[i] ? 1 : r[i].n_prompt;
            idx[n++] = i;
        }
        if (!n) break;
        atomic_store(&counting, true);
        st = sp_batch_decode(b, ss, tk, nt, n);
        atomic_store(&counting, false);
        CHECKF(st == SP_OK, "sp_batch_decode step %d: %s", step, sp_last_error());
        if (st) break;
        for (int k = 0; k < n; k++) {
            const int i = idx[k];
            fed[i] = true;
            const float *l = sp_get_logits(s[i]);
            const float *ref = r[i].logits + (size_t)done[i] * n_vocab;
            double mx = 0.0, d = 0.0;
            for (int32_t v = 0; v < n_vocab; v++) {
                mx = fmax(mx, fabs(ref[v]));
                d = fmax(d, fabs((double)l[v] - ref[v]));
                if (l[v] != ref[v]) *exact = false;
            }
            worst = fmax(worst, d / (mx > 0 ? mx : 1));
            int32_t tok = 0;
            CHECK(sp_sample(s[i], &tok) == SP_OK);
            CHECKF(tok == r[i].gen[done[i]], "sequence %d token %d: batch %d, alone %d", i, done[i], tok,
                   r[i].gen[done[i]]);
            last[i] = r[i].gen[done[i]];
            done[i]++;
        }
    }
    *allocs = atomic_load(&n_alloc);
    for (int i = 0; i < N_SEQ; i++) {
        CHECKF(done[i] == n_gen[i], "sequence %d decoded %d of %d", i, done[i], n_gen[i]);
        CHECKF(sp_session_n_past(s[i]) == r[i].n_prompt + n_gen[i] - 1, "sequence %d holds %d tokens", i,
               sp_session_n_past(s[i]));
    }

    /* bad calls: nothing decoded */
    {
        const int32_t one = 1, big = 1 << 30;
        const int32_t *tk2[2] = {&one, &one};
        const int32_t n1[2] = {1, 1};
        struct sp_session *twice[2] = {s[0], s[0]};
        const int32_t held = sp_session_n_past(s[0]);
        CHECK(sp_batch_decode(b, twice, tk2, n1, 2) == SP_E_INVALID);
        const int32_t *tkb[1] = {&big};
        CHECK(sp_batch_decode(b, s, tkb, n1, 1) == SP_E_INVALID);
        CHECK(sp_batch_decode(b, s, tk2, n1, 0) == SP_E_INVALID);
        CHECK(sp_batch_decode(b, s, tk2, n1, N_SEQ + 1) == SP_E_INVALID);
        int32_t many[200] = {0};
        const int32_t *tkm[1] = {many};
        const int32_t nm[1] = {200};
        CHECK(sp_batch_decode(b, s, tkm, nm, 1) == SP_E_INVALID); /* over the batch's 128 tokens */
        const int32_t nf[1] = {128 - held + 1};
        CHECK(sp_batch_decode(b, s, tkm, nf, 1) == SP_E_CONTEXT_FULL);
        CHECK(sp_session_n_past(s[0]) == held);
    }
    for (int i = 0; i < N_SEQ; i++) sp_session_free(s[i]);
    sp_batch_free(b);
    return worst;
}

static void test_model(const char *rel, double tol) {
    const char *path = need_fixture(rel);
    if (!path) return;
    struct sp_model_params mp = sp_model_default_params();
    mp.n_seq = N_SEQ;
    mp.n_ctx = 128;
    struct sp_model *m = NULL;
    sp_status st = sp_model_load(path, &mp, &m);
    CHECKF(st == SP_OK, "sp_model_load(%s): %s", path, sp_last_error());
    if (st) return;
    struct sp_model_info info;
    CHECK(sp_model_get_info(m, &info) == SP_OK);
    const int32_t n_vocab = info.n_vocab;
    CHECK(n_vocab > 0 && n_vocab < MAX_VOCAB);
    struct run r[N_SEQ];
    const int32_t n_gen[N_SEQ] = {N_GEN, 5, N_GEN - 1, 8};
    for (int i = 0; i < N_SEQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].logits = malloc((size_t)N_GEN * n_vocab * sizeof(float));
        int32_t n = 0;
        st = sp_tokenize(m, prompts[i], strlen(prompts[i]), 1, r[i].prompt, 64, &n);
        CHECKF(st == SP_OK && n > 0, "sp_tokenize: %s", sp_last_error());
        r[i].n_prompt = n;
        run_alone(m, &r[i], n_vocab, n_gen[i]);
    }
    bool exact = false;
    long allocs = -1;
    const double worst = run_batch(m, r, n_vocab, n_gen, &exact, &allocs);
    printf("%s: batch vs alone: max relative logit difference %.3g (%s)\n", rel, worst,
           exact ? "bit for bit" : "not bit for bit");
    CHECKF(worst <= tol, "%s: logits differ by %.3g (relative), over %.3g", rel, worst, tol);
    CHECKF(allocs == 0, "%s: %ld allocations on the token path", rel, allocs);
    for (int i = 0; i < N_SEQ; i++) free(r[i].logits);
    sp_model_free(m);
}

int main(void) {
    sp_set_allocator(&cnt_alloc);
    sp_init();
    /* f32 weights: the products are per row either way; quantized weights:
     * activations are quantized per row too -- so the only source of a
     * difference is a kernel that accumulates differently for several rows. */
    test_model("models/stories260K/stories260K-f32.gguf", 1e-5);
    test_model("models/stories260K/stories260K-q4_0.gguf", 1e-5);
    test_model("models/tiny-qwen/tiny-qwen3-q8_0.gguf", 1e-5);
    test_model("models/tiny-qwen/tiny-qwen3moe-q8_0.gguf", 1e-5);
    printf("test_batch: %d checks, %d failed\n", test_checks, test_failures);
    return test_failures ? 1 : 0;
}
