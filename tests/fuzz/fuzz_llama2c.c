/*
 * fuzz_llama2c.c -- libFuzzer target for the llama2.c formats: the input's
 * first byte chooses what the rest is.
 *   even: a tokenizer.bin, read for a model of n_vocab tokens (bytes 1-2,
 *         little-endian; 0 = no model: read to the end), then, if accepted,
 *         turned into a tokenizer that encodes and decodes a fixed text and
 *         renders every piece;
 *   odd:  a checkpoint .bin (bit 1: vocab_only), read as the loader reads it
 *         (fuzz_gguf reaches it only through a file that is not GGUF, and
 *         never with a tokenizer that parses).
 * Nothing may crash, leak or read out of bounds; every rejection is an
 * ordinary status.
 *   make fuzz && build-fuzz/fuzz_llama2c -max_total_time=60 build-fuzz/corpus-fuzz_llama2c tests/fuzz/corpus/fuzz_llama2c
 * Not a test_ file: tests/run.sh does not run it (make fuzz-run does).
 */
#include "core/file.h"
#include "format/llama2c.h"
#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static void use_tokenizer(const struct sp_vocab_data *v) {
    struct sp_tokenizer *tok = NULL;
    if (sp_tokenizer_init(v, &tok) != SP_OK) return;
    static const char text[] = "Once upon a time, <s> a \xe2\x96\x81 caf\xc3\xa9\n\t 42";
    int32_t ids[256];
    int32_t n = 0;
    if (sp_tokenizer_encode(tok, text, sizeof text - 1, true, false, ids, 256, &n) == SP_OK) {
        char out[1024];
        size_t len;
        (void)sp_tokenizer_decode(tok, ids, n, out, sizeof out, &len);
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        char piece[64];
        size_t len;
        (void)sp_tokenizer_piece(tok, (int32_t)i, piece, sizeof piece, &len);
    }
    sp_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sp_log_set(quiet, NULL);
    if (size < 3) return 0;
    const uint8_t mode = data[0];
    const uint32_t n_vocab = (uint32_t)data[1] | (uint32_t)data[2] << 8;
    struct sp_file *f = NULL;
    if (sp_file_from_memory(data + 3, size - 3, &f) != SP_OK) return 0;
    struct sp_model_file *mf = sp_calloc(1, sizeof(*mf));
    if (mf && (mf->path = sp_strdup("<fuzz>")) != NULL) {
        mf->file_size = size - 3;
        if (mode & 1) {
            (void)sp_llama2c_read(f, mf, (mode & 2) != 0);
        } else {
            mf->has_hparams = n_vocab > 0;
            mf->hp.n_vocab = n_vocab;
            if (sp_llama2c_read_tokenizer_file(f, mf) == SP_OK) use_tokenizer(&mf->vocab);
        }
    }
    sp_model_file_free(mf);
    sp_file_close(f);
    return 0;
}
