/* json.h: a growable output buffer and a small JSON writer for responses.
 *
 * Responses are written straight into one buffer (a timeline window is tens
 * of thousands of numbers; building a cJSON tree for it would cost more than
 * the query). The writer tracks where commas go. Request bodies are parsed
 * with cJSON instead (see web/routes_sql.c), never with this.
 *
 * Ownership: the buffer owns its bytes; jw_take hands them to the caller
 * (free()), jw_free releases them. An allocation failure sets `oom` and
 * turns every later call into a no-op, so callers check once at the end. */
#ifndef PP_BASE_JSON_H
#define PP_BASE_JSON_H
#include <stddef.h>
#include <stdint.h>

typedef struct jw {
    char *buf;
    size_t len, cap;
    int oom;
    int depth;
    unsigned char first[64]; /* per nesting level: no comma needed yet */
} jw;

void jw_init(jw *w);
void jw_free(jw *w);
/* Returns the NUL-terminated text (caller frees) and its length; NULL on oom. */
char *jw_take(jw *w, size_t *len);

/* Raw bytes and printf, no JSON bookkeeping. */
void jw_raw(jw *w, const char *s, size_t n);
void jw_rawf(jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void jw_obj(jw *w);       /* { */
void jw_obj_end(jw *w);   /* } */
void jw_arr(jw *w);       /* [ */
void jw_arr_end(jw *w);   /* ] */
void jw_key(jw *w, const char *k);
void jw_str(jw *w, const char *s);              /* NULL writes null */
void jw_strn(jw *w, const char *s, size_t n);   /* escapes control chars, quotes, invalid UTF-8 -> U+FFFD */
void jw_int(jw *w, int64_t v);
void jw_num(jw *w, double v);                   /* NaN/inf -> null */
void jw_bool(jw *w, int v);
void jw_null(jw *w);
/* Inserts already-valid JSON text as one value. */
void jw_json(jw *w, const char *s, size_t n);

/* Shorthands for object members. */
void jw_kstr(jw *w, const char *k, const char *s);
void jw_kint(jw *w, const char *k, int64_t v);
void jw_knum(jw *w, const char *k, double v);
/* A count, size or index where a negative value means "none": null. */
void jw_kint_or_null(jw *w, const char *k, int64_t v);
/* n of those as an array. */
void jw_kints_or_null(jw *w, const char *k, const int64_t *v, int n);
/* bytes as one JSON string of lower-case hex digits (a BLOB). */
void jw_hex(jw *w, const void *bytes, size_t n);
#endif
