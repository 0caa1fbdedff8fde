/*
 * jinja_lex.c -- template source -> tokens.  Text between tags becomes TEXT
 * tokens with Jinja2's whitespace control already applied:
 *   {%- / {{- / {#-   strip all whitespace before the tag;
 *   -%} / -}} / -#}   strip all whitespace after it;
 *   trim_blocks       drop the first newline after a block or comment tag
 *                     (not after }}; +%} keeps it);
 *   lstrip_blocks     drop spaces and tabs between the start of a line and
 *                     a block or comment tag ({%+ keeps them).
 * {% raw %}...{% endraw %} becomes one TEXT token.  Inside tags come names,
 * numbers, strings (Python escapes unescaped) and operators.  Positions are
 * 1-based lines and columns in characters.
 */
#include "chat/jinja_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct lx {
    const char *src;
    size_t n, pos;
    uint32_t line, col;
    struct sp_jarena *a;
    struct sp_jtoks *out;
    struct sp_jinja_error *err;
    long last_text;   /* index of the TEXT token right before the current tag, -1 if none */
    bool strip_next;  /* the last tag ended with '-' */
    bool trim_next;   /* the last tag was a block or comment tag (trim_blocks) */
};

static bool lx_fail(struct lx *l, uint32_t line, uint32_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool lx_fail(struct lx *l, uint32_t line, uint32_t col, const char *fmt, ...) {
    l->err->st = l->a->nomem ? SP_E_NOMEM : SP_E_FORMAT;
    l->err->line = line;
    l->err->col = col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err->msg, sizeof l->err->msg, fmt, ap);
    va_end(ap);
    return false;
}

/* Move pos to to, keeping line and column. */
static void advance_to(struct lx *l, size_t to) {
    for (; l->pos < to; l->pos++) {
        const unsigned char c = (unsigned char)l->src[l->pos];
        if (c == '\n') {
            l->line++;
            l->col = 1;
        } else if ((c & 0xc0) != 0x80) {
            l->col++;
        }
    }
}

