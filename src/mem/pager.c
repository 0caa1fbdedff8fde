/*
 * pager.c -- the weight pager (see pager.h for the contract).
 *
 * Invariants:
 *  1. Every successful pin is matched by exactly one unpin with the same
 *     pointer; a slot's refs count its outstanding pins and never goes
 *     negative (SP_ASSERT).  A slot with refs > 0 is never evicted or
 *     overwritten.
 *  2. A pinned range lies inside its tensor (and inside one unit when the
 *     tensor streams), and every tensor lies inside the file (format/
 *     validated the directory; open checks the size did not change since).
 *  3. Resident back end: MMAP maps the file read-only; LOAD holds file bytes
 *     [base, file_size) at region offset (file offset - base), except that
 *     tensors with a wtype[] hold the same values in a resident layout of
 *     their type (quant.h), in the same bytes, and tensors with an
 *     unpacked[] -- stored in a resident layout the kernel table lacks --
 *     hold them in that layout's file type.  A tensor with an unpacked[]
 *     is never mapped: MMAP is not chosen for a file that has one, and the
 *     budgeted back end un-repacks it in every slot and pinned copy.
 *  4. Budgeted back end: all memory -- the pinned region and one block of
 *     slots for the three pools -- is mapped in sp_pager_apply, sized by the
 *     plan, and never grows; it is touched and locked by a thread of its own
 *     (the locker) while the pinned tensors are read, in the forward pass's
 *     order, by the I/O threads, and sp_pager_apply returns without waiting
 *     for either: a pin of a pinned tensor waits until that tensor is read
 *     (and repacked), so the first layers compute while later ones are still
 *     being read (start-up pipeline, docs/MEMORY.md).  Slot data is the
 *     4 KiB-aligned file span around a unit, read by O_DIRECT (buffered +
 *     POSIX_FADV_DONTNEED where O_DIRECT is refused), so file pages do not
 *     pile up in the page cache outside the budget.
 *  5. All slot state changes happen under pg->mu; I/O threads read without
 *     the lock into slots whose state is LOADING (owned by that request).
 *
 * Slot states:   FREE --miss/prefetch--> LOADING --read ok--> READY
 *                                           \--read error--> ERROR
 *   READY/ERROR with refs == 0 may be reassigned (eviction) by the pool's
 *   policy: RING reuses slots whose unit was consumed (pinned since it was
 *   read), then the prefetched unit furthest ahead; EXPERT evicts by the
 *   next-use policy (xcache.h; or the least recently used, cfg.expert_cache),
 *   keeping the slices the router chose for the layer now served until they
 *   are pinned; ROWS evicts the least recently used.  Prefetched slots get a
 *   fresh use time when issued.
 */
#include "pager.h"

#include "core/file.h"
#include "mem/xcache.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ALIGN ((uint64_t)SP_PLAN_IO_ALIGN)
#define IO_CHUNK ((uint64_t)8 << 20)
#define DEFAULT_IO_THREADS 8u
#define PINNED_STALLED 3u /* sp_pager_tuning.pinned_stall_ms slows the last this many pinned tensors' reads */
#define X_WINDOW 128u /* expert slots the next-use policy ranks per eviction */

enum slot_state { SLOT_FREE = 0, SLOT_LOADING, SLOT_READY, SLOT_ERROR };
enum pool_id { POOL_RING = 0, POOL_EXPERT, POOL_ROWS, POOL_COUNT };

struct slot {
    uint8_t *buf;        /* slot memory, slot_bytes of its pool */
    const uint8_t *data; /* first byte of the unit inside buf */
    int64_t key;         /* global unit id (RING, EXPERT) or row key (ROWS); -1 none */
    uint64_t unit_off, unit_len; /* tensor-relative range the slot holds */
    uint32_t tensor;
    uint32_t refs;
    uint8_t state, pool;
    bool prefetched, used;
    bool counted; /* expert slots: this use was counted as hit or miss (cleared when unpinned) */
    int err;
    uint64_t err_off; /* SLOT_ERROR: the file offset whose read failed */
    uint64_t last_use;
    uint32_t xl, xe; /* expert slots under the next-use policy: the unit's layer and expert */
    uint64_t xguess; /* prefetched on a guess for that visit of its layer (0: not a guess) */
};

struct pool {
    uint32_t first, n; /* slots [first, first + n) */
    uint64_t slot_bytes;
};

struct io_req {
    uint8_t *dst;
    uint64_t off, len; /* aligned file span */
    uint64_t need;     /* bytes that must arrive (the rest may be past EOF) */
    int32_t slot;      /* -1: part of the pinned-region load */
    uint32_t tensor;   /* slot -1: the pinned tensor the span belongs to */
};

/* Pinned tensors of the budgeted back end while the start-up reads them. */
enum { PIN_LOADING = 0, PIN_READY, PIN_ERROR };
struct pin_state {
    uint32_t pending;  /* chunk reads in flight (under mu) */
    int err;           /* the first failed chunk's errno (under mu) */
    uint64_t err_off;
    uint32_t seq;      /* its place in the start-up order */
};

struct sp_pager {
    const struct sp_model_file *mf;
    struct sp_pager_config cfg;
    enum sp_weight_mode mode;
    /* resident back end */
    const uint8_t *map;
    uint64_t map_size, base;
    atomic_uint_fast32_t *pins; /* (n_tensors) outstanding pins of pinned/resident tensors */
    uint32_t *wtype;        /* (n_tensors) the resident layout LOAD repacked a tensor to, 0: its file type; NULL: none */
    uint32_t *unpacked;     /* (n_tensors) the file type a tensor stored in a resident layout is read back as,
                               where the kernel table lacks the layout (0: as stored); NULL: none.  Open to close */
    atomic_uint_fast64_t n_pins, n_unpins;

    /* budgeted back end */
    bool budgeted, applied, streaming;
    uint64_t plan_session;  /* session bytes (the envelope) the plan was made for */
    bool accounted;         /* the plan's base and weights are reserved in cfg.account */
    struct sp_plan plan;
    double read_bps, mem_bps;
    int fd, fd_direct;      /* fd_direct == fd when O_DIRECT is unavailable */
    bool direct;
    const uint8_t **tptr;   /* (n_tensors) pinned tensors' data, else NULL */
    uint8_t *pinned_region, *slot_region;
    uint64_t pinned_size, slot_size;
    uint32_t *first_unit;   /* (n_tensors) global id of each streamed tensor's unit 0 */
    int32_t *unit_slot;     /* (n_units) slot holding the unit, -1 */
    int32_t *unit_sched;    /* (n_units) ring schedule position, -1 */
    uint32_t n_units;
    struct sched_ent {
        uint32_t gu, tensor; /* global unit id, tensor index */
        uint64_t start, len; /* tensor-relative range */
    } *sched;               /* ring schedule: units in forward order */
    uint32_t n_sched, sched_next;
    struct slot *slots;
    uint32_t n_slots;
    struct pool pools[POOL_COUNT];
    uint64_t tick;
    struct io_req *q;       /* circular queue, capacity q_cap */
    uint32_t q_cap, q_head, q_len;
    uint32_t n_pinned;
    uint32_t pinned_pending;        /* pinned tensors not READY or ERROR yet (under mu) */
    struct pin_state *pstate;       /* (n_tensors) pinned tensors' reads */
    atomic_uchar *pready;           /* (n_tensors) PIN_*: the pin's lock-free test */
    double t_apply;                 /* when the start-up reads began (now_s) */
    pthread_t locker;               /* touches and locks the regions (lock_main) */
    bool locker_started;
    pthread_t *io;
    uint32_t n_io;
    bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv_io, cv_done;
    pthread_mutex_t turn; /* one forward pass at a time (sp_pager_turn_begin) */
    struct sp_pager_stats st;
    struct sp_pager_tuning tune;
    /* the expert pool's next-use policy (NULL: LRU) */
    struct sp_xcache *xc;
    int32_t *t_layer;       /* (n_tensors) layer of each streamed expert tensor, else -1 */
    uint64_t x_guess_issued, x_guess_used; /* expert slices prefetched on a guess; of those, used */
    uint32_t x_filled, x_cursor;            /* expert slots filled once; where the next window starts */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t align_down(uint64_t x) {
    return x & ~(ALIGN - 1);
}

static uint64_t align_up(uint64_t x) {
    return (x + ALIGN - 1) & ~(ALIGN - 1);
}

static uint64_t tensor_rows(const struct sp_tensor_desc *t) {
    return (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
}

/* ---- resident back end -------------------------------------------------- */

static sp_status map_file(struct sp_pager *pg, int fd) {
    const struct sp_model_file *mf = pg->mf;
    void *m = mmap(NULL, (size_t)mf->file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        return sp_err(SP_E_IO, "%s: cannot map '%s' (%llu bytes): %s", __func__, mf->path,
                      (unsigned long long)mf->file_size, strerror(errno));
    }
#ifdef MADV_HUGEPAGE
    /* where the page cache holds the file in 2 MiB folios (ext4 and others
     * with large folios), the faults map them whole: 1/512 of the page-table
     * setup and of the TLB misses of 4 KiB pages; a cold read of a fault
     * reads ahead as much */
    (void)madvise(m, (size_t)mf->file_size, MADV_HUGEPAGE);
#endif
    pg->map = m;
    pg->map_size = mf->file_size;
    pg->base = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) n += sp_qtype_resident_from(mf->tensors[i].type) != 0;
    if (mf->in_place) SP_LOG_I("'%s': weights used in place (%u tensors in stored resident layouts)", mf->path, n);
    return SP_OK;
}

/* The resident layout tensor t gets in memory, or 0: only where the table
 * has the layout's gemm (x86 with AVX2; not on AArch64, whose kernels read
 * the file layouts) and never for the tensor read by rows. */
static uint32_t resident_choice(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    return pg->cfg.repack && t != pg->cfg.by_rows ? sp_qtype_resident_here(t->type, t->ne[0]) : 0;
}

/* Give LOAD's region's matrices that have a resident layout that layout, in
 * place (the same bytes per row, so nothing grows): the decode kernels read
 * them with far fewer vector ops (docs/KERNELS.md).  The budgeted back end
 * repacks each pinned tensor as it is read (finish_pinned); its streamed
 * ones keep the file layout. */
static void repack_resident(struct sp_pager *pg, uint8_t *region) {
    const struct sp_model_file *mf = pg->mf;
    const double t0 = now_s();
    uint64_t bytes = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        const uint32_t r = resident_choice(pg, t);
        if (!r) continue;
        uint8_t *data = region + (t->offset - pg->base);
        if (!pg->wtype && !(pg->wtype = sp_calloc(mf->n_tensors, sizeof *pg->wtype))) return; /* file layouts */
        sp_qtype_repack(r, data, (int64_t)tensor_rows(t), t->ne[0], sp_qtype_row_bytes(t->type, t->ne[0]));
        pg->wtype[i] = r;
        bytes += t->size;
        n++;
    }
    if (n) SP_LOG_I("repacked %u tensors (%.1f MiB) to resident layouts in %.2f s", n, (double)bytes / (1 << 20), now_s() - t0);
}

