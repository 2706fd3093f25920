/* engine.c: one rank's pipeline loop (see engine.h): the training step's
 * actions, the optimizer, checkpoints; data parallelism in engine_dp.c,
 * evaluation steps in engine_eval.c. */
#include "runner/worker/engine_int.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "runner/worker/checkpoint_dir.h"
#include "tracer/cpuwait.h"

/* Timestamps are pp_now_ns(); the ring adds the test-only clock skew
 * itself (tracer/clock.h). */

/* A record of the engine's thread (with CUPTI, its op's kernels come with
 * it) or of the all-reduce's (a named span): one writer at a time. */
static void trace_event_write(engine *e, const trace_event *ev, int gpu) {
    pthread_mutex_lock(&e->trace_mu);
    trace_ring_write(e->ring, ev);
    if (gpu) gputrace_host_span(e->gpu, ev); /* CUPTI: the op's kernels are the ones launched since the last one */
    pthread_mutex_unlock(&e->trace_mu);
}

/* A host record of this rank's current attempt. */
static trace_event host_event(const engine *e, int phase, int step, int mb, int stage, int peer, uint64_t bytes,
                              uint64_t t0, uint64_t t1) {
    return (trace_event){.version = TRACE_EVENT_VERSION, .phase = (uint8_t)phase, .source = TRACE_SRC_CPU,
                         .attempt = e->attempt, .rank = e->rank, .step = step, .microbatch = mb, .stage = stage,
                         .peer = peer, .start_ns = t0, .end_ns = t1, .bytes = bytes};
}

static void trace(engine *e, int phase, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0, uint64_t t1,
                  double value) {
    if (!e->ring) return;
    trace_event ev = host_event(e, phase, step, mb, stage, peer, bytes, t0, t1);
    ev.value = value;
    if (phase < TRACE_LOSS) ev.wait_cpu_ns = trace_cpu_wait_since_last(); /* ops: rows of events */
    trace_event_write(e, &ev, 1);
}

void engine_trace(engine *e, int phase, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                  uint64_t t1, double value) {
    trace(e, phase, step, mb, stage, peer, bytes, t0, t1, value);
}

/* pprun's own span names (ENGINE_SPAN_*, engine_int.h), into the ring once
 * per attempt before any span: how a span's name id becomes its name in
 * the database (TRACE_SPAN_NAME records, as libpprun_trace sends a
 * program's). */
static void name_spans(engine *e) {
    static const char *const names[ENGINE_SPANS] = {
        [ENGINE_SPAN_ALLREDUCE] = "ALLREDUCE", [ENGINE_SPAN_REDUCE_SCATTER] = "REDUCE_SCATTER",
        [ENGINE_SPAN_ALL_GATHER] = "ALL_GATHER", [ENGINE_SPAN_RECOMPUTE] = "RECOMPUTE",
        [ENGINE_SPAN_GPU_TRACE] = "GPU_TRACE"};
    if (!e->ring) return;
    trace_event base = {.version = TRACE_EVENT_VERSION, .source = TRACE_SRC_CPU, .attempt = e->attempt,
                        .rank = e->rank, .step = e->start_step};
    trace_event recs[TRACE_SPAN_NAME_MAX / TRACE_NAME_CHUNK + 1];
    pthread_mutex_lock(&e->trace_mu);
    for (uint32_t id = 1; id < ENGINE_SPANS; id++) {
        size_t n = trace_name_records_of(TRACE_SPAN_NAME, &base, id, names[id], recs);
        for (size_t i = 0; i < n; i++) trace_ring_write(e->ring, &recs[i]);
    }
    pthread_mutex_unlock(&e->trace_mu);
}

/* A span of pprun's own; on_gpu: the kernels launched since the last record
 * are its (CUPTI), as for an op of the engine's thread. */
static void span(engine *e, uint32_t name, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                 uint64_t t1, int on_gpu) {
    if (!e->ring) return;
    trace_event ev = host_event(e, TRACE_SPAN, step, mb, stage, peer, bytes, t0, t1);
    ev.name = name;
    ev.wait_cpu_ns = trace_cpu_wait_since_last(); /* of this span's thread: the engine's or the all-reduce's */
    trace_event_write(e, &ev, on_gpu);
}

void engine_trace_span(engine *e, uint32_t name, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                       uint64_t t1) {
    span(e, name, step, mb, stage, peer, bytes, t0, t1, 0);
}

/* The global microbatch of the replica's mb (docs/model.md: replica·m + mb). */
static int global_mb(const engine *e, int mb) { return e->replica * e->plan->microbatches + mb; }

/* Activation bytes the rank holds now (model_stage_saved_bytes summed over
 * its few local stages): the `bytes` of F, B and W events. */
