/*
 * test_gguf.c -- the format/ layer: GGUF reader and writer, llama2.c import,
 * model_file (hyper-parameters, vocabulary).  Opens every fixture model and
 * checks key facts, compares the llama2.c import with llama.cpp's GGUF
 * conversion tensor by tensor and token by token, round-trips the writer,
 * and feeds the reader handcrafted corrupt files (each failure must name the
 * problem), every truncation and thousands of byte flips of a small file.
 */
#include "core/file.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/model_file.h"
#include "quant/quant.h"
#include "test_util.h"

#include <dirent.h>
#include <sys/wait.h>
#include <math.h>
#include <stdint.h>

/* ---- helpers ------------------------------------------------------------ */

static int n_warnings;
static char last_warning[1024];

static void quiet_log(enum sp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == SP_LOG_WARN) {
        n_warnings++;
        snprintf(last_warning, sizeof last_warning, "%s", msg);
    }
}

#define EXPECT_ERR(expr, want, needle)                                                                               \
    do {                                                                                                             \
        sp_err_clear();                                                                                              \
        sp_status rc_ = (expr);                                                                                      \
        CHECKF(rc_ == (want), "%s: got %d (%s), want %d: %s", #expr, rc_, sp_status_str(rc_), (int)(want),            \
               sp_last_error());                                                                                     \
        CHECKF(strstr(sp_last_error(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", sp_last_error(), (needle)); \
    } while (0)

static char tmp_paths[64][512];
static int n_tmp;

/* A fresh path in the scratch directory, removed at the end. */
static const char *tmp_path(const char *name) {
    SP_ASSERT(n_tmp < 64);
    snprintf(tmp_paths[n_tmp], sizeof tmp_paths[0], "%s/sparrow-test-gguf-%ld-%s", scratch_dir(), (long)getpid(), name);
    return tmp_paths[n_tmp++];
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    SP_ASSERT(fp);
    SP_ASSERT(n == 0 || fwrite(p, 1, n, fp) == n);
    fclose(fp);
}

static uint8_t *read_whole(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(sz ? (size_t)sz : 1);
    SP_ASSERT(p && fread(p, 1, (size_t)sz, fp) == (size_t)sz);
    fclose(fp);
    *n = (size_t)sz;
    return p;
}

/* sp_gguf_read on a memory buffer; *out gets the file on success. */
static sp_status gguf_mem(const void *p, size_t n, struct sp_model_file **out) {
    struct sp_file *f;
    sp_status rc = sp_file_from_memory(p, n, &f);
    if (rc) return rc;
    struct sp_model_file *mf = sp_calloc(1, sizeof(*mf));
    SP_ASSERT(mf);
    rc = sp_gguf_read(f, mf);
    sp_file_close(f);
    if (rc == SP_OK && out) {
        *out = mf;
    } else {
        sp_model_file_free(mf);
    }
    return rc;
}

/* sp_model_file_open_file on a memory buffer. */
static sp_status model_mem(const void *p, size_t n, bool vocab_only, struct sp_model_file **out) {
    struct sp_file *f;
    struct sp_model_file *mf = NULL;
    sp_status rc = sp_file_from_memory(p, n, &f);
    if (rc) return rc;
    rc = sp_model_file_open_file(f, NULL, vocab_only, &mf);
    sp_file_close(f);
    if (out) {
        *out = mf;
    } else {
        sp_model_file_free(mf);
    }
    return rc;
}

/* Invariants every successfully opened file must satisfy. */
static void check_directory(const struct sp_model_file *mf) {
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        CHECKF(t->name && *t->name, "tensor %u has no name", i);
        CHECKF(t->n_dims >= 1 && t->n_dims <= 4, "%s: n_dims %u", t->name, t->n_dims);
        CHECKF(t->offset >= mf->data_offset && t->offset <= mf->file_size && t->size <= mf->file_size - t->offset,
               "%s: [%llu, +%llu) outside the file", t->name, (unsigned long long)t->offset, (unsigned long long)t->size);
        CHECKF(mf->alignment && (t->offset - mf->data_offset) % mf->alignment == 0, "%s: offset not aligned", t->name);
        int64_t rows = 1;
        for (int d = 1; d < 4; d++) rows *= t->ne[d];
        for (uint32_t d = t->n_dims; d < 4; d++) CHECKF(t->ne[d] == 1, "%s: unused dim %u is %lld", t->name, d, (long long)t->ne[d]);
        const uint64_t want = t->ne[0] == 0 ? 0 : (uint64_t)sp_qtype_row_bytes(t->type, t->ne[0]) * (uint64_t)rows;
        CHECKF(t->size == want, "%s: size %llu, expected %llu", t->name, (unsigned long long)t->size, (unsigned long long)want);
    }
}

/* ---- raw GGUF builder, for files the writer refuses to produce ------- */

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void b_put(struct buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        SP_ASSERT(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void b_u32(struct buf *b, uint32_t x) {
    uint8_t d[4];
    for (int i = 0; i < 4; i++) d[i] = (uint8_t)(x >> (8 * i));
    b_put(b, d, 4);
}
static void b_u64(struct buf *b, uint64_t x) {
    uint8_t d[8];
    for (int i = 0; i < 8; i++) d[i] = (uint8_t)(x >> (8 * i));
    b_put(b, d, 8);
}
static void b_str(struct buf *b, const char *s) {
    b_u64(b, strlen(s));
    b_put(b, s, strlen(s));
}
static void b_zeros(struct buf *b, size_t n) {
    static const uint8_t z[4096];
    while (n) {
        size_t k = SP_MIN(n, sizeof z);
        b_put(b, z, k);
        n -= k;
    }
}
static void b_align(struct buf *b, size_t a) {
    b_zeros(b, (a - b->n % a) % a);
}
static void b_header(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_put(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_str(struct buf *b, const char *key, const char *val) {
    b_str(b, key);
    b_u32(b, SP_META_STRING);
    b_str(b, val);
}
static void b_kv_u32(struct buf *b, const char *key, uint32_t val) {
    b_str(b, key);
    b_u32(b, SP_META_U32);
    b_u32(b, val);
}
static void b_tensor(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) b_u64(b, ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}

/* A valid file: one key, tensor "w" F32 [8, 2] at offset 0, its 64 data bytes. */
static void b_simple(struct buf *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off, size_t data) {
    b_header(b, 3, 1, 1);
    b_kv_str(b, "general.architecture", "llama");
    b_tensor(b, "w", n_dims, ne, type, off);
    b_align(b, 32);
    b_zeros(b, data);
}

/* ---- fixtures ------------------------------------------------------------ */

struct tensor_fact {
    const char *name;
    uint32_t type;
    int64_t ne0, ne1, ne2;
};

struct fixture_fact {
    const char *rel;
    enum sp_arch arch;
    uint32_t n_tensors, n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff, n_experts, n_experts_used, n_ff_exp;
    float theta, eps;
    struct tensor_fact t[3];
    const char *absent; /* a tensor that must not exist */
};

static const struct fixture_fact fixtures[] = {
    {"models/stories260K/stories260K-f32.gguf", SP_ARCH_LLAMA, 48, 64, 5, 8, 4, 8, 172, 0, 0, 0, 1e4f, 1e-5f,
     {{"token_embd.weight", SP_QTYPE_F32, 64, 512, 1}, {"blk.0.ffn_down.weight", SP_QTYPE_F32, 172, 64, 1},
      {"blk.4.attn_k.weight", SP_QTYPE_F32, 64, 32, 1}}, NULL},
    {"models/stories260K/stories260K-q8_0.gguf", SP_ARCH_LLAMA, 48, 64, 5, 8, 4, 8, 172, 0, 0, 0, 1e4f, 1e-5f,
     {{"blk.0.attn_q.weight", SP_QTYPE_Q8_0, 64, 64, 1}, {"blk.0.ffn_down.weight", SP_QTYPE_F16, 172, 64, 1},
      {"output_norm.weight", SP_QTYPE_F32, 64, 1, 1}}, NULL},
    {"models/stories260K/stories260K-q4_0.gguf", SP_ARCH_LLAMA, 48, 64, 5, 8, 4, 8, 172, 0, 0, 0, 1e4f, 1e-5f,
     {{"blk.0.attn_q.weight", SP_QTYPE_Q4_0, 64, 64, 1}, {"output.weight", SP_QTYPE_Q8_0, 64, 512, 1},
      {"blk.3.ffn_down.weight", SP_QTYPE_F16, 172, 64, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-f32.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_F32, 256, 512, 1}, {"blk.0.attn_output.weight", SP_QTYPE_F32, 64, 256, 1},
      {"blk.0.attn_q.weight", SP_QTYPE_F32, 256, 64, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-q2_k.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_Q2_K, 256, 512, 1}, {"output.weight", SP_QTYPE_Q6_K, 256, 512, 1},
      {"blk.0.attn_output.weight", SP_QTYPE_Q4_0, 64, 256, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-q3_k_m.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_Q3_K, 256, 512, 1}, {"output.weight", SP_QTYPE_Q6_K, 256, 512, 1},
      {"blk.0.ffn_norm.weight", SP_QTYPE_F32, 256, 1, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-q4_k_m.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_Q4_K, 256, 512, 1}, {"blk.0.attn_output.weight", SP_QTYPE_Q5_0, 64, 256, 1},
      {"blk.0.ffn_up.weight", SP_QTYPE_Q4_K, 256, 256, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-q5_k_m.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_Q5_K, 256, 512, 1}, {"output.weight", SP_QTYPE_Q6_K, 256, 512, 1},
      {"blk.0.attn_output.weight", SP_QTYPE_Q5_1, 64, 256, 1}}, NULL},
    {"models/stories260K-pad256/stories260K-pad256-q6_k.gguf", SP_ARCH_LLAMA, 48, 256, 5, 8, 4, 8, 256, 0, 0, 0, 1e4f, 2.5e-6f,
     {{"token_embd.weight", SP_QTYPE_Q6_K, 256, 512, 1}, {"output.weight", SP_QTYPE_Q6_K, 256, 512, 1},
      {"blk.0.attn_output.weight", SP_QTYPE_Q8_0, 64, 256, 1}}, NULL},
    {"models/stories260K-moe/stories260K-moe-f32.gguf", SP_ARCH_LLAMA, 53, 64, 5, 8, 4, 8, 192, 8, 2, 192, 1e4f, 1e-5f,
     {{"blk.0.ffn_gate_exps.weight", SP_QTYPE_F32, 64, 192, 8}, {"blk.0.ffn_down_exps.weight", SP_QTYPE_F32, 192, 64, 8},
      {"blk.0.ffn_gate_inp.weight", SP_QTYPE_F32, 64, 8, 1}}, "blk.0.ffn_gate.weight"},
    {"models/stories260K-moe/stories260K-moe-q8_0.gguf", SP_ARCH_LLAMA, 53, 64, 5, 8, 4, 8, 192, 8, 2, 192, 1e4f, 1e-5f,
     {{"blk.0.ffn_gate_exps.weight", SP_QTYPE_Q8_0, 64, 192, 8}, {"blk.4.ffn_up_exps.weight", SP_QTYPE_Q8_0, 64, 192, 8},
      {"blk.0.ffn_gate_inp.weight", SP_QTYPE_F32, 64, 8, 1}}, NULL},
    {"models/tiny-qwen/tiny-qwen2-f32.gguf", SP_ARCH_QWEN2, 39, 128, 3, 4, 2, 32, 256, 0, 0, 0, 1e6f, 1e-6f,
     {{"blk.0.attn_q.bias", SP_QTYPE_F32, 128, 1, 1}, {"output.weight", SP_QTYPE_F32, 128, 512, 1},
      {"blk.2.attn_k.weight", SP_QTYPE_F32, 128, 64, 1}}, NULL},
    {"models/tiny-qwen/tiny-qwen2-q8_0.gguf", SP_ARCH_QWEN2, 39, 128, 3, 4, 2, 32, 256, 0, 0, 0, 1e6f, 1e-6f,
     {{"blk.0.attn_q.weight", SP_QTYPE_Q8_0, 128, 128, 1}, {"blk.0.attn_v.bias", SP_QTYPE_F32, 64, 1, 1},
      {"output.weight", SP_QTYPE_Q8_0, 128, 512, 1}}, NULL},
    {"models/tiny-qwen/tiny-qwen3-f32.gguf", SP_ARCH_QWEN3, 35, 128, 3, 8, 4, 32, 256, 0, 0, 0, 1e6f, 1e-6f,
     {{"blk.0.attn_q_norm.weight", SP_QTYPE_F32, 32, 1, 1}, {"blk.0.attn_q.weight", SP_QTYPE_F32, 128, 256, 1},
      {"blk.0.attn_output.weight", SP_QTYPE_F32, 256, 128, 1}}, "output.weight"},
    {"models/tiny-qwen/tiny-qwen3-q8_0.gguf", SP_ARCH_QWEN3, 35, 128, 3, 8, 4, 32, 256, 0, 0, 0, 1e6f, 1e-6f,
     {{"blk.0.attn_q.weight", SP_QTYPE_Q8_0, 128, 256, 1}, {"token_embd.weight", SP_QTYPE_Q8_0, 128, 512, 1},
      {"blk.1.attn_k_norm.weight", SP_QTYPE_F32, 32, 1, 1}}, "output.weight"},
    {"models/tiny-qwen/tiny-qwen3-bf16.gguf", SP_ARCH_QWEN3, 35, 128, 3, 8, 4, 32, 256, 0, 0, 0, 1e6f, 1e-6f,
     {{"token_embd.weight", SP_QTYPE_BF16, 128, 512, 1}, {"blk.0.ffn_down.weight", SP_QTYPE_BF16, 256, 128, 1},
      {"output_norm.weight", SP_QTYPE_F32, 128, 1, 1}}, "output.weight"},
    {"models/tiny-qwen/tiny-qwen3moe-f32.gguf", SP_ARCH_QWEN3MOE, 27, 128, 2, 8, 2, 32, 256, 8, 2, 64, 1e6f, 1e-6f,
     {{"blk.0.ffn_gate_exps.weight", SP_QTYPE_F32, 128, 64, 8}, {"blk.1.ffn_down_exps.weight", SP_QTYPE_F32, 64, 128, 8},
      {"blk.0.ffn_gate_inp.weight", SP_QTYPE_F32, 128, 8, 1}}, NULL},
    {"models/tiny-qwen/tiny-qwen3moe-q8_0.gguf", SP_ARCH_QWEN3MOE, 27, 128, 2, 8, 2, 32, 256, 8, 2, 64, 1e6f, 1e-6f,
     {{"blk.0.ffn_down_exps.weight", SP_QTYPE_Q8_0, 64, 128, 8}, {"blk.0.attn_k.weight", SP_QTYPE_Q8_0, 128, 64, 1},
      {"blk.0.ffn_gate_inp.weight", SP_QTYPE_F32, 128, 8, 1}}, NULL},
};

/* The stories260K SPM vocabulary every fixture model carries. */
static void check_stories_vocab(const char *what, const struct sp_model_file *mf) {
    const struct sp_vocab_data *vd = &mf->vocab;
    CHECKF(vd->kind == SP_VOCAB_SPM, "%s: vocab kind %d", what, vd->kind);
    CHECKF(vd->n_tokens == 512, "%s: %u tokens", what, vd->n_tokens);
    CHECKF(vd->bos == 1 && vd->eos == 2 && vd->unk == 0 && vd->pad == -1 && vd->eot == -1, "%s: special ids %d %d %d %d %d",
           what, vd->bos, vd->eos, vd->unk, vd->pad, vd->eot);
    CHECKF(vd->add_bos && !vd->add_eos && vd->add_space_prefix, "%s: add flags", what);
    CHECKF(vd->scores && vd->types, "%s: scores/types missing", what);
    if (vd->n_tokens == 512 && vd->types && vd->scores) {
        CHECKF(strcmp(vd->tokens[0], "<unk>") == 0 && strcmp(vd->tokens[1], "<s>") == 0 && strcmp(vd->tokens[2], "</s>") == 0,
               "%s: special texts", what);
        CHECKF(vd->types[0] == SP_TOKEN_UNKNOWN && vd->types[1] == SP_TOKEN_CONTROL && vd->types[3] == SP_TOKEN_BYTE &&
                   vd->types[300] == SP_TOKEN_NORMAL,
               "%s: token types", what);
        CHECKF(strcmp(vd->tokens[259], "\xe2\x96\x81t") == 0 && vd->token_len[259] == 4, "%s: token 259 '%s'", what, vd->tokens[259]);
        CHECKF(strcmp(vd->tokens[13], "<0x0A>") == 0, "%s: token 13 '%s'", what, vd->tokens[13]);
        CHECKF(vd->scores[261] == -2.0f, "%s: score 261 = %g", what, vd->scores[261]);
    }
}

static void test_fixtures(void) {
    for (size_t i = 0; i < SP_ARRAY_LEN(fixtures); i++) {
        const struct fixture_fact *fx = &fixtures[i];
        const char *path = need_fixture(fx->rel);
        if (!path) continue;
        struct sp_model_file *mf = NULL;
        sp_status rc = sp_model_file_open(path, NULL, false, &mf);
        CHECKF(rc == SP_OK, "%s: %s", fx->rel, sp_last_error());
        if (rc) continue;
        const struct sp_hparams *hp = &mf->hp;
        CHECKF(mf->kind == SP_FILE_GGUF && mf->version == 3 && mf->alignment == 32, "%s: kind/version/alignment", fx->rel);
        CHECKF(mf->has_hparams && hp->arch == fx->arch, "%s: arch %s", fx->rel, sp_arch_name(hp->arch));
        CHECKF(mf->n_tensors == fx->n_tensors, "%s: %u tensors, want %u", fx->rel, mf->n_tensors, fx->n_tensors);
        CHECKF(hp->n_vocab == 512 && hp->n_ctx_train == 128, "%s: n_vocab %u n_ctx %u", fx->rel, hp->n_vocab, hp->n_ctx_train);
        CHECKF(hp->n_embd == fx->n_embd && hp->n_layers == fx->n_layers && hp->n_heads == fx->n_heads &&
                   hp->n_kv_heads == fx->n_kv_heads,
               "%s: embd %u layers %u heads %u/%u", fx->rel, hp->n_embd, hp->n_layers, hp->n_heads, hp->n_kv_heads);
        CHECKF(hp->head_dim_k == fx->head_dim && hp->head_dim_v == fx->head_dim && hp->rope_dims == fx->head_dim,
               "%s: head dims %u %u rope %u", fx->rel, hp->head_dim_k, hp->head_dim_v, hp->rope_dims);
        CHECKF(hp->n_ff == fx->n_ff && hp->n_experts == fx->n_experts && hp->n_experts_used == fx->n_experts_used &&
                   hp->n_ff_exp == fx->n_ff_exp,
               "%s: ff %u experts %u/%u ff_exp %u", fx->rel, hp->n_ff, hp->n_experts, hp->n_experts_used, hp->n_ff_exp);
        CHECKF(hp->rope_theta == fx->theta && hp->rms_eps == fx->eps && hp->rope_freq_scale == 1.0f,
               "%s: theta %g eps %g scale %g", fx->rel, hp->rope_theta, hp->rms_eps, hp->rope_freq_scale);
        CHECKF(hp->rope_neox == (fx->arch != SP_ARCH_LLAMA), "%s: rope_neox", fx->rel);
        for (int k = 0; k < 3; k++) {
            const struct tensor_fact *tf = &fx->t[k];
            const struct sp_tensor_desc *t = sp_model_file_find(mf, tf->name);
            CHECKF(t != NULL, "%s: no tensor %s", fx->rel, tf->name);
            if (!t) continue;
            CHECKF(t->type == tf->type && t->ne[0] == tf->ne0 && t->ne[1] == tf->ne1 && t->ne[2] == tf->ne2,
                   "%s: %s is %s [%lld %lld %lld], want %s [%lld %lld %lld]", fx->rel, tf->name, sp_qtype_name(t->type),
                   (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], sp_qtype_name(tf->type),
                   (long long)tf->ne0, (long long)tf->ne1, (long long)tf->ne2);
        }
        if (fx->absent) CHECKF(sp_model_file_find(mf, fx->absent) == NULL, "%s: unexpected %s", fx->rel, fx->absent);
        const struct sp_meta_value *a = sp_model_file_meta(mf, "general.architecture");
        CHECKF(a && a->type == SP_META_STRING && strcmp(a->v.str.ptr, sp_arch_name(fx->arch)) == 0, "%s: meta arch", fx->rel);
        CHECKF(mf->data_offset % 32 == 0 && mf->data_offset < mf->file_size, "%s: data offset", fx->rel);
        check_directory(mf);
        check_stories_vocab(fx->rel, mf);
        sp_model_file_free(mf);
    }

    /* Every GGUF under models/ must be in the table above (so new fixtures get checked). */
    const char *dirs[] = {"models/stories260K", "models/stories260K-pad256", "models/stories260K-moe", "models/tiny-qwen"};
    int n_found = 0;
    for (size_t d = 0; d < SP_ARRAY_LEN(dirs); d++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", fixture(dirs[d]));
        DIR *dp = opendir(dir);
        CHECKF(dp != NULL, "cannot list %s", dir);
        if (!dp) continue;
        struct dirent *e;
        while ((e = readdir(dp))) {
            const size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
            char rel[512];
            snprintf(rel, sizeof rel, "%s/%s", dirs[d], e->d_name);
            bool known = false;
            for (size_t i = 0; i < SP_ARRAY_LEN(fixtures); i++) known |= strcmp(fixtures[i].rel, rel) == 0;
            CHECKF(known, "fixture %s has no facts in test_gguf.c", rel);
            n_found++;
        }
        closedir(dp);
    }
    CHECKF(n_found == (int)SP_ARRAY_LEN(fixtures), "found %d GGUF fixtures, expected %zu", n_found, SP_ARRAY_LEN(fixtures));
}

/* llama2.c checkpoint vs llama.cpp's F32 conversion of it: same tensors
 * (except the converter's separate copy of the tied output), same bytes,
 * same vocabulary. */
static void test_llama2c(void) {
    const char *bin = need_fixture("models/stories260K/stories260K.bin");
    char tok[4096], bin_path[4096], gguf_path[4096];
    if (!bin) return;
    snprintf(bin_path, sizeof bin_path, "%s", bin);
    const char *t = need_fixture("models/stories260K/tok512.bin");
    if (!t) return;
    snprintf(tok, sizeof tok, "%s", t);
    const char *g = need_fixture("models/stories260K/stories260K-f32.gguf");
    if (!g) return;
    snprintf(gguf_path, sizeof gguf_path, "%s", g);

    struct sp_model_file *l2 = NULL, *gg = NULL;
    sp_status rc = sp_model_file_open(bin_path, tok, false, &l2);
    CHECKF(rc == SP_OK, "llama2c open: %s", sp_last_error());
    rc = sp_model_file_open(gguf_path, NULL, false, &gg);
    CHECKF(rc == SP_OK, "gguf open: %s", sp_last_error());
    if (!l2 || !gg) goto out;

    CHECK(l2->kind == SP_FILE_LLAMA2C && l2->version == 0 && l2->alignment == 1 && l2->data_offset == 28);
    CHECK(l2->file_size == 1056540 && l2->n_meta == 0 && strcmp(l2->name, "") == 0);
    CHECKF(l2->tokenizer_path && strcmp(l2->tokenizer_path, tok) == 0, "tokenizer_path %s", l2->tokenizer_path);
    const struct sp_hparams *a = &l2->hp, *b = &gg->hp;
    CHECK(l2->has_hparams && a->arch == SP_ARCH_LLAMA && !a->rope_neox);
    CHECKF(a->n_ctx_train == 512, "llama2c n_ctx_train %u (seq_len)", a->n_ctx_train);
    CHECK(a->n_vocab == b->n_vocab && a->n_embd == b->n_embd && a->n_layers == b->n_layers && a->n_heads == b->n_heads);
    CHECK(a->n_kv_heads == b->n_kv_heads && a->head_dim_k == b->head_dim_k && a->head_dim_v == b->head_dim_v);
    CHECK(a->n_ff == b->n_ff && a->rope_dims == b->rope_dims && a->rope_theta == b->rope_theta && a->rms_eps == b->rms_eps);
    CHECK(a->n_experts == 0 && a->rope_freq_scale == 1.0f);

    /* Tensors: same names, types, shapes, bytes. */
    CHECKF(l2->n_tensors == 47 && gg->n_tensors == 48, "%u vs %u tensors", l2->n_tensors, gg->n_tensors);
    CHECK(sp_model_file_find(l2, "output.weight") == NULL);
    check_directory(l2);
    size_t nb, ng;
    uint8_t *db = read_whole(bin_path, &nb), *dg = read_whole(gguf_path, &ng);
    SP_ASSERT(db && dg);
    for (uint32_t i = 0; i < gg->n_tensors; i++) {
        const struct sp_tensor_desc *tg = &gg->tensors[i];
        const struct sp_tensor_desc *tl = sp_model_file_find(l2, tg->name);
        if (strcmp(tg->name, "output.weight") == 0) {
            /* the converter's copy of the shared classifier: equal to token_embd */
            const struct sp_tensor_desc *emb = sp_model_file_find(l2, "token_embd.weight");
            CHECK(emb && emb->size == tg->size && memcmp(db + emb->offset, dg + tg->offset, tg->size) == 0);
            continue;
        }
        CHECKF(tl != NULL, "llama2c lacks %s", tg->name);
        if (!tl) continue;
        CHECKF(tl->type == tg->type && tl->n_dims == tg->n_dims && memcmp(tl->ne, tg->ne, sizeof tl->ne) == 0 &&
                   tl->size == tg->size,
               "%s: shape/type differ: [%lld %lld] vs [%lld %lld]", tg->name, (long long)tl->ne[0], (long long)tl->ne[1],
               (long long)tg->ne[0], (long long)tg->ne[1]);
        if (tl->size == tg->size) {
            CHECKF(memcmp(db + tl->offset, dg + tg->offset, tl->size) == 0, "%s: data differ", tg->name);
        }
    }
    free(db);
    free(dg);

    /* Vocabulary: identical strings, lengths, scores, types and specials. */
    const struct sp_vocab_data *va = &l2->vocab, *vb = &gg->vocab;
    check_stories_vocab("llama2c", l2);
    CHECK(va->n_tokens == vb->n_tokens);
    int n_diff = 0;
    for (uint32_t i = 0; i < SP_MIN(va->n_tokens, vb->n_tokens); i++) {
        const bool same = va->token_len[i] == vb->token_len[i] && strcmp(va->tokens[i], vb->tokens[i]) == 0 &&
                          memcmp(&va->scores[i], &vb->scores[i], sizeof(float)) == 0 && va->types[i] == vb->types[i];
        if (!same && n_diff++ < 5) {
            fprintf(stderr, "token %u: llama2c '%s' %g %d vs gguf '%s' %g %d\n", i, va->tokens[i], va->scores[i], va->types[i],
                    vb->tokens[i], vb->scores[i], vb->types[i]);
        }
    }
    CHECKF(n_diff == 0, "%d tokens differ", n_diff);
    CHECK(va->bos == vb->bos && va->eos == vb->eos && va->unk == vb->unk && va->pad == vb->pad);
    CHECK(va->add_bos == vb->add_bos && va->add_eos == vb->add_eos && va->add_space_prefix == vb->add_space_prefix);
    CHECK(strcmp(va->pre, vb->pre) == 0);

out:
    sp_model_file_free(l2);
    sp_model_file_free(gg);

    /* No tokenizer given: tokenizer.bin beside the model, which is absent here. */
    struct sp_model_file *mf = NULL;
    EXPECT_ERR(sp_model_file_open(bin_path, NULL, false, &mf), SP_E_IO, "stories260K/tokenizer.bin");
    CHECK(mf == NULL);
    /* vocab_only: hyper-parameters and vocabulary, no tensors. */
    rc = sp_model_file_open(bin_path, tok, true, &mf);
    CHECKF(rc == SP_OK && mf && mf->n_tensors == 0 && mf->vocab.n_tokens == 512 && mf->has_hparams, "vocab_only llama2c: %s",
           sp_last_error());
    sp_model_file_free(mf);

    /* Corrupt checkpoints and tokenizers. */
    size_t n;
    uint8_t *p = read_whole(bin_path, &n);
    SP_ASSERT(p);
    const char *cut = tmp_path("cut.bin");
    write_file(cut, p, n - 4);
    EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_FORMAT, "or 1056540 with the freq_cis tables");
    write_file(cut, p, 20);
    EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_FORMAT, "neither GGUF nor a llama2.c checkpoint");
    uint8_t hdr[28];
    memcpy(hdr, p, 28);
    hdr[12] = 3; /* n_heads 3 does not divide dim 64 */
    write_file(cut, hdr, 28);
    EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_FORMAT, "n_heads=3");
    memcpy(hdr, "24ka\x02\x00\x00\x00", 8);
    write_file(cut, hdr, 28);
    EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_UNSUPPORTED, "version 2");
    /* An absurd seq_len (the trained context) in a file without the
     * freq_cis tables, whose size then does not depend on it. */
    memcpy(hdr, p, 28);
    hdr[24] = 0xff, hdr[25] = 0xff, hdr[26] = 0xff, hdr[27] = 0x7f;
    {
        const size_t freq = 512 * 8 * 4; /* seq_len x head_size x 2 tables x 4 bytes, as stored */
        uint8_t *q = malloc(n);
        memcpy(q, p, n);
        memcpy(q, hdr, 28);
        write_file(cut, q, n - freq);
        EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_FORMAT, "seq_len=2147483647 is inconsistent");
        memcpy(q, p, 28);
        write_file(cut, q, n - freq);
        CHECKF(sp_model_file_open(cut, tok, false, &mf) == SP_OK, "no freq_cis: %s", sp_last_error());
        sp_model_file_free(mf);
        free(q);
    }
    /* Negative vocab_size: unshared classifier, expected after freq_cis. */
    memcpy(hdr, p, 28);
    hdr[20] = 0x00, hdr[21] = 0xfe, hdr[22] = 0xff, hdr[23] = 0xff; /* -512 */
    {
        const size_t wcls = 512 * 64 * 4;
        uint8_t *q = calloc(1, n + wcls);
        memcpy(q, p, n);
        memcpy(q, hdr, 28);
        write_file(cut, q, n + wcls);
        rc = sp_model_file_open(cut, tok, false, &mf);
        CHECKF(rc == SP_OK, "unshared llama2c: %s", sp_last_error());
        if (!rc) {
            const struct sp_tensor_desc *o = sp_model_file_find(mf, "output.weight");
            CHECKF(o && o->offset == n && o->ne[0] == 64 && o->ne[1] == 512, "output.weight offset %llu",
                   o ? (unsigned long long)o->offset : 0ull);
            CHECK(mf->n_tensors == 48);
        }
        sp_model_file_free(mf);
        write_file(cut, q, n + wcls - 1);
        EXPECT_ERR(sp_model_file_open(cut, tok, false, &mf), SP_E_FORMAT, "separate classifier");
        free(q);
    }
    free(p);

    p = read_whole(tok, &n);
    SP_ASSERT(p);
    const char *badtok = tmp_path("tok.bin");
    write_file(badtok, p, n - 1);
    EXPECT_ERR(sp_model_file_open(bin_path, badtok, false, &mf), SP_E_FORMAT, "tok.bin");
    {
        uint8_t *q = malloc(n + 3);
        memcpy(q, p, n);
        memcpy(q + n, "xyz", 3);
        write_file(badtok, q, n + 3);
        EXPECT_ERR(sp_model_file_open(bin_path, badtok, false, &mf), SP_E_FORMAT, "3 bytes left after the model's 512 tokens");
        memcpy(q, p, n);
        q[4 + 4] = 0xff, q[4 + 5] = 0xff, q[4 + 6] = 0xff, q[4 + 7] = 0x7f; /* token 0 length 2^31-1 */
        write_file(badtok, q, n);
        EXPECT_ERR(sp_model_file_open(bin_path, badtok, false, &mf), SP_E_FORMAT, "token 0 has length 2147483647");
        free(q);
    }
    free(p);
}

static void test_vocab_only_files(void) {
    const char *p = need_fixture("peer-tests/tokenizer/ggml-vocab-gpt-2.gguf");
    struct sp_model_file *mf = NULL;
    if (p) {
        char path[4096];
        snprintf(path, sizeof path, "%s", p);
        sp_status rc = sp_model_file_open(path, NULL, true, &mf);
        CHECKF(rc == SP_OK, "gpt-2 vocab: %s", sp_last_error());
        if (!rc) {
            const struct sp_vocab_data *vd = &mf->vocab;
            CHECK(!mf->has_hparams && mf->n_tensors == 0 && mf->data_offset == mf->file_size);
            CHECK(vd->kind == SP_VOCAB_BPE && vd->n_tokens == 50257 && vd->n_merges == 50000);
            CHECK(strcmp(vd->pre, "gpt-2") == 0 && strcmp(vd->merges[0], "\xc4\xa0 t") == 0);
            CHECK(vd->bos == 50256 && vd->eos == 50256 && vd->unk == -1 && vd->pad == -1);
            CHECK(!vd->add_bos && !vd->add_eos && !vd->add_space_prefix);
            CHECK(vd->scores == NULL && vd->types && vd->types[0] == SP_TOKEN_NORMAL);
            CHECK(strcmp(vd->tokens[0], "!") == 0 && strcmp(mf->name, "gpt-2") == 0);
        }
        sp_model_file_free(mf);
        mf = NULL;
        EXPECT_ERR(sp_model_file_open(path, NULL, false, &mf), SP_E_UNSUPPORTED, "'general.architecture' = 'gpt2'");
    }
    p = need_fixture("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf");
    if (p) {
        char path[4096];
        snprintf(path, sizeof path, "%s", p);
        sp_status rc = sp_model_file_open(path, NULL, true, &mf);
        CHECKF(rc == SP_OK, "llama-spm vocab: %s", sp_last_error());
        if (!rc) {
            const struct sp_vocab_data *vd = &mf->vocab;
            CHECK(mf->has_hparams && mf->hp.arch == SP_ARCH_LLAMA && mf->hp.n_vocab == 32000 && mf->hp.n_embd == 4096);
            CHECK(mf->hp.head_dim_k == 128 && mf->hp.n_layers == 32);
            CHECK(vd->kind == SP_VOCAB_SPM && vd->n_tokens == 32000 && vd->scores && vd->types);
            CHECK(vd->bos == 1 && vd->eos == 2 && vd->unk == 0 && vd->add_bos && !vd->add_eos && vd->add_space_prefix);
            CHECK(strcmp(vd->pre, "default") == 0 && vd->types[1] == SP_TOKEN_CONTROL && vd->types[3] == SP_TOKEN_BYTE);
        }
        sp_model_file_free(mf);
        mf = NULL;
        EXPECT_ERR(sp_model_file_open(path, NULL, false, &mf), SP_E_FORMAT, "has no tensors");
    }
}

/* ---- writer round trip -------------------------------------------------- */

static struct sp_meta_value mv_u(enum sp_meta_type t, uint64_t x) {
    struct sp_meta_value v = {.type = t};
    v.v.u64 = x;
    return v;
}
static struct sp_meta_value mv_i(enum sp_meta_type t, int64_t x) {
    struct sp_meta_value v = {.type = t};
    v.v.i64 = x;
    return v;
}
static struct sp_meta_value mv_f(enum sp_meta_type t, double x) {
    struct sp_meta_value v = {.type = t};
    v.v.f64 = x;
    return v;
}
static struct sp_meta_value mv_s(const char *s) {
    struct sp_meta_value v = {.type = SP_META_STRING};
    v.v.str.ptr = (char *)s;
    v.v.str.len = strlen(s);
    return v;
}
static struct sp_meta_value mv_arr(enum sp_meta_type et, uint64_t n, struct sp_meta_value *items) {
    struct sp_meta_value v = {.type = SP_META_ARRAY};
    v.v.arr.elem_type = et;
    v.v.arr.n = n;
    v.v.arr.items = items;
    return v;
}

static bool mv_equal(const struct sp_meta_value *a, const struct sp_meta_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case SP_META_STRING:
        return a->v.str.len == b->v.str.len && memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len) == 0 &&
               b->v.str.ptr[b->v.str.len] == '\0';
    case SP_META_ARRAY:
        if (a->v.arr.elem_type != b->v.arr.elem_type || a->v.arr.n != b->v.arr.n) return false;
        for (uint64_t i = 0; i < a->v.arr.n; i++) {
            if (!mv_equal(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
        }
        return true;
    case SP_META_F32:
        return (float)a->v.f64 == (float)b->v.f64;
    case SP_META_F64:
        return a->v.f64 == b->v.f64;
    case SP_META_I8: case SP_META_I16: case SP_META_I32: case SP_META_I64:
        return a->v.i64 == b->v.i64;
    default:
        return a->v.u64 == b->v.u64;
    }
}

struct wkv {
    const char *key;
    struct sp_meta_value v;
};

/* Every metadata type, arrays of each, nested arrays and empty arrays. */
static int make_kvs(struct wkv *kv) {
    static struct sp_meta_value a_u8[3], a_i8[2], a_u16[2], a_i16[2], a_u32[2], a_i32[3], a_f32[2], a_bool[2], a_str[3],
        a_u64[2], a_i64[2], a_f64[2], inner1[2], inner2[1], outer[3], deep[1], deep2[1], deep3[2];
    int n = 0;
    kv[n++] = (struct wkv){"t.u8", mv_u(SP_META_U8, 200)};
    kv[n++] = (struct wkv){"t.i8", mv_i(SP_META_I8, -100)};
    kv[n++] = (struct wkv){"t.u16", mv_u(SP_META_U16, 60000)};
    kv[n++] = (struct wkv){"t.i16", mv_i(SP_META_I16, -30000)};
    kv[n++] = (struct wkv){"t.u32", mv_u(SP_META_U32, 4000000000u)};
    kv[n++] = (struct wkv){"t.i32", mv_i(SP_META_I32, -2000000000)};
    kv[n++] = (struct wkv){"t.f32", mv_f(SP_META_F32, 1.5)};
    kv[n++] = (struct wkv){"t.bool", mv_u(SP_META_BOOL, 1)};
    kv[n++] = (struct wkv){"t.string", mv_s("h\xc3\xa9llo \xe2\x96\x81 world")};
    kv[n++] = (struct wkv){"t.empty_string", mv_s("")};
    kv[n++] = (struct wkv){"t.u64", mv_u(SP_META_U64, 0x8000000000000005ull)};
    kv[n++] = (struct wkv){"t.i64", mv_i(SP_META_I64, -(INT64_C(1) << 62))};
    kv[n++] = (struct wkv){"t.f64", mv_f(SP_META_F64, 3.141592653589793)};
    a_u8[0] = mv_u(SP_META_U8, 0), a_u8[1] = mv_u(SP_META_U8, 255), a_u8[2] = mv_u(SP_META_U8, 7);
    a_i8[0] = mv_i(SP_META_I8, -128), a_i8[1] = mv_i(SP_META_I8, 127);
    a_u16[0] = mv_u(SP_META_U16, 65535), a_u16[1] = mv_u(SP_META_U16, 1);
    a_i16[0] = mv_i(SP_META_I16, -32768), a_i16[1] = mv_i(SP_META_I16, 32767);
    a_u32[0] = mv_u(SP_META_U32, 0xffffffffu), a_u32[1] = mv_u(SP_META_U32, 3);
    a_i32[0] = mv_i(SP_META_I32, INT32_MIN), a_i32[1] = mv_i(SP_META_I32, -1), a_i32[2] = mv_i(SP_META_I32, 6);
    a_f32[0] = mv_f(SP_META_F32, -0.25), a_f32[1] = mv_f(SP_META_F32, 1e-6);
    a_bool[0] = mv_u(SP_META_BOOL, 0), a_bool[1] = mv_u(SP_META_BOOL, 1);
    a_str[0] = mv_s("a b"), a_str[1] = mv_s(""), a_str[2] = mv_s("\xe2\x96\x81x");
    a_u64[0] = mv_u(SP_META_U64, UINT64_MAX), a_u64[1] = mv_u(SP_META_U64, 0);
    a_i64[0] = mv_i(SP_META_I64, INT64_MIN), a_i64[1] = mv_i(SP_META_I64, INT64_MAX);
    a_f64[0] = mv_f(SP_META_F64, -1e300), a_f64[1] = mv_f(SP_META_F64, 0.1);
    kv[n++] = (struct wkv){"a.u8", mv_arr(SP_META_U8, 3, a_u8)};
    kv[n++] = (struct wkv){"a.i8", mv_arr(SP_META_I8, 2, a_i8)};
    kv[n++] = (struct wkv){"a.u16", mv_arr(SP_META_U16, 2, a_u16)};
    kv[n++] = (struct wkv){"a.i16", mv_arr(SP_META_I16, 2, a_i16)};
    kv[n++] = (struct wkv){"a.u32", mv_arr(SP_META_U32, 2, a_u32)};
    kv[n++] = (struct wkv){"a.i32", mv_arr(SP_META_I32, 3, a_i32)};
    kv[n++] = (struct wkv){"a.f32", mv_arr(SP_META_F32, 2, a_f32)};
    kv[n++] = (struct wkv){"a.bool", mv_arr(SP_META_BOOL, 2, a_bool)};
    kv[n++] = (struct wkv){"a.string", mv_arr(SP_META_STRING, 3, a_str)};
    kv[n++] = (struct wkv){"a.u64", mv_arr(SP_META_U64, 2, a_u64)};
    kv[n++] = (struct wkv){"a.i64", mv_arr(SP_META_I64, 2, a_i64)};
    kv[n++] = (struct wkv){"a.f64", mv_arr(SP_META_F64, 2, a_f64)};
    kv[n++] = (struct wkv){"a.empty", mv_arr(SP_META_F32, 0, NULL)};
    /* [[ "a b", "" ], [ 6 ]... ] : an array of arrays of different element types */
    inner1[0] = mv_s("x"), inner1[1] = mv_s("yz");
    inner2[0] = mv_i(SP_META_I32, 6);
    outer[0] = mv_arr(SP_META_STRING, 2, inner1);
    outer[1] = mv_arr(SP_META_I32, 1, inner2);
    outer[2] = mv_arr(SP_META_U8, 0, NULL);
    kv[n++] = (struct wkv){"a.nested", mv_arr(SP_META_ARRAY, 3, outer)};
    deep3[0] = mv_f(SP_META_F64, 2.5), deep3[1] = mv_f(SP_META_F64, -2.5);
    deep2[0] = mv_arr(SP_META_F64, 2, deep3);
    deep[0] = mv_arr(SP_META_ARRAY, 1, deep2);
    kv[n++] = (struct wkv){"a.deep", mv_arr(SP_META_ARRAY, 1, deep)};
    return n;
}

struct wt {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
};

static const struct wt wtensors[] = {
    {"t.f32", SP_QTYPE_F32, 2, {8, 3, 1, 1}},
    {"t.empty", SP_QTYPE_F32, 2, {0, 4, 1, 1}},
    {"t.q8_0", SP_QTYPE_Q8_0, 2, {64, 2, 1, 1}},
    {"t.f16", SP_QTYPE_F16, 1, {17, 1, 1, 1}},
    {"t.q4_k", SP_QTYPE_Q4_K, 4, {256, 2, 1, 2}},
    {"t.bf16", SP_QTYPE_BF16, 3, {4, 1, 3, 1}},
};

/* Deterministic data bytes for tensor k. */
static uint8_t data_byte(size_t k, uint64_t i) {
    return (uint8_t)(i * 31 + k * 7 + 1);
}

/* Write a file with make_kvs() and wtensors at alignment, data in chunks of
 * `chunk` bytes that cross tensor boundaries. */
static sp_status write_sample(const char *path, uint32_t alignment, size_t chunk) {
    struct sp_gguf_writer *w;
    struct wkv kv[64];
    sp_status rc = sp_gguf_writer_open(path, alignment, &w);
    if (rc) return rc;
    const int n = make_kvs(kv);
    for (int i = 0; i < n && !rc; i++) rc = sp_gguf_writer_set(w, kv[i].key, &kv[i].v);
    if (!rc) rc = sp_gguf_writer_set_str(w, "general.architecture", "test");
    if (!rc) rc = sp_gguf_writer_set_u32(w, "t.u32", 4000000000u); /* replaces, keeps position */
    for (size_t k = 0; k < SP_ARRAY_LEN(wtensors) && !rc; k++) {
        rc = sp_gguf_writer_add_tensor(w, wtensors[k].name, wtensors[k].type, wtensors[k].n_dims, wtensors[k].ne);
    }
    /* All tensor bytes, concatenated, then fed in chunks. */
    size_t total = 0;
    for (size_t k = 0; k < SP_ARRAY_LEN(wtensors); k++) {
        int64_t rows = wtensors[k].ne[1] * wtensors[k].ne[2] * wtensors[k].ne[3];
        total += sp_qtype_row_bytes(wtensors[k].type, wtensors[k].ne[0]) * (size_t)rows;
    }
    uint8_t *all = malloc(total + 1);
    size_t pos = 0;
    for (size_t k = 0; k < SP_ARRAY_LEN(wtensors); k++) {
        int64_t rows = wtensors[k].ne[1] * wtensors[k].ne[2] * wtensors[k].ne[3];
        size_t sz = sp_qtype_row_bytes(wtensors[k].type, wtensors[k].ne[0]) * (size_t)rows;
        for (size_t i = 0; i < sz; i++) all[pos + i] = data_byte(k, i);
        pos += sz;
    }
    for (size_t off = 0; off < total && !rc; off += chunk) rc = sp_gguf_writer_write(w, all + off, SP_MIN(chunk, total - off));
    free(all);
    if (!rc) rc = sp_gguf_writer_finish(w);
    sp_gguf_writer_free(w);
    return rc;
}

static void check_sample(const char *path, uint32_t alignment) {
    struct sp_file *f = NULL;
    struct sp_model_file *mf = sp_calloc(1, sizeof(*mf));
    sp_status rc = sp_file_open(path, &f);
    CHECKF(rc == SP_OK, "open %s: %s", path, sp_last_error());
    if (!rc) rc = sp_gguf_read(f, mf);
    CHECKF(rc == SP_OK, "read back %s: %s", path, sp_last_error());
    if (rc) goto out;
    CHECK(mf->version == 3 && mf->alignment == alignment && mf->data_offset % alignment == 0);
    CHECK(mf->file_size % alignment == 0); /* the last tensor is padded too, as ggml does */
    struct wkv kv[64];
    const int n = make_kvs(kv);
    const uint64_t n_want = (uint64_t)n + 1 + (alignment != 32);
    CHECKF(mf->n_meta == n_want, "%llu keys, want %llu", (unsigned long long)mf->n_meta, (unsigned long long)n_want);
    for (int i = 0; i < n; i++) {
        const struct sp_meta_value *v = sp_model_file_meta(mf, kv[i].key);
        CHECKF(v && mv_equal(&kv[i].v, v), "key %s differs after the round trip", kv[i].key);
    }
    for (uint64_t i = 1; i < mf->n_meta; i++) { /* a replaced key keeps its place */
        if (strcmp(mf->meta[i].key, "t.u32") == 0) CHECK(strcmp(mf->meta[i - 1].key, "t.i16") == 0);
    }
    if (alignment != 32) {
        const struct sp_meta_value *a = sp_model_file_meta(mf, "general.alignment");
        CHECK(a && a->type == SP_META_U32 && a->v.u64 == alignment);
    }
    CHECK(mf->n_tensors == SP_ARRAY_LEN(wtensors));
    check_directory(mf);
    for (size_t k = 0; k < SP_ARRAY_LEN(wtensors) && k < mf->n_tensors; k++) {
        const struct sp_tensor_desc *t = &mf->tensors[k];
        CHECK(strcmp(t->name, wtensors[k].name) == 0 && t->type == wtensors[k].type && t->n_dims == wtensors[k].n_dims);
        CHECK(memcmp(t->ne, wtensors[k].ne, sizeof t->ne) == 0);
        uint8_t *d = malloc(t->size + 1);
        CHECK(sp_file_read_at(f, t->offset, d, t->size) == SP_OK);
        bool same = true;
        for (uint64_t i = 0; i < t->size; i++) same &= d[i] == data_byte(k, i);
        CHECKF(same, "tensor %s data differs", t->name);
        free(d);
    }
out:
    sp_model_file_free(mf);
    sp_file_close(f);
}

static void test_writer(void) {
    const char *p32 = tmp_path("rt32.gguf"), *p4k = tmp_path("rt4k.gguf");
    sp_status rc = write_sample(p32, 0, 7);
    CHECKF(rc == SP_OK, "write: %s", sp_last_error());
    check_sample(p32, 32);
    rc = write_sample(p4k, 4096, 100000);
    CHECKF(rc == SP_OK, "write 4k: %s", sp_last_error());
    check_sample(p4k, 4096);

    /* Misuse and incomplete files. */
    const char *pe = tmp_path("err.gguf");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.sparrow-tmp.%ld", pe, (long)getpid());
    /* Leftovers of killed writers of pe: a dead process's is removed when
     * the next writer opens, a live one's (pid 1) is left alone. */
    char dead[640], live[640];
    const pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    snprintf(dead, sizeof dead, "%s.sparrow-tmp.%ld", pe, (long)child);
    snprintf(live, sizeof live, "%s.sparrow-tmp.1", pe);
    for (int k = 0; k < 2; k++) {
        FILE *lf = fopen(k ? live : dead, "wb");
        CHECK(lf && fputs("GGUF partial", lf) >= 0);
        if (lf) fclose(lf);
    }
    struct sp_gguf_writer *w;
    const int64_t ne[2] = {32, 2};
    CHECK(sp_gguf_writer_open(pe, 0, &w) == SP_OK);
    CHECK(access(tmp, F_OK) == 0);
    CHECKF(access(dead, F_OK) != 0, "the leftover of a dead writer %s is still there", dead);
    CHECKF(access(live, F_OK) == 0, "the temporary file of a live process %s was removed", live);
    unlink(live);
    CHECK(sp_gguf_writer_add_tensor(w, "a", SP_QTYPE_Q8_0, 2, ne) == SP_OK);
    EXPECT_ERR(sp_gguf_writer_add_tensor(w, "a", SP_QTYPE_F32, 2, ne), SP_E_INVALID, "duplicate tensor name 'a'");
    EXPECT_ERR(sp_gguf_writer_add_tensor(w, "b", 99, 2, ne), SP_E_INVALID, "unknown type id 99");
    EXPECT_ERR(sp_gguf_writer_add_tensor(w, "b", SP_QTYPE_Q8_0, 5, ne), SP_E_INVALID, "n_dims 5");
    const int64_t bad_ne[2] = {33, 1};
    EXPECT_ERR(sp_gguf_writer_add_tensor(w, "b", SP_QTYPE_Q8_0, 2, bad_ne), SP_E_INVALID, "block size 32");
    EXPECT_ERR(sp_gguf_writer_add_tensor(w, "a-name-that-is-much-too-long-for-ggml-readers-to-accept-0123456789", SP_QTYPE_F32, 2, ne),
               SP_E_INVALID, "1..63 bytes");
    EXPECT_ERR(sp_gguf_writer_set_u32(w, "general.alignment", 64), SP_E_INVALID, "general.alignment");
    struct sp_meta_value bad_items[2] = {mv_u(SP_META_U8, 1), mv_u(SP_META_U32, 2)};
    struct sp_meta_value bad_arr = mv_arr(SP_META_U8, 2, bad_items);
    EXPECT_ERR(sp_gguf_writer_set(w, "x", &bad_arr), SP_E_INVALID, "array item 1 has type u32");
    uint8_t data[68] = {0};
    CHECK(sp_gguf_writer_write(w, data, 30) == SP_OK);
    {   /* the header is out, but the magic comes last: no reader takes it for a model */
        uint8_t *part = NULL;
        size_t n_part = 0;
        fflush(NULL);
        part = read_whole(tmp, &n_part);
        CHECKF(part && n_part >= 4 && memcmp(part, "GGUF", 4) != 0, "a partial file starts with the GGUF magic");
        free(part);
    }
    EXPECT_ERR(sp_gguf_writer_set_u32(w, "late", 1), SP_E_STATE, "frozen");
    EXPECT_ERR(sp_gguf_writer_finish(w), SP_E_STATE, "tensor 'a' has 30 of its 68 bytes written");
    EXPECT_ERR(sp_gguf_writer_write(w, data, 39), SP_E_INVALID, "1 bytes more than the declared tensors hold");
    sp_gguf_writer_free(w);
    CHECKF(access(tmp, F_OK) != 0 && access(pe, F_OK) != 0, "free without finish left %s or %s", tmp, pe);
    EXPECT_ERR(sp_gguf_writer_open(pe, 48, &w), SP_E_INVALID, "power of two");
    EXPECT_ERR(sp_gguf_writer_open("/nonexistent-dir/x.gguf", 0, &w), SP_E_IO, "/nonexistent-dir/x.gguf.sparrow-tmp.");

    /* A metadata-only file (no tensors) round-trips and opens as vocab_only-less GGUF. */
    CHECK(sp_gguf_writer_open(pe, 0, &w) == SP_OK);
    CHECK(sp_gguf_writer_set_bool(w, "b", true) == SP_OK && sp_gguf_writer_set_f32(w, "f", 0.5f) == SP_OK);
    CHECK(sp_gguf_writer_finish(w) == SP_OK);
    EXPECT_ERR(sp_gguf_writer_finish(w), SP_E_STATE, "already finished");
    sp_gguf_writer_free(w);
    CHECK(access(pe, F_OK) == 0 && access(tmp, F_OK) != 0);
    size_t n;
    uint8_t *p = read_whole(pe, &n);
    struct sp_model_file *mf = NULL;
    CHECK(p && gguf_mem(p, n, &mf) == SP_OK && mf->n_meta == 2 && mf->n_tensors == 0);
    if (mf) {
        CHECK(sp_model_file_meta(mf, "b")->v.u64 == 1 && sp_model_file_meta(mf, "f")->v.f64 == 0.5);
        sp_model_file_free(mf);
    }
    free(p);
}

/* ---- model_file on handmade models ------------------------------------ */

typedef void (*mutate_fn)(struct sp_gguf_writer *w, const char *arch);

/* A tiny but complete model file: hyper-parameters, an 8-token SPM vocab
 * and the embedding table [32, 8]. */
static sp_status write_tiny(const char *path, const char *arch, mutate_fn mutate) {
    struct sp_gguf_writer *w;
    char key[128];
    sp_status rc = sp_gguf_writer_open(path, 0, &w);
    if (rc) return rc;
#define AK(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    static const char *toks[8] = {"<unk>", "<s>", "</s>", ("\xe2\x96\x81" "a"), "b", "c", "<0x0A>", "d"};
    struct sp_meta_value tv[8], sv[8], yv[8];
    for (int i = 0; i < 8; i++) {
        tv[i] = mv_s(toks[i]);
        sv[i] = mv_f(SP_META_F32, -i);
        yv[i] = mv_i(SP_META_I32, i == 0 ? 2 : i < 3 ? 3 : i == 6 ? 6 : 1);
    }
    struct sp_meta_value ta = mv_arr(SP_META_STRING, 8, tv), sa = mv_arr(SP_META_F32, 8, sv), ya = mv_arr(SP_META_I32, 8, yv);
    sp_gguf_writer_set_str(w, "general.architecture", arch);
    sp_gguf_writer_set_str(w, "general.name", "tiny");
    sp_gguf_writer_set_u32(w, AK("context_length"), 64);
    sp_gguf_writer_set_u32(w, AK("embedding_length"), 32);
    sp_gguf_writer_set_u32(w, AK("block_count"), 1);
    sp_gguf_writer_set_u32(w, AK("feed_forward_length"), 64);
    sp_gguf_writer_set_u32(w, AK("attention.head_count"), 4);
    sp_gguf_writer_set_u32(w, AK("attention.head_count_kv"), 2);
    sp_gguf_writer_set_f32(w, AK("attention.layer_norm_rms_epsilon"), 1e-5f);
    sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    sp_gguf_writer_set(w, "tokenizer.ggml.tokens", &ta);
    sp_gguf_writer_set(w, "tokenizer.ggml.scores", &sa);
    sp_gguf_writer_set(w, "tokenizer.ggml.token_type", &ya);
#undef AK
    if (mutate) mutate(w, arch);
    const int64_t ne[2] = {32, 8};
    rc = sp_gguf_writer_add_tensor(w, "token_embd.weight", SP_QTYPE_F32, 2, ne);
    static const float zeros[32 * 8];
    if (!rc) rc = sp_gguf_writer_write(w, zeros, sizeof zeros);
    if (!rc) rc = sp_gguf_writer_finish(w);
    sp_gguf_writer_free(w);
    return rc;
}

static char mkey[128];
static const char *akey(const char *arch, const char *s) {
    snprintf(mkey, sizeof mkey, "%s.%s", arch, s);
    return mkey;
}

static void m_ctx_u8(struct sp_gguf_writer *w, const char *a) {
    struct sp_meta_value v = mv_u(SP_META_U8, 200);
    sp_gguf_writer_set(w, akey(a, "context_length"), &v);
    v = mv_i(SP_META_I64, 1);
    sp_gguf_writer_set(w, akey(a, "block_count"), &v);
    v = mv_u(SP_META_U16, 2);
    sp_gguf_writer_set(w, akey(a, "attention.head_count_kv"), &v);
    v = mv_f(SP_META_F64, 5e5);
    sp_gguf_writer_set(w, akey(a, "rope.freq_base"), &v);
    sp_gguf_writer_set_str(w, akey(a, "rope.scaling.type"), "linear");
    sp_gguf_writer_set_f32(w, akey(a, "rope.scaling.factor"), 4.0f);
    sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    sp_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    sp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 7);
    sp_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 4294967295u);
    v = mv_i(SP_META_I32, 5);
    sp_gguf_writer_set(w, "tokenizer.ggml.eot_token_id", &v);
}
static void m_ctx_str(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_str(w, akey(a, "context_length"), "4096");
}
static void m_ctx_absurd(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_u32(w, akey(a, "context_length"), 0xFFFFFFFFu);
}
static void m_layers_neg(struct sp_gguf_writer *w, const char *a) {
    struct sp_meta_value v = mv_i(SP_META_I32, -1);
    sp_gguf_writer_set(w, akey(a, "block_count"), &v);
}
static void m_no_embd(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_bool(w, akey(a, "embedding_length"), true);
}
static void m_heads_arr_same(struct sp_gguf_writer *w, const char *a) {
    struct sp_meta_value items[1] = {mv_u(SP_META_U32, 4)};
    struct sp_meta_value v = mv_arr(SP_META_U32, 1, items);
    sp_gguf_writer_set(w, akey(a, "attention.head_count"), &v);
}
static void m_heads_arr_diff(struct sp_gguf_writer *w, const char *a) {
    struct sp_meta_value items[2] = {mv_u(SP_META_U32, 4), mv_u(SP_META_U32, 8)};
    struct sp_meta_value v = mv_arr(SP_META_U32, 2, items);
    sp_gguf_writer_set(w, akey(a, "attention.head_count_kv"), &v);
}
static void m_kv_bad(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_u32(w, akey(a, "attention.head_count_kv"), 3);
}
static void m_yarn(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_str(w, akey(a, "rope.scaling.type"), "yarn");
}
static void m_bad_bos(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    sp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 8);
}
static void m_bpe_no_merges(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
}
static void m_bpe(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    struct sp_meta_value m[1] = {mv_s("b c")};
    struct sp_meta_value v = mv_arr(SP_META_STRING, 1, m);
    sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    sp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    sp_gguf_writer_set(w, "tokenizer.ggml.merges", &v);
}
static void m_tok_model(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
}
static void m_scores_short(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    struct sp_meta_value s[2] = {mv_f(SP_META_F32, 0), mv_f(SP_META_F32, 0)};
    struct sp_meta_value v = mv_arr(SP_META_F32, 2, s);
    sp_gguf_writer_set(w, "tokenizer.ggml.scores", &v);
}
static void m_tokens_int(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    struct sp_meta_value s[1] = {mv_u(SP_META_U32, 0)};
    struct sp_meta_value v = mv_arr(SP_META_U32, 1, s);
    sp_gguf_writer_set(w, "tokenizer.ggml.tokens", &v);
}
static void m_token_nul(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    struct sp_meta_value s[8];
    for (int i = 0; i < 8; i++) s[i] = mv_s("x");
    s[5].v.str.ptr = (char *)"a\0b";
    s[5].v.str.len = 3;
    struct sp_meta_value v = mv_arr(SP_META_STRING, 8, s);
    sp_gguf_writer_set(w, "tokenizer.ggml.tokens", &v);
}
static void m_moe(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_u32(w, akey(a, "expert_count"), 4);
    sp_gguf_writer_set_u32(w, akey(a, "expert_used_count"), 2);
    sp_gguf_writer_set_u32(w, akey(a, "attention.key_length"), 16);
    sp_gguf_writer_set_u32(w, akey(a, "attention.value_length"), 16);
}
static void m_moe_bad(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_u32(w, akey(a, "expert_count"), 2);
    sp_gguf_writer_set_u32(w, akey(a, "expert_used_count"), 3);
}
static void m_requires(struct sp_gguf_writer *w, const char *a) {
    (void)a;
    sp_gguf_writer_set_str(w, "sparrow.requires", "native-types-9");
}

