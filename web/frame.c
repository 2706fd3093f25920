/* frame.c: a request's head held to RFC 9112 (frame.h).
 *
 * libmicrohttpd 0.9.75 parses heads leniently, in ways a proxy in front
 * of the server may read differently (request smuggling): it takes the
 * first of two Content-Lengths (the rest of the body read as the next
 * request), lets Transfer-Encoding win over Content-Length on a connection
 * it keeps open (a pipelined request after a chunked body got two
 * answers), reads a body of any other transfer coding until the client
 * closes (Transfer-Encoding: gzip was answered only by the timeout), ends
 * a line at a bare LF, cuts a header's value at a NUL and the request
 * target at one, joins a folded line (obs-fold) to the header's NAME, and
 * takes whitespace before a header's colon as part of its name
 * ("Content-Length : 5" is then no length, and the body a request), and
 * takes an HTTP/1.1 request without a Host, or with two. By RFC 9112 each
 * is a 400 (501 for a coding it does not know) and the connection closed
 * after it. A chunked body, which libmicrohttpd frames as leniently (a bare
 * LF ends a chunk's line, a trailer line may be folded), is not read at
 * all: 411, send Content-Length.
 *
 * What the access handler is given shows most of this: every header's
 * name and value, in order. The rest shows in where they lie: the head
 * libmicrohttpd parsed is one buffer of the client's bytes, from the method
 * to the blank line (MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE bytes), with
 * each line end, the spaces around the target and each header's colon
 * overwritten by NULs, and the names and values pointing into it. A head
 * of CRLF lines with nothing libmicrohttpd dropped is then exactly: the
 * method, one space, the target, one space, the version, CRLF, each header
 * right after the one before (name, colon, blanks, value, CRLF), and the
 * blank line. A bare LF, a NUL that cut a value or the target, a folded
 * line (its name is moved elsewhere) or extra spaces all break that
 * sequence. If a later libmicrohttpd lays its buffer out otherwise, every
 * request is refused, and every test says so: this never fails quietly. */
#include "web/frame.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 5.6.2: the characters of a token (a method, a header's name). */
static int is_tchar(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int is_token(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)s[i])) return 0;
    return 1;
}

/* The walk over the headers, in the order they came. */
typedef struct frame_walk {
    const char *next;  /* where the next line must start */
    int broken;        /* a line was not where it must be */
    char bad[200];     /* the first header found wrong, what is wrong */
    unsigned lengths;  /* Content-Length headers */
    unsigned codings;  /* Transfer-Encoding headers */
    unsigned hosts;    /* Host headers */
    const char *coding; /* the first one's value */
} frame_walk;

static enum MHD_Result walk_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size) {
    (void)kind;
    frame_walk *w = cls;
    if (key != w->next) w->broken = 1;
    if (!w->bad[0] && !is_token(key, key_size))
        snprintf(w->bad, sizeof w->bad, "the header name '%.60s' is not a token (blanks before its colon?)", key);
    for (const char *p = key + key_size + 1; p < value && !w->broken; p++)
        if (*p != ' ' && *p != '\t') w->broken = 1;
    for (size_t i = 0; i < value_size && !w->bad[0]; i++) {
        unsigned char ch = (unsigned char)value[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            snprintf(w->bad, sizeof w->bad, "the header %.60s holds the control character 0x%02x (a bare CR?)", key,
                     ch);
    }
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) w->lengths++;
    if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) w->hosts++;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0 && w->codings++ == 0) w->coding = value;
    w->next = value + value_size + 2;
    return MHD_YES;
}

frame_target frame_target_of(const char *uri) {
    frame_target t = {.at = uri, .len = strlen(uri), .visible = 1};
    for (size_t i = 0; i < t.len; i++)
        if ((unsigned char)uri[i] <= 0x20 || (unsigned char)uri[i] >= 0x7f) t.visible = 0;
    t.visible &= t.len > 0;
    return t;
}

