/*
 * pretok.c -- BPE pre-tokenizers: tokenizer.ggml.pre name -> the list of
 * regexes llama.cpp applies (llm_tokenizer_bpe constructor and the name table
 * in llama_vocab::impl::load, src/llama-vocab.cpp), compiled once with PCRE2
 * (UTF + UCP) and run per call with per-call match data.
 *
 * Semantics follow llama.cpp's unicode_regex_split (src/unicode.cpp): each
 * regex splits every current piece into its matches and the gaps between
 * them, searching inside the piece only (lookaheads and $ stop at its end).
 * llama.cpp runs std::regex (ECMAScript) on a text whose non-ASCII code points
 * are collapsed to one byte per Unicode category, or hand-written splitters
 * for the GPT-2 and Llama-3 patterns; PCRE2 on the real code points gives the
 * same splits once \s means the Unicode White_Space set (PCRE2's \s also takes
 * U+180E), \d means [0-9], and $ matches only at the very end.  Left out:
 * pre-tokenizers llama.cpp handles with custom code (kimi-k2, afmoe), the
 * non-byte-level ones (gemma4, sarvam-moe, whitespace) and tiny_aya (\b).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"

#include <pcre2.h>
#include <string.h>

/* ---- the regexes, as llama.cpp writes them (non-ASCII as \x{...}) ------- */

#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)  (llama.cpp: custom gpt2 splitter) */
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

/* llama.cpp: custom llama3 splitter */
static const char RE_LLAMA3[] = RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char RE_QWEN2[] = RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char RE_QWEN35[] = RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
                                                "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char RE_JAIS2[] = RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                               "\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|"
                                               "\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|"
                                               "\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";

/* Letters of the cased categories DeepSeek's tokenizer.json lists. */
static const char RE_DEEPSEEK_LLM_LETTERS[] =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+";

#define RE_CJK_DEEPSEEK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
/* " ?[^(\s|.,!?…。，、।۔،)]+" */
#define RE_BLOOM " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"

static const char RE_TEKKEN[] = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
                                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
                                "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char RE_GPT4O[] = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?|"
                               "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?|"
                               "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char RE_DEEPSEEK3_MAIN[] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                        "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                        "\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

#define MAX_RE 6

enum pre_set {
    PRE_DEFAULT = 0,
    PRE_GPT2,
    PRE_LLAMA3,
    PRE_QWEN2,
    PRE_QWEN35,
    PRE_JAIS2,
    PRE_DEEPSEEK_LLM,
    PRE_DEEPSEEK_CODER,
    PRE_DEEPSEEK3,
    PRE_FALCON,
    PRE_STARCODER,
    PRE_BLOOM,
    PRE_VIKING,
    PRE_TEKKEN,
    PRE_CHAMELEON,
    PRE_GPT4O,
    PRE_BAILINGMOE,
    PRE_SEED_CODER,
    PRE_UFAKZEKA,
    PRE_LAGUNA,
    PRE_MINICPM5,
    PRE_SUPERBPE,
    PRE_SET_COUNT
};

static const char *const k_sets[PRE_SET_COUNT][MAX_RE + 1] = {
    [PRE_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
    [PRE_GPT2] = {RE_GPT2, NULL},
    [PRE_LLAMA3] = {RE_LLAMA3, NULL},
    [PRE_QWEN2] = {RE_QWEN2, NULL},
    [PRE_QWEN35] = {RE_QWEN35, NULL},
    [PRE_JAIS2] = {RE_JAIS2, NULL},
    [PRE_DEEPSEEK_LLM] = {"[\r\n]", RE_DEEPSEEK_LLM_LETTERS,
                          "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
                          "\\s+$", RE_CJK_DEEPSEEK, "\\p{N}+", NULL},
    [PRE_DEEPSEEK_CODER] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_DEEPSEEK, "\\p{N}", NULL},
    [PRE_DEEPSEEK3] = {"\\p{N}{1,3}", RE_CJK_KANA, RE_DEEPSEEK3_MAIN, NULL},
    [PRE_FALCON] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL},
    [PRE_STARCODER] = {"\\p{N}", RE_GPT2, NULL},
    [PRE_BLOOM] = {RE_BLOOM, NULL},
    [PRE_VIKING] = {RE_BLOOM, "\\p{N}", NULL},
    [PRE_TEKKEN] = {RE_TEKKEN, NULL},
    [PRE_CHAMELEON] = {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
                       "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2, NULL},
    [PRE_GPT4O] = {RE_GPT4O, NULL},
    [PRE_BAILINGMOE] = {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
                        NULL},
    [PRE_SEED_CODER] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                                        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                        NULL},
    [PRE_UFAKZEKA] = {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                      NULL},
    [PRE_LAGUNA] = {"[^\\n]+|[\\n]+", RE_QWEN2, NULL},
    [PRE_MINICPM5] = {"\\p{N}{1,3}",
                      RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                      NULL},
    [PRE_SUPERBPE] = {"\\p{N}+", "(?=(\\d{3})+(?!\\d))", NULL},
};

