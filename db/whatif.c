/* whatif.c: every built-in schedule played out at a job's own measured
 * costs (whatif.h). The simulator is the one `pprun schedule` and the
 * planned timeline use; this file only chooses its inputs: which costs,
 * how they scale with a chunk's size, and what memory they imply. */
#include "db/whatif.h"

#include "base/utf8.h"
#include "config/model_spec.h"
#include "db/bounds.h"
#include "db/critpath.h"
#include "db/durations.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* zb-v last: its row tuned to the measured costs follows it */
static const char *const whatif_kinds[WHATIF_KINDS] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipev",
                                                       "zb-v"};

/* Beyond this many actions (ranks x chunks x microbatches x 3) a schedule is
 * not simulated: a request must stay quick, and jobs this large are rare. */
#define WHATIF_MAX_ACTIONS 2000000

/* What a microbatch holds on each of `chunks` chunks of the job's layers
 * under recompute (bytes: whatif_input.act_profile): after F (.f), after B
 * (.b) and at its recompute (.w), each chunk's share of the job's stages'
 * (balance_chunk_costs, bytes for costs: they add up by layers as costs
 * do). malloc'd (caller frees); NULL when they cannot be split so finely
 * or memory ran out. */
static sched_costs *whatif_chunk_bytes(const balance_profile *bytes, int chunks) {
    sched_costs *each = malloc(sizeof *each * (size_t)chunks);
    double *bound = malloc(sizeof *bound * (size_t)(chunks + 1));
    pp_err ignored;
    int ok = each && bound && balance_split(bytes, chunks, bound, &ignored) == 0;
    if (ok) balance_chunk_costs(bytes, bound, chunks, each);
    free(bound);
    if (!ok) free(each), each = NULL;
    return each;
}

/* Under recompute (in->act_profile): plan's actions replayed with what a
 * microbatch holds on each of its chunks after F and after B, and during
 * B the moment after its recompute (sched_mem.high); the most any rank
 * holds, or -1. */
static int64_t whatif_act_replay(const balance_profile *bytes, const sched_plan *plan) {
    int S = plan->stages;
    sched_costs *each = whatif_chunk_bytes(bytes, S);
    double *peak = malloc(sizeof *peak * (size_t)plan->ranks), *high = malloc(sizeof *high * (size_t)S);
    sched_act *act = malloc(sizeof *act * (size_t)S);
    pp_err ignored;
    int ok = each && peak && high && act;
    for (int s = 0; ok && s < S; s++) act[s] = (sched_act){each[s].f, each[s].b, 0}, high[s] = each[s].w;
    sched_mem mem = {.act = act, .nact = S, .bytes = 1, .high = high};
    ok = ok && sched_mem_peaks(plan, &mem, peak, NULL, &ignored) == 0;
    double most = 0;
    for (int r = 0; ok && r < plan->ranks; r++)
        if (peak[r] > most) most = peak[r];
    free(each), free(peak), free(high), free(act);
    return ok ? llround(most) : -1;
}

/* The most bytes any rank would hold: each rank keeps the bytes per
 * microbatch-stage the job measured on it, times `scale` (the chunk's size
 * against the job's), times the schedule's peak in flight there; under
 * recompute, replayed (whatif_act_replay). -1 unless every rank's bytes and
 * in-flight count are known. */
static int64_t whatif_act_estimate(const whatif_input *in, const sched_plan *plan, const sched_sim *sim,
                                   double scale) {
    if (in->act_profile) return whatif_act_replay(in->act_profile, plan);
    if (!in->act_peak_by_rank || !in->inflight_by_rank) return -1;
    double most = 0;
    for (int r = 0; r < in->ranks; r++) {
        if (in->act_peak_by_rank[r] <= 0 || in->inflight_by_rank[r] <= 0) return -1;
        double per_unit = (double)in->act_peak_by_rank[r] / (double)in->inflight_by_rank[r];
        double held = per_unit * scale * sim->peak_inflight[r];
        if (held > most) most = held;
    }
    return llround(most);
}

/* A chunk of v per rank against one of the job's: what its op costs
 * scale by (the same layers split into v chunks per rank). */
static double whatif_scale(const whatif_input *in, int v) {
    return in->fixed_op_costs ? 1.0 : (double)in->virtual_stages / v;
}

/* The same for the bytes a chunk holds per microbatch: a timed chunk holds
 * `act` whatever its layers, even where its ops follow them (per=layer). */
static double whatif_act_scale(const whatif_input *in, int v) {
    return in->fixed_act_bytes ? 1.0 : (double)in->virtual_stages / v;
}

/* c for a chunk `scale` times the size: its ops' costs scale, a send's
 * and a rank's time between ops do not. */
static sched_costs whatif_scaled(const sched_costs *c, double scale) {
    return (sched_costs){c->f * scale, c->b * scale, c->w * scale, c->comm, c->bw * scale, c->between};
}

sched_costs whatif_chunk_costs(const whatif_input *in, int v) { return whatif_scaled(&in->costs, whatif_scale(in, v)); }

void whatif_tuned_flag(const whatif_input *in, char *buf, size_t size) {
    sched_costs c = whatif_chunk_costs(in, 2);
    int n = snprintf(buf, size, "f=%.4gms,b=%.4gms,w=%.4gms,comm=%.4gms", c.f / 1e6, c.b / 1e6, c.w / 1e6,
                     c.comm / 1e6);
    if (c.between > 0 && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ",between=%.4gms", c.between / 1e6);
}

int whatif_tuned_pays(const whatif_row *rows, int nrows) {
    if (nrows <= WHATIF_KINDS) return 0;
    const whatif_row *plain = &rows[WHATIF_KINDS - 1], *tuned = &rows[WHATIF_KINDS];
    if (!tuned->tuned || plain->tuned || plain->error[0] || tuned->error[0]) return 0;
    return isfinite(tuned->step_time_ns) && isfinite(plain->step_time_ns) && tuned->step_time_ns < plain->step_time_ns;
}

/* Simulates plan at costs c into row (whose name and v are set); scale is
 * the plan's chunk against the job's. The first line of an error goes into
 * the row: a validator's message goes on with the grid. */
static void whatif_play(const whatif_input *in, const sched_plan *plan, const pp_err *build_err, const sched_costs *c,
                        const sched_costs *each, double scale, whatif_row *row) {
    sched_sim *sim = NULL;
    pp_err err;
    if (!plan) err = *build_err;
    if (!plan || (each ? sched_simulate_stages(plan, each, &sim, &err) : sched_simulate(plan, c, &sim, &err)) != 0) {
        int len = (int)strcspn(err.msg, "\n");
        if (len > (int)sizeof row->error - 1) len = (int)sizeof row->error - 1;
        memcpy(row->error, err.msg, (size_t)len);
    } else {
        row->step_time_ns = sim->step_time;
        row->bubble_ratio = sim->bubble_ratio;
        for (int r = 0; r < in->ranks; r++)
            if (sim->peak_inflight[r] > row->peak_inflight) row->peak_inflight = sim->peak_inflight[r];
        row->act_peak_bytes = whatif_act_estimate(in, plan, sim, scale);
        if (in->allreduce_ns && row->this_job && plan->stages == in->ranks * in->virtual_stages) {
            double step = sched_sim_dp_step(plan, sim, in->allreduce_ns);
            row->dp_step_time_ns = step >= 0 ? step : NAN;
        }
    }
    sched_sim_free(sim);
}

static int whatif_profiled(const whatif_input *in) { return in->profile && !in->fixed_op_costs; }

/* Each chunk's costs when the job's layers are split into `chunks`, from
 * the profile; malloc'd (caller frees), NULL with err when they cannot be
 * split so finely or memory ran out. */
static sched_costs *whatif_profile_costs(const whatif_input *in, int chunks, pp_err *err) {
    sched_costs *each = malloc(sizeof *each * (size_t)chunks);
    double *bound = malloc(sizeof *bound * (size_t)(chunks + 1));
    int rc = each && bound ? balance_split(in->profile, chunks, bound, err) : pp_fail(err, "out of memory");
    if (rc == 0) balance_chunk_costs(in->profile, bound, chunks, each);
    free(bound);
    if (rc != 0) free(each), each = NULL;
    return each;
}

/* 1, with the reason in row, when a plan of this many actions is not simulated. */
static int whatif_too_big(int64_t actions, whatif_row *row) {
    if (actions <= WHATIF_MAX_ACTIONS) return 0;
    snprintf(row->error, sizeof row->error, "not simulated: %lld actions, more than the %d simulated here",
             (long long)actions, WHATIF_MAX_ACTIONS);
    return 1;
}

