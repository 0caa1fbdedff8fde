/*
 * test_moe.c -- the Mixture-of-Experts paths that no peer golden covers,
 * checked on variants of the real stories260K-moe file rewritten here:
 *  - a shared expert (qwen2moe style), with and without its sigmoid gate:
 *    routed experts zeroed and the shared expert set to the dense
 *    stories260K FFN (its down projection doubled when the zero gate halves
 *    it) must give exactly the dense model's logits;
 *  - router ties: a zero router makes all experts equally likely, and the
 *    lower ids must win, with weights 1/2 each;
 *  - refused layouts (one tensor per expert, a wrong 3-D shape, a missing
 *    router, shared-expert tensors without their gate projection, more
 *    experts used than exist) fail with a message naming the tensor or key;
 *  - the routing trace hook refuses a dense model.
 * Golden routing and logits are test_golden.c's job.
 */
#include "sparrow.h"

#include "api_internal.h"
#include "format/gguf.h"
#include "format/model_file.h"
#include "quant/quant.h"
#include "test_util.h"

#define MOE_F32 "models/stories260K-moe/stories260K-moe-f32.gguf"
#define DENSE_F32 "models/stories260K/stories260K-f32.gguf"
#define N_LAYERS 5
#define N_STEPS 8 /* greedy decode steps compared after the prompt */

static const int32_t prompt[] = {1, 403, 407, 261, 378}; /* "Once upon a time" with BOS */
#define N_PROMPT 5

/* ---------------------------------------------------------------------------
 * A source file in memory and a list of tensors to write
 * ------------------------------------------------------------------------- */
struct src {
    struct sp_model_file *mf;
    unsigned char *bytes; /* the whole file */
};

static bool src_open(const char *rel, struct src *s) {
    memset(s, 0, sizeof *s);
    const char *path = need_fixture(rel);
    if (!path) return false;
    sp_status rc = sp_model_file_open(path, NULL, false, &s->mf);
    CHECKF(rc == SP_OK, "open %s: %s", path, sp_last_error());
    if (rc) return false;
    FILE *f = fopen(path, "rb");
    s->bytes = malloc((size_t)s->mf->file_size);
    bool ok = f && s->bytes && fread(s->bytes, 1, (size_t)s->mf->file_size, f) == s->mf->file_size;
    if (f) fclose(f);
    CHECKF(ok, "cannot read %s", path);
    return ok;
}

static void src_close(struct src *s) {
    sp_model_file_free(s->mf);
    free(s->bytes);
}

static const float *src_data(const struct src *s, const char *name, const struct sp_tensor_desc **t_out) {
    const struct sp_tensor_desc *t = sp_model_file_find(s->mf, name);
    CHECKF(t && t->type == SP_QTYPE_F32, "tensor %s missing or not F32", name);
    if (t_out) *t_out = t;
    return t ? (const float *)(s->bytes + t->offset) : NULL;
}

struct otensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3];
    const void *data; /* F32 */
    float *owned;     /* data, when made here */
};

#define MAX_OUT 160
static struct otensor outs[MAX_OUT];
static int n_out;

static struct otensor *out_add(const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                               const void *data) {
    if (n_out >= MAX_OUT) return NULL;
    struct otensor *o = &outs[n_out++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->n_dims = n_dims;
    o->ne[0] = ne0;
    o->ne[1] = ne1;
    o->ne[2] = ne2;
    o->data = data;
    return o;
}

/* A copy of data * scale (n floats), owned by the last added tensor. */
static float *scaled(const float *data, size_t n, float scale) {
    float *p = calloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; p && data && i < n; i++) p[i] = data[i] * scale;
    outs[n_out - 1].owned = p;
    outs[n_out - 1].data = p;
    return p;
}

static void outs_reset(void) {
    for (int i = 0; i < n_out; i++) free(outs[i].owned);
    n_out = 0;
}

/* Every tensor of the source as it is (tensor order kept). */
static void out_copy_all(const struct src *s) {
    for (uint32_t i = 0; i < s->mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &s->mf->tensors[i];
        out_add(t->name, t->n_dims, t->ne[0], t->ne[1], t->ne[2], s->bytes + t->offset);
    }
}

