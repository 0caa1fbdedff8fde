/*
 * test_package.c -- model packages (src/package/, src/format/pack.c):
 *  - every GGUF in $SPARROW_SHARED/models packs and installs byte for byte,
 *    and packing twice (1 and 2 threads) gives the same bytes;
 *  - sp_model_load of a package gives the tokens of the GGUF, resident and
 *    budgeted (installed once into $SPARROW_CACHE);
 *  - diff/apply: a metadata edit travels as a manifest only; a changed
 *    tensor as whole or delta shards; GGUF and package targets both give
 *    the new model byte for byte;
 *  - nothing is half-written: a patch for another model, truncated or
 *    bit-flipped patches and packages, a full disk (RLIMIT_FSIZE) and kill
 *    -9 at random moments leave the old model byte-identical and loadable;
 *    each refusal names the shard or field; a rerun completes;
 *  - sp_model_edit: typed and string keys, malformed assignments refused.
 * Files go to a temporary folder under $SPARROW_SCRATCH (default /tmp).
 */
#include "sparrow.h"

#include "format/model_file.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

static char dir[4096];

static const char *path_in(const char *name) {
    return test_path(dir, name);
}

static bool same_file(const char *a, const char *b) {
    return test_same_file(a, b);
}

static bool copy_file(const char *from, const char *to) {
    size_t n = 0;
    char *b = test_read_file(from, &n);
    FILE *f = b ? fopen(to, "wb") : NULL;
    const bool ok = f && fwrite(b, 1, n, f) == n;
    if (f) fclose(f);
    free(b);
    return ok;
}

static bool write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    const bool ok = f && fwrite(p, 1, n, f) == n;
    if (f) fclose(f);
    return ok;
}

static int count_tmp_files(void) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, "tmp") != NULL; /* .sparrow-tmp.<pid> */
    closedir(d);
    return n;
}

static struct sp_package_params params(int threads, uint64_t shard) {
    struct sp_package_params p = sp_package_default_params();
    p.n_threads = threads;
    p.shard_size = shard;
    return p;
}

/* Greedy tokens of a model (n of them after "Once upon a time"). */
static int greedy(const char *path, uint64_t budget, int32_t *out, int n) {
    struct sp_model_params mp = sp_model_default_params();
    mp.mem_budget = budget;
    struct sp_model *m = NULL;
    struct sp_session *s = NULL;
    if (sp_model_load(path, &mp, &m) != SP_OK) {
        fprintf(stderr, "load %s: %s\n", path, sp_last_error());
        return -1;
    }
    struct sp_session_params sp = sp_session_default_params();
    sp.sampling.temp = 0;
    sp.n_ctx = 64;
    int got = -1;
    int32_t ids[64], nids = 0;
    if (sp_session_init(m, &sp, &s) != SP_OK) fprintf(stderr, "session %s: %s\n", path, sp_last_error());
    if (s &&
        sp_tokenize(m, "Once upon a time", 16, SP_TOKENIZE_ADD_BOS, ids, 64, &nids) == SP_OK &&
        sp_decode(s, ids, nids) == SP_OK) {
        got = 0;
        while (got < n) {
            int32_t t;
            if (sp_sample(s, &t) != SP_OK) break;
            out[got++] = t;
            if (sp_decode(s, &t, 1) != SP_OK) break;
        }
    }
    sp_session_free(s);
    sp_model_free(m);
    return got;
}

static bool loads(const char *path) {
    struct sp_model *m = NULL;
    const bool ok = sp_model_load(path, NULL, &m) == SP_OK;
    sp_model_free(m);
    return ok;
}

/* ---- round trips ------------------------------------------------------------ */

