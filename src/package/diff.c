/*
 * diff.c -- sp_package_diff: the patch (format/pack.h) that turns OLD into
 * NEW.  Shards are matched by content (raw SHA-256), never by position: a
 * metadata edit moves every data offset of a GGUF and still costs only the
 * new manifest.  A changed shard travels as the smaller of its frame alone
 * and a zstd delta against the old shard holding most of the same tensors'
 * bytes (by tensor name and offset within the tensor).
 */
#include "package.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <zstd.h>

#define MANIFEST_LEVEL 19

static int cmp_digest(const void *a, const void *b, void *ctx) {
    const struct sp_pack_manifest *m = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const int c = memcmp(m->shards[x].raw_sha, m->shards[y].raw_sha, SP_SHA256_BYTES);
    return c ? c : (x < y ? -1 : x > y);
}

/* The old shard with the same raw bytes (lowest index), or -1: binary search
 * over old shards sorted by digest. */
static int64_t find_same(const struct sp_pack_manifest *om, const uint32_t *by_digest, const uint8_t *d) {
    uint32_t lo = 0, hi = om->n_shards;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (memcmp(om->shards[by_digest[mid]].raw_sha, d, SP_SHA256_BYTES) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < om->n_shards && memcmp(om->shards[by_digest[lo]].raw_sha, d, SP_SHA256_BYTES) == 0) return by_digest[lo];
    return -1;
}

/* The old shard sharing the most bytes of the same tensors at the same
 * offsets within them, or -1. */
static int64_t find_base(const struct sp_src *o, const struct sp_src *n, uint32_t i) {
    const struct sp_pack_shard *sh = &n->m.shards[i];
    int64_t best = -1;
    uint64_t best_bytes = 0;
    for (uint32_t k = 0; k < sh->n_ranges; k++) {
        const struct sp_pack_range *r = &n->m.ranges[sh->first_range + k];
        const struct sp_tensor_desc *t = &n->dir->tensors[r->tensor];
        const struct sp_tensor_desc *ot = sp_model_file_find(o->dir, t->name);
        if (!ot) continue;
        const uint32_t oi = (uint32_t)(ot - o->dir->tensors);
        for (uint32_t s = 0; s < o->m.n_shards; s++) { /* shards holding that old tensor */
            const struct sp_pack_shard *os = &o->m.shards[s];
            if (os->raw_offset >= ot->offset + ot->size || os->raw_offset + os->raw_size <= ot->offset) continue;
            for (uint32_t q = 0; q < os->n_ranges; q++) {
                const struct sp_pack_range *orr = &o->m.ranges[os->first_range + q];
                if (orr->tensor != oi) continue;
                const uint64_t a = SP_MAX(orr->offset, r->offset), b = SP_MIN(orr->offset + orr->length, r->offset + r->length);
                if (b > a && b - a > best_bytes) {
                    best_bytes = b - a;
                    best = s;
                }
            }
        }
    }
    return best;
}

struct diff_job {
    struct sp_src *o, *n;
    struct sp_out *out;
    int level;
    struct sp_patch_record *recs;
    struct sp_scratch *sc; /* (n_threads) */
    uint64_t at, changed_comp;
    struct sp_work w;
};

static sp_status diff_one(void *ctx, uint32_t i, int ith) {
    struct diff_job *j = ctx;
    struct sp_patch_record *r = &j->recs[i];
    const struct sp_pack_shard *sh = &j->n->m.shards[i];
    struct sp_scratch *sc = &j->sc[ith];
    sp_status rc;
    sp_work_add(&j->w, sh->raw_size);
    if (r->kind == SP_PATCH_REF) return SP_OK;
    const int64_t base = find_base(j->o, j->n, i);
    if (base >= 0 && (rc = sp_src_read_raw(j->o, (uint32_t)base, sc, &sc->old, &sc->old_cap))) return rc;
    /* whole: the new package's frame (left in sc->comp by the read), or a fresh one */
    size_t whole_n;
    if ((rc = sp_src_read_raw(j->n, i, sc, &sc->raw, &sc->raw_cap))) return rc;
    if (j->n->spk) {
        whole_n = (size_t)sh->comp_size;
    } else if ((rc = sp_zcompress(sc, &sc->comp, &sc->comp_cap, sc->raw, (size_t)sh->raw_size, j->level, NULL, 0,
                                  &whole_n))) {
        return rc;
    }
    const uint8_t *payload = sc->comp;
    size_t payload_n = whole_n;
    r->kind = SP_PATCH_WHOLE;
    if (base >= 0) {
        size_t delta_n;
        if ((rc = sp_zcompress(sc, &sc->delta, &sc->delta_cap, sc->raw, (size_t)sh->raw_size, j->level, sc->old,
                               (size_t)j->o->m.shards[base].raw_size, &delta_n))) {
            return rc;
        }
        if (delta_n < whole_n) {
            payload = sc->delta;
            payload_n = delta_n;
            r->kind = SP_PATCH_DELTA;
            r->old_shard = (uint32_t)base;
        }
    }
    r->size = payload_n;
    if (!sp_work_turn(&j->w, i)) return SP_OK;
    r->offset = j->at;
    rc = sp_out_pwrite(j->out, payload, payload_n, j->at);
    j->at += payload_n;
    j->changed_comp += whole_n;
    return rc;
}

