/*
 * out.c -- the atomic output file every package writer uses (package.h):
 * a locked temporary file beside the target, fsync, rename, fsync of the
 * folder.  A writer killed at any instant leaves the target as it was and
 * at most "<target>.tmp", which the next writer of that target takes over.
 */
#include "package.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

sp_status sp_out_open(struct sp_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    if (!path || !*path) return sp_err(SP_E_INVALID, "%s: empty output path", __func__);
    const size_t n = strlen(path) + 8;
    o->path = sp_strdup(path);
    o->tmp = sp_malloc(n);
    if (!o->path || !o->tmp) {
        sp_out_abort(o);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    snprintf(o->tmp, n, "%s.tmp", path);
    /* Lock-file dance: the file we locked must still be the one at o->tmp
     * (another writer may have renamed it into place meanwhile). */
    for (int tries = 0; tries < 8; tries++) {
        int fd = open(o->tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            sp_status rc = sp_err(SP_E_IO, "cannot create '%s': %s", o->tmp, strerror(errno));
            sp_out_abort(o);
            return rc;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            close(fd);
            sp_status rc = e == EWOULDBLOCK
                               ? sp_err(SP_E_STATE, "'%s' is being written by another process (its temporary file '%s' is locked)",
                                        path, o->tmp)
                               : sp_err(SP_E_IO, "cannot lock '%s': %s", o->tmp, strerror(e));
            sp_out_abort(o);
            return rc;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(o->tmp, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            if (ftruncate(fd, 0) != 0) {
                sp_status rc = sp_err(SP_E_IO, "cannot truncate '%s': %s", o->tmp, strerror(errno));
                close(fd);
                sp_out_abort(o);
                return rc;
            }
            o->fd = fd;
            return SP_OK;
        }
        close(fd);
    }
    sp_status rc = sp_err(SP_E_STATE, "'%s': its temporary file '%s' keeps being replaced by another writer", path, o->tmp);
    sp_out_abort(o);
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

/* The folder of path, for fsync (heap string). */
static char *folder_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return sp_strdup(".");
    if (slash == path) return sp_strdup("/");
    return sp_strndup(path, (size_t)(slash - path));
}

sp_status sp_out_commit(struct sp_out *o) {
    sp_status rc;
    if (fsync(o->fd) != 0) {
        rc = sp_err(SP_E_IO, "flushing '%s' to storage failed: %s", o->tmp, strerror(errno));
        goto fail;
    }
    if (rename(o->tmp, o->path) != 0) {
        rc = sp_err(SP_E_IO, "renaming '%s' to '%s' failed: %s", o->tmp, o->path, strerror(errno));
        goto fail;
    }
    close(o->fd); /* after the rename: the lock is held until the new file is in place */
    o->fd = -1;
    char *dir = folder_of(o->path);
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    rc = SP_OK;
    if (dfd < 0 || fsync(dfd) != 0) {
        rc = sp_err(SP_E_IO, "'%s' is in place, but flushing its folder '%s' failed: %s", o->path, dir ? dir : "?",
                    strerror(errno));
    }
    if (dfd >= 0) close(dfd);
    sp_free(dir);
    sp_free(o->tmp);
    o->tmp = NULL; /* nothing to remove any more */
    sp_out_abort(o);
    return rc;
fail:
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
