/* routes_steps.c: the per-step API (docs/api.md): the steps with their
 * time, bubble and loss; the planned schedule and its simulated bubble; a
 * job's summary in a few numbers; every schedule simulated at the job's
 * measured costs; the critical path; and the Chrome/Perfetto trace
 * export. */
#include <sqlite3.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "db/critpath.h"
#include "db/export.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "web/routes.h"

/* One step's line of /steps: its stats rows (any ranks so far) and its
 * losses (any microbatches so far). */
typedef struct steps_line {
    int nranks;
    int64_t start, end;
    double *ratio;       /* world entries, valid where have[rank] */
    int64_t *act;        /* world entries, valid where have[rank] */
    unsigned char *have; /* world entries */
    int nloss, has_loss; /* has_loss: the mean is a number (every loss finite) */
    double loss;
} steps_line;

static void steps_write(jw *w, long step, const steps_line *l, const job_info *j) {
    jw_obj(w);
    jw_kint(w, "step", step);
    if (l->nranks) {
        jw_kint(w, "start", l->start - j->t0);
        jw_kint(w, "end", l->end - j->t0);
        jw_kint(w, "time_ns", l->end - l->start);
    } else {
        jw_kint_or_null(w, "start", -1);
        jw_kint_or_null(w, "end", -1);
        jw_kint_or_null(w, "time_ns", -1);
    }
    jw_key(w, "loss");
    if (l->has_loss) jw_num(w, l->loss);
    else jw_null(w);
    jw_kint(w, "losses", l->nloss);
    double sum = 0;
    jw_key(w, "bubble_ratio");
    jw_arr(w);
    for (int k = 0; k < j->world; k++)
        if (l->have[k]) jw_num(w, l->ratio[k]), sum += l->ratio[k];
        else jw_null(w);
    jw_arr_end(w);
    jw_key(w, "bubble_ratio_mean");
    if (l->nranks) jw_num(w, sum / l->nranks);
    else jw_null(w);
    jw_key(w, "act_peak_bytes");
    jw_arr(w);
    for (int k = 0; k < j->world; k++)
        if (l->have[k]) jw_int(w, l->act[k]);
        else jw_null(w);
    jw_arr_end(w);
    jw_key(w, "complete");
    jw_bool(w, l->nranks == j->world);
    jw_obj_end(w);
}

/* Steps with stats, and steps that only have losses so far (running): two
 * cursors in step order, merged here. One SQL query joining them ran the
 * loss subqueries once per rank and sorted a UNION of both tables' steps
 * (0.27 s on a 20,000-step job, against 0.07 s). */