static void m_rope_dims(struct sp_gguf_writer *w, const char *a) {
    sp_gguf_writer_set_u32(w, akey(a, "rope.dimension_count"), 4);
}

static void test_model_keys(void) {
    const char *p = tmp_path("tiny.gguf");
    struct sp_model_file *mf = NULL;
    sp_status rc;

    CHECK(write_tiny(p, "llama", NULL) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK, "tiny: %s", sp_last_error());
    if (!rc) {
        CHECK(mf->hp.n_vocab == 8 && mf->hp.head_dim_k == 8 && mf->hp.rope_dims == 8 && mf->hp.rope_theta == 10000.0f);
        CHECK(mf->vocab.types[6] == SP_TOKEN_BYTE && mf->vocab.bos == 1 && mf->vocab.add_bos && strcmp(mf->name, "tiny") == 0);
        CHECK(strcmp(mf->vocab.pre, "") == 0);
    }
    sp_model_file_free(mf);

    /* Integer keys under other integer types, linear RoPE scaling, vocab overrides. */
    CHECK(write_tiny(p, "qwen2", m_ctx_u8) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK, "u8/i64/u16 keys: %s", sp_last_error());
    if (!rc) {
        CHECK(mf->hp.arch == SP_ARCH_QWEN2 && mf->hp.rope_neox && mf->hp.n_ctx_train == 200 && mf->hp.n_layers == 1);
        CHECK(mf->hp.rope_theta == 5e5f && mf->hp.rope_freq_scale == 0.25f);
        CHECK(!mf->vocab.add_bos && !mf->vocab.add_space_prefix && mf->vocab.eos == 7 && mf->vocab.pad == -1 && mf->vocab.eot == 5);
    }
    sp_model_file_free(mf);

    CHECK(write_tiny(p, "llama", m_heads_arr_same) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK && mf->hp.n_heads == 4, "per-layer head_count array: %s", sp_last_error());
    sp_model_file_free(mf);

    CHECK(write_tiny(p, "qwen3moe", m_moe) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK, "qwen3moe: %s", sp_last_error());
    if (!rc) {
        CHECK(mf->hp.n_experts == 4 && mf->hp.n_experts_used == 2 && mf->hp.n_ff_exp == 32); /* 64 / 2, llama.cpp default */
        CHECK(mf->hp.head_dim_k == 16 && mf->hp.rope_dims == 16);
    }
    sp_model_file_free(mf);

    n_warnings = 0;
    CHECK(write_tiny(p, "llama", m_bad_bos) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK && mf->vocab.bos == 1, "out-of-range bos keeps the default: %s", sp_last_error());
    CHECKF(n_warnings == 1 && strstr(last_warning, "tokenizer.ggml.bos_token_id"), "warning: %s", last_warning);
    sp_model_file_free(mf);

    CHECK(write_tiny(p, "llama", m_bpe) == SP_OK);
    rc = sp_model_file_open(p, NULL, false, &mf);
    CHECKF(rc == SP_OK, "bpe: %s", sp_last_error());
    if (!rc) {
        CHECK(mf->vocab.kind == SP_VOCAB_BPE && mf->vocab.n_merges == 1 && strcmp(mf->vocab.merges[0], "b c") == 0);
        CHECK(mf->vocab.add_bos && !mf->vocab.add_space_prefix && mf->vocab.bos == -1 && mf->vocab.unk == -1);
    }
    sp_model_file_free(mf);

    /* Errors that name the key. */
    struct {
        const char *arch;
        mutate_fn m;
        sp_status want;
        const char *needle;
    } bad[] = {
        {"mamba", NULL, SP_E_UNSUPPORTED, "'general.architecture' = 'mamba'"},
        {"llama", m_ctx_str, SP_E_FORMAT, "'llama.context_length' has type string"},
        {"llama", m_ctx_absurd, SP_E_FORMAT, "context_length is absurd"},
        {"llama", m_layers_neg, SP_E_FORMAT, "'llama.block_count' = -1 is out of range"},
        {"llama", m_no_embd, SP_E_FORMAT, "'llama.embedding_length' has type bool"},
        {"llama", m_heads_arr_diff, SP_E_UNSUPPORTED, "'llama.attention.head_count_kv' has per-layer values that differ"},
        {"llama", m_kv_bad, SP_E_FORMAT, "head_count is not a multiple of attention.head_count_kv"},
        {"llama", m_yarn, SP_E_UNSUPPORTED, "'llama.rope.scaling.type' = 'yarn'"},
        {"llama", m_bpe_no_merges, SP_E_FORMAT, "tokenizer.ggml.merges"},
        {"llama", m_tok_model, SP_E_UNSUPPORTED, "'tokenizer.ggml.model' = 't5'"},
        {"llama", m_scores_short, SP_E_FORMAT, "'tokenizer.ggml.scores' has 2 values, expected 8"},
        {"llama", m_tokens_int, SP_E_FORMAT, "'tokenizer.ggml.tokens' has type array of u32"},
        {"llama", m_token_nul, SP_E_FORMAT, "'tokenizer.ggml.tokens' value 5 contains a NUL"},
        {"qwen3moe", m_moe_bad, SP_E_FORMAT, "expert_used_count exceeds expert_count"},
        {"qwen3moe", NULL, SP_E_FORMAT, "missing required key 'qwen3moe.expert_count'"},
        {"llama", m_rope_dims, SP_E_FORMAT, "rope.dimension_count differs"},
        {"llama", m_requires, SP_E_UNSUPPORTED, "requires 'native-types-9' (key sparrow.requires)"},
    };
    for (size_t i = 0; i < SP_ARRAY_LEN(bad); i++) {
        CHECK(write_tiny(p, bad[i].arch, bad[i].m) == SP_OK);
        mf = NULL;
        EXPECT_ERR(sp_model_file_open(p, NULL, false, &mf), bad[i].want, bad[i].needle);
        CHECK(mf == NULL);
    }
    /* vocab_only tolerates an unknown architecture. */
    CHECK(write_tiny(p, "mamba", NULL) == SP_OK);
    rc = sp_model_file_open(p, NULL, true, &mf);
    CHECKF(rc == SP_OK && !mf->has_hparams && mf->vocab.n_tokens == 8, "vocab_only mamba: %s", sp_last_error());
    sp_model_file_free(mf);
}