/* The tensors a file stores in resident layouts that the kernel table
 * lacks here (a file converted on another CPU kind, or SPARROW_REPACK=0):
 * they are read back as the layout's file type (pg->unpacked), so that the
 * file's own kernels run them at their usual speed.  The tensor read by rows
 * keeps what it has: rows are read with its stored type's reference. */
static sp_status plan_unpack(struct sp_pager *pg) {
    const struct sp_model_file *mf = pg->mf;
    uint32_t n = 0, first = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        const uint32_t base = sp_qtype_resident_from(t->type);
        if (!base || t == pg->cfg.by_rows || sp_qtype_layout_here(t->type)) continue;
        if (!pg->unpacked && !(pg->unpacked = sp_calloc(mf->n_tensors, sizeof *pg->unpacked)))
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        pg->unpacked[i] = base;
        bytes += t->size;
        if (!n++) first = t->type;
    }
    if (n) {
        SP_LOG_W("'%s': %u tensors (%.1f MiB) are stored in resident layouts this CPU's kernels do not read (%s, "
                 "...): loading them converted back to their file types, not mapped ('sparrow convert' writes a "
                 "file for this CPU)", mf->path, n, (double)bytes / (1 << 20), sp_qtype_name(first));
    }
    return SP_OK;
}

/* Un-repack the tensors plan_unpack chose, in LOAD's region (the budgeted
 * back end does it as it reads: finish_pinned for pinned tensors, io_main
 * for streamed units). */
static void unpack_stored(struct sp_pager *pg, uint8_t *region) {
    const struct sp_model_file *mf = pg->mf;
    for (uint32_t i = 0; pg->unpacked && i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        if (!pg->unpacked[i]) continue;
        uint8_t *data = region + (t->offset - pg->base);
        sp_qtype_unrepack(t->type, data, (int64_t)tensor_rows(t), t->ne[0], sp_qtype_row_bytes(t->type, t->ne[0]));
    }
}

/* Read the tensor data section into one anonymous region.  Reads go in large
 * sequential chunks; the region asks for transparent huge pages. */
static sp_status load_file(struct sp_pager *pg, int fd) {
    const struct sp_model_file *mf = pg->mf;
    uint64_t lo = UINT64_MAX;
    for (uint32_t i = 0; i < mf->n_tensors; i++) lo = SP_MIN(lo, mf->tensors[i].offset);
    pg->base = align_down(lo);
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
    if (pg->cfg.fill) { /* a package: its shards decompress into the region */
        sp_status rc = pg->cfg.fill(pg->cfg.fill_user, dst, pg->base, n);
        if (rc) {
            munmap(m, (size_t)n);
            return rc;
        }
        done = n;
    }
    while (done < n) {
        const size_t chunk = (size_t)SP_MIN(n - done, (uint64_t)64 << 20);
        size_t got;
        const int err = sp_file_pread_all(fd, dst + done, chunk, pg->base + done, &got);
        if (err || got < chunk) {
            munmap(m, (size_t)n);
            return sp_err(SP_E_IO, "%s: reading '%s' at offset %llu: %s", __func__, mf->path,
                          (unsigned long long)(pg->base + done + got), err ? strerror(err) : "unexpected end of file");
        }
        done += chunk;
    }
    unpack_stored(pg, m);
    repack_resident(pg, m);
    (void)mprotect(m, (size_t)n, PROT_READ); /* weights are read-only from here on */
    pg->map = m;
    pg->map_size = n;
    return SP_OK;
}

