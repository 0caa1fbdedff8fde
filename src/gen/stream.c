/*
 * stream.c -- the UTF-8 assembler and the stop-string matcher (contracts in
 * stream.h).  Both are byte-level state machines with no knowledge of
 * tokens; the matcher's buffer is sized at init and grows only when a
 * longer piece arrives, so the token path does not allocate.
 */
#include "gen/stream.h"

#include "core/core.h"

#include <string.h>

/* ---- UTF-8 assembler ------------------------------------------------------ */

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

void sp_utf8_stream_init(struct sp_utf8_stream *u) { memset(u, 0, sizeof *u); }

/* Length of the character a lead byte starts (2..4), 1 for ASCII, 0 if the
 * byte cannot start one (a continuation byte, C0/C1, F5..FF). */
static int lead_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* May b follow lead at position pos (1..3) of its character?  The second
 * byte's range excludes overlongs (E0, F0), surrogates (ED) and > U+10FFFF (F4). */
static bool cont_ok(unsigned char lead, int pos, unsigned char b) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (pos == 1) {
        if (lead == 0xE0) lo = 0xA0;
        else if (lead == 0xED) hi = 0x9F;
        else if (lead == 0xF0) lo = 0x90;
        else if (lead == 0xF4) hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

size_t sp_utf8_stream_push(struct sp_utf8_stream *u, const char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)in[i];
        if (u->n_held) {
            if (cont_ok(u->held[0], u->n_held, b)) {
                u->held[u->n_held++] = b;
                if (u->n_held == u->need) {
                    memcpy(out + o, u->held, u->need);
                    o += u->need;
                    u->n_held = 0;
                }
                continue;
            }
            /* the held bytes are a maximal subpart: one U+FFFD, then b starts afresh */
            memcpy(out + o, fffd, 3);
            o += 3;
            u->n_held = 0;
        }
        int len = lead_len(b);
        if (len == 1) {
            out[o++] = (char)b;
        } else if (len == 0) {
            memcpy(out + o, fffd, 3);
            o += 3;
        } else {
            u->held[0] = b;
            u->n_held = 1;
            u->need = (uint8_t)len;
        }
    }
    return o;
}

size_t sp_utf8_stream_flush(struct sp_utf8_stream *u, char *out) {
    if (!u->n_held) return 0;
    u->n_held = 0;
    memcpy(out, fffd, 3);
    return 3;
}

bool sp_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len = lead_len(p[i]);
        if (len == 0 || (size_t)len > n - i) return false;
        for (int k = 1; k < len; k++)
            if (!cont_ok(p[i], k, p[i + k])) return false;
        i += (size_t)len;
    }
    return true;
}

/* ---- stop-string matcher -------------------------------------------------- */

void sp_stop_free(struct sp_stop_matcher *m) {
    if (!m) return;
    for (int32_t i = 0; m->stops && i < m->n_stops; i++) sp_free(m->stops[i]);
    sp_free(m->stops);
    sp_free(m->lens);
    sp_free(m->buf);
    memset(m, 0, sizeof *m);
}

sp_status sp_stop_init(struct sp_stop_matcher *m, const char *const *stops, int32_t n) {
    memset(m, 0, sizeof *m);
    if (n < 0 || (n > 0 && !stops)) return sp_err(SP_E_INVALID, "%s: %d stop strings", __func__, (int)n);
    for (int32_t i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0])
            return sp_err(SP_E_INVALID, "%s: stop string %d is empty", __func__, (int)i);
        if (!sp_utf8_valid(stops[i], strlen(stops[i])))
            return sp_err(SP_E_INVALID, "%s: stop string %d is not valid UTF-8", __func__, (int)i);
    }
    m->cap = 1024;
    if (n > 0) {
        m->stops = sp_calloc((size_t)n, sizeof *m->stops);
        m->lens = sp_calloc((size_t)n, sizeof *m->lens);
        if (!m->stops || !m->lens) goto nomem;
        m->n_stops = n;
        for (int32_t i = 0; i < n; i++) {
            m->lens[i] = strlen(stops[i]);
            if (!(m->stops[i] = sp_strndup(stops[i], m->lens[i]))) goto nomem;
            m->max_len = SP_MAX(m->max_len, m->lens[i]);
        }
        m->cap += m->max_len;
    }
    if (!(m->buf = sp_malloc(m->cap))) goto nomem;
    return SP_OK;
nomem:
    sp_stop_free(m);
    return sp_err(SP_E_NOMEM, "%s: out of memory for %d stop strings", __func__, (int)n);
}

void sp_stop_reset(struct sp_stop_matcher *m) { m->start = m->n_buf = 0; }

/* Length of the longest proper suffix-prefix: the longest k < n (and shorter
 * than the stop string) such that s's last k bytes begin some stop string. */
static size_t held_len(const struct sp_stop_matcher *m, const char *s, size_t n) {
    size_t k = SP_MIN(n, m->max_len ? m->max_len - 1 : 0);
    for (; k > 0; k--)
        for (int32_t i = 0; i < m->n_stops; i++)
            if (m->lens[i] > k && memcmp(m->stops[i], s + n - k, k) == 0) return k;
    return 0;
}

sp_status sp_stop_push(struct sp_stop_matcher *m, const char *text, size_t n, const char **out, size_t *out_len,
                       int32_t *matched) {
    *matched = -1;
    *out = m->buf;
    *out_len = 0;
    if (m->n_stops == 0) { /* nothing to hold: pass the caller's text straight through */
        *out = n ? text : m->buf;
        *out_len = n;
        return SP_OK;
    }
    /* move the held text to the front (the last release is no longer needed) */
    size_t held = m->n_buf - m->start;
    memmove(m->buf, m->buf + m->start, held);
    m->start = 0;
    m->n_buf = held;
    if (n > m->cap - held) {
        size_t cap = held + n + m->max_len + 1024;
        char *b = sp_realloc(m->buf, cap);
        if (!b) return sp_err(SP_E_NOMEM, "%s: out of memory for %zu bytes of text", __func__, cap);
        m->buf = b;
        m->cap = cap;
        *out = m->buf;
    }
    memcpy(m->buf + held, text, n);
    m->n_buf = held + n;

    /* the earliest stop string in the held text plus the new text */
    size_t best = SIZE_MAX;
    for (int32_t i = 0; i < m->n_stops; i++) {
        const char *p = memmem(m->buf, m->n_buf, m->stops[i], m->lens[i]);
        if (p && (size_t)(p - m->buf) < best) {
            best = (size_t)(p - m->buf);
            *matched = i;
        }
    }
    if (*matched >= 0) {
        *out_len = best;
        m->start = m->n_buf = best; /* released: buf[0..best); nothing held */
        return SP_OK;
    }
    size_t keep = held_len(m, m->buf, m->n_buf);
    *out_len = m->n_buf - keep;
    m->start = *out_len;
    return SP_OK;
}

void sp_stop_flush(struct sp_stop_matcher *m, const char **out, size_t *out_len) {
    *out = m->buf ? m->buf + m->start : "";
    *out_len = m->n_buf - m->start;
    m->start = m->n_buf = 0;
}
