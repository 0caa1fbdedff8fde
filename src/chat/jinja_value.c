/*
 * jinja_value.c -- the values chat templates compute with: an arena that
 * owns them, strings, lists and insertion-ordered dicts, Python truthiness
 * and equality, Python's str()/repr() text of a value, JSON as Python's
 * json.dumps writes it (Hugging Face's tojson), and a JSON reader for the
 * messages and variables a caller passes.  Not the interpreter
 * (jinja_eval.c) and not the filters (jinja_builtins.c).
 */
#include "chat/jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- arena ------------------------------------------------------------------ */

struct sp_jarena_block {
    struct sp_jarena_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK = 64 * 1024 };

/* 16-byte aligned memory that lives until sp_jarena_free.  See jinja.h. */
void *sp_jarena_alloc(struct sp_jarena *a, size_t n) {
    if (a->over) return NULL;
    const size_t need = (n + 15) & ~(size_t)15;
    if (need < n || (a->limit && (need > a->limit || a->used > a->limit - need))) {
        a->over = true;
        return NULL;
    }
    struct sp_jarena_block *b = a->head;
    if (!b || b->size - b->used < need) {
        const size_t size = need > ARENA_BLOCK / 4 ? need : ARENA_BLOCK;
        b = sp_malloc(sizeof *b + size);
        if (!b) {
            a->over = a->nomem = true;
            return NULL;
        }
        b->size = size;
        b->used = 0;
        if (size == need && a->head) { /* a big one-off: keep the current block for small ones */
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += need;
    a->used += need;
    return p;
}

/* Frees every block; the arena is empty and usable again. */
void sp_jarena_free(struct sp_jarena *a) {
    struct sp_jarena_block *b = a->head;
    while (b) {
        struct sp_jarena_block *next = b->next;
        sp_free(b);
        b = next;
    }
    a->head = NULL;
    a->used = 0;
    a->over = a->nomem = false;
}

/* ---- strings, lists, dicts ------------------------------------------------- */

/* A copy of s[0..n) with a NUL after it, in arena a; NULL if exhausted. */
const struct sp_jstr *sp_jstr_new(struct sp_jarena *a, const char *s, size_t n) {
    if (n > SIZE_MAX - sizeof(struct sp_jstr) - 1) {
        a->over = true;
        return NULL;
    }
    struct sp_jstr *r = sp_jarena_alloc(a, sizeof *r + n + 1);
    if (!r) return NULL;
    r->len = n;
    r->nchars = sp_jutf8_count(s, n);
    if (n) memcpy(r->s, s, n);
    r->s[n] = '\0';
    return r;
}

/* A string value holding a copy of s[0..n); false if the arena is exhausted. */
bool sp_jv_str(struct sp_jarena *a, const char *s, size_t n, struct sp_jv *out) {
    const struct sp_jstr *r = sp_jstr_new(a, s, n);
    if (!r) return false;
    *out = sp_jv_strv(r);
    return true;
}

/* An empty list with room for cap items. */
struct sp_jlist *sp_jlist_new(struct sp_jarena *a, size_t cap) {
    struct sp_jlist *l = sp_jarena_alloc(a, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap;
    l->items = NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof *l->items || !(l->items = sp_jarena_alloc(a, cap * sizeof *l->items))) {
            a->over = true;
            return NULL;
        }
    }
    return l;
}

/* Grow an item array to hold one more (doubling; the old copy stays in the arena). */
static bool grow(struct sp_jarena *a, struct sp_jv **items, size_t n, size_t *cap) {
    if (n < *cap) return true;
    const size_t nc = *cap ? *cap * 2 : 4;
    if (nc > SIZE_MAX / sizeof **items) {
        a->over = true;
        return false;
    }
    struct sp_jv *p = sp_jarena_alloc(a, nc * sizeof *p);
    if (!p) return false;
    if (n) memcpy(p, *items, n * sizeof *p);
    *items = p;
    *cap = nc;
    return true;
}

/* Append v to l; false if the arena is exhausted (l unchanged). */
bool sp_jlist_push(struct sp_jarena *a, struct sp_jlist *l, struct sp_jv v) {
    if (!grow(a, &l->items, l->n, &l->cap)) return false;
    l->items[l->n++] = v;
    return true;
}

/* An empty plain dict with room for cap entries. */
struct sp_jdict *sp_jdict_new(struct sp_jarena *a, size_t cap) {
    struct sp_jdict *d = sp_jarena_alloc(a, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap) {
        if (cap > SIZE_MAX / sizeof *d->keys || !(d->keys = sp_jarena_alloc(a, cap * sizeof *d->keys)) ||
            !(d->vals = sp_jarena_alloc(a, cap * sizeof *d->vals))) {
            a->over = true;
            return NULL;
        }
        d->cap = cap;
    }
    return d;
}

/* Index of the entry whose key equals k, or -1. */
long sp_jdict_find(const struct sp_jdict *d, struct sp_jv k) {
    if (k.type == SP_JV_STR) return sp_jdict_find_str(d, k.u.s->s, k.u.s->len);
    for (size_t i = 0; i < d->n; i++)
        if (sp_jv_equal(d->keys[i], k, 8)) return (long)i;
    return -1;
}

/* Index of the entry whose key is the string s[0..n), or -1. */
long sp_jdict_find_str(const struct sp_jdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++) {
        const struct sp_jv *k = &d->keys[i];
        if (k->type == SP_JV_STR && k->u.s->len == n && memcmp(k->u.s->s, s, n) == 0) return (long)i;
    }
    return -1;
}

