/*
 * jinja_builtins.c -- what a template can call: filters (x | name), tests
 * (x is name), methods of strings, lists, dicts and the loop object
 * (x.name(...)), global functions (range, namespace, dict, raise_exception,
 * strftime_now) and Python's % string formatting.  Each follows Jinja2 /
 * Python semantics for the arguments chat templates pass; the list is in
 * docs/CHAT.md.  Case mapping and whitespace are ASCII's (other characters
 * pass through unchanged).
 */
#include "chat/jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { DEPTH = 64 };

/* ---- argument helpers ------------------------------------------------------------ */

/* Positional argument i, else the keyword argument name; NULL if neither. */
static const struct sp_jv *arg(const struct sp_jargs *a, uint32_t i, const char *name) {
    if (i < a->n_pos) return &a->pos[i];
    if (name)
        for (uint32_t k = 0; k < a->n_kw; k++)
            if (strcmp(a->names[k]->s, name) == 0) return &a->kw[k];
    return NULL;
}

/* At most max_pos positional arguments and keywords only from kw (NULL-terminated). */
static bool check_args(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jargs *a, uint32_t max_pos,
                       const char *const *kw, const char *what) {
    if (a->n_pos > max_pos)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s takes at most %u positional arguments (%u given)", what, max_pos,
                           a->n_pos);
    for (uint32_t k = 0; k < a->n_kw; k++) {
        bool ok = false;
        for (const char *const *w = kw; w && *w && !ok; w++) ok = strcmp(*w, a->names[k]->s) == 0;
        if (!ok) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s got an unexpected argument '%s'", what, a->names[k]->s);
    }
    return true;
}

static bool want_str(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jv *v, const char *what) {
    if (v && v->type == SP_JV_STR) return true;
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s needs a string, not a %s", what, v ? sp_jv_type_name(*v) : "nothing");
}

static bool want_int(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jv *v, const char *what,
                     int64_t *out) {
    if (v && (v->type == SP_JV_INT || v->type == SP_JV_BOOL)) {
        *out = v->type == SP_JV_INT ? v->u.i : v->u.b;
        return true;
    }
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s needs an integer, not a %s", what, v ? sp_jv_type_name(*v) : "nothing");
}

static bool mkstr(struct sp_jrt *rt, const struct sp_jnode *at, const char *s, size_t n, struct sp_jv *out) {
    return sp_jv_str(rt->a, s, n, out) || sp_jrt_oom(rt, at);
}

static bool from_buf(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jbuf *b, struct sp_jv *out) {
    bool ok;
    if (b->over)
        ok = b->nomem ? sp_jrt_fail(rt, at, SP_E_NOMEM, "out of memory")
                      : sp_jrt_fail(rt, at, SP_E_FORMAT, "a string longer than %zu bytes (the output limit)",
                                    rt->ctx->lim.max_output);
    else
        ok = mkstr(rt, at, b->p ? b->p : "", b->n, out);
    sp_jbuf_free(b);
    return ok;
}

static struct sp_jbuf newbuf(struct sp_jrt *rt) {
    return (struct sp_jbuf){.limit = rt->ctx->lim.max_output};
}

static bool mklist(struct sp_jrt *rt, const struct sp_jnode *at, size_t cap, struct sp_jlist **out) {
    *out = sp_jlist_new(rt->a, cap);
    return *out || sp_jrt_oom(rt, at);
}

static struct sp_jv listv(struct sp_jlist *l) {
    return (struct sp_jv){.type = SP_JV_LIST, .u.l = l};
}

static bool push(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jlist *l, struct sp_jv v) {
    return sp_jlist_push(rt->a, l, v) || sp_jrt_oom(rt, at);
}

static bool pair(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv k, struct sp_jv v, struct sp_jv *out) {
    struct sp_jlist *l;
    if (!mklist(rt, at, 2, &l)) return false;
    l->items[0] = k;
    l->items[1] = v;
    l->n = 2;
    *out = listv(l);
    return true;
}

/* The items of anything iterable as a list (a string's characters, a dict's keys). */
static bool to_list(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv v, struct sp_jlist **out) {
    if (v.type == SP_JV_LIST) {
        *out = v.u.l;
        return true;
    }
    if (v.type == SP_JV_DICT) {
        if (!mklist(rt, at, v.u.d->n, out)) return false;
        for (size_t i = 0; i < v.u.d->n; i++) (*out)->items[(*out)->n++] = v.u.d->keys[i];
        return true;
    }
    if (v.type == SP_JV_STR) {
        const struct sp_jstr *s = v.u.s;
        if (!mklist(rt, at, 0, out)) return false;
        for (size_t i = 0; i < s->len;) {
            size_t j = i + 1;
            while (j < s->len && ((unsigned char)s->s[j] & 0xc0) == 0x80) j++;
            struct sp_jv c;
            if (!mkstr(rt, at, s->s + i, j - i, &c) || !push(rt, at, *out, c)) return false;
            i = j;
        }
        return true;
    }
    if (v.type == SP_JV_UNDEF || v.type == SP_JV_NONE) return mklist(rt, at, 0, out);
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "a %s is not iterable", sp_jv_type_name(v));
}

/* obj's attribute path "a.b.0" (as the attribute= arguments take). */
static bool get_path(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv obj, const struct sp_jstr *path,
                     struct sp_jv *out) {
    size_t i = 0;
    *out = obj;
    while (i <= path->len) {
        size_t j = i;
        while (j < path->len && path->s[j] != '.') j++;
        struct sp_jv key;
        bool digits = j > i;
        for (size_t k = i; k < j; k++) digits = digits && path->s[k] >= '0' && path->s[k] <= '9';
        if (digits && out->type == SP_JV_LIST) {
            key = sp_jv_int(strtoll(path->s + i, NULL, 10));
        } else if (!mkstr(rt, at, path->s + i, j - i, &key)) {
            return false;
        }
        if (!sp_jrt_getitem(rt, at, *out, key, out)) return false;
        i = j + 1;
    }
    return true;
}

/* ---- ASCII character helpers ---------------------------------------------------------- */

static bool is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}
static bool is_alpha(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}
static char lower(char c) {
    return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
}
static char upper(char c) {
    return c >= 'a' && c <= 'z' ? (char)(c - 32) : c;
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE };
static bool change_case(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, int mode, struct sp_jv *out) {
    char *p = sp_jarena_alloc(rt->a, s->len + 1);
    if (!p) return sp_jrt_oom(rt, at);
    bool word = false;
    for (size_t i = 0; i < s->len; i++) {
        const char c = s->s[i];
        switch (mode) {
        case CASE_UPPER: p[i] = upper(c); break;
        case CASE_LOWER: p[i] = lower(c); break;
        case CASE_TITLE: p[i] = word ? lower(c) : upper(c); break;
        default: p[i] = i == 0 ? upper(c) : lower(c); break;
        }
        word = is_alpha((unsigned char)c) || ((unsigned char)c >= 0x80 && word);
    }
    return mkstr(rt, at, p, s->len, out);
}

/* Does s[i..] start with one of the characters of set (UTF-8, NULL = whitespace)?
 * Returns its byte length, 0 if not. */
static size_t strip_char_at(const struct sp_jstr *s, size_t i, const struct sp_jstr *set) {
    if (!set) return is_space((unsigned char)s->s[i]) ? 1 : 0;
    for (size_t k = 0; k < set->len;) {
        size_t e = k + 1;
        while (e < set->len && ((unsigned char)set->s[e] & 0xc0) == 0x80) e++;
        if (e - k <= s->len - i && memcmp(s->s + i, set->s + k, e - k) == 0) return e - k;
        k = e;
    }
    return 0;
}

/* The byte length of the character ending at s[end) that is in set, 0 if none. */
static size_t strip_char_before(const struct sp_jstr *s, size_t end, const struct sp_jstr *set) {
    size_t b = end - 1;
    while (b > 0 && ((unsigned char)s->s[b] & 0xc0) == 0x80) b--;
    return strip_char_at(s, b, set) == end - b ? end - b : 0;
}

static bool strip(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, const struct sp_jv *chars,
                  bool left, bool right, struct sp_jv *out) {
    const struct sp_jstr *set = NULL;
    if (chars && chars->type != SP_JV_NONE && chars->type != SP_JV_UNDEF) {
        if (!want_str(rt, at, chars, "strip")) return false;
        set = chars->u.s;
    }
    size_t b = 0, e = s->len, k;
    if (left)
        while (b < e && (k = strip_char_at(s, b, set)) > 0) b += k;
    if (right)
        while (e > b && (k = strip_char_before(s, e, set)) > 0) e -= k;
    if (b == 0 && e == s->len) {
        *out = sp_jv_strv(s);
        return true;
    }
    return mkstr(rt, at, s->s + b, e - b, out);
}

