/* live.c: GET /api/jobs/{id}/live: Server-Sent Events fed by polling the
 * database, so it works the same for a job this process runs and for a
 * database another process writes (WAL readers never block the writer).
 *
 * One hub thread polls every poll_ms while a stream is open (and sleeps
 * while none is). Each tick it takes a snapshot of the open streams under
 * the lock, then runs the SQL without the lock (stream readers, live_open
 * and /metrics never wait on a query), and finally moves
 * each stream's new frames into its buffer under the lock. Streams of one
 * job with the same cursor share one query per tick: those following a job
 * live all sit at the newest row, so that is one query per job per tick.
 *
 * A stream's content reader hands out what is buffered; with nothing
 * buffered it suspends its connection (returning 0 without suspending would
 * make libmicrohttpd spin) and the hub resumes it when it has something, at
 * the latest with a keep-alive comment every heartbeat_ms. A suspended
 * connection sees no disconnect, so each tick the hub also peeks at the
 * socket of every suspended stream: a client that closed its end is ended
 * then, not at the next heartbeat (until then its connection counted
 * against the per-IP limit: a client opening and closing 128 streams kept
 * every request from its address, the dashboard's on loopback too, out
 * for 10 s).
 *
 * Unsent bytes are bounded server-wide: a client that opens streams and
 * never reads must not make the server buffer 8 MiB for each of them, nor
 * keep the room from a client that reads. A stream is polled only while
 * the bytes its client has not read are under its share (half of
 * LIVE_UNSENT_MAX over the open streams, at most MAX_PENDING), and each
 * tick polls streams only until what it produced reaches what is left of
 * LIVE_UNSENT_MAX (the unsent bytes of every stream), those whose clients
 * have read the most first, and among those a different one first each
 * tick. So the streams never hold more than LIVE_UNSENT_MAX plus one
 * poll's messages, which each query caps in rows and in bytes
 * (POLL_BYTES). When they hold it all, every stream that holds unsent
 * messages and whose client has taken none for LIVE_STALL_NS is ended, its
 * unsent messages dropped; its connection stays until its client reads or
 * the idle timeout, but no longer counts among the MAX_STREAMS. Nothing is
 * lost: a client that reconnects with the id of the last message it got
 * (EventSource does so by itself, as does the dashboard) gets exactly what
 * came after. Before, streams nobody read kept the budget, and a stream
 * whose client read again, or a new one, waited behind them until they
 * closed (minutes, in a test of 256 of them).
 *
 * Messages: hello (the cursor to resume from), status, events, losses, step.
 * Every message carries `id: E.LS.LM.SS` (last event id, last loss
 * step.microbatch, last complete step); a client reconnecting with
 * Last-Event-ID gets exactly what came after. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "db/alive.h"
#include "db/analyze.h"
#include "db/bounds.h"
#include "db/summary.h"
#include "db/usersql.h"
#include "report/sql.h"
#include "web/conn.h"
#include "web/live.h"

#define MAX_STREAMS 256
#define EVENTS_PER_TICK 5000
#define LOSSES_PER_TICK 5000
#define STEPS_PER_TICK 1000
#define MAX_PENDING ((size_t)8 << 20) /* the most a stream's share can be */
/* The server-wide budget of unsent bytes (docs/api.md, "Limits"). */
#define LIVE_UNSENT_MAX ((size_t)64 << 20)
/* What one query of a tick may produce for its message, past its row limit:
 * rows stop once the message passes it (a step message is never cut). */
#define POLL_BYTES ((size_t)512 << 10)
/* A stream's staging buffer larger than this is freed after each tick
 * rather than kept at its high-water mark. */
#define KEEP_BYTES ((size_t)64 << 10)
/* How long a client may take nothing of its stream before the stream is
 * ended, when the budget is full. */
