/* routes_compare.c: GET /api/jobs/{id}/compare?vs=M, the dashboard's twin
 * of `pprun stats --job ID --vs M` (docs/api.md): what differs in the two
 * jobs' configurations, their numbers side by side with the change from M
 * to the job, M's what-if prediction for the job's schedule against what
 * the job measured, and whether their losses agree bit for bit. The
 * comparison itself is db/compare.c's, the numbers db/summary.c's,
 * db/whatif.c's and db/critpath.c's, so the page and the terminal agree; here they only become
 * JSON (the changes as numbers, where the terminal formats them). */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/compare.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "web/routes.h"

/* job / other as the terminal's "1.20x": NAN (null) when either is
 * missing, or other is 0. */
static double ratio(double job, double other) {
    return isfinite(job) && isfinite(other) && job >= 0 && other > 0 ? job / other : NAN;
}

/* ns per complete step, NAN without steps. */
static double per_step(int64_t ns, const job_summary *s) {
    return s->steps > 0 ? (double)ns / (double)s->steps : NAN;
}

/* A job's critical path per step, as the terminal's rows: its span, each
 * rank's ops on it, the three waits; null without a complete step. */
static void path_json(jw *w, const critpath_report *p) {
    if (!p->steps) {
        jw_null(w);
        return;
    }
    jw_obj(w);
    jw_kint(w, "steps", p->steps);
    jw_kint(w, "first_step", p->first_step);
    jw_kint(w, "last_step", p->last_step);
    jw_knum(w, "span_ns", critpath_per_step(p, p->t.span_ns));
    jw_key(w, "rank_ops_ns");
    jw_arr(w);
    for (int k = 0; k < p->t.ranks; k++) jw_num(w, critpath_rank_per_step(p, k));
    jw_arr_end(w);
    for (int k = 0; k < CRITPATH_WAITS; k++)
        jw_knum(w, critpath_wait_keys[k], critpath_per_step(p, p->t.wait_ns[k]));
    jw_obj_end(w);
}

/* One job's numbers: the jobs row's name and schedule, then its summary
 * and critical path as `pprun stats --vs` tabulates them. */
static int side(sqlite3 *db, jw *w, const job_summary *s, const critpath_report *path, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT name, schedule, virtual_stages, microbatches, " SQL_JOB_STATUS("")
                                       " FROM jobs WHERE id=?1", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, s->job_id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    jw_obj(w);
    jw_kint(w, "id", s->job_id);
    jw_kstr(w, "name", (const char *)sqlite3_column_text(st, 0));
    jw_kstr(w, "schedule", (const char *)sqlite3_column_text(st, 1));
    jw_kint(w, "virtual_stages", sqlite3_column_int64(st, 2));
    jw_kint(w, "microbatches", sqlite3_column_int64(st, 3));
    jw_kstr(w, "status", (const char *)sqlite3_column_text(st, 4));
    sqlite3_finalize(st);
    jw_kint(w, "world_size", s->world);
    jw_kint(w, "from_step", s->from_step);
    jw_kint(w, "steps", s->steps);
    jw_kint_or_null(w, "step_time_ns", s->steps ? s->step_time_ns : -1);
    jw_knum(w, "bubble_ratio", s->bubble_ratio);
    jw_knum(w, "sim_bubble_ratio", s->sim_bubble_ratio);
    jw_kint_or_null(w, "act_peak_bytes", s->act_peak); /* 0: not recorded, as in /summary */
    jw_kint_or_null(w, "mem_peak_bytes", s->mem_peak); /* with weights, gradients and optimizer state */
    jw_knum(w, "idle_ns_per_step", per_step(summary_idle_total(s), s));
    jw_key(w, "idle_ns_per_step_by_cause");
    jw_obj(w);
    for (int k = 0; k < CAUSE_COUNT; k++) jw_knum(w, analyze_causes[k], per_step(s->idle_ns_by_cause[k], s));
    jw_obj_end(w);
    jw_key(w, "op_median_ns"); /* the phases the job ran, host spans and (--cupti on) GPU spans */
    jw_obj(w);
    for (int gpu = 0; gpu < 2; gpu++) {
        if (gpu && !summary_has_ops(s, 1)) continue;
        jw_key(w, gpu ? "gpu" : "host");
        jw_obj(w);
        for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++)
            if (s->ops[gpu][ph].count > 0) jw_kint(w, trace_phase_name(ph), s->ops[gpu][ph].median_ns);
        jw_obj_end(w);
    }
    jw_obj_end(w);
    jw_kint_or_null(w, "loss_step", s->loss_step);
    jw_knum(w, "loss", s->loss);
    jw_key(w, "critical_path_per_step");
    path_json(w, path);
    jw_obj_end(w);
    return 0;
}

/* The terminal table's last column as numbers: ratios job/other, and for
 * the bubbles the difference in percentage points. */
