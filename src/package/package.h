/*
 * package.h -- what package/ shares between its files and with api.c: the
 * atomic output file, the shard work loop, model sources (a GGUF file or a
 * package, read shard by shard), and the loader hooks behind `-m PKG.spk`.
 * The byte layouts live in format/pack.h; the public calls (sp_package_*,
 * sp_model_edit) are documented in sparrow.h.
 */
#ifndef SP_PACKAGE_H
#define SP_PACKAGE_H

#include "core/file.h"
#include "core/hash.h"
#include "format/pack.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- atomic output (out.c) ------------------------------------------------
 * Bytes go to "<path>.tmp" in the target's folder, locked with flock so two
 * writers cannot share it; a temporary file left by a killed writer is taken
 * over (truncated) by the next one.  commit: fsync, rename over path, fsync
 * the folder -- at every instant path is the old file or the new one, whole.
 * abort (or commit failing): the temporary file is removed, path untouched. */
struct sp_out {
    char *path, *tmp;
    int fd;
};
sp_status sp_out_open(struct sp_out *o, const char *path);
/* Reserve size bytes up front (posix_fallocate): a full disk fails here. */
sp_status sp_out_reserve(struct sp_out *o, uint64_t size);
sp_status sp_out_pwrite(struct sp_out *o, const void *p, size_t n, uint64_t off);
sp_status sp_out_commit(struct sp_out *o);
void sp_out_abort(struct sp_out *o); /* no-op after commit or on a zeroed sp_out */

/* ---- the shard loop (work.c) -----------------------------------------------
 * fn(ctx, i, ith) runs once for every item i in [0, n_items), on n_threads
 * threads (the caller is thread 0) taking items in increasing order.  With
 * ordered set, an item's fn may call sp_work_turn(w, i): it returns once
 * every item before i has finished (then true), or false when the loop is
 * failing; what fn does after it happens in item order (appending to a file).
 * The first failure stops the loop; sp_work_run returns it with its message.
 * progress (may be NULL) is called on the caller's thread with units added
 * by sp_work_add; returning false cancels (SP_E_STATE). */
struct sp_work {
    uint32_t n_items;
    int n_threads;
    bool ordered;
    sp_status (*fn)(void *ctx, uint32_t i, int ith);
    void *ctx;
    sp_progress_fn progress;
    void *progress_user;
    uint64_t total;
    /* internal */
    atomic_uint next;
    atomic_uint_fast64_t done;
    atomic_int failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t turn;
    sp_status rc;
    char msg[1024];
};
sp_status sp_work_run(struct sp_work *w);
bool sp_work_turn(struct sp_work *w, uint32_t i);
void sp_work_add(struct sp_work *w, uint64_t units);

/* Per-thread buffers and zstd contexts, grown on demand. */
struct sp_scratch {
    uint8_t *raw, *comp, *old, *delta;
    size_t raw_cap, comp_cap, old_cap, delta_cap;
    void *cctx, *dctx; /* ZSTD_CCtx*, ZSTD_DCtx* */
};
sp_status sp_scratch_grow(uint8_t **buf, size_t *cap, size_t n);
/* n zeroed scratches (NULL: out of memory, message set); freed with all
 * their buffers by sp_scratch_array_free (NULL is a no-op). */
struct sp_scratch *sp_scratch_array(int n);
void sp_scratch_array_free(struct sp_scratch *sc, int n);
sp_status sp_scratch_ctx(struct sp_scratch *s); /* create both contexts */
void sp_scratch_free(struct sp_scratch *s);

/* Compress n bytes of src into *buf (grown, *cap its size) at level with
 * s's context: one frame with its size, no checksum (shards are named by
 * SHA-256); with prefix, zstd's referenced prefix, a window covering prefix
 * and source, and long-distance matching (a delta).  *out_n = frame bytes. */
sp_status sp_zcompress(struct sp_scratch *s, uint8_t **buf, size_t *cap, const void *src, size_t n, int level,
                       const void *prefix, size_t prefix_n, size_t *out_n);

