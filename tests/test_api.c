/*
 * test_api.c -- the public API as an embedder sees it: strict C, only
 * sparrow.h (like llama.cpp's test-c.c).  Covers the allocator hook (no
 * allocation on the token path, SQLite-style fault injection at every
 * allocation of a load, leak counts), bad input (missing, empty, corrupt and
 * truncated files, NULL and out-of-range arguments, a full context), buffer
 * contracts, determinism and session independence.  Numerical agreement with
 * llama.cpp is test_golden.c's job, not this file's.
 */
#include "sparrow.h"
#include "test_util.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define F32_MODEL "models/stories260K/stories260K-f32.gguf"
#define LLAMA2C_MODEL "models/stories260K/stories260K.bin"
#define LLAMA2C_TOKENIZER "models/stories260K/tok512.bin"
#define MOE_MODEL "models/stories260K-moe/stories260K-moe-f32.gguf"

#define PROMPT "Once upon a time"
static const int32_t prompt_ids[] = {1, 403, 407, 261, 378}; /* with BOS, from peer-golden */
#define N_PROMPT 5
#define LONG_TEXT "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."

#define NO_ALLOC_STEPS 50 /* decode+sample pairs that must not allocate */

/* ---------------------------------------------------------------------------
 * A counting allocator with fault injection (SQLite faultsim, Lua memlimit).
 * Every block carries a header with its size so live bytes can be counted.
 * ------------------------------------------------------------------------- */
union block_hdr {
    max_align_t align;
    size_t size;
};

static struct {
    atomic_long n_calls;   /* malloc_fn + realloc_fn calls since the last reset */
    atomic_long n_live;    /* blocks outstanding */
    atomic_long live_bytes;
    atomic_long peak_bytes;
    atomic_long n_failed;  /* calls answered with NULL on purpose */
    atomic_long fail_at;   /* 1-based call number to fail; 0 = never */
    atomic_bool fail_after;/* also fail every call after fail_at */
} A;

static bool alloc_should_fail(long call) {
    long at = atomic_load(&A.fail_at);
    if (at <= 0) return false;
    if (call == at || (atomic_load(&A.fail_after) && call > at)) {
        atomic_fetch_add(&A.n_failed, 1);
        return true;
    }
    return false;
}

static void add_bytes(long d) {
    long now = atomic_fetch_add(&A.live_bytes, d) + d;
    long peak = atomic_load(&A.peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&A.peak_bytes, &peak, now)) {
    }
}

static void *count_malloc(size_t size, void *user) {
    (void)user;
    long call = atomic_fetch_add(&A.n_calls, 1) + 1;
    if (alloc_should_fail(call) || size > SIZE_MAX - sizeof(union block_hdr)) return NULL;
    union block_hdr *h = malloc(sizeof *h + size);
    if (!h) return NULL;
    h->size = size;
    atomic_fetch_add(&A.n_live, 1);
    add_bytes((long)size);
    return h + 1;
}

static void *count_realloc(void *ptr, size_t size, void *user) {
    if (!ptr) return count_malloc(size, user);
    long call = atomic_fetch_add(&A.n_calls, 1) + 1;
    if (alloc_should_fail(call) || size > SIZE_MAX - sizeof(union block_hdr)) return NULL;
    union block_hdr *h = (union block_hdr *)ptr - 1;
    size_t old = h->size;
    union block_hdr *n = realloc(h, sizeof *n + size);
    if (!n) return NULL;
    n->size = size;
    add_bytes((long)size - (long)old);
    return n + 1;
}

static void count_free(void *ptr, void *user) {
    (void)user;
    if (!ptr) return;
    union block_hdr *h = (union block_hdr *)ptr - 1;
    atomic_fetch_sub(&A.n_live, 1);
    add_bytes(-(long)h->size);
    free(h);
}

static const struct sp_allocator counting_allocator = {count_malloc, count_realloc, count_free, NULL};

/* Start counting calls from zero and set the fault (0 = none). */
static void alloc_arm(long fail_at, bool fail_after) {
    atomic_store(&A.n_calls, 0);
    atomic_store(&A.n_failed, 0);
    atomic_store(&A.fail_after, fail_after);
    atomic_store(&A.fail_at, fail_at);
}

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------- */
/* Keep the library's diagnostics off stderr; failures print sp_last_error(). */
static int n_log_errors;
static void quiet_log(enum sp_log_level level, const char *msg, void *user) {
    (void)msg;
    (void)user;
    if (level == SP_LOG_ERROR) n_log_errors++;
}

static bool contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return true;
    }
    return n == 0;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* st must be want, and sp_last_error() non-empty and containing one of
 * words (NULL-terminated, case-insensitive; NULL words = any message). */
static void expect_err_at(int line, const char *what, sp_status st, sp_status want, const char *const *words) {
    const char *msg = sp_last_error();
    CHECKF(st == want, "line %d: %s: got %d (%s), expected %d (%s); message: %s", line, what, (int)st,
           sp_status_str(st), (int)want, sp_status_str(want), msg ? msg : "(null)");
    CHECKF(msg && msg[0], "line %d: %s: sp_last_error() is empty", line, what);
    if (!msg || !words) return;
    bool found = false;
    for (const char *const *w = words; *w; w++) found = found || contains_ci(msg, *w);
    if (!found) {
        fprintf(stderr, "line %d: %s: message \"%s\" names none of:", line, what, msg);
        for (const char *const *w = words; *w; w++) fprintf(stderr, " \"%s\"", *w);
        fputc('\n', stderr);
    }
    CHECKF(found, "line %d: %s: message does not name the problem", line, what);
}
#define EXPECT_ERR(what, st, want, ...) expect_err_at(__LINE__, what, st, want, (const char *const[]){__VA_ARGS__, NULL})
#define EXPECT_ERR_ANY(what, st, want) expect_err_at(__LINE__, what, st, want, NULL)

/* A pointer value the library must overwrite with NULL on failure. */
static max_align_t sentinel_storage;
#define SENTINEL ((void *)&sentinel_storage)

static sp_status load_model(const char *rel, struct sp_model **out) {
    *out = NULL;
    const char *path = need_fixture(rel);
    if (!path) return SP_E_IO;
    struct sp_model_params mp = sp_model_default_params();
    sp_status st = sp_model_load(path, &mp, out);
    CHECKF(st == SP_OK && *out, "sp_model_load(%s): %s (%s)", path, sp_status_str(st), sp_last_error());
    return st;
}

static sp_status load_llama2c(struct sp_model **out) {
    *out = NULL;
    char model[4096], tok[4096];
    const char *p = need_fixture(LLAMA2C_MODEL);
    if (!p) return SP_E_IO;
    snprintf(model, sizeof model, "%s", p);
    p = need_fixture(LLAMA2C_TOKENIZER);
    if (!p) return SP_E_IO;
    snprintf(tok, sizeof tok, "%s", p);
    struct sp_model_params mp = sp_model_default_params();
    mp.tokenizer_path = tok;
    return sp_model_load(model, &mp, out);
}

