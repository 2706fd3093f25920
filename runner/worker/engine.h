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
 * The engine owns nothing it is given (plan, comm, ring, data); it owns the
 * model stages it creates. */
#ifndef PP_ENGINE_H
#define PP_ENGINE_H
#include <stdint.h>

#include "base/pp.h"
#include "runner/comm/comm.h"
#include "runner/comm/devcomm.h"
#include "runner/model/model.h"
#include "sched/sched.h"
#include "config/run_config.h"
#include "tracer/gputrace.h"
#include "tracer/ring.h"

/* Called on the rank that holds the last stage after each step. */
typedef struct engine_step_report {
    int step;
    int microbatches;
    const float *losses; /* [microbatches], microbatch order */
    double loss;         /* mean */
    uint64_t step_ns;    /* this rank's step, first action to optimizer end */
    double tokens_per_s;
} engine_step_report;

typedef struct engine_hooks {
    void *ctx;
    int (*on_step)(void *ctx, const engine_step_report *report, pp_err *err);
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

    /* owned */
    int nlocal;           /* stages on this rank */
    int *local_stage;     /* [nlocal] stage index */
    model_stage **stages; /* [plan->stages], NULL where not local */
    int *first_layer;     /* [plan->stages + 1] partition of the blocks */
    int device_boundaries; /* 1: boundary tensors live in device memory (set by engine_init) */
    unsigned span_names;   /* bit i: the name of span id i is in the ring (engine.c) */
} engine;

/* Partitions the model, creates this rank's stages and, with a ckpt,
 * loads them from it, whatever layout wrote it (checkpoint_dir_start says
 * which, if any, a rank starts from). */
int engine_init(engine *e, pp_err *err);
/* Runs steps start_step .. cfg->steps-1. */
int engine_run(engine *e, pp_err *err);
void engine_free(engine *e);

/* The ranks of stage s's neighbours, the stages s-1 (nb[0]) and s+1
 * (nb[1]); `self` where there is none (the first and the last stage). */
void engine_stage_neighbours(const sched_plan *plan, int s, int self, int nb[2]);

#endif
