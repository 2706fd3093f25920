/* guard.h: who may ask. The checks every request passes on its head,
 * before any of its body is read and before its route runs (guard.c, one
 * table, in this order):
 *
 *   Host      403  on a loopback listener (and on any listener given
 *                  --allow-host): localhost, 127.x.y.z or [::1] (any port,
 *                  any case), or a name given with --allow-host; any other
 *                  name is a page whose DNS name was rebound to 127.0.0.1.
 *                  No Host (HTTP/1.0 only: frame.c requires one of 1.1) is
 *                  taken: no browser sends a request without one.
 *   Origin    403  a request with an Origin must come from the server's own
 *                  page: http:// or https:// and exactly the request's Host
 *                  (on every listener, token or not); without an Origin
 *                  (a navigation, curl) nothing is checked.
 *   token     401  routes with ROUTE_TOKEN, when a token is set.
 *   query     400  routes with ROUTE_QUERY (query.h).
 *   size      413  an announced body over max_body.
 *   type      415  a request with a body, and any to a ROUTE_JSON route
 *                  (POST /api/sql), must say Content-Type:
 *                  application/json (a form or text/plain body is what a
 *                  page of another site can send without a CORS
 *                  preflight); not one its route answers 405.
 *
 * docs/api.md, "Authentication" and "Who may ask", says the same. */
#ifndef PP_WEB_GUARD_H
#define PP_WEB_GUARD_H
#include <microhttpd.h>
#include <stddef.h>

#include "base/pp.h"
#include "web/reply.h"
#include "web/routes.h"
#include "web/server.h"

/* The option that admits a Host name, as the 403 and start errors name it. */
#define GUARD_ALLOW_FLAG "--allow-host"

/* Parses list (names separated by commas, as --allow-host gathers them;
 * NULL or "" = none) into s->allow (lower case, IPv6 brackets dropped):
 * 0, or -1 naming the bad name (a port, a URL, a character no host name
 * holds). */
int guard_init(http_server *s, const char *list, pp_err *err);
void guard_free(http_server *s);

/* Runs the checks on request c (its method, its route rt) in order: 0 when
 * it passes them all, else -1 with r filled (403, 401, 400, 413 or 415).
 * Called once per request, on its headers. */
int guard_check(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt, reply *r);

#endif
