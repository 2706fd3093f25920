/* engine_dp.c: data parallelism in the engine (engine.h, docs/cli.md "Data
 * parallel"). The ranks at one pipeline rank in every replica hold the same
 * stages; after the step's last W of a stage, its gradient is all-reduced
 * over them, bucket by bucket (comm_coll.h: each shard owner adds every
 * replica's parts of the gradient tree in its fixed order, then the
 * all-gather), by a thread of this rank's own, so that it overlaps the
 * rest of the rank's actions (Megatron's overlapped gradient reduction);
 * the optimizer step waits for it. Under ZeRO-1 only the rank's shard of
 * each bucket is reduced, the optimizer updates that shard and the weights
 * are all-gathered after it.
 *
 * Where the collective runs follows the boundary tensors, one rule: when
 * they travel in GPU memory (the worker opened a devcomm) it runs in GPU
 * memory too: the parts, the reduced gradient and ZeRO-1's gathered weights
 * stay on the device, shards travel over devcomm and the shard owner adds
 * them with the stage's kernels (model_stage_set_collective_device,
 * comm_coll.h's coll_device), in the same fixed order, so the bits are the
 * host collective's. Otherwise (CPU stages, or GPU stages whose tensors are
 * staged through the host) it runs on host memory over comm: a GPU stage
 * hands its parts to the host and takes the reduced gradient back bucket
 * by bucket (model_stage_grad_fetch, model_stage_grad_written, no-ops on
 * the device path), on this thread, and ZeRO-1's gathered weights
 * (model_stage_params_written). The checkpoint's gather of the optimizer
 * state always runs on host memory: its moments are the host's copies.
 *
 * Every replica runs the same plan, so the stages of a rank finish their W's
 * in the same order everywhere and the thread takes them in that order: no
 * rank waits in one stage's collective for a peer that is in another's. */
#include "runner/worker/engine_int.h"

#include <stdlib.h>
#include <string.h>

#include "runner/comm/comm_coll.h"
#include "runner/model/model_tree.h"
#include "tracer/event.h"

/* The bucket's index goes into the tag's microbatch field above the
 * operation (3 bits) and the reduce-scatter's part number (7 bits). */
#define DP_MAX_BUCKETS 1024
enum { DP_OP_RS = 0, DP_OP_AG_GRAD = 1, DP_OP_AG_PARAMS = 2, DP_OP_AG_M = 3, DP_OP_AG_V = 4 };

static uint64_t dp_tag(int step, int stage, int bucket, int op) {
    return comm_tag((uint64_t)step, (uint64_t)stage, (uint64_t)bucket << 10 | (uint64_t)op << 7, COMM_DIR_COLL);
}

/* A device buffer of a stage's collective: shards received, kept from
 * call to call (cudaMalloc synchronises the whole device). */
typedef struct dp_buf {
    void *p;
    size_t cap;
    int busy;
} dp_buf;

typedef struct dp_stage {
    int stage;
    int last_w;   /* the index in the rank's actions of the stage's last W (or BW: a W too) */
    int nbuckets;
    size_t *lo;   /* [nbuckets + 1]: bucket b is floats [lo[b], lo[b+1]) */
    /* the collective in device memory: the stage's ops lent to it, and its buffers */
    model_stage *ms;
    coll_device dev;
    dp_buf *bufs;
    int nbufs;
} dp_stage;

struct engine_dp {
    engine *e;
    int *ranks; /* [replicas]: the group */
    coll_group g;
    int *prog, *owner, *part; /* the gradient tree above the replicas' parts */
    coll_order order;
    int nst;
    dp_stage *st; /* the local stages, in the order of their last W */
    int fail_armed; /* --fail-at phase=allreduce: not yet checked this step */
    int device;     /* the collective on device memory over devcomm; else host memory over comm */

    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int queued, taken, done; /* of st[], this step: handed to the thread, taken by it, reduced */
    int step;
    int stop, failed;
    pp_err err;
};

/* ---- set-up --------------------------------------------------------------- */

/* Buckets of --dp-bucket bytes (at most DP_MAX_BUCKETS: larger ones past
 * that). */
static int make_buckets(engine *e, dp_stage *st, size_t n, pp_err *err) {
    size_t per = e->cfg->dp_bucket / sizeof(float);
    if (per < 1) per = 1;
    if ((n + per - 1) / per > DP_MAX_BUCKETS) per = (n + DP_MAX_BUCKETS - 1) / DP_MAX_BUCKETS;
    st->nbuckets = (int)((n + per - 1) / per);
    st->lo = malloc(sizeof *st->lo * (size_t)(st->nbuckets + 1));
    if (!st->lo) return pp_fail(err, "out of memory");
    for (int b = 0; b <= st->nbuckets; b++) st->lo[b] = (size_t)b * per < n ? (size_t)b * per : n;
    return 0;
}