static bool replace(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, const struct sp_jv *old,
                    const struct sp_jv *rep, const struct sp_jv *count, struct sp_jv *out) {
    if (!want_str(rt, at, old, "replace") || !want_str(rt, at, rep, "replace")) return false;
    int64_t max = -1;
    if (count && count->type != SP_JV_NONE && !want_int(rt, at, count, "replace", &max)) return false;
    struct sp_jbuf b = newbuf(rt);
    const struct sp_jstr *o = old->u.s, *r = rep->u.s;
    size_t i = 0;
    int64_t done = 0;
    if (o->len == 0) { /* Python inserts the replacement around every character */
        for (; i <= s->len && (max < 0 || done < max); done++) {
            sp_jbuf_put(&b, r->s, r->len);
            if (i == s->len) {
                i++;
                break;
            }
            size_t j = i + 1;
            while (j < s->len && ((unsigned char)s->s[j] & 0xc0) == 0x80) j++;
            sp_jbuf_put(&b, s->s + i, j - i);
            i = j;
        }
        if (i <= s->len) sp_jbuf_put(&b, s->s + i, s->len - i);
        return from_buf(rt, at, &b, out);
    }
    while (i < s->len && (max < 0 || done < max)) {
        const char *m = memmem(s->s + i, s->len - i, o->s, o->len);
        if (!m) break;
        const size_t at_i = (size_t)(m - s->s);
        sp_jbuf_put(&b, s->s + i, at_i - i);
        sp_jbuf_put(&b, r->s, r->len);
        i = at_i + o->len;
        done++;
        if (b.over) break;
    }
    sp_jbuf_put(&b, s->s + i, s->len - i);
    return from_buf(rt, at, &b, out);
}

/* Python str.split / rsplit (sep NULL: runs of whitespace, no empty parts). */
static bool split(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, const struct sp_jv *sepv,
                  const struct sp_jv *maxv, bool from_right, struct sp_jv *out) {
    const struct sp_jstr *sep = NULL;
    if (sepv && sepv->type != SP_JV_NONE) {
        if (!want_str(rt, at, sepv, "split")) return false;
        sep = sepv->u.s;
        if (sep->len == 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "split: empty separator");
    }
    int64_t max = -1;
    if (maxv && !want_int(rt, at, maxv, "split", &max)) return false;
    struct sp_jlist *l;
    if (!mklist(rt, at, 0, &l)) return false;
    /* collect [begin, end) spans, then reverse them for rsplit */
    struct span {
        size_t b, e;
    };
    struct sp_jbuf spans = newbuf(rt);
    int64_t n = 0;
    if (!sep) {
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                while (i < s->len && is_space((unsigned char)s->s[i])) i++;
                if (i >= s->len) break;
                size_t j = i;
                if (max >= 0 && n == max) {
                    j = s->len;
                    while (j > i && is_space((unsigned char)s->s[j - 1])) j--;
                } else {
                    while (j < s->len && !is_space((unsigned char)s->s[j])) j++;
                }
                const struct span sp = {i, j};
                sp_jbuf_put(&spans, (const char *)&sp, sizeof sp);
                n++;
                i = j;
            }
        } else {
            size_t e = s->len;
            for (;;) {
                while (e > 0 && is_space((unsigned char)s->s[e - 1])) e--;
                if (e == 0) break;
                size_t b = e;
                if (max >= 0 && n == max) {
                    b = 0;
                    while (b < e && is_space((unsigned char)s->s[b])) b++;
                } else {
                    while (b > 0 && !is_space((unsigned char)s->s[b - 1])) b--;
                }
                const struct span sp = {b, e};
                sp_jbuf_put(&spans, (const char *)&sp, sizeof sp);
                n++;
                e = b;
            }
        }
    } else if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *m = max >= 0 && n == max ? NULL : memmem(s->s + i, s->len - i, sep->s, sep->len);
            const size_t j = m ? (size_t)(m - s->s) : s->len;
            const struct span sp = {i, j};
            sp_jbuf_put(&spans, (const char *)&sp, sizeof sp);
            n++;
            if (!m) break;
            i = j + sep->len;
        }
    } else {
        size_t e = s->len;
        for (;;) {
            size_t b = 0;
            bool found = false;
            if (!(max >= 0 && n == max)) {
                for (size_t k = e; k >= sep->len; k--) {
                    if (memcmp(s->s + k - sep->len, sep->s, sep->len) == 0) {
                        b = k;
                        found = true;
                        break;
                    }
                }
            }
            const struct span sp = {b, e};
            sp_jbuf_put(&spans, (const char *)&sp, sizeof sp);
            n++;
            if (!found) break;
            e = b - sep->len;
        }
    }
    if (spans.over) {
        sp_jbuf_free(&spans);
        return sp_jrt_oom(rt, at);
    }
    const struct span *sp = (const struct span *)spans.p;
    for (int64_t k = 0; k < n; k++) {
        const struct span x = sp[from_right ? n - 1 - k : k];
        struct sp_jv part;
        if (!mkstr(rt, at, s->s + x.b, x.e - x.b, &part) || !push(rt, at, l, part)) {
            sp_jbuf_free(&spans);
            return false;
        }
    }
    sp_jbuf_free(&spans);
    *out = listv(l);
    return true;
}

static bool starts_ends(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, const struct sp_jv *x,
                        bool ends, struct sp_jv *out) {
    if (x && x->type == SP_JV_LIST) {
        for (size_t i = 0; i < x->u.l->n; i++) {
            if (!starts_ends(rt, at, s, &x->u.l->items[i], ends, out)) return false;
            if (out->u.b) return true;
        }
        *out = sp_jv_bool(false);
        return true;
    }
    if (!want_str(rt, at, x, ends ? "endswith" : "startswith")) return false;
    const struct sp_jstr *p = x->u.s;
    const bool r = p->len <= s->len && memcmp(ends ? s->s + s->len - p->len : s->s, p->s, p->len) == 0;
    *out = sp_jv_bool(r);
    return true;
}

/* Python str.format: {} {0} {name}, {{ and }}; format specs are ignored. */
static bool str_format(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *f, const struct sp_jargs *a,
                       struct sp_jv *out) {
    struct sp_jbuf b = newbuf(rt);
    uint32_t auto_i = 0;
    for (size_t i = 0; i < f->len; i++) {
        const char c = f->s[i];
        if ((c == '{' || c == '}') && i + 1 < f->len && f->s[i + 1] == c) {
            sp_jbuf_putc(&b, c);
            i++;
            continue;
        }
        if (c != '{') {
            sp_jbuf_putc(&b, c);
            continue;
        }
        const char *close = memchr(f->s + i, '}', f->len - i);
        if (!close) {
            sp_jbuf_free(&b);
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "format: '{' without '}'");
        }
        size_t name_end = i + 1;
        while (f->s + name_end < close && f->s[name_end] != ':' && f->s[name_end] != '!') name_end++;
        const struct sp_jv *v = NULL;
        if (name_end == i + 1) {
            v = auto_i < a->n_pos ? &a->pos[auto_i] : NULL;
            auto_i++;
        } else if (is_digit((unsigned char)f->s[i + 1])) {
            const long k = strtol(f->s + i + 1, NULL, 10);
            v = k >= 0 && (uint32_t)k < a->n_pos ? &a->pos[k] : NULL;
        } else {
            for (uint32_t k = 0; k < a->n_kw && !v; k++)
                if (a->names[k]->len == name_end - i - 1 && memcmp(a->names[k]->s, f->s + i + 1, name_end - i - 1) == 0)
                    v = &a->kw[k];
        }
        if (!v) {
            sp_jbuf_free(&b);
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "format: no argument for '%.*s'", (int)(close - (f->s + i) + 1),
                               f->s + i);
        }
        if (!sp_jv_write_str(&b, *v, DEPTH)) {
            sp_jbuf_free(&b);
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "format: a value nested too deeply");
        }
        i = (size_t)(close - f->s);
    }
    return from_buf(rt, at, &b, out);
}

/* ---- % formatting ----------------------------------------------------------------------- */

