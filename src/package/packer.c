/*
 * packer.c -- sp_package_pack: a GGUF file in, a package out (format/pack.h).
 * Shards are compressed on a few threads, each with its own single-threaded
 * zstd context, so a shard's frame depends on its bytes and the level alone
 * and the package does not depend on the thread count; frames are appended
 * in shard order.  Also sp_package_info.
 */
#include "package.h"

#include <stdio.h>
#include <time.h>
#include <zstd.h>

#define DEFAULT_LEVEL 3
#define MANIFEST_LEVEL 19 /* the manifest is small and read on every load: spend time on it once */

struct sp_package_params sp_package_default_params(void) {
    return (struct sp_package_params){.level = 0, .shard_size = 0, .n_threads = 0};
}

static sp_status check_params(const struct sp_package_params *p, const char *fn) {
    if (p->level < 0 || p->level > 19) return sp_err(SP_E_INVALID, "%s: zstd level %d outside 1..19", fn, (int)p->level);
    if (p->shard_size && (p->shard_size < SP_PACK_MIN_SHARD || p->shard_size > SP_PACK_MAX_SHARD)) {
        return sp_err(SP_E_INVALID, "%s: shard size %llu outside [%llu, %llu]", fn, (unsigned long long)p->shard_size,
                      (unsigned long long)SP_PACK_MIN_SHARD, (unsigned long long)SP_PACK_MAX_SHARD);
    }
    if (p->n_threads < 0 || p->n_threads > 256) return sp_err(SP_E_INVALID, "%s: n_threads %d outside 0..256", fn, (int)p->n_threads);
    return SP_OK;
}

/* Validated params with defaults (package.h). */
sp_status sp_package_params_resolve(const struct sp_package_params *in, const char *fn, struct sp_package_params *out) {
    *out = in ? *in : sp_package_default_params();
    sp_status rc = check_params(out, fn);
    if (rc) return rc;
    if (!out->level) out->level = DEFAULT_LEVEL;
    if (!out->shard_size) out->shard_size = SP_PACK_DEFAULT_SHARD;
    out->n_threads = sp_package_threads(out->n_threads);
    return SP_OK;
}

/* The manifest as one frame at `at`, then the header (package.h). */
sp_status sp_package_finish(struct sp_out *o, struct sp_pack_manifest *m, uint64_t at, uint64_t *end) {
    uint8_t *mb = NULL;
    size_t mn = 0, zn = 0;
    struct sp_scratch sc = {0};
    m->has_package = true;
    m->zstd_version = ZSTD_versionNumber();
    sp_status rc = sp_pack_manifest_bytes(m, &mb, &mn);
    if (!rc) rc = sp_zcompress(&sc, &sc.comp, &sc.comp_cap, mb, mn, MANIFEST_LEVEL, NULL, 0, &zn);
    if (!rc) rc = sp_out_pwrite(o, sc.comp, zn, at);
    struct sp_pack_file_header h = {.version = SP_PACK_VERSION, .manifest_offset = at, .manifest_size = zn};
    if (!rc) rc = sp_sha256(sc.comp, zn, h.manifest_sha);
    uint8_t hb[SP_PACK_HEADER_BYTES];
    sp_pack_header_write(&h, hb);
    if (!rc) rc = sp_out_pwrite(o, hb, sizeof hb, 0);
    *end = at + zn;
    sp_free(mb);
    sp_scratch_free(&sc);
    return rc;
}

struct pack_job {
    struct sp_src *src;
    struct sp_out *o;
    int level;
    struct sp_scratch *sc; /* (n_threads) */
    uint64_t at;           /* next frame's offset (in the ordered section) */
    struct sp_work w;
};

static sp_status pack_one(void *ctx, uint32_t i, int ith) {
    struct pack_job *j = ctx;
    struct sp_scratch *sc = &j->sc[ith];
    struct sp_pack_shard *sh = &j->src->m.shards[i];
    size_t zn;
    sp_status rc = sp_src_read_raw(j->src, i, sc, &sc->raw, &sc->raw_cap);
    if (!rc) rc = sp_zcompress(sc, &sc->comp, &sc->comp_cap, sc->raw, (size_t)sh->raw_size, j->level, NULL, 0, &zn);
    if (!rc) rc = sp_sha256(sc->comp, zn, sh->comp_sha);
    if (rc) return rc;
    sh->comp_size = zn;
    if (!sp_work_turn(&j->w, i)) return SP_OK;
    sh->comp_offset = j->at;
    rc = sp_out_pwrite(j->o, sc->comp, zn, j->at);
    j->at += zn;
    sp_work_add(&j->w, sh->raw_size);
    return rc;
}

