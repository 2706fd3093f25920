/* compare.c: two jobs side by side (compare.h): their configurations
 * value by value, the other job's what-if row for this job's schedule,
 * their losses at the latest step both have, microbatch by microbatch, and
 * their critical paths. */
#include "db/compare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bounds.h"

/* What makes two jobs less than like for like, as SQL over `jobs` (with
 * cj: config_json when it is valid JSON, else '{}'). NULL: not recorded
 * (config_json of an older pprun), never named as a difference. */
static const struct {
    const char *what, *sql;
} compare_fields[COMPARE_FIELDS] = {
    {"model", "model"},
    {"ranks", "world_size"},
    {"nodes", "nnodes"},
    {"microbatches", "microbatches"},
    {"stages", "stages"},
    {"virtual stages", "virtual_stages"},
    {"device", "device"},
    {"dtype", "json_extract(cj, '$.dtype')"},
    {"transport", "json_extract(cj, '$.transport')"},
    {"cupti", "json_extract(cj, '$.cupti')"},
    {"mps", "json_extract(cj, '$.mps')"},
    {"seed", "json_extract(cj, '$.seed')"},
    {"data", "json_extract(cj, '$.data')"},
    {"optimizer", "json_extract(cj, '$.optimizer')"},
    {"lr", "CASE WHEN json_extract(cj, '$.lr') IS NOT NULL THEN printf('%g', json_extract(cj, '$.lr')) END"},
    {"weight decay", "CASE WHEN json_extract(cj, '$.weight_decay') IS NOT NULL"
                     " THEN printf('%g', json_extract(cj, '$.weight_decay')) END"},
    {"pipeline cuts", "json_extract(cj, '$.pipeline_cuts')"},
    {"recompute", "json_extract(cj, '$.recompute') || coalesce(' (stages ' || json_extract(cj, '$.recompute_stages')"
                  " || ')', '')"},
    {"pipelines (--dp)", "json_extract(cj, '$.dp')"},
};

/* A job's compare_fields as text (NULL: not recorded) and whether its
 * zb-v order was built for given costs (--schedule-costs). */
typedef struct compare_config {
    char value[COMPARE_FIELDS][256];
    int recorded[COMPARE_FIELDS];
    int schedule_costs;
} compare_config;

static int compare_read_config(sqlite3 *db, int64_t job, compare_config *cfg, pp_err *err) {
    char sql[4096];
    size_t n = (size_t)snprintf(sql, sizeof sql, "SELECT json_extract(cj, '$.schedule_costs') IS NOT NULL");
    for (int k = 0; k < COMPARE_FIELDS; k++)
        n += (size_t)snprintf(sql + n, sizeof sql - n, ", %s", compare_fields[k].sql);
    snprintf(sql + n, sizeof sql - n,
             " FROM (SELECT *, CASE WHEN json_valid(config_json) THEN config_json ELSE '{}' END AS cj "
             "FROM jobs WHERE id=?1)");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    memset(cfg, 0, sizeof *cfg);
    if (rc == SQLITE_ROW) {
        cfg->schedule_costs = sqlite3_column_int(st, 0);
        for (int k = 0; k < COMPARE_FIELDS; k++) {
            const unsigned char *v = sqlite3_column_text(st, k + 1);
            cfg->recorded[k] = v != NULL;
            snprintf(cfg->value[k], sizeof cfg->value[k], "%s", v ? (const char *)v : "");
        }
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_DONE) return pp_fail(err, "no job %lld in this database", (long long)job);
    return rc == SQLITE_ROW ? 0 : pp_fail(err, "database error: %s", sqlite3_errmsg(db));
}

/* A --dp the program's plan does not follow ran as one pipeline
 * (summary_dp): its value says so, as pprun stats does, rather than the
 * option alone. */
static void compare_note_layout(compare_config *cfg, const job_summary *s) {
    for (int k = 0; k < COMPARE_FIELDS; k++)
        if (s->dp_unlaid && cfg->recorded[k] && strcmp(compare_fields[k].what, "pipelines (--dp)") == 0)
            snprintf(cfg->value[k], sizeof cfg->value[k], "1 (--dp %d is not the program's layout)", s->dp_unlaid);
}

/* Which of ow's rows played the schedule jw's job ran, or why none did;
 * `bounded` (NULL unless the job ran under --max-mem) is the job's own
 * order played at ow's costs, which stands for it instead. */
