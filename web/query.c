/* query.c: query parameters (query.h). */
#include "web/query.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pp.h"

typedef struct query_seen {
    const char *names[QUERY_MAX];
    size_t n;
    const char *accepted; /* the route's names, space-separated; NULL: any */
    char bad[400];
} query_seen;

/* Whether key is one of the space-separated words of list. */
static int is_word_of(const char *list, const char *key) {
    size_t n = strlen(key);
    if (!n || strchr(key, ' ')) return 0; /* "from to" is no word of "from to step" */
    for (const char *w = list; *w; w += strcspn(w, " "), w += strspn(w, " "))
        if (strncmp(w, key, n) == 0 && (w[n] == ' ' || w[n] == 0)) return 1;
    return 0;
}

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
    if (q->accepted && !is_word_of(q->accepted, key)) {
        int at = snprintf(q->bad, sizeof q->bad, "unknown query parameter '%.64s': this route takes ", key);
        if (!q->accepted[0]) snprintf(q->bad + at, sizeof q->bad - (size_t)at, "none");
        for (const char *w = q->accepted; *w && at < (int)sizeof q->bad; w += strcspn(w, " "), w += strspn(w, " "))
            at += snprintf(q->bad + at, sizeof q->bad - (size_t)at, "%s%.*s", w == q->accepted ? "" : ", ",
                           (int)strcspn(w, " "), w);
        return MHD_NO;
    }
    if (q->n == sizeof q->names / sizeof q->names[0]) {
        snprintf(q->bad, sizeof q->bad, "more than %zu query parameters", q->n);
        return MHD_NO;
    }
    q->names[q->n++] = key;
    return MHD_YES;
}

int query_check(struct MHD_Connection *c, const char *accepted, reply *r) {
    query_seen q = {.n = 0, .accepted = accepted};
    MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, check_one, &q);
    if (!q.bad[0]) return 0;
    reply_error(r, 400, "bad query: %s", q.bad);
    return -1;
}

/* query_copy's two walks: the bytes the parameters need, then the copy. */
typedef struct query_walk {
    query_args *a;
    size_t need, at;
} query_walk;

static char *copy_into(query_walk *w, const char *v) {
    size_t n = strlen(v) + 1;
    char *p = w->a->buf + w->at;
    memcpy(p, v, n);
    w->at += n;
    return p;
}

static enum MHD_Result copy_one(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    query_walk *w = cls;
    if (!key[0] && !value) return MHD_YES; /* as query_check: nothing given */
    if (!w->a->buf) {
        w->need += strlen(key) + 1 + (value ? strlen(value) + 1 : 0);
        return MHD_YES;
    }
    if (w->a->n == QUERY_MAX) return MHD_NO; /* query_check refused more */
    w->a->name[w->a->n] = copy_into(w, key);
    w->a->value[w->a->n] = value ? copy_into(w, value) : NULL;
    w->a->n++;
    return MHD_YES;
}

int query_copy(struct MHD_Connection *c, query_args *a, reply *r) {
    *a = (query_args){.n = 0};
    query_walk w = {.a = a};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, copy_one, &w);
    if (!(a->buf = malloc(w.need ? w.need : 1))) {
        reply_error(r, 500, "out of memory");
        return -1;
    }
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, copy_one, &w);
    return 0;
}

void query_free(query_args *a) {
    free(a->buf);
    *a = (query_args){.n = 0};
}

const char *query_str(const query_args *a, const char *name) {
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->name[i], name) == 0) return a->value[i] && a->value[i][0] ? a->value[i] : NULL;
    return NULL;
}

int query_long(const query_args *a, const char *name, long min, long max, long *out, reply *r) {
    const char *v = query_str(a, name);
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