#define LIVE_STALL_NS (5ull * 1000000000ull)
/* A stream's socket send buffer (the kernel doubles it): what it holds is
 * outside the budget, and autotuned it grew to 2 MiB a stream whose client
 * never read (200 of them held 404 MB); 512 KiB still carries a stream at
 * 5 MB/s over a 100 ms round trip. */
#define LIVE_SNDBUF (256 << 10)

typedef struct live_sub {
    struct live_sub *next;
    struct MHD_Connection *conn;
    int fd; /* the connection's socket, -1 unknown: peeked at only while suspended (MHD keeps it open) */
    live_hub *hub;
    long job;
    /* The hub thread's alone (no lock): cursors and this tick's frames. */
    int initialised;  /* cursors known (from Last-Event-ID or "now") */
    int64_t ev;       /* last event id sent (or skipped: none of this job up to it) */
    long ls, lm;      /* last loss sent (step, microbatch) */
    long ss;          /* last complete step sent */
    char status[32];
    uint64_t last_write_ns;
    jw stage;
    /* Under hub->mu: pending bytes out.buf[off .. len) and the state. */
    jw out;
    size_t off;
    uint64_t took_ns; /* when its client last took bytes, or was given some while it held none */
    int suspended, ending, gone;
} live_sub;

struct live_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;    /* under mu */
    sqlite3 *db;          /* the hub thread's */
    /* A tick's queries end at the hub's stop (hub_progress): a file whose
     * tables are views over endless queries held the hub, and the
     * server's stop, for good. What such a tick made is not sent. */
    atomic_int halt;
    unsigned poll_ms, heartbeat_ms;
    live_sub *subs;       /* under mu; freed only by the hub thread (or live_free) */
    unsigned long long stalled; /* under mu: streams ended because their clients took nothing */
    unsigned ticks;       /* the hub thread's: where a tick starts polling */
};

/* ---- one tick's query results, shared by streams asking the same -------- */

enum { Q_STATUS, Q_EVENTS, Q_LOSSES, Q_STEPS };

typedef struct qmsg {
    size_t off, len; /* the message's JSON in result.text */
    int64_t cursor;  /* Q_STEPS: the step it is about */
} qmsg;

typedef struct result {
    long job;
    int kind;
    int64_t k1, k2;      /* the cursor the query started from */
    int64_t n1, n2;      /* the cursor after it (events: skips rows of other jobs too) */
    int found;           /* Q_STATUS: the job exists */
    int64_t t0;          /* Q_STATUS */
    char status[32];     /* Q_STATUS */
    jw text;
    qmsg *msgs;
    int nmsgs, cap;
} result;

typedef struct tick {
    sqlite3 *db;
    int64_t hi; /* the newest event id of the tick's snapshot */
    result **r;
    int n, cap;
} tick;

static int add_msg(result *r, size_t off, int64_t cursor) {
    if (r->nmsgs == r->cap) {
        int cap = r->cap ? 2 * r->cap : 4;
        qmsg *m = realloc(r->msgs, (size_t)cap * sizeof *m);
        if (!m) return -1;
        r->msgs = m;
        r->cap = cap;
    }
    r->msgs[r->nmsgs++] = (qmsg){off, r->text.len - off, cursor};
    return 0;
}

static void q_status(tick *t, result *r) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(t->db,
                           "SELECT " SQL_JOB_STATUS("") ", exit_code, failed_rank, " SQL_JOB_FAILURE("")
                           ", t0_ns FROM jobs WHERE id=?",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, r->job);
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *status = (const char *)sqlite3_column_text(st, 0);
        r->found = 1;
        r->t0 = sqlite3_column_int64(st, 4);
        snprintf(r->status, sizeof r->status, "%s", status ? status : "");
        jw *w = &r->text;
        jw_obj(w);
        jw_kstr(w, "status", r->status);
        jw_key(w, "exit_code");
        if (sqlite3_column_type(st, 1) == SQLITE_NULL) jw_null(w);
        else jw_int(w, sqlite3_column_int(st, 1));
        jw_key(w, "failed_rank");
        if (sqlite3_column_type(st, 2) == SQLITE_NULL) jw_null(w);
        else jw_int(w, sqlite3_column_int(st, 2));
        jw_kstr(w, "failure", (const char *)sqlite3_column_text(st, 3));
        jw_obj_end(w);
        add_msg(r, 0, 0);
    }
    sqlite3_finalize(st);
}