static struct sp_jtok *push(struct lx *l, uint8_t kind, uint32_t line, uint32_t col) {
    struct sp_jtoks *t = l->out;
    if (t->n == t->cap) {
        const size_t cap = t->cap ? t->cap * 2 : 64;
        struct sp_jtok *p = sp_realloc(t->t, cap * sizeof *p);
        if (!p) {
            l->a->nomem = true;
            lx_fail(l, line, col, "out of memory");
            return NULL;
        }
        t->t = p;
        t->cap = cap;
    }
    struct sp_jtok *k = &t->t[t->n++];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->line = line;
    k->col = col;
    return k;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Text src[from, to) as a TEXT token, with the pending after-tag rules
 * (strip_next, trim_next) applied to its start.  Empty text makes no token. */
static bool emit_text(struct lx *l, size_t from, size_t to, uint32_t line, uint32_t col) {
    l->last_text = -1;
    if (l->strip_next) {
        while (from < to && is_ws(l->src[from])) from++;
    } else if (l->trim_next) {
        if (from < to && l->src[from] == '\n')
            from++;
        else if (from + 1 < to && l->src[from] == '\r' && l->src[from + 1] == '\n')
            from += 2;
    }
    l->strip_next = l->trim_next = false;
    if (from >= to) return true;
    struct sp_jtok *k = push(l, SP_JT_TEXT, line, col);
    if (!k) return false;
    k->s = l->src + from;
    k->n = to - from;
    l->last_text = (long)(l->out->n - 1);
    return true;
}

/* The before-tag rules on the TEXT token right before a tag: '-' strips all
 * trailing whitespace; lstrip_blocks strips spaces/tabs back to the line start. */
static void strip_before(struct lx *l, char mod, bool block_like) {
    if (l->last_text < 0) return;
    struct sp_jtok *k = &l->out->t[l->last_text];
    if (mod == '-') {
        while (k->n > 0 && is_ws(k->s[k->n - 1])) k->n--;
    } else if (block_like && mod != '+') {
        size_t i = k->n;
        while (i > 0 && (k->s[i - 1] == ' ' || k->s[i - 1] == '\t')) i--;
        const bool line_start = i > 0 ? k->s[i - 1] == '\n' : (k->s == l->src || k->s[-1] == '\n');
        if (line_start) k->n = i;
    }
    if (k->n == 0) l->out->n--; /* it was the last token */
    l->last_text = -1;
}

/* ---- inside a tag ------------------------------------------------------------ */

static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

static int hexdigit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A quoted string at pos: Python escapes (\n \t \r \\ \' \" \a \b \f \v,
 * octal, \xHH, \uXXXX, \UXXXXXXXX, backslash-newline); an unknown escape
 * keeps its backslash. */
static bool lex_string(struct lx *l, struct sp_jtok *k) {
    const char q = l->src[l->pos];
    size_t end = l->pos + 1;
    while (end < l->n && l->src[end] != q) end += l->src[end] == '\\' ? 2 : 1;
    if (end >= l->n) return lx_fail(l, k->line, k->col, "unterminated string");
    /* an escape never grows the text: \xHH (4 bytes) -> at most 2, \uXXXX (6) -> 3, \U (10) -> 4 */
    char *buf = sp_jarena_alloc(l->a, end - l->pos + 1);
    if (!buf) return lx_fail(l, k->line, k->col, "out of memory");
    size_t i = l->pos + 1, o = 0;
    while (i < end) {
        const char c = l->src[i];
        if (c != '\\') {
            buf[o++] = c;
            i++;
            continue;
        }
        const char e = l->src[i + 1];
        i += 2;
        switch (e) {
        case 'n': buf[o++] = '\n'; break;
        case 't': buf[o++] = '\t'; break;
        case 'r': buf[o++] = '\r'; break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'v': buf[o++] = '\v'; break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            const int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            int d = 0;
            for (; d < nd && i + (size_t)d < end && hexdigit(l->src[i + d]) >= 0; d++)
                v = v * 16 + (uint32_t)hexdigit(l->src[i + d]);
            if (d < nd) return lx_fail(l, k->line, k->col, "bad \\%c escape in a string", e);
            i += (size_t)nd;
            o += sp_utf8_put(v >= 0xd800 && v < 0xe000 ? 0xfffd : v, buf + o);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i < end && l->src[i] >= '0' && l->src[i] <= '7'; d++, i++)
                    v = v * 8 + (uint32_t)(l->src[i] - '0');
                o += sp_utf8_put(v >= 0xd800 && v < 0xe000 ? 0xfffd : v, buf + o);
            } else {
                buf[o++] = '\\';
                i--; /* the character itself is read again as text */
            }
        }
    }
    buf[o] = '\0';
    k->kind = SP_JT_STRING;
    k->s = buf;
    k->n = o;
    advance_to(l, end + 1);
    return true;
}

static bool lex_number(struct lx *l, struct sp_jtok *k) {
    size_t i = l->pos;
    bool is_float = false;
    while (i < l->n && (is_digit(l->src[i]) || (l->src[i] == '_' && i + 1 < l->n && is_digit(l->src[i + 1])))) i++;
    if (i + 1 < l->n && l->src[i] == '.' && is_digit(l->src[i + 1])) {
        is_float = true;
        i++;
        while (i < l->n && is_digit(l->src[i])) i++;
    }
    if (i < l->n && (l->src[i] == 'e' || l->src[i] == 'E')) {
        size_t j = i + 1;
        if (j < l->n && (l->src[j] == '+' || l->src[j] == '-')) j++;
        if (j < l->n && is_digit(l->src[j])) {
            is_float = true;
            i = j;
            while (i < l->n && is_digit(l->src[i])) i++;
        }
    }
    char tmp[80];
    size_t t = 0;
    for (size_t j = l->pos; j < i && t + 1 < sizeof tmp; j++)
        if (l->src[j] != '_') tmp[t++] = l->src[j];
    tmp[t] = '\0';
    if (i - l->pos >= sizeof tmp - 1) return lx_fail(l, k->line, k->col, "number too long");
    if (is_float) {
        k->kind = SP_JT_FLOAT;
        k->f = strtod(tmp, NULL);
    } else {
        errno = 0;
        k->kind = SP_JT_INT;
        k->i = strtoll(tmp, NULL, 10);
        if (errno) return lx_fail(l, k->line, k->col, "integer %s does not fit 64 bits", tmp);
    }
    advance_to(l, i);
    return true;
}

