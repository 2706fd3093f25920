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
 * Both ends are here, so that the protocol between them is in one file:
 * the server writes the SQL to the child's standard input; the child
 * answers on its standard output with the HTTP status and the answer's
 * length on the first line and, after it, the answer: the body (200: the
 * result as report_sql_table writes it) or the error's message. */
#ifndef PP_WEB_SQLPROC_H
#define PP_WEB_SQLPROC_H
#include <pthread.h>
#include <sqlite3.h>
#include <sys/types.h>

#include "db/usersql.h"
#include "web/reply.h"

/* The hidden command the server runs (runner/main.c). */
#define SQLPROC_COMMAND "serve-query"
#define SQLPROC_GROUP_MAX 64 /* the children a group knows of at once (a server's SQL workers) */

/* A server's running children, so that its stop ends them at once. */
typedef struct sqlproc_group {
    pthread_mutex_t mu;
    pid_t pid[SQLPROC_GROUP_MAX]; /* 0: a free place */
    int stopping;
} sqlproc_group;

void sqlproc_group_init(sqlproc_group *g);
/* Kills every child of g, and refuses new ones (503): the server stops. */
void sqlproc_group_stop(sqlproc_group *g);
void sqlproc_group_destroy(sqlproc_group *g);

/* Runs sql under lim over the database at db_path in `exe serve-query`
 * (a child of g) and fills r with the answer: the result (200, with
 * "elapsed_ms"), the query's refusal or failure (400, 403, 408, 413, 503),
 * a 408 when the process was still at it a second past the time limit
 * (killed), a 500 when it died of a signal of its own or could not be
 * started, a 503 when g is stopping. */
void sqlproc_run(sqlproc_group *g, const char *exe, const char *db_path, const char *sql, const usersql_limits *lim,
                 reply *r);

/* The same query run on this thread over db (a connection of the server's
 * pool), the same answer: for a server inside `pprun run --serve`, whose
 * launcher reaps every child of its process and ends them with the job's
 * attempts (runner/launch/launch.h), so that a query's process would be
 * taken by it. */
void sqlproc_run_here(sqlite3 *db, const char *sql, const usersql_limits *lim, reply *r);

/* The child: `serve-query DB PARENT_PID TIME_NS MAX_ROWS MAX_BYTES MAX_MEM`,
 * the SQL on standard input. 0 when it answered, 2 for bad arguments. */
int sqlproc_child_main(int argc, char **argv);

#endif
