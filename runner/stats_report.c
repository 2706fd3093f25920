/* stats_report.c: a job's summary as text (stats_report.h). Durations pick
 * their unit (ns, us, ms, s) and sizes theirs (B, KiB, MiB, GiB) so that
 * columns stay short; percentages have one decimal. */
#include "runner/stats_report.h"

#include <math.h>

/* "812 ns", "3.40 us", "245.1 ms", "1.204 s" into buf. */
static const char *fmt_ns(char *buf, size_t n, double ns) {
    if (ns < 0 || !isfinite(ns)) snprintf(buf, n, "-");
    else if (ns < 1e3) snprintf(buf, n, "%.0f ns", ns);
    else if (ns < 1e6) snprintf(buf, n, "%.2f us", ns / 1e3);
    else if (ns < 1e9) snprintf(buf, n, "%.2f ms", ns / 1e6);
    else snprintf(buf, n, "%.3f s", ns / 1e9);
    return buf;
}

/* "512 B", "768 KiB", "1.5 MiB", "12 GiB" into buf: one decimal below 100
 * units unless the value is whole. */
static const char *fmt_bytes(char *buf, size_t n, int64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0 || v >= 100 || v == (double)(int64_t)v) snprintf(buf, n, "%.0f %s", v, units[u]);
    else snprintf(buf, n, "%.1f %s", v, units[u]);
    return buf;
}

static const char *fmt_pct(char *buf, size_t n, double ratio) {
    if (isfinite(ratio)) snprintf(buf, n, "%.1f%%", 100 * ratio);
    else snprintf(buf, n, "-");
    return buf;
}

static int64_t idle_total(const job_summary *s) {
    int64_t t = 0;
    for (int k = 0; k < CAUSE_COUNT; k++) t += s->idle_ns_by_cause[k];
    return t;
}

/* The cause with the most idle time, or -1 when there is none. */
static int top_cause(const job_summary *s, const int *done) {
    int best = -1;
    for (int k = 0; k < CAUSE_COUNT; k++)
        if (!(done && done[k]) && s->idle_ns_by_cause[k] > 0 &&
            (best < 0 || s->idle_ns_by_cause[k] > s->idle_ns_by_cause[best]))
            best = k;
    return best;
}

static void job_line(FILE *out, sqlite3 *db, const job_summary *s) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, schedule, microbatches, model, device, exit_code FROM jobs WHERE id=?1", -1,
                           &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, s->job_id);
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *t[5];
        for (int c = 0; c < 5; c++) {
            const unsigned char *v = sqlite3_column_text(st, c);
            t[c] = v ? (const char *)v : "?";
        }
        fprintf(out, "job %lld  %s  %s  %d ranks  %s microbatches  model %s  device %s  %s", (long long)s->job_id, t[0],
                t[1], s->world, t[2], t[3], t[4], s->status);
        if (sqlite3_column_type(st, 5) != SQLITE_NULL) fprintf(out, " (exit %d)", sqlite3_column_int(st, 5));
        fputc('\n', out);
    }
    sqlite3_finalize(st);
}

static void ops_table(FILE *out, const job_summary *s, int gpu) {
    int any = 0;
    for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++) any |= s->ops[gpu][ph].count > 0;
    if (!any) return;
    fprintf(out, "%-17s %8s %10s %10s %10s %10s\n", gpu ? "ops (GPU spans)" : "ops (host spans)", "count", "median",
            "mean", "max", "total");
    for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++) {
        const summary_ops *o = &s->ops[gpu][ph];
        if (!o->count) continue;
        char med[24], mean[24], max[24], total[24];
        fprintf(out, "  %-15s %8lld %10s %10s %10s %10s\n", trace_phase_name(ph), (long long)o->count,
                fmt_ns(med, sizeof med, (double)o->median_ns),
                fmt_ns(mean, sizeof mean, (double)o->total_ns / (double)o->count),
                fmt_ns(max, sizeof max, (double)o->max_ns), fmt_ns(total, sizeof total, (double)o->total_ns));
    }
}

