/* text.c: a job's analyses as text (text.h). Durations pick
 * their unit (ns, us, ms, s) and sizes theirs (B, KiB, MiB, GiB) so that
 * columns stay short; percentages have one decimal. */
#include "report/text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/term.h"
#include "db/alive.h"

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
 * units unless it would be .0 ("16 KiB" for 16.02 KiB, as for 16). */
static const char *fmt_bytes(char *buf, size_t n, int64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0 || v >= 100 || fmod(round(v * 10), 10) == 0) snprintf(buf, n, "%.0f %s", v, units[u]);
    else snprintf(buf, n, "%.1f %s", v, units[u]);
    return buf;
}

static const char *fmt_pct(char *buf, size_t n, double ratio) {
    if (isfinite(ratio)) snprintf(buf, n, "%.1f%%", 100 * ratio);
    else snprintf(buf, n, "-");
    return buf;
}

/* A figure per rank on one line: every rank's, "  0: 19.7%  1: 20.1%" (a
 * rank without one, v < 0 or NAN: "-"); past RANKS_LISTED ranks the least,
 * the median and the most, each of its rank (a 1,024-rank job's lines
 * were 12 to 14 KB each; every rank's is a query of step_stats or ranks
 * away). fmt writes one value. */
#define RANKS_LISTED 16
typedef const char *rank_fmt(char *buf, size_t n, double v);
static const char *fmt_ratio(char *buf, size_t n, double v) { return fmt_pct(buf, n, v); }
static const char *fmt_size(char *buf, size_t n, double v) { return fmt_bytes(buf, n, (int64_t)v); }
static const char *fmt_count(char *buf, size_t n, double v) {
    snprintf(buf, n, "%.0f", v);
    return buf;
}

static const double *by_value; /* per_rank's values, for cmp_rank (the report runs on one thread) */
static int cmp_rank(const void *a, const void *b) {
    double x = by_value[*(const int *)a], y = by_value[*(const int *)b];
    return (x > y) - (x < y);
}

/* Who a figure is of, in spread()'s line: "rank 5", "replica 79, ranks 632-639". */
typedef const char *item_label(char *buf, size_t n, int k, const void *ctx);
static const char *label_rank(char *buf, size_t n, int k, const void *ctx) {
    (void)ctx;
    snprintf(buf, n, "rank %d", k);
    return buf;
}
static const char *label_replica(char *buf, size_t n, int k, const void *ctx) {
    const summary_replica *r = &((const summary_replica *)ctx)[k];
    if (r->ranks == 1)
        snprintf(buf, n, "replica %d, rank %d", k, r->first_rank);
    else
        snprintf(buf, n, "replica %d, ranks %d-%d", k, r->first_rank, r->first_rank + r->ranks - 1);
    return buf;
}

/* "  least 18.1% (rank 637), median 37.0%, most 37.0% (rank 1016) of 1024
 * ranks" over the n items of v that have a figure (v >= 0); the median of
 * an even count the middle two's mean, as every median pprun reports. */
static void spread(FILE *out, int n_items, const double *v, rank_fmt *fmt, item_label *label, const void *ctx,
                   const char *plural) {
    char a[24], b[24], c[24], la[64], lc[64];
    int *item = malloc(sizeof *item * (size_t)(n_items > 0 ? n_items : 1)), n = 0;
    if (!item) {
        fprintf(out, ": (out of memory)");
        return;
    }
    for (int k = 0; k < n_items; k++)
        if (isfinite(v[k]) && v[k] >= 0) item[n++] = k;
    by_value = v;
    qsort(item, (size_t)n, sizeof *item, cmp_rank);
    if (n == 0)
        fprintf(out, ": none of %d %s", n_items, plural);
    else
        fprintf(out, "  least %s (%s), median %s, most %s (%s) of %d %s", fmt(a, sizeof a, v[item[0]]),
                label(la, sizeof la, item[0], ctx),
                fmt(b, sizeof b, n % 2 ? v[item[n / 2]] : (v[item[n / 2 - 1]] + v[item[n / 2]]) / 2),
                fmt(c, sizeof c, v[item[n - 1]]), label(lc, sizeof lc, item[n - 1], ctx), n, plural);
    if (n > 0 && n < n_items) fprintf(out, " (%d without)", n_items - n);
    free(item);
}

static void per_rank(FILE *out, int world, const double *v, rank_fmt *fmt) {
    char a[24];
    if (world > RANKS_LISTED) {
        spread(out, world, v, fmt, label_rank, NULL, "ranks");
        return;
    }
    for (int k = 0; k < world; k++)
        fprintf(out, "  %d: %s", k, v[k] >= 0 ? fmt(a, sizeof a, v[k]) : "-");
}

/* An int64_t figure per rank as per_rank takes it (allocated, NULL when out of memory). */
static double *as_doubles(const int64_t *v, int world) {
    double *d = malloc(sizeof *d * (size_t)(world > 0 ? world : 1));
    for (int k = 0; d && k < world; k++) d[k] = (double)v[k];
    return d;
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

void report_job_line(FILE *out, sqlite3 *db, const job_summary *s) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, schedule, microbatches, model, device, exit_code, " SQL_JOB_FAILURE("")
                           " FROM jobs WHERE id=?1",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, s->job_id);
    if (sqlite3_step(st) == SQLITE_ROW) {
        /* each stored value escaped as one, whole (term_dup without
         * TERM_LINES): a newline in a name, an argument or a rank's last
         * line cannot forge a line of this report */
        char *t[7]; /* columns 0-4 (name .. device), the status in place of 5 (the exit code), 6 the failure */
        for (int c = 0; c < 7; c++) {
            const char *v = c == 5 ? s->status : (const char *)sqlite3_column_text(st, c);
            t[c] = v ? term_dup(v, strlen(v), 0) : NULL;
        }
        fprintf(out, "job %lld  %s  %s  %d ranks  %s microbatches  model %s  device %s  %s", (long long)s->job_id,
                t[0] ? t[0] : "?", t[1] ? t[1] : "?", s->world, t[2] ? t[2] : "?", t[3] ? t[3] : "?",
                t[4] ? t[4] : "?", t[5] ? t[5] : "?");
        if (sqlite3_column_type(st, 5) != SQLITE_NULL) fprintf(out, " (exit %d)", sqlite3_column_int(st, 5));
        fputc('\n', out);
        if (t[6]) fprintf(out, "failure    %s\n", t[6]);
        for (int c = 0; c < 7; c++) free(t[c]);
    }
    sqlite3_finalize(st);
    /* Trace records the ranks lost: the figures below miss them, which the
     * job's status alone does not say (pprun.torch stops tracing at the
     * first refused record, docs/torch.md). */
    if (s->dropped > 0) {
        fprintf(out, "dropped    %lld trace records lost (by rank ", (long long)s->dropped);
        for (int k = 0, first = 1; k < s->world; k++)
            if (s->dropped_by_rank[k]) {
                fprintf(out, "%s%d: %lld", first ? "" : ", ", k, (long long)s->dropped_by_rank[k]);
                first = 0;
            }
        fprintf(out, "): the figures below miss them\n");
    }
}