/* Events after k1: rows are same as /events (times since t0). When fewer
 * than the limit come back, every row up to the snapshot's newest id was
 * looked at, so the cursor moves there even without rows of this job. */
static void q_events(tick *t, result *r, int64_t t0) {
    r->n1 = r->k1;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(t->db, SQL_LIVE_EVENTS, -1, &st, NULL) != SQLITE_OK) return;
    sqlite3_bind_int64(st, 1, r->job);
    sqlite3_bind_int64(st, 2, r->k1);
    sqlite3_bind_int64(st, 3, t->hi);
    sqlite3_bind_int64(st, 4, t0);
    sqlite3_bind_int(st, 5, EVENTS_PER_TICK);
    jw rows;
    jw_init(&rows);
    int n = 0, rc;
    int64_t last = r->k1;
    int full = 0; /* stopped at POLL_BYTES: the rows after `last` come next tick */
    while (!full && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        last = sqlite3_column_int64(st, 0);
        jw_rawf(&rows, "%s[%lld,%d,%d,%d,%d,%d,%lld,%lld,%d,%lld", n++ ? "," : "", (long long)last,
                sqlite3_column_int(st, 1), sqlite3_column_int(st, 2), sqlite3_column_int(st, 3),
                sqlite3_column_int(st, 4), analyze_phase_of((const char *)sqlite3_column_text(st, 5)),
                (long long)sqlite3_column_int64(st, 6), (long long)sqlite3_column_int64(st, 7),
                sqlite3_column_int(st, 8), (long long)sqlite3_column_int64(st, 9));
        report_sql_raw_text_cell(&rows, st, 10); /* a span's name, null for an op: as /events */
        jw_raw(&rows, "]", 1);
        full = rows.len >= POLL_BYTES;
    }
    sqlite3_finalize(st);
    if ((full || rc == SQLITE_DONE) && !rows.oom) {
        r->n1 = !full && n < EVENTS_PER_TICK && t->hi > last ? t->hi : last;
        if (n > 0) {
            jw_rawf(&r->text, "{\"count\":%d,\"events\":[", n);
            jw_raw(&r->text, rows.buf, rows.len);
            jw_raw(&r->text, "]}", 2);
            if (!r->text.oom) add_msg(r, 0, 0);
        }
    }
    jw_free(&rows);
}

static void q_losses(tick *t, result *r) {
    r->n1 = r->k1;
    r->n2 = r->k2;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(t->db,
                           "SELECT step, microbatch, loss FROM losses WHERE job_id=?1 AND "
                           "(step>?2 OR (step=?2 AND microbatch>?3)) ORDER BY step, microbatch LIMIT ?4",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, r->job);
    sqlite3_bind_int64(st, 2, r->k1);
    sqlite3_bind_int64(st, 3, r->k2);
    sqlite3_bind_int(st, 4, LOSSES_PER_TICK);
    jw *w = &r->text;
    jw_raw(w, "{\"columns\":[\"step\",\"microbatch\",\"loss\"],\"losses\":", 49);
    jw_arr(w);
    int n = 0, rc;
    int64_t ls = r->k1, lm = r->k2;
    int full = 0; /* stopped at POLL_BYTES */
    while (!full && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        ls = sqlite3_column_int(st, 0);
        lm = sqlite3_column_int(st, 1);
        jw_arr(w);
        jw_int(w, ls);
        jw_int(w, lm);
        double loss;
        if (bounds_loss(st, 2, &loss)) jw_num(w, loss);
        else jw_null(w); /* not finite, or no number */
        jw_arr_end(w);
        n++;
        full = w->len >= POLL_BYTES;
    }
    jw_arr_end(w);
    jw_raw(w, "}", 1);
    sqlite3_finalize(st);
    if ((!full && rc != SQLITE_DONE) || w->oom || n == 0) {
        r->text.len = 0;
        return;
    }
    r->n1 = ls;
    r->n2 = lm;
    add_msg(r, 0, 0);
}