static void change(jw *w, const job_summary *js, const job_summary *os, const job_compare *c) {
    jw_obj(w);
    jw_knum(w, "step_time", js->steps && os->steps ? ratio((double)js->step_time_ns, (double)os->step_time_ns) : NAN);
    jw_knum(w, "bubble_ratio_pp", 100 * (js->bubble_ratio - os->bubble_ratio));
    jw_knum(w, "sim_bubble_ratio_pp", 100 * (js->sim_bubble_ratio - os->sim_bubble_ratio));
    /* 0 is "not recorded", -1 no statistics: neither is a peak */
    jw_knum(w, "act_peak_bytes", js->act_peak > 0 && os->act_peak > 0 ? ratio((double)js->act_peak, (double)os->act_peak)
                                                                       : NAN);
    jw_knum(w, "mem_peak_bytes", js->mem_peak >= 0 && os->mem_peak >= 0 ? ratio((double)js->mem_peak, (double)os->mem_peak)
                                                                          : NAN);
    jw_knum(w, "idle_ns_per_step", ratio(per_step(summary_idle_total(js), js), per_step(summary_idle_total(os), os)));
    jw_key(w, "idle_ns_per_step_by_cause"); /* the causes either job has */
    jw_obj(w);
    for (int k = 0; k < CAUSE_COUNT; k++)
        if (js->idle_ns_by_cause[k] || os->idle_ns_by_cause[k])
            jw_knum(w, analyze_causes[k], ratio(per_step(js->idle_ns_by_cause[k], js), per_step(os->idle_ns_by_cause[k], os)));
    jw_obj_end(w);
    jw_key(w, "op_median_ns"); /* the phases either ran; GPU spans only when both have them */
    jw_obj(w);
    for (int gpu = 0; gpu < 2; gpu++) {
        if (gpu && !(summary_has_ops(js, 1) && summary_has_ops(os, 1))) continue;
        jw_key(w, gpu ? "gpu" : "host");
        jw_obj(w);
        for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++)
            if (js->ops[gpu][ph].count || os->ops[gpu][ph].count)
                jw_knum(w, trace_phase_name(ph),
                        ratio((double)js->ops[gpu][ph].median_ns, (double)os->ops[gpu][ph].median_ns));
        jw_obj_end(w);
    }
    jw_obj_end(w);
    int same_step = js->loss_step >= 0 && js->loss_step == os->loss_step;
    jw_knum(w, "loss", same_step ? js->loss - os->loss : NAN);
    const critpath_report *pj = &c->path_job, *po = &c->path_other;
    jw_key(w, "critical_path_per_step"); /* rank_ops_ns: the ranks either job has */
    jw_obj(w);
    jw_knum(w, "span_ns", ratio(critpath_per_step(pj, pj->t.span_ns), critpath_per_step(po, po->t.span_ns)));
    for (int k = 0; k < CRITPATH_WAITS; k++)
        jw_knum(w, critpath_wait_keys[k],
                ratio(critpath_per_step(pj, pj->t.wait_ns[k]), critpath_per_step(po, po->t.wait_ns[k])));
    jw_key(w, "rank_ops_ns");
    jw_arr(w);
    for (int k = 0; k < pj->t.ranks || k < po->t.ranks; k++)
        jw_num(w, ratio(critpath_rank_per_step(pj, k), critpath_rank_per_step(po, k)));
    jw_arr_end(w);
    const int *on = c->path_ranks, n = c->npath_ranks;
    const char *keys[2] = {"ranks_on_path", "listed_ranks"}; /* listed: a row each (too many: their sum) */
    for (int list = 0; list < 2; list++) {
        jw_key(w, keys[list]);
        jw_arr(w);
        for (int i = 0; i < n && (!list || n <= CRITPATH_LIST_ALL); i++) jw_int(w, on[i]);
        jw_arr_end(w);
    }
    jw_obj_end(w);
    jw_obj_end(w);
}

/* The other job's what-if row for this job's schedule against what this
 * job measured, or why there is none. */
