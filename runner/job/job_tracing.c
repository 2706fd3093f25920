/* job_tracing.c: the trace collector and rings of a `pprun run` job
 * (job_tracing.h). */
#include "runner/job/job_tracing.h"

#include <stdio.h>
#include <stdlib.h>

#include "runner/job/run_plan.h"
#include "tracer/clock.h"

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

int job_step_bound(const run_job *job) { return job->program ? 0 : job->cfg.steps; }

static int remote_now(void *ctx, uint64_t *remote_ns, pp_err *err) {
    return store_time(ctx, remote_ns, err);
}

/* On the collector's thread, after each step it analyses while the job
 * runs: the plan re-simulated at the first step after the job's first
 * (step 0, or a resumed job's first, pays for start-up: its ops ran ten
 * times as long) that has every stage's F, B and W medians, so the
 * dashboard's planned timeline is at measured costs from then on (a timed
 * model's plan has its costs from the start). The first step only when it
 * is the job's last; the job's end re-simulates the plan over its latest
 * steps (job_rows.c). */
static void refresh_plan(void *ctx, db *d, int step) {
    run_job *job = ctx;
    if (job->plan_refreshed) return;
    if (!job->plan_passed_first) {
        job->plan_passed_first = 1;
        if (step != job_step_bound(job) - 1) return; /* a program's bound is 0: never its last */
    }
    pp_err err;
    int rc = run_plan_resimulate(d, job->job_id, job->plan, &job->cfg, step, step, &err);
    if (rc < 0) fprintf(stderr, "pprun run: planned timeline not updated: %s\n", err.msg);
    job->plan_refreshed = rc != 0;
}

/* Master: the collector writes into the database and, with several nodes,
 * listens for the other nodes' forwarded batches. */
static int start_master_collector(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    collector_config cc = {
        .db = job->db, .job_id = job->job_id, .world_size = info->world_size, .steps = job_step_bound(job),
        .node_ranks = info->nproc_per_node, .interval_ns = RUN_COLLECT_INTERVAL_NS, .token = info->rdzv_token,
        .step_analyzed = job->cfg.model.kind == MODEL_TIMED ? NULL : refresh_plan, .step_analyzed_ctx = job,
        .ring_fault = &job->ring_fault};
    job->ring_fault.msg[0] = '\0';
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
        .job_id = job_id, .world_size = info->world_size, .steps = job_step_bound(job), .interval_ns = RUN_COLLECT_INTERVAL_NS,
        .token = info->rdzv_token, .ring_fault = &job->ring_fault};
    job->ring_fault.msg[0] = '\0';
    uint64_t rtt;
    if (trace_clock_offset(remote_now, store, RUN_CLOCK_ROUNDS, &cc.clock_offset_ns, &rtt, err) != 0) return -1;
    cc.forward_host = job->lo.master_addr;
    cc.forward_port = (int)port;
    return collector_start(&cc, &job->coll, err);
}

int job_tracing_start(run_job *job, const launch_info *info, store_client *store, pp_err *err) {
    int rc = info->node_rank == 0 ? start_master_collector(job, info, store, err)
                                  : start_forwarding_collector(job, info, store, err);
    if (rc != 0) return -1;
    job->rings = calloc((size_t)info->nproc_per_node, sizeof *job->rings);
    job->ring_writers = calloc((size_t)info->nproc_per_node, sizeof *job->ring_writers);
    if (!job->rings || !job->ring_writers) return pp_fail(err, "out of memory");
    job->nrings = info->nproc_per_node;
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

void job_tracing_stop(run_job *job, job_outcome *end) {
    end->trace_err.msg[0] = '\0';
    end->ring_err.msg[0] = '\0';
    if (!job->coll) return;
    /* the rings are the collector's, and there until collector_stop; a
     * ring claimed by an earlier attempt's process only is not counted */
    end->rings_claimed = 0;
    for (int l = 0; job->rings && l < job->nrings; l++)
        if (job->rings[l]) {
            int writer = trace_ring_writer(job->rings[l]);
            end->rings_claimed += writer != 0 && writer != job->ring_writers[l];
        }
    if (end->launch_rc != 0 || end->res.status != LAUNCH_OK) collector_last_step_cut(job->coll);
    if (collector_stop(job->coll, &end->trace_err) != 0) {
        fprintf(stderr, "pprun run: trace collector: %s\n", end->trace_err.msg);
        if (end->exit_code == 0) end->exit_code = 1;
    }
    job->coll = NULL;
    /* A rank that corrupted its ring ran, but its trace is cut short: a
     * job that otherwise succeeded says so by its exit code, as a trace
     * that stopped early does (job_rows_failure names the rank). */
    if (job->ring_fault.msg[0]) {
        end->ring_err = job->ring_fault;
        if (end->exit_code == 0) end->exit_code = 1;
    }
}
