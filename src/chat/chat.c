/*
 * chat.c -- a conversation + a template -> a prompt.  Two engines, chosen
 * as llama.cpp's --jinja / --no-jinja choose:
 *  - Jinja (the default): the template's own program runs in the sandboxed
 *    interpreter, with the variables chat templates expect (messages,
 *    bos_token, eos_token, add_generation_prompt, enable_thinking, and what
 *    the caller adds: tools, ...).  Before it runs, the messages get the
 *    adjustments llama.cpp makes (common/chat.cpp at the goldens' commit):
 *    a "developer" role becomes "system" unless the template is gpt-oss's,
 *    and when the template ignores a system message (a probe render with
 *    one shows its content is never read) the system text is merged into
 *    the next message as "<system>\n<next>".  A template that is exactly a
 *    family name uses that named formatter.
 *  - Named formatters (named.c): the family recognised from the template's
 *    text; a template none recognises is an error.
 * Content given as a list of parts ({"type": "text", "text": ...}) is
 * joined into one string with newlines first, for both engines.
 */
#include "chat/chat.h"

#include <stdio.h>

enum { JSON_DEPTH = 64 };

static sp_status report(const struct sp_jinja_error *e, const char *what) {
    if (e->line)
        return sp_err(e->st ? e->st : SP_E_FORMAT, "%s: line %u, column %u: %s", what, e->line, e->col, e->msg);
    return sp_err(e->st ? e->st : SP_E_FORMAT, "%s: %s", what, e->msg);
}

static sp_status nomem(void) {
    return sp_err(SP_E_NOMEM, "chat template: out of memory");
}

/* ---- messages as values --------------------------------------------------------- */

/* content parts joined as llama.cpp joins them: text parts with "\n" between */
static bool flatten_parts(struct sp_jarena *a, struct sp_jv parts, struct sp_jv *out) {
    struct sp_jbuf b = {0};
    for (size_t i = 0; i < parts.u.l->n; i++) {
        const struct sp_jv p = parts.u.l->items[i];
        if (p.type != SP_JV_DICT) continue;
        const long t = sp_jdict_find_str(p.u.d, "type", 4), x = sp_jdict_find_str(p.u.d, "text", 4);
        if (t < 0 || p.u.d->vals[t].type != SP_JV_STR || strcmp(p.u.d->vals[t].u.s->s, "text") != 0) continue;
        if (b.n) sp_jbuf_putc(&b, '\n');
        if (x >= 0 && p.u.d->vals[x].type == SP_JV_STR) sp_jbuf_put(&b, p.u.d->vals[x].u.s->s, p.u.d->vals[x].u.s->len);
    }
    const bool ok = !b.over && sp_jv_str(a, b.p ? b.p : "", b.n, out);
    sp_jbuf_free(&b);
    return ok;
}

/* The messages list: parsed from JSON, or built from the C array. */
static sp_status build_messages(const struct sp_chat_request *r, struct sp_jarena *a, struct sp_jlist **out) {
    struct sp_jinja_error e = {0};
    if (r->messages_json) {
        struct sp_jv v;
        if (!sp_jv_parse_json(a, r->messages_json, strlen(r->messages_json), "messages", &v, &e))
            return report(&e, "chat messages");
        if (v.type != SP_JV_LIST) return sp_err(SP_E_FORMAT, "chat messages: expected a JSON array of messages");
        for (size_t i = 0; i < v.u.l->n; i++) {
            struct sp_jv m = v.u.l->items[i];
            if (m.type != SP_JV_DICT) return sp_err(SP_E_FORMAT, "chat messages: message %zu is not an object", i);
            const long role = sp_jdict_find_str(m.u.d, "role", 4);
            if (role < 0 || m.u.d->vals[role].type != SP_JV_STR)
                return sp_err(SP_E_FORMAT, "chat messages: message %zu has no \"role\" string", i);
            const long c = sp_jdict_find_str(m.u.d, "content", 7);
            if (c >= 0 && m.u.d->vals[c].type == SP_JV_LIST && !flatten_parts(a, m.u.d->vals[c], &m.u.d->vals[c]))
                return nomem();
        }
        *out = v.u.l;
        return SP_OK;
    }
    struct sp_jlist *l = sp_jlist_new(a, r->n_msgs);
    if (!l) return nomem();
    for (size_t i = 0; i < r->n_msgs; i++) {
        const struct sp_chat_message *m = &r->msgs[i];
        if (!m->role) return sp_err(SP_E_INVALID, "chat messages: message %zu has no role", i);
        struct sp_jdict *d = sp_jdict_new(a, 2);
        struct sp_jv role, content;
        if (!d || !sp_jv_str(a, m->role, strlen(m->role), &role) ||
            !sp_jv_str(a, m->content ? m->content : "", m->content ? strlen(m->content) : 0, &content) ||
            !sp_jdict_set_str(a, d, "role", role) || !sp_jdict_set_str(a, d, "content", content))
            return nomem();
        l->items[l->n++] = (struct sp_jv){.type = SP_JV_DICT, .u.d = d};
    }
    *out = l;
    return SP_OK;
}

