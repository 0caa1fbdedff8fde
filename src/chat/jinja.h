/*
 * jinja.h -- a sandboxed interpreter for the subset of Jinja2 that chat
 * templates use (the `tokenizer.chat_template` programs of GGUF files), and
 * the values it computes with.  What the subset is, and its limits, is in
 * docs/CHAT.md; the reference semantics are Jinja2's with the settings
 * Hugging Face applies to chat templates (trim_blocks, lstrip_blocks, loop
 * controls, its own tojson).  No file, environment or network access exists
 * in the language as implemented: include/import/extends are refused.
 *
 * Files: jinja_lex.c (source -> tokens, whitespace control), jinja_parse.c
 * (tokens -> syntax tree), jinja_value.c (arena, values, JSON in and out,
 * Python-style str/repr), jinja_eval.c (the tree-walking interpreter),
 * jinja_builtins.c (filters, tests, methods, global functions).
 *
 * Memory: a program and a render context each own an arena; every value
 * lives in one of them and is freed with it, so there is no reference
 * counting and nothing a template does can leak.  Errors are reported in a
 * struct sp_jinja_error (line and column of the construct at fault), never
 * through sp_err(), so that a failed capability probe stays silent.
 */
#ifndef SP_CHAT_JINJA_H
#define SP_CHAT_JINJA_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits and errors --------------------------------------------------- */

/* Bounds that keep a hostile template from exhausting the device.  Zero
 * fields take the defaults (sp_jinja_default_limits). */
struct sp_jinja_limits {
    size_t max_output;       /* bytes of rendered text (also of any one captured block) */
    size_t max_memory;       /* bytes of values a render may allocate */
    uint64_t max_iterations; /* loop iterations and macro calls over the whole render */
    uint32_t max_depth;      /* nesting: syntax while parsing, evaluation and macro calls while rendering */
};
struct sp_jinja_limits sp_jinja_default_limits(void);
/* *lim (or nothing, when NULL) with every zero field set to its default. */
struct sp_jinja_limits sp_jinja_limits_or_default(const struct sp_jinja_limits *lim);

struct sp_jinja_error {
    sp_status st;     /* SP_E_FORMAT (syntax, runtime, limits), SP_E_UNSUPPORTED, SP_E_NOMEM */
    uint32_t line;    /* 1-based; 0 when the error has no position */
    uint32_t col;     /* 1-based, in characters (UTF-8 code points) */
    char msg[400];    /* without the position */
};

/* ---- arena --------------------------------------------------------------- */
struct sp_jarena_block;
struct sp_jarena {
    struct sp_jarena_block *head;
    size_t used;  /* bytes handed out, summed */
    size_t limit; /* 0 = none */
    bool over;    /* an allocation failed: out of memory or over the limit */
    bool nomem;   /* ... and it was the allocator's (not the limit's) */
};

/* 16-byte aligned memory valid until sp_jarena_free; NULL on failure (and
 * a->over is set).  n == 0 returns a valid pointer. */
void *sp_jarena_alloc(struct sp_jarena *a, size_t n);
void sp_jarena_free(struct sp_jarena *a);

/* ---- values -------------------------------------------------------------- */
enum sp_jv_type {
    SP_JV_UNDEF = 0, /* a name or key that does not exist (renders as "") */
    SP_JV_NONE,
    SP_JV_BOOL,
    SP_JV_INT,
    SP_JV_FLOAT,
    SP_JV_STR,
    SP_JV_LIST,      /* also tuples */
    SP_JV_DICT,      /* also namespace() and the loop object */
    SP_JV_FUNC,      /* a global function (range, namespace, ...) */
    SP_JV_MACRO,
    SP_JV_TYPE_COUNT
};

struct sp_jstr {
    size_t len;
    size_t nchars; /* characters: bytes that do not continue a UTF-8 sequence (== len for ASCII) */
    char s[];      /* len bytes and a NUL */
};

struct sp_jv;
struct sp_jlist {
    size_t n, cap;
    struct sp_jv *items;
};

enum { SP_JDICT_PLAIN = 0, SP_JDICT_NAMESPACE = 1, SP_JDICT_LOOP = 2 };
struct sp_jdict {
    size_t n, cap;
    struct sp_jv *keys; /* insertion order, as Python dicts */
    struct sp_jv *vals;
    int kind;           /* SP_JDICT_* */
};

struct sp_jmacro;
struct sp_jv {
    uint8_t type; /* enum sp_jv_type */
    union {
        bool b;
        int64_t i;
        double f;
        const struct sp_jstr *s;
        struct sp_jlist *l;
        struct sp_jdict *d;
        int fn; /* global function id */
        const struct sp_jmacro *m;
    } u;
};

static inline struct sp_jv sp_jv_undef(void) {
    return (struct sp_jv){.type = SP_JV_UNDEF};
}
static inline struct sp_jv sp_jv_none(void) {
    return (struct sp_jv){.type = SP_JV_NONE};
}
static inline struct sp_jv sp_jv_bool(bool b) {
    return (struct sp_jv){.type = SP_JV_BOOL, .u.b = b};
}
static inline struct sp_jv sp_jv_int(int64_t i) {
    return (struct sp_jv){.type = SP_JV_INT, .u.i = i};
}
static inline struct sp_jv sp_jv_float(double f) {
    return (struct sp_jv){.type = SP_JV_FLOAT, .u.f = f};
}
static inline struct sp_jv sp_jv_strv(const struct sp_jstr *s) {
    return (struct sp_jv){.type = SP_JV_STR, .u.s = s};
}

