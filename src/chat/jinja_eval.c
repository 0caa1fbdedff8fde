/*
 * jinja_eval.c -- the tree-walking interpreter: scopes, statements,
 * expressions, operators, macro calls and the render entry point.  Filters,
 * tests and methods are in jinja_builtins.c.
 *
 * Semantics follow Jinja2 as Hugging Face runs chat templates, with these
 * choices where Jinja2 would raise: a missing attribute or key, and any
 * attribute of undefined or none, is undefined (Jinja2 raises for
 * attributes of undefined); iterating undefined or none gives nothing.
 * Scoping: a for loop has its own scope (a set inside it does not change an
 * outer variable; namespace() exists for that), if has none, a macro body
 * runs in a scope over the one it was defined in.
 *
 * Bounds (struct sp_jinja_limits): output bytes, arena bytes, loop
 * iterations plus macro calls, and evaluation depth (5 x max_depth, which
 * also bounds macro recursion).  Exceeding one is an error at the node that
 * did it.
 */
#include "chat/jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

enum { FLOW_NONE = 0, FLOW_BREAK, FLOW_CONTINUE };
enum { VALUE_DEPTH = 64 }; /* nesting printed or compared before a value counts as cyclic */

bool sp_jrt_fail(struct sp_jrt *rt, const struct sp_jnode *at, sp_status st, const char *fmt, ...) {
    if (rt->failed) return false;
    rt->failed = true;
    rt->err->st = st;
    rt->err->line = at ? at->line : 0;
    rt->err->col = at ? at->col : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->err->msg, sizeof rt->err->msg, fmt, ap);
    va_end(ap);
    return false;
}

/* An arena failure at at: out of memory, or over the memory limit. */
bool sp_jrt_oom(struct sp_jrt *rt, const struct sp_jnode *at) {
    if (rt->a->nomem) return sp_jrt_fail(rt, at, SP_E_NOMEM, "out of memory");
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "the template needs more than %zu bytes of memory (the limit)",
                       rt->ctx->lim.max_memory);
}

/* One loop iteration or macro call; false past max_iterations. */
bool sp_jrt_tick(struct sp_jrt *rt, const struct sp_jnode *at) {
    if (++rt->iterations > rt->ctx->lim.max_iterations)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "more than %llu loop iterations and macro calls (the limit)",
                           (unsigned long long)rt->ctx->lim.max_iterations);
    return true;
}

/* What walking v costs in work units: items, or bytes / 64 of a string. */
uint64_t sp_jrt_size(struct sp_jv v) {
    switch (v.type) {
    case SP_JV_STR: return v.u.s->len / 64;
    case SP_JV_LIST: return v.u.l->n;
    case SP_JV_DICT: return v.u.d->n;
    default: return 0;
    }
}

/* Add units + 1 of work; false past 256 x max_iterations. */
bool sp_jrt_charge(struct sp_jrt *rt, const struct sp_jnode *at, uint64_t units) {
    rt->work += units + 1;
    if (rt->work / 256 > rt->ctx->lim.max_iterations)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "the template does too much work (more than %llu steps over lists "
                           "and strings; a runaway loop?)", (unsigned long long)rt->ctx->lim.max_iterations * 256);
    return true;
}

static bool enter(struct sp_jrt *rt, const struct sp_jnode *at) {
    if (++rt->depth > 5 * rt->ctx->lim.max_depth)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "evaluation nested more than %u levels deep (runaway recursion?)",
                           5 * rt->ctx->lim.max_depth);
    return true;
}

/* str(v) as a string value in the render arena (v itself when it is one). */
bool sp_jrt_to_str(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv v, struct sp_jv *out) {
    if (v.type == SP_JV_STR) {
        *out = v;
        return true;
    }
    struct sp_jbuf b = {.limit = rt->ctx->lim.max_output};
    bool ok = sp_jv_write_str(&b, v, VALUE_DEPTH);
    if (!ok) {
        sp_jbuf_free(&b);
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "a value nested more than %d levels deep (a cycle?)", VALUE_DEPTH);
    }
    if (b.over) {
        const bool nomem = b.nomem;
        sp_jbuf_free(&b);
        return nomem ? sp_jrt_fail(rt, at, SP_E_NOMEM, "out of memory")
                     : sp_jrt_fail(rt, at, SP_E_FORMAT, "a string longer than %zu bytes (the output limit)",
                                   rt->ctx->lim.max_output);
    }
    ok = sp_jv_str(rt->a, b.p ? b.p : "", b.n, out);
    sp_jbuf_free(&b);
    return ok || sp_jrt_oom(rt, at);
}

/* ---- scopes ------------------------------------------------------------------ */

static struct sp_jscope *scope_new(struct sp_jrt *rt, struct sp_jscope *parent) {
    struct sp_jscope *s = sp_jarena_alloc(rt->a, sizeof *s);
    if (!s) return NULL;
    s->parent = parent;
    s->vars = sp_jdict_new(rt->a, 0);
    return s->vars ? s : NULL;
}

static void note_use(struct sp_jrt *rt, struct sp_jv v) {
    if (v.type == SP_JV_STR && v.u.s == rt->ctx->watch) rt->ctx->watch_used = true;
}

static struct sp_jv lookup(struct sp_jrt *rt, struct sp_jscope *sc, const struct sp_jstr *name) {
    for (struct sp_jscope *s = sc; s; s = s->parent) {
        const long i = sp_jdict_find_str(s->vars, name->s, name->len);
        if (i >= 0) {
            note_use(rt, s->vars->vals[i]);
            return s->vars->vals[i];
        }
    }
    const int fn = sp_jinja_func_id(name->s, name->len);
    if (fn >= 0) return (struct sp_jv){.type = SP_JV_FUNC, .u.fn = fn};
    return sp_jv_undef();
}

static bool assign(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jscope *sc, const struct sp_jstr *name,
                   struct sp_jv v) {
    return sp_jdict_set(rt->a, sc->vars, sp_jv_strv(name), v) || sp_jrt_oom(rt, at);
}

