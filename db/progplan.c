/* progplan.c: a program's own schedule into jobs and plan, and its
 * simulated timeline (progplan.h). */
#include "db/progplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/analyze.h"
#include "sched/sched.h"

/* Runs one statement with its integer and text bindings (NULL text: none). */
static int run(sqlite3 *sql, const char *text, const int64_t *ints, int nints, const char *const *texts, int ntexts) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql, text, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    for (int i = 0; i < nints; i++) sqlite3_bind_int64(st, i + 1, ints[i]);
    for (int i = 0; i < ntexts; i++) sqlite3_bind_text(st, nints + i + 1, texts[i], -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc;
}

int progplan_declare(sqlite3 *sql, int64_t job, int rank, const char *name, const trace_event *e, int first) {
    int ranks = e->sched.ranks, stages = e->sched.stages;
    int v = ranks > 0 && stages % ranks == 0 ? stages / ranks : 1;
    int64_t ints[] = {job, stages, e->sched.microbatches, v};
    const char *texts[] = {name};
    int rc = run(sql, "UPDATE jobs SET stages=?2, microbatches=?3, virtual_stages=?4, schedule=?5 WHERE id=?1", ints, 4,
                 texts, 1);
    if (rc != SQLITE_DONE) return rc;
    int64_t which[] = {job, rank};
    return first ? run(sql, "DELETE FROM plan WHERE job_id=?1", which, 1, NULL, 0)
                 : run(sql, "DELETE FROM plan WHERE job_id=?1 AND rank=?2", which, 2, NULL, 0);
}

static const char *op_name(int op) {
    return op == TRACE_BW ? "BW" : op == TRACE_B ? "B" : op == TRACE_W ? "W" : "F";
}

int progplan_action(sqlite3 *sql, int64_t job, int rank, const trace_event *e) {
    char action[48];
    snprintf(action, sizeof action, "%d%s%d", e->plan.stage, op_name(e->plan.op), e->plan.microbatch);
    int64_t ints[] = {job, rank, e->plan.slot, e->plan.stage, e->plan.microbatch};
    const char *texts[] = {action, op_name(e->plan.op)};
    return run(sql,
               "INSERT OR REPLACE INTO plan(job_id,rank,slot,stage,microbatch,action,phase,sim_start_ns,sim_end_ns)"
               " VALUES(?1,?2,?3,?4,?5,?6,?7,NULL,NULL)",
               ints, 5, texts, 2);
}

/* ---- simulation ------------------------------------------------------------ */

/* One plan row, and where its span is among the simulator's actions. */
typedef struct row {
    int rank, slot, stage, op, mb; /* op: TRACE_F, B, W or BW */
    int index;                     /* its action in the rank's list */
} row;

typedef struct rows {
    row *v;
    size_t n, cap;
} rows;