static void ops_table(FILE *out, const job_summary *s, int gpu) {
    if (!summary_has_ops(s, gpu)) return;
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

/* The program's own spans (pprun.span) by name, most time first. */
static void spans_table(FILE *out, const job_summary *s) {
    if (!s->nspans) return;
    fprintf(out, "%-17s %8s %10s %10s %10s %10s\n", "time by span name", "count", "median", "mean", "max", "total");
    for (size_t i = 0; i < s->nspans; i++) {
        const summary_span *o = &s->spans[i];
        char med[24], mean[24], max[24], total[24], name[61]; /* 60 bytes at most, cut at a character */
        fprintf(out, "  %-15s %8lld %10s %10s %10s %10s\n", term_value(o->name[0] ? o->name : "(no name)", name, sizeof name),
                (long long)o->count, fmt_ns(med, sizeof med, (double)o->median_ns),
                fmt_ns(mean, sizeof mean, (double)o->total_ns / (double)o->count),
                fmt_ns(max, sizeof max, (double)o->max_ns), fmt_ns(total, sizeof total, (double)o->total_ns));
    }
}

/* Why a job run with --dp D shows one pipeline (summary.h, dp_unlaid). */
static const char *dp_unlaid_text(char *buf, size_t n, const job_summary *s) {
    int per = s->world / s->dp_unlaid;
    snprintf(buf, n,
             "--dp %d is not the program's layout (its pipelines of %d %s do not hold the same stages): one "
             "pipeline of %d ranks shown (docs/torch.md)",
             s->dp_unlaid, per, per == 1 ? "rank" : "consecutive ranks", s->world);
    return buf;
}

/* A replica's all-reduce and wait are its ranks' sums over the steps: a
 * rank's share a step is what reads beside a step time (the replica's
 * ranks all-reduce their stages at once). */
static double replica_per(const job_summary *s, const summary_replica *r) {
    return (s->steps > 0 ? (double)s->steps : 1) * (r->ranks > 0 ? r->ranks : 1);
}

/* Past RANKS_LISTED replicas (--dp 128: 128 lines), each figure's least,
 * median and most, each of its replica, as per_rank does for ranks. */
static void replicas_spread(FILE *out, const job_summary *s, int own_allreduce) {
    double *v = malloc(sizeof *v * (size_t)s->nreplicas);
    if (!v) {
        fprintf(out, "  by replica: (out of memory)");
        return;
    }
    /* a replica without a bubble figure (no step statistics, or a forged
     * one) has none on any line: its all-reduce and wait are no 0 ns */
#define REPLICA_FIGURE(d, x) (isfinite(s->replicas[d].bubble_ratio) ? (x) : -1)
    for (int d = 0; d < s->nreplicas; d++)
        v[d] = REPLICA_FIGURE(d, s->replicas[d].bubble_ratio);
    fprintf(out, "  by replica");
    spread(out, s->nreplicas, v, fmt_ratio, label_replica, s->replicas, "replicas");
    if (own_allreduce) {
        for (int d = 0; d < s->nreplicas; d++)
            v[d] = REPLICA_FIGURE(d, (double)s->replicas[d].allreduce_ns / replica_per(s, &s->replicas[d]));
        fprintf(out, "\n  all-reduce a rank a step, by replica");
        spread(out, s->nreplicas, v, fmt_ns, label_replica, s->replicas, "replicas");
        for (int d = 0; d < s->nreplicas; d++)
            v[d] = REPLICA_FIGURE(d, (double)s->replicas[d].wait_dp_ns / replica_per(s, &s->replicas[d]));
        fprintf(out, "\n  waited for it, by replica");
        spread(out, s->nreplicas, v, fmt_ns, label_replica, s->replicas, "replicas");
    }
#undef REPLICA_FIGURE
    free(v);
}

void report_full(FILE *out, sqlite3 *db, const job_summary *s) {
    char a[24], b[24];
    report_job_line(out, db, s);
    if (!s->steps) /* "yet" only while it may come: a job that ended ran none (an evaluation is no step) */
        fprintf(out, "steps      %s\n", strcmp(s->status, "running") == 0 ? "none complete yet" : "none complete");
    else {
        fprintf(out, "steps      %lld complete from step %d", (long long)s->steps, s->from_step);
        if (s->from_step > s->first_step) fprintf(out, " (step %d pays for start-up)", s->first_step);
        fputc('\n', out);
    }
    fprintf(out, "step time  %s (median)\n", fmt_ns(a, sizeof a, (double)s->step_time_ns));
    /* what a step's span leaves out: a program's data loading between its
     * schedule.step() calls makes the loop slower than its steps */
    if (s->between_ns >= 0)
        fprintf(out, "between    %s from a step's end to the next one's start (median: the program's time outside its "
                     "steps)\n", fmt_ns(a, sizeof a, (double)s->between_ns));
    fprintf(out, "bubble     %s measured, %s planned\n", fmt_pct(a, sizeof a, s->bubble_ratio),
            fmt_pct(b, sizeof b, s->sim_bubble_ratio));
    fprintf(out, "  by rank");
    per_rank(out, s->world, s->bubble_by_rank, fmt_ratio);
    fputc('\n', out);
    /* --dp: a line per pipeline; the all-reduce is pprun's own collective's
     * (a program's all-reduce is a span of its own, under "time by span name") */
    int own_allreduce = 0;
    for (int d = 0; s->replicas && d < s->nreplicas; d++) own_allreduce |= s->replicas[d].allreduce_ns > 0;
    if (s->dp_unlaid) {
        char why[200];
        fprintf(out, "  replicas %s\n", dp_unlaid_text(why, sizeof why, s));
    }
    if (s->replicas && s->nreplicas > RANKS_LISTED) {
        replicas_spread(out, s, own_allreduce);
        fputc('\n', out);
    }
    for (int d = 0; s->replicas && s->nreplicas <= RANKS_LISTED && d < s->nreplicas; d++) {
        const summary_replica *r = &s->replicas[d];
        char c[24];
        double per = replica_per(s, r);
        if (r->ranks == 1)
            fprintf(out, "  replica %d (rank %d): %s bubble", d, r->first_rank, fmt_pct(a, sizeof a, r->bubble_ratio));
        else
            fprintf(out, "  replica %d (ranks %d-%d): %s bubble", d, r->first_rank, r->first_rank + r->ranks - 1,
                    fmt_pct(a, sizeof a, r->bubble_ratio));
        if (own_allreduce)
            fprintf(out, ", all-reduce %s a rank a step, waited for it %s",
                    fmt_ns(b, sizeof b, (double)r->allreduce_ns / per),
                    fmt_ns(c, sizeof c, (double)r->wait_dp_ns / per));
        fputc('\n', out);
    }

    /* Activation memory: measured held bytes, and the plan's microbatches
     * in flight (the schedule's promise, in microbatch-stage units). */
    int recorded = 0;
    for (int k = 0; k < s->world; k++) recorded |= s->act_peak_by_rank[k] > 0;
    fprintf(out, "memory     activations held at peak");
    double *per = as_doubles(s->act_peak_by_rank, s->world);
    if (!recorded) fprintf(out, ": not recorded");
    else if (per) per_rank(out, s->world, per, fmt_size);
    free(per);
    int have_state = s->mem_peak >= 0;
    fprintf(out, "\n  state    weights, gradients, optimizer");
    per = as_doubles(s->state_by_rank, s->world);
    if (!have_state) fprintf(out, ": not recorded");
    else if (per) per_rank(out, s->world, per, fmt_size);
    free(per);
    if (have_state)
        fprintf(out, "\n  at peak  both, most on rank %d: %s", s->mem_peak_rank, fmt_bytes(a, sizeof a, s->mem_peak));
    fprintf(out, "\n  planned  microbatch-stages in flight at most");
    per = s->has_plan ? as_doubles(s->plan_peak_inflight, s->world) : NULL;
    if (!s->has_plan) fprintf(out, ": no plan stored");
    else if (per) per_rank(out, s->world, per, fmt_count);
    free(per);
    fputc('\n', out);

    int64_t idle = summary_idle_total(s);
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
        spans_table(out, s);
    }
    if (s->loss_step < 0) fprintf(out, "loss       none yet\n");
    else if (isnan(s->loss)) fprintf(out, "loss       not finite at step %lld\n", (long long)s->loss_step);
    else fprintf(out, "loss       %.4f (mean of step %lld)\n", s->loss, (long long)s->loss_step);
    if (s->eval_step >= 0 && isnan(s->eval_loss))
        fprintf(out, "eval loss  not finite after step %lld\n", (long long)s->eval_step);
    else if (s->eval_step >= 0)
        fprintf(out, "eval loss  %.4f (mean of the evaluation after step %lld)\n", s->eval_loss,
                (long long)s->eval_step);
}

