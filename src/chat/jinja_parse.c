/*
 * jinja_parse.c -- tokens -> syntax tree, by recursive descent with Jinja2's
 * grammar and operator precedence (lowest first):
 *   x if c else y;  or;  and;  not;  == != < <= > >= in, not in (chained);
 *   + -;  ~;  * / // %;  **;  unary - +;  then postfix .attr [i] [a:b:c] (args),
 *   and | filter, is test, (args) after those.
 * Statements: if/elif/else, for (target lists, an inline if, else), set
 * (names, tuples, namespace attributes, blocks), macro, filter blocks,
 * break/continue, do, generation and block bodies.  Every node keeps the
 * line and column of the token that began it; nesting is bounded.
 */
#include "chat/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>

struct ps {
    const struct sp_jtok *t;
    size_t n, i;
    struct sp_jarena *a;
    struct sp_jinja_error *err;
    uint32_t depth, max_depth;
    uint32_t loops; /* enclosing for loops (break/continue are valid inside) */
    bool failed;
};

static bool fail_at(struct ps *p, const struct sp_jtok *t, sp_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool fail_at(struct ps *p, const struct sp_jtok *t, sp_status st, const char *fmt, ...) {
    if (p->failed) return false;
    p->failed = true;
    p->err->st = p->a->nomem ? SP_E_NOMEM : st;
    p->err->line = t->line;
    p->err->col = t->col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
    va_end(ap);
    return false;
}

static const struct sp_jtok *cur(const struct ps *p) {
    return &p->t[p->i < p->n ? p->i : p->n - 1];
}
static const struct sp_jtok *peek(const struct ps *p, size_t k) {
    return &p->t[p->i + k < p->n ? p->i + k : p->n - 1];
}
static void next(struct ps *p) {
    if (p->i + 1 < p->n) p->i++;
}

static bool is_op(const struct sp_jtok *t, int op) {
    return t->kind == SP_JT_OP && t->op == op;
}
static bool is_kw(const struct sp_jtok *t, const char *w) {
    return t->kind == SP_JT_NAME && t->n == strlen(w) && memcmp(t->s, w, t->n) == 0;
}

/* "'foo'", "end of template", "'%}'" */
static const char *desc(const struct sp_jtok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case SP_JT_EOF: return "end of template";
    case SP_JT_TEXT: return "text";
    case SP_JT_VAR_OPEN: return "'{{'";
    case SP_JT_VAR_CLOSE: return "'}}'";
    case SP_JT_BLOCK_OPEN: return "'{%'";
    case SP_JT_BLOCK_CLOSE: return "'%}'";
    case SP_JT_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    case SP_JT_STRING: return "a string";
    case SP_JT_INT: case SP_JT_FLOAT: return "a number";
    default: return "an operator";
    }
}

static bool unexpected(struct ps *p, const char *wanted) {
    char b[64];
    return fail_at(p, cur(p), SP_E_FORMAT, "expected %s, found %s", wanted, desc(cur(p), b, sizeof b));
}

static bool expect_op(struct ps *p, int op, const char *what) {
    if (!is_op(cur(p), op)) return unexpected(p, what);
    next(p);
    return true;
}

static bool expect_close(struct ps *p) {
    if (cur(p)->kind != SP_JT_BLOCK_CLOSE) return unexpected(p, "'%}'");
    next(p);
    return true;
}