/* Insert key k with value v, or replace the value of an equal key in place. */
bool sp_jdict_set(struct sp_jarena *a, struct sp_jdict *d, struct sp_jv k, struct sp_jv v) {
    const long i = sp_jdict_find(d, k);
    if (i >= 0) {
        d->vals[i] = v;
        return true;
    }
    size_t kc = d->cap, vc = d->cap;
    if (!grow(a, &d->keys, d->n, &kc) || !grow(a, &d->vals, d->n, &vc)) return false;
    d->cap = kc;
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    return true;
}

/* sp_jdict_set with a C string key (copied into the arena when new). */
bool sp_jdict_set_str(struct sp_jarena *a, struct sp_jdict *d, const char *k, struct sp_jv v) {
    const long i = sp_jdict_find_str(d, k, strlen(k));
    if (i >= 0) {
        d->vals[i] = v;
        return true;
    }
    struct sp_jv key;
    return sp_jv_str(a, k, strlen(k), &key) && sp_jdict_set(a, d, key, v);
}

/* Drop entry i, keeping the order of the rest.  note: call only with i < d->n. */
void sp_jdict_remove(struct sp_jdict *d, size_t i) {
    memmove(d->keys + i, d->keys + i + 1, (d->n - i - 1) * sizeof *d->keys);
    memmove(d->vals + i, d->vals + i + 1, (d->n - i - 1) * sizeof *d->vals);
    d->n--;
}

/* ---- truthiness, equality, names ------------------------------------------------ */

bool sp_jv_truthy(struct sp_jv v) {
    switch (v.type) {
    case SP_JV_BOOL: return v.u.b;
    case SP_JV_INT: return v.u.i != 0;
    case SP_JV_FLOAT: return v.u.f != 0.0;
    case SP_JV_STR: return v.u.s->len != 0;
    case SP_JV_LIST: return v.u.l->n != 0;
    case SP_JV_DICT: return v.u.d->kind != SP_JDICT_PLAIN || v.u.d->n != 0;
    case SP_JV_FUNC: case SP_JV_MACRO: return true;
    default: return false;
    }
}

static bool is_num(struct sp_jv v) {
    return v.type == SP_JV_INT || v.type == SP_JV_FLOAT || v.type == SP_JV_BOOL;
}

static double num_of(struct sp_jv v) {
    return v.type == SP_JV_FLOAT ? v.u.f : v.type == SP_JV_INT ? (double)v.u.i : (double)v.u.b;
}

/* Python ==: numbers across int/float/bool, strings by bytes, lists and
 * dicts deeply (dicts regardless of order), undefined only equals undefined. */
