/*
 * test_tokenizer.c -- the tokenizers against llama.cpp: its tokenizer test
 * vectors (peer-tests/tokenizer: llama SPM and GPT-2 BPE, encoded without
 * BOS), the stories260K golden prompts and pieces from both the GGUF and the
 * llama2.c tokenizer.bin, decode(encode(x)) round trips, pre-tokenizer splits,
 * the buffer contract, every pre-tokenizer name compiling, init time of a
 * 150k-token vocabulary, shared use from several threads and allocation
 * failures at every step.
 */
#include "format/model_file.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include "test_util.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <time.h>

/* ---- helpers --------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct sp_model_file *open_vocab(const char *rel, const char *tok_rel) {
    const char *p = need_fixture(rel);
    if (!p) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s", p);
    char tok[4096];
    if (tok_rel) {
        const char *tp = need_fixture(tok_rel);
        if (!tp) return NULL;
        snprintf(tok, sizeof tok, "%s", tp);
    }
    struct sp_model_file *mf = NULL;
    sp_status rc = sp_model_file_open(path, tok_rel ? tok : NULL, true, &mf);
    CHECKF(rc == SP_OK && mf, "open %s: %s", path, sp_last_error());
    return rc == SP_OK ? mf : NULL;
}

static struct sp_tokenizer *make_tok(const struct sp_vocab_data *v) {
    struct sp_tokenizer *t = NULL;
    sp_status rc = sp_tokenizer_init(v, &t);
    CHECKF(rc == SP_OK && t, "tokenizer init: %s", sp_last_error());
    return t;
}

/* Encode into a malloc'd array (size query first). */
static int32_t *encode(const struct sp_tokenizer *t, const char *s, size_t len, bool bos, int32_t *n) {
    int32_t need = -1;
    sp_status rc = sp_tokenizer_encode(t, s, len, bos, false, NULL, 0, &need);
    CHECKF(rc == SP_OK || rc == SP_E_BUFFER, "encode size: %d %s", rc, sp_last_error());
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(need > 0 ? need : 1));
    rc = sp_tokenizer_encode(t, s, len, bos, false, ids, need, n);
    CHECKF(rc == SP_OK && *n == need, "encode: %d %s", rc, sp_last_error());
    return ids;
}

static char *decode(const struct sp_tokenizer *t, const int32_t *ids, int32_t n, size_t *len) {
    size_t need = 0;
    sp_status rc = sp_tokenizer_decode(t, ids, n, NULL, 0, &need);
    CHECK(rc == SP_OK || rc == SP_E_BUFFER);
    char *buf = malloc(need + 1);
    rc = sp_tokenizer_decode(t, ids, n, buf, need, len);
    CHECKF(rc == SP_OK && *len == need, "decode: %d %s", rc, sp_last_error());
    buf[*len] = '\0';
    return buf;
}

