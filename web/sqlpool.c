/* sqlpool.c: long reads on threads of their own: POST /api/sql, the
 * Chrome trace export and the analyses whose cost grows with the job
 * (docs/api.md, "Limits"). What each runs is its route's (the `then` of
 * route_sql and route_trace, or a ROUTE_ANALYSIS_POOL route's handler,
 * routes.h); this file runs it off the HTTP threads.
 *
 * A query may run for the whole time limit, and a long job's trace takes a
 * minute and more to write (1.4 GB for 20,000 steps: 90 s). On an MHD
 * thread either held up every other connection that thread had accepted:
 * the dashboard's requests waited behind them, and were cut off by the
 * request timeout. Each runs on a worker instead, its connection suspended
 * (a waiting task holds no thread either); past the workers some wait their
 * turn, in order, and past those the request is refused at once (503). A
 * pool counts a request from its submission until its answer is sent
 * (sqlpool_done), so the trace pool's limit also bounds the temporary files
 * being sent. The SQL pool's places (64) are more than a crowd of clients
 * that each send a short query at the same moment: 8 refused queries of a
 * few milliseconds when 50 clients sent them together (test_soak, on a busy
 * machine where the workers had not yet been scheduled). A waiting
 * connection still counts against its client's connection limit, so one
 * whose client has gone is dropped from the queue. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>

#include "web/conn.h"
#include "web/sqlpool.h"

struct sql_task {
    sql_task *next; /* in the pool's queue */
    sql_pool *pool;
    struct MHD_Connection *c;
    int fd; /* c's socket (-1 unknown): MHD keeps it open while c is suspended */
    sqlpool_fn *run;
    void *arg; /* the submitter's, alive while c is suspended */
    reply answer;
    int stopped; /* under pool->mu: answered "the server is stopping" */
};

typedef struct sql_worker {
    sql_pool *pool;
    pthread_t thread;
    int started;
    sqlite3 *db; /* under pool->mu: the connection its task runs on, for sqlite3_interrupt */
} sql_worker;

struct sql_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *what; /* "SQL queries", for the busy message */
    dbpool *conns;    /* where a worker takes its connection for a task */
    int stop;
    unsigned n, running, queued;
    unsigned pending, max_pending; /* submitted and not yet done (sqlpool_done, the answer sent), and the limit */
    unsigned unsent;               /* answered "the server is stopping" and not yet done: what stop waits for */
    sql_task *head, *tail;         /* waiting for a worker, oldest first */
    sql_worker *w;
};

/* t's answer is the stop's 503; sqlpool_stop waits until it is sent. */
static void stop_answer(sql_pool *p, sql_task *t) {
    pthread_mutex_lock(&p->mu);
    reply_clear(&t->answer);
    reply_error(&t->answer, 503, "the server is stopping");
    t->stopped = 1;
    p->unsent++;
    pthread_mutex_unlock(&p->mu);
}

static void sql_task_run(sql_worker *w, sql_task *t) {
    sql_pool *p = w->pool;
    pp_err err;
    sqlite3 *db = dbpool_get(p->conns, &err);
    if (!db) {
        reply_error(&t->answer, 503, "%s", err.msg);
        return;
    }
    pthread_mutex_lock(&p->mu);
    w->db = db;
    int stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (!stop) t->run(db, t->arg, &t->answer);
    pthread_mutex_lock(&p->mu);
    w->db = NULL;
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    /* Interrupted by sqlpool_stop: the answer is the server's, not the task's. */
    if (stop) stop_answer(p, t);
    dbpool_put(p->conns, db);
}

/* Drops the waiting tasks whose clients have gone (under p->mu): resumed,
 * MHD closes their connections. */
