/*
 * synth.c -- synthetic models: GGUF files with seeded random weights in the
 * exact shapes of real models (Llama 2 7B, Llama 3 8B, CodeLlama 34B,
 * Qwen3-30B-A3B, plus tiny shapes for tests), so that speed and memory can be
 * measured on full-size files without downloading any.  The tensors, types,
 * hyper-parameter keys and a SentencePiece-style vocabulary are what
 * llama.cpp expects, so the same file runs in both engines.
 *
 * What it is not: a converter or a quantizer of real weights, and the output
 * is no language model (it generates gibberish, finite and varied).
 *
 * Every row of every tensor comes from its own stream (seed, tensor index,
 * row), so the bytes depend on shape, type and seed only -- not on the number
 * of threads.  Instead of a file type, a quantize policy (src/quantize/policy.c,
 * by name or from a file) can choose each matrix's type: then Sparrow's native
 * types are written directly, each row quantized in one pass by
 * sp_quantize_rows_fast (the quantizer's scale search costs several times
 * longer and buys nothing for random weights), so mixed-precision models of
 * full size need no F16 intermediate.  Rows are generated and quantized in
 * slabs of a few MiB that the threads fill in parallel and the calling thread
 * appends to the GGUF writer (format/gguf.h; temporary file + rename, so a
 * failed or cancelled run leaves nothing behind).  docs/BENCHMARKS.md describes the shapes and their use.
 */
#include "sparrow.h"

#include "core/core.h"
#include "format/gguf.h"
#include "quant/native.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "quantize/quantize.h" /* policies: synth is a tool, like quantize (DESIGN.md) */
#include "sched/pool.h"

#include <math.h>
#include <stdio.h>

/* ---- shapes ------------------------------------------------------------ */

struct shape {
    const char *name;
    const char *arch; /* "llama" or "qwen3moe" */
    const char *about;
    uint32_t n_vocab, n_ctx, n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff;
    uint32_t n_experts, n_experts_used, n_ff_exp; /* MoE only; n_ff is then the dense size the file records */
    float rope_theta, rms_eps;
};

static const struct shape shapes[] = {
    {"tiny", "llama", "test shape: 2 layers of width 256, GQA 4/2", 512, 1024, 256, 2, 4, 2, 64, 512, 0, 0, 0, 10000.0f,
     1e-5f},
    {"tiny-moe", "qwen3moe", "test shape: qwen3moe, 2 layers, 8 experts (2 active)", 512, 1024, 256, 2, 4, 2, 64, 768,
     8, 2, 256, 1000000.0f, 1e-6f},
    {"deep-moe", "qwen3moe", "test shape: the qwen3-30b-a3b layout (48 layers, 128 experts, 8 active) at width 256",
     2048, 1024, 256, 48, 4, 2, 64, 512, 128, 8, 64, 1000000.0f, 1e-6f},
    {"llama-7b", "llama", "Llama 2 7B", 32000, 4096, 4096, 32, 32, 32, 128, 11008, 0, 0, 0, 10000.0f, 1e-5f},
    {"llama3-8b", "llama", "Llama 3 8B (GQA 32/8)", 128256, 8192, 4096, 32, 32, 8, 128, 14336, 0, 0, 0, 500000.0f,
     1e-5f},
    {"llama-34b", "llama", "CodeLlama 34B (GQA 64/8)", 32000, 16384, 8192, 48, 64, 8, 128, 22016, 0, 0, 0, 1000000.0f,
     1e-5f},
    {"qwen3-30b-a3b", "qwen3moe", "Qwen3-30B-A3B (128 experts, 8 active, qk-norm)", 151936, 40960, 2048, 48, 32, 4,
     128, 6144, 128, 8, 768, 1000000.0f, 1e-6f},
};

/* ---- types: a file type decides each tensor's element type ---------------- */

enum ftype { FT_F16, FT_BF16, FT_Q8_0, FT_Q4_0, FT_Q4_K_M, FT_COUNT };
static const char *const ftype_names[FT_COUNT] = {"f16", "bf16", "q8_0", "q4_0", "q4_k_m"};
/* general.file_type as llama.cpp numbers it (enum llama_ftype). */
static const uint32_t ftype_ids[FT_COUNT] = {1, 32, 7, 2, 15};

/* llama.cpp's Q4_K_M rule for attn_v / ffn_down (its use_more_bits): the
 * first and last eighth of the layers and every third one in between get
 * Q6_K. */