static uint64_t held_bytes(const engine *e) {
    uint64_t sum = 0;
    for (int i = 0; i < e->nlocal; i++) sum += model_stage_saved_bytes(e->stages[e->local_stage[i]]);
    return sum;
}

/* ---- partition and set-up -------------------------------------------------- */

static int partition(engine *e, pp_err *err) {
    const sched_plan *plan = e->plan;
    int layers = e->cfg->model.layers;
    e->first_layer = calloc((size_t)plan->stages + 1, sizeof *e->first_layer);
    if (!e->first_layer) return pp_fail(err, "out of memory");
    return sched_partition(layers, plan->stages, e->cfg->ncuts ? e->cfg->cuts : NULL, e->cfg->ncuts, e->first_layer,
                           err);
}

/* --recompute's mode for stage s (run_recompute and model_recompute name
 * the same modes). */
static model_recompute stage_recompute(const engine *e, int s) {
    switch (run_config_recompute_of(e->cfg, s)) {
    case RUN_RECOMPUTE_FULL: return MODEL_RECOMPUTE_FULL;
    case RUN_RECOMPUTE_SELECTIVE: return MODEL_RECOMPUTE_SELECTIVE;
    default: return MODEL_RECOMPUTE_NONE;
    }
}

/* Each local stage's units from the checkpoint's set of files. */
static int load_checkpoint(engine *e, pp_err *err) {
    for (int i = 0; i < e->nlocal; i++) {
        int s = e->local_stage[i];
        if (model_stage_load_from(e->stages[s], e->ckpt, err) != 0) return pp_wrap(err, "stage %d", s);
    }
    return 0;
}

int engine_init(engine *e, pp_err *err) {
    const sched_plan *plan = e->plan;
    pthread_mutex_init(&e->trace_mu, NULL);
    e->trace_mu_ready = 1;
    e->prank = e->rank % plan->ranks;
    e->replica = e->rank / plan->ranks;
    e->replicas = e->cfg->dp > 1 ? e->cfg->dp : 1;
    if (e->replica >= e->replicas)
        return pp_fail(err, "rank %d is outside %d replicas of %d ranks", e->rank, e->replicas, plan->ranks);
    if (partition(e, err) != 0) return -1;
    e->stages = calloc((size_t)plan->stages, sizeof *e->stages);
    e->local_stage = calloc((size_t)plan->stages, sizeof *e->local_stage);
    if (!e->stages || !e->local_stage) return pp_fail(err, "out of memory");
    for (int s = 0; s < plan->stages; s++) {
        if (plan->stage_rank[s] != e->prank) continue;
        e->local_stage[e->nlocal++] = s;
        model_device dev = {.cuda = e->cfg->device == RUN_DEVICE_CUDA, .local_rank = e->local_rank,
                            .bf16 = e->cfg->dtype == RUN_DTYPE_BF16};
        if (model_stage_create_on(&e->cfg->model, e->first_layer[s], e->first_layer[s + 1], s == 0,
                                  s == plan->stages - 1, e->cfg->seed, plan->microbatches, &dev, &e->stages[s],
                                  err) != 0 ||
            model_stage_set_recompute(e->stages[s], stage_recompute(e, s), err) != 0)
            return pp_wrap(err, "stage %d", s);
        if (e->replicas > 1 && model_stage_set_replica(e->stages[s], e->replica, e->replicas, err) != 0)
            return pp_wrap(err, "stage %d", s);
    }
    /* Device boundaries: every local stage takes and returns device buffers;
     * tensors for other ranks need devcomm. */
    e->device_boundaries = run_config_device_boundaries(e->cfg);
    for (int i = 0; i < e->nlocal && e->device_boundaries; i++) {
        int s = e->local_stage[i];
        if (model_stage_set_boundary_device(e->stages[s], 1, err) != 0) return pp_wrap(err, "stage %d", s);
        int nb[2];
        engine_stage_neighbours(plan, s, e->prank, nb);
        if (!e->devcomm && (nb[0] != e->prank || nb[1] != e->prank))
            return pp_fail(err, "rank %d: stage %d exchanges GPU-resident tensors with rank %d, but no device "
                           "transport (devcomm) is open", e->rank, s,
                           engine_global_rank(plan, e->replica, nb[0] != e->prank ? nb[0] : nb[1]));
    }
    /* Every replica loads the same units (the checkpoint's set, of any
     * layout); ZeRO-1 then keeps its shard of the optimizer state
     * (engine_dp_open). */
    if (e->ckpt && load_checkpoint(e, err) != 0) return -1;
    name_spans(e);
    return engine_dp_open(e, err);
}