static void print_ids(const char *what, const int32_t *ids, int32_t n) {
    fprintf(stderr, "  %s:", what);
    for (int32_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* ---- llama.cpp test vectors -------------------------------------------------- */

static void run_vectors(const char *rel, bool expect_roundtrip_all) {
    struct sp_model_file *mf = open_vocab(rel, NULL);
    if (!mf) return;
    const double t0 = now_s();
    struct sp_tokenizer *t = make_tok(&mf->vocab);
    printf("%s: tokenizer init %.2f ms\n", rel, (now_s() - t0) * 1e3);
    char inp_rel[512], out_rel[512];
    snprintf(inp_rel, sizeof inp_rel, "%s.inp", rel);
    snprintf(out_rel, sizeof out_rel, "%s.out", rel);
    const char *pi = need_fixture(inp_rel);
    size_t n_inp = 0, n_out = 0;
    char *inp = pi ? read_all(pi, &n_inp) : NULL;
    const char *po = need_fixture(out_rel);
    char *out = po ? read_all(po, &n_out) : NULL;
    if (!t || !inp || !out) goto done;

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    char *p = inp, *end = inp + n_inp;
    char *line = out;
    int n_tests = 0, n_pass = 0, n_rt = 0, n_rt_ok = 0;
    while (p < end) {
        char *q = memmem(p, (size_t)(end - p), sep, sep_len);
        if (!q) break;
        const size_t len = (size_t)(q - p);
        /* expected ids: one line of " id id ..." */
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        int32_t want[4096];
        int32_t n_want = 0;
        for (char *s = line; *s;) {
            char *e;
            long v = strtol(s, &e, 10);
            if (e == s) break;
            want[n_want++] = (int32_t)v;
            s = e;
        }
        line = nl ? nl + 1 : line + strlen(line);

        int32_t n = 0;
        int32_t *ids = encode(t, p, len, false, &n);
        bool ok = n == n_want && memcmp(ids, want, sizeof(int32_t) * (size_t)n) == 0;
        CHECKF(ok, "%s test %d: %.*s", rel, n_tests, (int)SP_MIN(len, 60), p);
        if (!ok) {
            print_ids("want", want, n_want);
            print_ids("got ", ids, n);
        }
        n_pass += ok;

        size_t dl = 0;
        char *text = decode(t, ids, n, &dl);
        const bool rt = dl == len && memcmp(text, p, len) == 0;
        n_rt++;
        n_rt_ok += rt;
        if (expect_roundtrip_all) CHECKF(rt, "%s test %d round trip: '%s'", rel, n_tests, text);
        free(text);
        free(ids);
        n_tests++;
        p = q + sep_len;
    }
    CHECKF(n_tests == 46, "%s: %d tests", rel, n_tests);
    const char *xp = need_fixture("peer-golden/tinystories-valid-excerpt.txt");
    size_t xl = 0;
    char *x = xp ? read_all(xp, &xl) : NULL;
    if (x) {
        int32_t nx = 0;
        const double t1 = now_s();
        int32_t *ids = encode(t, x, xl, false, &nx);
        printf("%s: %zu bytes -> %d tokens in %.2f ms\n", rel, xl, nx, (now_s() - t1) * 1e3);
        size_t dl = 0;
        char *back = decode(t, ids, nx, &dl);
        CHECK(dl == xl && memcmp(back, x, xl) == 0);
        free(back);
        free(ids);
        free(x);
    }
    printf("%s: %d/%d vectors match, %d/%d round trips\n", rel, n_pass, n_tests, n_rt_ok, n_rt);
done:
    free(inp);
    free(out);
    sp_tokenizer_free(t);
    sp_model_file_free(mf);
}

/* ---- stories260K golden prompts ----------------------------------------------- */

static void hex_to_bytes(const char *hex, char *out, size_t *n) {
    *n = 0;
    for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
        unsigned v;
        sscanf(hex + i, "%2x", &v);
        out[(*n)++] = (char)v;
    }
}

static void run_stories(const char *rel, const char *tok_rel) {
    struct sp_model_file *mf = open_vocab(rel, tok_rel);
    const char *gp = need_fixture("peer-golden/stories260K.json");
    size_t jl = 0;
    char *js = gp ? read_all(gp, &jl) : NULL;
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    CHECKF(!js || root, "parse %s", gp);
    struct sp_tokenizer *t = mf ? make_tok(&mf->vocab) : NULL;
    if (!t || !root) goto done;

    const cJSON *runs = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "variants"), 0), "runs");
    const cJSON *run;
    int n_runs = 0;
    cJSON_ArrayForEach(run, runs) {
        const char *prompt = cJSON_GetObjectItem(run, "prompt")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(run, "prompt_tokens");
        int32_t n = 0;
        int32_t *ids = encode(t, prompt, strlen(prompt), true, &n);
        bool ok = n == cJSON_GetArraySize(want);
        for (int32_t i = 0; ok && i < n; i++) ok = ids[i] == cJSON_GetArrayItem(want, i)->valueint;
        CHECKF(ok, "%s: prompt '%s'", rel, prompt);
        if (!ok) print_ids("got", ids, n);

        /* pieces of the prompt (llama.cpp printed them with special = true, so
         * skip BOS, which renders as "" here) */
        const cJSON *pieces = cJSON_GetObjectItem(run, "prompt_pieces");
        for (int32_t i = 1; ok && i < n; i++) {
            char buf[64];
            size_t pl = 0;
            sp_status rc = sp_tokenizer_piece(t, ids[i], buf, sizeof buf, &pl);
            const char *w = cJSON_GetArrayItem(pieces, i)->valuestring;
            CHECKF(rc == SP_OK && pl == strlen(w) && memcmp(buf, w, pl) == 0, "piece %d of '%s'", ids[i], prompt);
        }

        /* generated pieces, byte for byte, and the full detokenization */
        const cJSON *gen = cJSON_GetObjectItem(run, "generated_tokens");
        const cJSON *hex = cJSON_GetObjectItem(run, "generated_pieces_hex");
        const int n_gen = cJSON_GetArraySize(gen);
        int32_t *all = malloc(sizeof(int32_t) * (size_t)(n + n_gen));
        memcpy(all, ids, sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n_gen; i++) {
            const int32_t id = cJSON_GetArrayItem(gen, i)->valueint;
            all[n + i] = id;
            char buf[64], wb[64];
            size_t pl = 0, wl = 0;
            sp_status rc = sp_tokenizer_piece(t, id, buf, sizeof buf, &pl);
            hex_to_bytes(cJSON_GetArrayItem(hex, i)->valuestring, wb, &wl);
            CHECKF(rc == SP_OK && pl == wl && memcmp(buf, wb, wl) == 0, "generated piece %d (id %d)", i, id);
        }
        /* llama.cpp's full_detokenized keeps the prefix space after BOS;
         * Sparrow drops it with or without the BOS */
        size_t dl = 0;
        const char *full = cJSON_GetObjectItem(run, "full_detokenized")->valuestring;
        CHECK(full[0] == ' ');
        for (int skip = 0; skip < 2; skip++) {
            char *text = decode(t, all + skip, n + n_gen - skip, &dl);
            CHECKF(dl == strlen(full) - 1 && memcmp(text, full + 1, dl) == 0,
                   "%s: detokenized (BOS %s)\n  got  '%s'\n  want '%s'", rel, skip ? "dropped" : "kept", text, full + 1);
            free(text);
        }
        free(all);
        free(ids);
        n_runs++;
    }
    CHECKF(n_runs == 3, "%s: %d golden prompts", rel, n_runs);

    /* the perplexity text: 7159 tokens with BOS (peer-golden/README.md) */
    const char *xp = need_fixture("peer-golden/tinystories-valid-excerpt.txt");
    size_t xl = 0;
    char *x = xp ? read_all(xp, &xl) : NULL;
    if (x) {
        int32_t n = 0;
        const double t0 = now_s();
        int32_t *ids = encode(t, x, xl, true, &n);
        const double dt = now_s() - t0;
        CHECKF(n == 7159, "%s: excerpt gives %d tokens", rel, n);
        printf("%s: %zu bytes -> %d tokens in %.2f ms\n", rel, xl, n, dt * 1e3);
        size_t dl = 0;
        char *back = decode(t, ids + 1, n - 1, &dl);
        CHECK(dl == xl && memcmp(back, x, xl) == 0);
        free(back);
        free(ids);
        free(x);
    }
    CHECK(sp_tokenizer_is_eog(t, 2));
    CHECK(!sp_tokenizer_is_eog(t, 1));
    CHECK(!sp_tokenizer_is_eog(t, 400));
