/* sqlproc.h: a user's query (POST /api/sql) run in a process of its own,
 * `pprun serve-query`, which the server kills at its deadline (docs/api.md,
 * "POST /api/sql").
 *
 * Why apart: SQLite does not stop some work inside one row, where no loop
 * goes round for its time limit to be checked (operators reading an
 * aggregate's 16 MiB result in place ran 70 s against a 2 s limit), and a
 * bug of SQLite's that crashes (a stack overflow) would take the server
 * with it, and under `pprun run --serve` the job. A process the deadline
 * can kill bounds both: the answer comes by the time limit and a second,
 * and a crash is the query's 500, not the server's end.
 *
 * Every end is here, so that the protocols are in one file. The server
 * asks its spawner (below) for each query's process with one message on
 * the spawner's socket: the program, the database and the limits, and
 * three descriptors: the child's standard input (a socket the server
 * writes the SQL to), its standard output (a pipe the server reads the
 * answer from) and the query's line (a socket: the spawner says there the
 * child's pid, or why it could not start it, then how it ended; a message
 * of the server's there, or its end, has the spawner kill the child). The
 * child answers with the HTTP status and the answer's length on the first
 * line and, after it, the answer: the body (200: the result as
 * report_sql_table writes it) or the error's message. */
#ifndef PP_WEB_SQLPROC_H
#define PP_WEB_SQLPROC_H

#include <pthread.h>
#include <sys/types.h>

#include "base/pp.h"
#include "db/usersql.h"
#include "web/reply.h"

/* The hidden command the server runs (runner/main.c). */
#define SQLPROC_COMMAND "serve-query"
#define SQLPROC_CHILDREN_MAX 64 /* queries' processes at once; past them a query is a 503 */

/* A server's spawner: a process apart from the server's own tree
 * (base/apart.h), started with the server, that starts each query's
 * process and is its parent. Apart because the server may run inside
 * `pprun run --serve`, whose launcher reaps every child of its process
 * and ends its descendants with the job's attempts (runner/launch/launch.h):
 * a query's process of the server's own would be taken by it. The
 * spawner ends when its socket does (the server stopped or died), and
 * kills the queries' processes it still runs; each of them also dies with
 * the spawner. */
typedef struct sqlproc_spawner {
    pthread_rwlock_t lock; /* the queries read fd under it; a spawner started again writes it */
    int fd;                /* the socket to the spawner; -1 before it started */
    pid_t group;           /* its session (base/apart.h) */
    _Atomic int stopping;
} sqlproc_spawner;

/* No spawner yet (sqlproc_spawner_close frees it as it is). */
void sqlproc_spawner_init(sqlproc_spawner *sp);
/* 0, or -1 with err. Before the server starts its threads: the spawner is
 * a fork of this process. One that is gone later (killed) is started
 * again by the next query, said on stderr. */
int sqlproc_spawner_start(sqlproc_spawner *sp, pp_err *err);
/* Kills every query's process and refuses new queries (503): the server
 * stops. Waits (a few seconds at most) until the spawner is gone. */
void sqlproc_spawner_stop(sqlproc_spawner *sp);
/* Once nothing runs queries any more: closes the socket, frees sp. */
void sqlproc_spawner_close(sqlproc_spawner *sp);

/* Runs sql under lim over the database at db_path in `exe serve-query`
 * (started by sp) and fills r with the answer: the result (200, with
 * "elapsed_ms"), the query's refusal or failure (400, 403, 408, 413, 503),
 * a 408 when the process was still at it a second past the time limit
 * (killed), a 500 when it died of a signal of its own or could not be
 * started, a 503 when sp is stopping or runs SQLPROC_CHILDREN_MAX queries. */
void sqlproc_run(sqlproc_spawner *sp, const char *exe, const char *db_path, const char *sql,
                 const usersql_limits *lim, reply *r);

/* The child: `serve-query DB PARENT_PID TIME_NS MAX_ROWS MAX_BYTES MAX_MEM`,
 * the SQL on standard input. 0 when it answered, 2 for bad arguments. */
int sqlproc_child_main(int argc, char **argv);

#endif