static const char *const models[] = {
    "models/stories260K/stories260K-f32.gguf",          "models/stories260K/stories260K-q4_0.gguf",
    "models/stories260K/stories260K-q8_0.gguf",         "models/stories260K-moe/stories260K-moe-f32.gguf",
    "models/stories260K-moe/stories260K-moe-q8_0.gguf", "models/stories260K-pad256/stories260K-pad256-f32.gguf",
    "models/stories260K-pad256/stories260K-pad256-q2_k.gguf",
    "models/stories260K-pad256/stories260K-pad256-q3_k_m.gguf",
    "models/stories260K-pad256/stories260K-pad256-q4_k_m.gguf",
    "models/stories260K-pad256/stories260K-pad256-q5_k_m.gguf",
    "models/stories260K-pad256/stories260K-pad256-q6_k.gguf", "models/tiny-qwen/tiny-qwen2-f32.gguf",
    "models/tiny-qwen/tiny-qwen2-q8_0.gguf",            "models/tiny-qwen/tiny-qwen3-bf16.gguf",
    "models/tiny-qwen/tiny-qwen3-f32.gguf",             "models/tiny-qwen/tiny-qwen3-q8_0.gguf",
    "models/tiny-qwen/tiny-qwen3moe-f32.gguf",          "models/tiny-qwen/tiny-qwen3moe-q8_0.gguf",
};

static void test_round_trips(void) {
    /* the list above must be every GGUF there is */
    int listed = 0;
    for (size_t i = 0; i < SP_ARRAY_LEN(models); i++) listed += need_fixture(models[i]) != NULL;
    int found = 0;
    static const char *const folders[] = {"models/stories260K", "models/stories260K-moe", "models/stories260K-pad256",
                                          "models/tiny-qwen"};
    for (size_t k = 0; k < SP_ARRAY_LEN(folders); k++) {
        DIR *d = opendir(fixture(folders[k]));
        for (struct dirent *e; d && (e = readdir(d));) {
            const size_t n = strlen(e->d_name);
            found += n > 5 && strcmp(e->d_name + n - 5, ".gguf") == 0;
        }
        if (d) closedir(d);
    }
    CHECKF(found == listed, "%d GGUF files in the fixtures, %d in the list", found, listed);

    for (size_t i = 0; i < SP_ARRAY_LEN(models); i++) {
        const char *src = fixture(models[i]);
        if (access(src, R_OK) != 0) continue;
        /* small shards, so that tensors split and group */
        struct sp_package_params p1 = params(1, 64 << 10), p2 = params(2, 64 << 10);
        struct sp_package_stats st;
        CHECKF(sp_package_pack(src, path_in("a.spk"), &p1, &st) == SP_OK, "%s: %s", src, sp_last_error());
        CHECKF(st.n_shards > 1 && st.package_bytes < st.model_bytes + 4096 + st.n_shards * 64ull, "%s: %u shards", src,
               st.n_shards);
        CHECKF(sp_package_pack(src, path_in("b.spk"), &p2, NULL) == SP_OK, "%s", sp_last_error());
        CHECKF(same_file(path_in("a.spk"), path_in("b.spk")), "%s: packing twice gave different bytes", src);
        CHECKF(sp_package_install(path_in("a.spk"), path_in("a.gguf"), &p2, &st) == SP_OK, "%s: %s", src,
               sp_last_error());
        CHECKF(same_file(src, path_in("a.gguf")), "%s: the installed file differs", src);
        struct sp_package_info pi;
        CHECK(sp_package_info(path_in("a.spk"), &pi) == SP_OK && !pi.patch && pi.n_shards == st.n_shards &&
              strcmp(pi.content_id, st.content_id) == 0);
    }
    /* the default shard size: one or two shards per layer of these tiny files */
    struct sp_package_stats st;
    CHECK(sp_package_pack(fixture(models[0]), path_in("d.spk"), NULL, &st) == SP_OK);
    CHECK(sp_package_install(path_in("d.spk"), path_in("d.gguf"), NULL, NULL) == SP_OK);
    CHECK(same_file(fixture(models[0]), path_in("d.gguf")));
    /* not a GGUF */
    CHECK(sp_package_pack(fixture("models/stories260K/stories260K.bin"), path_in("x.spk"), NULL, NULL) == SP_E_INVALID);
    CHECK(sp_package_pack(path_in("d.spk"), path_in("x.spk"), NULL, NULL) == SP_E_INVALID);
    CHECK(access(path_in("x.spk"), F_OK) != 0);
}

