/*
 * test_quantize.c -- `sparrow quantize` (sp_quantize) on stories260K:
 *  - the policy parser: good files, and malformed ones refused with the line;
 *  - every named policy from the F32 GGUF, with and without calibration, and
 *    from the llama2.c checkpoint: the output loads, generates, and its bits
 *    per weight are in the range the policy states;
 *  - quality against references: the mean KL divergence of the next-token
 *    distribution from the F32 model's, over chunks of the TinyStories excerpt
 *    not used for calibration, against llama.cpp's Q4_0 and Q8_0 files
 *    measured the same way (thresholds below, with issue 5's targets);
 *  - calibration's channel scaling keeps the model's function (F16 storage);
 *  - pruning: the pruned model runs, its parameter count is what the cut
 *    implies, calibrated importance beats weight norms, and pruning that
 *    grouped-query attention cannot express is refused;
 *  - folding KV heads: 4 into 4 is the identity (logits bit for bit), 4 into
 *    2 and 1 give the shapes and rows asked for (each pooled row the mean of
 *    its group's), qwen2's biases and qwen3's head norms are handled, with
 *    pruning the groups are of the kept heads, channel scaling still keeps
 *    the function, and a count that does not divide the heads is refused;
 *  - a truncated output is refused by the loader; a failed or cancelled run
 *    leaves no output and no temporary file.
 * The table it prints is what docs/QUANT.md quotes.
 */
#include "sparrow.h"

#include "quant/native.h"
#include "quantize/quantize.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>

#define MODEL_DIR "models/stories260K/"
#define EXCERPT "peer-golden/tinystories-valid-excerpt.txt"
#define CALIB_BYTES 7400   /* the excerpt's first stories calibrate; the rest evaluate */
#define EVAL_CTX 128       /* the model's context, as `sparrow eval -c 128` */
#define EVAL_CHUNKS 6      /* chunks of the held-out text; the second half of each is scored */
#define GEN_TOKENS 32

/* Thresholds.  Issue 5 (acceptance 2) asks the best policy at <= 4.5 bpw for
 * at most 0.5x the Q4_0 file's KL; docs/QUANT.md measures q4 at 0.476x on
 * the whole excerpt.  On this test's shorter texts q4 gives 0.487x, and the
 * calibration moves it by +-0.001 (2.5%) where other kernels (AVX-512, AMX)
 * round the calibration run differently, so the guard sits at 0.55x.  The
 * q8 target (1.25x the Q8_0 file's) holds with calibration (measured 0.8x);
 * without, q8 measures 1.2-1.3x. */
#define KL_VS_Q4_0 0.55    /* best policy <= 4.5 bpw, calibrated: KL <= this x the Q4_0 file's */
#define KL_VS_Q8_0 1.25    /* q8, calibrated: KL <= this x the Q8_0 file's */
#define KL_EXACT 1e-4      /* F16 storage after channel scaling: the function is kept */
/* q8 is near-lossless: its greedy continuation matches F32's this far. */
#define Q8_GREEDY_MATCH 16

static char dir[2048];

