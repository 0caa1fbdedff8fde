/*
 * jinja_internal.h -- what the jinja_*.c files share and chat.c does not
 * see: tokens, the syntax tree, the interpreter's state and the builtin
 * tables.  Not a header for anything outside src/chat/jinja_*.c.
 */
#ifndef SP_CHAT_JINJA_INTERNAL_H
#define SP_CHAT_JINJA_INTERNAL_H

#include "chat/jinja.h"

/* ---- tokens (jinja_lex.c) -------------------------------------------------- */
enum sp_jtok_kind {
    SP_JT_EOF = 0,
    SP_JT_TEXT,        /* literal output text (s, n) after whitespace control */
    SP_JT_VAR_OPEN,    /* {{ */
    SP_JT_VAR_CLOSE,   /* }} */
    SP_JT_BLOCK_OPEN,  /* {% */
    SP_JT_BLOCK_CLOSE, /* %} */
    SP_JT_NAME,        /* s, n */
    SP_JT_STRING,      /* s, n: the unescaped value, in the program arena */
    SP_JT_INT,         /* i */
    SP_JT_FLOAT,       /* f */
    SP_JT_OP,          /* op */
};

enum sp_jop {
    SP_JOP_NONE = 0,
    SP_JOP_ADD, SP_JOP_SUB, SP_JOP_MUL, SP_JOP_DIV, SP_JOP_FLOORDIV, SP_JOP_MOD, SP_JOP_POW, SP_JOP_TILDE,
    SP_JOP_EQ, SP_JOP_NE, SP_JOP_LT, SP_JOP_LE, SP_JOP_GT, SP_JOP_GE,
    SP_JOP_ASSIGN, SP_JOP_LPAREN, SP_JOP_RPAREN, SP_JOP_LBRACKET, SP_JOP_RBRACKET, SP_JOP_LBRACE, SP_JOP_RBRACE,
    SP_JOP_COMMA, SP_JOP_DOT, SP_JOP_COLON, SP_JOP_PIPE,
    /* used by the tree only */
    SP_JOP_IN, SP_JOP_NOTIN, SP_JOP_AND, SP_JOP_OR, SP_JOP_NOT, SP_JOP_NEG, SP_JOP_POS,
    SP_JOP_COUNT
};

struct sp_jtok {
    uint8_t kind; /* enum sp_jtok_kind */
    uint8_t op;   /* enum sp_jop for SP_JT_OP */
    uint32_t line, col;
    const char *s;
    size_t n;
    int64_t i;
    double f;
};

struct sp_jtoks {
    struct sp_jtok *t;
    size_t n, cap;
};

/* Split src into tokens (strings unescaped into arena a).  False with err
 * set on a lexical error. */
bool sp_jinja_lex(const char *src, size_t len, struct sp_jarena *a, struct sp_jtoks *out,
                  struct sp_jinja_error *err);

/* ---- syntax tree (jinja_parse.c) ------------------------------------------- */
enum sp_jnode_kind {
    /* expressions */
    SP_JN_LIT = 0, /* lit */
    SP_JN_NAME,    /* str */
    SP_JN_ATTR,    /* a . str */
    SP_JN_ITEM,    /* a [ b ] */
    SP_JN_SLICE,   /* a [ kids[0] : kids[1] : kids[2] ] (NULL parts absent) */
    SP_JN_CALL,    /* a ( kids ; names = kids2 ) */
    SP_JN_FILTER,  /* a | str ( kids ; names = kids2 ); id = filter; a NULL in a filter block */
    SP_JN_TEST,    /* a is [not: op] str ( kids ); id = test */
    SP_JN_UNARY,   /* op a */
    SP_JN_BINARY,  /* a op b (arithmetic, comparison, in, and, or) */
    SP_JN_COND,    /* b if a else c (c may be NULL) */
    SP_JN_LIST,    /* [ kids ] */
    SP_JN_TUPLE,   /* ( kids ) */
    SP_JN_DICT,    /* { kids : kids2 } */
    /* statements */
    SP_JN_TEXT,    /* str */
    SP_JN_OUTPUT,  /* {{ a }} */
    SP_JN_IF,      /* if a: kids else kids2 */
    SP_JN_FOR,     /* for names in a [if b]: kids else kids2 */
    SP_JN_SET,     /* set names = a; or set ns.attr = a (c = NAME ns, str = attr) */
    SP_JN_SET_BLOCK, /* set str: kids captured (optional filter b) */
    SP_JN_MACRO,   /* macro str (names = kids2 defaults): kids */
    SP_JN_FILTER_BLOCK, /* filter b (an SP_JN_FILTER with a = NULL): kids */
    SP_JN_BREAK,
    SP_JN_CONTINUE,
    SP_JN_DO,      /* do a */
    SP_JN_BLOCK,   /* a plain body (generation blocks): kids */
    SP_JN_KIND_COUNT
};

struct sp_jnode {
    uint8_t kind; /* enum sp_jnode_kind */
    uint8_t op;   /* enum sp_jop; for TEST: 1 = negated */
    int16_t id;   /* filter / test id, -1 unknown */
    uint32_t line, col;
    struct sp_jnode *a, *b, *c;
    struct sp_jnode **kids;
    struct sp_jnode **kids2;
    const struct sp_jstr **names; /* kwarg names (CALL, FILTER), targets (FOR, SET), params (MACRO) */
    uint32_t n_kids, n_kids2, n_names;
    const struct sp_jstr *str;
    struct sp_jv lit;
};