void route_steps(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long since = 0, limit = 100000;
    if (arg_long(c, "since", 0, 1l << 40, &since, r) < 0 || arg_long(c, "limit", 1, 100000, &limit, r) < 0) return;
    sqlite3_stmt *stats = routes_prep(db,
                                      "SELECT step, rank, start_ns, end_ns, bubble_ratio, act_peak_bytes FROM step_stats "
                                      "WHERE job_id=?1 AND step>=?2 ORDER BY step, rank",
                                      r);
    if (!stats) return;
    sqlite3_stmt *losses = routes_prep(db,
                                       "SELECT step, CASE WHEN count(loss) = count(*) THEN avg(loss) END, count(*) "
                                       "FROM losses WHERE job_id=?1 AND step>=?2 GROUP BY step ORDER BY step",
                                       r);
    steps_line l = {.ratio = calloc((size_t)j->world, sizeof *l.ratio),
                    .act = calloc((size_t)j->world, sizeof *l.act),
                    .have = calloc((size_t)j->world, 1)};
    int rs = SQLITE_DONE, rl = SQLITE_DONE;
    jw w;
    jw_init(&w);
    if (!losses) goto out;
    if (!l.ratio || !l.act || !l.have) {
        http_error(r, 500, "out of memory");
        goto out;
    }
    sqlite3_bind_int64(stats, 1, j->id);
    sqlite3_bind_int64(stats, 2, since);
    sqlite3_bind_int64(losses, 1, j->id);
    sqlite3_bind_int64(losses, 2, since);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_key(&w, "steps");
    jw_arr(&w);
    rs = sqlite3_step(stats);
    rl = sqlite3_step(losses);
    for (long n = 0; n < limit && (rs == SQLITE_ROW || rl == SQLITE_ROW); n++) {
        long step = rs == SQLITE_ROW ? sqlite3_column_int(stats, 0) : LONG_MAX;
        if (rl == SQLITE_ROW && sqlite3_column_int(losses, 0) < step) step = sqlite3_column_int(losses, 0);
        l.nranks = 0;
        l.start = INT64_MAX;
        l.end = INT64_MIN;
        memset(l.have, 0, (size_t)j->world);
        for (; rs == SQLITE_ROW && sqlite3_column_int(stats, 0) == step; rs = sqlite3_step(stats)) {
            int rank = sqlite3_column_int(stats, 1);
            int64_t s = sqlite3_column_int64(stats, 2), e = sqlite3_column_int64(stats, 3);
            if (rank < 0 || rank >= j->world) continue;
            if (s < l.start) l.start = s;
            if (e > l.end) l.end = e;
            l.have[rank] = 1;
            l.ratio[rank] = sqlite3_column_double(stats, 4);
            l.act[rank] = sqlite3_column_int64(stats, 5);
            l.nranks++;
        }
        l.nloss = l.has_loss = 0;
        if (rl == SQLITE_ROW && sqlite3_column_int(losses, 0) == step) {
            l.has_loss = sqlite3_column_type(losses, 1) != SQLITE_NULL;
            l.loss = sqlite3_column_double(losses, 1);
            l.nloss = sqlite3_column_int(losses, 2);
            rl = sqlite3_step(losses);
        }
        steps_write(&w, step, &l, j);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    if ((rs != SQLITE_ROW && rs != SQLITE_DONE) || (rl != SQLITE_ROW && rl != SQLITE_DONE))
        http_error(r, 500, "database error: %s", sqlite3_errmsg(db));
    else
        http_json(r, &w);
out:
    jw_free(&w);
    free(l.ratio);
    free(l.act);
    free(l.have);
    sqlite3_finalize(stats);
    sqlite3_finalize(losses);
}

int routes_trace_request(struct MHD_Connection *c, long job, trace_request *t, http_reply *r) {
    const char *steps_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "steps");
    pp_err err;
    *t = (trace_request){.job = job, .has_steps = steps_s && *steps_s}; /* empty: as absent */
    if (t->has_steps && db_export_parse_steps(steps_s, &t->steps, &err) != 0) {
        http_error(r, 400, "steps: %s", err.msg);
        return 0;
    }
    return 1;
}

/* Written to a temporary file, not to memory: a long job's whole trace runs
 * to gigabytes (about 70 kB a step of 4 ranks and 8 microbatches). */
void routes_trace(http_server *s, sqlite3 *db, const void *arg, http_reply *r) {
    (void)s;
    const trace_request *t = arg;
    job_info j;
    if (routes_load_job(db, t->job, &j, r) != 0) return;
    FILE *out = tmpfile();
    if (!out) {
        http_error(r, 500, "cannot make a temporary file for the trace: %s", strerror(errno));
        return;
    }
    pp_err err;
    int rc = db_export_chrome(db, j.id, t->has_steps ? &t->steps : NULL, out, &err);
    off_t len = ftello(out);
    if (rc != 0 || len < 0) {
        fclose(out);
        http_error(r, rc == 1 ? 404 : 500, "%s", rc == 0 ? "cannot measure the trace's temporary file" : err.msg);
        return;
    }
    free(r->body);
    r->body = NULL;
    r->status = 200;
    r->type = "application/json";
    r->file = out;
    r->len = (size_t)len;
}

static void plan_row(void *w, sqlite3_stmt *st) { routes_row_object(w, st); }

void route_plan(sqlite3 *db, const job_info *j, http_reply *r) {
    int64_t *busy = calloc((size_t)j->world, sizeof *busy), makespan;
    int64_t *peak = calloc((size_t)j->world, sizeof *peak);
    if (!busy || !peak) {
        free(busy);
        free(peak);
        http_error(r, 500, "out of memory");
        return;
    }
    jw w;
    jw_init(&w);
    jw_obj(&w);
    jw_kint(&w, "job", j->id);
    jw_kint(&w, "world_size", j->world);
    jw_key(&w, "actions");
    jw_arr(&w);
    pp_err err;
    int simulated = summary_plan(db, j->id, j->world, busy, peak, &makespan, plan_row, &w, &err);
    if (simulated < 0) http_error(r, 500, "%s", err.msg);
    jw_arr_end(&w);
    jw_key(&w, "simulated");
    jw_bool(&w, simulated > 0);
    if (simulated > 0) {
        jw_kint(&w, "sim_makespan_ns", makespan);
        jw_key(&w, "sim_bubble_ratio");
        jw_arr(&w);
        for (int k = 0; k < j->world; k++) jw_num(&w, summary_sim_bubble(busy[k], makespan));
        jw_arr_end(&w);
    }
    int has_plan = 0; /* some rank has an F (summary_plan) */
    for (int k = 0; k < j->world; k++) has_plan |= peak[k] > 0;
    jw_key(&w, "peak_inflight");
    jw_arr(&w);
    for (int k = 0; has_plan && k < j->world; k++) jw_int(&w, peak[k]);
    jw_arr_end(&w);
    jw_obj_end(&w);
    free(busy);
    free(peak);
    if (simulated >= 0) http_json(r, &w);
    jw_free(&w); /* empty once sent */
}