static const char *scratch(const char *name) {
    return test_path(dir, name);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Files in dir whose name contains needle (temporary files left behind). */
static int count_files(const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, needle) != NULL;
    closedir(d);
    return n;
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    const bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static char *read_text(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[len] = '\0', *n = (size_t)len;
    return buf;
}

/* ---- policy parser ------------------------------------------------------------ */

static void check_parse_error(const char *text, const char *expect) {
    struct sp_qpolicy *p = NULL;
    sp_status rc = sp_qpolicy_parse(text, strlen(text), "pol.txt", &p);
    CHECKF(rc == SP_E_FORMAT, "'%s' gave %d", text, (int)rc);
    CHECKF(strstr(sp_last_error(), expect) != NULL, "message '%s' lacks '%s'", sp_last_error(), expect);
    CHECK(p == NULL);
}

static void test_policy_parser(void) {
    const char *good = "# my policy\n"
                       "\n"
                       "output.weight   i6_b64   # the head\n"
                       "  *.attn_?.weight\ti4_b32_e8\r\n"
                       "blk.[0-1].ffn_*  q8_0\n"
                       "*                i3a_b64";
    struct sp_qpolicy *p = NULL;
    CHECK(sp_qpolicy_parse(good, strlen(good), "good", &p) == SP_OK);
    if (p) {
        CHECK(p->n_rules == 4);
        CHECK(p->n_rules == 4 && p->rules[1].line == 4 && p->rules[3].line == 6);
        const struct sp_qrule *r = sp_qpolicy_match(p, "blk.3.attn_q.weight");
        CHECK(r && r->type == (uint32_t)sp_qtype_from_name("i4_b32_e8"));
        r = sp_qpolicy_match(p, "blk.1.ffn_up.weight");
        CHECK(r && r->type == (uint32_t)sp_qtype_from_name("Q8_0"));
        r = sp_qpolicy_match(p, "blk.2.ffn_up.weight");
        CHECK(r && r->line == 6);
        r = sp_qpolicy_match(p, "blk.3.attn_output.weight"); /* '?' is one character */
        CHECK(r && r->line == 6);
        sp_qpolicy_free(p);
    }
    check_parse_error("* i4_b64\nblk.*  \n", "'pol.txt' line 2: expected 'PATTERN TYPE', found 1 field");
    check_parse_error("\n\n* i4_b64 extra\n", "line 3: expected 'PATTERN TYPE', found 3 fields");
    check_parse_error("# c\n* i5_b64\n", "line 2: unknown type 'i5_b64'");
    check_parse_error("* Q8_K\n", "line 1: type 'Q8_K' cannot hold weights");
    check_parse_error("# only comments\n\n", "no rules");
    check_parse_error("* i4_b64\nx\0y i4_b64\n", "line 2"); /* stops at the NUL: strlen */

    /* Every named policy parses (its types exist in this build). */
    for (int32_t i = 0; i < sp_quantize_n_policies(); i++) {
        const char *name;
        CHECK(sp_quantize_policy_info(i, &name, NULL) == SP_OK);
        CHECKF(sp_qpolicy_named(name, &p) == SP_OK, "policy %s: %s", name, sp_last_error());
        sp_qpolicy_free(p);
    }
    CHECK(sp_qpolicy_named("mem5", &p) == SP_E_INVALID && strstr(sp_last_error(), "mem4"));
}

/* ---- running models -------------------------------------------------------------- */

static struct sp_model *load(const char *path, const char *tok) {
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tok;
    struct sp_model *m = NULL;
    sp_status rc = sp_model_load(path, &mp, &m);
    CHECKF(rc == SP_OK, "loading %s: %s", path, sp_last_error());
    return m;
}

static struct sp_session *session(struct sp_model *m) {
    struct sp_session_params sp = sp_session_default_params();
    sp.n_ctx = EVAL_CTX;
    sp.n_threads = 1;
    sp.sampling.temp = 0.0f;
    struct sp_session *s = NULL;
    CHECKF(sp_session_init(m, &sp, &s) == SP_OK, "%s", sp_last_error());
    return s;
}

/* Greedy continuation of "Once upon a time" into out (GEN_TOKENS ids). */
static bool generate(struct sp_model *m, int32_t *out) {
    struct sp_session *s = session(m);
    if (!s) return false;
    int32_t prompt[32], n = 0;
    const char *text = "Once upon a time";
    bool ok = sp_tokenize(m, text, strlen(text), SP_TOKENIZE_ADD_BOS, prompt, 32, &n) == SP_OK &&
              sp_decode(s, prompt, n) == SP_OK;
    for (int i = 0; ok && i < GEN_TOKENS; i++) {
        ok = sp_sample(s, &out[i]) == SP_OK && sp_decode(s, &out[i], 1) == SP_OK;
    }
    sp_session_free(s);
    CHECKF(ok, "generation failed: %s", sp_last_error());
    return ok;
}

/* The evaluation text: tokens of the excerpt after CALIB_BYTES. */
static int32_t *eval_tokens(struct sp_model *m, int32_t *n_out) {
    size_t len = 0;
    const char *path = need_fixture(EXCERPT);
    char *text = path ? read_text(path, &len) : NULL;
    if (!text || len <= CALIB_BYTES) {
        free(text);
        return NULL;
    }
    const size_t n_text = len - CALIB_BYTES;
    int32_t *t = malloc((n_text + 8) * sizeof(*t)), n = 0;
    if (sp_tokenize(m, text + CALIB_BYTES, n_text, SP_TOKENIZE_ADD_BOS, t, (int32_t)n_text + 8, &n) != SP_OK) n = 0;
    free(text);
    *n_out = n;
    return t;
}

/* Next-token logits of model m at the scored positions of every chunk: chunk
 * k is tokens [k*CTX, (k+1)*CTX) with its first replaced by BOS, run from an
 * empty cache; positions CTX/2 - 1 .. CTX - 2 (predicting the second half)
 * are scored.  out: EVAL_CHUNKS * CTX/2 rows of n_vocab. */
static bool chunk_logits(struct sp_model *m, const int32_t *tok, int n_vocab, float *out) {
    struct sp_session *s = session(m);
    if (!s) return false;
    bool ok = true;
    const int half = EVAL_CTX / 2;
    for (int k = 0; ok && k < EVAL_CHUNKS; k++) {
        int32_t chunk[EVAL_CTX];
        memcpy(chunk, tok + k * EVAL_CTX, sizeof chunk);
        chunk[0] = 1; /* BOS */
        sp_session_reset(s);
        ok = sp_decode(s, chunk, half) == SP_OK;
        for (int i = 0; ok && i < half; i++) {
            memcpy(out + ((size_t)k * half + i) * n_vocab, sp_get_logits(s), (size_t)n_vocab * sizeof(float));
            if (i + 1 < half) ok = sp_decode(s, &chunk[half + i], 1) == SP_OK;
        }
    }
    sp_session_free(s);
    CHECKF(ok, "evaluation failed: %s", sp_last_error());
    return ok;
}

static void log_softmax(const float *x, int n, double *out) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    const double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

struct quality {
    double kl_mean, top1;
};

/* Mean KL(ref || q) in nats and top-1 agreement over the scored positions. */
static struct quality compare(const float *ref, const float *q, int n_vocab) {
    const int n_pos = EVAL_CHUNKS * EVAL_CTX / 2;
    double *lp = malloc((size_t)n_vocab * sizeof(double)), *lq = malloc((size_t)n_vocab * sizeof(double));
    struct quality r = {0, 0};
    for (int p = 0; p < n_pos; p++) {
        const float *a = ref + (size_t)p * n_vocab, *b = q + (size_t)p * n_vocab;
        log_softmax(a, n_vocab, lp);
        log_softmax(b, n_vocab, lq);
        double kl = 0;
        int ia = 0, ib = 0;
        for (int i = 0; i < n_vocab; i++) {
            kl += exp(lp[i]) * (lp[i] - lq[i]);
            if (a[i] > a[ia]) ia = i;
            if (b[i] > b[ib]) ib = i;
        }
        r.kl_mean += kl;
        r.top1 += ia == ib;
    }
    free(lp);
    free(lq);
    r.kl_mean /= n_pos;
    r.top1 /= n_pos;
    return r;
}

/* The reference: the F32 model's logits on the held-out chunks, computed
 * once; variants are compared with it. */
static struct {
    int n_vocab;
    int32_t *toks;
    float *ref_logits, *logits; /* (EVAL_CHUNKS * EVAL_CTX / 2, n_vocab) */
    int32_t ref_gen[GEN_TOKENS];
    bool ready;
} ev;

static bool eval_init(const char *ref_path) {
    struct sp_model *ref = load(ref_path, NULL);
    if (!ref) return false;
    struct sp_model_info info;
    sp_model_get_info(ref, &info);
    ev.n_vocab = info.n_vocab;
    int32_t n_tok = 0;
    ev.toks = eval_tokens(ref, &n_tok);
    CHECKF(ev.toks && n_tok >= EVAL_CHUNKS * EVAL_CTX, "evaluation text: %d tokens", n_tok);
    const size_t n_logits = (size_t)EVAL_CHUNKS * EVAL_CTX / 2 * (size_t)ev.n_vocab;
    ev.ref_logits = malloc(n_logits * sizeof(float));
    ev.logits = malloc(n_logits * sizeof(float));
    ev.ready = ev.toks && n_tok >= EVAL_CHUNKS * EVAL_CTX && chunk_logits(ref, ev.toks, ev.n_vocab, ev.ref_logits) &&
               generate(ref, ev.ref_gen);
    sp_model_free(ref);
    return ev.ready;
}

static void eval_free(void) {
    free(ev.toks);
    free(ev.ref_logits);
    free(ev.logits);
}

/* Quality of model m against the reference; false if it could not run. */
static bool evaluate(struct sp_model *m, struct quality *q, int *greedy_match) {
    int32_t gen[GEN_TOKENS];
    if (!ev.ready || !chunk_logits(m, ev.toks, ev.n_vocab, ev.logits) || !generate(m, gen)) return false;
    *q = compare(ev.ref_logits, ev.logits, ev.n_vocab);
    *greedy_match = 0;
    while (*greedy_match < GEN_TOKENS && gen[*greedy_match] == ev.ref_gen[*greedy_match]) (*greedy_match)++;
    return true;
}

/* ---- quantizing ------------------------------------------------------------------- */

static bool count_reports(const struct sp_quantize_tensor_report *r, void *user) {
    int *n = user;
    (*n)++;
    return r->rel_rmse >= 0 && r->rel_rmse < 1.0;
}

/* What one quantization run asks for; zeroes are the defaults. */
struct qargs {
    const char *in, *tok, *policy, *policy_file, *calib;
    float prune_ffn;
    int prune_heads;
    int merge_kv_heads;
    int calib_chunks; /* 0: all of the calibration text */
    unsigned calib_skip;
};

static sp_status quantize(const struct qargs *a, const char *out, struct sp_quantize_result *res) {
    struct sp_quantize_params p = sp_quantize_default_params();
    int n_reports = 0;
    p.input = a->in;
    p.tokenizer_path = a->tok;
    p.output = out;
    p.policy = a->policy;
    p.policy_file = a->policy_file;
    p.calib_path = a->calib;
    p.calib_chunks = a->calib_chunks ? a->calib_chunks : 64; /* 64: all of the calibration text */
    p.prune_ffn = a->prune_ffn;
    p.prune_heads = a->prune_heads;
    p.merge_kv_heads = a->merge_kv_heads;
    p.calib_skip = a->calib_skip;
    p.n_threads = 2;
    p.on_tensor = count_reports;
    p.user = &n_reports;
    memset(res, 0, sizeof(*res));
    sp_status rc = sp_quantize(&p, res);
    if (rc == SP_OK) CHECKF(n_reports > 0, "%s: no tensor reports", out);
    return rc;
}

/* Quantize, load, check the parameter count against the loader's, and
 * evaluate.  Prints one table row.  False when any step failed. */
static bool run_variant(const struct qargs *a, const char *name, struct sp_quantize_result *res, struct quality *qq) {
    const char *out = scratch(name);
    sp_status rc = quantize(a, out, res);
    CHECKF(rc == SP_OK, "%s: %s", name, sp_last_error());
    if (rc) return false;
    struct sp_model *m = load(out, NULL);
    if (!m) return false;
    struct sp_model_info info;
    sp_model_get_info(m, &info);
    CHECKF(info.n_params == res->n_params, "%s: loader counts %llu parameters, quantize %llu", name,
           (unsigned long long)info.n_params, (unsigned long long)res->n_params);
    int match = 0;
    const bool ok = evaluate(m, qq, &match);
    if (ok) {
        printf("%-24s %6.3f %9.6f %7.4f %6d   %d scaled, %d fed back\n", name, res->bpw, qq->kl_mean, qq->top1, match,
               (int)res->n_scaled, (int)res->n_gptq);
    }
    sp_model_free(m);
    return ok;
}

struct variant {
    const char *policy;
    double bpw_lo, bpw_hi; /* the policy's range, as measured on stories260K */
    bool calib_always;     /* calibrated run in every test, else only with SPARROW_TEST_FULL=1 */
};

/* bpw on stories260K is above the nominal (Llama-7B) figures: its norms
 * and its FFN width 172, padded to 192, weigh more in 260K parameters.
 * Calibrated runs take about a second each; the full table is
 * SPARROW_TEST_FULL=1. */
static const struct variant variants[] = {
    {"mem4", 3.8, 4.5, true}, {"mem4x", 3.7, 4.4, false}, {"mem3", 3.1, 3.6, false},
    {"q4", 4.2, 4.5, true},   {"q8", 8.0, 9.0, true},     {"mem4l", 3.7, 4.4, false},
};

static char f32[4096], bin[4096], tok[4096], calib[4096];

static void test_policies(void) {
    char q4[4096], q8[4096];
    snprintf(q4, sizeof q4, "%s", fixture(MODEL_DIR "stories260K-q4_0.gguf"));
    snprintf(q8, sizeof q8, "%s", fixture(MODEL_DIR "stories260K-q8_0.gguf"));
    if (!need_fixture(MODEL_DIR "stories260K-q4_0.gguf") || !need_fixture(MODEL_DIR "stories260K-q8_0.gguf")) return;

    printf("%-24s %6s %9s %7s %6s   (vs F32 on held-out text; greedy = tokens equal to F32's)\n", "model", "bpw",
           "KL mean", "top-1", "greedy");
    struct sp_model_info info;
    struct quality qq, peer[2] = {{INFINITY, 0}, {INFINITY, 0}};
    const char *peers[2] = {q4, q8};
    for (int k = 0; k < 2; k++) {
        struct sp_model *m = load(peers[k], NULL);
        int match;
        if (m && evaluate(m, &peer[k], &match)) {
            sp_model_get_info(m, &info);
            printf("%-24s %6.3f %9.6f %7.4f %6d\n", k == 0 ? "llama.cpp Q4_0" : "llama.cpp Q8_0",
                   (double)info.tensor_bytes * 8.0 / (double)info.n_params, peer[k].kl_mean, peer[k].top1, match);
        }
        sp_model_free(m);
    }

    const bool full = getenv("SPARROW_TEST_FULL") && *getenv("SPARROW_TEST_FULL") == '1';
    double best_kl_45 = INFINITY, q8_kl = INFINITY, kl_of[2][SP_ARRAY_LEN(variants)];
    uint64_t bytes_of[SP_ARRAY_LEN(variants)];
    for (size_t v = 0; v < SP_ARRAY_LEN(variants); v++) {
        kl_of[0][v] = kl_of[1][v] = NAN;
        for (int cal = 0; cal < 2; cal++) {
            const struct variant *x = &variants[v];
            if (cal && !x->calib_always && !full) continue;
            char name[64];
            snprintf(name, sizeof name, "%s%s.gguf", x->policy, cal ? "-calib" : "");
            struct qargs a = {.in = f32, .policy = x->policy, .calib = cal ? calib : NULL};
            struct sp_quantize_result res;
            kl_of[cal][v] = INFINITY;
            if (!run_variant(&a, name, &res, &qq)) continue;
            CHECKF(res.bpw >= x->bpw_lo && res.bpw <= x->bpw_hi, "%s: %.3f bpw outside [%.2f, %.2f]", name, res.bpw,
                   x->bpw_lo, x->bpw_hi);
            CHECK(res.native && res.n_params == 292800); /* the F32 file's count */
            CHECK(cal ? res.calib_tokens > 0 && res.n_scaled > 0 && res.n_gptq > 0 : res.calib_tokens == 0);
            kl_of[cal][v] = qq.kl_mean;
            bytes_of[v] = res.tensor_bytes;
            if (cal && res.bpw <= 4.5) best_kl_45 = SP_MIN(best_kl_45, qq.kl_mean);
            if (cal && !strcmp(x->policy, "q8")) q8_kl = qq.kl_mean;
        }
    }
    CHECKF(best_kl_45 <= KL_VS_Q4_0 * peer[0].kl_mean, "best KL at <= 4.5 bpw %.5f > %.2f x Q4_0's %.5f", best_kl_45,
           KL_VS_Q4_0, peer[0].kl_mean);
    CHECKF(q8_kl <= KL_VS_Q8_0 * peer[1].kl_mean, "calibrated q8 KL %.6f > %.2f x Q8_0's %.6f", q8_kl, KL_VS_Q8_0,
           peer[1].kl_mean);
    /* calibration helps every policy it ran for */
    for (size_t v = 0; v < SP_ARRAY_LEN(variants); v++) {
        if (isnan(kl_of[1][v])) continue;
        CHECKF(kl_of[1][v] < kl_of[0][v], "%s: calibrated KL %.5f >= %.5f without", variants[v].policy, kl_of[1][v],
               kl_of[0][v]);
    }
    /* exponent-only scales: smaller, and less accurate than FP16 scales */
    CHECK(bytes_of[1] < bytes_of[0] && kl_of[0][1] > kl_of[0][0]);
    printf("E8M0 vs FP16 scales (mem4x vs mem4): %.1f%% fewer tensor bytes, KL x%.2f (x%.2f calibrated)\n",
           100.0 * (1.0 - (double)bytes_of[1] / (double)bytes_of[0]), kl_of[0][1] / kl_of[0][0],
           kl_of[1][1] / kl_of[1][0]); /* NaN calibrated unless SPARROW_TEST_FULL=1 */
    /* L8 scales: as small as E8M0's, much closer to FP16's accuracy */
    CHECK(bytes_of[5] == bytes_of[1] && kl_of[0][5] < kl_of[0][1]);
    printf("L8 vs FP16 scales (mem4l vs mem4): %.1f%% fewer tensor bytes, KL x%.2f (E8M0: x%.2f)\n",
           100.0 * (1.0 - (double)bytes_of[5] / (double)bytes_of[0]), kl_of[0][5] / kl_of[0][0],
           kl_of[0][1] / kl_of[0][0]);

    /* Channel scaling folds exactly: stored as F16, the model barely moves. */
    const char *pol = scratch("f16-policy.txt");
    CHECK(write_file(pol, "* F16\n", 6));
    struct qargs a16 = {.in = f32, .policy_file = pol, .calib = calib, .calib_chunks = 8};
    struct sp_quantize_result res;
    if (run_variant(&a16, "f16-calib.gguf", &res, &qq)) {
        CHECK(res.n_scaled > 0 && strcmp(res.policy, "file") == 0);
        CHECKF(qq.kl_mean < KL_EXACT, "F16 after channel scaling: KL %.2e", qq.kl_mean);
    }

    /* The llama2.c checkpoint: metadata written from scratch, shared classifier. */
    struct qargs ab = {.in = bin, .tok = tok, .policy = "q4", .calib = calib, .calib_chunks = 8};
    if (run_variant(&ab, "bin-q4-calib.gguf", &res, &qq)) {
        struct sp_model *m = load(scratch("bin-q4-calib.gguf"), NULL);
        if (m) {
            sp_model_get_info(m, &info);
            CHECK(info.tied_output && info.n_params == (uint64_t)260032 && info.n_ctx_train == 512);
            CHECK(info.bos == 1 && info.eos == 2 && info.add_bos && info.n_vocab == 512);
            sp_model_free(m);
        }
        CHECKF(res.bpw >= 4.2 && res.bpw <= 4.9, "llama2.c q4: %.3f bpw", res.bpw);
        CHECK(qq.kl_mean < peer[0].kl_mean);
    }
}

/* ---- error feedback on random data --------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rng_gauss(void) { /* Box-Muller on xorshift64* */
    double u[2];
    for (int k = 0; k < 2; k++) {
        rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
        u[k] = ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* sum over rows of (w - q)^T H (w - q) */
static double out_err(const double *h, const float *w, const float *q, int n, int rows) {
    double e = 0;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += h[i * n + j] * ((double)w[r * n + j] - q[r * n + j]);
            e += ((double)w[r * n + i] - q[r * n + i]) * s;
        }
    }
    return e;
}

