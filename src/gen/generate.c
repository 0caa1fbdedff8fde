/*
 * generate.c -- sp_generate: the prompt, then sample -> stream -> feed back
 * until a stop condition (contract in sparrow.h, "Generation").  A client of
 * the session API (sp_decode, sp_sample) plus the stream filters of
 * stream.h; what it adds is the order of the checks and the timings:
 *
 *   sample --EOG--> stop (the token is neither delivered nor fed)
 *     | piece -> UTF-8 assembler -> stop matcher -> on_token(text, id)
 *     |   matched -> stop;  on_token false -> stop;  n_predict reached -> stop
 *     | (the last one fed only with decode_last)
 *   decode it --CONTEXT_FULL / ABORTED--> stop
 */
#include "api_internal.h"
#include "core/core.h"
#include "gen/stream.h"

#include <time.h>

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *sp_stop_reason_name(enum sp_stop_reason r) {
    static const char *const names[SP_STOP_REASON_COUNT] = {
        [SP_STOP_LIMIT] = "limit",           [SP_STOP_EOG] = "eog",           [SP_STOP_STRING] = "stop string",
        [SP_STOP_CONTEXT] = "context full", [SP_STOP_CALLBACK] = "callback", [SP_STOP_ABORTED] = "aborted"};
    return (unsigned)r < SP_STOP_REASON_COUNT ? names[r] : "?";
}

struct sp_generate_params sp_generate_default_params(void) {
    struct sp_generate_params p = {.n_predict = -1, .decode_last = true};
    return p;
}

/* The loop's buffers: a token's bytes and what the assembler makes of them. */
struct gen_bufs {
    char *piece, *text;
    size_t piece_cap, text_cap;
};

static sp_status bufs_fit(struct gen_bufs *b, size_t piece_len) {
    if (piece_len > b->piece_cap) {
        char *p = sp_realloc(b->piece, piece_len);
        if (!p) return sp_err(SP_E_NOMEM, "sp_generate: out of memory for a %zu-byte token", piece_len);
        b->piece = p;
        b->piece_cap = piece_len;
    }
    size_t need = SP_UTF8_STREAM_OUT_MAX(piece_len);
    if (need > b->text_cap) {
        char *t = sp_realloc(b->text, need);
        if (!t) return sp_err(SP_E_NOMEM, "sp_generate: out of memory for a %zu-byte token", piece_len);
        b->text = t;
        b->text_cap = need;
    }
    return SP_OK;
}

/* A token's bytes into b->piece (*n long), growing it for a long token. */
static sp_status token_bytes(const struct sp_model *m, int32_t tok, struct gen_bufs *b, size_t *n) {
    sp_status rc = sp_token_to_piece(m, tok, b->piece, b->piece_cap, n);
    if (rc == SP_E_BUFFER) {
        if ((rc = bufs_fit(b, *n)) != SP_OK) return rc;
        rc = sp_token_to_piece(m, tok, b->piece, b->piece_cap, n);
    }
    return rc;
}