struct sp_jinja_program {
    struct sp_jarena arena;
    struct sp_jnode *root; /* an SP_JN_BLOCK */
    struct sp_jinja_limits lim;
};

struct sp_jmacro {
    const struct sp_jnode *def; /* the SP_JN_MACRO node */
    struct sp_jscope *closure;  /* the scope it was defined in */
};

/* ---- interpreter (jinja_eval.c) --------------------------------------------- */
struct sp_jscope {
    struct sp_jscope *parent;
    struct sp_jdict *vars;
};

struct sp_jrt {
    struct sp_jinja_ctx *ctx;
    struct sp_jarena *a;     /* = &ctx->arena */
    struct sp_jbuf *out;     /* where output goes now (captures swap it) */
    struct sp_jscope *root;
    struct sp_jinja_error *err;
    bool failed;
    uint64_t iterations;
    uint64_t work;           /* items and bytes the builtins walked (see sp_jrt_charge) */
    uint32_t depth;
};

/* Record an error at node at (first one wins) and return false. */
bool sp_jrt_fail(struct sp_jrt *rt, const struct sp_jnode *at, sp_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An arena failure as an error at node at. */
bool sp_jrt_oom(struct sp_jrt *rt, const struct sp_jnode *at);

/* Evaluate an expression. */
bool sp_jrt_eval(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jv *out);
/* Call a callable value (macro or global function) with arguments. */
struct sp_jargs;
bool sp_jrt_call(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv fn, const struct sp_jargs *args,
                 struct sp_jv *out);
/* Count one loop iteration or macro call against the limit. */
bool sp_jrt_tick(struct sp_jrt *rt, const struct sp_jnode *at);
/* Charge work proportional to the size of what an operation walks (items
 * of a list or dict, bytes / 64 of a string), so that a loop inside the
 * iteration limit cannot spend unbounded time in builtins: the budget is
 * 256 x max_iterations.  The size of v, and v itself charged. */
bool sp_jrt_charge(struct sp_jrt *rt, const struct sp_jnode *at, uint64_t units);
uint64_t sp_jrt_size(struct sp_jv v);

/* str(v) as a new string value. */
bool sp_jrt_to_str(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv v, struct sp_jv *out);

/* ---- builtins (jinja_builtins.c) -------------------------------------------- */
struct sp_jargs {
    const struct sp_jv *pos;
    uint32_t n_pos;
    const struct sp_jstr *const *names; /* keyword names */
    const struct sp_jv *kw;
    uint32_t n_kw;
};

enum sp_jfunc {
    SP_JF_RANGE = 0, SP_JF_NAMESPACE, SP_JF_RAISE, SP_JF_DICT, SP_JF_STRFTIME, SP_JF_COUNT
};

/* Filter / test ids by name; -1 if unknown. */
int sp_jinja_filter_id(const char *name, size_t n);
int sp_jinja_test_id(const char *name, size_t n);
/* Global function id by name; -1 if none. */
int sp_jinja_func_id(const char *name, size_t n);

bool sp_jinja_filter(struct sp_jrt *rt, const struct sp_jnode *at, int id, struct sp_jv in,
                     const struct sp_jargs *args, struct sp_jv *out);
bool sp_jinja_test(struct sp_jrt *rt, const struct sp_jnode *at, int id, struct sp_jv in,
                   const struct sp_jargs *args, bool *result);
bool sp_jinja_func(struct sp_jrt *rt, const struct sp_jnode *at, int fn, const struct sp_jargs *args,
                   struct sp_jv *out);
/* recv.name(args): string, list, dict and loop methods.  *found false when
 * recv has no method of that name (then nothing else is done). */
bool sp_jinja_method(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv recv, const struct sp_jstr *name,
                     const struct sp_jargs *args, struct sp_jv *out, bool *found);

/* fmt % args as Python formats it (%s %r %d %i %f %e %g %x %o %c %%, flags,
 * width, precision; a dict for %(name)s; a list/tuple for several). */
bool sp_jinja_percent(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *fmt, struct sp_jv args,
                      struct sp_jv *out);

/* Python ordering of two values for sort/min/max/<: numbers with numbers,
 * strings with strings (bytewise, which is code-point order), lists
 * element-wise.  False (and an error at at) for values that do not order. */
bool sp_jrt_compare(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv a, struct sp_jv b, int *cmp);

/* Attribute / item lookup as Jinja does it (obj.name tries the key, then
 * nothing; obj[i] indexes lists and strings, negative from the end).
 * Missing gives undefined.  False only on an arena failure. */
bool sp_jrt_getitem(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv obj, struct sp_jv key,
                    struct sp_jv *out);

/* ---- UTF-8 helpers (jinja_value.c) --------------------------------------- */
/* Characters in s[0..n): the bytes that do not continue a UTF-8 sequence. */
size_t sp_jutf8_count(const char *s, size_t n);
/* Byte offset of character index ci (clamped to n). */
size_t sp_jutf8_offset(const char *s, size_t n, size_t ci);
/* The same for a string value: constant time when it is ASCII. */
static inline size_t sp_jstr_offset(const struct sp_jstr *s, size_t ci) {
    if (s->nchars == s->len) return ci < s->len ? ci : s->len;
    return sp_jutf8_offset(s->s, s->len, ci);
}

#endif /* SP_CHAT_JINJA_INTERNAL_H */
