/* summary.c: a job in a few numbers (summary.h), read with a handful of
 * queries over step_stats, step_idle, plan, losses, each rank's latest OPT event and,
 * when asked, all events. */
#include "db/summary.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/alive.h"
#include "db/bounds.h"
#include "db/durations.h"

static int prepare(sqlite3 *db, const char *sql, int64_t job, sqlite3_stmt **st, pp_err *err) {
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(*st, 1, job);
    return 0;
}

/* Ends a statement's loop: 0 when it ran to the end, else -1 naming why. */
static int finish(sqlite3 *db, sqlite3_stmt *st, int rc, pp_err *err) {
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : pp_fail(err, "database error: %s", sqlite3_errmsg(db));
}

double summary_sim_bubble(int64_t busy, int64_t makespan) {
    return makespan > 0 ? 1.0 - (double)busy / (double)makespan : 0;
}

int summary_plan(sqlite3 *db, int64_t job, int world, int64_t *busy, int64_t *peak, int64_t *makespan,
                 void (*row)(void *ctx, sqlite3_stmt *st), void *ctx, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db,
                "SELECT rank, slot, action, stage, phase, microbatch, sim_start_ns AS sim_start, "
                "sim_end_ns AS sim_end FROM plan WHERE job_id=?1 ORDER BY rank, slot",
                job, &st, err) != 0)
        return -1;
    int64_t lo = INT64_MAX, hi = INT64_MIN, inflight = 0, prev_s = 0, prev_e = 0;
    int simulated = 1, n = 0, rc, last_rank = -1;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        /* row shows each action's stage and microbatch as the file has them */
        int64_t shown = 0;
        if (row && (bounds_col(st, 3, &bounds_stage, job, "plan.stage", &shown, err) != 0 ||
                    bounds_col(st, 5, &bounds_microbatch, job, "plan.microbatch", &shown, err) != 0)) {
            sqlite3_finalize(st);
            return -1;
        }
        if (row) row(ctx, st);
        n++;
        int rank = sqlite3_column_int(st, 0);
        const char *phase = (const char *)sqlite3_column_text(st, 4);
        if (rank != last_rank) last_rank = rank, inflight = 0, prev_s = prev_e = 0;
        if (rank >= 0 && rank < world && phase) {
            if (strcmp(phase, "F") == 0) inflight++;
            else if (strcmp(phase, "W") == 0 || strcmp(phase, "BW") == 0) inflight--; /* its activations go */
            if (inflight > peak[rank]) peak[rank] = inflight;
        }
        if (sqlite3_column_type(st, 6) == SQLITE_NULL || sqlite3_column_type(st, 7) == SQLITE_NULL) {
            simulated = 0;
            continue;
        }
        int64_t s = 0, e = 0;
        if (bounds_col(st, 6, &bounds_time, job, "plan.sim_start_ns", &s, err) != 0 ||
            bounds_col(st, 7, &bounds_time, job, "plan.sim_end_ns", &e, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        if (s < lo) lo = s;
        if (e > hi) hi = e;
        /* busy is the union of the rank's spans: the two halves of an
         * overlapped pair (sched.h) run at once, and only they overlap, next
         * to each other in slot order */
        int64_t both = (e < prev_e ? e : prev_e) - (s > prev_s ? s : prev_s);
        if (rank >= 0 && rank < world) busy[rank] += e - s - (both > 0 ? both : 0);
        prev_s = s, prev_e = e;
    }
    if (finish(db, st, rc, err) != 0) return -1;
    *makespan = simulated && n > 0 ? hi - lo : 0;
    return simulated && n > 0;
}

