/* routes_analyses.c: the analyses of a job (docs/api.md): its planned
 * schedule and simulated bubble, its summary in a few numbers, every
 * schedule simulated at its measured costs, its critical path, and the
 * job beside another (GET /api/jobs/{id}/compare?vs=M, the dashboard's
 * twin of `pprun stats --job ID --vs M`). The numbers are db/'s
 * (summary.c, whatif.c, critpath.c, compare.c), their JSON report/json.c's,
 * as for `pprun stats --format json`, so the page and the terminal agree;
 * here they are only read, and a failure becomes a status. */
#include <sqlite3.h>
#include <stdlib.h>

#include "db/compare.h"
#include "db/critpath.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "report/json.h"
#include "web/routes.h"

void route_plan(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    pp_err err;
    jw w;
    jw_init(&w);
    if (report_plan_json(&w, db, j->id, j->world, &err) != 0) reply_error(r, 500, "%s", err.msg);
    else reply_json(r, &w);
    jw_free(&w); /* empty once sent */
}

/* The job in a few numbers (db/summary.h), to hold jobs side by side. */
void route_summary(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    job_summary s;
    pp_err err;
    if (summary_read(db, j->id, 0, &s, &err) != 0) {
        reply_error(r, 500, "%s", err.msg);
    } else {
        jw w;
        jw_init(&w);
        report_summary_json(&w, &s);
        reply_json(r, &w);
    }
    summary_free(&s);
}

/* Each built-in schedule played out at the job's measured costs (db/whatif.h). */
void route_whatif(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    job_summary s;
    whatif_report wr;
    pp_err err;
    /* the what-if shows no idle times: it skips the pass over every gap, which
     * the dashboard would pay every 10 s while following a long job */
    if (summary_read(db, j->id, SUMMARY_NO_IDLE, &s, &err) != 0 || whatif_read(db, &s, &wr, &err) != 0) {
        reply_error(r, 500, "%s", err.msg);
    } else {
        jw w;
        jw_init(&w);
        report_whatif_json(&w, j->id, &wr);
        reply_json(r, &w);
    }
    summary_free(&s);
}

/* One step's path, op by op (?step=N), or the latest complete steps'
 * totals (db/critpath.h). */
void route_critpath(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    long step = -1;
    if (query_long(&q->query, "step", 0, INT32_MAX, &step, r) < 0) return;
    pp_err err;
    jw w;
    jw_init(&w);
    if (step < 0) {
        critpath_report cr;
        if (critpath_read(db, j->id, j->world, &cr, &err) != 0) {
            reply_error(r, 500, "%s", err.msg);
        } else {
            report_critpath_json(&w, j->id, &cr);
            reply_json(r, &w);
        }
        critpath_report_free(&cr);
    } else {
        critpath_path p;
        if (critpath_step(db, j->id, (int)step, &p, &err) != 0) reply_error(r, 500, "%s", err.msg);
        else if (p.n == 0) reply_error(r, 404, "job %ld has no compute op in step %ld", j->id, step);
        else if (report_critpath_step_json(&w, j->id, j->t0, j->world, step, &p, &err) != 0)
            reply_error(r, 500, "%s", err.msg);
        else reply_json(r, &w);
        critpath_free(&p);
    }
    jw_free(&w); /* empty once sent; what an error left */
}

/* 0 when job vs is in db, else fills r (404, or 500) and returns -1. */
static int vs_exists(sqlite3 *db, long vs, reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT 1 FROM jobs WHERE id=?1", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, vs);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) reply_error(r, 404, "vs=%ld: no job %ld in this database", vs, vs);
    else reply_error(r, 500, "database error: %s", sqlite3_errmsg(db));
    return -1;
}

void route_compare(route_req *q, reply *r) {
    sqlite3 *db = q->db;
    const job_info *j = &q->job;
    long vs = 0;
    int got = query_long(&q->query, "vs", 1, 0x7fffffffL, &vs, r); /* `pprun stats --vs`'s range */
    if (got < 0) return;
    if (got == 0) {
        reply_error(r, 400, "missing query parameter vs: the job to compare job %ld with (compare?vs=ID)", j->id);
        return;
    }
    if (vs == j->id) {
        reply_error(r, 400, "vs=%ld is job %ld itself: nothing to compare", vs, j->id);
        return;
    }
    if (vs_exists(db, vs, r) != 0) return;
    /* s, o, the two what-ifs (several KB each) and the comparison: on the
     * heap, not on a worker thread's stack */
    struct {
        job_summary s, o;
        whatif_report w[2];
        job_compare c;
    } *t = calloc(1, sizeof *t); /* zeroed: compare_free runs whether or not compare_read did */
    if (!t) {
        reply_error(r, 500, "out of memory");
        return;
    }
    pp_err err;
    int read_o = 0;
    if (summary_read(db, j->id, SUMMARY_OPS, &t->s, &err) == 0 &&
        (read_o = 1, summary_read(db, vs, SUMMARY_OPS, &t->o, &err) == 0) &&
        whatif_read(db, &t->s, &t->w[0], &err) == 0 && whatif_read(db, &t->o, &t->w[1], &err) == 0 &&
        compare_read(db, &t->s, &t->w[0], &t->o, &t->w[1], &t->c, &err) == 0) {
        jw w;
        jw_init(&w);
        if (report_compare_json(&w, db, &t->s, &t->w[0], &t->o, &t->w[1], &t->c, &err) == 0) reply_json(r, &w);
        else reply_error(r, 500, "%s", err.msg);
        jw_free(&w); /* empty once sent; what an error left */
    } else {
        reply_error(r, 500, "%s", err.msg);
    }
    compare_free(&t->c);
    if (read_o) summary_free(&t->o);
    summary_free(&t->s);
    free(t);
}
