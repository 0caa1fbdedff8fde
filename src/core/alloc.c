/*
 * alloc.c -- every heap allocation in the library goes through here, so an
 * embedder can supply its own allocator (sp_set_allocator, like lua_Alloc) and
 * tests can count allocations or inject failures.  The allocator table is set
 * only while no Sparrow object exists; the call counter is atomic.
 */
#include "core.h"

#include <stdatomic.h>
#include <stdlib.h>

static void *std_malloc(size_t n, void *u) {
    (void)u;
    return malloc(n);
}
static void *std_realloc(void *p, size_t n, void *u) {
    (void)u;
    return realloc(p, n);
}
static void std_free(void *p, void *u) {
    (void)u;
    free(p);
}

static struct sp_allocator cur = {std_malloc, std_realloc, std_free, NULL};
static atomic_uint_fast64_t n_allocs;

void sp_set_allocator(const struct sp_allocator *a) {
    if (a && a->malloc_fn && a->realloc_fn && a->free_fn) {
        cur = *a;
    } else {
        cur = (struct sp_allocator){std_malloc, std_realloc, std_free, NULL};
    }
}

uint64_t sp_alloc_count(void) {
    return (uint64_t)atomic_load(&n_allocs);
}

void *sp_malloc(size_t size) {
    atomic_fetch_add(&n_allocs, 1);
    return cur.malloc_fn(size ? size : 1, cur.user);
}

void *sp_calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return NULL;
    void *p = sp_malloc(total);
    if (p) memset(p, 0, total ? total : 1);
    return p;
}

void *sp_realloc(void *ptr, size_t size) {
    atomic_fetch_add(&n_allocs, 1);
    return cur.realloc_fn(ptr, size ? size : 1, cur.user);
}

void sp_free(void *ptr) {
    if (ptr) cur.free_fn(ptr, cur.user);
}

char *sp_strndup(const char *s, size_t n) {
    char *d = sp_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *sp_strdup(const char *s) {
    return sp_strndup(s, strlen(s));
}

/* The original pointer is stored in the word just below the aligned block. */
void *sp_malloc_aligned(size_t size, size_t alignment) {
    size_t total;
    if (__builtin_add_overflow(size, alignment + sizeof(void *), &total)) return NULL;
    uint8_t *raw = sp_malloc(total);
    if (!raw) return NULL;
    uintptr_t a = ((uintptr_t)(raw + sizeof(void *)) + alignment - 1) & ~(uintptr_t)(alignment - 1);
    ((void **)a)[-1] = raw;
    return (void *)a;
}

void sp_free_aligned(void *ptr) {
    if (ptr) sp_free(((void **)ptr)[-1]);
}