/* GPTQ (sp_gptq_rows) against round-to-nearest with the same importance
 * (sp_quantize_rows with H's diagonal): on correlated inputs the layer's
 * output error (w - q)^T H (w - q) must drop clearly, and the bytes written
 * must decode to exactly the values it reports. */
static void test_gptq_random(void) {
    enum { N = 96, ROWS = 24, T = 400 };
    double *h = calloc((size_t)N * N, sizeof(double)), *mix = malloc((size_t)N * 8 * sizeof(double));
    float *x = malloc(N * sizeof(float)), *w = malloc((size_t)ROWS * N * sizeof(float));
    float *q = malloc((size_t)ROWS * N * sizeof(float)), *wg = malloc((size_t)ROWS * N * sizeof(float));
    float *imp = malloc(N * sizeof(float)), *deq = malloc((size_t)ROWS * 128 * sizeof(float));
    uint8_t *buf = malloc((size_t)ROWS * 4096);
    if (!h || !mix || !x || !w || !q || !wg || !imp || !deq || !buf) {
        CHECK(!"out of memory");
        goto done;
    }
    /* inputs: 8 shared factors plus channel noise, a few loud channels */
    for (int i = 0; i < N * 8; i++) mix[i] = rng_gauss();
    for (int t = 0; t < T; t++) {
        double f[8];
        for (int k = 0; k < 8; k++) f[k] = rng_gauss();
        for (int i = 0; i < N; i++) {
            double v = 0.3 * rng_gauss();
            for (int k = 0; k < 8; k++) v += mix[i * 8 + k] * f[k];
            x[i] = (float)(v * (i % 17 == 0 ? 4.0 : 1.0));
        }
        for (int i = 0; i < N; i++) {
            for (int j = 0; j < N; j++) h[i * N + j] += (double)x[i] * x[j];
        }
    }
    for (int i = 0; i < N; i++) imp[i] = (float)(h[i * N + i] / T);
    for (int i = 0; i < ROWS * N; i++) w[i] = (float)(0.02 * rng_gauss());
    const char *types[] = {"i4_b64", "i3_b32", "i4a_b64", "i4_b32_e8", "i6_b64", "i4n_b64", "i4n_b32_e8", "i4n_b32_l8"};
    for (size_t k = 0; k < SP_ARRAY_LEN(types); k++) {
        const int32_t t = sp_qtype_from_name(types[k]);
        const struct sp_qtraits *tr = sp_qtraits_get((uint32_t)t);
        const size_t rb = sp_qtype_row_bytes((uint32_t)t, N);
        CHECK(sp_quantize_rows((uint32_t)t, w, ROWS, N, imp, buf) == SP_OK);
        for (int r = 0; r < ROWS; r++) {
            tr->to_float(buf + (size_t)r * rb, deq, tr->block_elems * ((N + tr->block_elems - 1) / tr->block_elems));
            memcpy(q + r * N, deq, N * sizeof(float));
        }
        const double e_rtn = out_err(h, w, q, N, ROWS);
        struct sp_gptq *g = NULL;
        CHECK(sp_gptq_init(h, N, NULL, NULL, N, tr->block_elems, &g) == SP_OK);
        if (!g) continue;
        memcpy(wg, w, (size_t)ROWS * N * sizeof(float));
        struct sp_gptq_stats st = {0};
        CHECK(sp_gptq_rows(g, (uint32_t)t, wg, ROWS, imp, buf, &st) == SP_OK && st.n_rows == ROWS);
        bool same = true;
        for (int r = 0; r < ROWS; r++) {
            tr->to_float(buf + (size_t)r * rb, deq, tr->block_elems * ((N + tr->block_elems - 1) / tr->block_elems));
            for (int i = 0; i < N; i++) same &= deq[i] == wg[r * N + i];
        }
        CHECKF(same, "%s: GPTQ's reported values differ from the bytes it wrote", types[k]);
        const double e_gptq = out_err(h, w, wg, N, ROWS);
        printf("GPTQ on random correlated inputs, %-9s output error %.3g vs round-to-nearest %.3g (x%.2f; %lld of "
               "%d rows refit)\n", types[k], e_gptq, e_rtn, e_gptq / e_rtn, (long long)st.n_refit, ROWS);
        CHECKF(e_gptq < 0.7 * e_rtn, "%s: GPTQ output error %.4g not well below round-to-nearest's %.4g", types[k],
               e_gptq, e_rtn);
        sp_gptq_free(g);
    }
done:
    free(h);
    free(mix);
    free(x);
    free(w);
    free(q);
    free(wg);
    free(imp);
    free(deq);
    free(buf);
}