bool sp_jv_equal(struct sp_jv a, struct sp_jv b, int depth) {
    if (is_num(a) && is_num(b)) {
        if (a.type != SP_JV_FLOAT && b.type != SP_JV_FLOAT) {
            const int64_t x = a.type == SP_JV_INT ? a.u.i : a.u.b, y = b.type == SP_JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num_of(a) == num_of(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case SP_JV_UNDEF: case SP_JV_NONE: return true;
    case SP_JV_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case SP_JV_LIST:
        if (a.u.l == b.u.l) return true;
        if (a.u.l->n != b.u.l->n || depth <= 0) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!sp_jv_equal(a.u.l->items[i], b.u.l->items[i], depth - 1)) return false;
        return true;
    case SP_JV_DICT:
        if (a.u.d == b.u.d) return true;
        if (a.u.d->n != b.u.d->n || depth <= 0) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const long j = sp_jdict_find(b.u.d, a.u.d->keys[i]);
            if (j < 0 || !sp_jv_equal(a.u.d->vals[i], b.u.d->vals[j], depth - 1)) return false;
        }
        return true;
    case SP_JV_FUNC: return a.u.fn == b.u.fn;
    case SP_JV_MACRO: return a.u.m == b.u.m;
    default: return false;
    }
}

/* A constant name of v's type for messages. */
const char *sp_jv_type_name(struct sp_jv v) {
    switch (v.type) {
    case SP_JV_UNDEF: return "undefined";
    case SP_JV_NONE: return "none";
    case SP_JV_BOOL: return "boolean";
    case SP_JV_INT: return "integer";
    case SP_JV_FLOAT: return "float";
    case SP_JV_STR: return "string";
    case SP_JV_LIST: return "list";
    case SP_JV_DICT: return v.u.d->kind == SP_JDICT_NAMESPACE ? "namespace" : v.u.d->kind == SP_JDICT_LOOP ? "loop" : "dict";
    case SP_JV_FUNC: return "function";
    case SP_JV_MACRO: return "macro";
    default: return "?";
    }
}

/* ---- text builders ------------------------------------------------------------ */