/* "F 2.01 ms, B 2.10 ms, W 1.00 ms" into buf. */
static const char *fmt_fbw(char *buf, size_t n, const sched_costs *c) {
    char f[24], b[24], w[24];
    snprintf(buf, n, "F %s, B %s, W %s", fmt_ns(f, sizeof f, c->f), fmt_ns(b, sizeof b, c->b),
             fmt_ns(w, sizeof w, c->w));
    return buf;
}

/* The ranks that ran stage k (balance.h), as the stage table names them:
 * "3", or "0,4" for the same stage of two pipelines (--dp 2); past three,
 * the first two and the last, "0,4,..,28": the ranks of a stage are one
 * pipeline apart (docs/cli.md, "Rank layout"). */
static const char *fmt_stage_ranks(char *buf, size_t n, const balance_profile *bp, int k) {
    int d = balance_stage_ranks(bp);
    if (d == 1) snprintf(buf, n, "%d", bp->rank[k]);
    else if (d == 2) snprintf(buf, n, "%d,%d", bp->rank[k], balance_stage_rank(bp, k, 1));
    else if (d == 3)
        snprintf(buf, n, "%d,%d,%d", bp->rank[k], balance_stage_rank(bp, k, 1), balance_stage_rank(bp, k, 2));
    else snprintf(buf, n, "%d,%d,..,%d", bp->rank[k], balance_stage_rank(bp, k, 1), balance_stage_rank(bp, k, d - 1));
    return buf;
}

