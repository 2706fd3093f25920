/* engine_int.h: what the engine's files share (not a contract): engine.c
 * (the training step), engine_dp.c (data parallelism: the gradient
 * all-reduce, ZeRO-1, the losses of every replica) and engine_eval.c (the
 * evaluation step). */
#ifndef PP_ENGINE_INT_H
#define PP_ENGINE_INT_H
#include "runner/worker/engine.h"

/* One trace record (phase, fields as tracer/event.h has them); safe from
 * the engine's threads. */
void engine_trace(engine *e, int phase, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                  uint64_t t1, double value);
/* pprun's own span names (TRACE_SPAN_NAME ids, every rank): ALLREDUCE (a
 * bucket's reduce-scatter and all-gather of the gradient), REDUCE_SCATTER
 * (the same under ZeRO-1: only the shard is reduced), ALL_GATHER (ZeRO-1:
 * the weights after the optimizer), RECOMPUTE (what F dropped, computed
 * again before its B), GPU_TRACE (CUPTI's work at a step's end: what
 * tracing the GPU costs the training thread). */
enum {
    ENGINE_SPAN_ALLREDUCE = 1,
    ENGINE_SPAN_REDUCE_SCATTER,
    ENGINE_SPAN_ALL_GATHER,
    ENGINE_SPAN_RECOMPUTE,
    ENGINE_SPAN_GPU_TRACE,
    ENGINE_SPANS
};
/* One of pprun's own named spans (phase SPAN, name id ENGINE_SPAN_*). */
void engine_trace_span(engine *e, uint32_t name, int step, int mb, int stage, int peer, uint64_t bytes, uint64_t t0,
                       uint64_t t1);
/* --fail-at: dies the way a crashed rank dies when (step, op, mb) is the
 * point named (op: sched_op or RUN_FAIL_AT_ALLREDUCE; mb: the replica's). */
void engine_maybe_fail(const engine *e, int step, int op, int mb);
/* The global rank that holds stage s in this rank's replica. */
static inline int engine_stage_peer(const engine *e, int s) {
    return engine_global_rank(e->plan, e->replica, e->plan->stage_rank[s]);
}

/* ---- engine_dp.c ---------------------------------------------------------- */



/* With several replicas: the group, the buckets, ZeRO-1's shards, the span
 * names and the thread. After the stages are created and loaded. */
int engine_dp_open(engine *e, pp_err *err);
void engine_dp_close(engine *e); /* stops and joins the thread */
/* Marks the ranks of this rank's data-parallel group (is_peer: the world)
 * with ENGINE_PEER_DP, beside the pipeline neighbours' ENGINE_PEER_PIPE:
 * only these exchange device tensors over devcomm (the DP group's only when
 * its collective runs in device memory: engine_dp_device). */
enum { ENGINE_PEER_PIPE = 1, ENGINE_PEER_DP = 2 };
void engine_dp_peers(const engine *e, char *is_peer);
/* The W at `action` (an index into the rank's list) ran: when it was its
 * stage's last of the step and --dp-overlap is on, the stage's all-reduce
 * starts. */
int engine_dp_w_done(engine *e, int step, int action);
/* After the rank's last action: starts what has not started, and waits
 * until every local stage's gradient is reduced (the first failure of the
 * all-reduce is returned). */
int engine_dp_finish(engine *e, int step, pp_err *err);
/* After the optimizer step, ZeRO-1: every shard's updated weights to every
 * replica. */
int engine_dp_after_step(engine *e, int step, pp_err *err);
/* The losses of every replica on the rank of replica 0's last stage: the
 * other replicas' last-stage ranks send theirs (m each) and return; replica
 * 0's fills all[replicas·m] in global order. kind: 0 training, 1 evaluation. */
int engine_dp_losses(engine *e, int step, int kind, const float *mine, int m, float *all, pp_err *err);
/* ZeRO-1, for a checkpoint: every weight's moments of local stage s
 * (m and v, weight_count floats each) gathered from the group. */
int engine_dp_whole_state(engine *e, int step, int s, float *m, float *v, pp_err *err);
/* ZeRO-1: local stage s keeps only its shard of the optimizer state again
 * (after model_stage_unshard_optimizer for a checkpoint). */
int engine_dp_reshard(engine *e, int s, pp_err *err);

/* ---- engine_eval.c -------------------------------------------------------- */

/* The evaluation step after training step `step` (when --eval-every says
 * so): the forward-only plan on held-out data, traced as EVAL_*, the losses
 * to hooks.on_eval. */
int engine_eval_step(engine *e, int step, pp_err *err);

#endif
