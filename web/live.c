/* live.c: GET /api/jobs/{id}/live: Server-Sent Events fed by polling the
 * database, so it works the same for a job this process runs and for a
 * database another process writes (WAL readers never block the writer).
 *
 * One hub thread polls every poll_ms for each open stream and appends SSE
 * frames to the stream's buffer. A stream's content reader hands out what is
 * buffered; with nothing buffered it suspends its connection (returning 0
 * without suspending would make libmicrohttpd spin) and the hub resumes it
 * when it has something, at the latest with a keep-alive comment every
 * heartbeat_ms, which is also how a closed client is noticed (a suspended
 * connection sees no disconnect).
 *
 * Messages: hello (the cursor to resume from), status, events, losses, step.
 * Every message carries `id: E.LS.LM.SS` (last event id, last loss
 * step.microbatch, last complete step); a client reconnecting with
 * Last-Event-ID gets exactly what came after. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db/usersql.h"
#include "web/internal.h"

#define MAX_STREAMS 256
#define EVENTS_PER_TICK 5000
#define MAX_PENDING (8u << 20) /* a slow client stops being polled */

typedef struct live_sub {
    struct live_sub *next;
    struct MHD_Connection *conn;
    live_hub *hub;
    long job;
    int world;
    int initialised;  /* cursors known (from Last-Event-ID or "now") */
    int64_t ev;       /* last event id sent */
    long ls, lm;      /* last loss sent (step, microbatch) */
    long ss;          /* last complete step sent */
    char status[32];
    jw out;           /* pending bytes: out.buf[off .. len) */
    size_t off;
    int suspended, ending, gone;
    uint64_t last_write_ns;
} live_sub;

struct live_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;
    sqlite3 *db;
    unsigned poll_ms, heartbeat_ms;
    live_sub *subs;
    int nsubs;
};

static void sub_free(live_sub *s) {
    jw_free(&s->out);
    free(s);
}

static void frame_begin(live_sub *s, const char *event) {
    jw_rawf(&s->out, "id: %lld.%ld.%ld.%ld\nevent: %s\ndata: ", (long long)s->ev, s->ls, s->lm, s->ss, event);
    s->out.depth = 0;
    s->out.first[0] = 1;
}

static void frame_end(live_sub *s) { jw_raw(&s->out, "\n\n", 2); }

/* Sets the cursors to "now": what a fresh stream does not replay. */
static int init_cursors(live_hub *h, live_sub *s) {
    const char *q =
        "SELECT (SELECT coalesce(max(id),0) FROM events),"
        " (SELECT step FROM losses WHERE job_id=?1 ORDER BY step DESC, microbatch DESC LIMIT 1),"
        " (SELECT microbatch FROM losses WHERE job_id=?1 ORDER BY step DESC, microbatch DESC LIMIT 1),"
        " (SELECT max(step) FROM (SELECT step FROM step_stats WHERE job_id=?1 GROUP BY step"
        "   HAVING count(*) >= (SELECT world_size FROM jobs WHERE id=?1)))";
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h->db, q, -1, &st, NULL) != SQLITE_OK) return -1;
    sqlite3_bind_int64(st, 1, s->job);
    int rc = -1;
    if (sqlite3_step(st) == SQLITE_ROW) {
        s->ev = sqlite3_column_int64(st, 0);
        s->ls = sqlite3_column_type(st, 1) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 1);
        s->lm = sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 2);
        s->ss = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 3);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* One poll of one stream; returns 1 if it wrote something. */
