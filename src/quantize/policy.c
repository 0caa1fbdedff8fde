/*
 * policy.c -- quantization policies: which element type each tensor gets.
 *
 * A policy is a list of "PATTERN TYPE" rules; the first rule whose glob
 * pattern matches a tensor's name wins.  The named policies below are written
 * in the same syntax a user's --policy-file uses, so there is one parser and
 * docs/QUANT.md can show them verbatim.  TYPE is any name sp_qtype_from_name
 * knows (Sparrow's native "i4_b64", or ggml's "Q8_0", "F16", ...) that a
 * weight can be quantized to and multiplied with.
 *
 * Not here: the exceptions every policy gets (1-D tensors stay F32, a tied
 * embedding follows the output head's rule): quantize.c applies those.
 */
#include "quantize.h"

#include "core/file.h"
#include "quant/native.h"
#include "quant/quant.h"

#include <fnmatch.h>
#include <stdio.h>

#define POLICY_MAX_BYTES ((uint64_t)1 << 20)
#define PATTERN_MAX 255

/* ---- the named policies ----------------------------------------------------
 * Native names are i<bits>[a|n]_b<block>[_e8|_l8] (src/quant/native.h).  Blocks of
 * 64 keep the padding of narrow rows small (stories260K's FFN is 172 wide:
 * three 64-blocks, against two 128-blocks) while the scale costs 0.25 bit
 * per weight.  The bits per weight quoted are Llama-7B's (Llama-3-8B's are
 * within 0.2); small models pay more for their norms and padded rows
 * (docs/QUANT.md). */

struct named_policy {
    const char *name;
    const char *about;
    const char *text;
};

static const struct named_policy named[] = {
    {"mem4", "~3.9 bpw: FFN gate/up 3-bit, other matrices 4-bit, output head 6-bit",
     "# mem4: precision where the model is sensitive\n"
     "output.weight        i6_b64\n"
     "token_embd.weight    i4_b64\n"
     "*ffn_gate_inp*       F32      # MoE router: never quantized\n"
     "*.attn_q.weight      i4_b64\n"
     "*.attn_k.weight      i4_b64\n"
     "*.attn_v.weight      i4_b64\n"
     "*.attn_output.weight i4_b64\n"
     "*.ffn_gate*          i3_b64\n"
     "*.ffn_up*            i3_b64\n"
     "*.ffn_down*          i4_b64\n"
     "*                    i4_b64\n"},
    {"mem4x", "~3.7 bpw: mem4 with exponent-only (E8M0) block scales",
     "# mem4x: mem4 with power-of-two block scales\n"
     "output.weight        i6_b64_e8\n"
     "token_embd.weight    i4_b64_e8\n"
     "*ffn_gate_inp*       F32\n"
     "*.attn_q.weight      i4_b64_e8\n"
     "*.attn_k.weight      i4_b64_e8\n"
     "*.attn_v.weight      i4_b64_e8\n"
     "*.attn_output.weight i4_b64_e8\n"
     "*.ffn_gate*          i3_b64_e8\n"
     "*.ffn_up*            i3_b64_e8\n"
     "*.ffn_down*          i4_b64_e8\n"
     "*                    i4_b64_e8\n"},
    {"mem4l", "~3.7 bpw: mem4 with 8-bit logarithmic (L8) block scales",
     "# mem4l: mem4 with one-byte scales in eighths of an octave\n"
     "output.weight        i6_b64_l8\n"
     "token_embd.weight    i4_b64_l8\n"
     "*ffn_gate_inp*       F32\n"
     "*.attn_q.weight      i4_b64_l8\n"
     "*.attn_k.weight      i4_b64_l8\n"
     "*.attn_v.weight      i4_b64_l8\n"
     "*.attn_output.weight i4_b64_l8\n"
     "*.ffn_gate*          i3_b64_l8\n"
     "*.ffn_up*            i3_b64_l8\n"
     "*.ffn_down*          i4_b64_l8\n"
     "*                    i4_b64_l8\n"},
    {"mem3", "~3.3 bpw: 3-bit, output head 4-bit",
     "# mem3: 3-bit weights, 4-bit output head\n"
     "output.weight        i4_b64\n"
     "token_embd.weight    i3_b64\n"
     "*ffn_gate_inp*       F32\n"
     "*                    i3_b64\n"},
    {"q4", "~4.5 bpw, quality first: non-uniform 4-bit in blocks of 32, attention K and V 6-bit",
     "# q4: the most accurate mix found for <= 4.5 bpw (docs/QUANT.md)\n"
     "*ffn_gate_inp*       F32\n"
     "token_embd.weight    i4n_b64_l8  # read by rows, the least sensitive: larger blocks\n"
     "*.attn_k.weight      i6_b64_l8   # the most sensitive per weight, and small with GQA\n"
     "*.attn_v.weight      i6_b64_l8   # the next most sensitive\n"
     "*                    i4n_b32_l8  # non-uniform levels, one-byte scales\n"},
    {"moe3", "MoE: routed experts 3-bit, attention, router, embeddings and output as q4",
     "# moe3: routed experts at 3 bits, what every token reads as q4 (docs/QUANT.md)\n"
     "*ffn_gate_inp*       F32         # routers, a shared expert's gate too: never quantized\n"
     "*_exps.weight        i3_b64      # routed experts: most of the bytes, each read by few tokens\n"
     "token_embd.weight    i4n_b64_l8\n"
     "*.attn_k.weight      i6_b64_l8\n"
     "*.attn_v.weight      i6_b64_l8\n"
     "*                    i4n_b32_l8  # attention Q and output, shared experts, output head\n"},
    {"q8", "~8.5 bpw: INT8 everywhere",
     "# q8: 8-bit weights everywhere\n"
     "*ffn_gate_inp*       F32\n"
     "*                    i8_b32\n"},
    {"f32", "32 bpw: nothing rounded, norms too (pruning or folding alone)",
     "# f32: every tensor as F32, so that only a cut or a fold changes the model\n"
     "*norm*               F32\n"
     "*                    F32\n"},
};