void engine_free(engine *e) {
    engine_dp_close(e); /* its thread reads the stages */
    if (e->trace_mu_ready) pthread_mutex_destroy(&e->trace_mu);
    e->trace_mu_ready = 0;
    if (e->stages)
        for (int s = 0; s < e->plan->stages; s++)
            model_stage_free(e->stages[s]);
    free(e->stages);
    free(e->local_stage);
    free(e->first_layer);
    e->stages = NULL;
    e->local_stage = NULL;
    e->first_layer = NULL;
}

/* ---- one step ---------------------------------------------------------------- */

typedef struct engine_pair engine_pair;

/* Tensors handed between two stages of this rank, keyed by (dir, stage, mb). */
typedef struct step_state {
    int step;
    size_t act_bytes;
    void **mailbox; /* [2][stages][m] */
    float *losses;  /* [m] */
    uint8_t *tokens, *targets;
    engine_pair *pair; /* the second thread for overlapped pairs; NULL: this rank has none */
} step_state;

static void **mailbox_slot(const engine *e, step_state *st, int dir, int stage, int mb) {
    int m = e->plan->microbatches;
    return &st->mailbox[((size_t)dir * e->plan->stages + (size_t)stage) * (size_t)m + (size_t)mb];
}

/* --fail-at: fault injection for tests; dies the way a crashed rank dies.
 * A fused BW is the point of phase=B and of phase=W (run_fail_at_names). */
void engine_maybe_fail(const engine *e, int step, int op, int mb) {
    const run_fail_at *f = &e->cfg->fail_at;
    if (!f->enabled || e->attempt != 0 || f->step != step || f->rank != e->rank) return;
    if (!run_fail_at_names(f, op, mb)) return;
    fflush(NULL);
    raise(SIGKILL);
}

/* Boundary buffers come from the stage that writes them and go back to the
 * stage that read them last: host malloc, or device memory of the rank's
 * device with device boundaries (model_stage_boundary_alloc). */
static void *boundary_alloc(engine *e, step_state *st, int stage, pp_err *err) {
    return model_stage_boundary_alloc(e->stages[stage], st->act_bytes, err);
}
static void boundary_free(engine *e, step_state *st, int stage, void *buf) {
    if (buf) model_stage_boundary_free(e->stages[stage], buf, st->act_bytes);
}

/* Gets the tensor stage `from_stage` produced for `to_stage`: from the
 * mailbox when both are on this rank, else from the peer (over devcomm with
 * device boundaries). The caller frees it with boundary_free(to_stage). */
static int receive(engine *e, step_state *st, int dir, int from_stage, int mb, void **out, pp_err *err) {
    int peer = engine_stage_peer(e, from_stage);
    int to_stage = dir == COMM_DIR_ACT ? from_stage + 1 : from_stage - 1;
    if (peer == e->rank) {
        void **slot = mailbox_slot(e, st, dir, from_stage, mb);
        if (!*slot)
            return pp_fail(err, "rank %d: the %s of stage %d, microbatch %d is not ready on this rank (schedule order)",
                           e->rank, dir == COMM_DIR_ACT ? "activation" : "gradient", from_stage, mb);
        *out = *slot;
        *slot = NULL;
        return 0;
    }
    void *buf = boundary_alloc(e, st, to_stage, err);
    if (!buf) return -1;
    uint64_t t0 = pp_now_ns();
    uint64_t tag = comm_tag((uint64_t)st->step, (uint64_t)to_stage, (uint64_t)mb, (uint64_t)dir);
    int rc = e->device_boundaries
                 ? devcomm_recv(e->devcomm, peer, tag, buf, st->act_bytes, e->cfg->recv_timeout_ms, err)
                 : comm_recv(e->comm, peer, tag, buf, st->act_bytes, e->cfg->recv_timeout_ms, err);
    if (rc != 0) {
        boundary_free(e, st, to_stage, buf);
        return pp_wrap(err, "rank %d: receiving the %s of stage %d for microbatch %d (step %d) from rank %d", e->rank,
                       dir == COMM_DIR_ACT ? "activation" : "gradient", from_stage, mb, st->step, peer);
    }
    trace(e, dir == COMM_DIR_ACT ? TRACE_RECV_F : TRACE_RECV_B, st->step, global_mb(e, mb), to_stage, peer,
          st->act_bytes, t0, pp_now_ns(), 0);
    *out = buf;
    return 0;
}

/* Hands the tensor to `to_stage`; takes ownership of buf (from_stage's
 * boundary buffer). Both comm and devcomm sends keep their own copy. */
