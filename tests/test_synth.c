/*
 * test_synth.c -- the synthetic-model generator (src/model/synth.c): every
 * file type of the tiny shape loads and generates finite, varied logits;
 * per-tensor types follow the Q4_K_M rule; K-quant blocks decode back to
 * the source weights within the format's error; the bytes depend on the seed
 * but not on the thread count; the MoE shape has the tensors and router that
 * make routing vary, runs, and routes differently from token to token; failures and cancels leave no file behind.
 * With a quantize policy instead of a file type: each tensor gets the
 * policy's native type, quantized as sp_quantize_rows_fast does, the file runs and
 * its bytes do not depend on the thread count.
 * Files go to a temporary folder under $SPARROW_SCRATCH (default /tmp).
 */
#include "sparrow.h"

#include "api_internal.h"
#include "format/model_file.h"
#include "quant/native.h"
#include "quant/quant.h"
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

static char dir[4096];

static const char *path_in(const char *name) {
    static char buf[2][4200];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static sp_status synth(const char *shape, const char *type, const char *path, uint64_t seed, int threads) {
    struct sp_synth_params p = sp_synth_default_params();
    p.shape = shape;
    p.type = type;
    p.path = path;
    p.seed = seed;
    p.n_threads = threads;
    return sp_synth(&p);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Files in dir other than the ones the test made on purpose: temporaries
 * left behind would show up here. */
static int count_tmp_files(void) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* ---- listing and sizes ------------------------------------------------- */

static void test_catalogue(void) {
    static const char *const want[] = {"tiny", "tiny-moe", "deep-moe", "llama-7b", "llama3-8b", "llama-34b", "qwen3-30b-a3b"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int found = 0;
        for (int32_t k = 0; k < sp_synth_n_shapes(); k++) {
            struct sp_synth_shape_info si;
            CHECK(sp_synth_get_shape(k, &si) == SP_OK);
            found |= strcmp(si.name, want[i]) == 0;
        }
        CHECKF(found, "shape %s", want[i]);
    }
    struct sp_synth_shape_info si;
    CHECK(sp_synth_get_shape(-1, &si) == SP_E_INVALID);
    CHECK(sp_synth_get_shape(sp_synth_n_shapes(), &si) == SP_E_INVALID);
    CHECK(sp_synth_n_types() == 5);
    CHECK(sp_synth_type_name(sp_synth_n_types()) == NULL);

    uint64_t np = 0, nb = 0;
    CHECK(sp_synth_size("llama-7b", "q4_0", &np, &nb) == SP_OK);
    CHECKF(np > 6700000000ull && np < 6800000000ull, "llama-7b params %llu", (unsigned long long)np);
    CHECKF(nb > 3700000000ull && nb < 3900000000ull, "llama-7b q4_0 bytes %llu", (unsigned long long)nb);
    CHECK(sp_synth_size("llama-7b", "f16", NULL, &nb) == SP_OK);
    CHECKF(nb > np * 2 && nb < np * 2 + np / 100, "llama-7b f16 bytes %llu", (unsigned long long)nb); /* norms stay F32 */
    CHECK(sp_synth_size("llama3-8b", "q4_k_m", &np, &nb) == SP_OK);
    CHECKF(np > 8000000000ull && np < 8100000000ull, "llama3-8b params %llu", (unsigned long long)np);
    CHECKF(nb > 4700000000ull && nb < 5000000000ull, "llama3-8b q4_k_m bytes %llu", (unsigned long long)nb);
    CHECK(sp_synth_size("qwen3-30b-a3b", "q8_0", &np, NULL) == SP_OK);
    CHECKF(np > 30000000000ull && np < 31000000000ull, "qwen3-30b-a3b params %llu", (unsigned long long)np);
    CHECK(sp_synth_size("llama-34b", "q4_0", &np, NULL) == SP_OK);
    CHECKF(np > 33000000000ull && np < 34500000000ull, "llama-34b params %llu", (unsigned long long)np);
    CHECK(sp_synth_size("llama-8b", "q4_0", &np, &nb) == SP_E_INVALID);
    CHECK(sp_synth_size("tiny", "q5_k", &np, &nb) == SP_E_INVALID);
}

/* ---- every type of the tiny shape runs ---------------------------------- */

/* Decode a prompt, then 8 greedy tokens; every logit vector must be finite
 * and spread out, and must change from step to step (random models often
 * repeat one token greedily, so the tokens themselves may not vary). */
static void check_runs(const char *path, const char *what) {
    struct sp_model *m = NULL;
    struct sp_session *s = NULL;
    float *prev = NULL;
    sp_status rc = sp_model_load(path, NULL, &m);
    CHECKF(rc == SP_OK, "%s: load: %s", what, sp_last_error());
    if (rc) return;
    struct sp_session_params sp = sp_session_default_params();
    sp.sampling.temp = 0;
    sp.n_ctx = 64;
    rc = sp_session_init(m, &sp, &s);
    CHECKF(rc == SP_OK, "%s: session: %s", what, sp_last_error());
    if (rc) goto done;
    struct sp_model_info info;
    CHECK(sp_model_get_info(m, &info) == SP_OK);
    prev = calloc((size_t)info.n_vocab, sizeof *prev);
    int32_t prompt[6] = {1, 300, 301, 17, 450, 99}, tok = 0;
    rc = sp_decode(s, prompt, 6);
    CHECKF(rc == SP_OK, "%s: decode: %s", what, sp_last_error());
    int changed = 0;
    for (int step = 0; rc == SP_OK && step < 8; step++) {
        const float *lg = sp_get_logits(s);
        double lo = INFINITY, hi = -INFINITY, diff = 0;
        int finite = 1;
        for (int32_t i = 0; i < info.n_vocab; i++) {
            finite &= isfinite(lg[i]);
            lo = fmin(lo, lg[i]);
            hi = fmax(hi, lg[i]);
            diff = fmax(diff, fabs(lg[i] - prev[i]));
        }
        memcpy(prev, lg, (size_t)info.n_vocab * sizeof *prev);
        CHECKF(finite, "%s: step %d: non-finite logits", what, step);
        CHECKF(hi - lo > 0.1, "%s: step %d: logits nearly constant (%g..%g)", what, step, lo, hi);
        changed += step > 0 && diff > 1e-3;
        CHECK(sp_sample(s, &tok) == SP_OK);
        rc = sp_decode(s, &tok, 1);
    }
    CHECKF(changed == 7, "%s: logits changed in only %d of 7 steps", what, changed);
done:
    free(prev);
    sp_session_free(s);
    sp_model_free(m);
}

static void test_types(void) {
    for (int32_t k = 0; k < sp_synth_n_types(); k++) {
        const char *t = sp_synth_type_name(k);
        char name[64];
        snprintf(name, sizeof name, "tiny-%s.gguf", t);
        sp_status rc = synth("tiny", t, path_in(name), 1, 2);
        CHECKF(rc == SP_OK, "synth tiny %s: %s", t, sp_last_error());
        if (rc == SP_OK) check_runs(path_in(name), name);
    }
}

/* Per-tensor types of Q4_K_M (2 layers: llama.cpp's rule picks layer 1 for
 * Q6_K attn_v / ffn_down) and Q4_0 (output Q6_K). */
static const char *tensor_type(const char *path, const char *name) {
    static char buf[16];
    struct sp_model *m = NULL;
    buf[0] = '\0';
    if (sp_model_load(path, NULL, &m) != SP_OK) return buf;
    for (int32_t i = 0; i < sp_model_n_tensors(m); i++) {
        struct sp_tensor_info ti;
        if (sp_model_get_tensor(m, i, &ti) == SP_OK && strcmp(ti.name, name) == 0) snprintf(buf, sizeof buf, "%s", ti.type);
    }
    sp_model_free(m);
    return buf;
}

static void test_mixture(void) {
    const char *km = path_in("tiny-q4_k_m.gguf");
    CHECK(strcmp(tensor_type(km, "token_embd.weight"), "Q4_K") == 0);
    CHECK(strcmp(tensor_type(km, "output.weight"), "Q6_K") == 0);
    CHECK(strcmp(tensor_type(km, "output_norm.weight"), "F32") == 0);
    CHECK(strcmp(tensor_type(km, "blk.0.attn_v.weight"), "Q4_K") == 0);
    CHECK(strcmp(tensor_type(km, "blk.1.attn_v.weight"), "Q6_K") == 0);
    CHECK(strcmp(tensor_type(km, "blk.0.ffn_down.weight"), "Q4_K") == 0);
    CHECK(strcmp(tensor_type(km, "blk.1.ffn_down.weight"), "Q6_K") == 0);
    CHECK(strcmp(tensor_type(km, "blk.1.ffn_up.weight"), "Q4_K") == 0);
    CHECK(strcmp(tensor_type(km, "blk.0.attn_norm.weight"), "F32") == 0);
    const char *q4 = path_in("tiny-q4_0.gguf");
    CHECK(strcmp(tensor_type(q4, "output.weight"), "Q6_K") == 0);
    CHECK(strcmp(tensor_type(q4, "token_embd.weight"), "Q4_0") == 0);
    CHECK(strcmp(tensor_type(q4, "blk.1.attn_v.weight"), "Q4_0") == 0);
    CHECK(strcmp(tensor_type(path_in("tiny-bf16.gguf"), "blk.0.ffn_gate.weight"), "BF16") == 0);
    CHECK(strcmp(tensor_type(path_in("tiny-q8_0.gguf"), "output.weight"), "Q8_0") == 0);
}

/* ---- K-quant blocks decode back to the weights --------------------------- */

/* Rows of the same tensor in files of different types come from the same
 * random stream, so the F32 view of the F16 file is the reference: the
 * Q4_K / Q6_K tensors must decode to it with a normalised RMS error like
 * the reference quantizer's. */
static double nrmse(const float *a, const float *b, int64_t n) {
    double se = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        se += (double)(a[i] - b[i]) * (a[i] - b[i]);
        ss += (double)b[i] * b[i];
    }
    return sqrt(se / ss);
}

static float *read_tensor_f32(const char *path, const char *name, int64_t *n_out) {
    struct sp_model_file *mf = NULL;
    float *out = NULL;
    if (sp_model_file_open(path, NULL, false, &mf) != SP_OK) return NULL;
    const struct sp_tensor_desc *t = sp_model_file_find(mf, name);
    size_t n_file = 0;
    unsigned char *bytes = t ? slurp(path, &n_file) : NULL;
    if (bytes && t->offset + t->size <= n_file) {
        const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        out = malloc((size_t)n * sizeof(float));
        sp_qtraits_ref(t->type)->to_float(bytes + t->offset, out, n);
        *n_out = n;
    }
    free(bytes);
    sp_model_file_free(mf);
    return out;
}

static void test_kquant_accuracy(void) {
    static const struct {
        const char *tensor;
        uint32_t type;
        double max_err;
    } cases[] = {
        {"blk.0.ffn_up.weight", SP_QTYPE_Q4_K, 0.12},
        {"blk.1.ffn_down.weight", SP_QTYPE_Q6_K, 0.03},
        {"output.weight", SP_QTYPE_Q6_K, 0.03},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = 0, n2 = 0;
        float *ref = read_tensor_f32(path_in("tiny-f16.gguf"), cases[c].tensor, &n);
        float *got = read_tensor_f32(path_in("tiny-q4_k_m.gguf"), cases[c].tensor, &n2);
        CHECKF(ref && got && n == n2, "%s: readable", cases[c].tensor);
        if (ref && got && n == n2) {
            /* the reference quantizer on the same weights, for scale */
            const struct sp_qtraits *tr = sp_qtraits_ref(cases[c].type);
            void *blk = malloc((size_t)(n / tr->block_elems) * tr->block_bytes);
            float *back = malloc((size_t)n * sizeof(float));
            tr->from_float(ref, blk, n);
            tr->to_float(blk, back, n);
            const double e_synth = nrmse(got, ref, n), e_ref = nrmse(back, ref, n);
            CHECKF(e_synth < cases[c].max_err && e_synth < 1.5 * e_ref + 1e-3,
                   "%s (%s): synth NRMSE %.4f, reference quantizer %.4f", cases[c].tensor, tr->name, e_synth, e_ref);
            free(blk);
            free(back);
        }
        free(ref);
        free(got);
    }
}

/* ---- determinism -------------------------------------------------------- */

static void test_determinism(void) {
    size_t n1 = 0, n2 = 0, n3 = 0;
    CHECK(synth("tiny", "q4_0", path_in("d1.gguf"), 7, 1) == SP_OK);
    CHECK(synth("tiny", "q4_0", path_in("d2.gguf"), 7, 3) == SP_OK);
    CHECK(synth("tiny", "q4_0", path_in("d3.gguf"), 8, 2) == SP_OK);
    unsigned char *a = slurp(path_in("d1.gguf"), &n1), *b = slurp(path_in("d2.gguf"), &n2),
                  *c = slurp(path_in("d3.gguf"), &n3);
    CHECK(a && b && c);
    if (a && b && c) {
        CHECKF(n1 == n2 && memcmp(a, b, n1) == 0, "1 and 3 threads give different bytes");
        CHECKF(n1 == n3 && memcmp(a, c, n1) != 0, "seeds 7 and 8 give the same bytes");
    }
    free(a);
    free(b);
    free(c);
    unlink(path_in("d1.gguf"));
    unlink(path_in("d2.gguf"));
    unlink(path_in("d3.gguf"));
}

/* ---- policies: native types written directly ----------------------------- */

static sp_status synth_policy(const char *shape, const char *policy, const char *policy_file, const char *path,
                              uint64_t seed, int threads) {
    struct sp_synth_params p = sp_synth_default_params();
    p.shape = shape;
    p.policy = policy;
    p.policy_file = policy_file;
    p.path = path;
    p.seed = seed;
    p.n_threads = threads;
    return sp_synth(&p);
}

static uint64_t policy_bytes(const char *shape, const char *policy) {
    struct sp_synth_params p = sp_synth_default_params();
    uint64_t nb = 0;
    p.shape = shape;
    p.policy = policy;
    return sp_synth_params_size(&p, NULL, &nb) == SP_OK ? nb : 0;
}

static void test_policies(void) {
    /* sizes: moe3 on qwen3-30b-a3b, its routed experts at i3_b64 (3.25 bpw) */
    struct sp_synth_params q = sp_synth_default_params();
    uint64_t np = 0, nb = 0, nb_q40 = 0;
    q.shape = "qwen3-30b-a3b";
    q.policy = "moe3";
    CHECK(sp_synth_params_size(&q, &np, &nb) == SP_OK);
    CHECK(sp_synth_size("qwen3-30b-a3b", "q4_0", NULL, &nb_q40) == SP_OK);
    const double bpw = (double)nb * 8.0 / (double)np;
    CHECKF(bpw > 3.25 && bpw < 3.45, "qwen3-30b-a3b moe3: %.3f bpw", bpw);
    CHECKF(nb < nb_q40 * 3 / 4, "qwen3-30b-a3b moe3 %llu bytes, q4_0 %llu", (unsigned long long)nb,
           (unsigned long long)nb_q40);
    CHECK(policy_bytes("tiny", "q8") > policy_bytes("tiny", "q4"));
    /* exactly one of type, policy, policy file; unknown names */
    q.type = "q4_0";
    CHECK(sp_synth_params_size(&q, NULL, NULL) == SP_E_INVALID);
    q.type = NULL;
    q.policy = "moe9";
    CHECK(sp_synth_params_size(&q, NULL, NULL) == SP_E_INVALID);
    q.policy = NULL;
    CHECK(sp_synth_params_size(&q, NULL, NULL) == SP_E_INVALID);
    q.policy_file = path_in("no-such-policy.txt");
    CHECK(sp_synth_params_size(&q, NULL, NULL) == SP_E_IO);
    CHECK(synth_policy("tiny", "q4", NULL, NULL, 1, 1) == SP_E_INVALID); /* no path */

    /* a policy file without a catch-all: a matrix no rule matches is an error, no file written */
    const char *pf = path_in("partial.txt");
    FILE *f = fopen(pf, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("*ffn_gate_inp* F32\n*_exps.weight Q8_0\n", f);
        fclose(f);
    }
    CHECK(synth_policy("tiny-moe", NULL, pf, path_in("partial.gguf"), 1, 1) == SP_E_INVALID);
    CHECKF(strstr(sp_last_error(), "no rule matches tensor 'token_embd.weight'") != NULL, "message: %s",
           sp_last_error());
    struct stat st;
    CHECK(stat(path_in("partial.gguf"), &st) != 0);
    /* ... and with one, ggml types too */
    f = fopen(pf, "w");
    if (f) {
        fputs("*ffn_gate_inp* F32\n*_exps.weight Q8_0\n* F16\n", f);
        fclose(f);
    }
    sp_status rc = synth_policy("tiny-moe", NULL, pf, path_in("file-policy.gguf"), 1, 2);
    CHECKF(rc == SP_OK, "synth tiny-moe --policy-file: %s", sp_last_error());
    if (rc == SP_OK) {
        CHECK(strcmp(tensor_type(path_in("file-policy.gguf"), "blk.1.ffn_up_exps.weight"), "Q8_0") == 0);
        CHECK(strcmp(tensor_type(path_in("file-policy.gguf"), "blk.1.attn_q.weight"), "F16") == 0);
        check_runs(path_in("file-policy.gguf"), "tiny-moe policy file");
    }

    /* moe3 on tiny-moe: the policy's types, same bytes for 1 and 2 threads, runs */
    const char *m1 = path_in("tiny-moe-moe3.gguf"), *m2 = path_in("tiny-moe-moe3-t1.gguf");
    rc = synth_policy("tiny-moe", "moe3", NULL, m1, 3, 2);
    CHECKF(rc == SP_OK, "synth tiny-moe moe3: %s", sp_last_error());
    CHECK(synth_policy("tiny-moe", "moe3", NULL, m2, 3, 1) == SP_OK);
    size_t n1 = 0, n2 = 0;
    unsigned char *a = slurp(m1, &n1), *b = slurp(m2, &n2);
    CHECKF(a && b && n1 == n2 && memcmp(a, b, n1) == 0, "moe3: 1 and 2 threads give different bytes");
    free(a);
    free(b);
    if (rc != SP_OK) return;
    static const char *const want[][2] = {
        {"token_embd.weight", "i4n_b64_l8"},      {"output.weight", "i4n_b32_l8"},
        {"blk.0.attn_q.weight", "i4n_b32_l8"},    {"blk.0.attn_k.weight", "i6_b64_l8"},
        {"blk.1.attn_v.weight", "i6_b64_l8"},     {"blk.1.attn_output.weight", "i4n_b32_l8"},
        {"blk.0.ffn_gate_inp.weight", "F32"},     {"blk.0.ffn_gate_exps.weight", "i3_b64"},
        {"blk.1.ffn_up_exps.weight", "i3_b64"},   {"blk.1.ffn_down_exps.weight", "i3_b64"},
        {"blk.0.attn_norm.weight", "F32"},        {"output_norm.weight", "F32"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *got = tensor_type(m1, want[i][0]);
        CHECKF(strcmp(got, want[i][1]) == 0, "moe3 %s: %s, want %s", want[i][0], got, want[i][1]);
    }
    check_runs(m1, "tiny-moe moe3");

    /* the experts are the same random weights, quantized in one pass
     * (sp_quantize_rows_fast): against the F16 file of the same seed, within
     * what that gets, and within 1.3x of the searching quantizer's error */
    char m1_path[4200]; /* path_in reuses its two buffers */
    snprintf(m1_path, sizeof m1_path, "%s", m1);
    m1 = m1_path;
    const char *fp = path_in("tiny-moe-f16.gguf");
    CHECK(synth("tiny-moe", "f16", fp, 3, 2) == SP_OK);
    const char *const names[] = {"blk.0.ffn_gate_exps.weight", "blk.1.attn_k.weight", "token_embd.weight"};
    for (size_t c = 0; c < sizeof names / sizeof names[0]; c++) {
        int64_t n = 0, n3 = 0;
        float *ref = read_tensor_f32(fp, names[c], &n), *got = read_tensor_f32(m1, names[c], &n3);
        const uint32_t t = (uint32_t)sp_qtype_from_name(tensor_type(m1, names[c]));
        CHECKF(ref && got && n == n3, "%s: readable", names[c]);
        if (ref && got && n == n3) {
            void *blk = malloc(sp_qtype_row_bytes(t, n));
            float *back = malloc((size_t)n * sizeof(float));
            CHECK(sp_quantize_rows_fast(t, ref, 1, n, blk) == SP_OK);
            sp_qtraits_ref(t)->to_float(blk, back, n);
            const double e_synth = nrmse(got, ref, n), e_fast = nrmse(back, ref, n);
            printf("  moe3 %s (%s): NRMSE synth %.4f, sp_quantize_rows_fast %.4f", names[c], tensor_type(m1, names[c]),
                   e_synth, e_fast);
            CHECK(sp_quantize_rows(t, ref, 1, n, NULL, blk) == SP_OK);
            sp_qtraits_ref(t)->to_float(blk, back, n);
            const double e_ref = nrmse(back, ref, n);
            printf(", sp_quantize_rows %.4f\n", e_ref);
            CHECKF(e_synth > 0 && e_synth < 1.05 * e_fast + 1e-3 && e_synth < 1.3 * e_ref,
                   "%s: synth NRMSE %.4f, sp_quantize_rows_fast %.4f, sp_quantize_rows %.4f", names[c], e_synth, e_fast,
                   e_ref);
            free(blk);
            free(back);
        }
        free(ref);
        free(got);
    }
}

/* ---- the MoE shape ----------------------------------------------------- */

static int top2_key(const float *logit, int n) {
    int a = 0, b = -1;
    for (int e = 1; e < n; e++) if (logit[e] > logit[a]) a = e;
    for (int e = 0; e < n; e++) if (e != a && (b < 0 || logit[e] > logit[b])) b = e;
    return a < b ? a * n + b : b * n + a;
}

static void test_moe(void) {
    const char *path = path_in("tiny-moe.gguf");
    sp_status rc = synth("tiny-moe", "q4_k_m", path, 3, 2);
    CHECKF(rc == SP_OK, "synth tiny-moe: %s", sp_last_error());
    struct sp_model_file *mf = NULL;
    rc = sp_model_file_open(path, NULL, false, &mf);
    CHECKF(rc == SP_OK, "open tiny-moe: %s", sp_last_error());
    if (rc) return;
    CHECK(mf->hp.arch == SP_ARCH_QWEN3MOE);
    CHECK(mf->hp.n_experts == 8 && mf->hp.n_experts_used == 2 && mf->hp.n_ff_exp == 256);
    CHECK(mf->hp.head_dim_k == 64 && mf->hp.n_kv_heads == 2 && mf->vocab.n_tokens == 512);
    const struct sp_tensor_desc *gi = sp_model_file_find(mf, "blk.0.ffn_gate_inp.weight");
    const struct sp_tensor_desc *ge = sp_model_file_find(mf, "blk.1.ffn_gate_exps.weight");
    const struct sp_tensor_desc *de = sp_model_file_find(mf, "blk.1.ffn_down_exps.weight");
    const struct sp_tensor_desc *qn = sp_model_file_find(mf, "blk.0.attn_q_norm.weight");
    CHECK(gi && gi->type == SP_QTYPE_F32 && gi->ne[0] == 256 && gi->ne[1] == 8);
    CHECK(ge && ge->type == SP_QTYPE_Q4_K && ge->ne[0] == 256 && ge->ne[1] == 256 && ge->ne[2] == 8);
    CHECK(de && de->type == SP_QTYPE_Q6_K && de->ne[0] == 256 && de->ne[1] == 256 && de->ne[2] == 8);
    CHECK(qn && qn->type == SP_QTYPE_F32 && qn->ne[0] == 64);
    CHECK(sp_model_file_find(mf, "blk.0.ffn_gate.weight") == NULL);
    sp_model_file_free(mf);

    /* Routing varies: the top-2 experts of the layer-0 router over the
     * embeddings of 64 tokens take many different values. */
    int64_t n_r = 0, n_e = 0;
    float *router = read_tensor_f32(path, "blk.0.ffn_gate_inp.weight", &n_r);
    float *embd = read_tensor_f32(path, "token_embd.weight", &n_e);
    CHECK(router && embd && n_r == 256 * 8);
    if (router && embd) {
        int seen[64] = {0}, n_seen = 0;
        double mean = 0;
        for (int64_t i = 0; i < n_r; i++) mean += router[i];
        mean /= (double)n_r;
        CHECKF(fabs(mean) < 0.01, "router mean %g", mean);
        for (int tok = 300; tok < 364; tok++) {
            float logit[8];
            for (int e = 0; e < 8; e++) {
                double s = 0;
                for (int i = 0; i < 256; i++) s += (double)router[e * 256 + i] * embd[(int64_t)tok * 256 + i];
                logit[e] = (float)s;
            }
            const int key = top2_key(logit, 8);
            n_seen += !seen[key];
            seen[key] = 1;
        }
        CHECKF(n_seen >= 8, "only %d distinct expert pairs over 64 tokens", n_seen);
    }
    free(router);
    free(embd);

    /* The file runs, and the routing of the running model varies from token
     * to token: over 16 greedy decode steps, count the distinct expert sets
     * each layer chose (read through the test hook of api_internal.h). */
    struct sp_model *m = NULL;
    rc = sp_model_load(path, NULL, &m);
    CHECKF(rc == SP_OK, "load tiny-moe: %s", sp_last_error());
    if (rc) return;
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 2;
    sp.sampling.temp = 0.0f;
    struct sp_session *s = NULL;
    rc = sp_session_init(m, &sp, &s);
    CHECKF(rc == SP_OK, "session on tiny-moe: %s", sp_last_error());
    if (!rc) rc = sp_session_trace_routing(s, true);
    CHECKF(rc == SP_OK, "routing trace: %s", sp_last_error());
    int32_t tok = 1;
    int sets[2][16], n_sets[2] = {0, 0}, n_tok_distinct = 0;
    int32_t seen_tok[16];
    for (int step = 0; rc == SP_OK && step < 16; step++) {
        const int32_t pos = sp_session_n_past(s);
        rc = sp_decode(s, &tok, 1);
        CHECKF(rc == SP_OK, "tiny-moe decode %d: %s", step, sp_last_error());
        if (rc) break;
        const float *lg = sp_get_logits(s);
        bool finite = lg != NULL;
        for (int i = 0; finite && i < 512; i++) finite = isfinite(lg[i]);
        CHECKF(finite, "tiny-moe step %d: logits not finite", step);
        for (uint32_t il = 0; il < 2; il++) {
            struct sp_moe_route r;
            bool got = sp_session_routing(s, il, (uint32_t)pos, &r);
            CHECKF(got && r.n_used == 2 && r.n_experts == 8, "tiny-moe: no routing for layer %u position %d", il, pos);
            if (!got) continue;
            CHECK(r.experts[0] != r.experts[1] && r.probs[r.experts[0]] >= r.probs[r.experts[1]]);
            CHECK(fabsf(r.weights[0] + r.weights[1] - 1.0f) < 1e-5f); /* renormalized */
            const int key = (1 << r.experts[0]) | (1 << r.experts[1]);
            bool dup = false;
            for (int i = 0; i < n_sets[il]; i++) dup |= sets[il][i] == key;
            if (!dup) sets[il][n_sets[il]++] = key;
        }
        CHECK(sp_sample(s, &tok) == SP_OK);
        bool dup = false;
        for (int i = 0; i < n_tok_distinct; i++) dup |= seen_tok[i] == tok;
        if (!dup) seen_tok[n_tok_distinct++] = tok;
    }
    printf("  tiny-moe: 16 decode steps, %d distinct tokens, distinct expert sets: layer 0 %d, layer 1 %d\n",
           n_tok_distinct, n_sets[0], n_sets[1]);
    CHECKF(n_sets[0] >= 4 && n_sets[1] >= 4, "routing hardly varies: %d / %d distinct expert sets over 16 tokens",
           n_sets[0], n_sets[1]);
    sp_session_free(s);
    sp_model_free(m);
}

/* ---- routing at depth --------------------------------------------------------
 * The deep-moe shape has qwen3-30b-a3b's layout (48 layers, 128 experts, 8
 * active) at width 256.  Over 24 decoded tokens every layer, the deepest
 * included, must choose close to as many distinct experts as uniform routing
 * would (~97 of 128): a synthetic model whose tokens all route alike would
 * make an expert cache look far better than it is. */
static void test_deep_routing(void) {
    const char *path = path_in("deep-moe.gguf");
    sp_status rc = synth("deep-moe", "q4_0", path, 0, 2);
    CHECKF(rc == SP_OK, "synth deep-moe: %s", sp_last_error());
    struct sp_model *m = NULL;
    struct sp_session *s = NULL;
    if (rc == SP_OK) rc = sp_model_load(path, NULL, &m);
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = 32;
    sp.sampling.temp = 0;
    if (rc == SP_OK) rc = sp_session_init(m, &sp, &s);
    if (rc == SP_OK) rc = sp_session_trace_routing(s, true);
    CHECKF(rc == SP_OK, "deep-moe session: %s", sp_last_error());
    enum { T = 24, L = 48, X = 128 };
    static int count[L][X];
    memset(count, 0, sizeof count);
    int32_t tok = 1;
    for (int t = 0; t < T && rc == SP_OK; t++) {
        rc = sp_decode(s, &tok, 1);
        CHECKF(rc == SP_OK, "deep-moe decode %d: %s", t, sp_last_error());
        for (uint32_t il = 0; il < L && rc == SP_OK; il++) {
            struct sp_moe_route r;
            if (sp_session_routing(s, il, (uint32_t)t, &r) && r.n_experts == X) {
                for (uint32_t k = 0; k < r.n_used; k++) count[il][r.experts[k]]++;
            }
        }
        tok = (int32_t)((t * 7919 + 13) % 2048); /* a varied prompt, not the model's own loop */
    }
    int worst = X, worst_layer = -1, most = 0;
    for (int il = 0; il < L; il++) {
        int d = 0;
        for (int e = 0; e < X; e++) {
            d += count[il][e] > 0;
            most = count[il][e] > most ? count[il][e] : most;
        }
        if (d < worst) {
            worst = d;
            worst_layer = il;
        }
    }
    printf("  deep-moe: fewest distinct experts over %d tokens: %d of %d (layer %d); most picks of one expert: %d\n",
           T, worst, X, worst_layer, most);
    CHECKF(worst >= 80 && most <= 10, "deep-moe routes alike: %d distinct in layer %d, one expert picked %d times",
           worst, worst_layer, most);
    sp_session_free(s);
    sp_model_free(m);
    unlink(path);
}

/* ---- failures leave nothing behind ---------------------------------------- */

static bool cancel_after(uint64_t done, uint64_t total, void *user) {
    (void)total;
    int *calls = user;
    return ++*calls < 3 && done < total;
}

static void test_failure_paths(void) {
    struct stat st;
    CHECK(synth("nope", "q4_0", path_in("bad.gguf"), 0, 1) == SP_E_INVALID);
    CHECK(synth("tiny", "q4_1", path_in("bad.gguf"), 0, 1) == SP_E_INVALID);
    CHECK(synth("tiny", NULL, path_in("bad.gguf"), 0, 1) == SP_E_INVALID);
    CHECK(synth("tiny", "q4_0", NULL, 0, 1) == SP_E_INVALID);
    CHECK(stat(path_in("bad.gguf"), &st) != 0);
    CHECK(sp_synth(NULL) == SP_E_INVALID);
    CHECK(synth("tiny", "q4_0", "/nonexistent-dir/x.gguf", 0, 1) == SP_E_IO);

    /* cancel: no file, no temporary, and an existing file is untouched */
    FILE *f = fopen(path_in("keep.gguf"), "wb");
    CHECK(f && fputs("old", f) >= 0 && fclose(f) == 0);
    struct sp_synth_params p = sp_synth_default_params();
    int calls = 0;
    p.shape = "tiny";
    p.type = "f16";
    p.path = path_in("keep.gguf");
    p.progress = cancel_after;
    p.progress_user = &calls;
    CHECK(sp_synth(&p) == SP_E_STATE);
    CHECK(calls == 3);
    size_t n = 0;
    unsigned char *b = slurp(path_in("keep.gguf"), &n);
    CHECK(b && n == 3 && memcmp(b, "old", 3) == 0);
    free(b);
    CHECK(count_tmp_files() == 0);
    unlink(path_in("keep.gguf"));
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/sparrow-synth.XXXXXX", scratch_dir());
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a folder under %s\n", scratch_dir());
        return 1;
    }
    sp_log_set(NULL, NULL);
    test_catalogue();
    test_types();
    test_mixture();
    test_kquant_accuracy();
    test_determinism();
    test_policies();
    test_moe();
    test_deep_routing();
    test_failure_paths();
    CHECK(count_tmp_files() == 0);
    /* clean up */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] != '.') unlink(path_in(e->d_name));
    }
    if (d) closedir(d);
    rmdir(dir);
    return test_report("test_synth");
}