static struct sp_session_params greedy_params(int32_t n_ctx, int32_t n_threads) {
    struct sp_session_params p = sp_session_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = n_threads;
    p.kv_type_k = p.kv_type_v = SP_KV_F32;
    p.sampling.temp = 0.0f;
    p.sampling.repeat_penalty = 1.0f;
    return p;
}

static struct sp_session *new_session(struct sp_model *m, const struct sp_session_params *p) {
    struct sp_session *s = NULL;
    sp_status st = sp_session_init(m, p, &s);
    CHECKF(st == SP_OK && s, "sp_session_init: %s (%s)", sp_status_str(st), sp_last_error());
    return st == SP_OK ? s : NULL;
}

/* Write n bytes of data to a scratch file; returns its path (static, per slot). */
static const char *write_scratch(int slot, const char *name, const void *data, size_t n) {
    static char paths[8][4096];
    snprintf(paths[slot], sizeof paths[slot], "%s/sp_test_api_%ld_%s", scratch_dir(), (long)getpid(), name);
    FILE *f = fopen(paths[slot], "wb");
    CHECKF(f != NULL, "cannot write %s", paths[slot]);
    if (!f) return paths[slot];
    if (n) CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
    return paths[slot];
}

static unsigned char *read_fixture(const char *rel, size_t *n_out) {
    const char *path = need_fixture(rel);
    if (!path) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = n > 0 ? malloc((size_t)n) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n_out = buf ? (size_t)n : 0;
    return buf;
}

/* Decode prompt then n greedy steps; tokens sampled go to out (may be NULL). */
static sp_status generate(struct sp_session *s, int n, int32_t *out) {
    sp_status st = sp_decode(s, prompt_ids, N_PROMPT);
    for (int i = 0; st == SP_OK && i < n; i++) {
        int32_t t = -1;
        st = sp_sample(s, &t);
        if (st != SP_OK) break;
        if (out) out[i] = t;
        st = sp_decode(s, &t, 1);
    }
    return st;
}

/* ---------------------------------------------------------------------------
 * Status codes, NULL frees, model info
 * ------------------------------------------------------------------------- */
static void test_status_str(void) {
    const char *names[SP_STATUS_COUNT];
    for (int i = 0; i < SP_STATUS_COUNT; i++) {
        names[i] = sp_status_str((sp_status)-i);
        CHECKF(names[i] && names[i][0], "sp_status_str(%d) is empty", -i);
        for (int j = 0; j < i; j++)
            CHECKF(!names[i] || !names[j] || strcmp(names[i], names[j]) != 0, "sp_status_str(%d) == sp_status_str(%d)",
                   -i, -j);
    }
    CHECK(names[0] && contains_ci(names[0], "ok"));
    CHECK(names[3] && contains_ci(names[3], "format"));
    CHECK(names[5] && contains_ci(names[5], "memory"));
    const int unknown[] = {1, -SP_STATUS_COUNT, -1000, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = sp_status_str((sp_status)unknown[i]);
        CHECKF(s != NULL && s[0], "sp_status_str(%d) must be a non-empty string", unknown[i]);
    }
}

static void test_free_null(void) {
    sp_model_free(NULL);
    sp_session_free(NULL);
    CHECK(1); /* reaching here is the test */
}

static void test_model_info(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    struct sp_model_info info;
    memset(&info, 0, sizeof info);
    sp_status st = sp_model_get_info(m, &info);
    CHECK(st == SP_OK);
    if (st == SP_OK) {
        CHECK(info.arch && strcmp(info.arch, "llama") == 0);
        CHECK(info.tokenizer && strcmp(info.tokenizer, "spm") == 0);
        CHECK(info.name != NULL && info.file_format && contains_ci(info.file_format, "gguf"));
        CHECK(info.n_vocab == 512);
        CHECK(info.n_embd == 64);
        CHECK(info.n_layers == 5);
        CHECK(info.n_heads == 8);
        CHECK(info.n_kv_heads == 4);
        CHECK(info.head_dim_k == 8 && info.head_dim_v == 8);
        CHECK(info.n_ff == 172);
        CHECK(info.n_experts == 0 && info.n_experts_used == 0 && info.n_ff_exp == 0);
        CHECK(info.n_ctx_train == 128);
        CHECK(!info.rope_neox);
        CHECK(info.bos == 1 && info.eos == 2 && info.add_bos);
        CHECK(info.file_size == 1185376);
        CHECK(info.tensor_bytes > 0 && info.tensor_bytes <= info.file_size);
        CHECK(info.bytes_per_token > 0 && info.bytes_per_token <= info.tensor_bytes);
    }
    int32_t nt = sp_model_n_tensors(m);
    CHECK(nt > 0);
    uint64_t bytes = 0;
    for (int32_t i = 0; i < nt; i++) {
        struct sp_tensor_info ti;
        st = sp_model_get_tensor(m, i, &ti);
        CHECKF(st == SP_OK, "sp_model_get_tensor(%d): %s", i, sp_status_str(st));
        if (st != SP_OK) continue;
        CHECK(ti.name && ti.name[0] && ti.type && ti.type[0]);
        CHECK(ti.n_dims >= 1 && ti.n_dims <= 4);
        CHECK(ti.offset + ti.size <= info.file_size);
        bytes += ti.size;
    }
    CHECKF(bytes == info.tensor_bytes, "sum of tensor sizes %llu != tensor_bytes %llu", (unsigned long long)bytes,
           (unsigned long long)info.tensor_bytes);

    int32_t nm = sp_model_n_meta(m);
    CHECK(nm > 0);
    bool found_arch = false;
    for (int32_t i = 0; i < nm; i++) {
        char key[128], val[256];
        st = sp_model_get_meta(m, i, key, sizeof key, val, sizeof val);
        CHECK(st == SP_OK);
        if (st == SP_OK && strcmp(key, "general.architecture") == 0) found_arch = contains_ci(val, "llama");
    }
    CHECK(found_arch);
    if (nm > 0) { /* truncation keeps a terminated string within cap */
        char key[4], val[4];
        memset(key, 'x', sizeof key);
        memset(val, 'x', sizeof val);
        st = sp_model_get_meta(m, 0, key, sizeof key, val, sizeof val);
        CHECK(st == SP_OK && memchr(key, '\0', sizeof key) && memchr(val, '\0', sizeof val));
    }

    CHECK(sp_token_is_eog(m, 2));
    CHECK(!sp_token_is_eog(m, 1));
    CHECK(!sp_token_is_eog(m, 403));
    CHECK(!sp_token_is_eog(m, -1));
    CHECK(!sp_token_is_eog(m, 512));

    /* n_ctx 0 = the model's context length (128), capped at 4096. */
    struct sp_session_params p = greedy_params(0, 1);
    struct sp_session *s = new_session(m, &p);
    if (s) {
        CHECKF(sp_session_n_ctx(s) == 128, "n_ctx 0 gave %d, expected the model's 128", sp_session_n_ctx(s));
        CHECK(sp_session_n_past(s) == 0);
        CHECK(sp_get_logits(s) == NULL);
        CHECK(sp_session_memory_bytes(s) > 0);
        int32_t t = -1;
        EXPECT_ERR_ANY("sp_sample before any decode", sp_sample(s, &t), SP_E_STATE);
    }
    sp_session_free(s);
    sp_model_free(m);
}

