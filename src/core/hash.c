/*
 * hash.c -- SHA-256 over OpenSSL's EVP interface (hash.h).  The low-level
 * SHA256_* calls are deprecated in OpenSSL 3; EVP picks the SHA extensions
 * (SHA-NI, ARMv8 SHA2) where the CPU has them.
 */
#include "hash.h"

#include <openssl/evp.h>

struct sp_sha256_ctx {
    EVP_MD_CTX *md;
};

sp_status sp_sha256_init(struct sp_sha256_ctx **out) {
    *out = NULL;
    struct sp_sha256_ctx *c = sp_calloc(1, sizeof *c);
    if (!c) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    c->md = EVP_MD_CTX_new();
    if (!c->md || EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1) {
        sp_sha256_free(c);
        return sp_err(SP_E_NOMEM, "%s: libcrypto cannot start a SHA-256 digest", __func__);
    }
    *out = c;
    return SP_OK;
}

sp_status sp_sha256_update(struct sp_sha256_ctx *c, const void *p, size_t n) {
    if (n && EVP_DigestUpdate(c->md, p, n) != 1) return sp_err(SP_E_NOMEM, "%s: libcrypto failed", __func__);
    return SP_OK;
}

sp_status sp_sha256_final(struct sp_sha256_ctx *c, uint8_t out[SP_SHA256_BYTES]) {
    unsigned len = 0;
    const int ok = EVP_DigestFinal_ex(c->md, out, &len);
    sp_sha256_free(c);
    if (ok != 1 || len != SP_SHA256_BYTES) return sp_err(SP_E_NOMEM, "%s: libcrypto failed", __func__);
    return SP_OK;
}

void sp_sha256_free(struct sp_sha256_ctx *c) {
    if (!c) return;
    EVP_MD_CTX_free(c->md);
    sp_free(c);
}

sp_status sp_sha256(const void *p, size_t n, uint8_t out[SP_SHA256_BYTES]) {
    struct sp_sha256_ctx *c;
    sp_status rc = sp_sha256_init(&c);
    if (rc) return rc;
    if ((rc = sp_sha256_update(c, p, n))) {
        sp_sha256_free(c);
        return rc;
    }
    return sp_sha256_final(c, out);
}

void sp_sha256_hex(const uint8_t d[SP_SHA256_BYTES], char out[SP_SHA256_HEX]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SP_SHA256_BYTES; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * SP_SHA256_BYTES] = '\0';
}
