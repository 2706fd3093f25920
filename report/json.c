/* json.c: a job's analyses as the API's JSON (json.h): summary, what-if
 * with stage balance, critical path, plan, and two jobs side by side. The
 * numbers are db/'s (summary.c, whatif.c, balance.c, critpath.c,
 * compare.c); here they only become JSON, the changes between two jobs as
 * numbers where the terminal (text.c) formats them. */
#include "report/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "report/sql.h"

/* ---- summary ---------------------------------------------------------- */

void report_summary_json(jw *w, const job_summary *s) {
    jw_obj(w);
    jw_kint(w, "job", s->job_id);
    jw_kint(w, "from_step", s->from_step);
    jw_kint(w, "steps", s->steps);
    jw_key(w, "step_time_ns");
    if (s->steps) jw_int(w, s->step_time_ns);
    else jw_null(w);
    jw_kint_or_null(w, "between_steps_ns", s->between_ns);
    jw_key(w, "bubble_ratio");
    jw_num(w, s->bubble_ratio);
    jw_key(w, "bubble_ratio_by_rank");
    jw_arr(w);
    for (int k = 0; k < s->world; k++) jw_num(w, s->bubble_by_rank[k]);
    jw_arr_end(w);
    jw_key(w, "sim_bubble_ratio");
    jw_num(w, s->sim_bubble_ratio);
    jw_kints_or_null(w, "act_peak_bytes_by_rank", s->act_peak_by_rank, s->world);
    jw_kint_or_null(w, "act_peak_bytes", s->act_peak);
    jw_kints_or_null(w, "state_bytes_by_rank", s->state_by_rank, s->world);
    jw_kint_or_null(w, "mem_peak_bytes", s->mem_peak);
    jw_kint_or_null(w, "mem_peak_rank", s->mem_peak_rank);
    jw_kint(w, "dropped_events", s->dropped);
    jw_key(w, "dropped_events_by_rank");
    jw_arr(w);
    for (int k = 0; k < s->world; k++) jw_int(w, s->dropped_by_rank[k]);
    jw_arr_end(w);
    jw_key(w, "plan_peak_inflight");
    jw_arr(w);
    for (int k = 0; s->has_plan && k < s->world; k++) jw_int(w, s->plan_peak_inflight[k]);
    jw_arr_end(w);
    jw_key(w, "idle_ns_by_cause");
    jw_obj(w);
    for (int k = 0; k < CAUSE_COUNT; k++) jw_kint(w, analyze_causes[k], s->idle_ns_by_cause[k]);
    jw_obj_end(w);
    jw_kint_or_null(w, "loss_step", s->loss_step);
    jw_knum(w, "loss", s->loss);
    jw_kint_or_null(w, "eval_loss_step", s->eval_step);
    jw_knum(w, "eval_loss", s->eval_loss);
    if (s->has_ops) { /* the program's own spans by name, most time first */
        jw_key(w, "spans");
        jw_arr(w);
        for (size_t i = 0; i < s->nspans; i++) {
            const summary_span *o = &s->spans[i];
            jw_obj(w);
            jw_kstr(w, "name", o->name);
            jw_kint(w, "count", o->count);
            jw_kint(w, "total_ns", o->total_ns);
            jw_kint(w, "median_ns", o->median_ns);
            jw_kint(w, "max_ns", o->max_ns);
            jw_obj_end(w);
        }
        jw_arr_end(w);
    }
    if (s->dp_unlaid) jw_kint(w, "dp_not_laid_out", s->dp_unlaid); /* --dp D shown as one pipeline */
    if (s->replicas) { /* --dp: each pipeline's bubble and data-parallel time */
        jw_key(w, "replicas");
        jw_arr(w);
        for (int d = 0; d < s->nreplicas; d++) {
            const summary_replica *r = &s->replicas[d];
            jw_obj(w);
            jw_kint(w, "replica", d);
            jw_kint(w, "first_rank", r->first_rank);
            jw_kint(w, "ranks", r->ranks);
            jw_key(w, "bubble_ratio");
            jw_num(w, r->bubble_ratio);
            jw_kint(w, "wait_dp_ns", r->wait_dp_ns);
            jw_kint(w, "allreduce_ns", r->allreduce_ns);
            jw_obj_end(w);
        }
        jw_arr_end(w);
    }
    jw_obj_end(w);
}

