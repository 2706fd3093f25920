/* routes_compare.c: GET /api/jobs/{id}/compare?vs=M, the dashboard's twin
 * of `pprun stats --job ID --vs M` (docs/api.md): what differs in the two
 * jobs' configurations, their numbers side by side with the change from M
 * to the job, M's what-if prediction for the job's schedule against what
 * the job measured, and whether their losses agree bit for bit. The
 * comparison itself is db/compare.c's, the numbers db/summary.c's,
 * db/whatif.c's and db/critpath.c's, and their JSON report/json.c's, so
 * the page and the terminal agree. */
#include <sqlite3.h>
#include <stdlib.h>

#include "db/compare.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "report/json.h"
#include "web/routes.h"

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

void route_compare(sqlite3 *db, struct MHD_Connection *c, const job_info *j, reply *r) {
    long vs = 0;
    int got = query_long(c, "vs", 1, 0x7fffffffL, &vs, r); /* `pprun stats --vs`'s range */
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
     * heap, not on an MHD thread's stack */
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