static int poll_sub(live_hub *h, live_sub *s) {
    size_t before = s->out.len;
    sqlite3_stmt *st;
    if (!s->initialised) {
        if (init_cursors(h, s) != 0) return 0;
        s->initialised = 1;
        jw_raw(&s->out, "retry: 2000\n\n", 13);
        frame_begin(s, "hello");
        jw_obj(&s->out);
        jw_kint(&s->out, "job", s->job);
        jw_kint(&s->out, "last_event_id", s->ev);
        jw_kint(&s->out, "last_complete_step", s->ss);
        jw_obj_end(&s->out);
        frame_end(s);
    }
    /* status */
    if (sqlite3_prepare_v2(h->db, "SELECT status, exit_code, failed_rank, failure, world_size FROM jobs WHERE id=?",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, s->job);
        if (sqlite3_step(st) == SQLITE_ROW) {
            const char *status = (const char *)sqlite3_column_text(st, 0);
            s->world = sqlite3_column_int(st, 4);
            if (status && strcmp(status, s->status) != 0) {
                snprintf(s->status, sizeof s->status, "%s", status);
                frame_begin(s, "status");
                jw_obj(&s->out);
                jw_kstr(&s->out, "status", status);
                jw_key(&s->out, "exit_code");
                if (sqlite3_column_type(st, 1) == SQLITE_NULL) jw_null(&s->out);
                else jw_int(&s->out, sqlite3_column_int(st, 1));
                jw_key(&s->out, "failed_rank");
                if (sqlite3_column_type(st, 2) == SQLITE_NULL) jw_null(&s->out);
                else jw_int(&s->out, sqlite3_column_int(st, 2));
                jw_kstr(&s->out, "failure", (const char *)sqlite3_column_text(st, 3));
                jw_obj_end(&s->out);
                frame_end(s);
            }
        }
        sqlite3_finalize(st);
    }
    /* events: same rows as /events (times since t0) */
    if (sqlite3_prepare_v2(h->db,
                           "SELECT e.id, e.rank, e.step, coalesce(e.microbatch,-1), coalesce(e.stage,-1), e.phase, "
                           "e.start_ns - j.t0_ns, e.end_ns - j.t0_ns, coalesce(e.peer,-1), coalesce(e.bytes,0) "
                           "FROM events e JOIN jobs j ON j.id=e.job_id WHERE e.id>?1 AND e.job_id=?2 "
                           "ORDER BY e.id LIMIT ?3",
                           -1, &st, NULL) == SQLITE_OK) {
        static const char *const phases[] = {"F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OPT"};
        sqlite3_bind_int64(st, 1, s->ev);
        sqlite3_bind_int64(st, 2, s->job);
        sqlite3_bind_int(st, 3, EVENTS_PER_TICK);
        jw body;
        jw_init(&body);
        int n = 0;
        int64_t last = s->ev;
        while (sqlite3_step(st) == SQLITE_ROW) {
            const char *ph = (const char *)sqlite3_column_text(st, 5);
            int phi = -1;
            for (int k = 0; ph && k < 8; k++)
                if (!strcmp(ph, phases[k])) phi = k;
            last = sqlite3_column_int64(st, 0);
            jw_rawf(&body, "%s[%lld,%d,%d,%d,%d,%d,%lld,%lld,%d,%lld]", n++ ? "," : "", (long long)last,
                    sqlite3_column_int(st, 1), sqlite3_column_int(st, 2), sqlite3_column_int(st, 3),
                    sqlite3_column_int(st, 4), phi, (long long)sqlite3_column_int64(st, 6),
                    (long long)sqlite3_column_int64(st, 7), sqlite3_column_int(st, 8),
                    (long long)sqlite3_column_int64(st, 9));
        }
        sqlite3_finalize(st);
        if (n > 0 && !body.oom) {
            s->ev = last;
            frame_begin(s, "events");
            jw_rawf(&s->out, "{\"count\":%d,\"events\":[", n);
            jw_raw(&s->out, body.buf, body.len);
            jw_raw(&s->out, "]}", 2);
            frame_end(s);
        }
        jw_free(&body);
    }
    /* losses */
    if (sqlite3_prepare_v2(h->db,
                           "SELECT step, microbatch, loss FROM losses WHERE job_id=?1 AND "
                           "(step>?2 OR (step=?2 AND microbatch>?3)) ORDER BY step, microbatch LIMIT 5000",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, s->job);
        sqlite3_bind_int64(st, 2, s->ls);
        sqlite3_bind_int64(st, 3, s->lm);
        jw body;
        jw_init(&body);
        jw_arr(&body);
        int n = 0;
        long ls = s->ls, lm = s->lm;
        while (sqlite3_step(st) == SQLITE_ROW) {
            ls = sqlite3_column_int(st, 0);
            lm = sqlite3_column_int(st, 1);
            jw_arr(&body);
            jw_int(&body, ls);
            jw_int(&body, lm);
            if (sqlite3_column_type(st, 2) == SQLITE_NULL) jw_null(&body); /* not finite */
            else jw_num(&body, sqlite3_column_double(st, 2));
            jw_arr_end(&body);
            n++;
        }
        jw_arr_end(&body);
        sqlite3_finalize(st);
        if (n > 0 && !body.oom) {
            s->ls = ls;
            s->lm = lm;
            frame_begin(s, "losses");
            jw_raw(&s->out, "{\"columns\":[\"step\",\"microbatch\",\"loss\"],\"losses\":", 49);
            jw_raw(&s->out, body.buf, body.len);
            jw_raw(&s->out, "}", 1);
            frame_end(s);
        }
        jw_free(&body);
    }
    /* step summaries, once every rank's stats for the step are in */
    if (sqlite3_prepare_v2(h->db,
                           "SELECT step, count(*), min(start_ns) - (SELECT t0_ns FROM jobs WHERE id=?1), "
                           "max(end_ns) - (SELECT t0_ns FROM jobs WHERE id=?1), avg(bubble_ratio), "
                           SQL_STEP_MEAN_LOSS("s.step") " "
                           "FROM step_stats s WHERE job_id=?1 AND step>?2 GROUP BY step ORDER BY step LIMIT 1000",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, s->job);
        sqlite3_bind_int64(st, 2, s->ss);
        sqlite3_stmt *ranks = NULL;
        sqlite3_prepare_v2(h->db, "SELECT rank, bubble_ratio FROM step_stats WHERE job_id=?1 AND step=?2 ORDER BY rank",
                           -1, &ranks, NULL);
        while (ranks && sqlite3_step(st) == SQLITE_ROW) {
            long step = sqlite3_column_int(st, 0);
            if (sqlite3_column_int(st, 1) < s->world) break; /* not complete yet */
            s->ss = step;
            frame_begin(s, "step");
            jw_obj(&s->out);
            jw_kint(&s->out, "step", step);
            jw_kint(&s->out, "start", sqlite3_column_int64(st, 2));
            jw_kint(&s->out, "end", sqlite3_column_int64(st, 3));
            jw_kint(&s->out, "time_ns", sqlite3_column_int64(st, 3) - sqlite3_column_int64(st, 2));
            jw_knum(&s->out, "bubble_ratio_mean", sqlite3_column_double(st, 4));
            jw_key(&s->out, "loss");
            if (sqlite3_column_type(st, 5) == SQLITE_NULL) jw_null(&s->out);
            else jw_num(&s->out, sqlite3_column_double(st, 5));
            jw_key(&s->out, "bubble_ratio");
            jw_arr(&s->out);
            sqlite3_reset(ranks);
            sqlite3_bind_int64(ranks, 1, s->job);
            sqlite3_bind_int64(ranks, 2, step);
            while (sqlite3_step(ranks) == SQLITE_ROW) jw_num(&s->out, sqlite3_column_double(ranks, 1));
            jw_arr_end(&s->out);
            jw_obj_end(&s->out);
            frame_end(s);
        }
        sqlite3_finalize(ranks);
        sqlite3_finalize(st);
    }
    uint64_t now = pp_now_ns();
    if (s->out.len == before && now - s->last_write_ns >= (uint64_t)h->heartbeat_ms * 1000000ull)
        jw_raw(&s->out, ": keep-alive\n\n", 14);
    if (s->out.len != before) s->last_write_ns = now;
    return s->out.len != before;
}

