/*
 * cmd_chat.c -- `sparrow chat`: a conversation with a model, at a terminal
 * (line editing and history with libedit), from a pipe (one message per
 * line), or as JSON lines for scripts.
 *
 * History is never recomputed.  The session holds the conversation's
 * tokens; c->n_rendered is how many bytes of the template's rendering of the
 * conversation those tokens stand for.  A turn renders the conversation with
 * the new message (and the opening of the answer), tokenizes only the bytes
 * past n_rendered (special tokens parsed) and decodes them; the answer stays
 * in the session as the ids that were generated, and n_rendered moves past
 * the answer's text.  The next turn's difference thus starts with whatever
 * the template writes after an answer (<|im_end|>, <|eot_id|>, ...): the
 * end-of-generation token that stopped the answer, not decoded then, is
 * decoded with the next turn.  A model without a template gets plain turns:
 * each message is appended to the text on a line of its own.
 */
#include "cmds.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <histedit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void help_chat(FILE *f) {
    fprintf(f,
            "usage: sparrow chat -m MODEL [-sys TEXT] [--chat-template NAME | --jinja] [OPTIONS]\n"
            "\n"
            "Hold a conversation with MODEL.  On a terminal: type a message, Enter sends it;\n"
            "the answer streams as it is generated; line editing and history (libedit);\n"
            "Ctrl-D or end of input quits.  From a pipe: one user message per line, each\n"
            "answer on stdout followed by a newline.  With --json: one JSON message per line\n"
            "in, {\"role\": \"user\" | \"system\", \"content\": TEXT}, and one JSON object per\n"
            "answer out: text, tokens_decoded (prompt tokens decoded this turn),\n"
            "tokens_generated, n_past (positions the session holds after the turn), n_ctx,\n"
            "ttft_s (time to first token), decode_tps and stop (eog, limit, context full,\n"
            "callback = interrupted); a bad line gets {\"error\": ...} and the exit status 1.\n"
            "Streamed text is always valid UTF-8 (invalid bytes become U+FFFD).\n"
            "\n"
            "The conversation is rendered with the model's chat template\n"
            "(tokenizer.chat_template) or --chat-template NAME, and each turn decodes only\n"
            "what its message adds: earlier turns are never decoded again, and an answer\n"
            "stays in the session as the tokens that were generated.  A model without a\n"
            "template gets plain turns (said on stderr): each message is appended to the\n"
            "text on its own line and the model continues it.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        model file (GGUF or llama2.c .bin); required\n"
            "  -sys, --system-prompt TEXT  the system message (default: none)\n"
            "      --chat-template NAME  a named formatter instead of the model's template\n"
            "                          (the names: 'sparrow template --help')\n"
            "      --jinja             run the template's Jinja program (the default)\n"
            "      --no-jinja          use the named formatter the template is recognised as\n"
            "      --json              JSON lines in and out (above)\n"
            "  -n, --n-predict N       tokens each answer may have at most, -1 = until end of\n"
            "                          generation or a full context (default: -1)\n");
    help_gen_opts(f);
    fputs("      --prompt-cache FILE the session after the system prompt: reused from FILE\n"
          "                          (saved by an earlier chat with the same model, cache\n"
          "                          types and system prompt) as far as it matches, else\n"
          "                          decoded and saved to FILE\n"
          CLI_HELP_MEM_BUDGET
          CLI_HELP_TOKENIZER
          "  -v, --verbose           print the library's log messages on stderr\n"
          "  -h, --help              print this help and exit\n"
          "\n"
          "commands (a line starting with '/'; not in --json mode):\n"
          "  /reset        start a new conversation (the system prompt stays)\n"
          "  /save FILE    save the conversation: the session to FILE, its messages to\n"
          "                FILE.json\n"
          "  /load FILE    continue a conversation /save wrote (same model, cache types)\n"
          "  /system TEXT  set the system prompt; a conversation under way starts anew\n"
          "  /stats        the last turn: tokens decoded, time to first token, tok/s; KV\n"
          "                positions used, memory\n"
          "  /help         this list\n"
          "A {\"role\": \"system\"} line in --json mode acts as /system.\n"
          "\n"
          "Ctrl-C stops the answer being generated; what was generated stays in the\n"
          "conversation.  Ctrl-C while the message is decoded drops the message.  The\n"
          "same model, options, seed and messages give the same conversation.\n"
          "\n"
          "exit status: 0 at the end of input, 1 runtime or library error (or a bad JSON\n"
          "line or failed turn), 2 usage error.\n",
          f);
}