/* Constructors in arena a; NULL / false when the arena is exhausted. */
const struct sp_jstr *sp_jstr_new(struct sp_jarena *a, const char *s, size_t n);
bool sp_jv_str(struct sp_jarena *a, const char *s, size_t n, struct sp_jv *out);
struct sp_jlist *sp_jlist_new(struct sp_jarena *a, size_t cap);
bool sp_jlist_push(struct sp_jarena *a, struct sp_jlist *l, struct sp_jv v);
struct sp_jdict *sp_jdict_new(struct sp_jarena *a, size_t cap);
/* Insert or replace key k (compared by value equality). */
bool sp_jdict_set(struct sp_jarena *a, struct sp_jdict *d, struct sp_jv k, struct sp_jv v);
bool sp_jdict_set_str(struct sp_jarena *a, struct sp_jdict *d, const char *k, struct sp_jv v);
/* Index of key k, or -1. */
long sp_jdict_find(const struct sp_jdict *d, struct sp_jv k);
long sp_jdict_find_str(const struct sp_jdict *d, const char *k, size_t n);
/* Remove entry i (0 <= i < d->n), keeping the order of the others. */
void sp_jdict_remove(struct sp_jdict *d, size_t i);

/* Python truthiness and equality.  Equality is deep for lists and dicts and
 * stops (false) past depth levels of nesting (a cyclic value). */
bool sp_jv_truthy(struct sp_jv v);
bool sp_jv_equal(struct sp_jv a, struct sp_jv b, int depth);

/* A type name for messages: "string", "list", "undefined", ... */
const char *sp_jv_type_name(struct sp_jv v);

/* ---- text builders --------------------------------------------------------
 * A growable byte buffer on the heap (sp_realloc) with a size limit.  On
 * failure (allocation or limit) it stops growing and sets over / nomem; the
 * caller checks once at the end. */
struct sp_jbuf {
    char *p;
    size_t n, cap;
    size_t limit; /* 0 = none */
    bool over, nomem;
};
void sp_jbuf_put(struct sp_jbuf *b, const char *s, size_t n);
void sp_jbuf_putc(struct sp_jbuf *b, char c);
void sp_jbuf_printf(struct sp_jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sp_jbuf_free(struct sp_jbuf *b);

/* Python str(v) / repr(v) appended to b (lists and dicts print their items'
 * repr; True, False, None; floats as Python prints them).  False when the
 * value nests deeper than depth (a cycle). */
bool sp_jv_write_str(struct sp_jbuf *b, struct sp_jv v, int depth);
bool sp_jv_write_repr(struct sp_jbuf *b, struct sp_jv v, int depth);
/* A double as Python's repr prints it: "1.0", "0.1", "1e+16", "nan". */
void sp_jv_write_float(struct sp_jbuf *b, double f);

/* JSON as Python's json.dumps(v, ensure_ascii=False, indent=indent,
 * sort_keys=sort_keys) writes it (indent < 0: none, separators ", " and ": ";
 * otherwise "," and ": " with newlines).  Undefined writes null.  False for
 * a value JSON cannot hold (a macro, a function) or nesting past depth. */
bool sp_jv_write_json(struct sp_jbuf *b, struct sp_jv v, int indent, bool sort_keys, int depth);

/* Parse JSON text (RFC 8259; nesting at most 256) into a value in arena a.
 * Integers without fraction or exponent that fit int64 become SP_JV_INT,
 * other numbers SP_JV_FLOAT; duplicate keys keep the last value.  On error
 * returns false with err filled (position in the JSON text, prefixed by
 * what, e.g. "messages"). */
bool sp_jv_parse_json(struct sp_jarena *a, const char *text, size_t len, const char *what, struct sp_jv *out,
                      struct sp_jinja_error *err);

/* ---- programs and rendering ------------------------------------------------ */
struct sp_jinja_program;

/* Compile a template.  trim_blocks and lstrip_blocks are on, as for chat
 * templates.  Returns SP_OK and *out, or the error (also in *err, with the
 * line and column in the source): SP_E_FORMAT for a syntax error,
 * SP_E_UNSUPPORTED for a construct the subset lacks (include, call blocks),
 * SP_E_NOMEM. */
sp_status sp_jinja_parse(const char *src, size_t len, const struct sp_jinja_limits *lim,
                         struct sp_jinja_program **out, struct sp_jinja_error *err);
void sp_jinja_program_free(struct sp_jinja_program *p);

/* The variables one render sees, and the arena its values live in.  Build
 * it, set variables, render once, free.  (A render may change the values:
 * templates assign and append.) */
struct sp_jinja_ctx {
    struct sp_jarena arena;
    struct sp_jdict *vars;
    struct sp_jinja_limits lim;
    const struct sp_jstr *watch; /* a string whose use the render reports */
    bool watch_used;             /* it was read from a list, dict or variable */
};

/* Set up ctx (lim NULL = defaults).  False on out of memory. */
bool sp_jinja_ctx_init(struct sp_jinja_ctx *ctx, const struct sp_jinja_limits *lim);
void sp_jinja_ctx_free(struct sp_jinja_ctx *ctx);
bool sp_jinja_ctx_set(struct sp_jinja_ctx *ctx, const char *name, struct sp_jv v);

/* Render p with ctx's variables.  On SP_OK *out is a NUL-terminated
 * sp_malloc'd string of *len bytes (the caller frees it with sp_free).
 * Otherwise *out is NULL and *err says what and where (SP_E_FORMAT for
 * runtime errors, raise_exception and exceeded limits; SP_E_UNSUPPORTED for
 * unknown filters, tests and methods; SP_E_NOMEM). */
sp_status sp_jinja_render(const struct sp_jinja_program *p, struct sp_jinja_ctx *ctx, char **out, size_t *len,
                          struct sp_jinja_error *err);

#endif /* SP_CHAT_JINJA_H */