static bool more_bits(uint32_t il, uint32_t n) {
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

/* Element type of a weight matrix.  kind: 'e' token_embd, 'o' output,
 * 'v' attn_v, 'd' ffn_down(_exps), 'w' any other matrix. */
static uint32_t weight_type(enum ftype ft, char kind, uint32_t il, uint32_t n_layers) {
    switch (ft) {
    case FT_F16: return SP_QTYPE_F16;
    case FT_BF16: return SP_QTYPE_BF16;
    case FT_Q8_0: return SP_QTYPE_Q8_0;
    case FT_Q4_0: return kind == 'o' ? SP_QTYPE_Q6_K : SP_QTYPE_Q4_0; /* as llama-quantize writes Q4_0 files */
    case FT_Q4_K_M:
        if (kind == 'o') return SP_QTYPE_Q6_K;
        if ((kind == 'v' || kind == 'd') && more_bits(il, n_layers)) return SP_QTYPE_Q6_K;
        return SP_QTYPE_Q4_K;
    default: return SP_QTYPE_F32;
    }
}

/* What chooses the types: a file type, or a policy (then ft is unused). */
struct tsel {
    enum ftype ft;
    const struct sp_qpolicy *pol;
};

/* A matrix's type under a policy: its first matching rule, with quantize's
 * fallback for a ggml type whose block does not divide the row (F16).  No
 * rule matching is an error, as in sp_quantize. */
static sp_status policy_type(const struct sp_qpolicy *pol, const char *name, int64_t ne0, uint32_t *type) {
    const struct sp_qrule *r = sp_qpolicy_match(pol, name);
    if (!r) {
        return sp_err(SP_E_INVALID, "sp_synth: '%s': no rule matches tensor '%s' (end the policy with a catch-all "
                      "'* TYPE')", pol->origin, name);
    }
    *type = r->type;
    if (!sp_qtype_is_native(r->type) && ne0 % sp_qtraits_get(r->type)->block_elems != 0) *type = SP_QTYPE_F16;
    return SP_OK;
}

/* ---- the tensor plan: what the file holds, in file order ------------------ */

/* Keeping tokens apart in a random network.  Random attention averages the
 * values of the whole context, so its output is nearly the same for every
 * later token; summed over dozens of layers it swamps what is particular to
 * the token, and every token then routes to the same few experts in deep
 * layers -- a cache's best case, not the worst.  So the embedding is drawn
 * at unit scale (INIT_EMBED: its norm is sqrt(n_embd), as large as a normed
 * block input) and the projections that write into the residual stream
 * (attention output, FFN and expert down) 1/sqrt(2 n_layers) smaller
 * (INIT_RESID, as depth-scaled initialisations do).  Measured on the
 * deep-moe shape (tests/test_synth.c): ~97 distinct experts of 128 chosen
 * over 24 tokens in every layer, as uniform routing gives, instead of ~25. */
enum init { INIT_WEIGHT, INIT_NORM, INIT_RESID, INIT_EMBED };

struct tplan {
    char name[48];
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[3]; /* ne[0] = row length = fan-in */
    enum init init;
};

struct plan {
    struct tplan *t; /* (n) */
    uint32_t n, cap;
    uint64_t n_params;
    uint64_t bytes; /* tensor data, unpadded */
    int64_t max_row;
    bool native, native_l8, ggml_quant; /* what the metadata must declare (as quantize.c) */
};

static sp_status plan_add(struct plan *p, const char *name, uint32_t type, enum init init, int64_t ne0, int64_t ne1,
                          int64_t ne2) {
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 64;
        struct tplan *nt = sp_realloc(p->t, (size_t)cap * sizeof(*nt));
        if (!nt) return sp_err(SP_E_NOMEM, "sp_synth: out of memory");
        p->t = nt;
        p->cap = cap;
    }
    struct tplan *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->init = init;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    p->n_params += (uint64_t)(ne0 * ne1 * ne2);
    p->bytes += sp_qtype_row_bytes(type, ne0) * (uint64_t)(ne1 * ne2);
    if (ne0 > p->max_row) p->max_row = ne0;
    p->native |= sp_qtype_is_native(type);
    p->native_l8 |= sp_native_layout(type) && sp_native_layout(type)->l8;
    p->ggml_quant |= !sp_qtype_is_native(type) && type != SP_QTYPE_F32 && type != SP_QTYPE_F16 && type != SP_QTYPE_BF16;
    return SP_OK;
}

/* token_embd, then each layer in data-flow order, then output_norm, output:
 * the order the forward pass reads them. */