/* ---- pruning ------------------------------------------------------------------------ */

/* Parameters of a llama model, from its shape. */
static uint64_t llama_params(const struct sp_model_info *i) {
    const uint64_t E = (uint64_t)i->n_embd, V = (uint64_t)i->n_vocab, F = (uint64_t)i->n_ff;
    const uint64_t QD = (uint64_t)i->n_heads * (uint64_t)i->head_dim_k;
    const uint64_t KD = (uint64_t)i->n_kv_heads * (uint64_t)i->head_dim_k;
    const uint64_t per_layer = 2 * E + E * QD + 2 * E * KD + QD * E + 3 * E * F;
    return (i->tied_output ? 1 : 2) * V * E + E + (uint64_t)i->n_layers * per_layer;
}

static void test_pruning(void) {
    struct case_ {
        struct qargs a;
        int n_ff, n_heads, n_kv; /* expected shape */
    } cases[] = {
        /* 43 of 172 neurons */
        {{.in = f32, .policy = "mem4", .calib = calib, .calib_chunks = 4, .prune_ffn = 0.25f}, 129, 8, 4},
        /* one KV group (2 query heads) */
        {{.in = f32, .policy = "mem4", .calib = calib, .calib_chunks = 4, .prune_heads = 2}, 172, 6, 3},
        {{.in = f32, .policy = "mem4", .prune_heads = 4}, 172, 4, 2},                   /* two, by weight norms */
        {{.in = bin, .tok = tok, .policy = "mem4", .prune_ffn = 0.5f, .prune_heads = 2}, 86, 6, 3},
    };
    for (size_t c = 0; c < SP_ARRAY_LEN(cases); c++) {
        const struct case_ *k = &cases[c];
        char name[64];
        snprintf(name, sizeof name, "pruned-%zu.gguf", c);
        struct sp_quantize_result res;
        struct quality qq;
        if (!run_variant(&k->a, name, &res, &qq)) continue;
        CHECK(res.n_ff == k->n_ff && res.n_heads == k->n_heads && res.n_kv_heads == k->n_kv);
        struct sp_model *m = load(scratch(name), NULL);
        if (!m) continue;
        struct sp_model_info info;
        sp_model_get_info(m, &info);
        CHECKF(info.n_ff == k->n_ff && info.n_heads == k->n_heads && info.n_kv_heads == k->n_kv && info.head_dim_k == 8,
               "%s: ff %d heads %d/%d hd %d", name, info.n_ff, info.n_heads, info.n_kv_heads, info.head_dim_k);
        CHECKF(info.n_params == llama_params(&info), "%s: %llu params, its shape says %llu", name,
               (unsigned long long)info.n_params, (unsigned long long)llama_params(&info));
        int32_t gen[GEN_TOKENS];
        char text[512];
        size_t n = 0;
        if (generate(m, gen) && sp_detokenize(m, gen, GEN_TOKENS, text, sizeof text - 1, &n) == SP_OK) {
            text[n] = '\0';
            printf("  %s generates: \"%s\"\n", name, text);
        }
        sp_model_free(m);
    }
    /* Calibrated importance keeps what matters better than weight norms (F32
     * storage: pruning alone). */
    const char *pol = scratch("f32-policy.txt");
    CHECK(write_file(pol, "* F32\n", 6));
    struct quality qc, qw;
    struct sp_quantize_result res;
    struct qargs ac = {.in = f32, .policy_file = pol, .calib = calib, .calib_chunks = 8, .prune_ffn = 0.1f};
    struct qargs aw = {.in = f32, .policy_file = pol, .prune_ffn = 0.1f};
    if (run_variant(&ac, "prune10-calib.gguf", &res, &qc) && run_variant(&aw, "prune10-norms.gguf", &res, &qw)) {
        CHECKF(qc.kl_mean < qw.kl_mean, "calibrated pruning KL %.4f >= weight-norm pruning %.4f", qc.kl_mean,
               qw.kl_mean);
    }
    /* 3 heads: not whole groups of 2; 8: no head left. */
    const char *out = scratch("pruned-bad.gguf");
    struct qargs bad = {.in = f32, .policy = "mem4", .prune_heads = 3};
    CHECK(quantize(&bad, out, &res) == SP_E_INVALID);
    CHECKF(strstr(sp_last_error(), "--prune-heads 3 cannot be expressed"), "%s", sp_last_error());
    CHECK(!exists(out));
    bad.prune_heads = 8;
    CHECK(quantize(&bad, out, &res) == SP_E_INVALID && !exists(out));
}