/* ---- Ctrl-C ------------------------------------------------------------------ */

static volatile sig_atomic_t chat_interrupted;
static void chat_on_sigint(int sig) {
    (void)sig;
    chat_interrupted = 1;
}
static bool chat_abort(void *user) {
    (void)user;
    return chat_interrupted != 0;
}

/* ---- growable buffers ---------------------------------------------------------- */

struct buf {
    char *p;
    size_t n, cap;
};

static int buf_add(struct buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* ---- the conversation ------------------------------------------------------------ */

struct chat {
    struct sp_model *model;
    struct sp_session *sess;
    struct sp_chat_params cp;
    bool plain;                 /* no template: plain turns */
    bool json;
    struct gen_opts g;
    struct sp_governor *gov;    /* --governor, or NULL */
    char *sys;                  /* the system prompt, or NULL */
    struct sp_chat_message *msgs;
    size_t n_msgs, cap_msgs;
    size_t n_rendered;          /* bytes of the rendering the session holds */
    struct buf render, answer;
    /* the last turn */
    int32_t t_decoded, t_generated;
    double t_ttft, t_tps;
    enum sp_stop_reason t_stop;
    int failed;                 /* a turn or line failed: exit 1 at the end */
};

/* Append a message (content copied); -1 out of memory. */
static int msgs_push(struct chat *c, const char *role, const char *content, size_t n) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? c->cap_msgs * 2 : 16;
        struct sp_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return -1;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *copy = malloc(n + 1);
    if (!copy) return -1;
    memcpy(copy, content, n);
    copy[n] = '\0';
    c->msgs[c->n_msgs].role = role; /* a static string */
    c->msgs[c->n_msgs].content = copy;
    c->n_msgs++;
    return 0;
}