static sp_status plan_build(const struct shape *s, const struct tsel *sel, struct plan *p) {
    const int64_t E = s->n_embd, V = s->n_vocab, F = s->n_ff, L = s->n_layers;
    const int64_t QD = (int64_t)s->n_heads * s->head_dim, KD = (int64_t)s->n_kv_heads * s->head_dim;
    const bool moe = s->n_experts > 0;
    char nm[48];
    sp_status rc;
    memset(p, 0, sizeof(*p));
#define ADD(init, type, ne0, ne1, ne2)                                                                             \
    do {                                                                                                           \
        if ((rc = plan_add(p, nm, type, init, ne0, ne1, ne2))) goto fail;                                          \
    } while (0)
    /* a matrix: named by nm, typed by the policy or the file type */
#define ADDW(init, kind, il, ne0, ne1, ne2)                                                                        \
    do {                                                                                                           \
        uint32_t ty_ = weight_type(sel->ft, kind, il, s->n_layers);                                                \
        if (sel->pol && (rc = policy_type(sel->pol, nm, ne0, &ty_))) goto fail;                                    \
        ADD(init, ty_, ne0, ne1, ne2);                                                                             \
    } while (0)
    snprintf(nm, sizeof nm, "token_embd.weight");
    ADDW(INIT_EMBED, 'e', 0, E, V, 1);
    for (uint32_t il = 0; il < L; il++) {
#define NM(x) snprintf(nm, sizeof nm, "blk.%u." x, il)
        NM("attn_norm.weight"); ADD(INIT_NORM, SP_QTYPE_F32, E, 1, 1);
        NM("attn_q.weight"); ADDW(INIT_WEIGHT, 'w', il, E, QD, 1);
        NM("attn_k.weight"); ADDW(INIT_WEIGHT, 'w', il, E, KD, 1);
        NM("attn_v.weight"); ADDW(INIT_WEIGHT, 'v', il, E, KD, 1);
        NM("attn_output.weight"); ADDW(INIT_RESID, 'w', il, QD, E, 1);
        if (moe) { /* qwen3moe: per-head q/k norms */
            NM("attn_q_norm.weight"); ADD(INIT_NORM, SP_QTYPE_F32, s->head_dim, 1, 1);
            NM("attn_k_norm.weight"); ADD(INIT_NORM, SP_QTYPE_F32, s->head_dim, 1, 1);
        }
        NM("ffn_norm.weight"); ADD(INIT_NORM, SP_QTYPE_F32, E, 1, 1);
        if (moe) {
            const int64_t X = s->n_experts, FE = s->n_ff_exp;
            NM("ffn_gate_inp.weight"); /* the router: F32 for file types, the policy's rule otherwise */
            if (sel->pol) ADDW(INIT_WEIGHT, 'w', il, E, X, 1);
            else ADD(INIT_WEIGHT, SP_QTYPE_F32, E, X, 1);
            NM("ffn_gate_exps.weight"); ADDW(INIT_WEIGHT, 'w', il, E, FE, X);
            NM("ffn_up_exps.weight"); ADDW(INIT_WEIGHT, 'w', il, E, FE, X);
            NM("ffn_down_exps.weight"); ADDW(INIT_RESID, 'd', il, FE, E, X);
        } else {
            NM("ffn_gate.weight"); ADDW(INIT_WEIGHT, 'w', il, E, F, 1);
            NM("ffn_up.weight"); ADDW(INIT_WEIGHT, 'w', il, E, F, 1);
            NM("ffn_down.weight"); ADDW(INIT_RESID, 'd', il, F, E, 1);
        }
#undef NM
    }
    snprintf(nm, sizeof nm, "output_norm.weight");
    ADD(INIT_NORM, SP_QTYPE_F32, E, 1, 1);
    snprintf(nm, sizeof nm, "output.weight");
    ADDW(INIT_WEIGHT, 'o', 0, E, V, 1);
#undef ADDW
#undef ADD
    return SP_OK;
fail:
    sp_free(p->t);
    memset(p, 0, sizeof(*p));
    return rc;
}

static const struct shape *find_shape(const char *name) {
    for (size_t i = 0; name && i < SP_ARRAY_LEN(shapes); i++) {
        if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
    }
    return NULL;
}

static int find_ftype(const char *name) {
    for (int i = 0; name && i < FT_COUNT; i++) {
        if (strcmp(ftype_names[i], name) == 0) return i;
    }
    return -1;
}

/* ---- random rows ----------------------------------------------------------
 * splitmix64 over a counter: value i of a row is mix(base + i * GAMMA), so the
 * loop has no carried state and rows are independent streams.  Four 16-bit
 * lanes of one draw are summed (Irwin-Hall, n = 4): zero mean, unit variance
 * after scaling, bounded at +-3.46 sigma -- close enough to a normal for
 * weights that only have to keep activations finite and varied. */