static void whatif_row_init(whatif_row *row, const char *name, int v) {
    memset(row, 0, sizeof *row);
    utf8_copy(row->schedule, sizeof row->schedule, name); /* a whole character at the cut */
    row->virtual_stages = v;
    row->step_time_ns = row->bubble_ratio = NAN;
    row->act_peak_bytes = -1;
    row->dp_step_time_ns = NAN;
}

/* kind at v chunks per rank, its actions in the order `pprun run` gives
 * them, or (tuned) ordered for the measured costs themselves. */
static int whatif_build(const whatif_input *in, const char *kind, int v, int tuned, sched_plan **plan, pp_err *err) {
    sched_costs c = whatif_chunk_costs(in, v);
    return sched_from_flag(kind, in->ranks, in->microbatches, v, in->build_costs && !tuned ? in->build_costs : &c, plan,
                           err);
}

/* One row: kind at its v, its order built as `pprun run` would build it,
 * or (tuned) for the measured costs themselves. */
static void whatif_one(const whatif_input *in, const char *kind, int tuned, whatif_row *row) {
    int this_job = !tuned && strcmp(in->schedule, kind) == 0 && !in->max_mem; /* bounded: its own_plan's row */
    int p = in->ranks, m = in->microbatches, v = this_job ? in->virtual_stages : sched_default_virtual(kind);
    whatif_row_init(row, kind, v);
    row->tuned = tuned;
    row->this_job = this_job;
    int64_t actions = (int64_t)p * v * m * 3;
    if (whatif_too_big(actions, row)) return;
    sched_costs c = whatif_chunk_costs(in, v), *each = NULL;
    sched_plan *plan = NULL;
    pp_err err;
    if (whatif_build(in, kind, v, tuned, &plan, &err) != 0) plan = NULL;
    if (plan && whatif_profiled(in) && !(each = whatif_profile_costs(in, plan->stages, &err))) {
        sched_free(plan);
        plan = NULL;
    }
    whatif_play(in, plan, &err, &c, each, whatif_act_scale(in, v), row);
    free(each);
    sched_free(plan);
}

const char *whatif_max_mem_text(const char *stored, char buf[24]) {
    char *end;
    errno = 0;
    unsigned long long bytes = strtoull(stored, &end, 10);
    if (errno || end == stored || strcmp(end, "B") != 0) return stored;
    pp_format_size(bytes, buf, 24);
    return buf;
}

/* plan, at its own chunks per rank, played at in's costs into row (whose
 * name and v are set): a chunk of v per rank costs and holds as
 * whatif_chunk_costs and whatif_act_scale say, or its share of in's profile. */
static void whatif_play_plan(const whatif_input *in, const sched_plan *plan, whatif_row *row) {
    int64_t actions = 0;
    for (int r = 0; r < plan->ranks; r++) actions += plan->len[r];
    if (whatif_too_big(actions, row)) return;
    int v = plan->virtual_stages;
    sched_costs c = whatif_chunk_costs(in, v);
    pp_err err;
    sched_costs *each = whatif_profiled(in) ? whatif_profile_costs(in, plan->stages, &err) : NULL;
    if (whatif_profiled(in) && !each) whatif_play(in, NULL, &err, NULL, NULL, 1.0, row);
    else whatif_play(in, plan, NULL, &c, each, whatif_act_scale(in, v), row);
    free(each);
}

/* The job's own plan, as it ran (a csv: job's, or one built under
 * --max-mem), at the job's own costs. */
static void whatif_own(const whatif_input *in, whatif_row *row) {
    const char *name = in->schedule, *slash = strrchr(name, '/');
    char shown[sizeof row->schedule], bound[24];
    if (strncmp(name, "csv:", 4) == 0 && slash) snprintf(shown, sizeof shown, "csv:%.59s", slash + 1);
    else if (in->max_mem)
        snprintf(shown, sizeof shown, "%.20s --max-mem %.20s", name, whatif_max_mem_text(in->max_mem, bound));
    else snprintf(shown, sizeof shown, "%.63s", name);
    whatif_row_init(row, shown, in->virtual_stages);
    row->this_job = 1;
    whatif_play_plan(in, in->own_plan, row);
}

int whatif_simulate(const whatif_input *in, whatif_row rows[WHATIF_ROWS], pp_err *err) {
    if (in->ranks < 1 || in->microbatches < 1 || in->virtual_stages < 1)
        return pp_fail(err, "what-if: a job needs at least 1 rank, microbatch and chunk (got %d, %d, %d)", in->ranks,
                       in->microbatches, in->virtual_stages);
    const sched_costs *c = &in->costs;
    const double cost[6] = {c->f, c->b, c->w, c->comm, c->bw, c->between};
    for (int k = 0; k < 6; k++)
        if (!isfinite(cost[k]) || cost[k] < 0)
            return pp_fail(err,
                           "what-if: op costs must be finite and not negative (f=%g b=%g w=%g comm=%g bw=%g "
                           "between=%g)",
                           c->f, c->b, c->w, c->comm, c->bw, c->between);
    if (in->own_plan && in->own_plan->ranks != in->ranks)
        return pp_fail(err, "what-if: the job's plan has %d ranks, the job %d", in->own_plan->ranks, in->ranks);
    for (int k = 0; k < WHATIF_KINDS; k++) whatif_one(in, whatif_kinds[k], 0, &rows[k]);
    whatif_one(in, "zb-v", 1, &rows[WHATIF_KINDS]);
    int n = WHATIF_KINDS + 1;
    if (in->own_plan) whatif_own(in, &rows[n++]);
    return n;
}

/* ---- the memory curve (whatif_curve) --------------------------------------- */

/* Beyond this much greedy work (actions x levels x schedules) the curve is
 * not drawn: a request must stay quick. p=16, m=64 takes about 40 million. */
#define WHATIF_CURVE_WORK 60000000L

/* One cell: col 0 zb-h1, 1 zb-v, 2 zb-v tuned, built so that no rank holds
 * more than `bound` microbatch-stages of a 1F1B stage, at the job's costs. */
static void whatif_curve_one(const whatif_input *in, int col, int bound, whatif_curve_cell *cell) {
    const char *kind = col == 0 ? "zb-h1" : "zb-v";
    int v = col == 0 ? 1 : 2, tuned = col == 2;
    whatif_row row;
    whatif_row_init(&row, kind, v);
    /* a chunk's share of a 1F1B stage: its layers' (gpt), or all (timed) */
    double share = in->fixed_act_bytes ? 1.0 : 1.0 / v;
    sched_act units = {share, share, 0};
    sched_mem mem = {.max = bound, .act = &units, .nact = 1};
    sched_costs c = whatif_chunk_costs(in, v), *each = NULL;
    sched_plan *plan = NULL;
    pp_err err;
    const sched_costs *order = in->build_costs && !tuned ? in->build_costs : &c;
    if (sched_from_flag_mem(kind, in->ranks, in->microbatches, v, order, &mem, &plan, &err) != 0) plan = NULL;
    if (plan && whatif_profiled(in) && !(each = whatif_profile_costs(in, plan->stages, &err))) {
        sched_free(plan);
        plan = NULL;
    }
    whatif_play(in, plan, &err, &c, each, whatif_act_scale(in, v), &row);
    free(each);
    sched_free(plan);
    *cell = (whatif_curve_cell){.step_time_ns = row.step_time_ns, .bubble_ratio = row.bubble_ratio,
                                .peak_inflight = row.peak_inflight, .act_peak_bytes = row.act_peak_bytes};
    snprintf(cell->error, sizeof cell->error, "%.95s", row.error);
}

/* The bound in bytes: the job's bytes per microbatch-stage on the rank
 * where one holds most, scaled to a 1F1B stage; -1 unknown. Under
 * recompute (in->act_profile) a microbatch-stage holds what its F kept
 * until its recompute brings the rest back: the bytes the rows' replay
 * counts, the most one microbatch holds on a 1F1B stage (a rank's layers:
 * after its F, at its recompute or after its B), on the stage where that
 * is most. A job's peak over its peak in flight would be an average of
 * the two sizes, below what the bound lets a rank hold. */
static int64_t whatif_bound_bytes(const whatif_input *in, int bound) {
    if (in->act_profile) {
        sched_costs *each = whatif_chunk_bytes(in->act_profile, in->ranks);
        if (!each) return -1;
        double most = 0;
        for (int k = 0; k < in->ranks; k++) {
            double held = fmax(each[k].f, fmax(each[k].b, each[k].w));
            if (held > most) most = held;
        }
        free(each);
        return llround(most * bound);
    }
    if (!in->act_peak_by_rank || !in->inflight_by_rank) return -1;
    double most = 0;
    for (int r = 0; r < in->ranks; r++) {
        if (in->act_peak_by_rank[r] <= 0 || in->inflight_by_rank[r] <= 0) return -1;
        double per_unit = (double)in->act_peak_by_rank[r] / (double)in->inflight_by_rank[r] * whatif_act_scale(in, 1);
        if (per_unit > most) most = per_unit;
    }
    return llround(most * bound);
}