void report_full(FILE *out, sqlite3 *db, const job_summary *s) {
    char a[24], b[24];
    job_line(out, db, s);
    if (!s->steps) fprintf(out, "steps      none complete yet\n");
    else
        fprintf(out, "steps      %lld complete from step %d%s\n", (long long)s->steps, s->from_step,
                s->from_step ? " (step 0 pays for start-up)" : "");
    fprintf(out, "step time  %s (median)\n", fmt_ns(a, sizeof a, (double)s->step_time_ns));
    fprintf(out, "bubble     %s measured, %s planned\n", fmt_pct(a, sizeof a, s->bubble_ratio),
            fmt_pct(b, sizeof b, s->sim_bubble_ratio));
    fprintf(out, "  by rank");
    for (int k = 0; k < s->world; k++) fprintf(out, "  %d: %s", k, fmt_pct(a, sizeof a, s->bubble_by_rank[k]));
    fputc('\n', out);

    /* Activation memory: measured held bytes, and the plan's microbatches
     * in flight (the schedule's promise, in microbatch-stage units). */
    int recorded = 0;
    for (int k = 0; k < s->world; k++) recorded |= s->act_peak_by_rank[k] > 0;
    fprintf(out, "memory     activations held at peak");
    if (!recorded) fprintf(out, ": not recorded");
    for (int k = 0; recorded && k < s->world; k++)
        fprintf(out, "  %d: %s", k, s->act_peak_by_rank[k] < 0 ? "-" : fmt_bytes(a, sizeof a, s->act_peak_by_rank[k]));
    fprintf(out, "\n  planned  microbatch-stages in flight at most");
    if (!s->has_plan) fprintf(out, ": no plan stored");
    for (int k = 0; s->has_plan && k < s->world; k++) fprintf(out, "  %d: %lld", k, (long long)s->plan_peak_inflight[k]);
    fputc('\n', out);

    int64_t idle = idle_total(s);
    if (idle > 0) {
        fprintf(out, "idle time by cause, from step %d, all ranks\n", s->from_step);
        int done[CAUSE_COUNT] = {0}, k;
        while ((k = top_cause(s, done)) >= 0) { /* the largest first */
            fprintf(out, "  %-17s %10s %6s\n", analyze_causes[k], fmt_ns(a, sizeof a, (double)s->idle_ns_by_cause[k]),
                    fmt_pct(b, sizeof b, (double)s->idle_ns_by_cause[k] / (double)idle));
            done[k] = 1;
        }
    }
    if (s->has_ops) {
        ops_table(out, s, 0);
        ops_table(out, s, 1);
    }
    if (s->loss_step < 0) fprintf(out, "loss       none yet\n");
    else if (isnan(s->loss)) fprintf(out, "loss       not finite at step %lld\n", (long long)s->loss_step);
    else fprintf(out, "loss       %.4f (mean of step %lld)\n", s->loss, (long long)s->loss_step);
}

void report_whatif(FILE *out, const whatif_report *r) {
    char a[24], b[24], c[24], d[24];
    if (!r->measured) {
        fprintf(out, "what if    nothing to simulate yet: no complete step with F, B and W spans\n");
        return;
    }
    fprintf(out, "what if    each schedule at this job's costs, simulated: F %s, B %s, W %s, send %s per op\n",
            fmt_ns(a, sizeof a, r->in.costs.f), fmt_ns(b, sizeof b, r->in.costs.b), fmt_ns(c, sizeof c, r->in.costs.w),
            fmt_ns(d, sizeof d, r->in.costs.comm));
    fprintf(out, "  (medians of %s spans, steps %d-%d; * = this job's schedule)\n", r->gpu ? "GPU" : "host",
            r->first_step, r->last_step);
    double own = NAN;
    for (int k = 0; k < r->nrows; k++)
        if (r->rows[k].this_job && !r->rows[k].error[0]) own = r->rows[k].step_time_ns;
    fprintf(out, "  %-18s %6s %10s %7s %8s %11s %9s\n", "schedule", "chunks", "step time", "bubble", "vs this",
            "activations", "in flight");
    for (int k = 0; k < r->nrows; k++) {
        const whatif_row *w = &r->rows[k];
        char name[sizeof w->schedule + 8];
        snprintf(name, sizeof name, "%s%s", w->schedule, w->this_job ? " *" : w->tuned ? " tuned" : "");
        if (w->error[0]) {
            fprintf(out, "  %-18s %6d  %s\n", name, w->virtual_stages, w->error);
            continue;
        }
        if (isfinite(own) && own > 0) snprintf(c, sizeof c, "%.2fx", w->step_time_ns / own);
        else snprintf(c, sizeof c, "-");
        if (w->act_peak_bytes >= 0) fmt_bytes(d, sizeof d, w->act_peak_bytes);
        else snprintf(d, sizeof d, "-");
        fprintf(out, "  %-18s %6d %10s %7s %8s %11s %9d\n", name, w->virtual_stages,
                fmt_ns(a, sizeof a, w->step_time_ns), fmt_pct(b, sizeof b, w->bubble_ratio), c, d, w->peak_inflight);
    }
    char flag[160];
    whatif_tuned_flag(&r->in, flag, sizeof flag);
    fprintf(out, "  (zb-v tuned: its order built for these costs; run it with --schedule zb-v --schedule-costs %s)\n",
            flag);
}

void report_brief(FILE *out, const char *prefix, const job_summary *s, const char *db_path) {
    if (!s->steps) return;
    char t[24], m[24], p[24];
    fprintf(out, "%s: job %lld: median step %s; bubble %s measured, %s planned", prefix, (long long)s->job_id,
            fmt_ns(t, sizeof t, (double)s->step_time_ns), fmt_pct(m, sizeof m, s->bubble_ratio),
            fmt_pct(p, sizeof p, s->sim_bubble_ratio));
    int k = top_cause(s, NULL);
    if (k >= 0)
        fprintf(out, "; idle mostly %s (%s)", analyze_causes[k],
                fmt_pct(t, sizeof t, (double)s->idle_ns_by_cause[k] / (double)idle_total(s)));
    fprintf(out, "\n%s: more: pprun stats --db %s --job %lld\n", prefix, db_path, (long long)s->job_id);
}