#define GAMMA 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void gen_row(uint64_t seed, uint32_t ti, uint64_t row, enum init init, uint32_t n_layers, float *x,
                    int64_t n) {
    const uint64_t base = mix64(seed ^ mix64(((uint64_t)ti << 40) ^ row ^ 0x5eed5eedull));
    /* sum of 4 uniforms on [0, 65535]: mean 131070, variance 4 * (65536^2 - 1) / 12 */
    const float mean = 131070.0f, inv_sd = (float)(1.0 / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0));
    const float scale = init == INIT_NORM    ? 0.02f
                        : init == INIT_EMBED ? 1.0f
                        : init == INIT_RESID ? (float)(1.0 / sqrt((double)n * 2.0 * n_layers))
                                             : (float)(1.0 / sqrt((double)n));
    const float offset = init == INIT_NORM ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = mix64(base + (uint64_t)i * GAMMA);
        const uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) + (uint32_t)((r >> 32) & 0xffff) +
                           (uint32_t)(r >> 48);
        x[i] = offset + ((float)s - mean) * inv_sd * scale;
    }
}

/* ---- one-pass K-quant encoders ------------------------------------------------
 * The reference Q4_K / Q6_K quantizers (quant/ref.c) search 21 trial scales
 * per sub-block: about 50x the cost of Q4_0, which makes an 8B Q4_K_M file
 * take the better part of an hour.  For random weights the search buys
 * nothing, so synth encodes K-quant blocks in one pass with range-filling
 * scales (the search's starting point), in the block layouts of
 * quant/types.h.  The blocks are ordinary Q4_K / Q6_K; test_synth checks
 * that the reference dequantizer gives back the source within the format's
 * error. */

static inline int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Q4_K: x = d*sc*q - dmin*m per 32 elements, q in 0..15, 6-bit sc and m. */
static void synth_q4_k(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_block_q4_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        float a[8], m[8], amax = 0, mmax = 0;
        for (int s = 0; s < 8; s++) {
            float lo = 0, hi = src[32 * s]; /* lo <= 0: the min term only subtracts */
            for (int l = 0; l < 32; l++) {
                lo = SP_MIN(lo, src[32 * s + l]);
                hi = SP_MAX(hi, src[32 * s + l]);
            }
            a[s] = hi > lo ? (hi - lo) / 15.0f : 0.0f;
            m[s] = -lo;
            amax = SP_MAX(amax, a[s]);
            mmax = SP_MAX(mmax, m[s]);
        }
        y[i].d = sp_fp32_to_fp16(amax / 63.0f);
        y[i].dmin = sp_fp32_to_fp16(mmax / 63.0f);
        const float dd = sp_fp16_to_fp32(y[i].d), dm = sp_fp16_to_fp32(y[i].dmin);
        memset(y[i].scales, 0, sizeof y[i].scales);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int s = 0; s < 8; s++) {
            /* round the scale up, so the sub-block's range still fits 0..15 */
            const int ls = dd > 0 ? clamp_int((int)ceilf(a[s] / dd), 0, 63) : 0;
            const int lm = dm > 0 ? clamp_int((int)lrintf(m[s] / dm), 0, 63) : 0;
            if (s < 4) {
                y[i].scales[s] |= (uint8_t)ls;
                y[i].scales[s + 4] |= (uint8_t)lm;
            } else {
                y[i].scales[s + 4] = (uint8_t)((ls & 0x0f) | (lm & 0x0f) << 4);
                y[i].scales[s - 4] |= (uint8_t)((ls >> 4) << 6);
                y[i].scales[s] |= (uint8_t)((lm >> 4) << 6);
            }
            const float dl = dd * ls, ml = dm * lm, idl = dl > 0 ? 1.0f / dl : 0.0f;
            uint8_t *qs = y[i].qs + 32 * (s / 2);
            const int shift = (s % 2) * 4;
            for (int l = 0; l < 32; l++) {
                const int q = clamp_int((int)lrintf((src[32 * s + l] + ml) * idl), 0, 15);
                qs[l] |= (uint8_t)(q << shift);
            }
        }
    }
}

/* Q6_K: x = d*sc*q per 16 elements, q in -32..31, int8 sc. */
static void synth_q6_k(const float *restrict src, void *restrict dst, int64_t n) {
    struct sp_block_q6_k *y = dst;
    for (int64_t i = 0; i < n / SP_QK_K; i++, src += SP_QK_K) {
        float sg[16], samax = 0;
        for (int g = 0; g < 16; g++) {
            float amax = 0, max = 0; /* the element of largest magnitude, with its sign */
            for (int l = 0; l < 16; l++) {
                const float v = src[16 * g + l];
                if (fabsf(v) > amax) amax = fabsf(v), max = v;
            }
            sg[g] = max / -32.0f; /* that element maps to -32, the end with room */
            samax = SP_MAX(samax, fabsf(sg[g]));
        }
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = sp_fp32_to_fp16(samax / 127.0f);
        const float dd = sp_fp16_to_fp32(y[i].d);
        for (int g = 0; g < 16; g++) {
            const int sc = dd > 0 ? clamp_int((int)lrintf(sg[g] / dd), -127, 127) : 0;
            y[i].scales[g] = (int8_t)sc;
            const float dl = dd * sc, idl = dl != 0 ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l;
                const int u = clamp_int((int)lrintf(src[e] * idl), -32, 31) + 32; /* 0..63 */
                const int h = e / 128, k = (e % 128) / 32, j = e % 32;
                y[i].ql[64 * h + 32 * (k & 1) + j] |= (uint8_t)((u & 0x0f) << (k < 2 ? 0 : 4));
                y[i].qh[32 * h + j] |= (uint8_t)((u >> 4) << (2 * k));
            }
        }
    }
}