static void sql_drop_gone(sql_pool *p) {
    sql_task *prev = NULL;
    for (sql_task *t = p->head, *next; t; t = next) {
        next = t->next;
        if (!conn_client_gone(t->fd)) {
            prev = t;
            continue;
        }
        if (prev) prev->next = next;
        else p->head = next;
        if (p->tail == t) p->tail = prev;
        p->queued--;
        reply_error(&t->answer, 503, "the client closed the connection before its request ran");
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

int sqlpool_start(sql_pool **out, const char *what, dbpool *conns, unsigned workers, unsigned max_waiting,
                  pp_err *err) {
    sql_pool *p = calloc(1, sizeof *p);
    if (!p) return pp_fail(err, "out of memory");
    p->w = calloc(workers, sizeof *p->w);
    if (!p->w) {
        free(p);
        return pp_fail(err, "out of memory");
    }
    p->what = what;
    p->conns = conns;
    p->max_pending = workers + max_waiting;
    pthread_mutex_init(&p->mu, NULL);
    pp_cond_init_monotonic(&p->cv);
    *out = p;
    for (unsigned i = 0; i < workers; i++) {
        p->w[i].pool = p;
        if (pthread_create(&p->w[i].thread, NULL, sql_worker_main, &p->w[i]) != 0) {
            sqlpool_stop(p);
            sqlpool_free(out);
            return pp_fail(err, "cannot start the worker threads for %s", what);
        }
        p->w[i].started = 1;
        p->n = i + 1;
    }
    return 0;
}

void sqlpool_stop(sql_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    /* Interrupted again until no worker holds a connection: an interrupt
     * that comes before its task's statement starts is lost (SQLite clears
     * it when a connection's first statement begins), and the task would
     * then run to its end. A worker that takes its connection from here on
     * sees stop and runs nothing. */
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
        reply_error(&t->answer, 503, "the server is stopping");
        t->stopped = 1;
        p->unsent++;
        MHD_resume_connection(t->c);
    }
    p->head = p->tail = NULL;
    p->queued = 0;
    /* A resumed connection is answered on its MHD thread's next turns: the
     * handler queues the 503, a later turn writes it. Stopping the daemon
     * before it is written closes the connection without a word, so this
     * waits for each 503 to be sent (the request done), not only queued:
     * waiting for it to be queued lost one in ten under load (the stop
     * test, with two CPU burners). An answer the task gave before the stop
     * and still being sent is not waited for (a trace may take minutes). */
    uint64_t deadline = pp_now_ns() + 2000000000ull;
    while (p->unsent > 0 && pp_now_ns() < deadline) pp_cond_wait_until(&p->cv, &p->mu, deadline);
    pthread_mutex_unlock(&p->mu);
}

void sqlpool_done(sql_task *t) {
    if (!t) return;
    sql_pool *p = t->pool;
    pthread_mutex_lock(&p->mu);
    p->unsent -= (unsigned)t->stopped;
    p->pending--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    reply_clear(&t->answer);
    free(t);
}

void sqlpool_free(sql_pool **pp) {
    sql_pool *p = *pp;
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->w);
    free(p);
    *pp = NULL;
}

int sqlpool_submit(sql_pool *p, struct MHD_Connection *c, sqlpool_fn *run, void *arg, sql_task **task, reply *r) {
    sql_task *t = calloc(1, sizeof *t);
    if (!t) {
        reply_error(r, 500, "out of memory");
        return 0;
    }
    *t = (sql_task){.pool = p, .c = c, .fd = conn_fd(c), .run = run, .arg = arg};
    pthread_mutex_lock(&p->mu);
    if (p->pending >= p->max_pending) sql_drop_gone(p); /* places clients gave up */
    int stop = p->stop, room = p->pending < p->max_pending;
    unsigned running = p->running, queued = p->queued, sending = p->pending - p->running - p->queued;
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
    if (stop) reply_error(r, 503, "the server is stopping");
    else
        reply_error(r, 503,
                    "busy: %u %s are running, %u waiting and %u being sent, the most the server takes; try again "
                    "when one has finished",
                    running, p->what, queued, sending);
    return 0;
}

void sqlpool_take(sql_task *t, reply *r) {
    *r = t->answer; /* the worker is done with t: it resumed the connection */
    t->answer = (reply){0};
}

void sqlpool_count(sql_pool *p, unsigned *running, unsigned *queued) {
    pthread_mutex_lock(&p->mu);
    *running = p->running;
    *queued = p->queued;
    pthread_mutex_unlock(&p->mu);
}
