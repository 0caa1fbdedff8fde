/*
 * core.h -- the bottom layer every module includes: status/error reporting,
 * logging, the replaceable allocator, assertions, UTF-8 encoding and
 * half-precision helpers.
 * Nothing here knows about models, files or kernels.
 */
#ifndef SP_CORE_H
#define SP_CORE_H

#include "sparrow.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- errors -------------------------------------------------------------
 * sp_err() formats a message into the calling thread's error buffer (what
 * sp_last_error() returns), sends it to the log callback at error level, and
 * returns st, so failure paths read:  return sp_err(SP_E_FORMAT, "%s: ...", __func__);
 * Messages name what was wrong and where: file, offset, tensor or key. */
sp_status sp_err(sp_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the calling thread's error message (tests). */
void sp_err_clear(void);

/* ---- logging ------------------------------------------------------------ */
void sp_log(enum sp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define SP_LOG_E(...) sp_log(SP_LOG_ERROR, __VA_ARGS__)
#define SP_LOG_W(...) sp_log(SP_LOG_WARN, __VA_ARGS__)
#define SP_LOG_I(...) sp_log(SP_LOG_INFO, __VA_ARGS__)
#define SP_LOG_D(...) sp_log(SP_LOG_DEBUG, __VA_ARGS__)

/* ---- allocator ----------------------------------------------------------
 * All heap memory goes through these.  They return NULL on failure (never
 * abort); sp_free(NULL) is a no-op.  sp_calloc checks n*size for overflow.
 * sp_strdup/sp_strndup copy into sp_malloc'd memory. */
void *sp_malloc(size_t size);
void *sp_calloc(size_t n, size_t size);
void *sp_realloc(void *ptr, size_t size);
void sp_free(void *ptr);
char *sp_strdup(const char *s);
char *sp_strndup(const char *s, size_t n);

/* Aligned allocation (alignment a power of two >= sizeof(void*)), freed with
 * sp_free_aligned.  Built on sp_malloc so the hook sees it. */
void *sp_malloc_aligned(size_t size, size_t alignment);
void sp_free_aligned(void *ptr);

/* Number of sp_malloc/sp_calloc/sp_realloc calls since start-up (tests use it
 * to prove the decode loop does not allocate).  Atomic. */
uint64_t sp_alloc_count(void);

/* ---- overflow-checked arithmetic ---------------------------------------- */
static inline int sp_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline int sp_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* ---- assertions ---------------------------------------------------------
 * SP_ASSERT is always on: it is for programmer errors and invariants, never
 * for untrusted input.  It reports file:line and aborts. */
void sp_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define SP_ASSERT(x) ((x) ? (void)0 : sp_assert_fail(#x, __FILE__, __LINE__))

#define SP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- UTF-8 ----------------------------------------------------------------
 * Encode code point c into o (room for 4 bytes); returns the byte count.
 * Values past U+10FFFF become U+FFFD; surrogates are encoded as they are
 * (callers that must not produce them map them first). */
static inline size_t sp_utf8_put(uint32_t c, char *o) {
    if (c > 0x10FFFF) c = 0xFFFD;
    if (c <= 0x7f) {
        o[0] = (char)c;
        return 1;
    }
    if (c <= 0x7ff) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c <= 0xffff) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* ---- half precision -----------------------------------------------------
 * IEEE binary16 and bfloat16 conversions, round-to-nearest-even, as ggml's
 * CPU backend rounds activations. */
static inline float sp_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) { /* inf, or nan made quiet with its payload kept (as F16C does) */
        bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t sp_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf, or nan: quiet, top payload bits kept (as F16C does) */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 ... */
        uint32_t r = m >> (shift);
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absx - 0x38000000u) >> 13); /* rebias exponent 127->15 */
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static inline float sp_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t sp_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64u); /* quiet nan */
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

#endif /* SP_CORE_H */
