/*
 * install.c -- a package back into the GGUF it holds: sp_package_install
 * (to a file, shards decompressed on a few threads and written at their
 * offsets), the loader's fill hook (the same, straight into the weight
 * region: no intermediate file), and the install-once cache a budgeted run
 * streams from.
 */
#include "package.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

/* ---- decompressing into memory ---------------------------------------------- */

struct fill_job {
    struct sp_src *src;
    struct sp_scratch *sc; /* (n_threads) */
    uint8_t *dst;          /* file bytes [off, off + n) */
    uint64_t off, n;
    struct sp_out *o;      /* instead of dst: write at the shard's offset */
    bool check_raw;        /* also hash the decompressed bytes (installs; a load
                              trusts a frame whose own SHA-256 matched) */
    struct sp_work w;
};

static sp_status fill_one(void *ctx, uint32_t i, int ith) {
    struct fill_job *j = ctx;
    struct sp_src *s = j->src;
    struct sp_scratch *sc = &j->sc[ith];
    const struct sp_pack_shard *sh = &s->m.shards[i];
    char name[300];
    sp_status rc;
    if (j->o) {
        if ((rc = sp_src_read_raw(s, i, sc, &sc->raw, &sc->raw_cap))) return rc;
        rc = sp_out_pwrite(j->o, sc->raw, (size_t)sh->raw_size, sh->raw_offset);
        sp_work_add(&j->w, sh->raw_size);
        return rc;
    }
    const uint64_t lo = SP_MAX(sh->raw_offset, j->off), hi = SP_MIN(sh->raw_offset + sh->raw_size, j->off + j->n);
    if (lo >= hi) return SP_OK;
    if (lo == sh->raw_offset && hi == sh->raw_offset + sh->raw_size) {
        /* the whole shard: decompress in place, then check */
        uint8_t *d = j->dst + (sh->raw_offset - j->off);
        uint8_t dg[SP_SHA256_BYTES];
        if ((rc = sp_src_read_comp(s, i, sc)) || (rc = sp_scratch_ctx(sc))) return rc;
        sp_src_shard_name(s, i, name, sizeof name);
        if ((rc = sp_pack_decompress(sc->dctx, sc->comp, (size_t)sh->comp_size, d, (size_t)sh->raw_size, NULL, 0, name)) ||
            (j->check_raw && (rc = sp_sha256(d, (size_t)sh->raw_size, dg)))) {
            return rc;
        }
        if (j->check_raw && !sp_sha256_eq(dg, sh->raw_sha)) {
            return sp_err(SP_E_FORMAT, "%s: its bytes do not match the manifest's SHA-256: the package is damaged", name);
        }
    } else {
        if ((rc = sp_src_read_raw(s, i, sc, &sc->raw, &sc->raw_cap))) return rc;
        memcpy(j->dst + (lo - j->off), sc->raw + (lo - sh->raw_offset), (size_t)(hi - lo));
    }
    sp_work_add(&j->w, hi - lo);
    return SP_OK;
}

static sp_status run_fill(struct sp_src *s, int n_threads, uint8_t *dst, uint64_t off, uint64_t n, struct sp_out *o,
                          sp_progress_fn progress, void *user) {
    const int nth = sp_package_threads(n_threads);
    struct fill_job j = {.src = s, .dst = dst, .off = off, .n = n, .o = o, .check_raw = o != NULL};
    if (!(j.sc = sp_scratch_array(nth))) return SP_E_NOMEM;
    j.w = (struct sp_work){.n_items = s->m.n_shards, .n_threads = nth, .fn = fill_one, .ctx = &j, .progress = progress,
                           .progress_user = user, .total = o ? s->m.file_size - s->m.header_size : n};
    sp_status rc = sp_work_run(&j.w);
    sp_scratch_array_free(j.sc, nth);
    return rc;
}

/* ---- the loader's hook ---------------------------------------------------------- */

struct sp_package_reader {
    struct sp_src *src;
    int n_threads;
};

sp_status sp_package_reader_open(const char *path, int n_threads, struct sp_package_reader **out) {
    *out = NULL;
    struct sp_package_reader *r = sp_calloc(1, sizeof *r);
    if (!r) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    sp_status rc = sp_src_open(path, 0, &r->src);
    if (!rc && !r->src->spk) rc = sp_err(SP_E_INVALID, "%s: '%s' is not a package", __func__, path);
    if (rc) {
        sp_package_reader_close(r);
        return rc;
    }
    r->n_threads = sp_package_threads(n_threads);
    *out = r;
    return SP_OK;
}

void sp_package_reader_close(struct sp_package_reader *r) {
    if (!r) return;
    sp_src_close(r->src);
    sp_free(r);
}