void sp_jbuf_put(struct sp_jbuf *b, const char *s, size_t n) {
    if (b->over || n == 0) return;
    if (b->limit && (n > b->limit || b->n > b->limit - n)) {
        b->over = true;
        return;
    }
    if (b->cap - b->n <= n) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc - b->n <= n) {
            if (nc > SIZE_MAX / 2) {
                b->over = true;
                return;
            }
            nc *= 2;
        }
        char *p = sp_realloc(b->p, nc);
        if (!p) {
            b->over = b->nomem = true;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Append one byte. */
void sp_jbuf_putc(struct sp_jbuf *b, char c) {
    sp_jbuf_put(b, &c, 1);
}

/* Append formatted text (at most 127 bytes per call: numbers and escapes). */
void sp_jbuf_printf(struct sp_jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sp_jbuf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Free the bytes; b is empty and usable again. */
void sp_jbuf_free(struct sp_jbuf *b) {
    sp_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- Python str / repr ------------------------------------------------------------ */

/* Python's float repr: the shortest digits that read back as f, fixed
 * notation for decimal exponents -4 .. 15, otherwise d.ddde+XX. */
void sp_jv_write_float(struct sp_jbuf *b, double f) {
    if (isnan(f)) {
        sp_jbuf_put(b, "nan", 3);
        return;
    }
    if (isinf(f)) {
        sp_jbuf_put(b, f < 0 ? "-inf" : "inf", f < 0 ? 4 : 3);
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    if (prec > 17) prec = 17;
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    const bool neg = *p == '-';
    if (neg) p++;
    char digits[20];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    const int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sp_jbuf_putc(b, '-');
    if (e >= -4 && e < 16) {
        if (e < 0) {
            sp_jbuf_put(b, "0.", 2);
            for (int i = 0; i < -e - 1; i++) sp_jbuf_putc(b, '0');
            sp_jbuf_put(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= e; i++) sp_jbuf_putc(b, i < nd ? digits[i] : '0');
            sp_jbuf_putc(b, '.');
            if (nd > e + 1)
                sp_jbuf_put(b, digits + e + 1, (size_t)(nd - e - 1));
            else
                sp_jbuf_putc(b, '0');
        }
    } else {
        sp_jbuf_putc(b, digits[0]);
        if (nd > 1) {
            sp_jbuf_putc(b, '.');
            sp_jbuf_put(b, digits + 1, (size_t)(nd - 1));
        }
        sp_jbuf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* A string as Python's repr quotes it. */
static void write_str_repr(struct sp_jbuf *b, const struct sp_jstr *s) {
    const bool dq = memchr(s->s, '\'', s->len) && !memchr(s->s, '"', s->len);
    const char q = dq ? '"' : '\'';
    sp_jbuf_putc(b, q);
    for (size_t i = 0; i < s->len; i++) {
        const unsigned char c = (unsigned char)s->s[i];
        if (c == (unsigned char)q || c == '\\') {
            sp_jbuf_putc(b, '\\');
            sp_jbuf_putc(b, (char)c);
        } else if (c == '\n') {
            sp_jbuf_put(b, "\\n", 2);
        } else if (c == '\r') {
            sp_jbuf_put(b, "\\r", 2);
        } else if (c == '\t') {
            sp_jbuf_put(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            sp_jbuf_printf(b, "\\x%02x", c);
        } else {
            sp_jbuf_putc(b, (char)c);
        }
    }
    sp_jbuf_putc(b, q);
}

/* Python repr(v) appended to b; false past depth levels of nesting. */
bool sp_jv_write_repr(struct sp_jbuf *b, struct sp_jv v, int depth) {
    if (depth <= 0) return false;
    switch (v.type) {
    case SP_JV_STR: write_str_repr(b, v.u.s); return true;
    case SP_JV_LIST:
        sp_jbuf_putc(b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sp_jbuf_put(b, ", ", 2);
            if (!sp_jv_write_repr(b, v.u.l->items[i], depth - 1)) return false;
        }
        sp_jbuf_putc(b, ']');
        return true;
    case SP_JV_DICT:
        if (v.u.d->kind == SP_JDICT_NAMESPACE) sp_jbuf_put(b, "<Namespace ", 11);
        sp_jbuf_putc(b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sp_jbuf_put(b, ", ", 2);
            if (!sp_jv_write_repr(b, v.u.d->keys[i], depth - 1)) return false;
            sp_jbuf_put(b, ": ", 2);
            if (!sp_jv_write_repr(b, v.u.d->vals[i], depth - 1)) return false;
        }
        sp_jbuf_putc(b, '}');
        if (v.u.d->kind == SP_JDICT_NAMESPACE) sp_jbuf_putc(b, '>');
        return true;
    case SP_JV_UNDEF: return true; /* as str: "" */
    default: return sp_jv_write_str(b, v, depth);
    }
}

/* Python str(v) appended to b (undefined: nothing); false past depth levels. */
bool sp_jv_write_str(struct sp_jbuf *b, struct sp_jv v, int depth) {
    switch (v.type) {
    case SP_JV_UNDEF: return true;
    case SP_JV_NONE: sp_jbuf_put(b, "None", 4); return true;
    case SP_JV_BOOL: sp_jbuf_put(b, v.u.b ? "True" : "False", v.u.b ? 4 : 5); return true;
    case SP_JV_INT: sp_jbuf_printf(b, "%lld", (long long)v.u.i); return true;
    case SP_JV_FLOAT: sp_jv_write_float(b, v.u.f); return true;
    case SP_JV_STR: sp_jbuf_put(b, v.u.s->s, v.u.s->len); return true;
    case SP_JV_FUNC: sp_jbuf_put(b, "<built-in function>", 19); return true;
    case SP_JV_MACRO: sp_jbuf_put(b, "<macro>", 7); return true;
    default: return sp_jv_write_repr(b, v, depth);
    }
}

/* ---- JSON out ---------------------------------------------------------------------- */

static void json_str(struct sp_jbuf *b, const char *s, size_t n) {
    sp_jbuf_putc(b, '"');
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default: break;
        }
        if (!esc && c >= 0x20) {
            run++;
            continue;
        }
        sp_jbuf_put(b, s + i - run, run);
        run = 0;
        if (esc)
            sp_jbuf_put(b, esc, 2);
        else
            sp_jbuf_printf(b, "\\u%04x", c);
    }
    sp_jbuf_put(b, s + n - run, run);
    sp_jbuf_putc(b, '"');
}

static void json_nl(struct sp_jbuf *b, int indent, int level) {
    sp_jbuf_putc(b, '\n');
    for (int i = 0; i < indent * level; i++) sp_jbuf_putc(b, ' ');
}

/* Stable insertion sort of entry indices by key text (sort_keys; dicts are small). */
static void sorted_order(const struct sp_jdict *d, size_t *ord) {
    for (size_t i = 0; i < d->n; i++) {
        size_t j = i;
        ord[i] = i;
        while (j > 0) {
            const struct sp_jv x = d->keys[ord[j - 1]], y = d->keys[ord[j]];
            if (x.type != SP_JV_STR || y.type != SP_JV_STR) break;
            const size_t m = x.u.s->len < y.u.s->len ? x.u.s->len : y.u.s->len;
            int c = memcmp(x.u.s->s, y.u.s->s, m);
            if (c == 0) c = x.u.s->len < y.u.s->len ? -1 : x.u.s->len > y.u.s->len;
            if (c <= 0) break;
            const size_t t = ord[j - 1];
            ord[j - 1] = ord[j];
            ord[j] = t;
            j--;
        }
    }
}

static bool json_val(struct sp_jbuf *b, struct sp_jv v, int indent, bool sort_keys, int level, int depth) {
    if (depth <= 0) return false;
    switch (v.type) {
    case SP_JV_UNDEF: case SP_JV_NONE: sp_jbuf_put(b, "null", 4); return true;
    case SP_JV_BOOL: sp_jbuf_put(b, v.u.b ? "true" : "false", v.u.b ? 4 : 5); return true;
    case SP_JV_INT: sp_jbuf_printf(b, "%lld", (long long)v.u.i); return true;
    case SP_JV_FLOAT:
        if (isnan(v.u.f))
            sp_jbuf_put(b, "NaN", 3);
        else if (isinf(v.u.f))
            sp_jbuf_put(b, v.u.f < 0 ? "-Infinity" : "Infinity", v.u.f < 0 ? 9 : 8);
        else
            sp_jv_write_float(b, v.u.f);
        return true;
    case SP_JV_STR: json_str(b, v.u.s->s, v.u.s->len); return true;
    case SP_JV_LIST: {
        const struct sp_jlist *l = v.u.l;
        if (l->n == 0) {
            sp_jbuf_put(b, "[]", 2);
            return true;
        }
        sp_jbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) sp_jbuf_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) json_nl(b, indent, level + 1);
            if (!json_val(b, l->items[i], indent, sort_keys, level + 1, depth - 1)) return false;
        }
        if (indent >= 0) json_nl(b, indent, level);
        sp_jbuf_putc(b, ']');
        return true;
    }
    case SP_JV_DICT: {
        const struct sp_jdict *d = v.u.d;
        if (d->n == 0) {
            sp_jbuf_put(b, "{}", 2);
            return true;
        }
        size_t small[32], *ord = d->n <= 32 ? small : sp_malloc(d->n * sizeof *ord);
        if (!ord) {
            b->over = b->nomem = true;
            return true;
        }
        if (sort_keys) {
            sorted_order(d, ord);
        } else {
            for (size_t i = 0; i < d->n; i++) ord[i] = i;
        }
        bool ok = true;
        sp_jbuf_putc(b, '{');
        for (size_t k = 0; ok && k < d->n; k++) {
            const size_t i = ord[k];
            if (k) sp_jbuf_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) json_nl(b, indent, level + 1);
            const struct sp_jv key = d->keys[i];
            if (key.type == SP_JV_STR) {
                json_str(b, key.u.s->s, key.u.s->len);
            } else if (key.type == SP_JV_INT || key.type == SP_JV_FLOAT || key.type == SP_JV_BOOL ||
                       key.type == SP_JV_NONE) {
                /* Python turns these keys into strings: 1 -> "1", True -> "true" */
                struct sp_jbuf kb = {0};
                json_val(&kb, key, -1, false, 0, 2);
                json_str(b, kb.p ? kb.p : "", kb.n);
                if (kb.nomem) b->over = b->nomem = true;
                sp_jbuf_free(&kb);
            } else {
                ok = false;
                break;
            }
            sp_jbuf_put(b, ": ", 2);
            ok = json_val(b, d->vals[i], indent, sort_keys, level + 1, depth - 1);
        }
        if (ord != small) sp_free(ord);
        if (!ok) return false;
        if (indent >= 0) json_nl(b, indent, level);
        sp_jbuf_putc(b, '}');
        return true;
    }
    default: return false;
    }
}

/* JSON as json.dumps writes it (see jinja.h). */
bool sp_jv_write_json(struct sp_jbuf *b, struct sp_jv v, int indent, bool sort_keys, int depth) {
    return json_val(b, v, indent, sort_keys, 0, depth);
}

/* ---- JSON in ------------------------------------------------------------------------ */

struct jin {
    const char *s;
    size_t n, pos;
    struct sp_jarena *a;
    struct sp_jinja_error *err;
    const char *what;
};

static bool jin_fail(struct jin *j, const char *msg) {
    /* line and column of pos in the JSON text */
    uint32_t line = 1, col = 1;
    for (size_t i = 0; i < j->pos && i < j->n; i++) {
        if (j->s[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)j->s[i] & 0xc0) != 0x80) {
            col++;
        }
    }
    j->err->st = j->a->nomem ? SP_E_NOMEM : SP_E_FORMAT;
    j->err->line = line;
    j->err->col = col;
    snprintf(j->err->msg, sizeof j->err->msg, "%s: invalid JSON: %s", j->what, msg);
    return false;
}

