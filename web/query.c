/* query.c: query parameters (query.h). */
#include "web/query.h"

#include <stdio.h>
#include <string.h>

#include "base/pp.h"

typedef struct query_seen {
    const char *names[32];
    size_t n;
    char bad[160];
} query_seen;

static enum MHD_Result check_one(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                 const char *value, size_t value_size) {
    (void)kind;
    query_seen *q = cls;
    if (key_size == 0 && !value) return MHD_YES; /* "?&limit=5": nothing given */
    if (strlen(key) != key_size || (value && strlen(value) != value_size)) {
        snprintf(q->bad, sizeof q->bad, "query parameter '%.64s' holds a NUL character (%%00)", key);
        return MHD_NO;
    }
    for (size_t i = 0; i < q->n; i++)
        if (strcmp(q->names[i], key) == 0) {
            snprintf(q->bad, sizeof q->bad, "query parameter '%.64s' is given more than once", key);
            return MHD_NO;
        }
    if (q->n == sizeof q->names / sizeof q->names[0]) {
        snprintf(q->bad, sizeof q->bad, "more than %zu query parameters", q->n);
        return MHD_NO;
    }
    q->names[q->n++] = key;
    return MHD_YES;
}

int query_check(struct MHD_Connection *c, reply *r) {
    query_seen q = {.n = 0};
    MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, check_one, &q);
    if (!q.bad[0]) return 0;
    reply_error(r, 400, "bad query: %s", q.bad);
    return -1;
}

const char *query_str(struct MHD_Connection *c, const char *name) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    return v && *v ? v : NULL;
}

int query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out, reply *r) {
    const char *v = query_str(c, name);
    if (!v) return 0;
    /* Digits only: strtol would also take " 5" and "+5". */
    const char *d = v + (v[0] == '-');
    if (!*d || strspn(d, "0123456789") != strlen(d)) {
        reply_error(r, 400, "bad query parameter: %s: expected an integer in [%ld, %ld], got '%.64s'", name, min, max,
                    v);
        return -1;
    }
    pp_err err;
    if (pp_parse_long(v, min, max, name, out, &err) != 0) {
        reply_error(r, 400, "bad query parameter: %s", err.msg);
        return -1;
    }
    return 1;
}