/* ---- what-if and stage balance --------------------------------------- */

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
static void balance_json(jw *w, const whatif_report *wr) {
    const balance_profile *bp = &wr->profile;
    jw_obj(w);
    jw_key(w, "stages");
    jw_arr(w);
    for (int k = 0; k < bp->stages; k++) {
        jw_obj(w);
        jw_kint(w, "stage", k);
        jw_kint(w, "rank", bp->rank[k]); /* the first pipeline's, as before "ranks" */
        jw_key(w, "ranks");
        jw_arr(w);
        for (int d = 0; d < balance_stage_ranks(bp); d++) jw_int(w, balance_stage_rank(bp, k, d));
        jw_arr_end(w);
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

/* What the job measured: the window, its op costs, and whether its ranks
 * shared cores or a GPU (wr->measured). */
static void measured_json(jw *w, const whatif_report *wr) {
    jw_kint(w, "first_step", wr->first_step);
    jw_kint(w, "last_step", wr->last_step);
    jw_kstr(w, "source", wr->gpu ? "gpu" : "cpu");
    jw_key(w, "costs_ns");
    jw_obj(w);
    jw_knum(w, "f", wr->in.costs.f);
    jw_knum(w, "b", wr->in.costs.b);
    jw_knum(w, "w", wr->in.costs.w);
    jw_knum(w, "send", wr->in.costs.comm);
    jw_knum(w, "between", wr->in.costs.between);
    jw_kint_or_null(w, "bw", wr->in.costs.bw > 0 ? llround(wr->in.costs.bw) : -1); /* null: a BW costs b + w */
    jw_obj_end(w);
    jw_key(w, "fixed_op_costs");
    jw_bool(w, wr->in.fixed_op_costs);
    /* a job whose backward is BW only: b and w above are halves of it */
    jw_kint_or_null(w, "bw_split_ns", wr->bw_split ? wr->bw_ns : -1);
    char flag[160];
    whatif_tuned_flag(&wr->in, flag, sizeof flag);
    jw_kstr(w, "tuned_schedule_costs", flag);
    /* what `pprun stats` recommends the flag on: the tuned row built and faster than zb-v's */
    jw_key(w, "tuned_recommended");
    jw_bool(w, wr->nrows >= 0 && whatif_tuned_pays(wr->rows, wr->nrows));
    jw_key(w, "shared_cores");
    if (wr->shared_ranks > 0) {
        jw_obj(w);
        jw_kint(w, "ranks", wr->shared_ranks);
        jw_kint(w, "cores", wr->shared_cores);
        jw_knum(w, "waited_share", wr->wait_cpu_share); /* of the ops' time, taken out of costs_ns */
        jw_obj_end(w);
    } else {
        jw_null(w);
    }
    jw_key(w, "shared_gpu");
    if (wr->shared_gpu_ranks > 0) {
        jw_obj(w);
        jw_kint(w, "ranks", wr->shared_gpu_ranks);
        jw_kstr(w, "device", wr->shared_gpu);
        jw_key(w, "mps"); /* under the job's MPS daemon */
        jw_bool(w, wr->shared_gpu_mps);
        jw_obj_end(w);
    } else {
        jw_null(w);
    }
}

/* The memory curve (whatif_curve): each bound's zb-h1, zb-v and zb-v tuned
 * built under it; rows [] and why_not when there is none. */
static void curve_json(jw *w, const whatif_report *wr) {
    static const char *const cols[WHATIF_CURVE_COLS] = {"zb-h1", "zb-v", "zb-v tuned"};
    jw_obj(w);
    jw_kstr(w, "unit", "microbatch-stages of a 1F1B stage");
    jw_kstr(w, "why_not", wr->ncurve ? NULL : wr->no_curve);
    jw_key(w, "rows");
    jw_arr(w);
    for (int k = 0; k < wr->ncurve; k++) {
        const whatif_curve_row *row = &wr->curve[k];
        jw_obj(w);
        jw_kint(w, "bound", row->bound);
        jw_kint_or_null(w, "bound_bytes", row->bound_bytes);
        for (int col = 0; col < WHATIF_CURVE_COLS; col++) {
            const whatif_curve_cell *cell = &row->cell[col];
            jw_key(w, cols[col]);
            jw_obj(w);
            jw_kstr(w, "error", cell->error[0] ? cell->error : NULL);
            jw_knum(w, "step_time_ns", cell->error[0] ? NAN : cell->step_time_ns);
            jw_knum(w, "bubble_ratio", cell->error[0] ? NAN : cell->bubble_ratio);
            jw_key(w, "peak_inflight");
            if (cell->error[0]) jw_null(w);
            else jw_int(w, cell->peak_inflight);
            jw_kint_or_null(w, "act_peak_bytes", cell->error[0] ? -1 : cell->act_peak_bytes);
            jw_obj_end(w);
        }
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

void report_whatif_json(jw *w, int64_t job, const whatif_report *wr) {
    jw_obj(w);
    jw_kint(w, "job", job);
    jw_key(w, "measured");
    jw_bool(w, wr->measured);
    if (wr->measured) measured_json(w, wr);
    jw_key(w, "schedules");
    jw_arr(w);
    for (int k = 0; wr->measured && k < wr->nrows; k++) {
        const whatif_row *row = &wr->rows[k];
        jw_obj(w);
        jw_kstr(w, "schedule", row->schedule);
        jw_kint(w, "virtual_stages", row->virtual_stages);
        jw_key(w, "this_job");
        jw_bool(w, row->this_job);
        jw_key(w, "tuned");
        jw_bool(w, row->tuned);
        jw_kstr(w, "error", row->error[0] ? row->error : NULL);
        jw_knum(w, "step_time_ns", row->step_time_ns);
        jw_knum(w, "bubble_ratio", row->bubble_ratio);
        jw_key(w, "peak_inflight");
        if (row->error[0]) jw_null(w);
        else jw_int(w, row->peak_inflight);
        jw_kint_or_null(w, "act_peak_bytes", row->act_peak_bytes);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_key(w, "balance");
    if (wr->measured && wr->has_profile) balance_json(w, wr);
    else jw_null(w);
    jw_key(w, "memory_curve");
    if (wr->measured) curve_json(w, wr);
    else jw_null(w);
    jw_key(w, "data_parallel"); /* --dp: what more pipelines or microbatches would do */
    if (wr->measured && wr->ndp) {
        jw_obj(w);
        jw_kint(w, "replicas", wr->dp);
        jw_knum(w, "exposed_allreduce_ns", wr->exposed_allreduce_ns);
        jw_key(w, "allreduce_ns_by_stage"); /* null: a stage without an all-reduce span */
        jw_arr(w);
        for (int k = 0; k < wr->in.ranks * wr->in.virtual_stages && k < BALANCE_MAX_STAGES; k++)
            jw_num(w, wr->allreduce_ns[k]);
        jw_arr_end(w);
        jw_key(w, "rows");
        jw_arr(w);
        for (int k = 0; k < wr->ndp; k++) {
            const whatif_dp_row *row = &wr->dp_rows[k];
            jw_obj(w);
            jw_kint(w, "dp", row->dp);
            jw_kint(w, "microbatches", row->microbatches);
            jw_knum(w, "step_time_ns", row->step_time_ns);
            jw_knum(w, "throughput", row->throughput);
            jw_obj_end(w);
        }
        jw_arr_end(w);
        jw_obj_end(w);
    } else {
        jw_null(w);
    }
    jw_obj_end(w);
}

/* ---- critical path ---------------------------------------------------- */

/* Where t's time went: per rank its ops' time on the path, and the waits. */
static void critpath_totals_json(jw *w, const critpath_totals *t) {
    static const char *const phases[5] = {"F", "B", "W", "OPT", "BW"}; /* critpath_totals.op_ns's order */
    jw_kint(w, "span_ns", t->span_ns);
    jw_key(w, "ranks");
    jw_arr(w);
    for (int k = 0; k < t->ranks; k++) {
        jw_obj(w);
        jw_kint(w, "rank", k);
        for (int p = 0; p < 5; p++) jw_kint(w, phases[p], t->op_ns[k][p]);
        jw_key(w, "listed");
        jw_bool(w, critpath_listed(t, k));
        jw_obj_end(w);
    }
    jw_arr_end(w);
    for (int k = 0; k < CRITPATH_WAITS; k++) jw_kint(w, critpath_wait_keys[k], t->wait_ns[k]);
}

void report_critpath_json(jw *w, int64_t job, const critpath_report *r) {
    jw_obj(w);
    jw_kint(w, "job", job);
    jw_kint(w, "steps", r->steps);
    jw_kint_or_null(w, "first_step", r->steps ? r->first_step : -1);
    jw_kint_or_null(w, "last_step", r->steps ? r->last_step : -1);
    critpath_totals_json(w, &r->t);
    jw_obj_end(w);
}

int report_critpath_step_json(jw *w, int64_t job, int64_t t0, int world, long step, const critpath_path *p,
                              pp_err *err) {
    critpath_totals t = {.ranks = world};
    if (!(t.op_ns = calloc(world > 0 ? (size_t)world : 1, sizeof *t.op_ns))) return pp_fail(err, "out of memory");
    critpath_add(&t, p);
    jw_obj(w);
    jw_kint(w, "job", job);
    jw_kint(w, "step", step);
    jw_kint(w, "start", p->start_ns - t0);
    jw_kint(w, "end", p->end_ns - t0);
    critpath_totals_json(w, &t);
    jw_key(w, "ops");
    jw_arr(w);
    for (size_t i = 0; i < p->n; i++) {
        const critpath_op *o = &p->ops[i];
        jw_obj(w);
        jw_kint(w, "id", o->op.id);
        jw_kint(w, "rank", o->op.rank);
        jw_kstr(w, "phase", analyze_phase_name(o->op.phase));
        jw_kint_or_null(w, "stage", o->op.stage);
        jw_kint_or_null(w, "microbatch", o->op.microbatch);
        jw_kint(w, "start", o->op.start - t0);
        jw_kint(w, "end", o->op.end - t0);
        jw_kstr(w, "via", critpath_via_names[o->via]);
        jw_kint(w, "lead_ns", o->lead_ns);
        jw_kint(w, "lead_comm_ns", o->lead_comm_ns);
        jw_kint(w, "lead_allreduce_ns", o->lead_dp_ns);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
    free(t.op_ns);
    return 0;
}

/* ---- plan ------------------------------------------------------------- */

static void plan_row(void *w, sqlite3_stmt *st) { report_sql_row(w, st); }
static void plan_row_left_out(void *w, sqlite3_stmt *st) { (void)w, (void)st; }

int report_plan_json(jw *w, sqlite3 *db, int64_t job, int world, pp_err *err) {
    int64_t *busy = calloc((size_t)world, sizeof *busy), makespan;
    int64_t *peak = calloc((size_t)world, sizeof *peak);
    int simulated = -1;
    if (!busy || !peak) {
        pp_fail(err, "out of memory");
        goto out;
    }
    sqlite3_stmt *st;
    int64_t actions = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM plan WHERE job_id = ?1", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, job);
        if (sqlite3_step(st) == SQLITE_ROW) actions = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (actions < 0) {
        pp_fail(err, "reading the plan's size: %s", sqlite3_errmsg(db));
        goto out;
    }
    int listed = actions <= REPORT_PLAN_ACTIONS_MAX;
    jw_obj(w);
    jw_kint(w, "job", job);
    jw_kint(w, "world_size", world);
    jw_kint(w, "actions_left_out", listed ? 0 : actions);
    jw_key(w, "actions");
    jw_arr(w);
    simulated = summary_plan(db, job, world, busy, peak, &makespan, listed ? plan_row : plan_row_left_out, w, err);
    if (simulated < 0) goto out;
    jw_arr_end(w);
    jw_key(w, "simulated");
    jw_bool(w, simulated > 0);
    if (simulated > 0) {
        jw_kint(w, "sim_makespan_ns", makespan);
        jw_key(w, "sim_bubble_ratio");
        jw_arr(w);
        for (int k = 0; k < world; k++) jw_num(w, summary_sim_bubble(busy[k], makespan));
        jw_arr_end(w);
    }
    int has_plan = 0; /* some rank has an F (summary_plan) */
    for (int k = 0; k < world; k++) has_plan |= peak[k] > 0;
    jw_key(w, "peak_inflight");
    jw_arr(w);
    for (int k = 0; has_plan && k < world; k++) jw_int(w, peak[k]);
    jw_arr_end(w);
    jw_obj_end(w);
out:
    free(busy);
    free(peak);
    return simulated < 0 ? -1 : 0;
}

/* ---- two jobs side by side -------------------------------------------- */

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
    for (int k = 0; k < CRITPATH_WAITS; k++) jw_knum(w, critpath_wait_keys[k], critpath_per_step(p, p->t.wait_ns[k]));
    jw_obj_end(w);
}

/* One job's numbers: the jobs row's name and schedule, then its summary
 * and critical path as `pprun stats --vs` tabulates them. */
static int side(jw *w, sqlite3 *db, const job_summary *s, const critpath_report *path, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, schedule, virtual_stages, microbatches, " SQL_JOB_STATUS("")
                           " FROM jobs WHERE id=?1",
                           -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, s->job_id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        pp_fail(err, "database error: %s", sqlite3_errmsg(db));
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
static void prediction(jw *w, const job_summary *js, const job_summary *os, const whatif_report *owr,
                       const job_compare *c) {
    jw_obj(w);
    if (c->predicted < 0) {
        jw_kstr(w, "why_not", c->why_not);
        jw_obj_end(w);
        return;
    }
    const whatif_row *row = &c->row;
    jw_kint(w, "by", c->other);
    jw_kstr(w, "schedule", row->schedule);
    jw_kstr(w, "max_mem", c->max_mem[0] ? c->max_mem : NULL); /* the job's own order under it, as it ran */
    jw_key(w, "tuned");
    jw_bool(w, row->tuned);
    jw_kint(w, "virtual_stages", row->virtual_stages);
    if (c->by_cuts) {
        char cuts[BALANCE_MAX_STAGES * 6];
        jw_kstr(w, "pipeline_cuts", sched_cuts_text(owr->cuts, owr->ncuts, cuts, sizeof cuts));
    }
    jw_knum(w, "predicted_step_time_ns", c->predicted_ns);
    if (c->own >= 0) {
        jw_kstr(w, "own_schedule", owr->rows[c->own].schedule);
        jw_knum(w, "own_step_time_ns", owr->rows[c->own].step_time_ns);
        jw_knum(w, "predicted_over_own", ratio(c->predicted_ns, owr->rows[c->own].step_time_ns));
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

int report_compare_json(jw *w, sqlite3 *db, const job_summary *js, const whatif_report *jwr, const job_summary *os,
                        const whatif_report *owr, const job_compare *c, pp_err *err) {
    jw_obj(w);
    jw_kint(w, "job", js->job_id);
    jw_kint(w, "other", os->job_id);
    jw_key(w, "differs");
    jw_arr(w);
    int chunks_differ = 0;
    for (int k = 0; k < c->ndiffs; k++) {
        const compare_diff *d = &c->diffs[k];
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
    jw_bool(w, chunks_differ && !jwr->in.fixed_op_costs);
    jw_key(w, "numbers");
    jw_obj(w);
    jw_key(w, "job");
    if (side(w, db, js, &c->path_job, err) != 0) return -1;
    jw_key(w, "other");
    if (side(w, db, os, &c->path_other, err) != 0) return -1;
    jw_key(w, "change");
    change(w, js, os, c);
    jw_obj_end(w);
    jw_key(w, "prediction");
    prediction(w, js, os, owr, c);
    jw_key(w, "loss_check");
    loss_check(w, c);
    jw_obj_end(w);
    return 0;
}

/* ---- pprun stats --format json ---------------------------------------- */

void report_stats_json(jw *w, const job_summary *s, const whatif_report *wr, const critpath_report *cp) {
    jw_obj(w);
    jw_kint(w, "job", s->job_id);
    jw_key(w, "summary");
    report_summary_json(w, s);
    jw_key(w, "whatif");
    report_whatif_json(w, s->job_id, wr);
    jw_key(w, "critpath");
    report_critpath_json(w, s->job_id, cp);
    jw_obj_end(w);
}