static int read_job(sqlite3 *db, job_summary *s, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db,
                "SELECT world_size, (SELECT min(step) FROM step_stats WHERE job_id=?1),"
                " (SELECT max(step) FROM step_stats WHERE job_id=?1), " SQL_JOB_STATUS("") " FROM jobs WHERE id=?1",
                s->job_id, &st, err) != 0)
        return -1;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE) pp_fail(err, "no job %lld in this database", (long long)s->job_id);
        else pp_fail(err, "database error: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    /* read wide, named as the file holds it (a forged 2^31 or 1e300, not an int it wrapped to), in the
     * words every reader uses (db/bounds.h) */
    int64_t world = 0, first = 0, last = 0; /* no steps yet: NULL, read as 0 */
    if (bounds_col(st, 0, &bounds_world, s->job_id, "jobs.world_size", &world, err) != 0 ||
        bounds_col(st, 1, &bounds_step, s->job_id, "step_stats.step", &first, err) != 0 ||
        bounds_col(st, 2, &bounds_step, s->job_id, "step_stats.step", &last, err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    const unsigned char *status = sqlite3_column_text(st, 3);
    snprintf(s->status, sizeof s->status, "%s", status ? (const char *)status : "");
    s->first_step = (int)first;
    s->from_step = (int)summary_from_step(first, last);
    sqlite3_finalize(st);
    s->world = (int)world;
    return 0;
}

/* Complete steps: count, median span, mean bubble ratio; then per rank. */
static int read_steps(sqlite3 *db, job_summary *s, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db,
                "SELECT c.start_ns, c.end_ns, c.bubble_ratio_mean, c.step FROM (" SQL_COMPLETE_STEPS("AND step>=?2")
                ") c ORDER BY c.step",
                s->job_id, &st, err) != 0)
        return -1;
    sqlite3_bind_int(st, 2, s->from_step);
    durations times = {0}, between = {0};
    double bubble = 0;
    int64_t prev_step = -2, prev_end = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t start = 0, end = 0, step = sqlite3_column_int64(st, 3);
        int bad = bounds_col(st, 0, &bounds_time, s->job_id, "step_totals.start_ns", &start, err) != 0 ||
                  bounds_col(st, 1, &bounds_time, s->job_id, "step_totals.end_ns", &end, err) != 0;
        /* the step before it complete too: the time between them */
        int oom = !bad && (durations_push(&times, end - start) != 0 ||
                           (step == prev_step + 1 && start >= prev_end && durations_push(&between, start - prev_end)));
        if (bad || oom) {
            sqlite3_finalize(st);
            free(times.v), free(between.v);
            return bad ? -1 : pp_fail(err, "out of memory");
        }
        bubble += sqlite3_column_double(st, 2);
        prev_step = step, prev_end = end;
    }
    s->steps = (int64_t)times.n;
    s->step_time_ns = durations_median(&times);
    s->between_ns = durations_median(&between);
    s->bubble_ratio = times.n ? bubble / (double)times.n : NAN;
    free(times.v), free(between.v);
    if (finish(db, st, rc, err) != 0) return -1;

    /* Per rank, summed here in the rows' key order (step, rank): GROUP BY
     * rank sorted them, 3.3 s of 5.1 million against 1.3 s for this pass */
    if (prepare(db, "SELECT rank, bubble_ratio, act_peak_bytes FROM step_stats WHERE job_id=?1 AND step>=?2", s->job_id,
                &st, err) != 0)
        return -1;
    sqlite3_bind_int(st, 2, s->from_step);
    int64_t *nsteps = calloc((size_t)s->world, sizeof *nsteps);
    if (!nsteps) {
        sqlite3_finalize(st);
        return pp_fail(err, "out of memory");
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = sqlite3_column_int(st, 0);
        int64_t act = 0;
        if (k < 0 || k >= s->world) continue;
        if (bounds_col(st, 2, &bounds_bytes, s->job_id, "step_stats.act_peak_bytes", &act, err)) {
            sqlite3_finalize(st);
            free(nsteps);
            return -1;
        }
        double ratio = sqlite3_column_double(st, 1);
        s->bubble_by_rank[k] = nsteps[k]++ ? s->bubble_by_rank[k] + ratio : ratio;
        if (act > s->act_peak_by_rank[k]) s->act_peak_by_rank[k] = act;
        if (act > s->act_peak) s->act_peak = act;
    }
    for (int k = 0; k < s->world; k++)
        if (nsteps[k]) s->bubble_by_rank[k] /= (double)nsteps[k];
    free(nsteps);
    return finish(db, st, rc, err);
}

/* Trace records each rank lost (ranks.dropped_events). */
static int read_dropped(sqlite3 *db, job_summary *s, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db, "SELECT rank, dropped_events FROM ranks WHERE job_id=?1 AND dropped_events != 0", s->job_id, &st,
                err) != 0)
        return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = sqlite3_column_int(st, 0);
        int64_t n = 0;
        if (k < 0 || k >= s->world) continue;
        if (bounds_col(st, 1, &bounds_count, s->job_id, "ranks.dropped_events", &n, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        s->dropped_by_rank[k] = n;
        s->dropped += n;
    }
    return finish(db, st, rc, err);
}

