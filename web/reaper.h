/* reaper.h: the time limit on receiving a request (reaper.c): a
 * connection's clock runs from its start, and again from the end of each
 * reply, until its next request is in whole; past the limit the reaper
 * thread shuts the socket down. Every reaper_conn_* call may come from any
 * MHD thread. */
#ifndef PP_WEB_REAPER_H
#define PP_WEB_REAPER_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/pp.h"

typedef struct reaper_conn reaper_conn;
typedef struct reaper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop;
    int idle; /* the thread sleeps until a clock starts (no deadline) */
    uint64_t limit_ns;
    reaper_conn *conns; /* every open connection, under mu */
    atomic_ullong closed; /* connections shut down for a slow request, for /metrics */
} reaper;

int reaper_start(reaper *r, unsigned limit_s, pp_err *err);
void reaper_stop(reaper *r); /* joins the thread; before MHD_stop_daemon */
void reaper_free(reaper *r); /* after MHD_stop_daemon */
/* A connection starts (its clock running); NULL when out of memory, and
 * then the other calls ignore it. Owned here until reaper_conn_closed. */
reaper_conn *reaper_conn_open(reaper *r, int fd);
void reaper_conn_closed(reaper *r, reaper_conn *c);
/* running 0: its request is in, the clock stops; 1: a reply ended, the
 * clock starts again for the next request. */
void reaper_conn_clock(reaper *r, reaper_conn *c, int running);

#endif
