/* web_burst.h: many connections at once to a server on 127.0.0.1, each
 * from one of several loopback source addresses, each sending one GET and
 * waiting for its answer; what became of every connection is counted.
 * The standing test of "every accepted request is answered"
 * (test_web_burst.c) and the load tool bench/burst.c use it.
 *
 * One thread, non-blocking sockets and poll(): 1,000 connections are
 * opened within milliseconds, so the server sees them as one burst. */
#ifndef PP_TEST_WEB_BURST_H
#define PP_TEST_WEB_BURST_H
#include <stddef.h>

typedef struct webburst_opts {
    int port;          /* the server's, on 127.0.0.1 */
    unsigned conns;    /* connections opened at once */
    unsigned addrs;    /* source addresses 127.0.0.1 .. 127.0.0.N, in turn; 0 = 1 */
    const char *path;  /* what each GETs */
    unsigned wait_ms;  /* how long a connection may wait for its answer, from the burst's start */
} webburst_opts;

typedef struct webburst_counts {
    unsigned answered;   /* a status line came back */
    unsigned ok, busy;   /* ... 200, 503 */
    unsigned other;      /* ... any other status */
    unsigned refused;    /* connect() failed: never accepted */
    unsigned dropped;    /* closed or reset without a byte of answer */
    unsigned unanswered; /* accepted, and still nothing back at wait_ms */
    double max_ms;       /* the slowest answer, from the burst's start */
} webburst_counts;

/* Runs one burst. -1 (errno set) when the client itself cannot work: no
 * sockets left, a source address that cannot be bound. */
int webburst_run(const webburst_opts *o, webburst_counts *out);

#endif