bool sp_jinja_percent(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *fmt, struct sp_jv args,
                      struct sp_jv *out) {
    const struct sp_jv *list = NULL;
    size_t n_list = 1, next = 0;
    if (args.type == SP_JV_LIST) {
        list = args.u.l->items;
        n_list = args.u.l->n;
    } else {
        list = &args;
    }
    struct sp_jbuf b = newbuf(rt);
    const struct sp_jstr *f = fmt;
    for (size_t i = 0; i < f->len; i++) {
        if (f->s[i] != '%') {
            sp_jbuf_putc(&b, f->s[i]);
            continue;
        }
        if (++i >= f->len) goto bad;
        if (f->s[i] == '%') {
            sp_jbuf_putc(&b, '%');
            continue;
        }
        const struct sp_jv *v = NULL;
        if (f->s[i] == '(') {
            const char *close = memchr(f->s + i, ')', f->len - i);
            if (!close || args.type != SP_JV_DICT) goto bad;
            const long k = sp_jdict_find_str(args.u.d, f->s + i + 1, (size_t)(close - f->s - i - 1));
            if (k < 0) goto bad;
            v = &args.u.d->vals[k];
            i = (size_t)(close - f->s) + 1;
        }
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        while (i < f->len && strchr("-+ #0", f->s[i]) && sn < 8) spec[sn++] = f->s[i++];
        while (i < f->len && is_digit((unsigned char)f->s[i]) && sn < 16) spec[sn++] = f->s[i++];
        if (i < f->len && f->s[i] == '.') {
            spec[sn++] = f->s[i++];
            while (i < f->len && is_digit((unsigned char)f->s[i]) && sn < 24) spec[sn++] = f->s[i++];
        }
        if (i >= f->len) goto bad;
        const char conv = f->s[i];
        if (!v) {
            if (next >= n_list) {
                sp_jbuf_free(&b);
                return sp_jrt_fail(rt, at, SP_E_FORMAT, "not enough arguments for format string");
            }
            v = &list[next++];
        }
        char tmp[128];
        switch (conv) {
        case 's': case 'r': {
            struct sp_jbuf sb = newbuf(rt);
            if (!(conv == 's' ? sp_jv_write_str(&sb, *v, DEPTH) : sp_jv_write_repr(&sb, *v, DEPTH)) || sb.over) {
                sp_jbuf_free(&sb);
                goto bad;
            }
            spec[sn++] = 's';
            spec[sn] = '\0';
            if (sn == 2) {
                sp_jbuf_put(&b, sb.p ? sb.p : "", sb.n);
            } else {
                const int w = snprintf(tmp, sizeof tmp, spec, sb.p ? sb.p : "");
                sp_jbuf_put(&b, tmp, w > 0 ? ((size_t)w < sizeof tmp ? (size_t)w : sizeof tmp - 1) : 0);
            }
            sp_jbuf_free(&sb);
            break;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': case 'c': {
            if (v->type != SP_JV_INT && v->type != SP_JV_BOOL && v->type != SP_JV_FLOAT) goto bad;
            const long long x = v->type == SP_JV_FLOAT ? (long long)v->u.f : v->type == SP_JV_INT ? v->u.i : v->u.b;
            if (conv == 'c') {
                sp_jbuf_putc(&b, (char)x);
                break;
            }
            spec[sn++] = 'l';
            spec[sn++] = 'l';
            spec[sn++] = conv == 'i' ? 'd' : conv;
            spec[sn] = '\0';
            const int w = snprintf(tmp, sizeof tmp, spec, x);
            sp_jbuf_put(&b, tmp, w > 0 ? ((size_t)w < sizeof tmp ? (size_t)w : sizeof tmp - 1) : 0);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            if (v->type != SP_JV_INT && v->type != SP_JV_BOOL && v->type != SP_JV_FLOAT) goto bad;
            const double x = v->type == SP_JV_FLOAT ? v->u.f : v->type == SP_JV_INT ? (double)v->u.i : v->u.b;
            spec[sn++] = conv;
            spec[sn] = '\0';
            const int w = snprintf(tmp, sizeof tmp, spec, x);
            sp_jbuf_put(&b, tmp, w > 0 ? ((size_t)w < sizeof tmp ? (size_t)w : sizeof tmp - 1) : 0);
            break;
        }
        default: goto bad;
        }
    }
    if (args.type == SP_JV_LIST && next < n_list) {
        sp_jbuf_free(&b);
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "not all arguments converted during string formatting");
    }
    return from_buf(rt, at, &b, out);
bad:
    sp_jbuf_free(&b);
    return sp_jrt_fail(rt, at, SP_E_FORMAT, "bad %% format string or argument");
}

/* ---- sorting ------------------------------------------------------------------------------ */

struct sortctx {
    struct sp_jrt *rt;
    const struct sp_jnode *at;
    bool fold;    /* compare strings case-insensitively */
    bool reverse;
    bool failed;
};

static int cmp_fold(const struct sp_jstr *a, const struct sp_jstr *b) {
    const size_t m = a->len < b->len ? a->len : b->len;
    for (size_t i = 0; i < m; i++) {
        const char x = lower(a->s[i]), y = lower(b->s[i]);
        if (x != y) return (unsigned char)x < (unsigned char)y ? -1 : 1;
    }
    return (a->len > b->len) - (a->len < b->len);
}

static int cmp_keys(struct sortctx *c, struct sp_jv a, struct sp_jv b) {
    int r = 0;
    if (c->failed) return 0;
    if (c->fold && a.type == SP_JV_STR && b.type == SP_JV_STR)
        r = cmp_fold(a.u.s, b.u.s);
    else if (!sp_jrt_compare(c->rt, c->at, a, b, &r))
        c->failed = true;
    return c->reverse ? -r : r;
}

/* Stable merge sort of items by keys (keys[i] belongs to items[i]). */
static void merge_sort(struct sortctx *c, struct sp_jv *items, struct sp_jv *keys, struct sp_jv *ti, struct sp_jv *tk,
                       size_t n) {
    if (n < 2 || c->failed) return;
    const size_t h = n / 2;
    merge_sort(c, items, keys, ti, tk, h);
    merge_sort(c, items + h, keys + h, ti, tk, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (cmp_keys(c, keys[j], keys[i]) < 0) {
            ti[k] = items[j];
            tk[k++] = keys[j++];
        } else {
            ti[k] = items[i];
            tk[k++] = keys[i++];
        }
    }
    while (i < h) {
        ti[k] = items[i];
        tk[k++] = keys[i++];
    }
    while (j < n) {
        ti[k] = items[j];
        tk[k++] = keys[j++];
    }
    memcpy(items, ti, n * sizeof *items);
    memcpy(keys, tk, n * sizeof *keys);
}

/* A sorted copy of l, by attribute path attr (NULL: the items), or by the
 * pairs' key/value (by = 0 / 1; -1: not pairs). */
static bool sorted(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jlist *l, const struct sp_jstr *attr,
                   int by, bool fold, bool reverse, struct sp_jlist **out) {
    struct sp_jlist *r;
    uint64_t log2n = 1;
    while ((1ull << log2n) < l->n) log2n++;
    if (!sp_jrt_charge(rt, at, l->n * log2n)) return false;
    if (!mklist(rt, at, l->n, &r)) return false;
    struct sp_jv *keys = sp_jarena_alloc(rt->a, (l->n + 1) * sizeof *keys);
    struct sp_jv *ti = sp_jarena_alloc(rt->a, (l->n + 1) * sizeof *ti);
    struct sp_jv *tk = sp_jarena_alloc(rt->a, (l->n + 1) * sizeof *tk);
    if (!keys || !ti || !tk) return sp_jrt_oom(rt, at);
    for (size_t i = 0; i < l->n; i++) {
        r->items[i] = l->items[i];
        if (attr) {
            if (!get_path(rt, at, l->items[i], attr, &keys[i])) return false;
        } else if (by >= 0 && l->items[i].type == SP_JV_LIST && l->items[i].u.l->n == 2) {
            keys[i] = l->items[i].u.l->items[by];
        } else {
            keys[i] = l->items[i];
        }
    }
    r->n = l->n;
    struct sortctx c = {.rt = rt, .at = at, .fold = fold, .reverse = reverse};
    merge_sort(&c, r->items, keys, ti, tk, r->n);
    if (c.failed) return false;
    *out = r;
    return true;
}

/* ---- filters -------------------------------------------------------------------------------- */

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_FORMAT, F_INDENT,
    F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_PPRINT, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE,
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_COUNT_
};

static const struct {
    const char *name;
    int id;
} k_filters[] = {
    {"abs", F_ABS},         {"attr", F_ATTR},           {"capitalize", F_CAPITALIZE}, {"center", F_CENTER},
    {"default", F_DEFAULT}, {"d", F_DEFAULT},           {"dictsort", F_DICTSORT},     {"escape", F_ESCAPE},
    {"e", F_ESCAPE},        {"first", F_FIRST},         {"float", F_FLOAT},           {"format", F_FORMAT},
    {"indent", F_INDENT},   {"int", F_INT},             {"items", F_ITEMS},           {"join", F_JOIN},
    {"last", F_LAST},       {"length", F_LENGTH},       {"count", F_LENGTH},          {"list", F_LIST},
    {"lower", F_LOWER},     {"map", F_MAP},             {"max", F_MAX},               {"min", F_MIN},
    {"pprint", F_PPRINT},   {"reject", F_REJECT},       {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE},
    {"reverse", F_REVERSE}, {"round", F_ROUND},         {"safe", F_SAFE},             {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"sort", F_SORT},     {"string", F_STRING},         {"sum", F_SUM},
    {"title", F_TITLE},     {"tojson", F_TOJSON},       {"trim", F_TRIM},             {"unique", F_UNIQUE},
    {"upper", F_UPPER},     {"wordcount", F_WORDCOUNT},
};

/* The id of filter name[0..n) (aliases share one), -1 if there is none. */
int sp_jinja_filter_id(const char *name, size_t n) {
    for (size_t i = 0; i < SP_ARRAY_LEN(k_filters); i++)
        if (strlen(k_filters[i].name) == n && memcmp(k_filters[i].name, name, n) == 0) return k_filters[i].id;
    return -1;
}

