/*
 * pager.c -- weight pager, resident mode (the whole file is mapped).
 *
 * Invariants:
 *  1. Every successful pin is matched by exactly one unpin; pins[i] counts the
 *     outstanding pins of tensor i and never goes negative (SP_ASSERT).
 *  2. A pinned range lies inside its tensor, and every tensor lies inside the
 *     file (format/ validated the directory against the file size; open checks
 *     the size did not change since).
 *  3. MMAP mode: the mapping is read-only and shared; weights are never
 *     copied.  LOAD mode: the region holds file bytes [base, file_size) at
 *     region offset (file offset - base), base a multiple of 4096, so every
 *     tensor keeps its file alignment; it is written only in open.
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
    enum sp_weight_mode mode;
    const uint8_t *map;   /* MMAP: the file; LOAD: file bytes from `base` on */
    uint64_t map_size;    /* bytes of map */
    uint64_t base;        /* file offset of map[0] */
    atomic_uint_fast32_t *pins; /* (n_tensors) outstanding pins per tensor */
    atomic_uint_fast64_t n_pins;
    atomic_uint_fast64_t n_unpins;
};

static sp_status map_file(struct sp_pager *pg, int fd) {
    const struct sp_model_file *mf = pg->mf;
    void *m = mmap(NULL, (size_t)mf->file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        return sp_err(SP_E_IO, "%s: cannot map '%s' (%llu bytes): %s", __func__, mf->path,
                      (unsigned long long)mf->file_size, strerror(errno));
    }
    pg->map = m;
    pg->map_size = mf->file_size;
    pg->base = 0;
    return SP_OK;
}

/* Read the tensor data section into one anonymous region.  Reads go in large
 * sequential chunks; the region asks for transparent huge pages. */
static sp_status load_file(struct sp_pager *pg, int fd) {
    const struct sp_model_file *mf = pg->mf;
    uint64_t lo = UINT64_MAX;
    for (uint32_t i = 0; i < mf->n_tensors; i++) lo = SP_MIN(lo, mf->tensors[i].offset);
    pg->base = lo & ~(uint64_t)4095;
    const uint64_t n = mf->file_size - pg->base;
    void *m = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %llu bytes for the weights of '%s': %s", __func__,
                      (unsigned long long)n, mf->path, strerror(errno));
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(m, (size_t)n, MADV_HUGEPAGE);
#endif
#ifdef POSIX_FADV_SEQUENTIAL
    (void)posix_fadvise(fd, (off_t)pg->base, (off_t)n, POSIX_FADV_SEQUENTIAL);
#endif
    uint8_t *dst = m;
    uint64_t done = 0;
    while (done < n) {
        const size_t chunk = (size_t)SP_MIN(n - done, (uint64_t)64 << 20);
        ssize_t r = pread(fd, dst + done, chunk, (off_t)(pg->base + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            munmap(m, (size_t)n);
            return sp_err(SP_E_IO, "%s: reading '%s' at offset %llu: %s", __func__, mf->path,
                          (unsigned long long)(pg->base + done), r < 0 ? strerror(errno) : "unexpected end of file");
        }
        done += (uint64_t)r;
    }
    (void)mprotect(m, (size_t)n, PROT_READ); /* weights are read-only from here on */
    pg->map = m;
    pg->map_size = n;
    return SP_OK;
}

sp_status sp_pager_open(const struct sp_model_file *mf, enum sp_weight_mode mode, struct sp_pager **out) {
    *out = NULL;
    struct sp_pager *pg = sp_calloc(1, sizeof(*pg));
    if (!pg) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    pg->mf = mf;
    pg->mode = mode == SP_WEIGHTS_MMAP ? SP_WEIGHTS_MMAP : SP_WEIGHTS_LOAD;
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
    if ((rc = mode == SP_WEIGHTS_MMAP ? map_file(pg, fd) : load_file(pg, fd))) goto fail;
    close(fd);
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
    if (!pg->map || t->offset < pg->base || t->offset - pg->base + end > pg->map_size) {
        return sp_err(SP_E_IO, "%s: tensor '%s' is not resident", __func__, t->name);
    }
    atomic_fetch_add(&pg->pins[i], 1);
    atomic_fetch_add(&pg->n_pins, 1);
    *out = pg->map + (t->offset - pg->base) + off;
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
    out->mode = pg->mode;
}