#define F_IGNORE_MERGES 1u
#define F_NO_BOS 2u

/* tokenizer.ggml.pre -> regex set, as llama_vocab::impl::load maps them. */
static const struct {
    const char *name;
    enum pre_set set;
    unsigned flags;
} k_names[] = {
    {"default", PRE_DEFAULT, 0},
    {"llama3", PRE_LLAMA3, F_IGNORE_MERGES},
    {"llama-v3", PRE_LLAMA3, F_IGNORE_MERGES},
    {"llama-bpe", PRE_LLAMA3, F_IGNORE_MERGES},
    {"falcon3", PRE_LLAMA3, F_IGNORE_MERGES},
    {"falcon-h1", PRE_LLAMA3, F_IGNORE_MERGES},
    {"pixtral", PRE_LLAMA3, F_IGNORE_MERGES},
    {"midm-2.0", PRE_LLAMA3, F_IGNORE_MERGES},
    {"lfm2", PRE_LLAMA3, F_IGNORE_MERGES},
    {"jina-v5-nano", PRE_LLAMA3, F_IGNORE_MERGES},
    {"dbrx", PRE_LLAMA3, 0},
    {"smaug-bpe", PRE_LLAMA3, 0},
    {"deepseek-llm", PRE_DEEPSEEK_LLM, 0},
    {"deepseek-coder", PRE_DEEPSEEK_CODER, 0},
    {"deepseek-v3", PRE_DEEPSEEK3, 0},
    {"hunyuan-dense", PRE_DEEPSEEK3, 0},
    {"joyai-llm", PRE_DEEPSEEK3, 0},
    {"hy_v4", PRE_DEEPSEEK3, 0},
    {"falcon", PRE_FALCON, 0},
    {"mpt", PRE_GPT2, 0},
    {"olmo", PRE_GPT2, 0},
    {"jais", PRE_GPT2, 0},
    {"trillion", PRE_GPT2, 0},
    {"granite-docling", PRE_GPT2, 0},
    {"gpt-2", PRE_GPT2, 0},
    {"phi-2", PRE_GPT2, 0},
    {"jina-es", PRE_GPT2, 0},
    {"jina-de", PRE_GPT2, 0},
    {"gigachat", PRE_GPT2, 0},
    {"jina-v2-es", PRE_GPT2, 0},
    {"jina-v2-de", PRE_GPT2, 0},
    {"a.x-4.0", PRE_GPT2, 0},
    {"mellum", PRE_GPT2, 0},
    {"modern-bert", PRE_GPT2, 0},
    {"jina-v1-en", PRE_GPT2, 0},
    {"jina-v2-code", PRE_GPT2, 0},
    {"roberta-bpe", PRE_GPT2, 0},
    {"exaone4", PRE_GPT2, 0},
    {"jais-2", PRE_JAIS2, 0},
    {"starcoder", PRE_STARCODER, 0},
    {"refact", PRE_STARCODER, 0},
    {"command-r", PRE_STARCODER, 0},
    {"smollm", PRE_STARCODER, 0},
    {"codeshell", PRE_STARCODER, 0},
    {"exaone", PRE_STARCODER, 0},
    {"minerva-7b", PRE_STARCODER, 0},
    {"mellum2", PRE_STARCODER, 0},
    {"qwen2", PRE_QWEN2, 0},
    {"deepseek-r1-qwen", PRE_QWEN2, 0},
    {"kormo", PRE_QWEN2, 0},
    {"f2llmv2", PRE_QWEN2, 0},
    {"megrez", PRE_QWEN2, 0},
    {"stablelm2", PRE_QWEN2, 0},
    {"hunyuan", PRE_QWEN2, 0},
    {"solar-open", PRE_QWEN2, 0},
    {"grok-2", PRE_QWEN2, 0},
    {"qwen35", PRE_QWEN35, 0},
    {"poro-chat", PRE_BLOOM, 0},
    {"bloom", PRE_BLOOM, 0},
    {"gpt3-finnish", PRE_BLOOM, 0},
    {"chatglm-bpe", PRE_LLAMA3, F_NO_BOS},
    {"glm4", PRE_LLAMA3, F_NO_BOS},
    {"viking", PRE_VIKING, 0},
    {"tekken", PRE_TEKKEN, F_IGNORE_MERGES},
    {"chameleon", PRE_CHAMELEON, 0},
    {"gpt-4o", PRE_GPT4O, 0},
    {"llama4", PRE_GPT4O, 0},
    {"kanana2", PRE_GPT4O, 0},
    {"talkie", PRE_GPT4O, 0},
    {"minimax-m2", PRE_GPT4O, 0},
    {"bailingmoe", PRE_BAILINGMOE, 0},
    {"bailingmoe2", PRE_BAILINGMOE, 0},
    {"llada-moe", PRE_BAILINGMOE, 0},
    {"seed-coder", PRE_SEED_CODER, 0},
    {"ufakzeka", PRE_UFAKZEKA, 0},
    {"laguna", PRE_LAGUNA, 0},
    {"minicpm5", PRE_MINICPM5, F_IGNORE_MERGES},
    {"superbpe", PRE_SUPERBPE, 0},
};