static void msgs_clear(struct chat *c) {
    for (size_t i = 0; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = 0;
    if (c->sys && msgs_push(c, "system", c->sys, strlen(c->sys)) != 0) {
        fprintf(stderr, "sparrow: chat: out of memory\n");
        exit(EXIT_RUNTIME);
    }
}

static void msgs_pop(struct chat *c) {
    if (c->n_msgs) free((char *)c->msgs[--c->n_msgs].content);
}

/* A new conversation: no messages but the system prompt, an empty session. */
static void chat_reset(struct chat *c) {
    msgs_clear(c);
    c->n_rendered = 0;
    sp_session_reset(c->sess);
}

/* The conversation rendered into c->render (the first n messages). */
static sp_status render(struct chat *c, size_t n, bool add_assistant) {
    struct sp_chat_params p = c->cp;
    p.add_assistant = add_assistant;
    size_t len = 0;
    if (n == 0) { /* templates may refuse an empty conversation: it renders as nothing */
        c->render.n = 0;
        return SP_OK;
    }
    sp_status rc = sp_chat_apply(c->model, &p, c->msgs, n, c->render.p, c->render.cap, &len);
    if (rc == SP_E_BUFFER) {
        free(c->render.p);
        c->render.cap = len + 1;
        if (!(c->render.p = malloc(c->render.cap))) {
            c->render.cap = 0;
            return SP_E_NOMEM;
        }
        rc = sp_chat_apply(c->model, &p, c->msgs, n, c->render.p, c->render.cap, &len);
    }
    c->render.n = rc == SP_OK ? len : 0;
    return rc;
}

/* ---- one turn ----------------------------------------------------------------------- */

struct stream {
    struct chat *c;
    int write_failed;
};

static bool on_token(const char *text, size_t n, int32_t tok, void *user) {
    struct stream *st = user;
    struct chat *c = st->c;
    (void)tok;
    for (size_t i = 0; i < n; i++) /* a NUL byte would cut the message short: drop it */
        if (text[i] && buf_add(&c->answer, text + i, 1) != 0) return false;
    if (!c->json && n) {
        if (fwrite(text, 1, n, stdout) != n || fflush(stdout) != 0) {
            st->write_failed = 1;
            return false;
        }
    }
    return !chat_interrupted;
}

/* Tokenize text[0..n) and decode + generate (or decode only with
 * n_predict 0), adding into the turn's figures.  Returns the status. */
static sp_status step(struct chat *c, const char *text, size_t n, unsigned flags, int32_t n_predict,
                      struct stream *st, struct sp_generate_result *r) {
    int32_t *toks = NULL, n_toks = 0;
    sp_status rc = tokenize_all(c->model, text, n, flags, &toks, &n_toks);
    if (rc != SP_OK) return rc;
    struct sp_generate_params gp = sp_generate_default_params();
    gp.n_predict = n_predict;
    gp.decode_last = true; /* the session keeps the whole answer */
    if (n_toks == 0 && n_predict == 0) {
        free(toks);
        memset(r, 0, sizeof *r);
        return SP_OK;
    }
    rc = sp_generate(c->sess, toks, n_toks, &gp, on_token, st, r);
    free(toks);
    return rc;
}

/* --prompt-cache: the session after the system prompt's n tokens; reuse
 * what FILE holds of them, decode the rest and save.  Returns the tokens
 * decoded (the rest), or -1 on failure (message printed). */
static int32_t cached_prefix(struct chat *c, const char *text, size_t n, double *t) {
    int32_t *toks = NULL, n_toks = 0, reuse = 0;
    sp_status rc = tokenize_all(c->model, text, n, SP_TOKENIZE_ADD_BOS | (c->plain ? 0 : SP_TOKENIZE_PARSE_SPECIAL),
                                &toks, &n_toks);
    if (rc != SP_OK) return lib_error("tokenizing the system prompt", rc), -1;
    const char *file = c->g.prompt_cache;
    reuse = prompt_cache_reuse("chat", c->sess, file, toks, n_toks, c->g.sp.seed);
    if (reuse >= 0 && !c->json)
        fprintf(stderr, "sparrow: prompt cache %s: %d of %d system prompt tokens reused\n", file, (int)reuse,
                (int)n_toks);
    if (reuse < 0) reuse = 0;
    struct sp_generate_params gp = sp_generate_default_params();
    gp.n_predict = 0;
    struct sp_generate_result r;
    rc = n_toks > reuse ? sp_generate(c->sess, toks + reuse, n_toks - reuse, &gp, NULL, NULL, &r) : SP_OK;
    free(toks);
    if (rc != SP_OK) return lib_error("decoding the system prompt", rc), -1;
    if (n_toks > reuse && r.stop == SP_STOP_ABORTED) return -1;
    *t = n_toks > reuse ? r.t_total_s : 0;
    if (sp_session_save(c->sess, file) != SP_OK)
        fprintf(stderr, "sparrow: chat: warning: cannot save the prompt cache: %s\n", sp_last_error());
    return n_toks - reuse;
}

static void print_json_answer(const struct chat *c) {
    printf("{\"text\": ");
    json_string(c->answer.p ? c->answer.p : "");
    json_key_num("tokens_decoded", c->t_decoded, 1);
    json_key_num("tokens_generated", c->t_generated, 1);
    json_key_num("n_past", sp_session_n_past(c->sess), 1);
    json_key_num("n_ctx", sp_session_n_ctx(c->sess), 1);
    json_key_num("ttft_s", c->t_ttft, 0);
    json_key_num("decode_tps", c->t_tps, 0);
    json_key_str("stop", sp_stop_reason_name(c->t_stop));
    printf("}\n");
    fflush(stdout);
}

static void print_json_error(const char *msg) {
    printf("{\"error\": ");
    json_string(msg);
    printf("}\n");
    fflush(stdout);
}

/* Does the rendering of the whole conversation (the answer included) start
 * with what the session holds: the turn's prompt, then the answer as it
 * was generated?  Templates that trim or rewrite answers say no. */
static bool answer_rendered_as_generated(struct chat *c, const struct buf *prompt) {
    if (render(c, c->n_msgs, false) != SP_OK) return false;
    return c->render.n >= prompt->n + c->answer.n && memcmp(c->render.p, prompt->p, prompt->n) == 0 &&
           memcmp(c->render.p + prompt->n, c->answer.p, c->answer.n) == 0;
}

/* One user message: its difference decoded, the answer generated.  Returns
 * 0, or -1 when the turn failed (message printed; the conversation is as
 * before the message). */
static int turn(struct chat *c, const char *msg, size_t msg_len) {
    const int32_t past0 = sp_session_n_past(c->sess);
    const size_t n_msgs0 = c->n_msgs;
    const bool first = c->n_rendered == 0 && past0 == 0;
    struct stream st = {c, 0};
    struct sp_generate_result r;
    struct buf prompt = {NULL, 0, 0}; /* the conversation through the opening of the answer */
    size_t sys_len = 0;               /* of which the system prompt (--prompt-cache) */
    int ret = -1;
    c->answer.n = 0;
    c->t_decoded = c->t_generated = 0;
    c->t_ttft = c->t_tps = 0;
    chat_interrupted = 0;
    if (buf_add(&c->answer, "", 0) != 0 || buf_add(&prompt, "", 0) != 0) goto nomem;
    const bool cache_sys = first && c->g.prompt_cache && c->sys;
    if (cache_sys && !c->plain) {
        if (render(c, 1, false) != SP_OK) goto bad_template;
        sys_len = c->render.n;
    }
    if (msgs_push(c, "user", msg, msg_len) != 0) goto nomem;

    /* the new text: the rendering past what the session holds */
    if (c->plain) {
        /* plain turns: the text so far, then each message not yet decoded on
         * a line of its own (the system prompt on the first turn) */
        prompt.n = 0;
        for (size_t i = first ? 0 : c->n_msgs - 1; i < c->n_msgs; i++)
            if ((i > 0 && buf_add(&prompt, "\n", 1) != 0) ||
                buf_add(&prompt, c->msgs[i].content, strlen(c->msgs[i].content)) != 0)
                goto nomem;
        if (cache_sys) sys_len = strlen(c->sys);
        /* prompt holds only the new text here; n_rendered counts bytes */
    } else {
        if (render(c, c->n_msgs, true) != SP_OK) goto bad_template;
        if (c->render.n < c->n_rendered) {
            fprintf(stderr, "sparrow: chat: the template's rendering of the conversation got shorter (%zu < %zu "
                            "bytes): cannot append to it\n",
                    c->render.n, c->n_rendered);
            goto fail;
        }
        if (buf_add(&prompt, c->render.p, c->render.n) != 0) goto nomem;
        if (sys_len > prompt.n) sys_len = 0;
    }
    const size_t from = c->plain ? 0 : c->n_rendered;
    const char *text = prompt.p + from;
    size_t n_text = prompt.n - from;

    /* --prompt-cache: the system prompt on its own, reused from the file or
     * decoded and saved there */
    double t_sys = 0;
    size_t skip = 0;
    if (sys_len > 0) {
        int32_t d = cached_prefix(c, text, sys_len, &t_sys);
        if (d < 0) goto fail_undo;
        c->t_decoded += d;
        skip = sys_len;
    }

    unsigned flags = (c->plain ? 0 : SP_TOKENIZE_PARSE_SPECIAL) | (first && skip == 0 ? SP_TOKENIZE_ADD_BOS : 0);
    sp_status rc = step(c, text + skip, n_text - skip, flags, (int32_t)c->g.n_predict, &st, &r);
    if (rc == SP_E_CONTEXT_FULL) {
        fprintf(stderr, "sparrow: chat: the message does not fit in the context (%d of %d positions held): "
                        "/reset, a larger -c or --context-shift\n",
                (int)sp_session_n_past(c->sess), (int)sp_session_n_ctx(c->sess));
        goto fail_undo;
    }
    if (rc != SP_OK) {
        lib_error("generating the answer", rc);
        if (r.n_generated == 0) goto fail_undo;
        c->failed = 1; /* keep what was generated */
    }
    if (st.write_failed) {
        fprintf(stderr, "sparrow: chat: cannot write to stdout: %s\n", strerror(errno));
        exit(EXIT_RUNTIME);
    }
    if (r.stop == SP_STOP_ABORTED && r.n_generated == 0) {
        /* Ctrl-C while the message was decoded: forget it */
        if (!c->json) fprintf(stderr, "\n(interrupted: the message was dropped)\n");
        ret = 0;
        goto undo;
    }
    c->t_decoded += r.n_prompt;
    c->t_generated = r.n_generated;
    c->t_ttft = t_sys + r.ttft_s;
    c->t_tps = r.decode_tps;
    c->t_stop = r.stop;

    /* the answer joins the conversation, and the session holds the
     * rendering through it; where the template rewrites answers, the next
     * turn goes on after the rendering's end of the answer instead, as
     * llama.cpp's chat loop does */
    if (msgs_push(c, "assistant", c->answer.p, c->answer.n) != 0) goto nomem;
    if (c->plain) {
        c->n_rendered += n_text + c->answer.n;
    } else if (answer_rendered_as_generated(c, &prompt)) {
        c->n_rendered = prompt.n + c->answer.n;
    } else {
        c->n_rendered = c->render.n;
        if (log_verbose) fprintf(stderr, "sparrow: chat: the template rewrites answers; following its rendering\n");
    }
    if (c->json) {
        print_json_answer(c);
    } else {
        if (fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
            fprintf(stderr, "sparrow: chat: cannot write to stdout: %s\n", strerror(errno));
            exit(EXIT_RUNTIME);
        }
        if (r.stop == SP_STOP_CALLBACK) fprintf(stderr, "(interrupted)\n");
        if (r.stop == SP_STOP_CONTEXT)
            fprintf(stderr, "(the context is full: /reset, a larger -c or --context-shift)\n");
    }
    ret = 0;
    goto out;

bad_template:
    lib_error("rendering the chat template", SP_E_FORMAT);
    goto fail;
nomem:
    fprintf(stderr, "sparrow: chat: out of memory\n");
fail_undo:
    c->failed = 1;
undo:
    /* back to the conversation before the message */
    if (sp_session_n_past(c->sess) > past0) sp_session_truncate(c->sess, past0);
    if (first) sp_session_reset(c->sess);
    goto pop;
fail:
    c->failed = 1;
pop:
    while (c->n_msgs > n_msgs0) msgs_pop(c);
out:
    free(prompt.p);
    chat_interrupted = 0;
    return ret;
}

/* ---- /save and /load ----------------------------------------------------------------- */

/* FILE.json: {"plain": bool, "rendered": N, "messages": [{role, content}...]},
 * written to a temporary file in its folder, synced and renamed. */
static int save_messages(const struct chat *c, const char *path) {
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "messages");
    cJSON_AddBoolToObject(root, "plain", c->plain);
    cJSON_AddNumberToObject(root, "rendered", (double)c->n_rendered);
    for (size_t i = 0; i < c->n_msgs; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", c->msgs[i].role);
        cJSON_AddStringToObject(m, "content", c->msgs[i].content);
        cJSON_AddItemToArray(arr, m);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return -1;
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    int ok = 0;
    if (tmp) {
        snprintf(tmp, n, "%s.sparrow-tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
            ok = fclose(f) == 0 && ok;
            ok = ok && rename(tmp, path) == 0;
            if (!ok) unlink(tmp);
        }
    }
    if (!ok) fprintf(stderr, "sparrow: chat: cannot write %s: %s\n", path, strerror(errno));
    free(tmp);
    free(text);
    return ok ? 0 : -1;
}

static const char *role_name(const char *r) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0) return roles[i];
    return NULL;
}