static struct sp_jnode *node(struct ps *p, int kind, const struct sp_jtok *at) {
    struct sp_jnode *n = sp_jarena_alloc(p->a, sizeof *n);
    if (!n) {
        fail_at(p, at, SP_E_NOMEM, "out of memory");
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->id = -1;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static const struct sp_jstr *tok_str(struct ps *p, const struct sp_jtok *t) {
    const struct sp_jstr *s = sp_jstr_new(p->a, t->s, t->n);
    if (!s) fail_at(p, t, SP_E_NOMEM, "out of memory");
    return s;
}

/* Growable pointer arrays in the arena. */
struct nvec {
    struct sp_jnode **p;
    uint32_t n, cap;
};
struct svec {
    const struct sp_jstr **p;
    uint32_t n, cap;
};

/* elems with room for one more than n (doubling into a new arena block,
 * the old contents copied); NULL on failure. */
static void *grow(struct ps *p, void *elems, uint32_t n, uint32_t *cap, size_t elem) {
    if (n < *cap) return elems;
    const uint32_t nc = *cap ? *cap * 2 : 4;
    void *q = sp_jarena_alloc(p->a, nc * elem);
    if (!q) {
        fail_at(p, cur(p), SP_E_NOMEM, "out of memory");
        return NULL;
    }
    if (n) memcpy(q, elems, n * elem);
    *cap = nc;
    return q;
}

static bool nvec_push(struct ps *p, struct nvec *v, struct sp_jnode *x) {
    struct sp_jnode **q = grow(p, v->p, v->n, &v->cap, sizeof *q);
    if (!q) return false;
    v->p = q;
    v->p[v->n++] = x;
    return true;
}

static bool svec_push(struct ps *p, struct svec *v, const struct sp_jstr *x) {
    const struct sp_jstr **q = grow(p, (void *)v->p, v->n, &v->cap, sizeof *q);
    if (!q) return false;
    v->p = q;
    v->p[v->n++] = x;
    return true;
}

static bool enter(struct ps *p) {
    if (++p->depth > p->max_depth)
        return fail_at(p, cur(p), SP_E_FORMAT, "nested more than %u levels deep", p->max_depth);
    return true;
}

/* ---- expressions -------------------------------------------------------------- */

static struct sp_jnode *parse_expr(struct ps *p, bool with_cond);
static struct sp_jnode *parse_unary(struct ps *p, bool with_filter);
static struct sp_jnode *parse_primary(struct ps *p);
static struct sp_jnode *parse_postfix(struct ps *p, struct sp_jnode *n);

static struct sp_jnode *binary(struct ps *p, const struct sp_jtok *at, int op, struct sp_jnode *l, struct sp_jnode *r) {
    struct sp_jnode *n = node(p, SP_JN_BINARY, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

/* ( args ) after the '(' : positional expressions, then name=value pairs. */
static bool parse_args(struct ps *p, struct sp_jnode *n) {
    struct nvec pos = {0}, kw = {0};
    struct svec names = {0};
    next(p); /* ( */
    while (!is_op(cur(p), SP_JOP_RPAREN)) {
        if (cur(p)->kind == SP_JT_NAME && is_op(peek(p, 1), SP_JOP_ASSIGN)) {
            const struct sp_jstr *name = tok_str(p, cur(p));
            if (!name) return false;
            next(p);
            next(p);
            struct sp_jnode *v = parse_expr(p, true);
            if (!v || !svec_push(p, &names, name) || !nvec_push(p, &kw, v)) return false;
        } else {
            if (kw.n) return fail_at(p, cur(p), SP_E_FORMAT, "a positional argument follows a keyword argument");
            if (is_op(cur(p), SP_JOP_MUL) || is_op(cur(p), SP_JOP_POW))
                return fail_at(p, cur(p), SP_E_UNSUPPORTED, "*args and **kwargs are not supported");
            struct sp_jnode *v = parse_expr(p, true);
            if (!v || !nvec_push(p, &pos, v)) return false;
        }
        if (is_op(cur(p), SP_JOP_COMMA)) {
            next(p);
            continue;
        }
        if (!is_op(cur(p), SP_JOP_RPAREN)) return unexpected(p, "',' or ')'");
    }
    next(p);
    n->kids = pos.p;
    n->n_kids = pos.n;
    n->kids2 = kw.p;
    n->n_kids2 = kw.n;
    n->names = names.p;
    n->n_names = names.n;
    return true;
}

/* | name[.name...][(args)] applied to in (NULL in a filter block). */
static struct sp_jnode *parse_filter(struct ps *p, struct sp_jnode *in) {
    const struct sp_jtok *at = cur(p);
    if (at->kind != SP_JT_NAME) {
        unexpected(p, "a filter name");
        return NULL;
    }
    struct sp_jnode *f = node(p, SP_JN_FILTER, at);
    if (!f || !(f->str = tok_str(p, at))) return NULL;
    next(p);
    f->a = in;
    f->id = (int16_t)sp_jinja_filter_id(f->str->s, f->str->len);
    if (is_op(cur(p), SP_JOP_LPAREN) && !parse_args(p, f)) return NULL;
    return f;
}

static struct sp_jnode *parse_test(struct ps *p, struct sp_jnode *in) {
    const struct sp_jtok *is = cur(p);
    next(p); /* is */
    bool neg = false;
    if (is_kw(cur(p), "not")) {
        neg = true;
        next(p);
    }
    const struct sp_jtok *at = cur(p);
    if (at->kind != SP_JT_NAME) {
        unexpected(p, "a test name");
        return NULL;
    }
    struct sp_jnode *t = node(p, SP_JN_TEST, is);
    if (!t || !(t->str = tok_str(p, at))) return NULL;
    /* "none", "true", "false" name tests, not literals */
    next(p);
    t->a = in;
    t->op = neg;
    t->id = (int16_t)sp_jinja_test_id(t->str->s, t->str->len);
    const struct sp_jtok *c = cur(p);
    if (is_op(c, SP_JOP_LPAREN)) {
        if (!parse_args(p, t)) return NULL;
    } else if ((c->kind == SP_JT_NAME || c->kind == SP_JT_STRING || c->kind == SP_JT_INT || c->kind == SP_JT_FLOAT ||
                is_op(c, SP_JOP_LBRACKET) || is_op(c, SP_JOP_LBRACE)) &&
               !is_kw(c, "else") && !is_kw(c, "or") && !is_kw(c, "and") && !is_kw(c, "if") && !is_kw(c, "in") &&
               !is_kw(c, "not") && !is_kw(c, "is") && !is_kw(c, "recursive")) {
        /* one argument without parentheses: x is divisibleby 3, x is sameas none */
        struct sp_jnode *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg))) return NULL;
        t->kids = sp_jarena_alloc(p->a, sizeof *t->kids);
        if (!t->kids) {
            fail_at(p, c, SP_E_NOMEM, "out of memory");
            return NULL;
        }
        t->kids[0] = arg;
        t->n_kids = 1;
    }
    return t;
}

/* [ ... ] after obj: an index or a slice. */
static struct sp_jnode *parse_subscript(struct ps *p, struct sp_jnode *obj) {
    const struct sp_jtok *at = cur(p);
    next(p); /* [ */
    struct sp_jnode *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(cur(p), SP_JOP_COLON) && !is_op(cur(p), SP_JOP_RBRACKET)) {
            if (!(parts[np] = parse_expr(p, true))) return NULL;
        }
        if (is_op(cur(p), SP_JOP_COLON) && np < 2) {
            slice = true;
            np++;
            next(p);
            continue;
        }
        break;
    }
    if (!expect_op(p, SP_JOP_RBRACKET, "']'")) return NULL;
    if (!slice) {
        if (!parts[0]) {
            fail_at(p, at, SP_E_FORMAT, "empty subscript");
            return NULL;
        }
        struct sp_jnode *n = node(p, SP_JN_ITEM, at);
        if (!n) return NULL;
        n->a = obj;
        n->b = parts[0];
        return n;
    }
    struct sp_jnode *n = node(p, SP_JN_SLICE, at);
    if (!n || !(n->kids = sp_jarena_alloc(p->a, 3 * sizeof *n->kids))) {
        fail_at(p, at, SP_E_NOMEM, "out of memory");
        return NULL;
    }
    n->a = obj;
    for (int i = 0; i < 3; i++) n->kids[i] = parts[i];
    n->n_kids = 3;
    return n;
}

