/*
 * hash.h -- SHA-256, from OpenSSL's libcrypto (never hand-written): one-shot
 * and incremental, plus hex rendering.  Model packages (format/pack.c,
 * package/) name every shard, manifest and model by these digests.
 */
#ifndef SP_HASH_H
#define SP_HASH_H

#include "core.h"

#include <stdbool.h>

#define SP_SHA256_BYTES 32
#define SP_SHA256_HEX 65 /* 64 digits and a NUL */

/* out = SHA-256 of n bytes at p.  SP_E_NOMEM when libcrypto cannot make a
 * context (the only way it fails). */
sp_status sp_sha256(const void *p, size_t n, uint8_t out[SP_SHA256_BYTES]);

/* Incremental: init, any number of updates, final.  A context is freed by
 * final or by sp_sha256_free (NULL is a no-op). */
struct sp_sha256_ctx;
sp_status sp_sha256_init(struct sp_sha256_ctx **out);
sp_status sp_sha256_update(struct sp_sha256_ctx *c, const void *p, size_t n);
sp_status sp_sha256_final(struct sp_sha256_ctx *c, uint8_t out[SP_SHA256_BYTES]); /* frees c */
void sp_sha256_free(struct sp_sha256_ctx *c);

/* Lower-case hex of a digest into out (SP_SHA256_HEX bytes). */
void sp_sha256_hex(const uint8_t d[SP_SHA256_BYTES], char out[SP_SHA256_HEX]);

/* Constant-size comparison of two digests. */
static inline bool sp_sha256_eq(const uint8_t a[SP_SHA256_BYTES], const uint8_t b[SP_SHA256_BYTES]) {
    return memcmp(a, b, SP_SHA256_BYTES) == 0;
}

#endif /* SP_HASH_H */