/* ZeRO-1: the rank's shard of every bucket is what its optimizer updates. */
static int shard_optimizer(engine *e, const dp_stage *st, pp_err *err) {
    int nb = st->nbuckets, d = e->replica, D = e->replicas;
    size_t *lo = malloc(sizeof *lo * (size_t)(nb ? nb : 1)), *hi = malloc(sizeof *hi * (size_t)(nb ? nb : 1));
    int rc = lo && hi ? 0 : pp_fail(err, "out of memory");
    for (int b = 0; rc == 0 && b < nb; b++) {
        size_t len = st->lo[b + 1] - st->lo[b];
        lo[b] = st->lo[b] + coll_shard_lo(len, D, d);
        hi[b] = st->lo[b] + coll_shard_lo(len, D, d + 1);
    }
    if (rc == 0) rc = model_stage_shard_optimizer(e->stages[st->stage], lo, hi, nb, err);
    free(lo), free(hi);
    return rc;
}

/* The device ops a stage lends its collective (coll_device): its kernels,
 * and buffers kept in st->bufs. Only the all-reduce thread, or the
 * engine's after the step, runs a stage's collective: no lock. */
static void *dev_alloc(void *ctx, size_t bytes, pp_err *err) {
    dp_stage *st = ctx;
    dp_buf *best = NULL;
    for (int i = 0; i < st->nbufs; i++)
        if (!st->bufs[i].busy && st->bufs[i].cap >= bytes && (!best || st->bufs[i].cap < best->cap))
            best = &st->bufs[i];
    if (!best) {
        dp_buf *b = realloc(st->bufs, sizeof *b * (size_t)(st->nbufs + 1));
        if (!b) {
            pp_fail(err, "out of memory");
            return NULL;
        }
        st->bufs = b;
        void *p = model_stage_device_alloc(st->ms, bytes, err);
        if (!p) return NULL;
        best = &st->bufs[st->nbufs++];
        *best = (dp_buf){p, bytes, 0};
    }
    best->busy = 1;
    return best->p;
}

static void dev_release(void *ctx, void *buf) {
    dp_stage *st = ctx;
    for (int i = 0; i < st->nbufs; i++)
        if (st->bufs[i].p == buf) st->bufs[i].busy = 0;
}

static int dev_add(void *ctx, float *left, const float *right, size_t n, pp_err *err) {
    dp_stage *st = ctx;
    return model_stage_device_add(st->ms, left, left, right, n, err);
}

static int dev_copy(void *ctx, float *dst, const float *src, size_t n, pp_err *err) {
    dp_stage *st = ctx;
    return model_stage_device_copy(st->ms, dst, src, sizeof(float) * n, err);
}

/* The device buffers of stage st's reduce-scatters (the most one holds at
 * once, of the largest shard), made before the first step: cudaMalloc may
 * wait for the whole device, and in a step it would wait for transfers that
 * wait for a peer (docs/gpu.md, "Still to check"). */
static int prefill_buffers(engine_dp *dp, dp_stage *st, pp_err *err) {
    size_t most = 0, D = (size_t)dp->g.n;
    for (int b = 0; b < st->nbuckets; b++) {
        size_t shard = (st->lo[b + 1] - st->lo[b] + D - 1) / D; /* shards differ by at most one float */
        most = shard > most ? shard : most;
    }
    int n = coll_reduce_scatter_buffers(&dp->order, dp->g.me);
    if (n < 0) return pp_fail(err, "out of memory counting the all-reduce's device buffers");
    for (int i = 0; i < n; i++)
        if (!dev_alloc(st, sizeof(float) * (most ? most : 1), err)) return -1;
    for (int i = 0; i < st->nbufs; i++) st->bufs[i].busy = 0;
    return 0;
}

/* The group of stage st's collectives: its device's, or the host's. */
static coll_group stage_group(const engine_dp *dp, const dp_stage *st) {
    coll_group g = dp->g;
    if (dp->device) g.dev = &st->dev;
    return g;
}

static void *dp_main(void *arg);