static int deliver(engine *e, step_state *st, int dir, int from_stage, int to_stage, int mb, void *buf, pp_err *err) {
    int peer = engine_stage_peer(e, to_stage);
    if (peer == e->rank) {
        *mailbox_slot(e, st, dir, from_stage, mb) = buf;
        return 0;
    }
    uint64_t t0 = pp_now_ns();
    uint64_t tag = comm_tag((uint64_t)st->step, (uint64_t)to_stage, (uint64_t)mb, (uint64_t)dir);
    int rc = e->device_boundaries ? devcomm_send(e->devcomm, peer, tag, buf, st->act_bytes, err)
                                  : comm_send(e->comm, peer, tag, buf, st->act_bytes, err);
    boundary_free(e, st, from_stage, buf);
    if (rc != 0)
        return pp_wrap(err, "rank %d: sending the %s of stage %d for microbatch %d (step %d) to rank %d", e->rank,
                       dir == COMM_DIR_ACT ? "activation" : "gradient", from_stage, mb, st->step, peer);
    trace(e, dir == COMM_DIR_ACT ? TRACE_SEND_F : TRACE_SEND_B, st->step, global_mb(e, mb), from_stage, peer,
          st->act_bytes, t0, pp_now_ns(), 0);
    return 0;
}

static int run_forward(engine *e, step_state *st, int s, int mb, pp_err *err) {
    const sched_plan *plan = e->plan;
    int first = s == 0, last = s == plan->stages - 1;
    const model_spec *spec = &e->cfg->model;
    void *in = NULL, *out = NULL;
    if ((first || last) && spec->kind == MODEL_GPT)
        data_batch(e->data, e->cfg->seed, st->step, global_mb(e, mb), spec->batch, spec->seq, st->tokens,
                   st->targets);
    if (!first && receive(e, st, COMM_DIR_ACT, s - 1, mb, &in, err) != 0) return -1;
    if (!last && !(out = boundary_alloc(e, st, s, err))) {
        boundary_free(e, st, s, in);
        return -1;
    }
    float loss = 0;
    uint64_t t0 = pp_now_ns();
    int rc = model_stage_forward(e->stages[s], mb, in, st->tokens, st->targets, out, last ? &loss : NULL, err);
    uint64_t t1 = pp_now_ns();
    boundary_free(e, st, s, in); /* the stage keeps its own copy of what B and W need */
    if (rc != 0) {
        boundary_free(e, st, s, out);
        return pp_wrap(err, "rank %d: forward of stage %d, microbatch %d (step %d)", e->rank, s, mb, st->step);
    }
    trace(e, TRACE_F, st->step, global_mb(e, mb), s, -1, held_bytes(e), t0, t1, 0);
    if (last) {
        st->losses[mb] = loss;
        trace(e, TRACE_LOSS, st->step, global_mb(e, mb), s, -1, 0, t1, t1, loss);
        return 0;
    }
    return deliver(e, st, COMM_DIR_ACT, s, s + 1, mb, out, err);
}

/* What F of mb dropped, computed again before its B, as a span of its own:
 * before the gradient's receive, so that it runs while the gradient is on
 * its way. */
static int recompute_before_b(engine *e, step_state *st, int s, int mb, pp_err *err) {
    if (!model_stage_recompute_pending(e->stages[s], mb)) return 0;
    uint64_t t0 = pp_now_ns();
    if (model_stage_recompute(e->stages[s], mb, err) != 0)
        return pp_wrap(err, "rank %d: recompute of stage %d, microbatch %d (step %d)", e->rank, s, mb, st->step);
    span(e, ENGINE_SPAN_RECOMPUTE, st->step, global_mb(e, mb), s, -1, held_bytes(e), t0, pp_now_ns(), 1);
    return 0;
}

/* B, or with fused a BW: B and W in one op, traced as one, the input
 * gradient sent at its end (a schedule's full backward, sched.h). */
static int run_backward_input(engine *e, step_state *st, int s, int mb, int fused, pp_err *err) {
    const sched_plan *plan = e->plan;
    int first = s == 0, last = s == plan->stages - 1;
    void *grad_out = NULL, *grad_in = NULL;
    if (recompute_before_b(e, st, s, mb, err) != 0) return -1;
    if (!last && receive(e, st, COMM_DIR_GRAD, s + 1, mb, &grad_out, err) != 0) return -1;
    if (!first && !(grad_in = boundary_alloc(e, st, s, err))) {
        boundary_free(e, st, s, grad_out);
        return -1;
    }
    uint64_t t0 = pp_now_ns();
    int rc = model_stage_backward_input(e->stages[s], mb, grad_out, grad_in, err);
    if (rc == 0 && fused) rc = model_stage_backward_weight(e->stages[s], mb, err);
    uint64_t t1 = pp_now_ns();
    boundary_free(e, st, s, grad_out);
    if (rc != 0) {
        boundary_free(e, st, s, grad_in);
        return pp_wrap(err, "rank %d: backward (%s) of stage %d, microbatch %d (step %d)", e->rank, fused ? "BW" : "B",
                       s, mb, st->step);
    }
    trace(e, fused ? TRACE_BW : TRACE_B, st->step, global_mb(e, mb), s, -1, held_bytes(e), t0, t1, 0);
    return first ? 0 : deliver(e, st, COMM_DIR_GRAD, s, s - 1, mb, grad_in, err);
}

