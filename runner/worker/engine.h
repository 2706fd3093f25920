/* engine.h: runs one rank's part of a pipeline schedule, step after step.
 *
 * For every action of the rank's list: F receives its input from the previous
 * stage (unless it is the first) and sends its output on (unless it is the
 * last); B receives the output gradient (unless last) and sends the input
 * gradient (unless first); W uses what F and B saved; the last stage records
 * each microbatch's loss; the optimizer step follows the last action. Two
 * stages on one rank pass tensors in memory. Every op is traced.
 *
 * Boundary tensors are host buffers sent over comm, except with --device
 * cuda and a GPU transport (run_config_device_boundaries): then they are
 * device buffers of the stages (model_stage_set_boundary_device) and travel
 * to other ranks over devcomm; local stages hand them over as before.
 *
 * With --recompute, a stage's F drops activations that B needs; before B
 * the engine has them computed again (model_stage_recompute), traced as a
 * span named RECOMPUTE (phase SPAN) of the B's step, microbatch and stage,
 * with the bytes the rank holds after it.
 *
 * After the steps --checkpoint-every names, and after the last, with
 * --checkpoint-dir, the rank's stages are saved into the checkpoint
 * directory (checkpoint_dir.h), each file tagged with its stage, the
 * number of stages and the run, before hooks.checkpoint_done.
 *
 * Data parallelism (--dp D, docs/cli.md "Data parallel"): global rank r is
 * replica r / P at pipeline rank r % P (P = plan->ranks); the plan is one
 * pipeline's, and every replica runs it on its own microbatches, global
 * microbatch replica·m + mb. After a stage's last W its gradient is
 * all-reduced over the ranks at the same pipeline rank (engine_dp.c): in
 * a thread of its own, so that it overlaps the rank's remaining actions,
 * and the optimizer step waits for it. Evaluation steps (--eval-every) run
 * the forward-only plan after training steps (engine_eval.c).
 *
 * The engine owns nothing it is given (plan, comm, ring, data); it owns the
 * model stages it creates and its data-parallel state. */
#ifndef PP_ENGINE_H
#define PP_ENGINE_H
#include <pthread.h>
#include <stdint.h>

#include "base/pp.h"
#include "runner/comm/comm.h"
#include "runner/comm/devcomm.h"
#include "runner/model/model.h"
#include "sched/sched.h"
#include "config/run_config.h"
#include "tracer/gputrace.h"
#include "tracer/ring.h"

/* Called on the rank that holds the last stage of replica 0 after each step
 * (and each evaluation step), with every replica's losses. */
typedef struct engine_step_report {
    int step;
    int microbatches;    /* of the step over all replicas */
    const float *losses; /* [microbatches], global microbatch order */
    double loss;         /* mean */
    uint64_t step_ns;    /* this rank's step, first action to optimizer end */
    double tokens_per_s;
} engine_step_report;

typedef struct engine_dp engine_dp; /* engine_dp.c */

typedef struct engine_hooks {
    void *ctx;
    int (*on_step)(void *ctx, const engine_step_report *report, pp_err *err);
    /* After the evaluation step that follows training step report->step
     * (step_ns: the evaluation's time; tokens_per_s its rate). */
    int (*on_eval)(void *ctx, const engine_step_report *report, pp_err *err);
    /* After every stage of this rank saved checkpoint `step`: returns once
     * the checkpoint is complete on all ranks (or fails). */
    int (*checkpoint_done)(void *ctx, int step, pp_err *err);
} engine_hooks;

typedef struct engine {
    const run_config *cfg;
    const sched_plan *plan;
    int rank, attempt;
    int local_rank;      /* picks the CUDA device with --device cuda */
    comm *comm;          /* NULL only when the job has one rank */
    devcomm *devcomm;    /* device boundaries to other ranks; NULL with one rank or host boundaries */
    trace_ring *ring;    /* NULL when tracing is off */
    gputrace *gpu;       /* CUPTI (--cupti on); NULL when off or unavailable */
    data_source *data;   /* needed on the ranks holding the first or last stage */
    engine_hooks hooks;
    int start_step;      /* the first step to run: 0, or the step after the checkpoint to start from */
    model_ckpt *ckpt;    /* the checkpoint to start from (checkpoint_dir_start); NULL: none; engine_init reads it */
    const char *run_id;  /* the run, in the header of every stage file it saves */
    data_source *eval_data; /* --eval-every: held-out data, on the ranks of the first and the last stage */
    const sched_plan *eval_plan; /* --eval-every: the forward-only plan (sched_forward_only) */

    /* owned */
    int prank;            /* the rank in its pipeline (plan's rank): rank % plan->ranks */
    int replica, replicas; /* its replica rank / plan->ranks, of cfg->dp */
    engine_dp *dp;        /* the data-parallel gradient reduction; NULL with one replica */
    pthread_mutex_t trace_mu; /* the ring takes one writer at a time: the engine's and the all-reduce's threads */
    int trace_mu_ready;
    int nlocal;           /* stages on this rank */
    int *local_stage;     /* [nlocal] stage index */
    model_stage **stages; /* [plan->stages], NULL where not local */
    int *first_layer;     /* [plan->stages + 1] partition of the blocks */
    int device_boundaries; /* 1: boundary tensors live in device memory (set by engine_init) */
} engine;

/* Partitions the model, creates this rank's stages and, with a ckpt,
 * loads them from it, whatever layout wrote it (checkpoint_dir_start says
 * which, if any, a rank starts from). */
int engine_init(engine *e, pp_err *err);
/* Runs steps start_step .. cfg->steps-1. */
int engine_run(engine *e, pp_err *err);
void engine_free(engine *e);

/* The pipeline ranks (the plan's) of stage s's neighbours, the stages s-1
 * (nb[0]) and s+1 (nb[1]); `self` where there is none (the first and the
 * last stage). Add replica·plan->ranks for global ranks. */
void engine_stage_neighbours(const sched_plan *plan, int s, int self, int nb[2]);
/* 1 when this rank's data-parallel all-reduce runs in GPU memory (over
 * devcomm, with the stages' kernels: engine_dp.c), 0 when it runs on host
 * memory or there is none; after engine_init. */
int engine_dp_device(const engine *e);
/* The global rank of pipeline rank prank in replica `replica`. */
static inline int engine_global_rank(const sched_plan *plan, int replica, int prank) {
    return replica * plan->ranks + prank;
}

#endif