static void jin_ws(struct jin *j) {
    while (j->pos < j->n && (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' || j->s[j->pos] == '\n' ||
                             j->s[j->pos] == '\r'))
        j->pos++;
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool jin_string(struct jin *j, struct sp_jv *out) {
    j->pos++; /* opening quote */
    /* the unescaped text is never longer than the escaped */
    size_t end = j->pos;
    while (end < j->n && j->s[end] != '"') end += j->s[end] == '\\' ? 2 : 1;
    if (end >= j->n) return jin_fail(j, "unterminated string");
    char *buf = sp_jarena_alloc(j->a, end - j->pos + 1);
    if (!buf) return jin_fail(j, "out of memory");
    size_t k = 0;
    while (j->s[j->pos] != '"') {
        const unsigned char c = (unsigned char)j->s[j->pos];
        if (c < 0x20) return jin_fail(j, "control character in a string");
        if (c != '\\') {
            buf[k++] = (char)c;
            j->pos++;
            continue;
        }
        const char e = j->s[j->pos + 1];
        j->pos += 2;
        switch (e) {
        case '"': buf[k++] = '"'; break;
        case '\\': buf[k++] = '\\'; break;
        case '/': buf[k++] = '/'; break;
        case 'b': buf[k++] = '\b'; break;
        case 'f': buf[k++] = '\f'; break;
        case 'n': buf[k++] = '\n'; break;
        case 'r': buf[k++] = '\r'; break;
        case 't': buf[k++] = '\t'; break;
        case 'u': {
            if (j->pos + 4 > end) return jin_fail(j, "short \\u escape");
            int cp = hex4(j->s + j->pos);
            if (cp < 0) return jin_fail(j, "bad \\u escape");
            j->pos += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && j->pos + 6 <= end && j->s[j->pos] == '\\' && j->s[j->pos + 1] == 'u') {
                const int lo = hex4(j->s + j->pos + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    j->pos += 6;
                }
            }
            if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* a lone surrogate */
            k += sp_utf8_put((uint32_t)cp, buf + k);
            break;
        }
        default: j->pos -= 1; return jin_fail(j, "bad escape");
        }
    }
    j->pos++;
    buf[k] = '\0';
    const struct sp_jstr *s = sp_jstr_new(j->a, buf, k);
    if (!s) return jin_fail(j, "out of memory");
    *out = sp_jv_strv(s);
    return true;
}