int whatif_curve(const whatif_input *in, whatif_curve_row *rows, char *why_not, size_t size) {
    int p = in->ranks;
    why_not[0] = '\0';
    if (p + 1 > WHATIF_CURVE_MAX) {
        snprintf(why_not, size, "not drawn for more than %d ranks (this job has %d)", WHATIF_CURVE_MAX - 1, p);
        return 0;
    }
    /* each bound's greedy runs at every level up to it (sched_build_bounded): a
     * zb-v level is half a stage apart, so up to 4p + 1 levels, each twice */
    double work = 3.0 * (p + 1) * (4.0 * p + 1) * 2 * (6.0 * p * in->microbatches);
    if (work > WHATIF_CURVE_WORK) {
        snprintf(why_not, size, "not drawn: %d ranks x %d microbatches take more greedy work than a request may "
                 "(pprun schedule --max-mem draws one bound)", p, in->microbatches);
        return 0;
    }
    for (int k = 0; k <= p; k++) {
        whatif_curve_row *row = &rows[k];
        row->bound = p + k;
        row->bound_bytes = whatif_bound_bytes(in, row->bound);
        for (int col = 0; col < WHATIF_CURVE_COLS; col++) whatif_curve_one(in, col, row->bound, &row->cell[col]);
    }
    return p + 1;
}

/* ---- reading a job's costs -------------------------------------------- */

static int whatif_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st, pp_err *err) {
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    return 0;
}

/* Prepares sql over the window: ?1 the job, ?2 and ?3 its first and last step. */
static int whatif_prepare_window(sqlite3 *db, const char *sql, const job_summary *s, const whatif_report *r,
                                 sqlite3_stmt **st, pp_err *err) {
    if (whatif_prepare(db, sql, st, err) != 0) return -1;
    sqlite3_bind_int64(*st, 1, s->job_id);
    sqlite3_bind_int(*st, 2, r->first_step);
    sqlite3_bind_int(*st, 3, r->last_step);
    return 0;
}

static int whatif_done(sqlite3 *db, sqlite3_stmt *st, int rc, pp_err *err) {
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : pp_fail(err, "database error: %s", sqlite3_errmsg(db));
}

/* Which layers each of the job's stages held, into r->profile: `layers`
 * split as `pprun run` split them (cuts_text: config_json's pipeline_cuts,
 * NULL for the even split), or, layers 0 or a split that does not fit, each
 * stage one unit of its own. */
static void whatif_stage_layers(whatif_report *r, int layers, const char *cuts_text) {
    balance_profile *bp = &r->profile;
    int S = r->stages;
    if (S < 1 || S > BALANCE_MAX_STAGES) return;
    bp->stages = bp->layers = S;
    for (int k = 0; k <= S; k++) bp->bound[k] = k;
    int *cuts = NULL, ncuts = 0;
    pp_err ignored;
    if (layers < 1 || (cuts_text && sched_parse_cuts(cuts_text, &cuts, &ncuts, &ignored) != 0)) return;
    int first[BALANCE_MAX_STAGES + 1];
    if (sched_partition(layers, S, cuts, ncuts, first, &ignored) == 0) {
        bp->layers = layers, bp->layers_known = 1;
        memcpy(bp->bound, first, sizeof(int) * (size_t)(S + 1));
    }
    free(cuts);
}

/* The job's ranks on node 0's host (ranks.host, which every node gives at
 * the rendezvous), in a query on jobs: two launchers of one job on one
 * machine (--nnodes 2 on one host) share its cores, its nproc_per_node
 * counts one launcher's only. Against node 0's cpu_cores, the cores known. */
#define SQL_HOST_RANKS                                                                                                 \
    "(SELECT count(*) FROM ranks h WHERE h.job_id = jobs.id AND h.host <> '' AND h.host = (SELECT host FROM ranks "    \
    "WHERE job_id = jobs.id AND node = 0 AND host <> '' LIMIT 1))"

/* The job's shape from its row, and how `pprun run` built its schedule:
 * its --schedule-costs (config_json), else run_config_costs (a timed
 * model's own costs, unit costs for gpt). */
static int whatif_read_job(sqlite3 *db, int64_t job, whatif_report *r, pp_err *err) {
    sqlite3_stmt *st;
    if (whatif_prepare(db,
                       "SELECT schedule, microbatches, virtual_stages, model, json_extract(config_json, "
                       "'$.schedule_costs'), stages, json_extract(config_json, '$.pipeline_cuts'), device, "
                       "max(coalesce(json_extract(config_json, '$.nproc_per_node'), 0), " SQL_HOST_RANKS "), "
                       "json_extract(config_json, '$.cpu_cores'), "
                       "json_extract(config_json, '$.max_mem') FROM jobs WHERE id=?1",
                       &st, err) != 0)
        return -1;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_finalize(st);
        return pp_fail(err, "no job %lld in this database", (long long)job);
    }
    if (rc == SQLITE_ROW) {
        const unsigned char *schedule = sqlite3_column_text(st, 0), *model = sqlite3_column_text(st, 3);
        const unsigned char *ordered_for = sqlite3_column_text(st, 4);
        utf8_copy(r->in.schedule, sizeof r->in.schedule, (const char *)schedule); /* NULL as "" */
        snprintf(r->model, sizeof r->model, "%s", model ? (const char *)model : "");
        /* Every play allocates by the row's shape (stages, chunks,
         * microbatches), and the costs below divide by it: one past pprun's
         * bounds is a damaged or forged file, refused before anything is
         * computed or a byte taken for it. Read wide: an int wrapped a
         * forged 2^63 - 1 to -1, no shape, and the what-if showed none. */
        int64_t stages = sqlite3_column_int64(st, 5), chunks = sqlite3_column_int64(st, 2),
                mbs = sqlite3_column_int64(st, 1);
        pp_err bad;
        /* 0 is a job with no shape yet (a program's, before its plan);
         * below 0 pprun never writes */
        int negative = stages < 0 || chunks < 0 || mbs < 0;
        if (negative)
            pp_fail(&bad, "%lld stages, %lld chunks per rank, %lld microbatches: below 0", (long long)stages,
                    (long long)chunks, (long long)mbs);
        if (negative || pp_shape_check_upper(stages, chunks, mbs, &bad) != 0) {
            sqlite3_finalize(st);
            return pp_fail(err,
                           "job %lld's row declares a shape pprun never runs (%s): the database is damaged or was not "
                           "written by pprun",
                           (long long)job, bad.msg);
        }
        /* each fits an int now; 0 is no shape */
        r->stages = (int)stages;
        r->in.virtual_stages = (int)chunks;
        r->in.microbatches = (int)mbs;
        model_spec spec;
        pp_err ignored;
        int parsed = model && model_parse_spec((const char *)model, &spec, &ignored) == 0;
        if (parsed) {
            /* timed per=layer costs follow a chunk's layers, as gpt's do */
            r->in.fixed_op_costs = spec.kind == MODEL_TIMED && !spec.per_layer;
            /* but a timed chunk holds `act` bytes a microbatch, per=layer too */
            r->in.fixed_act_bytes = spec.kind == MODEL_TIMED;
            int v = r->in.virtual_stages > 0 ? r->in.virtual_stages : 1, zbv_chunks = 2 * (r->stages / v);
            /* as run_config_costs orders zb-v: at its mean chunk's costs */
            double layers = zbv_chunks > 0 ? (double)spec.layers / zbv_chunks : 1;
            r->build = spec.kind == MODEL_TIMED
                           ? (sched_costs){model_timed_op_ns(&spec, 0, layers), model_timed_op_ns(&spec, 1, layers),
                                           model_timed_op_ns(&spec, 2, layers), 0, 0, 0}
                           : (sched_costs){1, 1, 1, 0, 0, 0};
            r->in.build_costs = &r->build;
        }
        sched_costs given = {0, 0, 0, 0, 0, 0};
        if (ordered_for && sched_parse_costs((const char *)ordered_for, "schedule_costs", &given, &ignored) == 0) {
            r->build = given;
            r->in.build_costs = &r->build;
        }
        int layered = parsed && (spec.kind == MODEL_GPT || spec.per_layer);
        whatif_stage_layers(r, layered ? spec.layers : 0, (const char *)sqlite3_column_text(st, 6));
        const unsigned char *bound = sqlite3_column_text(st, 10);
        if (bound && *bound) {
            snprintf(r->max_mem, sizeof r->max_mem, "%s", (const char *)bound);
            r->in.max_mem = r->max_mem;
        }
        const unsigned char *device = sqlite3_column_text(st, 7);
        int node_ranks = sqlite3_column_int(st, 8), cores = sqlite3_column_int(st, 9); /* 0: not recorded */
        /* a timed model sleeps; gpt computes, and so does a program (a
         * PyTorch job: `pprun run -- PROGRAM` records its model as
         * "program:...") */
        int computes = parsed ? spec.kind == MODEL_GPT : model && strncmp((const char *)model, "program:", 8) == 0;
        if (computes && device && strcmp((const char *)device, "cpu") == 0 && cores > 0 && node_ranks > cores)
            r->shared_ranks = node_ranks, r->shared_cores = cores;
    }
    return whatif_done(db, st, rc, err);
}

