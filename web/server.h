/* server.h: what a running server holds (http_start makes it, http_stop
 * frees it): its options, the database connections, the live-stream hub,
 * the pools for long reads, the request reaper and the counters /metrics
 * reports. The routes read it; only http.c starts, changes and stops it. */
#ifndef PP_WEB_SERVER_H
#define PP_WEB_SERVER_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "web/dbpool.h"
#include "web/http.h"
#include "web/live.h"
#include "web/reaper.h"
#include "web/sqlpool.h"
#include "web/sqlproc.h"

#define HTTP_CODES 600

struct http_server {
    http_options o;
    struct MHD_Daemon *daemon;
    char url[128];
    uint16_t port;
    char *token;
    size_t token_len;
    int loopback;   /* the listener is on a loopback address: the Host is checked (guard.h) */
    char **allow;   /* --allow-host: names a Host may give besides the loopback ones (lower case) */
    size_t nallow;
    dbpool pool;
    live_hub *live;
    sql_pool *sql, *traces; /* POST /api/sql; GET .../trace.json */
    sql_pool *analyses;     /* the routes whose cost grows with the job (ROUTE_ANALYSIS_POOL) */
    sqlproc_spawner sqlprocs; /* starts POST /api/sql's queries, each in a process of its own */
    char *sql_exe;          /* the pprun that runs them (http_options.sql_exe) */
    reaper reaper;
    atomic_ullong requests[HTTP_CODES]; /* by status code, for /metrics */
    atomic_int stopping;                /* http_stop began: the routes' database work ends */
    atomic_size_t held;                 /* bytes of answers libmicrohttpd holds until their clients read them */
    atomic_ullong gone;                 /* requests not run: their clients had closed */
};

#endif