static const struct {
    const char *s;
    uint8_t op;
} k_ops[] = {
    {"**", SP_JOP_POW}, {"//", SP_JOP_FLOORDIV}, {"==", SP_JOP_EQ}, {"!=", SP_JOP_NE}, {"<=", SP_JOP_LE},
    {">=", SP_JOP_GE},  {"+", SP_JOP_ADD},       {"-", SP_JOP_SUB}, {"*", SP_JOP_MUL}, {"/", SP_JOP_DIV},
    {"%", SP_JOP_MOD},  {"~", SP_JOP_TILDE},     {"<", SP_JOP_LT},  {">", SP_JOP_GT},  {"=", SP_JOP_ASSIGN},
    {"(", SP_JOP_LPAREN}, {")", SP_JOP_RPAREN}, {"[", SP_JOP_LBRACKET}, {"]", SP_JOP_RBRACKET},
    {"{", SP_JOP_LBRACE}, {"}", SP_JOP_RBRACE}, {",", SP_JOP_COMMA}, {".", SP_JOP_DOT}, {":", SP_JOP_COLON},
    {"|", SP_JOP_PIPE},
};

/* Tokens of a {{ }} (block = false) or {% %} tag up to its close, which it
 * consumes.  *close_mod receives '-', '+' or 0. */
static bool lex_tag(struct lx *l, bool block, uint32_t tline, uint32_t tcol, char *close_mod) {
    int depth = 0; /* open brackets: '}}' inside a dict literal does not close */
    for (;;) {
        while (l->pos < l->n && is_ws(l->src[l->pos])) advance_to(l, l->pos + 1);
        if (l->pos >= l->n) return lx_fail(l, tline, tcol, "'%s' tag is never closed", block ? "{%" : "{{");
        const char *p = l->src + l->pos;
        const size_t left = l->n - l->pos;
        const uint32_t line = l->line, col = l->col;
        const char cl = block ? '%' : '}';
        if ((left >= 3 && (p[0] == '-' || (block && p[0] == '+')) && p[1] == cl && p[2] == '}' && depth == 0) ||
            (left >= 2 && p[0] == cl && p[1] == '}' && depth == 0)) {
            *close_mod = p[0] == cl ? 0 : p[0];
            if (!push(l, block ? SP_JT_BLOCK_CLOSE : SP_JT_VAR_CLOSE, line, col)) return false;
            advance_to(l, l->pos + (*close_mod ? 3 : 2));
            return true;
        }
        struct sp_jtok *k = push(l, SP_JT_NAME, line, col);
        if (!k) return false;
        if (is_name_start(p[0])) {
            size_t i = 1;
            while (i < left && (is_name_start(p[i]) || is_digit(p[i]))) i++;
            k->s = p;
            k->n = i;
            advance_to(l, l->pos + i);
        } else if (is_digit(p[0])) {
            if (!lex_number(l, k)) return false;
        } else if (p[0] == '\'' || p[0] == '"') {
            if (!lex_string(l, k)) return false;
        } else {
            size_t i = 0;
            for (; i < SP_ARRAY_LEN(k_ops); i++) {
                const size_t ol = strlen(k_ops[i].s);
                if (left >= ol && memcmp(p, k_ops[i].s, ol) == 0) break;
            }
            if (i == SP_ARRAY_LEN(k_ops)) {
                if ((unsigned char)p[0] < 0x20 || (unsigned char)p[0] >= 0x7f)
                    return lx_fail(l, line, col, "unexpected byte 0x%02x in a tag", (unsigned char)p[0]);
                return lx_fail(l, line, col, "unexpected character '%c' in a tag", p[0]);
            }
            k->kind = SP_JT_OP;
            k->op = k_ops[i].op;
            if (k->op == SP_JOP_LPAREN || k->op == SP_JOP_LBRACKET || k->op == SP_JOP_LBRACE) depth++;
            if ((k->op == SP_JOP_RPAREN || k->op == SP_JOP_RBRACKET || k->op == SP_JOP_RBRACE) && depth > 0) depth--;
            advance_to(l, l->pos + strlen(k_ops[i].s));
        }
    }
}

/* If a raw block starts at pos ("{%" already seen at tag), its close: the
 * offset after "%}" and the strip modifier; 0 if this is not {% raw %}. */