/* ---- loading a package ------------------------------------------------------------ */

static void test_load(void) {
    static const char *const load_models[] = {"models/stories260K/stories260K-q8_0.gguf",
                                              "models/tiny-qwen/tiny-qwen3moe-q8_0.gguf"};
    char cache[4300];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("SPARROW_CACHE", cache, 1);
    for (size_t i = 0; i < SP_ARRAY_LEN(load_models); i++) {
        const char *src = fixture(load_models[i]);
        if (access(src, R_OK) != 0) continue;
        struct sp_package_params p = params(2, 64 << 10);
        CHECK(sp_package_pack(src, path_in("l.spk"), &p, NULL) == SP_OK);
        int32_t a[24], b[24], c[24];
        const int na = greedy(src, 0, a, 24), nb = greedy(path_in("l.spk"), 0, b, 24);
        CHECKF(na == 24 && nb == na && memcmp(a, b, sizeof a) == 0, "%s: package tokens differ (%d, %d)", src, na, nb);
        /* budgeted: installed once into the cache, then found there */
        const int nc = greedy(path_in("l.spk"), 2ull << 30, c, 24); /* room for ASan too */
        CHECKF(nc == 24 && memcmp(a, c, sizeof a) == 0, "%s: budgeted package tokens differ", src);
        CHECK(greedy(path_in("l.spk"), 2ull << 30, c, 24) == 24 && memcmp(a, c, sizeof a) == 0);
        struct sp_package_info pi;
        CHECK(sp_package_info(path_in("l.spk"), &pi) == SP_OK);
        char cached[4500];
        snprintf(cached, sizeof cached, "%s/%s.gguf", cache, pi.content_id);
        CHECKF(same_file(src, cached), "the cached copy %s is not the packed file", cached);
        unlink(cached);
        struct sp_model *m = NULL;
        struct sp_model_info mi;
        CHECK(sp_model_load(path_in("l.spk"), NULL, &m) == SP_OK && sp_model_get_info(m, &mi) == SP_OK &&
              strstr(mi.file_format, "package") != NULL);
        sp_model_free(m);
    }
    rmdir(cache);
}

/* ---- diffs and patches ---------------------------------------------------------------- */

/* Flip bytes of tensor `name` in a copy of a GGUF (a changed tensor). */
static bool change_tensor(const char *src, const char *dst, const char *name, size_t n_bytes) {
    struct sp_model *m = NULL;
    if (sp_model_load(src, NULL, &m) != SP_OK) return false;
    uint64_t off = 0, size = 0;
    for (int32_t i = 0; i < sp_model_n_tensors(m); i++) {
        struct sp_tensor_info ti;
        if (sp_model_get_tensor(m, i, &ti) == SP_OK && strcmp(ti.name, name) == 0) off = ti.offset, size = ti.size;
    }
    sp_model_free(m);
    size_t n = 0;
    unsigned char *b = (unsigned char *)test_read_file(src, &n);
    if (!b || !size) {
        free(b);
        return false;
    }
    const size_t stride = SP_MAX((size_t)1, (size_t)size / SP_MAX(n_bytes, (size_t)1));
    for (size_t k = 0; k < n_bytes && k * stride < size; k++) b[off + k * stride] ^= 0x5a;
    const bool ok = write_bytes(dst, b, n);
    free(b);
    return ok;
}