/* ---------------------------------------------------------------------------
 * Bad input
 * ------------------------------------------------------------------------- */
static void expect_load_fails(const char *what, const char *path, const struct sp_model_params *mp, sp_status want,
                              const char *const *words, int line) {
    struct sp_model *m = SENTINEL;
    sp_status st = sp_model_load(path, mp, &m);
    printf("  %-34s -> %s: %s\n", what, sp_status_str(st), sp_last_error());
    expect_err_at(line, what, st, want, words);
    CHECKF(m == NULL, "line %d: %s: *out must be NULL on failure", line, what);
    if (m != NULL && m != SENTINEL) sp_model_free(m);
}
#define EXPECT_LOAD_FAILS(what, path, mp, want, ...)                                                              \
    expect_load_fails(what, path, mp, want, (const char *const[]){__VA_ARGS__, NULL}, __LINE__)

static void test_bad_files(void) {
    struct sp_model_params mp = sp_model_default_params();

    /* Missing file: an i/o error naming the path. */
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/sp_test_api_no-such-model.gguf", scratch_dir());
    EXPECT_LOAD_FAILS("missing file", missing, &mp, SP_E_IO, "no-such-model.gguf");

    /* Empty file. */
    const char *empty = write_scratch(0, "empty.gguf", "", 0);
    EXPECT_LOAD_FAILS("empty file", empty, &mp, SP_E_FORMAT, base_name(empty), "empty", "truncat", "too small",
                      "too short");

    size_t n = 0;
    unsigned char *gguf = read_fixture(F32_MODEL, &n);
    if (!gguf) return;
    CHECK(n > 4096);

    /* Wrong magic: a GGUF whose first bytes were damaged.  Whatever the loader
     * takes it for, it is a format error that names the file. */
    unsigned char *copy = malloc(n);
    if (copy) {
        memcpy(copy, gguf, n);
        memcpy(copy, "GGUX", 4);
        const char *bad = write_scratch(1, "badmagic.gguf", copy, n);
        EXPECT_LOAD_FAILS("wrong magic", bad, &mp, SP_E_FORMAT, base_name(bad), "magic");

        /* Unsupported GGUF versions (1 had 32-bit counts; 99 does not exist). */
        memcpy(copy, gguf, n);
        const uint32_t versions[] = {1, 99};
        for (size_t i = 0; i < 2; i++) {
            memcpy(copy + 4, &versions[i], 4); /* little-endian hosts only, as the files */
            const char *p = write_scratch(2, "badversion.gguf", copy, n);
            struct sp_model *m = SENTINEL;
            sp_status st = sp_model_load(p, &mp, &m);
            CHECKF(st == SP_E_UNSUPPORTED || st == SP_E_FORMAT, "GGUF version %u: got %s", versions[i],
                   sp_status_str(st));
            CHECKF(contains_ci(sp_last_error(), "version"), "GGUF version %u: message \"%s\" lacks 'version'",
                   versions[i], sp_last_error());
            CHECK(m == NULL);
            if (m && m != SENTINEL) sp_model_free(m);
        }
        free(copy);
    }

    /* Where the tensor data starts and which tensor comes last. */
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) == SP_OK) {
        struct sp_tensor_info last;
        memset(&last, 0, sizeof last);
        char last_name[256] = "";
        uint64_t first_off = n;
        for (int32_t i = 0; i < sp_model_n_tensors(m); i++) {
            struct sp_tensor_info ti;
            if (sp_model_get_tensor(m, i, &ti) != SP_OK) continue;
            if (ti.offset < first_off) first_off = ti.offset;
            if (ti.offset >= last.offset) {
                last = ti;
                snprintf(last_name, sizeof last_name, "%s", ti.name);
            }
        }
        sp_model_free(m);
        CHECK(first_off > 1000 && first_off < n);

        /* Truncated header: the magic is right, then the header, the metadata
         * or the tensor directory stops short. */
        const size_t cuts[] = {4, 8, 23, 64, 1000, (size_t)first_off / 4, (size_t)first_off / 2,
                               (size_t)first_off * 3 / 4, (size_t)first_off - 40, (size_t)first_off};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            const char *p = write_scratch(3, "trunchdr.gguf", gguf, cuts[i]);
            char what[64];
            snprintf(what, sizeof what, "header truncated at %zu bytes", cuts[i]);
            EXPECT_LOAD_FAILS(what, p, &mp, SP_E_FORMAT, base_name(p), "truncat", "end of file", "past end", "eof",
                              "short");
        }

        /* Truncated tensor data: cut the file in the middle of its last tensor. */
        CHECK(last.size > 0 && last.offset + last.size <= n);
        size_t cut = (size_t)(last.offset + last.size / 2);
        const char *p = write_scratch(4, "truncdata.gguf", gguf, cut);
        EXPECT_LOAD_FAILS("tensor data truncated", p, &mp, SP_E_FORMAT, last_name, base_name(p), "truncat",
                          "past end", "end of file");
        /* One byte short is just as bad. */
        p = write_scratch(4, "truncdata.gguf", gguf, n - 1);
        EXPECT_LOAD_FAILS("tensor data one byte short", p, &mp, SP_E_FORMAT, last_name, base_name(p), "truncat",
                          "past end", "end of file");
    }

    /* A llama2.c checkpoint without its tokenizer: the message names it. */
    char tok[4096];
    snprintf(tok, sizeof tok, "%s/sp_test_api_no-such-tokenizer.bin", scratch_dir());
    const char *bin = need_fixture(LLAMA2C_MODEL);
    if (bin) {
        char binpath[4096];
        snprintf(binpath, sizeof binpath, "%s", bin);
        struct sp_model_params mp2 = sp_model_default_params();
        mp2.tokenizer_path = tok;
        EXPECT_LOAD_FAILS("llama2.c with a missing tokenizer", binpath, &mp2, SP_E_IO, "no-such-tokenizer.bin");
    }
    free(gguf);
}