/* The most ranks of one node that ran on one GPU (ranks.device), into
 * r->shared_gpu_ranks and r->shared_gpu when more than one did, and
 * whether under MPS (r->shared_gpu_mps). */
static int whatif_read_gpu_sharing(sqlite3 *db, int64_t job, whatif_report *r, pp_err *err) {
    sqlite3_stmt *st;
    if (whatif_prepare(db,
                       "SELECT count(*) AS n, device, (SELECT CASE WHEN json_valid(config_json) THEN "
                       "json_extract(config_json, '$.mps') END = 'on' FROM jobs WHERE id=?1) FROM ranks "
                       "WHERE job_id=?1 AND device LIKE 'cuda:%' GROUP BY node, device ORDER BY n DESC LIMIT 1",
                       &st, err) != 0)
        return -1;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_column_int(st, 0) > 1) {
        r->shared_gpu_ranks = sqlite3_column_int(st, 0);
        snprintf(r->shared_gpu, sizeof r->shared_gpu, "%s", (const char *)sqlite3_column_text(st, 1));
        r->shared_gpu_mps = sqlite3_column_int(st, 2);
    }
    return whatif_done(db, st, rc, err);
}

/* The window of steps to measure: the latest complete step from
 * s->from_step on (r->last_step, -1 when there is none) and up to
 * WHATIF_STEPS - 1 before it; r->gpu when it has GPU spans. */
static int whatif_read_window(sqlite3 *db, const job_summary *s, whatif_report *r, pp_err *err) {
    sqlite3_stmt *st;
    if (whatif_prepare(db, "SELECT max(step) FROM (" SQL_COMPLETE_STEPS("AND step>=?2") ")", &st, err) != 0) return -1;
    sqlite3_bind_int64(st, 1, s->job_id);
    sqlite3_bind_int(st, 2, s->from_step);
    int rc = sqlite3_step(st);
    int64_t last = -1; /* read wide: an int wrapped a forged step to -1, "not measured" */
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL &&
        bounds_col(st, 0, &bounds_step, s->job_id, "step_totals.step", &last, err) != 0) {
        sqlite3_finalize(st);
        return -1;
    }
    r->last_step = (int)last;
    if (whatif_done(db, st, rc, err) != 0) return -1;
    if (r->last_step < 0) return 0;
    r->first_step = r->last_step - WHATIF_STEPS + 1;
    if (r->first_step < s->from_step) r->first_step = s->from_step;
    if (whatif_prepare_window(db,
                              "SELECT EXISTS(SELECT 1 FROM events WHERE job_id=?1 AND step BETWEEN ?2 AND ?3 AND "
                              "source='gpu' AND phase='F')",
                              s, r, &st, err) != 0)
        return -1;
    rc = sqlite3_step(st);
    r->gpu = rc == SQLITE_ROW && sqlite3_column_int(st, 0);
    return whatif_done(db, st, rc, err);
}

/* Medians over the window, taken as `pprun stats`' ops table takes them:
 * of the F, B and W spans into med[0..2] (-1 where there is none), and of
 * each stage's F, B and W into r->profile (r->has_profile when every stage
 * has all three). A job whose backward is PyTorch's full backward (BW: B
 * and W in one op, never timed apart) has half of its BW median as B and
 * the rest as W, where the stage (or the job) has no B and W of their own
 * (r->bw_split): the schedules that split the backward play those halves,
 * and the job's own plan its BW, which the simulator plays at b + w, the
 * whole median. Where a stage ran both (PyTorch's DualPipeV), its BW
 * median is its bw (sched_costs.bw): PyTorch's split backward costs more
 * than its fused one. A stage that recomputes (RECOMPUTE spans,
 * --recompute) has its recompute's median in its B, which waits for it;
 * the job's B (and bw, med[3]: the BW median where the job also ran B and
 * W, else -1) the recompute median times the share of backwards that had
 * one. Every stage's comm and between are `gaps`'
 * (whatif_read_handoff). */
static int whatif_read_medians(sqlite3 *db, const job_summary *s, whatif_report *r, double med[4],
                               const sched_costs *gaps, pp_err *err) {
    balance_profile *bp = &r->profile;
    int S = bp->stages, rc = SQLITE_DONE;
    sqlite3_stmt *st;
    if (whatif_prepare_window(
            db,
            "SELECT CASE phase WHEN 'F' THEN 0 WHEN 'B' THEN 1 WHEN 'W' THEN 2 WHEN 'BW' THEN 3 "
            "ELSE 4 END, end_ns - start_ns - ?5 * min(max(coalesce(wait_cpu_ns, 0), 0),"
            " end_ns - start_ns), stage, rank, end_ns - start_ns FROM events" DB_LATEST_ATTEMPT_IN_WINDOW
            " WHERE job_id=?1 AND step BETWEEN ?2 AND ?3 AND source=?4 AND (phase IN "
            "('F','B','W','BW') OR (phase='SPAN' AND name='RECOMPUTE'))",
            s, r, &st, err) != 0)
        return -1;
    sqlite3_bind_text(st, 4, r->gpu ? "gpu" : "cpu", -1, SQLITE_STATIC);
    int net = r->shared_ranks > 0 && !r->gpu; /* each op less its wait for a core */
    sqlite3_bind_int(st, 5, net);
    double ran = 0, took = 0;
    /* by kind: F, B, W, BW, RECOMPUTE; the job's in d, each stage's in by_stage */
    durations d[5] = {{0}}, *by_stage = S > 0 ? calloc((size_t)S * 5, sizeof *by_stage) : NULL;
    int oom = S > 0 && !by_stage;
    for (int k = 0; k < S; k++) bp->rank[k] = -1;
    /* every pipeline of a --dp job runs each stage: its medians are over
     * all of them, so the table names them all (balance.h) */
    bp->replicas = s->nreplicas > 1 ? s->nreplicas : 1;
    bp->pipeline_ranks = s->world / bp->replicas;
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = sqlite3_column_int(st, 0), stage = sqlite3_column_int(st, 2);
        int64_t ns = sqlite3_column_int64(st, 1);
        ran += (double)ns, took += (double)sqlite3_column_int64(st, 4);
        oom = durations_push(&d[k], ns) != 0;
        if (oom || !by_stage || sqlite3_column_type(st, 2) == SQLITE_NULL || stage < 0 || stage >= S) continue;
        int rank = sqlite3_column_int(st, 3);
        if (bp->rank[stage] < 0 || rank < bp->rank[stage]) bp->rank[stage] = rank; /* the first pipeline's */
        oom = durations_push(&by_stage[stage * 5 + k], ns) != 0;
    }
    r->wait_cpu_share = net && took > 0 ? 1 - ran / took : NAN;
    r->recomputed = d[4].n > 0;
    int64_t bw = durations_median(&d[3]), recompute = durations_median(&d[4]);
    double recomputed = d[1].n + d[3].n ? (double)d[4].n / (double)(d[1].n + d[3].n) : 0;
    for (int k = 0; k < 5; k++) {
        if (k < 3) med[k] = (double)durations_median(&d[k]);
        free(d[k].v);
    }
    med[3] = -1;
    if (med[1] < 0 && med[2] < 0 && bw >= 0) {
        med[1] = (double)(bw / 2), med[2] = (double)(bw - bw / 2);
        r->bw_split = 1;
        r->bw_ns = bw;
    } else if (bw > 0) {
        med[3] = (double)bw;
    }
    /* sums in double: two medians of a damaged file's 2^62 would overflow an int64 */
    double again = recompute > 0 ? (double)recompute * (recomputed < 1 ? recomputed : 1) : 0;
    if (med[1] >= 0) med[1] += again;
    if (med[3] > 0) med[3] += again;
    int complete = !oom && by_stage;
    for (int k = 0; by_stage && k < S; k++) {
        double f = (double)durations_median(&by_stage[k * 5]), b = (double)durations_median(&by_stage[k * 5 + 1]);
        double w = (double)durations_median(&by_stage[k * 5 + 2]);
        int64_t sb = durations_median(&by_stage[k * 5 + 3]), again = durations_median(&by_stage[k * 5 + 4]);
        int split = b >= 0 || w >= 0; /* its own B and W: a BW beside them costs what it measured */
        if (!split && sb >= 0) b = (double)(sb / 2), w = (double)(sb - sb / 2);
        double more = again > 0 ? (double)again : 0;
        if (b >= 0) b += more;
        complete &= f >= 0 && b >= 0 && w >= 0;
        double fused = split && sb > 0 ? (double)sb + more : 0;
        bp->stage[k] = (sched_costs){f, b, w, gaps->comm, fused, gaps->between};
        for (int j = 0; j < 5; j++) free(by_stage[k * 5 + j].v);
    }
    free(by_stage);
    if (oom) {
        sqlite3_finalize(st);
        return pp_fail(err, "out of memory");
    }
    if (complete) {
        balance_fit(bp);
        r->has_profile = 1;
    }
    return whatif_done(db, st, rc, err);
}