static sp_status open_resident(struct sp_pager *pg) {
    int fd = open(pg->mf->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sp_err(SP_E_IO, "%s: cannot open '%s': %s", __func__, pg->mf->path, strerror(errno));
    sp_status rc = pg->mode == SP_WEIGHTS_MMAP ? map_file(pg, fd) : load_file(pg, fd);
    close(fd);
    return rc;
}

/* ---- I/O ----------------------------------------------------------------- */

/* Read [off, off + len) into dst; at least `need` bytes must arrive.  Returns
 * 0 or an errno value (EIO for a short file), with *err_off the file offset
 * that failed.  Transient errors are retried by sp_file_pread_all's policy
 * (core/file.h); what it gives up on is reported, never used. */
static int read_span(struct sp_pager *pg, uint8_t *dst, uint64_t off, uint64_t len, uint64_t need, uint64_t *err_off) {
    uint64_t done = 0;
    int fd = pg->direct ? pg->fd_direct : pg->fd;
    while (done < len) {
        size_t got;
        const int err = sp_file_pread_all(fd, dst + done, (size_t)(len - done), off + done, &got);
        done += got;
        if (err == EINVAL && fd != pg->fd) { /* O_DIRECT refused here: buffered from now on */
            fd = pg->fd;
            continue;
        }
        if (err) {
            *err_off = off + done;
            return err;
        }
        break; /* all of it, or the end of the file */
    }
    if (done < need) {
        *err_off = off + done;
        return EIO;
    }
#ifdef POSIX_FADV_DONTNEED
    if (fd == pg->fd) (void)posix_fadvise(pg->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
#endif
    return 0;
}

/* Repack or un-repack pinned tensor i once read (load_pinned's part, one
 * tensor at a time): the types sp_pager_wtype reports were fixed when the
 * plan was applied. */
static void finish_pinned(struct sp_pager *pg, uint32_t i) {
    const struct sp_tensor_desc *t = &pg->mf->tensors[i];
    uint8_t *data = pg->pinned_region + (pg->tptr[i] - (const uint8_t *)pg->pinned_region);
    const uint64_t rows = tensor_rows(t);
    const size_t rb = sp_qtype_row_bytes(t->type, t->ne[0]);
    if (pg->unpacked && pg->unpacked[i]) sp_qtype_unrepack(t->type, data, (int64_t)rows, t->ne[0], rb);
    if (pg->wtype && pg->wtype[i]) sp_qtype_repack(pg->wtype[i], data, (int64_t)rows, t->ne[0], rb);
}

/* A chunk of pinned tensor i arrived (under mu; err: its read failed).  The
 * last one finishes the tensor -- outside mu, it stays LOADING meanwhile --
 * and wakes the pins waiting for it. */
static void pinned_done(struct sp_pager *pg, uint32_t i, int err, uint64_t err_off) {
    struct pin_state *ps = &pg->pstate[i];
    if (err && !ps->err) {
        ps->err = err;
        ps->err_off = err_off;
    }
    SP_ASSERT(ps->pending > 0);
    if (--ps->pending) return;
    if (!ps->err) {
        pthread_mutex_unlock(&pg->mu);
        finish_pinned(pg, i);
        pthread_mutex_lock(&pg->mu);
    }
    atomic_store_explicit(&pg->pready[i], ps->err ? PIN_ERROR : PIN_READY, memory_order_release);
    if (--pg->pinned_pending == 0) {
        SP_LOG_I("pager: pinned weights read (%.1f MiB) %.3f s after the plan was applied", pg->pinned_size / 1048576.0,
                 now_s() - pg->t_apply);
    }
}

static void *io_main(void *arg) {
    struct sp_pager *pg = arg;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->stop && pg->q_len == 0) pthread_cond_wait(&pg->cv_io, &pg->mu);
        if (pg->stop) break;
        struct io_req r = pg->q[pg->q_head];
        pg->q_head = (pg->q_head + 1) % pg->q_cap;
        pg->q_len--;
        /* a slot's unit of a tensor read back as its file type (plan_unpack):
         * the slot is LOADING, so nobody changes it until the read is done */
        const struct slot *rs = r.slot >= 0 ? &pg->slots[r.slot] : NULL;
        const struct sp_tensor_desc *ut = rs && pg->unpacked && pg->unpacked[rs->tensor] ? &pg->mf->tensors[rs->tensor] : NULL;
        uint8_t *udata = ut ? (uint8_t *)rs->data : NULL;
        const uint64_t ulen = ut ? rs->unit_len : 0;
        const uint32_t stall_ms =
            r.slot < 0 && pg->pstate[r.tensor].seq + PINNED_STALLED >= pg->n_pinned ? pg->tune.pinned_stall_ms : 0;
        pthread_mutex_unlock(&pg->mu);
        if (stall_ms) nanosleep(&(struct timespec){.tv_sec = stall_ms / 1000, .tv_nsec = (long)(stall_ms % 1000) * 1000000L}, NULL);
        uint64_t err_off = 0;
        int err = read_span(pg, r.dst, r.off, r.len, r.need, &err_off);
        if (!err && ut) {
            const size_t rb = sp_qtype_row_bytes(ut->type, ut->ne[0]);
            sp_qtype_unrepack(ut->type, udata, (int64_t)(ulen / rb), ut->ne[0], rb);
        }
        pthread_mutex_lock(&pg->mu);
        if (r.slot < 0) {
            pinned_done(pg, r.tensor, err, err_off); /* may drop mu to repack */
        } else {
            pg->st.bytes_read += err ? 0 : r.len; /* streaming only: the pinned reads are start-up */
            struct slot *s = &pg->slots[r.slot];
            s->state = err ? SLOT_ERROR : SLOT_READY;
            s->err = err;
            s->err_off = err_off;
        }
        pthread_cond_broadcast(&pg->cv_done);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* Queue a read (under mu).  Demand reads go to the front. */
static void enqueue(struct sp_pager *pg, struct io_req r, bool front) {
    SP_ASSERT(pg->q_len < pg->q_cap);
    if (front) {
        pg->q_head = (pg->q_head + pg->q_cap - 1) % pg->q_cap;
        pg->q[pg->q_head] = r;
    } else {
        pg->q[(pg->q_head + pg->q_len) % pg->q_cap] = r;
    }
    pg->q_len++;
    pthread_cond_signal(&pg->cv_io);
}

/* ---- measuring ------------------------------------------------------------ */

/* Storage read speed: O_DIRECT 8 MiB reads at 16 spread offsets of the tensor
 * section (128 MiB), 4 threads in flight, as the pager reads; the best of 3
 * passes over the same offsets.  The pager reads the same streamed weights
 * again every token, and storage below a VM (or a device's own cache) serves
 * a range read again soon faster than the first time, so the first pass alone
 * underestimates what streaming gets (bench/memwall.sh measures the same way). */
struct rb_job {
    struct sp_pager *pg;
    uint8_t *buf;
    uint64_t offs[4];
    uint32_t n;
};

static void *rb_main(void *arg) {
    struct rb_job *j = arg;
    uint64_t err_off;
    for (uint32_t i = 0; i < j->n; i++) (void)read_span(j->pg, j->buf, j->offs[i], IO_CHUNK, 0, &err_off);
    return NULL;
}

static double measure_read_bps(struct sp_pager *pg) {
    const struct sp_model_file *mf = pg->mf;
    uint64_t lo = UINT64_MAX;
    for (uint32_t i = 0; i < mf->n_tensors; i++) lo = SP_MIN(lo, mf->tensors[i].offset);
    lo = align_down(lo);
    if (mf->file_size < lo + 2 * IO_CHUNK) return 1e9;
    const uint64_t span = mf->file_size - lo - IO_CHUNK;
    uint8_t *buf = mmap(NULL, 4 * IO_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1e9;
    memset(buf, 0, 4 * IO_CHUNK);
    struct rb_job jobs[4];
    uint32_t n = 0;
    for (uint32_t k = 0; k < 16; k++) {
        struct rb_job *j = &jobs[k % 4];
        if (k < 4) *j = (struct rb_job){.pg = pg, .buf = buf + k * IO_CHUNK};
        j->offs[j->n++] = align_down(lo + span / 16 * k);
        n++;
    }
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        pthread_t th[4];
        const double t0 = now_s();
        uint32_t started = 0;
        for (uint32_t k = 0; k < 4; k++) started += pthread_create(&th[k], NULL, rb_main, &jobs[k]) == 0;
        for (uint32_t k = 0; k < started; k++) pthread_join(th[k], NULL);
        const double dt = now_s() - t0;
        if (started == 4 && dt > 0) best = SP_MAX(best, (double)(n * IO_CHUNK) / dt);
    }
    munmap(buf, 4 * IO_CHUNK);
    return best > 0 ? best : 1e9;
}

/* Memory read speed of one thread over 64 MiB. */
static double measure_mem_bps(void) {
    const size_t n = (size_t)64 << 20;
    uint64_t *b = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 1e10;
    for (size_t i = 0; i < n / 8; i++) b[i] = i;
    volatile uint64_t sink = 0;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_s();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < n / 8; i += 4) {
            s0 += b[i];
            s1 += b[i + 1];
            s2 += b[i + 2];
            s3 += b[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
        const double dt = now_s() - t0;
        if (dt > 0) best = SP_MAX(best, (double)n / dt);
    }
    (void)sink;
    munmap(b, n);
    return best > 0 ? best : 1e10;
}

/* Resident set of this process now (VmRSS), or 0 when unknown. */
static uint64_t proc_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) break;
    }
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- open / plan / apply ------------------------------------------------- */