/* select / reject / selectattr / rejectattr */
static bool filter_select(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jargs *a,
                          bool by_attr, bool keep, struct sp_jv *out) {
    struct sp_jlist *items, *r;
    if (!to_list(rt, at, in, &items) || !mklist(rt, at, 0, &r)) return false;
    uint32_t first = 0;
    const struct sp_jstr *attr = NULL;
    if (by_attr) {
        const struct sp_jv *av = arg(a, 0, NULL);
        if (!want_str(rt, at, av, "selectattr")) return false;
        attr = av->u.s;
        first = 1;
    }
    int test = -1;
    if (a->n_pos > first) {
        if (!want_str(rt, at, &a->pos[first], "select")) return false;
        test = sp_jinja_test_id(a->pos[first].u.s->s, a->pos[first].u.s->len);
        if (test < 0) return sp_jrt_fail(rt, at, SP_E_UNSUPPORTED, "unknown test '%s'", a->pos[first].u.s->s);
    }
    const struct sp_jargs targs = {.pos = a->n_pos > first + 1 ? a->pos + first + 1 : NULL,
                                   .n_pos = a->n_pos > first + 1 ? a->n_pos - first - 1 : 0};
    for (size_t i = 0; i < items->n; i++) {
        struct sp_jv v = items->items[i];
        if (attr && !get_path(rt, at, v, attr, &v)) return false;
        bool r_ok;
        if (test >= 0) {
            if (!sp_jinja_test(rt, at, test, v, &targs, &r_ok)) return false;
        } else {
            r_ok = sp_jv_truthy(v);
        }
        if (r_ok == keep && !push(rt, at, r, items->items[i])) return false;
    }
    *out = listv(r);
    return true;
}

static bool filter_map(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jargs *a,
                       struct sp_jv *out) {
    struct sp_jlist *items, *r;
    if (!to_list(rt, at, in, &items) || !mklist(rt, at, items->n, &r)) return false;
    const struct sp_jv *attr = arg(a, a->n_pos, "attribute"), *dflt = arg(a, a->n_pos, "default");
    if (attr) {
        if (!want_str(rt, at, attr, "map")) return false;
        for (size_t i = 0; i < items->n; i++) {
            struct sp_jv v;
            if (!get_path(rt, at, items->items[i], attr->u.s, &v)) return false;
            if (v.type == SP_JV_UNDEF && dflt) v = *dflt;
            r->items[r->n++] = v;
        }
        *out = listv(r);
        return true;
    }
    if (a->n_pos == 0 || a->pos[0].type != SP_JV_STR)
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "map needs a filter name or attribute=");
    const int f = sp_jinja_filter_id(a->pos[0].u.s->s, a->pos[0].u.s->len);
    if (f < 0) return sp_jrt_fail(rt, at, SP_E_UNSUPPORTED, "unknown filter '%s'", a->pos[0].u.s->s);
    const struct sp_jargs fa = {.pos = a->pos + 1, .n_pos = a->n_pos - 1, .names = a->names, .kw = a->kw, .n_kw = a->n_kw};
    for (size_t i = 0; i < items->n; i++)
        if (!sp_jinja_filter(rt, at, f, items->items[i], &fa, &r->items[r->n++])) return false;
    *out = listv(r);
    return true;
}

static bool filter_minmax(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jargs *a,
                          bool want_max, struct sp_jv *out) {
    struct sp_jlist *items;
    if (!to_list(rt, at, in, &items)) return false;
    const struct sp_jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    if (attr && !want_str(rt, at, attr, "min/max")) return false;
    struct sortctx c = {.rt = rt, .at = at, .fold = !(cs && sp_jv_truthy(*cs))};
    *out = sp_jv_undef();
    struct sp_jv best_key = sp_jv_undef();
    for (size_t i = 0; i < items->n; i++) {
        struct sp_jv k = items->items[i];
        if (attr && !get_path(rt, at, k, attr->u.s, &k)) return false;
        if (i == 0 || (want_max ? cmp_keys(&c, k, best_key) > 0 : cmp_keys(&c, k, best_key) < 0)) {
            *out = items->items[i];
            best_key = k;
        }
        if (c.failed) return false;
    }
    return true;
}

static bool filter_indent(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s,
                          const struct sp_jargs *a, struct sp_jv *out) {
    const struct sp_jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    char pad_buf[256];
    const char *pad = "    ";
    size_t pad_n = 4;
    if (w && w->type == SP_JV_STR) {
        pad = w->u.s->s;
        pad_n = w->u.s->len;
    } else if (w) {
        int64_t n = 0;
        if (!want_int(rt, at, w, "indent", &n)) return false;
        if (n < 0) n = 0;
        if (n > (int64_t)sizeof pad_buf) return sp_jrt_fail(rt, at, SP_E_FORMAT, "indent width %lld too large", (long long)n);
        memset(pad_buf, ' ', (size_t)n);
        pad = pad_buf;
        pad_n = (size_t)n;
    }
    const bool ind_first = first && sp_jv_truthy(*first), ind_blank = blank && sp_jv_truthy(*blank);
    struct sp_jbuf b = newbuf(rt);
    size_t i = 0;
    bool line0 = true;
    while (i <= s->len) {
        size_t j = i;
        while (j < s->len && s->s[j] != '\n') j++;
        const bool empty = j == i;
        if ((line0 ? ind_first : true) && (!empty || ind_blank) && !(j == s->len && empty && !line0))
            sp_jbuf_put(&b, pad, pad_n);
        sp_jbuf_put(&b, s->s + i, j - i);
        if (j < s->len) sp_jbuf_putc(&b, '\n');
        line0 = false;
        i = j + 1;
    }
    return from_buf(rt, at, &b, out);
}

static bool filter_int(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jargs *a,
                       struct sp_jv *out) {
    const struct sp_jv *dflt = arg(a, 0, "default"), *basev = arg(a, 1, "base");
    int64_t base = 10;
    if (basev && !want_int(rt, at, basev, "int", &base)) return false;
    *out = dflt ? *dflt : sp_jv_int(0);
    switch (in.type) {
    case SP_JV_INT: *out = in; break;
    case SP_JV_BOOL: *out = sp_jv_int(in.u.b); break;
    case SP_JV_FLOAT:
        if (isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) *out = sp_jv_int((int64_t)in.u.f);
        break;
    case SP_JV_STR: {
        char *end;
        errno = 0;
        const long long v = strtoll(in.u.s->s, &end, (int)(base >= 2 && base <= 36 ? base : 10));
        while (*end && is_space((unsigned char)*end)) end++;
        if (errno == 0 && end != in.u.s->s && *end == '\0') {
            *out = sp_jv_int(v);
        } else { /* "3.7" -> 3, as Jinja's int filter falls back to float */
            const double f = strtod(in.u.s->s, &end);
            while (*end && is_space((unsigned char)*end)) end++;
            if (end != in.u.s->s && *end == '\0' && isfinite(f) && fabs(f) < 9.2e18) *out = sp_jv_int((int64_t)f);
        }
        break;
    }
    default: break;
    }
    return true;
}

static bool filter_join(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jv *sepv,
                        const struct sp_jv *attr, struct sp_jv *out) {
    struct sp_jlist *items;
    if (!to_list(rt, at, in, &items)) return false;
    if (sepv && !want_str(rt, at, sepv, "join")) return false;
    if (attr && !want_str(rt, at, attr, "join")) return false;
    struct sp_jbuf b = newbuf(rt);
    for (size_t i = 0; i < items->n; i++) {
        struct sp_jv v = items->items[i];
        if (i && sepv) sp_jbuf_put(&b, sepv->u.s->s, sepv->u.s->len);
        if (attr && !get_path(rt, at, v, attr->u.s, &v)) {
            sp_jbuf_free(&b);
            return false;
        }
        if (!sp_jv_write_str(&b, v, DEPTH)) {
            sp_jbuf_free(&b);
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "join: a value nested too deeply");
        }
    }
    return from_buf(rt, at, &b, out);
}

static bool filter_tojson(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv in, const struct sp_jargs *a,
                          struct sp_jv *out) {
    static const char *const kw[] = {"indent", "sort_keys", "ensure_ascii", "separators", NULL};
    if (!check_args(rt, at, a, 1, kw, "tojson")) return false;
    const struct sp_jv *ind = arg(a, 0, "indent"), *sk = arg(a, 99, "sort_keys");
    int64_t indent = -1;
    if (ind && ind->type != SP_JV_NONE) {
        if (!want_int(rt, at, ind, "tojson indent", &indent)) return false;
        if (indent < 0) indent = 0;
        if (indent > 64) indent = 64;
    }
    struct sp_jbuf b = newbuf(rt);
    if (!sp_jv_write_json(&b, in, (int)indent, sk && sp_jv_truthy(*sk), DEPTH)) {
        sp_jbuf_free(&b);
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "tojson: the value is not JSON (a function, or nested too deeply)");
    }
    return from_buf(rt, at, &b, out);
}