static struct otensor *out_find(const char *name) {
    for (int i = 0; i < n_out; i++)
        if (strcmp(outs[i].name, name) == 0) return &outs[i];
    return NULL;
}

/* Write the source's metadata (key `skip` left out; `used` replaces
 * expert_used_count when nonzero) and the tensor list to path. */
static bool write_model(const char *path, const struct src *s, uint32_t used) {
    struct sp_gguf_writer *w = NULL;
    sp_status rc = sp_gguf_writer_open(path, 0, &w);
    for (uint64_t i = 0; !rc && i < s->mf->n_meta; i++) {
        const struct sp_meta_kv *kv = &s->mf->meta[i];
        if (used && strcmp(kv->key, "llama.expert_used_count") == 0) {
            rc = sp_gguf_writer_set_u32(w, kv->key, used);
        } else {
            rc = sp_gguf_writer_set(w, kv->key, &kv->value);
        }
    }
    for (int i = 0; !rc && i < n_out; i++) rc = sp_gguf_writer_add_tensor(w, outs[i].name, SP_QTYPE_F32, outs[i].n_dims, outs[i].ne);
    for (int i = 0; !rc && i < n_out; i++) {
        const size_t n = (size_t)(outs[i].ne[0] * outs[i].ne[1] * outs[i].ne[2]);
        rc = sp_gguf_writer_write(w, outs[i].data, n * sizeof(float));
    }
    if (!rc) rc = sp_gguf_writer_finish(w);
    sp_gguf_writer_free(w);
    CHECKF(rc == SP_OK, "writing %s: %s", path, sp_last_error());
    return rc == SP_OK;
}

static const char *tmp_file(const char *name) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/sp_test_moe_%ld_%s", scratch_dir(), (long)getpid(), name);
    return buf;
}

/* ---------------------------------------------------------------------------
 * Running a model
 * ------------------------------------------------------------------------- */

/* Prompt, then N_STEPS tokens fed back (the given ones, or greedy when
 * feed == NULL); logits of every step into out ((N_STEPS + 1) * 512). */
static sp_status run_logits(struct sp_model *m, const int32_t *feed, float *out, int32_t *fed) {
    struct sp_session_params p = sp_session_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    p.sampling.temp = 0.0f;
    struct sp_session *s = NULL;
    sp_status st = sp_session_init(m, &p, &s);
    if (st) return st;
    st = sp_decode(s, prompt, N_PROMPT);
    for (int k = 0; st == SP_OK && k <= N_STEPS; k++) {
        memcpy(out + (size_t)k * 512, sp_get_logits(s), 512 * sizeof(float));
        if (k == N_STEPS) break;
        int32_t t = -1;
        if (feed) {
            t = feed[k];
        } else {
            st = sp_sample(s, &t);
        }
        if (fed) fed[k] = t;
        if (st == SP_OK) st = sp_decode(s, &t, 1);
    }
    sp_session_free(s);
    return st;
}

static struct sp_model *load(const char *path) {
    struct sp_model *m = NULL;
    sp_status st = sp_model_load(path, NULL, &m);
    CHECKF(st == SP_OK, "load %s: %s (%s)", path, sp_status_str(st), sp_last_error());
    return m;
}

/* ---------------------------------------------------------------------------
 * Shared expert == the dense FFN
 * ------------------------------------------------------------------------- */
static float dense_logits[(N_STEPS + 1) * 512];
static int32_t dense_tokens[N_STEPS];