static const struct sp_jstr *msg_str(struct sp_jv m, const char *key) {
    if (m.type != SP_JV_DICT) return NULL;
    const long i = sp_jdict_find_str(m.u.d, key, strlen(key));
    return i >= 0 && m.u.d->vals[i].type == SP_JV_STR ? m.u.d->vals[i].u.s : NULL;
}

/* ---- the named path ------------------------------------------------------------------ */

static sp_status render_named(const struct sp_chat_request *r, int fam, struct sp_jbuf *out) {
    struct sp_jarena a = {.limit = r->lim.max_memory};
    struct sp_jlist *l = NULL;
    sp_status rc = build_messages(r, &a, &l);
    struct sp_chat_msg *msgs = NULL;
    if (rc == SP_OK && l->n && !(msgs = sp_calloc(l->n, sizeof *msgs))) rc = nomem();
    for (size_t i = 0; rc == SP_OK && i < l->n; i++) {
        const struct sp_jstr *role = msg_str(l->items[i], "role"), *content = msg_str(l->items[i], "content");
        msgs[i] = (struct sp_chat_msg){role->s, content ? content->s : "", role->len, content ? content->len : 0};
    }
    if (rc == SP_OK) sp_chat_named_apply(fam, msgs, l ? l->n : 0, r->add_assistant, out);
    sp_free(msgs);
    sp_jarena_free(&a);
    return rc;
}

/* ---- the Jinja path ------------------------------------------------------------------- */

/* Set the variables every render sees; extra (a JSON object) last, so the
 * caller can add or override them. */
static sp_status set_vars(const struct sp_chat_request *r, struct sp_jinja_ctx *ctx, struct sp_jlist *msgs,
                          const char *bos, const char *eos, bool probe) {
    struct sp_jarena *a = &ctx->arena;
    struct sp_jv s;
    if (!sp_jinja_ctx_set(ctx, "messages", (struct sp_jv){.type = SP_JV_LIST, .u.l = msgs}) ||
        !sp_jv_str(a, bos, strlen(bos), &s) || !sp_jinja_ctx_set(ctx, "bos_token", s) ||
        !sp_jv_str(a, eos, strlen(eos), &s) || !sp_jinja_ctx_set(ctx, "eos_token", s) ||
        !sp_jinja_ctx_set(ctx, "enable_thinking", sp_jv_bool(true)))
        return nomem();
    if (probe) {
        struct sp_jlist *tools = sp_jlist_new(a, 0);
        if (!tools || !sp_jinja_ctx_set(ctx, "tools", (struct sp_jv){.type = SP_JV_LIST, .u.l = tools})) return nomem();
    } else if (r->vars_json) {
        struct sp_jinja_error e = {0};
        struct sp_jv v;
        if (!sp_jv_parse_json(a, r->vars_json, strlen(r->vars_json), "variables", &v, &e))
            return report(&e, "chat template variables");
        if (v.type != SP_JV_DICT) return sp_err(SP_E_FORMAT, "chat template variables: expected a JSON object");
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!sp_jdict_set(a, ctx->vars, v.u.d->keys[i], v.u.d->vals[i])) return nomem();
    }
    if (!sp_jinja_ctx_set(ctx, "add_generation_prompt", sp_jv_bool(probe || r->add_assistant))) return nomem();
    return SP_OK;
}

/* Does the template read a system message's content?  Rendered once with a
 * system and a user message, as llama.cpp's capability check does; an
 * error in that render counts as "no" unless the content was read first. */
static bool reads_system(const struct sp_chat_request *r, const struct sp_jinja_program *p) {
    struct sp_jinja_ctx ctx;
    if (!sp_jinja_ctx_init(&ctx, &r->lim)) return true;
    struct sp_jarena *a = &ctx.arena;
    struct sp_jlist *msgs = sp_jlist_new(a, 2);
    static const char *const role[2] = {"system", "user"}, *const text[2] = {"System message", "User message"};
    bool ok = msgs != NULL;
    for (int i = 0; ok && i < 2; i++) {
        struct sp_jdict *d = sp_jdict_new(a, 2);
        struct sp_jv rv, cv;
        ok = d && sp_jv_str(a, role[i], strlen(role[i]), &rv) && sp_jv_str(a, text[i], strlen(text[i]), &cv) &&
             sp_jdict_set_str(a, d, "role", rv) && sp_jdict_set_str(a, d, "content", cv);
        if (ok) msgs->items[msgs->n++] = (struct sp_jv){.type = SP_JV_DICT, .u.d = d};
        if (ok && i == 0) ctx.watch = cv.u.s;
    }
    bool used = true;
    if (ok && set_vars(r, &ctx, msgs, "", "", true) == SP_OK) {
        char *out = NULL;
        size_t len;
        struct sp_jinja_error e;
        sp_jinja_render(p, &ctx, &out, &len, &e);
        sp_free(out);
        used = ctx.watch_used;
    }
    sp_jinja_ctx_free(&ctx);
    return used;
}