sp_status sp_package_fill(void *reader, void *dst, uint64_t off, uint64_t n) {
    struct sp_package_reader *r = reader;
    const struct sp_pack_manifest *m = &r->src->m;
    if (off > m->file_size || n > m->file_size - off) {
        return sp_err(SP_E_INVALID, "%s: bytes [%llu, +%llu) outside the %llu of '%s'", __func__, (unsigned long long)off,
                      (unsigned long long)n, (unsigned long long)m->file_size, r->src->path);
    }
    if (off < m->header_size) memcpy(dst, m->header + off, (size_t)SP_MIN(n, m->header_size - off));
    const double t0 = sp_package_now();
    const sp_status rc = run_fill(r->src, r->n_threads, dst, off, n, NULL, NULL, NULL);
    if (!rc) {
        const double el = sp_package_now() - t0;
        SP_LOG_I("'%s': %u shards decompressed into the weights (%.1f MiB) on %d threads in %.2f s, %.0f MB/s", r->src->path,
                 m->n_shards, (double)n / (1 << 20), r->n_threads, el, el > 0 ? (double)n / 1e6 / el : 0.0);
    }
    return rc;
}

/* ---- to a file ------------------------------------------------------------------ */

static sp_status install_src(struct sp_src *s, const char *out, const struct sp_package_params *P) {
    struct sp_out o;
    sp_status rc = sp_out_open(&o, out);
    if (rc) return rc;
    if (!(rc = sp_out_reserve(&o, s->m.file_size)) &&
        !(rc = sp_out_pwrite(&o, s->m.header, (size_t)s->m.header_size, 0)) &&
        !(rc = run_fill(s, P->n_threads, NULL, 0, 0, &o, P->progress, P->progress_user))) {
        rc = sp_out_commit(&o);
    }
    sp_out_abort(&o);
    return rc;
}

sp_status sp_package_install(const char *pkg, const char *out, const struct sp_package_params *params,
                             struct sp_package_stats *st) {
    const double t0 = sp_package_now();
    struct sp_package_params P;
    sp_status rc = sp_package_params_resolve(params, __func__, &P);
    if (rc) return rc;
    if (!pkg || !out) return sp_err(SP_E_INVALID, "%s: NULL path", __func__);
    struct sp_src *s = NULL;
    if ((rc = sp_src_open(pkg, 0, &s))) return rc;
    if (!s->spk) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' is not a package", __func__, pkg);
    } else {
        rc = install_src(s, out, &P);
    }
    if (!rc && st) {
        memset(st, 0, sizeof *st);
        st->model_bytes = s->m.file_size;
        st->package_bytes = sp_file_size(s->f);
        st->n_shards = s->m.n_shards;
        sp_sha256_hex(s->m.content_id, st->content_id);
        st->seconds = sp_package_now() - t0;
    }
    sp_src_close(s);
    return rc;
}

/* ---- the cache ------------------------------------------------------------------ */

/* mkdir -p */
static sp_status make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            sp_status rc = sp_err(SP_E_IO, "cannot create the folder '%s': %s", path, strerror(errno));
            *p = '/';
            return rc;
        }
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return sp_err(SP_E_IO, "cannot create the folder '%s': %s", path, strerror(errno));
    return SP_OK;
}

sp_status sp_package_cache_install(const char *pkg, int n_threads, char **out_path, bool *installed) {
    *out_path = NULL;
    *installed = false;
    char dir[4096];
    const char *env = getenv("SPARROW_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env) snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/sparrow", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/sparrow", home);
    else return sp_err(SP_E_INVALID, "'%s': no cache folder for the installed copy (set SPARROW_CACHE)", pkg);
    struct sp_src *s = NULL;
    sp_status rc = sp_src_open(pkg, 0, &s);
    if (rc) return rc;
    if (!s->spk) {
        sp_src_close(s);
        return sp_err(SP_E_INVALID, "%s: '%s' is not a package", __func__, pkg);
    }
    char id[SP_SHA256_HEX];
    sp_sha256_hex(s->m.content_id, id);
    const size_t n = strlen(dir) + sizeof id + 8;
    char *path = sp_malloc(n);
    if (!path) {
        sp_src_close(s);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    snprintf(path, n, "%s/%s.gguf", dir, id);
    /* An installed copy was renamed into place only once whole and checked:
     * its size and header bytes are enough to recognise it. */
    struct sp_file *f = NULL;
    bool have = false;
    if (sp_file_open(path, &f) == SP_OK && sp_file_size(f) == s->m.file_size) {
        uint8_t *h = sp_malloc(s->m.header_size ? (size_t)s->m.header_size : 1);
        have = h && sp_file_read_at(f, 0, h, (size_t)s->m.header_size) == SP_OK &&
               memcmp(h, s->m.header, (size_t)s->m.header_size) == 0;
        sp_free(h);
    }
    sp_file_close(f);
    sp_err_clear();
    if (!have) {
        struct sp_package_params P = sp_package_default_params();
        P.n_threads = sp_package_threads(n_threads);
        if (!(rc = make_dirs(dir))) rc = install_src(s, path, &P);
        *installed = rc == SP_OK;
    }
    sp_src_close(s);
    if (rc) {
        sp_free(path);
        return rc;
    }
    *out_path = path;
    return SP_OK;
}