static void *hub_main(void *arg) {
    live_hub *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        /* Streams whose connection is gone are freed here, the one place
         * that also walks the list. */
        for (live_sub **pp = &h->subs; *pp;) {
            live_sub *s = *pp;
            if (s->gone) {
                *pp = s->next;
                h->nsubs--;
                sub_free(s);
                continue;
            }
            if (!s->ending && s->out.len - s->off < MAX_PENDING && poll_sub(h, s) && s->suspended) {
                s->suspended = 0;
                MHD_resume_connection(s->conn);
            }
            pp = &s->next;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)h->poll_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int live_start(live_hub **out, const char *db_path, unsigned poll_ms, unsigned heartbeat_ms, pp_err *err) {
    live_hub *h = calloc(1, sizeof *h);
    if (!h) return pp_fail(err, "out of memory");
    if (usersql_open(db_path, &h->db, err) != 0) {
        free(h);
        return -1;
    }
    h->poll_ms = poll_ms;
    h->heartbeat_ms = heartbeat_ms;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (pthread_create(&h->thread, NULL, hub_main, h) != 0) {
        sqlite3_close(h->db);
        free(h);
        return pp_fail(err, "cannot start the live-stream thread");
    }
    h->running = 1;
    *out = h;
    return 0;
}

static ssize_t sub_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    live_sub *s = cls;
    live_hub *h = s->hub;
    pthread_mutex_lock(&h->mu);
    size_t avail = s->out.len - s->off;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, s->out.buf + s->off, n);
        s->off += n;
        if (s->off == s->out.len) s->off = s->out.len = 0;
        pthread_mutex_unlock(&h->mu);
        return (ssize_t)n;
    }
    if (s->ending) {
        pthread_mutex_unlock(&h->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    s->suspended = 1;
    MHD_suspend_connection(s->conn);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static void sub_release(void *cls) {
    live_sub *s = cls;
    live_hub *h = s->hub;
    pthread_mutex_lock(&h->mu);
    s->gone = 1;
    pthread_mutex_unlock(&h->mu);
}

/* "E.LS.LM.SS" as sent in id: lines. */
static int parse_cursor(const char *v, live_sub *s) {
    long long e;
    long ls, lm, ss;
    int n = 0;
    if (sscanf(v, "%lld.%ld.%ld.%ld%n", &e, &ls, &lm, &ss, &n) != 4 || v[n] || e < 0 || ls < -1 || lm < -1 || ss < -1)
        return -1;
    s->ev = e;
    s->ls = ls;
    s->lm = lm;
    s->ss = ss;
    return 0;
}

enum MHD_Result live_open(http_server *srv, struct MHD_Connection *c, long job, http_reply *r, int *queued) {
    live_hub *h = srv->live;
    *queued = 0;
    /* The job must exist; checked through the pool, not the hub's connection. */
    pp_err err;
    sqlite3 *db = dbpool_get(&srv->pool, &err);
    if (!db) {
        http_error(r, 503, "%s", err.msg);
        return MHD_NO;
    }
    sqlite3_stmt *st = NULL;
    int exists = 0, world = 1;
    if (sqlite3_prepare_v2(db, "SELECT world_size FROM jobs WHERE id=?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, job);
        if (sqlite3_step(st) == SQLITE_ROW) {
            exists = 1;
            world = sqlite3_column_int(st, 0);
        }
    }
    sqlite3_finalize(st);
    dbpool_put(&srv->pool, db);
    if (!exists) {
        http_error(r, 404, "no job %ld in this database", job);
        return MHD_NO;
    }
    live_sub *s = calloc(1, sizeof *s);
    if (!s) {
        http_error(r, 500, "out of memory");
        return MHD_NO;
    }
    s->conn = c;
    s->hub = h;
    s->job = job;
    s->world = world;
    jw_init(&s->out);
    s->last_write_ns = pp_now_ns();
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (last && *last) {
        if (parse_cursor(last, s) != 0) {
            free(s);
            http_error(r, 400, "bad Last-Event-ID '%.60s': expected the id of a message of this stream", last);
            return MHD_NO;
        }
        s->initialised = 1;
        jw_raw(&s->out, "retry: 2000\n\n", 13);
    }
    pthread_mutex_lock(&h->mu);
    int full = h->nsubs >= MAX_STREAMS;
    pthread_mutex_unlock(&h->mu);
    if (full) {
        free(s);
        http_error(r, 503, "too many live streams open (%d)", MAX_STREAMS);
        return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sub_read, s, sub_release);
    if (!resp) {
        free(s);
        http_error(r, 500, "cannot create the stream response");
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    pthread_mutex_lock(&h->mu);
    s->next = h->subs;
    h->subs = s;
    h->nsubs++;
    pthread_cond_signal(&h->cv); /* first poll now: the hello goes out at once */
    pthread_mutex_unlock(&h->mu);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* sub_release runs when MHD is done with it */
    atomic_fetch_add(&srv->requests[200], 1);
    *queued = 1;
    return ret;
}

void live_end_all(live_hub *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->running) pthread_join(h->thread, NULL);
    h->running = 0;
    pthread_mutex_lock(&h->mu);
    for (live_sub *s = h->subs; s; s = s->next) {
        s->ending = 1;
        if (s->suspended) {
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

void live_free(live_hub *h) {
    if (!h) return;
    live_end_all(h);
    for (live_sub *s = h->subs, *n; s; s = n) {
        n = s->next;
        sub_free(s);
    }
    sqlite3_close(h->db);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

int live_count(live_hub *h) {
    pthread_mutex_lock(&h->mu);
    int n = h->nsubs;
    pthread_mutex_unlock(&h->mu);
    return n;
}