void report_balance(FILE *out, const whatif_report *r) {
    if (!r->measured || !r->has_profile) return;
    const balance_profile *bp = &r->profile;
    int S = bp->stages, shown[BALANCE_MAX_STAGES], n = 0;
    for (int k = 0; k < S; k++)
        if (balance_listed(bp, k)) shown[n++] = k;
    double mean = balance_mean_stage(bp);
    char slowest[40] = "";
    if (n < S) snprintf(slowest, sizeof slowest, " (the %d slowest stages)", n);
    fprintf(out, "stage balance  one microbatch's ops per stage, medians of %s spans, steps %d-%d%s\n",
            r->gpu ? "GPU" : "host", r->first_step, r->last_step, slowest);
    /* the column as wide as its widest name: "rank" for one pipeline, as before */
    const char *head = balance_stage_ranks(bp) > 1 ? "ranks" : "rank";
    int width = (int)strlen(head);
    char ranks[48];
    for (int i = 0; i < n; i++) {
        int len = (int)strlen(fmt_stage_ranks(ranks, sizeof ranks, bp, shown[i]));
        if (len > width) width = len;
    }
    fprintf(out, "  %-5s %*s %-9s %10s %10s %10s %10s %7s\n", "stage", width, head, "layers", "F", "B", "W", "F+B+W",
            "vs mean");
    for (int i = 0; i < n; i++) {
        const sched_costs *c = &bp->stage[shown[i]];
        double t = c->f + c->b + c->w;
        char layers[24], f[24], b[24], w[24], all[24];
        if (bp->layers_known)
            snprintf(layers, sizeof layers, "%d-%d", bp->bound[shown[i]], bp->bound[shown[i] + 1] - 1);
        else snprintf(layers, sizeof layers, "-");
        fprintf(out, "  %-5d %*s %-9s %10s %10s %10s %10s %6.2fx%s\n", shown[i], width,
                fmt_stage_ranks(ranks, sizeof ranks, bp, shown[i]), layers,
                fmt_ns(f, sizeof f, c->f), fmt_ns(b, sizeof b, c->b), fmt_ns(w, sizeof w, c->w),
                fmt_ns(all, sizeof all, t), mean > 0 ? t / mean : 0, t >= r->bottleneck_ns ? "  slowest" : "");
    }
    char a[24], b[24], c[80], d[80], e[80];
    if (isfinite(r->own_step_ns) && isfinite(r->equal_step_ns)) {
        if (r->own_step_ns > r->equal_step_ns)
            snprintf(c, sizeof c, "the unevenness costs %.1f%%",
                     100 * (r->own_step_ns - r->equal_step_ns) / r->own_step_ns);
        else snprintf(c, sizeof c, "even");
        fprintf(out, "  %s simulated: %s a step at these stage costs, %s with every stage at their mean (%s)\n",
                r->in.schedule, fmt_ns(a, sizeof a, r->own_step_ns), fmt_ns(b, sizeof b, r->equal_step_ns), c);
    }
    if (bp->layers_known)
        fprintf(out, "  one layer  %s; the first stage adds %s; the last adds %s\n",
                fmt_fbw(c, sizeof c, &bp->per_layer), fmt_fbw(d, sizeof d, &bp->first_adds),
                fmt_fbw(e, sizeof e, &bp->last_adds));
    if (r->ncuts > 0) {
        char cuts[BALANCE_MAX_STAGES * 6];
        sched_cuts_text(r->cuts, r->ncuts, cuts, sizeof cuts);
        fprintf(out,
                "  cuts       --pipeline-cuts %s: slowest stage %s instead of %s; %s simulated %s a step (%.2fx)\n",
                cuts, fmt_ns(a, sizeof a, r->cuts_bottleneck_ns), fmt_ns(b, sizeof b, r->bottleneck_ns), r->in.schedule,
                fmt_ns(c, sizeof c, r->cuts_step_ns), r->cuts_step_ns / r->own_step_ns);
    } else {
        fprintf(out, "  cuts       none suggested: %s\n", r->no_cuts);
    }
}

void report_critpath(FILE *out, const critpath_report *r) {
    static const char *const wait_labels[CRITPATH_WAITS] = {
        "hand-offs: an output crossing to another rank", "on a rank between its ops, sending or receiving",
        "on a rank between its ops, the rest", "the all-reduce: before an OPT, its own or another replica's backward"};
    if (!r->steps) return;
    const critpath_totals *t = &r->t;
    double steps = r->steps, span = (double)t->span_ns;
    char a[24], b[24], c[24], d[24], e[24], f[24], g[24];
    /* A BW column (PyTorch's full backward) only for a job that has one on
     * its path: a built-in job's table stays as it was. */
    int bw = 0;
    for (int k = 0; k < t->ranks; k++) bw |= t->op_ns[k][4] > 0;
    fprintf(out, "critical path  the ops each step waited on, steps %d-%d (%s a step, mean)\n", r->first_step,
            r->last_step, fmt_ns(a, sizeof a, span / steps));
    fprintf(out, "  %-4s %10s %10s %10s", "rank", "F", "B", "W");
    if (bw) fprintf(out, " %10s", "BW");
    fprintf(out, " %10s %10s %6s\n", "OPT", "all", "share");
    int64_t listed = 0;
    for (int k = 0; k < t->ranks; k++) {
        if (!critpath_listed(t, k)) continue;
        const int64_t *ns = t->op_ns[k];
        int64_t all = critpath_rank_ns(t, k);
        listed += all;
        fprintf(out, "  %-4d %10s %10s %10s", k, fmt_ns(a, sizeof a, ns[0] / steps), fmt_ns(b, sizeof b, ns[1] / steps),
                fmt_ns(c, sizeof c, ns[2] / steps));
        if (bw) fprintf(out, " %10s", fmt_ns(g, sizeof g, ns[4] / steps));
        fprintf(out, " %10s %10s %6s\n", fmt_ns(d, sizeof d, ns[3] / steps), fmt_ns(e, sizeof e, all / steps),
                fmt_pct(f, sizeof f, all / span));
    }
    int label = bw ? 59 : 48; /* the rows' labels end where "all" does */
    int64_t ops = 0;
    for (int k = 0; k < t->ranks; k++) ops += critpath_rank_ns(t, k);
    if (ops > listed)
        fprintf(out, "  %-*s %10s %6s\n", label, "the other ranks", fmt_ns(a, sizeof a, (ops - listed) / steps),
                fmt_pct(b, sizeof b, (ops - listed) / span));
    for (int k = 0; k < CRITPATH_WAITS; k++)
        if (k != CRITPATH_ALLREDUCE || t->wait_ns[k] > 0) /* a job without --dp: no such line */
            fprintf(out, "  %-*s %10s %6s\n", label, wait_labels[k], fmt_ns(a, sizeof a, t->wait_ns[k] / steps),
                    fmt_pct(b, sizeof b, t->wait_ns[k] / span));
    fprintf(out, "  (an op on this path done t sooner ends the step at most t sooner; an op off it, not at all)\n");
}

static void report_whatif_curve(FILE *out, const whatif_report *r);
static void report_whatif_dp(FILE *out, const whatif_report *r);

