/* reply.h: what a request is answered with: a status, a content type and a
 * body, and the ways a handler fills one. At the bottom of web/ (it
 * includes nothing of it): the routes, the live streams and the pools fill
 * replies, the server (http.c) sends them. */
#ifndef PP_WEB_REPLY_H
#define PP_WEB_REPLY_H
#include <microhttpd.h>
#include <stddef.h>
#include <stdio.h>

#include "base/json.h"

/* A response to send: status, content type and one kind of body: bytes
 * (body), a file, bytes of the binary (data) or a stream. What it owns is
 * handed to libmicrohttpd when it is sent, or freed by reply_clear. */
typedef struct reply {
    int status;
    const char *type;   /* Content-Type; NULL = application/json */
    char *body;         /* owned */
    size_t len;         /* of body, file or data */
    FILE *file;         /* owned; instead of body when set: its len bytes from the start (a big export) */
    const void *data;   /* instead of body when set: bytes that live as long as the program (a dashboard file) */
    /* Instead of a body when set: a stream of unknown length, read as the
     * client takes it (a live stream); stream_end(stream_arg) runs once
     * libmicrohttpd is done with it, or when it is never sent. */
    MHD_ContentReaderCallback stream;
    MHD_ContentReaderFreeCallback stream_end;
    void *stream_arg;
    const char *cache;  /* Cache-Control; NULL = no-store */
    const char *allow;  /* a 405's Allow; NULL = "GET, HEAD" */
    char etag[24];      /* ETag, when not empty */
    int dashboard;      /* a dashboard file: the Content-Security-Policy its pages run under */
} reply;

/* Fills r with {"error": msg, "status": status}. */
void reply_error(reply *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Takes w's bytes as a body of Content-Type `type` with status 200 (500
 * if w ran out of memory); w is left empty. */
void reply_body(reply *r, jw *w, const char *type);
/* reply_body as application/json. */
void reply_json(reply *r, jw *w);
/* Frees what r holds (body, file, stream) and empties it. */
void reply_clear(reply *r);

#endif
