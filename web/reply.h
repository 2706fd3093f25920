/* reply.h: what a request is answered with: a status, a content type and a
 * body, and the ways a handler fills one. The lowest file of web/: the
 * routes fill replies, the server (http.c) sends them. */
#ifndef PP_WEB_REPLY_H
#define PP_WEB_REPLY_H
#include <stddef.h>
#include <stdio.h>

#include "base/json.h"

/* A response to send: status, content type and body (owned, freed by MHD). */
typedef struct reply {
    int status;
    const char *type;
    char *body;
    size_t len;
    FILE *file;         /* owned; instead of body when set: its len bytes from the start (a big export) */
    const char *cache;  /* Cache-Control; NULL = no-store */
    const char *allow;  /* a 405's Allow; NULL = "GET, HEAD" */
} reply;

/* Fills r with {"error": msg, "status": status}. */
void reply_error(reply *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Takes w's bytes as a JSON body with status 200 (500 if w ran out of
 * memory); w is left empty. */
void reply_json(reply *r, jw *w);
/* Frees what r holds (body, file) and empties it. */
void reply_clear(reply *r);

#endif