/* ---- compiling ------------------------------------------------------------ */

struct sp_pretok {
    pcre2_general_context *gctx; /* routes PCRE2's heap through sp_malloc */
    pcre2_compile_context *cctx;
    pcre2_code *re[MAX_RE];
    uint32_t n_re;
};

static void *pcre_alloc(PCRE2_SIZE n, void *u) {
    (void)u;
    return sp_malloc(n);
}

static void pcre_dealloc(void *p, void *u) {
    (void)u;
    sp_free(p);
}

/* Unicode White_Space, the set llama.cpp's tables call whitespace. */
#define WS_BODY "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Rewrite llama.cpp's ECMAScript-flavoured pattern for PCRE2: \s and \S by
 * the White_Space set, \d and \D as ASCII digits.  Returns a sp_malloc'd
 * string or NULL. */
static char *translate(const char *re) {
    size_t cap = strlen(re) * 8 + 64, n = 0;
    for (const char *p = re; *p; p++)
        if (*p == '\\') cap += sizeof(WS_BODY) + 4;
    char *o = sp_malloc(cap);
    if (!o) return NULL;
#define PUT(s)                                                                                                         \
    do {                                                                                                               \
        const size_t k_ = strlen(s);                                                                                   \
        memcpy(o + n, s, k_);                                                                                          \
        n += k_;                                                                                                       \
    } while (0)
    bool inside = false;
    for (size_t i = 0; re[i]; i++) {
        const char c = re[i];
        if (c == '\\' && re[i + 1]) {
            const char e = re[++i];
            if (e == 's') {
                PUT(inside ? WS_BODY : "[" WS_BODY "]");
            } else if (e == 'S' && !inside) {
                PUT("[^" WS_BODY "]");
            } else if (e == 'd') {
                PUT(inside ? "0-9" : "[0-9]");
            } else if (e == 'D' && !inside) {
                PUT("[^0-9]");
            } else {
                o[n++] = '\\';
                o[n++] = e;
            }
            continue;
        }
        if (c == '[' && !inside) {
            inside = true;
        } else if (c == ']' && inside) {
            inside = false;
        }
        o[n++] = c;
    }
#undef PUT
    o[n] = '\0';
    return o;
}

/* Compile the set for name; see tok_internal.h. */
sp_status sp_pretok_init(const char *name, struct sp_pretok **out, struct sp_pretok_info *info) {
    *out = NULL;
    memset(info, 0, sizeof *info);
    const char *key = (name && *name) ? name : "default";
    int found = -1;
    for (size_t i = 0; i < SP_ARRAY_LEN(k_names); i++) {
        if (strcmp(k_names[i].name, key) == 0) {
            found = (int)i;
            break;
        }
    }
    if (found < 0) return sp_err(SP_E_UNSUPPORTED, "%s: unknown pre-tokenizer type: '%s'", __func__, key);
    info->ignore_merges = (k_names[found].flags & F_IGNORE_MERGES) != 0;
    info->no_bos = (k_names[found].flags & F_NO_BOS) != 0;

    sp_status rc = SP_OK;
    struct sp_pretok *p = sp_calloc(1, sizeof *p);
    if (!p) return sp_err(SP_E_NOMEM, "%s: pre-tokenizer", __func__);
    p->gctx = pcre2_general_context_create(pcre_alloc, pcre_dealloc, NULL);
    p->cctx = p->gctx ? pcre2_compile_context_create(p->gctx) : NULL;
    if (!p->cctx) {
        rc = sp_err(SP_E_NOMEM, "%s: PCRE2 contexts", __func__);
        goto fail;
    }
    const char *const *set = k_sets[k_names[found].set];
    for (uint32_t i = 0; set[i]; i++) {
        char *pat = translate(set[i]);
        if (!pat) {
            rc = sp_err(SP_E_NOMEM, "%s: regex text", __func__);
            goto fail;
        }
        int err = 0;
        PCRE2_SIZE at = 0;
        p->re[i] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_MATCH_INVALID_UTF, &err, &at,
                                 p->cctx);
        sp_free(pat);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            rc = sp_err(err == PCRE2_ERROR_HEAP_FAILED ? SP_E_NOMEM : SP_E_FORMAT,
                        "%s: pre-tokenizer '%s' regex %u does not compile at %zu: %s", __func__, key, i, (size_t)at,
                        (const char *)msg);
            goto fail;
        }
        /* JIT is only a speed-up: where the platform refuses executable
         * memory the interpreter gives the same matches. */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
        p->n_re = i + 1;
    }
    *out = p;
    return SP_OK;

