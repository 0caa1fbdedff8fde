/*
 * chat.h -- chat templates below the public API: named formatters for the
 * template families llama.cpp recognises (named.c), and the pipeline that
 * turns a conversation into a prompt with either them or the Jinja
 * interpreter (chat.c).  api.c is the only caller; it supplies the model's
 * template, BOS/EOS text and vocabulary facts.
 */
#ifndef SP_CHAT_CHAT_H
#define SP_CHAT_CHAT_H

#include "chat/jinja.h"

/* One message as the named formatters see it (bytes, not NUL-terminated). */
struct sp_chat_msg {
    const char *role, *content;
    size_t role_len, content_len;
};

/* ---- named formatters (named.c) ------------------------------------------- */

/* Number of families and the name of family i (0 <= i < count), sorted. */
int sp_chat_named_count(void);
const char *sp_chat_named_name(int i);

/* The family named exactly name[0..n), or -1. */
int sp_chat_named_find(const char *name, size_t n);

/* The family whose formatter a template belongs to, recognised by
 * substrings of its Jinja source as llama.cpp's llm_chat_detect_template
 * does (an exact family name is accepted too); -1 if none. */
int sp_chat_named_detect(const char *tmpl, size_t n);

/* Append the conversation formatted by family fam to out (check out->over
 * afterwards).  add_ass: end with the opening of an assistant turn, where
 * the family has one. */
void sp_chat_named_apply(int fam, const struct sp_chat_msg *msgs, size_t n, bool add_ass, struct sp_jbuf *out);

/* ---- the pipeline (chat.c) --------------------------------------------------- */

struct sp_chat_request {
    const char *tmpl;          /* Jinja source or a family name (NUL-terminated) */
    bool use_jinja;            /* false: named formatters only */
    const struct sp_chat_message *msgs; /* used when messages_json is NULL */
    size_t n_msgs;
    const char *messages_json; /* a JSON array of message objects, or NULL */
    const char *vars_json;     /* a JSON object of extra variables, or NULL */
    const char *bos, *eos;     /* the text bos_token / eos_token stand for */
    bool add_assistant;        /* add_generation_prompt */
    bool strip_bos;            /* drop a leading bos text from the result */
    bool strip_eos;            /* drop a trailing eos text from the result */
    struct sp_jinja_limits lim;
};

/* Render the request.  On SP_OK *out is a NUL-terminated sp_malloc'd string
 * of *len bytes.  Errors go through sp_err with what and where:
 * SP_E_FORMAT (the template's line and column for syntax and runtime
 * errors, raise_exception, limits; bad messages or variables JSON),
 * SP_E_UNSUPPORTED (a construct or filter the interpreter lacks; with
 * use_jinja false, a template no named formatter recognises), SP_E_INVALID,
 * SP_E_NOMEM. */
sp_status sp_chat_render(const struct sp_chat_request *r, char **out, size_t *len);

#endif /* SP_CHAT_CHAT_H */
