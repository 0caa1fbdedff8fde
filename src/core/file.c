/*
 * file.c -- the bounds-checked positional reader behind file.h: a file on
 * disk read with pread(2), or a caller's memory buffer read with memcpy.
 * Every read is checked against the size taken when the source was opened,
 * with overflow-safe arithmetic, so a parser can hand it any offset and
 * length from an untrusted file.  It does not map, cache or interpret bytes.
 *
 * Below the reader sits the one function every read of a model file goes
 * through -- the parsers', the pager's loads and its streamed spans:
 * sp_file_pread, with the fault-injection hook tests arm (like SQLite's
 * faultsim), and sp_file_pread_all, the retry policy on top of it.
 */
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- writing a file whole or not at all ----------------------------------- */

/* path split into its folder ("." when none) and base name; sp_malloc'd. */
static char *dir_of(const char *path, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) return sp_strdup(".");
    return slash == path ? sp_strdup("/") : sp_strndup(path, (size_t)(slash - path));
}

int sp_file_tmp_sweep(const char *path) {
    const char *base;
    char *dir = dir_of(path, &base);
    DIR *d = dir ? opendir(dir) : NULL;
    int removed = 0;
    const size_t nb = strlen(base), nt = strlen(SP_FILE_TMP_TAG);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, base, nb) != 0 || strncmp(n + nb, SP_FILE_TMP_TAG, nt) != 0) continue;
        char *end;
        errno = 0;
        const long pid = strtol(n + nb + nt, &end, 10);
        if (errno || end == n + nb + nt || *end || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its writer may still be at work */
        if (unlinkat(dirfd(d), n, 0) == 0) {
            SP_LOG_I("removed '%s/%s', the temporary file of an interrupted writer (process %ld, gone)", dir, n, pid);
            removed++;
        }
    }
    if (d) closedir(d);
    sp_free(dir);
    return removed;
}

sp_status sp_file_tmp_create(const char *path, char **tmp_path, int *fd) {
    *tmp_path = NULL;
    *fd = -1;
    (void)sp_file_tmp_sweep(path);
    const size_t n = strlen(path) + strlen(SP_FILE_TMP_TAG) + 24;
    char *t = sp_malloc(n);
    if (!t) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    snprintf(t, n, "%s" SP_FILE_TMP_TAG "%ld", path, (long)getpid());
    const int f = open(t, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0) {
        const sp_status rc = sp_err(SP_E_IO, "%s: cannot create '%s': %s", __func__, t, strerror(errno));
        sp_free(t);
        return rc;
    }
    *tmp_path = t;
    *fd = f;
    return SP_OK;
}

sp_status sp_file_tmp_commit(int fd, const char *tmp_path, const char *path) {
    if (fsync(fd) != 0) return sp_err(SP_E_IO, "%s: flushing '%s' failed: %s", __func__, tmp_path, strerror(errno));
    if (rename(tmp_path, path) != 0) {
        return sp_err(SP_E_IO, "%s: renaming '%s' to '%s' failed: %s", __func__, tmp_path, path, strerror(errno));
    }
    /* Make the rename durable; failure here loses nothing already written. */
    const char *base;
    char *dir = dir_of(path, &base);
    const int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    sp_free(dir);
    return SP_OK;
}

