/* reply.c: filling a reply (reply.h). */
#include "web/reply.h"

#include <stdarg.h>
#include <stdlib.h>

void reply_error(reply *r, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kstr(&w, "error", msg);
    jw_kint(&w, "status", status);
    jw_obj_end(&w);
    free(r->body);
    r->body = jw_take(&w, &r->len);
    r->status = r->body ? status : 500;
    r->type = "application/json";
    r->cache = NULL;
}

void reply_body(reply *r, jw *w, const char *type) {
    free(r->body);
    r->body = jw_take(w, &r->len);
    if (!r->body) {
        reply_error(r, 500, "out of memory building the response");
        return;
    }
    r->status = 200;
    r->type = type;
    r->cache = NULL;
}

void reply_json(reply *r, jw *w) { reply_body(r, w, "application/json"); }

void reply_clear(reply *r) {
    if (r->stream) r->stream_end(r->stream_arg);
    if (r->file) fclose(r->file);
    free(r->body);
    *r = (reply){0};
}