static void compare_predict(const job_summary *js, const whatif_report *jw, const job_summary *os,
                            const whatif_report *ow, int schedule_costs, const whatif_row *bounded, job_compare *c) {
    long long job = (long long)js->job_id, other = (long long)os->job_id;
    const char *schedule = jw->in.schedule;
    c->predicted = -1;
    c->own = whatif_own_row(ow);
    if (!ow->measured) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld has no complete step with F, B and W spans to simulate from",
                 other);
        return;
    }
    if (strncmp(schedule, "csv:", 4) == 0) {
        const char *slash = strrchr(schedule, '/');
        snprintf(c->why_not, sizeof c->why_not, "job %lld ran a csv file (csv:%.100s), which no what-if plays", job,
                 slash ? slash + 1 : schedule + 4);
        return;
    }
    char shape[160] = "";
    size_t n = 0;
    if (js->world != os->world)
        n += (size_t)snprintf(shape + n, sizeof shape - n, ", ranks %d against %d", js->world, os->world);
    if (jw->in.microbatches != ow->in.microbatches)
        n += (size_t)snprintf(shape + n, sizeof shape - n, ", microbatches %d against %d", jw->in.microbatches,
                              ow->in.microbatches);
    if (strcmp(jw->model, ow->model) != 0) snprintf(shape + n, sizeof shape - n, ", another model");
    if (shape[0]) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld's what-if plays its own shape only; job %lld has%s", other,
                 job, shape + 1);
        return;
    }
    int tuned = schedule_costs && strcmp(schedule, "zb-v") == 0, named = -1;
    for (int k = 0; k < ow->nrows; k++)
        if (strcmp(ow->rows[k].schedule, schedule) == 0 && ow->rows[k].tuned == tuned) named = k;
    if (named < 0 && !bounded) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld's schedule '%.100s' is none that a what-if plays", job,
                 schedule);
        return;
    }
    /* a bound changes zb-h1's and zb-v's order: the other's row of the
     * schedule is the unbounded one, so the job's own order stands in */
    const whatif_row *row = bounded ? bounded : &ow->rows[named];
    char bound[24];
    if (bounded && row->error[0]) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld ran %.60s --max-mem %.20s, an order of its own, and job "
                 "%lld's what-if could not play it: %.150s", job, schedule,
                 whatif_max_mem_text(jw->in.max_mem, bound), other, row->error);
        return;
    }
    if (row->virtual_stages != jw->in.virtual_stages) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld's what-if plays %s at %d chunks per rank, job %lld ran %d",
                 other, row->schedule, row->virtual_stages, job, jw->in.virtual_stages);
        return;
    }
    if (row->error[0]) {
        snprintf(c->why_not, sizeof c->why_not, "job %lld's what-if could not play %s: %.200s", other, row->schedule,
                 row->error);
        return;
    }
    c->predicted_ns = row->step_time_ns;
    const balance_profile *a = &jw->profile, *b = &ow->profile;
    int S = a->stages;
    if (a->layers_known && b->layers_known && S == b->stages &&
        memcmp(a->bound, b->bound, sizeof(int) * (size_t)(S + 1)) != 0) {
        char mine[BALANCE_MAX_STAGES * 6], theirs[BALANCE_MAX_STAGES * 6];
        sched_cuts_text(a->bound + 1, S - 1, mine, sizeof mine);
        sched_cuts_text(b->bound + 1, S - 1, theirs, sizeof theirs);
        if (!row->this_job || ow->ncuts != S - 1 || memcmp(ow->cuts, a->bound + 1, sizeof(int) * (size_t)(S - 1))) {
            snprintf(c->why_not, sizeof c->why_not,
                     "job %lld split the layers at %.60s, job %lld at %.60s: a what-if plays its own split, and its "
                     "own schedule at the cuts it suggests", job, mine, other, theirs);
            return;
        }
        c->predicted_ns = ow->cuts_step_ns, c->by_cuts = 1;
    }
    c->row = *row;
    if (bounded) snprintf(c->max_mem, sizeof c->max_mem, "%s", whatif_max_mem_text(jw->in.max_mem, bound));
    c->predicted = 1;
}

/* One job's losses at a step, in microbatch order; the owner frees mb. */
typedef struct compare_losses {
    int n;
    int64_t *mb;
    double *loss; /* NAN where stored as NULL (not finite) */
} compare_losses;

static int compare_read_losses(sqlite3 *db, int64_t job, int64_t step, compare_losses *l, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT microbatch, loss FROM losses WHERE job_id=?1 AND step=?2 ORDER BY microbatch",
                           -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, step);
    int rc, cap = 0, oom = 0;
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (l->n == cap) {
            cap = cap ? 2 * cap : 64;
            int64_t *mb = realloc(l->mb, (size_t)cap * sizeof *mb);
            if (mb) l->mb = mb;
            double *loss = realloc(l->loss, (size_t)cap * sizeof *loss);
            if (loss) l->loss = loss;
            if ((oom = !mb || !loss)) break;
        }
        l->mb[l->n] = sqlite3_column_int64(st, 0);
        double loss;
        l->loss[l->n++] = bounds_loss(st, 1, &loss) ? loss : NAN;
    }
    sqlite3_finalize(st);
    if (oom) return pp_fail(err, "out of memory");
    return rc == SQLITE_DONE ? 0 : pp_fail(err, "database error: %s", sqlite3_errmsg(db));
}

