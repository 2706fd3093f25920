/* worker.c: one rank of a `pprun run` job (worker.h): its set-up, in the
 * order each part needs the last, the engine's run, and its step and
 * checkpoint reports. */
#include "runner/worker/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/token.h"
#include "runner/comm/comm.h"
#include "runner/comm/devcomm.h"
#include "runner/worker/checkpoint_dir.h"
#include "runner/worker/engine.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif
#include "runner/store/store.h"
#include "tracer/gputrace.h"
#include "tracer/ring.h"

#define WORKER_STORE_TIMEOUT_NS (60ull * 1000000000ull)

/* What the rank holds while it runs; close_all releases it. */
typedef struct worker {
    const run_config *cfg;
    int rank, world, local_world, attempt;
    const char *run_id;
    store_client *store;      /* the main thread's connection */
    store_client *comm_store; /* comm's own: its set-up threads and devcomm's use it (comm serialises them) */
    sched_plan *plan;  /* one pipeline's (pranks ranks) */
    int pranks, prank, replica; /* ranks per pipeline; this rank's place in it and its replica */
    sched_plan *eval_plan; /* --eval-every: the forward-only plan */
    data_source *data; /* on the ranks of the first and the last stage (gpt) */
    data_source *eval_data; /* --eval-every: held-out data, on the same ranks */
    FILE *metrics;     /* on the rank of replica 0's last stage, with --metrics */
    trace_ring *ring;  /* NULL with --trace off */
    gputrace *gpu;     /* NULL without CUPTI */
    int *rank_node;    /* [world]: each rank's node, for comm */
    comm *comm;        /* NULL with one rank */
    devcomm *devcomm;  /* NULL unless boundary tensors stay in GPU memory */
    int device;        /* the GPU of devcomm's boundary tensors; -1: none */
    engine engine;
} worker;

static int env_int(const char *name, int min, int *out, pp_err *err) {
    const char *v = getenv(name);
    long n;
    if (!v) return pp_fail(err, "%s is not set: `pprun worker` is started by `pprun run`", name);
    if (pp_parse_long(v, min, 1 << 24, name, &n, err) != 0) return -1;
    *out = (int)n;
    return 0;
}

/* Who this rank is, from the launcher's environment. */
static int read_env(worker *w, pp_err *err) {
    if (env_int("RANK", 0, &w->rank, err) || env_int("WORLD_SIZE", 1, &w->world, err) ||
        env_int("LOCAL_WORLD_SIZE", 1, &w->local_world, err) || env_int("PPRUN_RESTART_COUNT", 0, &w->attempt, err))
        return -1;
    w->run_id = getenv("PPRUN_RUN_ID") ? getenv("PPRUN_RUN_ID") : "job";
    return 0;
}

/* --- the store as comm's key/value exchange --------------------------------- */

static int exchange_put(void *ctx, const char *key, const void *value, size_t len, pp_err *err) {
    return store_set(ctx, key, value, len, err);
}

static int exchange_get(void *ctx, const char *key, void *value, size_t cap, size_t *len, int timeout_ms, pp_err *err) {
    const char *keys[] = {key};
    int rc = store_wait(ctx, keys, 1, timeout_ms, err);
    if (rc == 1) return pp_fail(err, "timed out after %d ms waiting for '%s' in the job's store", timeout_ms, key);
    if (rc != 0) return -1;
    void *v = NULL;
    size_t n = 0;
    rc = store_get(ctx, key, &v, &n, err);
    if (rc == 1) return pp_fail(err, "key '%s' vanished from the job's store", key);
    if (rc != 0) return -1;
    memcpy(value, v, n < cap ? n : cap);
    *len = n;
    free(v);
    return 0;
}

/* --- set-up ------------------------------------------------------------------ */

/* The mesh: --pp and --dp as the launcher resolved them (run_config_mesh)
 * against WORLD_SIZE; global rank r is replica r / P at pipeline rank r % P. */
static int read_mesh(worker *w, pp_err *err) {
    run_config mesh = *w->cfg;
    if (run_config_mesh(&mesh, w->world, "WORLD_SIZE", err) != 0) return -1;
    w->pranks = mesh.pp;
    w->prank = w->rank % w->pranks;
    w->replica = w->rank / w->pranks;
    return 0;
}

/* Evaluation data: --eval-data FILE, or the training data's last tenth
 * (which training then leaves alone). */
static int open_eval_data(worker *w, size_t min_bytes, pp_err *err) {
    const run_config *cfg = w->cfg;
    if (cfg->eval_data[0]) return data_open_as(cfg->eval_data, "--eval-data", min_bytes, &w->eval_data, err);
    return data_hold_out(w->data, min_bytes, &w->eval_data, err);
}