/* Bind targets (one name, or several unpacking a list). */
static bool bind(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jscope *sc, const struct sp_jstr *const *names,
                 uint32_t n, struct sp_jv v) {
    if (n == 1) return assign(rt, at, sc, names[0], v);
    if (v.type != SP_JV_LIST)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "cannot unpack a %s into %u names", sp_jv_type_name(v), n);
    if (v.u.l->n != n)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "cannot unpack %zu values into %u names", v.u.l->n, n);
    for (uint32_t i = 0; i < n; i++)
        if (!assign(rt, at, sc, names[i], v.u.l->items[i])) return false;
    return true;
}

/* ---- item access, comparison ----------------------------------------------------- */

bool sp_jrt_getitem(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv obj, struct sp_jv key,
                    struct sp_jv *out) {
    *out = sp_jv_undef();
    if (obj.type == SP_JV_DICT) {
        const long i = sp_jdict_find(obj.u.d, key);
        if (i >= 0) *out = obj.u.d->vals[i];
    } else if ((obj.type == SP_JV_LIST || obj.type == SP_JV_STR) && (key.type == SP_JV_INT || key.type == SP_JV_BOOL)) {
        int64_t i = key.type == SP_JV_INT ? key.u.i : key.u.b;
        if (obj.type == SP_JV_LIST) {
            const int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) *out = obj.u.l->items[i];
        } else {
            const struct sp_jstr *s = obj.u.s;
            const int64_t n = (int64_t)s->nchars;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                if (s->nchars != s->len && !sp_jrt_charge(rt, at, s->len / 64)) return false;
                const size_t b = sp_jstr_offset(s, (size_t)i);
                const size_t e = sp_jstr_offset(s, (size_t)i + 1);
                if (!sp_jv_str(rt->a, s->s + b, e - b, out)) return sp_jrt_oom(rt, at);
            }
        }
    }
    note_use(rt, *out);
    return true;
}

static bool is_number(struct sp_jv v) {
    return v.type == SP_JV_INT || v.type == SP_JV_FLOAT || v.type == SP_JV_BOOL;
}

static double as_double(struct sp_jv v) {
    return v.type == SP_JV_FLOAT ? v.u.f : v.type == SP_JV_INT ? (double)v.u.i : (double)v.u.b;
}

static int64_t as_int(struct sp_jv v) {
    return v.type == SP_JV_INT ? v.u.i : v.u.b;
}

static bool compare_depth(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv a, struct sp_jv b, int *cmp,
                          int depth) {
    if (is_number(a) && is_number(b)) {
        if (a.type != SP_JV_FLOAT && b.type != SP_JV_FLOAT) {
            const int64_t x = as_int(a), y = as_int(b);
            *cmp = (x > y) - (x < y);
        } else {
            const double x = as_double(a), y = as_double(b);
            *cmp = (x > y) - (x < y);
        }
        return true;
    }
    if (a.type == SP_JV_STR && b.type == SP_JV_STR) {
        const size_t m = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, m);
        if (c == 0) c = (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        *cmp = (c > 0) - (c < 0);
        return true;
    }
    if (a.type == SP_JV_LIST && b.type == SP_JV_LIST) {
        if (depth <= 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "lists nested too deeply to compare");
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!compare_depth(rt, at, a.u.l->items[i], b.u.l->items[i], cmp, depth - 1)) return false;
            if (*cmp) return true;
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return true;
    }
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "cannot order a %s and a %s", sp_jv_type_name(a), sp_jv_type_name(b));
}

/* Python ordering of a and b into *cmp (-1, 0, 1); false for values that do not order. */
bool sp_jrt_compare(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv a, struct sp_jv b, int *cmp) {
    return compare_depth(rt, at, a, b, cmp, VALUE_DEPTH);
}

/* x in container */
static bool contains(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv x, struct sp_jv c, bool *res) {
    *res = false;
    if (!sp_jrt_charge(rt, at, sp_jrt_size(c))) return false;
    switch (c.type) {
    case SP_JV_STR:
        if (x.type != SP_JV_STR)
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "'in <string>' needs a string on the left, not a %s",
                               sp_jv_type_name(x));
        *res = x.u.s->len == 0 || (x.u.s->len <= c.u.s->len && memmem(c.u.s->s, c.u.s->len, x.u.s->s, x.u.s->len));
        return true;
    case SP_JV_LIST:
        for (size_t i = 0; i < c.u.l->n && !*res; i++) *res = sp_jv_equal(x, c.u.l->items[i], VALUE_DEPTH);
        return true;
    case SP_JV_DICT: *res = sp_jdict_find(c.u.d, x) >= 0; return true;
    case SP_JV_UNDEF: case SP_JV_NONE: return true;
    default: return sp_jrt_fail(rt, at, SP_E_FORMAT, "'in' needs a container, not a %s", sp_jv_type_name(c));
    }
}

/* ---- arithmetic ------------------------------------------------------------------- */

static bool num_result(struct sp_jrt *rt, const struct sp_jnode *at, double f, struct sp_jv *out) {
    (void)rt, (void)at;
    *out = sp_jv_float(f);
    return true;
}