static size_t raw_open(const char *s, size_t n, size_t tag, char *mod) {
    size_t i = tag + 2;
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    while (i < n && is_ws(s[i])) i++;
    if (n - i < 3 || memcmp(s + i, "raw", 3) != 0) return 0;
    i += 3;
    while (i < n && is_ws(s[i])) i++;
    *mod = 0;
    if (i < n && s[i] == '-') {
        *mod = '-';
        i++;
    }
    if (n - i < 2 || s[i] != '%' || s[i + 1] != '}') return 0;
    return i + 2;
}

/* The next {% endraw %} from pos: its start, end and modifiers; false if none. */
static bool raw_close(const char *s, size_t n, size_t from, size_t *start, size_t *end, char *lmod, char *rmod) {
    for (size_t i = from; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t j = i + 2;
        *lmod = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) *lmod = s[j++];
        while (j < n && is_ws(s[j])) j++;
        if (n - j < 6 || memcmp(s + j, "endraw", 6) != 0) continue;
        j += 6;
        while (j < n && is_ws(s[j])) j++;
        *rmod = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) *rmod = s[j++];
        if (n - j < 2 || s[j] != '%' || s[j + 1] != '}') continue;
        *start = i;
        *end = j + 2;
        return true;
    }
    return false;
}

/* Tokenize src (see the file comment).  Strings go to arena a; the token
 * array is sp_realloc'd into out (the caller frees out->t). */
bool sp_jinja_lex(const char *src, size_t len, struct sp_jarena *a, struct sp_jtoks *out,
                  struct sp_jinja_error *err) {
    struct lx l = {.src = src, .n = len, .line = 1, .col = 1, .a = a, .out = out, .err = err, .last_text = -1};
    for (;;) {
        /* text up to the next tag */
        size_t tag = l.pos;
        while (tag + 1 < len && !(src[tag] == '{' && (src[tag + 1] == '{' || src[tag + 1] == '%' || src[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= len) tag = len;
        const uint32_t line = l.line, col = l.col;
        if (!emit_text(&l, l.pos, tag, line, col)) return false;
        advance_to(&l, tag);
        if (tag >= len) break;

        const char kind = src[tag + 1];
        const char mod = tag + 2 < len && (src[tag + 2] == '-' || src[tag + 2] == '+') ? src[tag + 2] : 0;
        const uint32_t tline = l.line, tcol = l.col;
        if (kind == '#') {
            strip_before(&l, mod, true);
            size_t e = tag + 2;
            while (e + 1 < len && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= len) return lx_fail(&l, tline, tcol, "comment is never closed (no '#}')");
            l.strip_next = e > tag + 2 && src[e - 1] == '-';
            l.trim_next = !(e > tag + 2 && src[e - 1] == '+');
            advance_to(&l, e + 2);
            continue;
        }
        char rmod = 0;
        const size_t raw_end = kind == '%' ? raw_open(src, len, tag, &rmod) : 0;
        if (raw_end) {
            strip_before(&l, mod, true);
            size_t cs, ce;
            char lm, rm;
            if (!raw_close(src, len, raw_end, &cs, &ce, &lm, &rm))
                return lx_fail(&l, tline, tcol, "'raw' block is never closed (expected 'endraw')");
            advance_to(&l, raw_end);
            l.strip_next = rmod == '-';
            l.trim_next = rmod != '+';
            if (!emit_text(&l, raw_end, cs, l.line, l.col)) return false;
            if (l.last_text >= 0) strip_before(&l, lm, true);
            l.strip_next = rm == '-';
            l.trim_next = rm != '+';
            advance_to(&l, ce);
            continue;
        }
        strip_before(&l, kind == '{' && mod == '+' ? 0 : mod, kind == '%');
        if (!push(&l, kind == '%' ? SP_JT_BLOCK_OPEN : SP_JT_VAR_OPEN, tline, tcol)) return false;
        /* a '-' or '+' right after the opener is a modifier ({{+ is not: unary plus) */
        advance_to(&l, tag + 2 + (mod == '-' || (mod == '+' && kind == '%') ? 1 : 0));
        char cmod = 0;
        if (!lex_tag(&l, kind == '%', tline, tcol, &cmod)) return false;
        l.last_text = -1;
        l.strip_next = cmod == '-';
        l.trim_next = kind == '%' && cmod != '+';
    }
    return push(&l, SP_JT_EOF, l.line, l.col) != NULL;
}