static int run_backward_weight(engine *e, step_state *st, int s, int mb, pp_err *err) {
    uint64_t t0 = pp_now_ns();
    if (model_stage_backward_weight(e->stages[s], mb, err) != 0)
        return pp_wrap(err, "rank %d: backward (W) of stage %d, microbatch %d (step %d)", e->rank, s, mb, st->step);
    uint64_t t1 = pp_now_ns();
    trace(e, TRACE_W, st->step, global_mb(e, mb), s, -1, held_bytes(e), t0, t1, 0);
    return 0;
}

/* Local stage s into its file; under ZeRO-1 its optimizer state is
 * gathered whole from the group for the file (every replica takes part,
 * replica 0 writes), then sharded again. */
static int save_stage(engine *e, int step, int s, const char *path, pp_err *err) {
    model_stage *ms = e->stages[s];
    float *m = NULL, *v = NULL;
    if (e->cfg->zero1 && e->dp) {
        size_t n = model_stage_weight_count(ms);
        m = malloc(sizeof(float) * (n ? n : 1)), v = malloc(sizeof(float) * (n ? n : 1));
        int rc = m && v ? engine_dp_whole_state(e, step, s, m, v, err) : pp_fail(err, "out of memory");
        if (rc == 0 && e->replica == 0) rc = model_stage_unshard_optimizer(ms, m, v, err);
        free(m), free(v);
        if (rc != 0) return -1;
    }
    if (e->replica != 0) return 0;
    file_output out;
    int rc = file_output_begin(&out, path, "checkpoint", 0, err);
    model_ckpt_tag tag = {s, e->plan->stages, e->run_id};
    if (rc == 0 && model_stage_save_as(ms, &tag, out.f, err) != 0) {
        file_output_abort(&out);
        rc = pp_wrap(err, "%s", path); /* the model's write knows its stream only */
    } else if (rc == 0) {
        rc = file_output_commit(&out, err);
    }
    if (e->cfg->zero1 && e->dp && engine_dp_reshard(e, s, err) != 0) return -1;
    return rc;
}

/* The stages of replica 0 are the checkpoint (every replica holds the same
 * weights); each rank still counts itself in. */