done:
    cJSON_Delete(root);
    free(js);
    sp_tokenizer_free(t);
    sp_model_file_free(mf);
}

/* ---- contract details on the SPM and GPT-2 vocabularies ------------------------ */

static void test_spm_details(void) {
    struct sp_model_file *mf = open_vocab("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf", NULL);
    if (!mf) return;
    struct sp_tokenizer *t = make_tok(&mf->vocab);
    if (!t) goto done;
    int32_t ids[16], n = -1;
    /* empty text: nothing, or just BOS */
    CHECK(sp_tokenizer_encode(t, "", 0, false, false, ids, 16, &n) == SP_OK && n == 0);
    CHECK(sp_tokenizer_encode(t, "", 0, true, false, ids, 16, &n) == SP_OK && n == 1 && ids[0] == 1);
    CHECK(sp_tokenizer_encode(t, NULL, 0, true, false, ids, 16, &n) == SP_OK && n == 1);
    /* buffer too small: the count needed comes back */
    n = -1;
    CHECK(sp_tokenizer_encode(t, "Hello world", 11, true, false, ids, 1, &n) == SP_E_BUFFER && n == 3);
    CHECK(sp_tokenizer_encode(t, "Hello world", 11, true, false, ids, 3, &n) == SP_OK && n == 3);
    CHECK(ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186);
    /* pieces: byte token, control token, space marker */
    char buf[32];
    size_t pl = 99;
    CHECK(sp_tokenizer_piece(t, 13, buf, sizeof buf, &pl) == SP_OK && pl == 1 && buf[0] == '\n'); /* <0x0A> */
    CHECK(sp_tokenizer_piece(t, 1, buf, sizeof buf, &pl) == SP_OK && pl == 0);                   /* <s> */
    CHECK(sp_tokenizer_piece(t, 0, buf, sizeof buf, &pl) == SP_OK && pl == 0);                   /* <unk> */
    CHECK(sp_tokenizer_piece(t, 15043, buf, sizeof buf, &pl) == SP_OK && pl == 6 && memcmp(buf, " Hello", 6) == 0);
    CHECK(sp_tokenizer_piece(t, 15043, buf, 3, &pl) == SP_E_BUFFER && pl == 6);
    CHECK(sp_tokenizer_piece(t, 32000, buf, sizeof buf, &pl) == SP_E_INVALID);
    CHECK(sp_tokenizer_piece(t, -1, buf, sizeof buf, &pl) == SP_E_INVALID);
    /* decode: one leading space dropped, not two; buffer contract */
    int32_t two[2] = {29871, 15043}; /* "▁" "▁Hello" */
    size_t dl = 0;
    CHECK(sp_tokenizer_decode(t, two, 2, buf, sizeof buf, &dl) == SP_OK && dl == 6 && memcmp(buf, " Hello", 6) == 0);
    CHECK(sp_tokenizer_decode(t, two, 2, buf, 2, &dl) == SP_E_BUFFER && dl == 6);
    int32_t bos_hello[2] = {1, 15043}; /* the space after a skipped BOS goes too */
    CHECK(sp_tokenizer_decode(t, bos_hello, 2, buf, sizeof buf, &dl) == SP_OK && dl == 5 && memcmp(buf, "Hello", 5) == 0);
    int32_t bad[1] = {40000};
    CHECK(sp_tokenizer_decode(t, bad, 1, buf, sizeof buf, &dl) == SP_E_INVALID);
    CHECK(sp_tokenizer_is_eog(t, 2) && !sp_tokenizer_is_eog(t, 1) && !sp_tokenizer_is_eog(t, -5));
    /* invalid UTF-8 goes through byte tokens and comes back unchanged */
    const char raw[] = "a\xff\xc3(\xe2\x82";
    int32_t m = 0;
    int32_t *r = encode(t, raw, sizeof raw - 1, false, &m);
    char *back = decode(t, r, m, &dl);
    CHECK(dl == sizeof raw - 1 && memcmp(back, raw, dl) == 0);
    free(back);
    free(r);
done:
    sp_tokenizer_free(t);
    sp_model_file_free(mf);
}

static void expect_split(const struct sp_pretok *p, const char *text, const char *const *want, size_t n_want) {
    struct sp_span_vec v = {0};
    sp_status rc = sp_pretok_split(p, text, strlen(text), &v);
    bool ok = rc == SP_OK && v.n == n_want;
    for (size_t i = 0; ok && i < n_want; i++)
        ok = v.s[i].len == strlen(want[i]) && memcmp(text + v.s[i].off, want[i], v.s[i].len) == 0;
    CHECKF(ok, "split of '%s'", text);
    if (!ok) {
        for (size_t i = 0; i < v.n; i++) fprintf(stderr, "  [%.*s]\n", (int)v.s[i].len, text + v.s[i].off);
    }
    sp_free(v.s);
}