static int load_messages(struct chat *c, const char *path) {
    char *text = NULL;
    size_t len;
    if (read_all("chat", path, &text, &len) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "messages"),
                *rend = cJSON_GetObjectItemCaseSensitive(root, "rendered"),
                *plain = cJSON_GetObjectItemCaseSensitive(root, "plain");
    int ok = cJSON_IsArray(arr) && cJSON_IsNumber(rend) && rend->valuedouble >= 0 && cJSON_IsBool(plain) &&
             cJSON_IsTrue(plain) == c->plain;
    if (ok) {
        while (c->n_msgs) msgs_pop(c);
        const cJSON *m;
        cJSON_ArrayForEach(m, arr) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"),
                        *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            const char *r = cJSON_IsString(role) ? role_name(role->valuestring) : NULL;
            if (!r || !cJSON_IsString(content) ||
                msgs_push(c, r, content->valuestring, strlen(content->valuestring)) != 0) {
                ok = 0;
                break;
            }
        }
        c->n_rendered = (size_t)rend->valuedouble;
    }
    cJSON_Delete(root);
    if (!ok) fprintf(stderr, "sparrow: chat: %s is not a conversation /save wrote (for this kind of chat)\n", path);
    return ok ? 0 : -1;
}

static void cmd_save(struct chat *c, const char *file) {
    char *side = malloc(strlen(file) + 6);
    if (!side) return;
    sprintf(side, "%s.json", file);
    if (sp_session_save(c->sess, file) != SP_OK) lib_error("saving the session", SP_E_IO);
    else if (save_messages(c, side) == 0)
        fprintf(stderr, "saved %d positions to %s, %zu messages to %s\n", (int)sp_session_n_past(c->sess), file,
                c->n_msgs, side);
    free(side);
}

