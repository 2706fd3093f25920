/* cmd_run.c: `pprun run`: a pipeline training job on this node (docs/design.md §1, §3).
 *
 * The launcher side of a job: parses and checks the job's options (bad input
 * exits 2 before anything starts), writes the job, its ranks and its plan
 * into the database, creates one trace ring per local rank and the collector
 * that drains them, optionally serves the dashboard, then runs the workers
 * (`pprun worker`) through the same supervisor as `pprun launch`, so every
 * failure, signal and restart rule holds. At the end the job's outcome is
 * written and, with --serve, the dashboard stays up until Ctrl-C.
 *
 * `pprun run [options] -- PROGRAM [ARGS]` runs the user's own program in
 * place of the built-in worker: the same job, rings and dashboard, with the
 * schedule in the program's environment (job_program_env.h) and its ops recorded
 * through libpprun_trace (tracer/pprun_trace.h, docs/trace-api.md). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "db/alive.h"
#include "db/db.h"
#include "db/whatif.h"
#include "runner/cmd/cli.h"
#include "runner/comm/comm.h"
#include "runner/worker/checkpoint_dir.h"
#include "runner/launch/launch.h"
#include "config/run_config.h"
#include "runner/job/job.h"
#include "runner/job/job_checks.h"
#include "runner/job/job_nodes.h"
#include "runner/job/job_options.h"
#include "runner/job/job_program_env.h"
#include "runner/job/run_plan.h"
#include "runner/job/run_progress.h"
#include "report/text.h"
#include "runner/store/store.h"
#include "tracer/clock.h"
#include "runner/job/collector.h"
#include "tracer/ring.h"
#include "web/http.h"

#define RUN_RING_CAPACITY (1u << 16)
/* --cupti on: every kernel is a record, written in one burst at the end of
 * each step (tens of thousands for a large stage): 16 MB per rank. */
#define RUN_RING_CAPACITY_CUPTI (1u << 18)
#define RUN_CLOCK_ROUNDS 16
/* How often the collector drains the rings: a ring holds 65536 records, a
 * rank records a few hundred per step, so 50 ms is far from a drop, while
 * each drain costs a transaction (5 ms drains cost the launcher 1.5% of the
 * job's CPU, bench/pipeline). */
#define RUN_COLLECT_INTERVAL_NS (50ull * 1000000ull)


/* --- the database: job, ranks, plan ---------------------------------------------- */

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
        snprintf(text, sizeof text, "f=%.17g,b=%.17g,w=%.17g,comm=%.17g", c->schedule_costs.f, c->schedule_costs.b,
                 c->schedule_costs.w, c->schedule_costs.comm);
        cJSON_AddStringToObject(o, "schedule_costs", text);
        if (c->schedule_costs_db[0]) {
            snprintf(text, sizeof text, "%s, %s", c->schedule_costs_db, job->costs_about);
            cJSON_AddStringToObject(o, "schedule_costs_from", text);
        }
    }
    cJSON_AddNumberToObject(o, "microbatches", c->microbatches);
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
        char cuts[RUN_MAX_CUTS * 8]; /* which layers each stage holds (db/whatif.c reads it back) */
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
        cJSON_AddStringToObject(o, "dtype", run_dtype_name(c->dtype));
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