sp_status sp_generate(struct sp_session *s, const int32_t *prompt, int32_t n, const struct sp_generate_params *params,
                      sp_token_fn on_token, void *user, struct sp_generate_result *out) {
    const double t0 = mono_s();
    struct sp_generate_result r = {.stop = SP_STOP_LIMIT, .stop_index = -1};
    if (out) *out = r;
    if (!s || !out || n < 0 || (n > 0 && !prompt))
        return sp_err(SP_E_INVALID, "sp_generate: need a session, a result and n >= 0 prompt tokens (n = %d)", (int)n);
    struct sp_generate_params p = params ? *params : sp_generate_default_params();
    if (p.n_predict < -1) return sp_err(SP_E_INVALID, "sp_generate: n_predict %d (-1 = no limit)", (int)p.n_predict);
    const struct sp_model *model = sp_session_model(s);

    struct sp_stop_matcher stop;
    struct gen_bufs b = {NULL, NULL, 0, 0};
    struct sp_utf8_stream u;
    sp_utf8_stream_init(&u);
    sp_status rc = sp_stop_init(&stop, p.stops, p.n_stops);
    if (rc != SP_OK) return rc;
    if ((rc = bufs_fit(&b, 256)) != SP_OK) goto done;

    /* the prompt */
    if (n > 0) {
        const int32_t past0 = sp_session_n_past(s);
        rc = sp_decode(s, prompt, n);
        r.t_prompt_s = mono_s() - t0;
        if (rc == SP_E_ABORTED) {
            /* the batches before the abort stay decoded; n_past may have
             * shifted, so count what the session gained, at most n */
            int32_t got = sp_session_n_past(s) - past0;
            r.n_prompt = got < 0 ? 0 : SP_MIN(got, n);
            r.stop = SP_STOP_ABORTED;
            rc = SP_OK;
            goto done;
        }
        if (rc != SP_OK) goto done;
        r.n_prompt = n;
    }

    /* the answer */
    while (p.n_predict < 0 || r.n_generated < p.n_predict) {
        int32_t tok;
        if ((rc = sp_sample(s, &tok)) != SP_OK) goto done;
        if (r.n_generated == 0) r.ttft_s = mono_s() - t0;
        if (sp_token_is_eog(model, tok)) {
            r.stop = SP_STOP_EOG;
            break;
        }
        size_t len;
        if ((rc = token_bytes(model, tok, &b, &len)) != SP_OK) goto done;
        size_t tn = sp_utf8_stream_push(&u, b.piece, len, b.text);
        const char *show;
        size_t show_n;
        int32_t matched;
        if ((rc = sp_stop_push(&stop, b.text, tn, &show, &show_n, &matched)) != SP_OK) goto done;
        r.n_generated++;
        bool go_on = on_token ? on_token(show, show_n, tok, user) : true;
        if (matched >= 0) {
            r.stop = SP_STOP_STRING;
            r.stop_index = matched;
        } else if (!go_on) {
            r.stop = SP_STOP_CALLBACK;
        }
        bool last = r.stop != SP_STOP_LIMIT || (p.n_predict >= 0 && r.n_generated >= p.n_predict);
        if (last && !p.decode_last) break;
        const double td = mono_s();
        rc = sp_decode(s, &tok, 1);
        r.t_decode_s += mono_s() - td;
        if (rc == SP_E_CONTEXT_FULL || rc == SP_E_ABORTED) {
            if (r.stop == SP_STOP_LIMIT) r.stop = rc == SP_E_CONTEXT_FULL ? SP_STOP_CONTEXT : SP_STOP_ABORTED;
            rc = SP_OK;
            break;
        }
        if (rc != SP_OK) goto done;
        r.n_decoded++;
        if (last) break;
    }

    /* what is still held: an incomplete character, a possible stop string */
    if (r.stop != SP_STOP_STRING && on_token) {
        char tail[3];
        size_t tn = sp_utf8_stream_flush(&u, tail);
        const char *show;
        size_t show_n;
        int32_t matched = -1;
        if (tn && (rc = sp_stop_push(&stop, tail, tn, &show, &show_n, &matched)) != SP_OK) goto done;
        if (tn && show_n) on_token(show, show_n, -1, user);
        if (matched >= 0) {
            r.stop = SP_STOP_STRING;
            r.stop_index = matched;
        } else {
            sp_stop_flush(&stop, &show, &show_n);
            if (show_n) on_token(show, show_n, -1, user);
        }
    }
done:
    r.decode_tps = r.t_decode_s > 0 ? r.n_decoded / r.t_decode_s : 0;
    r.t_total_s = mono_s() - t0;
    *out = r;
    sp_stop_free(&stop);
    sp_free(b.piece);
    sp_free(b.text);
    return rc;
}