/* The encoder synth uses for type t: the one-pass K-quant encoders above,
 * NULL for native types (sp_quantize_rows_fast: one pass, no scale
 * search), else the dispatch table's from_float. */
static sp_from_float_fn synth_quantizer(uint32_t t) {
    if (t == SP_QTYPE_Q4_K) return synth_q4_k;
    if (t == SP_QTYPE_Q6_K) return synth_q6_k;
    if (sp_qtype_is_native(t)) return NULL;
    return sp_qtraits_get(t)->from_float;
}

/* One slab: rows [row0, row0 + n_rows) of tensor ti, quantized into out. */
struct slab {
    const struct tplan *t;
    sp_from_float_fn from_float;
    uint64_t seed;
    uint32_t ti, n_layers;
    int64_t row0, n_rows;
    size_t row_bytes;
    uint8_t *out;  /* (n_rows * row_bytes) */
    float **fbuf;  /* (n_threads) rows of max_row floats */
};

static void slab_task(void *arg, int ith, int nth) {
    const struct slab *sl = arg;
    const int64_t a = sl->n_rows * ith / nth, b = sl->n_rows * (ith + 1) / nth;
    float *x = sl->fbuf[ith];
    for (int64_t r = a; r < b; r++) {
        gen_row(sl->seed, sl->ti, (uint64_t)(sl->row0 + r), sl->t->init, sl->n_layers, x, sl->t->ne[0]);
        uint8_t *dst = sl->out + (size_t)r * sl->row_bytes;
        if (sl->from_float) {
            sl->from_float(x, dst, sl->t->ne[0]);
        } else { /* native: cannot fail (a native type, one row of its plan's width) */
            const sp_status rc = sp_quantize_rows_fast(sl->t->type, x, 1, sl->t->ne[0], dst);
            SP_ASSERT(rc == SP_OK);
            (void)rc;
        }
    }
}

/* ---- metadata --------------------------------------------------------------- */

/* A SentencePiece-style vocabulary of n tokens: <unk> <s> </s>, the 256 byte
 * tokens <0x00>..<0xFF>, the word boundary "\u2581" and the 94 printable
 * ASCII characters (so text tokenizes into characters, and spaces render as
 * spaces, as in real Llama vocabularies), then fillers "\u2581tok<i>" with
 * falling scores. */
enum { VOCAB_BYTES = 3, VOCAB_CHARS = VOCAB_BYTES + 256, VOCAB_FILL = VOCAB_CHARS + 1 + 94 };

static sp_status set_vocab(struct sp_gguf_writer *w, uint32_t n) {
    SP_ASSERT(n >= VOCAB_FILL); /* every shape's vocabulary is larger */
    sp_status rc = SP_OK;
    const size_t per = 24; /* longest token text: "\xe2\x96\x81tok" + 10 digits + NUL */
    char *text = sp_malloc((size_t)n * per);
    struct sp_meta_value *tok = sp_calloc(n, sizeof(*tok));
    struct sp_meta_value *score = sp_calloc(n, sizeof(*score));
    struct sp_meta_value *type = sp_calloc(n, sizeof(*type));
    if (!text || !tok || !score || !type) {
        rc = sp_err(SP_E_NOMEM, "sp_synth: out of memory for a vocabulary of %u tokens", n);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        char *s = text + (size_t)i * per;
        int32_t tt = 1; /* normal */
        float sc = 0.0f;
        if (i == 0) snprintf(s, per, "<unk>"), tt = 2;
        else if (i == 1) snprintf(s, per, "<s>"), tt = 3;
        else if (i == 2) snprintf(s, per, "</s>"), tt = 3;
        else if (i < VOCAB_CHARS) snprintf(s, per, "<0x%02X>", i - VOCAB_BYTES), tt = 6;
        else if (i == VOCAB_CHARS) snprintf(s, per, "\xe2\x96\x81"), sc = -1.0f;
        else if (i < VOCAB_FILL) snprintf(s, per, "%c", (char)('!' + (i - VOCAB_CHARS - 1))), sc = -2.0f;
        else snprintf(s, per, "\xe2\x96\x81tok%u", i), sc = -3.0f - (float)(i - VOCAB_FILL);
        tok[i].type = SP_META_STRING;
        tok[i].v.str.ptr = s;
        tok[i].v.str.len = strlen(s);
        score[i].type = SP_META_F32;
        score[i].v.f64 = sc;
        type[i].type = SP_META_I32;
        type[i].v.i64 = tt;
    }
    struct sp_meta_value arr = {.type = SP_META_ARRAY};
    arr.v.arr.n = n;
    arr.v.arr.elem_type = SP_META_STRING, arr.v.arr.items = tok;
    if ((rc = sp_gguf_writer_set(w, "tokenizer.ggml.tokens", &arr))) goto done;
    arr.v.arr.elem_type = SP_META_F32, arr.v.arr.items = score;
    if ((rc = sp_gguf_writer_set(w, "tokenizer.ggml.scores", &arr))) goto done;
    arr.v.arr.elem_type = SP_META_I32, arr.v.arr.items = type;
    if ((rc = sp_gguf_writer_set(w, "tokenizer.ggml.token_type", &arr))) goto done;
done:
    sp_free(text);
    sp_free(tok);
    sp_free(score);
    sp_free(type);
    return rc;
}