sp_status sp_package_pack(const char *in, const char *out, const struct sp_package_params *params,
                          struct sp_package_stats *st) {
    const double t0 = sp_package_now();
    struct sp_package_params P;
    sp_status rc = sp_package_params_resolve(params, __func__, &P);
    if (rc) return rc;
    if (!in || !out) return sp_err(SP_E_INVALID, "%s: NULL path", __func__);
    struct sp_src *src = NULL;
    struct sp_out o = {.fd = -1};
    struct pack_job j = {.level = P.level};
    if ((rc = sp_src_open(in, P.shard_size, &src))) goto done;
    if (src->spk) {
        rc = sp_err(SP_E_INVALID, "%s: '%s' is a package already (install it to pack it again)", __func__, in);
        goto done;
    }
    if ((rc = sp_out_open(&o, out))) goto done;
    j.src = src;
    j.o = &o;
    j.at = SP_PACK_HEADER_BYTES;
    if (!(j.sc = sp_scratch_array(P.n_threads))) {
        rc = SP_E_NOMEM;
        goto done;
    }
    j.w = (struct sp_work){.n_items = src->m.n_shards, .n_threads = P.n_threads, .ordered = true, .fn = pack_one,
                           .ctx = &j, .progress = P.progress, .progress_user = P.progress_user,
                           .total = src->m.file_size - src->m.header_size};
    if ((rc = sp_work_run(&j.w))) goto done;
    src->m.level = P.level;
    uint64_t end;
    if ((rc = sp_pack_content_id(&src->m)) || (rc = sp_package_finish(&o, &src->m, j.at, &end)) ||
        (rc = sp_out_commit(&o))) {
        goto done;
    }
    if (st) {
        memset(st, 0, sizeof *st);
        st->model_bytes = src->m.file_size;
        st->package_bytes = end;
        st->n_shards = src->m.n_shards;
        sp_sha256_hex(src->m.content_id, st->content_id);
        st->seconds = sp_package_now() - t0;
    }
done:
    sp_out_abort(&o);
    sp_scratch_array_free(j.sc, P.n_threads);
    sp_src_close(src);
    return rc;
}

sp_status sp_package_info(const char *path, struct sp_package_info *out) {
    if (!path || !out) return sp_err(SP_E_INVALID, "%s: NULL argument", __func__);
    memset(out, 0, sizeof *out);
    struct sp_file *f = NULL;
    struct sp_model_file *dir = NULL;
    struct sp_pack_manifest m = {0};
    sp_status rc = sp_file_open(path, &f);
    if (rc) return rc;
    uint8_t hb[SP_PATCH_HEADER_BYTES] = {0};
    out->file_bytes = sp_file_size(f);
    if ((rc = sp_file_read_at(f, 0, hb, (size_t)SP_MIN((uint64_t)sizeof hb, out->file_bytes)))) goto done;
    if (sp_pack_is_patch(hb, sizeof hb)) {
        struct sp_patch_header h;
        char where[300];
        snprintf(where, sizeof where, "patch '%s'", path);
        if ((rc = sp_patch_header_parse(hb, sizeof hb, out->file_bytes, where, &h))) goto done;
        out->patch = true;
        out->n_shards = h.n_records;
        out->shard_size = h.old_shard_size;
        sp_sha256_hex(h.new_id, out->content_id);
        sp_sha256_hex(h.old_id, out->old_content_id);
        const size_t tn = (size_t)h.n_records * 16;
        uint8_t *tb = sp_malloc(tn ? tn : 1);
        struct sp_patch_record *recs = sp_calloc(h.n_records ? h.n_records : 1, sizeof *recs);
        if (!tb || !recs) rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        if (!rc) rc = sp_file_read_at(f, h.table_offset, tb, tn);
        if (!rc) rc = sp_patch_table_parse(tb, tn, &h, where, recs);
        if (!rc) {
            struct sp_package_stats k;
            sp_package_count_kinds(recs, h.n_records, &k);
            out->n_ref = k.n_ref, out->n_whole = k.n_whole, out->n_delta = k.n_delta;
        }
        sp_free(tb);
        sp_free(recs);
        goto done;
    }
    if ((rc = sp_pack_read_manifest(f, &m, &dir))) goto done;
    out->model_bytes = m.file_size;
    out->header_bytes = m.header_size;
    out->shard_size = m.shard_size;
    out->n_shards = m.n_shards;
    out->n_tensors = dir->n_tensors;
    out->level = m.level;
    sp_sha256_hex(m.content_id, out->content_id);
done:
    sp_pack_manifest_clear(&m);
    sp_model_file_free(dir);
    sp_file_close(f);
    return rc;
}