/* The mean in microbatch order, so that equal losses give an equal mean. */
static double compare_mean(const compare_losses *l) {
    double sum = 0;
    for (int k = 0; k < l->n; k++) sum += l->loss[k];
    return l->n ? sum / l->n : NAN;
}

/* The latest step where both jobs have every microbatch's loss, then
 * those losses side by side. */
static int compare_read_loss(sqlite3 *db, job_compare *c, pp_err *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT step FROM losses WHERE job_id=?1 GROUP BY step HAVING count(*) >= "
                           "(SELECT microbatches FROM jobs WHERE id=?1) INTERSECT "
                           "SELECT step FROM losses WHERE job_id=?2 GROUP BY step HAVING count(*) >= "
                           "(SELECT microbatches FROM jobs WHERE id=?2) ORDER BY 1 DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, c->job);
    sqlite3_bind_int64(st, 2, c->other);
    int rc = sqlite3_step(st);
    c->loss_step = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return pp_fail(err, "database error: %s", sqlite3_errmsg(db));
    if (c->loss_step < 0) return 0;
    compare_losses a = {0}, b = {0};
    int failed = compare_read_losses(db, c->job, c->loss_step, &a, err) != 0 ||
                 compare_read_losses(db, c->other, c->loss_step, &b, err) != 0;
    if (!failed) {
        c->loss_job = compare_mean(&a);
        c->loss_other = compare_mean(&b);
        c->loss_n_job = a.n;
        c->loss_n_other = b.n;
        int i = 0, j = 0; /* walk both in microbatch order: one job's extra microbatches differ too */
        while (i < a.n || j < b.n) {
            if (j >= b.n || (i < a.n && a.mb[i] < b.mb[j])) c->loss_differing++, i++;
            else if (i >= a.n || b.mb[j] < a.mb[i]) c->loss_differing++, j++;
            else c->loss_differing += memcmp(&a.loss[i++], &b.loss[j++], sizeof(double)) != 0;
        }
        c->loss_bitwise = c->loss_differing == 0;
    }
    free(a.mb), free(a.loss), free(b.mb), free(b.loss);
    return failed ? -1 : 0;
}

int compare_read(sqlite3 *db, const job_summary *js, const whatif_report *jw, const job_summary *os,
                 const whatif_report *ow, job_compare *c, pp_err *err) {
    memset(c, 0, sizeof *c);
    c->job = js->job_id;
    c->other = os->job_id;
    c->loss_step = -1;
    c->loss_job = c->loss_other = NAN;
    compare_config *a = malloc(2 * sizeof *a), *b = a + 1;
    if (!a) return pp_fail(err, "out of memory");
    int rc = -1;
    if (compare_read_config(db, c->job, a, err) != 0 || compare_read_config(db, c->other, b, err) != 0) goto out;
    compare_note_layout(a, js);
    compare_note_layout(b, os);
    for (int k = 0; k < COMPARE_FIELDS; k++) {
        if (!a->recorded[k] || !b->recorded[k] || strcmp(a->value[k], b->value[k]) == 0) continue;
        compare_diff *d = &c->diffs[c->ndiffs++];
        d->what = compare_fields[k].what;
        snprintf(d->job, sizeof d->job, "%s", a->value[k]);
        snprintf(d->other, sizeof d->other, "%s", b->value[k]);
    }
    whatif_row bounded;
    int by_plan = jw->in.max_mem && ow->measured; /* an order built under its bound: the job's own, as it ran */
    if (by_plan && whatif_play_job_plan(db, js, jw, &ow->in, &bounded, err) != 0) goto out;
    compare_predict(js, jw, os, ow, a->schedule_costs, by_plan ? &bounded : NULL, c);
    if (compare_read_loss(db, c, err) == 0 && critpath_read(db, c->job, js->world, &c->path_job, err) == 0 &&
        critpath_read(db, c->other, os->world, &c->path_other, err) == 0) {
        int wide = js->world > os->world ? js->world : os->world;
        if (!(c->path_ranks = malloc((wide > 0 ? (size_t)wide : 1) * sizeof *c->path_ranks)))
            pp_fail(err, "out of memory comparing critical paths");
        else c->npath_ranks = critpath_ranks_on_either(&c->path_job, &c->path_other, c->path_ranks), rc = 0;
    }
out:
    free(a);
    return rc;
}

void compare_free(job_compare *c) {
    critpath_report_free(&c->path_job);
    critpath_report_free(&c->path_other);
    free(c->path_ranks);
    c->path_ranks = NULL;
    c->npath_ranks = 0;
}