static int rows_read(sqlite3 *sql, int64_t job, rows *out) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql, "SELECT rank, slot, stage, phase, microbatch FROM plan WHERE job_id=?1"
                                     " ORDER BY rank, slot", -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    sqlite3_bind_int64(st, 1, job);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 256;
            row *v = realloc(out->v, cap * sizeof *v);
            if (!v) {
                rc = SQLITE_NOMEM;
                break;
            }
            out->v = v, out->cap = cap;
        }
        const char *ph = (const char *)sqlite3_column_text(st, 3);
        out->v[out->n++] = (row){.rank = sqlite3_column_int(st, 0), .slot = sqlite3_column_int(st, 1),
                                 .stage = sqlite3_column_int(st, 2), .op = analyze_phase_of(ph),
                                 .mb = sqlite3_column_int(st, 4)};
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Every row as it is to be stored: replica d's (rank / p, p the
 * pipeline's ranks) under the step's global microbatches, d·m + mb, as
 * its ops are numbered and as pprun's --dp jobs store their plans
 * (docs/schema.md): a program declares its rank's plan in its replica's
 * own numbers (rows already global stay); and, with sim, its simulated
 * times: those of its action on rank mod p (every replica runs pipeline
 * 0's plan). */
static int write_rows(sqlite3 *sql, int64_t job, rows *rs, int p, int m, const sched_sim *sim) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql,
                                "UPDATE plan SET microbatch=?4, action=?5, sim_start_ns=coalesce(?6, sim_start_ns),"
                                " sim_end_ns=coalesce(?7, sim_end_ns) WHERE job_id=?1 AND rank=?2 AND slot=?3",
                                -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    rc = sqlite3_exec(sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    for (size_t i = 0; i < rs->n && rc == SQLITE_OK; i++) {
        row *r = &rs->v[i];
        if (r->mb < m) r->mb += r->rank / p * m;
        char action[48];
        snprintf(action, sizeof action, "%d%s%d", r->stage, op_name(r->op), r->mb);
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_int(st, 2, r->rank);
        sqlite3_bind_int(st, 3, r->slot);
        sqlite3_bind_int(st, 4, r->mb);
        sqlite3_bind_text(st, 5, action, -1, SQLITE_TRANSIENT);
        if (sim) {
            const sched_span *sp = &sim->spans[r->rank % p][r->index];
            sqlite3_bind_int64(st, 6, (int64_t)sp->start);
            sqlite3_bind_int64(st, 7, (int64_t)sp->end);
        }
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(sql);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) {
        sqlite3_exec(sql, "ROLLBACK", NULL, NULL, NULL);
        return rc;
    }
    return sqlite3_exec(sql, "COMMIT", NULL, NULL, NULL);
}

/* The job's name (for the simulator's messages) and microbatches. */
static int job_shape(sqlite3 *sql, int64_t job, char *name, size_t n, int *microbatches) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(sql, "SELECT schedule, microbatches FROM jobs WHERE id=?1", -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    sqlite3_bind_int64(st, 1, job);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(name, n, "%s", (const char *)sqlite3_column_text(st, 0));
        *microbatches = sqlite3_column_int(st, 1);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_NOTFOUND : rc;
}

/* The sched_op of a plan row's phase (TRACE_F, B, W or BW). */
static int sched_op_of(int trace_op) {
    return trace_op == TRACE_F ? SCHED_F : trace_op == TRACE_B ? SCHED_B : trace_op == TRACE_W ? SCHED_W : SCHED_BW;
}

/* The pipeline's ranks P of a job of `world` ranks whose stages each sit on
 * the same number D of ranks (data-parallel replicas: P = world / D), in
 * pprun's layout: pipelines of P consecutive ranks, rank r being pipeline
 * rank r mod P of replica r / P (docs/cli.md, "Rank layout"), each with
 * pipeline 0's plan, its microbatches the replica's own (below m) or the
 * step's global ones of its replica (globalize). rs is ordered by rank and
 * slot, lens[r] the rows of rank r, every rank below world with some. 0
 * and err when the rows are not such a mesh. */
static int pipeline_ranks(const rows *rs, const int *lens, int world, int stages, int m, pp_err *err,
                          const char *what) {
    int *seen = malloc(sizeof(int) * (size_t)stages), *copies = calloc((size_t)stages, sizeof(int));
    int p = 0;
    if (!seen || !copies) {
        pp_fail(err, "%s: out of memory", what);
        goto done;
    }
    for (int s = 0; s < stages; s++) seen[s] = -1;
    for (size_t i = 0; i < rs->n; i++)
        if (seen[rs->v[i].stage] != rs->v[i].rank) seen[rs->v[i].stage] = rs->v[i].rank, copies[rs->v[i].stage]++;
    if (copies[0] == 0) { /* a rank's plan alone never names stage 0 */
        pp_fail(err, "%s: no rank runs stage 0: not replicas of one pipeline", what);
        goto done;
    }
    for (int s = 0; s < stages; s++)
        if (copies[s] != copies[0] || world % copies[0] != 0) {
            pp_fail(err, "%s: stage 0 is on %d of the %d ranks, stage %d on %d: not replicas of one pipeline", what,
                    copies[0], world, s, copies[s]);
            goto done;
        }
    p = world / copies[0];
    /* Rank r's rows must be rank r mod P's: ranks' rows are consecutive in rs. */
    for (size_t i = 0, first_of_rank = 0; i < rs->n; i++) {
        const row *r = &rs->v[i];
        if (i > 0 && r->rank != rs->v[i - 1].rank) first_of_rank = i;
        if (r->mb >= m && r->mb / m != r->rank / p) {
            pp_fail(err, "%s: rank %d slot %d: microbatch %d is not of its replica %d (%d a replica)", what, r->rank,
                    r->slot, r->mb, r->rank / p, m);
            p = 0;
            goto done;
        }
        if (r->rank < p) continue;
        size_t twin = 0; /* rank r mod P's row of the same index */
        for (int k = 0; k < r->rank % p; k++) twin += (size_t)lens[k];
        twin += i - first_of_rank;
        const row *t = &rs->v[twin];
        if (lens[r->rank] != lens[r->rank % p] || t->stage != r->stage || t->op != r->op ||
            t->mb % m != r->mb % m) {
            pp_fail(err, "%s: rank %d's plan is not rank %d's: replicas of one pipeline of %d consecutive ranks "
                    "(pprun's layout) are simulated, not this mesh", what, r->rank, r->rank % p, p);
            p = 0;
            goto done;
        }
    }
done:
    free(seen), free(copies);
    return p;
}

/* Each rank's ranks.stages: the stages its plan runs (a ZBVZeroBubble's V
 * puts stages 0 and 3 on rank 0), not the launcher's placement, which knew
 * nothing of the program's schedule. */
static int ranks_hold_their_plans_stages(sqlite3 *sql, int64_t job) {
    int64_t ints[] = {job};
    return run(sql,
               "UPDATE ranks SET stages=(SELECT group_concat(stage, ',') FROM (SELECT DISTINCT stage FROM plan"
               " WHERE job_id=?1 AND rank=ranks.rank ORDER BY stage)) WHERE job_id=?1 AND rank IN"
               " (SELECT DISTINCT rank FROM plan WHERE job_id=?1)",
               ints, 1, NULL, 0);
}

int progplan_simulate(db *d, int64_t job, int first_step, int last_step, pp_err *err) {
    sqlite3 *sql = db_sqlite(d);
    char what[64], name[64] = "";
    snprintf(what, sizeof what, "simulating the program's plan of job %lld", (long long)job);
    rows rs = {0};
    int m = 0, ranks = 0, stages = 0, result = 0;
    int rc = rows_read(sql, job, &rs);
    if (rc == SQLITE_OK) rc = job_shape(sql, job, name, sizeof name, &m);
    if (rc != SQLITE_OK) {
        free(rs.v);
        return db_fail(d, rc, what, err);
    }
    /* The counts come from the rows, which a damaged or forged file may
     * fill with any number: a plan has an action on every rank and of every
     * stage, so neither count is more than the rows, and none past pprun's
     * bounds (base/shape.h); a row past them is refused before anything is
     * allocated by it. */
    pp_err bad;
    if (pp_shape_check_upper(1, 1, m, &bad) != 0) {
        free(rs.v);
        pp_fail(err, "%s: the job's row declares %s: the database is damaged", what, bad.msg);
        return 0; /* as a plan the simulator refuses: none will play */
    }
    for (size_t i = 0; i < rs.n; i++) {
        const row *r = &rs.v[i];
        if (r->rank < 0 || (size_t)r->rank >= rs.n || r->stage < 0 || (size_t)r->stage >= rs.n ||
            r->stage >= PP_SHAPE_MAX_STAGES) {
            pp_fail(err, "%s: plan row rank %d slot %d stage %d is not of a plan of %zu actions with at most %d "
                         "stages: the database is damaged", what, r->rank, r->slot, r->stage, rs.n, PP_SHAPE_MAX_STAGES);
            free(rs.v); /* after the message: r points into it */
            return 0;   /* as a plan the simulator refuses: none will play */
        }
        if (r->rank + 1 > ranks) ranks = r->rank + 1;
        if (r->stage + 1 > stages) stages = r->stage + 1;
    }
    int *stage_rank = malloc(sizeof(int) * (size_t)(stages ? stages : 1));
    unsigned *ops = calloc((size_t)(stages ? stages : 1), sizeof *ops);
    int *lens = calloc((size_t)(ranks ? ranks : 1), sizeof(int));
    sched_action **lists = calloc((size_t)(ranks ? ranks : 1), sizeof *lists);
    int64_t *med = malloc(sizeof(int64_t) * 4 * (size_t)(stages ? stages : 1));
    sched_costs *costs = malloc(sizeof *costs * (size_t)(stages ? stages : 1));
    sched_plan *plan = NULL;
    sched_sim *sim = NULL;
    int p = ranks, replicated = 0; /* the pipeline's ranks: all of them, but for data-parallel replicas */
    if (!stage_rank || !ops || !lens || !lists || !med || !costs) {
        result = pp_fail(err, "%s: out of memory", what);
        goto done;
    }
    if (rs.n == 0 || m < 1) goto done;
    for (int s = 0; s < stages; s++) stage_rank[s] = -1;
    /* Each rank's list, one action per row (a BW is one op). */
    for (size_t i = 0; i < rs.n; i++) {
        row *r = &rs.v[i];
        /* a replica's rows may be under the step's global numbers, below
         * m·ranks (pipeline_ranks checks each is its replica's) */
        if (r->op < 0 || (r->op > TRACE_W && r->op != TRACE_BW) || r->stage < 0 || r->mb < 0 ||
            r->mb >= (int64_t)m * ranks) {
            pp_fail(err, "%s: rank %d slot %d is not an action of this job's shape", what, r->rank, r->slot);
            goto done;
        }
        if (stage_rank[r->stage] >= 0 && stage_rank[r->stage] != r->rank) replicated = 1;
        stage_rank[r->stage] = r->rank;
        ops[r->stage] |= 1u << sched_op_of(r->op);
        r->index = lens[r->rank]++;
    }
    for (int k = 0; k < ranks; k++)
        if (lens[k] == 0) goto done; /* a rank has not declared its plan yet */
    if ((rc = ranks_hold_their_plans_stages(sql, job)) != SQLITE_DONE) {
        result = db_fail(d, rc, what, err);
        goto done;
    }
    if (replicated && !(p = pipeline_ranks(&rs, lens, ranks, stages, m, err, what))) goto done;
    for (size_t i = 0; !replicated && i < rs.n; i++)
        if (rs.v[i].mb >= m) {
            pp_fail(err, "%s: rank %d slot %d is not an action of this job's shape", what, rs.v[i].rank, rs.v[i].slot);
            goto done;
        }
    /* replicas' rows still in their own numbers: renumbered now, whether or
     * not the plan is simulated below (once: then they are global) */
    int local = 0;
    for (size_t i = 0; replicated && i < rs.n; i++) local |= rs.v[i].rank >= p && rs.v[i].mb < m;
    if (local && (rc = write_rows(sql, job, &rs, p, m, NULL)) != SQLITE_OK) {
        result = db_fail(d, rc, what, err);
        goto done;
    }
    /* Pipeline 0's ranks: each stage on one of them. */
    for (int s = 0; s < stages; s++) stage_rank[s] = -1;
    for (size_t i = 0; i < rs.n && rs.v[i].rank < p; i++) stage_rank[rs.v[i].stage] = rs.v[i].rank;
    for (int s = 0; s < stages; s++)
        if (stage_rank[s] < 0) goto done;
    for (int k = 0; k < p; k++)
        if (!(lists[k] = malloc(sizeof(sched_action) * (size_t)lens[k]))) {
            result = pp_fail(err, "%s: out of memory", what);
            goto done;
        }
    for (size_t i = 0; i < rs.n && rs.v[i].rank < p; i++) {
        const row *r = &rs.v[i];
        lists[r->rank][r->index] = (sched_action){r->stage, sched_op_of(r->op), r->mb};
    }
    if (db_op_medians(d, job, first_step, last_step, stages, med, err) != 0) {
        result = -1;
        goto done;
    }
    if (!analyze_plan_costs(med, ops, stages, costs)) goto done; /* not measured at this step */
    if (sched_plan_from_lists(name, p, stages, stages % p == 0 ? stages / p : 1, m, stage_rank, lists, lens, &plan,
                              err) != 0 ||
        sched_simulate_stages(plan, costs, &sim, err) != 0)
        goto done; /* 0, with err saying why */
    rc = write_rows(sql, job, &rs, p, m, sim);
    result = rc == SQLITE_OK ? 1 : db_fail(d, rc, what, err);
done:
    for (int k = 0; lists && k < ranks; k++) free(lists[k]);
    free(lists), free(lens), free(stage_rank), free(ops), free(med), free(costs), free(rs.v);
    sched_free(plan);
    sched_sim_free(sim);
    return result;
}