/* ---- corrupt files -------------------------------------------------------- */

static void test_corrupt(void) {
    struct sp_model_file *mf = NULL;
    struct buf b = {0};
    const uint64_t ne2[2] = {8, 2};

    /* Missing, empty, not GGUF. */
    EXPECT_ERR(sp_model_file_open("/nonexistent/model.gguf", NULL, false, &mf), SP_E_IO, "'/nonexistent/model.gguf': No such file");
    const char *empty = tmp_path("empty.gguf");
    write_file(empty, "", 0);
    EXPECT_ERR(sp_model_file_open(empty, NULL, false, &mf), SP_E_FORMAT, "empty");
    EXPECT_ERR(gguf_mem("", 0, NULL), SP_E_FORMAT, "truncated");
    EXPECT_ERR(gguf_mem("GGUX\3\0\0\0", 8, NULL), SP_E_FORMAT, "not a GGUF file (magic 47 47 55 58");
    EXPECT_ERR(sp_model_file_open(scratch_dir(), NULL, false, &mf), SP_E_IO, "Is a directory");

    /* Truncated header. */
    EXPECT_ERR(gguf_mem("GGUF\3\0\0", 7, NULL), SP_E_FORMAT, "truncated: the GGUF header needs 24 bytes at offset 0");
    b_header(&b, 3, 0, 0);
    EXPECT_ERR(gguf_mem(b.p, 20, NULL), SP_E_FORMAT, "truncated");
    CHECK(gguf_mem(b.p, b.n, NULL) == SP_OK);

    /* Versions. */
    b.n = 0, b_header(&b, 1, 0, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_UNSUPPORTED, "GGUF v1");
    b.n = 0, b_header(&b, 4, 0, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_UNSUPPORTED, "unsupported GGUF version 4");
    b.n = 0, b_header(&b, 0, 0, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "invalid GGUF version 0");
    b.n = 0, b_header(&b, 0x03000000u, 0, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_UNSUPPORTED, "big-endian");
    b.n = 0, b_header(&b, 2, 0, 1), b_kv_u32(&b, "k", 1);
    CHECKF(gguf_mem(b.p, b.n, NULL) == SP_OK, "v2: %s", sp_last_error());

    /* Absurd counts, refused before allocating. */
    b.n = 0, b_header(&b, 3, UINT64_MAX, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "header claims 18446744073709551615 tensors");
    b.n = 0, b_header(&b, 3, 0, UINT64_MAX), b_kv_u32(&b, "k", 1);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "18446744073709551615 metadata keys");
    b.n = 0, b_header(&b, 3, (UINT64_C(1) << 63) + 1, (UINT64_C(1) << 62));
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "header claims");
    b.n = 0, b_header(&b, 3, 0, 2), b_kv_u32(&b, "k", 1); /* 2 keys, bytes for one */
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "header claims 0 tensors and 2 metadata keys");

    /* String and array lengths near 2^64. */
    b.n = 0, b_header(&b, 3, 0, 1), b_u64(&b, UINT64_MAX - 3), b_zeros(&b, 16);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "string length 18446744073709551612 at offset 24 exceeds");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "k"), b_u32(&b, SP_META_STRING), b_u64(&b, UINT64_MAX), b_zeros(&b, 8);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "key 'k': string length 18446744073709551615");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "arr"), b_u32(&b, SP_META_ARRAY), b_u32(&b, SP_META_U8), b_u64(&b, UINT64_MAX - 1);
    b_zeros(&b, 8);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "key 'arr': array of 18446744073709551614 u8 values");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "arr"), b_u32(&b, SP_META_ARRAY), b_u32(&b, SP_META_STRING), b_u64(&b, 3);
    b_u64(&b, 0), b_u64(&b, 0); /* two empty strings, the third missing: 3*8 bytes needed, 16 left */
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "array of 3 string values");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "arr"), b_u32(&b, SP_META_ARRAY), b_u32(&b, SP_META_U64), b_u64(&b, 2);
    b_u64(&b, 1), b_zeros(&b, 7);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "array of 2 u64 values");

    /* Keys and values. */
    b.n = 0, b_header(&b, 3, 0, 2), b_kv_u32(&b, "dup", 1), b_kv_u32(&b, "dup", 2);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "duplicate metadata key 'dup'");
    b.n = 0, b_header(&b, 3, 0, 1), b_kv_u32(&b, "", 1);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "the key of metadata entry 0 at offset 24 is empty");
    b.n = 0, b_header(&b, 3, 0, 1), b_u64(&b, 3), b_put(&b, "a\0b", 3), b_u32(&b, SP_META_U32), b_u32(&b, 1);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "contains a NUL byte");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "k"), b_u32(&b, 13), b_u64(&b, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "key 'k' has unknown value type 13 at offset 33");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "k"), b_u32(&b, SP_META_ARRAY), b_u32(&b, 77), b_u64(&b, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "key 'k': unknown array element type 77");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "deep"), b_u32(&b, SP_META_ARRAY);
    for (int i = 0; i < 9; i++) b_u32(&b, SP_META_ARRAY), b_u64(&b, 1);
    b_u32(&b, SP_META_U8), b_u64(&b, 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "key 'deep': arrays nested deeper than 8");
    b.n = 0, b_header(&b, 3, 0, 1), b_str(&b, "deep"), b_u32(&b, SP_META_ARRAY);
    for (int i = 0; i < 7; i++) b_u32(&b, SP_META_ARRAY), b_u64(&b, 1);
    b_u32(&b, SP_META_U8), b_u64(&b, 1), b_put(&b, "x", 1);
    CHECKF(gguf_mem(b.p, b.n, NULL) == SP_OK, "8 levels of arrays: %s", sp_last_error());

    /* Alignment. */
    b.n = 0, b_header(&b, 3, 0, 1), b_kv_u32(&b, "general.alignment", 48);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "'general.alignment' = 48 is not a nonzero power of two");
    b.n = 0, b_header(&b, 3, 0, 1), b_kv_u32(&b, "general.alignment", 0);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "'general.alignment' = 0");
    b.n = 0, b_header(&b, 3, 0, 1), b_kv_str(&b, "general.alignment", "32");
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "'general.alignment' has type string");

    /* Tensors: the valid baseline first. */
    b.n = 0, b_simple(&b, 2, ne2, SP_QTYPE_F32, 0, 64);
    CHECKF(gguf_mem(b.p, b.n, &mf) == SP_OK, "baseline: %s", sp_last_error());
    if (mf) {
        CHECK(mf->n_tensors == 1 && mf->tensors[0].offset == mf->data_offset && mf->tensors[0].size == 64);
        sp_model_file_free(mf);
        mf = NULL;
    }
    /* Two tensors whose data overlap (the second starts inside the first),
     * and a Q8_0 tensor whose type is changed to F32 (34 -> 128 bytes: it
     * claims its neighbour's); side by side they are fine. */
    const uint64_t ne_row[1] = {32};
    const struct {
        uint32_t type_a;
        uint64_t off_b;
        bool ok;
    } pairs[] = {{SP_QTYPE_F32, 128, true}, {SP_QTYPE_F32, 96, false}, {SP_QTYPE_Q8_0, 64, true}, {SP_QTYPE_F32, 64, false}};
    for (size_t k = 0; k < SP_ARRAY_LEN(pairs); k++) {
        b.n = 0, b_header(&b, 3, 2, 1), b_kv_str(&b, "general.architecture", "llama");
        b_tensor(&b, "blk.0.a", 1, ne_row, pairs[k].type_a, 0), b_tensor(&b, "blk.0.b", 1, ne_row, SP_QTYPE_F32, pairs[k].off_b);
        b_align(&b, 32), b_zeros(&b, 256);
        if (pairs[k].ok) {
            CHECKF(gguf_mem(b.p, b.n, NULL) == SP_OK, "pair %zu: %s", k, sp_last_error());
        } else {
            EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensors 'blk.0.a'");
            EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "and 'blk.0.b'");
            EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "overlap");
        }
    }
    b.n = 0, b_header(&b, 3, 2, 1), b_kv_str(&b, "general.architecture", "llama");
    b_tensor(&b, "blk.0.b", 1, ne_row, SP_QTYPE_F32, 128), b_tensor(&b, "blk.0.a", 1, ne_row, SP_QTYPE_F32, 0);
    b_align(&b, 32), b_zeros(&b, 256);
    CHECKF(gguf_mem(b.p, b.n, NULL) == SP_OK, "directory out of file order: %s", sp_last_error());

    b.n = 0, b_simple(&b, 2, ne2, SP_QTYPE_F32, 0, 63);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensor 'w' data [");
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "past end of file");
    b.n = 0, b_simple(&b, 2, ne2, SP_QTYPE_F32, 1 << 20, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensor 'w' data [");
    b.n = 0, b_simple(&b, 2, ne2, SP_QTYPE_F32, UINT64_MAX - 31, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "overflows");
    b.n = 0, b_simple(&b, 2, ne2, SP_QTYPE_F32, 4, 128);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensor 'w' offset 4 (field at");
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "not a multiple of the alignment 32");
    b.n = 0, b_simple(&b, 2, ne2, 99, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_UNSUPPORTED, "tensor 'w' has unknown type id 99");
    b.n = 0, b_simple(&b, 2, ne2, 4, 0, 64); /* Q4_2, removed from ggml long ago */
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_UNSUPPORTED, "unknown type id 4");
    b.n = 0, b_simple(&b, 0, ne2, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensor 'w' has n_dims = 0");
    const uint64_t ne5[5] = {8, 2, 1, 1, 1};
    b.n = 0, b_simple(&b, 5, ne5, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "tensor 'w' has n_dims = 5");
    const uint64_t neg[2] = {8, (uint64_t)-2};
    b.n = 0, b_simple(&b, 2, neg, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "negative dimension ne[1] = -2");
    const uint64_t huge[4] = {1u << 20, 1u << 20, 1u << 20, 1u << 20};
    b.n = 0, b_simple(&b, 4, huge, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "too many elements");
    const uint64_t wrap[4] = {UINT64_C(1) << 32, UINT64_C(1) << 32, 1, 1}; /* the product wraps to exactly 0 */
    b.n = 0, b_simple(&b, 4, wrap, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "too many elements");
    const uint64_t big_bytes[2] = {UINT64_C(1) << 40, UINT64_C(1) << 22};
    b.n = 0, b_simple(&b, 2, big_bytes, SP_QTYPE_F32, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "byte size overflows");
    const uint64_t ne_blk[2] = {40, 2};
    b.n = 0, b_simple(&b, 2, ne_blk, SP_QTYPE_Q8_0, 0, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "row length ne[0] = 40 is not a multiple of the Q8_0 block size 32");
    const uint64_t zero[2] = {0, 5};
    b.n = 0, b_simple(&b, 2, zero, SP_QTYPE_Q4_K, 0, 0);
    CHECKF(gguf_mem(b.p, b.n, NULL) == SP_OK, "zero-size tensor: %s", sp_last_error());

    /* Duplicate and empty tensor names. */
    b.n = 0, b_header(&b, 3, 2, 0);
    b_tensor(&b, "x", 2, ne2, SP_QTYPE_F32, 0), b_tensor(&b, "x", 2, ne2, SP_QTYPE_F32, 64);
    b_align(&b, 32), b_zeros(&b, 128);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "duplicate tensor name 'x' (tensor 1)");
    b.n = 0, b_header(&b, 3, 1, 0), b_tensor(&b, "", 2, ne2, SP_QTYPE_F32, 0), b_align(&b, 32), b_zeros(&b, 64);
    EXPECT_ERR(gguf_mem(b.p, b.n, NULL), SP_E_FORMAT, "the name of tensor 0 at offset 24 is empty");

    /* Through sp_model_file_open too: a model whose tensor data was cut off. */
    const char *tiny = tmp_path("tiny-cut.gguf");
    CHECK(write_tiny(tiny, "llama", NULL) == SP_OK);
    size_t n;
    uint8_t *p = read_whole(tiny, &n);
    SP_ASSERT(p);
    write_file(tiny, p, n - 100);
    EXPECT_ERR(sp_model_file_open(tiny, NULL, false, &mf), SP_E_FORMAT, "tensor 'token_embd.weight' data [");
    EXPECT_ERR(sp_model_file_open(tiny, NULL, false, &mf), SP_E_FORMAT, "tiny-cut.gguf");
    CHECK(mf == NULL);
    free(p);
    free(b.p);
}