static struct sp_pretok *make_pre(const char *name) {
    struct sp_pretok *p = NULL;
    struct sp_pretok_info info;
    sp_status rc = sp_pretok_init(name, &p, &info);
    CHECKF(rc == SP_OK, "pre-tokenizer %s: %s", name, sp_last_error());
    return p;
}

static void test_pretok(void) {
    struct sp_pretok *p = make_pre("llama-bpe");
    if (p) {
        static const char *const w[] = {"Hello", " world", " ", "123", "456", " it", "'S", "\n\n", " ", " x"};
        expect_split(p, "Hello world 123456 it'S\n\n  x", w, SP_ARRAY_LEN(w));
        static const char *const w2[] = {"a", "\xc2\xa0\xc2\xa0 \n", "\xe1\xa0\x8e" "b"};
        expect_split(p, "a\xc2\xa0\xc2\xa0 \n\xe1\xa0\x8e" "b", w2, SP_ARRAY_LEN(w2));
        /* U+180E is not White_Space (PCRE2's own \s would take it) */
        static const char *const w3[] = {"x", "\xe1\xa0\x8e\xe1\xa0\x8e", "y"};
        expect_split(p, "x\xe1\xa0\x8e\xe1\xa0\x8ey", w3, SP_ARRAY_LEN(w3));
    }
    sp_pretok_free(p);
    p = make_pre("gpt-2");
    if (p) {
        static const char *const w[] = {"Hello", " world", "  ", " 12", "!!", "\t", "x", "'s", "   "};
        expect_split(p, "Hello world   12!!\tx's   ", w, SP_ARRAY_LEN(w));
    }
    sp_pretok_free(p);
    p = make_pre("qwen2");
    if (p) {
        static const char *const w[] = {"I", "'M", " ", "1", "2", " \xe4\xbd\xa0\xe5\xa5\xbd", "..\n"};
        expect_split(p, "I'M 12 \xe4\xbd\xa0\xe5\xa5\xbd..\n", w, SP_ARRAY_LEN(w));
    }
    sp_pretok_free(p);
    p = make_pre("deepseek-llm");
    if (p) {
        /* the letter class takes " a" but U+212A falls in the CJK pass's
         * U+0800-U+4E00 range; "\s+$" splits the trailing spaces off */
        static const char *const w[] = {"ab", " ", "\xe2\x84\xaa", "\xc6\xbb", "  "};
        expect_split(p, "ab \xe2\x84\xaa\xc6\xbb  ", w, SP_ARRAY_LEN(w));
    }
    sp_pretok_free(p);
    p = make_pre("superbpe"); /* empty lookahead matches split digits in threes from the right */
    if (p) {
        static const char *const w[] = {"1", "234", "567", "x"};
        expect_split(p, "1234567x", w, SP_ARRAY_LEN(w));
    }
    sp_pretok_free(p);

    /* every name in the table compiles; unknown names are refused by name */
    static const char *const names[] = {
        "", "default", "gpt-2", "llama3", "llama-v3", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
        "deepseek-v3", "falcon", "mpt", "starcoder", "refact", "command-r", "olmo", "dbrx", "smaug-bpe", "stablelm2",
        "jais", "jais-2", "tekken", "smollm", "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "chameleon",
        "minerva-7b", "viking", "poro-chat", "chatglm-bpe", "glm4", "gpt-4o", "llama4", "minimax-m2", "bailingmoe",
        "seed-coder", "grok-2", "ufakzeka", "laguna", "minicpm5", "superbpe", "hunyuan", "hunyuan-dense", "trillion",
        "granite-docling", "megrez", "solar-open", "mellum", "mellum2", "phi-2", "roberta-bpe"};
    for (size_t i = 0; i < SP_ARRAY_LEN(names); i++) {
        p = make_pre(names[i]);
        if (p) {
            struct sp_span_vec v = {0};
            const char *s = "Hello, World! It's 2024: \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\n\n  end";
            CHECKF(sp_pretok_split(p, s, strlen(s), &v) == SP_OK, "split with %s", names[i]);
            size_t covered = 0;
            for (size_t k = 0; k < v.n; k++) covered += v.s[k].len;
            CHECKF(covered == strlen(s), "%s: pieces cover the text", names[i]);
            sp_free(v.s);
        }
        sp_pretok_free(p);
    }
    struct sp_pretok_info info;
    p = NULL;
    CHECK(sp_pretok_init("no-such-pre", &p, &info) == SP_E_UNSUPPORTED && p == NULL);
    CHECK(strstr(sp_last_error(), "no-such-pre") != NULL);
}

/* ---- the pre-tokenizer against a model of llama.cpp's hand-written splitters --
 * llama.cpp does not run a regex engine for the GPT-2 and Llama-3 patterns but
 * walks code points by their Unicode flags (unicode_regex_split_custom_gpt2 /
 * _llama3); qwen2 is Llama-3 with single digits.  This restates those walks
 * over a small alphabet with known flags and compares them with the PCRE2
 * splits on random strings. */

