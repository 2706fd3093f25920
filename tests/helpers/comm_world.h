/* comm_world.h: runs a function on N forked ranks connected by comm, for the
 * transport tests.  Every rank opens comm through a file exchange in a fresh
 * temporary directory, runs fn, flushes, closes and exits; the parent
 * collects each rank's exit status and the report it left. */
#ifndef PP_COMM_WORLD_H
#define PP_COMM_WORLD_H
#include "runner/comm/comm.h"

#define CW_MAX 8

/* Runs in each rank's process.  Return 0 for success; whatever it writes to
 * report (a pp_err) comes back to the parent either way. */
/* fn returns this after closing comm itself (the harness then neither
 * flushes nor closes it). */
#define CW_CLOSED 100
typedef int (*cw_fn)(comm *c, int rank, void *arg, pp_err *report);

typedef struct cw_result {
    int exited[CW_MAX];     /* 1 if the rank exited normally */
    int code[CW_MAX];       /* exit code, or the signal that killed it */
    char report[CW_MAX][1024];
    char job_key[64];
} cw_result;

/* nodes: node index per rank (NULL = all on one node); transport as in
 * comm_config.  res->job_key is set before the ranks fork, so passing res
 * as arg gives fn the job key.  Returns -1 if the ranks could not be started. */
int cw_run(int world, const int *nodes, const char *transport, cw_fn fn, void *arg, cw_result *res);
/* The same, all on one node, but the exchange is the job's real store
 * (runner/store/store.h): a server in a process of its own, one client per rank, as pprun
 * workers have.  A client is not thread-safe, so this catches comm calling
 * the exchange from two threads at once.  A rank whose fn fails exits at
 * once (its comm may be wedged), without flushing or closing. */
int cw_run_store(int world, const char *transport, cw_fn fn, void *arg, cw_result *res);
/* cw_run on one node over TCP, rank r opening comm with the job token
 * tokens[r] (NULL: none). */
int cw_run_tokens(int world, const char *const *tokens, cw_fn fn, void *arg, cw_result *res);

#endif