/* Remove what test_bad_files wrote, however far it got. */
static void remove_scratch_files(void) {
    static const char *const names[] = {"empty.gguf", "badmagic.gguf", "badversion.gguf", "trunchdr.gguf",
                                        "truncdata.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/sp_test_api_%ld_%s", scratch_dir(), (long)getpid(), names[i]);
        remove(p);
    }
}

static void test_null_args(void) {
    struct sp_model_params mp = sp_model_default_params();
    struct sp_model *m = SENTINEL;
    EXPECT_ERR_ANY("sp_model_load(NULL path)", sp_model_load(NULL, &mp, &m), SP_E_INVALID);
    CHECK(m == NULL);
    const char *path = need_fixture(F32_MODEL);
    if (!path) return;
    EXPECT_ERR_ANY("sp_model_load(NULL out)", sp_model_load(path, &mp, NULL), SP_E_INVALID);

    if (load_model(F32_MODEL, &m) != SP_OK) return;
    struct sp_model_info info;
    struct sp_tensor_info ti;
    EXPECT_ERR_ANY("sp_model_get_info(NULL model)", sp_model_get_info(NULL, &info), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_model_get_info(NULL out)", sp_model_get_info(m, NULL), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_model_get_tensor(-1)", sp_model_get_tensor(m, -1, &ti), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_model_get_tensor(n)", sp_model_get_tensor(m, sp_model_n_tensors(m), &ti), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_model_get_tensor(NULL out)", sp_model_get_tensor(m, 0, NULL), SP_E_INVALID);
    char k[64], v[64];
    EXPECT_ERR_ANY("sp_model_get_meta(-1)", sp_model_get_meta(m, -1, k, sizeof k, v, sizeof v), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_model_get_meta(n)", sp_model_get_meta(m, sp_model_n_meta(m), k, sizeof k, v, sizeof v),
                   SP_E_INVALID);

    /* Tokenizer calls. */
    int32_t toks[16];
    int32_t nt = 0;
    char buf[64];
    size_t nb = 0;
    EXPECT_ERR_ANY("sp_tokenize(NULL model)", sp_tokenize(NULL, "a", 1, 0, toks, 16, &nt), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_tokenize(NULL text)", sp_tokenize(m, NULL, 5, 0, toks, 16, &nt), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_tokenize(NULL n_out)", sp_tokenize(m, "a", 1, 0, toks, 16, NULL), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_tokenize(NULL tokens, cap 16)", sp_tokenize(m, "a", 1, 0, NULL, 16, &nt), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_token_to_piece(NULL model)", sp_token_to_piece(NULL, 403, buf, sizeof buf, &nb), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_token_to_piece(NULL n_out)", sp_token_to_piece(m, 403, buf, sizeof buf, NULL), SP_E_INVALID);
    EXPECT_ERR("sp_token_to_piece(-1)", sp_token_to_piece(m, -1, buf, sizeof buf, &nb), SP_E_INVALID, "-1");
    EXPECT_ERR("sp_token_to_piece(512)", sp_token_to_piece(m, 512, buf, sizeof buf, &nb), SP_E_INVALID, "512");
    EXPECT_ERR_ANY("sp_detokenize(NULL model)", sp_detokenize(NULL, prompt_ids, N_PROMPT, buf, sizeof buf, &nb),
                   SP_E_INVALID);
    EXPECT_ERR_ANY("sp_detokenize(NULL tokens)", sp_detokenize(m, NULL, 3, buf, sizeof buf, &nb), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_detokenize(n -1)", sp_detokenize(m, prompt_ids, -1, buf, sizeof buf, &nb), SP_E_INVALID);
    EXPECT_ERR_ANY("sp_detokenize(NULL n_out)", sp_detokenize(m, prompt_ids, N_PROMPT, buf, sizeof buf, NULL),
                   SP_E_INVALID);
    const int32_t bad_ids[] = {403, 600};
    EXPECT_ERR("sp_detokenize(id 600)", sp_detokenize(m, bad_ids, 2, buf, sizeof buf, &nb), SP_E_INVALID, "600");

    /* Session creation. */
    struct sp_session_params p = greedy_params(32, 1);
    struct sp_session *s = SENTINEL;
    EXPECT_ERR_ANY("sp_session_init(NULL model)", sp_session_init(NULL, &p, &s), SP_E_INVALID);
    CHECK(s == NULL);
    EXPECT_ERR_ANY("sp_session_init(NULL out)", sp_session_init(m, &p, NULL), SP_E_INVALID);
    struct sp_session_params bad = p;
    bad.n_ctx = -1;
    s = SENTINEL;
    EXPECT_ERR("n_ctx -1", sp_session_init(m, &bad, &s), SP_E_INVALID, "n_ctx");
    CHECK(s == NULL);
    bad = p;
    bad.n_threads = -1;
    s = SENTINEL;
    EXPECT_ERR("n_threads -1", sp_session_init(m, &bad, &s), SP_E_INVALID, "n_threads", "thread");
    CHECK(s == NULL);
    bad = p;
    bad.kv_type_v = SP_KV_TYPE_COUNT;
    s = SENTINEL;
    EXPECT_ERR("kv_type out of range", sp_session_init(m, &bad, &s), SP_E_INVALID, "kv_type", "kv");
    CHECK(s == NULL);
    bad = p;
    bad.sampling.temp = -1.0f;
    s = SENTINEL;
    EXPECT_ERR("temp -1", sp_session_init(m, &bad, &s), SP_E_INVALID, "temp");
    CHECK(s == NULL);

    /* Decoding and sampling. */
    s = new_session(m, &p);
    if (s) {
        int32_t t = 0;
        EXPECT_ERR_ANY("sp_decode(NULL session)", sp_decode(NULL, prompt_ids, 1), SP_E_INVALID);
        EXPECT_ERR_ANY("sp_decode(NULL tokens)", sp_decode(s, NULL, 1), SP_E_INVALID);
        EXPECT_ERR_ANY("sp_decode(n 0)", sp_decode(s, prompt_ids, 0), SP_E_INVALID);
        EXPECT_ERR_ANY("sp_decode(n -1)", sp_decode(s, prompt_ids, -1), SP_E_INVALID);
        EXPECT_ERR_ANY("sp_sample(NULL session)", sp_sample(NULL, &t), SP_E_INVALID);
        CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK);
        EXPECT_ERR_ANY("sp_sample(NULL out)", sp_sample(s, NULL), SP_E_INVALID);
        CHECK(sp_session_n_past(s) == N_PROMPT);
    }
    sp_session_free(s);
    sp_model_free(m);
}

static void test_token_range(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    struct sp_session_params p = greedy_params(32, 1);
    struct sp_session *s = new_session(m, &p);
    if (s) {
        const int32_t high[] = {1, 403, 512};
        const int32_t neg[] = {1, -1};
        EXPECT_ERR("decode id 512 (n_vocab)", sp_decode(s, high, 3), SP_E_INVALID, "512");
        CHECK(sp_session_n_past(s) == 0);
        CHECK(sp_get_logits(s) == NULL);
        EXPECT_ERR("decode id -1", sp_decode(s, neg, 2), SP_E_INVALID, "-1");
        CHECK(sp_session_n_past(s) == 0);
        /* After a good decode, a bad one consumes nothing either. */
        CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK);
        const int32_t one_bad = 100000;
        EXPECT_ERR("decode id 100000", sp_decode(s, &one_bad, 1), SP_E_INVALID, "100000");
        CHECK(sp_session_n_past(s) == N_PROMPT);
    }
    sp_session_free(s);
    sp_model_free(m);
}