enum { FL_L = 1, FL_N = 2, FL_WS = 4 };
static const struct {
    const char *utf8;
    uint32_t cpt;
    int flags;
} k_alpha[] = {
    {"a", 'a', FL_L},  {"Z", 'Z', FL_L}, {"s", 's', FL_L}, {"S", 'S', FL_L}, {"t", 't', FL_L}, {"l", 'l', FL_L},
    {"L", 'L', FL_L},  {"e", 'e', FL_L}, {"r", 'r', FL_L}, {"v", 'v', FL_L}, {"d", 'd', FL_L}, {"M", 'M', FL_L},
    {"\xc3\xa9", 0xE9, FL_L}, {"\xe4\xbd\xa0", 0x4F60, FL_L}, {"\xd0\x96", 0x416, FL_L},
    {"1", '1', FL_N}, {"7", '7', FL_N}, {"\xd9\xa3", 0x663, FL_N}, {"\xc2\xbd", 0xBD, FL_N}, {"\xe2\x85\xab", 0x216B, FL_N},
    {" ", ' ', FL_WS}, {" ", ' ', FL_WS}, {"\t", '\t', FL_WS}, {"\n", '\n', FL_WS}, {"\r", '\r', FL_WS},
    {"\x0b", 0x0B, FL_WS}, {"\xc2\xa0", 0xA0, FL_WS}, {"\xe3\x80\x80", 0x3000, FL_WS}, {"\xe2\x80\xa8", 0x2028, FL_WS},
    {"\xc2\x85", 0x85, FL_WS},
    {"'", '\'', 0}, {"'", '\'', 0}, {"!", '!', 0}, {".", '.', 0}, {"$", '$', 0}, {"\xf0\x9f\x98\x80", 0x1F600, 0},
    {"\xcc\x81", 0x301, 0}, {"\xe1\xa0\x8e", 0x180E, 0}, {"\x01", 0x01, 0}, {"/", '/', 0},
};

struct walk {
    const int *sym; /* alphabet index per code point */
    size_t n;
    size_t *ends; /* piece end positions (code points) */
    size_t n_ends;
    size_t prev;
};

static int wflags(const struct walk *w, size_t pos) {
    return pos < w->n ? k_alpha[w->sym[pos]].flags : -1; /* -1: out of range */
}
static uint32_t wcpt(const struct walk *w, size_t pos) {
    return pos < w->n ? k_alpha[w->sym[pos]].cpt : 0xFFFFFFFFu;
}
static void wend(struct walk *w, size_t end) {
    if (end > w->prev) w->ends[w->n_ends++] = end;
    w->prev = end;
}
static uint32_t lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}
#define IS(f, bit) ((f) >= 0 && ((f) & (bit)))

/* kind 0: gpt2, 1: llama3, 2: qwen2 */
static void walk_split(struct walk *w, int kind) {
    size_t pos = 0;
    while (pos < w->n) {
        const uint32_t c = wcpt(w, pos);
        const int f = wflags(w, pos);
        if (c == '\'' && pos + 1 < w->n) {
            const uint32_t a = kind ? lower(wcpt(w, pos + 1)) : wcpt(w, pos + 1);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') {
                pos += 2;
                wend(w, pos);
                continue;
            }
            if (pos + 2 < w->n) {
                const uint32_t b = kind ? lower(wcpt(w, pos + 2)) : wcpt(w, pos + 2);
                if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
                    pos += 3;
                    wend(w, pos);
                    continue;
                }
            }
        }
        if (kind == 0) {
            const int f2 = c == ' ' ? wflags(w, pos + 1) : f;
            if (IS(f2, FL_L) || IS(f2, FL_N)) {
                const int bit = IS(f2, FL_L) ? FL_L : FL_N;
                pos += c == ' ';
                while (IS(wflags(w, pos), bit)) pos++;
                wend(w, pos);
                continue;
            }
            if (f2 >= 0 && !(f2 & (FL_L | FL_N | FL_WS))) {
                pos += c == ' ';
                while (wflags(w, pos) >= 0 && !(wflags(w, pos) & (FL_L | FL_N | FL_WS))) pos++;
                wend(w, pos);
                continue;
            }
        } else {
            if (!(c == '\r' || c == '\n' || IS(f, FL_N)) && (IS(f, FL_L) || IS(wflags(w, pos + 1), FL_L))) {
                pos++;
                while (IS(wflags(w, pos), FL_L)) pos++;
                wend(w, pos);
                continue;
            }
            if (IS(f, FL_N)) {
                const size_t max = kind == 1 ? 3 : 1;
                size_t ini = pos;
                while (IS(wflags(w, pos), FL_N)) {
                    if (++pos - ini >= max) {
                        wend(w, pos);
                        ini = pos;
                    }
                }
                wend(w, pos);
                continue;
            }
            const int f2 = c == ' ' ? wflags(w, pos + 1) : f;
            if (!IS(f2, FL_L | FL_N | FL_WS) && f >= 0 && (c != ' ' || f2 >= 0)) {
                pos += c == ' ';
                while (wflags(w, pos) >= 0 && !(wflags(w, pos) & (FL_L | FL_N | FL_WS))) pos++;
                while (wcpt(w, pos) == '\r' || wcpt(w, pos) == '\n') pos++;
                wend(w, pos);
                continue;
            }
        }
        size_t n_ws = 0, last_rn = 0;
        while (IS(wflags(w, pos + n_ws), FL_WS)) {
            const uint32_t c2 = wcpt(w, pos + n_ws);
            if (kind && (c2 == '\r' || c2 == '\n')) last_rn = pos + n_ws + 1;
            n_ws++;
        }
        if (last_rn > 0) {
            pos = last_rn;
            wend(w, pos);
            continue;
        }
        if (n_ws > 1 && pos + n_ws < w->n) {
            pos += n_ws - 1;
            wend(w, pos);
            continue;
        }
        if (n_ws > 0) {
            pos += n_ws;
            wend(w, pos);
            continue;
        }
        wend(w, ++pos);
    }
}