/* The send cost the simulator plays (comm: from a producer's end to its
 * output being there for an op of another rank), as the window measured
 * it: the mean hand-off of the ops that waited for their input
 * (critpath_handoffs), of the spans the F, B and W medians are of (GPU
 * spans where the job has them: a PyTorch rank's host span ends when its
 * kernels are queued), 0 where none did (one rank) or clocks of two nodes
 * put it below 0. Not a send span's time: PyTorch's run from
 * the send's issue to a wait its schedule may defer to the step's end
 * (docs/torch.md), the engine's is only the copy that starts a hand-off.
 * The same walk gives `between` (sched_costs.between): the mean of a
 * rank's own time between two ops where the second's input was there,
 * what a PyTorch rank spends issuing and waiting on its sends and
 * receives and in Python between ops (the engine's, microseconds).
 * Means, not medians as for the ops: these times are skewed (most short,
 * a few a thread's wake-up or a collection long), a step adds them up, and
 * a PyTorch job's medians were a fifth to a half of its means
 * (docs/torch.md, "What-if").
 * With cores shared (r->shared_ranks) each is less the receiver's wait
 * for a core after its input came, as the ops are less theirs: the
 * schedules are played with a core per rank. The window's steps are
 * read from its last back until WHATIF_HANDOFFS of each are in: a step of
 * 1,024 ranks has thousands, and reading all 20 would add a third to what
 * `pprun stats` takes over such a job. */
#define WHATIF_HANDOFFS 4096
static int whatif_read_handoff(sqlite3 *db, const job_summary *s, const whatif_report *r, int64_t *comm,
                               int64_t *between, pp_err *err) {
    durations d = {0}, t = {0};
    int rc = 0;
    for (int step = r->last_step;
         rc == 0 && step >= r->first_step && (d.n < WHATIF_HANDOFFS || t.n < WHATIF_HANDOFFS); step--)
        rc = critpath_step_handoffs(db, s->job_id, step, r->gpu ? "gpu" : "cpu", r->shared_ranks > 0 && !r->gpu, &d,
                                    &t, err);
    int64_t handoff = durations_mean(&d), turn = durations_mean(&t);
    free(d.v), free(t.v);
    *comm = handoff > 0 ? handoff : 0;
    *between = turn > 0 ? turn : 0;
    return rc;
}

/* Appends a to a growing list; -1 when out of memory. */
static int whatif_push_action(sched_action **list, int *len, int *cap, sched_action a) {
    if (*len == *cap) {
        int want = *cap ? 2 * *cap : 64;
        sched_action *grown = realloc(*list, (size_t)want * sizeof *grown);
        if (!grown) return -1;
        *list = grown, *cap = want;
    }
    (*list)[(*len)++] = a;
    return 0;
}

/* The plan a job ran, from its plan table: each rank's actions in slot
 * order (a csv: job's schedule is in no generator, nor is a program's own:
 * PyTorch's). A BW (PyTorch's full backward) is one op, its input gradient
 * leaving at its end (docs/torch.md). Of a job of several pipelines, the
 * first one's ranks (every replica runs its plan). *out stays NULL when
 * the table does not hold a whole plan for the job's shape. */
static int whatif_read_plan(sqlite3 *db, const job_summary *s, const whatif_report *r, int p, sched_plan **out,
                            pp_err *err) {
    *out = NULL;
    int stages = r->stages, whole = p > 0 && stages > 0, oom = 0, rc = SQLITE_DONE;
    sqlite3_stmt *st;
    if (!whole) return 0;
    if (whatif_prepare(db, "SELECT rank, stage, phase, microbatch FROM plan WHERE job_id=?1 ORDER BY rank, slot", &st,
                       err) != 0)
        return -1;
    sqlite3_bind_int64(st, 1, s->job_id);
    sched_action **lists = calloc((size_t)p, sizeof *lists);
    int *lens = calloc((size_t)p, sizeof *lens), *caps = calloc((size_t)p, sizeof *caps);
    int *stage_rank = malloc((size_t)stages * sizeof *stage_rank);
    oom = !lists || !lens || !caps || !stage_rank;
    for (int k = 0; !oom && k < stages; k++) stage_rank[k] = -1;
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(st, 0), stage = sqlite3_column_int(st, 1), mb = sqlite3_column_int(st, 3);
        const char *phase = (const char *)sqlite3_column_text(st, 2);
        int op = phase ? analyze_phase_of(phase) : -1, fused = op == TRACE_BW;
        if (rank >= p && rank < s->world) continue; /* another replica's */
        if (rank < 0 || rank >= p || stage < 0 || stage >= stages || (op > TRACE_W && !fused) || op < 0 || mb < 0 ||
            mb >= r->in.microbatches || (stage_rank[stage] >= 0 && stage_rank[stage] != rank)) {
            whole = 0;
            continue;
        }
        stage_rank[stage] = rank;
        oom = whatif_push_action(&lists[rank], &lens[rank], &caps[rank],
                                 (sched_action){stage, fused ? SCHED_BW : op, mb}) != 0;
    }
    int failed = whatif_done(db, st, rc, err) != 0 || (oom && pp_fail(err, "out of memory"));
    for (int k = 0; whole && !failed && k < stages; k++) whole = stage_rank[k] >= 0;
    pp_err ignored; /* a plan the table holds but that does not build: no row of its own */
    if (whole && !failed &&
        sched_plan_from_lists(r->in.schedule, p, stages, r->in.virtual_stages, r->in.microbatches, stage_rank,
                              (sched_action *const *)lists, lens, out, &ignored) != 0)
        *out = NULL;
    for (int k = 0; lists && k < p; k++) free(lists[k]);
    free(lists), free(lens), free(caps), free(stage_rank);
    return failed ? -1 : 0;
}

/* The job's schedule simulated with each stage at each[stage]: its step
 * time, NAN when it does not play. */
static double whatif_step_at(const sched_plan *plan, const sched_costs *each) {
    sched_sim *sim = NULL;
    pp_err ignored;
    double step = sched_simulate_stages(plan, each, &sim, &ignored) == 0 ? sim->step_time : NAN;
    sched_sim_free(sim);
    return step;
}

/* Stage balance: the job's schedule at its stages' own costs and with all
 * of them at their mean, and the cuts that would even them out. */