int engine_dp_open(engine *e, pp_err *err) {
    if (e->replicas < 2) return 0;
    const sched_plan *plan = e->plan;
    engine_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return pp_fail(err, "out of memory");
    e->dp = dp;
    dp->e = e;
    dp->device = e->devcomm != NULL; /* boundary tensors in GPU memory: the gradient too (the top) */
    int D = e->replicas, m = plan->microbatches;
    int cap = model_tree_max_steps(D * m);
    dp->ranks = malloc(sizeof *dp->ranks * (size_t)D);
    dp->prog = malloc(sizeof(int) * (size_t)cap);
    dp->owner = malloc(sizeof(int) * (size_t)cap);
    dp->part = malloc(sizeof(int) * (size_t)cap);
    dp->st = calloc((size_t)(e->nlocal ? e->nlocal : 1), sizeof *dp->st);
    if (!dp->ranks || !dp->prog || !dp->owner || !dp->part || !dp->st) return pp_fail(err, "out of memory");
    for (int d = 0; d < D; d++) dp->ranks[d] = engine_global_rank(plan, d, e->prank);
    dp->g = (coll_group){
        .c = e->comm, .n = D, .ranks = dp->ranks, .me = e->replica, .timeout_ms = e->cfg->recv_timeout_ms};
    int n = model_tree_combine_program(D, m, dp->prog, dp->owner, dp->part, cap);
    if (n < 0) return pp_fail(err, "out of memory for the gradient tree of %d replicas", D);
    dp->order = (coll_order){n, dp->prog, dp->owner, dp->part};
    /* The local stages in the order their last W comes in the rank's list
     * (a BW is a W too: a stage of DualPipeV may end with one). */
    const sched_action *acts = plan->actions[e->prank];
    for (int i = plan->len[e->prank] - 1; i >= 0; i--) {
        if (acts[i].op != SCHED_W && acts[i].op != SCHED_BW) continue;
        int seen = 0;
        for (int k = 0; k < dp->nst; k++) seen |= dp->st[k].stage == acts[i].stage;
        if (!seen) dp->st[dp->nst++] = (dp_stage){.stage = acts[i].stage, .last_w = i};
    }
    for (int a = 0, b = dp->nst - 1; a < b; a++, b--) { /* found last first */
        dp_stage t = dp->st[a];
        dp->st[a] = dp->st[b], dp->st[b] = t;
    }
    for (int k = 0; k < dp->nst; k++) {
        dp_stage *st = &dp->st[k];
        model_stage *s = st->ms = e->stages[st->stage];
        if (make_buckets(e, st, model_stage_weight_count(s), err) != 0) return -1;
        if (e->cfg->zero1 && shard_optimizer(e, st, err) != 0) return pp_wrap(err, "stage %d", st->stage);
        if (dp->device) {
            st->dev = (coll_device){e->devcomm, st, dev_alloc, dev_release, dev_add, dev_copy};
            if (model_stage_set_collective_device(s, 1, err) != 0 || prefill_buffers(dp, st, err) != 0)
                return pp_wrap(err, "stage %d", st->stage);
        }
    }
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->cv, NULL);
    if (pthread_create(&dp->thread, NULL, dp_main, dp) != 0) return pp_fail(err, "cannot start the all-reduce thread");
    dp->started = 1;
    return 0;
}

void engine_dp_close(engine *e) {
    engine_dp *dp = e->dp;
    if (!dp) return;
    if (dp->started) {
        pthread_mutex_lock(&dp->mu);
        dp->stop = 1;
        pthread_cond_broadcast(&dp->cv);
        pthread_mutex_unlock(&dp->mu);
        pthread_join(dp->thread, NULL);
        pthread_mutex_destroy(&dp->mu);
        pthread_cond_destroy(&dp->cv);
    }
    for (int k = 0; k < dp->nst; k++) {
        dp_stage *st = &dp->st[k];
        for (int i = 0; i < st->nbufs; i++) model_stage_device_free(st->ms, st->bufs[i].p);
        free(st->bufs), free(st->lo);
    }
    free(dp->st), free(dp->ranks), free(dp->prog), free(dp->owner), free(dp->part);
    free(dp);
    e->dp = NULL;
}

int engine_dp_device(const engine *e) { return e->dp && e->dp->device; }

void engine_dp_peers(const engine *e, char *is_peer) {
    if (!e->dp) return;
    for (int d = 0; d < e->replicas; d++)
        if (d != e->replica) is_peer[e->dp->ranks[d]] |= ENGINE_PEER_DP;
}

/* ---- the all-reduce ------------------------------------------------------- */

