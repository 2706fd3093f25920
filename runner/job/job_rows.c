/* job_rows.c: a `pprun run` job in its trace database (job_rows.h). */
#include "runner/job/job_rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "base/net.h"
#include "db/alive.h"
#include "db/progplan.h"
#include "db/summary.h"
#include "db/whatif.h"
#include "report/text.h"
#include "runner/job/job_salvage.h"
#include "runner/job/run_plan.h"

/* db's messages start with the file's name; the lines that print them
 * name it already, after --db. */
static const char *without_path(const char *msg, const char *path) {
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

static void say_db_error(const run_job *job, const pp_err *err) {
    fprintf(stderr, "pprun run: --db %s: %s\n", job->cfg.db, without_path(err->msg, job->cfg.db));
}

/* --- the start --------------------------------------------------------------- */

/* The options that shape the run, as JSON (jobs.config_json; not, say,
 * --recv-timeout or the checkpoint flags). Caller frees. */
static char *config_json(const run_job *job) {
    const run_config *c = &job->cfg;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    cJSON_AddStringToObject(o, "schedule", run_schedule_text(c, schedule, sizeof schedule));
    if (c->has_schedule_costs) { /* what zb-v's order was built for (db/whatif.c reads it back) */
        char text[1024];
        sched_costs_text(&c->schedule_costs, text, sizeof text);
        cJSON_AddStringToObject(o, "schedule_costs", text);
        if (c->schedule_costs_db[0]) {
            snprintf(text, sizeof text, "%s, %s", c->schedule_costs_db, job->costs_about);
            cJSON_AddStringToObject(o, "schedule_costs_from", text);
        }
    }
    cJSON_AddNumberToObject(o, "microbatches", c->microbatches); /* per pipeline (replica) */
    cJSON_AddNumberToObject(o, "pp", c->pp);                     /* ranks per pipeline */
    cJSON_AddNumberToObject(o, "dp", c->dp);                     /* pipelines: jobs.world_size = pp x dp */
    if (c->max_mem > 0) { /* the bound zb-h1's and zb-v's order was built under (db/whatif.c reads it back) */
        char text[64];
        snprintf(text, sizeof text, c->max_mem_bytes ? "%.0fB" : "%.0f", c->max_mem);
        cJSON_AddStringToObject(o, "max_mem", text);
    }
    cJSON_AddNumberToObject(o, "virtual_stages", job->plan->virtual_stages);
    cJSON_AddNumberToObject(o, "stages", job->plan->stages);
    cJSON_AddNumberToObject(o, "steps", c->steps);
    cJSON_AddStringToObject(o, "model", job->model);
    cJSON_AddNumberToObject(o, "nproc_per_node", job->lo.nproc_per_node);
    /* more ranks than cores: op times include waiting for one (db/whatif.c) */
    cJSON_AddNumberToObject(o, "cpu_cores", pp_cpu_count());
    cJSON_AddNumberToObject(o, "nnodes", job->lo.nnodes);
    cJSON_AddNumberToObject(o, "max_restarts", job->lo.max_restarts);
    alive_identity(o); /* who to ask whether the job still runs; without /proc, nobody */
    if (job->program) {
        cJSON *argv = cJSON_AddArrayToObject(o, "program");
        for (int i = 0; argv && i < job->lo.prog_argc; i++)
            cJSON_AddItemToArray(argv, cJSON_CreateString(job->lo.prog_argv[i]));
    } else {
        char cuts[WHATIF_LAYOUT_TEXT]; /* which layers each stage holds (db/whatif.c reads it back) */
        sched_cuts_text(c->cuts, c->ncuts, cuts, sizeof cuts);
        cJSON_AddStringToObject(o, "pipeline_cuts", cuts);
        cJSON_AddStringToObject(o, "data", c->data[0] ? c->data : "(built-in corpus)");
        cJSON_AddNumberToObject(o, "seed", (double)c->seed);
        cJSON_AddNumberToObject(o, "lr", c->optim.lr);
        cJSON_AddNumberToObject(o, "weight_decay", c->optim.weight_decay);
        cJSON_AddStringToObject(o, "optimizer", run_optimizer_name(c->optim.kind));
        /* where boundary tensors live; the per-peer transport is each worker's first line */
        cJSON_AddStringToObject(o, "boundaries", run_config_device_boundaries(c) ? "device" : "host");
        cJSON_AddStringToObject(o, "transport", run_transport_name(c->transport));
        cJSON_AddStringToObject(o, "cupti", c->cupti > 0 ? "on" : "off");
        /* --device cuda: whether this node's ranks ran under an MPS daemon, or why not (job_mps.h) */
        if (job->mps.state[0]) cJSON_AddStringToObject(o, "mps", job->mps.state);
        cJSON_AddStringToObject(o, "dtype", run_dtype_name(c->dtype));
        /* which stages compute F again before B: db/ reads their RECOMPUTE spans as part of B */
        cJSON_AddStringToObject(o, "recompute", run_recompute_name(c->recompute));
        if (c->recompute != RUN_RECOMPUTE_NONE && c->nrecompute_stages > 0) {
            char stages[WHATIF_LAYOUT_TEXT];
            sched_cuts_text(c->recompute_stages, c->nrecompute_stages, stages, sizeof stages);
            cJSON_AddStringToObject(o, "recompute_stages", stages);
        }
        if (c->dp > 1) {
            cJSON_AddBoolToObject(o, "zero1", c->zero1);
            cJSON_AddStringToObject(o, "dp_overlap", c->dp_overlap ? "on" : "off");
            cJSON_AddNumberToObject(o, "dp_bucket", (double)c->dp_bucket);
        }
        if (c->eval_every) {
            cJSON_AddNumberToObject(o, "eval_every", c->eval_every);
            cJSON_AddNumberToObject(o, "eval_microbatches", c->eval_microbatches);
            cJSON_AddStringToObject(o, "eval_data", c->eval_data[0] ? c->eval_data : "(last tenth of the data)");
        }
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* The jobs row: job->job_id. */
static int write_job_row(run_job *job, pp_err *err) {
    const sched_plan *plan = job->plan;
    char *json = config_json(job);
    if (!json) return pp_fail(err, "out of memory");
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    db_job_info info = {
        .name = job->lo.run_id,
        .nnodes = job->lo.nnodes,
        .world_size = plan->ranks * job->cfg.dp, /* every replica's ranks */
        .schedule = run_schedule_text(&job->cfg, schedule, sizeof schedule),
        .microbatches = plan->microbatches,
        .virtual_stages = plan->virtual_stages,
        .stages = plan->stages,
        .steps = job->cfg.steps,
        .model = job->model,
        .device = run_device_name(job->cfg.device),
        .config_json = json,
        .t0_ns = (int64_t)pp_now_ns(),
    };
    int rc = db_create_job(job->db, &info, &job->job_id, err);
    free(json);
    return rc;
}

/* One row per rank (of every replica): its node, host, device and stages. */
static int write_ranks(run_job *job, pp_err *err) {
    const sched_plan *plan = job->plan;
    int world = plan->ranks * job->cfg.dp; /* rank r holds the stages of pipeline rank r % plan->ranks */
    char host[256];
    net_host_name(host, sizeof host);
    db_rank_info *ranks = calloc((size_t)world, sizeof *ranks);
    char (*stages)[256] = calloc((size_t)world, sizeof *stages);
    char (*hosts)[272] = calloc((size_t)world, sizeof *hosts);
    char (*devices)[32] = calloc((size_t)world, sizeof *devices);
    if (!ranks || !stages || !hosts || !devices) {
        free(ranks), free(stages), free(hosts), free(devices);
        return pp_fail(err, "out of memory");
    }
    for (int r = 0; r < world; r++) {
        int node = r / job->lo.nproc_per_node;
        for (int s = 0, n = 0; s < plan->stages; s++)
            if (plan->stage_rank[s] == r % plan->ranks && n < 240) n += snprintf(stages[r] + n, sizeof stages[r] - n, n ? ",%d" : "%d", s);
        /* Another node's host is known once its launcher joined (job_rows_hosts): "" until then. */
        if (node == job->lo.node_rank) snprintf(hosts[r], sizeof hosts[r], "%s", host);
        /* the worker's choice (LOCAL_RANK mod count), assuming every node sees as many devices as this one */
        if (job->cuda_devices > 0)
            snprintf(devices[r], sizeof devices[r], "cuda:%d", (r % job->lo.nproc_per_node) % job->cuda_devices);
        else
            snprintf(devices[r], sizeof devices[r], "%s", run_device_name(job->cfg.device));
        ranks[r] = (db_rank_info){.rank = r, .node = node, .host = hosts[r], .device = devices[r], .stages = stages[r]};
    }
    int rc = db_insert_ranks(job->db, job->job_id, ranks, (size_t)world, err);
    free(ranks), free(stages), free(hosts), free(devices);
    return rc;
}

int job_rows_open(run_job *job) {
    job->db_created = access(job->cfg.db, F_OK) != 0;
    /* Not refused: srun gives every node the same command line, --db too
     * (docs/cli.md, "Slurm"). Said, so that nobody looks for a file here. */
    if (job->cfg.trace && job->lo.node_rank != 0 && job->db_given)
        fprintf(stderr,
                "pprun run: --db %s is not written on node rank %d: a job's trace database is node rank 0's (its "
                "--db), where this node's trace goes\n",
                job->cfg.db, job->lo.node_rank);
    if (!job->cfg.trace || job->lo.node_rank != 0) return 0;
    pp_err err;
    if (db_open(job->cfg.db, &job->db, &err) == 0) return 0;
    say_db_error(job, &err);
    return -1;
}

/* The database file and SQLite's WAL and shared-memory files beside it. */
static void remove_db_files(const char *path) {
    char side[sizeof ((run_config *)0)->db + 8];
    remove(path);
    snprintf(side, sizeof side, "%s-wal", path);
    remove(side);
    snprintf(side, sizeof side, "%s-shm", path);
    remove(side);
}

void job_rows_discard(run_job *job) {
    if (!job->db || !job->db_created) return;
    db_close(job->db);
    job->db = NULL;
    remove_db_files(job->cfg.db);
}

int job_rows_start(run_job *job) {
    if (!job->db) return 0;
    pp_err err;
    int nlost = 0;
    if (db_mark_lost(job->db, &nlost, &err) != 0 || write_job_row(job, &err) != 0 || write_ranks(job, &err) != 0 ||
        run_plan_write(job->db, job->job_id, job->plan, &job->cfg, NULL, &err) != 0) {
        say_db_error(job, &err);
        return -1;
    }
    if (nlost)
        fprintf(stderr, "pprun run: --db %s: %d earlier job%s still said running, but %s launcher is gone: marked lost\n",
                job->cfg.db, nlost, nlost > 1 ? "s" : "", nlost > 1 ? "their" : "its");
    return 0;
}

void job_rows_hosts(run_job *job, const launch_info *info) {
    if (!job->db || !info->node_hosts || info->nnodes < 2) return;
    /* Where the other nodes' ranks ran is worth a line, not the training
     * (a database that cannot be written stops the trace, never the job). */
    pp_err err;
    if (db_set_node_hosts(job->db, job->job_id, info->node_hosts, info->nnodes, &err) != 0) say_db_error(job, &err);
}

/* --- the end ------------------------------------------------------------------ */

/* At its end a job's planned timeline, the launcher's plan or the
 * program's own, is re-simulated at the medians of its latest steps: the
 * what-if's window (up to WHATIF_STEPS steps with statistics, after the
 * job's first, step 0 or a resumed job's; that one alone in a job of one
 * step). Steadier than the one step the
 * live refresh had, and there for a job too short for that refresh. A
 * plan the simulator refuses, or one some stage never ran an op of, stays
 * as it was. */
static void plan_at_the_end(run_job *job) {
    if (job->cfg.model.kind == MODEL_TIMED) return; /* planned at the model's own costs from the start */
    sqlite3 *sql = db_sqlite(job->db);
    sqlite3_stmt *st;
    int last = -1, job_first = 0;
    if (sqlite3_prepare_v2(sql, "SELECT min(step), max(step) FROM step_stats WHERE job_id=?1", -1, &st, NULL) !=
        SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, job->job_id);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 1) != SQLITE_NULL)
        job_first = sqlite3_column_int(st, 0), last = sqlite3_column_int(st, 1);
    sqlite3_finalize(st);
    if (last < 0) return;
    int first = (int)summary_from_step(job_first, last);
    if (last - WHATIF_STEPS + 1 > first) first = last - WHATIF_STEPS + 1;
    pp_err err = {{0}};
    int rc = db_program_plan(job->db, job->job_id)
                 ? progplan_simulate(job->db, job->job_id, first, last, &err)
                 : run_plan_resimulate(job->db, job->job_id, job->plan, &job->cfg, first, last, &err);
    if (rc < 0) fprintf(stderr, "pprun run: planned timeline not written: %s\n", err.msg);
}

const char *job_rows_status(const job_outcome *end) {
    const launch_result *res = &end->res;
    if (end->launch_rc != 0) return "failed";
    return res->status == LAUNCH_OK ? "succeeded" : res->status == LAUNCH_SIGNALED ? "stopped" : "failed";
}

int job_rows_failed_rank(const job_outcome *end) {
    return end->launch_rc == 0 && end->res.status == LAUNCH_FAILED ? end->res.failure.global_rank : -1;
}

static int blank(char c) { return c && strchr(" \t\r\n\v\f", c) != NULL; }

/* Line [p, p + len) of a stderr tail without a "[rankN]:" prefix (PyTorch
 * puts one on every line a rank dies with) and the blanks around it: its
 * text and length; *indented: it began with a blank (after the prefix and
 * its one space), a line under another (a traceback's, a message's). */
static int line_text(const char *p, int len, const char **text, int *indented) {
    int a = 0, b = len, k = 5;
    if (len > 7 && strncmp(p, "[rank", 5) == 0) {
        while (k < len && p[k] >= '0' && p[k] <= '9') k++;
        if (k > 5 && k + 1 < len && p[k] == ']' && p[k + 1] == ':') a = k + 2 + (k + 2 < len && p[k + 2] == ' ');
    }
    *indented = a < b && blank(p[a]);
    while (a < b && blank(p[a])) a++;
    while (b > a && blank(p[b - 1])) b--;
    *text = p + a;
    return b - a;
}

/* The line that ends just before tail[*end] (line_text: its text, 0 for a
 * blank one), *end moved to its start; -1 above the first line. */
static int prev_line(const char *tail, int *end, const char **text, int *indented) {
    if (*end <= 0) return -1;
    int start = *end;
    while (start > 0 && tail[start - 1] != '\n') start--;
    int len = line_text(tail + start, *end - start, text, indented);
    *end = start > 0 ? start - 1 : 0;
    return len;
}

static int line_is(const char *text, int len, const char *what) {
    return len >= (int)strlen(what) && strncmp(text, what, strlen(what)) == 0;
}

/* The last line above tail[*end] that is not blank, not indented and not
 * a traceback's first ("Traceback (most recent call last):"): its length,
 * or -1. */
static int prev_statement(const char *tail, int *end, const char **text) {
    int len, indented;
    while ((len = prev_line(tail, end, text, &indented)) >= 0)
        if (len && !indented && !line_is(*text, len, "Traceback (most recent call last):")) return len;
    return -1;
}

/* Whether a line is a log record that does not say why a rank died: a
 * warning or an informational line that came after the cause (Python's
 * logging at INFO, DEBUG or WARNING, "WARNING:train:..."; c10d's and
 * gloo's "[W1130 12:00:00.1 ProcessGroupGloo.cpp:727] Warning: ..." and
 * glog's "I1130 ..."; Python's warnings, "x.py:3: UserWarning: ..."). */
static int log_noise(const char *text, int len) {
    static const char *const levels[] = {"INFO:", "DEBUG:", "WARNING:", "[INFO]", "[DEBUG]", "[WARNING]", "INFO ",
                                         "DEBUG ", "WARNING "};
    for (size_t k = 0; k < sizeof levels / sizeof levels[0]; k++)
        if (line_is(text, len, levels[k])) return 1;
    int at = text[0] == '[';
    if (len > at + 5 && (text[at] == 'W' || text[at] == 'I') && text[at + 1] >= '0' && text[at + 1] <= '9' &&
        text[at + 4] >= '0' && text[at + 4] <= '9')
        return 1;
    /* a heuristic: a line saying "Warning: " and no "Error" is taken for
     * a warning (a fatal "Exception: Warning: ..." is misread as one) */
    return memmem(text, (size_t)len, "Warning: ", 9) && !memmem(text, (size_t)len, "Error", 5);
}

/* A Python traceback's first line: 1 for "Traceback (most recent call
 * last):", 2 for an exception group's ("+ Exception Group Traceback ...":
 * its lines are then marked "| "), else 0. */
static int traceback_header(const char *text, int len) {
    if (line_is(text, len, "Traceback (most recent call last):")) return 1;
    if (line_is(text, len, "+ Exception Group Traceback (most recent call last):")) return 2;
    return 0;
}

/* The line of tail that starts at *at (moved to the next one): its text as
 * line_text gives it, a group's "| " mark taken off. */
static int next_line(const char *tail, int *at, int group, const char **text, int *indented) {
    const char *p = tail + *at, *nl = strchr(p, '\n');
    int raw = nl ? (int)(nl - p) : (int)strlen(p);
    *at += raw + (nl != NULL);
    int len = line_text(p, raw, text, indented);
    if (group && len >= 2 && (*text)[0] == '|' && (*text)[1] == ' ') {
        *indented = len > 2 && blank((*text)[2]);
        while (len > 0 && ((*text)[0] == '|' || blank((*text)[0]))) (*text)++, len--;
    }
    return len;
}

/* The exception that ends the traceback whose header line starts at
 * tail[at]: the first line under the header that is not indented (its
 * frames are), and where it ends in ':' the line under it too
 * ("RuntimeError:" then PyTorch's "[Stage 1] failed to run forward:";
 * torch.compile's "BackendCompilerFailed: backend='bad' raised:" then the
 * backend's error), into out; -1 where none came. A message of several
 * lines is named by its first, which has the exception's type. */
static int traceback_exception(const char *tail, int at, char *out, size_t n) {
    const char *text;
    int indented, len, group = 0;
    len = next_line(tail, &at, 0, &text, &indented);
    group = traceback_header(text, len) == 2;
    while (tail[at]) {
        len = next_line(tail, &at, group, &text, &indented);
        if (len <= 0 || indented) continue;
        const char *under = NULL;
        int under_len = 0;
        while (text[len - 1] == ':' && tail[at] && (under_len = next_line(tail, &at, group, &under, &indented)) == 0) {
        }
        snprintf(out, n, under_len > 0 ? "%.*s %.*s" : "%.*s", len, text, under_len, under);
        return 0;
    }
    return -1;
}

/* What a Python rank died of, from the last traceback in its stderr tail,
 * into out: that exception, and where it was raised from another or while
 * handling one ("The above exception was the direct cause ...", "During
 * handling ..."), the one the chain started with first:
 * "KeyError: 'batch' (then: RuntimeError: the loader gave up)". Lines
 * after it (an atexit handler's, a logger's) are not the cause. -1 where
 * the tail has no traceback (then last_line's reading of its last lines). */
static int python_exception(const char *tail, char *out, size_t n) {
    enum { KEEP = 32 };
    int start[KEEP], chained[KEEP], count = 0, marked = 0; /* the last KEEP headers; whether a chain led to each */
    for (int at = 0, line_at; tail[at];) {
        const char *text;
        int indented;
        line_at = at;
        int len = next_line(tail, &at, 0, &text, &indented);
        if (traceback_header(text, len)) {
            if (count == KEEP) {
                memmove(start, start + 1, (KEEP - 1) * sizeof *start);
                memmove(chained, chained + 1, (KEEP - 1) * sizeof *chained);
                count--;
            }
            start[count] = line_at, chained[count++] = marked;
        }
        if (len > 0)
            marked = line_is(text, len, "The above exception was the direct cause of the following exception:") ||
                     line_is(text, len, "During handling of the above exception, another exception occurred:");
    }
    char last[512], first[512];
    if (count == 0 || traceback_exception(tail, start[count - 1], last, sizeof last) != 0) return -1;
    int k = count - 1;
    while (k > 0 && chained[k]) k--;
    if (k < count - 1 && traceback_exception(tail, start[k], first, sizeof first) == 0)
        snprintf(out, n, "%.*s (then: %.*s)", (int)strlen(first), first, (int)strlen(last), last);
    else
        snprintf(out, n, "%s", last);
    return 0;
}

/* What a rank died saying, from its stderr tail, into out: the last line
 * that says something (a worker's message, a Python exception), prefixes,
 * blanks and log records after it (log_noise) dropped; when lines under it are indented (an exception
 * whose message goes on, as PyTorch's stage errors do), the last line that
 * is not, and when that one ends in ':' the first line under it too
 * ("RuntimeError: [Stage 1] failed to run forward:"). An exception raised
 * from another (`raise ... from e`: PyTorch's stage errors wrap the
 * program's) or while handling one (an except block that failed in turn)
 * names that one first, where it started:
 * "RuntimeError: boom (then: RuntimeError: [Stage 1] failed to run forward:)". */
static void last_line(const char *tail, char *out, size_t n) {
    const char *last = NULL, *under = NULL, *text;
    int last_len = 0, under_len = 0, end = (int)strlen(tail), indented, len;
    out[0] = '\0';
    if (python_exception(tail, out, n) == 0) return;
    while ((len = prev_line(tail, &end, &text, &indented)) >= 0) {
        if (!len) continue;
        /* the lines seen so far were all indented: under it, its own (a
         * warning's source line) */
        if (!indented && log_noise(text, len)) {
            last = under = NULL, last_len = 0;
            continue;
        }
        if (!last) last = text, last_len = len;
        if (indented) {
            under = text, under_len = len;
            continue;
        }
        char said[512];
        if (text[len - 1] == ':' && under)
            snprintf(said, sizeof said, "%.*s %.*s", len, text, under_len, under);
        else
            snprintf(said, sizeof said, "%.*s", len, text);
        const char *cause;
        int clen = prev_statement(tail, &end, &cause);
        size_t w = 0;
        if (clen > 0 &&
            (line_is(cause, clen, "The above exception was the direct cause of the following exception:") ||
             line_is(cause, clen, "During handling of the above exception, another exception occurred:")) &&
            (clen = prev_statement(tail, &end, &cause)) > 0)
            w = (size_t)snprintf(out, n, "%.*s (then: ", clen, cause);
        if (w < n) snprintf(out + w, n - w, w ? "%.*s)" : "%.*s", (int)strlen(said), said);
        return;
    }
    if (last) snprintf(out, n, "%.*s", last_len, last);
}

static void failure_text(const launch_result *res, char *buf, size_t n) {
    char sigbuf[16];
    const launch_failure *f = &res->failure;
    const char *state = launch_state_name(f->state);
    char line[512];
    last_line(f->stderr_tail, line, sizeof line);
    if (res->status == LAUNCH_FAILED && f->global_rank < 0) /* its message is its stderr's first line */
        snprintf(buf, n, "the launcher of node rank %d (on %s) failed: %.*s", f->node_rank, f->host,
                 (int)strcspn(f->stderr_tail, "\n"), f->stderr_tail);
    else if (res->status == LAUNCH_FAILED && f->hung) /* the ranks that waited for it say how we know */
        snprintf(buf, n, "rank %d (local rank %d%s%s) stopped answering%s%s%s: %s", f->global_rank, f->local_rank,
                 f->host[0] ? " on " : "", f->host, state ? " (it was " : "", state ? state : "", state ? ")" : "",
                 f->why);
    else if (res->status == LAUNCH_FAILED && f->signal) /* a stop signal: the rank's own (docs/launch.md) */
        snprintf(buf, n, "rank %d (local rank %d on %s) was killed by %s%s%s%s%s%s", f->global_rank, f->local_rank,
                 f->host, launch_signal_name(f->signal, sigbuf),
                 launch_is_stop_signal(f->signal) ? ", which pprun had not sent" : "",
                 f->injected[0] ? " (injected by " : "", f->injected, f->injected[0] ? ")" : "",
                 f->oom_kills <= 0 ? ""
                 : f->oom_in_cgroup
                     ? ", most likely the kernel's out-of-memory killer (it killed in the job's memory cgroup)"
                     : ", most likely the kernel's out-of-memory killer (oom_kill in /proc/vmstat)");
    else if (res->status == LAUNCH_FAILED)
        snprintf(buf, n, "rank %d (local rank %d on %s) exited with code %d%s%s", f->global_rank, f->local_rank,
                 f->host, f->exit_code, line[0] ? ": " : "", line);
    else if (res->status == LAUNCH_SIGNALED) /* who got the signal: this launcher, another, or a rank from outside */
        launch_stop_text(res, buf, n);
    else
        snprintf(buf, n, "the launcher failed");
}

/* A node whose launcher never told how the attempt ended (killed,
 * frozen, cut off), after the failure in buf (n bytes): that failure may
 * be no more than its ranks lost (launch.h, silent_node). */
static void append_silent_node(const launch_result *r, char *buf, size_t n) {
    size_t w = strlen(buf);
    if (w < n)
        snprintf(buf + w, n - w, "; node rank %d%s%s%s never told how the attempt ended there within %.0fs (its "
                 "launcher killed, frozen or cut off?)", r->silent_node, r->silent_host[0] ? " (on " : "",
                 r->silent_host, r->silent_host[0] ? ")" : "", (double)r->silent_wait_ns / 1e9);
}

void job_rows_failure(const job_outcome *end, char *buf, size_t n) {
    buf[0] = '\0';
    if (end->launch_rc != 0) {
        snprintf(buf, n, "%s", end->launch_err.msg);
    } else if (end->res.status != LAUNCH_OK) {
        failure_text(&end->res, buf, n);
        if (end->res.silent) append_silent_node(&end->res, buf, n);
    } else if (end->trace_err.msg[0]) { /* the training succeeded, its trace did not: why pprun exits 1 */
        snprintf(buf, n, "the trace stopped early: %s", end->trace_err.msg);
    } else if (end->ring_err.msg[0]) { /* the same, for one rank's trace */
        snprintf(buf, n, "the trace of a rank was cut short: %s", end->ring_err.msg);
    }
}

/* A program that ran to its end and recorded nothing leaves a job that
 * `pprun stats` calls "none complete", and nothing else says why: the
 * likely causes, in one line (docs/torch.md, "How pprun gets into the
 * program"). Only for a job traced here (node 0, --trace on). A program
 * whose records were all refused (counted as dropped) did call the
 * library: the library said why at the time, and stats shows the drops. */
static int say_nothing_recorded(const run_job *job, const job_outcome *end) {
    if (!job->program || end->exit_code != 0) return 0;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db_sqlite(job->db),
                           "SELECT EXISTS(SELECT 1 FROM events WHERE job_id=?1) OR"
                           " EXISTS(SELECT 1 FROM losses WHERE job_id=?1) OR"
                           " EXISTS(SELECT 1 FROM ranks WHERE job_id=?1 AND dropped_events>0)",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_int64(st, 1, job->job_id);
    int recorded = sqlite3_step(st) != SQLITE_ROW || sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (recorded) return 0;
    if (end->rings_claimed > 0) /* the hook worked: the program made no op to record */
        fprintf(stderr,
                "pprun run: job %lld: no records came from the program, though %d of the ranks on this node "
                "loaded pprun's tracer (pprun.torch loads it when a program imports torch.distributed.pipelining): "
                "no schedule's step() ran, and nothing was recorded through libpprun_trace (docs/torch.md)\n",
                (long long)job->job_id, end->rings_claimed);
    else
        fprintf(stderr,
                "pprun run: job %lld: no records came from the program: it never called libpprun_trace "
                "(docs/trace-api.md), or, in Python, never imported torch.distributed.pipelining or pprun.torch; a "
                "python3 started with -I, -E or -S skips the site hook pprun traces PyTorch through (docs/torch.md)\n",
                (long long)job->job_id);
    return 1;
}

void job_rows_finish(run_job *job, job_outcome *end) {
    if (!job->db) {
        job_salvage_disarm(job); /* nothing to record here: its guard had no will */
        return;
    }
    /* After a failed write (a full disk) what room is left goes to the
     * job's end, not to the plan. */
    if (!end->trace_err.msg[0]) {
        plan_at_the_end(job);
        pp_err serr; /* not written: the row keeps --steps, too many for a program that stopped early */
        if (job->program) db_job_steps_traced(job->db, job->job_id, &serr);
    }
    char failure[sizeof end->launch_err.msg + 64];
    job_rows_failure(end, failure, sizeof failure);
    pp_err ferr;
    const char *status = job_rows_status(end);
    int rc = db_finish_job(job->db, job->job_id, status, end->exit_code, job_rows_failed_rank(end),
                           failure[0] ? failure : NULL, &ferr);
    /* Recorded (or not recordable): a launcher killed from now on leaves
     * the row as it is. */
    job_salvage_disarm(job);
    if (rc != 0) {
        fprintf(stderr,
                "pprun run: --db %s: the job's end (%s) could not be recorded: %s; readers on this machine "
                "will show job %lld as lost\n",
                job->cfg.db, status, without_path(ferr.msg, job->cfg.db), (long long)job->job_id);
        if (end->exit_code == 0) end->exit_code = 1;
    } else if (db_check_path(job->db, &ferr) != 0) {
        fprintf(stderr, "pprun run: --db %s\n", ferr.msg);
        if (end->exit_code == 0) end->exit_code = 1;
    }
    /* Where the time went, in two lines: the summary and whether ranks
     * shared cores, not the whole what-if (its simulations were half of
     * the launcher's CPU for tracing a 10-step job, docs/design.md §6). */
    if (!say_nothing_recorded(job, end) && end->exit_code == 0) {
        job_summary s;
        whatif_report w;
        if (summary_read(db_sqlite(job->db), job->job_id, 0, &s, &ferr) == 0)
            report_brief(stderr, "pprun run", &s,
                         whatif_read_sharing(db_sqlite(job->db), job->job_id, &w, &ferr) == 0 ? &w : NULL, job->cfg.db);
        summary_free(&s);
    }
    /* With --serve the dashboard's read-only connections outlive this one
     * until Ctrl-C: job_free closes it after them, so that the last to
     * close is a writer, which folds the WAL back into the file and
     * removes it (a reader leaves pprun.db-wal and -shm behind). */
    if (job->web) return;
    db_close(job->db);
    job->db = NULL;
}