void report_whatif(FILE *out, const whatif_report *r) {
    char a[24], b[24], c[24], d[24];
    if (!r->measured) {
        fprintf(out, "what if    nothing to simulate yet: no complete step with F, B and W spans\n");
        return;
    }
    fprintf(out, "what if    each schedule at this job's costs, simulated: F %s, B %s, W %s, hand-off %s",
            fmt_ns(a, sizeof a, r->in.costs.f), fmt_ns(b, sizeof b, r->in.costs.b), fmt_ns(c, sizeof c, r->in.costs.w),
            fmt_ns(d, sizeof d, r->in.costs.comm));
    if (r->in.costs.bw > 0) fprintf(out, ", BW %s", fmt_ns(a, sizeof a, r->in.costs.bw));
    fprintf(out, ", between ops %s\n", fmt_ns(a, sizeof a, r->in.costs.between));
    fprintf(out, "  (medians of %s spans, hand-off and between ops their means, steps %d-%d%s; * = this job's "
                 "schedule)\n",
            r->gpu ? "GPU" : "host", r->first_step, r->last_step,
            r->has_profile && !r->in.fixed_op_costs ? "; each chunk at its layers' share of its stage's costs" : "");
    if (r->shared_ranks > 0) {
        char share[24];
        fprintf(out,
                "  (%d ranks shared %d core%s: %s of these ops' time was waiting for a core, taken out of the times "
                "above, and each schedule is simulated with a core per rank)\n",
                r->shared_ranks, r->shared_cores, r->shared_cores == 1 ? "" : "s",
                fmt_pct(share, sizeof share, r->wait_cpu_share));
    }
    if (r->shared_gpu_ranks > 0)
        fprintf(out,
                "  (%d ranks shared one GPU (%s)%s: these op times include %s, and each schedule is simulated with a "
                "GPU per rank)\n",
                r->shared_gpu_ranks, r->shared_gpu, r->shared_gpu_mps ? " through MPS" : "",
                r->shared_gpu_mps ? "running beside the others' ops on it" : "waiting for the GPU");
    int own_row = whatif_own_row(r);
    double own = own_row >= 0 ? r->rows[own_row].step_time_ns : NAN;
    char names[WHATIF_ROWS][sizeof r->rows[0].schedule + 8];
    int width = 18; /* the column fits the longest name ("zb-v --max-mem 8MiB *") */
    for (int k = 0; k < r->nrows; k++) {
        const whatif_row *w = &r->rows[k];
        char shown[sizeof w->schedule];
        int n = snprintf(names[k], sizeof names[k], "%s%s", term_value(w->schedule, shown, sizeof shown),
                         w->this_job ? " *" : w->tuned ? " tuned" : "");
        width = n > width ? n : width;
    }
    fprintf(out, "  %-*s %6s %10s %7s %8s %11s %9s\n", width, "schedule", "chunks", "step time", "bubble", "vs this",
            "activations", "in flight");
    for (int k = 0; k < r->nrows; k++) {
        const whatif_row *w = &r->rows[k];
        const char *name = names[k];
        if (w->error[0]) {
            fprintf(out, "  %-*s %6d  %s\n", width, name, w->virtual_stages, w->error);
            continue;
        }
        if (isfinite(own) && own > 0) snprintf(c, sizeof c, "%.2fx", w->step_time_ns / own);
        else snprintf(c, sizeof c, "-");
        if (w->act_peak_bytes >= 0) fmt_bytes(d, sizeof d, w->act_peak_bytes);
        else snprintf(d, sizeof d, "-");
        fprintf(out, "  %-*s %6d %10s %7s %8s %11s %9d\n", width, name, w->virtual_stages,
                fmt_ns(a, sizeof a, w->step_time_ns), fmt_pct(b, sizeof b, w->bubble_ratio), c, d, w->peak_inflight);
    }
    /* the flag only where the tuned order pays: built, and faster than zb-v's (the API's tuned_recommended) */
    const whatif_row *tuned = r->nrows > WHATIF_KINDS ? &r->rows[WHATIF_KINDS] : NULL;
    const whatif_row *plain = tuned ? &r->rows[WHATIF_KINDS - 1] : NULL; /* zb-v's own order */
    if (whatif_tuned_pays(r->rows, r->nrows)) {
        char flag[160];
        whatif_tuned_flag(&r->in, flag, sizeof flag);
        fprintf(out,
                "  (zb-v tuned: its order built for these costs; run it with --schedule zb-v --schedule-costs %s)\n",
                flag);
    } else if (tuned && !tuned->error[0] && !plain->error[0]) {
        fprintf(out, "  (zb-v tuned: its order built for these costs, no faster than zb-v's own: nothing to gain "
                     "from --schedule-costs)\n");
    }
    if (r->bw_split)
        fprintf(out,
                "  (this job's backward is one op, BW, of %s: B and W above are halves of it, since it is never timed "
                "apart; its own schedule plays each BW whole)\n",
                fmt_ns(a, sizeof a, (double)r->bw_ns));
    report_whatif_curve(out, r);
    report_whatif_dp(out, r);
}

/* --dp: the job's schedule with more pipelines or microbatches (whatif_dp). */
static void report_whatif_dp(FILE *out, const whatif_report *r) {
    if (!r->ndp) return;
    char a[24], b[24];
    fprintf(out,
            "data parallel  more pipelines (D) or microbatches (m): this job's median step plus the simulated change,\n"
            "  the pipeline at m microbatches with each stage's all-reduce after its last W, measured (");
    for (int k = 0; k < r->in.ranks * r->in.virtual_stages && k < BALANCE_MAX_STAGES; k++)
        fprintf(out, "%s%s", k ? ", " : "", isnan(r->allreduce_ns[k]) ? "-" : fmt_ns(a, sizeof a, r->allreduce_ns[k]));
    fprintf(out, " a stage)\n  and scaled as a ring's 2(D-1)/D; the ranks waited %s a step for it\n",
            fmt_ns(a, sizeof a, r->exposed_allreduce_ns));
    fprintf(out, "  %4s %5s %10s %12s\n", "D", "m", "step time", "throughput");
    for (int k = 0; k < r->ndp; k++) {
        const whatif_dp_row *row = &r->dp_rows[k];
        snprintf(b, sizeof b, "%.2fx", row->throughput);
        fprintf(out, "  %4d %5d %10s %12s%s\n", row->dp, row->microbatches, fmt_ns(a, sizeof a, row->step_time_ns),
                isfinite(row->throughput) ? b : "-", k == 0 ? "  (this job)" : "");
    }
}