/* One message per complete step after k1; a step that never completes
 * (a rank without stats for it) does not hold back the ones after it. A
 * step whose number or times are past their bounds (a damaged or forged
 * file: db/bounds.h) is left out, as one that never completes: /steps
 * refuses it, naming it, but a stream has no status to answer with, and
 * the differences below must not overflow. A rank's held bytes past
 * their bound are null. */
static void q_steps(tick *t, result *r, int64_t t0) {
    r->n1 = r->k1;
    sqlite3_stmt *st = NULL, *ranks = NULL;
    if (sqlite3_prepare_v2(t->db,
                           "SELECT c.step, c.start_ns, c.end_ns, c.bubble_ratio_mean, " SQL_STEP_MEAN_LOSS("c.step")
                           ", " SQL_STEP_EVAL_LOSS("c.step") ", " SQL_STEP_EVAL_LOSSES("c.step")
                           " FROM (" SQL_COMPLETE_STEPS("AND step>?2") ") c ORDER BY c.step LIMIT ?3",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(t->db,
                           "SELECT bubble_ratio, act_peak_bytes FROM step_stats WHERE job_id=?1 AND step=?2 ORDER BY rank",
                           -1, &ranks, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return;
    }
    sqlite3_bind_int64(st, 1, r->job);
    sqlite3_bind_int64(st, 2, r->k1);
    sqlite3_bind_int(st, 3, STEPS_PER_TICK);
    jw *w = &r->text;
    while (w->len < POLL_BYTES && sqlite3_step(st) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(st, 0);
        if (!bounds_step_row_ok(st, 0) || !bounds_ok(&bounds_time, t0)) {
            r->n1 = step;
            continue;
        }
        int64_t start = sqlite3_column_int64(st, 1) - t0, end = sqlite3_column_int64(st, 2) - t0;
        size_t off = w->len;
        w->depth = 0;
        w->first[0] = 1;
        jw_obj(w);
        jw_kint(w, "step", step);
        jw_kint(w, "start", start);
        jw_kint(w, "end", end);
        jw_kint(w, "time_ns", end - start);
        jw_knum(w, "bubble_ratio_mean", sqlite3_column_double(st, 3));
        jw_key(w, "loss");
        if (sqlite3_column_type(st, 4) == SQLITE_NULL) jw_null(w);
        else jw_num(w, sqlite3_column_double(st, 4));
        jw_key(w, "eval_loss"); /* as in /steps */
        if (sqlite3_column_type(st, 5) == SQLITE_NULL) jw_null(w);
        else jw_num(w, sqlite3_column_double(st, 5));
        jw_kint(w, "eval_losses", sqlite3_column_int64(st, 6));
        jw_key(w, "bubble_ratio");
        jw_arr(w);
        sqlite3_reset(ranks);
        sqlite3_bind_int64(ranks, 1, r->job);
        sqlite3_bind_int64(ranks, 2, step);
        double lo = INFINITY, hi = -INFINITY;
        while (sqlite3_step(ranks) == SQLITE_ROW) {
            double v = sqlite3_column_double(ranks, 0);
            jw_num(w, v);
            lo = fmin(lo, v);
            hi = fmax(hi, v);
        }
        jw_arr_end(w);
        jw_knum(w, "bubble_ratio_min", lo); /* as in /steps */
        jw_knum(w, "bubble_ratio_max", hi);
        jw_key(w, "act_peak_bytes");
        jw_arr(w);
        sqlite3_reset(ranks); /* the same few rows again: two arrays, no buffer */
        int64_t most = -1;
        while (sqlite3_step(ranks) == SQLITE_ROW) {
            int64_t bytes = sqlite3_column_int64(ranks, 1);
            int ok = bounds_ok(&bounds_bytes, bytes);
            if (ok) jw_int(w, bytes);
            else jw_null(w);
            if (ok && bytes > most) most = bytes;
        }
        jw_arr_end(w);
        jw_kint_or_null(w, "act_peak_bytes_max", most);
        jw_obj_end(w);
        if (w->oom || add_msg(r, off, step) != 0) break;
        r->n1 = step;
    }
    sqlite3_finalize(ranks);
    sqlite3_finalize(st);
}

/* The result of (job, kind, cursor) for this tick: run once, then shared. */
static result *query(tick *t, long job, int kind, int64_t k1, int64_t k2, int64_t t0) {
    for (int i = 0; i < t->n; i++) {
        result *r = t->r[i];
        if (r->job == job && r->kind == kind && r->k1 == k1 && r->k2 == k2) return r;
    }
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        result **a = realloc(t->r, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        t->r = a;
        t->cap = cap;
    }
    result *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (result){.job = job, .kind = kind, .k1 = k1, .k2 = k2};
    jw_init(&r->text);
    t->r[t->n++] = r;
    switch (kind) {
    case Q_STATUS: q_status(t, r); break;
    case Q_EVENTS: q_events(t, r, t0); break;
    case Q_LOSSES: q_losses(t, r); break;
    default: q_steps(t, r, t0); break;
    }
    return r;
}

static void tick_free(tick *t) {
    for (int i = 0; i < t->n; i++) {
        jw_free(&t->r[i]->text);
        free(t->r[i]->msgs);
        free(t->r[i]);
    }
    free(t->r);
}

/* ---- one stream's share of a tick --------------------------------------- */

static void frame(live_sub *s, const char *event, const result *r, int i) {
    jw_rawf(&s->stage, "id: %lld.%ld.%ld.%ld\nevent: %s\ndata: ", (long long)s->ev, s->ls, s->lm, s->ss, event);
    jw_raw(&s->stage, r->text.buf + r->msgs[i].off, r->msgs[i].len);
    jw_raw(&s->stage, "\n\n", 2);
}

/* Sets the cursors to "now": what a fresh stream does not replay. */
static int init_cursors(sqlite3 *db, live_sub *s) {
    const char *q = "SELECT (SELECT coalesce(max(id),0) FROM events),"
                    " (SELECT step FROM losses WHERE job_id=?1 ORDER BY step DESC, microbatch DESC LIMIT 1),"
                    " (SELECT microbatch FROM losses WHERE job_id=?1 ORDER BY step DESC, microbatch DESC LIMIT 1),"
                    " (SELECT max(step) FROM (" SQL_COMPLETE_STEPS("") "))";
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK) return -1;
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

/* Writes the stream's new frames into s->stage (hub thread, no lock). */
static void poll_sub(live_hub *h, tick *t, live_sub *s) {
    if (!s->initialised) {
        if (init_cursors(t->db, s) != 0) return;
        s->initialised = 1;
        jw_raw(&s->stage, "retry: 2000\n\n", 13);
        jw_rawf(&s->stage,
                "id: %lld.%ld.%ld.%ld\nevent: hello\ndata: {\"job\":%ld,\"last_event_id\":%lld,"
                "\"last_complete_step\":%ld}\n\n",
                (long long)s->ev, s->ls, s->lm, s->ss, s->job, (long long)s->ev, s->ss);
    }
    result *st = query(t, s->job, Q_STATUS, 0, 0, 0);
    if (st && st->found) {
        if (strcmp(st->status, s->status) != 0) {
            snprintf(s->status, sizeof s->status, "%s", st->status);
            frame(s, "status", st, 0);
        }
        result *r = query(t, s->job, Q_EVENTS, s->ev, 0, st->t0);
        if (r) {
            s->ev = r->n1;
            if (r->nmsgs) frame(s, "events", r, 0);
        }
        r = query(t, s->job, Q_LOSSES, s->ls, s->lm, 0);
        if (r) {
            s->ls = (long)r->n1;
            s->lm = (long)r->n2;
            if (r->nmsgs) frame(s, "losses", r, 0);
        }
        r = query(t, s->job, Q_STEPS, s->ss, 0, st->t0);
        for (int i = 0; r && i < r->nmsgs; i++) {
            s->ss = (long)r->msgs[i].cursor;
            frame(s, "step", r, i);
        }
    }
    uint64_t now = pp_now_ns();
    if (s->stage.len == 0 && now - s->last_write_ns >= (uint64_t)h->heartbeat_ms * 1000000ull)
        jw_raw(&s->stage, ": keep-alive\n\n", 14);
    if (s->stage.len) s->last_write_ns = now;
}

/* A stream of a tick's snapshot, in the order it is polled. */
typedef struct snap_ent {
    live_sub *s;
    size_t unsent; /* bytes its client had not read at the snapshot */
    unsigned order; /* its place from this tick's first stream on */
} snap_ent;

/* The streams whose clients have read the most come first; among equals
 * the first is a different one each tick. */
static int by_unsent(const void *a, const void *b) {
    const snap_ent *x = a, *y = b;
    if (x->unsent != y->unsent) return x->unsent < y->unsent ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int hub_progress(void *arg) {
    live_hub *h = arg;
    return atomic_load(&h->halt);
}

/* Polls streams in order until they have been given `room` bytes (the
 * rest of LIVE_UNSENT_MAX); the others wait for a later tick. */
static void run_tick(live_hub *h, snap_ent *subs, int n, size_t room) {
    /* The file changed under the hub's connection (db_reader_refresh): a
     * new one, by the old one's file name (the old stays open till then),
     * or the old one until it can be opened. */
    sqlite3 *fresh;
    pp_err e;
    if (db_reader_refresh(h->db) != 0 && usersql_open(sqlite3_db_filename(h->db, "main"), &fresh, &e) == 0) {
        db_reader_close(h->db);
        h->db = fresh;
    }
    sqlite3_progress_handler(h->db, 10000, hub_progress, h);
    tick t = {.db = h->db};
    /* One read transaction: every query of the tick sees one snapshot, so
     * no event id at or below `hi` can appear later. */
    sqlite3_exec(h->db, "BEGIN", NULL, NULL, NULL);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h->db, "SELECT coalesce(max(id),0) FROM events", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) t.hi = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    size_t given = 0;
    for (int i = 0; i < n && given < room; i++) {
        poll_sub(h, &t, subs[i].s);
        given += subs[i].s->stage.len;
    }
    sqlite3_exec(h->db, "COMMIT", NULL, NULL, NULL);
    tick_free(&t);
}

static void sub_free(live_sub *s) {
    jw_free(&s->out);
    jw_free(&s->stage);
    free(s);
}

/* Streams not ended (under mu): an ended one keeps its connection until
 * its client reads or the idle timeout, but no place among MAX_STREAMS. */
static int open_streams(live_hub *h) {
    int n = 0;
    for (live_sub *s = h->subs; s; s = s->next)
        n += !s->ending && !s->gone;
    return n;
}

/* The budget is full (under mu): ends every stream that holds unsent
 * messages and whose client has taken none for LIVE_STALL_NS, dropping
 * them; returns the bytes freed. A stream holding bytes is never
 * suspended: its connection ends when MHD next asks it for bytes, once its
 * client reads, or at the idle timeout. */
static size_t end_stalled(live_hub *h, uint64_t now) {
    size_t freed = 0;
    for (live_sub *s = h->subs; s; s = s->next) {
        size_t mine = s->out.len - s->off;
        /* took_ns is written on MHD's threads: a clock a little behind the hub's is no stall */
        if (s->ending || mine == 0 || now <= s->took_ns || now - s->took_ns < LIVE_STALL_NS) continue;
        freed += mine;
        jw_free(&s->out);
        jw_init(&s->out);
        s->off = 0;
        s->ending = 1;
        h->stalled++;
    }
    return freed;
}

static void *hub_main(void *arg) {
    live_hub *h = arg;
    snap_ent snap[MAX_STREAMS];
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        /* Streams whose connection is gone are freed here, and only here. */
        int n = 0;
        size_t unsent = 0;
        for (live_sub **pp = &h->subs; *pp;) {
            live_sub *s = *pp;
            if (s->gone) {
                *pp = s->next;
                sub_free(s);
                continue;
            }
            if (s->suspended && !s->ending && conn_client_gone(s->fd)) {
                s->ending = 1; /* its reader ends the stream, and MHD closes the connection */
                s->suspended = 0;
                MHD_resume_connection(s->conn);
            }
            unsent += s->out.len - s->off;
            pp = &s->next;
        }
        if (unsent >= LIVE_UNSENT_MAX) unsent -= end_stalled(h, pp_now_ns());
        /* A stream's share: half the budget over the open streams, so that
         * one client's streams do not take it all. */
        int open = open_streams(h);
        size_t share = LIVE_UNSENT_MAX / 2 / (size_t)(open > 0 ? open : 1);
        if (share > MAX_PENDING) share = MAX_PENDING;
        for (live_sub *s = h->subs; s; s = s->next) {
            size_t mine = s->out.len - s->off;
            if (!s->ending && mine < share && n < MAX_STREAMS) snap[n++] = (snap_ent){s, mine, 0};
        }
        unsigned first = n > 0 ? h->ticks++ % (unsigned)n : 0;
        for (int i = 0; i < n; i++) snap[i].order = ((unsigned)i + (unsigned)n - first) % (unsigned)n;
        qsort(snap, (size_t)n, sizeof *snap, by_unsent);
        /* Until the merge below clients only take bytes away (a new stream
         * brings 13): the room measured now is not too large. */
        size_t room = unsent < LIVE_UNSENT_MAX ? LIVE_UNSENT_MAX - unsent : 0;
        /* Only this thread frees streams, so the snapshot stays valid. */
        pthread_mutex_unlock(&h->mu);
        if (n > 0 && room > 0) run_tick(h, snap, n, room);
        pthread_mutex_lock(&h->mu);
        for (int i = 0; i < n; i++) {
            live_sub *s = snap[i].s;
            if (s->stage.len && !s->gone && !s->ending && !atomic_load(&h->halt)) {
                if (s->out.len == s->off) s->took_ns = pp_now_ns(); /* it held nothing: its client is not behind */
                if (s->off) { /* what was sent goes: a client that reads a little less than it is given
                                 would otherwise grow the buffer without end */
                    memmove(s->out.buf, s->out.buf + s->off, s->out.len - s->off);
                    s->out.len -= s->off;
                    s->off = 0;
                }
                jw_raw(&s->out, s->stage.buf, s->stage.len);
                if (s->suspended) {
                    s->suspended = 0;
                    MHD_resume_connection(s->conn);
                }
            }
            s->stage.len = 0;
            if (s->stage.cap > KEEP_BYTES) {
                jw_free(&s->stage);
                jw_init(&s->stage);
            }
        }
        if (h->stop) break;
        /* With no stream open there is nothing to poll for: sleep until
         * one opens (live_open signals) or the hub stops. */
        if (!h->subs) pthread_cond_wait(&h->cv, &h->mu);
        else pp_cond_wait_until(&h->cv, &h->mu, pp_now_ns() + (uint64_t)h->poll_ms * 1000000ull);
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
    pp_cond_init_monotonic(&h->cv);
    if (pthread_create(&h->thread, NULL, hub_main, h) != 0) {
        db_reader_close(h->db);
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
        s->took_ns = pp_now_ns();
        if (s->off == s->out.len) {
            s->off = s->out.len = 0;
            if (s->out.cap > KEEP_BYTES) { /* a stream that caught up keeps no MiB-sized buffer */
                jw_free(&s->out);
                jw_init(&s->out);
            }
        }
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
    /* strtoll, not sscanf: a number out of range is refused, not undefined. */
    long long part[4];
    const char *p = v;
    for (int i = 0; i < 4; i++) {
        char *end;
        /* digits, or -1 (none yet) past the first: strtoll alone takes a
         * sign and leading blanks ("+1", " 1") the ids never have */
        if (!isdigit((unsigned char)*p) && !(i && p[0] == '-' && p[1] == '1')) return -1;
        errno = 0;
        part[i] = strtoll(p, &end, 10);
        if (end == p || errno || *end != (i < 3 ? '.' : '\0') || part[i] < (i ? -1 : 0) || part[i] > LONG_MAX)
            return -1;
        p = end + 1;
    }
    s->ev = part[0];
    s->ls = (long)part[1];
    s->lm = (long)part[2];
    s->ss = (long)part[3];
    return 0;
}

void live_open(live_hub *h, struct MHD_Connection *c, long job, reply *r) {
    live_sub *s = calloc(1, sizeof *s);
    if (!s) {
        reply_error(r, 500, "out of memory");
        return;
    }
    s->conn = c;
    s->fd = conn_fd(c);
    if (s->fd >= 0) setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &(int){LIVE_SNDBUF}, sizeof(int));
    s->hub = h;
    s->job = job;
    jw_init(&s->out);
    jw_init(&s->stage);
    s->last_write_ns = s->took_ns = pp_now_ns();
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (last && *last) {
        if (parse_cursor(last, s) != 0) {
            sub_free(s);
            reply_error(r, 400, "bad Last-Event-ID '%.60s': expected the id of a message of this stream", last);
            return;
        }
        s->initialised = 1;
        jw_raw(&s->out, "retry: 2000\n\n", 13);
    }
    /* Checked and added under one lock: two opens cannot both take the last
     * place, and none is added once live_end_all has begun (its connection
     * would stay suspended past MHD_stop_daemon). */
    pthread_mutex_lock(&h->mu);
    int stopping = h->stop, full = open_streams(h) >= MAX_STREAMS;
    if (!stopping && !full) {
        s->next = h->subs;
        h->subs = s;
        pthread_cond_signal(&h->cv); /* first poll now: the hello goes out at once */
    }
    pthread_mutex_unlock(&h->mu);
    if (stopping || full) {
        sub_free(s);
        if (stopping) reply_error(r, 503, "the server is stopping");
        else reply_error(r, 503, "too many live streams open (%d)", MAX_STREAMS);
        return;
    }
    r->status = MHD_HTTP_OK;
    r->type = "text/event-stream; charset=utf-8";
    r->stream = sub_read;
    r->stream_end = sub_release; /* the hub frees the stream once it is released */
    r->stream_arg = s;
}

void live_end_all(live_hub *h) {
    if (!h) return;
    atomic_store(&h->halt, 1);
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
    db_reader_close(h->db);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

unsigned long long live_stalled(live_hub *h) {
    pthread_mutex_lock(&h->mu);
    unsigned long long n = h->stalled;
    pthread_mutex_unlock(&h->mu);
    return n;
}

size_t live_unsent(live_hub *h) {
    pthread_mutex_lock(&h->mu);
    size_t n = 0;
    for (live_sub *s = h->subs; s; s = s->next) n += s->out.len - s->off;
    pthread_mutex_unlock(&h->mu);
    return n;
}

int live_count(live_hub *h) {
    pthread_mutex_lock(&h->mu);
    int n = open_streams(h);
    pthread_mutex_unlock(&h->mu);
    return n;
}
