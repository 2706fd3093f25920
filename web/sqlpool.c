/* sqlpool.c: POST /api/sql on threads of its own (docs/api.md, "Limits").
 * The query itself is routes_sql's; this file runs it off the HTTP threads.
 *
 * A query may run for the whole time limit. On an MHD thread it held up
 * every other connection that thread had accepted: with a few clients
 * sending long queries, the dashboard's requests waited seconds behind
 * them. Each query runs on a worker instead, its connection suspended
 * (a waiting query holds no thread either); past the workers some wait
 * their turn, in order, and past those the request is refused at once
 * (503). The queue (64) is longer than a crowd of clients that each send a
 * short query at the same moment: a queue of 8 refused queries of a few
 * milliseconds when 50 clients sent them together (test_soak, on a busy
 * machine where the workers had not yet been scheduled). A waiting
 * connection still counts against its client's connection limit, so one
 * whose client has gone is dropped from the queue. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>

#include "web/routes.h"

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
    if (!stop) routes_sql(t->s, db, t->body, t->len, &t->reply);
    pthread_mutex_lock(&p->mu);
    w->db = NULL;
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    /* Interrupted by sqlpool_stop: the answer is the server's, not the query's. */
    if (stop) http_error(&t->reply, 503, "the server is stopping");
    dbpool_put(&t->s->pool, db);
}

/* Drops the waiting tasks whose clients have gone (under p->mu): resumed,
 * MHD closes their connections. */
static void sql_drop_gone(sql_pool *p) {
    sql_task *prev = NULL;
    for (sql_task *t = p->head, *next; t; t = next) {
        next = t->next;
        if (!http_client_gone(t->fd)) {
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
    pthread_cond_broadcast(&p->cv);
    /* Interrupted again until no worker holds a connection: an interrupt
     * that comes before its query's statement starts is lost (SQLite clears
     * it when a connection's first statement begins), and the query would
     * then run its whole time limit. A worker that takes its connection
     * from here on sees stop and runs nothing. */
    for (;;) {
        int busy = 0;
        for (unsigned i = 0; i < p->n; i++)
            if (p->w[i].db) sqlite3_interrupt(p->w[i].db), busy = 1;
        if (!busy) break;
        pp_cond_wait_until(&p->cv, &p->mu, pp_now_ns() + 10000000ull);
    }
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
    *t = (sql_task){.s = s, .c = c, .fd = http_conn_fd(c), .body = body, .len = len};
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
