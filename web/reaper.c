/* reaper.c: the time limit on receiving a request. libmicrohttpd's
 * connection timeout counts idle time only, so a client that sends a byte of
 * its headers every few seconds (slowloris) would hold a connection, and
 * with enough of them every connection the server allows. Each connection
 * here has a clock that runs while a request arrives: from the connection's
 * start, or from the end of its previous reply, until the request's headers
 * and body are in. The reaper thread shuts down the socket of a connection
 * whose clock passed the limit; libmicrohttpd then sees the end of the
 * stream and closes it. The clock stands still while the server answers,
 * so a live stream may last hours.
 *
 * A client that closes in the middle of its request's body is shut down
 * here too, within about a second: libmicrohttpd, having seen the end of
 * the stream, waits out its timeout for the rest of the body (in the
 * headers it closes at once), and meanwhile the
 * connection counts against its address's limit (a client that did that
 * 128 times kept every request from its address out, the dashboard's on
 * loopback too). A socket with nothing unread and the end of the stream
 * whose clock has run a second holds no request that can still complete:
 * libmicrohttpd reads and parses on the same turn, and stops the clock.
 *
 * Why shutdown() is safe on a socket libmicrohttpd owns: a connection is
 * unlinked here (under the mutex) by its "closed" notification, which
 * libmicrohttpd sends before it closes the descriptor, so the reaper never
 * touches a descriptor number that was closed and given to someone else. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "web/conn.h"
#include "web/reaper.h"

struct reaper_conn {
    reaper_conn *prev, *next;
    int fd;
    uint64_t since_ns; /* when its current request began to arrive; 0 = answering */
};

#define REAPER_PEEK_NS 1000000000ull /* how often a running clock's socket is looked at for its end */

/* Sleeps until the earliest running clock reaches the limit, at most a
 * second while any runs (to look for clients that closed), or, with none
 * running, until one starts (reaper_conn_open and reaper_conn_clock wake
 * it): an idle server's reaper does not wake at all. A clock that starts
 * while it sleeps ends no earlier than those it sleeps for, since every
 * clock has the same limit and this one started last. */
static void *reaper_main(void *arg) {
    reaper *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        uint64_t now = pp_now_ns(), next = 0;
        for (reaper_conn *c = r->conns; c; c = c->next) {
            if (c->since_ns == 0) continue;
            int slow = now - c->since_ns >= r->limit_ns;
            if (slow || (now - c->since_ns >= REAPER_PEEK_NS && conn_client_gone(c->fd))) {
                shutdown(c->fd, SHUT_RDWR);
                c->since_ns = 0; /* once */
                if (slow) atomic_fetch_add(&r->closed, 1);
            } else if (next == 0 || c->since_ns + r->limit_ns < next) {
                next = c->since_ns + r->limit_ns;
            }
        }
        r->idle = next == 0;
        if (next > now + REAPER_PEEK_NS) next = now + REAPER_PEEK_NS;
        if (r->idle) pthread_cond_wait(&r->cv, &r->mu);
        else pp_cond_wait_until(&r->cv, &r->mu, next);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Under mu: a clock started; wake a reaper that sleeps with none running. */
static void clock_started(reaper *r) {
    if (r->idle) pthread_cond_signal(&r->cv);
}

int reaper_start(reaper *r, unsigned limit_s, pp_err *err) {
    r->conns = NULL;
    r->stop = 0;
    r->idle = 0;
    r->limit_ns = (uint64_t)limit_s * 1000000000ull;
    atomic_init(&r->closed, 0);
    pp_cond_init_monotonic(&r->cv);
    pthread_mutex_init(&r->mu, NULL);
    int e = pthread_create(&r->thread, NULL, reaper_main, r);
    if (e != 0) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        return pp_fail(err, "cannot start the HTTP server's request timer thread: %s", strerror(e));
    }
    return 0;
}

void reaper_stop(reaper *r) {
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
}

void reaper_free(reaper *r) {
    /* Every connection was unlinked by its "closed" notification when the
     * daemon stopped; anything left is freed all the same. */
    while (r->conns) reaper_conn_closed(r, r->conns);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
}

reaper_conn *reaper_conn_open(reaper *r, int fd) {
    reaper_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL; /* the connection goes unguarded rather than refused */
    c->fd = fd;
    c->since_ns = pp_now_ns();
    pthread_mutex_lock(&r->mu);
    c->next = r->conns;
    if (r->conns) r->conns->prev = c;
    r->conns = c;
    clock_started(r);
    pthread_mutex_unlock(&r->mu);
    return c;
}

void reaper_conn_closed(reaper *r, reaper_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&r->mu);
    if (c->prev) c->prev->next = c->next;
    else r->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&r->mu);
    free(c);
}

void reaper_conn_clock(reaper *r, reaper_conn *c, int running) {
    if (!c) return;
    pthread_mutex_lock(&r->mu);
    c->since_ns = running ? pp_now_ns() : 0;
    if (running) clock_started(r);
    pthread_mutex_unlock(&r->mu);
}