/* ---- model sources (source.c) ------------------------------------------- */
struct sp_src {
    char *path;
    bool spk;                  /* a package; else a GGUF file */
    struct sp_file *f;
    struct sp_pack_manifest m; /* package: its manifest; GGUF: the cut, hashes once hashed */
    struct sp_model_file *dir; /* container directory */
    bool hashed;               /* raw SHA-256s, header SHA-256 and content id are known */
    atomic_uchar *verified;    /* (n_shards) raw bytes read and found to match */
};

/* Open path (GGUF: cut with shard_size, 0 = the default; a package keeps
 * its own).  SP_E_IO, SP_E_FORMAT, SP_E_INVALID (neither GGUF nor package). */
sp_status sp_src_open(const char *path, uint64_t shard_size, struct sp_src **out);
void sp_src_close(struct sp_src *s);

/* GGUF sources: read and hash every shard and the header on n_threads
 * threads; sets hashed and the content id.  No-op for packages. */
sp_status sp_src_hash(struct sp_src *s, int n_threads, sp_progress_fn progress, void *user);

/* Shard i's raw bytes into *buf (grown; &sc->raw or &sc->old, *cap its
 * size); a package's frame passes through sc->comp.  A package's frame is checked
 * against its SHA-256 before it is decompressed, and the result against the
 * raw SHA-256; a GGUF's bytes are checked when the source is hashed, else
 * hashed into m.shards[i].raw_sha (first reader) and marked verified. */
sp_status sp_src_read_raw(struct sp_src *s, uint32_t i, struct sp_scratch *sc, uint8_t **buf, size_t *cap);

/* A package's shard i frame into sc->comp (grown), checked. */
sp_status sp_src_read_comp(struct sp_src *s, uint32_t i, struct sp_scratch *sc);

/* "shard 3 (blk.0.attn_q.weight bytes 0..1024) of 'x.spk'" */
void sp_src_shard_name(const struct sp_src *s, uint32_t i, char *buf, size_t cap);

int sp_package_threads(int n_threads); /* 0 -> 1; capped at 256 */
double sp_package_now(void);           /* monotonic seconds */

/* st's n_ref, n_whole, n_delta from n patch records. */
void sp_package_count_kinds(const struct sp_patch_record *recs, uint32_t n, struct sp_package_stats *st);

/* Validated parameters with the defaults filled in (level, shard size,
 * threads); fn names the caller in messages. */
sp_status sp_package_params_resolve(const struct sp_package_params *in, const char *fn, struct sp_package_params *out);

/* Write a package's manifest (m gets its package section: level must be
 * set, comp sizes and hashes filled) as one frame at `at`, the end of the
 * frames, then the package header at 0.  *end = the package's size. */
sp_status sp_package_finish(struct sp_out *o, struct sp_pack_manifest *m, uint64_t at, uint64_t *end);

/* ---- loading a package (install.c), for api.c ------------------------------ */

/* A package open for sp_pager_config.fill: sp_package_fill(reader, dst, off,
 * n) decompresses the shards covering file bytes [off, off + n) straight
 * into dst on n_threads threads, each frame checked against its SHA-256
 * before it is decompressed (installs also hash the raw bytes). */
struct sp_package_reader;
sp_status sp_package_reader_open(const char *path, int n_threads, struct sp_package_reader **out);
sp_status sp_package_fill(void *reader, void *dst, uint64_t off, uint64_t n);
void sp_package_reader_close(struct sp_package_reader *r);

/* Install a package once into the cache folder ($SPARROW_CACHE, else
 * $XDG_CACHE_HOME/sparrow, else $HOME/.cache/sparrow) as <content id>.gguf,
 * or find it there; *out_path is sp_malloc'd.  *installed says which. */
sp_status sp_package_cache_install(const char *pkg, int n_threads, char **out_path, bool *installed);

#endif /* SP_PACKAGE_H */