static void test_pretok_model(void) {
    static const char *const names[3] = {"gpt-2", "llama3", "qwen2"};
    uint32_t x = 2024;
    for (int kind = 0; kind < 3; kind++) {
        struct sp_pretok *p = make_pre(names[kind]);
        if (!p) continue;
        int bad = 0;
        for (int iter = 0; iter < 4000 && bad < 3; iter++) {
            int sym[40];
            size_t off[41], ends[40];
            char text[200];
            x = x * 1664525u + 1013904223u;
            const size_t n = (x >> 8) % 24;
            size_t len = 0;
            for (size_t i = 0; i < n; i++) {
                x = x * 1664525u + 1013904223u;
                sym[i] = (int)((x >> 8) % SP_ARRAY_LEN(k_alpha));
                off[i] = len;
                const size_t k = strlen(k_alpha[sym[i]].utf8);
                memcpy(text + len, k_alpha[sym[i]].utf8, k);
                len += k;
            }
            off[n] = len;
            struct walk w = {sym, n, ends, 0, 0};
            walk_split(&w, kind);
            struct sp_span_vec v = {0};
            sp_status rc = sp_pretok_split(p, text, len, &v);
            bool ok = rc == SP_OK && v.n == w.n_ends;
            for (size_t i = 0; ok && i < v.n; i++) ok = v.s[i].off + v.s[i].len == off[w.ends[i]];
            if (!ok) {
                bad++;
                CHECKF(ok, "%s split differs from llama.cpp's walk", names[kind]);
                fprintf(stderr, "  text:");
                for (size_t i = 0; i < n; i++) fprintf(stderr, " U+%04X", (unsigned)k_alpha[sym[i]].cpt);
                fprintf(stderr, "\n  walk ends:");
                for (size_t i = 0; i < w.n_ends; i++) fprintf(stderr, " %zu", w.ends[i]);
                fprintf(stderr, "\n  pcre2 pieces:");
                for (size_t i = 0; i < v.n; i++) fprintf(stderr, " [%zu,%zu)", v.s[i].off, v.s[i].off + v.s[i].len);
                fputc('\n', stderr);
            }
            sp_free(v.s);
        }
        CHECKF(bad == 0, "%s: %d random strings split differently", names[kind], bad);
        sp_pretok_free(p);
    }
}

/* ---- a synthetic vocabulary: 150k tokens, 150k merges ---------------------------- */

struct synth {
    struct sp_vocab_data v;
    char *store;
};

/* Tokens: the 256 GPT-2 byte symbols, then "<a><b>" concatenations made by
 * merges of earlier tokens, like a real merge list. */
static void synth_build(struct synth *s, uint32_t n_tokens) {
    memset(s, 0, sizeof *s);
    struct sp_tokenizer tmp;
    sp_bpe_init_bytes(&tmp);
    const uint32_t n_merges = n_tokens - 256;
    s->store = malloc((size_t)n_tokens * 48 + (size_t)n_merges * 48);
    s->v.kind = SP_VOCAB_BPE;
    s->v.pre = (char *)"gpt-2";
    s->v.n_tokens = n_tokens;
    s->v.tokens = malloc(sizeof(char *) * n_tokens);
    s->v.token_len = malloc(sizeof(uint32_t) * n_tokens);
    s->v.n_merges = n_merges;
    s->v.merges = malloc(sizeof(char *) * n_merges);
    char *w = s->store;
    for (uint32_t i = 0; i < 256; i++) {
        s->v.tokens[i] = w;
        memcpy(w, tmp.byte_utf8[i], tmp.byte_utf8_len[i]);
        w += tmp.byte_utf8_len[i];
        *w++ = '\0';
        s->v.token_len[i] = tmp.byte_utf8_len[i];
    }
    uint32_t x = 12345;
    for (uint32_t i = 256; i < n_tokens; i++) {
        /* pick two short earlier tokens (by construction distinct texts are
         * not guaranteed, so encode the index to keep them unique) */
        x = x * 1664525u + 1013904223u;
        const uint32_t a = 33 + (x >> 8) % 94;
        char text[40];
        const int tl = snprintf(text, sizeof text, "%c%u", (char)a, i);
        s->v.tokens[i] = w;
        memcpy(w, text, (size_t)tl + 1);
        w += tl + 1;
        s->v.token_len[i] = (uint32_t)tl;
        s->v.merges[i - 256] = w;
        w += sprintf(w, "%c %u", (char)a, i) + 1;
    }
    s->v.bos = s->v.eos = (int32_t)n_tokens - 1;
    s->v.unk = s->v.pad = s->v.eot = -1;
}

static void synth_free(struct synth *s) {
    free(s->v.tokens);
    free(s->v.token_len);
    free(s->v.merges);
    free(s->store);
}