static bool repeat(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv seq, int64_t times, struct sp_jv *out) {
    if (times < 0) times = 0;
    if (seq.type == SP_JV_STR) {
        const size_t n = seq.u.s->len;
        if (n && (uint64_t)times > rt->ctx->lim.max_output / n)
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "a string longer than %zu bytes (the output limit)",
                               rt->ctx->lim.max_output);
        if (!sp_jrt_charge(rt, at, n * (uint64_t)times / 64)) return false;
        char *buf = sp_jarena_alloc(rt->a, n * (size_t)times + 1);
        if (!buf) return sp_jrt_oom(rt, at);
        for (int64_t i = 0; i < times; i++) memcpy(buf + (size_t)i * n, seq.u.s->s, n);
        return sp_jv_str(rt->a, buf, n * (size_t)times, out) || sp_jrt_oom(rt, at);
    }
    const size_t n = seq.u.l->n;
    if (n && (uint64_t)times > rt->ctx->lim.max_iterations / n)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "a list of more than %llu items", (unsigned long long)rt->ctx->lim.max_iterations);
    if (!sp_jrt_charge(rt, at, n * (uint64_t)times)) return false;
    struct sp_jlist *l = sp_jlist_new(rt->a, n * (size_t)times);
    if (!l) return sp_jrt_oom(rt, at);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < n; k++) l->items[l->n++] = seq.u.l->items[k];
    *out = (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
    return true;
}

static bool arith(struct sp_jrt *rt, const struct sp_jnode *at, int op, struct sp_jv a, struct sp_jv b, struct sp_jv *out) {
    const bool ints = (a.type == SP_JV_INT || a.type == SP_JV_BOOL) && (b.type == SP_JV_INT || b.type == SP_JV_BOOL);
    const bool nums = is_number(a) && is_number(b);
    int64_t r;
    switch (op) {
    case SP_JOP_ADD:
        if (ints) {
            if (__builtin_add_overflow(as_int(a), as_int(b), &r)) return num_result(rt, at, as_double(a) + as_double(b), out);
            *out = sp_jv_int(r);
            return true;
        }
        if (nums) return num_result(rt, at, as_double(a) + as_double(b), out);
        if (a.type == SP_JV_STR && b.type == SP_JV_STR) {
            const size_t n = a.u.s->len + b.u.s->len;
            if (n > rt->ctx->lim.max_output)
                return sp_jrt_fail(rt, at, SP_E_FORMAT, "a string longer than %zu bytes (the output limit)",
                                   rt->ctx->lim.max_output);
            if (!sp_jrt_charge(rt, at, n / 64)) return false;
            char *buf = sp_jarena_alloc(rt->a, sizeof(struct sp_jstr) + n + 1);
            if (!buf) return sp_jrt_oom(rt, at);
            struct sp_jstr *s = (struct sp_jstr *)buf;
            s->len = n;
            s->nchars = a.u.s->nchars + b.u.s->nchars;
            memcpy(s->s, a.u.s->s, a.u.s->len);
            memcpy(s->s + a.u.s->len, b.u.s->s, b.u.s->len);
            s->s[n] = '\0';
            *out = sp_jv_strv(s);
            return true;
        }
        if (a.type == SP_JV_LIST && b.type == SP_JV_LIST) {
            if (!sp_jrt_charge(rt, at, a.u.l->n + b.u.l->n)) return false;
            struct sp_jlist *l = sp_jlist_new(rt->a, a.u.l->n + b.u.l->n);
            if (!l) return sp_jrt_oom(rt, at);
            for (size_t i = 0; i < a.u.l->n; i++) l->items[l->n++] = a.u.l->items[i];
            for (size_t i = 0; i < b.u.l->n; i++) l->items[l->n++] = b.u.l->items[i];
            *out = (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
            return true;
        }
        break;
    case SP_JOP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) return num_result(rt, at, as_double(a) - as_double(b), out);
            *out = sp_jv_int(r);
            return true;
        }
        if (nums) return num_result(rt, at, as_double(a) - as_double(b), out);
        break;
    case SP_JOP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) return num_result(rt, at, as_double(a) * as_double(b), out);
            *out = sp_jv_int(r);
            return true;
        }
        if (nums) return num_result(rt, at, as_double(a) * as_double(b), out);
        if ((a.type == SP_JV_STR || a.type == SP_JV_LIST) && (b.type == SP_JV_INT || b.type == SP_JV_BOOL))
            return repeat(rt, at, a, as_int(b), out);
        if ((b.type == SP_JV_STR || b.type == SP_JV_LIST) && (a.type == SP_JV_INT || a.type == SP_JV_BOOL))
            return repeat(rt, at, b, as_int(a), out);
        break;
    case SP_JOP_DIV:
        if (nums) {
            if (as_double(b) == 0.0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "division by zero");
            return num_result(rt, at, as_double(a) / as_double(b), out);
        }
        break;
    case SP_JOP_FLOORDIV:
    case SP_JOP_MOD:
        if (op == SP_JOP_MOD && a.type == SP_JV_STR) return sp_jinja_percent(rt, at, a.u.s, b, out);
        if (ints) {
            const int64_t x = as_int(a), y = as_int(b);
            if (y == 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s by zero", op == SP_JOP_MOD ? "modulo" : "division");
            if (x == INT64_MIN && y == -1) {
                *out = op == SP_JOP_MOD ? sp_jv_int(0) : sp_jv_float(-(double)INT64_MIN);
                return true;
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) { /* Python rounds toward minus infinity */
                q--;
                m += y;
            }
            *out = sp_jv_int(op == SP_JOP_MOD ? m : q);
            return true;
        }
        if (nums) {
            const double x = as_double(a), y = as_double(b);
            if (y == 0.0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s by zero", op == SP_JOP_MOD ? "modulo" : "division");
            if (op == SP_JOP_FLOORDIV) return num_result(rt, at, floor(x / y), out);
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return num_result(rt, at, m, out);
        }
        break;
    case SP_JOP_POW:
        if (ints && as_int(b) >= 0) {
            int64_t base = as_int(a), e = as_int(b), acc = 1;
            bool over = false;
            while (e > 0 && !over) {
                if (e & 1) over = __builtin_mul_overflow(acc, base, &acc);
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) over = true;
            }
            if (!over) {
                *out = sp_jv_int(acc);
                return true;
            }
            return num_result(rt, at, pow(as_double(a), as_double(b)), out);
        }
        if (nums) return num_result(rt, at, pow(as_double(a), as_double(b)), out);
        break;
    default: break;
    }
    static const char *const names[SP_JOP_COUNT] = {[SP_JOP_ADD] = "+", [SP_JOP_SUB] = "-", [SP_JOP_MUL] = "*",
                                                    [SP_JOP_DIV] = "/", [SP_JOP_FLOORDIV] = "//", [SP_JOP_MOD] = "%",
                                                    [SP_JOP_POW] = "**"};
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "unsupported operand types for %s: %s and %s", names[op] ? names[op] : "?",
                       sp_jv_type_name(a), sp_jv_type_name(b));
}