static bool escape_html(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, struct sp_jv *out) {
    struct sp_jbuf b = newbuf(rt);
    for (size_t i = 0; i < s->len; i++) {
        switch (s->s[i]) {
        case '&': sp_jbuf_put(&b, "&amp;", 5); break;
        case '<': sp_jbuf_put(&b, "&lt;", 4); break;
        case '>': sp_jbuf_put(&b, "&gt;", 4); break;
        case '"': sp_jbuf_put(&b, "&#34;", 5); break;
        case '\'': sp_jbuf_put(&b, "&#39;", 5); break;
        default: sp_jbuf_putc(&b, s->s[i]);
        }
    }
    return from_buf(rt, at, &b, out);
}

/* in | filter(args) into *out; false with the error recorded at at. */
bool sp_jinja_filter(struct sp_jrt *rt, const struct sp_jnode *at, int id, struct sp_jv in,
                     const struct sp_jargs *a, struct sp_jv *out) {
    struct sp_jlist *items, *r;
    struct sp_jv s;
    /* filters that read a string turn other values into their str() first */
    const bool stringy = id == F_CAPITALIZE || id == F_CENTER || id == F_ESCAPE || id == F_INDENT || id == F_LOWER ||
                         id == F_REPLACE || id == F_TITLE || id == F_TRIM || id == F_UPPER || id == F_WORDCOUNT ||
                         id == F_FORMAT;
    if (stringy && !sp_jrt_to_str(rt, at, in, &s)) return false;
    if (!sp_jrt_charge(rt, at, sp_jrt_size(in))) return false;
    switch (id) {
    case F_ABS:
        if (in.type == SP_JV_INT) *out = in.u.i == INT64_MIN ? sp_jv_float(-(double)in.u.i) : sp_jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
        else if (in.type == SP_JV_FLOAT) *out = sp_jv_float(fabs(in.u.f));
        else if (in.type == SP_JV_BOOL) *out = sp_jv_int(in.u.b);
        else return sp_jrt_fail(rt, at, SP_E_FORMAT, "abs needs a number, not a %s", sp_jv_type_name(in));
        return true;
    case F_ATTR: {
        const struct sp_jv *n = arg(a, 0, "name");
        return want_str(rt, at, n, "attr") && sp_jrt_getitem(rt, at, in, *n, out);
    }
    case F_CAPITALIZE: return change_case(rt, at, s.u.s, CASE_CAPITALIZE, out);
    case F_CENTER: {
        int64_t w = 80;
        const struct sp_jv *wv = arg(a, 0, "width");
        if (wv && !want_int(rt, at, wv, "center", &w)) return false;
        const size_t len = s.u.s->nchars;
        if (w <= (int64_t)len || w > 4096) {
            *out = s;
            return true;
        }
        const size_t pad = (size_t)w - len, left = pad / 2 + (pad & (size_t)w & 1); /* Python's str.center */
        struct sp_jbuf b = newbuf(rt);
        for (size_t i = 0; i < left; i++) sp_jbuf_putc(&b, ' ');
        sp_jbuf_put(&b, s.u.s->s, s.u.s->len);
        for (size_t i = left; i < pad; i++) sp_jbuf_putc(&b, ' ');
        return from_buf(rt, at, &b, out);
    }
    case F_DEFAULT: {
        const struct sp_jv *d = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        const bool use = in.type == SP_JV_UNDEF || (boolean && sp_jv_truthy(*boolean) && !sp_jv_truthy(in));
        if (!use) *out = in;
        else if (d) *out = *d;
        else return mkstr(rt, at, "", 0, out);
        return true;
    }
    case F_DICTSORT: {
        if (in.type != SP_JV_DICT) return sp_jrt_fail(rt, at, SP_E_FORMAT, "dictsort needs a dict, not a %s", sp_jv_type_name(in));
        const struct sp_jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
        int byv = 0;
        if (by) {
            if (!want_str(rt, at, by, "dictsort")) return false;
            byv = strcmp(by->u.s->s, "value") == 0 ? 1 : 0;
        }
        if (!mklist(rt, at, in.u.d->n, &items)) return false;
        for (size_t i = 0; i < in.u.d->n; i++)
            if (!pair(rt, at, in.u.d->keys[i], in.u.d->vals[i], &items->items[items->n++])) return false;
        if (!sorted(rt, at, items, NULL, byv, !(cs && sp_jv_truthy(*cs)), rev && sp_jv_truthy(*rev), &r)) return false;
        *out = listv(r);
        return true;
    }
    case F_ESCAPE: return escape_html(rt, at, s.u.s, out);
    case F_FIRST: case F_LAST:
        if (!to_list(rt, at, in, &items)) return false;
        *out = items->n ? items->items[id == F_FIRST ? 0 : items->n - 1] : sp_jv_undef();
        return true;
    case F_FLOAT: {
        const struct sp_jv *dflt = arg(a, 0, "default");
        *out = dflt ? *dflt : sp_jv_float(0.0);
        if (in.type == SP_JV_FLOAT) *out = in;
        else if (in.type == SP_JV_INT) *out = sp_jv_float((double)in.u.i);
        else if (in.type == SP_JV_BOOL) *out = sp_jv_float(in.u.b);
        else if (in.type == SP_JV_STR) {
            char *end;
            const double f = strtod(in.u.s->s, &end);
            while (*end && is_space((unsigned char)*end)) end++;
            if (end != in.u.s->s && *end == '\0') *out = sp_jv_float(f);
        }
        return true;
    }
    case F_FORMAT: {
        struct sp_jlist *l;
        if (!mklist(rt, at, a->n_pos, &l)) return false;
        for (uint32_t i = 0; i < a->n_pos; i++) l->items[l->n++] = a->pos[i];
        return sp_jinja_percent(rt, at, s.u.s, a->n_pos == 1 ? a->pos[0] : listv(l), out);
    }
    case F_INDENT: return filter_indent(rt, at, s.u.s, a, out);
    case F_INT: return filter_int(rt, at, in, a, out);
    case F_ITEMS:
        if (in.type == SP_JV_UNDEF) return mklist(rt, at, 0, &r) && (*out = listv(r), true);
        if (in.type != SP_JV_DICT) return sp_jrt_fail(rt, at, SP_E_FORMAT, "items needs a dict, not a %s", sp_jv_type_name(in));
        if (!mklist(rt, at, in.u.d->n, &r)) return false;
        for (size_t i = 0; i < in.u.d->n; i++)
            if (!pair(rt, at, in.u.d->keys[i], in.u.d->vals[i], &r->items[r->n++])) return false;
        *out = listv(r);
        return true;
    case F_JOIN: return filter_join(rt, at, in, arg(a, 0, "d"), arg(a, 1, "attribute"), out);
    case F_LENGTH:
        switch (in.type) {
        case SP_JV_STR: *out = sp_jv_int((int64_t)in.u.s->nchars); return true;
        case SP_JV_LIST: *out = sp_jv_int((int64_t)in.u.l->n); return true;
        case SP_JV_DICT: *out = sp_jv_int((int64_t)in.u.d->n); return true;
        case SP_JV_UNDEF: *out = sp_jv_int(0); return true;
        default: return sp_jrt_fail(rt, at, SP_E_FORMAT, "a %s has no length", sp_jv_type_name(in));
        }
    case F_LIST:
        if (!to_list(rt, at, in, &items) || !mklist(rt, at, items->n, &r)) return false;
        if (items->n) memcpy(r->items, items->items, items->n * sizeof *r->items);
        r->n = items->n;
        *out = listv(r);
        return true;
    case F_LOWER: return change_case(rt, at, s.u.s, CASE_LOWER, out);
    case F_MAP: return filter_map(rt, at, in, a, out);
    case F_MAX: case F_MIN: return filter_minmax(rt, at, in, a, id == F_MAX, out);
    case F_PPRINT: {
        struct sp_jbuf b = newbuf(rt);
        if (!sp_jv_write_repr(&b, in, DEPTH)) {
            sp_jbuf_free(&b);
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "pprint: a value nested too deeply");
        }
        return from_buf(rt, at, &b, out);
    }
    case F_REJECT: return filter_select(rt, at, in, a, false, false, out);
    case F_REJECTATTR: return filter_select(rt, at, in, a, true, false, out);
    case F_SELECT: return filter_select(rt, at, in, a, false, true, out);
    case F_SELECTATTR: return filter_select(rt, at, in, a, true, true, out);
    case F_REPLACE: return replace(rt, at, s.u.s, arg(a, 0, "old"), arg(a, 1, "new"), arg(a, 2, "count"), out);
    case F_REVERSE:
        if (in.type == SP_JV_STR) {
            const struct sp_jstr *x = in.u.s;
            char *p = sp_jarena_alloc(rt->a, x->len + 1);
            if (!p) return sp_jrt_oom(rt, at);
            size_t o = x->len;
            for (size_t i = 0; i < x->len;) {
                size_t j = i + 1;
                while (j < x->len && ((unsigned char)x->s[j] & 0xc0) == 0x80) j++;
                o -= j - i;
                memcpy(p + o, x->s + i, j - i);
                i = j;
            }
            return mkstr(rt, at, p, x->len, out);
        }
        if (!to_list(rt, at, in, &items) || !mklist(rt, at, items->n, &r)) return false;
        for (size_t i = 0; i < items->n; i++) r->items[r->n++] = items->items[items->n - 1 - i];
        *out = listv(r);
        return true;
    case F_ROUND: {
        int64_t prec = 0;
        const struct sp_jv *pv = arg(a, 0, "precision"), *mv = arg(a, 1, "method");
        if (pv && !want_int(rt, at, pv, "round", &prec)) return false;
        if (in.type != SP_JV_INT && in.type != SP_JV_FLOAT && in.type != SP_JV_BOOL)
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "round needs a number, not a %s", sp_jv_type_name(in));
        double x = in.type == SP_JV_FLOAT ? in.u.f : in.type == SP_JV_INT ? (double)in.u.i : in.u.b;
        if (prec > 15) prec = 15;
        if (prec < -15) prec = -15;
        const double m = pow(10.0, (double)prec);
        const char *method = mv && mv->type == SP_JV_STR ? mv->u.s->s : "common";
        if (strcmp(method, "floor") == 0) x = floor(x * m) / m;
        else if (strcmp(method, "ceil") == 0) x = ceil(x * m) / m;
        else x = round(x * m) / m;
        *out = sp_jv_float(x);
        return true;
    }
    case F_SAFE: *out = in; return true;
    case F_SORT: {
        const struct sp_jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
        if (attr && !want_str(rt, at, attr, "sort")) return false;
        if (!to_list(rt, at, in, &items)) return false;
        if (!sorted(rt, at, items, attr ? attr->u.s : NULL, -1, !(cs && sp_jv_truthy(*cs)), rev && sp_jv_truthy(*rev), &r))
            return false;
        *out = listv(r);
        return true;
    }
    case F_STRING: return sp_jrt_to_str(rt, at, in, out);
    case F_SUM: {
        const struct sp_jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
        if (attr && !want_str(rt, at, attr, "sum")) return false;
        if (!to_list(rt, at, in, &items)) return false;
        struct sp_jv acc = start ? *start : sp_jv_int(0);
        for (size_t i = 0; i < items->n; i++) {
            struct sp_jv v = items->items[i];
            if (attr && !get_path(rt, at, v, attr->u.s, &v)) return false;
            const bool ints = (acc.type == SP_JV_INT || acc.type == SP_JV_BOOL) && (v.type == SP_JV_INT || v.type == SP_JV_BOOL);
            int64_t t;
            if (ints && !__builtin_add_overflow(acc.type == SP_JV_INT ? acc.u.i : acc.u.b, v.type == SP_JV_INT ? v.u.i : v.u.b, &t)) {
                acc = sp_jv_int(t);
            } else if ((acc.type == SP_JV_INT || acc.type == SP_JV_FLOAT || acc.type == SP_JV_BOOL) &&
                       (v.type == SP_JV_INT || v.type == SP_JV_FLOAT || v.type == SP_JV_BOOL)) {
                const double x = acc.type == SP_JV_FLOAT ? acc.u.f : acc.type == SP_JV_INT ? (double)acc.u.i : acc.u.b;
                const double y = v.type == SP_JV_FLOAT ? v.u.f : v.type == SP_JV_INT ? (double)v.u.i : v.u.b;
                acc = sp_jv_float(x + y);
            } else {
                return sp_jrt_fail(rt, at, SP_E_FORMAT, "sum: cannot add a %s", sp_jv_type_name(v));
            }
        }
        *out = acc;
        return true;
    }
    case F_TITLE: return change_case(rt, at, s.u.s, CASE_TITLE, out);
    case F_TOJSON: return filter_tojson(rt, at, in, a, out);
    case F_TRIM: return strip(rt, at, s.u.s, arg(a, 0, "chars"), true, true, out);
    case F_UNIQUE: {
        const struct sp_jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
        if (attr && !want_str(rt, at, attr, "unique")) return false;
        if (!to_list(rt, at, in, &items) || !mklist(rt, at, 0, &r)) return false;
        struct sp_jlist *keys;
        if (!mklist(rt, at, 0, &keys)) return false;
        const bool fold = !(cs && sp_jv_truthy(*cs));
        for (size_t i = 0; i < items->n; i++) {
            struct sp_jv k = items->items[i];
            if (attr && !get_path(rt, at, k, attr->u.s, &k)) return false;
            if (fold && k.type == SP_JV_STR && !change_case(rt, at, k.u.s, CASE_LOWER, &k)) return false;
            bool seen = false;
            for (size_t j = 0; j < keys->n && !seen; j++) seen = sp_jv_equal(keys->items[j], k, DEPTH);
            if (!seen && (!push(rt, at, keys, k) || !push(rt, at, r, items->items[i]))) return false;
        }
        *out = listv(r);
        return true;
    }
    case F_UPPER: return change_case(rt, at, s.u.s, CASE_UPPER, out);
    case F_WORDCOUNT: {
        int64_t n = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.u.s->len; i++) {
            const unsigned char c = (unsigned char)s.u.s->s[i];
            const bool w = is_alpha(c) || is_digit(c) || c == '_' || c >= 0x80;
            if (w && !in_word) n++;
            in_word = w;
        }
        *out = sp_jv_int(n);
        return true;
    }
    default: return sp_jrt_fail(rt, at, SP_E_UNSUPPORTED, "unknown filter");
    }
}