/* ---- sweeps ---------------------------------------------------------------- */

/* Every prefix of a valid file either fails cleanly (with a message) or, once
 * all tensor bytes are present, succeeds; every single-byte change of the
 * header/metadata/directory never crashes and keeps the invariants. */
static void test_sweeps(void) {
    const char *path = tmp_path("sweep.gguf");
    CHECK(write_tiny(path, "llama", m_ctx_u8) == SP_OK);
    size_t n;
    uint8_t *p = read_whole(path, &n);
    SP_ASSERT(p);
    struct sp_model_file *mf = NULL;
    CHECK(gguf_mem(p, n, &mf) == SP_OK);
    if (!mf) {
        free(p);
        return;
    }
    uint64_t data_end = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) data_end = SP_MAX(data_end, mf->tensors[i].offset + mf->tensors[i].size);
    const uint64_t dir_end = mf->data_offset;
    sp_model_file_free(mf);

    int bad_prefix = 0, prefixes = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *q = malloc(len ? len : 1); /* an exact-size copy, so ASan sees any overread */
        memcpy(q, p, len);
        sp_err_clear();
        const sp_status rc = gguf_mem(q, len, NULL);
        const sp_status rc2 = model_mem(q, len, false, NULL);
        const bool want_ok = len >= data_end;
        if ((rc == SP_OK) != want_ok || (rc2 == SP_OK) != want_ok || (!want_ok && sp_last_error()[0] == '\0')) {
            if (bad_prefix++ < 5) fprintf(stderr, "prefix %zu: rc %d/%d msg '%s'\n", len, rc, rc2, sp_last_error());
        }
        prefixes++;
        free(q);
    }
    CHECKF(bad_prefix == 0, "%d of %d prefixes misbehaved", bad_prefix, prefixes);

    /* Single-byte changes over the header, metadata and directory. */
    static const uint8_t masks[] = {0x01, 0x80, 0xff, 0x7f};
    int runs = 0, accepted = 0;
    uint8_t *q = malloc(n);
    for (size_t i = 0; i < dir_end; i++) {
        for (size_t m = 0; m < SP_ARRAY_LEN(masks); m++) {
            memcpy(q, p, n);
            q[i] ^= masks[m];
            struct sp_model_file *g = NULL;
            sp_err_clear();
            sp_status rc = gguf_mem(q, n, &g);
            if (rc == SP_OK) {
                check_directory(g);
                sp_model_file_free(g);
                accepted++;
            } else {
                CHECKF(sp_last_error()[0] != '\0', "flip %zu^%02x failed without a message", i, masks[m]);
            }
            (void)model_mem(q, n, false, NULL);
            (void)model_mem(q, n, true, NULL);
            runs++;
        }
    }
    /* Random multi-byte damage, fixed seed. */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 20000; it++) {
        memcpy(q, p, n);
        const int k = 1 + (int)(s % 4);
        for (int j = 0; j < k; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            q[s % dir_end] = (uint8_t)(s >> 32);
        }
        struct sp_model_file *g = NULL;
        if (gguf_mem(q, n, &g) == SP_OK) {
            check_directory(g);
            sp_model_file_free(g);
        }
        (void)model_mem(q, n, it & 1, NULL);
        runs++;
    }
    free(q);
    printf("sweeps: %d prefixes of %zu bytes, %d mutated files (%d single flips accepted)\n", prefixes, n, runs, accepted);

    /* Seeds for the fuzzer, when asked. */
    const char *seeds = getenv("SPARROW_FUZZ_SEEDS");
    if (seeds && *seeds) {
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/tiny.gguf", seeds);
        write_file(sp, p, n);
        const char *rt = tmp_path("seed-rt.gguf");
        if (write_sample(rt, 0, 64) == SP_OK) {
            size_t m;
            uint8_t *r = read_whole(rt, &m);
            snprintf(sp, sizeof sp, "%s/sample.gguf", seeds);
            if (r) write_file(sp, r, m);
            free(r);
        }
    }
    free(p);
}

