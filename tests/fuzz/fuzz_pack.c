/*
 * fuzz_pack.c -- libFuzzer target for the model-package parsers in
 * src/format/pack.c: manifests (content section alone and whole), the
 * layout check against the GGUF header they carry, package files (header,
 * manifest frame, zstd), patch headers and record tables, and whole patches
 * (new-manifest frame decompressed against an old header).  The first byte
 * picks the parser; for whole files the harness recomputes the SHA-256
 * fields over the fuzzed bytes, so mutations reach the parsers behind them
 * instead of stopping at a hash mismatch.  Nothing may crash, leak or read
 * out of bounds; every rejection is an ordinary status.
 *   make fuzz && build-fuzz/fuzz_pack -max_total_time=60 build-fuzz/corpus-fuzz_pack tests/fuzz/corpus/fuzz_pack
 * Not a test_ file: tests/run.sh does not run it.
 */
#include "core/file.h"
#include "core/hash.h"
#include "format/model_file.h"
#include "format/pack.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static void manifest(const uint8_t *b, size_t n, bool with_package) {
    struct sp_pack_manifest m;
    if (sp_pack_manifest_parse(b, n, with_package, "fuzz", &m) != SP_OK) return;
    struct sp_model_file *dir = NULL;
    if (sp_pack_check_layout(&m, "fuzz", &dir) == SP_OK && dir) {
        char name[200];
        for (uint32_t i = 0; i < m.n_shards && i < 4; i++) sp_pack_shard_name(&m, dir, i, name, sizeof name);
    }
    sp_model_file_free(dir);
    /* what parses serializes back to the same bytes */
    uint8_t *out = NULL;
    size_t on = 0;
    if ((with_package ? sp_pack_manifest_bytes(&m, &out, &on) : sp_pack_content_bytes(&m, &out, &on)) == SP_OK) {
        if (on != n || memcmp(out, b, n) != 0) abort();
    }
    sp_free(out);
    sp_pack_manifest_clear(&m);
}

static void package(uint8_t *b, size_t n) {
    if (n >= SP_PACK_HEADER_BYTES) {
        uint64_t moff = 0;
        for (int i = 0; i < 8; i++) moff |= (uint64_t)b[16 + i] << (8 * i);
        if (moff >= SP_PACK_HEADER_BYTES && moff < n) (void)sp_sha256(b + moff, n - (size_t)moff, b + 32);
    }
    struct sp_file *f = NULL;
    if (sp_file_from_memory(b, n, &f) != SP_OK) return;
    struct sp_pack_manifest m;
    struct sp_model_file *dir = NULL;
    if (sp_pack_read_manifest(f, &m, &dir) == SP_OK) sp_pack_manifest_clear(&m);
    sp_model_file_free(dir);
    /* and as a model file (format/model_file.c's package path) */
    struct sp_model_file *mf = NULL;
    (void)sp_model_file_open_file(f, "/nonexistent/tokenizer.bin", false, &mf);
    sp_model_file_free(mf);
    sp_file_close(f);
}

/* [u16 old header length][old header][patch] */
static void patch(uint8_t *b, size_t n) {
    if (n < 2) return;
    size_t hn = (size_t)b[0] | (size_t)b[1] << 8;
    if (hn > n - 2) hn = n - 2;
    const uint8_t *old = b + 2;
    uint8_t *p = b + 2 + hn;
    const size_t pn = n - 2 - hn;
    struct sp_patch_header h;
    if (pn >= SP_PATCH_HEADER_BYTES) {
        (void)sp_sha256(old, hn, p + 80);
        if (sp_patch_header_parse(p, pn, pn, "fuzz", &h) == SP_OK) {
            (void)sp_sha256(p + h.content_offset, (size_t)(h.payload_offset - h.content_offset), p + 112);
            struct sp_patch_record *r = calloc(h.n_records ? h.n_records : 1, sizeof *r);
            if (r) (void)sp_patch_table_parse(p + h.table_offset, (size_t)(h.payload_offset - h.table_offset), &h, "fuzz", r);
            free(r);
        }
    }
    struct sp_file *f = NULL;
    if (sp_file_from_memory(p, pn, &f) != SP_OK) return;
    struct sp_patch_record *recs = NULL;
    struct sp_pack_manifest m;
    if (sp_patch_read(f, old, hn, &h, &recs, &m) == SP_OK) {
        sp_free(recs);
        sp_pack_manifest_clear(&m);
    }
    sp_file_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sp_log_set(quiet, NULL);
    if (size < 1) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data + 1, size - 1);
    switch (data[0] % 4) {
    case 0: manifest(b, size - 1, false); break;
    case 1: manifest(b, size - 1, true); break;
    case 2: package(b, size - 1); break;
    default: patch(b, size - 1); break;
    }
    free(b);
    return 0;
}