static void prediction(jw *w, const job_summary *js, const job_summary *os, const whatif_report *ow,
                       const job_compare *c) {
    jw_obj(w);
    if (c->predicted < 0) {
        jw_kstr(w, "why_not", c->why_not);
        jw_obj_end(w);
        return;
    }
    const whatif_row *row = &ow->rows[c->predicted];
    jw_kint(w, "by", c->other);
    jw_kstr(w, "schedule", row->schedule);
    jw_key(w, "tuned");
    jw_bool(w, row->tuned);
    jw_kint(w, "virtual_stages", row->virtual_stages);
    if (c->by_cuts) {
        char cuts[BALANCE_MAX_STAGES * 6];
        jw_kstr(w, "pipeline_cuts", sched_cuts_text(ow->cuts, ow->ncuts, cuts, sizeof cuts));
    }
    jw_knum(w, "predicted_step_time_ns", c->predicted_ns);
    if (c->own >= 0) {
        jw_kstr(w, "own_schedule", ow->rows[c->own].schedule);
        jw_knum(w, "own_step_time_ns", ow->rows[c->own].step_time_ns);
        jw_knum(w, "predicted_over_own", ratio(c->predicted_ns, ow->rows[c->own].step_time_ns));
    }
    double measured = js->steps > 0 ? (double)js->step_time_ns : NAN;
    jw_knum(w, "measured_step_time_ns", measured);
    jw_knum(w, "measured_over_predicted", ratio(measured, c->predicted_ns));
    jw_knum(w, "measured_over_other", os->steps > 0 ? ratio(measured, (double)os->step_time_ns) : NAN);
    jw_obj_end(w);
}

static void loss_check(jw *w, const job_compare *c) {
    if (c->loss_step < 0) {
        jw_null(w);
        return;
    }
    jw_obj(w);
    jw_kint(w, "step", c->loss_step);
    jw_knum(w, "job", c->loss_job); /* means in microbatch order; null when a loss was not finite */
    jw_knum(w, "other", c->loss_other);
    jw_kint(w, "microbatches_job", c->loss_n_job);
    jw_kint(w, "microbatches_other", c->loss_n_other);
    jw_key(w, "bitwise");
    jw_bool(w, c->loss_bitwise);
    jw_kint(w, "differing", c->loss_differing);
    jw_obj_end(w);
}

/* 0 when job vs is in db, else fills r (404, or 500) and returns -1. */
static int vs_exists(sqlite3 *db, long vs, http_reply *r) {
    sqlite3_stmt *st = routes_prep(db, "SELECT 1 FROM jobs WHERE id=?1", r);
    if (!st) return -1;
    sqlite3_bind_int64(st, 1, vs);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) http_error(r, 404, "vs=%ld: no job %ld in this database", vs, vs);
    else http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
    return -1;
}

/* The whole answer into w; -1 with r filled when a jobs row cannot be read. */
static int compare_json(sqlite3 *db, jw *w, const job_summary *s, const job_summary *o, const whatif_report *wr,
                        const job_compare *cmp, http_reply *r) {
    jw_obj(w);
    jw_kint(w, "job", s->job_id);
    jw_kint(w, "other", o->job_id);
    jw_key(w, "differs");
    jw_arr(w);
    int chunks_differ = 0;
    for (int k = 0; k < cmp->ndiffs; k++) {
        const compare_diff *d = &cmp->diffs[k];
        jw_obj(w);
        jw_kstr(w, "what", d->what);
        jw_kstr(w, "job", d->job);
        jw_kstr(w, "other", d->other);
        jw_obj_end(w);
        chunks_differ |= strcmp(d->what, "virtual stages") == 0;
    }
    jw_arr_end(w);
    /* the terminal's note: an op is one chunk's, so the op medians of jobs
     * with other chunks per rank are not like for like (timed ops are) */
    jw_key(w, "op_sizes_differ");
    jw_bool(w, chunks_differ && !wr[0].in.fixed_op_costs);
    jw_key(w, "numbers");
    jw_obj(w);
    jw_key(w, "job");
    if (side(db, w, s, &cmp->path_job, r) != 0) return -1;
    jw_key(w, "other");
    if (side(db, w, o, &cmp->path_other, r) != 0) return -1;
    jw_key(w, "change");
    change(w, s, o, cmp);
    jw_obj_end(w);
    jw_key(w, "prediction");
    prediction(w, s, o, &wr[1], cmp);
    jw_key(w, "loss_check");
    loss_check(w, cmp);
    jw_obj_end(w);
    return 0;
}

void route_compare(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long vs = 0;
    int got = arg_long(c, "vs", 1, 0x7fffffffL, &vs, r); /* `pprun stats --vs`'s range */
    if (got < 0) return;
    if (got == 0) {
        http_error(r, 400, "missing query parameter vs: the job to compare job %ld with (compare?vs=ID)", j->id);
        return;
    }
    routes_compare(db, j, vs, r);
}

void routes_compare(sqlite3 *db, const job_info *j, long vs, http_reply *r) {
    if (vs == j->id) {
        http_error(r, 400, "vs=%ld is job %ld itself: nothing to compare", vs, j->id);
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
        http_error(r, 500, "out of memory");
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
        if (compare_json(db, &w, &t->s, &t->o, t->w, &t->c, r) == 0) http_json(r, &w);
        jw_free(&w); /* empty once sent */
    } else {
        http_error(r, 500, "%s", err.msg);
    }
    compare_free(&t->c);
    if (read_o) summary_free(&t->o);
    summary_free(&t->s);
    free(t);
}