/* llama.cpp's workarounds on the messages before a Jinja render. */
static sp_status adjust_messages(const struct sp_chat_request *r, const struct sp_jinja_program *p, struct sp_jarena *a,
                                 struct sp_jlist *msgs) {
    if (!strstr(r->tmpl, "<|channel|>")) {
        for (size_t i = 0; i < msgs->n; i++) {
            const struct sp_jstr *role = msg_str(msgs->items[i], "role");
            struct sp_jv sys;
            if (role && strcmp(role->s, "developer") == 0 &&
                (!sp_jv_str(a, "system", 6, &sys) || !sp_jdict_set_str(a, msgs->items[i].u.d, "role", sys)))
                return nomem();
        }
    }
    const struct sp_jstr *role0 = msgs->n ? msg_str(msgs->items[0], "role") : NULL;
    if (!role0 || strcmp(role0->s, "system") != 0 || reads_system(r, p)) return SP_OK;
    if (msgs->n > 1 && msgs->items[1].type == SP_JV_DICT) {
        const struct sp_jstr *c0 = msg_str(msgs->items[0], "content"), *c1 = msg_str(msgs->items[1], "content");
        struct sp_jbuf b = {0};
        if (c0) sp_jbuf_put(&b, c0->s, c0->len);
        sp_jbuf_putc(&b, '\n');
        if (c1) sp_jbuf_put(&b, c1->s, c1->len);
        struct sp_jv merged;
        const bool ok = !b.over && sp_jv_str(a, b.p, b.n, &merged) &&
                        sp_jdict_set_str(a, msgs->items[1].u.d, "content", merged);
        sp_jbuf_free(&b);
        if (!ok) return nomem();
    }
    memmove(msgs->items, msgs->items + 1, (msgs->n - 1) * sizeof *msgs->items);
    msgs->n--;
    return SP_OK;
}

static sp_status render_jinja(const struct sp_chat_request *r, char **out, size_t *len) {
    struct sp_jinja_program *p = NULL;
    struct sp_jinja_error e;
    sp_status rc = sp_jinja_parse(r->tmpl, strlen(r->tmpl), &r->lim, &p, &e);
    if (rc != SP_OK) return report(&e, "chat template");
    struct sp_jinja_ctx ctx;
    if (!sp_jinja_ctx_init(&ctx, &r->lim)) {
        sp_jinja_program_free(p);
        return nomem();
    }
    struct sp_jlist *msgs = NULL;
    rc = build_messages(r, &ctx.arena, &msgs);
    if (rc == SP_OK) rc = adjust_messages(r, p, &ctx.arena, msgs);
    if (rc == SP_OK) rc = set_vars(r, &ctx, msgs, r->bos ? r->bos : "", r->eos ? r->eos : "", false);
    if (rc == SP_OK) {
        rc = sp_jinja_render(p, &ctx, out, len, &e);
        if (rc != SP_OK) rc = report(&e, "chat template");
    }
    sp_jinja_ctx_free(&ctx);
    sp_jinja_program_free(p);
    return rc;
}

/* Render r (see chat.h). */
sp_status sp_chat_render(const struct sp_chat_request *r, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!r->tmpl) return sp_err(SP_E_INVALID, "chat template: no template");
    const size_t tl = strlen(r->tmpl);
    int fam = sp_chat_named_find(r->tmpl, tl);
    if (fam < 0 && !r->use_jinja) {
        fam = sp_chat_named_detect(r->tmpl, tl);
        if (fam < 0)
            return sp_err(SP_E_UNSUPPORTED,
                          "chat template: no named formatter recognises this template (the Jinja interpreter "
                          "would run it)");
    }
    sp_status rc;
    if (fam >= 0) {
        struct sp_jbuf b = {.limit = r->lim.max_output};
        rc = render_named(r, fam, &b);
        if (rc == SP_OK && b.over)
            rc = b.nomem ? nomem() : sp_err(SP_E_FORMAT, "chat template: the prompt exceeds %zu bytes", r->lim.max_output);
        if (rc == SP_OK && !b.p && !(b.p = sp_calloc(1, 1))) rc = nomem();
        if (rc != SP_OK) {
            sp_jbuf_free(&b);
            return rc;
        }
        *out = b.p;
        *len = b.n;
    } else {
        rc = render_jinja(r, out, len);
        if (rc != SP_OK) return rc;
    }
    const size_t bl = r->bos ? strlen(r->bos) : 0, el = r->eos ? strlen(r->eos) : 0;
    if (r->strip_bos && bl && *len >= bl && memcmp(*out, r->bos, bl) == 0) {
        memmove(*out, *out + bl, *len - bl + 1);
        *len -= bl;
    }
    if (r->strip_eos && el && *len >= el && memcmp(*out + *len - el, r->eos, el) == 0) {
        *len -= el;
        (*out)[*len] = '\0';
    }
    return SP_OK;
}