sp_status sp_pager_open(const struct sp_model_file *mf, const struct sp_pager_config *cfg, struct sp_pager **out) {
    *out = NULL;
    struct sp_pager *pg = sp_calloc(1, sizeof(*pg));
    if (!pg) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    pg->mf = mf;
    pg->cfg = *cfg;
    pg->budgeted = cfg->budget > 0;
    pg->fd = pg->fd_direct = -1;
    sp_status rc;
    pg->pins = sp_calloc(mf->n_tensors ? mf->n_tensors : 1, sizeof(*pg->pins));
    if (!pg->pins) {
        rc = sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        goto fail;
    }
    if ((rc = plan_unpack(pg))) goto fail;
    /* AUTO maps a file written to be used in place (its layouts all read
     * here); a tensor to un-repack needs writable memory, so never MMAP */
    pg->mode = cfg->mode == SP_WEIGHTS_MMAP || (cfg->mode == SP_WEIGHTS_AUTO && mf->in_place) ? SP_WEIGHTS_MMAP
                                                                                               : SP_WEIGHTS_LOAD;
    if (pg->unpacked) pg->mode = SP_WEIGHTS_LOAD;
    if (mf->n_tensors == 0) { /* vocab-only: nothing to map */
        *out = pg;
        return SP_OK;
    }
    if (cfg->fill) { /* bytes from the caller (a package): resident LOAD only */
        if (pg->budgeted) {
            rc = sp_err(SP_E_INVALID, "%s: '%s': a budget streams from a plain file, not from fill", __func__, mf->path);
            goto fail;
        }
        pg->mode = SP_WEIGHTS_LOAD;
        if ((rc = load_file(pg, -1))) goto fail;
        *out = pg;
        return SP_OK;
    }
    pg->fd = open(mf->path, O_RDONLY | O_CLOEXEC);
    if (pg->fd < 0) {
        rc = sp_err(SP_E_IO, "%s: cannot open '%s': %s", __func__, mf->path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(pg->fd, &st) != 0) {
        rc = sp_err(SP_E_IO, "%s: cannot stat '%s': %s", __func__, mf->path, strerror(errno));
        goto fail;
    }
    if ((uint64_t)st.st_size != mf->file_size) {
        rc = sp_err(SP_E_FORMAT, "%s: '%s' changed size since it was opened (%llu, was %llu)", __func__, mf->path,
                    (unsigned long long)st.st_size, (unsigned long long)mf->file_size);
        goto fail;
    }
    if (!pg->budgeted) {
        if ((rc = open_resident(pg))) goto fail;
        close(pg->fd);
        pg->fd = -1;
        *out = pg;
        return SP_OK;
    }
#ifdef O_DIRECT
    pg->fd_direct = open(mf->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
    pg->direct = pg->fd_direct >= 0;
    if (!pg->direct) {
        pg->fd_direct = pg->fd;
        SP_LOG_W("%s: O_DIRECT is not available for '%s'; reading through the page cache and dropping pages after use",
                 __func__, mf->path);
    }
    if (pthread_mutex_init(&pg->mu, NULL) || pthread_cond_init(&pg->cv_io, NULL) ||
        pthread_cond_init(&pg->cv_done, NULL) || pthread_mutex_init(&pg->turn, NULL)) {
        rc = sp_err(SP_E_NOMEM, "%s: cannot create locks", __func__);
        goto fail;
    }
    *out = pg;
    return SP_OK;
fail:
    sp_pager_close(pg);
    return rc;
}

void sp_pager_tune(struct sp_pager *pg, const struct sp_pager_tuning *t) {
    pg->tune = *t;
}

sp_status sp_pager_make_plan(struct sp_pager *pg, uint64_t session_bytes, struct sp_plan *out) {
    memset(out, 0, sizeof *out);
    if (!pg->budgeted) return sp_err(SP_E_STATE, "%s: the pager has no memory budget", __func__);
    if (pg->tune.read_bps > 0) pg->read_bps = pg->tune.read_bps;
    if (pg->tune.mem_bps > 0) pg->mem_bps = pg->tune.mem_bps;
    struct sp_plan_input in = {
        .mf = pg->mf, .embed = pg->cfg.embed, .budget = pg->cfg.budget,
        .base_bytes = pg->tune.base_set ? pg->tune.base_bytes : proc_rss(),
        .session_bytes = session_bytes, .read_bps = pg->read_bps, .mem_bps = pg->mem_bps,
        .n_experts = pg->cfg.n_experts, .n_experts_used = pg->cfg.n_experts_used,
        .ring_unit_bytes = pg->tune.unit_bytes, .small_bytes = pg->tune.small_bytes,
        .margin_set = pg->tune.margin_set, .margin_bytes = pg->tune.margin_bytes,
    };
    sp_status rc = sp_plan_make(&in, out);
    if (rc || out->resident || pg->read_bps > 0) return rc;
    /* Something streams: measure the speeds the prediction needs, once. */
    pg->read_bps = measure_read_bps(pg);
    pg->mem_bps = measure_mem_bps();
    sp_plan_free(out);
    in.read_bps = pg->read_bps;
    in.mem_bps = pg->mem_bps;
    return sp_plan_make(&in, out);
}

/* Forward-order ring schedule of the RING units. */
static sp_status build_schedule(struct sp_pager *pg) {
    const struct sp_model_file *mf = pg->mf;
    uint32_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++)
        if (pg->plan.t[i].place == SP_PLACE_RING) n += pg->plan.t[i].n_units;
    pg->sched = sp_calloc(n ? n : 1, sizeof *pg->sched);
    if (!pg->sched) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    bool *done = sp_calloc(mf->n_tensors, sizeof *done);
    if (!done) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    /* the model's forward order first, then any streamed tensor it did not list */
    for (uint32_t pass = 0; pass < 2; pass++) {
        const uint32_t m = pass == 0 ? pg->cfg.n_order : mf->n_tensors;
        for (uint32_t k = 0; k < m; k++) {
            const struct sp_tensor_desc *t = pass == 0 ? pg->cfg.order[k] : &mf->tensors[k];
            if (!t) continue;
            const uint32_t i = (uint32_t)(t - mf->tensors);
            if (done[i] || pg->plan.t[i].place != SP_PLACE_RING) continue;
            done[i] = true;
            const uint64_t ub = (uint64_t)pg->plan.t[i].unit_rows * (t->size / tensor_rows(t));
            for (uint32_t u = 0; u < pg->plan.t[i].n_units; u++) {
                struct sched_ent *e = &pg->sched[pg->n_sched];
                e->gu = pg->first_unit[i] + u;
                e->tensor = i;
                e->start = (uint64_t)u * ub;
                e->len = SP_MIN(ub, t->size - e->start);
                pg->unit_sched[e->gu] = (int32_t)pg->n_sched++;
            }
        }
    }
    sp_free(done);
    SP_ASSERT(pg->n_sched == n);
    return SP_OK;
}

/* Map a region of size bytes; the locker touches and locks it (lock_main),
 * the reads write into it meanwhile. */
static sp_status map_region(uint64_t size, uint8_t **out, const char *what) {
    *out = NULL;
    if (size == 0) return SP_OK;
    void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return sp_err(SP_E_NOMEM, "%s: cannot allocate %.1f MiB for %s: %s", __func__, size / 1048576.0, what,
                      strerror(errno));
    }
    *out = m;
    return SP_OK;
}

/* Touch and lock [p, p + size): mlock faults every page in and keeps it;
 * where locking is not allowed, MADV_POPULATE_WRITE faults them in without
 * changing what the reads already wrote.  Never writes the memory. */
static void touch_and_lock(uint8_t *p, uint64_t size) {
    if (!size) return;
    if (mlock(p, (size_t)size) == 0) return;
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1)) {
        SP_LOG_W("weights are not locked in memory (mlock: %s); the OS may swap them out. "
                 "Raise RLIMIT_MEMLOCK (ulimit -l) or run with CAP_IPC_LOCK to lock them",
                 strerror(errno));
    }
#ifdef MADV_POPULATE_WRITE
    (void)madvise(p, (size_t)size, MADV_POPULATE_WRITE);
#endif
}

/* The locker: the pinned region (the reads are filling it), then the pools,
 * touched and locked while the first layers are read and run -- not before
 * the first read, as when every region was MAP_POPULATEd and mlocked first. */
static void *lock_main(void *arg) {
    struct sp_pager *pg = arg;
    const double t0 = now_s();
    touch_and_lock(pg->pinned_region, pg->pinned_size);
    const double t1 = now_s();
    touch_and_lock(pg->slot_region, pg->slot_size);
    SP_LOG_I("pager: regions touched and locked: pinned %.1f MiB in %.3f s, pools %.1f MiB in %.3f s "
             "(%.3f s after the plan was applied)",
             pg->pinned_size / 1048576.0, t1 - t0, pg->slot_size / 1048576.0, now_s() - t1, now_s() - pg->t_apply);
    return NULL;
}

/* The layer a tensor named "blk.N...." belongs to, or -1. */
static int32_t layer_of_name(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    const long l = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && l >= 0 && l < 4096 ? (int32_t)l : -1;
}

/* Where pinned tensor i comes in the forward pass: the inputs (the token
 * embedding) first, then layer by layer, each layer's tensors in the order
 * the model listed (cfg.order) and the rest of the layer after, then what
 * follows the last layer (output norm and head). */
static uint64_t forward_rank(const struct sp_pager *pg, const uint32_t *pos, uint32_t i) {
    const int32_t l = layer_of_name(pg->mf->tensors[i].name);
    uint64_t group;
    if (l >= 0) group = (uint64_t)l + 1;
    else group = pos[i] < pg->cfg.n_order ? UINT32_MAX : 0; /* listed outside a layer: the output */
    return group << 32 | (pos[i] < pg->cfg.n_order ? pos[i] : pg->cfg.n_order + i);
}

struct ranked {
    uint64_t rank;
    uint32_t i;
};

static int cmp_rank(const void *a, const void *b) {
    const uint64_t x = ((const struct ranked *)a)->rank, y = ((const struct ranked *)b)->rank;
    return x < y ? -1 : x > y;
}

/* Queue the reads of pinned tensor i (under mu). */
static void queue_pinned(struct sp_pager *pg, uint32_t i) {
    const struct sp_tensor_desc *t = &pg->mf->tensors[i];
    const uint64_t a = align_down(t->offset), end = t->offset + t->size;
    const uint64_t len = align_up(end) - a;
    uint8_t *dst = (uint8_t *)pg->tptr[i] - (t->offset - a);
    struct pin_state *ps = &pg->pstate[i];
    ps->err = 0;
    ps->err_off = 0;
    for (uint64_t o = 0; o < len; o += IO_CHUNK) {
        const uint64_t n = SP_MIN(IO_CHUNK, len - o);
        const uint64_t need = a + o + n <= end ? n : (end > a + o ? end - (a + o) : 0);
        enqueue(pg, (struct io_req){.dst = dst + o, .off = a + o, .len = n, .need = need, .slot = -1, .tensor = i},
                false);
        ps->pending++;
    }
}

/* The start-up reads: every pinned tensor, in the forward pass's order, by
 * the I/O threads; nothing waits for them here (pin_pinned does). */
static sp_status start_pinned(struct sp_pager *pg, uint32_t n_pinned) {
    const struct sp_model_file *mf = pg->mf;
    struct ranked *idx = sp_malloc((size_t)SP_MAX(n_pinned, 1u) * sizeof *idx);
    uint32_t *pos = sp_malloc((size_t)mf->n_tensors * sizeof *pos);
    if (!idx || !pos) {
        sp_free(idx), sp_free(pos);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    for (uint32_t i = 0; i < mf->n_tensors; i++) pos[i] = UINT32_MAX;
    for (uint32_t k = pg->cfg.n_order; k-- > 0;)
        if (pg->cfg.order[k]) pos[pg->cfg.order[k] - mf->tensors] = k;
    uint32_t n = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (pg->plan.t[i].place != SP_PLACE_PINNED) continue;
        idx[n++] = (struct ranked){forward_rank(pg, pos, i), i};
    }
    SP_ASSERT(n == n_pinned);
    qsort(idx, n, sizeof *idx, cmp_rank); /* ranks are distinct: the order is total */
    pthread_mutex_lock(&pg->mu);
    pg->t_apply = now_s();
    pg->pinned_pending = pg->n_pinned = n;
    for (uint32_t k = 0; k < n; k++) pg->pstate[idx[k].i].seq = k;
    for (uint32_t k = 0; k < n; k++) queue_pinned(pg, idx[k].i);
    pthread_mutex_unlock(&pg->mu);
    sp_free(idx), sp_free(pos);
    return SP_OK;
}

