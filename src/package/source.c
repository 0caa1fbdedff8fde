/*
 * source.c -- a model to read shard by shard, whatever it is stored as: a
 * GGUF file (cut into shards by format/'s rule, hashed on demand) or a
 * package (its manifest; frames checked and decompressed).  diff and apply
 * use it on both sides, so OLD, NEW and MODEL may each be either.
 */
#include "package.h"

#include <fcntl.h>
#include <stdio.h>
#include <zstd.h>

sp_status sp_src_open(const char *path, uint64_t shard_size, struct sp_src **out) {
    *out = NULL;
    struct sp_src *s = sp_calloc(1, sizeof *s);
    sp_status rc;
    if (!s || !(s->path = sp_strdup(path))) {
        sp_free(s);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    if ((rc = sp_file_open(path, &s->f))) goto fail;
    uint8_t magic[8] = {0};
    if ((rc = sp_file_read_at(s->f, 0, magic, (size_t)SP_MIN((uint64_t)8, sp_file_size(s->f))))) goto fail;
    if (sp_pack_is_package(magic, sizeof magic)) {
        s->spk = true;
        if ((rc = sp_pack_read_manifest(s->f, &s->m, &s->dir))) goto fail;
        s->hashed = true;
    } else {
        if ((rc = sp_pack_gguf_dir(s->f, &s->dir))) goto fail;
        if ((rc = sp_pack_cut(s->dir, shard_size ? shard_size : SP_PACK_DEFAULT_SHARD, &s->m))) goto fail;
        if (!(s->m.header = sp_malloc(s->m.header_size ? (size_t)s->m.header_size : 1))) {
            rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
            goto fail;
        }
        if ((rc = sp_file_read_at(s->f, 0, s->m.header, (size_t)s->m.header_size))) goto fail;
        if ((rc = sp_sha256(s->m.header, (size_t)s->m.header_size, s->m.header_sha))) goto fail;
    }
    if (!(s->verified = sp_calloc(s->m.n_shards ? s->m.n_shards : 1, sizeof *s->verified))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    *out = s;
    return SP_OK;
fail:
    sp_src_close(s);
    return rc;
}

void sp_src_close(struct sp_src *s) {
    if (!s) return;
    sp_file_close(s->f);
    sp_pack_manifest_clear(&s->m);
    sp_model_file_free(s->dir);
    sp_free(s->verified);
    sp_free(s->path);
    sp_free(s);
}

void sp_src_shard_name(const struct sp_src *s, uint32_t i, char *buf, size_t cap) {
    char name[200];
    sp_pack_shard_name(&s->m, s->dir, i, name, sizeof name);
    snprintf(buf, cap, "%s of '%s'", name, s->path);
}

sp_status sp_src_read_comp(struct sp_src *s, uint32_t i, struct sp_scratch *sc) {
    const struct sp_pack_shard *sh = &s->m.shards[i];
#ifdef POSIX_FADV_WILLNEED
    /* shards are read in order by a few threads: start reading the next
     * frames now, so that a cold file streams instead of waiting per read */
    if (i + 2 < s->m.n_shards) { /* each frame is asked for once, two ahead */
        (void)posix_fadvise(sp_file_fd(s->f), (off_t)s->m.shards[i + 2].comp_offset, (off_t)s->m.shards[i + 2].comp_size,
                            POSIX_FADV_WILLNEED);
    }
#endif
    sp_status rc = sp_scratch_grow(&sc->comp, &sc->comp_cap, (size_t)sh->comp_size);
    if (rc) return rc;
    if ((rc = sp_file_read_at(s->f, sh->comp_offset, sc->comp, (size_t)sh->comp_size))) return rc;
    uint8_t d[SP_SHA256_BYTES];
    if ((rc = sp_sha256(sc->comp, (size_t)sh->comp_size, d))) return rc;
    if (!sp_sha256_eq(d, sh->comp_sha)) {
        char name[300];
        sp_src_shard_name(s, i, name, sizeof name);
        return sp_err(SP_E_FORMAT, "%s: its compressed bytes do not match the manifest's SHA-256: the package is damaged",
                      name);
    }
    return SP_OK;
}

sp_status sp_src_read_raw(struct sp_src *s, uint32_t i, struct sp_scratch *sc, uint8_t **buf, size_t *cap) {
    struct sp_pack_shard *sh = &s->m.shards[i];
    char name[300];
    sp_status rc = sp_scratch_grow(buf, cap, (size_t)sh->raw_size);
    if (rc) return rc;
    if (s->spk) {
        if ((rc = sp_src_read_comp(s, i, sc)) || (rc = sp_scratch_ctx(sc))) return rc;
        sp_src_shard_name(s, i, name, sizeof name);
        if ((rc = sp_pack_decompress(sc->dctx, sc->comp, (size_t)sh->comp_size, *buf, (size_t)sh->raw_size, NULL, 0,
                                     name))) {
            return rc;
        }
    } else if ((rc = sp_file_read_at(s->f, sh->raw_offset, *buf, (size_t)sh->raw_size))) {
        return rc;
    }
    uint8_t d[SP_SHA256_BYTES];
    if ((rc = sp_sha256(*buf, (size_t)sh->raw_size, d))) return rc;
    if (!s->hashed) { /* a GGUF read for the first time: its bytes define the hash */
        unsigned char expect = 0;
        if (atomic_compare_exchange_strong(&s->verified[i], &expect, 2)) {
            memcpy(sh->raw_sha, d, SP_SHA256_BYTES);
            atomic_store(&s->verified[i], 1);
            return SP_OK;
        }
        while (atomic_load(&s->verified[i]) == 2) { /* another thread is recording it */
        }
    }
    if (!sp_sha256_eq(d, sh->raw_sha)) {
        sp_src_shard_name(s, i, name, sizeof name);
        return sp_err(SP_E_FORMAT, "%s: its bytes do not match the %s SHA-256%s", name,
                      s->spk ? "manifest's" : "one read before", s->spk ? ": the package is damaged" : " (the file changed)");
    }
    atomic_store(&s->verified[i], 1);
    return SP_OK;
}

/* ---- hashing a GGUF --------------------------------------------------------- */

struct hash_job {
    struct sp_src *s;
    struct sp_scratch *sc; /* (n_threads) */
    struct sp_work w;
};

static sp_status hash_one(void *ctx, uint32_t i, int ith) {
    struct hash_job *j = ctx;
    if (atomic_load(&j->s->verified[i]) == 1) {
        sp_work_add(&j->w, j->s->m.shards[i].raw_size);
        return SP_OK;
    }
    struct sp_scratch *sc = &j->sc[ith];
    sp_status rc = sp_src_read_raw(j->s, i, sc, &sc->raw, &sc->raw_cap);
    sp_work_add(&j->w, j->s->m.shards[i].raw_size);
    return rc;
}

sp_status sp_src_hash(struct sp_src *s, int n_threads, sp_progress_fn progress, void *user) {
    if (s->hashed) return SP_OK;
    const int nth = sp_package_threads(n_threads);
    struct hash_job j = {.s = s};
    if (!(j.sc = sp_scratch_array(nth))) return SP_E_NOMEM;
    j.w = (struct sp_work){.n_items = s->m.n_shards, .n_threads = nth, .fn = hash_one, .ctx = &j, .progress = progress,
                           .progress_user = user, .total = s->m.file_size - s->m.header_size};
    sp_status rc = sp_work_run(&j.w);
    sp_scratch_array_free(j.sc, nth);
    if (rc) return rc;
    if ((rc = sp_pack_content_id(&s->m))) return rc;
    s->hashed = true;
    return SP_OK;
}
