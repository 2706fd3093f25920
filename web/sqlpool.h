/* sqlpool.h: long reads on threads of their own (sqlpool.c): POST /api/sql,
 * the trace export and the analyses. The request's connection is suspended meanwhile,
 * so no MHD thread waits. */
#ifndef PP_WEB_SQLPOOL_H
#define PP_WEB_SQLPOOL_H
#include <microhttpd.h>
#include <sqlite3.h>

#include "base/pp.h"
#include "web/dbpool.h"
#include "web/reply.h"

typedef struct sql_pool sql_pool;
typedef struct sql_task sql_task;

/* What a pool's worker does for a task: answers r from db (a connection of
 * the pool's dbpool). arg is the submitter's. */
typedef void sqlpool_fn(sqlite3 *db, void *arg, reply *r);
/* A pool of `workers` threads, their connections from conns; past them
 * max_waiting requests wait, the rest are refused (503 naming `what`, a
 * static string). */
int sqlpool_start(sql_pool **p, const char *what, dbpool *conns, unsigned workers, unsigned max_waiting, pp_err *err);
/* Queues run(db, arg, reply) for a worker and suspends c (1: the caller
 * returns MHD_YES and is called again once the reply is ready, with *task
 * set), or fills r (0: the pool is full, the server is stopping). arg must
 * live until the task is taken. */
int sqlpool_submit(sql_pool *p, struct MHD_Connection *c, sqlpool_fn *run, void *arg, sql_task **task, reply *r);
/* Moves a finished task's reply into r (once its connection is resumed);
 * the task stays the request's until sqlpool_done. */
void sqlpool_take(sql_task *t, reply *r);
/* Interrupts the running tasks and joins the workers; every suspended
 * connection is resumed and answered 503, and each 503 is sent before this
 * returns (2 s at most). Before MHD_stop_daemon. */
void sqlpool_stop(sql_pool *p);
void sqlpool_free(sql_pool **p); /* after MHD_stop_daemon */
/* The request of task t (sqlpool_submit's) has completed: its answer sent,
 * its client gone, or the daemon stopping. Its place is free, and t and
 * any answer not taken are freed. t NULL: nothing. */
void sqlpool_done(sql_task *t);
/* Tasks running on a worker now, and waiting for one. */
void sqlpool_count(sql_pool *p, unsigned *running, unsigned *queued);

#endif
