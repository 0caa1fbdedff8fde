/*
 * pager.c -- weight pager, resident mode (the whole file is mapped).
 *
 * Invariants:
 *  1. Every successful pin is matched by exactly one unpin; pins[i] counts the
 *     outstanding pins of tensor i and never goes negative (SP_ASSERT).
 *  2. A pinned range lies inside its tensor, and every tensor lies inside the
 *     file (format/ validated the directory against the file size; open checks
 *     the size did not change since).
 *  3. The mapping is read-only and shared: weights are never copied here.
 *
 * States of a tensor:   UNPINNED --pin--> PINNED(n) --unpin (n==1)--> UNPINNED
 *   transition            function
 *   UNPINNED -> PINNED    sp_pager_pin_range()
 *   PINNED(n) -> n+1      sp_pager_pin_range()
 *   PINNED(n) -> n-1      sp_pager_unpin()
 * In resident mode "PINNED" only pins the pointer; the budgeted pager will add
 * LOADING and EVICTABLE states between these.
 */
#include "pager.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct sp_pager {
    const struct sp_model_file *mf;
    const uint8_t *map;   /* (file_size) read-only mapping */
    uint64_t map_size;
    atomic_uint_fast32_t *pins; /* (n_tensors) outstanding pins per tensor */
    atomic_uint_fast64_t n_pins;
    atomic_uint_fast64_t n_unpins;
};

sp_status sp_pager_open(const struct sp_model_file *mf, struct sp_pager **out) {
    *out = NULL;
    struct sp_pager *pg = sp_calloc(1, sizeof(*pg));
    if (!pg) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    pg->mf = mf;
    int fd = -1;
    sp_status rc;
    pg->pins = sp_calloc(mf->n_tensors ? mf->n_tensors : 1, sizeof(*pg->pins));
    if (!pg->pins) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    if (mf->n_tensors == 0) { /* vocab-only: nothing to map */
        *out = pg;
        return SP_OK;
    }
    fd = open(mf->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = sp_err(SP_E_IO, "%s: cannot open '%s': %s", __func__, mf->path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = sp_err(SP_E_IO, "%s: cannot stat '%s': %s", __func__, mf->path, strerror(errno));
        goto fail;
    }
    if ((uint64_t)st.st_size != mf->file_size) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' changed size since it was opened (%llu, was %llu)", __func__, mf->path,
                    (unsigned long long)st.st_size, (unsigned long long)mf->file_size);
        goto fail;
    }
    void *m = mmap(NULL, (size_t)mf->file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = sp_err(SP_E_IO, "%s: cannot map '%s' (%llu bytes): %s", __func__, mf->path,
                    (unsigned long long)mf->file_size, strerror(errno));
        goto fail;
    }
    close(fd);
    pg->map = m;
    pg->map_size = mf->file_size;
    *out = pg;
    return SP_OK;
fail:
    if (fd >= 0) close(fd);
    sp_pager_close(pg);
    return rc;
}

void sp_pager_close(struct sp_pager *pg) {
    if (!pg) return;
    if (pg->map) munmap((void *)pg->map, (size_t)pg->map_size);
    sp_free(pg->pins);
    sp_free(pg);
}

static size_t tensor_index(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    SP_ASSERT(t >= pg->mf->tensors && t < pg->mf->tensors + pg->mf->n_tensors);
    return (size_t)(t - pg->mf->tensors);
}

sp_status sp_pager_pin_range(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes,
                             const void **out) {
    size_t i = tensor_index(pg, t);
    uint64_t end;
    if (sp_add_overflow_u64(off, nbytes, &end) || end > t->size) {
        return sp_err(SP_E_INVALID, "%s: range [%llu, +%llu) outside tensor '%s' (%llu bytes)", __func__,
                      (unsigned long long)off, (unsigned long long)nbytes, t->name, (unsigned long long)t->size);
    }
    if (!pg->map || t->offset + end > pg->map_size) {
        return sp_err(SP_E_IO, "%s: tensor '%s' is not mapped", __func__, t->name);
    }
    atomic_fetch_add(&pg->pins[i], 1);
    atomic_fetch_add(&pg->n_pins, 1);
    *out = pg->map + t->offset + off;
    return SP_OK;
}

void sp_pager_unpin(struct sp_pager *pg, const struct sp_tensor_desc *t) {
    size_t i = tensor_index(pg, t);
    uint_fast32_t prev = atomic_fetch_sub(&pg->pins[i], 1);
    SP_ASSERT(prev > 0); /* invariant 1: one unpin per successful pin */
    atomic_fetch_add(&pg->n_unpins, 1);
}

void sp_pager_get_stats(const struct sp_pager *pg, struct sp_pager_stats *out) {
    out->pins = atomic_load(&pg->n_pins);
    out->unpins = atomic_load(&pg->n_unpins);
    out->outstanding = out->pins - out->unpins;
    out->mapped_bytes = pg->map_size;
}
