/*
 * membw.c -- memory and storage read bandwidth, the ceilings decode speed
 * is measured against (docs/BENCHMARKS.md).  A standalone tool: it does not
 * use the library.
 *
 *   membw [--size MiB] [--passes N] [--threads LIST] [--json]
 *       Read a buffer much larger than the last-level cache (default 1 GiB,
 *       touched first) with 1, 2 and all online threads (or LIST, e.g.
 *       "1,2,4"), each thread streaming its own contiguous slice with the
 *       widest vector loads the CPU has (AVX-512, AVX2, else 64-bit scalar).
 *       Reports GB/s (1e9 bytes/s), the median and best of the passes.
 *       --chunk KiB: thread i reads chunks i, i + n, i + 2n, ... of that size
 *       instead (n threads), so that the threads' streams stay close together
 *       -- the pattern an interleaved split of a matrix's rows would give.
 *   membw --file PATH [--block KiB] [--passes N] [--json]
 *       Sequential read speed of a file: buffered as it is (page cache warm
 *       or not), buffered after evicting the file from the page cache
 *       (posix_fadvise DONTNEED), and O_DIRECT.  For the memory-wall work:
 *       how fast weights stream from storage.
 *
 * Not a kernel benchmark: bench/ holds those separately.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "membw: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- read kernels: return a value that depends on every byte, so the
 * loads cannot be dropped.  n is a multiple of 256. ---------------------- */

typedef uint64_t (*read_fn)(const uint8_t *p, size_t n);

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        const __m256i *q = (const __m256i *)(p + i);
        a = _mm256_xor_si256(a, _mm256_load_si256(q + 0));
        b = _mm256_xor_si256(b, _mm256_load_si256(q + 1));
        c = _mm256_xor_si256(c, _mm256_load_si256(q + 2));
        d = _mm256_xor_si256(d, _mm256_load_si256(q + 3));
        a = _mm256_xor_si256(a, _mm256_load_si256(q + 4));
        b = _mm256_xor_si256(b, _mm256_load_si256(q + 5));
        c = _mm256_xor_si256(c, _mm256_load_si256(q + 6));
        d = _mm256_xor_si256(d, _mm256_load_si256(q + 7));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        const __m512i *q = (const __m512i *)(p + i);
        a = _mm512_xor_si512(a, _mm512_load_si512(q + 0));
        b = _mm512_xor_si512(b, _mm512_load_si512(q + 1));
        c = _mm512_xor_si512(c, _mm512_load_si512(q + 2));
        d = _mm512_xor_si512(d, _mm512_load_si512(q + 3));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_add_epi64(a);
}
#endif

static read_fn pick_kernel(const char **name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *name = "avx512";
        return read_avx512;
    }
    if (__builtin_cpu_supports("avx2")) {
        *name = "avx2";
        return read_avx2;
    }
#endif
    *name = "scalar";
    return read_scalar;
}

/* ---- memory mode ------------------------------------------------------ */

struct mem_job {
    const uint8_t *buf;
    size_t size;
    size_t chunk; /* 0: contiguous slices */
    int nth;
    int passes;
    read_fn fn;
    pthread_barrier_t start, end;
    volatile uint64_t sink;
};

struct mem_thread {
    struct mem_job *job;
    int ith;
};

/* Bytes each pass reads (whole slices or whole rounds of chunks). */
static size_t mem_bytes(const struct mem_job *j) {
    const size_t n = (size_t)j->nth;
    return j->chunk ? j->size / (j->chunk * n) * j->chunk * n : j->size / n / 256 * 256 * n;
}

/* Each pass: wait at start, read this thread's slice (or chunks), wait at end. */
static void *mem_worker(void *arg) {
    struct mem_thread *t = arg;
    struct mem_job *j = t->job;
    const size_t n = (size_t)j->nth, ith = (size_t)t->ith, bytes = mem_bytes(j);
    for (int k = 0; k < j->passes; k++) {
        pthread_barrier_wait(&j->start);
        if (j->chunk) {
            for (size_t o = j->chunk * ith; o < bytes; o += j->chunk * n) j->sink ^= j->fn(j->buf + o, j->chunk);
        } else {
            j->sink ^= j->fn(j->buf + bytes / n * ith, bytes / n);
        }
        pthread_barrier_wait(&j->end);
    }
    return NULL;
}

/* GB/s of each pass into gbps[passes]. */
static void mem_run(const uint8_t *buf, size_t size, size_t chunk, int nth, int passes, read_fn fn, double *gbps) {
    struct mem_job j = {.buf = buf, .size = size, .chunk = chunk, .nth = nth, .passes = passes, .fn = fn};
    pthread_t tid[256];
    struct mem_thread ts[256];
    pthread_barrier_init(&j.start, NULL, (unsigned)nth + 1);
    pthread_barrier_init(&j.end, NULL, (unsigned)nth + 1);
    for (int i = 0; i < nth; i++) {
        ts[i] = (struct mem_thread){&j, i};
        if (pthread_create(&tid[i], NULL, mem_worker, &ts[i]) != 0) die("%s", "pthread_create failed");
    }
    const size_t bytes = mem_bytes(&j);
    for (int k = 0; k < passes; k++) {
        pthread_barrier_wait(&j.start);
        const double t0 = now_s();
        pthread_barrier_wait(&j.end);
        gbps[k] = (double)bytes / (now_s() - t0) / 1e9;
    }
    for (int i = 0; i < nth; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&j.start);
    pthread_barrier_destroy(&j.end);
}