/* ---- folding KV heads ------------------------------------------------------------------ */

/* Tensor name of m as floats (malloc'd; NULL, failing a check, if absent). */
static float *tensor_floats(struct sp_model *m, const char *name) {
    const struct sp_tensor_desc *t = sp_model_file_find(m->mf, name);
    CHECKF(t != NULL, "no tensor '%s'", name);
    if (!t) return NULL;
    const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    float *w = malloc((size_t)(rows * t->ne[0]) * sizeof(float));
    if (w && sp_qread_rows(m, t, 0, rows, w) == SP_OK) return w;
    CHECKF(false, "reading '%s': %s", name, sp_last_error());
    free(w);
    return NULL;
}

/* Largest |folded - mean of its group| over the rows of a folded tensor: out
 * heads of hd rows (a matrix's rows of `wide` floats, or a bias's elements
 * with wide 1), out head g the mean of source heads keep[g*f .. g*f+f-1]. */
static double fold_error(const float *src, const float *folded, int out, int hd, int64_t wide, int f,
                         const int *keep) {
    double worst = 0;
    for (int g = 0; g < out; g++) {
        for (int d = 0; d < hd; d++) {
            for (int64_t k = 0; k < wide; k++) {
                double mean = 0;
                for (int j = 0; j < f; j++) mean += src[((int64_t)keep[g * f + j] * hd + d) * wide + k];
                mean /= f;
                worst = fmax(worst, fabs(folded[((int64_t)g * hd + d) * wide + k] - mean));
            }
        }
    }
    return worst;
}

