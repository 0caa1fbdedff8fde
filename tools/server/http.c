/*
 * http.c -- the server's HTTP side on libmicrohttpd (one thread per
 * connection, so a handler may block while its request is decoded): routes,
 * request bodies, the OpenAI request fields, responses and server-sent
 * events.  The shapes follow OpenAI's API as llama-server serves it
 * (docs/SERVER.md lists what is and is not supported).
 */
#include "server.h"

#include "../common/cli.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <time.h>

#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))
#define TRIM_EVERY 32 /* requests between two malloc_trim calls */

/* ---- small helpers ---------------------------------------------------------- */

struct buf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void buf_put(struct buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void buf_str(struct buf *b, const char *s) {
    buf_put(b, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s[0..n) (1-4), or 0 when it is not
 * one (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_len((const unsigned char *)s + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* A JSON string literal of s[0..n); bytes that are not UTF-8 become U+FFFD
 * (generated text is valid already; detokenized ids need not be). */
static void buf_json_str(struct buf *b, const char *s, size_t n) {
    buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c >= 0x80) {
            const size_t k = utf8_len((const unsigned char *)s + i, n - i);
            if (k) buf_put(b, s + i, k), i += k - 1;
            else buf_put(b, "\xef\xbf\xbd", 3);
            continue;
        }
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c;
            buf_put(b, e, 2);
        } else if (c == '\n') {
            buf_put(b, "\\n", 2);
        } else if (c == '\r') {
            buf_put(b, "\\r", 2);
        } else if (c == '\t') {
            buf_put(b, "\\t", 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            buf_put(b, e, 6);
        } else {
            buf_put(b, (const char *)&s[i], 1);
        }
    }
    buf_put(b, "\"", 1);
}

static void buf_json_cstr(struct buf *b, const char *s) {
    buf_json_str(b, s, strlen(s));
}

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    const enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, const char *json) {
    return send_body(c, status, "application/json; charset=utf-8", json, strlen(json));
}

/* OpenAI's error object: {"error": {"code", "message", "type"}}. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct buf b = {0};
    buf_printf(&b, "{\"error\":{\"code\":%u,\"message\":", status);
    buf_json_str(&b, msg, strlen(msg));
    buf_str(&b, ",\"type\":");
    buf_json_str(&b, type, strlen(type));
    buf_str(&b, "}}");
    const enum MHD_Result r = b.oom ? MHD_NO : send_json(c, status, b.p);
    free(b.p);
    return r;
}

/* Has the client closed its end?  (A half-closed socket counts: the
 * clients this serves do not half-close while waiting for an answer.) */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Wait up to ms for r to change (text or its end); under r->mu. */
static void wait_req(struct srv_request *r, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

static const char *finish_name(enum srv_finish f) {
    return f == SRV_LENGTH ? "length" : "stop";
}

/* ---- one connection ------------------------------------------------------------ */

enum route {
    R_NONE, R_CHAT, R_COMPLETION, R_MODELS, R_HEALTH, R_SLOTS, R_SLOT_ACTION, R_TOKENIZE, R_DETOKENIZE,
    R_APPLY_TEMPLATE, R_PROPS, R_METRICS
};

struct conn {
    struct srv *sv;
    struct buf body;
    bool too_big;
    enum route rt;
};

/* A streamed answer: what the reader callback needs. */
struct stream {
    struct srv *sv;
    struct srv_request *r;
    struct MHD_Connection *c;
    bool chat, include_usage;
    char id[48];
    long long created;
    struct buf out;      /* SSE bytes formatted and not yet sent */
    size_t sent;         /* of out */
    bool role_sent, ended;
};

/* The common head of a chunk: {"id":..,"object":..,"created":..,"model":..,"choices": */
static void chunk_head(struct stream *s, struct buf *b) {
    buf_str(b, "{\"id\":");
    buf_json_str(b, s->id, strlen(s->id));
    buf_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
               s->chat ? "chat.completion.chunk" : "text_completion", s->created);
    buf_json_str(b, s->sv->cfg.alias, strlen(s->sv->cfg.alias));
    buf_str(b, ",\"choices\":");
}

static void sse_text(struct stream *s, const char *text, size_t n) {
    struct buf *b = &s->out;
    buf_str(b, "data: ");
    chunk_head(s, b);
    if (s->chat) {
        buf_str(b, "[{\"index\":0,\"delta\":{");
        if (!s->role_sent) buf_str(b, "\"role\":\"assistant\",");
        buf_str(b, "\"content\":");
        buf_json_str(b, text, n);
        buf_str(b, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        s->role_sent = true;
    } else {
        buf_str(b, "[{\"index\":0,\"text\":");
        buf_json_str(b, text, n);
        buf_str(b, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

static void usage_json(struct buf *b, const struct srv_request *r) {
    buf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->n_prompt, r->n_gen,
               r->n_prompt + r->n_gen);
}

/* The end of a stream (under r->mu): the finish_reason chunk, usage, [DONE];
 * or an error event. */
static void sse_end(struct stream *s) {
    struct buf *b = &s->out;
    const struct srv_request *r = s->r;
    if (r->finish == SRV_ERROR || r->finish == SRV_CANCELLED) {
        buf_str(b, "data: {\"error\":{\"code\":500,\"message\":");
        buf_json_str(b, r->error, strlen(r->error));
        buf_str(b, ",\"type\":\"server_error\"}}\n\n");
    } else {
        buf_str(b, "data: ");
        chunk_head(s, b);
        if (s->chat) buf_printf(b, "[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                                finish_name(r->finish));
        else buf_printf(b, "[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                        finish_name(r->finish));
        if (s->include_usage) {
            buf_str(b, "data: ");
            chunk_head(s, b);
            buf_str(b, "[],\"usage\":");
            usage_json(b, r);
            buf_str(b, "}\n\n");
        }
    }
    buf_str(b, "data: [DONE]\n\n");
    s->ended = true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    struct stream *s = cls;
    struct srv_request *r = s->r;
    while (s->sent == s->out.n) {
        if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        s->out.n = s->sent = 0;
        pthread_mutex_lock(&r->mu);
        while (!r->n_text && r->finish == SRV_RUNNING) {
            wait_req(r, 50);
            if (!r->n_text && r->finish == SRV_RUNNING && client_gone(s->c)) {
                r->cancelled = true;
                pthread_mutex_unlock(&r->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        if (r->n_text) {
            sse_text(s, r->text, r->n_text);
            r->n_text = 0;
        }
        if (r->finish != SRV_RUNNING) sse_end(s);
        pthread_mutex_unlock(&r->mu);
        if (s->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    const size_t n = MIN_SZ(max, s->out.n - s->sent);
    memcpy(out, s->out.p + s->sent, n);
    s->sent += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    struct stream *s = cls;
    srv_cancel(s->r); /* a no-op once it has ended */
    srv_request_release(s->r);
    free(s->out.p);
    free(s);
}

/* ---- request fields ------------------------------------------------------------- */

/* A field's problem: the message names it. */
struct field_err {
    char msg[256];
};

static bool bad(struct field_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool bad(struct field_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

/* A number field in [lo, hi] (absent or null: *out stays). */
static bool num_field(const cJSON *o, const char *key, double lo, double hi, double *out, struct field_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v)) return bad(e, "'%s' must be a number", key);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi)) return bad(e, "'%s' must be in [%g, %g]", key, lo, hi);
    *out = v->valuedouble;
    return true;
}

static bool int_field(const cJSON *o, const char *key, double lo, double hi, double *out, struct field_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && cJSON_IsNumber(v) && v->valuedouble != floor(v->valuedouble))
        return bad(e, "'%s' must be an integer", key);
    return num_field(o, key, lo, hi, out, e);
}

static bool bool_field(const cJSON *o, const char *key, bool *out, struct field_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return bad(e, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return true;
}

/* The fields every generation takes into r (prompt aside). */
static bool gen_fields(struct srv *sv, const cJSON *o, struct srv_request *r, bool *stream, bool *usage,
                       struct field_err *e) {
    double temp = 0.8, top_p = 0.95, top_k = 40, min_p = 0.05, seed = -1, n = 1, pres = 0, freq = 0, rep = 1.0;
    double max_tokens = -1, last_n = 64;
    const double cap = sv->cfg.max_tokens_cap;
    if (!num_field(o, "temperature", 0, 100, &temp, e) || !num_field(o, "top_p", 0, 1, &top_p, e) ||
        !int_field(o, "top_k", -1, 1e9, &top_k, e) || !num_field(o, "min_p", 0, 1, &min_p, e) ||
        !int_field(o, "seed", -1, 1.8e19, &seed, e) || !int_field(o, "n", -1e9, 1e9, &n, e) ||
        !num_field(o, "presence_penalty", -2, 2, &pres, e) || !num_field(o, "frequency_penalty", -2, 2, &freq, e) ||
        !num_field(o, "repeat_penalty", 0, 100, &rep, e) ||
        !int_field(o, "repeat_last_n", -1, sv->cfg.sp.n_ctx, &last_n, e) || !int_field(o, "n_predict", -1, cap, &max_tokens, e) ||
        !int_field(o, "max_tokens", -1, cap, &max_tokens, e) ||
        !int_field(o, "max_completion_tokens", -1, cap, &max_tokens, e) || !bool_field(o, "stream", stream, e) ||
        !bool_field(o, "ignore_eos", &r->ignore_eos, e))
        return false;
    if (n != 1) return bad(e, "'n' must be 1: one choice per request is supported");
    if (rep <= 0) return bad(e, "'repeat_penalty' must be in (0, 100]: 1 disables it");
    if (max_tokens == 0) return bad(e, "'max_tokens' must be at least 1");
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad(e, "'stream_options' must be an object");
        if (!bool_field(so, "include_usage", usage, e)) return bad(e, "'stream_options.include_usage' must be a boolean");
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (st && !cJSON_IsNull(st)) {
        const cJSON *it;
        if (cJSON_IsString(st)) {
            if (*st->valuestring && !(r->stops[r->n_stops++] = strdup(st->valuestring))) return bad(e, "out of memory");
        } else if (cJSON_IsArray(st)) {
            cJSON_ArrayForEach(it, st) {
                if (!cJSON_IsString(it)) return bad(e, "'stop' must be a string or an array of strings");
                if (r->n_stops == SRV_MAX_STOPS) return bad(e, "'stop': at most %d strings", SRV_MAX_STOPS);
                if (*it->valuestring && !(r->stops[r->n_stops++] = strdup(it->valuestring)))
                    return bad(e, "out of memory");
            }
        } else {
            return bad(e, "'stop' must be a string or an array of strings");
        }
    }
    r->sampling = (struct sp_sampling_params){.temp = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p,
                                              .min_p = (float)min_p, .repeat_penalty = (float)rep,
                                              .repeat_last_n = last_n < 0 ? sv->cfg.sp.n_ctx : (int32_t)last_n,
                                              .presence_penalty = (float)pres,
                                              .frequency_penalty = (float)freq};
    if (top_p == 0) r->sampling.top_p = 1e-6f;
    r->seed = seed < 0 ? (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r : (uint64_t)seed;
    r->max_tokens = max_tokens < 0 ? (int32_t)cap : (int32_t)max_tokens;
    return true;
}

/* Tokenize text: the ids (malloc'd) and their count, or NULL. */
static int32_t *tokenize_text(struct srv *sv, const char *text, size_t len, unsigned flags, int32_t *n_out,
                              struct field_err *e) {
    int32_t n = 0;
    int32_t cap = (int32_t)MIN_SZ(len + 8, (size_t)1 << 24);
    int32_t *tok = malloc((size_t)cap * sizeof(int32_t));
    if (!tok) return bad(e, "out of memory"), NULL;
    sp_status st = sp_tokenize(sv->model, text, len, flags, tok, cap, &n);
    if (st == SP_E_BUFFER) {
        free(tok);
        cap = n;
        if (!(tok = malloc((size_t)cap * sizeof(int32_t)))) return bad(e, "out of memory"), NULL;
        st = sp_tokenize(sv->model, text, len, flags, tok, cap, &n);
    }
    if (st) {
        free(tok);
        return bad(e, "the text cannot be tokenized: %s", sp_last_error()), NULL;
    }
    *n_out = n;
    return tok;
}

/* Tokenize text into r->prompt. */
static bool tokenize_prompt(struct srv *sv, const char *text, size_t len, unsigned flags, struct srv_request *r,
                            struct field_err *e) {
    return (r->prompt = tokenize_text(sv, text, len, flags, &r->n_prompt, e)) != NULL;
}

/* A request's messages through the chat template: the prompt text into
 * *text (malloc'd, NUL-terminated), its length into *len. */
static bool render_messages(struct srv *sv, const cJSON *o, char **text, size_t *len, struct field_err *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!msgs) return bad(e, "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return bad(e, "'messages' must be a non-empty array");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m)) return bad(e, "'messages[%d]' must be an object", i);
        if (!cJSON_IsString(role)) return bad(e, "'messages[%d].role' must be a string", i);
        if (content && !cJSON_IsString(content) && !cJSON_IsArray(content) && !cJSON_IsNull(content))
            return bad(e, "'messages[%d].content' must be a string or an array of parts", i);
        i++;
    }
    char *json = cJSON_PrintUnformatted(msgs);
    if (!json) return bad(e, "out of memory");
    struct sp_chat_params cp = sp_chat_default_params();
    cp.tmpl = sv->cfg.chat_template;
    cp.engine = sv->cfg.jinja ? SP_CHAT_JINJA : SP_CHAT_NAMED;
    cp.messages_json = json;
    *len = 0;
    *text = NULL;
    sp_status st = sp_chat_apply(sv->model, &cp, NULL, 0, NULL, 0, len);
    if (st == SP_E_BUFFER || st == SP_OK) {
        if ((*text = malloc(*len + 1))) st = sp_chat_apply(sv->model, &cp, NULL, 0, *text, *len + 1, len);
        else st = SP_E_NOMEM;
    }
    free(json);
    if (st == SP_OK) return true;
    free(*text);
    *text = NULL;
    return bad(e, "'messages': the chat template failed: %s", sp_last_error());
}

/* The prompt of a chat request: its messages through the chat template. */
static bool chat_prompt(struct srv *sv, const cJSON *o, struct srv_request *r, struct field_err *e) {
    char *text;
    size_t len;
    if (!render_messages(sv, o, &text, &len, e)) return false;
    const bool ok = tokenize_prompt(sv, text, len, SP_TOKENIZE_ADD_BOS | SP_TOKENIZE_PARSE_SPECIAL, r, e);
    free(text);
    return ok;
}

/* The prompt of a completion: a string (or an array of one string), or token ids. */
static bool completion_prompt(struct srv *sv, const cJSON *o, struct srv_request *r, struct field_err *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!p) return bad(e, "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) return tokenize_prompt(sv, p->valuestring, strlen(p->valuestring), SP_TOKENIZE_ADD_BOS, r, e);
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return bad(e, "'prompt' must be a string, an array of one string or an array of token ids");
    const int n = cJSON_GetArraySize(p);
    if (!(r->prompt = malloc((size_t)n * sizeof(int32_t)))) return bad(e, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= sv->info.n_vocab ||
            it->valuedouble != floor(it->valuedouble))
            return bad(e, "'prompt[%d]' is not a token id of this model (0..%d)", r->n_prompt, sv->info.n_vocab - 1);
        r->prompt[r->n_prompt++] = (int32_t)it->valuedouble;
    }
    return true;
}

/* ---- the generation endpoints --------------------------------------------------------- */

static enum MHD_Result generate(struct srv *sv, struct MHD_Connection *c, struct conn *cn, bool chat) {
    cJSON *o = cJSON_ParseWithLength(cn->body.p ? cn->body.p : "", cn->body.n);
    if (!o) return send_error(c, 400, "invalid_request_error", "the request body is not valid JSON");
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return send_error(c, 400, "invalid_request_error", "the request body must be a JSON object");
    }
    struct srv_request *r = srv_request_new();
    if (!r) {
        cJSON_Delete(o);
        return send_error(c, 500, "server_error", "out of memory");
    }
    struct field_err e = {{0}};
    bool stream = false, usage = false;
    bool ok = gen_fields(sv, o, r, &stream, &usage, &e) &&
              (chat ? chat_prompt(sv, o, r, &e) : completion_prompt(sv, o, r, &e));
    cJSON_Delete(o);
    if (!ok) {
        r->refs = 1;
        srv_request_release(r);
        return send_error(c, 400, "invalid_request_error", "%s", e.msg);
    }
    const int32_t n_ctx = sv->cfg.sp.n_ctx;
    if (r->n_prompt < 1 || r->n_prompt >= n_ctx) {
        const int32_t np = r->n_prompt;
        r->refs = 1;
        srv_request_release(r);
        if (np < 1) return send_error(c, 400, "invalid_request_error", "the prompt is empty");
        return send_error(c, 400, "exceed_context_size_error",
                          "the prompt has %d tokens; a slot's context (-c) holds %d, and one must be left to generate",
                          np, n_ctx);
    }
    char id[48];
    static _Atomic unsigned long long seq;
    snprintf(id, sizeof id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL), ++seq);
    const long long created = (long long)time(NULL);
    srv_submit(sv, r); /* the scheduler's reference */

    if (stream) {
        struct stream *s = calloc(1, sizeof *s);
        if (!s) {
            srv_cancel(r);
            srv_request_release(r);
            return send_error(c, 500, "server_error", "out of memory");
        }
        *s = (struct stream){.sv = sv, .r = r, .c = c, .chat = chat, .include_usage = usage, .created = created};
        snprintf(s->id, sizeof s->id, "%s", id);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
        if (!resp) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        const enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }

    /* not streamed: wait for the whole answer */
    struct buf text = {0};
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->n_text) {
            buf_put(&text, r->text, r->n_text);
            r->n_text = 0;
        }
        if (r->finish != SRV_RUNNING) break;
        wait_req(r, 50);
        if (r->finish == SRV_RUNNING && !r->n_text && client_gone(c)) {
            r->cancelled = true;
            pthread_mutex_unlock(&r->mu);
            srv_request_release(r);
            free(text.p);
            return MHD_NO;
        }
    }
    const enum srv_finish fin = r->finish;
    char err[256];
    snprintf(err, sizeof err, "%s", r->error);
    struct buf b = {0};
    buf_str(&b, "{\"id\":");
    buf_json_str(&b, id, strlen(id));
    buf_printf(&b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", chat ? "chat.completion" : "text_completion",
               created);
    buf_json_str(&b, sv->cfg.alias, strlen(sv->cfg.alias));
    if (chat) {
        buf_str(&b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
        buf_json_str(&b, text.p ? text.p : "", text.n);
        buf_printf(&b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", finish_name(fin));
    } else {
        buf_str(&b, ",\"choices\":[{\"index\":0,\"text\":");
        buf_json_str(&b, text.p ? text.p : "", text.n);
        buf_printf(&b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", finish_name(fin));
    }
    usage_json(&b, r);
    buf_str(&b, "}");
    pthread_mutex_unlock(&r->mu);
    srv_request_release(r);
    free(text.p);
    enum MHD_Result ret;
    if (fin == SRV_ERROR || fin == SRV_CANCELLED) ret = send_error(c, 500, "server_error", "%s", err);
    else ret = b.oom ? send_error(c, 500, "server_error", "out of memory") : send_json(c, 200, b.p);
    free(b.p);
    return ret;
}

/* ---- the other endpoints ------------------------------------------------------------------ */

/* The body as a JSON object, or NULL after answering 400. */
static cJSON *body_object(struct MHD_Connection *c, struct conn *cn, enum MHD_Result *ret) {
    cJSON *o = cJSON_ParseWithLength(cn->body.p ? cn->body.p : "", cn->body.n);
    if (!o) {
        *ret = send_error(c, 400, "invalid_request_error", "the request body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        *ret = send_error(c, 400, "invalid_request_error", "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, struct buf *b) {
    const enum MHD_Result r = b->oom ? send_error(c, 500, "server_error", "out of memory") : send_json(c, 200, b->p);
    free(b->p);
    return r;
}

/* POST /tokenize {"content", "add_special" (false), "parse_special" (true),
 * "with_pieces" (false)} -> {"tokens": [id, ...]} or, with pieces,
 * {"tokens": [{"id", "piece"}, ...]}: a piece that is not valid UTF-8 on its
 * own (part of a character) is given as its bytes, an array of numbers. */
static enum MHD_Result tokenize_ep(struct srv *sv, struct MHD_Connection *c, struct conn *cn) {
    enum MHD_Result ret = MHD_NO;
    cJSON *o = body_object(c, cn, &ret);
    if (!o) return ret;
    struct field_err e = {{0}};
    bool add_special = false, parse_special = true, with_pieces = false;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (!content) bad(&e, "'content' is required");
    else if (!cJSON_IsString(content)) bad(&e, "'content' must be a string");
    else if (bool_field(o, "add_special", &add_special, &e) && bool_field(o, "parse_special", &parse_special, &e))
        bool_field(o, "with_pieces", &with_pieces, &e);
    int32_t n = 0, *tok = NULL;
    if (!e.msg[0]) {
        const unsigned flags = (add_special ? SP_TOKENIZE_ADD_BOS : 0) | (parse_special ? SP_TOKENIZE_PARSE_SPECIAL : 0);
        tok = tokenize_text(sv, content->valuestring, strlen(content->valuestring), flags, &n, &e);
    }
    cJSON_Delete(o);
    if (e.msg[0]) return send_error(c, 400, "invalid_request_error", "%s", e.msg);
    struct buf b = {0};
    buf_str(&b, "{\"tokens\":[");
    for (int32_t i = 0; i < n; i++) {
        if (i) buf_str(&b, ",");
        if (!with_pieces) {
            buf_printf(&b, "%d", tok[i]);
            continue;
        }
        char piece[256];
        size_t np = 0;
        if (sp_token_to_piece(sv->model, tok[i], piece, sizeof piece, &np) != SP_OK) np = 0;
        buf_printf(&b, "{\"id\":%d,\"piece\":", tok[i]);
        if (utf8_valid(piece, np)) {
            buf_json_str(&b, piece, np);
        } else {
            buf_str(&b, "[");
            for (size_t k = 0; k < np; k++) buf_printf(&b, "%s%u", k ? "," : "", (unsigned char)piece[k]);
            buf_str(&b, "]");
        }
        buf_str(&b, "}");
    }
    buf_str(&b, "]}");
    free(tok);
    return send_buf(c, &b);
}

/* POST /detokenize {"tokens": [id, ...]} -> {"content": text}. */
static enum MHD_Result detokenize_ep(struct srv *sv, struct MHD_Connection *c, struct conn *cn) {
    enum MHD_Result ret = MHD_NO;
    cJSON *o = body_object(c, cn, &ret);
    if (!o) return ret;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    if (!t || !cJSON_IsArray(t)) {
        cJSON_Delete(o);
        return send_error(c, 400, "invalid_request_error", "'tokens' must be an array of token ids");
    }
    const int n = cJSON_GetArraySize(t);
    int32_t *tok = malloc((size_t)(n ? n : 1) * sizeof *tok);
    if (!tok) {
        cJSON_Delete(o);
        return send_error(c, 500, "server_error", "out of memory");
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, t) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= sv->info.n_vocab ||
            it->valuedouble != floor(it->valuedouble)) {
            cJSON_Delete(o);
            free(tok);
            return send_error(c, 400, "invalid_request_error", "'tokens[%d]' is not a token id of this model (0..%d)",
                              i, sv->info.n_vocab - 1);
        }
        tok[i++] = (int32_t)it->valuedouble;
    }
    cJSON_Delete(o);
    size_t len = 0;
    char *text = NULL;
    sp_status st = sp_detokenize(sv->model, tok, n, NULL, 0, &len);
    if (st == SP_E_BUFFER || st == SP_OK) {
        if ((text = malloc(len + 1))) st = sp_detokenize(sv->model, tok, n, text, len + 1, &len);
        else st = SP_E_NOMEM;
    }
    free(tok);
    if (st) {
        free(text);
        return send_error(c, 500, "server_error", "detokenizing failed: %s", sp_last_error());
    }
    struct buf b = {0};
    buf_str(&b, "{\"content\":");
    buf_json_str(&b, text, len);
    buf_str(&b, "}");
    free(text);
    return send_buf(c, &b);
}

/* POST /apply-template {"messages": [...]} -> {"prompt": text}: the prompt a
 * chat completion of those messages would decode. */
static enum MHD_Result apply_template_ep(struct srv *sv, struct MHD_Connection *c, struct conn *cn) {
    enum MHD_Result ret = MHD_NO;
    cJSON *o = body_object(c, cn, &ret);
    if (!o) return ret;
    struct field_err e = {{0}};
    char *text = NULL;
    size_t len = 0;
    const bool ok = render_messages(sv, o, &text, &len, &e);
    cJSON_Delete(o);
    if (!ok) return send_error(c, 400, "invalid_request_error", "%s", e.msg);
    struct buf b = {0};
    buf_str(&b, "{\"prompt\":");
    buf_json_str(&b, text, len);
    buf_str(&b, "}");
    free(text);
    return send_buf(c, &b);
}

/* GET /props: the server's settings as llama-server names them (those that
 * apply here). */
static enum MHD_Result props_ep(struct srv *sv, struct MHD_Connection *c) {
    const struct srv_config *cf = &sv->cfg;
    struct buf b = {0};
    buf_printf(&b,
               "{\"default_generation_settings\":{\"id\":0,\"id_task\":-1,\"n_ctx\":%d,\"is_processing\":false,"
               "\"params\":{\"n_predict\":%d,\"max_tokens\":%d,\"seed\":-1,\"temperature\":%g,\"top_k\":%d,"
               "\"top_p\":%g,\"min_p\":%g,\"repeat_last_n\":%d,\"repeat_penalty\":%g,\"presence_penalty\":0,"
               "\"frequency_penalty\":0,\"stop\":[],\"ignore_eos\":false,\"stream\":false,\"n_probs\":0},"
               "\"prompt\":\"\"},",
               cf->sp.n_ctx, cf->max_tokens_cap, cf->max_tokens_cap, DEF_TEMP, DEF_TOP_K, DEF_TOP_P, DEF_MIN_P,
               DEF_REPEAT_LAST_N, DEF_REPEAT_PENALTY);
    buf_printf(&b, "\"total_slots\":%d,\"model_path\":", cf->n_slots);
    buf_json_cstr(&b, cf->model_path);
    buf_str(&b, ",\"model_alias\":");
    buf_json_cstr(&b, cf->alias);
    buf_str(&b, ",\"chat_template\":");
    if (cf->chat_template) {
        buf_json_cstr(&b, cf->chat_template);
    } else {
        size_t len = 0;
        char *t = NULL;
        if (sp_model_meta_str(sv->model, "tokenizer.chat_template", NULL, 0, &len) == SP_E_BUFFER &&
            (t = malloc(len + 1)) && sp_model_meta_str(sv->model, "tokenizer.chat_template", t, len + 1, &len) == SP_OK)
            buf_json_str(&b, t, len);
        else buf_str(&b, "\"\"");
        free(t);
    }
    buf_str(&b, ",\"modalities\":{\"vision\":false,\"audio\":false},\"build_info\":");
    buf_json_cstr(&b, "sparrow " SPARROW_CLI_VERSION);
    buf_str(&b, "}");
    return send_buf(c, &b);
}

/* A file name for --slot-save-path: one name, nothing that climbs or
 * descends (no '/', '\\', "..", control characters), at most 255 bytes. */
static bool slot_filename_ok(const char *f) {
    const size_t n = strlen(f);
    if (!n || n > 255 || !strcmp(f, ".") || strstr(f, "..")) return false;
    for (size_t i = 0; i < n; i++)
        if (f[i] == '/' || f[i] == '\\' || (unsigned char)f[i] < 0x20 || f[i] == 0x7f) return false;
    return true;
}

/* POST /slots/{id}?action=save|restore|erase (body {"filename": ...} for
 * save and restore): a slot's conversation to a file in --slot-save-path
 * and back (a session file, sp_session_save / sp_session_load), or its KV
 * cleared.  The action waits until the slot is idle. */
static enum MHD_Result slot_action_ep(struct srv *sv, struct MHD_Connection *c, struct conn *cn, const char *url) {
    if (!sv->cfg.slot_save_path)
        return send_error(c, 501, "not_supported_error",
                          "this server does not support slot actions: start it with --slot-save-path DIR");
    const char *ids = url + strlen("/slots/");
    char *end = NULL;
    errno = 0;
    const long id = strtol(ids, &end, 10);
    if (!*ids || *end || errno || id < 0 || id >= sv->cfg.n_slots || (ids[0] == '0' && ids[1]))
        return send_error(c, 400, "invalid_request_error", "'%s' is not a slot id (0..%d)", ids, sv->cfg.n_slots - 1);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    struct srv_op op = {.slot = (int)id};
    if (!action) return send_error(c, 400, "invalid_request_error", "'action' is required: save, restore or erase");
    if (!strcmp(action, "save")) op.kind = SRV_OP_SAVE;
    else if (!strcmp(action, "restore")) op.kind = SRV_OP_RESTORE;
    else if (!strcmp(action, "erase")) op.kind = SRV_OP_ERASE;
    else return send_error(c, 400, "invalid_request_error", "'action' must be save, restore or erase");
    char filename[256] = "", path[4096];
    if (op.kind != SRV_OP_ERASE) {
        enum MHD_Result ret = MHD_NO;
        cJSON *o = body_object(c, cn, &ret);
        if (!o) return ret;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "filename");
        if (!cJSON_IsString(f) || !slot_filename_ok(f->valuestring)) {
            cJSON_Delete(o);
            return send_error(c, 400, "invalid_request_error",
                              "'filename' must be a file name: not empty, at most 255 bytes, no '/', '\\\\', '..' "
                              "or control characters");
        }
        snprintf(filename, sizeof filename, "%s", f->valuestring);
        cJSON_Delete(o);
        const size_t nd = strlen(sv->cfg.slot_save_path);
        if ((size_t)snprintf(path, sizeof path, "%s%s%s", sv->cfg.slot_save_path,
                             nd && sv->cfg.slot_save_path[nd - 1] == '/' ? "" : "/", filename) >= sizeof path)
            return send_error(c, 400, "invalid_request_error", "the path of '%s' is too long", filename);
        op.path = path;
        struct stat fst;
        if (op.kind == SRV_OP_RESTORE && stat(path, &fst) != 0)
            return send_error(c, 400, "invalid_request_error", "no saved slot named '%s'", filename);
    }
    srv_slot_op(sv, &op);
    if (op.st) {
        const bool theirs = op.st == SP_E_INVALID || op.st == SP_E_FORMAT;
        return send_error(c, theirs ? 400 : 500, theirs ? "invalid_request_error" : "server_error", "slot %ld: %s: %s",
                          id, action, op.error);
    }
    struct buf b = {0};
    buf_printf(&b, "{\"id_slot\":%ld,", id);
    if (op.kind == SRV_OP_ERASE) {
        buf_printf(&b, "\"n_erased\":%d}", op.n_tokens);
        return send_buf(c, &b);
    }
    struct stat fst;
    const long long bytes = stat(path, &fst) == 0 ? (long long)fst.st_size : 0;
    buf_str(&b, "\"filename\":");
    buf_json_cstr(&b, filename);
    if (op.kind == SRV_OP_SAVE)
        buf_printf(&b, ",\"n_saved\":%d,\"n_written\":%lld,\"timings\":{\"save_ms\":%.3f}}", op.n_tokens, bytes, op.ms);
    else
        buf_printf(&b, ",\"n_restored\":%d,\"n_read\":%lld,\"timings\":{\"restore_ms\":%.3f}}", op.n_tokens, bytes,
                   op.ms);
    return send_buf(c, &b);
}

/* ---- routing ------------------------------------------------------------------------------ */

static enum route route_of(const char *url, const char *method, bool *method_ok) {
    static const struct {
        const char *path, *method;
        enum route r;
    } routes[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/chat/completions", "POST", R_CHAT},
        {"/v1/completions", "POST", R_COMPLETION}, {"/completions", "POST", R_COMPLETION},
        {"/v1/models", "GET", R_MODELS},          {"/models", "GET", R_MODELS},
        {"/health", "GET", R_HEALTH},             {"/v1/health", "GET", R_HEALTH},
        {"/slots", "GET", R_SLOTS},               {"/tokenize", "POST", R_TOKENIZE},
        {"/detokenize", "POST", R_DETOKENIZE},    {"/apply-template", "POST", R_APPLY_TEMPLATE},
        {"/props", "GET", R_PROPS},               {"/metrics", "GET", R_METRICS},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        *method_ok = !strcmp(method, routes[i].method);
        return routes[i].r;
    }
    if (!strncmp(url, "/slots/", 7) && url[7]) { /* /slots/{id}; the id is checked by the endpoint */
        *method_ok = !strcmp(method, "POST");
        return R_SLOT_ACTION;
    }
    *method_ok = false;
    return R_NONE;
}


/* Constant-time comparison of the bearer token with the key. */
static bool key_ok(const char *key, const char *auth) {
    if (!auth || strncmp(auth, "Bearer ", 7)) return false;
    const char *t = auth + 7;
    const size_t nk = strlen(key), nt = strlen(t);
    unsigned char d = nk != nt;
    for (size_t i = 0; i < nk; i++) d |= (unsigned char)(key[i] ^ (i < nt ? t[i] : 0));
    return d == 0;
}

/* Does the request carry one of the keys?  Every key is compared in full. */
static bool auth_ok(const struct srv_config *cf, const char *auth) {
    bool ok = false;
    for (int i = 0; i < cf->n_api_keys; i++) ok |= key_ok(cf->api_keys[i], auth);
    return ok;
}

/* Requests begun and not completed yet: on SIGTERM the server waits (a
 * while) for them to send their last bytes before it stops the daemon,
 * which would cut their connections -- a slot save that ran at shutdown
 * must reach its client. */
static _Atomic long n_live;

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct srv *sv = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        /* the headers: answer what needs no body before reading it (a body
         * over --max-body is then never read, nor kept) */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        cn->sv = sv;
        *con_cls = cn;
        n_live++;
        bool method_ok;
        cn->rt = route_of(url, method, &method_ok);
        if (cn->rt == R_NONE) return send_error(c, 404, "not_found_error", "no route %s %s", method, url);
        if (!method_ok) return send_error(c, 405, "invalid_request_error", "%s does not take %s", url, method);
        if (sv->cfg.n_api_keys && cn->rt != R_HEALTH &&
            !auth_ok(&sv->cfg, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")))
            return send_error(c, 401, "authentication_error", "invalid API key");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            const unsigned long long want = strtoull(cl, NULL, 10);
            if (want > sv->cfg.max_body)
                return send_error(c, 413, "invalid_request_error", "the request body is larger than %zu bytes",
                                  sv->cfg.max_body);
            if (want && !(cn->body.p = malloc(want + 1))) return MHD_NO; /* the whole body, once */
            cn->body.cap = want ? want + 1 : 0;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (cn->body.n + *upload_size > sv->cfg.max_body) cn->too_big = true;
        if (!cn->too_big) buf_put(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->body.oom) return send_error(c, 500, "server_error", "out of memory");
    const enum route rt = cn->rt;
    if (cn->too_big)
        return send_error(c, 413, "invalid_request_error", "the request body is larger than %zu bytes",
                          sv->cfg.max_body);
    if (!sv->ready) return send_error(c, 503, "unavailable_error", "the model is loading");
    switch (rt) {
    case R_HEALTH:
        return send_json(c, 200, "{\"status\":\"ok\"}");
    case R_MODELS: {
        struct buf b = {0};
        buf_str(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        buf_json_str(&b, sv->cfg.alias, strlen(sv->cfg.alias));
        buf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sparrow\",\"meta\":{\"n_vocab\":%d,"
                       "\"n_ctx_train\":%d,\"n_params\":%llu}}]}",
                   (long long)time(NULL), sv->info.n_vocab, sv->info.n_ctx_train,
                   (unsigned long long)sv->info.n_params);
        const enum MHD_Result r = b.oom ? MHD_NO : send_json(c, 200, b.p);
        free(b.p);
        return r;
    }
    case R_SLOTS: {
        char *j = srv_slots_json(sv);
        const enum MHD_Result r = j ? send_json(c, 200, j) : MHD_NO;
        free(j);
        return r;
    }
    case R_SLOT_ACTION:
        return slot_action_ep(sv, c, cn, url);
    case R_TOKENIZE:
        return tokenize_ep(sv, c, cn);
    case R_DETOKENIZE:
        return detokenize_ep(sv, c, cn);
    case R_APPLY_TEMPLATE:
        return apply_template_ep(sv, c, cn);
    case R_PROPS:
        return props_ep(sv, c);
    case R_METRICS: {
        if (!sv->cfg.metrics)
            return send_error(c, 501, "not_supported_error",
                              "this server does not serve metrics: start it with --metrics");
        char *t = srv_metrics_text(sv);
        const enum MHD_Result r = t ? send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", t, strlen(t))
                                    : send_error(c, 500, "server_error", "out of memory");
        free(t);
        return r;
    }
    case R_CHAT:
    case R_COMPLETION:
        return generate(sv, c, cn, rt == R_CHAT);
    default:
        return MHD_NO;
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    struct conn *cn = *con_cls;
    if (!cn) return;
    free(cn->body.p);
    free(cn);
    *con_cls = NULL;
    n_live--;
#ifdef __GLIBC__
    /* Every TRIM_EVERY requests, hand the heap's free pages back to the OS:
     * what concurrent connections needed at their peak stays mapped but
     * free, and later allocations would touch ever more of it, a slow creep
     * of the resident set (bench/serve-load.sh measured ~1.5 KB a request
     * before).  One walk over a heap of a few MiB: microseconds. */
    static _Atomic unsigned long n_done;
    if (++n_done % TRIM_EVERY == 0) malloc_trim(0);
#endif
}

/* ---- the daemon ----------------------------------------------------------------------------- */

int srv_http_run(struct srv *sv) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    const char *host = strcmp(sv->cfg.host, "localhost") ? sv->cfg.host : "127.0.0.1";
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)sv->cfg.port);
        len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)sv->cfg.port);
        len = sizeof *a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "sparrow serve: --host %s is not an IPv4 or IPv6 address\n", sv->cfg.host);
        return EXIT_USAGE;
    }
    (void)len;
    /* the signals go to the thread that waits for them below, none other */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, handler, sv, MHD_OPTION_SOCK_ADDR, &ss,
                                            MHD_OPTION_NOTIFY_COMPLETED, completed, sv,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
                                            /* over 32 KiB, a connection's pool is mmap'd (and unmapped
                                             * when it closes) instead of a malloc'd 32 KiB: each
                                             * connection's pool then leaves no hole in the heap */
                                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 << 10), MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "sparrow serve: cannot listen on %s port %d: %s\n", sv->cfg.host, sv->cfg.port,
                strerror(errno));
        return EXIT_RUNTIME;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("sparrow serve: listening on http://%s:%u (model %s, %d slots of %d tokens)\n", sv->cfg.host,
           di ? di->port : (unsigned)sv->cfg.port, sv->cfg.alias, sv->cfg.n_slots, sv->cfg.sp.n_ctx);
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "sparrow serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(sv);        /* in-flight requests end with an error event, slot actions asked for run */
    /* let their answers go out (at most 5 s: a client that stops reading
     * must not hold the stop) before the daemon cuts the connections */
    for (int i = 0; i < 500 && n_live > 0; i++) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    MHD_stop_daemon(d);  /* waits for the connection threads */
    return EXIT_OK;
}
