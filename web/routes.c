/* routes.c: the JSON API (DESIGN.md §8, docs/api.md): the dispatch, the
 * job list, one job, and POST /api/sql. The timeline's routes are in
 * routes_timeline.c, the per-step ones in routes_steps.c, the comparison
 * of two jobs in routes_compare.c.
 *
 * Every time in a response is nanoseconds since the job's start (jobs.t0_ns):
 * small integers that a browser holds exactly in a double. Big arrays are
 * rows of numbers, not objects, so a window of 20,000 events stays under
 * 1 MB. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "db/alive.h"
#include "db/usersql.h"
#include "web/routes.h"

static int index_of(const char *const *names, const char *s) {
    for (int i = 0; s && names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

sqlite3_stmt *routes_prep(sqlite3 *db, const char *sql, http_reply *r) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return NULL;
    }
    return st;
}

void routes_row_object(jw *w, sqlite3_stmt *st) {
    jw_obj(w);
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n; c++) {
        jw_key(w, sqlite3_column_name(st, c));
        switch (sqlite3_column_type(st, c)) {
        case SQLITE_INTEGER: jw_int(w, sqlite3_column_int64(st, c)); break;
        case SQLITE_FLOAT: jw_num(w, sqlite3_column_double(st, c)); break;
        case SQLITE_TEXT:
            jw_strn(w, (const char *)sqlite3_column_text(st, c), (size_t)sqlite3_column_bytes(st, c));
            break;
        default: jw_null(w);
        }
    }
    jw_obj_end(w);
}

int routes_load_job(sqlite3 *db, long id, job_info *j, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT t0_ns, world_size, " SQL_JOB_STATUS("") " FROM jobs WHERE id=?", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE) http_error(r, 404, "no job %ld in this database", id);
        else http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    j->id = id;
    j->t0 = sqlite3_column_int64(st, 0);
    j->world = sqlite3_column_int(st, 1);
    snprintf(j->status, sizeof j->status, "%s", (const char *)sqlite3_column_text(st, 2));
    sqlite3_finalize(st);
    if (j->world < 1 || j->world > 65536) j->world = 1;
    return 0;
}

#define JOB_COLUMNS                                                                                            \
    "j.id, j.name, j.created_at, " SQL_JOB_STATUS("j.") " AS status, j.nnodes, j.world_size, j.schedule, "     \
    "j.microbatches, j.virtual_stages, j.stages, j.steps, j.model, j.device, j.t0_ns, j.ended_at, j.exit_code, " \
    "j.failed_rank, " SQL_JOB_FAILURE("j.") " AS failure, "                                                    \
    "(SELECT count(DISTINCT step) FROM step_stats s WHERE s.job_id=j.id) AS steps_done, "                      \
    "coalesce((SELECT events_ingested FROM job_counters c WHERE c.job_id=j.id), 0) AS events_ingested, "      \
    "max(coalesce((SELECT events_dropped FROM job_counters c WHERE c.job_id=j.id), 0), "                      \
    "    coalesce((SELECT sum(dropped_events) FROM ranks r WHERE r.job_id=j.id), 0)) AS events_dropped, "         \
    "coalesce((SELECT sum(cupti_dropped) FROM ranks r WHERE r.job_id=j.id), 0) AS cupti_dropped"

static void route_jobs(sqlite3 *db, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT " JOB_COLUMNS " FROM jobs j ORDER BY j.id DESC LIMIT 1000", r);
    if (!st) return;
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_key(&w, "jobs");
    jw_arr(&w);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) routes_row_object(&w, st);
    jw_arr_end(&w);
    jw_obj_end(&w);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        jw_free(&w);
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        return;
    }
    http_json(r, &w);
}

int64_t routes_timeline_end(sqlite3 *db, const job_info *j) {
    sqlite3_stmt *st;
    int64_t end = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT max(end_ns) FROM (SELECT end_ns FROM events WHERE job_id=?1 AND rank=?2 AND source='cpu' "
                           "ORDER BY start_ns DESC LIMIT 8)",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    for (int rank = 0; rank < j->world; rank++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, rank);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            int64_t e = sqlite3_column_int64(st, 0) - j->t0;
            if (e > end) end = e;
        }
    }
    sqlite3_finalize(st);
    return end;
}

static void route_job(sqlite3 *db, const job_info *j, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT " JOB_COLUMNS ", j.config_json FROM jobs j WHERE j.id=?", r);
    if (!st) return;
    sqlite3_bind_int64(st, 1, j->id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return;
    }
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_key(&w, "job");
    /* All columns but config_json, which goes in parsed (below). */
    jw_obj(&w);
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n - 1; c++) {
        jw_key(&w, sqlite3_column_name(st, c));
        switch (sqlite3_column_type(st, c)) {
        case SQLITE_INTEGER: jw_int(&w, sqlite3_column_int64(st, c)); break;
        case SQLITE_FLOAT: jw_num(&w, sqlite3_column_double(st, c)); break;
        case SQLITE_TEXT: jw_str(&w, (const char *)sqlite3_column_text(st, c)); break;
        default: jw_null(&w);
        }
    }
    jw_obj_end(&w);
    /* config_json is the collector's, but parse it as untrusted anyway: a
     * bounded NUL-terminated copy, and re-printed by cJSON. */
    jw_key(&w, "config");
    const char *cfg = (const char *)sqlite3_column_text(st, n - 1);
    size_t cfglen = (size_t)sqlite3_column_bytes(st, n - 1);
    char *copy = cfg ? strndup(cfg, cfglen) : NULL;
    cJSON *parsed = copy ? cJSON_ParseWithLength(copy, cfglen) : NULL;
    char *printed = parsed ? cJSON_PrintUnformatted(parsed) : NULL;
    if (printed) jw_json(&w, printed, strlen(printed));
    else jw_null(&w);
    cJSON_free(printed);
    cJSON_Delete(parsed);
    free(copy);
    sqlite3_finalize(st);

    jw_key(&w, "ranks");
    jw_arr(&w);
    st = routes_prep(db,
                     "SELECT rank, node, host, pid, device, stages, clock_offset_ns, dropped_events, cupti_dropped FROM ranks "
                     "WHERE job_id=? ORDER BY rank",
                     r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_bind_int64(st, 1, j->id);
    while (sqlite3_step(st) == SQLITE_ROW) routes_row_object(&w, st);
    sqlite3_finalize(st);
    jw_arr_end(&w);
    jw_kint(&w, "timeline_end", routes_timeline_end(db, j));
    /* Whether the dashboard should ask for gpu spans (events?gpu=1): a
     * kernel that points at a span means there is one; through the kernels
     * index, so a CPU job costs one index probe, not a scan of its events. */
    st = routes_prep(db, "SELECT EXISTS(SELECT 1 FROM kernels WHERE job_id=?1 AND event_id IS NOT NULL), "
                  "EXISTS(SELECT 1 FROM kernels WHERE job_id=?1)", r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_step(st);
    jw_key(&w, "gpu_spans");
    jw_bool(&w, sqlite3_column_int(st, 0));
    jw_key(&w, "gpu_kernels");
    jw_bool(&w, sqlite3_column_int(st, 1));
    sqlite3_finalize(st);
    /* The live stream's starting point: events with a larger id are new. */
    st = routes_prep(db, "SELECT coalesce(max(id), 0) FROM events", r);
    if (!st) {
        jw_free(&w);
        return;
    }
    sqlite3_step(st);
    jw_kint(&w, "last_event_id", sqlite3_column_int64(st, 0));
    sqlite3_finalize(st);
    jw_obj_end(&w);
    http_json(r, &w);
}

/* ---- POST /api/sql --------------------------------------------------------- */

/* What is wrong with the members of a parsed body (an object), or NULL:
 * a member given twice (cJSON would use the first silently), one that is
 * neither "sql" nor "max_rows" (a misspelt "max_row" would be ignored), or
 * a \u0000 in a string (cJSON's copy ends there: the SQL would be cut short
 * unseen). body is valid JSON here, so every backslash starts an escape. */
static const char *body_members_bad(const cJSON *req, const char *body, size_t len, char *msg, size_t msgsz) {
    if (!cJSON_IsObject(req)) return NULL; /* answered below */
    const cJSON *m;
    cJSON_ArrayForEach(m, req) {
        if (strcmp(m->string, "sql") != 0 && strcmp(m->string, "max_rows") != 0) {
            snprintf(msg, msgsz, "unknown member \"%.40s\" in the body: it takes \"sql\" and \"max_rows\"", m->string);
            return msg;
        }
        for (const cJSON *o = req->child; o != m; o = o->next)
            if (strcmp(o->string, m->string) == 0) {
                snprintf(msg, msgsz, "\"%s\" is given twice in the body", m->string);
                return msg;
            }
    }
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && strncmp(body + i + 2, "0000", 4) == 0)
            return "the body holds a \\u0000 (NUL) character: SQL cannot contain one";
        i++; /* the escaped character */
    }
    return NULL;
}