static void test_context_full(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    int32_t toks[64];
    int32_t nt = 0;
    sp_status st = sp_tokenize(m, LONG_TEXT, strlen(LONG_TEXT), SP_TOKENIZE_ADD_BOS, toks, 64, &nt);
    CHECK(st == SP_OK && nt > 20);
    enum { N_CTX = 16 };
    struct sp_session_params p = greedy_params(N_CTX, 2);
    struct sp_session *s = new_session(m, &p);
    if (s && st == SP_OK && nt > 20) {
        CHECKF(sp_session_n_ctx(s) == N_CTX, "asked n_ctx %d, got %d", N_CTX, sp_session_n_ctx(s));
        int32_t n_ctx = sp_session_n_ctx(s);
        /* A prompt longer than the context: refused whole. */
        EXPECT_ERR_ANY("prompt of n_ctx+1 tokens", sp_decode(s, toks, n_ctx + 1), SP_E_CONTEXT_FULL);
        CHECK(sp_session_n_past(s) == 0);
        CHECK(sp_get_logits(s) == NULL);
        /* 10 tokens, then a batch that would overflow by one, then fill exactly. */
        CHECK(sp_decode(s, toks, 10) == SP_OK);
        EXPECT_ERR_ANY("batch overflowing by one", sp_decode(s, toks + 10, n_ctx - 10 + 1), SP_E_CONTEXT_FULL);
        CHECK(sp_session_n_past(s) == 10);
        for (int32_t i = 10; i < n_ctx; i++) {
            st = sp_decode(s, &toks[i], 1);
            CHECKF(st == SP_OK, "decode at n_past %d of %d: %s (%s)", i, n_ctx, sp_status_str(st), sp_last_error());
        }
        CHECK(sp_session_n_past(s) == n_ctx);
        int32_t t = -1;
        CHECK(sp_sample(s, &t) == SP_OK && t >= 0 && t < 512);
        EXPECT_ERR_ANY("decode into a full context", sp_decode(s, &t, 1), SP_E_CONTEXT_FULL);
        CHECK(sp_session_n_past(s) == n_ctx);
        /* Reset empties it again. */
        sp_session_reset(s);
        CHECK(sp_session_n_past(s) == 0);
        CHECK(sp_decode(s, toks, n_ctx) == SP_OK);
        CHECK(sp_session_n_past(s) == n_ctx);
    }
    sp_session_free(s);
    sp_model_free(m);
}

static void test_vocab_only(void) {
    const char *path = need_fixture(F32_MODEL);
    if (!path) return;
    struct sp_model_params mp = sp_model_default_params();
    mp.vocab_only = true;
    struct sp_model *m = NULL;
    sp_status st = sp_model_load(path, &mp, &m);
    CHECKF(st == SP_OK && m, "vocab-only load: %s (%s)", sp_status_str(st), sp_last_error());
    if (!m) return;
    int32_t toks[16], nt = 0;
    st = sp_tokenize(m, PROMPT, strlen(PROMPT), SP_TOKENIZE_ADD_BOS, toks, 16, &nt);
    CHECK(st == SP_OK && nt == N_PROMPT && memcmp(toks, prompt_ids, sizeof prompt_ids) == 0);
    struct sp_session_params p = greedy_params(32, 1);
    struct sp_session *s = SENTINEL;
    EXPECT_ERR("sp_session_init on a vocab-only model", sp_session_init(m, &p, &s), SP_E_STATE, "vocab");
    CHECK(s == NULL);
    sp_model_free(m);
}

/* ---------------------------------------------------------------------------
 * Buffer contracts
 * ------------------------------------------------------------------------- */
static void test_buffers(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    const size_t len = strlen(PROMPT);
    int32_t toks[16];
    int32_t n = -1;

    sp_status st = sp_tokenize(m, PROMPT, len, SP_TOKENIZE_ADD_BOS, toks, 2, &n);
    CHECKF(st == SP_E_BUFFER && n == N_PROMPT, "sp_tokenize cap 2: %s, n %d (want SP_E_BUFFER, 5)",
           sp_status_str(st), n);
    n = -1;
    st = sp_tokenize(m, PROMPT, len, SP_TOKENIZE_ADD_BOS, NULL, 0, &n);
    CHECKF(st == SP_E_BUFFER && n == N_PROMPT, "sp_tokenize NULL/0 size query: %s, n %d", sp_status_str(st), n);
    n = -1;
    st = sp_tokenize(m, PROMPT, len, SP_TOKENIZE_ADD_BOS, toks, N_PROMPT, &n);
    CHECK(st == SP_OK && n == N_PROMPT && memcmp(toks, prompt_ids, sizeof prompt_ids) == 0);
    /* Without the flag: no BOS.  len, not the NUL, ends the text. */
    st = sp_tokenize(m, PROMPT "XYZ", len, 0, toks, 16, &n);
    CHECK(st == SP_OK && n == N_PROMPT - 1 && memcmp(toks, prompt_ids + 1, sizeof(int32_t) * (N_PROMPT - 1)) == 0);
    st = sp_tokenize(m, "", 0, SP_TOKENIZE_ADD_BOS, toks, 16, &n);
    CHECK(st == SP_OK && n == 1 && toks[0] == 1);
    st = sp_tokenize(m, "", 0, 0, toks, 16, &n);
    CHECK(st == SP_OK && n == 0);

    char buf[64];
    size_t nb = 99;
    st = sp_token_to_piece(m, 403, buf, 2, &nb);
    CHECKF(st == SP_E_BUFFER && nb == 5, "sp_token_to_piece(' Once') cap 2: %s, n %zu", sp_status_str(st), nb);
    st = sp_token_to_piece(m, 403, buf, 5, &nb);
    CHECK(st == SP_OK && nb == 5 && memcmp(buf, " Once", 5) == 0);
    st = sp_token_to_piece(m, 1, NULL, 0, &nb); /* BOS renders as "" */
    CHECK(st == SP_OK && nb == 0);
    st = sp_token_to_piece(m, 13, buf, sizeof buf, &nb); /* byte token <0x0A> */
    CHECK(st == SP_OK && nb == 1 && buf[0] == '\n');

    nb = 0;
    st = sp_detokenize(m, prompt_ids, N_PROMPT, buf, 4, &nb);
    CHECKF(st == SP_E_BUFFER && nb == len, "sp_detokenize cap 4: %s, n %zu (want %zu)", sp_status_str(st), nb, len);
    st = sp_detokenize(m, prompt_ids, N_PROMPT, buf, sizeof buf, &nb);
    CHECKF(st == SP_OK && nb == len && memcmp(buf, PROMPT, len) == 0, "sp_detokenize: %s \"%.*s\"",
           sp_status_str(st), (int)(nb < sizeof buf ? nb : 0), buf);
    st = sp_detokenize(m, prompt_ids, 0, NULL, 0, &nb);
    CHECK(st == SP_OK && nb == 0);
    sp_model_free(m);
}