/* One local stage's gradient, bucket by bucket. */
static int reduce_stage(engine_dp *dp, const dp_stage *st, int step, pp_err *err) {
    engine *e = dp->e;
    model_stage *ms = e->stages[st->stage];
    float *const *parts;
    int np;
    if (model_stage_grad_parts(ms, &parts, &np, err) != 0) return -1;
    if (np > COLL_MAX_PARTS) return pp_fail(err, "stage %d: %d parts of the gradient tree", st->stage, np);
    float *grad = model_stage_grad(ms), *bp[COLL_MAX_PARTS];
    int zero1 = e->cfg->zero1;
    coll_group g = stage_group(dp, st);
    for (int b = 0; b < st->nbuckets; b++) {
        size_t lo = st->lo[b], len = st->lo[b + 1] - lo;
        for (int k = 0; k < np; k++) bp[k] = parts[k] + lo;
        uint64_t t0 = pp_now_ns(), rs = dp_tag(step, st->stage, b, DP_OP_RS);
        /* a GPU stage's bucket to the host (model.h; nothing on the device
         * path): in the span, the collective's own staging */
        if (model_stage_grad_fetch(ms, lo, lo + len, err) != 0) return -1;
        if (coll_reduce_scatter_send(&g, bp, np, len, rs, err) != 0) return -1;
        if (dp->fail_armed) { /* --fail-at phase=allreduce: its part of the first bucket is out */
            dp->fail_armed = 0;
            engine_maybe_fail(e, step, RUN_FAIL_AT_ALLREDUCE, -1);
        }
        if (coll_reduce_scatter_reduce(&g, &dp->order, bp, len, grad + lo, rs, err) != 0) return -1;
        if (!zero1 && coll_all_gather(&g, grad + lo, len, dp_tag(step, st->stage, b, DP_OP_AG_GRAD), err) != 0)
            return -1;
        /* ... and back to the device: the optimizer's part of the bucket */
        size_t wlo = zero1 ? coll_shard_lo(len, e->replicas, e->replica) : 0;
        size_t whi = zero1 ? coll_shard_lo(len, e->replicas, e->replica + 1) : len;
        if (model_stage_grad_written(ms, lo + wlo, lo + whi, err) != 0) return -1;
        engine_trace_span(e, zero1 ? ENGINE_SPAN_REDUCE_SCATTER : ENGINE_SPAN_ALLREDUCE, step, b, st->stage, dp->ranks[0],
                          sizeof(float) * len, t0, pp_now_ns());
    }
    return 0;
}

static void *dp_main(void *arg) {
    engine_dp *dp = arg;
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        while (!dp->stop && dp->taken == dp->queued) pthread_cond_wait(&dp->cv, &dp->mu);
        if (dp->stop) break;
        const dp_stage *st = &dp->st[dp->taken++];
        int step = dp->step;
        pthread_mutex_unlock(&dp->mu);
        pp_err err;
        int rc = reduce_stage(dp, st, step, &err);
        pthread_mutex_lock(&dp->mu);
        if (rc != 0 && !dp->failed) {
            dp->failed = 1;
            dp->err = err;
            pp_wrap(&dp->err, "rank %d: all-reduce of stage %d's gradient (step %d)", dp->e->rank, st->stage, step);
        }
        dp->done++;
        pthread_cond_broadcast(&dp->cv);
        if (dp->failed) { /* the group is broken: nothing more to reduce */
            while (!dp->stop) pthread_cond_wait(&dp->cv, &dp->mu);
            break;
        }
    }
    pthread_mutex_unlock(&dp->mu);
    return NULL;
}

/* Hands st[k] to the thread (they are handed in order). */
static void queue_stage(engine_dp *dp, int step) {
    pthread_mutex_lock(&dp->mu);
    if (dp->queued == 0) dp->step = step, dp->fail_armed = 1;
    dp->queued++;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
}

int engine_dp_w_done(engine *e, int step, int action) {
    engine_dp *dp = e->dp;
    /* The stages are queued in the order of their last W, which the rank
     * runs in its list's order: the next stage is complete at its last W. */
    if (dp && e->cfg->dp_overlap && dp->queued < dp->nst && dp->st[dp->queued].last_w == action) queue_stage(dp, step);
    return 0;
}

int engine_dp_finish(engine *e, int step, pp_err *err) {
    engine_dp *dp = e->dp;
    if (!dp) return 0;
    while (dp->queued < dp->nst) queue_stage(dp, step); /* --dp-overlap off, or stages that finished out of order */
    pthread_mutex_lock(&dp->mu);
    while (dp->done < dp->nst && !dp->failed) pthread_cond_wait(&dp->cv, &dp->mu);
    int failed = dp->failed;
    if (failed) *err = dp->err;
    dp->queued = dp->taken = dp->done = 0;
    pthread_mutex_unlock(&dp->mu);
    return failed ? -1 : 0;
}