static void test_patches(void) {
    const char *src = need_fixture("models/stories260K-pad256/stories260K-pad256-f32.gguf");
    if (!src) return;
    struct sp_package_params p = params(2, 64 << 10);
    struct sp_package_stats st;
    CHECK(copy_file(src, path_in("old.gguf")));

    /* (b) metadata only: a new chat template moves every data offset */
    CHECK(copy_file(src, path_in("meta.gguf")));
    const char *set[] = {"tokenizer.chat_template={% for m in messages %}{{ m.content }}{% endfor %}",
                         "general.name=edited", "sparrow.test.n:u32=7"};
    CHECKF(sp_model_edit(path_in("meta.gguf"), set, 3) == SP_OK, "%s", sp_last_error());
    CHECK(sp_package_diff(path_in("old.gguf"), path_in("meta.gguf"), path_in("meta.spkd"), &p, &st) == SP_OK);
    CHECKF(st.n_whole == 0 && st.n_delta == 0 && st.n_ref == st.n_shards && st.patch_bytes < 8192,
           "a metadata edit: %u whole, %u delta, %llu bytes", st.n_whole, st.n_delta, (unsigned long long)st.patch_bytes);
    CHECKF(sp_package_apply(path_in("old.gguf"), path_in("meta.spkd"), path_in("meta2.gguf"), &p, NULL) == SP_OK, "%s",
           sp_last_error());
    CHECK(same_file(path_in("meta.gguf"), path_in("meta2.gguf")));

    /* a changed tensor, a few bytes (delta) and all of it (whole) */
    CHECK(change_tensor(src, path_in("new.gguf"), "blk.2.attn_q.weight", 40));
    CHECK(sp_package_diff(path_in("old.gguf"), path_in("new.gguf"), path_in("new.spkd"), &p, &st) == SP_OK);
    CHECKF(st.n_delta >= 1 && st.n_ref + 4 >= st.n_shards && st.patch_bytes < 64 << 10,
           "a few bytes changed: %u ref, %u whole, %u delta of %u, %llu bytes", st.n_ref, st.n_whole, st.n_delta,
           st.n_shards, (unsigned long long)st.patch_bytes);
    /* GGUF -> GGUF, package -> package, update in place */
    CHECK(sp_package_apply(path_in("old.gguf"), path_in("new.spkd"), path_in("new2.gguf"), &p, NULL) == SP_OK);
    CHECK(same_file(path_in("new.gguf"), path_in("new2.gguf")));
    CHECK(sp_package_pack(path_in("old.gguf"), path_in("old.spk"), &p, NULL) == SP_OK);
    CHECK(sp_package_pack(path_in("new.gguf"), path_in("new.spk"), &p, NULL) == SP_OK);
    CHECKF(sp_package_apply(path_in("old.spk"), path_in("new.spkd"), path_in("new2.spk"), &p, &st) == SP_OK, "%s",
           sp_last_error());
    CHECK(sp_package_install(path_in("new2.spk"), path_in("new3.gguf"), &p, NULL) == SP_OK);
    CHECK(same_file(path_in("new.gguf"), path_in("new3.gguf")));
    struct sp_package_info a, b;
    CHECK(sp_package_info(path_in("new2.spk"), &a) == SP_OK && sp_package_info(path_in("new.spk"), &b) == SP_OK &&
          strcmp(a.content_id, b.content_id) == 0);
    /* package <-> GGUF diffs give the same patch */
    CHECK(sp_package_diff(path_in("old.spk"), path_in("new.spk"), path_in("new-spk.spkd"), &p, NULL) == SP_OK);
    CHECK(same_file(path_in("new.spkd"), path_in("new-spk.spkd")));
    CHECK(copy_file(path_in("old.gguf"), path_in("upd.gguf")));
    CHECK(sp_package_apply(path_in("upd.gguf"), path_in("new.spkd"), NULL, &p, NULL) == SP_OK);
    CHECK(same_file(path_in("new.gguf"), path_in("upd.gguf")));

    /* a whole tensor re-drawn: whole shards, ~ the compressed changed shards */
    CHECK(change_tensor(src, path_in("big.gguf"), "blk.0.ffn_up.weight", 1u << 30));
    CHECK(sp_package_diff(path_in("old.gguf"), path_in("big.gguf"), path_in("big.spkd"), &p, &st) == SP_OK);
    CHECKF(st.n_whole + st.n_delta >= 1 && st.patch_bytes <= st.changed_comp_bytes * 105 / 100 + (64 << 10),
           "patch %llu bytes for %llu of changed shards", (unsigned long long)st.patch_bytes,
           (unsigned long long)st.changed_comp_bytes);
    CHECK(sp_package_apply(path_in("old.gguf"), path_in("big.spkd"), path_in("big2.gguf"), &p, NULL) == SP_OK);
    CHECK(same_file(path_in("big.gguf"), path_in("big2.gguf")));
    struct sp_package_info pi;
    CHECK(sp_package_info(path_in("big.spkd"), &pi) == SP_OK && pi.patch && pi.n_ref + pi.n_whole + pi.n_delta == pi.n_shards);
    unlink(path_in("big.gguf"));
    unlink(path_in("big2.gguf"));
    unlink(path_in("big.spkd"));
}