static struct sp_jnode *parse_postfix(struct ps *p, struct sp_jnode *n) {
    while (n) {
        const struct sp_jtok *t = cur(p);
        if (is_op(t, SP_JOP_DOT)) {
            next(p);
            const struct sp_jtok *name = cur(p);
            if (name->kind == SP_JT_INT) { /* x.0 */
                struct sp_jnode *it = node(p, SP_JN_ITEM, t), *lit = node(p, SP_JN_LIT, name);
                if (!it || !lit) return NULL;
                lit->lit = sp_jv_int(name->i);
                it->a = n;
                it->b = lit;
                next(p);
                n = it;
                continue;
            }
            if (name->kind != SP_JT_NAME) {
                unexpected(p, "an attribute name");
                return NULL;
            }
            struct sp_jnode *at = node(p, SP_JN_ATTR, t);
            if (!at || !(at->str = tok_str(p, name))) return NULL;
            at->a = n;
            next(p);
            n = at;
        } else if (is_op(t, SP_JOP_LBRACKET)) {
            n = parse_subscript(p, n);
        } else if (is_op(t, SP_JOP_LPAREN)) {
            struct sp_jnode *c = node(p, SP_JN_CALL, t);
            if (!c) return NULL;
            c->a = n;
            c->line = n->line; /* a call is reported where its callee starts */
            c->col = n->col;
            if (!parse_args(p, c)) return NULL;
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static struct sp_jnode *parse_filter_expr(struct ps *p, struct sp_jnode *n) {
    while (n) {
        const struct sp_jtok *t = cur(p);
        if (is_op(t, SP_JOP_PIPE)) {
            next(p);
            n = parse_filter(p, n);
        } else if (is_kw(t, "is")) {
            n = parse_test(p, n);
        } else if (is_op(t, SP_JOP_LPAREN)) {
            struct sp_jnode *c = node(p, SP_JN_CALL, t);
            if (!c) return NULL;
            c->a = n;
            c->line = n->line; /* a call is reported where its callee starts */
            c->col = n->col;
            if (!parse_args(p, c)) return NULL;
            n = c;
        } else {
            break;
        }
    }
    return n;
}

/* Items of a list, tuple or dict literal up to the closing op. */
static struct sp_jnode *parse_seq(struct ps *p, int kind, int close, const struct sp_jtok *at) {
    struct sp_jnode *n = node(p, kind, at);
    struct nvec items = {0}, vals = {0};
    if (!n) return NULL;
    while (!is_op(cur(p), close)) {
        struct sp_jnode *k = parse_expr(p, true);
        if (!k || !nvec_push(p, &items, k)) return NULL;
        if (kind == SP_JN_DICT) {
            if (!expect_op(p, SP_JOP_COLON, "':'")) return NULL;
            struct sp_jnode *v = parse_expr(p, true);
            if (!v || !nvec_push(p, &vals, v)) return NULL;
        }
        if (is_op(cur(p), SP_JOP_COMMA)) {
            next(p);
            continue;
        }
        if (!is_op(cur(p), close)) {
            unexpected(p, close == SP_JOP_RBRACKET ? "',' or ']'" : close == SP_JOP_RBRACE ? "',' or '}'" : "',' or ')'");
            return NULL;
        }
    }
    next(p);
    n->kids = items.p;
    n->n_kids = items.n;
    n->kids2 = vals.p;
    n->n_kids2 = vals.n;
    return n;
}

static struct sp_jnode *parse_primary(struct ps *p) {
    const struct sp_jtok *t = cur(p);
    if (!enter(p)) return NULL;
    struct sp_jnode *n = NULL;
    if (t->kind == SP_JT_NAME) {
        static const struct {
            const char *w;
            uint8_t type;
            bool b;
        } lits[] = {{"true", SP_JV_BOOL, true},   {"True", SP_JV_BOOL, true}, {"false", SP_JV_BOOL, false},
                    {"False", SP_JV_BOOL, false}, {"none", SP_JV_NONE, 0},    {"None", SP_JV_NONE, 0}};
        for (size_t i = 0; i < SP_ARRAY_LEN(lits); i++) {
            if (is_kw(t, lits[i].w)) {
                if (!(n = node(p, SP_JN_LIT, t))) return NULL;
                n->lit = lits[i].type == SP_JV_BOOL ? sp_jv_bool(lits[i].b) : sp_jv_none();
                next(p);
                p->depth--;
                return n;
            }
        }
        if (!(n = node(p, SP_JN_NAME, t)) || !(n->str = tok_str(p, t))) return NULL;
        next(p);
    } else if (t->kind == SP_JT_STRING) {
        /* adjacent literals concatenate: 'a' 'b' */
        size_t len = 0, k = p->i;
        while (k < p->n && p->t[k].kind == SP_JT_STRING) len += p->t[k++].n;
        char *buf = sp_jarena_alloc(p->a, len + 1);
        if (!buf || !(n = node(p, SP_JN_LIT, t))) {
            fail_at(p, t, SP_E_NOMEM, "out of memory");
            return NULL;
        }
        size_t o = 0;
        for (; p->i < k; p->i++) {
            memcpy(buf + o, p->t[p->i].s, p->t[p->i].n);
            o += p->t[p->i].n;
        }
        if (!sp_jv_str(p->a, buf, len, &n->lit)) {
            fail_at(p, t, SP_E_NOMEM, "out of memory");
            return NULL;
        }
    } else if (t->kind == SP_JT_INT || t->kind == SP_JT_FLOAT) {
        if (!(n = node(p, SP_JN_LIT, t))) return NULL;
        n->lit = t->kind == SP_JT_INT ? sp_jv_int(t->i) : sp_jv_float(t->f);
        next(p);
    } else if (is_op(t, SP_JOP_LPAREN)) {
        next(p);
        if (is_op(cur(p), SP_JOP_RPAREN)) {
            next(p);
            n = node(p, SP_JN_TUPLE, t);
        } else {
            struct sp_jnode *e = parse_expr(p, true);
            if (!e) return NULL;
            if (is_op(cur(p), SP_JOP_COMMA)) {
                next(p);
                struct sp_jnode *rest = parse_seq(p, SP_JN_TUPLE, SP_JOP_RPAREN, t);
                if (!rest) return NULL;
                struct sp_jnode **kids = sp_jarena_alloc(p->a, (rest->n_kids + 1) * sizeof *kids);
                if (!kids) {
                    fail_at(p, t, SP_E_NOMEM, "out of memory");
                    return NULL;
                }
                kids[0] = e;
                if (rest->n_kids) memcpy(kids + 1, rest->kids, rest->n_kids * sizeof *kids);
                rest->kids = kids;
                rest->n_kids++;
                n = rest;
            } else {
                if (!expect_op(p, SP_JOP_RPAREN, "')'")) return NULL;
                n = e;
            }
        }
    } else if (is_op(t, SP_JOP_LBRACKET)) {
        next(p);
        n = parse_seq(p, SP_JN_LIST, SP_JOP_RBRACKET, t);
    } else if (is_op(t, SP_JOP_LBRACE)) {
        next(p);
        n = parse_seq(p, SP_JN_DICT, SP_JOP_RBRACE, t);
    } else {
        unexpected(p, "an expression");
        return NULL;
    }
    p->depth--;
    return n;
}

static struct sp_jnode *parse_unary(struct ps *p, bool with_filter) {
    const struct sp_jtok *t = cur(p);
    struct sp_jnode *n;
    if (!enter(p)) return NULL;
    if (is_op(t, SP_JOP_SUB) || is_op(t, SP_JOP_ADD)) {
        next(p);
        struct sp_jnode *e = parse_unary(p, false);
        if (!e || !(n = node(p, SP_JN_UNARY, t))) return NULL;
        n->op = is_op(t, SP_JOP_SUB) ? SP_JOP_NEG : SP_JOP_POS;
        n->a = e;
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

/* The arithmetic levels, loosest first: + -, ~, * / // %, **; each is a
 * left-associative chain of the next (the last of unary expressions). */
static const uint8_t k_arith[4][4] = {
    {SP_JOP_ADD, SP_JOP_SUB}, {SP_JOP_TILDE}, {SP_JOP_MUL, SP_JOP_DIV, SP_JOP_FLOORDIV, SP_JOP_MOD}, {SP_JOP_POW}};

static bool at_level(const struct sp_jtok *t, int level) {
    for (int k = 0; k < 4 && k_arith[level][k]; k++)
        if (is_op(t, k_arith[level][k])) return true;
    return false;
}

static struct sp_jnode *parse_arith(struct ps *p, int level) {
    struct sp_jnode *l = level == 3 ? parse_unary(p, true) : parse_arith(p, level + 1);
    while (l && at_level(cur(p), level)) {
        const struct sp_jtok *t = cur(p);
        next(p);
        struct sp_jnode *r = level == 3 ? parse_unary(p, true) : parse_arith(p, level + 1);
        l = r ? binary(p, t, t->op, l, r) : NULL;
    }
    return l;
}

/* Comparisons; a chain a < b < c becomes (a < b) and (b < c). */
static struct sp_jnode *parse_compare(struct ps *p) {
    struct sp_jnode *l = parse_arith(p, 0), *result = NULL;
    if (!l) return NULL;
    for (;;) {
        const struct sp_jtok *t = cur(p);
        int op;
        if (t->kind == SP_JT_OP && t->op >= SP_JOP_EQ && t->op <= SP_JOP_GE) {
            op = t->op;
            next(p);
        } else if (is_kw(t, "in")) {
            op = SP_JOP_IN;
            next(p);
        } else if (is_kw(t, "not") && is_kw(peek(p, 1), "in")) {
            op = SP_JOP_NOTIN;
            next(p);
            next(p);
        } else {
            break;
        }
        struct sp_jnode *r = parse_arith(p, 0);
        if (!r) return NULL;
        struct sp_jnode *c = binary(p, t, op, l, r);
        if (!c) return NULL;
        result = result ? binary(p, t, SP_JOP_AND, result, c) : c;
        if (!result) return NULL;
        l = r;
    }
    return result ? result : l;
}

static struct sp_jnode *parse_not(struct ps *p) {
    const struct sp_jtok *t = cur(p);
    if (is_kw(t, "not")) {
        if (!enter(p)) return NULL;
        next(p);
        struct sp_jnode *e = parse_not(p), *n;
        if (!e || !(n = node(p, SP_JN_UNARY, t))) return NULL;
        n->op = SP_JOP_NOT;
        n->a = e;
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

/* a and b and ...  (is_or false) / a or b or ...  (is_or true) */
static struct sp_jnode *parse_logic(struct ps *p, bool is_or) {
    const char *kw = is_or ? "or" : "and";
    struct sp_jnode *l = is_or ? parse_logic(p, false) : parse_not(p);
    while (l && is_kw(cur(p), kw)) {
        const struct sp_jtok *t = cur(p);
        next(p);
        struct sp_jnode *r = is_or ? parse_logic(p, false) : parse_not(p);
        l = r ? binary(p, t, is_or ? SP_JOP_OR : SP_JOP_AND, l, r) : NULL;
    }
    return l;
}

/* An expression; with_cond allows "x if c else y" (not in a for's iterable,
 * whose "if" filters the loop). */
static struct sp_jnode *parse_expr(struct ps *p, bool with_cond) {
    if (!enter(p)) return NULL;
    struct sp_jnode *e = parse_logic(p, true);
    while (e && with_cond && is_kw(cur(p), "if")) {
        const struct sp_jtok *t = cur(p);
        next(p);
        struct sp_jnode *c = parse_logic(p, true), *n;
        if (!c || !(n = node(p, SP_JN_COND, t))) return NULL;
        n->a = c;
        n->b = e;
        if (is_kw(cur(p), "else")) {
            next(p);
            if (!(n->c = parse_expr(p, true))) return NULL;
        }
        e = n;
    }
    p->depth--;
    return e;
}

/* An expression, or several separated by commas (an implicit tuple). */
static struct sp_jnode *parse_tuple(struct ps *p, bool with_cond) {
    const struct sp_jtok *at = cur(p);
    struct sp_jnode *e = parse_expr(p, with_cond);
    if (!e || !is_op(cur(p), SP_JOP_COMMA)) return e;
    struct nvec items = {0};
    if (!nvec_push(p, &items, e)) return NULL;
    while (is_op(cur(p), SP_JOP_COMMA)) {
        next(p);
        if (cur(p)->kind == SP_JT_BLOCK_CLOSE || cur(p)->kind == SP_JT_VAR_CLOSE) break;
        if (!(e = parse_expr(p, with_cond)) || !nvec_push(p, &items, e)) return NULL;
    }
    struct sp_jnode *t = node(p, SP_JN_TUPLE, at);
    if (!t) return NULL;
    t->kids = items.p;
    t->n_kids = items.n;
    return t;
}

/* ---- statements ------------------------------------------------------------------ */

static struct sp_jnode *parse_body(struct ps *p, const char *const *ends, int n_ends, int *which,
                                   const struct sp_jtok *opened, const char *what);

/* Target names: a, b  or  (a, b). */
static bool parse_targets(struct ps *p, struct svec *names) {
    const bool paren = is_op(cur(p), SP_JOP_LPAREN);
    if (paren) next(p);
    for (;;) {
        if (cur(p)->kind != SP_JT_NAME) return unexpected(p, "a variable name");
        const struct sp_jstr *s = tok_str(p, cur(p));
        if (!s || !svec_push(p, names, s)) return false;
        next(p);
        if (!is_op(cur(p), SP_JOP_COMMA)) break;
        next(p);
    }
    if (paren && !expect_op(p, SP_JOP_RPAREN, "')'")) return false;
    return true;
}

static const char *const k_if_ends[] = {"elif", "else", "endif"};

/* After "if"/"elif": the condition, the body, and whatever follows. */
static struct sp_jnode *parse_if(struct ps *p, const struct sp_jtok *at) {
    struct sp_jnode *n = node(p, SP_JN_IF, at);
    if (!n || !(n->a = parse_expr(p, true)) || !expect_close(p)) return NULL;
    int which;
    struct sp_jnode *body = parse_body(p, k_if_ends, 3, &which, at, "if");
    if (!body) return NULL;
    n->kids = body->kids;
    n->n_kids = body->n_kids;
    if (which == 0) { /* elif: a nested if as the else branch */
        const struct sp_jtok *et = &p->t[p->i - 1];
        struct sp_jnode *e = parse_if(p, et);
        if (!e || !(n->kids2 = sp_jarena_alloc(p->a, sizeof *n->kids2))) return NULL;
        n->kids2[0] = e;
        n->n_kids2 = 1;
        return n;
    }
    if (!expect_close(p)) return NULL;
    if (which == 1) {
        static const char *const ends[] = {"endif"};
        struct sp_jnode *els = parse_body(p, ends, 1, &which, at, "if");
        if (!els || !expect_close(p)) return NULL;
        n->kids2 = els->kids;
        n->n_kids2 = els->n_kids;
    }
    return n;
}

static struct sp_jnode *parse_for(struct ps *p, const struct sp_jtok *at) {
    struct sp_jnode *n = node(p, SP_JN_FOR, at);
    struct svec names = {0};
    if (!n || !parse_targets(p, &names)) return NULL;
    n->names = names.p;
    n->n_names = names.n;
    if (!is_kw(cur(p), "in")) {
        unexpected(p, "'in'");
        return NULL;
    }
    next(p);
    if (!(n->a = parse_tuple(p, false))) return NULL;
    if (is_kw(cur(p), "if")) {
        next(p);
        if (!(n->b = parse_expr(p, true))) return NULL;
    }
    if (is_kw(cur(p), "recursive")) {
        fail_at(p, cur(p), SP_E_UNSUPPORTED, "recursive loops are not supported");
        return NULL;
    }
    if (!expect_close(p)) return NULL;
    static const char *const ends[] = {"else", "endfor"};
    int which;
    p->loops++;
    struct sp_jnode *body = parse_body(p, ends, 2, &which, at, "for");
    p->loops--;
    if (!body || !expect_close(p)) return NULL;
    n->kids = body->kids;
    n->n_kids = body->n_kids;
    if (which == 0) {
        struct sp_jnode *els = parse_body(p, ends + 1, 1, &which, at, "for");
        if (!els || !expect_close(p)) return NULL;
        n->kids2 = els->kids;
        n->n_kids2 = els->n_kids;
    }
    return n;
}

static struct sp_jnode *parse_set(struct ps *p, const struct sp_jtok *at) {
    if (cur(p)->kind == SP_JT_NAME && is_op(peek(p, 1), SP_JOP_DOT)) { /* set ns.attr = value */
        struct sp_jnode *n = node(p, SP_JN_SET, at), *ns = node(p, SP_JN_NAME, cur(p));
        if (!n || !ns || !(ns->str = tok_str(p, cur(p)))) return NULL;
        next(p);
        next(p);
        if (cur(p)->kind != SP_JT_NAME) {
            unexpected(p, "an attribute name");
            return NULL;
        }
        if (!(n->str = tok_str(p, cur(p)))) return NULL;
        next(p);
        n->c = ns;
        if (!expect_op(p, SP_JOP_ASSIGN, "'='") || !(n->a = parse_tuple(p, true)) || !expect_close(p)) return NULL;
        return n;
    }
    struct svec names = {0};
    if (!parse_targets(p, &names)) return NULL;
    if (is_op(cur(p), SP_JOP_ASSIGN)) {
        next(p);
        struct sp_jnode *n = node(p, SP_JN_SET, at);
        if (!n || !(n->a = parse_tuple(p, true)) || !expect_close(p)) return NULL;
        n->names = names.p;
        n->n_names = names.n;
        return n;
    }
    if (names.n != 1) {
        unexpected(p, "'='");
        return NULL;
    }
    struct sp_jnode *n = node(p, SP_JN_SET_BLOCK, at);
    if (!n) return NULL;
    n->str = names.p[0];
    if (is_op(cur(p), SP_JOP_PIPE)) {
        next(p);
        if (!(n->b = parse_filter(p, NULL))) return NULL;
    }
    if (!expect_close(p)) return NULL;
    static const char *const ends[] = {"endset"};
    int which;
    struct sp_jnode *body = parse_body(p, ends, 1, &which, at, "set");
    if (!body || !expect_close(p)) return NULL;
    n->kids = body->kids;
    n->n_kids = body->n_kids;
    return n;
}

static struct sp_jnode *parse_macro(struct ps *p, const struct sp_jtok *at) {
    struct sp_jnode *n = node(p, SP_JN_MACRO, at);
    if (!n) return NULL;
    if (cur(p)->kind != SP_JT_NAME) {
        unexpected(p, "a macro name");
        return NULL;
    }
    if (!(n->str = tok_str(p, cur(p)))) return NULL;
    next(p);
    struct svec params = {0};
    struct nvec defs = {0};
    if (!expect_op(p, SP_JOP_LPAREN, "'('")) return NULL;
    while (!is_op(cur(p), SP_JOP_RPAREN)) {
        if (cur(p)->kind != SP_JT_NAME) {
            unexpected(p, "a parameter name");
            return NULL;
        }
        const struct sp_jstr *s = tok_str(p, cur(p));
        if (!s || !svec_push(p, &params, s)) return NULL;
        next(p);
        struct sp_jnode *d = NULL;
        if (is_op(cur(p), SP_JOP_ASSIGN)) {
            next(p);
            if (!(d = parse_expr(p, true))) return NULL;
        }
        if (!nvec_push(p, &defs, d)) return NULL;
        if (is_op(cur(p), SP_JOP_COMMA)) {
            next(p);
            continue;
        }
        if (!is_op(cur(p), SP_JOP_RPAREN)) {
            unexpected(p, "',' or ')'");
            return NULL;
        }
    }
    next(p);
    if (!expect_close(p)) return NULL;
    n->names = params.p;
    n->n_names = params.n;
    n->kids2 = defs.p;
    n->n_kids2 = defs.n;
    static const char *const ends[] = {"endmacro"};
    int which;
    const uint32_t loops = p->loops;
    p->loops = 0; /* a macro body is not inside the loop it is defined in */
    struct sp_jnode *body = parse_body(p, ends, 1, &which, at, "macro");
    p->loops = loops;
    if (!body) return NULL;
    if (cur(p)->kind == SP_JT_NAME) next(p); /* {% endmacro name %} */
    if (!expect_close(p)) return NULL;
    n->kids = body->kids;
    n->n_kids = body->n_kids;
    return n;
}

/* A body with its own end tag and nothing else: filter, generation, block. */
static struct sp_jnode *parse_wrapped(struct ps *p, const struct sp_jtok *at, int kind, const char *end,
                                      const char *what) {
    struct sp_jnode *n = node(p, kind, at);
    if (!n) return NULL;
    if (kind == SP_JN_FILTER_BLOCK) {
        struct sp_jnode *f = parse_filter(p, NULL);
        while (f && is_op(cur(p), SP_JOP_PIPE)) {
            next(p);
            f = parse_filter(p, f);
        }
        if (!f) return NULL;
        n->b = f;
    } else if (kind == SP_JN_BLOCK && strcmp(what, "block") == 0) {
        if (cur(p)->kind != SP_JT_NAME) {
            unexpected(p, "a block name");
            return NULL;
        }
        next(p);
    }
    if (!expect_close(p)) return NULL;
    const char *ends[] = {end};
    int which;
    struct sp_jnode *body = parse_body(p, ends, 1, &which, at, what);
    if (!body) return NULL;
    if (kind == SP_JN_BLOCK && cur(p)->kind == SP_JT_NAME) next(p); /* {% endblock name %} */
    if (!expect_close(p)) return NULL;
    n->kids = body->kids;
    n->n_kids = body->n_kids;
    return n;
}

/* One {% tag %} at the cursor (after '{%'). */
static struct sp_jnode *parse_tag(struct ps *p) {
    const struct sp_jtok *at = cur(p);
    char b[64];
    if (at->kind != SP_JT_NAME) {
        unexpected(p, "a tag name");
        return NULL;
    }
    next(p);
    if (is_kw(at, "if")) return parse_if(p, at);
    if (is_kw(at, "for")) return parse_for(p, at);
    if (is_kw(at, "set")) return parse_set(p, at);
    if (is_kw(at, "macro")) return parse_macro(p, at);
    if (is_kw(at, "filter")) return parse_wrapped(p, at, SP_JN_FILTER_BLOCK, "endfilter", "filter");
    if (is_kw(at, "generation")) return parse_wrapped(p, at, SP_JN_BLOCK, "endgeneration", "generation");
    if (is_kw(at, "block")) return parse_wrapped(p, at, SP_JN_BLOCK, "endblock", "block");
    if (is_kw(at, "break") || is_kw(at, "continue")) {
        if (!p->loops) {
            fail_at(p, at, SP_E_FORMAT, "'%.*s' outside a for loop", (int)at->n, at->s);
            return NULL;
        }
        struct sp_jnode *n = node(p, is_kw(at, "break") ? SP_JN_BREAK : SP_JN_CONTINUE, at);
        return n && expect_close(p) ? n : NULL;
    }
    if (is_kw(at, "do")) {
        struct sp_jnode *n = node(p, SP_JN_DO, at);
        if (!n || !(n->a = parse_tuple(p, true)) || !expect_close(p)) return NULL;
        return n;
    }
    static const char *const unsupported[] = {"include", "import", "from", "extends", "call", "with", "autoescape",
                                              "trans"};
    for (size_t i = 0; i < SP_ARRAY_LEN(unsupported); i++) {
        if (is_kw(at, unsupported[i])) {
            fail_at(p, at, SP_E_UNSUPPORTED, "the '%s' tag is not supported%s", unsupported[i],
                    i < 4 ? " (templates cannot read files)" : "");
            return NULL;
        }
    }
    fail_at(p, at, SP_E_FORMAT, "unknown tag %s", desc(at, b, sizeof b));
    return NULL;
}

/* Statements up to a {% tag %} named in ends (the cursor is left after that
 * name, *which = its index) or, with n_ends == 0, the end of the template.
 * Returns an SP_JN_BLOCK holding them. */
static struct sp_jnode *parse_body(struct ps *p, const char *const *ends, int n_ends, int *which,
                                   const struct sp_jtok *opened, const char *what) {
    struct nvec kids = {0};
    struct sp_jnode *blk = node(p, SP_JN_BLOCK, cur(p));
    if (!blk || !enter(p)) return NULL;
    for (;;) {
        const struct sp_jtok *t = cur(p);
        struct sp_jnode *n = NULL;
        if (t->kind == SP_JT_EOF) {
            if (n_ends == 0) break;
            fail_at(p, opened, SP_E_FORMAT, "'%s' block is never closed (expected '%s')", what, ends[n_ends - 1]);
            return NULL;
        }
        if (t->kind == SP_JT_TEXT) {
            if (!(n = node(p, SP_JN_TEXT, t))) return NULL;
            if (!(n->str = sp_jstr_new(p->a, t->s, t->n))) {
                fail_at(p, t, SP_E_NOMEM, "out of memory");
                return NULL;
            }
            next(p);
        } else if (t->kind == SP_JT_VAR_OPEN) {
            next(p);
            if (!(n = node(p, SP_JN_OUTPUT, t)) || !(n->a = parse_tuple(p, true))) return NULL;
            if (cur(p)->kind != SP_JT_VAR_CLOSE) {
                unexpected(p, "'}}'");
                return NULL;
            }
            next(p);
        } else if (t->kind == SP_JT_BLOCK_OPEN) {
            next(p);
            const struct sp_jtok *name = cur(p);
            for (int i = 0; i < n_ends; i++) {
                if (is_kw(name, ends[i])) {
                    next(p);
                    *which = i;
                    blk->kids = kids.p;
                    blk->n_kids = kids.n;
                    p->depth--;
                    return blk;
                }
            }
            if (name->kind == SP_JT_NAME && ((name->n > 3 && memcmp(name->s, "end", 3) == 0) ||
                                             is_kw(name, "else") || is_kw(name, "elif"))) {
                char b[64];
                if (n_ends)
                    fail_at(p, name, SP_E_FORMAT, "unexpected %s inside '%s' (opened at line %u, column %u)",
                            desc(name, b, sizeof b), what, opened->line, opened->col);
                else
                    fail_at(p, name, SP_E_FORMAT, "unexpected %s with no block open", desc(name, b, sizeof b));
                return NULL;
            }
            if (!(n = parse_tag(p))) return NULL;
        } else {
            unexpected(p, "text or a tag");
            return NULL;
        }
        if (!nvec_push(p, &kids, n)) return NULL;
    }
    blk->kids = kids.p;
    blk->n_kids = kids.n;
    p->depth--;
    return blk;
}

/* The default bounds (docs/CHAT.md, "Sandbox and limits"). */
struct sp_jinja_limits sp_jinja_default_limits(void) {
    return (struct sp_jinja_limits){
        .max_output = 64u << 20, .max_memory = 256u << 20, .max_iterations = 1000000, .max_depth = 200};
}

/* lim (NULL = none given) with every zero field replaced by its default. */
struct sp_jinja_limits sp_jinja_limits_or_default(const struct sp_jinja_limits *lim) {
    const struct sp_jinja_limits d = sp_jinja_default_limits();
    struct sp_jinja_limits r = lim ? *lim : d;
    if (!r.max_output) r.max_output = d.max_output;
    if (!r.max_memory) r.max_memory = d.max_memory;
    if (!r.max_iterations) r.max_iterations = d.max_iterations;
    if (!r.max_depth) r.max_depth = d.max_depth;
    return r;
}

/* Compile src (see jinja.h). */
sp_status sp_jinja_parse(const char *src, size_t len, const struct sp_jinja_limits *lim,
                         struct sp_jinja_program **out, struct sp_jinja_error *err) {
    *out = NULL;
    memset(err, 0, sizeof *err);
    struct sp_jinja_program *prog = sp_calloc(1, sizeof *prog);
    if (!prog) {
        err->st = SP_E_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return SP_E_NOMEM;
    }
    prog->lim = sp_jinja_limits_or_default(lim);
    prog->arena.limit = prog->lim.max_memory;

    struct sp_jtoks toks = {0};
    if (!src) len = 0;
    if (!sp_jinja_lex(src ? src : "", len, &prog->arena, &toks, err)) {
        sp_free(toks.t);
        sp_jinja_program_free(prog);
        return err->st;
    }
    struct ps p = {.t = toks.t, .n = toks.n, .a = &prog->arena, .err = err, .max_depth = prog->lim.max_depth};
    int which;
    static const struct sp_jtok start = {.kind = SP_JT_EOF, .line = 1, .col = 1};
    prog->root = parse_body(&p, NULL, 0, &which, &start, "template");
    sp_free(toks.t);
    if (!prog->root) {
        if (!err->st) err->st = SP_E_FORMAT;
        sp_jinja_program_free(prog);
        return err->st;
    }
    *out = prog;
    return SP_OK;
}

/* Frees the program and its tree; NULL is a no-op. */
void sp_jinja_program_free(struct sp_jinja_program *p) {
    if (!p) return;
    sp_jarena_free(&p->arena);
    sp_free(p);
}