/* The job in a few numbers (db/summary.h), to hold jobs side by side. */
/* Reads job j's summary (and, with wr, its what-if) and opens the answer
 * `{"job": ID` in w; or answers 500 naming the problem and returns -1. */
static int summary_begin(sqlite3 *db, const job_info *j, job_summary *s, whatif_report *wr, jw *w, http_reply *r) {
    pp_err err;
    /* the what-if shows no idle times: it skips the pass over every gap, which
     * the dashboard would pay every 10 s while following a long job */
    if (summary_read(db, j->id, wr ? SUMMARY_NO_IDLE : 0, s, &err) != 0 || (wr && whatif_read(db, s, wr, &err) != 0)) {
        summary_free(s);
        http_error(r, 500, "%s", err.msg);
        return -1;
    }
    jw_init(w);
    jw_obj(w);
    jw_kint(w, "job", j->id);
    return 0;
}

void route_summary(sqlite3 *db, const job_info *j, http_reply *r) {
    job_summary s;
    jw w;
    if (summary_begin(db, j, &s, NULL, &w, r) != 0) return;
    jw_kint(&w, "from_step", s.from_step);
    jw_kint(&w, "steps", s.steps);
    jw_key(&w, "step_time_ns");
    if (s.steps) jw_int(&w, s.step_time_ns);
    else jw_null(&w);
    jw_key(&w, "bubble_ratio");
    jw_num(&w, s.bubble_ratio);
    jw_key(&w, "bubble_ratio_by_rank");
    jw_arr(&w);
    for (int k = 0; k < s.world; k++) jw_num(&w, s.bubble_by_rank[k]);
    jw_arr_end(&w);
    jw_key(&w, "sim_bubble_ratio");
    jw_num(&w, s.sim_bubble_ratio);
    jw_kints_or_null(&w, "act_peak_bytes_by_rank", s.act_peak_by_rank, s.world);
    jw_kint_or_null(&w, "act_peak_bytes", s.act_peak);
    jw_kints_or_null(&w, "state_bytes_by_rank", s.state_by_rank, s.world);
    jw_kint_or_null(&w, "mem_peak_bytes", s.mem_peak);
    jw_kint_or_null(&w, "mem_peak_rank", s.mem_peak_rank);
    jw_key(&w, "plan_peak_inflight");
    jw_arr(&w);
    for (int k = 0; s.has_plan && k < s.world; k++) jw_int(&w, s.plan_peak_inflight[k]);
    jw_arr_end(&w);
    jw_key(&w, "idle_ns_by_cause");
    jw_obj(&w);
    for (int k = 0; k < CAUSE_COUNT; k++) jw_kint(&w, analyze_causes[k], s.idle_ns_by_cause[k]);
    jw_obj_end(&w);
    jw_kint_or_null(&w, "loss_step", s.loss_step);
    jw_knum(&w, "loss", s.loss);
    jw_obj_end(&w);
    summary_free(&s);
    http_json(r, &w);
    jw_free(&w); /* empty once sent */
}

static void costs_json(jw *w, const char *key, const sched_costs *c) {
    jw_key(w, key);
    jw_obj(w);
    jw_knum(w, "f", c->f);
    jw_knum(w, "b", c->b);
    jw_knum(w, "w", c->w);
    jw_obj_end(w);
}

/* Stage balance (db/balance.h): each stage's costs, what their unevenness
 * costs the job's schedule, and the cuts that would even them out. */
