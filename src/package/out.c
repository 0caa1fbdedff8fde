/*
 * out.c -- the atomic output file every package writer uses (package.h), on
 * core/file.h's convention for all writers: "<target>.sparrow-tmp.<pid>"
 * beside the target, fsync, rename, fsync of the folder.  A writer killed at
 * any instant leaves the target as it was and at most its temporary file,
 * which the next writer of that target removes (its process is gone).
 */
#include "package.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

sp_status sp_out_open(struct sp_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    if (!path || !*path) return sp_err(SP_E_INVALID, "%s: empty output path", __func__);
    if (!(o->path = sp_strdup(path))) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    const sp_status rc = sp_file_tmp_create(path, &o->tmp, &o->fd); /* sweeps what killed writers left */
    if (rc) sp_out_abort(o);
    return rc;
}

sp_status sp_out_reserve(struct sp_out *o, uint64_t size) {
    if (size == 0) return SP_OK;
    const int e = posix_fallocate(o->fd, 0, (off_t)size);
    if (e == 0) return SP_OK;
    if (e == EOPNOTSUPP || e == EINVAL) return SP_OK; /* the file system cannot reserve: writes will tell */
    return sp_err(SP_E_IO, "cannot reserve %llu bytes for '%s': %s", (unsigned long long)size, o->tmp, strerror(e));
}

sp_status sp_out_pwrite(struct sp_out *o, const void *p, size_t n, uint64_t off) {
    const uint8_t *b = p;
    while (n) {
        const ssize_t w = pwrite(o->fd, b, SP_MIN(n, (size_t)1 << 30), (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            return sp_err(SP_E_IO, "writing %zu bytes at offset %llu of '%s': %s", n, (unsigned long long)off, o->tmp,
                          w < 0 ? strerror(errno) : "nothing written");
        }
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return SP_OK;
}

sp_status sp_out_commit(struct sp_out *o) {
    const sp_status rc = sp_file_tmp_commit(o->fd, o->tmp, o->path);
    if (!rc) {
        sp_free(o->tmp);
        o->tmp = NULL; /* in place: nothing to remove any more */
    }
    sp_out_abort(o);
    return rc;
}

void sp_out_abort(struct sp_out *o) {
    if (o->tmp && o->fd >= 0) unlink(o->tmp); /* only a temporary file we hold the lock of */
    if (o->fd >= 0) close(o->fd);
    sp_free(o->path);
    sp_free(o->tmp);
    memset(o, 0, sizeof *o);
    o->fd = -1;
}
