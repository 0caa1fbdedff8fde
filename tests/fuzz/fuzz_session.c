/*
 * fuzz_session.c -- libFuzzer target for saved-session files
 * (src/format/session.c and sp_session_load's checks behind it).  Each input
 * is parsed and verified as it is, then, with its trailing SHA-256
 * recomputed over the fuzzed bytes (so mutations get past the checksum), loaded
 * into a session of stories260K (from $SPARROW_SHARED, default ../shared;
 * without it only the parser runs).  The seed tests/fuzz/corpus/fuzz_session/
 * holds a real file from that model.  Nothing may crash, leak or read out
 * of bounds; every rejection is an ordinary status, and a refused file
 * leaves the session as it was.
 *   make fuzz && build-fuzz/fuzz_session -max_total_time=60 build-fuzz/corpus-fuzz_session tests/fuzz/corpus/fuzz_session
 * Not a test_ file: tests/run.sh does not run it.
 */
#include "api_internal.h"
#include "core/file.h"
#include "core/hash.h"
#include "format/session.h"
#include "quant/kv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct sp_model *model;
static struct sp_session *sess;

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static size_t row_bytes(uint32_t type, uint32_t hd, bool value) {
    if (type >= SP_KV_TYPE_COUNT) return 0;
    const enum sp_kv_type t = (enum sp_kv_type)type;
    return sp_kv_row_bytes(value ? sp_kv_value_rows(t) : t, (int32_t)hd);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    sp_log_set(quiet, NULL);
    const char *root = getenv("SPARROW_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K-f32.gguf", root && *root ? root : "../shared");
    if (sp_model_load(path, NULL, &model) != SP_OK) return 0;
    struct sp_session_params p = sp_session_default_params();
    p.n_ctx = 64;
    if (sp_session_init(model, &p, &sess) != SP_OK) {
        sp_model_free(model);
        model = NULL;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct sp_file *f = NULL;
    if (sp_file_from_memory(data, size, &f) != SP_OK) return 0;
    struct sp_session_file h;
    if (sp_session_file_parse(f, row_bytes, &h) == SP_OK) (void)sp_session_file_verify(f, &h);
    sp_file_close(f);
    if (!sess || size < SP_SHA256_BYTES) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    if (sp_sha256(b, size - SP_SHA256_BYTES, b + size - SP_SHA256_BYTES) == SP_OK &&
        sp_file_from_memory(b, size, &f) == SP_OK) {
        const int32_t before = sp_session_n_past(sess);
        const sp_status st = sp_session_load_from(sess, f, true);
        /* a refusal (anything but a read error) leaves the session as it was */
        if (st != SP_OK && st != SP_E_IO && sp_session_n_past(sess) != before) abort();
        sp_file_close(f);
    }
    free(b);
    return 0;
}
