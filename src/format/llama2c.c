/*
 * llama2c.c -- imports karpathy/llama2.c checkpoints: the legacy (version 0)
 * .bin written by export.py / the original run.c layout, and tokenizer.bin.
 * The layout is in llama2c.h.  Tensors are described under their GGUF names
 * and shapes (ggml order: a (rows=out, cols=in) matrix has ne = {in, out}),
 * so that the rest of the engine cannot tell the two formats apart; the
 * vocabulary is rewritten the way llama.cpp's convert-llama2c-to-ggml does
 * (U+2581 for spaces, "<s>"/"</s>" control tokens, byte tokens typed).
 * No tensor data is read here, and nothing is computed from it.
 */
#include "llama2c.h"

#include "quant/quant.h"

#include <stdio.h>

#define L2C_HEADER_BYTES 28
#define L2C_TOKENIZER_MAX_BYTES ((uint64_t)1 << 30) /* a tokenizer.bin is a few MB at most */

static int32_t le_i32(const uint8_t *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

/* One tensor kind of the checkpoint, in file order. */
struct l2c_kind {
    const char *name;   /* "blk.%u.attn_q.weight" or a global name */
    bool per_layer;
    uint64_t ne0, ne1;  /* ggml order: ne0 = row length (input), ne1 = rows (output); ne1 = 1 for vectors */
};

/* x = a * b, failing on overflow. */
static bool mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
    uint64_t t;
    return !sp_mul_overflow_u64(a, b, &t) && !sp_mul_overflow_u64(t, c, out);
}

/* Fill mf from the llama2.c checkpoint f (see llama2c.h).  Validates the
 * config and, unless vocab_only, that the file size is exactly what the
 * config implies with or without the freq_cis tables (shared classifier when
 * vocab_size > 0, else a trailing wcls).  Returns SP_OK, SP_E_FORMAT
 * (message names the path, the config and the expected sizes),
 * SP_E_UNSUPPORTED (the newer "ak42" export versions), SP_E_IO, SP_E_NOMEM. */