static void route_sql(http_server *s, sqlite3 *db, const char *body, size_t len, http_reply *r) {
    /* body is our own NUL-terminated copy of exactly len bytes: the NUL is
     * part of what cJSON may read, so that it can require it right after the
     * value (and whitespace); a NUL inside the body ends it early, caught by
     * the end check. */
    const char *nul = memchr(body, 0, len);
    if (nul) { /* inside a string cJSON would take it, and the SQL would end there unseen */
        http_error(r, 400, "the body holds a NUL byte at byte %zu: send {\"sql\": \"SELECT ...\"}",
                   (size_t)(nul - body));
        return;
    }
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);
    if (!req || end != body + len) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        if (req) http_error(r, 400, "unexpected text after the JSON body at byte %zu: send one {\"sql\": ...} object", at);
        else http_error(r, 400, "malformed JSON body near byte %zu: send {\"sql\": \"SELECT ...\"}", at);
        cJSON_Delete(req);
        return;
    }
    char msg[160];
    const char *bad = body_members_bad(req, body, len, msg, sizeof msg);
    if (bad) {
        http_error(r, 400, "%s", bad);
        cJSON_Delete(req);
        return;
    }
    const cJSON *sql = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "sql") : NULL;
    const cJSON *mr = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "max_rows") : NULL;
    if (!cJSON_IsString(sql) || !sql->valuestring) {
        cJSON_Delete(req);
        http_error(r, 400, "the body must be a JSON object with a string member \"sql\"");
        return;
    }
    /* The raw result is capped as it is read, the JSON as it is written:
     * escaping makes it up to 6 times larger (a control char is \u00XX). */
    usersql_limits lim = {.max_rows = s->o.sql_max_rows, .time_limit_ns = s->o.sql_time_limit_ns,
                          .max_bytes = s->o.sql_max_bytes, .max_mem = s->o.sql_max_mem};
    if (mr) {
        if (!cJSON_IsNumber(mr) || mr->valuedouble < 1 || mr->valuedouble > (double)s->o.sql_max_rows ||
            mr->valuedouble != (double)(size_t)mr->valuedouble) {
            cJSON_Delete(req);
            http_error(r, 400, "\"max_rows\" must be an integer from 1 to %zu", s->o.sql_max_rows);
            return;
        }
        lim.max_rows = (size_t)mr->valuedouble;
    }
    usersql_result *res;
    usersql_error why;
    pp_err err;
    uint64_t t = pp_now_ns();
    int rc = usersql_run_on(db, sql->valuestring, &lim, &res, &why, &err);
    cJSON_Delete(req);
    if (rc != 0) {
        int status = why == USERSQL_EDENIED ? 403 : why == USERSQL_ETIMEOUT ? 408 : why == USERSQL_ETOOBIG ? 413
                     : why == USERSQL_EDB ? 503 : 400;
        http_error(r, status, "%s", err.msg);
        return;
    }
    jw w;
    jw_init(&w);
    if (jw_usersql_table(&w, res, s->o.sql_max_bytes) != 0) {
        jw_free(&w);
        usersql_free(res);
        http_error(r, 413, "refused: the result is larger than %zu bytes as JSON; add a LIMIT or select fewer columns",
                   s->o.sql_max_bytes);
        return;
    }
    /* Splice elapsed time in before the closing brace. */
    if (!w.oom && w.len > 0) {
        w.len--;
        jw_rawf(&w, ",\"elapsed_ms\":%.3f}", (double)(pp_now_ns() - t) / 1e6);
    }
    usersql_free(res);
    http_json(r, &w);
}