/* Do tensor name of a and b hold the same floats (same count n)? */
static bool same_tensor(struct sp_model *a, struct sp_model *b, const char *name, int64_t n) {
    float *x = tensor_floats(a, name), *y = tensor_floats(b, name);
    const bool same = x && y && memcmp(x, y, (size_t)n * sizeof(float)) == 0;
    free(x);
    free(y);
    return same;
}

/* Check every layer of folded (from src, f32 policy): attn_k and attn_v
 * rows (and biases if any) pooled from heads keep[] (per layer: out*f
 * source heads, NULL = 0, 1, 2, ...); with find_drop, the layer's kept
 * heads are all but one, found by trying each.  Query side unchanged
 * unless pruned. */
static void check_pooled(struct sp_model *src, struct sp_model *folded, bool find_drop) {
    struct sp_model_info si, fi;
    sp_model_get_info(src, &si);
    sp_model_get_info(folded, &fi);
    const int out = fi.n_kv_heads, hd = si.head_dim_k, E = si.n_embd;
    const int n_src = find_drop ? si.n_kv_heads - 1 : si.n_kv_heads, f = n_src / out;
    CHECK(si.head_dim_k == si.head_dim_v && fi.head_dim_k == hd);
    for (int il = 0; il < si.n_layers; il++) {
        static const char *const kinds[4] = {"attn_k.weight", "attn_v.weight", "attn_k.bias", "attn_v.bias"};
        int keep[64];
        double best = INFINITY;
        for (int drop = find_drop ? 0 : -1; drop < (find_drop ? si.n_kv_heads : 0); drop++) {
            int n = 0;
            for (int h = 0; h < si.n_kv_heads; h++) {
                if (h != drop) keep[n++] = h;
            }
            double worst = 0;
            for (int k = 0; k < 4; k++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s", il, kinds[k]);
                if (k >= 2 && !sp_model_file_find(src->mf, name)) continue;
                float *a = tensor_floats(src, name), *b = tensor_floats(folded, name);
                if (a && b) worst = fmax(worst, fold_error(a, b, out, hd, k < 2 ? E : 1, f, keep));
                free(a);
                free(b);
            }
            best = fmin(best, worst);
        }
        CHECKF(best < 1e-6, "layer %d: folded K/V rows are %.3g from the mean of their group's", il, best);
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", il);
        if (!find_drop) CHECKF(same_tensor(src, folded, name, (int64_t)si.n_heads * hd * E), "%s changed", name);
        snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", il);
        if (sp_model_file_find(src->mf, name)) CHECKF(same_tensor(src, folded, name, hd), "%s changed", name);
    }
}

/* All next-token logits of model path on the held-out chunks (malloc'd). */
static float *logits_of(const char *path) {
    struct sp_model *m = load(path, NULL);
    float *l = m ? malloc((size_t)EVAL_CHUNKS * EVAL_CTX / 2 * (size_t)ev.n_vocab * sizeof(float)) : NULL;
    if (l && !chunk_logits(m, ev.toks, ev.n_vocab, l)) {
        free(l);
        l = NULL;
    }
    sp_model_free(m);
    return l;
}