static void test_big_vocab(void) {
    struct synth s;
    synth_build(&s, 150000);
    const double t0 = now_s();
    struct sp_tokenizer *t = make_tok(&s.v);
    const double dt = now_s() - t0;
    printf("init of a 150000-token, 149744-merge vocabulary: %.1f ms\n", dt * 1e3);
    CHECKF(dt < 0.5, "init took %.3f s", dt);
    if (t) {
        int32_t n = 0;
        int32_t *ids = encode(t, "hello world", 11, false, &n);
        CHECK(n > 0);
        free(ids);
    }
    sp_tokenizer_free(t);

    /* a duplicate token is a format error naming it */
    s.v.tokens[300] = s.v.tokens[299];
    s.v.token_len[300] = s.v.token_len[299];
    t = NULL;
    CHECK(sp_tokenizer_init(&s.v, &t) == SP_E_FORMAT && t == NULL);
    CHECK(strstr(sp_last_error(), "duplicate") != NULL);
    /* an unknown pre-tokenizer is unsupported */
    synth_free(&s);
    synth_build(&s, 1000);
    s.v.pre = (char *)"brand-new-pre";
    CHECK(sp_tokenizer_init(&s.v, &t) == SP_E_UNSUPPORTED && t == NULL);
    CHECK(strstr(sp_last_error(), "brand-new-pre") != NULL);
    synth_free(&s);
}

/* ---- a hand-made BPE vocabulary with a user-defined token ---------------------- */

static void test_user_defined(void) {
    /* "<think>" is user-defined: cut out of raw text before the regexes */
    static char *tokens[] = {"a", "b", "<", ">", "t", "h", "i", "n", "k", "<think>", "ab", "\xc4\xa0", "<|end|>"};
    static int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 3};
    static char *merges[] = {"a b"};
    uint32_t lens[SP_ARRAY_LEN(tokens)];
    for (size_t i = 0; i < SP_ARRAY_LEN(tokens); i++) lens[i] = (uint32_t)strlen(tokens[i]);
    struct sp_vocab_data v = {
        .kind = SP_VOCAB_BPE, .pre = (char *)"qwen2", .n_tokens = SP_ARRAY_LEN(tokens), .tokens = tokens,
        .token_len = lens, .types = types, .n_merges = 1, .merges = merges, .bos = -1, .eos = 12, .unk = -1,
        .pad = -1, .eot = -1};
    struct sp_tokenizer *t = make_tok(&v);
    if (!t) return;
    int32_t ids[16], n = 0;
    /* "ab<think>ab": the control token text "<|end|>" is not parsed */
    CHECK(sp_tokenizer_encode(t, "ab<think>ab", 11, true, false, ids, 16, &n) == SP_OK);
    CHECK(n == 3 && ids[0] == 10 && ids[1] == 9 && ids[2] == 10);
    CHECK(sp_tokenizer_encode(t, "<|end|>", 7, false, false, ids, 16, &n) == SP_OK && n > 0 && ids[0] == 2);
    for (int32_t i = 0; i < n; i++) CHECK(ids[i] != 12);
    char buf[16];
    size_t pl = 0;
    CHECK(sp_tokenizer_piece(t, 9, buf, sizeof buf, &pl) == SP_OK && pl == 7 && memcmp(buf, "<think>", 7) == 0);
    CHECK(sp_tokenizer_piece(t, 12, buf, sizeof buf, &pl) == SP_OK && pl == 0);
    CHECK(sp_tokenizer_piece(t, 11, buf, sizeof buf, &pl) == SP_OK && pl == 1 && buf[0] == ' ');
    CHECK(sp_tokenizer_is_eog(t, 12) && !sp_tokenizer_is_eog(t, 9));
    sp_tokenizer_free(t);
}

/* ---- special tokens parsed (a rendered chat template) ---------------------------- */

/* Concatenate id arrays: the expected encoding of text around special tokens. */
static int32_t cat(int32_t *dst, int32_t n, const int32_t *src, int32_t k) {
    memcpy(dst + n, src, (size_t)k * sizeof *src);
    return n + k;
}

/* With parse_special, the text of a control token becomes that token and the
 * text around it is encoded as separate fragments (SPM: each fragment after a
 * special token gets the prefix space, as llama.cpp's does); without it the
 * same text never yields the control ids. */
static void test_parse_special(const char *rel, const char *special, int32_t special_id, bool spm) {
    struct sp_model_file *mf = open_vocab(rel, NULL);
    if (!mf) return;
    struct sp_tokenizer *t = make_tok(&mf->vocab);
    if (!t) {
        sp_model_file_free(mf);
        return;
    }
    char text[128];
    snprintf(text, sizeof text, "Hello%sworld %s", special, special);
    int32_t got[64], n = 0, na, nb;
    CHECK(sp_tokenizer_encode(t, text, strlen(text), false, true, got, 64, &n) == SP_OK);
    int32_t *a = encode(t, "Hello", 5, false, &na), *b = encode(t, spm ? "world " : "world ", 6, false, &nb);
    int32_t want[64], nw = 0;
    nw = cat(want, nw, a, na);
    want[nw++] = special_id;
    nw = cat(want, nw, b, nb);
    want[nw++] = special_id;
    CHECKF(n == nw && memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s: '%s' with parse_special", rel, text);
    if (n != nw || memcmp(got, want, (size_t)n * sizeof *got) != 0) {
        print_ids("got", got, n);
        print_ids("want", want, nw);
    }
    /* without it: plain text, and the control id never appears */
    int32_t plain[64], np = 0;
    CHECK(sp_tokenizer_encode(t, text, strlen(text), false, false, plain, 64, &np) == SP_OK && np > nw);
    for (int32_t i = 0; i < np; i++) CHECK(plain[i] != special_id);
    /* with BOS: the prefix comes first, then the same ids */
    int32_t with_bos[64], nbos = 0;
    CHECK(sp_tokenizer_encode(t, text, strlen(text), true, true, with_bos, 64, &nbos) == SP_OK);
    const int32_t extra = mf->vocab.add_bos && mf->vocab.bos >= 0 ? 1 : 0;
    CHECK(nbos == n + extra && memcmp(with_bos + extra, got, (size_t)n * sizeof *got) == 0);
    free(a);
    free(b);
    sp_tokenizer_free(t);
    sp_model_file_free(mf);
}

/* ---- threads share one tokenizer ---------------------------------------------- */

struct thread_arg {
    const struct sp_tokenizer *t;
    const char *text;
    const int32_t *want;
    int32_t n_want;
    int bad;
};

static void *thread_main(void *p) {
    struct thread_arg *a = p;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)a->n_want);
    for (int r = 0; r < 20; r++) {
        int32_t n = 0;
        sp_status rc = sp_tokenizer_encode(a->t, a->text, strlen(a->text), false, false, ids, a->n_want, &n);
        if (rc != SP_OK || n != a->n_want || memcmp(ids, a->want, sizeof(int32_t) * (size_t)n) != 0) a->bad++;
    }
    free(ids);
    return NULL;
}