static void whatif_balance_json(jw *w, const whatif_report *wr) {
    const balance_profile *bp = &wr->profile;
    jw_obj(w);
    jw_key(w, "stages");
    jw_arr(w);
    for (int k = 0; k < bp->stages; k++) {
        jw_obj(w);
        jw_kint(w, "stage", k);
        jw_kint(w, "rank", bp->rank[k]);
        if (bp->layers_known) {
            jw_kint(w, "first_layer", bp->bound[k]);
            jw_kint(w, "layers", bp->bound[k + 1] - bp->bound[k]);
        }
        costs_json(w, "costs_ns", &bp->stage[k]);
        jw_key(w, "listed");
        jw_bool(w, balance_listed(bp, k));
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_knum(w, "mean_stage_ns", balance_mean_stage(bp));
    jw_key(w, "layers_known");
    jw_bool(w, bp->layers_known);
    if (bp->layers_known) {
        costs_json(w, "per_layer_ns", &bp->per_layer);
        costs_json(w, "first_stage_adds_ns", &bp->first_adds);
        costs_json(w, "last_stage_adds_ns", &bp->last_adds);
    }
    jw_knum(w, "slowest_stage_ns", wr->bottleneck_ns);
    jw_knum(w, "step_time_ns", wr->own_step_ns);
    jw_knum(w, "even_step_time_ns", wr->equal_step_ns);
    char cuts[BALANCE_MAX_STAGES * 6];
    jw_kstr(w, "suggested_cuts", wr->ncuts ? sched_cuts_text(wr->cuts, wr->ncuts, cuts, sizeof cuts) : NULL);
    jw_knum(w, "suggested_slowest_stage_ns", wr->ncuts ? wr->cuts_bottleneck_ns : NAN);
    jw_knum(w, "suggested_step_time_ns", wr->ncuts ? wr->cuts_step_ns : NAN);
    jw_kstr(w, "no_cuts", wr->ncuts ? NULL : wr->no_cuts);
    jw_obj_end(w);
}

/* Each built-in schedule played out at the job's measured costs (db/whatif.h). */
void route_whatif(sqlite3 *db, const job_info *j, http_reply *r) {
    job_summary s;
    whatif_report wr;
    jw w;
    if (summary_begin(db, j, &s, &wr, &w, r) != 0) return;
    jw_key(&w, "measured");
    jw_bool(&w, wr.measured);
    if (wr.measured) {
        jw_kint(&w, "first_step", wr.first_step);
        jw_kint(&w, "last_step", wr.last_step);
        jw_kstr(&w, "source", wr.gpu ? "gpu" : "cpu");
        jw_key(&w, "costs_ns");
        jw_obj(&w);
        jw_knum(&w, "f", wr.in.costs.f);
        jw_knum(&w, "b", wr.in.costs.b);
        jw_knum(&w, "w", wr.in.costs.w);
        jw_knum(&w, "send", wr.in.costs.comm);
        jw_obj_end(&w);
        jw_key(&w, "fixed_op_costs");
        jw_bool(&w, wr.in.fixed_op_costs);
        char flag[160];
        whatif_tuned_flag(&wr.in, flag, sizeof flag);
        jw_kstr(&w, "tuned_schedule_costs", flag);
        jw_key(&w, "shared_cores");
        if (wr.shared_ranks > 0) {
            jw_obj(&w);
            jw_kint(&w, "ranks", wr.shared_ranks);
            jw_kint(&w, "cores", wr.shared_cores);
            jw_obj_end(&w);
        } else {
            jw_null(&w);
        }
        jw_key(&w, "shared_gpu");
        if (wr.shared_gpu_ranks > 0) {
            jw_obj(&w);
            jw_kint(&w, "ranks", wr.shared_gpu_ranks);
            jw_kstr(&w, "device", wr.shared_gpu);
            jw_obj_end(&w);
        } else {
            jw_null(&w);
        }
    }
    jw_key(&w, "schedules");
    jw_arr(&w);
    for (int k = 0; wr.measured && k < wr.nrows; k++) {
        const whatif_row *row = &wr.rows[k];
        jw_obj(&w);
        jw_kstr(&w, "schedule", row->schedule);
        jw_kint(&w, "virtual_stages", row->virtual_stages);
        jw_key(&w, "this_job");
        jw_bool(&w, row->this_job);
        jw_key(&w, "tuned");
        jw_bool(&w, row->tuned);
        jw_kstr(&w, "error", row->error[0] ? row->error : NULL);
        jw_knum(&w, "step_time_ns", row->step_time_ns);
        jw_knum(&w, "bubble_ratio", row->bubble_ratio);
        jw_key(&w, "peak_inflight");
        if (row->error[0]) jw_null(&w);
        else jw_int(&w, row->peak_inflight);
        jw_kint_or_null(&w, "act_peak_bytes", row->act_peak_bytes);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_key(&w, "balance");
    if (wr.measured && wr.has_profile) whatif_balance_json(&w, &wr);
    else jw_null(&w);
    jw_obj_end(&w);
    summary_free(&s);
    http_json(r, &w);
    jw_free(&w); /* empty once sent */
}

/* Where t's time went: per rank its ops' time on the path, and the waits. */
static void critpath_totals_json(jw *w, const critpath_totals *t) {
    static const char *const phases[4] = {"F", "B", "W", "OPT"};
    jw_kint(w, "span_ns", t->span_ns);
    jw_key(w, "ranks");
    jw_arr(w);
    for (int k = 0; k < t->ranks; k++) {
        jw_obj(w);
        jw_kint(w, "rank", k);
        for (int p = 0; p < 4; p++) jw_kint(w, phases[p], t->op_ns[k][p]);
        jw_key(w, "listed");
        jw_bool(w, critpath_listed(t, k));
        jw_obj_end(w);
    }
    jw_arr_end(w);
    for (int k = 0; k < CRITPATH_WAITS; k++)
        jw_kint(w, critpath_wait_keys[k], t->wait_ns[k]);
}

/* One step's path, op by op (?step=N), or the latest complete steps'
 * totals (db/critpath.h). */
void route_critpath(sqlite3 *db, struct MHD_Connection *c, const job_info *j, http_reply *r) {
    long step = -1;
    if (arg_long(c, "step", 0, 1l << 30, &step, r) >= 0) routes_critpath(db, j, step, r);
}

void routes_critpath(sqlite3 *db, const job_info *j, long step, http_reply *r) {
    pp_err err;
    jw w;
    if (step < 0) {
        critpath_report cr;
        if (critpath_read(db, j->id, j->world, &cr, &err) != 0) {
            http_error(r, 500, "%s", err.msg);
        } else {
            jw_init(&w);
            jw_obj(&w);
            jw_kint(&w, "job", j->id);
            jw_kint(&w, "steps", cr.steps);
            jw_kint_or_null(&w, "first_step", cr.steps ? cr.first_step : -1);
            jw_kint_or_null(&w, "last_step", cr.steps ? cr.last_step : -1);
            critpath_totals_json(&w, &cr.t);
            jw_obj_end(&w);
            http_json(r, &w);
            jw_free(&w); /* empty once sent */
        }
        critpath_report_free(&cr);
        return;
    }
    critpath_path p;
    critpath_totals t = {.ranks = j->world};
    if (critpath_step(db, j->id, (int)step, &p, &err) != 0) {
        http_error(r, 500, "%s", err.msg);
    } else if (p.n == 0) {
        http_error(r, 404, "job %ld has no compute op in step %ld", j->id, step);
    } else if (!(t.op_ns = calloc(j->world > 0 ? (size_t)j->world : 1, sizeof *t.op_ns))) {
        http_error(r, 500, "out of memory");
    } else {
        critpath_add(&t, &p);
        jw_init(&w);
        jw_obj(&w);
        jw_kint(&w, "job", j->id);
        jw_kint(&w, "step", step);
        jw_kint(&w, "start", p.start_ns - j->t0);
        jw_kint(&w, "end", p.end_ns - j->t0);
        critpath_totals_json(&w, &t);
        jw_key(&w, "ops");
        jw_arr(&w);
        for (size_t i = 0; i < p.n; i++) {
            const critpath_op *o = &p.ops[i];
            jw_obj(&w);
            jw_kint(&w, "id", o->op.id);
            jw_kint(&w, "rank", o->op.rank);
            jw_kstr(&w, "phase", trace_phase_name(o->op.phase));
            jw_kint_or_null(&w, "stage", o->op.stage);
            jw_kint_or_null(&w, "microbatch", o->op.microbatch);
            jw_kint(&w, "start", o->op.start - j->t0);
            jw_kint(&w, "end", o->op.end - j->t0);
            jw_kstr(&w, "via", critpath_via_names[o->via]);
            jw_kint(&w, "lead_ns", o->lead_ns);
            jw_kint(&w, "lead_comm_ns", o->lead_comm_ns);
            jw_obj_end(&w);
        }
        jw_arr_end(&w);
        jw_obj_end(&w);
        http_json(r, &w);
        jw_free(&w); /* empty once sent */
    }
    free(t.op_ns);
    critpath_free(&p);
}