/* ---------------------------------------------------------------------------
 * Sessions: reset, seeds, independence
 * ------------------------------------------------------------------------- */
static void test_reset(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    struct sp_session_params p = greedy_params(64, 2);
    struct sp_session *s = new_session(m, &p);
    if (s) {
        static float first[512];
        CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK);
        const float *lg = sp_get_logits(s);
        CHECK(lg != NULL);
        if (lg) memcpy(first, lg, sizeof first);
        int32_t more[] = {432, 383, 286};
        CHECK(sp_decode(s, more, 3) == SP_OK);
        sp_session_reset(s);
        CHECK(sp_session_n_past(s) == 0);
        CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK);
        lg = sp_get_logits(s);
        CHECK(lg && memcmp(lg, first, sizeof first) == 0);
        CHECK(sp_session_n_past(s) == N_PROMPT);
    }
    sp_session_free(s);
    sp_model_free(m);
}

static void sample_sequence(struct sp_model *m, uint64_t seed, int32_t *out, int n) {
    struct sp_session_params p = greedy_params(64, 2);
    p.seed = seed;
    p.sampling.temp = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    memset(out, 0xff, sizeof(int32_t) * (size_t)n);
    struct sp_session *s = new_session(m, &p);
    if (!s) return;
    sp_status st = generate(s, n, out);
    CHECKF(st == SP_OK, "sampling with seed %llu: %s (%s)", (unsigned long long)seed, sp_status_str(st),
           sp_last_error());
    sp_session_free(s);
}

static void test_seed(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    enum { N = 40 };
    int32_t a[N], b[N], c[N];
    sample_sequence(m, 1234, a, N);
    sample_sequence(m, 1234, b, N);
    sample_sequence(m, 98765, c, N);
    CHECKF(memcmp(a, b, sizeof a) == 0, "the same seed gave different sequences");
    /* temp 1 over 40 steps: a seed that changed nothing would be ignored. */
    CHECKF(memcmp(a, c, sizeof a) != 0, "seeds 1234 and 98765 gave the same %d tokens", N);
    sp_model_free(m);
}

static void test_independent_sessions(void) {
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    static const int32_t other[] = {1, 291, 376, 400, 428, 286, 296, 418}; /* "The little dog was sad ..." */
    static const int32_t feed[] = {432, 383, 286, 261, 376, 298};
    enum { N_OTHER = 8, N_FEED = 6 };
    static float ref_a[512], ref_b[512];
    struct sp_session_params p = greedy_params(64, 2);

    /* References, each alone. */
    struct sp_session *s = new_session(m, &p);
    if (!s) goto done;
    CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK && sp_decode(s, feed, N_FEED) == SP_OK);
    if (sp_get_logits(s)) memcpy(ref_a, sp_get_logits(s), sizeof ref_a);
    sp_session_reset(s);
    CHECK(sp_decode(s, other, N_OTHER) == SP_OK && sp_decode(s, feed, N_FEED) == SP_OK);
    if (sp_get_logits(s)) memcpy(ref_b, sp_get_logits(s), sizeof ref_b);
    sp_session_free(s);

    /* Interleaved: two sessions on the same model, one token at a time. */
    struct sp_session *a = new_session(m, &p), *b = new_session(m, &p);
    if (a && b) {
        CHECK(sp_decode(a, prompt_ids, N_PROMPT) == SP_OK);
        CHECK(sp_decode(b, other, N_OTHER) == SP_OK);
        for (int i = 0; i < N_FEED; i++) {
            CHECK(sp_decode(b, &feed[i], 1) == SP_OK);
            CHECK(sp_decode(a, &feed[i], 1) == SP_OK);
        }
        CHECK(sp_session_n_past(a) == N_PROMPT + N_FEED);
        CHECK(sp_session_n_past(b) == N_OTHER + N_FEED);
        const float *la = sp_get_logits(a), *lb = sp_get_logits(b);
        CHECKF(la && memcmp(la, ref_a, sizeof ref_a) == 0, "session A's logits changed when B ran beside it");
        CHECKF(lb && memcmp(lb, ref_b, sizeof ref_b) == 0, "session B's logits changed when A ran beside it");
        CHECK(la != lb);
    }
    sp_session_free(a);
    sp_session_free(b);
done:
    sp_model_free(m);
}

/* ---------------------------------------------------------------------------
 * Allocator: no allocation on the token path, no leaks, fault injection
 * ------------------------------------------------------------------------- */
static void test_no_alloc_on_token_path(void) {
    for (int32_t threads = 1; threads <= 2; threads++) {
        struct sp_model *m = NULL;
        if (load_model(F32_MODEL, &m) != SP_OK) return;
        struct sp_session_params p = greedy_params(128, threads);
        p.sampling.temp = 0.8f; /* exercise the full sampler chain too */
        p.sampling.top_k = 40;
        p.sampling.top_p = 0.9f;
        p.sampling.min_p = 0.05f;
        p.sampling.repeat_penalty = 1.1f;
        p.sampling.repeat_last_n = 16;
        struct sp_session *s = new_session(m, &p);
        if (s) {
            CHECK(sp_decode(s, prompt_ids, N_PROMPT) == SP_OK);
            alloc_arm(0, false);
            int32_t t = -1;
            sp_status st = SP_OK;
            for (int i = 0; st == SP_OK && i < NO_ALLOC_STEPS; i++) {
                st = sp_sample(s, &t);
                if (st == SP_OK) st = sp_decode(s, &t, 1);
                if (st == SP_OK) CHECK(sp_get_logits(s) != NULL);
            }
            long calls = atomic_load(&A.n_calls);
            CHECKF(st == SP_OK, "token loop: %s (%s)", sp_status_str(st), sp_last_error());
            printf("  token path, %d threads: %ld allocator calls over %d decode+sample steps\n", threads, calls,
                   NO_ALLOC_STEPS);
            CHECKF(calls == 0, "%ld allocations on the token path (%d threads)", calls, threads);
        }
        sp_session_free(s);
        sp_model_free(m);
    }
}