/* The plan, and what the first and last stages read and write: the
 * training (and evaluation) data, the --metrics file. */
static int open_inputs(worker *w, pp_err *err) {
    const run_config *cfg = w->cfg;
    if (read_mesh(w, err) != 0) return -1;
    if (run_config_plan(cfg, w->pranks, NULL, &w->plan, err) != 0) return -1;
    const sched_plan *plan = w->plan;
    /* The launcher planned the job (and recorded its plan) from its own
     * read of csv:FILE: a file changed since would run this rank on
     * another schedule than its peers. A built-in schedule is built, not
     * read: nothing to compare (the digest walks every action). */
    const char *digest = getenv("PPRUN_SCHEDULE_DIGEST");
    if (cfg->schedule_csv[0] && digest) {
        char mine[24];
        snprintf(mine, sizeof mine, "%016llx", (unsigned long long)sched_digest(plan));
        if (strcmp(digest, mine) != 0)
            return pp_fail(err, "--schedule csv:%s changed after pprun read it at the job's start; the job runs "
                                "the schedule it read then: leave the file alone while a job starts",
                           cfg->schedule_csv);
    }
    if (cfg->eval_every && sched_forward_only(plan, cfg->eval_microbatches, &w->eval_plan, err) != 0) return -1;
    int first = plan->stage_rank[0] == w->prank, last = plan->stage_rank[plan->stages - 1] == w->prank;
    size_t min_bytes = model_tokens_per_microbatch(&cfg->model) + 1;
    if ((first || last) && cfg->model.kind == MODEL_GPT &&
        data_open(cfg->data[0] ? cfg->data : NULL, min_bytes, &w->data, err) != 0)
        return -1;
    if ((first || last) && cfg->model.kind == MODEL_GPT && cfg->eval_every && open_eval_data(w, min_bytes, err) != 0)
        return -1;
    if (last && w->replica == 0 && cfg->metrics[0]) {
        int fd = file_output_stream(cfg->metrics, "--metrics", 0, err);
        if (fd < 0) return -1;
        if (!(w->metrics = fdopen(fd, "a"))) {
            close(fd);
            return pp_fail(err, "--metrics %s: %s", cfg->metrics, strerror(errno));
        }
    }
    return 0;
}

/* The trace ring the launcher created for this rank, and CUPTI on it. */
static int open_tracing(worker *w, pp_err *err) {
    const char *fd_text = getenv("PPRUN_TRACE_FD");
    if (w->cfg->trace && fd_text) {
        long fd;
        if (pp_parse_long(fd_text, 0, 1 << 20, "PPRUN_TRACE_FD", &fd, err) != 0) return -1;
        if (trace_ring_attach((int)fd, &w->ring, err) != 0) return -1;
    }
    /* CUPTI before the first CUDA call (engine_init creates the GPU stage);
     * unavailable, the job goes on with its host spans. */
    if (w->cfg->cupti > 0 && w->ring && gputrace_open(w->ring, w->rank, w->attempt, &w->gpu, err) != 0)
        fprintf(stderr, "pprun worker (rank %d): no GPU spans: %s; host spans are still recorded\n", w->rank, err->msg);
    return 0;
}

/* The device this rank's GPU stages use (gpu_device_pick, as
 * model_stage_create_on picks it). */
static int worker_device(int local_rank, int *device, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    return gpu_device_pick(local_rank, device, NULL, err);
#else
    (void)local_rank, (void)err;
    *device = 0; /* devcomm_open says that this build has no GPU backend */
    return 0;
#endif
}

/* One line on stderr for --device cuda jobs: where boundary tensors live and
 * the transport of every neighbour (the ranks of adjacent stages). */
static void say_transports(const worker *w) {
    const sched_plan *plan = w->plan;
    char line[1024];
    int n = w->devcomm ? snprintf(line, sizeof line, "boundary tensors in GPU memory (cuda:%d)", w->device)
                       : snprintf(line, sizeof line, "boundary tensors staged through host memory (--transport %s)",
                                  run_transport_name(w->cfg->transport));
    char *seen = calloc((size_t)w->world, 1);
    for (int s = 0; seen && s < plan->stages; s++) {
        if (plan->stage_rank[s] != w->prank) continue;
        int nb[2];
        engine_stage_neighbours(plan, s, w->prank, nb);
        for (int i = 0; i < 2; i++) {
            int r = engine_global_rank(plan, w->replica, nb[i]);
            if (r == w->rank || seen[r] || n >= (int)sizeof line - 64) continue;
            seen[r] = 1;
            n += snprintf(line + n, sizeof line - (size_t)n, "; rank %d: %s", r,
                          w->devcomm ? devcomm_transport_name(w->devcomm, r) : comm_transport_name(w->comm, r));
        }
    }
    free(seen);
    fprintf(stderr, "pprun worker (rank %d): %s\n", w->rank, line);
}