static void whatif_balance(whatif_report *r) {
    const balance_profile *bp = &r->profile;
    const whatif_input *in = &r->in;
    int S = bp->stages;
    r->own_step_ns = r->equal_step_ns = r->cuts_bottleneck_ns = r->cuts_step_ns = NAN;
    r->bottleneck_ns = balance_bottleneck(bp->stage, S);
    sched_plan *built = NULL;
    const sched_plan *plan = in->own_plan;
    pp_err err;
    if (!plan && whatif_build(in, in->schedule, in->virtual_stages, 0, &built, &err) == 0) plan = built;
    if (!plan || plan->stages != S) {
        snprintf(r->no_cuts, sizeof r->no_cuts, "the job's schedule could not be rebuilt to simulate");
        sched_free(built);
        return;
    }
    sched_costs equal[BALANCE_MAX_STAGES], mean = {0, 0, 0, bp->stage[0].comm, 0, bp->stage[0].between};
    int fused = 0; /* a stage's BW at its own cost (bw), not its b + w */
    for (int k = 0; k < S; k++) fused |= bp->stage[k].bw > 0;
    for (int k = 0; k < S; k++) {
        const sched_costs *c = &bp->stage[k];
        mean.f += c->f / S, mean.b += c->b / S, mean.w += c->w / S;
        if (fused) mean.bw += sched_bw_cost(c) / S;
    }
    for (int k = 0; k < S; k++) equal[k] = mean;
    r->own_step_ns = whatif_step_at(plan, bp->stage);
    r->equal_step_ns = whatif_step_at(plan, equal);
    int cuts[BALANCE_MAX_STAGES - 1];
    if (r->shared_ranks > 0) {
        snprintf(r->no_cuts, sizeof r->no_cuts,
                 "%d ranks shared %d core%s: a stage's op times include its waits for a core, so they do not tell "
                 "which stage is slowest; measure with a core per rank",
                 r->shared_ranks, r->shared_cores, r->shared_cores == 1 ? "" : "s");
    } else if (r->shared_gpu_ranks > 0) {
        snprintf(r->no_cuts, sizeof r->no_cuts,
                 "%d ranks shared one GPU (%s): a stage's op times include its waits for the GPU, so they do not "
                 "tell which stage is slowest; measure with a GPU per rank",
                 r->shared_gpu_ranks, r->shared_gpu);
    } else if (!bp->layers_known) {
        snprintf(r->no_cuts, sizeof r->no_cuts, "%s",
                 in->fixed_op_costs ? "the model's op costs do not depend on a stage's layers"
                                    : "the job does not say which layers each stage held");
    } else if (S < 2) {
        snprintf(r->no_cuts, sizeof r->no_cuts, "one stage: nothing to cut");
    } else if (balance_best_cuts(bp, cuts, &err) != 0) {
        snprintf(r->no_cuts, sizeof r->no_cuts, "%.199s", err.msg);
    } else {
        double bound[BALANCE_MAX_STAGES + 1] = {0};
        for (int k = 1; k < S; k++) bound[k] = cuts[k - 1];
        bound[S] = bp->layers;
        sched_costs *at_cuts = equal; /* the mean's simulation is done: reuse its array */
        balance_chunk_costs(bp, bound, S, at_cuts);
        r->cuts_bottleneck_ns = balance_bottleneck(at_cuts, S);
        /* a split no better than 1% on its slowest stage is not worth a run */
        if (r->cuts_bottleneck_ns < 0.99 * r->bottleneck_ns) {
            r->ncuts = S - 1;
            memcpy(r->cuts, cuts, sizeof(int) * (size_t)(S - 1));
            r->cuts_step_ns = whatif_step_at(plan, at_cuts);
        } else {
            snprintf(r->no_cuts, sizeof r->no_cuts, "the job's split is already as even as whole layers allow");
        }
    }
    sched_free(built);
}

static int whatif_is_built_in(const char *schedule) {
    for (int k = 0; k < WHATIF_KINDS; k++)
        if (strcmp(schedule, whatif_kinds[k]) == 0) return 1;
    return 0;
}

/* The share of a ring all-reduce's bytes each rank sends: 2(D-1)/D. */
static double ring_share(int d) { return 2.0 * (d - 1) / d; }

/* Each stage's gradient all-reduce a step, into r->allreduce_ns (NAN for a
 * stage without one): its ALLREDUCE spans (REDUCE_SCATTER and ALL_GATHER
 * under --zero1) summed over the step's buckets, the mean over the stage's
 * ranks and the window's steps. */
static int whatif_read_allreduce(sqlite3 *db, const job_summary *s, whatif_report *r, pp_err *err) {
    for (int k = 0; k < BALANCE_MAX_STAGES; k++) r->allreduce_ns[k] = NAN;
    sqlite3_stmt *st;
    /* summed here, a (stage, rank, step) at a time, not by sum() in SQL:
     * see bounds_sum */
    if (whatif_prepare_window(db,
                              "SELECT stage, rank, step, start_ns, end_ns FROM events" DB_LATEST_ATTEMPT_IN_WINDOW
                              " WHERE job_id=?1 AND step BETWEEN ?2 AND ?3 AND source='cpu' AND phase='SPAN' AND "
                              "name IN ('ALLREDUCE','REDUCE_SCATTER','ALL_GATHER') AND stage IS NOT NULL "
                              "ORDER BY stage, rank, step",
                              s, r, &st, err) != 0)
        return -1;
    static const bounds_event_cols cols = {
        .rank = 1, .step = 2, .stage = 0, .microbatch = -1, .start = 3, .end = 4, .peer = -1, .bytes = -1};
    double total[BALANCE_MAX_STAGES] = {0};
    int64_t groups[BALANCE_MAX_STAGES] = {0}, group[3] = {-2, -2, -2}, t = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (bounds_event_row(st, &cols, s->job_id, err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        int64_t row[3] = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2)};
        if (row[0] < 0 || row[0] >= BALANCE_MAX_STAGES) continue;
        if (memcmp(row, group, sizeof row) != 0) {
            memcpy(group, row, sizeof row);
            groups[row[0]]++;
            t = 0;
        }
        int64_t ns = sqlite3_column_int64(st, 4) - sqlite3_column_int64(st, 3);
        if (bounds_sum(&bounds_time, &t, ns, s->job_id, "events.end_ns - start_ns", err) != 0) {
            sqlite3_finalize(st);
            return -1;
        }
        total[row[0]] += (double)ns;
    }
    for (int k = 0; k < BALANCE_MAX_STAGES; k++)
        if (groups[k]) r->allreduce_ns[k] = total[k] / (double)groups[k];
    return whatif_done(db, st, rc, err);
}

/* Fills r->dp_rows (whatif_report) for a job of several pipelines. */
static void whatif_dp(const job_summary *s, whatif_report *r) {
    r->dp = s->nreplicas, r->ndp = 0;
    int S = r->in.ranks * r->in.virtual_stages;
    if (s->nreplicas <= 1 || !s->replicas || s->steps <= 0 || s->step_time_ns <= 0 ||
        !whatif_is_built_in(r->in.schedule) || r->in.max_mem || S < 1 || S > BALANCE_MAX_STAGES)
        return;
    int64_t waited = 0;
    for (int d = 0; d < s->nreplicas; d++) waited += s->replicas[d].wait_dp_ns;
    r->exposed_allreduce_ns = (double)waited / ((double)s->world * (double)s->steps);
    static const int shape[WHATIF_DP_ROWS][2] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}}; /* times D, times m */
    int D = s->nreplicas, m = r->in.microbatches;
    double sim[WHATIF_DP_ROWS], ar[BALANCE_MAX_STAGES];
    for (int i = 0; i < WHATIF_DP_ROWS; i++) {
        double scale = ring_share(D * shape[i][0]) / ring_share(D);
        for (int k = 0; k < S; k++) ar[k] = isnan(r->allreduce_ns[k]) ? 0 : r->allreduce_ns[k] * scale;
        whatif_input in = r->in;
        in.microbatches = m * shape[i][1];
        in.own_plan = NULL;
        in.allreduce_ns = ar;
        whatif_row row;
        whatif_one(&in, r->in.schedule, 0, &row);
        sim[i] = row.error[0] ? NAN : row.dp_step_time_ns;
    }
    double step = (double)s->step_time_ns, rate = (double)D * m / step;
    for (int i = 0; i < WHATIF_DP_ROWS; i++) {
        whatif_dp_row *row = &r->dp_rows[r->ndp++];
        row->dp = D * shape[i][0], row->microbatches = m * shape[i][1];
        row->step_time_ns = i == 0 ? step : step + (sim[i] - sim[0]);
        row->throughput = (double)row->dp * row->microbatches / row->step_time_ns / rate;
    }
}

/* One row of whatif_read_rises: a rank's F/B/W/BW or RECOMPUTE span. */
typedef struct rise_row {
    int rank, attempt, step, stage, k; /* k: 0 F, 1 B, 2 RECOMPUTE, -1 W or BW */
    int64_t bytes, start, end;
} rise_row;

/* A rank's count within one step of one attempt, as whatif_read_rises
 * walks it: what the rank held (the sample of the op that ended last) and
 * when the ops so far ended. */
typedef struct rise_walk {
    int rank, attempt, step;
    int64_t held, held_end, ended;
} rise_walk;

/* row's rise into rise[] (n stages) when it is a clean sample: no other op
 * of its rank ran while it did (ended: the latest end before it; next: the
 * next row's start, INT64_MAX for none). The halves of an overlapped pair
 * (dualpipev) are not: a half's bytes, read at its end, catch the other
 * midway. The count moves on with the sample of the op that ended last,
 * which nothing ran beside (a recompute's bytes are a moment: the B rises
 * from before it). -1 when out of memory. */
static int whatif_rise(durations *rise, int n, rise_walk *w, const rise_row *row, int64_t next) {
    if (row->rank != w->rank || row->attempt != w->attempt || row->step != w->step)
        *w = (rise_walk){row->rank, row->attempt, row->step, 0, INT64_MIN, INT64_MIN};
    int clean = w->ended <= row->start && next >= row->end;
    if (clean && row->k >= 0 && row->stage >= 0 && row->stage < n &&
        durations_push(&rise[row->stage * 3 + row->k], row->bytes - w->held) != 0)
        return -1;
    if (row->k != 2 && row->end >= w->held_end) w->held = row->bytes, w->held_end = row->end;
    if (row->end > w->ended) w->ended = row->end;
    return 0;
}