/* ---- expressions --------------------------------------------------------------------- */

static bool eval_args(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jargs *args) {
    struct sp_jv *vals = NULL;
    const uint32_t total = n->n_kids + n->n_kids2;
    if (total && !(vals = sp_jarena_alloc(rt->a, total * sizeof *vals))) return sp_jrt_oom(rt, n);
    for (uint32_t i = 0; i < n->n_kids; i++)
        if (!sp_jrt_eval(rt, n->kids[i], sc, &vals[i])) return false;
    for (uint32_t i = 0; i < n->n_kids2; i++)
        if (!sp_jrt_eval(rt, n->kids2[i], sc, &vals[n->n_kids + i])) return false;
    args->pos = vals;
    args->n_pos = n->n_kids;
    args->names = n->names;
    args->kw = vals ? vals + n->n_kids : NULL;
    args->n_kw = n->n_kids2;
    return true;
}

static bool capture(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jnode *const *kids, uint32_t n,
                    struct sp_jscope *sc, struct sp_jv *out, int *flow);

static bool call_macro(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jmacro *m,
                       const struct sp_jargs *args, struct sp_jv *out) {
    const struct sp_jnode *def = m->def;
    if (!sp_jrt_tick(rt, at)) return false;
    struct sp_jscope *sc = scope_new(rt, m->closure);
    if (!sc) return sp_jrt_oom(rt, at);
    struct sp_jlist *varargs = sp_jlist_new(rt->a, 0);
    struct sp_jdict *kwargs = sp_jdict_new(rt->a, 0);
    if (!varargs || !kwargs) return sp_jrt_oom(rt, at);
    for (uint32_t i = 0; i < def->n_names; i++) {
        struct sp_jv v = sp_jv_undef();
        bool have = false;
        if (i < args->n_pos) {
            v = args->pos[i];
            have = true;
        }
        for (uint32_t k = 0; k < args->n_kw; k++) {
            if (args->names[k]->len == def->names[i]->len &&
                memcmp(args->names[k]->s, def->names[i]->s, def->names[i]->len) == 0) {
                if (have)
                    return sp_jrt_fail(rt, at, SP_E_FORMAT, "macro '%s' got argument '%s' twice", def->str->s,
                                       def->names[i]->s);
                v = args->kw[k];
                have = true;
            }
        }
        if (!have && def->kids2[i] && !sp_jrt_eval(rt, def->kids2[i], sc, &v)) return false;
        if (!assign(rt, at, sc, def->names[i], v)) return false;
    }
    for (uint32_t i = def->n_names; i < args->n_pos; i++)
        if (!sp_jlist_push(rt->a, varargs, args->pos[i])) return sp_jrt_oom(rt, at);
    for (uint32_t k = 0; k < args->n_kw; k++) {
        bool known = false;
        for (uint32_t i = 0; i < def->n_names && !known; i++)
            known = args->names[k]->len == def->names[i]->len &&
                    memcmp(args->names[k]->s, def->names[i]->s, def->names[i]->len) == 0;
        if (!known && !sp_jdict_set(rt->a, kwargs, sp_jv_strv(args->names[k]), args->kw[k])) return sp_jrt_oom(rt, at);
    }
    if (!sp_jdict_set_str(rt->a, sc->vars, "varargs", (struct sp_jv){.type = SP_JV_LIST, .u.l = varargs}) ||
        !sp_jdict_set_str(rt->a, sc->vars, "kwargs", (struct sp_jv){.type = SP_JV_DICT, .u.d = kwargs}))
        return sp_jrt_oom(rt, at);
    int flow = FLOW_NONE;
    if (!enter(rt, at)) return false;
    const bool ok = capture(rt, at, def->kids, def->n_kids, sc, out, &flow);
    rt->depth--;
    return ok;
}

/* Call a macro or global function value; false for anything else. */
bool sp_jrt_call(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv fn, const struct sp_jargs *args,
                 struct sp_jv *out) {
    if (fn.type == SP_JV_MACRO) return call_macro(rt, at, fn.u.m, args, out);
    if (fn.type == SP_JV_FUNC) return sp_jinja_func(rt, at, fn.u.fn, args, out);
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "a %s is not callable", sp_jv_type_name(fn));
}

static bool eval_call(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jv *out) {
    struct sp_jargs args;
    if (n->a->kind == SP_JN_ATTR) { /* obj.method(...) */
        struct sp_jv recv;
        if (!sp_jrt_eval(rt, n->a->a, sc, &recv)) return false;
        if (recv.type == SP_JV_DICT) {
            const long i = sp_jdict_find_str(recv.u.d, n->a->str->s, n->a->str->len);
            if (i >= 0 && (recv.u.d->vals[i].type == SP_JV_MACRO || recv.u.d->vals[i].type == SP_JV_FUNC)) {
                if (!eval_args(rt, n, sc, &args)) return false;
                return sp_jrt_call(rt, n, recv.u.d->vals[i], &args, out);
            }
        }
        if (!eval_args(rt, n, sc, &args)) return false;
        bool found = false;
        if (!sp_jinja_method(rt, n, recv, n->a->str, &args, out, &found)) return false;
        if (found) return true;
        return sp_jrt_fail(rt, n, SP_E_UNSUPPORTED, "a %s has no method '%s'", sp_jv_type_name(recv), n->a->str->s);
    }
    struct sp_jv fn;
    if (!sp_jrt_eval(rt, n->a, sc, &fn)) return false;
    if (fn.type == SP_JV_UNDEF && n->a->kind == SP_JN_NAME)
        return sp_jrt_fail(rt, n, SP_E_UNSUPPORTED, "unknown function '%s'", n->a->str->s);
    if (!eval_args(rt, n, sc, &args)) return false;
    return sp_jrt_call(rt, n, fn, &args, out);
}