sp_status sp_llama2c_read(struct sp_file *f, struct sp_model_file *mf, bool vocab_only) {
    const char *path = sp_file_path(f);
    const uint64_t size = sp_file_size(f);
    uint8_t hdr[L2C_HEADER_BYTES];
    sp_status rc;

    mf->kind = SP_FILE_LLAMA2C;
    mf->version = 0;
    mf->file_size = size;
    mf->alignment = 1;
    mf->data_offset = L2C_HEADER_BYTES;
    if (size < L2C_HEADER_BYTES) {
        return sp_err(SP_E_FORMAT, "%s: '%s' (%llu bytes) is neither GGUF nor a llama2.c checkpoint: too short for the %d-byte config",
                      __func__, path, (unsigned long long)size, L2C_HEADER_BYTES);
    }
    if ((rc = sp_file_read_at(f, 0, hdr, sizeof hdr))) return rc;
    if (memcmp(hdr, "24ka", 4) == 0) { /* uint32 0x616b3432 "ak42", then an int version */
        return sp_err(SP_E_UNSUPPORTED, "%s: '%s' is a llama2.c export of version %d; only the legacy version-0 .bin is supported",
                      __func__, path, le_i32(hdr + 4));
    }
    const int32_t dim = le_i32(hdr), hidden = le_i32(hdr + 4), n_layers = le_i32(hdr + 8), n_heads = le_i32(hdr + 12),
                  n_kv_heads = le_i32(hdr + 16), vocab_raw = le_i32(hdr + 20), seq_len = le_i32(hdr + 24);
    if (dim <= 0 || hidden <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_kv_heads > n_heads ||
        n_heads % n_kv_heads != 0 || dim % n_heads != 0 || (dim / n_heads) % 2 != 0 || vocab_raw == 0 ||
        vocab_raw == INT32_MIN || seq_len <= 0 || (uint32_t)seq_len > SP_MAX_CTX_TRAIN) {
        return sp_err(SP_E_FORMAT,
                      "%s: '%s' is neither GGUF nor a valid llama2.c checkpoint: config dim=%d hidden_dim=%d n_layers=%d "
                      "n_heads=%d n_kv_heads=%d vocab_size=%d seq_len=%d is inconsistent",
                      __func__, path, dim, hidden, n_layers, n_heads, n_kv_heads, vocab_raw, seq_len);
    }
    const bool shared = vocab_raw > 0;
    const uint64_t D = (uint64_t)dim, H = (uint64_t)hidden, L = (uint64_t)n_layers, V = (uint64_t)(shared ? vocab_raw : -vocab_raw);
    const uint64_t head_size = D / (uint64_t)n_heads, KV = head_size * (uint64_t)n_kv_heads;

    /* Tensor kinds in file order; freq_cis (seq_len x head_size/2, twice) sits before wcls. */
    const struct l2c_kind kinds[] = {
        {"token_embd.weight", false, D, V},
        {"blk.%u.attn_norm.weight", true, D, 1},
        {"blk.%u.attn_q.weight", true, D, D},
        {"blk.%u.attn_k.weight", true, D, KV},
        {"blk.%u.attn_v.weight", true, D, KV},
        {"blk.%u.attn_output.weight", true, D, D},
        {"blk.%u.ffn_norm.weight", true, D, 1},
        {"blk.%u.ffn_gate.weight", true, D, H}, /* w1 */
        {"blk.%u.ffn_down.weight", true, H, D}, /* w2 */
        {"blk.%u.ffn_up.weight", true, D, H},   /* w3 */
        {"output_norm.weight", false, D, 1},
    };
    uint64_t body = 0; /* bytes of the tensors above */
    bool ok = true;
    for (size_t k = 0; k < SP_ARRAY_LEN(kinds); k++) {
        uint64_t b;
        ok = ok && mul3(kinds[k].ne0 * 4, kinds[k].ne1, kinds[k].per_layer ? L : 1, &b) && !sp_add_overflow_u64(body, b, &body);
    }
    uint64_t freq_bytes = 0, wcls_bytes = 0, base = 0;
    ok = ok && mul3((uint64_t)seq_len, head_size / 2 * 2, 4, &freq_bytes);
    ok = ok && mul3(V, D, shared ? 0 : 4, &wcls_bytes);
    ok = ok && !sp_add_overflow_u64(body, L2C_HEADER_BYTES, &base) && !sp_add_overflow_u64(base, wcls_bytes, &base);
    uint64_t with_freq = 0;
    ok = ok && !sp_add_overflow_u64(base, freq_bytes, &with_freq);
    const char *cfg_fmt = "dim=%d hidden_dim=%d n_layers=%d n_heads=%d n_kv_heads=%d vocab_size=%d seq_len=%d";
    char cfg[256];
    snprintf(cfg, sizeof cfg, cfg_fmt, dim, hidden, n_layers, n_heads, n_kv_heads, vocab_raw, seq_len);
    if (!ok) return sp_err(SP_E_FORMAT, "%s: '%s': llama2.c config (%s) describes an impossibly large model", __func__, path, cfg);
    if (!vocab_only && size != base && size != with_freq) {
        return sp_err(SP_E_FORMAT,
                      "%s: '%s': llama2.c checkpoint is %llu bytes, but its config (%s, %s classifier) implies %llu "
                      "bytes, or %llu with the freq_cis tables",
                      __func__, path, (unsigned long long)size, cfg, shared ? "shared" : "separate",
                      (unsigned long long)base, (unsigned long long)with_freq);
    }

    struct sp_hparams *hp = &mf->hp;
    memset(hp, 0, sizeof(*hp));
    hp->arch = SP_ARCH_LLAMA;
    hp->n_vocab = (uint32_t)V;
    hp->n_ctx_train = (uint32_t)seq_len;
    hp->n_embd = (uint32_t)dim;
    hp->n_layers = (uint32_t)n_layers;
    hp->n_heads = (uint32_t)n_heads;
    hp->n_kv_heads = (uint32_t)n_kv_heads;
    hp->head_dim_k = hp->head_dim_v = (uint32_t)head_size;
    hp->n_ff = (uint32_t)hidden;
    hp->rope_theta = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rope_dims = (uint32_t)head_size;
    hp->rope_neox = false; /* llama2.c rotates adjacent pairs */
    hp->rms_eps = 1e-5f;
    mf->has_hparams = true;
    if (vocab_only) return SP_OK;

    /* ---- tensor directory, in file order ---- */
    const uint64_t n_tensors = 2 + 9 * L + (shared ? 0 : 1);
    if (n_tensors > UINT32_MAX) return sp_err(SP_E_FORMAT, "%s: '%s': too many layers (%d)", __func__, path, n_layers);
    mf->tensors = sp_calloc((size_t)n_tensors, sizeof(*mf->tensors));
    if (!mf->tensors) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    uint64_t off = L2C_HEADER_BYTES;
    for (size_t k = 0; k < SP_ARRAY_LEN(kinds) + 1; k++) {
        struct l2c_kind kd;
        if (k < SP_ARRAY_LEN(kinds)) {
            kd = kinds[k];
        } else if (!shared) {
            kd = (struct l2c_kind){"output.weight", false, D, V}; /* wcls, after the freq_cis tables if present */
            if (size == with_freq) off += freq_bytes;
        } else {
            break;
        }
        const uint64_t n_rep = kd.per_layer ? L : 1;
        for (uint64_t il = 0; il < n_rep; il++) {
            struct sp_tensor_desc *t = &mf->tensors[mf->n_tensors];
            char name[64];
            if (kd.per_layer) {
                snprintf(name, sizeof name, kd.name, (unsigned)il);
            } else {
                snprintf(name, sizeof name, "%s", kd.name);
            }
            if (!(t->name = sp_strdup(name))) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            mf->n_tensors++;
            t->type = SP_QTYPE_F32;
            t->n_dims = kd.ne1 == 1 ? 1 : 2;
            t->ne[0] = (int64_t)kd.ne0;
            t->ne[1] = (int64_t)kd.ne1;
            t->ne[2] = t->ne[3] = 1;
            t->size = kd.ne0 * kd.ne1 * 4; /* no overflow: checked above */
            t->offset = off;
            off += t->size;
        }
    }
    SP_ASSERT(off <= size);
    return SP_OK;
}