/* ---- nothing half-written ------------------------------------------------------------- */

/* fn must fail with a message containing want, and leave victim as it was. */
#define REFUSED(call, want, victim, copy)                                                                    \
    do {                                                                                                     \
        const sp_status rc_ = (call);                                                                        \
        CHECKF(rc_ != SP_OK && strstr(sp_last_error(), want), "%s: status %d, message '%s' (want '%s')", #call, \
               (int)rc_, sp_last_error(), want);                                                             \
        CHECKF(same_file(victim, copy), "%s changed after a refused call", victim);                         \
        CHECK(count_tmp_files() == 0);                                                                       \
    } while (0)

static void flip_byte(const char *from, const char *to, double where) {
    size_t n = 0;
    unsigned char *b = (unsigned char *)test_read_file(from, &n);
    if (b && n) b[(size_t)(where * (double)(n - 1))] ^= 0x10;
    CHECK(b && write_bytes(to, b, n));
    free(b);
}

static void truncate_to(const char *from, const char *to, size_t keep_less) {
    size_t n = 0;
    char *b = test_read_file(from, &n);
    CHECK(b && n > keep_less && write_bytes(to, b, n - keep_less));
    free(b);
}

static void test_refusals(void) {
    const char *other = need_fixture("models/stories260K/stories260K-q8_0.gguf");
    if (!other || access(path_in("new.spkd"), R_OK) != 0) return;
    struct sp_package_params p = params(2, 64 << 10);
    CHECK(copy_file(path_in("old.gguf"), path_in("keep.gguf")));
    CHECK(copy_file(path_in("old.spk"), path_in("keep.spk")));

    /* a patch for another model: refused before anything is written */
    CHECK(copy_file(other, path_in("other.gguf")));
    REFUSED(sp_package_apply(path_in("other.gguf"), path_in("new.spkd"), NULL, &p, NULL), "another model",
            path_in("other.gguf"), other);
    /* truncated and bit-flipped patches, on GGUF and package targets */
    truncate_to(path_in("new.spkd"), path_in("t.spkd"), 100);
    REFUSED(sp_package_apply(path_in("old.gguf"), path_in("t.spkd"), NULL, &p, NULL), "truncated", path_in("old.gguf"),
            path_in("keep.gguf"));
    flip_byte(path_in("new.spkd"), path_in("f.spkd"), 0.99); /* in a payload: the shard is named */
    REFUSED(sp_package_apply(path_in("old.gguf"), path_in("f.spkd"), NULL, &p, NULL), "shard", path_in("old.gguf"),
            path_in("keep.gguf"));
    REFUSED(sp_package_apply(path_in("old.spk"), path_in("f.spkd"), NULL, &p, NULL), "shard", path_in("old.spk"),
            path_in("keep.spk"));
    flip_byte(path_in("new.spkd"), path_in("h.spkd"), 0.1); /* in the manifest or table: the field is named */
    REFUSED(sp_package_apply(path_in("old.gguf"), path_in("h.spkd"), NULL, &p, NULL), "table_sha256", path_in("old.gguf"),
            path_in("keep.gguf"));
    /* damaged packages: refused naming the shard or field, the old file kept */
    CHECK(copy_file(path_in("old.gguf"), path_in("inst.gguf")));
    flip_byte(path_in("old.spk"), path_in("f.spk"), 0.5);
    REFUSED(sp_package_install(path_in("f.spk"), path_in("inst.gguf"), &p, NULL), "shard", path_in("inst.gguf"),
            path_in("keep.gguf"));
    flip_byte(path_in("old.spk"), path_in("m.spk"), 0.9999);
    REFUSED(sp_package_install(path_in("m.spk"), path_in("inst.gguf"), &p, NULL), "manifest", path_in("inst.gguf"),
            path_in("keep.gguf"));
    truncate_to(path_in("old.spk"), path_in("t.spk"), 1000);
    REFUSED(sp_package_install(path_in("t.spk"), path_in("inst.gguf"), &p, NULL), "manifest_offset", path_in("inst.gguf"),
            path_in("keep.gguf"));
    struct sp_model *m = NULL;
    CHECK(sp_model_load(path_in("f.spk"), NULL, &m) != SP_OK && strstr(sp_last_error(), "shard"));
    /* a full disk: writes past RLIMIT_FSIZE fail (EFBIG) like ENOSPC */
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_FSIZE, &old_lim);
    signal(SIGXFSZ, SIG_IGN);
    lim = old_lim;
    lim.rlim_cur = 200 << 10;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    REFUSED(sp_package_apply(path_in("inst.gguf"), path_in("new.spkd"), NULL, &p, NULL), "inst.gguf", path_in("inst.gguf"),
            path_in("keep.gguf"));
    REFUSED(sp_package_install(path_in("new.spk"), path_in("inst.gguf"), &p, NULL), "inst.gguf", path_in("inst.gguf"),
            path_in("keep.gguf"));
    REFUSED(sp_package_pack(path_in("new.gguf"), path_in("keep.spk"), &p, NULL), "keep.spk", path_in("keep.spk"),
            path_in("old.spk"));
    CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    signal(SIGXFSZ, SIG_DFL);
    CHECK(loads(path_in("inst.gguf")) && loads(path_in("old.spk")));
    for (const char *const *f = (const char *const[]){"t.spkd", "f.spkd", "h.spkd", "f.spk", "m.spk", "t.spk",
                                                      "other.gguf", NULL};
         *f; f++) {
        unlink(path_in(*f));
    }
}

