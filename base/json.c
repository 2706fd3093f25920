/* json.c: the response buffer and JSON writer (see json.h). */
#include "base/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

void jw_init(jw *w) {
    memset(w, 0, sizeof *w);
    w->first[0] = 1;
}

void jw_free(jw *w) {
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}

char *jw_take(jw *w, size_t *len) {
    if (w->oom) {
        jw_free(w);
        return NULL;
    }
    if (!w->buf) jw_raw(w, "", 0);
    if (w->oom) return NULL;
    char *b = w->buf;
    if (len) *len = w->len;
    w->buf = NULL;
    w->len = w->cap = 0;
    return b;
}

static int reserve(jw *w, size_t n) {
    if (w->oom) return -1;
    if (w->len + n + 1 <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n + 1) cap *= 2;
    char *b = realloc(w->buf, cap);
    if (!b) {
        w->oom = 1;
        return -1;
    }
    w->buf = b;
    w->cap = cap;
    return 0;
}

void jw_raw(jw *w, const char *s, size_t n) {
    if (reserve(w, n) != 0) return;
    if (n) memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = 0;
}

void jw_rawf(jw *w, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        jw_raw(w, small, (size_t)n);
        return;
    }
    if (reserve(w, (size_t)n) != 0) return;
    va_start(ap, fmt);
    vsnprintf(w->buf + w->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    w->len += (size_t)n;
}

/* A value is about to be written at the current level. */
static void value_sep(jw *w) {
    if (w->first[w->depth]) w->first[w->depth] = 0;
    else jw_raw(w, ",", 1);
}

static void open(jw *w, const char *c) {
    value_sep(w);
    jw_raw(w, c, 1);
    if (w->depth + 1 < (int)sizeof w->first) w->depth++;
    w->first[w->depth] = 1;
}

static void close_(jw *w, const char *c) {
    if (w->depth > 0) w->depth--;
    jw_raw(w, c, 1);
}

void jw_obj(jw *w) { open(w, "{"); }
void jw_obj_end(jw *w) { close_(w, "}"); }
void jw_arr(jw *w) { open(w, "["); }
void jw_arr_end(jw *w) { close_(w, "]"); }

static void put_string(jw *w, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (reserve(w, n + 2) != 0) return;
    jw_raw(w, "\"", 1);
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            jw_raw(w, e, 2);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            if (c == '\n') jw_raw(w, "\\n", 2);
            else if (c == '\t') jw_raw(w, "\\t", 2);
            else if (c == '\r') jw_raw(w, "\\r", 2);
            else jw_raw(w, e, 6);
            p++;
        } else if (c < 0x80) {
            const unsigned char *q = p;
            while (q < end && *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\') q++;
            jw_raw(w, (const char *)p, (size_t)(q - p));
            p = q;
        } else {
            /* One UTF-8 sequence; anything else becomes U+FFFD so the
             * response stays valid JSON whatever is stored. The C1
             * controls (U+0080..U+009F: U+009B is CSI to a terminal that
             * reads 8-bit controls) go as \u escapes, as C0 ones do, so
             * that JSON printed to a terminal cannot drive it. */
            unsigned cp;
            size_t len = utf8_seq(p, (size_t)(end - p), &cp);
            if (len == 0) {
                jw_raw(w, "\xef\xbf\xbd", 3);
                p++;
            } else if (cp < 0xa0) {
                char e[6] = {'\\', 'u', '0', '0', hex[cp >> 4], hex[cp & 15]};
                jw_raw(w, e, 6);
                p += len;
            } else {
                jw_raw(w, (const char *)p, len);
                p += len;
            }
        }
    }
    jw_raw(w, "\"", 1);
}

void jw_key(jw *w, const char *k) {
    value_sep(w);
    put_string(w, k, strlen(k));
    jw_raw(w, ":", 1);
    w->first[w->depth] = 1; /* the value that follows needs no comma */
}

void jw_strn(jw *w, const char *s, size_t n) {
    value_sep(w);
    put_string(w, s, n);
}

void jw_str(jw *w, const char *s) {
    if (!s) {
        jw_null(w);
        return;
    }
    jw_strn(w, s, strlen(s));
}

void jw_int(jw *w, int64_t v) {
    value_sep(w);
    jw_rawf(w, "%lld", (long long)v);
}

void jw_num(jw *w, double v) {
    value_sep(w);
    if (!isfinite(v)) {
        jw_raw(w, "null", 4);
        return;
    }
    /* Shortest of %.15g / %.17g that reads back exactly. */
    char b[40];
    snprintf(b, sizeof b, "%.15g", v);
    if (strtod(b, NULL) != v) snprintf(b, sizeof b, "%.17g", v);
    jw_raw(w, b, strlen(b));
}

void jw_bool(jw *w, int v) {
    value_sep(w);
    jw_raw(w, v ? "true" : "false", v ? 4 : 5);
}

void jw_null(jw *w) {
    value_sep(w);
    jw_raw(w, "null", 4);
}

void jw_json(jw *w, const char *s, size_t n) {
    value_sep(w);
    jw_raw(w, s, n);
}

void jw_kstr(jw *w, const char *k, const char *s) {
    jw_key(w, k);
    jw_str(w, s);
}

void jw_kint(jw *w, const char *k, int64_t v) {
    jw_key(w, k);
    jw_int(w, v);
}

void jw_kint_or_null(jw *w, const char *k, int64_t v) {
    jw_key(w, k);
    if (v < 0) jw_null(w);
    else jw_int(w, v);
}

void jw_kints_or_null(jw *w, const char *k, const int64_t *v, int n) {
    jw_key(w, k);
    jw_arr(w);
    for (int i = 0; i < n; i++)
        if (v[i] < 0) jw_null(w);
        else jw_int(w, v[i]);
    jw_arr_end(w);
}

void jw_knum(jw *w, const char *k, double v) {
    jw_key(w, k);
    jw_num(w, v);
}

void jw_hex(jw *w, const void *bytes, size_t n) {
    static const char hex[] = "0123456789abcdef";
    value_sep(w);
    jw_raw(w, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char b = ((const unsigned char *)bytes)[i];
        char h[2] = {hex[b >> 4], hex[b & 15]};
        jw_raw(w, h, 2);
    }
    jw_raw(w, "\"", 1);
}