static int mem_mode(size_t size, size_t chunk, int passes, const char *list, int json) {
    const char *kname;
    read_fn fn = pick_kernel(&kname);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    int threads[16], nt = 0;
    if (list) {
        char *dup = strdup(list), *save = NULL;
        for (char *tok = strtok_r(dup, ",", &save); tok && nt < 16; tok = strtok_r(NULL, ",", &save)) {
            int v = atoi(tok);
            if (v < 1 || v > 256) die("--threads: '%s' is not in 1..256", tok);
            threads[nt++] = v;
        }
        free(dup);
    } else {
        threads[nt++] = 1;
        if (ncpu >= 2) threads[nt++] = 2;
        if (ncpu > 2) threads[nt++] = (int)(ncpu > 256 ? 256 : ncpu);
    }
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 2u << 20, size) != 0) die("cannot allocate %s", "the buffer");
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, size, MADV_HUGEPAGE); /* fewer TLB misses, where allowed */
#endif
    memset(buf, 1, size); /* touch every page before timing */

    if (json) printf("{\"mode\": \"memory\", \"kernel\": \"%s\", \"size_bytes\": %zu, \"chunk_bytes\": %zu, \"passes\": %d, "
                     "\"results\": [",
                     kname, size, chunk, passes);
    else printf("memory read bandwidth: %zu MiB buffer, %s loads, %d passes, %s\n%8s %12s %12s\n", size >> 20, kname,
                passes, chunk ? "interleaved chunks" : "contiguous slices", "threads", "median GB/s", "best GB/s");
    double *g = calloc((size_t)passes, sizeof *g);
    for (int i = 0; i < nt; i++) {
        mem_run(buf, size, chunk, threads[i], passes, fn, g);
        double best = 0;
        for (int k = 0; k < passes; k++) best = g[k] > best ? g[k] : best;
        const double med = median(g, passes);
        if (json) printf("%s{\"threads\": %d, \"gbps_median\": %.3f, \"gbps_best\": %.3f}", i ? ", " : "",
                         threads[i], med, best);
        else printf("%8d %12.2f %12.2f\n", threads[i], med, best);
        fflush(stdout);
    }
    if (json) printf("]}\n");
    free(g);
    free(buf);
    return 0;
}

/* ---- file mode -------------------------------------------------------- */

/* Read path sequentially in blocks; returns GB/s or -1 (message printed). */
static uint64_t file_limit = UINT64_MAX; /* --limit: bytes to read at most */
static int file_qd = 1;                   /* --qd: reads in flight (threads) */

/* One of file_qd readers: blocks k with k % qd == id, until EOF or the limit. */
struct qd_job {
    int fd, id;
    size_t block;
    uint64_t total;
    int err;
};

static void *qd_main(void *arg) {
    struct qd_job *j = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, j->block) != 0) {
        j->err = ENOMEM;
        return NULL;
    }
    for (uint64_t k = (uint64_t)j->id;; k += (uint64_t)file_qd) {
        const uint64_t off = k * j->block;
        if (off >= file_limit) break;
        ssize_t got = pread(j->fd, buf, j->block, (off_t)off);
        if (got < 0 && errno == EINTR) {
            k -= (uint64_t)file_qd;
            continue;
        }
        if (got < 0) {
            j->err = errno;
            break;
        }
        if (got == 0) break;
        j->total += (uint64_t)got;
    }
    free(buf);
    return NULL;
}

static double file_read(const char *path, size_t block, int direct, int drop, uint64_t *bytes_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        fprintf(stderr, "membw: cannot open '%s'%s: %s\n", path, direct ? " with O_DIRECT" : "", strerror(errno));
        return -1;
    }
    if (drop) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (file_qd > 1) {
        struct qd_job jobs[64];
        pthread_t th[64];
        const double t0 = now_s();
        int started = 0, err = 0;
        uint64_t total = 0;
        for (int k = 0; k < file_qd; k++) {
            jobs[k] = (struct qd_job){.fd = fd, .id = k, .block = block};
            if (pthread_create(&th[k], NULL, qd_main, &jobs[k]) == 0) started++;
        }
        for (int k = 0; k < started; k++) {
            pthread_join(th[k], NULL);
            total += jobs[k].total;
            if (jobs[k].err) err = jobs[k].err;
        }
        const double dt = now_s() - t0;
        close(fd);
        if (err || started != file_qd) {
            fprintf(stderr, "membw: read '%s': %s\n", path, err ? strerror(err) : "cannot start threads");
            return -1;
        }
        *bytes_out = total;
        return total ? (double)total / dt / 1e9 : -1;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, block) != 0) {
        close(fd);
        return -1;
    }
    uint64_t total = 0;
    const double t0 = now_s();
    for (;;) {
        ssize_t got = read(fd, buf, block);
        if (got < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "membw: read '%s': %s\n", path, strerror(errno));
            total = 0;
            break;
        }
        if (got == 0) break;
        total += (uint64_t)got;
        if (total >= file_limit) break;
    }
    const double dt = now_s() - t0;
    free(buf);
    close(fd);
    *bytes_out = total;
    return total ? (double)total / dt / 1e9 : -1;
}