/* ---- tokenizer.bin ---------------------------------------------------- */

/* "<0xHH>" with two uppercase hex digits, as llama2.c exports byte tokens. */
static bool is_byte_token(const uint8_t *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    for (int i = 3; i < 5; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'A' && s[i] <= 'F'))) return false;
    }
    return true;
}

/* Copy n bytes of s with every ' ' replaced by U+2581 (3 bytes). */
static char *escape_spaces(const uint8_t *s, size_t n, uint32_t *out_len) {
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    const size_t len = n + 2 * spaces;
    char *d = sp_malloc(len + 1);
    if (!d) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(d + j, "\xe2\x96\x81", 3);
            j += 3;
        } else {
            d[j++] = (char)s[i];
        }
    }
    d[j] = '\0';
    *out_len = (uint32_t)len;
    return d;
}

/* Read a llama2.c tokenizer.bin at path into mf->vocab (which must be
 * empty): an SPM vocabulary with the token texts and types llama.cpp's
 * converter writes (id 0 "<unk>" unknown, ids 1/2 "<s>"/"</s>" control,
 * empty texts control, "<0xHH>" byte, others normal; spaces become U+2581),
 * the file's scores, and llama.cpp's SPM defaults (bos 1, eos 2, unk 0, add
 * BOS, add a space prefix).  With hyper-parameters, the file must hold
 * exactly hp.n_vocab tokens and nothing after them; without, it is read to
 * its end.  Sets mf->tokenizer_path.  Returns SP_OK, SP_E_IO, SP_E_FORMAT
 * (message names the path, the token id and the offset), SP_E_NOMEM. */
