/* query.h: a request's query parameters, read strictly. The whole query is
 * checked once before any route reads it (query_check) and copied
 * (query_copy); then each route takes its numbers with query_long, its
 * text with query_str. An empty
 * value is the same as leaving the parameter out, on every route. */
#ifndef PP_WEB_QUERY_H
#define PP_WEB_QUERY_H
#include <microhttpd.h>

#include "web/reply.h"

/* The most parameters a query may have. */
#define QUERY_MAX 32

/* A request's query parameters, copied on libmicrohttpd's thread
 * (query_copy): a handler on a pool's worker reads them there while the
 * connection is suspended, never calling into libmicrohttpd for them. */
typedef struct query_args {
    size_t n;
    const char *name[QUERY_MAX], *value[QUERY_MAX]; /* into buf; a value NULL for "?name" alone */
    char *buf;
} query_args;

/* A name given twice (which value would count?) or a name or value holding
 * a NUL (%00: everything after it was silently dropped), more than
 * QUERY_MAX parameters, or, with `accepted` (the names the route reads,
 * space-separated; "" none), a name not among them (a typo's default
 * answer looked right): -1 with a 400 in r; else 0. */
int query_check(struct MHD_Connection *c, const char *accepted, reply *r);
/* The connection's parameters (checked) into *a: 0, or -1 with a 500 in r
 * (out of memory). query_free frees them. */
int query_copy(struct MHD_Connection *c, query_args *a, reply *r);
void query_free(query_args *a);
/* The value of parameter `name`, NULL when absent or empty. Owned by a. */
const char *query_str(const query_args *a, const char *name);
/* Parameter `name` as an integer in [min, max], digits only (an optional
 * '-' first): 0 when absent (*out left as it is), 1 when parsed, -1 on a
 * bad value (a 400 in r naming it). */
int query_long(const query_args *a, const char *name, long min, long max, long *out, reply *r);

#endif