int engine_dp_after_step(engine *e, int step, pp_err *err) {
    engine_dp *dp = e->dp;
    if (!dp || !e->cfg->zero1) return 0;
    for (int k = 0; k < dp->nst; k++) {
        const dp_stage *st = &dp->st[k];
        float *w = model_stage_params(e->stages[st->stage]); /* the device's on the device path */
        coll_group g = stage_group(dp, st);
        for (int b = 0; b < st->nbuckets; b++) {
            size_t lo = st->lo[b], len = st->lo[b + 1] - lo;
            uint64_t t0 = pp_now_ns();
            if (coll_all_gather(&g, w + lo, len, dp_tag(step, st->stage, b, DP_OP_AG_PARAMS), err) != 0 ||
                model_stage_params_written(e->stages[st->stage], lo, lo + len, err) != 0)
                return pp_wrap(err, "rank %d: all-gather of stage %d's weights (step %d)", e->rank, st->stage, step);
            engine_trace_span(e, ENGINE_SPAN_ALL_GATHER, step, b, st->stage, dp->ranks[0], sizeof(float) * len, t0,
                              pp_now_ns());
        }
    }
    return 0;
}

int engine_dp_losses(engine *e, int step, int kind, const float *mine, int m, float *all, pp_err *err) {
    if (e->replicas < 2) {
        memcpy(all, mine, sizeof(float) * (size_t)m);
        return 0;
    }
    int last = e->plan->stage_rank[e->plan->stages - 1];
    uint64_t tag = comm_tag((uint64_t)step, 0xFFFF, (uint64_t)kind, COMM_DIR_CTRL);
    if (e->replica > 0) {
        if (comm_send(e->comm, engine_global_rank(e->plan, 0, last), tag, mine, sizeof(float) * (size_t)m, err) != 0)
            return pp_wrap(err, "rank %d: sending step %d's losses to replica 0", e->rank, step);
        return 0;
    }
    memcpy(all, mine, sizeof(float) * (size_t)m);
    for (int d = 1; d < e->replicas; d++)
        if (comm_recv(e->comm, engine_global_rank(e->plan, d, last), tag, all + (size_t)d * (size_t)m,
                      sizeof(float) * (size_t)m, e->cfg->recv_timeout_ms, err) != 0)
            return pp_wrap(err, "rank %d: receiving step %d's losses of replica %d", e->rank, step, d);
    return 0;
}

int engine_dp_whole_state(engine *e, int step, int s, float *m, float *v, pp_err *err) {
    engine_dp *dp = e->dp;
    const dp_stage *st = NULL;
    for (int k = 0; dp && k < dp->nst; k++)
        if (dp->st[k].stage == s) st = &dp->st[k];
    if (!st) return pp_fail(err, "rank %d: stage %d has no data-parallel state", e->rank, s);
    float *pm, *pv;
    size_t owned, at = 0;
    model_stage_optimizer_state(e->stages[s], &pm, &pv, &owned);
    for (int b = 0; b < st->nbuckets; b++) { /* our shards into place (packed in bucket order) */
        size_t len = st->lo[b + 1] - st->lo[b];
        size_t lo = st->lo[b] + coll_shard_lo(len, e->replicas, e->replica);
        size_t k = coll_shard_lo(len, e->replicas, e->replica + 1) - coll_shard_lo(len, e->replicas, e->replica);
        memcpy(m + lo, pm + at, sizeof(float) * k);
        memcpy(v + lo, pv + at, sizeof(float) * k);
        at += k;
    }
    for (int b = 0; b < st->nbuckets; b++) {
        size_t lo = st->lo[b], len = st->lo[b + 1] - lo;
        if (coll_all_gather(&dp->g, m + lo, len, dp_tag(step, s, b, DP_OP_AG_M), err) != 0 ||
            coll_all_gather(&dp->g, v + lo, len, dp_tag(step, s, b, DP_OP_AG_V), err) != 0)
            return pp_wrap(err, "rank %d: gathering stage %d's optimizer state for the checkpoint", e->rank, s);
    }
    return 0;
}

int engine_dp_reshard(engine *e, int s, pp_err *err) {
    for (int k = 0; e->dp && k < e->dp->nst; k++)
        if (e->dp->st[k].stage == s) return shard_optimizer(e, &e->dp->st[k], err);
    return pp_fail(err, "rank %d: stage %d has no data-parallel state", e->rank, s);
}