/* Python slice [start:stop:step] of a list or string. */
static bool eval_slice(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jv *out) {
    struct sp_jv obj, part[3];
    if (!sp_jrt_eval(rt, n->a, sc, &obj)) return false;
    for (int i = 0; i < 3; i++) {
        part[i] = sp_jv_none();
        if (n->kids[i] && !sp_jrt_eval(rt, n->kids[i], sc, &part[i])) return false;
        if (part[i].type != SP_JV_NONE && part[i].type != SP_JV_INT && part[i].type != SP_JV_BOOL)
            return sp_jrt_fail(rt, n, SP_E_FORMAT, "slice indices must be integers, not %s", sp_jv_type_name(part[i]));
    }
    if (obj.type == SP_JV_UNDEF || obj.type == SP_JV_NONE) {
        *out = sp_jv_undef();
        return true;
    }
    if (obj.type != SP_JV_LIST && obj.type != SP_JV_STR)
        return sp_jrt_fail(rt, n, SP_E_FORMAT, "cannot slice a %s", sp_jv_type_name(obj));
    const int64_t len = obj.type == SP_JV_LIST ? (int64_t)obj.u.l->n : (int64_t)obj.u.s->nchars;
    if (!sp_jrt_charge(rt, n, sp_jrt_size(obj))) return false;
    const int64_t step = part[2].type == SP_JV_NONE ? 1 : as_int(part[2]);
    if (step == 0) return sp_jrt_fail(rt, n, SP_E_FORMAT, "slice step cannot be zero");
    int64_t start, stop;
    if (part[0].type == SP_JV_NONE) {
        start = step > 0 ? 0 : len - 1;
    } else {
        start = as_int(part[0]);
        if (start < 0) start += len;
        if (start < 0) start = step > 0 ? 0 : -1;
        if (start >= len) start = step > 0 ? len : len - 1;
    }
    if (part[1].type == SP_JV_NONE) {
        stop = step > 0 ? len : -1;
    } else {
        stop = as_int(part[1]);
        if (stop < 0) stop += len;
        if (stop < 0) stop = step > 0 ? 0 : -1;
        if (stop >= len) stop = step > 0 ? len : len - 1;
    }
    if (obj.type == SP_JV_LIST) {
        struct sp_jlist *l = sp_jlist_new(rt->a, 0);
        if (!l) return sp_jrt_oom(rt, n);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (!sp_jlist_push(rt->a, l, obj.u.l->items[i])) return sp_jrt_oom(rt, n);
        *out = (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
        return true;
    }
    const struct sp_jstr *s = obj.u.s;
    if (step == 1) {
        const size_t b = sp_jstr_offset(s, (size_t)start);
        const size_t e = stop > start ? sp_jstr_offset(s, (size_t)stop) : b;
        return sp_jv_str(rt->a, s->s + b, e - b, out) || sp_jrt_oom(rt, n);
    }
    struct sp_jbuf b = {.limit = rt->ctx->lim.max_output};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        const size_t cb = sp_jstr_offset(s, (size_t)i), ce = sp_jstr_offset(s, (size_t)i + 1);
        sp_jbuf_put(&b, s->s + cb, ce - cb);
    }
    const bool ok = !b.over && sp_jv_str(rt->a, b.p ? b.p : "", b.n, out);
    sp_jbuf_free(&b);
    return ok || sp_jrt_oom(rt, n);
}

/* A filter node applied to in (for chains in filter blocks, the inner filters first). */
static bool apply_filter(struct sp_jrt *rt, const struct sp_jnode *f, struct sp_jscope *sc, struct sp_jv in,
                         struct sp_jv *out) {
    if (f->a) {
        if (f->a->kind != SP_JN_FILTER) return sp_jrt_fail(rt, f, SP_E_FORMAT, "bad filter chain");
        if (!apply_filter(rt, f->a, sc, in, &in)) return false;
    }
    if (f->id < 0) return sp_jrt_fail(rt, f, SP_E_UNSUPPORTED, "unknown filter '%s'", f->str->s);
    struct sp_jargs args;
    if (!eval_args(rt, f, sc, &args)) return false;
    return sp_jinja_filter(rt, f, f->id, in, &args, out);
}