/* A Transfer-Encoding other than plain "chunked" (as libmicrohttpd
 * compares it): 501 naming the first coding that is not chunked, or 400
 * when every one is (chunked twice, or with blanks libmicrohttpd keeps). */
static void bad_coding(const char *te, reply *r) {
    for (const char *p = te; *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, " \t,;");
        if (n && !(n == 7 && strncasecmp(p, "chunked", 7) == 0)) {
            reply_error(r, 501, "Transfer-Encoding %.*s is not implemented: send the body with Content-Length",
                        (int)(n > 40 ? 40 : n), p);
            return;
        }
        p += n;
        p += strcspn(p, ",");
    }
    reply_error(r, 400, "Transfer-Encoding '%.40s' is not plain 'chunked' (RFC 9112 applies chunked once, last)", te);
}

int frame_check(struct MHD_Connection *c, const char *method, const char *version, const frame_target *t,
                reply *r) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    size_t mlen = strlen(method), vlen = strlen(version);
    if (!is_token(method, mlen)) {
        reply_error(r, 400, "the method is not a token");
        return -1;
    }
    /* method SP target SP version CRLF, nothing cut by a NUL */
    if (!ci || !t->at || t->at != method + mlen + 1 || t->at + t->len + 1 != version) {
        reply_error(r, 400, "malformed request line: one space between its three parts, no NUL in it");
        return -1;
    }
    if (!t->visible) {
        reply_error(r, 400, "malformed request target: visible ASCII only (percent-encode any other byte)");
        return -1;
    }
    /* libmicrohttpd answers HTTP/2 and later 505 itself, but takes any
     * HTTP/1.x as 1.1: HTTP/1.2 without a Host was served. pprun speaks
     * exactly 1.0 and 1.1 (docs/api.md, "Limits"). */
    if (strcmp(version, MHD_HTTP_VERSION_1_0) != 0 && strcmp(version, MHD_HTTP_VERSION_1_1) != 0) {
        reply_error(r, 505, "HTTP version '%.20s' is not supported: send HTTP/1.1 or HTTP/1.0", version);
        return -1;
    }
    frame_walk w = {.next = version + vlen + 2};
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, walk_header, &w);
    if (w.broken || w.next + 2 != method + ci->header_size) {
        reply_error(r, 400, "malformed header section: every line must end in CRLF, with no NUL in it and no "
                            "folded line (obs-fold)");
        return -1;
    }
    if (w.bad[0]) {
        reply_error(r, 400, "%s", w.bad);
        return -1;
    }
    /* RFC 9112 3.2: which host is meant must be plain too. */
    if (w.hosts > 1 || (w.hosts == 0 && strcmp(version, MHD_HTTP_VERSION_1_1) == 0)) {
        reply_error(r, 400, "an HTTP/1.1 request needs one Host header; this one has %u", w.hosts);
        return -1;
    }
    if (w.lengths > 1) {
        reply_error(r, 400, "Content-Length given %u times: the body's length is in doubt", w.lengths);
        return -1;
    }
    if (w.codings == 0) return 0;
    if (w.codings > 1) {
        reply_error(r, 400, "Transfer-Encoding given %u times", w.codings);
        return -1;
    }
    if (strcasecmp(w.coding, "chunked") != 0) {
        bad_coding(w.coding, r);
        return -1;
    }
    if (w.lengths) {
        reply_error(r, 400, "both Content-Length and Transfer-Encoding: the body's length is in doubt (RFC 9112 "
                            "6.3); send one");
        return -1;
    }
    if (strcmp(version, MHD_HTTP_VERSION_1_0) == 0) {
        reply_error(r, 400, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1): send Content-Length");
        return -1;
    }
    /* A chunked body is framed by libmicrohttpd's chunk parser, which takes
     * bare LFs and folded trailer lines that a proxy in front may read
     * otherwise; the one body the server reads (/api/sql's JSON) has a
     * length any client knows. */
    reply_error(r, 411, "a chunked request body is not read: send the body with Content-Length");
    return -1;
}
