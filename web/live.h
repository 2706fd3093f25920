/* live.h: GET /api/jobs/{id}/live, Server-Sent Events fed by polling the
 * database (live.c): one hub thread for every stream. */
#ifndef PP_WEB_LIVE_H
#define PP_WEB_LIVE_H
#include <microhttpd.h>
#include <stddef.h>

#include "base/pp.h"
#include "web/reply.h"

typedef struct live_hub live_hub;

/* Starts the hub thread on a connection of its own to db_path: it polls
 * every poll_ms while a stream is open, and writes a keep-alive comment on
 * a stream idle for heartbeat_ms. */
int live_start(live_hub **out, const char *db_path, unsigned poll_ms, unsigned heartbeat_ms, pp_err *err);
/* GET /api/jobs/{id}/live: fills r with the stream of job's new rows for
 * c (job is in the database: its route checked), or with an error. */
void live_open(live_hub *h, struct MHD_Connection *c, long job, reply *r);
/* Ends every stream (resumes suspended connections); call before MHD_stop_daemon. */
void live_end_all(live_hub *h);
void live_free(live_hub *h);
/* Streams open (not ended), at most 256. */
int live_count(live_hub *h);
/* Bytes of stream messages not yet taken by their clients, all streams. */
size_t live_unsent(live_hub *h);
/* Streams ended because their clients took nothing while the budget of
 * unsent bytes was full (live.c), since the server started. */
unsigned long long live_stalled(live_hub *h);

/* The live stream's new events of job ?1 after id ?2 up to id ?3, times
 * minus ?4 (t0), at most ?5. `+job_id` keeps SQLite off the job indexes:
 * it walks rowids from the cursor instead of the job's whole index plus a
 * sort (tests check the plan). */
#define SQL_LIVE_EVENTS                                                                                    \
    "SELECT id, rank, step, coalesce(microbatch,-1), coalesce(stage,-1), phase, start_ns - ?4, end_ns - ?4, " \
    "coalesce(peer,-1), coalesce(bytes,0), name FROM events WHERE id > ?2 AND id <= ?3 AND +job_id = ?1 "    \
    "AND source = 'cpu' "                                                                                  \
    "ORDER BY id LIMIT ?5"

#endif