static bool eval_inner(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jv *out) {
    struct sp_jv a, b;
    switch (n->kind) {
    case SP_JN_LIT: *out = n->lit; return true;
    case SP_JN_NAME: *out = lookup(rt, sc, n->str); return true;
    case SP_JN_ATTR:
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        return sp_jrt_getitem(rt, n, a, sp_jv_strv(n->str), out);
    case SP_JN_ITEM:
        if (!sp_jrt_eval(rt, n->a, sc, &a) || !sp_jrt_eval(rt, n->b, sc, &b)) return false;
        return sp_jrt_getitem(rt, n, a, b, out);
    case SP_JN_SLICE: return eval_slice(rt, n, sc, out);
    case SP_JN_CALL: return eval_call(rt, n, sc, out);
    case SP_JN_FILTER: {
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        if (n->id < 0) return sp_jrt_fail(rt, n, SP_E_UNSUPPORTED, "unknown filter '%s'", n->str->s);
        struct sp_jargs args;
        if (!eval_args(rt, n, sc, &args)) return false;
        return sp_jinja_filter(rt, n, n->id, a, &args, out);
    }
    case SP_JN_TEST: {
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        if (n->id < 0) return sp_jrt_fail(rt, n, SP_E_UNSUPPORTED, "unknown test '%s'", n->str->s);
        struct sp_jargs args;
        bool r;
        if (!eval_args(rt, n, sc, &args) || !sp_jinja_test(rt, n, n->id, a, &args, &r)) return false;
        *out = sp_jv_bool(n->op ? !r : r);
        return true;
    }
    case SP_JN_UNARY:
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        if (n->op == SP_JOP_NOT) {
            *out = sp_jv_bool(!sp_jv_truthy(a));
            return true;
        }
        if (!is_number(a))
            return sp_jrt_fail(rt, n, SP_E_FORMAT, "bad operand type for unary %c: %s", n->op == SP_JOP_NEG ? '-' : '+',
                               sp_jv_type_name(a));
        if (n->op == SP_JOP_POS) {
            *out = a.type == SP_JV_BOOL ? sp_jv_int(a.u.b) : a;
        } else if (a.type == SP_JV_FLOAT) {
            *out = sp_jv_float(-a.u.f);
        } else {
            const int64_t i = as_int(a);
            *out = i == INT64_MIN ? sp_jv_float(-(double)i) : sp_jv_int(-i);
        }
        return true;
    case SP_JN_BINARY:
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        if (n->op == SP_JOP_AND || n->op == SP_JOP_OR) { /* Python: the deciding operand itself */
            if (sp_jv_truthy(a) == (n->op == SP_JOP_OR)) {
                *out = a;
                return true;
            }
            return sp_jrt_eval(rt, n->b, sc, out);
        }
        if (!sp_jrt_eval(rt, n->b, sc, &b)) return false;
        switch (n->op) {
        case SP_JOP_EQ:
        case SP_JOP_NE:
            if (!sp_jrt_charge(rt, n, sp_jrt_size(a))) return false;
            *out = sp_jv_bool(sp_jv_equal(a, b, VALUE_DEPTH) == (n->op == SP_JOP_EQ));
            return true;
        case SP_JOP_LT: case SP_JOP_LE: case SP_JOP_GT: case SP_JOP_GE: {
            int c;
            if (!sp_jrt_compare(rt, n, a, b, &c)) return false;
            *out = sp_jv_bool(n->op == SP_JOP_LT ? c < 0 : n->op == SP_JOP_LE ? c <= 0 : n->op == SP_JOP_GT ? c > 0 : c >= 0);
            return true;
        }
        case SP_JOP_IN: case SP_JOP_NOTIN: {
            bool r;
            if (!contains(rt, n, a, b, &r)) return false;
            *out = sp_jv_bool(n->op == SP_JOP_IN ? r : !r);
            return true;
        }
        case SP_JOP_TILDE: {
            struct sp_jv x, y;
            if (!sp_jrt_to_str(rt, n, a, &x) || !sp_jrt_to_str(rt, n, b, &y)) return false;
            return arith(rt, n, SP_JOP_ADD, x, y, out);
        }
        default: return arith(rt, n, n->op, a, b, out);
        }
    case SP_JN_COND:
        if (!sp_jrt_eval(rt, n->a, sc, &a)) return false;
        if (sp_jv_truthy(a)) return sp_jrt_eval(rt, n->b, sc, out);
        if (n->c) return sp_jrt_eval(rt, n->c, sc, out);
        *out = sp_jv_undef();
        return true;
    case SP_JN_LIST:
    case SP_JN_TUPLE: {
        struct sp_jlist *l = sp_jlist_new(rt->a, n->n_kids);
        if (!l) return sp_jrt_oom(rt, n);
        for (uint32_t i = 0; i < n->n_kids; i++)
            if (!sp_jrt_eval(rt, n->kids[i], sc, &l->items[l->n++])) return false;
        *out = (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
        return true;
    }
    case SP_JN_DICT: {
        struct sp_jdict *d = sp_jdict_new(rt->a, n->n_kids);
        if (!d) return sp_jrt_oom(rt, n);
        for (uint32_t i = 0; i < n->n_kids; i++) {
            if (!sp_jrt_eval(rt, n->kids[i], sc, &a) || !sp_jrt_eval(rt, n->kids2[i], sc, &b)) return false;
            if (a.type == SP_JV_LIST || a.type == SP_JV_DICT)
                return sp_jrt_fail(rt, n->kids[i], SP_E_FORMAT, "a %s cannot be a dict key", sp_jv_type_name(a));
            if (!sp_jdict_set(rt->a, d, a, b)) return sp_jrt_oom(rt, n);
        }
        *out = (struct sp_jv){.type = SP_JV_DICT, .u.d = d};
        return true;
    }
    default: return sp_jrt_fail(rt, n, SP_E_FORMAT, "not an expression");
    }
}

/* Evaluate expression n in scope sc, bounded by the evaluation depth. */
bool sp_jrt_eval(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, struct sp_jv *out) {
    if (!enter(rt, n)) return false;
    const bool ok = eval_inner(rt, n, sc, out);
    rt->depth--;
    return ok;
}

/* ---- statements ------------------------------------------------------------------------ */

static bool exec_body(struct sp_jrt *rt, struct sp_jnode *const *kids, uint32_t n, struct sp_jscope *sc, int *flow);

static bool out_check(struct sp_jrt *rt, const struct sp_jnode *at) {
    if (!rt->out->over) return true;
    if (rt->out->nomem) return sp_jrt_fail(rt, at, SP_E_NOMEM, "out of memory");
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "the output exceeds %zu bytes (the limit)", rt->ctx->lim.max_output);
}

