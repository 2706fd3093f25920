/* routes_static.c: the dashboard's files (static/), compiled into the
 * binary (base/embed.h). A URL is only ever looked up in that table, never
 * mapped to a path of the file system. Any method but GET and HEAD on a
 * file is a 405; a URL that names no file, whatever the method, a 404. */
#include <stdio.h>
#include <string.h>

#include "base/embed.h"
#include "base/pp.h"
#include "web/routes.h"

static const char *content_type(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    if (!strcmp(dot, ".png")) return "image/png";
    if (!strcmp(dot, ".ico")) return "image/x-icon";
    if (!strcmp(dot, ".json")) return "application/json";
    if (!strcmp(dot, ".txt")) return "text/plain; charset=utf-8";
    return "application/octet-stream";
}

/* Looks the path up in the embedded table; nothing else is ever consulted.
 * Only plain names are looked up at all, so a traversal attempt is a 404
 * without touching the table's neighbours either. NULL: no such file. */
static const pp_embedded_file *static_file(const char *url, char name[256]) {
    int plain = url[0] == '/' && strlen(url) < 200 && !strstr(url, "..") && !strstr(url, "//");
    for (const char *p = url; plain && *p; p++)
        plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '/' ||
                *p == '.' || *p == '-' || *p == '_';
    if (!plain) return NULL;
    snprintf(name, 256, "static%s", strcmp(url, "/") == 0 ? "/index.html" : url);
    return pp_embed_find(pp_static_files, name);
}

/* If-None-Match's weak comparison (RFC 9110 13.1.2): "*", or any tag of
 * the comma-separated list equal to etag, with or without W/. */
static int etag_matches(const char *list, const char *etag) {
    size_t n = strlen(etag);
    for (const char *p = list; *p;) {
        p += strspn(p, " \t,");
        if (*p == '*') return 1;
        if (p[0] == 'W' && p[1] == '/') p += 2;
        if (strncmp(p, etag, n) == 0 && (p[n] == 0 || p[n] == ',' || p[n] == ' ' || p[n] == '\t')) return 1;
        p += strcspn(p, ",");
    }
    return 0;
}

void route_static(route_req *q, reply *r) {
    char name[256];
    const pp_embedded_file *f = static_file(q->url, name);
    if (!f) {
        reply_error(r, 404, "no such page: the dashboard is at /, the API under /api/ (docs/api.md)");
        return;
    }
    /* HEAD: libmicrohttpd sends the headers of the full answer, no body. */
    if (strcmp(q->method, "GET") != 0 && strcmp(q->method, "HEAD") != 0) {
        reply_error(r, 405, "%s not allowed on %s", q->method, q->url);
        return;
    }
    /* so that reloads get 304s */
    snprintf(r->etag, sizeof r->etag, "\"%016llx\"", (unsigned long long)pp_hash(f->data, f->size));
    const char *inm = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    int not_modified = inm && etag_matches(inm, r->etag);
    r->status = not_modified ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK;
    r->data = not_modified ? (const void *)"" : (const void *)f->data;
    r->len = not_modified ? 0 : f->size;
    r->type = content_type(name);
    /* Revalidate every time: the binary (and so the files) can change
     * between runs on the same port. */
    r->cache = "no-cache";
    r->dashboard = 1;
}