static bool jin_number(struct jin *j, struct sp_jv *out) {
    const size_t start = j->pos;
    bool is_float = false;
    if (j->s[j->pos] == '-') j->pos++;
    if (j->pos >= j->n || j->s[j->pos] < '0' || j->s[j->pos] > '9') return jin_fail(j, "bad number");
    while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') j->pos++;
    if (j->pos < j->n && j->s[j->pos] == '.') {
        is_float = true;
        j->pos++;
        if (j->pos >= j->n || j->s[j->pos] < '0' || j->s[j->pos] > '9') return jin_fail(j, "bad number");
        while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') j->pos++;
    }
    if (j->pos < j->n && (j->s[j->pos] == 'e' || j->s[j->pos] == 'E')) {
        is_float = true;
        j->pos++;
        if (j->pos < j->n && (j->s[j->pos] == '+' || j->s[j->pos] == '-')) j->pos++;
        if (j->pos >= j->n || j->s[j->pos] < '0' || j->s[j->pos] > '9') return jin_fail(j, "bad number");
        while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') j->pos++;
    }
    char tmp[64];
    const size_t len = j->pos - start;
    if (len >= sizeof tmp) is_float = true; /* too long for int64 anyway */
    char *num = len < sizeof tmp ? tmp : sp_jarena_alloc(j->a, len + 1);
    if (!num) return jin_fail(j, "out of memory");
    memcpy(num, j->s + start, len);
    num[len] = '\0';
    if (!is_float) {
        char *endp;
        errno = 0;
        const long long v = strtoll(num, &endp, 10);
        if (errno == 0) {
            *out = sp_jv_int(v);
            return true;
        }
    }
    *out = sp_jv_float(strtod(num, NULL));
    return true;
}