/* Weights, gradients and optimizer state do not change during a job: each
 * rank's latest OPT span tells them (walked back from its last run of host
 * spans, event_runs; a rank killed in its optimizer step still has the
 * step before). Then each rank's peak memory: that plus its activations at
 * peak. */
static int read_state(sqlite3 *db, job_summary *s, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db, "SELECT e.bytes FROM event_runs r CROSS JOIN events e ON e.id BETWEEN r.first_id AND r.last_id"
                    " WHERE r.job_id=?1 AND r.rank=?2 AND r.source='cpu' AND e.phase='OPT'"
                    " ORDER BY r.end_ns DESC, e.start_ns DESC LIMIT 1",
                s->job_id, &st, err) != 0)
        return -1;
    int rc = SQLITE_DONE;
    for (int k = 0; k < s->world && rc == SQLITE_DONE; k++) {
        sqlite3_bind_int(st, 2, k);
        if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            int64_t bytes = 0;
            if (bounds_col(st, 0, &bounds_bytes, s->job_id, "events.bytes", &bytes, err) != 0) {
                sqlite3_finalize(st);
                return -1;
            }
            if (bytes > 0) s->state_by_rank[k] = bytes; /* 0: the model reports none */
            rc = sqlite3_step(st);
        }
        sqlite3_reset(st);
    }
    for (int k = 0; k < s->world; k++) {
        if (s->state_by_rank[k] < 0) continue;
        int64_t held = s->state_by_rank[k] + (s->act_peak_by_rank[k] > 0 ? s->act_peak_by_rank[k] : 0);
        if (held > s->mem_peak) s->mem_peak = held, s->mem_peak_rank = k;
    }
    return finish(db, st, rc, err);
}

static int read_plan(sqlite3 *db, job_summary *s, pp_err *err) {
    int64_t *busy = calloc((size_t)s->world, sizeof *busy), makespan = 0;
    s->plan_peak_inflight = calloc((size_t)s->world, sizeof *s->plan_peak_inflight);
    if (!busy || !s->plan_peak_inflight) {
        free(busy);
        return pp_fail(err, "out of memory");
    }
    int simulated = summary_plan(db, s->job_id, s->world, busy, s->plan_peak_inflight, &makespan, NULL, NULL, err);
    if (simulated > 0) {
        double sum = 0;
        for (int k = 0; k < s->world; k++) sum += summary_sim_bubble(busy[k], makespan);
        s->sim_bubble_ratio = sum / s->world;
    }
    free(busy);
    if (simulated < 0) return -1;
    for (int k = 0; k < s->world; k++) s->has_plan |= s->plan_peak_inflight[k] > 0;
    if (!s->has_plan) {
        free(s->plan_peak_inflight);
        s->plan_peak_inflight = NULL;
    }
    return 0;
}

/* Idle time by cause, from step_idle_totals: a few rows a step at any
 * number of ranks (a file older than version 11 sums them when read, a
 * view: db_reader_init). Summed here, not by GROUP BY cause, which sorts
 * the rows. */
int summary_idle_by_cause(sqlite3 *db, int64_t job, int64_t first_step, int64_t last_step,
                          int64_t by_cause[CAUSE_COUNT], pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db, "SELECT cause, idle_ns FROM step_idle_totals WHERE job_id=?1 AND step BETWEEN ?2 AND ?3", job, &st,
                err) != 0)
        return -1;
    sqlite3_bind_int64(st, 2, first_step);
    sqlite3_bind_int64(st, 3, last_step < 0 ? INT64_MAX : last_step);
    /* each row's idle is a time, and so is their total over the causes
     * (summary_idle_total adds them without a check) */
    const char *column = "step_idle_totals.idle_ns";
    int64_t total = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = analyze_cause_of((const char *)sqlite3_column_text(st, 0));
        int64_t ns = 0;
        if (k < 0) continue;
        if (bounds_col(st, 1, &bounds_time, job, column, &ns, err) != 0 ||
            bounds_sum(&bounds_time, &total, ns, job, column, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        by_cause[k] += ns;
    }
    return finish(db, st, rc, err);
}