static sp_status set_meta(struct sp_gguf_writer *w, const struct shape *s, const struct tsel *sel,
                         const struct plan *p, uint64_t seed) {
    char key[96], name[96];
    sp_status rc;
    const enum ftype ft = sel->ft;
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((rc = (x))) return rc;                                                                                 \
    } while (0)
    snprintf(name, sizeof name, "sparrow-synth %s %s", s->name, sel->pol ? sel->pol->name : ftype_names[ft]);
    TRY(sp_gguf_writer_set_str(w, "general.architecture", s->arch));
    TRY(sp_gguf_writer_set_str(w, "general.name", name));
    if (sel->pol) { /* the keys sp_quantize writes (docs/QUANT.md, "The output file") */
        if (p->native) TRY(sp_gguf_writer_set_str(w, "sparrow.requires", p->native_l8 ? "native-types-2" : "native-types-1"));
        if (p->ggml_quant) TRY(sp_gguf_writer_set_u32(w, "general.quantization_version", 2));
        TRY(sp_gguf_writer_set_str(w, "sparrow.quant.policy", sel->pol->name));
        TRY(sp_gguf_writer_set_f32(w, "sparrow.quant.bpw", (float)((double)p->bytes * 8.0 / (double)p->n_params)));
    } else {
        TRY(sp_gguf_writer_set_u32(w, "general.file_type", ftype_ids[ft]));
        if (ft != FT_F16 && ft != FT_BF16) TRY(sp_gguf_writer_set_u32(w, "general.quantization_version", 2));
    }
    TRY(sp_gguf_writer_set_str(w, "sparrow.synth.shape", s->name));
    if (!sel->pol) TRY(sp_gguf_writer_set_str(w, "sparrow.synth.type", ftype_names[ft]));
    struct sp_meta_value sv = {.type = SP_META_U64, .v.u64 = seed};
    TRY(sp_gguf_writer_set(w, "sparrow.synth.seed", &sv));

    TRY(sp_gguf_writer_set_u32(w, K("vocab_size"), s->n_vocab));
    TRY(sp_gguf_writer_set_u32(w, K("context_length"), s->n_ctx));
    TRY(sp_gguf_writer_set_u32(w, K("embedding_length"), s->n_embd));
    TRY(sp_gguf_writer_set_u32(w, K("block_count"), s->n_layers));
    TRY(sp_gguf_writer_set_u32(w, K("feed_forward_length"), s->n_ff));
    TRY(sp_gguf_writer_set_u32(w, K("attention.head_count"), s->n_heads));
    TRY(sp_gguf_writer_set_u32(w, K("attention.head_count_kv"), s->n_kv_heads));
    TRY(sp_gguf_writer_set_u32(w, K("attention.key_length"), s->head_dim));
    TRY(sp_gguf_writer_set_u32(w, K("attention.value_length"), s->head_dim));
    TRY(sp_gguf_writer_set_u32(w, K("rope.dimension_count"), s->head_dim));
    TRY(sp_gguf_writer_set_f32(w, K("rope.freq_base"), s->rope_theta));
    TRY(sp_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), s->rms_eps));
    if (s->n_experts) {
        TRY(sp_gguf_writer_set_u32(w, K("expert_count"), s->n_experts));
        TRY(sp_gguf_writer_set_u32(w, K("expert_used_count"), s->n_experts_used));
        TRY(sp_gguf_writer_set_u32(w, K("expert_feed_forward_length"), s->n_ff_exp));
    }

    TRY(sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    TRY(set_vocab(w, s->n_vocab));
    TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    TRY(sp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    TRY(sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true));
    TRY(sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false));
