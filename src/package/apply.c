/*
 * apply.c -- sp_package_apply: a patch (format/pack.h) on a model, a GGUF
 * file or a package, giving the new model of the same kind, beside it as a
 * temporary file renamed into place only once every new shard's SHA-256 and
 * the old model's content id have been checked.  Order of checks: the old
 * model's header against the patch's (cheap: a patch for another model is
 * refused before anything is written), a package's content id, then every
 * old shard's bytes as they are used (a GGUF's unused shards too, so that
 * its content id can be computed), every new shard before it is written.
 */
#include "package.h"

#include <stdio.h>
#include <time.h>

struct apply_job {
    struct sp_src *t;             /* the old model */
    struct sp_file *pf;           /* the patch */
    const char *patch_path;
    struct sp_pack_manifest *nm;  /* the new content section (+ package section for a package) */
    struct sp_model_file *ndir;   /* its directory (names for messages) */
    const struct sp_patch_record *recs;
    struct sp_out *o;
    int level;
    struct sp_scratch *sc;        /* (n_threads) */
    uint64_t at;                  /* package output: next frame's offset */
    struct sp_work w;
};

static void new_name(const struct apply_job *j, uint32_t i, char *buf, size_t cap) {
    char name[200];
    sp_pack_shard_name(j->nm, j->ndir, i, name, sizeof name);
    snprintf(buf, cap, "patch '%s': new %s", j->patch_path, name);
}

static sp_status apply_one(void *ctx, uint32_t i, int ith) {
    struct apply_job *j = ctx;
    const struct sp_patch_record *r = &j->recs[i];
    struct sp_pack_shard *sh = &j->nm->shards[i];
    struct sp_scratch *sc = &j->sc[ith];
    char name[400];
    sp_status rc;
    if ((rc = sp_scratch_ctx(sc))) return rc;
    if (r->kind != SP_PATCH_WHOLE) { /* the old shard: checked against its hash */
        if (j->t->m.shards[r->old_shard].raw_size != sh->raw_size && r->kind == SP_PATCH_REF) {
            new_name(j, i, name, sizeof name);
            return sp_err(SP_E_FORMAT, "%s: refers to old shard %u of %llu bytes for %llu", name, r->old_shard,
                          (unsigned long long)j->t->m.shards[r->old_shard].raw_size, (unsigned long long)sh->raw_size);
        }
        if ((rc = sp_src_read_raw(j->t, r->old_shard, sc, &sc->old, &sc->old_cap))) return rc;
    }
    /* the new raw bytes in `raw` */
    const uint8_t *raw = sc->old;
    if (r->kind != SP_PATCH_REF) {
        if ((rc = sp_scratch_grow(&sc->delta, &sc->delta_cap, (size_t)r->size)) ||
            (rc = sp_scratch_grow(&sc->raw, &sc->raw_cap, (size_t)sh->raw_size)) ||
            (rc = sp_file_read_at(j->pf, r->offset, sc->delta, (size_t)r->size))) {
            return rc;
        }
        new_name(j, i, name, sizeof name);
        const bool delta = r->kind == SP_PATCH_DELTA;
        if ((rc = sp_pack_decompress(sc->dctx, sc->delta, (size_t)r->size, sc->raw, (size_t)sh->raw_size,
                                     delta ? sc->old : NULL, delta ? (size_t)j->t->m.shards[r->old_shard].raw_size : 0,
                                     name))) {
            return rc;
        }
        raw = sc->raw;
    }
    uint8_t d[SP_SHA256_BYTES];
    if ((rc = sp_sha256(raw, (size_t)sh->raw_size, d))) return rc;
    if (!sp_sha256_eq(d, sh->raw_sha)) {
        new_name(j, i, name, sizeof name);
        return sp_err(SP_E_FORMAT, "%s: the bytes it gives do not match the new manifest's SHA-256: the patch is damaged "
                      "or was made against other bytes", name);
    }
    sp_work_add(&j->w, sh->raw_size);
    if (!j->t->spk) return sp_out_pwrite(j->o, raw, (size_t)sh->raw_size, sh->raw_offset);
    /* a package: the old frame, the patch's whole frame, or a fresh one */
    const uint8_t *frame;
    size_t fn;
    if (r->kind == SP_PATCH_REF) {
        frame = sc->comp; /* left there by sp_src_read_raw, checked */
        fn = (size_t)j->t->m.shards[r->old_shard].comp_size;
    } else if (r->kind == SP_PATCH_WHOLE) {
        frame = sc->delta;
        fn = (size_t)r->size;
    } else {
        if ((rc = sp_zcompress(sc, &sc->comp, &sc->comp_cap, raw, (size_t)sh->raw_size, j->level, NULL, 0, &fn))) return rc;
        frame = sc->comp;
    }
    sh->comp_size = fn;
    if ((rc = sp_sha256(frame, fn, sh->comp_sha))) return rc;
    if (!sp_work_turn(&j->w, i)) return SP_OK;
    sh->comp_offset = j->at;
    rc = sp_out_pwrite(j->o, frame, fn, j->at);
    j->at += fn;
    return rc;
}

/* A GGUF model: hash the old shards no new shard used, for the content id. */
struct rest_job {
    struct sp_src *t;
    struct sp_scratch *sc;
};
static sp_status hash_rest(void *ctx, uint32_t i, int ith) {
    struct rest_job *j = ctx;
    if (atomic_load(&j->t->verified[i]) == 1) return SP_OK;
    return sp_src_read_raw(j->t, i, &j->sc[ith], &j->sc[ith].old, &j->sc[ith].old_cap);
}

