/*
 * file.c -- the bounds-checked positional reader behind file.h: a file on
 * disk read with pread(2), or a caller's memory buffer read with memcpy.
 * Every read is checked against the size taken when the source was opened,
 * with overflow-safe arithmetic, so a parser can hand it any offset and
 * length from an untrusted file.  It does not map, cache or interpret bytes.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

struct sp_file {
    char *path;          /* owned; "<memory>" for buffers */
    int fd;              /* -1 for buffers */
    const uint8_t *mem;  /* (size) caller's bytes, or NULL for files */
    uint64_t size;       /* bytes, fixed at open */
    uint64_t held;       /* bytes of mem readable: size, or less for a prefix */
};

/* Open path read-only and take its size.  Returns SP_OK and *out, or SP_E_IO
 * naming the path and the errno text (also for directories and non-regular
 * files whose size is unknown), or SP_E_NOMEM.  *out is NULL on failure. */
sp_status sp_file_open(const char *path, struct sp_file **out) {
    struct sp_file *f = NULL;
    int fd = -1;
    int rc;
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!path || !*path) return sp_err(SP_E_INVALID, "%s: empty path", __func__);

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sp_err(SP_E_IO, "%s: cannot open '%s': %s", __func__, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = sp_err(SP_E_IO, "%s: cannot stat '%s': %s", __func__, path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = sp_err(SP_E_IO, "%s: '%s': %s", __func__, path, strerror(EISDIR));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 0) {
        rc = sp_err(SP_E_IO, "%s: '%s' is not a regular file", __func__, path);
        goto fail;
    }
    f = sp_calloc(1, sizeof(*f));
    if (!f || !(f->path = sp_strdup(path))) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory opening '%s'", __func__, path);
        goto fail;
    }
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    *out = f;
    return SP_OK;

fail:
    if (f) sp_free(f->path);
    sp_free(f);
    close(fd);
    return rc;
}

/* Wrap n caller bytes (not copied; they must outlive the sp_file).  data may
 * be NULL only when n is 0.  Returns SP_OK and *out, SP_E_INVALID or
 * SP_E_NOMEM. */
sp_status sp_file_from_memory(const void *data, size_t n, struct sp_file **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if (!data && n) return sp_err(SP_E_INVALID, "%s: NULL data with %zu bytes", __func__, n);
    struct sp_file *f = sp_calloc(1, sizeof(*f));
    if (!f || !(f->path = sp_strdup("<memory>"))) {
        sp_free(f);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    f->fd = -1;
    f->mem = data;
    f->size = f->held = n;
    *out = f;
    return SP_OK;
}

/* A size-byte source of which the first n bytes are data (file.h).
 * Returns SP_OK and *out, SP_E_INVALID (n > size, NULL data) or SP_E_NOMEM. */
sp_status sp_file_from_prefix(const void *data, size_t n, uint64_t size, const char *name, struct sp_file **out) {
    if (!out) return sp_err(SP_E_INVALID, "%s: out is NULL", __func__);
    *out = NULL;
    if ((!data && n) || (uint64_t)n > size) return sp_err(SP_E_INVALID, "%s: %zu bytes of a %llu-byte file", __func__, n,
                                                           (unsigned long long)size);
    struct sp_file *f = sp_calloc(1, sizeof(*f));
    if (!f || !(f->path = sp_strdup(name ? name : "<memory>"))) {
        sp_free(f);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    f->fd = -1;
    f->mem = data;
    f->size = size;
    f->held = n;
    *out = f;
    return SP_OK;
}

/* Close the descriptor (if any) and free f.  NULL is a no-op. */
void sp_file_close(struct sp_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    sp_free(f->path);
    sp_free(f);
}

/* Size in bytes, as seen when the source was opened. */
uint64_t sp_file_size(const struct sp_file *f) {
    return f->size;
}

/* Readable bytes: the size, except for a prefix (sp_file_from_prefix). */
uint64_t sp_file_held(const struct sp_file *f) {
    return f->fd < 0 ? f->held : f->size;
}

/* The path given to sp_file_open, or "<memory>".  Owned by f. */
const char *sp_file_path(const struct sp_file *f) {
    return f->path;
}

/* The read-only descriptor, or -1 for memory buffers.  Owned by f. */
int sp_file_fd(const struct sp_file *f) {
    return f->fd;
}

/* Read exactly n bytes at off into dst.  [off, off+n) must lie inside the
 * file: otherwise SP_E_FORMAT "truncated", naming the path, the offset and
 * the size.  A read error is SP_E_IO with the errno text; a file that shrank
 * after it was opened is also SP_E_IO.  n == 0 always succeeds when off <= size. */
sp_status sp_file_read_at(struct sp_file *f, uint64_t off, void *dst, size_t n) {
    uint64_t end;
    if (sp_add_overflow_u64(off, (uint64_t)n, &end) || end > f->size) {
        return sp_err(SP_E_FORMAT, "%s: '%s' truncated: %zu bytes at offset %llu are past the end of the file (%llu bytes)",
                      __func__, f->path, n, (unsigned long long)off, (unsigned long long)f->size);
    }
    if (n == 0) return SP_OK;
    if (f->fd < 0) {
        if (end > f->held) {
            return sp_err(SP_E_FORMAT, "%s: '%s': %zu bytes at offset %llu are past the %llu bytes held (the header)",
                          __func__, f->path, n, (unsigned long long)off, (unsigned long long)f->held);
        }
        memcpy(dst, f->mem + off, n);
        return SP_OK;
    }
    uint8_t *p = dst;
    size_t done = 0;
    while (done < n) {
        /* Some kernels cap one read at ~2 GiB; ask for at most 1 GiB at a time. */
        size_t want = SP_MIN(n - done, (size_t)1 << 30);
        ssize_t got = pread(f->fd, p + done, want, (off_t)(off + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return sp_err(SP_E_IO, "%s: '%s': read of %zu bytes at offset %llu failed: %s", __func__, f->path, want,
                          (unsigned long long)(off + done), strerror(errno));
        }
        if (got == 0) {
            return sp_err(SP_E_IO, "%s: '%s': unexpected end of file at offset %llu (the file shrank after it was opened?)",
                          __func__, f->path, (unsigned long long)(off + done));
        }
        done += (size_t)got;
    }
    return SP_OK;
}