/* ---- file.c ------------------------------------------------------------------ */

static void test_file(void) {
    struct sp_file *f;
    const uint8_t data[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint8_t out[16];
    CHECK(sp_file_from_memory(data, sizeof data, &f) == SP_OK);
    CHECK(sp_file_size(f) == 10 && sp_file_fd(f) == -1 && strcmp(sp_file_path(f), "<memory>") == 0);
    CHECK(sp_file_read_at(f, 6, out, 4) == SP_OK && out[0] == 7 && out[3] == 10);
    CHECK(sp_file_read_at(f, 10, out, 0) == SP_OK);
    EXPECT_ERR(sp_file_read_at(f, 7, out, 4), SP_E_FORMAT, "'<memory>' truncated: 4 bytes at offset 7");
    EXPECT_ERR(sp_file_read_at(f, UINT64_MAX, out, 2), SP_E_FORMAT, "truncated");
    EXPECT_ERR(sp_file_read_at(f, 2, out, SIZE_MAX), SP_E_FORMAT, "truncated");
    sp_file_close(f);
    sp_file_close(NULL);

    const char *path = tmp_path("file.bin");
    write_file(path, data, sizeof data);
    CHECK(sp_file_open(path, &f) == SP_OK);
    CHECK(sp_file_size(f) == 10 && sp_file_fd(f) >= 0 && strcmp(sp_file_path(f), path) == 0);
    CHECK(sp_file_read_at(f, 0, out, 10) == SP_OK && memcmp(out, data, 10) == 0);
    EXPECT_ERR(sp_file_read_at(f, 9, out, 2), SP_E_FORMAT, "offset 9");
    sp_file_close(f);
    EXPECT_ERR(sp_file_open("/nonexistent/file", &f), SP_E_IO, "No such file or directory");
}

int main(void) {
    sp_log_set(quiet_log, NULL);
    test_file();
    test_fixtures();
    test_llama2c();
    test_vocab_only_files();
    test_writer();
    test_model_keys();
    test_corrupt();
    test_sweeps();
    for (int i = 0; i < n_tmp; i++) unlink(tmp_paths[i]);
    return test_report("test_gguf");
}