/* The loss of the latest step that has all its losses: of the last two
 * steps with any, the later of those with the most. A job stopped or
 * failed in its last step has part of that step's (a replica's, the
 * microbatches before the failure): its mean is no step's loss. Two
 * counts on the primary key, not a count of every step. `table`: losses
 * or eval_losses (an evaluation cut short the same way). */
#define SQL_LOSS_STEP(table)                                                                                           \
    "WITH last(step) AS (SELECT max(step) FROM " table " WHERE job_id=?1), two(step) AS (SELECT step FROM last "       \
    "UNION ALL SELECT max(step) FROM " table " WHERE job_id=?1 AND step < (SELECT step FROM last)) "                   \
    "SELECT step FROM two WHERE step IS NOT NULL "                                                                     \
    "ORDER BY (SELECT count(*) FROM " table " l WHERE l.job_id=?1 AND l.step=two.step) DESC, step DESC LIMIT 1"

/* The latest whole step's mean loss of `table` (sql: LATEST_LOSS_SQL):
 * its step into *step and, where it has one, its mean into *loss. A loss
 * that is not a number is a damaged file, named, not a mean of 0. */
#define LATEST_LOSS_SQL(table, mean)                                                                                   \
    "SELECT s.step, " mean ", (SELECT loss FROM " table " l WHERE l.job_id=?1 AND l.step=s.step AND "                  \
    "typeof(loss) NOT IN ('real', 'integer', 'null') LIMIT 1) FROM (" SQL_LOSS_STEP(table) ") s"

static int read_latest_loss(sqlite3 *db, const job_summary *s, const char *table, const char *sql, int64_t *step,
                            double *loss, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db, sql, s->job_id, &st, err) != 0) return -1;
    char col[64];
    snprintf(col, sizeof col, "%s.step", table);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (bounds_col(st, 0, &bounds_step, s->job_id, col, step, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        if (sqlite3_column_type(st, 2) != SQLITE_NULL) { /* the step's mean would take it for 0 */
            char shown[48]; /* as bounds_fail shows a value: the printer escapes it */
            snprintf(shown, sizeof shown, "%s", (const char *)sqlite3_column_text(st, 2));
            pp_fail(err,
                    "job %lld: %s.loss of step %lld holds %s, not a number: the database is damaged or was not "
                    "written by pprun",
                    (long long)s->job_id, table, (long long)*step, shown);
            sqlite3_finalize(st);
            return -1;
        }
        if (sqlite3_column_type(st, 1) != SQLITE_NULL) *loss = sqlite3_column_double(st, 1);
        rc = sqlite3_step(st);
    }
    return finish(db, st, rc, err);
}

/* The training loss, and the latest whole evaluation's (--eval-every, a
 * program's eval()) by the same rule: the validation loss a Megatron user
 * reads beside the training loss. */
static int read_loss(sqlite3 *db, job_summary *s, pp_err *err) {
    if (read_latest_loss(db, s, "losses", LATEST_LOSS_SQL("losses", SQL_STEP_MEAN_LOSS("s.step")), &s->loss_step,
                         &s->loss, err) != 0)
        return -1;
    return read_latest_loss(db, s, "eval_losses", LATEST_LOSS_SQL("eval_losses", SQL_STEP_EVAL_LOSS("s.step")),
                            &s->eval_step, &s->eval_loss, err);
}

