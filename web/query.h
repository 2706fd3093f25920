/* query.h: a request's query parameters, read strictly. The whole query is
 * checked once before any route reads it (query_check); then each route
 * takes its numbers with query_long, its text with query_str. An empty
 * value is the same as leaving the parameter out, on every route. */
#ifndef PP_WEB_QUERY_H
#define PP_WEB_QUERY_H
#include <microhttpd.h>

#include "web/reply.h"

/* A name given twice (which value would count?) or a name or value holding
 * a NUL (%00: everything after it was silently dropped), or more than 32
 * parameters: -1 with a 400 in r; else 0. */
int query_check(struct MHD_Connection *c, reply *r);
/* The value of parameter `name`, NULL when absent or empty. Owned by the
 * connection. */
const char *query_str(struct MHD_Connection *c, const char *name);
/* Parameter `name` as an integer in [min, max], digits only (an optional
 * '-' first): 0 when absent (*out left as it is), 1 when parsed, -1 on a
 * bad value (a 400 in r naming it). */
int query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out, reply *r);

#endif