/* The memory curve (whatif_curve): for each bound, zb-h1's and zb-v's step
 * and bubble built under it; "-" where one could not be built. */
static void report_whatif_curve(FILE *out, const whatif_report *r) {
    char a[24], b[24], c[24];
    if (!r->ncurve) {
        fprintf(out, "memory     %s\n", r->no_curve);
        return;
    }
    fprintf(out, "memory     zb-h1 and zb-v built so that no rank holds more than a bound (pprun run --max-mem N), "
                 "at this job's costs\n");
    fprintf(out, "  (a bound in microbatch-stages of a 1F1B stage, from 1F1B's peak, %d, to twice it; bytes on the "
                 "rank whose microbatch holds most)\n", r->curve[0].bound);
    fprintf(out, "  %5s %10s  %10s %7s  %10s %7s  %10s %7s\n", "bound", "bytes", "zb-h1", "bubble", "zb-v", "bubble",
            "zb-v tuned", "bubble");
    for (int k = 0; k < r->ncurve; k++) {
        const whatif_curve_row *row = &r->curve[k];
        if (row->bound_bytes >= 0) fmt_bytes(a, sizeof a, row->bound_bytes);
        else snprintf(a, sizeof a, "-");
        fprintf(out, "  %5d %10s", row->bound, a);
        for (int col = 0; col < WHATIF_CURVE_COLS; col++) {
            const whatif_curve_cell *cell = &row->cell[col];
            fprintf(out, "  %10s %7s", cell->error[0] ? "-" : fmt_ns(b, sizeof b, cell->step_time_ns),
                    cell->error[0] ? "-" : fmt_pct(c, sizeof c, cell->bubble_ratio));
        }
        fprintf(out, "\n");
    }
    for (int col = 0; col < WHATIF_CURVE_COLS; col++) /* why a column has "-": its first error */
        for (int k = 0; k < r->ncurve; k++)
            if (r->curve[k].cell[col].error[0]) {
                fprintf(out, "  (%s: %s)\n", col == 0 ? "zb-h1" : col == 1 ? "zb-v" : "zb-v tuned",
                        r->curve[k].cell[col].error);
                break;
            }
}

/* s as one word of a shell command line the reader may paste: as it is
 * when it holds only characters no shell reads specially, else in single
 * quotes (a quote within as '\''); cut to buf (cap > 6). Control bytes
 * are for the stream to escape (pprun's stderr does: docs/cli.md). */
static const char *shell_word(const char *s, char *buf, size_t cap) {
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./-+,:=@%") == strlen(s))
        return s;
    size_t n = 0;
    buf[n++] = '\'';
    for (; *s && n + 6 < cap; s++) {
        if (*s == '\'') {
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *s;
        }
    }
    buf[n++] = '\'';
    buf[n] = 0;
    return buf;
}

void report_brief(FILE *out, const char *prefix, const job_summary *s, const whatif_report *w, const char *db_path) {
    char t[24], m[24], p[24], word[4200];
    db_path = shell_word(db_path, word, sizeof word);
    if (!s->steps) { /* a program that only evaluated, or stopped in its first step */
        fprintf(out,
                "%s: job %lld: no step complete (a step has every rank's ops; evaluations are not steps)\n"
                "%s: more: pprun stats --db %s --job %lld\n",
                prefix, (long long)s->job_id, prefix, db_path, (long long)s->job_id);
        return;
    }
    fprintf(out, "%s: job %lld: median step %s; bubble %s measured, %s planned", prefix, (long long)s->job_id,
            fmt_ns(t, sizeof t, (double)s->step_time_ns), fmt_pct(m, sizeof m, s->bubble_ratio),
            fmt_pct(p, sizeof p, s->sim_bubble_ratio));
    if (w && w->shared_ranks > 0)
        fprintf(out, " (%d ranks shared %d core%s)", w->shared_ranks, w->shared_cores, w->shared_cores == 1 ? "" : "s");
    else if (w && w->shared_gpu_ranks > 0)
        fprintf(out, " (%d ranks shared one GPU)", w->shared_gpu_ranks);
    int k = top_cause(s, NULL);
    if (k >= 0)
        fprintf(out, "; idle mostly %s (%s)", analyze_causes[k],
                fmt_pct(t, sizeof t, (double)s->idle_ns_by_cause[k] / (double)summary_idle_total(s)));
    /* a loop slower than its steps by a tenth or more: say where the rest went */
    if (s->between_ns >= 0 && s->between_ns >= s->step_time_ns / 10)
        fprintf(out, "; %s between steps", fmt_ns(t, sizeof t, (double)s->between_ns));
    if (s->dropped > 0) fprintf(out, "; %lld trace records lost, not in these figures", (long long)s->dropped);
    char why[200];
    if (s->dp_unlaid) fprintf(out, "\n%s: job %lld: %s", prefix, (long long)s->job_id, dp_unlaid_text(why, sizeof why, s));
    fprintf(out, "\n%s: more: pprun stats --db %s --job %lld\n", prefix, db_path, (long long)s->job_id);
}

/* ---- two jobs side by side (pprun stats --vs) ------------------------- */

/* The change from other to job: "0.86x", or "-" when either is missing. */
static const char *fmt_times(char *buf, size_t n, double job, double other) {
    if (isfinite(job) && isfinite(other) && job >= 0 && other > 0) snprintf(buf, n, "%.2fx", job / other);
    else snprintf(buf, n, "-");
    return buf;
}

/* The change of a ratio in percentage points: "-19.9 pp". */
static const char *fmt_points(char *buf, size_t n, double job, double other) {
    if (isfinite(job) && isfinite(other)) snprintf(buf, n, "%+.1f pp", 100 * (job - other));
    else snprintf(buf, n, "-");
    return buf;
}