/* Wait (under mu) until pinned tensor i is no longer LOADING; its state. */
static uint8_t wait_pinned_one(struct sp_pager *pg, uint32_t i) {
    uint8_t st;
    while ((st = atomic_load_explicit(&pg->pready[i], memory_order_acquire)) == PIN_LOADING)
        pthread_cond_wait(&pg->cv_done, &pg->mu);
    return st;
}

/* The error of pinned tensor i's failed read (its state copied under mu). */
static sp_status pinned_error(const struct sp_pager *pg, uint32_t i, int err, uint64_t err_off, const char *fn) {
    return sp_err(SP_E_IO, "%s: '%s': reading the resident weights failed at offset %llu (tensor '%s'): %s", fn,
                  pg->mf->path, (unsigned long long)err_off, pg->mf->tensors[i].name, strerror(err));
}

/* A pin of pinned tensor i that found it not READY: wait for its reads; a
 * failed one is read again (the next pin after a failure tries afresh, as a
 * streamed unit's does).  SP_E_IO naming the file and the offset. */
static sp_status pin_pinned(struct sp_pager *pg, uint32_t i) {
    pthread_mutex_lock(&pg->mu);
    const double t0 = now_s();
    pg->st.pinned_waits++;
    if (atomic_load_explicit(&pg->pready[i], memory_order_relaxed) == PIN_ERROR) {
        atomic_store_explicit(&pg->pready[i], PIN_LOADING, memory_order_relaxed);
        pg->pinned_pending++;
        queue_pinned(pg, i);
    }
    const uint8_t st = wait_pinned_one(pg, i);
    pg->st.pinned_wait_s += now_s() - t0;
    const int err = pg->pstate[i].err;
    const uint64_t err_off = pg->pstate[i].err_off;
    pthread_mutex_unlock(&pg->mu);
    return st == PIN_READY ? SP_OK : pinned_error(pg, i, err, err_off, __func__);
}

sp_status sp_pager_wait_pinned(struct sp_pager *pg) {
    if (!pg->streaming) return SP_OK;
    const struct sp_model_file *mf = pg->mf;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        if (!pg->tptr[i] || atomic_load_explicit(&pg->pready[i], memory_order_acquire) == PIN_READY) continue;
        pthread_mutex_lock(&pg->mu);
        wait_pinned_one(pg, i);
        const int err = pg->pstate[i].err;
        const uint64_t err_off = pg->pstate[i].err_off;
        pthread_mutex_unlock(&pg->mu);
        if (err) return pinned_error(pg, i, err, err_off, __func__);
    }
    return SP_OK;
}

/* The next-use policy for the expert pool, unless LRU was asked for or no
 * expert streams.  Needs every streamed expert tensor's layer from its name. */
static sp_status expert_policy_init(struct sp_pager *pg) {
    const struct sp_model_file *mf = pg->mf;
    if (pg->cfg.expert_cache == SP_EXPERT_CACHE_LRU || !pg->plan.expert_slots || pg->cfg.n_experts < 2) return SP_OK;
    pg->t_layer = sp_malloc((size_t)mf->n_tensors * sizeof *pg->t_layer);
    if (!pg->t_layer) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    int32_t n_layers = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        pg->t_layer[i] = -1;
        if (pg->plan.t[i].place != SP_PLACE_EXPERT) continue;
        const int32_t l = layer_of_name(mf->tensors[i].name);
        if (l < 0 || pg->plan.t[i].units_per_expert == 0) { /* not a layout the policy knows: LRU */
            sp_free(pg->t_layer);
            pg->t_layer = NULL;
            return SP_OK;
        }
        pg->t_layer[i] = l;
        n_layers = SP_MAX(n_layers, l + 1);
    }
    return n_layers ? sp_xcache_new((uint32_t)n_layers, pg->cfg.n_experts, &pg->xc) : SP_OK;
}

/* Expert slices of unit u of tensor i are used (counted once per use). */
static void expert_used(struct sp_pager *pg, uint32_t i, uint32_t u) {
    if (pg->xc && pg->t_layer[i] >= 0)
        sp_xcache_use(pg->xc, (uint32_t)pg->t_layer[i], u / pg->plan.t[i].units_per_expert);
}

static sp_status apply_plan(struct sp_pager *pg) {
    const struct sp_model_file *mf = pg->mf;
    struct sp_plan *p = &pg->plan;
    sp_status rc;
    if (p->resident) { /* the model fits: exactly the unbudgeted path */
        if ((rc = open_resident(pg))) return rc;
        pg->applied = true;
        return SP_OK;
    }
    pg->streaming = true;
    pg->tptr = sp_calloc(mf->n_tensors, sizeof *pg->tptr);
    pg->first_unit = sp_calloc(mf->n_tensors, sizeof *pg->first_unit);
    if (!pg->tptr || !pg->first_unit) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    uint64_t pinned = 0;
    uint32_t n_pinned = 0, pinned_chunks = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        pg->first_unit[i] = pg->n_units;
        if (p->t[i].place == SP_PLACE_PINNED) {
            const uint64_t len = align_up(t->offset + t->size) - align_down(t->offset);
            pinned += len;
            n_pinned++;
            pinned_chunks += (uint32_t)((len + IO_CHUNK - 1) / IO_CHUNK);
        } else if (p->t[i].place != SP_PLACE_ROWS) {
            pg->n_units += p->t[i].n_units;
        }
    }
    pg->unit_slot = sp_malloc((size_t)SP_MAX(pg->n_units, 1u) * sizeof *pg->unit_slot);
    pg->unit_sched = sp_malloc((size_t)SP_MAX(pg->n_units, 1u) * sizeof *pg->unit_sched);
    if (!pg->unit_slot || !pg->unit_sched) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    for (uint32_t u = 0; u < pg->n_units; u++) pg->unit_slot[u] = pg->unit_sched[u] = -1;
    if ((rc = build_schedule(pg))) return rc;
    if ((rc = expert_policy_init(pg))) return rc;

    const uint32_t counts[POOL_COUNT] = {p->ring_slots, p->expert_slots, p->row_slots};
    const uint64_t sizes[POOL_COUNT] = {p->ring_slot_bytes, p->expert_slot_bytes, p->row_slot_bytes};
    uint64_t slot_total = 0;
    for (int k = 0; k < POOL_COUNT; k++) {
        pg->pools[k] = (struct pool){.first = pg->n_slots, .n = counts[k], .slot_bytes = sizes[k]};
        pg->n_slots += counts[k];
        slot_total += (uint64_t)counts[k] * sizes[k];
    }
    pg->slots = sp_calloc(SP_MAX(pg->n_slots, 1u), sizeof *pg->slots);
    pg->q_cap = pg->n_slots + 64 + pinned_chunks; /* every pinned chunk is queued at once */
    pg->q = sp_calloc(pg->q_cap, sizeof *pg->q);
    if (!pg->slots || !pg->q) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    pg->pinned_size = pinned;
    pg->slot_size = slot_total;
    pg->pstate = sp_calloc(mf->n_tensors, sizeof *pg->pstate);
    pg->pready = sp_calloc(mf->n_tensors, sizeof *pg->pready);
    if (!pg->pstate || !pg->pready) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    if ((rc = map_region(pinned, &pg->pinned_region, "pinned weights"))) return rc;
    if ((rc = map_region(slot_total, &pg->slot_region, "streaming buffers"))) return rc;
    /* where each pinned tensor goes, and the layout it is repacked to once
     * read (resident_choice, made now: sp_pager_wtype must answer
     * before the reads are done) */
    uint64_t cur_pin = 0, repacked = 0;
    uint32_t n_repacked = 0;
    for (uint32_t i = 0; i < mf->n_tensors; i++) {
        const struct sp_tensor_desc *t = &mf->tensors[i];
        if (p->t[i].place != SP_PLACE_PINNED) continue;
        const uint64_t a = align_down(t->offset), len = align_up(t->offset + t->size) - a;
        SP_ASSERT(cur_pin + len <= pinned);
        pg->tptr[i] = pg->pinned_region + cur_pin + (t->offset - a);
        cur_pin += len;
        const uint32_t r = resident_choice(pg, t);
        if (!r) continue;
        if (!pg->wtype && !(pg->wtype = sp_calloc(mf->n_tensors, sizeof *pg->wtype)))
            return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
        pg->wtype[i] = r;
        repacked += t->size;
        n_repacked++;
    }
    if (n_repacked) SP_LOG_I("repacking %u pinned tensors (%.1f MiB) to resident layouts as they are read", n_repacked,
                             repacked / 1048576.0);
    uint8_t *cur = pg->slot_region;
    for (int k = 0; k < POOL_COUNT; k++) {
        for (uint32_t s = 0; s < pg->pools[k].n; s++) {
            struct slot *sl = &pg->slots[pg->pools[k].first + s];
            sl->buf = cur;
            sl->key = -1;
            sl->pool = (uint8_t)k;
            cur += pg->pools[k].slot_bytes;
        }
    }
    pg->n_io = pg->cfg.io_threads ? pg->cfg.io_threads : DEFAULT_IO_THREADS;
    pg->io = sp_calloc(pg->n_io, sizeof *pg->io);
    if (!pg->io) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    for (uint32_t k = 0; k < pg->n_io; k++) {
        if (pthread_create(&pg->io[k], NULL, io_main, pg) != 0) {
            pg->n_io = k;
            return sp_err(SP_E_NOMEM, "%s: cannot start I/O threads", __func__);
        }
    }
    if ((rc = start_pinned(pg, n_pinned))) return rc;
    if (pthread_create(&pg->locker, NULL, lock_main, pg) == 0) pg->locker_started = true;
    else lock_main(pg); /* no thread: lock them here, as before */
    pg->applied = true;
    SP_LOG_I("pager: %.2f GiB pinned, pools %u ring x %.1f MiB, %u expert x %.2f MiB, %u row; "
             "predicted %.2f tok/s (read %.2f GB/s)",
             pinned / 1073741824.0, p->ring_slots, p->ring_slot_bytes / 1048576.0, p->expert_slots,
             p->expert_slot_bytes / 1048576.0, p->row_slots, p->predicted_tps, pg->read_bps / 1e9);
    return SP_OK;
}