/* kill -9 at random moments of an update, a pack and an install: the target
 * is the old file or the new one, whole; a rerun completes. */
static void test_kill(void) {
    if (access(path_in("new.spkd"), R_OK) != 0) return;
    srand((unsigned)time(NULL));
    int killed = 0, finished = 0;
    for (int k = 0; k < 12; k++) {
        const int op = k % 3;
        const char *target = op == 0 ? path_in("kill.gguf") : op == 1 ? path_in("kill.spk") : path_in("kinst.gguf");
        const char *before = op == 0 ? path_in("keep.gguf") : op == 1 ? path_in("keep.spk") : path_in("keep.gguf");
        const char *after = op == 0 ? path_in("new.gguf") : op == 1 ? path_in("new.spk") : path_in("new.gguf");
        CHECK(copy_file(before, target));
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0) {
            struct sp_package_params p = params(2, 64 << 10);
            sp_status rc = op == 0   ? sp_package_apply(target, path_in("new.spkd"), NULL, &p, NULL)
                           : op == 1 ? sp_package_pack(path_in("new.gguf"), target, &p, NULL)
                                     : sp_package_install(path_in("new.spk"), target, &p, NULL);
            _exit(rc == SP_OK ? 0 : 1);
        }
        struct timespec ts = {0, (long)(rand() % 60000) * 1000}; /* 0..60 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status)) killed++;
        else finished += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        CHECKF(same_file(target, before) || same_file(target, after), "kill %d (op %d): the target is neither old nor new",
               k, op);
        CHECK(loads(target));
        /* a rerun completes and leaves no temporary file */
        struct sp_package_params p = params(2, 64 << 10);
        const bool at_new = same_file(target, after);
        sp_status rc = op == 0 ? (at_new ? SP_OK : sp_package_apply(target, path_in("new.spkd"), NULL, &p, NULL))
                       : op == 1 ? sp_package_pack(path_in("new.gguf"), target, &p, NULL)
                                 : sp_package_install(path_in("new.spk"), target, &p, NULL);
        CHECKF(rc == SP_OK, "rerun after kill %d: %s", k, sp_last_error());
        CHECK(same_file(target, after));
        CHECK(count_tmp_files() == 0);
        unlink(target);
    }
    printf("kill -9: %d killed mid-way, %d had finished\n", killed, finished);
}