static bool jin_value(struct jin *j, struct sp_jv *out, int depth) {
    jin_ws(j);
    if (j->pos >= j->n) return jin_fail(j, "unexpected end");
    if (depth > 256) return jin_fail(j, "nested deeper than 256");
    const char c = j->s[j->pos];
    if (c == '{') {
        struct sp_jdict *d = sp_jdict_new(j->a, 0);
        if (!d) return jin_fail(j, "out of memory");
        j->pos++;
        jin_ws(j);
        if (j->pos < j->n && j->s[j->pos] == '}') {
            j->pos++;
        } else {
            for (;;) {
                jin_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != '"') return jin_fail(j, "expected a string key");
                struct sp_jv k, v;
                if (!jin_string(j, &k)) return false;
                jin_ws(j);
                if (j->pos >= j->n || j->s[j->pos] != ':') return jin_fail(j, "expected ':'");
                j->pos++;
                if (!jin_value(j, &v, depth + 1)) return false;
                if (!sp_jdict_set(j->a, d, k, v)) return jin_fail(j, "out of memory");
                jin_ws(j);
                if (j->pos < j->n && j->s[j->pos] == ',') {
                    j->pos++;
                    continue;
                }
                if (j->pos < j->n && j->s[j->pos] == '}') {
                    j->pos++;
                    break;
                }
                return jin_fail(j, "expected ',' or '}'");
            }
        }
        *out = (struct sp_jv){.type = SP_JV_DICT, .u.d = d};
        return true;
    }
    if (c == '[') {
        struct sp_jlist *l = sp_jlist_new(j->a, 0);
        if (!l) return jin_fail(j, "out of memory");
        j->pos++;
        jin_ws(j);
        if (j->pos < j->n && j->s[j->pos] == ']') {
            j->pos++;
        } else {
            for (;;) {
                struct sp_jv v;
                if (!jin_value(j, &v, depth + 1)) return false;
                if (!sp_jlist_push(j->a, l, v)) return jin_fail(j, "out of memory");
                jin_ws(j);
                if (j->pos < j->n && j->s[j->pos] == ',') {
                    j->pos++;
                    continue;
                }
                if (j->pos < j->n && j->s[j->pos] == ']') {
                    j->pos++;
                    break;
                }
                return jin_fail(j, "expected ',' or ']'");
            }
        }
        *out = (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
        return true;
    }
    if (c == '"') return jin_string(j, out);
    if (c == '-' || (c >= '0' && c <= '9')) return jin_number(j, out);
    static const struct {
        const char *w;
        uint8_t type;
        bool b;
    } words[] = {{"true", SP_JV_BOOL, true}, {"false", SP_JV_BOOL, false}, {"null", SP_JV_NONE, false}};
    for (size_t i = 0; i < SP_ARRAY_LEN(words); i++) {
        const size_t wl = strlen(words[i].w);
        if (j->n - j->pos >= wl && memcmp(j->s + j->pos, words[i].w, wl) == 0) {
            j->pos += wl;
            *out = words[i].type == SP_JV_BOOL ? sp_jv_bool(words[i].b) : sp_jv_none();
            return true;
        }
    }
    return jin_fail(j, "unexpected character");
}

/* JSON text -> a value in arena a (see jinja.h); false with err filled. */
bool sp_jv_parse_json(struct sp_jarena *a, const char *text, size_t len, const char *what, struct sp_jv *out,
                      struct sp_jinja_error *err) {
    struct jin j = {.s = text, .n = len, .pos = 0, .a = a, .err = err, .what = what};
    if (!jin_value(&j, out, 0)) return false;
    jin_ws(&j);
    if (j.pos != j.n) return jin_fail(&j, "text after the value");
    return true;
}

/* ---- UTF-8 -------------------------------------------------------------------------- */

size_t sp_jutf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* The byte offset where character ci of s[0..n) starts, n past the end. */
size_t sp_jutf8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0, c = 0;
    while (i < n) {
        if (((unsigned char)s[i] & 0xc0) != 0x80) {
            if (c == ci) return i;
            c++;
        }
        i++;
    }
    return n;
}