/* Each stage's F and B rises over the window, into act[n] (n stages;
 * whatif_act_for, and whatif_read under recompute): rows of a rank's F/B/W
 * events in the order they ran, the count starting from 0 at each step
 * (every W of a step ran before the next step's first F), each rise from
 * a sample no other op of the rank ran beside (whatif_rise). high (NULL:
 * not wanted) gets each stage's bytes at the moment after its recompute,
 * from the rise of its RECOMPUTE spans' bytes over what the rank held
 * before (the B's rise is from there too), act[k].f where the stage
 * recomputed nothing. *missing gets the first stage without an F and a B
 * rise, -1 when none is. -1 with err on a database error. */
static int whatif_read_rises(sqlite3 *db, const job_summary *s, const whatif_report *r, int n, sched_act *act,
                             double *high, int *missing, pp_err *err) {
    sqlite3_stmt *st;
    if (whatif_prepare_window(db,
                              "SELECT rank, attempt, step, stage, phase, bytes, start_ns, end_ns FROM events WHERE "
                              "job_id=?1 AND step BETWEEN ?2 AND ?3 AND source='cpu' AND (phase IN ('F','B','W','BW') "
                              "OR (phase='SPAN' AND name='RECOMPUTE')) AND bytes IS NOT NULL ORDER BY rank, attempt, "
                              "step, start_ns",
                              s, r, &st, err) != 0)
        return -1;
    durations *rise = calloc((size_t)n * 3, sizeof *rise); /* [stage][F, B, RECOMPUTE] */
    int rc, oom = !rise, have = 0;
    rise_walk w = {-1, -1, -1, 0, INT64_MIN, INT64_MIN};
    rise_row prev = {0}; /* the row before, its rise taken once the next row's start is known */
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *phase = (const char *)sqlite3_column_text(st, 4);
        int k = !phase ? -1 : strcmp(phase, "F") == 0 ? 0 : strcmp(phase, "B") == 0 ? 1 : -1;
        if (phase && strcmp(phase, "SPAN") == 0) k = 2; /* RECOMPUTE, the query's only span */
        rise_row row = {sqlite3_column_int(st, 0), sqlite3_column_int(st, 1), sqlite3_column_int(st, 2),
                        sqlite3_column_int(st, 3), k, sqlite3_column_int64(st, 5), sqlite3_column_int64(st, 6),
                        sqlite3_column_int64(st, 7)};
        int same = have && row.rank == prev.rank && row.attempt == prev.attempt && row.step == prev.step;
        if (have) oom = whatif_rise(rise, n, &w, &prev, same ? row.start : INT64_MAX) != 0;
        prev = row, have = 1;
    }
    if (!oom && have) oom = whatif_rise(rise, n, &w, &prev, INT64_MAX) != 0;
    if (oom) {
        sqlite3_finalize(st);
        for (int k = 0; rise && k < 3 * n; k++) free(rise[k].v);
        free(rise);
        return pp_fail(err, "out of memory");
    }
    rc = whatif_done(db, st, rc, err);
    *missing = -1;
    for (int k = 0; k < n; k++) {
        int64_t f = durations_median(&rise[k * 3]), b = durations_median(&rise[k * 3 + 1]);
        if (*missing < 0 && (rise[k * 3].n == 0 || rise[k * 3 + 1].n == 0 || f <= 0)) *missing = k;
        act[k] = (sched_act){(double)f, (double)(f + b), 0};
        if (high) high[k] = (double)f + (rise[k * 3 + 2].n ? (double)durations_median(&rise[k * 3 + 2]) : 0);
    }
    for (int k = 0; k < 3 * n; k++) free(rise[k].v);
    free(rise);
    return rc;
}

/* Under recompute a microbatch holds far less between its F and its B
 * than from its B on: each stage's bytes after F, at its recompute and
 * after B, measured,
 * with the stages' layers (r->profile's), into r->act_profile for every
 * schedule's estimate to replay (whatif_input.act_profile). Left unset
 * where a stage recorded no bytes: the estimate then scales the peak as
 * without recompute. -1 with err on a database error. */
static int whatif_read_act_profile(sqlite3 *db, const job_summary *s, whatif_report *r, pp_err *err) {
    balance_profile *bp = &r->act_profile;
    int S = r->profile.stages, missing = -1;
    if (S < 1 || S != r->stages) return 0; /* more stages than a profile holds */
    sched_act act[BALANCE_MAX_STAGES];
    double high[BALANCE_MAX_STAGES];
    if (whatif_read_rises(db, s, r, S, act, high, &missing, err) != 0) return -1;
    if (missing >= 0) return 0;
    *bp = r->profile; /* its stages, layers and bounds; its costs replaced by bytes (w: at the recompute) */
    for (int k = 0; k < S; k++) bp->stage[k] = (sched_costs){act[k].f, act[k].b, high[k], 0, 0, 0};
    balance_fit(bp);
    r->in.act_profile = bp;
    return 0;
}

int whatif_read(sqlite3 *db, const job_summary *s, whatif_report *r, pp_err *err) {
    memset(r, 0, sizeof *r);
    if (whatif_read_job(db, s->job_id, r, err) != 0 || whatif_read_gpu_sharing(db, s->job_id, r, err) != 0 ||
        whatif_read_window(db, s, r, err) != 0)
        return -1;
    if (r->last_step < 0) return 0;
    double med[4];
    int64_t comm, between;
    if (whatif_read_handoff(db, s, r, &comm, &between, err) != 0) return -1;
    sched_costs gaps = {.comm = (double)comm, .between = (double)between};
    if (whatif_read_medians(db, s, r, med, &gaps, err) != 0) return -1;
    /* a job without a pipeline shape (`pprun launch`) has nothing to play */
    if (med[0] < 0 || med[1] < 0 || med[2] < 0 || r->in.microbatches < 1 || r->in.virtual_stages < 1) return 0;
    r->in.ranks = s->world / (s->nreplicas > 1 ? s->nreplicas : 1); /* one pipeline's: --dp replicates it */
    r->in.costs = (sched_costs){med[0], med[1], med[2], gaps.comm, med[3] > 0 ? med[3] : 0, gaps.between};
    r->in.act_peak_by_rank = s->act_peak_by_rank;
    r->in.inflight_by_rank = s->plan_peak_inflight;
    if (r->recomputed && whatif_read_act_profile(db, s, r, err) != 0) return -1;
    r->in.profile = r->has_profile ? &r->profile : NULL;
    sched_plan *own = NULL;
    if ((!whatif_is_built_in(r->in.schedule) || r->in.max_mem) && whatif_read_plan(db, s, r, r->in.ranks, &own, err) != 0)
        return -1;
    r->in.own_plan = own;
    r->nrows = whatif_simulate(&r->in, r->rows, err);
    if (r->nrows >= 0) r->ncurve = whatif_curve(&r->in, r->curve, r->no_curve, sizeof r->no_curve);
    if (r->nrows >= 0 && r->has_profile) whatif_balance(r);
    if (r->nrows >= 0 && s->nreplicas > 1 && whatif_read_allreduce(db, s, r, err) != 0) r->nrows = -1;
    if (r->nrows >= 0) whatif_dp(s, r);
    r->in.own_plan = NULL; /* freed here: r does not own it */
    sched_free(own);
    if (r->nrows < 0) return -1;
    r->measured = 1;
    return 0;
}

int whatif_read_sharing(sqlite3 *db, int64_t job, whatif_report *r, pp_err *err) {
    memset(r, 0, sizeof *r);
    return whatif_read_job(db, job, r, err) != 0 || whatif_read_gpu_sharing(db, job, r, err) != 0 ? -1 : 0;
}

int whatif_own_row(const whatif_report *r) {
    int own = -1;
    for (int k = 0; k < r->nrows; k++)
        if (r->rows[k].this_job && !r->rows[k].error[0]) own = k;
    return own;
}

/* Job `job`'s measured what-if into *s and *r (the caller frees s), for
 * another job of --model `model` to take `what` from. 0, or -1 with err
 * naming why not: no complete step measured yet, another model. */
static int whatif_measured_for(sqlite3 *db, int64_t job, const char *model, const char *what, job_summary *s,
                               whatif_report *r, pp_err *err) {
    if (summary_read(db, job, SUMMARY_NO_IDLE, s, err) != 0 || whatif_read(db, s, r, err) != 0) return -1;
    if (!r->measured)
        return pp_fail(err, "job %lld has no complete step with F, B and W spans to measure yet", (long long)job);
    if (strcmp(r->model, model) != 0)
        return pp_fail(err, "job %lld ran --model %s, this job --model %s: its %s do not carry over", (long long)job,
                       r->model, model, what);
    return 0;
}