static void test_leaks(void) {
    long live0 = atomic_load(&A.n_live), bytes0 = atomic_load(&A.live_bytes);
    atomic_store(&A.peak_bytes, bytes0);
    alloc_arm(0, false);
    struct sp_model *m = NULL;
    if (load_model(F32_MODEL, &m) != SP_OK) return;
    long after_load = atomic_load(&A.n_calls), model_bytes = atomic_load(&A.live_bytes) - bytes0;
    struct sp_session_params p = greedy_params(128, 2);
    struct sp_session *s = new_session(m, &p);
    uint64_t sess_bytes = s ? sp_session_memory_bytes(s) : 0;
    if (s) CHECK(generate(s, 32, NULL) == SP_OK);
    sp_session_free(s);
    sp_model_free(m);
    printf("  load+session+generate: %ld allocator calls (%ld in load), model heap %ld bytes, session reports %llu "
           "bytes, peak heap %ld bytes\n",
           atomic_load(&A.n_calls), after_load, model_bytes, (unsigned long long)sess_bytes,
           atomic_load(&A.peak_bytes) - bytes0);
    CHECKF(atomic_load(&A.n_live) == live0, "%ld blocks (%ld bytes) leaked by load -> generate -> free",
           atomic_load(&A.n_live) - live0, atomic_load(&A.live_bytes) - bytes0);

    /* The llama2.c path too. */
    sp_status st = load_llama2c(&m);
    CHECKF(st == SP_OK, "llama2.c load: %s (%s)", sp_status_str(st), sp_last_error());
    if (st == SP_OK) {
        s = new_session(m, &p);
        if (s) CHECK(generate(s, 8, NULL) == SP_OK);
        sp_session_free(s);
        sp_model_free(m);
    }
    CHECKF(atomic_load(&A.n_live) == live0, "%ld blocks leaked by the llama2.c load -> free",
           atomic_load(&A.n_live) - live0);
}

/* One load + session + prompt decode.  Returns SP_OK or the first failure;
 * logits (512) are copied out on success. */
static sp_status full_cycle(bool llama2c, float *logits) {
    struct sp_model *m = SENTINEL;
    sp_status st;
    if (llama2c) {
        st = load_llama2c(&m);
    } else {
        const char *path = fixture(F32_MODEL);
        struct sp_model_params mp = sp_model_default_params();
        st = sp_model_load(path, &mp, &m);
    }
    if (st != SP_OK) {
        CHECKF(m == NULL, "sp_model_load failed with %s but left *out set", sp_status_str(st));
        return st;
    }
    struct sp_session_params p = greedy_params(64, 1);
    struct sp_session *s = SENTINEL;
    st = sp_session_init(m, &p, &s);
    if (st != SP_OK) {
        CHECKF(s == NULL, "sp_session_init failed with %s but left *out set", sp_status_str(st));
        sp_model_free(m);
        return st;
    }
    st = sp_decode(s, prompt_ids, N_PROMPT);
    if (st == SP_OK && sp_get_logits(s)) memcpy(logits, sp_get_logits(s), 512 * sizeof(float));
    sp_session_free(s);
    sp_model_free(m);
    return st;
}

static void fault_injection(bool llama2c) {
    const char *what = llama2c ? "stories260K.bin" : "stories260K-f32.gguf";
    static float ref[512], got[512];
    if (!need_fixture(llama2c ? LLAMA2C_MODEL : F32_MODEL)) return;
    long live0 = atomic_load(&A.n_live);
    alloc_arm(0, false);
    sp_status st = full_cycle(llama2c, ref);
    long total = atomic_load(&A.n_calls);
    CHECKF(st == SP_OK, "%s: baseline cycle: %s (%s)", what, sp_status_str(st), sp_last_error());
    if (st != SP_OK) return;

    int n_nomem = 0, n_recovered = 0, n_bad_status = 0, n_leaky = 0, n_wrong = 0, n_no_msg = 0;
    for (int mode = 0; mode < 2; mode++) {
        const bool after = mode == 1; /* 0: only call N fails; 1: call N and all later ones */
        for (long nth = 1; nth <= total; nth++) {
            alloc_arm(nth, after);
            memset(got, 0, sizeof got);
            st = full_cycle(llama2c, got);
            long failed = atomic_load(&A.n_failed);
            alloc_arm(0, false);
            if (st == SP_E_NOMEM) {
                n_nomem++;
                if (!sp_last_error()[0]) n_no_msg++;
            } else if (st == SP_OK) {
                if (failed) n_recovered++;
                if (memcmp(got, ref, sizeof ref) != 0) {
                    n_wrong++;
                    if (n_wrong <= 3)
                        fprintf(stderr, "%s: failing allocation %ld%s was absorbed but the logits differ\n", what,
                                nth, after ? "+" : "");
                }
            } else {
                n_bad_status++;
                if (n_bad_status <= 5)
                    fprintf(stderr, "%s: failing allocation %ld%s gave %s (%s), expected out of memory\n", what, nth,
                            after ? "+" : "", sp_status_str(st), sp_last_error());
            }
            long live = atomic_load(&A.n_live);
            if (live != live0) {
                n_leaky++;
                if (n_leaky <= 5)
                    fprintf(stderr, "%s: failing allocation %ld%s (%s) leaked %ld blocks\n", what, nth,
                            after ? "+" : "", sp_status_str(st), live - live0);
                /* The leaked blocks stay counted; compare later runs against this. */
                live0 = live;
            }
        }
    }
    printf("  fault injection, %s: %ld allocations per load+session+decode; %ld x 2 runs: %d SP_E_NOMEM, "
           "%d absorbed, %d other status, %d leaking, %d wrong logits\n",
           what, total, total, n_nomem, n_recovered, n_bad_status, n_leaky, n_wrong);
    CHECKF(n_bad_status == 0, "%s: %d injected failures returned something other than SP_E_NOMEM", what,
           n_bad_status);
    CHECKF(n_leaky == 0, "%s: %d injected failures leaked memory", what, n_leaky);
    CHECKF(n_wrong == 0, "%s: %d absorbed failures changed the result", what, n_wrong);
    CHECKF(n_no_msg == 0, "%s: %d SP_E_NOMEM returns without a message", what, n_no_msg);
    CHECKF(n_nomem > 0, "%s: no injected failure was reported", what);
}

