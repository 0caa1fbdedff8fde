/*
 * fuzz_template.c -- libFuzzer target for the chat-template interpreter and
 * the named formatters.  The input is a template (up to its first NUL byte)
 * and, after that NUL, the messages as JSON (else a fixed conversation with
 * a system turn, a tool call and non-ASCII text).  It is rendered through
 * the whole pipeline (src/chat/chat.c: the system-role probe, the message
 * adjustments, the interpreter) with small limits, and through whichever
 * named formatter recognises it.  Nothing may crash, leak, read out of
 * bounds or exceed the limits; every rejection must be an ordinary status
 * with a message (aborts otherwise).
 *   make fuzz && mkdir -p build-fuzz/corpus-fuzz_template && \
 *     build-fuzz/fuzz_template -dict=tests/fuzz/fuzz_template.dict -max_total_time=600 \
 *     build-fuzz/corpus-fuzz_template tests/fuzz/corpus/fuzz_template
 * (the seeds: the templates of ../shared/peer-tests/chat-template/cases.json,
 * one per file, written by make-corpus.py; make fuzz-run passes the dict).
 * Not a test_ file: tests/run.sh does not run it.
 */
#include "chat/chat.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum sp_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static const char k_messages[] =
    "[{\"role\": \"system\", \"content\": \"You are a helpful assistant\"},"
    " {\"role\": \"user\", \"content\": \"Hello \\u00e9\\u4e16\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call00001\", \"type\": \"function\","
    " \"function\": {\"name\": \"get\", \"arguments\": {\"x\": [1, 2.5, true, null]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"t\\\": 72}\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"  spaces  \"}]}]";

static const char k_vars[] = "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": "
                             "\"d\", \"parameters\": {\"type\": \"object\"}}}], \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sp_log_set(quiet, NULL);
    const uint8_t *nul = memchr(data, 0, size);
    const size_t tl = nul ? (size_t)(nul - data) : size;
    char *tmpl = malloc(tl + 1), *msgs = NULL;
    if (!tmpl) return 0;
    memcpy(tmpl, data, tl);
    tmpl[tl] = '\0';
    if (nul) {
        const size_t ml = size - tl - 1;
        msgs = malloc(ml + 1);
        if (!msgs) {
            free(tmpl);
            return 0;
        }
        memcpy(msgs, nul + 1, ml);
        msgs[ml] = '\0';
    }
    const struct sp_jinja_limits lim = {.max_output = 1 << 16, .max_memory = 8 << 20, .max_iterations = 20000, .max_depth = 64};
    for (int jinja = 1; jinja >= 0; jinja--) {
        struct sp_chat_request r = {
            .tmpl = tmpl,
            .use_jinja = jinja,
            .messages_json = msgs ? msgs : k_messages,
            .vars_json = size & 1 ? k_vars : NULL,
            .bos = "<s>",
            .eos = "</s>",
            .add_assistant = (size & 2) != 0,
            .strip_bos = (size & 4) != 0,
            .lim = lim,
        };
        char *out = NULL;
        size_t len = 0;
        sp_err_clear();
        const sp_status rc = sp_chat_render(&r, &out, &len);
        if (rc == SP_OK) {
            if (!out || strlen(out) > len || len > lim.max_output) abort(); /* NULs from the messages may shorten strlen */
        } else {
            if (out || rc == SP_E_BUFFER || !*sp_last_error()) abort();
        }
        sp_free(out);
    }
    free(msgs);
    free(tmpl);
    return 0;
}