/* ---- tests ------------------------------------------------------------------------------------- */

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_ESCAPED, T_EVEN, T_FALSE, T_FILTER, T_FLOAT, T_GE,
    T_GT, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER
};

static const struct {
    const char *name;
    int id;
} k_tests[] = {
    {"boolean", T_BOOLEAN}, {"callable", T_CALLABLE}, {"defined", T_DEFINED},   {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ},           {"equalto", T_EQ},        {"==", T_EQ},             {"escaped", T_ESCAPED},
    {"even", T_EVEN},       {"false", T_FALSE},       {"filter", T_FILTER},     {"float", T_FLOAT},
    {"ge", T_GE},           {">=", T_GE},             {"gt", T_GT},             {"greaterthan", T_GT},
    {">", T_GT},            {"in", T_IN},             {"integer", T_INTEGER},   {"iterable", T_ITERABLE},
    {"le", T_LE},           {"<=", T_LE},             {"lower", T_LOWER},       {"lt", T_LT},
    {"lessthan", T_LT},     {"<", T_LT},              {"mapping", T_MAPPING},   {"ne", T_NE},
    {"!=", T_NE},           {"none", T_NONE},         {"number", T_NUMBER},     {"odd", T_ODD},
    {"sameas", T_SAMEAS},   {"sequence", T_SEQUENCE}, {"string", T_STRING},     {"test", T_TEST},
    {"true", T_TRUE},       {"undefined", T_UNDEFINED}, {"upper", T_UPPER},
};

/* The id of test name[0..n) (aliases and symbols share one), -1 if none. */
int sp_jinja_test_id(const char *name, size_t n) {
    for (size_t i = 0; i < SP_ARRAY_LEN(k_tests); i++)
        if (strlen(k_tests[i].name) == n && memcmp(k_tests[i].name, name, n) == 0) return k_tests[i].id;
    return -1;
}