/* ---------------------------------------------------------------------------
 * MoE: the Mixtral-layout stories260K-moe loads, reports its experts and the
 * byte count a token reads, and runs without allocating on the token path
 * (prefill groups tokens by expert); a prompt split into small batches gives
 * the same logits as one batch.
 * ------------------------------------------------------------------------- */
#ifndef SP_TEST_MOE_SUPPORTED
#define SP_TEST_MOE_SUPPORTED 1
#endif

#if SP_TEST_MOE_SUPPORTED
/* Prompt logits of a fresh session with batch size n_batch (0 = default). */
static sp_status moe_prompt_logits(struct sp_model *m, int32_t n_batch, float *out) {
    struct sp_session_params p = greedy_params(64, 2);
    p.n_batch = n_batch;
    struct sp_session *s = NULL;
    sp_status st = sp_session_init(m, &p, &s); /* may fail on purpose (fault injection) */
    if (st != SP_OK) return st;
    st = sp_decode(s, prompt_ids, N_PROMPT);
    if (st == SP_OK) memcpy(out, sp_get_logits(s), 512 * sizeof(float));
    sp_session_free(s);
    return st;
}

static void test_moe_runs(struct sp_model *m) {
    struct sp_model_info info;
    CHECK(sp_model_get_info(m, &info) == SP_OK);
    CHECK(info.arch && strcmp(info.arch, "llama") == 0);
    CHECK(info.n_experts == 8 && info.n_experts_used == 2 && info.n_ff_exp == 192);
    /* bytes_per_token: every tensor, but one row of token_embd (the output
     * head is separate) and 2 of the 8 experts of each _exps tensor. */
    uint64_t all = 0, exps = 0, embd = 0;
    for (int32_t i = 0; i < sp_model_n_tensors(m); i++) {
        struct sp_tensor_info ti;
        if (sp_model_get_tensor(m, i, &ti) != SP_OK) continue;
        all += ti.size;
        if (strstr(ti.name, "_exps.")) exps += ti.size;
        if (strcmp(ti.name, "token_embd.weight") == 0) embd = ti.size;
    }
    CHECKF(exps > 0 && exps % 8 == 0, "expert bytes %llu", (unsigned long long)exps);
    const uint64_t want = all - embd + embd / 512 - exps + exps / 8 * 2;
    CHECKF(info.bytes_per_token == want, "MoE bytes_per_token %llu, expected %llu", (unsigned long long)info.bytes_per_token,
           (unsigned long long)want);

    for (int32_t threads = 1; threads <= 2; threads++) {
        struct sp_session_params p = greedy_params(128, threads);
        struct sp_session *s = new_session(m, &p);
        if (!s) continue;
        alloc_arm(0, false);
        int32_t toks[32];
        sp_status st = generate(s, 32, toks);
        long calls = atomic_load(&A.n_calls);
        CHECKF(st == SP_OK, "MoE generate: %s (%s)", sp_status_str(st), sp_last_error());
        printf("  MoE token path, %d threads: %ld allocator calls over a 5-token prefill and 32 decode+sample steps\n",
               threads, calls);
        CHECKF(calls == 0, "%ld allocations on the MoE token path (%d threads)", calls, threads);
        sp_session_free(s);
    }

    /* Every allocation of a MoE session (its expert scratch included) may
     * fail: SP_E_NOMEM, nothing leaked. */
    long live0 = atomic_load(&A.n_live);
    static float ref[512];
    alloc_arm(0, false);
    sp_status st = moe_prompt_logits(m, 0, ref);
    const long total = atomic_load(&A.n_calls);
    int n_bad = 0, n_leak = 0;
    for (long nth = 1; st == SP_OK && nth <= total; nth++) {
        static float got[512];
        alloc_arm(nth, false);
        sp_status st_n = moe_prompt_logits(m, 0, got);
        alloc_arm(0, false);
        n_bad += st_n != SP_E_NOMEM && !(st_n == SP_OK && memcmp(got, ref, sizeof ref) == 0);
        n_leak += atomic_load(&A.n_live) != live0;
        live0 = atomic_load(&A.n_live);
    }
    printf("  MoE session fault injection: %ld allocations, %d wrong outcomes, %d leaking\n", total, n_bad, n_leak);
    CHECKF(st == SP_OK && n_bad == 0 && n_leak == 0, "MoE session fault injection: %d wrong outcomes, %d leaks",
           n_bad, n_leak);

    static float one[512], small[512];
    sp_status st1 = moe_prompt_logits(m, 0, one), st2 = moe_prompt_logits(m, 2, small);
    CHECK(st1 == SP_OK && st2 == SP_OK);
    double d = 0;
    for (int i = 0; i < 512; i++) { /* not fmax: aarch64 gcc 12 crashes vectorizing that reduction */
        const double e = fabs((double)one[i] - small[i]);
        if (e > d) d = e;
    }
    printf("  MoE prompt as one batch vs batches of 2: max|dlogit| %.3g\n", d);
    CHECKF(d <= 1e-4, "MoE prompt logits depend on the batch size: %g", d);
}
#endif

static void test_moe(void) {
    const char *path = need_fixture(MOE_MODEL);
    if (!path) return;
    struct sp_model_params mp = sp_model_default_params();
    struct sp_model *m = SENTINEL;
    sp_status st = sp_model_load(path, &mp, &m);
#if SP_TEST_MOE_SUPPORTED
    CHECKF(st == SP_OK, "MoE load: %s (%s)", sp_status_str(st), sp_last_error());
    if (st == SP_OK) {
        test_moe_runs(m);
        sp_model_free(m);
    }
#else
    EXPECT_ERR("MoE model (not supported yet)", st, SP_E_UNSUPPORTED, "expert");
    CHECK(m == NULL);
    if (m && m != SENTINEL) sp_model_free(m);
#endif
}

/* ------------------------------------------------------------------------- */
int main(void) {
    /* Before anything has failed the message is "". */
    CHECK(sp_last_error() != NULL && sp_last_error()[0] == '\0');

    sp_log_set(quiet_log, NULL);
    sp_set_allocator(&counting_allocator); /* no Sparrow object exists yet */
    sp_init();

    test_status_str();
    test_free_null();
    test_model_info();
    test_bad_files();
    remove_scratch_files();
    test_null_args();
    test_token_range();
    test_context_full();
    test_vocab_only();
    test_buffers();
    test_reset();
    test_seed();
    test_independent_sessions();
    test_no_alloc_on_token_path();
    test_leaks();
    fault_injection(false);
    fault_injection(true);
    test_moe();

    long live = atomic_load(&A.n_live);
    printf("  outstanding at exit: %ld blocks, %ld bytes; %d error-level log messages\n", live,
           atomic_load(&A.live_bytes), n_log_errors);
    CHECKF(live == 0, "%ld blocks still allocated at exit", live);
    sp_set_allocator(NULL);
    return test_report("test_api");
}