static int save_checkpoint(engine *e, int step, pp_err *err) {
    char dir[1024], path[1024];
    checkpoint_dir_step_path(e->cfg->checkpoint_dir, step, dir, sizeof dir);
    if (e->replica == 0 && mkdir(e->cfg->checkpoint_dir, 0777) != 0 && errno != EEXIST)
        return pp_fail(err, "--checkpoint-dir %s: %s", e->cfg->checkpoint_dir, strerror(errno));
    if (e->replica == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        return pp_fail(err, "checkpoint: cannot create %s: %s", dir, strerror(errno));
    for (int i = 0; i < e->nlocal; i++) {
        int s = e->local_stage[i];
        checkpoint_dir_stage_path(e->cfg->checkpoint_dir, step, s, path, sizeof path);
        if (save_stage(e, step, s, path, err) != 0) return -1;
    }
    return e->hooks.checkpoint_done ? e->hooks.checkpoint_done(e->hooks.ctx, step, err) : 0;
}

/* On the rank of replica 0's last stage: the step's losses (every
 * replica's) to hooks.on_step; the other replicas' last stages send theirs. */
static int report_step(engine *e, step_state *st, uint64_t ns, pp_err *err) {
    const sched_plan *plan = e->plan;
    if (plan->stage_rank[plan->stages - 1] != e->prank) return 0;
    int m = plan->microbatches, total = m * e->replicas;
    float *all = malloc(sizeof(float) * (size_t)total);
    if (!all) return pp_fail(err, "out of memory");
    int rc = engine_dp_losses(e, st->step, 0, st->losses, m, all, err);
    if (rc == 0 && e->replica == 0 && e->hooks.on_step) {
        double sum = 0;
        for (int i = 0; i < total; i++) sum += all[i];
        engine_step_report rep = {
            .step = st->step,
            .microbatches = total,
            .losses = all,
            .loss = sum / total,
            .step_ns = ns,
            .tokens_per_s = ns ? (double)model_tokens_per_microbatch(&e->cfg->model) * total * 1e9 / (double)ns : 0,
        };
        rc = e->hooks.on_step(e->hooks.ctx, &rep, err);
    }
    free(all);
    return rc;
}

/* One action of the rank's list. */
static int run_action(engine *e, step_state *st, const sched_action *a, pp_err *err) {
    engine_maybe_fail(e, st->step, a->op, a->mb);
    gputrace_op_begin(e->gpu);
    int rc = a->op == SCHED_F   ? run_forward(e, st, a->stage, a->mb, err)
             : a->op == SCHED_W ? run_backward_weight(e, st, a->stage, a->mb, err)
                                : run_backward_input(e, st, a->stage, a->mb, a->op == SCHED_BW, err);
    gputrace_op_end(e->gpu);
    return rc;
}

/* ---- overlapped pairs ------------------------------------------------------
 *
 * An overlapped pair (sched_overlaps: DualPipeV's F of one chunk and BW of
 * the other) runs its F on a second thread while the engine's thread runs
 * its backward (on the CPU each with single-threaded BLAS:
 * model_blas_one_thread), so the two spans overlap in the trace. They share nothing but what is safe
 * to share: two stages of their own, the comm (it takes several threads),
 * the trace ring (under trace_mu) and the mailbox, where each reads and
 * writes slots of its own (an F's activation, a backward's gradient; the
 * validator made sure each input was there before the pair). The one F of
 * the first or last stage at a time uses tokens and targets. A pair's
 * event's `bytes` (held_bytes) may read the other half's stage mid-op. On
 * a GPU the halves run on their stages' own streams at once: each GPU
 * stage makes its device current on the calling thread and has its own
 * stream, cuBLAS handle, scratch and buffer pool (a pool is only used by
 * its stage's ops), devcomm takes several threads (devcomm.h: with the
 * data-parallel all-reduce's, three), and CUPTI's correlation is per
 * thread (gputrace.h). docs/schedules.md, "DualPipeV"; docs/gpu.md,
 * "Overlapped pairs on two streams". */
enum { PAIR_IDLE, PAIR_WORK, PAIR_DONE, PAIR_QUIT };

struct engine_pair {
    engine *e;
    step_state *st;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* state changed (either way) */
    int state;         /* PAIR_*, under mu */
    sched_action a;    /* the F handed over */
    int rc;
    pp_err err;
};

static void *pair_main(void *arg) {
    engine_pair *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->state == PAIR_IDLE || p->state == PAIR_DONE) pthread_cond_wait(&p->cv, &p->mu);
        if (p->state == PAIR_QUIT) break;
        sched_action a = p->a;
        pthread_mutex_unlock(&p->mu);
        int rc = run_action(p->e, p->st, &a, &p->err);
        pthread_mutex_lock(&p->mu);
        p->rc = rc;
        p->state = PAIR_DONE;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The second thread, for a plan with overlapped pairs on this rank; *out
 * stays NULL otherwise. */
static int pair_open(engine *e, step_state *st, engine_pair **out, pp_err *err) {
    *out = NULL;
    const sched_plan *plan = e->plan;
    int any = 0;
    for (int i = 0; i < plan->len[e->prank] && !any; i++) any = sched_overlaps(plan, e->prank, i);
    if (!any) return 0;
    engine_pair *p = calloc(1, sizeof *p);
    if (!p) return pp_fail(err, "out of memory");
    p->e = e, p->st = st;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, pair_main, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return pp_fail(err, "rank %d: cannot start the thread of the overlapped F", e->rank);
    }
    if (e->cfg->device == RUN_DEVICE_CPU)
        model_blas_one_thread(); /* two ops at once: one core each, whatever OPENBLAS_NUM_THREADS said */
    *out = p;
    return 0;
}