#undef TRY
#undef K
    return SP_OK;
}

/* ---- public API --------------------------------------------------------------- */

/* Defaults: no shape, type or path (the caller must set them), seed 0, one
 * thread, no progress callback. */
struct sp_synth_params sp_synth_default_params(void) {
    return (struct sp_synth_params){.shape = NULL, .type = NULL, .policy = NULL, .policy_file = NULL, .path = NULL,
                                    .seed = 0, .n_threads = 0, .progress = NULL, .progress_user = NULL};
}

/* Number of shapes; indices 0..n-1 are valid for sp_synth_get_shape. */
int32_t sp_synth_n_shapes(void) {
    return (int32_t)SP_ARRAY_LEN(shapes);
}

/* Shape i's hyper-parameters (strings are static).  SP_E_INVALID if i is out
 * of range. */
sp_status sp_synth_get_shape(int32_t i, struct sp_synth_shape_info *out) {
    if (!out || i < 0 || i >= sp_synth_n_shapes()) {
        return sp_err(SP_E_INVALID, "%s: shape index %d out of range", __func__, (int)i);
    }
    const struct shape *s = &shapes[i];
    *out = (struct sp_synth_shape_info){
        .name = s->name, .arch = s->arch, .about = s->about, .n_vocab = (int32_t)s->n_vocab,
        .n_ctx = (int32_t)s->n_ctx, .n_embd = (int32_t)s->n_embd, .n_layers = (int32_t)s->n_layers,
        .n_heads = (int32_t)s->n_heads, .n_kv_heads = (int32_t)s->n_kv_heads, .head_dim = (int32_t)s->head_dim,
        .n_ff = (int32_t)s->n_ff, .n_experts = (int32_t)s->n_experts, .n_experts_used = (int32_t)s->n_experts_used,
        .n_ff_exp = (int32_t)s->n_ff_exp, .rope_theta = s->rope_theta};
    return SP_OK;
}

/* Number of file types; indices 0..n-1 are valid for sp_synth_type_name. */
int32_t sp_synth_n_types(void) {
    return FT_COUNT;
}

/* Name of file type i ("q4_0"), or NULL if i is out of range. */
const char *sp_synth_type_name(int32_t i) {
    return i >= 0 && i < FT_COUNT ? ftype_names[i] : NULL;
}

/* The shape and the type selection of P: exactly one of type, policy and
 * policy_file.  *owned is the parsed policy (the caller frees it). */
static sp_status resolve(const struct sp_synth_params *P, const struct shape **sh, struct tsel *sel,
                         struct sp_qpolicy **owned) {
    *owned = NULL;
    memset(sel, 0, sizeof(*sel));
    if (!(*sh = find_shape(P->shape))) {
        return sp_err(SP_E_INVALID, "sp_synth: unknown shape '%s' (see 'sparrow synth --list')", P->shape ? P->shape : "");
    }
    const int given = (P->type != NULL) + (P->policy != NULL) + (P->policy_file != NULL);
    if (given != 1) {
        return sp_err(SP_E_INVALID, "sp_synth: give exactly one of a file type, a policy name and a policy file (%d "
                      "given)", given);
    }
    if (P->type) {
        const int ft = find_ftype(P->type);
        if (ft < 0) return sp_err(SP_E_INVALID, "sp_synth: unknown type '%s' (f16, bf16, q8_0, q4_0, q4_k_m)", P->type);
        sel->ft = (enum ftype)ft;
        return SP_OK;
    }
    sp_status rc = P->policy ? sp_qpolicy_named(P->policy, owned) : sp_qpolicy_load(P->policy_file, owned);
    if (!rc) sel->pol = *owned;
    return rc;
}

/* Parameter count and tensor-data bytes of P's shape and types, without
 * writing anything. */
sp_status sp_synth_params_size(const struct sp_synth_params *P, uint64_t *n_params, uint64_t *tensor_bytes) {
    if (!P) return sp_err(SP_E_INVALID, "%s: no parameters", __func__);
    const struct shape *s;
    struct tsel sel;
    struct sp_qpolicy *pol = NULL;
    struct plan p = {0};
    sp_status rc = resolve(P, &s, &sel, &pol);
    if (!rc) rc = plan_build(s, &sel, &p);
    if (!rc) {
        if (n_params) *n_params = p.n_params;
        if (tensor_bytes) *tensor_bytes = p.bytes;
    }
    sp_free(p.t);
    sp_qpolicy_free(pol);
    return rc;
}

/* Parameter count and tensor-data bytes of shape/type.  SP_E_INVALID for
 * unknown names (the message lists the valid ones), SP_E_NOMEM. */