static int file_mode(const char *path, size_t block, int passes, int json, const char *only) {
    static const struct {
        const char *name;
        int direct, drop;
    } modes[] = {{"buffered", 0, 0}, {"buffered_cold", 0, 1}, {"direct", 1, 0}};
    if (json) printf("{\"mode\": \"file\", \"file\": \"%s\", \"block_bytes\": %zu, \"qd\": %d, \"results\": [", path, block, file_qd);
    else printf("file read speed: %s, %zu KiB blocks, %d passes\n%14s %12s %12s\n", path, block >> 10, passes,
                "mode", "median GB/s", "best GB/s");
    double *g = calloc((size_t)passes, sizeof *g);
    int first = 1;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (only && strcmp(only, modes[m].name) != 0) continue;
        uint64_t bytes = 0;
        int ok = 1;
        for (int k = 0; k < passes && ok; k++) {
            g[k] = file_read(path, block, modes[m].direct, modes[m].drop, &bytes);
            ok = g[k] > 0;
        }
        if (!ok) continue;
        double best = 0;
        for (int k = 0; k < passes; k++) best = g[k] > best ? g[k] : best;
        const double med = median(g, passes);
        if (json) printf("%s{\"mode\": \"%s\", \"bytes\": %llu, \"gbps_median\": %.3f, \"gbps_best\": %.3f}",
                         first ? "" : ", ", modes[m].name, (unsigned long long)bytes, med, best);
        else printf("%14s %12.2f %12.2f\n", modes[m].name, med, best);
        first = 0;
        fflush(stdout);
    }
    if (json) printf("]}\n");
    free(g);
    return first ? 1 : 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: membw [--size MiB] [--passes N] [--threads LIST] [--chunk KiB] [--json]\n"
               "       membw --file PATH [--block KiB] [--passes N] [--mode M] [--limit MiB] [--json]\n"
               "Memory read bandwidth with 1, 2 and all threads (default 1024 MiB, 5 passes),\n"
               "or the sequential read speed of a file: buffered, buffered after evicting it from\n"
               "the page cache, and O_DIRECT (default 4096 KiB blocks, 3 passes).  --mode keeps one\n"
               "of buffered, buffered_cold, direct; --limit stops each pass after that many MiB;\n"
               "--qd N keeps N block reads in flight (N threads), as an engine's I/O threads do.\n"
               "--chunk: each thread reads every n-th chunk of that size instead of its own slice.\n");
}

int main(int argc, char **argv) {
    size_t size = (size_t)1 << 30, block = (size_t)4 << 20, chunk = 0;
    int passes = -1, json = 0;
    const char *list = NULL, *file = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!v) {
            die("unknown option or missing value: '%s'", a);
        } else if (!strcmp(a, "--size")) {
            long mb = atol(v);
            if (mb < 1) die("--size: '%s' is not a positive number of MiB", v);
            size = (size_t)mb << 20;
            i++;
        } else if (!strcmp(a, "--block")) {
            long kb = atol(v);
            if (kb < 4 || kb % 4) die("--block: '%s' is not a positive multiple of 4 KiB", v);
            block = (size_t)kb << 10;
            i++;
        } else if (!strcmp(a, "--chunk")) {
            long kb = atol(v);
            if (kb < 1) die("--chunk: '%s' is not a positive number of KiB", v);
            chunk = (size_t)kb << 10;
            i++;
        } else if (!strcmp(a, "--passes")) {
            passes = atoi(v);
            if (passes < 1 || passes > 1000) die("--passes: '%s' is not in 1..1000", v);
            i++;
        } else if (!strcmp(a, "--threads")) {
            list = v;
            i++;
        } else if (!strcmp(a, "--mode")) {
            if (strcmp(v, "buffered") && strcmp(v, "buffered_cold") && strcmp(v, "direct"))
                die("--mode: '%s' is not buffered, buffered_cold or direct", v);
            only = v;
            i++;
        } else if (!strcmp(a, "--qd")) {
            file_qd = atoi(v);
            if (file_qd < 1 || file_qd > 64) die("--qd: '%s' is not in 1..64", v);
            i++;
        } else if (!strcmp(a, "--limit")) {
            long mb = atol(v);
            if (mb < 1) die("--limit: '%s' is not a positive number of MiB", v);
            file_limit = (uint64_t)mb << 20;
            i++;
        } else if (!strcmp(a, "--file")) {
            file = v;
            i++;
        } else {
            die("unknown option '%s'", a);
        }
    }
    if (file) return file_mode(file, block, passes > 0 ? passes : 3, json, only);
    return mem_mode(size, chunk, passes > 0 ? passes : 5, list, json);
}
