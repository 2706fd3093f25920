/* guard.c: the checks a request's head passes before its route runs
 * (guard.h): Host (DNS rebinding), Origin (another site's page), the
 * token, the query, the body's size and its type. One table, run in order
 * for every request; the first that fails answers it.
 *
 * Why Host: a page of attacker.example.com whose name the attacker then
 * points at 127.0.0.1 (DNS rebinding) is, to the browser, same-origin with
 * the loopback server, and may read every answer; only the Host header
 * still says which name the page used. Loopback servers such as Jupyter
 * and Vite's dev server answer their own names only, and so does this one.
 * Why Origin: a page of another site cannot read the answers, but it can
 * send requests (a form, fetch with mode no-cors); a request carrying an
 * Origin other than the server's own is refused, whatever it asks. Why
 * Content-Type: a body of application/json is what such a page cannot send
 * without the CORS preflight that this server never answers. */
#include "web/guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "web/query.h"
#include "web/routes.h"

#define GUARD_MAX_NAMES 64
#define GUARD_NAME_MAX 253 /* a DNS name's most characters */

/* ---- host names ----------------------------------------------------------- */

/* The name of a Host header's value, its port (":" and a number up to
 * 65535) cut off, IPv6 brackets dropped, into name: 0, or -1 when it is no
 * host[:port] (an IPv6 address without brackets, an empty name, a bad
 * port). Blanks after the value are no part of it (RFC 9110 5.5), though
 * libmicrohttpd keeps them. */
static int host_name(const char *value, char *name, size_t cap) {
    char host[GUARD_NAME_MAX + 16];
    size_t len = strlen(value);
    while (len && (value[len - 1] == ' ' || value[len - 1] == '\t')) len--;
    if (len >= sizeof host) return -1;
    memcpy(host, value, len);
    host[len] = 0;
    const char *end, *start = host;
    if (host[0] == '[') {
        start = host + 1;
        end = strchr(start, ']');
        if (!end) return -1;
    } else {
        end = strchr(host, ':');
        if (!end) end = host + len;
    }
    const char *port = end + (host[0] == '[');
    if (*port == ':') {
        size_t nd = strspn(port + 1, "0123456789");
        if (nd == 0 || nd > 5 || port[1 + nd] || atoi(port + 1) > 65535) return -1;
    } else if (*port) {
        return -1;
    }
    size_t n = (size_t)(end - start);
    if (n == 0 || n >= cap) return -1;
    memcpy(name, start, n);
    name[n] = 0;
    return 0;
}

/* Whether name (brackets dropped) is one of this machine's loopback names:
 * localhost, an address of 127.0.0.0/8 (dotted decimal, as a browser
 * writes any spelling of it), ::1, or ::ffff:127.x.y.z. */
static int name_is_loopback(const char *name) {
    if (strcasecmp(name, "localhost") == 0) return 1;
    unsigned char a[16];
    if (inet_pton(AF_INET, name, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, name, a) != 1) return 0;
    struct in6_addr v6;
    memcpy(&v6, a, sizeof v6);
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && a[12] == 127);
}

/* Host names are letters, digits, '-', '.' and '_' (RFC 952/1123 and what
 * resolvers take); an IPv6 address is whatever inet_pton reads as one. */
static int name_is_valid(const char *name) {
    unsigned char a[16];
    if (strchr(name, ':')) return inet_pton(AF_INET6, name, a) == 1;
    return name[0] && strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") ==
                          strlen(name);
}