/* Back to "budgeted, not applied" (a failed apply; close): stop the I/O
 * threads and free what planning and applying made, so a later reserve --
 * once storage reads again -- plans and applies from scratch.  Under no lock:
 * the locker is joined first, then the I/O threads (a read in flight is
 * finished, the queued ones dropped), before any memory goes. */
static void unapply(struct sp_pager *pg) {
    if (pg->locker_started) pthread_join(pg->locker, NULL);
    pg->locker_started = false;
    if (pg->io) {
        pthread_mutex_lock(&pg->mu);
        pg->stop = true;
        pthread_cond_broadcast(&pg->cv_io);
        pthread_mutex_unlock(&pg->mu);
        for (uint32_t k = 0; k < pg->n_io; k++) pthread_join(pg->io[k], NULL);
        sp_free(pg->io);
    }
    if (pg->map) munmap((void *)pg->map, (size_t)pg->map_size);
    if (pg->pinned_region) munmap(pg->pinned_region, (size_t)pg->pinned_size);
    if (pg->slot_region) munmap(pg->slot_region, (size_t)pg->slot_size);
    sp_plan_free(&pg->plan);
    sp_free(pg->tptr);
    sp_free(pg->first_unit);
    sp_free(pg->unit_slot);
    sp_free(pg->unit_sched);
    sp_free(pg->sched);
    sp_free(pg->slots);
    sp_free(pg->q);
    sp_free(pg->wtype);
    sp_free(pg->pstate);
    sp_free((void *)pg->pready);
    pg->pstate = NULL;
    pg->pready = NULL;
    sp_xcache_free(pg->xc);
    sp_free(pg->t_layer);
    pg->xc = NULL;
    pg->t_layer = NULL;
    pg->x_guess_issued = pg->x_guess_used = 0;
    pg->x_filled = pg->x_cursor = 0;
    pg->io = NULL;
    pg->n_io = 0;
    pg->stop = pg->streaming = pg->applied = false;
    pg->map = NULL;
    pg->map_size = pg->base = 0;
    pg->pinned_region = pg->slot_region = NULL;
    pg->pinned_size = pg->slot_size = 0;
    pg->tptr = NULL;
    pg->first_unit = NULL;
    pg->unit_slot = pg->unit_sched = NULL;
    pg->sched = NULL;
    pg->slots = NULL;
    pg->q = NULL;
    pg->wtype = NULL;
    pg->n_units = pg->n_sched = pg->sched_next = pg->n_slots = 0;
    memset(pg->pools, 0, sizeof pg->pools);
    pg->q_cap = pg->q_head = pg->q_len = pg->pinned_pending = 0;
    pg->n_pinned = 0;
}

/* The weights' share of the account: all the plan holds but the sessions'
 * envelope (base process, pinned, pools, bookkeeping). */
static void weights_share(const struct sp_plan *p, uint64_t *base, uint64_t *weights) {
    *base = p->base_bytes;
    *weights = p->total_bytes - SP_MIN(p->total_bytes, p->base_bytes + p->session_bytes);
}

sp_status sp_pager_apply(struct sp_pager *pg, uint64_t envelope_bytes) {
    if (!pg->budgeted || pg->applied) return SP_OK;
    sp_status rc = sp_pager_make_plan(pg, envelope_bytes, &pg->plan);
    if (rc) return rc;
    pg->plan_session = envelope_bytes;
    uint64_t base, weights;
    weights_share(&pg->plan, &base, &weights);
    if ((rc = sp_budget_reserve(pg->cfg.account, SP_BUDGET_BASE, base, "the process"))) {
        unapply(pg);
        return rc;
    }
    if ((rc = sp_budget_reserve(pg->cfg.account, SP_BUDGET_WEIGHTS, weights, "the weights"))) {
        sp_budget_release(pg->cfg.account, SP_BUDGET_BASE, base);
        unapply(pg);
        return rc;
    }
    if ((rc = apply_plan(pg))) {
        sp_budget_release(pg->cfg.account, SP_BUDGET_BASE, base);
        sp_budget_release(pg->cfg.account, SP_BUDGET_WEIGHTS, weights);
        unapply(pg);
        return rc;
    }
    pg->accounted = true;
    return SP_OK;
}

void sp_pager_turn_begin(struct sp_pager *pg) {
    if (pg && pg->budgeted && pg->mf->n_tensors) pthread_mutex_lock(&pg->turn);
}

void sp_pager_turn_end(struct sp_pager *pg) {
    if (pg && pg->budgeted && pg->mf->n_tensors) pthread_mutex_unlock(&pg->turn);
}



void sp_pager_close(struct sp_pager *pg) {
    if (!pg) return;
    if (pg->accounted) {
        uint64_t base, weights;
        weights_share(&pg->plan, &base, &weights);
        sp_budget_release(pg->cfg.account, SP_BUDGET_BASE, base);
        sp_budget_release(pg->cfg.account, SP_BUDGET_WEIGHTS, weights);
    }
    unapply(pg);
    if (pg->budgeted && pg->mf->n_tensors) {
        pthread_mutex_destroy(&pg->mu);
        pthread_cond_destroy(&pg->cv_io);
        pthread_cond_destroy(&pg->cv_done);
        pthread_mutex_destroy(&pg->turn);
    }
    if (pg->fd_direct >= 0 && pg->fd_direct != pg->fd) close(pg->fd_direct);
    if (pg->fd >= 0) close(pg->fd);
    sp_free(pg->pins);
    sp_free(pg->unpacked);
    sp_free(pg);
}

/* ---- streaming ----------------------------------------------------------- */

static size_t tensor_index(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    SP_ASSERT(t >= pg->mf->tensors && t < pg->mf->tensors + pg->mf->n_tensors);
    return (size_t)(t - pg->mf->tensors);
}

uint32_t sp_pager_unit_rows(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    const uint64_t rows = tensor_rows(t);
    if (!pg->streaming) return (uint32_t)SP_MIN(rows, (uint64_t)UINT32_MAX);
    return pg->plan.t[tensor_index(pg, t)].unit_rows;
}

/* The unit of tensor i holding byte off: its local index and tensor-relative
 * range. */
static void unit_of(const struct sp_pager *pg, uint32_t i, uint64_t off, uint32_t *u, uint64_t *start, uint64_t *len) {
    const struct sp_tensor_desc *t = &pg->mf->tensors[i];
    const struct sp_plan_tensor *pt = &pg->plan.t[i];
    const uint64_t row_bytes = t->size / tensor_rows(t), ub = (uint64_t)pt->unit_rows * row_bytes;
    if (pt->place == SP_PLACE_EXPERT) {
        const uint64_t eb = (uint64_t)t->ne[1] * row_bytes, e = off / eb, r = (off - e * eb) / ub;
        *u = (uint32_t)(e * pt->units_per_expert + r);
        *start = e * eb + r * ub;
        *len = SP_MIN(ub, eb - r * ub);
    } else {
        *u = (uint32_t)(off / ub);
        *start = (uint64_t)*u * ub;
        *len = SP_MIN(ub, t->size - *start);
    }
}

/* A slot of pool k to (re)use, or -1.  Under mu.  for_prefetch: do not take
 * a slot holding a prefetched unit nobody has used yet. */