fail:
    sp_pretok_free(p);
    return rc;
}

/* Frees the compiled regexes; NULL is a no-op. */
void sp_pretok_free(struct sp_pretok *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    pcre2_compile_context_free(p->cctx);
    pcre2_general_context_free(p->gctx);
    sp_free(p);
}

/* ---- splitting ------------------------------------------------------------ */

static sp_status span_push(struct sp_span_vec *v, size_t off, size_t len) {
    if (len == 0) return SP_OK; /* llama.cpp keeps empty pieces; they produce no tokens */
    if (v->n == v->cap) {
        const size_t cap = v->cap ? v->cap * 2 : 32;
        struct sp_span *s = sp_realloc(v->s, cap * sizeof *s);
        if (!s) return sp_err(SP_E_NOMEM, "sp_pretok_split: %zu pieces", cap);
        v->s = s;
        v->cap = cap;
    }
    v->s[v->n++] = (struct sp_span){off, len};
    return SP_OK;
}

/* Split one piece by one regex, as std::regex_iterator walks it: matches and
 * the gaps between them; after an empty match, retry non-empty at the same
 * place, else step one character. */
static sp_status split_piece(const pcre2_code *re, pcre2_match_data *md, const char *text, struct sp_span piece,
                             struct sp_span_vec *out) {
    const PCRE2_SPTR subj = (PCRE2_SPTR)(text + piece.off);
    const size_t len = piece.len;
    size_t pos = 0, last = 0;
    uint32_t opts = 0;
    sp_status rc = SP_OK;
    while (rc == SP_OK && pos <= len) {
        const int m = pcre2_match(re, subj, len, pos, opts, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) {
            if (opts == 0 || pos >= len) break;
            opts = 0; /* no non-empty match here: move on one character */
            pos++;
            while (pos < len && (subj[pos] & 0xc0) == 0x80) pos++;
            continue;
        }
        if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            return sp_err(m == PCRE2_ERROR_NOMEMORY ? SP_E_NOMEM : SP_E_INVALID,
                          "sp_pretok_split: regex match failed at byte %zu: %s", piece.off + pos, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const size_t ms = ov[0], me = ov[1];
        if (ms > last) rc = span_push(out, piece.off + last, ms - last);
        if (rc == SP_OK) rc = span_push(out, piece.off + ms, me - ms);
        last = me;
        pos = me;
        opts = me == ms ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
    }
    if (rc == SP_OK && last < len) rc = span_push(out, piece.off + last, len - last);
    return rc;
}

/* Run every regex of the set over text; see tok_internal.h. */
sp_status sp_pretok_split(const struct sp_pretok *p, const char *text, size_t len, struct sp_span_vec *out) {
    sp_status rc = SP_OK;
    struct sp_span_vec tmp = {0};
    out->n = 0;
    rc = span_push(out, 0, len);
    if (rc != SP_OK || p->n_re == 0) return rc;
    pcre2_match_data *md = pcre2_match_data_create(1, p->gctx);
    if (!md) return sp_err(SP_E_NOMEM, "%s: match data", __func__);
    for (uint32_t r = 0; rc == SP_OK && r < p->n_re; r++) {
        tmp.n = 0;
        for (size_t i = 0; rc == SP_OK && i < out->n; i++) rc = split_piece(p->re[r], md, text, out->s[i], &tmp);
        const struct sp_span_vec swap = *out;
        *out = tmp;
        tmp = swap;
    }
    sp_free(tmp.s);
    pcre2_match_data_free(md);
    return rc;
}