/* A row of the table: the other job's value, this job's, the change. */
static void cmp_row(FILE *out, const char *label, const char *other, const char *job, const char *change) {
    fprintf(out, "  %-26s %12s %12s", label, other, job);
    if (change[0]) fprintf(out, " %10s", change);
    fputc('\n', out);
}

/* A duration row: both values and their ratio; -1 for none. */
static void cmp_ns_row(FILE *out, const char *label, double other, double job) {
    char a[24], b[24], c[24];
    cmp_row(out, label, fmt_ns(a, sizeof a, other), fmt_ns(b, sizeof b, job), fmt_times(c, sizeof c, job, other));
}

static double per_step(int64_t ns, const job_summary *s) {
    return s->steps > 0 ? (double)ns / (double)s->steps : -1;
}

/* The op medians of one kind of span, a row per phase either job ran. */
static void cmp_ops(FILE *out, const job_summary *js, const job_summary *os, int gpu) {
    fprintf(out, "  op medians (%s spans)\n", gpu ? "GPU" : "host");
    for (int ph = 0; ph < TRACE_PHASE_COUNT; ph++) {
        if (!js->ops[gpu][ph].count && !os->ops[gpu][ph].count) continue;
        char label[32];
        snprintf(label, sizeof label, "  %s", trace_phase_name(ph));
        cmp_ns_row(out, label, (double)os->ops[gpu][ph].median_ns, (double)js->ops[gpu][ph].median_ns);
    }
}

/* Each job's critical path per step: its span, each rank's ops on it (the
 * ranks either job has on it, or their sum when there are too many), the
 * waits. */
static void cmp_critpath(FILE *out, const job_compare *c) {
    const critpath_report *j = &c->path_job, *o = &c->path_other;
    if (!j->steps && !o->steps) return;
    static const char *const wait_labels[CRITPATH_WAITS] = {"  hand-offs", "  sends and receives", "  the rest",
                                                            "  the all-reduce"};
    cmp_ns_row(out, "critical path per step", critpath_per_step(o, o->t.span_ns), critpath_per_step(j, j->t.span_ns));
    const int *on = c->path_ranks, n = c->npath_ranks;
    char label[40];
    double sum[2] = {0, 0}; /* other, job: the ranks' ops, for more than CRITPATH_LIST_ALL */
    for (int i = 0; i < n; i++) {
        double a = critpath_rank_per_step(o, on[i]), b = critpath_rank_per_step(j, on[i]);
        sum[0] += isfinite(a) ? a : 0;
        sum[1] += isfinite(b) ? b : 0;
        if (n > CRITPATH_LIST_ALL) continue;
        snprintf(label, sizeof label, "  rank %d's ops", on[i]);
        cmp_ns_row(out, label, a, b);
    }
    if (n > CRITPATH_LIST_ALL) {
        snprintf(label, sizeof label, "  ops of %d ranks", n);
        cmp_ns_row(out, label, o->steps ? sum[0] : NAN, j->steps ? sum[1] : NAN);
    }
    for (int k = 0; k < CRITPATH_WAITS; k++)
        if (k != CRITPATH_ALLREDUCE || o->t.wait_ns[k] > 0 || j->t.wait_ns[k] > 0)
            cmp_ns_row(out, wait_labels[k], critpath_per_step(o, o->t.wait_ns[k]),
                       critpath_per_step(j, j->t.wait_ns[k]));
}

/* "differs    microbatches: 8 in job 1, 16 in job 2", on three lines when
 * that is wider than a terminal. */
static void cmp_diff(FILE *out, const compare_diff *d, const job_compare *c) {
    char line[640], other[sizeof d->other], job[sizeof d->job]; /* each job's value, stored: escaped */
    term_value(d->other, other, sizeof other);
    term_value(d->job, job, sizeof job);
    int n = snprintf(line, sizeof line, "differs    %s: %s in job %lld, %s in job %lld", d->what, other,
                     (long long)c->other, job, (long long)c->job);
    if (n <= 100) fprintf(out, "%s\n", line);
    else
        fprintf(out, "differs    %s\n             job %lld  %s\n             job %lld  %s\n", d->what,
                (long long)c->other, other, (long long)c->job, job);
}

static void cmp_prediction(FILE *out, const job_summary *js, const job_summary *os, const whatif_report *ow,
                           const job_compare *c) {
    char a[24], b[24], o[24];
    if (c->predicted < 0) {
        char *why = term_dup(c->why_not, strlen(c->why_not), 0); /* it quotes a stored schedule */
        fprintf(out, "what if    no prediction: %s\n", why ? why : "?");
        free(why);
        return;
    }
    const whatif_row *row = &c->row;
    char cuts[BALANCE_MAX_STAGES * 6 + 20] = "";
    if (c->by_cuts) {
        snprintf(cuts, sizeof cuts, " --pipeline-cuts ");
        sched_cuts_text(ow->cuts, ow->ncuts, cuts + strlen(cuts), sizeof cuts - strlen(cuts));
    } else if (c->max_mem[0]) { /* not the other's unbounded row: say which order was played */
        snprintf(cuts, sizeof cuts, " --max-mem %s (the order job %lld ran)", c->max_mem, (long long)c->job);
    }
    char name[sizeof row->schedule];
    fprintf(out, "what if    job %lld predicted %s%s%s at %s", (long long)c->other,
            term_value(row->schedule, name, sizeof name), row->tuned ? " tuned" : "", cuts,
            fmt_ns(a, sizeof a, c->predicted_ns));
    if (c->own >= 0)
        fprintf(out, ", %s of its own %s", fmt_times(b, sizeof b, c->predicted_ns, ow->rows[c->own].step_time_ns),
                term_value(ow->rows[c->own].schedule, name, sizeof name));
    fprintf(out, " (simulated)\n");
    if (js->steps > 0 && os->steps > 0)
        fprintf(out, "           job %lld measured %s, %s of job %lld's %s (median steps)\n", (long long)c->job,
                fmt_ns(a, sizeof a, (double)js->step_time_ns),
                fmt_times(b, sizeof b, (double)js->step_time_ns, (double)os->step_time_ns), (long long)c->other,
                fmt_ns(o, sizeof o, (double)os->step_time_ns));
    else fprintf(out, "           job %lld has no complete step to hold it against yet\n", (long long)c->job);
}