/* One more line for --device cuda jobs with several replicas: where the
 * gradient all-reduce runs (the engine's choice, engine_dp_device) and the
 * transport to every other member of this rank's data-parallel group. */
static void say_allreduce(const worker *w) {
    int replicas = w->world / w->pranks, device = engine_dp_device(&w->engine);
    if (w->cfg->device != RUN_DEVICE_CUDA || replicas < 2) return;
    char line[1024];
    int n = snprintf(line, sizeof line, "%s",
                     device ? "gradient all-reduce in GPU memory" : "gradient all-reduce staged through host memory");
    for (int d = 0; d < replicas; d++) {
        int r = engine_global_rank(w->plan, d, w->prank);
        if (r == w->rank || n >= (int)sizeof line - 64) continue;
        n += snprintf(line + n, sizeof line - (size_t)n, "; rank %d: %s", r,
                      device ? devcomm_transport_name(w->devcomm, r) : comm_transport_name(w->comm, r));
    }
    fprintf(stderr, "pprun worker (rank %d): %s\n", w->rank, line);
}

/* With more than one rank: the host comm, exchanging its endpoints through
 * the store, then devcomm on it when boundary tensors stay in GPU memory. */
static int open_comm(worker *w, pp_err *err) {
    if (w->world == 1) return 0;
    w->rank_node = calloc((size_t)w->world, sizeof *w->rank_node);
    if (!w->rank_node) return pp_fail(err, "out of memory");
    for (int r = 0; r < w->world; r++)
        w->rank_node[r] = r / w->local_world; /* global ranks are node-major */
    char job_key[192];
    comm_job_key(w->run_id, w->attempt, job_key, sizeof job_key);
    if (store_connect_env(WORKER_STORE_TIMEOUT_NS, &w->comm_store, err) != 0) return -1;
    comm_config cc = {
        .rank = w->rank,
        .world = w->world,
        .rank_node = w->rank_node,
        .job_key = job_key,
        .exchange = {w->comm_store, exchange_put, exchange_get},
        .connect_timeout_ms = 60000,
        .transport = run_transport_name(w->cfg->transport),
        .tcp_host = getenv("PPRUN_NODE_ADDR"),
        .token = getenv(PP_TOKEN_ENV), /* checked by store_connect_env */
    };
    int device_boundaries = run_config_device_boundaries(w->cfg);
    if (device_boundaries) cc.transport = "auto"; /* the host comm carries devcomm's control messages */
    if (comm_open(&cc, &w->comm, err) != 0) return -1;
    if (device_boundaries) {
        if (worker_device(w->rank % w->local_world, &w->device, err) != 0) return -1;
        devcomm_config dcfg = {
            .host = w->comm, .device = w->device, .transport = run_transport_name(w->cfg->transport)};
        if (devcomm_open(&dcfg, &w->devcomm, err) != 0)
            return pp_wrap(err, "opening the GPU transport (--transport %s) on cuda:%d",
                           run_transport_name(w->cfg->transport), w->device);
    }
    if (w->cfg->device == RUN_DEVICE_CUDA) say_transports(w);
    return 0;
}

/* --- the engine's reports -------------------------------------------------------- */

/* On the rank of replica 0's last stage: the step's line in --metrics
 * (every replica's losses), and its numbers under run/progress/STEP for
 * the launcher's display. */
static int on_step(void *ctx, const engine_step_report *r, pp_err *err) {
    worker *w = ctx;
    if (w->metrics) {
        /* 9 significant digits: a float32 loss reads back to the same bits. */
        fprintf(w->metrics, "{\"step\":%d,\"loss\":%.9g,\"losses\":[", r->step, r->loss);
        for (int i = 0; i < r->microbatches; i++)
            fprintf(w->metrics, i ? ",%.9g" : "%.9g", (double)r->losses[i]);
        fprintf(w->metrics, "],\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"attempt\":%d}\n", r->step_ns / 1e6,
                r->tokens_per_s, w->attempt);
        if (fflush(w->metrics) != 0) return pp_fail(err, "--metrics %s: %s", w->cfg->metrics, strerror(errno));
    }
    char key[64], text[128];
    snprintf(key, sizeof key, "run/progress/%d", r->step);
    int n = snprintf(text, sizeof text, "%.6f %.3f %.1f", r->loss, r->step_ns / 1e6, r->tokens_per_s);
    return store_set(w->store, key, text, (size_t)n, err);
}