/* in is test(args) into *res; false with the error recorded at at. */
bool sp_jinja_test(struct sp_jrt *rt, const struct sp_jnode *at, int id, struct sp_jv in,
                   const struct sp_jargs *a, bool *res) {
    const struct sp_jv *x = arg(a, 0, NULL);
    if (!sp_jrt_charge(rt, at, sp_jrt_size(in) + (x ? sp_jrt_size(*x) : 0))) return false;
    const uint8_t t = in.type;
    int c;
    switch (id) {
    case T_BOOLEAN: *res = t == SP_JV_BOOL; return true;
    case T_CALLABLE: *res = t == SP_JV_FUNC || t == SP_JV_MACRO; return true;
    case T_DEFINED: *res = t != SP_JV_UNDEF; return true;
    case T_UNDEFINED: *res = t == SP_JV_UNDEF; return true;
    case T_DIVISIBLEBY: {
        int64_t d = 1, v = 0;
        if (!want_int(rt, at, x, "divisibleby", &d) || !want_int(rt, at, &in, "divisibleby", &v)) return false;
        if (d == 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "divisibleby 0");
        *res = d == -1 || v % d == 0;
        return true;
    }
    case T_EQ: case T_NE:
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "the test needs a value to compare with");
        *res = sp_jv_equal(in, *x, DEPTH) == (id == T_EQ);
        return true;
    case T_GE: case T_GT: case T_LE: case T_LT:
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "the test needs a value to compare with");
        if (!sp_jrt_compare(rt, at, in, *x, &c)) return false;
        *res = id == T_GE ? c >= 0 : id == T_GT ? c > 0 : id == T_LE ? c <= 0 : c < 0;
        return true;
    case T_ESCAPED: *res = false; return true;
    case T_EVEN: case T_ODD:
        if (t != SP_JV_INT) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s needs an integer, not a %s", id == T_EVEN ? "even" : "odd", sp_jv_type_name(in));
        *res = ((in.u.i & 1) == 0) == (id == T_EVEN);
        return true;
    case T_FALSE: *res = t == SP_JV_BOOL && !in.u.b; return true;
    case T_TRUE: *res = t == SP_JV_BOOL && in.u.b; return true;
    case T_FILTER: *res = t == SP_JV_STR && sp_jinja_filter_id(in.u.s->s, in.u.s->len) >= 0; return true;
    case T_TEST: *res = t == SP_JV_STR && sp_jinja_test_id(in.u.s->s, in.u.s->len) >= 0; return true;
    case T_FLOAT: *res = t == SP_JV_FLOAT; return true;
    case T_INTEGER: *res = t == SP_JV_INT; return true;
    case T_NUMBER: *res = t == SP_JV_INT || t == SP_JV_FLOAT || t == SP_JV_BOOL; return true;
    case T_IN: {
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "'in' test needs a container");
        if (x->type == SP_JV_STR && t == SP_JV_STR) {
            *res = in.u.s->len == 0 || memmem(x->u.s->s, x->u.s->len, in.u.s->s, in.u.s->len) != NULL;
        } else if (x->type == SP_JV_LIST) {
            *res = false;
            for (size_t i = 0; i < x->u.l->n && !*res; i++) *res = sp_jv_equal(in, x->u.l->items[i], DEPTH);
        } else if (x->type == SP_JV_DICT) {
            *res = sp_jdict_find(x->u.d, in) >= 0;
        } else {
            *res = false;
        }
        return true;
    }
    case T_ITERABLE: case T_SEQUENCE: *res = t == SP_JV_STR || t == SP_JV_LIST || t == SP_JV_DICT; return true;
    case T_MAPPING: *res = t == SP_JV_DICT; return true;
    case T_NONE: *res = t == SP_JV_NONE; return true;
    case T_STRING: *res = t == SP_JV_STR; return true;
    case T_LOWER: case T_UPPER: {
        if (t != SP_JV_STR) {
            *res = false;
            return true;
        }
        bool cased = false, ok = true;
        for (size_t i = 0; i < in.u.s->len && ok; i++) {
            const char ch = in.u.s->s[i];
            if (is_alpha((unsigned char)ch)) {
                cased = true;
                ok = id == T_LOWER ? ch == lower(ch) : ch == upper(ch);
            }
        }
        *res = cased && ok;
        return true;
    }
    case T_SAMEAS:
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "sameas needs a value");
        if (t != x->type) *res = false;
        else if (t == SP_JV_LIST) *res = in.u.l == x->u.l;
        else if (t == SP_JV_DICT) *res = in.u.d == x->u.d;
        else if (t == SP_JV_STR) *res = in.u.s == x->u.s;
        else *res = sp_jv_equal(in, *x, 1);
        return true;
    default: return sp_jrt_fail(rt, at, SP_E_UNSUPPORTED, "unknown test");
    }
}

/* ---- global functions ---------------------------------------------------------------------- */

static const char *const k_funcs[SP_JF_COUNT] = {
    [SP_JF_RANGE] = "range", [SP_JF_NAMESPACE] = "namespace", [SP_JF_RAISE] = "raise_exception",
    [SP_JF_DICT] = "dict", [SP_JF_STRFTIME] = "strftime_now"};

/* The id of global function name[0..n), -1 if none. */
int sp_jinja_func_id(const char *name, size_t n) {
    for (int i = 0; i < SP_JF_COUNT; i++)
        if (strlen(k_funcs[i]) == n && memcmp(k_funcs[i], name, n) == 0) return i;
    return -1;
}

/* A global function call (range, namespace, dict, raise_exception, strftime_now). */
bool sp_jinja_func(struct sp_jrt *rt, const struct sp_jnode *at, int fn, const struct sp_jargs *a,
                   struct sp_jv *out) {
    switch (fn) {
    case SP_JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw)
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "range takes 1 to 3 integers");
        for (uint32_t i = 0; i < a->n_pos; i++)
            if (!want_int(rt, at, &a->pos[i], "range", &v[a->n_pos == 1 ? 1 : i])) return false;
        if (v[2] == 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "range step cannot be zero");
        double count = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
        if (count < 0) count = 0;
        if (count > (double)rt->ctx->lim.max_iterations)
            return sp_jrt_fail(rt, at, SP_E_FORMAT, "range of %.0f items exceeds the iteration limit (%llu)", count,
                               (unsigned long long)rt->ctx->lim.max_iterations);
        struct sp_jlist *l;
        if (!sp_jrt_charge(rt, at, (uint64_t)count) || !mklist(rt, at, (size_t)count, &l)) return false;
        for (size_t i = 0; i < (size_t)count; i++) l->items[l->n++] = sp_jv_int(v[0] + (int64_t)i * v[2]);
        *out = listv(l);
        return true;
    }
    case SP_JF_NAMESPACE:
    case SP_JF_DICT: {
        struct sp_jdict *d = sp_jdict_new(rt->a, a->n_kw);
        if (!d) return sp_jrt_oom(rt, at);
        d->kind = fn == SP_JF_NAMESPACE ? SP_JDICT_NAMESPACE : SP_JDICT_PLAIN;
        for (uint32_t i = 0; i < a->n_pos; i++) {
            const struct sp_jv *p = &a->pos[i];
            if (p->type == SP_JV_DICT) {
                for (size_t k = 0; k < p->u.d->n; k++)
                    if (!sp_jdict_set(rt->a, d, p->u.d->keys[k], p->u.d->vals[k])) return sp_jrt_oom(rt, at);
            } else if (p->type == SP_JV_LIST) {
                for (size_t k = 0; k < p->u.l->n; k++) {
                    const struct sp_jv e = p->u.l->items[k];
                    if (e.type != SP_JV_LIST || e.u.l->n != 2)
                        return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s() needs key/value pairs", k_funcs[fn]);
                    if (!sp_jdict_set(rt->a, d, e.u.l->items[0], e.u.l->items[1])) return sp_jrt_oom(rt, at);
                }
            } else {
                return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s() takes a dict or keyword arguments", k_funcs[fn]);
            }
        }
        for (uint32_t i = 0; i < a->n_kw; i++)
            if (!sp_jdict_set(rt->a, d, sp_jv_strv(a->names[i]), a->kw[i])) return sp_jrt_oom(rt, at);
        *out = (struct sp_jv){.type = SP_JV_DICT, .u.d = d};
        return true;
    }
    case SP_JF_RAISE: {
        struct sp_jv m = sp_jv_undef();
        if (a->n_pos && !sp_jrt_to_str(rt, at, a->pos[0], &m)) return false;
        return sp_jrt_fail(rt, at, SP_E_FORMAT, "the template raised an error: %s", m.type == SP_JV_STR ? m.u.s->s : "");
    }
    case SP_JF_STRFTIME: {
        const struct sp_jv *f = arg(a, 0, "format");
        if (!want_str(rt, at, f, "strftime_now")) return false;
        char buf[256];
        const time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm)) return sp_jrt_fail(rt, at, SP_E_FORMAT, "strftime_now: no local time");
        const size_t n = f->u.s->len < 200 ? strftime(buf, sizeof buf, f->u.s->s, &tm) : 0;
        return mkstr(rt, at, buf, n, out);
    }
    default: return sp_jrt_fail(rt, at, SP_E_FORMAT, "not a function");
    }
}

/* ---- methods ------------------------------------------------------------------------------- */