static int32_t pick_victim(struct sp_pager *pg, int k, bool for_prefetch, int32_t near_sched) {
    const struct pool *po = &pg->pools[k];
    int32_t best = -1;
    double best_first = 0; /* the next-use policy's score; ties (and the other policies) by score */
    uint64_t best_score = 0;
    const bool next_use = k == POOL_EXPERT && pg->xc;
    const double guess_rate = (double)(pg->x_guess_used + 1) / (double)(pg->x_guess_issued + 2);
    /* The next-use policy, once the pool is full, ranks a window of
     * X_WINDOW slots from a rotating cursor (the best of them is close to
     * the best of all, and ranking every slot per miss cost more than the
     * matmuls of a small model); a window with no candidate falls back to
     * all slots. */
    uint32_t from = 0, n = po->n;
    if (next_use && pg->x_filled >= po->n && po->n > X_WINDOW) {
        from = pg->x_cursor % po->n;
        n = X_WINDOW;
        pg->x_cursor = from + X_WINDOW;
    }
again:
    for (uint32_t j = 0; j < n; j++) {
        const uint32_t s = po->first + (from + j) % po->n;
        const struct slot *sl = &pg->slots[s];
        if (sl->refs || sl->state == SLOT_LOADING) continue;
        if (sl->state == SLOT_FREE || sl->state == SLOT_ERROR) return (int32_t)s;
        /* a prefetched unit nobody used yet is protected from other prefetches,
         * for a while: a wrong guess must not hold its slot forever */
        const bool fresh = sl->prefetched && !sl->used &&
                           (k == POOL_RING || pg->tick - sl->last_use < (uint64_t)po->n);
        uint64_t score;
        if (k == POOL_RING) {
            if (fresh && for_prefetch) continue;
            /* consumed units first; among unconsumed, the furthest ahead */
            const int32_t pos = pg->unit_sched[sl->key];
            const uint64_t ahead = near_sched >= 0 && pos >= 0
                                       ? (uint64_t)((pos - near_sched + (int32_t)pg->n_sched) % (int32_t)pg->n_sched)
                                       : 0;
            score = sl->used ? UINT64_MAX : ahead;
        } else {
            if (fresh && for_prefetch) continue;
            score = UINT64_MAX - sl->last_use; /* least recently used */
        }
        double first = 0;
        if (next_use) {
            /* chosen for the layer now served and not pinned yet: keep it */
            first = sl->counted ? -1.0
                                : sp_xcache_evict_score(pg->xc, sl->xl, sl->xe,
                                                        sl->prefetched && !sl->used &&
                                                            sl->xguess > sp_xcache_visits(pg->xc, sl->xl),
                                                        guess_rate);
        }
        if (best < 0 || first > best_first || (first == best_first && score > best_score)) {
            best = (int32_t)s;
            best_first = first;
            best_score = score;
        }
    }
    if (best < 0 && n < po->n) {
        from = 0;
        n = po->n;
        goto again;
    }
    return best;
}

/* Start reading unit gu (tensor i, range [start, start+len)) into slot s. */
static void start_read(struct sp_pager *pg, int32_t s, int64_t key, uint32_t i, uint64_t start, uint64_t len,
                       bool prefetch) {
    struct slot *sl = &pg->slots[s];
    if (sl->pool == POOL_EXPERT && sl->state == SLOT_FREE && sl->key < 0) pg->x_filled++;
    /* forget the unit this slot held -- unless another slot holds it now (a
     * unit whose read failed here may have been read again elsewhere) */
    if (sl->key >= 0 && sl->pool != POOL_ROWS && pg->unit_slot[sl->key] == s) pg->unit_slot[sl->key] = -1;
    const struct sp_tensor_desc *t = &pg->mf->tensors[i];
    const uint64_t a = align_down(t->offset + start), end = t->offset + start + len;
    const uint64_t span = align_up(end) - a;
    SP_ASSERT(span <= pg->pools[sl->pool].slot_bytes);
    sl->key = key;
    sl->tensor = i;
    sl->unit_off = start;
    sl->unit_len = len;
    sl->data = sl->buf + (t->offset + start - a);
    sl->state = SLOT_LOADING;
    sl->prefetched = prefetch;
    sl->used = false;
    sl->counted = false;
    sl->last_use = ++pg->tick;
    if (sl->pool != POOL_ROWS) pg->unit_slot[key] = s;
    if (sl->pool == POOL_EXPERT && pg->xc) {
        sl->xl = (uint32_t)pg->t_layer[i];
        sl->xe = (uint32_t)(key - pg->first_unit[i]) / pg->plan.t[i].units_per_expert;
        sl->xguess = prefetch ? sp_xcache_visits(pg->xc, sl->xl) + 1 : 0;
    }
    if (prefetch) pg->st.prefetch_issued++;
    if (prefetch && sl->pool == POOL_EXPERT) pg->x_guess_issued++;
    enqueue(pg, (struct io_req){.dst = sl->buf, .off = a, .len = span, .need = end - a, .slot = s}, !prefetch);
}

/* Keep the ring full: read ahead along the schedule while slots are free. */
static void ring_fill(struct sp_pager *pg) {
    const struct pool *po = &pg->pools[POOL_RING];
    if (!pg->n_sched || !po->n) return;
    for (uint32_t guard = 0; guard < po->n && guard < pg->n_sched; guard++) {
        const struct sched_ent *e = &pg->sched[pg->sched_next];
        if (pg->unit_slot[e->gu] < 0) {
            const int32_t s = pick_victim(pg, POOL_RING, true, (int32_t)pg->sched_next);
            if (s < 0) return;
            start_read(pg, s, e->gu, e->tensor, e->start, e->len, true);
        }
        pg->sched_next = (pg->sched_next + 1) % pg->n_sched;
    }
}

/* Wait (under mu) until slot s is not LOADING; account the wait. */
static void wait_loaded(struct sp_pager *pg, int32_t s) {
    if (pg->slots[s].state != SLOT_LOADING) return;
    const double t0 = now_s();
    while (pg->slots[s].state == SLOT_LOADING) pthread_cond_wait(&pg->cv_done, &pg->mu);
    pg->st.wait_s += now_s() - t0;
}

static sp_status pin_streamed(struct sp_pager *pg, uint32_t i, uint64_t off, uint64_t nbytes, const void **out) {
    const struct sp_tensor_desc *t = &pg->mf->tensors[i];
    const struct sp_plan_tensor *pt = &pg->plan.t[i];
    const bool rows = pt->place == SP_PLACE_ROWS;
    const int k = rows ? POOL_ROWS : pt->place == SP_PLACE_EXPERT ? POOL_EXPERT : POOL_RING;
    uint32_t u = 0;
    uint64_t start, len;
    int64_t key;
    if (rows) { /* any range that fits a row slot, keyed by its exact position */
        start = off;
        len = nbytes;
        if (sp_plan_span_bytes(len) > pg->pools[POOL_ROWS].slot_bytes) {
            return sp_err(SP_E_INVALID, "%s: %llu bytes of '%s' exceed the row buffer (%llu)", __func__,
                          (unsigned long long)nbytes, t->name, (unsigned long long)pg->pools[POOL_ROWS].slot_bytes);
        }
        key = (int64_t)(((uint64_t)i << 40) ^ off);
    } else {
        unit_of(pg, i, off, &u, &start, &len);
        if (off + nbytes > start + len) {
            return sp_err(SP_E_INVALID, "%s: range [%llu, +%llu) of '%s' spans more than one unit (%u rows)",
                          __func__, (unsigned long long)off, (unsigned long long)nbytes, t->name, pt->unit_rows);
        }
        key = pg->first_unit[i] + u;
    }
    pthread_mutex_lock(&pg->mu);
    if (k == POOL_EXPERT) expert_used(pg, i, u);
    int32_t s = -1;
    if (rows) {
        for (uint32_t j = pg->pools[k].first; j < pg->pools[k].first + pg->pools[k].n; j++) {
            const struct slot *sl = &pg->slots[j];
            if (sl->key == key && sl->tensor == i && sl->unit_off == start && sl->unit_len == len &&
                sl->state != SLOT_FREE) {
                s = (int32_t)j;
                break;
            }
        }
    } else {
        s = pg->unit_slot[key];
    }
    if (s >= 0 && pg->slots[s].state != SLOT_ERROR) {
        if (pg->slots[s].state == SLOT_LOADING) pg->st.waits++;
        else pg->st.hits++;
        if (k == POOL_EXPERT && !pg->slots[s].counted) {
            pg->st.expert_pins++;
            pg->st.expert_hits++;
            pg->slots[s].counted = true;
        }
    } else {
        pg->st.misses++;
        if (k == POOL_EXPERT) pg->st.expert_pins++;
        for (;;) {
            s = pick_victim(pg, k, false, k == POOL_RING ? pg->unit_sched[key] : -1);
            if (s >= 0) break;
            pthread_cond_wait(&pg->cv_done, &pg->mu); /* every slot busy: wait for an unpin or a read */
        }
        start_read(pg, s, key, i, start, len, false);
        pg->slots[s].counted = true;
    }
    struct slot *sl = &pg->slots[s];
    sl->refs++; /* held across the wait: nobody may evict it */
    wait_loaded(pg, s);
    if (sl->state == SLOT_ERROR) {
        /* nothing of the unit is used: the slot is free again, and the next
         * pin of the unit reads it afresh */
        const int err = sl->err;
        const uint64_t err_off = sl->err_off;
        sl->refs--;
        sl->state = SLOT_FREE;
        if (!rows) pg->unit_slot[key] = -1;
        sl->key = -1;
        pthread_cond_broadcast(&pg->cv_done);
        pthread_mutex_unlock(&pg->mu);
        return sp_err(SP_E_IO, "%s: '%s': read failed at offset %llu (tensor '%s', bytes [%llu, +%llu) of it): %s",
                      __func__, pg->mf->path, (unsigned long long)err_off, t->name, (unsigned long long)start,
                      (unsigned long long)len, strerror(err));
    }
    if (sl->prefetched && !sl->used) {
        pg->st.prefetch_used++;
        if (k == POOL_EXPERT) pg->x_guess_used++;
    }
    sl->used = true;
    sl->last_use = ++pg->tick;
    if (k == POOL_RING) {
        /* resynchronise the read-ahead when the forward pass is not where it expected */
        const uint32_t pos = (uint32_t)pg->unit_sched[key];
        const uint32_t dist = (pg->sched_next + pg->n_sched - pos) % pg->n_sched;
        if (dist == 0 || dist > pg->pools[POOL_RING].n) pg->sched_next = (pos + 1) % pg->n_sched;
        ring_fill(pg);
    }
    pg->st.pins++;
    pthread_mutex_unlock(&pg->mu);
    *out = sl->data + (off - start);
    return SP_OK;
}