static bool capture(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jnode *const *kids, uint32_t n,
                    struct sp_jscope *sc, struct sp_jv *out, int *flow) {
    struct sp_jbuf buf = {.limit = rt->ctx->lim.max_output};
    struct sp_jbuf *saved = rt->out;
    rt->out = &buf;
    bool ok = exec_body(rt, kids, n, sc, flow);
    rt->out = saved;
    if (ok && buf.over) {
        ok = buf.nomem ? sp_jrt_fail(rt, at, SP_E_NOMEM, "out of memory")
                       : sp_jrt_fail(rt, at, SP_E_FORMAT, "a captured block exceeds %zu bytes (the output limit)",
                                     rt->ctx->lim.max_output);
    }
    if (ok) ok = sp_jv_str(rt->a, buf.p ? buf.p : "", buf.n, out) || sp_jrt_oom(rt, at);
    sp_jbuf_free(&buf);
    return ok;
}

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static bool iter_items(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv v, struct sp_jlist **out) {
    if (!sp_jrt_charge(rt, at, sp_jrt_size(v))) return false;
    switch (v.type) {
    case SP_JV_LIST: {
        struct sp_jlist *l = sp_jlist_new(rt->a, v.u.l->n); /* a snapshot: appending in the body does not loop forever */
        if (!l) return sp_jrt_oom(rt, at);
        if (v.u.l->n) memcpy(l->items, v.u.l->items, v.u.l->n * sizeof *l->items);
        l->n = v.u.l->n;
        *out = l;
        return true;
    }
    case SP_JV_DICT: {
        struct sp_jlist *l = sp_jlist_new(rt->a, v.u.d->n);
        if (!l) return sp_jrt_oom(rt, at);
        for (size_t i = 0; i < v.u.d->n; i++) l->items[l->n++] = v.u.d->keys[i];
        *out = l;
        return true;
    }
    case SP_JV_STR: {
        const struct sp_jstr *s = v.u.s;
        struct sp_jlist *l = sp_jlist_new(rt->a, s->nchars);
        if (!l) return sp_jrt_oom(rt, at);
        for (size_t i = 0; i < s->len;) {
            size_t j = i + 1;
            while (j < s->len && ((unsigned char)s->s[j] & 0xc0) == 0x80) j++;
            if (l->n == l->cap || !sp_jv_str(rt->a, s->s + i, j - i, &l->items[l->n])) return sp_jrt_oom(rt, at);
            l->n++;
            i = j;
        }
        *out = l;
        return true;
    }
    case SP_JV_UNDEF: case SP_JV_NONE:
        *out = sp_jlist_new(rt->a, 0);
        return *out || sp_jrt_oom(rt, at);
    default: return sp_jrt_fail(rt, at, SP_E_FORMAT, "cannot iterate over a %s", sp_jv_type_name(v));
    }
}

/* The loop object's keys, in the order its values are updated. */
enum { L_INDEX, L_INDEX0, L_REVINDEX, L_REVINDEX0, L_FIRST, L_LAST, L_LENGTH, L_PREV, L_NEXT, L_DEPTH, L_DEPTH0, L_COUNT };
static const char *const k_loop_keys[L_COUNT] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                                 "length", "previtem", "nextitem", "depth", "depth0"};

static bool exec_for(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc) {
    struct sp_jv seq;
    struct sp_jlist *items = NULL;
    if (!sp_jrt_eval(rt, n->a, sc, &seq) || !iter_items(rt, n, seq, &items)) return false;
    struct sp_jscope *ls = scope_new(rt, sc);
    if (!ls) return sp_jrt_oom(rt, n);
    if (n->b) { /* for x in xs if cond: the loop sees only the items that pass */
        struct sp_jlist *kept = sp_jlist_new(rt->a, 0);
        if (!kept) return sp_jrt_oom(rt, n);
        for (size_t i = 0; i < items->n; i++) {
            struct sp_jv c;
            if (!sp_jrt_tick(rt, n) || !bind(rt, n, ls, n->names, n->n_names, items->items[i]) ||
                !sp_jrt_eval(rt, n->b, ls, &c))
                return false;
            if (sp_jv_truthy(c) && !sp_jlist_push(rt->a, kept, items->items[i])) return sp_jrt_oom(rt, n);
        }
        items = kept;
    }
    if (items->n == 0) {
        int flow = FLOW_NONE;
        return exec_body(rt, n->kids2, n->n_kids2, sc, &flow);
    }
    struct sp_jdict *loop = sp_jdict_new(rt->a, L_COUNT);
    if (!loop) return sp_jrt_oom(rt, n);
    loop->kind = SP_JDICT_LOOP;
    for (int k = 0; k < L_COUNT; k++)
        if (!sp_jdict_set_str(rt->a, loop, k_loop_keys[k], sp_jv_undef())) return sp_jrt_oom(rt, n);
    if (!sp_jdict_set_str(rt->a, ls->vars, "loop", (struct sp_jv){.type = SP_JV_DICT, .u.d = loop}))
        return sp_jrt_oom(rt, n);
    const int64_t len = (int64_t)items->n;
    for (int64_t i = 0; i < len; i++) {
        if (!sp_jrt_tick(rt, n)) return false;
        struct sp_jv *v = loop->vals;
        v[L_INDEX] = sp_jv_int(i + 1);
        v[L_INDEX0] = sp_jv_int(i);
        v[L_REVINDEX] = sp_jv_int(len - i);
        v[L_REVINDEX0] = sp_jv_int(len - i - 1);
        v[L_FIRST] = sp_jv_bool(i == 0);
        v[L_LAST] = sp_jv_bool(i == len - 1);
        v[L_LENGTH] = sp_jv_int(len);
        v[L_PREV] = i > 0 ? items->items[i - 1] : sp_jv_undef();
        v[L_NEXT] = i + 1 < len ? items->items[i + 1] : sp_jv_undef();
        v[L_DEPTH] = sp_jv_int(1);
        v[L_DEPTH0] = sp_jv_int(0);
        if (!bind(rt, n, ls, n->names, n->n_names, items->items[i])) return false;
        int flow = FLOW_NONE;
        if (!exec_body(rt, n->kids, n->n_kids, ls, &flow)) return false;
        if (flow == FLOW_BREAK) break;
    }
    return true;
}