static int write_job(run_job *job, pp_err *err) {
    const sched_plan *plan = job->plan;
    char *json = config_json(job);
    if (!json) return pp_fail(err, "out of memory");
    char schedule[RUN_SCHEDULE_TEXT_MAX];
    db_job_info info = {
        .name = job->lo.run_id,
        .nnodes = job->lo.nnodes,
        .world_size = plan->ranks,
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
    int created = db_create_job(job->db, &info, &job->job_id, err);
    free(json);
    if (created != 0) return -1;

    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    db_rank_info *ranks = calloc((size_t)plan->ranks, sizeof *ranks);
    char (*stages)[256] = calloc((size_t)plan->ranks, sizeof *stages);
    char (*hosts)[272] = calloc((size_t)plan->ranks, sizeof *hosts);
    char (*devices)[32] = calloc((size_t)plan->ranks, sizeof *devices);
    if (!ranks || !stages || !hosts || !devices) {
        free(ranks), free(stages), free(hosts), free(devices);
        return pp_fail(err, "out of memory");
    }
    for (int r = 0; r < plan->ranks; r++) {
        int node = r / job->lo.nproc_per_node;
        for (int s = 0, n = 0; s < plan->stages; s++)
            if (plan->stage_rank[s] == r && n < 240) n += snprintf(stages[r] + n, sizeof stages[r] - n, n ? ",%d" : "%d", s);
        if (node == job->lo.node_rank) snprintf(hosts[r], sizeof hosts[r], "%s", host);
        else snprintf(hosts[r], sizeof hosts[r], "node%d", node);
        /* the worker's choice (LOCAL_RANK mod count), assuming every node sees as many devices as this one */
        if (job->cuda_devices > 0)
            snprintf(devices[r], sizeof devices[r], "cuda:%d", (r % job->lo.nproc_per_node) % job->cuda_devices);
        else
            snprintf(devices[r], sizeof devices[r], "%s", run_device_name(job->cfg.device));
        ranks[r] = (db_rank_info){.rank = r, .node = node, .host = hosts[r], .device = devices[r], .stages = stages[r]};
    }
    int rc = db_insert_ranks(job->db, job->job_id, ranks, (size_t)plan->ranks, err);
    free(ranks), free(stages), free(hosts), free(devices);
    if (rc != 0) return -1;
    return run_plan_write(job->db, job->job_id, plan, &job->cfg, NULL, err);
}

/* --- launcher hooks --------------------------------------------------------------- */

static int remote_now(void *ctx, uint64_t *remote_ns, pp_err *err) {
    return store_time(ctx, remote_ns, err);
}

/* On the collector's thread, after each step it analyses while the job
 * runs: the plan re-simulated at the first step that has every stage's F,
 * B and W medians, so the dashboard's planned timeline is at measured
 * costs from then on (a timed model's plan has its costs from the start). */
static void refresh_plan(void *ctx, db *d, int step) {
    run_job *job = ctx;
    if (job->plan_refreshed) return;
    pp_err err;
    int rc = run_plan_resimulate(d, job->job_id, job->plan, &job->cfg, step, &err);
    if (rc < 0) fprintf(stderr, "pprun run: planned timeline not updated: %s\n", err.msg);
    job->plan_refreshed = rc != 0;
}

/* Master: the collector writes into the database and, with several nodes,
 * listens for the other nodes' forwarded batches. */
static int start_master_collector(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    collector_config cc = {
        .db = job->db, .job_id = job->job_id, .world_size = info->world_size, .steps = job->cfg.steps,
        .interval_ns = RUN_COLLECT_INTERVAL_NS, .token = info->rdzv_token,
        .step_analyzed = job->cfg.model.kind == MODEL_TIMED ? NULL : refresh_plan, .step_analyzed_ctx = job};
    /* Forwarding nodes connect to the master address: listen there only
     * (collector_start falls back to every interface when this machine
     * cannot bind that address, as the store does). */
    if (info->nnodes > 1) cc.listen_host = job->lo.master_addr;
    if (collector_start(&cc, &job->coll, err) != 0) return -1;
    /* From here until collector_stop only the collector thread writes. */
    char text[32];
    int n = snprintf(text, sizeof text, "%d", collector_listen_port(job->coll));
    if (store_set(store, "run/collector_port", text, (size_t)n, err) != 0) return -1;
    n = snprintf(text, sizeof text, "%lld", (long long)job->job_id);
    return store_set(store, "run/job_id", text, (size_t)n, err);
}

static int store_get_long(store_client *store, const char *key, long max, long *out, pp_err *err) {
    void *val = NULL;
    size_t len;
    if (store_get(store, key, &val, &len, err) != 0) return -1;
    int rc = pp_parse_long(val, 1, max, key, out, err);
    free(val);
    return rc;
}

/* Other nodes: measure this node's clock offset to the master through the
 * store, then forward every batch to the master's collector. */
static int start_forwarding_collector(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    const char *keys[] = {"run/collector_port", "run/job_id"};
    int rc = store_wait(store, keys, 2, 60000, err);
    if (rc == 1) return pp_fail(err, "the master launcher never published its trace collector's address");
    long port, job_id;
    if (rc != 0 || store_get_long(store, keys[0], 65535, &port, err) != 0 ||
        store_get_long(store, keys[1], 1L << 62, &job_id, err) != 0)
        return -1;
    collector_config cc = {
        .job_id = job_id, .world_size = info->world_size, .steps = job->cfg.steps, .interval_ns = RUN_COLLECT_INTERVAL_NS,
        .token = info->rdzv_token};
    uint64_t rtt;
    if (trace_clock_offset(remote_now, store, RUN_CLOCK_ROUNDS, &cc.clock_offset_ns, &rtt, err) != 0) return -1;
    cc.forward_host = job->lo.master_addr;
    cc.forward_port = (int)port;
    return collector_start(&cc, &job->coll, err);
}

/* The collector and one trace ring per local rank (the collector owns the
 * rings; the workers inherit their fds). */
static int start_tracing(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    int rc = info->node_rank == 0 ? start_master_collector(job, info, store, err)
                                  : start_forwarding_collector(job, info, store, err);
    if (rc != 0) return -1;
    job->rings = calloc((size_t)info->nproc_per_node, sizeof *job->rings);
    if (!job->rings) return pp_fail(err, "out of memory");
    for (int l = 0; l < info->nproc_per_node; l++) {
        int rank = info->node_rank * info->nproc_per_node + l;
        if (trace_ring_create(job->cfg.cupti > 0 ? RUN_RING_CAPACITY_CUPTI : RUN_RING_CAPACITY, &job->rings[l], err) != 0)
            return -1;
        if (collector_add_ring(job->coll, rank, job->rings[l], err) != 0) {
            trace_ring_close(job->rings[l]);
            job->rings[l] = NULL;
            return -1;
        }
    }
    return 0;
}

static int before_attempt(void *ctx, const launch_info *info, pp_err *err) {
    run_job *job = ctx;
    if (info->attempt > 0) {
        /* A restarted attempt runs again from its checkpoint, or from step
         * 0 without one: the display shows those steps again. */
        int latest;
        pp_err ignored;
        job->progress_next =
            checkpoint_dir_to_load(&job->cfg, info->run_id, &latest, &ignored) == 0 ? latest + 1 : 0;
    }
    /* The display lives for one attempt: it reads the store, which is up
     * only while launch_job runs. */
    if (info->node_rank == 0 &&
        run_progress_start(info->store_addr, info->rdzv_token, job->cfg.steps, job->progress_next, job->cfg.progress,
                           &job->progress, err) != 0)
        return -1;
    if (info->attempt > 0 || (info->nnodes == 1 && !job->cfg.trace)) return 0;
    store_client *store = NULL;
    char host[256];
    int port;
    if (store_parse_addr(info->store_addr, host, sizeof host, &port, err) != 0 ||
        store_connect_token(host, port, info->rdzv_token, 30ull * 1000000000ull, &store, err) != 0)
        return -1;
    int rc = 0;
    if (info->nnodes > 1) rc = job_nodes_agree(job, info, store, err);
    if (rc == 0 && job->cfg.trace) rc = start_tracing(job, info, store, err);
    store_close(store);
    return rc;
}

static int rank_env(void *ctx, const launch_info *info, int local_rank, int global_rank, launch_env *env, pp_err *err) {
    run_job *job = ctx;
    (void)info;
    if (launch_env_set(env, "PPRUN_NODE_ADDR", job->node_addr, err) != 0) return -1;
    if (job->program && job_program_env_set(job->plan, &job->cfg, global_rank, env, err) != 0) return -1;
    if (job->rings && job->rings[local_rank]) {
        int fd = trace_ring_fd(job->rings[local_rank]);
        char text[16];
        snprintf(text, sizeof text, "%d", fd);
        if (launch_env_pass_fd(env, fd, err) != 0) return -1;
        return launch_env_set(env, "PPRUN_TRACE_FD", text, err);
    }
    return 0;
}

/* db's messages start with the file's name; the lines that print them
 * name it already, after --db. */
static const char *without_path(const char *msg, const char *path) {
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

/* Each rank's pid, for ranks.pid (the latest attempt's). */
static void started(void *ctx, const launch_info *info, const pid_t *pids) {
    run_job *job = ctx;
    if (!job->coll) return;
    for (int l = 0; l < info->nproc_per_node; l++)
        collector_set_pid(job->coll, info->node_rank * info->nproc_per_node + l, (int)pids[l]);
}

/* Shared-memory rings a rank created before a peer attached (the peer died
 * first) are removed once the attempt's workers are gone. */
static void after_attempt(void *ctx, const launch_info *info, const launch_result *res) {
    run_job *job = ctx;
    (void)res;
    job->progress_next = run_progress_stop(job->progress);
    job->progress = NULL;
    char job_key[192];
    snprintf(job_key, sizeof job_key, "%s-a%d", info->run_id, info->attempt);
    comm_cleanup(job_key, info->world_size);
}

/* A job too short for the live refresh (its steps reached the database
 * after the progress display saw them) still gets its planned timeline at
 * its measured costs, from the latest step with statistics. */
static void plan_at_the_end(run_job *job) {
    if (job->cfg.model.kind == MODEL_TIMED) return; /* planned at the model's own costs from the start */
    sqlite3 *sql = db_sqlite(job->db);
    sqlite3_stmt *st;
    int simulated = 1, step = -1;
    if (sqlite3_prepare_v2(sql, "SELECT (SELECT count(sim_start_ns) FROM plan WHERE job_id=?1),"
                                " (SELECT max(step) FROM step_stats WHERE job_id=?1)", -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, job->job_id);
    if (sqlite3_step(st) == SQLITE_ROW) {
        simulated = sqlite3_column_int(st, 0) > 0;
        if (sqlite3_column_type(st, 1) != SQLITE_NULL) step = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);
    pp_err err;
    if (!simulated && step >= 0 && run_plan_resimulate(job->db, job->job_id, job->plan, &job->cfg, step, &err) < 0)
        fprintf(stderr, "pprun run: planned timeline not written: %s\n", err.msg);
}

/* --- main ------------------------------------------------------------------------- */

/* The database file and SQLite's WAL and shared-memory files beside it. */
static void remove_db_files(const char *path) {
    char side[sizeof ((run_config *)0)->db + 8];
    remove(path);
    snprintf(side, sizeof side, "%s-wal", path);
    remove(side);
    snprintf(side, sizeof side, "%s-shm", path);
    remove(side);
}

static void wait_for_interrupt(const char *url) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    fprintf(stderr, "pprun run: the job is over; the dashboard stays at %s until Ctrl-C\n", url);
    int sig;
    sigwait(&set, &sig);
}

static const char *job_status(const launch_result *res) {
    return res->status == LAUNCH_OK ? "succeeded" : res->status == LAUNCH_SIGNALED ? "stopped" : "failed";
}

/* The last non-empty line of a rank's stderr tail: the error it died
 * with, as a rule (a worker's message, a Python exception). */
static int last_line(const char *tail, const char **line) {
    int end = (int)strlen(tail);
    while (end > 0 && (tail[end - 1] == '\n' || tail[end - 1] == ' ')) end--;
    int start = end;
    while (start > 0 && tail[start - 1] != '\n') start--;
    *line = tail + start;
    return end - start;
}

static void failure_text(const launch_result *res, char *buf, size_t n) {
    char sigbuf[16];
    const launch_failure *f = &res->failure;
    const char *line;
    int len = last_line(f->stderr_tail, &line);
    if (res->status == LAUNCH_FAILED && f->global_rank < 0 && f->signal)
        snprintf(buf, n, "the launcher of node rank %d (on %s) got %s", f->node_rank, f->host,
                 launch_signal_name(f->signal, sigbuf));
    else if (res->status == LAUNCH_FAILED && f->global_rank < 0) /* its message is its stderr's first line */
        snprintf(buf, n, "the launcher of node rank %d (on %s) failed: %.*s", f->node_rank, f->host,
                 (int)strcspn(f->stderr_tail, "\n"), f->stderr_tail);
    else if (res->status == LAUNCH_FAILED && f->signal)
        snprintf(buf, n, "rank %d (local rank %d on %s) was killed by %s", f->global_rank, f->local_rank, f->host,
                 launch_signal_name(f->signal, sigbuf));
    else if (res->status == LAUNCH_FAILED)
        snprintf(buf, n, "rank %d (local rank %d on %s) exited with code %d%s%.*s", f->global_rank, f->local_rank,
                 f->host, f->exit_code, len ? ": " : "", len, line);
    else if (res->status == LAUNCH_SIGNALED)
        snprintf(buf, n, "pprun was stopped by %s", launch_signal_name(res->signal, sigbuf));
    else
        snprintf(buf, n, "the launcher failed");
}

int cmd_run(int argc, char **argv) {
    static run_job job; /* large: keep it off the stack */
    pp_err err;
    int prc = job_options_parse(&job, argc, argv, &err);
    if (prc == 1) return 0; /* --help */
    if (prc != 0 || job_check(&job, &err) != 0 || job_options_worker_argv(&job, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        job_free(&job);
        return 2;
    }
    job_checks_say_costs(&job);
    job_nodes_address(&job);

    int exit_code = 2;
    /* The server starts before the job is written: a refused --serve (a
     * taken port, no token for a public address) leaves no job behind, and
     * no database either when this run created it (the server reads it, so
     * it must exist first). */
    int db_existed = access(job.cfg.db, F_OK) == 0;
    if (job.cfg.trace && job.lo.node_rank == 0 && db_open(job.cfg.db, &job.db, &err) != 0) {
        fprintf(stderr, "pprun run: --db %s: %s\n", job.cfg.db, without_path(err.msg, job.cfg.db));
        goto out;
    }
    if (job.cfg.serve && job.lo.node_rank == 0) {
        http_options ho = {
            .listen = job.cfg.serve_addr, .listen_flag = "--serve", .token = job.cfg.token, .db_path = job.cfg.db};
        if (http_start(&ho, &job.web, &err) != 0) {
            fprintf(stderr, "pprun run: %s\n", err.msg); /* it names --serve */
            if (job.db && !db_existed) {
                db_close(job.db);
                job.db = NULL;
                remove_db_files(job.cfg.db);
            }
            goto out;
        }
        fprintf(stderr, "pprun run: dashboard at %s\n", http_url(job.web));
    }
    int nlost = 0;
    if (job.db && (db_mark_lost(job.db, &nlost, &err) != 0 || write_job(&job, &err) != 0)) {
        fprintf(stderr, "pprun run: --db %s: %s\n", job.cfg.db, without_path(err.msg, job.cfg.db));
        goto out;
    }
    if (nlost)
        fprintf(stderr, "pprun run: --db %s: %d earlier job%s still said running, but %s launcher is gone: marked lost\n",
                job.cfg.db, nlost, nlost > 1 ? "s" : "", nlost > 1 ? "their" : "its");

    launch_hooks hooks = {
        .ctx = &job, .before_attempt = before_attempt, .rank_env = rank_env, .started = started,
        .after_attempt = after_attempt};
    launch_result res;
    int lrc = launch_job(&job.lo, &hooks, &res, &err);
    exit_code = res.exit_code;
    if (lrc != 0)
        fprintf(stderr, "pprun run: %s\n", err.msg);
    else if (res.status == LAUNCH_FAILED)
        launch_print_summary(stderr, &job.lo, &res);
    else if (res.status == LAUNCH_SIGNALED) {
        char sigbuf[16];
        fprintf(stderr, "pprun run: stopped by %s", launch_signal_name(res.signal, sigbuf));
        if (job.db) fprintf(stderr, "; what ran is in %s (job %lld)", job.cfg.db, (long long)job.job_id);
        fputc('\n', stderr);
    }

    /* Everything the ranks recorded reaches the database, dead ranks too. */
    pp_err trace_err = {""};
    if (job.coll) {
        if (lrc != 0 || res.status != LAUNCH_OK) collector_last_step_cut(job.coll);
        if (collector_stop(job.coll, &trace_err) != 0) {
            fprintf(stderr, "pprun run: trace collector: %s\n", trace_err.msg);
            if (exit_code == 0) exit_code = 1;
        }
        job.coll = NULL;
    }
    if (job.db) {
        /* After a failed write (a full disk) what room is left goes to the
         * job's end, not to the plan. */
        if (!trace_err.msg[0]) plan_at_the_end(&job);
        char failure[sizeof err.msg + 64] = "";
        if (lrc != 0)
            snprintf(failure, sizeof failure, "%s", err.msg);
        else if (res.status != LAUNCH_OK)
            failure_text(&res, failure, sizeof failure);
        else if (trace_err.msg[0]) /* the training succeeded, its trace did not: why pprun exits 1 */
            snprintf(failure, sizeof failure, "the trace stopped early: %s", trace_err.msg);
        pp_err ferr;
        int failed_rank = lrc == 0 && res.status == LAUNCH_FAILED ? res.failure.global_rank : -1;
        const char *status = lrc != 0 ? "failed" : job_status(&res);
        if (db_finish_job(job.db, job.job_id, status, exit_code, failed_rank, failure[0] ? failure : NULL, &ferr) !=
            0) {
            fprintf(stderr,
                    "pprun run: --db %s: the job's end (%s) could not be recorded: %s; readers on this machine "
                    "will show job %lld as lost\n",
                    job.cfg.db, status, without_path(ferr.msg, job.cfg.db), (long long)job.job_id);
            if (exit_code == 0) exit_code = 1;
        }
        if (exit_code == 0) { /* where the time went, in two lines */
            job_summary s;
            whatif_report w;
            if (summary_read(db_sqlite(job.db), job.job_id, 0, &s, &ferr) == 0)
                report_brief(stderr, "pprun run", &s, whatif_read(db_sqlite(job.db), &s, &w, &ferr) == 0 ? &w : NULL,
                             job.cfg.db);
            summary_free(&s);
        }
        db_close(job.db);
        job.db = NULL;
    }
    if (job.web) {
        if (res.status != LAUNCH_SIGNALED) wait_for_interrupt(http_url(job.web));
        http_stop(job.web);
        job.web = NULL;
    }
out:
    job_free(&job);
    return exit_code;
}