int whatif_costs_for(sqlite3 *db, int64_t job, const char *model, int ranks, int v, sched_costs *out, char *about,
                     size_t about_size, pp_err *err) {
    job_summary s;
    whatif_report r;
    int rc = -1;
    if (whatif_measured_for(db, job, model, "op costs", &s, &r, err) != 0) goto out;
    /* a chunk here holds 1/(ranks*v) of the layers, there 1/(p*job_v), p
     * the ranks of one of its pipelines (r.in.ranks: --dp replicates it) */
    double scale = r.in.fixed_op_costs ? 1.0 : (double)r.in.ranks * r.in.virtual_stages / ((double)ranks * v);
    *out = whatif_scaled(&r.in.costs, scale);
    snprintf(about, about_size, "job %lld: medians of %s spans, hand-off and between ops their means, steps %d-%d",
             (long long)job, r.gpu ? "GPU" : "host", r.first_step, r.last_step);
    rc = 0;
out:
    summary_free(&s);
    return rc;
}

/* Job `job`'s layout as its config_json records it into *out; what it
 * leaves out is the default (the even split, no recompute: a program's
 * job, or a file from before the key). -1 with err on a database error. */
static int whatif_read_layout(sqlite3 *db, int64_t job, whatif_layout *out, pp_err *err) {
    sqlite3_stmt *st;
    if (whatif_prepare(db,
                       "SELECT json_extract(config_json, '$.pipeline_cuts'), json_extract(config_json, '$.recompute'), "
                       "json_extract(config_json, '$.recompute_stages') FROM jobs WHERE id=?1",
                       &st, err) != 0)
        return -1;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    const unsigned char *cuts = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    const unsigned char *mode = rc == SQLITE_ROW ? sqlite3_column_text(st, 1) : NULL;
    const unsigned char *which = rc == SQLITE_ROW ? sqlite3_column_text(st, 2) : NULL;
    /* cut short, two layouts that differ past the cut would read the same */
    if (snprintf(out->cuts, sizeof out->cuts, "%s", cuts && *cuts ? (const char *)cuts : "even") >=
            (int)sizeof out->cuts ||
        snprintf(out->recompute, sizeof out->recompute, "%s", mode && *mode ? (const char *)mode : "none") >=
            (int)sizeof out->recompute ||
        snprintf(out->recompute_stages, sizeof out->recompute_stages, "%s", which ? (const char *)which : "") >=
            (int)sizeof out->recompute_stages) {
        sqlite3_finalize(st);
        return pp_fail(err, "job %lld: config_json's pipeline_cuts, recompute or recompute_stages is longer than "
                            "pprun writes them: the database is damaged or was not written by pprun",
                       (long long)job);
    }
    return whatif_done(db, st, rc, err);
}

/* What a layout recomputes on stage s: its --recompute where its
 * --recompute-stages name s (or name none: every stage), else "none". */
static const char *whatif_recompute_of(const whatif_layout *l, int s) {
    if (strcmp(l->recompute, "none") == 0 || !l->recompute_stages[0]) return l->recompute;
    for (const char *p = l->recompute_stages; *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p) break; /* not a list pprun wrote: names no stage */
        if (k == s) return l->recompute;
        p = *end == ',' ? end + 1 : end;
    }
    return "none";
}

/* Whether a and b put the same layers on each of `stages` stages of
 * `model`: their splits compared, or, where either does not split it
 * (layers unknown, cuts that do not fit), their texts. */
static int whatif_same_split(const char *model, int stages, const char *a, const char *b) {
    model_spec spec;
    pp_err ignored;
    int *cuts[2] = {NULL, NULL}, ncuts[2] = {0, 0}, same = -1;
    int *first[2] = {malloc(sizeof(int) * (size_t)(stages + 1)), malloc(sizeof(int) * (size_t)(stages + 1))};
    const char *text[2] = {a, b};
    int ok = first[0] && first[1] && model_parse_spec(model, &spec, &ignored) == 0 && spec.layers > 0;
    for (int i = 0; ok && i < 2; i++)
        ok = sched_parse_cuts(text[i], &cuts[i], &ncuts[i], &ignored) == 0 &&
             sched_partition(spec.layers, stages, cuts[i], ncuts[i], first[i], &ignored) == 0;
    if (ok) same = memcmp(first[0], first[1], sizeof(int) * (size_t)(stages + 1)) == 0;
    for (int i = 0; i < 2; i++) free(cuts[i]), free(first[i]);
    return same >= 0 ? same : strcmp(a, b) == 0;
}

/* "--recompute full --recompute-stages 1,2" for l into buf. */
static const char *whatif_recompute_text(const whatif_layout *l, char *buf, size_t size) {
    if (strcmp(l->recompute, "none") != 0 && l->recompute_stages[0])
        snprintf(buf, size, "--recompute %s --recompute-stages %.200s", l->recompute, l->recompute_stages);
    else snprintf(buf, size, "--recompute %s", l->recompute);
    return buf;
}

/* 0 when job `job` (its layout `had`) held on each of `stages` stages of
 * `model` what this job (`want`) will: the same layers, the same
 * recompute; else -1 with err naming both. */
static int whatif_same_layout(int64_t job, const char *model, int stages, const whatif_layout *had,
                              const whatif_layout *want, pp_err *err) {
    static const char *const instead =
        "(give --max-mem in bytes without --schedule-costs DB:JOB to bound by the model's sizes)";
    if (!whatif_same_split(model, stages, had->cuts, want->cuts))
        return pp_fail(err,
                       "job %lld ran --pipeline-cuts %.200s, this job --pipeline-cuts %.200s: its bytes per stage do "
                       "not carry over to another split %s",
                       (long long)job, had->cuts, want->cuts, instead);
    for (int s = 0; s < stages; s++) {
        if (strcmp(whatif_recompute_of(had, s), whatif_recompute_of(want, s)) == 0) continue;
        char a[600], b[600];
        return pp_fail(err, "job %lld ran %s, this job %s: its bytes per stage do not carry over to another "
                            "recompute (stage %d: %s there, %s here) %s",
                       (long long)job, whatif_recompute_text(had, a, sizeof a),
                       whatif_recompute_text(want, b, sizeof b), s, whatif_recompute_of(had, s),
                       whatif_recompute_of(want, s), instead);
    }
    return 0;
}

int whatif_act_for(sqlite3 *db, int64_t job, const char *model, int stages, const whatif_layout *layout,
                   sched_act *act, char *about, size_t about_size, pp_err *err) {
    job_summary s;
    whatif_report r;
    whatif_layout had;
    int rc = -1, missing;
    if (whatif_measured_for(db, job, model, "activation bytes", &s, &r, err) != 0) goto out;
    if (r.stages != stages) {
        pp_fail(err, "job %lld ran %d stages, this job has %d: its bytes per stage do not carry over to another split "
                     "(give --max-mem in bytes without --schedule-costs DB:JOB to bound by the model's sizes)",
                (long long)job, r.stages, stages);
    } else if (whatif_read_layout(db, job, &had, err) != 0 ||
               whatif_same_layout(job, model, stages, &had, layout, err) != 0) {
    } else if (whatif_read_rises(db, &s, &r, stages, act, NULL, &missing, err) != 0) {
    } else if (missing >= 0) {
        pp_fail(err, "job %lld recorded no activation bytes for stage %d's F and B (a program's own spans, or a "
                     "trace from before pprun counted them)", (long long)job, missing);
    } else {
        snprintf(about, about_size, "job %lld: medians of its F and B bytes, steps %d-%d", (long long)job,
                 r.first_step, r.last_step);
        rc = 0;
    }
out:
    summary_free(&s);
    return rc;
}

int whatif_play_job_plan(sqlite3 *db, const job_summary *js, const whatif_report *jw, const whatif_input *in,
                         whatif_row *row, pp_err *err) {
    whatif_row_init(row, jw->in.schedule, jw->in.virtual_stages);
    int p = js->world / (js->nreplicas > 1 ? js->nreplicas : 1); /* one pipeline's: --dp replicates it */
    sched_plan *plan = NULL;
    if (whatif_read_plan(db, js, jw, p, &plan, err) != 0) return -1;
    if (!plan)
        snprintf(row->error, sizeof row->error, "job %lld's plan is not in the database whole", (long long)js->job_id);
    else if (p != in->ranks || plan->microbatches != in->microbatches)
        snprintf(row->error, sizeof row->error, "job %lld ran %d ranks and %d microbatches a pipeline, the what-if %d "
                 "and %d", (long long)js->job_id, p, plan->microbatches, in->ranks, in->microbatches);
    else whatif_play_plan(in, plan, row);
    sched_free(plan);
    return 0;
}