/* ---- POST /api/sql on threads of its own -----------------------------------
 *
 * A query may run for the whole time limit. On an MHD thread it held up
 * every other connection that thread had accepted: with a few clients
 * sending long queries, the dashboard's requests waited seconds behind
 * them. Each query runs on a worker instead, its connection suspended
 * (a waiting query holds no thread either); past the workers a few wait
 * their turn, in order, and past those the request is refused at once
 * (503). The queue is short: each place may cost a time limit of waiting,
 * and a waiting connection still counts against its client's connection
 * limit, so one whose client has gone is dropped from it. */

struct sql_task {
    sql_task *next; /* in the pool's queue */
    http_server *s;
    struct MHD_Connection *c;
    int fd;           /* c's socket (-1 unknown): MHD keeps it open while c is suspended */
    const char *body; /* the request's own copy, alive while c is suspended */
    size_t len;
    http_reply reply;
};

typedef struct sql_worker {
    sql_pool *pool;
    pthread_t thread;
    int started;
    sqlite3 *db; /* under pool->mu: the connection its query runs on, for sqlite3_interrupt */
} sql_worker;

struct sql_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    unsigned n, running, queued, max_queued;
    unsigned pending; /* submitted and not yet completed (sqlpool_done): what sqlpool_stop waits for */
    sql_task *head, *tail; /* waiting for a worker, oldest first */
    sql_worker *w;
};