static bool exec_stmt(struct sp_jrt *rt, const struct sp_jnode *n, struct sp_jscope *sc, int *flow) {
    struct sp_jv v;
    switch (n->kind) {
    case SP_JN_TEXT:
        sp_jbuf_put(rt->out, n->str->s, n->str->len);
        return out_check(rt, n);
    case SP_JN_OUTPUT:
        if (!sp_jrt_eval(rt, n->a, sc, &v)) return false;
        if (!sp_jv_write_str(rt->out, v, VALUE_DEPTH))
            return sp_jrt_fail(rt, n, SP_E_FORMAT, "a value nested more than %d levels deep (a cycle?)", VALUE_DEPTH);
        return out_check(rt, n);
    case SP_JN_IF:
        if (!sp_jrt_eval(rt, n->a, sc, &v)) return false;
        if (sp_jv_truthy(v)) return exec_body(rt, n->kids, n->n_kids, sc, flow);
        return exec_body(rt, n->kids2, n->n_kids2, sc, flow);
    case SP_JN_FOR: return exec_for(rt, n, sc);
    case SP_JN_SET:
        if (!sp_jrt_eval(rt, n->a, sc, &v)) return false;
        if (n->c) {
            struct sp_jv ns = lookup(rt, sc, n->c->str);
            if (ns.type != SP_JV_DICT)
                return sp_jrt_fail(rt, n, SP_E_FORMAT, "cannot set an attribute of a %s ('%s' is not a namespace)",
                                   sp_jv_type_name(ns), n->c->str->s);
            return sp_jdict_set(rt->a, ns.u.d, sp_jv_strv(n->str), v) || sp_jrt_oom(rt, n);
        }
        return bind(rt, n, sc, n->names, n->n_names, v);
    case SP_JN_SET_BLOCK:
        if (!capture(rt, n, n->kids, n->n_kids, sc, &v, flow)) return false;
        if (n->b && !apply_filter(rt, n->b, sc, v, &v)) return false;
        return assign(rt, n, sc, n->str, v);
    case SP_JN_MACRO: {
        struct sp_jmacro *m = sp_jarena_alloc(rt->a, sizeof *m);
        if (!m) return sp_jrt_oom(rt, n);
        m->def = n;
        m->closure = sc;
        return assign(rt, n, sc, n->str, (struct sp_jv){.type = SP_JV_MACRO, .u.m = m});
    }
    case SP_JN_FILTER_BLOCK:
        if (!capture(rt, n, n->kids, n->n_kids, sc, &v, flow) || !apply_filter(rt, n->b, sc, v, &v)) return false;
        if (!sp_jv_write_str(rt->out, v, VALUE_DEPTH))
            return sp_jrt_fail(rt, n, SP_E_FORMAT, "a value nested more than %d levels deep (a cycle?)", VALUE_DEPTH);
        return out_check(rt, n);
    case SP_JN_BREAK: *flow = FLOW_BREAK; return true;
    case SP_JN_CONTINUE: *flow = FLOW_CONTINUE; return true;
    case SP_JN_DO: return sp_jrt_eval(rt, n->a, sc, &v);
    case SP_JN_BLOCK: return exec_body(rt, n->kids, n->n_kids, sc, flow);
    default: return sp_jrt_fail(rt, n, SP_E_FORMAT, "not a statement");
    }
}

static bool exec_body(struct sp_jrt *rt, struct sp_jnode *const *kids, uint32_t n, struct sp_jscope *sc, int *flow) {
    for (uint32_t i = 0; i < n && *flow == FLOW_NONE; i++) {
        if (!enter(rt, kids[i])) return false;
        const bool ok = exec_stmt(rt, kids[i], sc, flow);
        rt->depth--;
        if (!ok) return false;
    }
    return true;
}

/* ---- contexts and rendering ---------------------------------------------------------------- */

bool sp_jinja_ctx_init(struct sp_jinja_ctx *ctx, const struct sp_jinja_limits *lim) {
    memset(ctx, 0, sizeof *ctx);
    ctx->lim = sp_jinja_limits_or_default(lim);
    ctx->arena.limit = ctx->lim.max_memory;
    ctx->vars = sp_jdict_new(&ctx->arena, 8);
    return ctx->vars != NULL;
}

/* Frees every value of the context; ctx may be initialised again. */
void sp_jinja_ctx_free(struct sp_jinja_ctx *ctx) {
    sp_jarena_free(&ctx->arena);
    ctx->vars = NULL;
}

/* Set variable name (v must live in ctx->arena or outlive the render). */
bool sp_jinja_ctx_set(struct sp_jinja_ctx *ctx, const char *name, struct sp_jv v) {
    return sp_jdict_set_str(&ctx->arena, ctx->vars, name, v);
}

/* Render p over ctx (see jinja.h). */
sp_status sp_jinja_render(const struct sp_jinja_program *p, struct sp_jinja_ctx *ctx, char **out, size_t *len,
                          struct sp_jinja_error *err) {
    *out = NULL;
    *len = 0;
    memset(err, 0, sizeof *err);
    struct sp_jbuf buf = {.limit = ctx->lim.max_output};
    struct sp_jscope root = {.parent = NULL, .vars = ctx->vars};
    /* the template's own variables shadow the caller's without changing them */
    struct sp_jscope *top = NULL;
    struct sp_jrt rt = {.ctx = ctx, .a = &ctx->arena, .out = &buf, .root = &root, .err = err};
    if (!(top = scope_new(&rt, &root))) {
        sp_jrt_oom(&rt, p->root);
    } else {
        int flow = FLOW_NONE;
        if (exec_body(&rt, p->root->kids, p->root->n_kids, top, &flow) && !buf.p) sp_jbuf_put(&buf, "", 0);
    }
    if (rt.failed) {
        sp_jbuf_free(&buf);
        return err->st;
    }
    if (!buf.p) { /* empty output: still hand back a string */
        buf.p = sp_malloc(1);
        if (!buf.p) {
            err->st = SP_E_NOMEM;
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return SP_E_NOMEM;
        }
        buf.p[0] = '\0';
    }
    *out = buf.p;
    *len = buf.n;
    return SP_OK;
}
