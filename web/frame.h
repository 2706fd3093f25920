/* frame.h: a request's head held to RFC 9112 before its route is run
 * (frame.c): where its body ends must be beyond doubt, and the head must
 * be exactly the lines libmicrohttpd parsed, so that no proxy in front of
 * the server can read the same bytes as another request. */
#ifndef PP_WEB_FRAME_H
#define PP_WEB_FRAME_H
#include <microhttpd.h>
#include <stddef.h>

#include "web/reply.h"

/* The request line's target as the URI log callback saw it: what
 * frame_check needs of it is read there, since libmicrohttpd splits and
 * decodes it in place afterwards. */
typedef struct frame_target {
    const char *at; /* where it starts in the request's head */
    size_t len;     /* its bytes up to the first NUL */
    int visible;    /* all of them visible ASCII, as RFC 3986 has it (any other byte percent-encoded) */
} frame_target;

/* What frame_check needs of uri, the URI log callback's. */
frame_target frame_target_of(const char *uri);

/* On the first call of the access handler (the head in, no body read):
 * 0, or -1 with r filled (400 or 501); the caller queues r at once, so that
 * libmicrohttpd reads no body and closes the connection after it.
 * method and version are the handler's arguments. */
int frame_check(struct MHD_Connection *c, const char *method, const char *version, const frame_target *t,
                reply *r);

#endif
