/*
 * fuzz_tokenizer.c -- libFuzzer target for the tokenizers: the input is
 * prompt text (any bytes, valid UTF-8 or not), encoded by three
 * vocabularies -- llama's 32000-token SentencePiece one and GPT-2's
 * byte-level BPE with its pre-tokenizer regex (peer-tests/tokenizer), and
 * stories260K's 512 SPM pieces with byte fallback -- each piece rendered,
 * then decoded as a whole.  Nothing may crash, leak or read out of bounds.
 * On well-formed UTF-8 every round trip must be exact, decode(encode(x))
 * == x (aborts if not); for the SPM ones only where x has no U+2581, the
 * character SentencePiece writes spaces as (it decodes as a space).  Other
 * input is not checked that way: as in llama.cpp, the BPE pre-tokenizer
 * reads invalid bytes as U+FFFD, and SPM takes a byte 0xF0-0xFF as the lead
 * of a 4-byte character, so it can pull a following escaped space into
 * byte tokens.
 *   make fuzz && build-fuzz/fuzz_tokenizer -max_total_time=60 build-fuzz/corpus-fuzz_tokenizer tests/fuzz/corpus/fuzz_tokenizer
 * Vocabularies come from $SPARROW_SHARED (default ../shared).  Not a test_
 * file: tests/run.sh does not run it (make fuzz-run does).
 */
#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_VOCAB = 3 };
static const char *const files[N_VOCAB] = {"peer-tests/tokenizer/ggml-vocab-llama-spm.gguf",
                                           "peer-tests/tokenizer/ggml-vocab-gpt-2.gguf",
                                           "models/stories260K/stories260K-f32.gguf"};
static const bool spm[N_VOCAB] = {true, false, true};
static struct sp_model_file *mfs[N_VOCAB];
static struct sp_tokenizer *toks[N_VOCAB];

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    sp_log_set(quiet, NULL);
    const char *shared = getenv("SPARROW_SHARED") ? getenv("SPARROW_SHARED") : "../shared";
    for (int i = 0; i < N_VOCAB; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", shared, files[i]);
        if (sp_model_file_open(path, NULL, true, &mfs[i]) != SP_OK ||
            sp_tokenizer_init(&mfs[i]->vocab, &toks[i]) != SP_OK) {
            fprintf(stderr, "fuzz_tokenizer: cannot load the vocabulary of %s: %s\n", path, sp_last_error());
            exit(2);
        }
    }
    return 0;
}

/* Well-formed UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF): the input on which a round trip must be exact.  Stricter than
 * the tokenizers' own reading of text (bpe.c's clean_utf8 follows
 * llama.cpp), on purpose: only unambiguous input is checked. */
static bool utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned c = s[i];
        /* sequence length by lead byte; 0: never a lead (continuation, 0xC0, 0xC1, 0xF5-0xFF) */
        const size_t len = c < 0x80                 ? 1
                           : c >= 0xc2 && c <= 0xdf ? 2
                           : c >= 0xe0 && c <= 0xef ? 3
                           : c >= 0xf0 && c <= 0xf4 ? 4
                                                    : 0;
        if (len == 0 || n - i < len) return false;
        unsigned cp = len == 1 ? c : c & (0x7fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += len;
    }
    return true;
}

/* Encode, render every piece, decode; compare where the round trip is exact. */
static void run_one(int i, const char *text, size_t len) {
    const struct sp_tokenizer *t = toks[i];
    int32_t n = 0, stack[256], *ids = stack;
    sp_status rc = sp_tokenizer_encode(t, text, len, false, false, ids, 256, &n);
    if (rc == SP_E_BUFFER) {
        if (!(ids = malloc((size_t)n * sizeof *ids))) return;
        rc = sp_tokenizer_encode(t, text, len, false, false, ids, n, &n);
    }
    if (rc == SP_OK) {
        char piece[256];
        for (int32_t k = 0; k < n; k++) {
            size_t pn = 0;
            (void)sp_tokenizer_piece(t, ids[k], piece, sizeof piece, &pn);
        }
        size_t out_n = 0;
        char *out = NULL;
        rc = sp_tokenizer_decode(t, ids, n, NULL, 0, &out_n);
        if ((rc == SP_OK || rc == SP_E_BUFFER) && (out = malloc(out_n + 1))) {
            const bool exact =
                utf8_ok((const unsigned char *)text, len) && !(spm[i] && memmem(text, len, "\xe2\x96\x81", 3));
            if (sp_tokenizer_decode(t, ids, n, out, out_n, &out_n) == SP_OK && exact &&
                (out_n != len || memcmp(out, text, len) != 0)) {
                fprintf(stderr, "fuzz_tokenizer: %s: decode(encode(x)) != x (%zu bytes in, %zu out)\n", files[i], len,
                        out_n);
                abort();
            }
            free(out);
        }
    }
    if (ids != stack) free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < N_VOCAB; i++)
        run_one(i, (const char *)data, size);
    return 0;
}