sp_status sp_synth_size(const char *shape, const char *type, uint64_t *n_params, uint64_t *tensor_bytes) {
    struct sp_synth_params P = sp_synth_default_params();
    P.shape = shape;
    P.type = type ? type : "";
    return sp_synth_params_size(&P, n_params, tensor_bytes);
}

/* Write the synthetic model params->shape / params->type to params->path.
 * The file appears only when complete (temporary file + rename); on failure
 * or cancellation nothing is left and an existing file at path is untouched.
 * Progress reports tensor-data bytes written after each slab.  Returns SP_OK,
 * SP_E_INVALID (unknown shape, type or policy, not exactly one of them, a
 * matrix no policy rule matches, no path), SP_E_IO (message names the file),
 * SP_E_FORMAT (a malformed policy file), SP_E_NOMEM, or SP_E_STATE when the
 * progress callback cancelled. */
sp_status sp_synth(const struct sp_synth_params *params) {
    if (!params || !params->path || !*params->path) return sp_err(SP_E_INVALID, "%s: no output path", __func__);
    const struct sp_synth_params *P = params;
    if (P->n_threads < 0 || P->n_threads > 1024) {
        return sp_err(SP_E_INVALID, "%s: n_threads %d out of range [0, 1024]", __func__, (int)P->n_threads);
    }
    const struct shape *s;
    struct tsel sel;
    struct sp_qpolicy *pol = NULL;
    sp_status rc = resolve(P, &s, &sel, &pol);
    if (rc) return rc;
    sp_init();

    const int nth = P->n_threads ? P->n_threads : 1;
    struct plan p = {0};
    struct sp_gguf_writer *w = NULL;
    struct sp_pool *pool = NULL;
    float **fbuf = NULL;
    uint8_t *out = NULL;
    const size_t slab_target = (size_t)8 << 20;
    size_t out_cap = 0;
    uint64_t written = 0;

    if ((rc = plan_build(s, &sel, &p))) goto done;
    for (uint32_t i = 0; i < p.n; i++) {
        const size_t rb = sp_qtype_row_bytes(p.t[i].type, p.t[i].ne[0]);
        SP_ASSERT(rb > 0); /* shapes are multiples of every block size */
        out_cap = SP_MAX(out_cap, SP_MAX(rb, slab_target / rb * rb));
    }
    fbuf = sp_calloc((size_t)nth, sizeof(*fbuf));
    out = sp_malloc(out_cap);
    if (!fbuf || !out) goto nomem;
    for (int i = 0; i < nth; i++) {
        if (!(fbuf[i] = sp_malloc((size_t)p.max_row * sizeof(float)))) goto nomem;
    }
    if ((rc = sp_pool_init(nth, &pool))) goto done;
    if ((rc = sp_gguf_writer_open(P->path, 0, &w))) goto done;
    if ((rc = set_meta(w, s, &sel, &p, P->seed))) goto done;
    for (uint32_t i = 0; i < p.n; i++) {
        if ((rc = sp_gguf_writer_add_tensor(w, p.t[i].name, p.t[i].type, p.t[i].n_dims, p.t[i].ne))) goto done;
    }
    if (P->progress && !P->progress(0, p.bytes, P->progress_user)) goto cancelled;

    for (uint32_t i = 0; i < p.n; i++) {
        const struct tplan *t = &p.t[i];
        const int64_t rows = t->ne[1] * t->ne[2];
        struct slab sl = {.t = t, .from_float = synth_quantizer(t->type), .seed = P->seed, .ti = i, .n_layers = s->n_layers,
                          .row_bytes = sp_qtype_row_bytes(t->type, t->ne[0]), .out = out, .fbuf = fbuf};
        const int64_t per_slab = (int64_t)(out_cap / sl.row_bytes);
        for (int64_t r = 0; r < rows; r += per_slab) {
            sl.row0 = r;
            sl.n_rows = SP_MIN(per_slab, rows - r);
            sp_pool_run(pool, slab_task, &sl);
            const size_t nb = (size_t)sl.n_rows * sl.row_bytes;
            if ((rc = sp_gguf_writer_write(w, out, nb))) goto done;
            written += nb;
            if (P->progress && !P->progress(written, p.bytes, P->progress_user)) goto cancelled;
        }
    }
    if ((rc = sp_gguf_writer_finish(w))) goto done;
    rc = SP_OK;
    goto done;

cancelled:
    rc = sp_err(SP_E_STATE, "%s: '%s': cancelled by the progress callback; nothing was written", __func__, P->path);
    goto done;
nomem:
    rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
done:
    sp_gguf_writer_free(w); /* removes the temporary file unless finished */
    sp_pool_free(pool);
    for (int i = 0; fbuf && i < nth; i++) sp_free(fbuf[i]);
    sp_free(fbuf);
    sp_free(out);
    sp_free(p.t);
    sp_qpolicy_free(pol);
    return rc;
}