/* Each op's duration from from_step on, host and GPU spans apart. */
static int read_ops(sqlite3 *db, job_summary *s, pp_err *err) {
    sqlite3_stmt *st;
    if (prepare(db,
                "SELECT source = 'gpu', phase, start_ns, end_ns FROM events WHERE job_id=?1 AND step>=?2 "
                "AND " DB_LATEST_ATTEMPT,
                s->job_id, &st, err) != 0)
        return -1;
    sqlite3_bind_int(st, 2, s->from_step);
    durations d[2][TRACE_PHASE_COUNT] = {{{0}}};
    int rc = SQLITE_DONE, oom = 0;
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int gpu = sqlite3_column_int(st, 0) != 0, ph = analyze_phase_of((const char *)sqlite3_column_text(st, 1));
        static const bounds_event_cols cols = {
            .rank = -1, .step = -1, .stage = -1, .microbatch = -1, .start = 2, .end = 3, .peer = -1, .bytes = -1};
        if (bounds_event_row(st, &cols, s->job_id, err) != 0) {
            rc = SQLITE_DONE;
            oom = -1;
            break;
        }
        int64_t ns = sqlite3_column_int64(st, 3) - sqlite3_column_int64(st, 2);
        if (ph < 0 || ph == TRACE_SPAN) continue; /* by name: summary_spans */
        summary_ops *o = &s->ops[gpu][ph];
        o->count++;
        if (bounds_sum(&bounds_time, &o->total_ns, ns, s->job_id, "events.end_ns - start_ns", err) != 0) {
            oom = -1;
            break;
        }
        if (ns > o->max_ns) o->max_ns = ns;
        oom = durations_push(&d[gpu][ph], ns) != 0;
    }
    for (int g = 0; g < 2; g++)
        for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++) {
            s->ops[g][ph].median_ns = durations_median(&d[g][ph]);
            free(d[g][ph].v);
        }
    if (oom) {
        sqlite3_finalize(st);
        return oom < 0 ? -1 : pp_fail(err, "out of memory");
    }
    return finish(db, st, rc, err);
}

static int by_total(const void *a, const void *b) {
    const summary_span *x = a, *y = b;
    if (x->total_ns != y->total_ns) return x->total_ns > y->total_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A span's start_ns and end_ns at columns 1 and 2 (summary_spans,
 * replica_sums), for their bounds. */
static const bounds_event_cols span_cols = {
    .rank = -1, .step = -1, .stage = -1, .microbatch = -1, .start = 1, .end = 2, .peer = -1, .bytes = -1};

int summary_spans(sqlite3 *db, int64_t job, int64_t from_step, summary_span **out, size_t *n_out, pp_err *err) {
    *out = NULL;
    *n_out = 0;
    sqlite3_stmt *st;
    if (prepare(db,
                "SELECT coalesce(name, ''), start_ns, end_ns FROM events WHERE job_id=?1 AND step>=?2"
                " AND phase='SPAN' AND source='cpu' AND " DB_LATEST_ATTEMPT " ORDER BY 1",
                job, &st, err) != 0)
        return -1;
    sqlite3_bind_int64(st, 2, from_step);
    summary_span *v = NULL;
    size_t n = 0, cap = 0;
    durations d = {0};
    int rc, oom = 0; /* -1: err is filled */
    for (;;) {
        rc = sqlite3_step(st);
        const char *name = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
        if (n > 0 && (!name || strncmp(name, v[n - 1].name, sizeof v[n - 1].name - 1) != 0)) {
            v[n - 1].median_ns = durations_median(&d); /* the name before is whole */
            d.n = 0;
        }
        if (rc != SQLITE_ROW) break;
        if (n == 0 || strncmp(name, v[n - 1].name, sizeof v[n - 1].name - 1) != 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                summary_span *grown = realloc(v, cap * sizeof *grown);
                if (!grown) {
                    oom = 1;
                    break;
                }
                v = grown;
            }
            summary_span *s = &v[n++];
            memset(s, 0, sizeof *s);
            snprintf(s->name, sizeof s->name, "%s", name);
        }
        summary_span *s = &v[n - 1];
        if (bounds_event_row(st, &span_cols, job, err) != 0) {
            oom = -1;
            break;
        }
        int64_t ns = sqlite3_column_int64(st, 2) - sqlite3_column_int64(st, 1);
        s->count++;
        if (bounds_sum(&bounds_time, &s->total_ns, ns, job, "events.end_ns - start_ns", err) != 0) {
            oom = -1;
            break;
        }
        if (ns > s->max_ns) s->max_ns = ns;
        if ((oom = durations_push(&d, ns) != 0)) break;
    }
    free(d.v);
    if (oom) {
        free(v);
        sqlite3_finalize(st);
        return oom < 0 ? -1 : pp_fail(err, "out of memory");
    }
    if (finish(db, st, rc, err) != 0) {
        free(v);
        return -1;
    }
    if (n) qsort(v, n, sizeof *v, by_total);
    *out = v;
    *n_out = n;
    return 0;
}

/* Adds each rank's time of `sql` into its replica's wait_dp_ns (allreduce
 * 0: rows of rank, step_idle.idle_ns) or allreduce_ns (rows of rank, an
 * events span's start_ns and end_ns); ?1 the job, ?2 from_step. Summed
 * here, not by sum() in SQL: see bounds_sum. */