static void sql_task_run(sql_worker *w, sql_task *t) {
    sql_pool *p = w->pool;
    pp_err err;
    sqlite3 *db = dbpool_get(&t->s->pool, &err);
    if (!db) {
        http_error(&t->reply, 503, "%s", err.msg);
        return;
    }
    pthread_mutex_lock(&p->mu);
    w->db = db;
    int stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (!stop) route_sql(t->s, db, t->body, t->len, &t->reply);
    pthread_mutex_lock(&p->mu);
    w->db = NULL;
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    /* Interrupted by sqlpool_stop: the answer is the server's, not the query's. */
    if (stop) http_error(&t->reply, 503, "the server is stopping");
    dbpool_put(&t->s->pool, db);
}

/* Whether the client of a waiting task has closed its end (or reset it):
 * its query need not run, nor its place be kept. */
static int sql_client_gone(const sql_task *t) {
    if (t->fd < 0) return 0;
    char b;
    ssize_t k = recv(t->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Drops the waiting tasks whose clients have gone (under p->mu): resumed,
 * MHD closes their connections. */
static void sql_drop_gone(sql_pool *p) {
    sql_task *prev = NULL;
    for (sql_task *t = p->head, *next; t; t = next) {
        next = t->next;
        if (!sql_client_gone(t)) {
            prev = t;
            continue;
        }
        if (prev) prev->next = next;
        else p->head = next;
        if (p->tail == t) p->tail = prev;
        p->queued--;
        http_error(&t->reply, 503, "the client closed the connection before its query ran");
        MHD_resume_connection(t->c);
    }
}

static void *sql_worker_main(void *arg) {
    sql_worker *w = arg;
    sql_pool *p = w->pool;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break; /* sqlpool_stop answers what still waits */
        sql_drop_gone(p);
        if (!p->head) continue;
        sql_task *t = p->head;
        p->head = t->next;
        if (!p->head) p->tail = NULL;
        p->queued--;
        p->running++;
        pthread_mutex_unlock(&p->mu);
        sql_task_run(w, t);
        pthread_mutex_lock(&p->mu);
        p->running--;
        pthread_mutex_unlock(&p->mu);
        /* From here on t belongs to the connection's thread (sqlpool_take). */
        MHD_resume_connection(t->c);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int sqlpool_start(http_server *s, pp_err *err) {
    sql_pool *p = calloc(1, sizeof *p);
    if (!p) return pp_fail(err, "out of memory");
    p->w = calloc(s->o.sql_workers, sizeof *p->w);
    if (!p->w) {
        free(p);
        return pp_fail(err, "out of memory");
    }
    p->max_queued = s->o.sql_queue;
    pthread_mutex_init(&p->mu, NULL);
    pp_cond_init_monotonic(&p->cv);
    s->sql = p;
    for (unsigned i = 0; i < s->o.sql_workers; i++) {
        p->w[i].pool = p;
        if (pthread_create(&p->w[i].thread, NULL, sql_worker_main, &p->w[i]) != 0) {
            sqlpool_stop(s);
            sqlpool_free(s);
            return pp_fail(err, "cannot start the SQL worker threads");
        }
        p->w[i].started = 1;
        p->n = i + 1;
    }
    return 0;
}

void sqlpool_stop(http_server *s) {
    sql_pool *p = s->sql;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    for (unsigned i = 0; i < p->n; i++)
        if (p->w[i].db) sqlite3_interrupt(p->w[i].db);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++) {
        if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
        p->w[i].started = 0;
    }
    /* No worker left: what still waits is answered here. */
    pthread_mutex_lock(&p->mu);
    for (sql_task *t = p->head, *next; t; t = next) {
        next = t->next;
        http_error(&t->reply, 503, "the server is stopping");
        MHD_resume_connection(t->c);
    }
    p->head = p->tail = NULL;
    p->queued = 0;
    /* A resumed connection is answered on its MHD thread's next turn;
     * stopping the daemon before that would close it without a word. */
    uint64_t deadline = pp_now_ns() + 2000000000ull;
    while (p->pending > 0 && pp_now_ns() < deadline) pp_cond_wait_until(&p->cv, &p->mu, deadline);
    pthread_mutex_unlock(&p->mu);
}

void sqlpool_done(http_server *s) {
    sql_pool *p = s->sql;
    pthread_mutex_lock(&p->mu);
    p->pending--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void sqlpool_free(http_server *s) {
    sql_pool *p = s->sql;
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->w);
    free(p);
    s->sql = NULL;
}

int sqlpool_submit(http_server *s, struct MHD_Connection *c, const char *body, size_t len, sql_task **task,
                   http_reply *r) {
    sql_pool *p = s->sql;
    sql_task *t = calloc(1, sizeof *t);
    if (!t) {
        http_error(r, 500, "out of memory");
        return 0;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *t = (sql_task){.s = s, .c = c, .fd = ci ? ci->connect_fd : -1, .body = body, .len = len};
    pthread_mutex_lock(&p->mu);
    if (p->running + p->queued >= p->n + p->max_queued) sql_drop_gone(p); /* places clients gave up */
    int stop = p->stop, room = p->running + p->queued < p->n + p->max_queued;
    unsigned running = p->running, queued = p->queued;
    if (!stop && room) {
        /* Suspended before a worker can see the task, so the resume
         * always comes after. */
        MHD_suspend_connection(c);
        *task = t;
        if (p->tail) p->tail->next = t;
        else p->head = t;
        p->tail = t;
        p->queued++;
        p->pending++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (!stop && room) return 1;
    free(t);
    if (stop) http_error(r, 503, "the server is stopping");
    else
        http_error(r, 503,
                   "busy: %u SQL queries are running and %u waiting, the most the server takes; try again when "
                   "one has finished",
                   running, queued);
    return 0;
}

void sqlpool_take(sql_task *t, http_reply *r) {
    if (!t) return;
    if (r) *r = t->reply;
    else free(t->reply.body);
    free(t);
}

void sqlpool_count(http_server *s, unsigned *running, unsigned *queued) {
    sql_pool *p = s->sql;
    pthread_mutex_lock(&p->mu);
    *running = p->running;
    *queued = p->queued;
    pthread_mutex_unlock(&p->mu);
}

/* ---- dispatch -------------------------------------------------------------- */

void routes_api(http_server *s, struct MHD_Connection *c, const char *method, const char *url, http_reply *r) {
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    pp_err err;
    if (strcmp(url, "/api/sql") == 0) { /* a POST went to sqlpool_submit */
        http_error(r, 405, "%s not allowed on /api/sql (use POST with {\"sql\": ...})", method);
        return;
    }
    /* /api/jobs, /api/jobs/{id}, /api/jobs/{id}/{what} */
    const char *rest = NULL;
    long id = -1;
    char what[16] = "";
    if (strcmp(url, "/api/jobs") == 0 || strcmp(url, "/api/jobs/") == 0) {
        rest = "";
    } else if (strncmp(url, "/api/jobs/", 10) == 0) {
        const char *p = url + 10;
        size_t nd = strspn(p, "0123456789");
        if (nd > 0 && nd < 16 && (p[nd] == 0 || p[nd] == '/')) {
            id = strtol(p, NULL, 10);
            rest = p + nd;
            if (*rest == '/') {
                rest++;
                if (strlen(rest) >= sizeof what || strchr(rest, '/')) rest = NULL;
                else snprintf(what, sizeof what, "%s", rest);
            }
        }
    }
    static const char *const known[] = {"", "events", "kernels", "steps", "gaps", "plan", "summary", "whatif", "compare",
                                        "critpath", "trace.json", NULL};
    if (!rest || index_of(known, what) < 0) {
        http_error(r, 404, "no such API route: %.200s (docs/api.md lists them)", url);
        return;
    }
    if (!get) {
        http_error(r, 405, "%s not allowed on %.200s (use GET)", method, url);
        return;
    }
    sqlite3 *db = dbpool_get(&s->pool, &err);
    if (!db) {
        http_error(r, 503, "%s", err.msg);
        return;
    }
    job_info j;
    if (id < 0) route_jobs(db, r);
    else if (routes_load_job(db, id, &j, r) == 0) {
        if (!what[0]) route_job(db, &j, r);
        else if (!strcmp(what, "events")) route_events(s, db, c, &j, r);
        else if (!strcmp(what, "kernels")) route_kernels(db, c, &j, r);
        else if (!strcmp(what, "steps")) route_steps(db, c, &j, r);
        else if (!strcmp(what, "gaps")) route_gaps(db, c, &j, r);
        else if (!strcmp(what, "trace.json")) route_trace(db, c, &j, r);
        else if (!strcmp(what, "summary")) route_summary(db, &j, r);
        else if (!strcmp(what, "whatif")) route_whatif(db, &j, r);
        else if (!strcmp(what, "compare")) route_compare(db, c, &j, r);
        else if (!strcmp(what, "critpath")) route_critpath(db, c, &j, r);
        else route_plan(db, &j, r);
    }
    dbpool_put(&s->pool, db);
}
