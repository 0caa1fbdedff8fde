/*
 * fuzz_gguf.c -- libFuzzer target for the model-file parsers (calm's
 * -DFUZZING habit): the input is a file image read from memory by the GGUF
 * reader, then by the whole model_file interpretation (hyper-parameters,
 * vocabulary), in normal and vocab-only modes.  Nothing may crash, leak or
 * read out of bounds; every rejection is an ordinary status.
 *   make fuzz && build-fuzz/fuzz_gguf -max_total_time=60 build-fuzz/corpus-fuzz_gguf tests/fuzz/corpus/fuzz_gguf
 * Not a test_ file: tests/run.sh does not run it (make fuzz-run does).
 */
#include "core/file.h"
#include "format/gguf.h"
#include "format/model_file.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct sp_file *f = NULL;
    sp_log_set(quiet, NULL);
    if (sp_file_from_memory(data, size, &f) != SP_OK) return 0;

    struct sp_model_file *mf = sp_calloc(1, sizeof(*mf));
    if (mf) {
        (void)sp_gguf_read(f, mf);
        sp_model_file_free(mf);
    }
    /* a llama2.c checkpoint needs a tokenizer path; GGUF refuses one */
    const bool gguf = size >= 4 && memcmp(data, "GGUF", 4) == 0;
    for (int vocab_only = 0; vocab_only < 2; vocab_only++) {
        struct sp_model_file *m = NULL;
        (void)sp_model_file_open_file(f, gguf ? NULL : "/nonexistent/tokenizer.bin", vocab_only, &m);
        sp_model_file_free(m);
    }
    sp_file_close(f);
    return 0;
}