static void test_folding(void) {
    const size_t n_logits = (size_t)EVAL_CHUNKS * EVAL_CTX / 2 * (size_t)ev.n_vocab;
    struct sp_quantize_result res;
    /* 4 into 4: the identity, with F32 and with a quantizing policy */
    static const char *const policies[2] = {"f32", "mem4"};
    for (int k = 0; k < 2; k++) {
        char plain[64], same[64];
        snprintf(plain, sizeof plain, "fold-%s-none.gguf", policies[k]);
        snprintf(same, sizeof same, "fold-%s-kv4.gguf", policies[k]);
        struct qargs a = {.in = f32, .policy = policies[k]};
        CHECKF(quantize(&a, scratch(plain), &res) == SP_OK, "%s: %s", plain, sp_last_error());
        a.merge_kv_heads = 4;
        CHECKF(quantize(&a, scratch(same), &res) == SP_OK && res.n_kv_heads == 4, "%s: %s", same, sp_last_error());
        float *x = logits_of(scratch(plain)), *y = logits_of(scratch(same));
        CHECKF(x && y && memcmp(x, y, n_logits * sizeof(float)) == 0, "%s: 4 KV heads into 4 changed the logits",
               policies[k]);
        free(x);
        free(y);
    }
    /* 4 into 2 and into 1: shapes, pooled rows, and a different model */
    struct sp_model *src = load(f32, NULL);
    for (int g = 2; src && g >= 1; g--) {
        char name[64];
        snprintf(name, sizeof name, "fold-kv%d.gguf", g);
        struct qargs a = {.in = f32, .policy = "f32", .merge_kv_heads = g};
        struct quality qq;
        if (!run_variant(&a, name, &res, &qq)) continue;
        CHECK(res.n_heads == 8 && res.n_kv_heads == g && res.n_ff == 172);
        CHECKF(qq.kl_mean > 0.1, "%s: KL %.4f from the unfolded model: were the heads pooled?", name, qq.kl_mean);
        struct sp_model *m = load(scratch(name), NULL);
        if (!m) continue;
        struct sp_model_info info;
        sp_model_get_info(m, &info);
        const struct sp_tensor_desc *wk = sp_model_file_find(m->mf, "blk.0.attn_k.weight");
        CHECKF(info.n_kv_heads == g && info.n_heads == 8 && wk && wk->ne[0] == 64 && wk->ne[1] == 8 * g,
               "%s: kv %d, attn_k %lld x %lld", name, info.n_kv_heads, wk ? (long long)wk->ne[0] : 0,
               wk ? (long long)wk->ne[1] : 0);
        CHECK(info.n_params == llama_params(&info) && info.n_params == res.n_params);
        check_pooled(src, m, false);
        sp_model_free(m);
    }
    /* qwen2: biases pooled too (2 KV heads into 1); qwen3: head norms kept (4 into 2) */
    static const char *const qwen[2] = {"models/tiny-qwen/tiny-qwen2-f32.gguf", "models/tiny-qwen/tiny-qwen3-f32.gguf"};
    for (int k = 0; k < 2; k++) {
        if (!need_fixture(qwen[k])) continue;
        char in[4096];
        snprintf(in, sizeof in, "%s", fixture(qwen[k]));
        struct sp_model *qs = load(in, NULL);
        struct sp_model_info qi;
        if (!qs) continue;
        sp_model_get_info(qs, &qi);
        const char *out = scratch(k ? "fold-qwen3.gguf" : "fold-qwen2.gguf");
        struct qargs a = {.in = in, .policy = "f32", .merge_kv_heads = qi.n_kv_heads / 2};
        CHECKF(quantize(&a, out, &res) == SP_OK, "%s: %s", qwen[k], sp_last_error());
        struct sp_model *m = load(out, NULL);
        int32_t gen[GEN_TOKENS];
        if (m) {
            check_pooled(qs, m, false);
            CHECK(generate(m, gen));
        }
        sp_model_free(m);
        sp_model_free(qs);
    }
    /* with pruning: one KV group goes, the 3 kept heads fold into 1; 2 does not divide 3 */
    struct qargs ap = {.in = f32, .policy = "f32", .prune_heads = 2, .merge_kv_heads = 1};
    const char *pf = scratch("fold-pruned.gguf");
    CHECKF(quantize(&ap, pf, &res) == SP_OK, "%s", sp_last_error());
    CHECK(res.n_heads == 6 && res.n_kv_heads == 1);
    struct sp_model *m = src ? load(pf, NULL) : NULL;
    if (m) check_pooled(src, m, true);
    sp_model_free(m);
    sp_model_free(src);
    ap.merge_kv_heads = 2;
    CHECK(quantize(&ap, scratch("fold-bad.gguf"), &res) == SP_E_INVALID);
    CHECKF(strstr(sp_last_error(), "3 KV heads after pruning") && strstr(sp_last_error(), "one of 1, 3"), "%s",
           sp_last_error());
    /* bad counts: refused, nothing written */
    static const int bad[3] = {3, 8, -1};
    for (int k = 0; k < 3; k++) {
        struct qargs a = {.in = f32, .policy = "f32", .merge_kv_heads = bad[k]};
        CHECK(quantize(&a, scratch("fold-bad.gguf"), &res) == SP_E_INVALID);
        CHECKF(strstr(sp_last_error(), bad[k] > 0 ? "G must divide 4 (one of 1, 2, 4)" : "negative"), "%d: %s",
               bad[k], sp_last_error());
        CHECK(!exists(scratch("fold-bad.gguf")));
    }
    /* Calibrated channel scaling still folds exactly: the query heads that
     * share a pooled KV head share one scale, so with F16 storage the model
     * is the F32 fold's.  (No covariances: GPTQ does not apply to F16, and
     * collecting them would take most of this test's time.) */
    const char *pol = scratch("f16-policy.txt");
    CHECK(write_file(pol, "* F16\n", 6));
    struct qargs ac = {.in = f32, .policy_file = pol, .calib = calib, .calib_chunks = 8, .merge_kv_heads = 2,
                       .calib_skip = SP_CALIB_GPTQ};
    const char *cf = scratch("fold-kv2-f16-calib.gguf");
    CHECKF(quantize(&ac, cf, &res) == SP_OK && res.n_scaled > 0, "%s", sp_last_error());
    float *x = logits_of(scratch("fold-kv2.gguf")), *y = logits_of(cf);
    if (x && y) {
        const struct quality q = compare(x, y, ev.n_vocab);
        CHECKF(q.kl_mean < KL_EXACT, "F16 fold after channel scaling: KL %.2e from the F32 fold", q.kl_mean);
        printf("fold 4->2, F16 + channel scaling vs F32 fold: KL %.2e\n", q.kl_mean);
    }
    free(x);
    free(y);
}