static void cmd_load(struct chat *c, const char *file) {
    char *side = malloc(strlen(file) + 6);
    if (!side) return;
    sprintf(side, "%s.json", file);
    if (access(side, R_OK) != 0) {
        fprintf(stderr, "sparrow: chat: %s is missing: /load takes what /save wrote\n", side);
    } else if (sp_session_load(c->sess, file) != SP_OK) {
        lib_error("loading the session", SP_E_IO);
        chat_reset(c);
    } else if (load_messages(c, side) != 0) {
        chat_reset(c);
    } else {
        free(c->sys);
        c->sys = c->n_msgs && strcmp(c->msgs[0].role, "system") == 0 ? strdup(c->msgs[0].content) : NULL;
        fprintf(stderr, "loaded %zu messages, %d positions\n", c->n_msgs, (int)sp_session_n_past(c->sess));
    }
    free(side);
}

static void set_system(struct chat *c, const char *text) {
    bool under_way = sp_session_n_past(c->sess) > 0;
    free(c->sys);
    c->sys = *text ? strdup(text) : NULL;
    chat_reset(c);
    if (under_way && !c->json) fprintf(stderr, "(a new conversation with this system prompt)\n");
}

static void cmd_stats(struct chat *c) {
    struct sp_kv_info kv;
    struct sp_mem_stats ms;
    char b1[32], b2[32];
    sp_session_kv_info(c->sess, &kv);
    sp_model_get_mem_stats(c->model, &ms);
    printf("last turn: %d tokens decoded, %d generated, time to first token %.3f s, %.2f tok/s (%s)\n",
           (int)c->t_decoded, (int)c->t_generated, c->t_ttft, c->t_tps, sp_stop_reason_name(c->t_stop));
    printf("KV cache: %d of %d positions used (%s %s/%s; %lld dropped by %d context shifts)\n", (int)kv.n_cells,
           (int)kv.n_ctx, human_bytes(kv.bytes_stored, b1, sizeof b1), kv_type_name(kv.type_k),
           kv_type_name(kv.type_v), (long long)kv.n_discarded, (int)kv.n_shifts);
    printf("memory: session %s, weights resident %s", human_bytes(sp_session_memory_bytes(c->sess), b1, sizeof b1),
           human_bytes(ms.resident_weight_bytes, b2, sizeof b2));
    if (ms.account_limit) printf(", budget %s", human_bytes(ms.account_limit, b1, sizeof b1));
    printf(", peak %s\n", human_bytes(ms.account_peak, b2, sizeof b2));
    struct sp_governor_stats gs;
    if (c->gov && sp_governor_get_stats(c->gov, &gs) == SP_OK)
        printf("governor: state %s%s, threads %d, experts %d, pacing %.2f ms, %lld state changes, paced %.3f s\n",
               sp_gov_state_name(gs.state), gs.saver ? " + battery saver" : "", (int)gs.threads,
               (int)gs.n_expert_used, gs.pacing_ms, (long long)gs.n_state_changes, gs.paced_s);
    fflush(stdout);
}