sp_status sp_llama2c_read_tokenizer(const char *path, struct sp_model_file *mf) {
    struct sp_file *f = NULL;
    uint8_t *buf = NULL;
    struct sp_vocab_data *vd = &mf->vocab;
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    const uint64_t size = sp_file_size(f);
    if (size < 4) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' truncated: %llu bytes, the max_token_length field needs 4", __func__, path,
                    (unsigned long long)size);
        goto done;
    }
    if (size > L2C_TOKENIZER_MAX_BYTES) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' is %llu bytes, too large for a llama2.c tokenizer", __func__, path, (unsigned long long)size);
        goto done;
    }
    buf = sp_malloc((size_t)size);
    if (!buf) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    if ((rc = sp_file_read_at(f, 0, buf, (size_t)size))) goto done;
    if (le_i32(buf) < 0) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s': negative max_token_length %d at offset 0", __func__, path, le_i32(buf));
        goto done;
    }

    /* Every token is at least 8 bytes (score + length), which bounds the count. */
    const uint64_t max_tokens = (size - 4) / 8;
    uint64_t want = mf->has_hparams ? mf->hp.n_vocab : max_tokens;
    if (mf->has_hparams && want > max_tokens) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' truncated: %llu bytes cannot hold the model's %llu tokens", __func__, path,
                    (unsigned long long)size, (unsigned long long)want);
        goto done;
    }
    if (want > UINT32_MAX) want = UINT32_MAX;
    vd->kind = SP_VOCAB_SPM;
    vd->tokens = sp_calloc((size_t)SP_MAX(want, 1), sizeof(*vd->tokens));
    vd->token_len = sp_calloc((size_t)SP_MAX(want, 1), sizeof(*vd->token_len));
    vd->scores = sp_calloc((size_t)SP_MAX(want, 1), sizeof(*vd->scores));
    vd->types = sp_calloc((size_t)SP_MAX(want, 1), sizeof(*vd->types));
    vd->pre = sp_strdup("");
    if (!vd->tokens || !vd->token_len || !vd->scores || !vd->types || !vd->pre) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    uint64_t pos = 4;
    while (vd->n_tokens < want && (mf->has_hparams || pos < size)) {
        const uint32_t id = vd->n_tokens;
        if (size - pos < 8) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' truncated: token %u needs its score and length at offset %llu, the file ends at %llu",
                        __func__, path, id, (unsigned long long)pos, (unsigned long long)size);
            goto done;
        }
        float score;
        uint32_t bits = (uint32_t)le_i32(buf + pos);
        memcpy(&score, &bits, 4);
        const int32_t len = le_i32(buf + pos + 4);
        pos += 8;
        if (len < 0 || (uint64_t)len > size - pos) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': token %u has length %d at offset %llu, but %llu bytes are left", __func__, path, id,
                        len, (unsigned long long)(pos - 4), (unsigned long long)(size - pos));
            goto done;
        }
        const uint8_t *s = buf + pos;
        if (memchr(s, 0, (size_t)len)) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s': token %u at offset %llu contains a NUL byte", __func__, path, id, (unsigned long long)pos);
            goto done;
        }
        pos += (uint64_t)len;
        int32_t type = SP_TOKEN_NORMAL;
        const char *fixed = NULL;
        if (id == 0) {
            fixed = "<unk>";
            type = SP_TOKEN_UNKNOWN;
        } else if (id == 1) {
            fixed = "<s>"; /* stored as "\n<s>\n" */
            type = SP_TOKEN_CONTROL;
        } else if (id == 2) {
            fixed = "</s>";
            type = SP_TOKEN_CONTROL;
        } else if (len == 0) {
            type = SP_TOKEN_CONTROL;
        } else if (is_byte_token(s, (size_t)len)) {
            type = SP_TOKEN_BYTE;
        }
        if (fixed) {
            vd->tokens[id] = sp_strdup(fixed);
            vd->token_len[id] = (uint32_t)strlen(fixed);
        } else {
            vd->tokens[id] = escape_spaces(s, (size_t)len, &vd->token_len[id]);
        }
        if (!vd->tokens[id]) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            goto done;
        }
        vd->scores[id] = score;
        vd->types[id] = type;
        vd->n_tokens++;
    }
    if (pos != size) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s': %llu bytes left after the model's %u tokens at offset %llu (a tokenizer for another model?)",
                    __func__, path, (unsigned long long)(size - pos), vd->n_tokens, (unsigned long long)pos);
        goto done;
    }
    if (vd->n_tokens == 0) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' holds no tokens", __func__, path);
        goto done;
    }
    vd->bos = vd->n_tokens > 1 ? 1 : -1;
    vd->eos = vd->n_tokens > 2 ? 2 : -1;
    vd->unk = 0;
    vd->pad = vd->eot = -1;
    vd->add_bos = true;
    vd->add_eos = false;
    vd->add_space_prefix = true;
    sp_free(mf->tokenizer_path);
    if (!(mf->tokenizer_path = sp_strdup(path))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    rc = SP_OK;

done:
    sp_free(buf);
    sp_file_close(f);
    return rc;
}