static const char *fmt_loss(char *buf, size_t n, double loss, const char *format) {
    if (isfinite(loss)) snprintf(buf, n, format, loss);
    else snprintf(buf, n, "not finite");
    return buf;
}

/* A job's latest mean loss and its step: "4.7083 @9", or "-". */
static void fmt_latest_loss(char *buf, size_t n, const job_summary *s) {
    if (s->loss_step >= 0 && isfinite(s->loss)) snprintf(buf, n, "%.4f @%lld", s->loss, (long long)s->loss_step);
    else snprintf(buf, n, "-");
}

static void cmp_loss(FILE *out, const job_compare *c) {
    char a[40], b[40];
    if (c->loss_step < 0) fprintf(out, "loss       no step has every microbatch's loss in both jobs\n");
    else if (c->loss_bitwise)
        fprintf(out, "loss       step %lld: %s in both (bitwise equal)\n", (long long)c->loss_step,
                fmt_loss(a, sizeof a, c->loss_job, "%.6f"));
    else {
        fprintf(out, "loss       step %lld: %s (job %lld), %s (job %lld): not bitwise equal\n", (long long)c->loss_step,
                fmt_loss(a, sizeof a, c->loss_other, "%.9g"), (long long)c->other,
                fmt_loss(b, sizeof b, c->loss_job, "%.9g"), (long long)c->job);
        if (c->loss_n_job != c->loss_n_other)
            fprintf(out, "           %d microbatches in job %lld, %d in job %lld\n", c->loss_n_other,
                    (long long)c->other, c->loss_n_job, (long long)c->job);
        else fprintf(out, "           %d of %d microbatches differ\n", c->loss_differing, c->loss_n_job);
    }
}

void report_compare(FILE *out, sqlite3 *db, const job_summary *js, const whatif_report *jw, const job_summary *os,
                    const whatif_report *ow, const job_compare *c) {
    char a[32], b[32], d[32], head[48];
    report_job_line(out, db, os);
    report_job_line(out, db, js);
    int chunks_differ = 0;
    for (int k = 0; k < c->ndiffs; k++) {
        cmp_diff(out, &c->diffs[k], c);
        chunks_differ |= strcmp(c->diffs[k].what, "virtual stages") == 0;
    }
    if (chunks_differ && !jw->in.fixed_op_costs)
        fprintf(out, "           (an op is one chunk's: more chunks per rank, shorter ops; compare step times)\n");

    /* "→" is one column in three bytes: pad the header by two more */
    snprintf(a, sizeof a, "job %lld", (long long)c->other);
    snprintf(b, sizeof b, "job %lld", (long long)c->job);
    snprintf(head, sizeof head, "%lld→%lld", (long long)c->other, (long long)c->job);
    fprintf(out, "  %-26s %12s %12s %12s\n", "", a, b, head);
    snprintf(a, sizeof a, "%lld", (long long)os->steps);
    snprintf(b, sizeof b, "%lld", (long long)js->steps);
    cmp_row(out, "steps compared", a, b, "");
    cmp_ns_row(out, "step time (median)", (double)os->step_time_ns, (double)js->step_time_ns);
    cmp_row(out, "bubble measured", fmt_pct(a, sizeof a, os->bubble_ratio), fmt_pct(b, sizeof b, js->bubble_ratio),
            fmt_points(d, sizeof d, js->bubble_ratio, os->bubble_ratio));
    cmp_row(out, "bubble planned", fmt_pct(a, sizeof a, os->sim_bubble_ratio),
            fmt_pct(b, sizeof b, js->sim_bubble_ratio),
            fmt_points(d, sizeof d, js->sim_bubble_ratio, os->sim_bubble_ratio));
    /* 0 is "not recorded", -1 no statistics: neither is a peak */
    double ap = os->act_peak > 0 ? (double)os->act_peak : NAN, bp = js->act_peak > 0 ? (double)js->act_peak : NAN;
    cmp_row(out, "activations at peak (rank)", isfinite(ap) ? fmt_bytes(a, sizeof a, os->act_peak) : "-",
            isfinite(bp) ? fmt_bytes(b, sizeof b, js->act_peak) : "-", fmt_times(d, sizeof d, bp, ap));
    if (os->mem_peak >= 0 || js->mem_peak >= 0) {
        double om = os->mem_peak >= 0 ? (double)os->mem_peak : NAN, jm = js->mem_peak >= 0 ? (double)js->mem_peak : NAN;
        cmp_row(out, "  with weights and optimizer", isfinite(om) ? fmt_bytes(a, sizeof a, os->mem_peak) : "-",
                isfinite(jm) ? fmt_bytes(b, sizeof b, js->mem_peak) : "-", fmt_times(d, sizeof d, jm, om));
    }

    cmp_ns_row(out, "idle per step, all ranks", per_step(summary_idle_total(os), os),
               per_step(summary_idle_total(js), js));
    for (int k = 0; k < CAUSE_COUNT; k++) {
        if (!os->idle_ns_by_cause[k] && !js->idle_ns_by_cause[k]) continue;
        char label[40];
        snprintf(label, sizeof label, "  %s", analyze_causes[k]);
        cmp_ns_row(out, label, per_step(os->idle_ns_by_cause[k], os), per_step(js->idle_ns_by_cause[k], js));
    }
    cmp_critpath(out, c);
    if (js->has_ops && os->has_ops) {
        cmp_ops(out, js, os, 0);
        if (summary_has_ops(js, 1) && summary_has_ops(os, 1)) cmp_ops(out, js, os, 1);
    }
    fmt_latest_loss(a, sizeof a, os);
    fmt_latest_loss(b, sizeof b, js);
    if (os->loss_step == js->loss_step && isfinite(os->loss) && isfinite(js->loss))
        snprintf(d, sizeof d, "%+.4f", js->loss - os->loss);
    else snprintf(d, sizeof d, "-");
    cmp_row(out, "loss (latest step's mean)", a, b, d);
    cmp_prediction(out, js, os, ow, c);
    cmp_loss(out, c);
}