static void cmd_help(void) {
    printf("/reset        start a new conversation (the system prompt stays)\n"
           "/save FILE    save the conversation (FILE and FILE.json)\n"
           "/load FILE    continue a saved conversation\n"
           "/system TEXT  set the system prompt (starts a new conversation)\n"
           "/stats        the last turn's figures, KV positions, memory\n"
           "/help         this list\n");
    fflush(stdout);
}

/* A line starting with '/': a command.  Returns 1 if it was one. */
static int command(struct chat *c, const char *line) {
    const char *arg = strchr(line, ' ');
    size_t n = arg ? (size_t)(arg - line) : strlen(line);
    while (arg && *arg == ' ') arg++;
    if (arg && !*arg) arg = NULL;
#define IS(name) (n == strlen(name) && memcmp(line, name, n) == 0)
    if (IS("/reset")) {
        chat_reset(c);
        fprintf(stderr, "(a new conversation)\n");
    } else if (IS("/save") || IS("/load")) {
        if (!arg) fprintf(stderr, "sparrow: chat: %.*s FILE\n", (int)n, line);
        else if (IS("/save")) cmd_save(c, arg);
        else cmd_load(c, arg);
    } else if (IS("/system")) {
        set_system(c, arg ? arg : "");
    } else if (IS("/stats")) {
        cmd_stats(c);
    } else if (IS("/help")) {
        cmd_help();
    } else {
        fprintf(stderr, "sparrow: chat: unknown command '%.*s' (/help lists them)\n", (int)n, line);
    }
#undef IS
    return 1;
}