static void pair_close(engine_pair *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->state = PAIR_QUIT;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The pair f (an F) and b (a B or BW): f on the second thread, b on this
 * one; returns when both ended (the first failure, f's if both failed). */
static int run_pair(engine *e, step_state *st, const sched_action *f, const sched_action *b, pp_err *err) {
    engine_pair *p = st->pair;
    pthread_mutex_lock(&p->mu);
    p->a = *f;
    p->state = PAIR_WORK;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    int rc = run_action(e, st, b, err);
    pthread_mutex_lock(&p->mu);
    while (p->state != PAIR_DONE) pthread_cond_wait(&p->cv, &p->mu);
    p->state = PAIR_IDLE;
    pthread_mutex_unlock(&p->mu);
    if (p->rc != 0) {
        *err = p->err;
        return -1;
    }
    return rc;
}

static int run_step(engine *e, step_state *st, pp_err *err) {
    const sched_plan *plan = e->plan;
    uint64_t t_start = pp_now_ns();
    engine_maybe_fail(e, st->step, -1, -1);
    const sched_action *acts = plan->actions[e->prank];
    for (int i = 0; i < plan->len[e->prank]; i++) {
        int rc;
        if (st->pair && sched_overlaps(plan, e->prank, i) && i + 1 < plan->len[e->prank]) {
            rc = run_pair(e, st, &acts[i], &acts[i + 1], err);
            i++; /* the pair's backward: its W-done below */
        } else {
            rc = run_action(e, st, &acts[i], err);
        }
        if (rc != 0) return -1;
        if (acts[i].op == SCHED_W || acts[i].op == SCHED_BW) engine_dp_w_done(e, st->step, i);
    }
    /* The gradient all-reduce: the gap from here to the OPT is waiting for it. */
    if (engine_dp_finish(e, st->step, err) != 0) return -1;
    uint64_t t0 = pp_now_ns();
    for (int i = 0; i < e->nlocal; i++)
        if (model_stage_step(e->stages[e->local_stage[i]], &e->cfg->optim, st->step, err) != 0)
            return pp_wrap(err, "rank %d: optimizer step %d", e->rank, st->step);
    uint64_t t_end = pp_now_ns(), state = 0, optim = 0;
    for (int i = 0; i < e->nlocal; i++) {
        state += model_stage_state_bytes(e->stages[e->local_stage[i]]);
        optim += model_stage_optimizer_bytes(e->stages[e->local_stage[i]]);
    }
    trace(e, TRACE_OPT, st->step, -1, -1, -1, state, t0, t_end, (double)optim);
    /* CUPTI: the step's gpu spans and kernels; its time on this thread is
     * the GPU_TRACE span, so what tracing costs shows in the trace */
    uint64_t g0 = pp_now_ns();
    if (gputrace_step_end(e->gpu, st->step, err) != 0) return -1;
    if (e->gpu) engine_trace_span(e, ENGINE_SPAN_GPU_TRACE, st->step, -1, -1, -1, 0, g0, pp_now_ns());
    if (engine_dp_after_step(e, st->step, err) != 0) return -1;     /* ZeRO-1: the weights */
    if (report_step(e, st, t_end - t_start, err) != 0) return -1;
    if (engine_eval_step(e, st->step, err) != 0) return -1;
    int every = e->cfg->checkpoint_every;
    int last_step = st->step == e->cfg->steps - 1;
    if (e->cfg->checkpoint_dir[0] && ((every && (st->step + 1) % every == 0) || last_step))
        return save_checkpoint(e, st->step, err);
    return 0;
}

/* --save-weights DIR: every stage's final weights, raw float32 in global
 * layer order; DIR/stage_0.f32 ... concatenated equal a one-stage run's.
 * Replica 0's. */
static int save_weights(engine *e, pp_err *err) {
    const char *dir = e->cfg->save_weights;
    if (e->replica != 0) return 0; /* every replica holds the same weights */
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return pp_fail(err, "--save-weights %s: %s", dir, strerror(errno));
    for (int i = 0; i < e->nlocal; i++) {
        int s = e->local_stage[i];
        size_t n = model_stage_weight_count(e->stages[s]);
        float *w = malloc(n ? n * sizeof *w : 1);
        if (!w) return pp_fail(err, "out of memory");
        model_stage_export_weights(e->stages[s], w);
        char path[1024];
        snprintf(path, sizeof path, "%s/stage_%d.f32", dir, s);
        file_output out;
        int rc = file_output_begin(&out, path, "--save-weights", 0, err);
        if (rc == 0) {
            fwrite(w, sizeof *w, n, out.f); /* a short write shows in the commit */
            rc = file_output_commit(&out, err);
        }
        free(w);
        if (rc != 0) return -1;
    }
    return 0;
}

/* With device boundaries, one boundary-sized device message each way too,
 * so that devcomm's links (IPC handles, NCCL communicators) are up before
 * step 0: with the pipeline neighbours, and with the data-parallel group
 * when its all-reduce runs in GPU memory. */
static int connect_devcomm(engine *e, const char *is_peer, int world, pp_err *err) {
    int want = ENGINE_PEER_PIPE | (engine_dp_device(e) ? ENGINE_PEER_DP : 0), any = 0;
    for (int r = 0; r < world; r++) any |= is_peer[r] & want;
    /* A peer is the neighbour of a local stage, and engine_init made sure
     * such a rank has a devcomm; a device all-reduce has one by its rule. */
    if (!any) return 0;
    model_stage *stage = e->stages[e->local_stage[0]];
    size_t bytes = model_boundary_bytes(&e->cfg->model);
    void *buf = model_stage_boundary_alloc(stage, bytes, err);
    if (!buf) return -1;
    uint64_t tag = comm_tag(0, 0, 0, COMM_DIR_CTRL); /* the host hello's too: devcomm's tags are its own */
    int rc = 0;
    for (int r = 0; rc == 0 && r < world; r++)
        if (is_peer[r] & want) rc = devcomm_send(e->devcomm, r, tag, buf, bytes, err);
    for (int r = 0; rc == 0 && r < world; r++)
        if (is_peer[r] & want)
            rc = devcomm_recv(e->devcomm, r, tag, buf, bytes, e->cfg->recv_timeout_ms, err);
    model_stage_boundary_free(stage, buf, bytes);
    return rc;
}

/* Before the first step, one small message each way with every neighbour
 * (the ranks of adjacent stages) and every rank of its data-parallel
 * group: links are set up outside the measured steps, and the ranks start
 * the pipeline together, as the simulator assumes. */
static int connect_neighbours(engine *e, pp_err *err) {
    const sched_plan *plan = e->plan;
    if (!e->comm) return 0;
    int world = plan->ranks * e->replicas;
    char *is_peer = calloc((size_t)world, 1);
    if (!is_peer) return pp_fail(err, "out of memory");
    for (int s = 0; s < plan->stages; s++) {
        if (plan->stage_rank[s] != e->prank) continue;
        int nb[2];
        engine_stage_neighbours(plan, s, e->prank, nb);
        is_peer[engine_global_rank(plan, e->replica, nb[0])] = ENGINE_PEER_PIPE;
        is_peer[engine_global_rank(plan, e->replica, nb[1])] = ENGINE_PEER_PIPE;
    }
    engine_dp_peers(e, is_peer);
    is_peer[e->rank] = 0;
    uint64_t tag = comm_tag(0, 0, 0, COMM_DIR_CTRL);
    char hello = 1;
    int rc = 0;
    for (int r = 0; rc == 0 && r < world; r++)
        if (is_peer[r]) rc = comm_send(e->comm, r, tag, &hello, 1, err);
    for (int r = 0; rc == 0 && r < world; r++)
        if (is_peer[r]) rc = comm_recv(e->comm, r, tag, &hello, 1, e->cfg->recv_timeout_ms, err);
    if (rc == 0 && e->device_boundaries) rc = connect_devcomm(e, is_peer, world, err);
    free(is_peer);
    return rc == 0 ? 0 : pp_wrap(err, "rank %d: connecting to its pipeline neighbours", e->rank);
}

void engine_stage_neighbours(const sched_plan *plan, int s, int self, int nb[2]) {
    nb[0] = s > 0 ? plan->stage_rank[s - 1] : self;
    nb[1] = s < plan->stages - 1 ? plan->stage_rank[s + 1] : self;
}

int engine_run(engine *e, pp_err *err) {
    const sched_plan *plan = e->plan;
    if (connect_neighbours(e, err) != 0) return -1;
    const model_spec *spec = &e->cfg->model;
    size_t m = (size_t)plan->microbatches, tokens = model_tokens_per_microbatch(spec);
    step_state st = {
        .act_bytes = model_boundary_bytes(spec),
        .mailbox = calloc(2 * (size_t)plan->stages * m, sizeof(void *)),
        .losses = calloc(m, sizeof(float)),
        .tokens = malloc(tokens ? tokens : 1),
        .targets = malloc(tokens ? tokens : 1),
    };
    int rc = 0;
    if (!st.mailbox || !st.losses || !st.tokens || !st.targets) rc = pp_fail(err, "out of memory");
    if (rc == 0) rc = pair_open(e, &st, &st.pair, err);
    for (int step = e->start_step; rc == 0 && step < e->cfg->steps; step++) {
        st.step = step;
        rc = run_step(e, &st, err);
    }
    pair_close(st.pair);
    if (rc == 0 && e->cfg->save_weights[0]) rc = save_weights(e, err);
    /* Tensors never taken (a failed step): any stage of this rank takes a
     * boundary buffer back (model.h), and only local stages fill the mailbox. */
    if (st.mailbox && e->nlocal > 0)
        for (size_t i = 0; i < 2 * (size_t)plan->stages * m; i++) boundary_free(e, &st, e->local_stage[0], st.mailbox[i]);
    free(st.mailbox);
    free(st.losses);
    free(st.tokens);
    free(st.targets);
    return rc;
}