static bool str_method(struct sp_jrt *rt, const struct sp_jnode *at, const struct sp_jstr *s, const char *m,
                       const struct sp_jargs *a, struct sp_jv *out, bool *found) {
    const struct sp_jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
    *found = true;
    if (!strcmp(m, "strip")) return strip(rt, at, s, x, true, true, out);
    if (!strcmp(m, "lstrip")) return strip(rt, at, s, x, true, false, out);
    if (!strcmp(m, "rstrip")) return strip(rt, at, s, x, false, true, out);
    if (!strcmp(m, "upper")) return change_case(rt, at, s, CASE_UPPER, out);
    if (!strcmp(m, "lower")) return change_case(rt, at, s, CASE_LOWER, out);
    if (!strcmp(m, "title")) return change_case(rt, at, s, CASE_TITLE, out);
    if (!strcmp(m, "capitalize")) return change_case(rt, at, s, CASE_CAPITALIZE, out);
    if (!strcmp(m, "startswith")) return starts_ends(rt, at, s, x, false, out);
    if (!strcmp(m, "endswith")) return starts_ends(rt, at, s, x, true, out);
    if (!strcmp(m, "split")) return split(rt, at, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), false, out);
    if (!strcmp(m, "rsplit")) return split(rt, at, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), true, out);
    if (!strcmp(m, "replace")) return replace(rt, at, s, x, y, arg(a, 2, "count"), out);
    if (!strcmp(m, "format")) return str_format(rt, at, s, a, out);
    if (!strcmp(m, "join")) return filter_join(rt, at, x ? *x : sp_jv_undef(), &(struct sp_jv){.type = SP_JV_STR, .u.s = s}, NULL, out);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if (!want_str(rt, at, x, m)) return false;
        const struct sp_jstr *n = x->u.s;
        if (!strcmp(m, "count")) {
            int64_t c = 0;
            if (n->len == 0) {
                c = (int64_t)s->nchars + 1;
            } else {
                for (size_t i = 0; i + n->len <= s->len;) {
                    const char *h = memmem(s->s + i, s->len - i, n->s, n->len);
                    if (!h) break;
                    c++;
                    i = (size_t)(h - s->s) + n->len;
                }
            }
            *out = sp_jv_int(c);
            return true;
        }
        long pos = -1;
        if (!strcmp(m, "rfind")) {
            for (size_t k = s->len + 1; k-- > 0;)
                if (k + n->len <= s->len && memcmp(s->s + k, n->s, n->len) == 0) {
                    pos = (long)k;
                    break;
                }
        } else {
            const char *h = n->len == 0 ? s->s : memmem(s->s, s->len, n->s, n->len);
            if (h) pos = (long)(h - s->s);
        }
        if (pos < 0 && !strcmp(m, "index")) return sp_jrt_fail(rt, at, SP_E_FORMAT, "index: substring not found");
        *out = sp_jv_int(pos < 0 ? -1 : (int64_t)sp_jutf8_count(s->s, (size_t)pos));
        return true;
    }
    if (!strcmp(m, "splitlines")) {
        struct sp_jlist *l;
        if (!mklist(rt, at, 0, &l)) return false;
        for (size_t i = 0; i < s->len;) {
            size_t j = i;
            while (j < s->len && s->s[j] != '\n' && s->s[j] != '\r') j++;
            struct sp_jv part;
            if (!mkstr(rt, at, s->s + i, j - i, &part) || !push(rt, at, l, part)) return false;
            if (j + 1 < s->len && s->s[j] == '\r' && s->s[j + 1] == '\n') j++;
            i = j + 1;
        }
        *out = listv(l);
        return true;
    }
    static const char *const preds[] = {"isalpha", "isdigit", "isnumeric", "isdecimal", "isalnum", "isspace", "islower", "isupper"};
    for (size_t k = 0; k < SP_ARRAY_LEN(preds); k++) {
        if (strcmp(m, preds[k]) != 0) continue;
        if (k >= 6) {
            bool r;
            if (!sp_jinja_test(rt, at, k == 6 ? T_LOWER : T_UPPER, sp_jv_strv(s), a, &r)) return false;
            *out = sp_jv_bool(r);
            return true;
        }
        bool r = s->len > 0;
        for (size_t i = 0; i < s->len && r; i++) {
            const unsigned char c = (unsigned char)s->s[i];
            r = k == 0 ? is_alpha(c) : k <= 3 ? is_digit(c) : k == 4 ? is_alpha(c) || is_digit(c) : is_space(c);
        }
        *out = sp_jv_bool(r);
        return true;
    }
    *found = false;
    return true;
}

static bool list_method(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jlist *l, const char *m,
                        const struct sp_jargs *a, struct sp_jv *out, bool *found) {
    const struct sp_jv *x = arg(a, 0, NULL);
    *found = true;
    *out = sp_jv_none();
    if (!strcmp(m, "append")) {
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "append needs a value");
        return push(rt, at, l, *x);
    }
    if (!strcmp(m, "extend")) {
        struct sp_jlist *src;
        if (!x || !to_list(rt, at, *x, &src)) return x ? false : sp_jrt_fail(rt, at, SP_E_FORMAT, "extend needs a list");
        const size_t n = src->n; /* l.extend(l) doubles once */
        for (size_t i = 0; i < n; i++)
            if (!push(rt, at, l, src->items[i])) return false;
        return true;
    }
    if (!strcmp(m, "pop")) {
        int64_t i = (int64_t)l->n - 1;
        if (x && !want_int(rt, at, x, "pop", &i)) return false;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n) return sp_jrt_fail(rt, at, SP_E_FORMAT, "pop index out of range");
        *out = l->items[i];
        memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof *l->items);
        l->n--;
        return true;
    }
    if (!strcmp(m, "insert")) {
        int64_t i = 0;
        const struct sp_jv *v = arg(a, 1, NULL);
        if (!want_int(rt, at, x, "insert", &i)) return false;
        if (!v) return sp_jrt_fail(rt, at, SP_E_FORMAT, "insert needs a value");
        if (i < 0) i += (int64_t)l->n;
        if (i < 0) i = 0;
        if (i > (int64_t)l->n) i = (int64_t)l->n;
        if (!push(rt, at, l, *v)) return false;
        memmove(l->items + i + 1, l->items + i, (l->n - (size_t)i - 1) * sizeof *l->items);
        l->items[i] = *v;
        return true;
    }
    if (!strcmp(m, "index") || !strcmp(m, "count")) {
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s needs a value", m);
        int64_t c = 0, first = -1;
        for (size_t i = 0; i < l->n; i++)
            if (sp_jv_equal(l->items[i], *x, DEPTH)) {
                if (first < 0) first = (int64_t)i;
                c++;
            }
        if (!strcmp(m, "index") && first < 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "index: value not in list");
        *out = sp_jv_int(!strcmp(m, "index") ? first : c);
        return true;
    }
    if (!strcmp(m, "copy")) {
        struct sp_jlist *r;
        if (!mklist(rt, at, l->n, &r)) return false;
        if (l->n) memcpy(r->items, l->items, l->n * sizeof *r->items);
        r->n = l->n;
        *out = listv(r);
        return true;
    }
    *found = false;
    return true;
}

static bool dict_method(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jdict *d, const char *m,
                        const struct sp_jargs *a, struct sp_jv *out, bool *found) {
    const struct sp_jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
    struct sp_jlist *l;
    *found = true;
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
        if (!mklist(rt, at, d->n, &l)) return false;
        for (size_t i = 0; i < d->n; i++) {
            if (m[0] == 'i') {
                if (!pair(rt, at, d->keys[i], d->vals[i], &l->items[l->n++])) return false;
            } else {
                l->items[l->n++] = m[0] == 'k' ? d->keys[i] : d->vals[i];
            }
        }
        *out = listv(l);
        return true;
    }
    if (!strcmp(m, "get") || !strcmp(m, "pop") || !strcmp(m, "setdefault")) {
        if (!x) return sp_jrt_fail(rt, at, SP_E_FORMAT, "%s needs a key", m);
        const long i = sp_jdict_find(d, *x);
        if (i >= 0) {
            *out = d->vals[i];
            if (m[0] == 'p') sp_jdict_remove(d, (size_t)i);
            return true;
        }
        *out = y ? *y : sp_jv_none();
        if (m[0] == 's' && !sp_jdict_set(rt->a, d, *x, *out)) return sp_jrt_oom(rt, at);
        return true;
    }
    if (!strcmp(m, "update")) {
        if (x && x->type == SP_JV_DICT)
            for (size_t i = 0; i < x->u.d->n; i++)
                if (!sp_jdict_set(rt->a, d, x->u.d->keys[i], x->u.d->vals[i])) return sp_jrt_oom(rt, at);
        for (uint32_t i = 0; i < a->n_kw; i++)
            if (!sp_jdict_set(rt->a, d, sp_jv_strv(a->names[i]), a->kw[i])) return sp_jrt_oom(rt, at);
        *out = sp_jv_none();
        return true;
    }
    if (!strcmp(m, "copy")) {
        struct sp_jdict *c = sp_jdict_new(rt->a, d->n);
        if (!c) return sp_jrt_oom(rt, at);
        for (size_t i = 0; i < d->n; i++)
            if (!sp_jdict_set(rt->a, c, d->keys[i], d->vals[i])) return sp_jrt_oom(rt, at);
        *out = (struct sp_jv){.type = SP_JV_DICT, .u.d = c};
        return true;
    }
    if (d->kind == SP_JDICT_LOOP && !strcmp(m, "cycle")) {
        const long i = sp_jdict_find_str(d, "index0", 6);
        if (a->n_pos == 0) return sp_jrt_fail(rt, at, SP_E_FORMAT, "loop.cycle needs values");
        const int64_t k = i >= 0 && d->vals[i].type == SP_JV_INT ? d->vals[i].u.i : 0;
        *out = a->pos[k % a->n_pos];
        return true;
    }
    *found = false;
    return true;
}

/* recv.name(args) for strings, lists, dicts and the loop object (see jinja_internal.h). */
bool sp_jinja_method(struct sp_jrt *rt, const struct sp_jnode *at, struct sp_jv recv, const struct sp_jstr *name,
                     const struct sp_jargs *args, struct sp_jv *out, bool *found) {
    *found = false;
    uint64_t units = sp_jrt_size(recv);
    for (uint32_t i = 0; i < args->n_pos; i++) units += sp_jrt_size(args->pos[i]);
    if (!sp_jrt_charge(rt, at, units)) return false;
    switch (recv.type) {
    case SP_JV_STR: return str_method(rt, at, recv.u.s, name->s, args, out, found);
    case SP_JV_LIST: return list_method(rt, at, recv.u.l, name->s, args, out, found);
    case SP_JV_DICT: return dict_method(rt, at, recv.u.d, name->s, args, out, found);
    default: return true;
    }
}
