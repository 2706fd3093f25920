/* cmd_worker.c: `pprun worker FLAGS`: one rank of a `pprun run` job.
 *
 * Started by the launcher with the job's flags and torchrun's environment
 * (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, PPRUN_STORE, PPRUN_RUN_ID,
 * PPRUN_RESTART_COUNT, PPRUN_TRACE_FD). It builds the same schedule as every
 * other rank, connects to its neighbours, runs the engine and reports each
 * step (metrics file, progress key in the store). Not meant to be run by
 * hand.
 *
 * With --device cuda and a GPU transport (auto, cuda-ipc, nccl) it also opens
 * devcomm on its GPU, after the host comm (devcomm sends its control
 * messages over it), and says on stderr which transport each neighbour
 * gets; it flushes and closes devcomm before the host comm. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/token.h"
#include "runner/cmd/cli.h"
#include "runner/comm/comm.h"
#include "runner/comm/devcomm.h"
#include "runner/worker/checkpoint_dir.h"
#include "runner/worker/engine.h"
#ifdef PPRUN_HAVE_CUDA
#include "runner/model/cuda/gpu.h"
#endif
#include "config/run_config.h"
#include "runner/store/store.h"
#include "tracer/gputrace.h"
#include "tracer/ring.h"

#define WORKER_STORE_TIMEOUT_NS (60ull * 1000000000ull)

typedef struct worker {
    run_config cfg;
    int rank, world, local_world, attempt;
    const char *run_id;
    store_client *store;      /* the main thread's connection */
    store_client *comm_store; /* comm's own: its set-up threads and devcomm's use it (comm serialises them) */
    FILE *metrics;
} worker;

static int env_int(const char *name, int min, int *out, pp_err *err) {
    const char *v = getenv(name);
    long n;
    if (!v) return pp_fail(err, "%s is not set: `pprun worker` is started by `pprun run`", name);
    if (pp_parse_long(v, min, 1 << 24, name, &n, err) != 0) return -1;
    *out = (int)n;
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

/* --- boundary tensors in GPU memory: devcomm ------------------------------------ */

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
static void say_transports(const worker *w, const sched_plan *plan, const comm *c, const devcomm *dc, int device) {
    char line[1024];
    int n = dc ? snprintf(line, sizeof line, "boundary tensors in GPU memory (cuda:%d)", device)
               : snprintf(line, sizeof line, "boundary tensors staged through host memory (--transport %s)",
                          run_transport_name(w->cfg.transport));
    char *seen = calloc((size_t)plan->ranks, 1);
    for (int s = 0; seen && s < plan->stages; s++) {
        if (plan->stage_rank[s] != w->rank) continue;
        int nb[2];
        engine_stage_neighbours(plan, s, w->rank, nb);
        for (int i = 0; i < 2; i++) {
            int r = nb[i];
            if (r == w->rank || seen[r] || n >= (int)sizeof line - 64) continue;
            seen[r] = 1;
            n += snprintf(line + n, sizeof line - (size_t)n, "; rank %d: %s", r,
                          dc ? devcomm_transport_name(dc, r) : comm_transport_name(c, r));
        }
    }
    free(seen);
    fprintf(stderr, "pprun worker (rank %d): %s\n", w->rank, line);
}

/* --- step reports -------------------------------------------------------------- */

static int on_step(void *ctx, const engine_step_report *r, pp_err *err) {
    worker *w = ctx;
    if (w->metrics) {
        /* 9 significant digits: a float32 loss reads back to the same bits. */
        fprintf(w->metrics, "{\"step\":%d,\"loss\":%.9g,\"losses\":[", r->step, r->loss);
        for (int i = 0; i < r->microbatches; i++)
            fprintf(w->metrics, i ? ",%.9g" : "%.9g", (double)r->losses[i]);
        fprintf(w->metrics, "],\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"attempt\":%d}\n", r->step_ns / 1e6,
                r->tokens_per_s, w->attempt);
        if (fflush(w->metrics) != 0) return pp_fail(err, "--metrics %s: %s", w->cfg.metrics, strerror(errno));
    }
    char key[64], text[128];
    snprintf(key, sizeof key, "run/progress/%d", r->step);
    int n = snprintf(text, sizeof text, "%.6f %.3f %.1f", r->loss, r->step_ns / 1e6, r->tokens_per_s);
    return store_set(w->store, key, text, (size_t)n, err);
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
    return checkpoint_dir_mark_latest(w->cfg.checkpoint_dir, step, w->run_id, err);
}

/* --- main ---------------------------------------------------------------------- */

static int parse_flags(worker *w, int argc, char **argv, pp_err *err) {
    run_config_default(&w->cfg);
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = NULL;
        if (run_config_takes_value(opt)) {
            if (i + 1 >= argc) return pp_fail(err, "%s: expected a value", opt);
            val = argv[++i];
        }
        int rc = run_config_option(&w->cfg, opt, val, err);
        if (rc < 0) return -1;
        if (rc == 0) return pp_fail(err, "unknown option '%s'", opt);
    }
    return run_config_finish(&w->cfg, err);
}