static void test_shared_expert(const struct src *moe, const struct src *dense, bool gated) {
    const char *what = gated ? "shared expert with gate" : "shared expert without gate";
    outs_reset();
    out_copy_all(moe);
    char name[64];
    for (int il = 0; il < N_LAYERS; il++) {
        /* Routed experts output 0: their down projections are zeroed. */
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", il);
        struct otensor *o = out_find(name);
        CHECK(o != NULL);
        if (!o) return;
        o->owned = calloc((size_t)(o->ne[0] * o->ne[1] * o->ne[2]), sizeof(float));
        o->data = o->owned;
        const struct sp_tensor_desc *tg, *tu, *td;
        char g[64], u[64], d[64];
        snprintf(g, sizeof g, "blk.%d.ffn_gate.weight", il);
        snprintf(u, sizeof u, "blk.%d.ffn_up.weight", il);
        snprintf(d, sizeof d, "blk.%d.ffn_down.weight", il);
        const float *wg = src_data(dense, g, &tg), *wu = src_data(dense, u, &tu), *wd = src_data(dense, d, &td);
        if (!wg || !wu || !wd) return;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", il);
        out_add(name, 2, tg->ne[0], tg->ne[1], 1, wg);
        snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", il);
        out_add(name, 2, tu->ne[0], tu->ne[1], 1, wu);
        /* sigmoid(0) = 1/2 exactly and doubling is exact: 1/2 * (2 W) h == W h. */
        snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", il);
        out_add(name, 2, td->ne[0], td->ne[1], 1, NULL);
        scaled(wd, (size_t)(td->ne[0] * td->ne[1]), gated ? 2.0f : 1.0f);
        if (gated) {
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", il);
            out_add(name, 1, td->ne[1], 1, 1, NULL);
            scaled(NULL, (size_t)td->ne[1], 0.0f);
        }
    }
    const char *path = tmp_file("shexp.gguf");
    if (!write_model(path, moe, 0)) return;
    struct sp_model *m = load(path);
    if (m) {
        static float got[(N_STEPS + 1) * 512];
        sp_status st = run_logits(m, dense_tokens, got, NULL);
        CHECKF(st == SP_OK, "%s: run: %s", what, sp_last_error());
        double d = 0;
        for (size_t i = 0; i < sizeof got / sizeof got[0]; i++) d = fmax(d, fabs((double)got[i] - dense_logits[i]));
        printf("  %s: max|dlogit| vs the dense model over %d steps: %.3g\n", what, N_STEPS + 1, d);
        CHECKF(st == SP_OK && d <= 1e-6, "%s: logits differ from the dense model's by %g", what, d);
        sp_model_free(m);
    }
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Router ties
 * ------------------------------------------------------------------------- */
static void test_ties(const struct src *moe) {
    outs_reset();
    out_copy_all(moe);
    char name[64];
    for (int il = 0; il < N_LAYERS; il++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
        struct otensor *o = out_find(name);
        CHECK(o != NULL);
        if (!o) return;
        o->owned = calloc((size_t)(o->ne[0] * o->ne[1]), sizeof(float));
        o->data = o->owned;
    }
    const char *path = tmp_file("ties.gguf");
    if (!write_model(path, moe, 0)) return;
    struct sp_model *m = load(path);
    struct sp_session *s = NULL;
    if (m) {
        struct sp_session_params p = sp_session_default_params();
        p.n_ctx = 32;
        CHECK(sp_session_init(m, &p, &s) == SP_OK && sp_session_trace_routing(s, true) == SP_OK);
    }
    if (s) {
        CHECK(sp_decode(s, prompt, N_PROMPT) == SP_OK);
        int n_ok = 0;
        for (uint32_t il = 0; il < N_LAYERS; il++) {
            for (uint32_t pos = 0; pos < N_PROMPT; pos++) {
                struct sp_moe_route r;
                bool ok = sp_session_routing(s, il, pos, &r) && r.n_used == 2 && r.experts[0] == 0 &&
                          r.experts[1] == 1 && r.weights[0] == 0.5f && r.weights[1] == 0.5f && r.probs[7] == 0.125f;
                n_ok += ok;
            }
        }
        printf("  zero router: %d of %d decisions are experts [0,1] with weights 1/2\n", n_ok, N_LAYERS * N_PROMPT);
        CHECKF(n_ok == N_LAYERS * N_PROMPT, "ties: %d of %d decisions chose the lower ids with weights 1/2", n_ok,
               N_LAYERS * N_PROMPT);
        struct sp_moe_route r;
        CHECK(!sp_session_routing(s, 0, N_PROMPT, &r)); /* not decoded yet */
        CHECK(!sp_session_routing(s, N_LAYERS, 0, &r));
        int32_t t = 5;
        CHECK(sp_decode(s, &t, 1) == SP_OK);
        CHECK(!sp_session_routing(s, 0, 0, &r));        /* the previous call's record is gone */
        CHECK(sp_session_routing(s, 0, N_PROMPT, &r));
    }
    sp_session_free(s);
    sp_model_free(m);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Refused layouts
 * ------------------------------------------------------------------------- */
static bool has(const char *msg, const char *needle) {
    return strstr(msg, needle) != NULL;
}

static void expect_refused(const struct src *moe, uint32_t used, const char *what, sp_status want, const char *w1,
                           const char *w2) {
    const char *path = tmp_file("bad.gguf");
    if (!write_model(path, moe, used)) return;
    struct sp_model *m = NULL;
    sp_status st = sp_model_load(path, NULL, &m);
    const char *msg = sp_last_error();
    printf("  %s: %s (%s)\n", what, sp_status_str(st), msg);
    CHECKF(st == want && m == NULL && has(msg, w1) && has(msg, w2), "%s: got %s '%s', want %s naming '%s', '%s'",
           what, sp_status_str(st), msg, sp_status_str(want), w1, w2);
    sp_model_free(m);
    unlink(path);
}

static void test_refused(const struct src *moe) {
    outs_reset();
    out_copy_all(moe);
    struct otensor *o = out_find("blk.2.ffn_gate_exps.weight");
    if (o) snprintf(o->name, sizeof o->name, "blk.2.ffn_gate.0.weight");
    expect_refused(moe, 0, "one tensor per expert", SP_E_UNSUPPORTED, "blk.2.ffn_gate.0.weight", "ffn_gate_exps");

    outs_reset();
    out_copy_all(moe);
    o = out_find("blk.1.ffn_up_exps.weight");
    if (o) {
        o->ne[1] = 96; /* same bytes, wrong shape */
        o->ne[2] = 16;
    }
    expect_refused(moe, 0, "wrong expert shape", SP_E_FORMAT, "blk.1.ffn_up_exps.weight", "expected [64, 192, 8]");

    outs_reset();
    out_copy_all(moe);
    o = out_find("blk.3.ffn_gate_inp.weight");
    if (o) snprintf(o->name, sizeof o->name, "blk.3.ffn_gate_inp_x.weight");
    expect_refused(moe, 0, "missing router", SP_E_FORMAT, "blk.3.ffn_gate_inp.weight", "missing");

    outs_reset();
    out_copy_all(moe);
    out_add("blk.0.ffn_up_shexp.weight", 2, 64, 32, 1, NULL);
    scaled(NULL, 64 * 32, 0.0f);
    expect_refused(moe, 0, "shared expert without its gate projection", SP_E_FORMAT, "blk.0.",
                   "ffn_gate_shexp.weight");

    outs_reset();
    out_copy_all(moe);
    expect_refused(moe, 9, "9 of 8 experts used", SP_E_FORMAT, "expert_used_count", "expert_count");
    outs_reset();
}

/* ------------------------------------------------------------------------- */
int main(void) {
    sp_init();
    struct src moe, dense;
    const bool have = src_open(MOE_F32, &moe) & src_open(DENSE_F32, &dense);
    if (have) {
        struct sp_model *dm = load(fixture(DENSE_F32));
        if (dm) {
            CHECK(run_logits(dm, NULL, dense_logits, dense_tokens) == SP_OK);
            struct sp_session *s = NULL;
            CHECK(sp_session_init(dm, NULL, &s) == SP_OK);
            CHECKF(sp_session_trace_routing(s, true) == SP_E_INVALID, "routing trace on a dense model must be refused");
            sp_session_free(s);
            sp_model_free(dm);
        }
        test_shared_expert(&moe, &dense, true);
        test_shared_expert(&moe, &dense, false);
        test_ties(&moe);
        test_refused(&moe);
    }
    src_close(&moe);
    src_close(&dense);
    return test_report("test_moe");
}