static void test_threads(void) {
    struct sp_model_file *mf = open_vocab("peer-tests/tokenizer/ggml-vocab-gpt-2.gguf", NULL);
    if (!mf) return;
    struct sp_tokenizer *t = make_tok(&mf->vocab);
    if (t) {
        const char *text = "The quick brown fox jumps over the lazy dog. \xe4\xbd\xa0\xe5\xa5\xbd, 1234567 it's   ok\n\n";
        int32_t n = 0;
        int32_t *want = encode(t, text, strlen(text), false, &n);
        pthread_t th[4];
        struct thread_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (struct thread_arg){t, text, want, n, 0};
            pthread_create(&th[i], NULL, thread_main, &args[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECKF(args[i].bad == 0, "thread %d: %d bad encodes", i, args[i].bad);
        }
        free(want);
    }
    sp_tokenizer_free(t);
    sp_model_file_free(mf);
}

/* ---- allocation failures ------------------------------------------------------- */

static int fail_after = -1; /* allocations left before failing; -1 = never */

static void *fail_malloc(size_t n, void *u) {
    (void)u;
    if (fail_after == 0) return NULL;
    if (fail_after > 0) fail_after--;
    return malloc(n);
}
static void *fail_realloc(void *p, size_t n, void *u) {
    (void)u;
    if (fail_after == 0) return NULL;
    if (fail_after > 0) fail_after--;
    return realloc(p, n);
}
static void fail_free(void *p, void *u) {
    (void)u;
    free(p);
}

static void test_oom(const char *rel) {
    struct sp_model_file *mf = open_vocab(rel, NULL);
    if (!mf) return;
    const char *text = "Hello world, it's 12345 \xe4\xbd\xa0\xe5\xa5\xbd!\n";
    struct sp_tokenizer *t0 = make_tok(&mf->vocab);
    int32_t n0 = 0;
    int32_t *want = t0 ? encode(t0, text, strlen(text), true, &n0) : NULL;
    sp_tokenizer_free(t0);
    const struct sp_allocator a = {fail_malloc, fail_realloc, fail_free, NULL};
    int n_ok = 0, n_nomem = 0, other = 0;
    for (int k = 0; k < 10000; k++) {
        sp_set_allocator(&a);
        fail_after = k;
        struct sp_tokenizer *t = NULL;
        sp_status rc = sp_tokenizer_init(&mf->vocab, &t);
        if (rc == SP_OK) {
            int32_t ids[256], n = 0;
            rc = sp_tokenizer_encode(t, text, strlen(text), true, false, ids, 256, &n);
            if (rc == SP_OK && (n != n0 || memcmp(ids, want, sizeof(int32_t) * (size_t)n) != 0)) {
                other++;
                fprintf(stderr, "  fail_after %d: different ids\n", k);
            }
        }
        sp_tokenizer_free(t);
        const int left = fail_after;
        fail_after = -1;
        sp_set_allocator(NULL);
        if (rc == SP_OK) n_ok++;
        else if (rc == SP_E_NOMEM) n_nomem++;
        else {
            other++;
            fprintf(stderr, "  fail_after %d: rc %d %s\n", k, rc, sp_last_error());
        }
        if (left > 0) break; /* every allocation was granted: all failure points seen */
    }
    CHECKF(other == 0 && n_ok > 0 && n_nomem > 0, "%s OOM: %d ok, %d nomem, %d other", rel, n_ok, n_nomem, other);
    free(want);
    sp_model_file_free(mf);
}

int main(void) {
    run_vectors("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf", true);
    run_vectors("peer-tests/tokenizer/ggml-vocab-gpt-2.gguf", true);
    run_stories("models/stories260K/stories260K-f32.gguf", NULL);
    run_stories("models/stories260K/stories260K.bin", "models/stories260K/tok512.bin");
    test_spm_details();
    test_pretok();
    test_pretok_model();
    test_user_defined();
    test_parse_special("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf", "</s>", 2, true);
    test_parse_special("peer-tests/tokenizer/ggml-vocab-gpt-2.gguf", "<|endoftext|>", 50256, false);
    test_parse_special("models/stories260K/stories260K-f32.gguf", "</s>", 2, true);
    test_big_vocab();
    test_threads();
    test_oom("models/stories260K/stories260K-f32.gguf");
    test_oom("peer-tests/tokenizer/ggml-vocab-gpt-2.gguf");
    return test_report("test_tokenizer");
}