static int run_worker(worker *w, pp_err *err) {
    sched_plan *plan = NULL;
    data_source *data = NULL;
    trace_ring *ring = NULL;
    gputrace *gpu = NULL;
    comm *c = NULL;
    devcomm *dc = NULL;
    int *rank_node = NULL;
    int device = -1; /* the GPU of devcomm's boundary tensors, if any */
    engine e = {0};
    int rc = -1;

    if (env_int("RANK", 0, &w->rank, err) || env_int("WORLD_SIZE", 1, &w->world, err) ||
        env_int("LOCAL_WORLD_SIZE", 1, &w->local_world, err) || env_int("PPRUN_RESTART_COUNT", 0, &w->attempt, err))
        return -1;
    w->run_id = getenv("PPRUN_RUN_ID") ? getenv("PPRUN_RUN_ID") : "job";
    if (store_connect_env(WORKER_STORE_TIMEOUT_NS, &w->store, err) != 0) return -1;
    if (run_config_plan(&w->cfg, w->world, &plan, err) != 0) goto out;

    int first = plan->stage_rank[0] == w->rank, last = plan->stage_rank[plan->stages - 1] == w->rank;
    if ((first || last) && w->cfg.model.kind == MODEL_GPT &&
        data_open(w->cfg.data[0] ? w->cfg.data : NULL, model_tokens_per_microbatch(&w->cfg.model) + 1, &data, err) != 0)
        goto out;
    if (last && w->cfg.metrics[0] && !(w->metrics = fopen(w->cfg.metrics, "a"))) {
        pp_fail(err, "--metrics %s: %s", w->cfg.metrics, strerror(errno));
        goto out;
    }
    const char *fd_text = getenv("PPRUN_TRACE_FD");
    if (w->cfg.trace && fd_text) {
        long fd;
        if (pp_parse_long(fd_text, 0, 1 << 20, "PPRUN_TRACE_FD", &fd, err) != 0) goto out;
        if (trace_ring_attach((int)fd, &ring, err) != 0) goto out;
    }
    /* CUPTI before the first CUDA call (engine_init creates the GPU stage);
     * unavailable, the job goes on with its host spans. */
    if (w->cfg.cupti > 0 && ring && gputrace_open(ring, w->rank, w->attempt, &gpu, err) != 0)
        fprintf(stderr, "pprun worker (rank %d): no GPU spans: %s; host spans are still recorded\n", w->rank, err->msg);
    if (w->world > 1) {
        rank_node = calloc((size_t)w->world, sizeof *rank_node);
        if (!rank_node) {
            pp_fail(err, "out of memory");
            goto out;
        }
        for (int r = 0; r < w->world; r++)
            rank_node[r] = r / w->local_world; /* global ranks are node-major */
        char job_key[192];
        snprintf(job_key, sizeof job_key, "%s-a%d", w->run_id, w->attempt);
        if (store_connect_env(WORKER_STORE_TIMEOUT_NS, &w->comm_store, err) != 0) goto out;
        comm_config cc = {
            .rank = w->rank,
            .world = w->world,
            .rank_node = rank_node,
            .job_key = job_key,
            .exchange = {w->comm_store, exchange_put, exchange_get},
            .connect_timeout_ms = 60000,
            .transport = run_transport_name(w->cfg.transport),
            .tcp_host = getenv("PPRUN_NODE_ADDR"),
            .token = getenv(PP_TOKEN_ENV), /* checked by store_connect_env */
        };
        int device_boundaries = run_config_device_boundaries(&w->cfg);
        if (device_boundaries) cc.transport = "auto"; /* the host comm carries devcomm's control messages */
        if (comm_open(&cc, &c, err) != 0) goto out;
        if (device_boundaries) {
            if (worker_device(w->rank % w->local_world, &device, err) != 0) goto out;
            devcomm_config dcfg = {.host = c, .device = device, .transport = run_transport_name(w->cfg.transport)};
            if (devcomm_open(&dcfg, &dc, err) != 0) {
                pp_wrap(err, "opening the GPU transport (--transport %s) on cuda:%d",
                        run_transport_name(w->cfg.transport), device);
                goto out;
            }
        }
        if (w->cfg.device == RUN_DEVICE_CUDA) say_transports(w, plan, c, dc, device);
    }
    int latest, from = checkpoint_dir_to_load(&w->cfg, w->run_id, &latest, err);
    if (from < 0) goto out;
    e = (engine){
        .cfg = &w->cfg,
        .plan = plan,
        .rank = w->rank,
        .attempt = w->attempt,
        .local_rank = w->rank % w->local_world, /* global ranks are node-major */
        .comm = c,
        .devcomm = dc,
        .ring = ring,
        .gpu = gpu,
        .data = data,
        .hooks = {w, on_step, checkpoint_done},
        .start_step = from == 0 ? latest + 1 : 0,
    };
    if (engine_init(&e, err) != 0 || engine_run(&e, err) != 0) goto out;
    /* Nothing in flight may be lost when this rank exits first; devcomm
     * first, its messages are acknowledged over the host comm. */
    if (dc && devcomm_flush(dc, w->cfg.recv_timeout_ms, err) != 0) goto out;
    if (c && comm_flush(c, w->cfg.recv_timeout_ms, err) != 0) goto out;
    rc = 0;
out:
    /* devcomm first: on a failure a posted NCCL send or receive ends only
     * when its communicator is aborted, and gputrace_close synchronises
     * the whole device. Then the tracer, before the stages (and their CUDA
     * context) go. */
    if (dc) devcomm_close(dc);
    gputrace_close(gpu);
    engine_free(&e);
#ifdef PPRUN_HAVE_CUDA
    if (device >= 0) gpu_device_release(device); /* after every CUDA user above */
#endif
    comm_close(c);
    free(rank_node);
    if (ring) trace_ring_close(ring);
    if (w->metrics) fclose(w->metrics);
    data_close(data);
    sched_free(plan);
    store_close(w->comm_store);
    store_close(w->store);
    return rc;
}

int cmd_worker(int argc, char **argv) {
    static worker w;
    pp_err err;
    if (parse_flags(&w, argc, argv, &err) != 0) {
        fprintf(stderr, "pprun worker: %s\n", err.msg);
        return 2;
    }
    if (run_worker(&w, &err) != 0) {
        fprintf(stderr, "pprun worker (rank %d): %s\n", w.rank, err.msg);
        return 1;
    }
    return 0;
}