int32_t sp_quantize_n_policies(void) {
    return (int32_t)SP_ARRAY_LEN(named);
}

/* Name and one-line description of named policy i (static strings). */
sp_status sp_quantize_policy_info(int32_t i, const char **name, const char **about) {
    if (i < 0 || i >= sp_quantize_n_policies()) {
        return sp_err(SP_E_INVALID, "%s: policy index %d out of range", __func__, (int)i);
    }
    if (name) *name = named[i].name;
    if (about) *about = named[i].about;
    return SP_OK;
}

const char *sp_qpolicy_text(int32_t i) {
    return i >= 0 && i < sp_quantize_n_policies() ? named[i].text : NULL;
}

/* ---- parsing ------------------------------------------------------------------ */

void sp_qpolicy_free(struct sp_qpolicy *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->n_rules; i++) sp_free(p->rules[i].pattern);
    sp_free(p->rules);
    sp_free(p->origin);
    sp_free(p);
}

static bool is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Can weights be stored as type t and multiplied by the forward pass? */
static bool weight_type_ok(uint32_t t) {
    if (sp_qtype_is_native(t)) return true;
    const struct sp_qtraits *tr = sp_qtraits_get(t);
    return tr && tr->from_float && tr->vec_dot;
}

/* Split one line (n bytes, no newline) into up to 3 fields; returns the count. */
static int split_fields(const char *s, size_t n, const char *f[3], size_t flen[3]) {
    int nf = 0;
    size_t i = 0;
    while (i < n && s[i] != '#') {
        while (i < n && is_blank(s[i])) i++;
        if (i >= n || s[i] == '#') break;
        const size_t b = i;
        while (i < n && !is_blank(s[i]) && s[i] != '#') i++;
        if (nf < 3) {
            f[nf] = s + b;
            flen[nf] = i - b;
        }
        nf++;
    }
    return nf;
}

static sp_status add_rule(struct sp_qpolicy *p, const char *pat, size_t plen, uint32_t type, uint32_t line) {
    struct sp_qrule *r = sp_realloc(p->rules, (size_t)(p->n_rules + 1) * sizeof(*r));
    if (!r) return sp_err(SP_E_NOMEM, "sp_qpolicy_parse: out of memory");
    p->rules = r;
    char *copy = sp_strndup(pat, plen);
    if (!copy) return sp_err(SP_E_NOMEM, "sp_qpolicy_parse: out of memory");
    p->rules[p->n_rules++] = (struct sp_qrule){.pattern = copy, .type = type, .line = line};
    return SP_OK;
}

