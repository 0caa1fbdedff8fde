/*
 * edit.c -- sp_model_edit: "KEY=VALUE" and "KEY:TYPE=VALUE" assignments
 * parsed into metadata values and handed to format/'s in-place GGUF edit.
 * Values are parsed strictly (the whole text, in range).
 */
#include "package.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const struct {
    const char *name;
    enum sp_meta_type type;
} types[] = {
    {"str", SP_META_STRING}, {"string", SP_META_STRING}, {"bool", SP_META_BOOL}, {"u8", SP_META_U8},
    {"i8", SP_META_I8},      {"u16", SP_META_U16},       {"i16", SP_META_I16},   {"u32", SP_META_U32},
    {"i32", SP_META_I32},    {"u64", SP_META_U64},       {"i64", SP_META_I64},   {"f32", SP_META_F32},
    {"f64", SP_META_F64},
};

static sp_status parse_value(const char *a, enum sp_meta_type t, const char *text, struct sp_meta_value *v) {
    memset(v, 0, sizeof *v);
    v->type = t;
    char *end = NULL;
    errno = 0;
    switch (t) {
    case SP_META_STRING:
        v->v.str.ptr = (char *)text; /* copied by the writer */
        v->v.str.len = strlen(text);
        return SP_OK;
    case SP_META_BOOL:
        if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0) v->v.u64 = 1;
        else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0) v->v.u64 = 0;
        else return sp_err(SP_E_INVALID, "sp_model_edit: '%s': a bool is true, false, 1 or 0", a);
        return SP_OK;
    case SP_META_F32: case SP_META_F64: {
        const double x = strtod(text, &end);
        if (!*text || *end || errno == ERANGE || (t == SP_META_F32 && isfinite(x) && fabs(x) > 3.4028234663852886e38)) {
            return sp_err(SP_E_INVALID, "sp_model_edit: '%s': not a number in range", a);
        }
        v->v.f64 = t == SP_META_F32 ? (double)(float)x : x;
        return SP_OK;
    }
    case SP_META_U8: case SP_META_U16: case SP_META_U32: case SP_META_U64: {
        const uint64_t max = t == SP_META_U8 ? 0xff : t == SP_META_U16 ? 0xffff : t == SP_META_U32 ? 0xffffffffu : UINT64_MAX;
        if (*text == '-') return sp_err(SP_E_INVALID, "sp_model_edit: '%s': negative value for an unsigned type", a);
        const unsigned long long x = strtoull(text, &end, 0);
        if (!*text || *end || errno == ERANGE || x > max) return sp_err(SP_E_INVALID, "sp_model_edit: '%s': not an integer in range", a);
        v->v.u64 = x;
        return SP_OK;
    }
    default: {
        const int64_t lo = t == SP_META_I8 ? -128 : t == SP_META_I16 ? -32768 : t == SP_META_I32 ? INT32_MIN : INT64_MIN;
        const int64_t hi = t == SP_META_I8 ? 127 : t == SP_META_I16 ? 32767 : t == SP_META_I32 ? INT32_MAX : INT64_MAX;
        const long long x = strtoll(text, &end, 0);
        if (!*text || *end || errno == ERANGE || x < lo || x > hi) {
            return sp_err(SP_E_INVALID, "sp_model_edit: '%s': not an integer in range", a);
        }
        v->v.i64 = x;
        return SP_OK;
    }
    }
}

sp_status sp_model_edit(const char *path, const char *const *assignments, int32_t n) {
    if (!path || n < 0 || (n && !assignments)) return sp_err(SP_E_INVALID, "%s: bad arguments", __func__);
    struct sp_meta_kv *kv = sp_calloc(n ? (size_t)n : 1, sizeof *kv);
    if (!kv) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    sp_status rc = SP_OK;
    int32_t k;
    for (k = 0; k < n && !rc; k++) {
        const char *a = assignments[k];
        const char *eq = a ? strchr(a, '=') : NULL;
        if (!eq || eq == a) {
            rc = sp_err(SP_E_INVALID, "%s: '%s' is not KEY=VALUE or KEY:TYPE=VALUE", __func__, a ? a : "(null)");
            break;
        }
        /* the type is after the last ':' before '=', when it names one */
        enum sp_meta_type t = SP_META_STRING;
        size_t key_len = (size_t)(eq - a);
        const char *colon = memchr(a, ':', key_len);
        for (const char *c = colon; c; c = memchr(c + 1, ':', (size_t)(eq - c - 1))) colon = c;
        if (colon) {
            const size_t tl = (size_t)(eq - colon - 1);
            bool known = false;
            for (size_t i = 0; i < SP_ARRAY_LEN(types); i++) {
                if (strlen(types[i].name) == tl && strncmp(types[i].name, colon + 1, tl) == 0) {
                    t = types[i].type;
                    known = true;
                }
            }
            if (!known) {
                rc = sp_err(SP_E_INVALID, "%s: '%s': unknown type '%.*s' (str, bool, u8, i8, u16, i16, u32, i32, u64, i64, "
                            "f32, f64)", __func__, a, (int)tl, colon + 1);
                break;
            }
            key_len = (size_t)(colon - a);
        }
        if (key_len == 0 || !(kv[k].key = sp_strndup(a, key_len))) {
            rc = key_len ? sp_err(SP_E_NOMEM, "%s: out of memory", __func__) : sp_err(SP_E_INVALID, "%s: '%s': empty key", __func__, a);
            break;
        }
        rc = parse_value(a, t, eq + 1, &kv[k].value);
    }
    if (!rc) rc = sp_model_file_edit(path, kv, (size_t)n);
    for (int32_t i = 0; i < n; i++) sp_free(kv[i].key); /* values point into the assignments */
    sp_free(kv);
    return rc;
}