static int replica_sums(sqlite3 *db, job_summary *s, const char *sql, int allreduce, pp_err *err) {
    const char *column = allreduce ? "events.end_ns - start_ns" : "step_idle.idle_ns";
    sqlite3_stmt *st;
    if (prepare(db, sql, s->job_id, &st, err) != 0) return -1;
    sqlite3_bind_int(st, 2, s->from_step);
    int rc, per = s->world / s->nreplicas;
    int64_t total = 0; /* over the replicas, which whatif adds up */
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t rank = sqlite3_column_int64(st, 0), ns = 0;
        if (rank < 0 || rank >= s->world) continue;
        int bad = allreduce ? bounds_event_row(st, &span_cols, s->job_id, err)
                            : bounds_col(st, 1, &bounds_time, s->job_id, column, &ns, err);
        if (!bad && allreduce) ns = sqlite3_column_int64(st, 2) - sqlite3_column_int64(st, 1);
        if (bad || bounds_sum(&bounds_time, &total, ns, s->job_id, column, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        summary_replica *r = &s->replicas[rank / per];
        *(allreduce ? &r->allreduce_ns : &r->wait_dp_ns) += ns;
    }
    return finish(db, st, rc, err);
}

/* One stage more into h, FNV-1a over a rank's stages in order: a stage
 * set's fingerprint for summary_dp. */
static uint64_t stage_set_hash(uint64_t h, int64_t stage) {
    for (int b = 0; b < 8; b++)
        h = (h ^ (uint64_t)((stage >> (8 * b)) & 0xff)) * 1099511628211ull;
    return h;
}

int summary_dp(sqlite3 *db, int64_t job, int world, int *dp, int *unlaid, pp_err *err) {
    sqlite3_stmt *st;
    *dp = 1, *unlaid = 0;
    if (prepare(db, "SELECT json_extract(config_json, '$.dp') FROM jobs WHERE id=?1", job, &st, err) != 0) return -1;
    /* a whole number, of pipelines the world splits into: else (an edited
     * file: "2", 2.5, 2^32 + 2) one pipeline */
    int64_t d = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_INTEGER
                    ? sqlite3_column_int64(st, 0)
                    : 1;
    sqlite3_finalize(st);
    if (d <= 1 || d > world || world % d != 0) return 0;
    /* pprun lays replica r out on ranks r*P .. r*P + P-1 (P = world / d):
     * rank k holds what every rank of its place k % P holds. A program's
     * plan laid out otherwise (one pipeline of every rank under --dp 2:
     * stage 2 on rank 2, where rank 0 holds stage 0) would make up
     * replicas, and stage ranks past the world, so it is one pipeline
     * (docs/torch.md). Ranks that declared no plan (yet: one arrives a
     * rank at a time; or ever) tell nothing. */
    int per = world / (int)d, rc, last = -1, mismatch = 0;
    uint64_t *seen = calloc((size_t)per, sizeof *seen), h = 0;
    if (!seen) return pp_fail(err, "out of memory");
    if (prepare(db, "SELECT DISTINCT rank, stage FROM plan WHERE job_id=?1 AND rank >= 0 AND rank < ?2 ORDER BY 1, 2",
                job, &st, err) != 0) {
        free(seen);
        return -1;
    }
    sqlite3_bind_int(st, 2, world);
    for (;;) {
        rc = sqlite3_step(st);
        int rank = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
        if (rank != last && last >= 0) { /* last's stages are all in h */
            uint64_t *place = &seen[last % per];
            if (!h) h = 1;
            if (!*place)
                *place = h;
            else
                mismatch |= *place != h;
        }
        if (rc != SQLITE_ROW) break;
        if (rank != last) h = 14695981039346656037ull, last = rank;
        h = stage_set_hash(h, sqlite3_column_int64(st, 1));
    }
    free(seen);
    if (rc == SQLITE_DONE) *(mismatch ? unlaid : dp) = (int)d;
    return finish(db, st, rc, err);
}

/* The job's replicas (--dp, as summary_dp takes it): each one's bubble from
 * bubble_by_rank, its wait for the all-reduce and the all-reduce's time.
 * Global rank r is replica r / P (docs/cli.md, "Data parallel"). */
static int read_replicas(sqlite3 *db, job_summary *s, pp_err *err) {
    if (summary_dp(db, s->job_id, s->world, &s->nreplicas, &s->dp_unlaid, err) != 0) return -1;
    if (s->nreplicas <= 1) return 0;
    if (!(s->replicas = calloc((size_t)s->nreplicas, sizeof *s->replicas))) return pp_fail(err, "out of memory");
    int per = s->world / s->nreplicas;
    for (int d = 0; d < s->nreplicas; d++) {
        summary_replica *r = &s->replicas[d];
        r->first_rank = d * per, r->ranks = per;
        double sum = 0;
        int n = 0;
        for (int k = r->first_rank; k < r->first_rank + per; k++)
            if (!isnan(s->bubble_by_rank[k])) sum += s->bubble_by_rank[k], n++;
        r->bubble_ratio = n ? sum / n : NAN;
    }
    return replica_sums(db, s, SQL_WAIT_DP_ROWS, 0, err) != 0 ||
                   replica_sums(db, s,
                                "SELECT rank, start_ns, end_ns FROM events WHERE job_id=?1 AND step>=?2 AND"
                                " source='cpu' AND phase='SPAN' AND name IN "
                                "('ALLREDUCE','REDUCE_SCATTER','ALL_GATHER') AND " DB_LATEST_ATTEMPT,
                                1, err) != 0
               ? -1
               : 0;
}

int summary_read(sqlite3 *db, int64_t job, int flags, job_summary *s, pp_err *err) {
    memset(s, 0, sizeof *s);
    s->job_id = job;
    s->step_time_ns = s->between_ns = s->loss_step = s->eval_step = s->act_peak = s->mem_peak = -1;
    s->mem_peak_rank = -1;
    s->bubble_ratio = s->sim_bubble_ratio = s->loss = s->eval_loss = NAN;
    for (int g = 0; g < 2; g++)
        for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++) s->ops[g][ph].median_ns = s->ops[g][ph].max_ns = -1;
    if (read_job(db, s, err) != 0) return -1;
    if (!(s->bubble_by_rank = malloc((size_t)s->world * sizeof *s->bubble_by_rank))) return pp_fail(err, "out of memory");
    if (!(s->act_peak_by_rank = malloc((size_t)s->world * sizeof *s->act_peak_by_rank)) ||
        !(s->state_by_rank = malloc((size_t)s->world * sizeof *s->state_by_rank)) ||
        !(s->dropped_by_rank = calloc((size_t)s->world, sizeof *s->dropped_by_rank)))
        return pp_fail(err, "out of memory");
    for (int k = 0; k < s->world; k++) s->bubble_by_rank[k] = NAN, s->act_peak_by_rank[k] = s->state_by_rank[k] = -1;
    if (read_steps(db, s, err) != 0 || read_state(db, s, err) != 0 || read_dropped(db, s, err) != 0 ||
        read_plan(db, s, err) != 0 ||
        (!(flags & SUMMARY_NO_IDLE) &&
         summary_idle_by_cause(db, s->job_id, s->from_step, -1, s->idle_ns_by_cause, err) != 0) || read_loss(db, s, err) != 0)
        return -1;
    if (read_replicas(db, s, err) != 0) return -1;
    s->has_ops = (flags & SUMMARY_OPS) != 0;
    if (!s->has_ops) return 0;
    return read_ops(db, s, err) != 0 ? -1 : summary_spans(db, s->job_id, s->from_step, &s->spans, &s->nspans, err);
}

int64_t summary_idle_total(const job_summary *s) {
    int64_t t = 0;
    for (int k = 0; k < CAUSE_COUNT; k++) t += s->idle_ns_by_cause[k];
    return t;
}

int summary_has_ops(const job_summary *s, int gpu) {
    for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++)
        if (s->ops[gpu][ph].count > 0) return 1;
    return 0;
}

void summary_free(job_summary *s) {
    free(s->bubble_by_rank);
    free(s->act_peak_by_rank);
    free(s->state_by_rank);
    free(s->dropped_by_rank);
    free(s->plan_peak_inflight);
    free(s->spans);
    free(s->replicas);
    s->replicas = NULL;
    s->spans = NULL;
    s->nspans = 0;
    s->bubble_by_rank = NULL;
    s->act_peak_by_rank = s->state_by_rank = s->dropped_by_rank = s->plan_peak_inflight = NULL;
}