/* One line of --json input. */
static void json_line(struct chat *c, const char *line, size_t len) {
    cJSON *m = cJSON_ParseWithLength(line, len);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"),
                *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !cJSON_IsString(content) ||
        (strcmp(role->valuestring, "user") != 0 && strcmp(role->valuestring, "system") != 0)) {
        print_json_error("expected {\"role\": \"user\" or \"system\", \"content\": TEXT}");
        fprintf(stderr, "sparrow: chat: not a message: %.*s\n", (int)(len > 200 ? 200 : len), line);
        c->failed = 1;
    } else if (strcmp(role->valuestring, "system") == 0) {
        set_system(c, content->valuestring);
    } else if (turn(c, content->valuestring, strlen(content->valuestring)) != 0) {
        print_json_error(sp_last_error()[0] ? sp_last_error() : "the turn failed");
    }
    cJSON_Delete(m);
}

static void handle_line(struct chat *c, char *line, size_t len) {
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    if (c->json) {
        if (len) json_line(c, line, len);
    } else if (line[0] == '/') {
        command(c, line);
    } else if (len) {
        turn(c, line, len);
    }
}

/* ---- input ------------------------------------------------------------------------------ */

static const char *prompt_fn(EditLine *e) {
    (void)e;
    return "> ";
}

/* A terminal: libedit with history.  Ctrl-C at the prompt clears the line. */
static void interactive(struct chat *c) {
    EditLine *el = el_init("sparrow", stdin, stdout, stderr);
    History *hist = history_init();
    HistEvent ev;
    if (!el || !hist) {
        fprintf(stderr, "sparrow: chat: cannot start line editing\n");
        exit(EXIT_RUNTIME);
    }
    history(hist, &ev, H_SETSIZE, 1000);
    el_set(el, EL_PROMPT, prompt_fn);
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_HIST, history, hist);
    el_set(el, EL_SIGNAL, 1);
    el_source(el, NULL);
    fprintf(stderr, "(/help lists the commands; Ctrl-D quits)\n");
    for (;;) {
        int count = 0;
        chat_interrupted = 0;
        const char *l = el_gets(el, &count);
        if (!l || count <= 0) {
            if (chat_interrupted || (count < 0 && errno == EINTR)) {
                fputc('\n', stdout);
                el_reset(el);
                continue;
            }
            break;
        }
        char *line = strdup(l);
        if (!line) break;
        if (line[0] && line[0] != '\n') history(hist, &ev, H_ENTER, line);
        handle_line(c, line, strlen(line));
        free(line);
    }
    fputc('\n', stdout);
    history_end(hist);
    el_end(el);
}

static void piped(struct chat *c) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (memchr(line, '\0', (size_t)n)) {
            fprintf(stderr, "sparrow: chat: an input line holds a NUL byte: skipped\n");
            c->failed = 1;
            continue;
        }
        handle_line(c, line, (size_t)n);
    }
    free(line);
}

/* ---- chat ------------------------------------------------------------------------------ */