/* ---- edit ------------------------------------------------------------------------------ */

static void test_edit(void) {
    const char *src = need_fixture("models/stories260K/stories260K-q4_0.gguf");
    if (!src) return;
    CHECK(copy_file(src, path_in("e.gguf")));
    const char *set[] = {"general.name=a=b", "sparrow.t.f:f32=0.5", "sparrow.t.b:bool=true", "sparrow.t.i:i64=-3"};
    CHECK(sp_model_edit(path_in("e.gguf"), set, 4) == SP_OK);
    struct sp_model *m = NULL;
    CHECK(sp_model_load(path_in("e.gguf"), NULL, &m) == SP_OK);
    struct sp_model_info mi;
    CHECK(m && sp_model_get_info(m, &mi) == SP_OK && strcmp(mi.name, "a=b") == 0);
    int seen = 0;
    for (int32_t i = 0; m && i < sp_model_n_meta(m); i++) {
        char k[128], v[128];
        CHECK(sp_model_get_meta(m, i, k, sizeof k, v, sizeof v) == SP_OK);
        seen += (strcmp(k, "sparrow.t.f") == 0 && strcmp(v, "0.5") == 0) +
                (strcmp(k, "sparrow.t.b") == 0 && strcmp(v, "true") == 0) +
                (strcmp(k, "sparrow.t.i") == 0 && strcmp(v, "-3") == 0);
    }
    CHECK(seen == 3);
    sp_model_free(m);
    CHECK(copy_file(path_in("e.gguf"), path_in("e0.gguf")));
    static const char *const bad[] = {"novalue", "=x", "k:u8=256", "k:u32=-1", "k:f32=abc", "k:nope=1", "k:bool=yes"};
    for (size_t i = 0; i < SP_ARRAY_LEN(bad); i++) {
        REFUSED(sp_model_edit(path_in("e.gguf"), &bad[i], 1), bad[i][0] == '=' ? "=x" : bad[i], path_in("e.gguf"),
                path_in("e0.gguf"));
    }
    unlink(path_in("e.gguf"));
    unlink(path_in("e0.gguf"));
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/sparrow-package.XXXXXX", scratch_dir());
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a folder under %s\n", scratch_dir());
        return 1;
    }
    sp_log_set(NULL, NULL);
    test_round_trips();
    test_load();
    test_patches();
    test_refusals();
    test_kill();
    test_edit();
    CHECK(count_tmp_files() == 0);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] != '.') unlink(path_in(e->d_name));
    }
    if (d) closedir(d);
    rmdir(dir);
    return test_report("test_package");
}