/* ---- failures leave nothing behind ------------------------------------------------------ */

static bool cancel_after_3(const struct sp_quantize_tensor_report *r, void *user) {
    (void)user;
    return r->index < 2;
}

static void test_atomicity(void) {
    char q4[4096];
    snprintf(q4, sizeof q4, "%s", fixture(MODEL_DIR "stories260K-q4_0.gguf"));
    const char *out = scratch("atomic.gguf"), *pol = scratch("bad-policy.txt");
    struct sp_quantize_params p = sp_quantize_default_params();
    p.input = f32;
    p.output = out;

    /* a malformed policy file: refused with its line, no output */
    const char *bad = "# header\noutput.weight i6_b64\n*.attn_* i4_b64 oops\n* i4_b64\n";
    CHECK(write_file(pol, bad, strlen(bad)));
    p.policy_file = pol;
    CHECK(sp_quantize(&p, NULL) == SP_E_FORMAT);
    CHECKF(strstr(sp_last_error(), "line 3"), "%s", sp_last_error());
    CHECK(!exists(out));
    /* a policy that leaves a matrix without a rule */
    const char *partial = "*.attn_* i4_b64\n";
    CHECK(write_file(pol, partial, strlen(partial)));
    CHECK(sp_quantize(&p, NULL) == SP_E_FORMAT && strstr(sp_last_error(), "no rule matches tensor") && !exists(out));
    p.policy_file = NULL;

    /* an output that is one of the files read, by inode (the same path, a
     * hard link, a symbolic link): refused before any work, nothing touched */
    {
        size_t n_in = 0;
        char *orig = read_text(f32, &n_in);
        char copy[4200], hard[4200], soft[4200]; /* scratch() has only four buffers */
        snprintf(copy, sizeof copy, "%s/in.gguf", dir);
        snprintf(hard, sizeof hard, "%s/in-hard.gguf", dir);
        snprintf(soft, sizeof soft, "%s/in-soft.gguf", dir);
        CHECK(orig && write_file(copy, orig, n_in) && link(copy, hard) == 0 && symlink(copy, soft) == 0);
        p.input = copy;
        const char *const outs[] = {copy, hard, soft};
        for (size_t k = 0; k < SP_ARRAY_LEN(outs); k++) {
            p.output = outs[k];
            const double t0 = (double)clock() / CLOCKS_PER_SEC;
            CHECK(sp_quantize(&p, NULL) == SP_E_INVALID);
            CHECKF(strstr(sp_last_error(), "is the input file"), "%s", sp_last_error());
            CHECKF((double)clock() / CLOCKS_PER_SEC - t0 < 0.05, "refused after %.2f s of work",
                   (double)clock() / CLOCKS_PER_SEC - t0);
        }
        size_t n_now = 0;
        char *now = read_text(copy, &n_now);
        CHECK(now && n_now == n_in && memcmp(now, orig, n_in) == 0);
        p.input = f32;
        p.output = calib;
        p.calib_path = calib;
        CHECK(sp_quantize(&p, NULL) == SP_E_INVALID && strstr(sp_last_error(), "is the calibration text file"));
        p.calib_path = NULL;
        p.output = out;
        CHECK(count_files(".sparrow-tmp.") == 0);
        free(orig);
        free(now);
        unlink(soft);
        unlink(hard);
        unlink(copy);
    }

    /* an input the quantizer does not read (Q4_0 tensors) */
    p.input = q4;
    CHECK(sp_quantize(&p, NULL) == SP_E_UNSUPPORTED && strstr(sp_last_error(), "Q4_0") && !exists(out));
    p.input = f32;

    /* cancelled after three tensors: an existing file is untouched */
    CHECK(write_file(out, "keep", 4));
    p.on_tensor = cancel_after_3;
    CHECK(sp_quantize(&p, NULL) == SP_E_STATE);
    size_t n = 0;
    char *kept = read_text(out, &n);
    CHECK(kept && n == 4 && memcmp(kept, "keep", 4) == 0);
    free(kept);
    CHECKF(count_files(".sparrow-tmp.") == 0, "temporary files left in %s", dir);
    p.on_tensor = NULL;

    /* the complete file replaces it; a truncated copy is refused by the loader */
    struct sp_quantize_result res;
    CHECK(sp_quantize(&p, &res) == SP_OK);
    char *data = read_text(out, &n);
    CHECK(data && n == res.file_size && strcmp(res.policy, "mem4") == 0);
    const char *cut = scratch("truncated.gguf");
    if (data && write_file(cut, data, n - 4096)) {
        struct sp_model *m = NULL;
        CHECK(sp_model_load(cut, NULL, &m) == SP_E_FORMAT && m == NULL);
        CHECKF(strstr(sp_last_error(), "truncated.gguf"), "%s", sp_last_error());
    }
    free(data);
    CHECK(count_files(".sparrow-tmp.") == 0);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/sparrow-quantize.XXXXXX", scratch_dir());
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a folder under %s: %s\n", scratch_dir(), strerror(errno));
        return 1;
    }
    sp_log_set(NULL, NULL);
    test_policy_parser();
    test_gptq_random();
    snprintf(f32, sizeof f32, "%s", fixture(MODEL_DIR "stories260K-f32.gguf"));
    snprintf(bin, sizeof bin, "%s", fixture(MODEL_DIR "stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", fixture(MODEL_DIR "tok512.bin"));
    snprintf(calib, sizeof calib, "%s", scratch("calib.txt"));
    size_t len = 0;
    char *text = need_fixture(EXCERPT) ? read_text(fixture(EXCERPT), &len) : NULL;
    if (need_fixture(MODEL_DIR "stories260K-f32.gguf") && need_fixture(MODEL_DIR "stories260K.bin") &&
        need_fixture(MODEL_DIR "tok512.bin") && text && len > CALIB_BYTES && write_file(calib, text, CALIB_BYTES) &&
        eval_init(f32)) {
        test_policies();
        test_pruning();
        test_folding();
        test_atomicity();
    }
    free(text);
    eval_free();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_report("test_quantize");
}