sp_status sp_package_apply(const char *model, const char *patch, const char *out,
                           const struct sp_package_params *params, struct sp_package_stats *st) {
    const double t0 = sp_package_now();
    struct sp_package_params P;
    sp_status rc = sp_package_params_resolve(params, __func__, &P);
    if (rc) return rc;
    if (!model || !patch) return sp_err(SP_E_INVALID, "%s: NULL path", __func__);
    if (!out) out = model;
    struct sp_src *t = NULL;
    struct sp_file *pf = NULL;
    struct sp_patch_header h;
    struct sp_patch_record *recs = NULL;
    struct sp_pack_manifest nm = {0};
    struct sp_model_file *ndir = NULL;
    struct sp_out o = {.fd = -1};
    struct apply_job j = {.patch_path = patch};
    char where[600];
    snprintf(where, sizeof where, "patch '%s'", patch);

    if ((rc = sp_file_open(patch, &pf))) goto done;
    /* the model, cut like the old model the patch was made from */
    uint8_t hb[SP_PATCH_HEADER_BYTES] = {0};
    if ((rc = sp_file_read_at(pf, 0, hb, (size_t)SP_MIN((uint64_t)sizeof hb, sp_file_size(pf)))) ||
        (rc = sp_patch_header_parse(hb, sizeof hb, sp_file_size(pf), where, &h))) {
        goto done;
    }
    if ((rc = sp_src_open(model, h.old_shard_size, &t))) goto done;
    if ((rc = sp_patch_read(pf, t->m.header, (size_t)t->m.header_size, &h, &recs, &nm))) goto done;
    if (t->m.shard_size != h.old_shard_size || t->m.n_shards != h.old_n_shards ||
        (t->spk && !sp_sha256_eq(t->m.content_id, h.old_id))) {
        char a[SP_SHA256_HEX], b[SP_SHA256_HEX];
        sp_sha256_hex(h.old_id, a);
        sp_sha256_hex(t->m.content_id, b);
        rc = sp_err(SP_E_INVALID, "%s is for another model: it applies to content id %.16s... (%u shards of at most %llu "
                    "bytes), '%s' is %s%.16s... (%u shards of %llu)", where, a, h.old_n_shards,
                    (unsigned long long)h.old_shard_size, model, t->spk ? "" : "cut into ", t->spk ? b : "",
                    t->m.n_shards, (unsigned long long)t->m.shard_size);
        goto done;
    }
    if ((rc = sp_pack_check_layout(&nm, where, &ndir))) goto done;
    if ((rc = sp_out_open(&o, out))) goto done;
    if (!t->spk && ((rc = sp_out_reserve(&o, nm.file_size)) ||
                    (rc = sp_out_pwrite(&o, nm.header, (size_t)nm.header_size, 0)))) {
        goto done;
    }
    j.t = t;
    j.pf = pf;
    j.nm = &nm;
    j.ndir = ndir;
    j.recs = recs;
    j.o = &o;
    j.level = t->spk ? t->m.level : P.level;
    j.at = SP_PACK_HEADER_BYTES;
    if (!(j.sc = sp_scratch_array(P.n_threads))) {
        rc = SP_E_NOMEM;
        goto done;
    }
    j.w = (struct sp_work){.n_items = nm.n_shards, .n_threads = P.n_threads, .ordered = t->spk, .fn = apply_one,
                           .ctx = &j, .progress = P.progress, .progress_user = P.progress_user,
                           .total = nm.file_size - nm.header_size};
    if ((rc = sp_work_run(&j.w))) goto done;
    if (!t->spk) {
        struct rest_job rj = {.t = t, .sc = j.sc};
        struct sp_work w2 = {.n_items = t->m.n_shards, .n_threads = P.n_threads, .fn = hash_rest, .ctx = &rj};
        if ((rc = sp_work_run(&w2)) || (rc = sp_pack_content_id(&t->m))) goto done;
        if (!sp_sha256_eq(t->m.content_id, h.old_id)) {
            char a[SP_SHA256_HEX], b[SP_SHA256_HEX];
            sp_sha256_hex(h.old_id, a);
            sp_sha256_hex(t->m.content_id, b);
            rc = sp_err(SP_E_INVALID, "%s is for another model: it applies to content id %.16s..., '%s' has %.16s... "
                        "(nothing was changed)", where, a, model, b);
            goto done;
        }
    }
    uint64_t end = nm.file_size;
    if (t->spk) {
        nm.level = j.level;
        if ((rc = sp_package_finish(&o, &nm, j.at, &end))) goto done;
    }
    if ((rc = sp_out_commit(&o))) goto done;
    if (st) {
        memset(st, 0, sizeof *st);
        st->model_bytes = nm.file_size;
        st->package_bytes = t->spk ? end : 0;
        st->patch_bytes = sp_file_size(pf);
        st->n_shards = nm.n_shards;
        sp_package_count_kinds(recs, nm.n_shards, st);
        sp_sha256_hex(nm.content_id, st->content_id);
        st->seconds = sp_package_now() - t0;
    }
done:
    sp_out_abort(&o);
    sp_scratch_array_free(j.sc, P.n_threads);
    sp_model_file_free(ndir);
    sp_pack_manifest_clear(&nm);
    sp_free(recs);
    sp_file_close(pf);
    sp_src_close(t);
    return rc;
}