sp_status sp_package_diff(const char *old_path, const char *new_path, const char *out,
                          const struct sp_package_params *params, struct sp_package_stats *st) {
    const double t0 = sp_package_now();
    struct sp_package_params P;
    sp_status rc = sp_package_params_resolve(params, __func__, &P);
    if (rc) return rc;
    if (!old_path || !new_path || !out) return sp_err(SP_E_INVALID, "%s: NULL path", __func__);
    struct sp_src *o = NULL, *n = NULL;
    struct sp_out w = {.fd = -1};
    struct diff_job j = {.level = P.level};
    uint32_t *by_digest = NULL;
    uint8_t *content = NULL, *meta = NULL;
    struct sp_scratch zs = {0};
    if ((rc = sp_src_open(old_path, P.shard_size, &o))) goto done;
    /* cut a GGUF NEW like OLD, so unchanged tensors give the same shards */
    if ((rc = sp_src_open(new_path, o->m.shard_size, &n))) goto done;
    if ((rc = sp_src_hash(o, P.n_threads, NULL, NULL)) || (rc = sp_src_hash(n, P.n_threads, NULL, NULL))) goto done;

    if (!(by_digest = sp_malloc((o->m.n_shards + 1) * sizeof *by_digest)) ||
        !(j.recs = sp_calloc(n->m.n_shards + 1, sizeof *j.recs)) ||
        !(j.sc = sp_calloc((size_t)P.n_threads, sizeof *j.sc))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    for (uint32_t i = 0; i < o->m.n_shards; i++) by_digest[i] = i;
    qsort_r(by_digest, o->m.n_shards, sizeof *by_digest, cmp_digest, &o->m);
    for (uint32_t i = 0; i < n->m.n_shards; i++) {
        const int64_t same = find_same(&o->m, by_digest, n->m.shards[i].raw_sha);
        j.recs[i] = same >= 0 ? (struct sp_patch_record){.kind = SP_PATCH_REF, .old_shard = (uint32_t)same}
                              : (struct sp_patch_record){.kind = SP_PATCH_WHOLE, .old_shard = SP_PATCH_NO_SHARD};
    }
    /* the new content section, with the old header bytes as prefix */
    size_t cn, zn;
    if ((rc = sp_pack_content_bytes(&n->m, &content, &cn)) ||
        (rc = sp_zcompress(&zs, &zs.comp, &zs.comp_cap, content, cn, MANIFEST_LEVEL, o->m.header, (size_t)o->m.header_size, &zn))) {
        goto done;
    }
    const uint64_t table_n = (uint64_t)n->m.n_shards * 16;
    if ((rc = sp_out_open(&w, out))) goto done;
    j.o = o;
    j.n = n;
    j.out = &w;
    j.at = SP_PATCH_HEADER_BYTES + zn + table_n;
    j.w = (struct sp_work){.n_items = n->m.n_shards, .n_threads = P.n_threads, .ordered = true, .fn = diff_one, .ctx = &j,
                           .progress = P.progress, .progress_user = P.progress_user,
                           .total = n->m.file_size - n->m.header_size};
    if ((rc = sp_work_run(&j.w))) goto done;

    struct sp_patch_header h = {.old_shard_size = o->m.shard_size, .old_n_shards = o->m.n_shards,
                                .n_records = n->m.n_shards, .content_size = cn, .content_zsize = zn,
                                .payload_total = j.at - (SP_PATCH_HEADER_BYTES + zn + table_n)};
    memcpy(h.old_id, o->m.content_id, SP_SHA256_BYTES);
    memcpy(h.new_id, n->m.content_id, SP_SHA256_BYTES);
    memcpy(h.old_header_sha, o->m.header_sha, SP_SHA256_BYTES);
    if (!(meta = sp_malloc(zn + (size_t)table_n + 1))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto done;
    }
    memcpy(meta, zs.comp, zn);
    sp_patch_table_write(j.recs, n->m.n_shards, meta + zn);
    uint8_t hb[SP_PATCH_HEADER_BYTES];
    if ((rc = sp_sha256(meta, zn + (size_t)table_n, h.table_sha))) goto done;
    sp_patch_header_write(&h, hb);
    if ((rc = sp_out_pwrite(&w, meta, zn + (size_t)table_n, SP_PATCH_HEADER_BYTES)) ||
        (rc = sp_out_pwrite(&w, hb, sizeof hb, 0)) || (rc = sp_out_commit(&w))) {
        goto done;
    }
    if (st) {
        memset(st, 0, sizeof *st);
        st->model_bytes = n->m.file_size;
        st->patch_bytes = j.at;
        st->n_shards = n->m.n_shards;
        sp_package_count_kinds(j.recs, n->m.n_shards, st);
        st->changed_comp_bytes = j.changed_comp;
        sp_sha256_hex(n->m.content_id, st->content_id);
        st->seconds = sp_package_now() - t0;
    }
done:
    sp_out_abort(&w);
    sp_scratch_array_free(j.sc, P.n_threads);
    sp_scratch_free(&zs);
    sp_free(j.recs);
    sp_free(by_digest);
    sp_free(content);
    sp_free(meta);
    sp_src_close(o);
    sp_src_close(n);
    return rc;
}