bool sp_file_same(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ---- the read primitive and its fault hook -------------------------------
 * The hook is global (as the allocator hook is) and costs one relaxed load
 * per read while disarmed.  Armed, a mutex orders the calls' numbering; the
 * misbehaving call itself runs outside it (a stall must not stall others). */

static atomic_bool fault_armed;
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sp_file_fault fault_cfg;
static uint64_t fault_calls, fault_hits;

void sp_file_fault_set(const struct sp_file_fault *f) {
    pthread_mutex_lock(&fault_mu);
    const bool arm = f && f->kind != SP_FAULT_NONE;
    fault_cfg = arm ? *f : (struct sp_file_fault){0};
    if (arm) fault_calls = fault_hits = 0; /* disarming keeps the counts for reading */
    atomic_store(&fault_armed, arm);
    pthread_mutex_unlock(&fault_mu);
}

uint64_t sp_file_fault_calls(void) {
    pthread_mutex_lock(&fault_mu);
    const uint64_t n = fault_calls;
    pthread_mutex_unlock(&fault_mu);
    return n;
}

uint64_t sp_file_fault_hits(void) {
    pthread_mutex_lock(&fault_mu);
    const uint64_t n = fault_hits;
    pthread_mutex_unlock(&fault_mu);
    return n;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Whether this call misbehaves, and how (under the hook's lock). */
static enum sp_fault_kind fault_next(uint32_t *stall_ms) {
    pthread_mutex_lock(&fault_mu);
    const uint64_t k = ++fault_calls;
    enum sp_fault_kind kind = SP_FAULT_NONE;
    if (k >= fault_cfg.at && (fault_cfg.count == 0 || k - fault_cfg.at < fault_cfg.count)) {
        kind = fault_cfg.kind;
        fault_hits++;
    }
    *stall_ms = fault_cfg.stall_ms;
    pthread_mutex_unlock(&fault_mu);
    return kind;
}

/* One pread(2) of up to n bytes at off, through the fault hook: returns the
 * byte count (0 at end of file) or -1 with errno, exactly as pread does. */
ssize_t sp_file_pread(int fd, void *dst, size_t n, uint64_t off) {
    if (atomic_load_explicit(&fault_armed, memory_order_relaxed)) {
        uint32_t stall_ms = 0;
        switch (fault_next(&stall_ms)) {
        case SP_FAULT_EIO: errno = EIO; return -1;
        case SP_FAULT_EINTR: errno = EINTR; return -1;
        case SP_FAULT_SHORT:
            /* a legal short count: half, whole 4 KiB pages where there are two */
            if (n > 1) n = n >= 8192 ? (n / 2) & ~(size_t)4095 : n / 2;
            break;
        case SP_FAULT_STALL: sleep_ms(stall_ms); break;
        default: break;
        }
    }
    return pread(fd, dst, n, (off_t)off);
}

/* Read [off, off + n) of fd into dst, as much of it as the file holds.
 * The retry policy of every model-file read:
 *  - a short count is not an error: the rest is asked for again;
 *  - EINTR and EAGAIN are retried at once, up to SP_FILE_RETRIES_INTR times
 *    in a row (bounded, so a descriptor that can only fail cannot spin);
 *  - any other error (EIO...) is retried SP_FILE_RETRIES times, after 1, 2
 *    and 4 ms: a glitch gets past, a failing medium surfaces within ~7 ms
 *    (the kernel has retried a disk error itself before it reports one, so
 *    a longer wait here would mostly delay the report; a caller that wants
 *    to wait longer repeats the call that failed -- sp_decode allows it);
 *  - EINVAL is returned at once (O_DIRECT refused: the caller may fall back).
 * A try that reads something starts the counts afresh.  Returns 0 with *got
 * the bytes read (< n only at end of file), or the errno of the last try,
 * *got then holding the bytes read before the failing offset off + *got. */
int sp_file_pread_all(int fd, void *dst, size_t n, uint64_t off, size_t *got) {
    uint8_t *p = dst;
    size_t done = 0;
    unsigned intr = 0, fails = 0;
    int err = 0;
    while (done < n) {
        /* Some kernels cap one read at ~2 GiB; ask for at most 1 GiB at a time. */
        const size_t want = SP_MIN(n - done, (size_t)1 << 30);
        const ssize_t r = sp_file_pread(fd, p + done, want, off + done);
        if (r > 0) {
            done += (size_t)r;
            intr = fails = 0;
            continue;
        }
        if (r == 0) {
            err = 0; /* end of file */
            break;
        }
        err = errno;
        if (err == EINTR || err == EAGAIN) {
            if (++intr <= SP_FILE_RETRIES_INTR) continue;
            break;
        }
        if (err == EINVAL || ++fails > SP_FILE_RETRIES) break;
        sleep_ms(1u << (fails - 1)); /* 1, 2, 4 ms */
    }
    *got = done;
    return done < n && err ? err : 0;
}

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
    size_t done = 0;
    const int err = sp_file_pread_all(f->fd, dst, n, off, &done);
    if (err) {
        return sp_err(SP_E_IO, "%s: '%s': read of %zu bytes at offset %llu failed: %s", __func__, f->path, n - done,
                      (unsigned long long)(off + done), strerror(err));
    }
    if (done < n) {
        return sp_err(SP_E_IO, "%s: '%s': unexpected end of file at offset %llu (the file shrank after it was opened?)",
                      __func__, f->path, (unsigned long long)(off + done));
    }
    return SP_OK;
}