sp_status sp_pager_pin_range(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes,
                             const void **out) {
    const size_t i = tensor_index(pg, t);
    uint64_t end;
    if (sp_add_overflow_u64(off, nbytes, &end) || end > t->size) {
        return sp_err(SP_E_INVALID, "%s: range [%llu, +%llu) outside tensor '%s' (%llu bytes)", __func__,
                      (unsigned long long)off, (unsigned long long)nbytes, t->name, (unsigned long long)t->size);
    }
    if (pg->budgeted && !pg->applied) {
        return sp_err(SP_E_STATE, "%s: the memory budget is not planned yet (create a session first)", __func__);
    }
    if (pg->streaming) {
        if (pg->tptr[i]) {
            sp_status rc;
            if (atomic_load_explicit(&pg->pready[i], memory_order_acquire) != PIN_READY && (rc = pin_pinned(pg, (uint32_t)i)))
                return rc;
            atomic_fetch_add(&pg->pins[i], 1);
            atomic_fetch_add(&pg->n_pins, 1);
            *out = pg->tptr[i] + off;
            return SP_OK;
        }
        return pin_streamed(pg, (uint32_t)i, off, nbytes, out);
    }
    if (!pg->map || t->offset < pg->base || t->offset - pg->base + end > pg->map_size) {
        return sp_err(SP_E_IO, "%s: tensor '%s' is not resident", __func__, t->name);
    }
    atomic_fetch_add(&pg->pins[i], 1);
    atomic_fetch_add(&pg->n_pins, 1);
    *out = pg->map + (t->offset - pg->base) + off;
    return SP_OK;
}

void sp_pager_unpin(struct sp_pager *pg, const struct sp_tensor_desc *t, const void *p) {
    const size_t i = tensor_index(pg, t);
    if (pg->streaming && !pg->tptr[i]) {
        const uint8_t *q = p;
        SP_ASSERT(q >= pg->slot_region && q < pg->slot_region + pg->slot_size);
        pthread_mutex_lock(&pg->mu);
        /* the slot whose buffer holds p */
        int32_t s = -1;
        for (int k = 0; k < POOL_COUNT && s < 0; k++) {
            const struct pool *po = &pg->pools[k];
            if (!po->n) continue;
            const uint8_t *b0 = pg->slots[po->first].buf;
            if (q >= b0 && q < b0 + (uint64_t)po->n * po->slot_bytes) s = (int32_t)(po->first + (uint64_t)(q - b0) / po->slot_bytes);
        }
        SP_ASSERT(s >= 0 && pg->slots[s].refs > 0 && pg->slots[s].tensor == i); /* invariant 1 */
        if (--pg->slots[s].refs == 0) pg->slots[s].counted = false;
        pg->st.unpins++;
        if (pg->slots[s].pool == POOL_RING) ring_fill(pg);
        pthread_cond_broadcast(&pg->cv_done);
        pthread_mutex_unlock(&pg->mu);
        return;
    }
    uint_fast32_t prev = atomic_fetch_sub(&pg->pins[i], 1);
    SP_ASSERT(prev > 0); /* invariant 1: one unpin per successful pin */
    atomic_fetch_add(&pg->n_unpins, 1);
}

uint32_t sp_pager_wtype(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    const size_t i = tensor_index(pg, t);
    if (pg->wtype && pg->wtype[i]) return pg->wtype[i];
    return pg->unpacked && pg->unpacked[i] ? pg->unpacked[i] : t->type;
}

/* Hints (see pager.h).  certain: the units will be pinned next, so they are
 * read like demand misses (prefetch slots may be taken) and counted as the
 * expert lookups; otherwise a guess that takes only slots nobody needs.
 * pass 1 (certain only): the units already resident are counted and so kept
 * from eviction; pass 2: the missing ones are read.  Doing the whole batch's
 * hits first matters: a miss must not evict a unit needed later in the same
 * batch (the next-use policy ranks a layer's own experts furthest away). */
static void hint_spans(struct sp_pager *pg, const struct sp_pager_span *sp, uint32_t n_spans, bool certain) {
    if (!pg->streaming) return;
    pthread_mutex_lock(&pg->mu);
    for (int pass = certain ? 1 : 2; pass <= 2; pass++) {
        for (uint32_t j = 0; j < n_spans; j++) {
            const struct sp_tensor_desc *t = sp[j].t;
            const uint32_t i = (uint32_t)tensor_index(pg, t);
            const struct sp_plan_tensor *pt = &pg->plan.t[i];
            if (pt->place != SP_PLACE_EXPERT && pt->place != SP_PLACE_RING) continue;
            const int k = pt->place == SP_PLACE_EXPERT ? POOL_EXPERT : POOL_RING;
            const uint64_t end = SP_MIN(t->size, sp[j].off + sp[j].n);
            for (uint64_t off = sp[j].off; off < end;) {
                uint32_t u;
                uint64_t start, len;
                unit_of(pg, i, off, &u, &start, &len);
                off = start + len;
                const uint32_t gu = pg->first_unit[i] + u;
                const int32_t have = pg->unit_slot[gu];
                const bool resident = have >= 0 && pg->slots[have].state != SLOT_ERROR;
                if (pass == 1) {
                    if (k == POOL_EXPERT) expert_used(pg, i, u);
                    if (!resident) continue;
                    struct slot *sl = &pg->slots[have];
                    sl->last_use = ++pg->tick; /* wanted soon: keep it */
                    if (k == POOL_EXPERT && !sl->counted) {
                        pg->st.expert_pins++;
                        pg->st.expert_hits++;
                        sl->counted = true;
                    }
                    if (sl->prefetched && !sl->used) {
                        pg->st.prefetch_used++;
                        if (k == POOL_EXPERT) pg->x_guess_used++;
                        sl->used = true;
                    }
                } else if (resident) {
                    if (!certain) pg->slots[have].last_use = ++pg->tick; /* wanted soon: keep it */
                } else {
                    const int32_t s = pick_victim(pg, k, !certain, -1);
                    if (s < 0) break;
                    start_read(pg, s, gu, i, start, len, !certain);
                    if (certain && k == POOL_EXPERT) {
                        pg->st.expert_pins++; /* a miss: read now, ahead of its pin */
                        pg->slots[s].counted = true;
                    }
                }
            }
        }
    }
    pthread_mutex_unlock(&pg->mu);
}

void sp_pager_prefetch(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes) {
    const struct sp_pager_span one = {t, off, nbytes};
    hint_spans(pg, &one, 1, false);
}

void sp_pager_need(struct sp_pager *pg, const struct sp_tensor_desc *t, uint64_t off, uint64_t nbytes) {
    const struct sp_pager_span one = {t, off, nbytes};
    hint_spans(pg, &one, 1, true);
}

void sp_pager_need_spans(struct sp_pager *pg, const struct sp_pager_span *spans, uint32_t n) {
    hint_spans(pg, spans, n, true);
}

bool sp_pager_streams(const struct sp_pager *pg, const struct sp_tensor_desc *t) {
    return pg->streaming && pg->plan.t[tensor_index(pg, t)].place != SP_PLACE_PINNED;
}

void sp_pager_get_stats(const struct sp_pager *pg, struct sp_pager_stats *out) {
    struct sp_pager *mpg = (struct sp_pager *)pg; /* the lock is not part of the logical state */
    if (pg->streaming) pthread_mutex_lock(&mpg->mu);
    *out = pg->st;
    if (pg->streaming) pthread_mutex_unlock(&mpg->mu);
    out->pins += atomic_load(&pg->n_pins);
    out->unpins += atomic_load(&pg->n_unpins);
    out->outstanding = out->pins - out->unpins;
    out->mapped_bytes = pg->streaming ? pg->pinned_size + pg->slot_size : pg->map_size;
    out->mode = pg->mode;
    out->budgeted = pg->streaming;
}

const struct sp_plan *sp_pager_plan(const struct sp_pager *pg) {
    return pg->budgeted && pg->applied ? &pg->plan : NULL;
}

double sp_pager_read_bps(const struct sp_pager *pg) {
    return pg->read_bps;
}

double sp_pager_mem_bps(const struct sp_pager *pg) {
    return pg->mem_bps;
}

uint64_t sp_pager_budget(const struct sp_pager *pg) {
    return pg->cfg.budget;
}