/* The evaluation after step r->step: a line of its own in --metrics,
 * {"eval_step": S, "eval_loss": ..., "eval_losses": [...]}. */
static int on_eval(void *ctx, const engine_step_report *r, pp_err *err) {
    worker *w = ctx;
    if (!w->metrics) return 0;
    fprintf(w->metrics, "{\"eval_step\":%d,\"eval_loss\":%.9g,\"eval_losses\":[", r->step, r->loss);
    for (int i = 0; i < r->microbatches; i++) fprintf(w->metrics, i ? ",%.9g" : "%.9g", (double)r->losses[i]);
    fprintf(w->metrics, "],\"eval_ms\":%.3f,\"attempt\":%d}\n", r->step_ns / 1e6, w->attempt);
    if (fflush(w->metrics) != 0) return pp_fail(err, "--metrics %s: %s", w->cfg->metrics, strerror(errno));
    return 0;
}

/* Each rank counts itself in once its stages are saved; the rank that
 * completes the count marks the step as the latest complete checkpoint. */
static int checkpoint_done(void *ctx, int step, pp_err *err) {
    worker *w = ctx;
    char key[256];
    snprintf(key, sizeof key, "run/ckpt/%d/%d", w->attempt, step);
    int64_t count = 0;
    if (store_add(w->store, key, 1, &count, err) != 0) return -1;
    if (count != w->world) return 0;
    return checkpoint_dir_mark_latest(w->cfg->checkpoint_dir, step, w->run_id, err);
}

/* --- the run -------------------------------------------------------------------- */

/* The engine from the checkpoint this rank starts from, if any; then
 * nothing in flight may be lost when this rank exits first: devcomm
 * first, its messages are acknowledged over the host comm. */
static int run_engine(worker *w, pp_err *err) {
    model_ckpt *ckpt;
    int start;
    if (checkpoint_dir_start(w->cfg, w->run_id, &ckpt, &start, err) != 0) return -1;
    w->engine = (engine){
        .cfg = w->cfg,
        .plan = w->plan,
        .rank = w->rank,
        .attempt = w->attempt,
        .local_rank = w->rank % w->local_world, /* global ranks are node-major */
        .comm = w->comm,
        .devcomm = w->devcomm,
        .ring = w->ring,
        .gpu = w->gpu,
        .data = w->data,
        .hooks = {w, on_step, on_eval, checkpoint_done},
        .start_step = start,
        .ckpt = ckpt,
        .run_id = w->run_id,
        .eval_data = w->eval_data,
        .eval_plan = w->eval_plan,
    };
    int rc = engine_init(&w->engine, err);
    model_ckpt_free(ckpt); /* read by engine_init only */
    w->engine.ckpt = NULL;
    if (rc == 0) say_allreduce(w);
    if (rc != 0 || engine_run(&w->engine, err) != 0) return -1;
    if (w->devcomm && devcomm_flush(w->devcomm, w->cfg->recv_timeout_ms, err) != 0) return -1;
    if (w->comm && comm_flush(w->comm, w->cfg->recv_timeout_ms, err) != 0) return -1;
    return 0;
}

static void close_all(worker *w) {
    /* devcomm first: on a failure a posted NCCL send or receive ends only
     * when its communicator is aborted, and gputrace_close synchronises
     * the whole device. Then the tracer, before the stages (and their CUDA
     * context) go. */
    if (w->devcomm) devcomm_close(w->devcomm);
    gputrace_close(w->gpu);
    engine_free(&w->engine);
#ifdef PPRUN_HAVE_CUDA
    if (w->device >= 0) gpu_device_release(w->device); /* after every CUDA user above */
#endif
    comm_close(w->comm);
    free(w->rank_node);
    if (w->ring) trace_ring_close(w->ring);
    if (w->metrics) fclose(w->metrics);
    data_close(w->data);
    data_close(w->eval_data);
    sched_free(w->plan);
    sched_free(w->eval_plan);
    store_close(w->comm_store);
    store_close(w->store);
}

int worker_run(const run_config *cfg, int *rank, pp_err *err) {
    worker w = {.cfg = cfg, .device = -1};
    int rc = read_env(&w, err);
    *rank = w.rank;
    if (rc == 0) rc = store_connect_env(WORKER_STORE_TIMEOUT_NS, &w.store, err);
    if (rc == 0) rc = open_inputs(&w, err);
    if (rc == 0) rc = open_tracing(&w, err);
    if (rc == 0) rc = open_comm(&w, err);
    if (rc == 0) rc = run_engine(&w, err);
    close_all(&w);
    return rc;
}