int guard_init(http_server *s, const char *list, pp_err *err) {
    s->allow = NULL;
    s->nallow = 0;
    if (!list || !*list) return 0;
    s->allow = calloc(GUARD_MAX_NAMES, sizeof *s->allow);
    if (!s->allow) return pp_fail(err, "out of memory");
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        char raw[GUARD_NAME_MAX + 3], name[GUARD_NAME_MAX + 1];
        if (n == 0 || n >= sizeof raw)
            return pp_fail(err, GUARD_ALLOW_FLAG " '%.*s': expected a host name (at most %d characters)",
                           (int)(n > 60 ? 60 : n), p, GUARD_NAME_MAX);
        memcpy(raw, p, n);
        raw[n] = 0;
        /* "[::1]" or "::1"; a name with a port, a scheme or a path is refused */
        const char *inner = raw;
        if (raw[0] == '[' && raw[n - 1] == ']') {
            raw[n - 1] = 0;
            inner = raw + 1;
        }
        if (strlen(inner) > GUARD_NAME_MAX || !name_is_valid(inner))
            return pp_fail(err,
                           GUARD_ALLOW_FLAG " '%.60s': expected a host name or address alone (no port, no scheme, "
                           "no path), e.g. " GUARD_ALLOW_FLAG " pprun.example.com",
                           raw);
        if (s->nallow == GUARD_MAX_NAMES)
            return pp_fail(err, GUARD_ALLOW_FLAG ": at most %d names", GUARD_MAX_NAMES);
        size_t k = 0;
        for (; inner[k]; k++) name[k] = (char)(inner[k] >= 'A' && inner[k] <= 'Z' ? inner[k] - 'A' + 'a' : inner[k]);
        name[k] = 0;
        if (!(s->allow[s->nallow] = strdup(name))) return pp_fail(err, "out of memory");
        s->nallow++;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

void guard_free(http_server *s) {
    for (size_t i = 0; i < s->nallow; i++) free(s->allow[i]);
    free(s->allow);
    s->allow = NULL;
    s->nallow = 0;
}

/* ---- the checks ------------------------------------------------------------- */

typedef int guard_fn(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt, reply *r);

static const char *header(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* 403 unless the Host is a loopback name or an allowed one. Checked on a
 * loopback listener, and on any listener given --allow-host; another
 * listener needs a token, and is reached by whatever name the network
 * gives it. */
static int check_host(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt,
                      reply *r) {
    (void)rt;
    (void)method;
    if (!s->loopback && s->nallow == 0) return 0;
    const char *host = header(c, MHD_HTTP_HEADER_HOST);
    if (!host) return 0; /* HTTP/1.0 without one: no browser sends that */
    char name[GUARD_NAME_MAX + 1];
    if (host_name(host, name, sizeof name) == 0) {
        if (name_is_loopback(name)) return 0;
        for (size_t i = 0; i < s->nallow; i++)
            if (strcasecmp(name, s->allow[i]) == 0) return 0;
    }
    reply_error(r, 403,
                "Host '%.200s' is not a name of this server: it answers localhost, 127.0.0.1 and [::1]%s "
                "(a page whose name is pointed at this machine must not read it: DNS rebinding); if you reach it "
                "by this name, start it with " GUARD_ALLOW_FLAG " %.200s",
                host, s->nallow ? " and the names given with " GUARD_ALLOW_FLAG : "",
                host_name(host, name, sizeof name) == 0 ? name : "NAME");
    return -1;
}

/* Whether origin is "http://HOST" or "https://HOST", HOST the request's
 * Host header exactly (in any case): the page the request came from is one
 * this server gave. https: a TLS proxy in front passes the Host on. */
static int origin_is_own(const char *origin, const char *host) {
    static const char *const schemes[] = {"http://", "https://"};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t n = strlen(schemes[i]);
        if (strncasecmp(origin, schemes[i], n) == 0 && strcasecmp(origin + n, host) == 0) return 1;
    }
    return 0;
}

/* 403 for a request whose Origin is not the server's own. */
static int check_origin(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt,
                        reply *r) {
    (void)rt;
    (void)s;
    (void)method;
    const char *origin = header(c, "Origin");
    if (!origin) return 0;
    const char *host = header(c, MHD_HTTP_HEADER_HOST);
    if (host && origin_is_own(origin, host)) return 0;
    reply_error(r, 403,
                "cross-origin request refused: Origin '%.200s' is not this server's own (http://%.200s); only "
                "the dashboard's own pages may call it",
                origin, host ? host : "no Host given");
    return -1;
}

/* The credentials of "Authorization: Bearer TOKEN": the scheme in any case
 * (RFC 7235 2.1: curl users and proxies write "bearer"), then one or more
 * spaces or tabs; anything else before the token is no match. NULL if none. */
static const char *bearer_token(const char *h) {
    static const char scheme[] = "bearer";
    if (!h) return NULL;
    for (size_t i = 0; i < sizeof scheme - 1; i++) {
        char ch = h[i];
        if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a'); /* ASCII only: not the locale's idea of case */
        if (ch != scheme[i]) return NULL;
    }
    h += sizeof scheme - 1;
    if (*h != ' ' && *h != '\t') return NULL;
    while (*h == ' ' || *h == '\t') h++;
    return h;
}

/* 401 without the token. Constant time in the length of the expected
 * token: no early exit on the first differing byte, nor on a length
 * mismatch. */
static int check_token(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt,
                       reply *r) {
    (void)rt;
    (void)method;
    if (!s->token) return 0;
    const char *got = bearer_token(header(c, MHD_HTTP_HEADER_AUTHORIZATION));
    size_t glen = got ? strlen(got) : 0;
    /* Blanks after the value are not part of it (RFC 7230 3.2.4), and
     * libmicrohttpd keeps them: `-H "Authorization: Bearer $T "` matches. */
    while (glen > 0 && (got[glen - 1] == ' ' || got[glen - 1] == '\t')) glen--;
    unsigned char diff = (unsigned char)(!got || glen != s->token_len);
    for (size_t i = 0; i < s->token_len; i++) diff |= (unsigned char)(s->token[i] ^ (i < glen ? got[i] : 0));
    if (diff == 0) return 0;
    reply_error(r, 401, "missing or wrong token: send 'Authorization: Bearer TOKEN'");
    return -1;
}

static int check_query(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt, reply *r) {
    (void)s;
    (void)method;
    return query_check(c, rt ? rt->params : NULL, r);
}

/* 413 for a body announced over the cap (a chunked one is refused:
 * frame.c). */
static int check_size(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt,
                      reply *r) {
    (void)rt;
    (void)method;
    const char *cl = header(c, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (!errno && !*end && n <= s->o.max_body) return 0;
    reply_error(r, 413, "request body larger than the limit of %zu bytes", s->o.max_body);
    return -1;
}

/* 415 for a request whose Content-Type is not application/json
 * (parameters after a ';' allowed): one with a body, or any to a
 * ROUTE_JSON route; not one its route refuses (405: its body is never
 * read). */
static int check_type(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt,
                      reply *r) {
    (void)s;
    if (!route_takes(rt, method)) return 0;
    const char *cl = header(c, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int body = (cl && strcmp(cl, "0") != 0) || header(c, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (!body && !(rt->flags & ROUTE_JSON)) return 0;
    static const char json[] = "application/json";
    const char *ct = header(c, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (ct && strncasecmp(ct, json, sizeof json - 1) == 0) {
        const char *rest = ct + sizeof json - 1;
        rest += strspn(rest, " \t");
        if (*rest == 0 || *rest == ';') return 0;
    }
    reply_error(r, 415, "a request body must be JSON: send 'Content-Type: application/json' (got %s%.100s%s)",
                ct ? "'" : "", ct ? ct : "none", ct ? "'" : "");
    return -1;
}

/* In order: who asks (Host, Origin, token) before what is asked (the
 * query, the body's size and type). flags: the ROUTE_* a request's route
 * must have for the check to apply (0: every request). */
static const struct {
    unsigned flags;
    guard_fn *check;
} guard_table[] = {
    {0, check_host},           /* 403 */
    {0, check_origin},         /* 403 */
    {ROUTE_TOKEN, check_token}, /* 401 */
    {ROUTE_QUERY, check_query}, /* 400 */
    {0, check_size},           /* 413 */
    {0, check_type},           /* 415 */
};

int guard_check(const http_server *s, struct MHD_Connection *c, const char *method, const route *rt, reply *r) {
    for (size_t i = 0; i < sizeof guard_table / sizeof guard_table[0]; i++)
        if ((guard_table[i].flags & rt->flags) == guard_table[i].flags &&
            guard_table[i].check(s, c, method, rt, r) != 0)
            return -1;
    return 0;
}
