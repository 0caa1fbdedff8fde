/*
 * stream.h -- the two filters every streamed answer goes through, whoever
 * runs the decode loop (sp_generate, the server's batched sequences):
 *
 *   token pieces --> sp_utf8_stream --> valid UTF-8 --> sp_stop_matcher --> text to show
 *
 * sp_utf8_stream holds back a character split across tokens until its last
 * byte comes and turns invalid bytes into U+FFFD ("substitution of maximal
 * subparts", Unicode 15 section 3.9), so what leaves it is always valid UTF-8.
 * sp_stop_matcher holds back text that could still become a stop string and
 * reports the first stop string found; the text before it is released, the
 * stop string itself never is.  Neither knows about models or sessions; each
 * one is owned by one stream (one sequence) and is not thread-safe.
 */
#ifndef SP_GEN_STREAM_H
#define SP_GEN_STREAM_H

#include "sparrow.h"

#include <stddef.h>
#include <stdint.h>

/* ---- UTF-8 assembler ------------------------------------------------------ */

struct sp_utf8_stream {
    unsigned char held[4]; /* the start of a character whose last byte has not come */
    uint8_t n_held;        /* 0..3 bytes in held */
    uint8_t need;          /* the character's full length (2..4) while n_held > 0 */
};

/* Bytes sp_utf8_stream_push may write for n input bytes (every byte, and the
 * up to 3 held ones, may become a 3-byte U+FFFD). */
#define SP_UTF8_STREAM_OUT_MAX(n) (3 * ((size_t)(n) + 3))

/* An empty stream (a zeroed struct is one too). */
void sp_utf8_stream_init(struct sp_utf8_stream *u);

/* Feed n bytes (any bytes) and write what is complete to out, which has room
 * for SP_UTF8_STREAM_OUT_MAX(n) bytes; returns the number written (not
 * NUL-terminated).  An incomplete trailing character stays held for the next
 * call.  Never fails. */
size_t sp_utf8_stream_push(struct sp_utf8_stream *u, const char *in, size_t n, char *out);

/* End of stream: a held incomplete character becomes U+FFFD.  out has room
 * for 3 bytes; returns the number written (0 or 3).  The stream is empty after. */
size_t sp_utf8_stream_flush(struct sp_utf8_stream *u, char *out);

/* True if s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool sp_utf8_valid(const char *s, size_t n);

/* ---- stop-string matcher -------------------------------------------------- */

struct sp_stop_matcher {
    char **stops;     /* n_stops copies (sp_malloc'd), each non-empty valid UTF-8 */
    size_t *lens;     /* their lengths */
    int32_t n_stops;
    size_t max_len;   /* the longest stop string */
    char *buf;        /* buf[start..n_buf): text held back; buf[0..start): last release */
    size_t start, n_buf, cap;
};

/* Copy n stop strings (n may be 0: everything passes straight through).
 * Each must be non-empty valid UTF-8 (SP_E_INVALID names the one that is
 * not), so the text released always ends on a character boundary.
 * SP_E_NOMEM on allocation failure.  Free with sp_stop_free. */
sp_status sp_stop_init(struct sp_stop_matcher *m, const char *const *stops, int32_t n);

/* Release what init allocated; on a zeroed struct, a no-op. */
void sp_stop_free(struct sp_stop_matcher *m);

/* Forget held text (a new answer with the same stop strings). */
void sp_stop_reset(struct sp_stop_matcher *m);

/* Feed text[0..n) (valid UTF-8, e.g. from sp_utf8_stream).  *out, *out_len:
 * the text that can be shown now; it points into m and is valid until the
 * next call on m.  *matched: the index of the stop string found (the one
 * that starts first; of those, the first listed), or -1.  After a match,
 * *out is the text before the stop string, the stop string and whatever
 * followed it are dropped, and the matcher is empty again.  Allocates only
 * when text is longer than anything fed before; SP_E_NOMEM if that fails
 * (nothing is consumed). */
sp_status sp_stop_push(struct sp_stop_matcher *m, const char *text, size_t n, const char **out, size_t *out_len,
                       int32_t *matched);

/* End of stream: *out, *out_len is the text still held (no stop string was
 * completed by it); valid until the next call on m; the matcher is empty after. */
void sp_stop_flush(struct sp_stop_matcher *m, const char **out, size_t *out_len);

#endif /* SP_GEN_STREAM_H */