int cmd_chat(int argc, char **argv) {
    struct argp a = {.cmd = "chat", .argc = argc, .argv = argv};
    const char *model_path = NULL, *tokenizer = NULL, *tmpl_name = NULL, *sys = NULL;
    struct chat c;
    memset(&c, 0, sizeof c);
    c.cp = sp_chat_default_params();
    gen_opts_init(&c.g);
    c.g.n_predict = -1;

    for (a.i = 1; a.i < argc; a.i++) {
        if (opt_is(&a, NULL, "--list-cache-types")) {
            opt_no_value(&a);
            return list_cache_types();
        } else if (opt_is(&a, "-h", "--help")) {
            help_chat(stdout);
            return EXIT_OK;
        } else if (opt_is(&a, "-m", "--model")) {
            model_path = opt_value(&a);
        } else if (opt_is(&a, "-sys", "--system-prompt")) {
            sys = opt_value(&a);
        } else if (opt_is(&a, NULL, "--chat-template")) {
            tmpl_name = opt_value(&a);
        } else if (opt_is(&a, NULL, "--jinja")) {
            opt_no_value(&a);
            c.cp.engine = SP_CHAT_JINJA;
        } else if (opt_is(&a, NULL, "--no-jinja")) {
            opt_no_value(&a);
            c.cp.engine = SP_CHAT_NAMED;
        } else if (opt_is(&a, NULL, "--json")) {
            opt_no_value(&a);
            c.json = true;
        } else if (gen_opt(&a, &c.g)) {
            /* -n, sampling, -t -c -b -ctk -ctv, --mem-budget, --context-shift, --keep, --prompt-cache */
        } else if (opt_is(&a, NULL, "--tokenizer")) {
            tokenizer = opt_value(&a);
        } else {
            last_opt(&a, "messages come on stdin");
        }
    }
    if (!model_path) usage_error(a.cmd, "-m MODEL is required (see 'sparrow chat --help')");
    if (tmpl_name) {
        const char *named = sp_chat_detect_template(tmpl_name);
        if (!named || strcmp(named, tmpl_name) != 0)
            usage_error(a.cmd, "unknown template name '%s' (see 'sparrow template --help' for the list)", tmpl_name);
        c.cp.tmpl = tmpl_name;
    }
    gov_opts_check(a.cmd, &c.g.gov);
    gen_opts_seed(&c.g);

    int ret = EXIT_RUNTIME;
    struct sp_governor *gov = NULL;
    sp_status rc;
    sp_log_set(cli_log, &log_verbose);
    rc = load_model(model_path, tokenizer, false, c.g.mem_budget, &c.g.sp, &c.model);
    if (rc != SP_OK) {
        ret = lib_error("loading the model", rc);
        goto done;
    }
    rc = sp_session_init(c.model, &c.g.sp, &c.sess);
    if (rc != SP_OK) {
        ret = lib_error("creating the session", rc);
        goto done;
    }
    if ((ret = gov_create(&c.g.gov, &gov)) != EXIT_OK) goto done;
    ret = EXIT_RUNTIME;
    if (gov && (rc = sp_session_set_governor(c.sess, gov)) != SP_OK) {
        ret = lib_error("attaching the governor", rc);
        goto done;
    }
    c.gov = gov;
    if (!c.cp.tmpl) {
        size_t len = 0;
        rc = sp_model_meta_str(c.model, "tokenizer.chat_template", NULL, 0, &len);
        if (rc != SP_OK && rc != SP_E_BUFFER) {
            c.plain = true;
            fprintf(stderr, "sparrow: chat: the model has no chat template (tokenizer.chat_template): plain "
                            "turns, each message on a line of its own (--chat-template NAME sets one)\n");
        }
    }
    c.sys = sys && *sys ? strdup(sys) : NULL;
    msgs_clear(&c);
    if (!c.plain) { /* a template that cannot run is said before the first message */
        struct sp_chat_message probe[2] = {{"system", "s"}, {"user", "u"}};
        struct sp_chat_params p = c.cp;
        size_t len = 0;
        rc = sp_chat_apply(c.model, &p, c.sys ? probe : probe + 1, c.sys ? 2 : 1, NULL, 0, &len);
        if (rc != SP_OK && rc != SP_E_BUFFER) {
            ret = lib_error("rendering the chat template", rc);
            goto done;
        }
    }
    if (!c.json)
        fprintf(stderr, "sparrow: chat: seed %llu, n_ctx %d, template %s\n", (unsigned long long)c.g.sp.seed,
                (int)sp_session_n_ctx(c.sess),
                c.plain ? "none" : c.cp.tmpl ? c.cp.tmpl : "the model's");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chat_on_sigint; /* no SA_RESTART: a read in progress returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sp_session_set_abort(c.sess, chat_abort, NULL);

    if (isatty(STDIN_FILENO) && !c.json) interactive(&c);
    else piped(&c);
    ret = c.failed ? EXIT_RUNTIME : EXIT_OK;

done:
    if (c.msgs) while (c.n_msgs) msgs_pop(&c);
    free(c.msgs);
    free(c.sys);
    free(c.render.p);
    free(c.answer.p);
    sp_session_free(c.sess);
    sp_governor_free(gov);
    sp_model_free(c.model);
    return ret;
}