/* Parse rules; see quantize.h for the syntax and the errors. */
sp_status sp_qpolicy_parse(const char *text, size_t len, const char *origin, struct sp_qpolicy **out) {
    *out = NULL;
    if (!origin) origin = "policy";
    struct sp_qpolicy *p = sp_calloc(1, sizeof(*p));
    if (!p || !(p->origin = sp_strdup(origin))) {
        sp_free(p);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    snprintf(p->name, sizeof p->name, "file");
    sp_status rc = SP_OK;
    uint32_t line = 0;
    for (size_t pos = 0; pos < len;) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        const size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + (nl ? 1 : 0);
        line++;
        if (memchr(s, '\0', n)) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: NUL byte (not a text file?)", __func__, origin, line);
            goto fail;
        }
        const char *f[3];
        size_t fl[3];
        const int nf = split_fields(s, n, f, fl);
        if (nf == 0) continue;
        if (nf != 2) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: expected 'PATTERN TYPE', found %d field%s", __func__, origin,
                        line, nf, nf == 1 ? "" : "s");
            goto fail;
        }
        if (fl[0] > PATTERN_MAX) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: pattern longer than %d bytes", __func__, origin, line,
                        PATTERN_MAX);
            goto fail;
        }
        char tname[64];
        if (fl[1] >= sizeof tname) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: unknown type '%.*s...'", __func__, origin, line, 32, f[1]);
            goto fail;
        }
        memcpy(tname, f[1], fl[1]);
        tname[fl[1]] = '\0';
        const int32_t t = sp_qtype_from_name(tname);
        if (t < 0) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: unknown type '%s' (native i3/i4/i6/i8 types such as i4_b64, "
                        "or ggml's F32, F16, BF16, Q8_0, Q4_0, Q4_K, ...)", __func__, origin, line, tname);
            goto fail;
        }
        if (!weight_type_ok((uint32_t)t)) {
            rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: type '%s' cannot hold weights (no quantizer or no dot "
                        "product)", __func__, origin, line, tname);
            goto fail;
        }
        if ((rc = add_rule(p, f[0], fl[0], (uint32_t)t, line))) goto fail;
    }
    if (p->n_rules == 0) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' line %u: no rules (lines are 'PATTERN TYPE', e.g. '* i4_b64')", __func__,
                    origin, line);
        goto fail;
    }
    *out = p;
    return SP_OK;
fail:
    sp_qpolicy_free(p);
    return rc;
}

/* Read path whole (bounded) and parse it. */
sp_status sp_qpolicy_load(const char *path, struct sp_qpolicy **out) {
    *out = NULL;
    struct sp_file *f = NULL;
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    const uint64_t size = sp_file_size(f);
    char *buf = NULL;
    if (size > POLICY_MAX_BYTES) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' is %llu bytes; a policy file is at most %llu", __func__, path,
                    (unsigned long long)size, (unsigned long long)POLICY_MAX_BYTES);
    } else if (!(buf = sp_malloc((size_t)size + 1))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    } else if (!(rc = sp_file_read_at(f, 0, buf, (size_t)size))) {
        rc = sp_qpolicy_parse(buf, (size_t)size, path, out);
    }
    sp_free(buf);
    sp_file_close(f);
    return rc;
}

sp_status sp_qpolicy_named(const char *name, struct sp_qpolicy **out) {
    *out = NULL;
    for (size_t i = 0; name && i < SP_ARRAY_LEN(named); i++) {
        if (strcmp(named[i].name, name) != 0) continue;
        char origin[64];
        snprintf(origin, sizeof origin, "policy %s", named[i].name);
        sp_status rc = sp_qpolicy_parse(named[i].text, strlen(named[i].text), origin, out);
        if (rc) return rc; /* a native type the build lacks: the message names it */
        snprintf((*out)->name, sizeof (*out)->name, "%s", named[i].name);
        return SP_OK;
    }
    char list[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < SP_ARRAY_LEN(named) && n < sizeof list; i++) {
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", named[i].name);
    }
    return sp_err(SP_E_INVALID, "sp_quantize: unknown policy '%s' (known: %s)", name ? name : "", list);
}

const struct sp_qrule *sp_qpolicy_match(const struct sp_qpolicy *p, const char *name) {
    for (uint32_t i = 0; i < p->n_rules; i++) {
        if (fnmatch(p->rules[i].pattern, name, 0) == 0) return &p->rules[i];
    }
    return NULL;
}
