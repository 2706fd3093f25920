/* dbpool.h: read-only connections to the trace database for the request
 * threads (dbpool.c). */
#ifndef PP_WEB_DBPOOL_H
#define PP_WEB_DBPOOL_H
#include <pthread.h>
#include <sqlite3.h>

#include "base/pp.h"

/* A small pool of read-only connections: one per concurrent request. */
typedef struct dbpool {
    pthread_mutex_t mu;
    char *path;
    sqlite3 *idle[32];
    int nidle;
} dbpool;

int dbpool_init(dbpool *p, const char *path, pp_err *err);
/* Returns a connection (the caller gives it back with dbpool_put) or NULL. */
sqlite3 *dbpool_get(dbpool *p, pp_err *err);
void dbpool_put(dbpool *p, sqlite3 *db);
void dbpool_close(dbpool *p);

#endif
