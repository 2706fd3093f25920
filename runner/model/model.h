/* model.h: one pipeline stage of the model, with forward (F), input-gradient
 * backward (B) and weight-gradient backward (W) as separate calls, plus the
 * optimizer step and checkpoints (docs/design.md §4-5).
 *
 * Two workloads share this interface:
 *   gpt:layers=L,dim=D,heads=H,seq=T,batch=N  a byte-level decoder-only
 *       transformer (llm.c style) on OpenBLAS, single-threaded;
 *   timed:f=2ms,b=2ms,w=2ms,act=64KiB        ops that sleep and move real
 *       buffers of `act` bytes, to check schedules against their theory
 *       (per=layer: the times are one layer's, so cuts unbalance stages).
 *
 * Partition: the L transformer blocks are what is split across stages
 * (layer index 0..L-1). The first stage also holds the token and position
 * embeddings, the last stage the final LayerNorm, the LM head and the loss.
 * Every layer's weights are initialised from (seed, layer index) alone, so the
 * partition never changes them.
 *
 * Numerics contract: whatever the schedule, the microbatch gradients of a
 * step are added along one fixed binary tree over their global index
 * (model_tree.h; W may be called out of order: the stage keeps pending
 * per-microbatch gradients until their turn), so a pipeline run equals the
 * one-stage run bit for bit, and D data-parallel replicas of m microbatches
 * equal one replica of D·m.
 *
 * CONTRACT: the engine (runner/worker/engine.c) relies on everything below. */
#ifndef PP_MODEL_H
#define PP_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/pp.h"
#include "config/model_spec.h"

typedef struct model_stage model_stage;

/* A stage holding blocks [first_layer, last_layer) and, if is_first, the
 * embeddings, if is_last, the head and loss. microbatches = m of one step
 * (the loss of a step is the mean over its microbatches). */
int model_stage_create(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last,
                       uint64_t seed, int microbatches, model_stage **out, pp_err *err);
void model_stage_free(model_stage *stage);

/* F of microbatch mb. First stage: reads tokens (model_tokens_per_microbatch
 * bytes), `in` is NULL. Other stages: `in` has model_boundary_bytes. Last
 * stage: reads targets, writes *loss (mean cross-entropy of this microbatch),
 * `out` is NULL. Others write `out`. Saves what B and W need. */
int model_stage_forward(model_stage *stage, int mb, const void *in, const uint8_t *tokens,
                        const uint8_t *targets, void *out, float *loss, pp_err *err);
/* B of mb: last stage has grad_out NULL (the loss is the source); first stage
 * has grad_in NULL. Frees what only B needed. */
int model_stage_backward_input(model_stage *stage, int mb, const void *grad_out, void *grad_in, pp_err *err);
/* W of mb: weight gradients, added along the gradient tree in microbatch
 * order. Frees the microbatch's saved activations. */
int model_stage_backward_weight(model_stage *stage, int mb, pp_err *err);
/* Optimizer step with the step's gradient, then zeroes it. step counts
 * from 0 (AdamW bias correction). With several replicas the gradient is
 * what the collective wrote into model_stage_grad. */
int model_stage_step(model_stage *stage, const model_optim *opt, int step, pp_err *err);

/* Number of floats model_stage_export_weights writes. */
size_t model_stage_weight_count(const model_stage *stage);
/* Writes all weights in global layer order (embeddings, blocks, head).
 * Concatenating the exports of stages 0..S-1 gives the one-stage export. */
void model_stage_export_weights(const model_stage *stage, float *dst);

/* Checkpoint of weights and optimizer state (docs/checkpoint.md); load
 * checks that the file was written for the same spec and layer range and
 * names what differs (a checkpoint of another layout loads with
 * model_stage_load_from, below). */
int model_stage_save(const model_stage *stage, FILE *f, pp_err *err);
int model_stage_load(model_stage *stage, FILE *f, pp_err *err);

/* Training data: bytes of a text file, or the embedded default corpus. */
typedef struct data_source data_source;
/* path NULL: the default corpus compiled into the binary; else a regular
 * file of at most 1 GiB (file_input_read). */
int data_open(const char *path, size_t min_bytes, data_source **out, pp_err *err);
void data_close(data_source *data);
/* Deterministic from (seed, step, mb): batch sequences of seq tokens, and the
 * next-byte targets. */
void data_batch(const data_source *data, uint64_t seed, int step, int mb, int batch, int seq, uint8_t *tokens,
                uint8_t *targets);

/* --- additions (not used by the engine's original contract) --------------- */

/* Optimizer steps applied so far (restored by model_stage_load): the step a
 * resumed job continues from. */
int model_stage_steps_done(const model_stage *stage);
/* The step's gradient once its last W ran (zero before), same layout as
 * the export (for gradient checks in tests). */
void model_stage_export_grads(const model_stage *stage, float *dst);
/* Replaces all weights (same layout as the export); for tests. */
void model_stage_import_weights(model_stage *stage, const float *src);

/* Time and work of every cblas_sgemm the stage ran (for bench/model.c). */
typedef struct model_gemm_stats {
    uint64_t calls, ns;
    double flops;
} model_gemm_stats;
model_gemm_stats model_stage_gemm_stats(const model_stage *stage);

/* Every BLAS call of the process on its calling thread (OpenBLAS's own
 * threads off, process-wide): for a rank that runs two ops at once on two
 * threads (an overlapped pair, sched.h), one core each. */
void model_blas_one_thread(void);
/* OpenBLAS's own threads stopped, until a BLAS call of this process wants
 * them again (OpenBLAS starts them anew then). The library starts them as
 * it loads, and each spins on sched_yield for about 0.1 s first
 * (OpenBLAS's THREAD_TIMEOUT): up to 60 ms of CPU on 2 cores for a
 * launcher that never multiplies, with or without a trace, and one
 * spinning thread per core on a bigger machine (docs/design.md §6, "What
 * tracing costs"). Nothing with an OpenBLAS without such threads (OpenMP
 * or serial builds). */
void model_blas_idle(void);

/* Activation memory the stage holds right now: the bytes of the buffers it
 * keeps for microbatches between their F and their W, i.e. what F saved for
 * B and W, minus what B already released, plus what B saved for W. gpt
 * (CPU or GPU): every per-microbatch saved tensor of mb_save/block_save
 * that is in use (not the stage's pool of free buffers kept for reuse) and
 * the copies of tokens and targets; timed: F's copy of its input, act bytes
 * per microbatch, freed by W. Not counted: weights, gradients (the step's
 * and the per-microbatch pending ones), optimizer state, scratch, boundary
 * tensors (the same for every schedule). 0 when no microbatch is in flight,
 * so after the W of every microbatch of a step. O(1). */
size_t model_stage_saved_bytes(const model_stage *stage);

/* Memory the stage holds for the whole job, whatever the schedule: its
 * weights, the step's gradient and the optimizer's two moments (allocated
 * for SGD too; under ZeRO-1 of its shard only), four floats per weight
 * unsharded; on the device for a GPU stage (its host copies not counted),
 * plus the weights' bf16 copy with --dtype bf16 (two bytes per weight).
 * Beside model_stage_saved_bytes it makes the
 * stage's memory at a point of the step (scratch, pools and boundary
 * tensors aside). */
size_t model_stage_state_bytes(const model_stage *stage);

/* --- activation recompute (docs/model.md, "Activation recompute") ----------
 *
 * What F keeps of each transformer block for B and W. With a recompute
 * mode, F drops part of it and model_stage_recompute computes it again
 * between the microbatch's F and its B, with the same kernels on the same
 * inputs: losses and weights stay bit for bit those of no recompute, and
 * model_stage_saved_bytes is lower between F and the recompute. After the
 * recompute the stage holds what it would have held without (full: less
 * the last block's output on a stage other than the last, which nothing
 * reads), so B and W are unchanged. */
typedef enum model_recompute {
    MODEL_RECOMPUTE_NONE = 0,      /* F keeps everything B and W read */
    MODEL_RECOMPUTE_FULL = 1,      /* F keeps each block's input only; the blocks' F runs again */
    MODEL_RECOMPUTE_SELECTIVE = 2, /* F drops what no GEMM produces (LayerNorm outputs, attention
                                      probabilities and output, GELU output) */
} model_recompute;
/* gpt only (a timed stage saves no activations to recompute: -1 for full or
 * selective), CPU or GPU; -1 naming the stage when a microbatch is in
 * flight. The mode applies from the next F on. */
int model_stage_set_recompute(model_stage *stage, model_recompute mode, pp_err *err);
/* 1 when mb is between its F and its B with dropped activations, so that
 * model_stage_recompute has work (the engine traces that work as its own
 * span); 0 otherwise. */
int model_stage_recompute_pending(const model_stage *stage, int mb);
/* Computes again what F of mb dropped; mb must be after F and before B (0
 * with nothing done when none was dropped). B does it itself when the
 * caller did not. */
int model_stage_recompute(model_stage *stage, int mb, pp_err *err);

/* --- checkpoints on any layout (docs/checkpoint.md) -------------------------
 *
 * A checkpoint file holds units of the model by name ("embeddings",
 * "block.L", "head"): each one's weights and AdamW moments, with the steps
 * done and the model spec. The stage files of a job's checkpoint step (any
 * number of stages, any cuts), or one merged file, form a set that loads
 * into a stage of any layout, and that writes out as one merged file. */

/* Who writes a stage file: stage `stage` of `stages`, of run `run_id`
 * (model_stage_save: stage 0 of 1, no run). */
typedef struct model_ckpt_tag {
    int stage, stages;
    const char *run_id;
} model_ckpt_tag;
int model_stage_save_as(const model_stage *stage, const model_ckpt_tag *tag, FILE *f, pp_err *err);

typedef struct model_ckpt model_ckpt;
int model_ckpt_create(model_ckpt **out, pp_err *err); /* an empty set */
void model_ckpt_free(model_ckpt *ckpt);
/* Adds the checkpoint file at path (a regular file: file_input_open) as the
 * set's next file: its header and table are read and checked (version 1
 * files, which pprun wrote before, whole); it must be of the same model,
 * step, format version and run as the files before it, say it is the next
 * stage of as many (version 2), and start at the unit where they end. -1
 * naming the file and what is wrong; the set is then as it was. */
int model_ckpt_add_file(model_ckpt *ckpt, const char *path, pp_err *err);
/* 1 when the set holds every unit of its model. */
int model_ckpt_complete(const model_ckpt *ckpt);
/* The number of stage files the set's writer had (version 2; a merged file:
 * 1), 0 for version 1 files, which do not say. */
int model_ckpt_stages(const model_ckpt *ckpt);
int model_ckpt_steps_done(const model_ckpt *ckpt);   /* the step a job continues from */
const char *model_ckpt_spec(const model_ckpt *ckpt); /* the canonical model spec */
const char *model_ckpt_run_id(const model_ckpt *ckpt); /* the run that wrote it; "" when unknown */
size_t model_ckpt_weight_count(const model_ckpt *ckpt);
/* 0 when the set is complete and of the model `spec`; else -1 naming both
 * models, or the first unit missing. */
int model_ckpt_check(const model_ckpt *ckpt, const model_spec *spec, pp_err *err);
/* Every unit of the set read and checked against its checksum (the whole
 * set read once): 0, or -1 naming the file and the first unit that is
 * truncated or corrupted. The launcher's check before a job starts. */
int model_ckpt_verify(model_ckpt *ckpt, pp_err *err);
/* The stage's units from the set (each checked against its checksum),
 * AdamW moments and steps done included: a job continues bit for bit. A
 * refused load changes nothing. */
int model_stage_load_from(model_stage *stage, model_ckpt *ckpt, pp_err *err);
/* The whole set as one version 2 file (stage 0 of 1, the set's run), every
 * unit checked before anything is written and again as it is copied: 0;
 * MODEL_CKPT_EINPUT when a unit cannot be read or fails its checksum (the
 * set's files are damaged, or changed meanwhile); -1 when writing failed
 * or memory ran out. err says which. */
#define MODEL_CKPT_EINPUT (-2)
int model_ckpt_write(model_ckpt *ckpt, FILE *f, pp_err *err);

/* Bytes of the training data (the corpus or the file). */
size_t data_size(const data_source *data);
/* data_open with `flag` naming the option in its messages ("--eval-data"). */
int data_open_as(const char *path, const char *flag, size_t min_bytes, data_source **out, pp_err *err);
/* Evaluation data held out of the training data: the last tenth of data's
 * bytes move into *held (data keeps the rest; batches are then drawn from
 * the first nine tenths). Both must keep min_bytes, or -1 naming the sizes
 * and nothing changes. */
int data_hold_out(data_source *data, size_t min_bytes, data_source **held, pp_err *err);

/* Where a stage computes. cuda = 0: the CPU (OpenBLAS), what
 * model_stage_create gives. cuda = 1: a CUDA device, local_rank modulo the
 * devices this process sees (CUDA_VISIBLE_DEVICES applies; several ranks may
 * share one GPU); bf16 = 1 rounds the operands of the linear layers' and the
 * head's GEMMs to bf16 (fp32 accumulation and output). gpt only, and only in
 * a build with the GPU backend (runner/model/cuda/, docs/gpu.md); the same
 * layers, F/B/W split, weight layout and numerics contract as on the CPU,
 * with host boundary buffers unless switched (model_stage_set_boundary_device). */
typedef struct model_device {
    int cuda, local_rank, bf16;
} model_device;
/* model_stage_create on a device (dev NULL: the CPU). No device, or no GPU
 * backend in this build: -1 naming which. */
int model_stage_create_on(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last,
                          uint64_t seed, int microbatches, const model_device *dev, model_stage **out, pp_err *err);

/* --- boundary tensors in device memory (docs/gpu.md) ---------------------
 *
 * By default the boundary tensors of F and B (F's `in` and `out`, B's
 * `grad_out` and `grad_in`) are host memory, whatever the stage computes on:
 * the GPU stage uploads and downloads them. A stage on a GPU can be switched
 * to take and return them in device memory of its own device instead, so that
 * they travel between ranks over devcomm (runner/comm/devcomm.h) without a
 * trip through the host. The switch is per stage and changes only what those
 * four pointers mean: the same calls, order checks and numerics (tokens and
 * targets stay host bytes), and every op still returns with its device work
 * complete. The CPU path never sees it. */

/* on = 1: from now on F and B take and return device pointers; on = 0: host
 * buffers (the default). -1 naming the stage when it does not compute on a
 * GPU, or when a microbatch is between its F and its W. */
int model_stage_set_boundary_device(model_stage *stage, int on, pp_err *err);
/* A boundary buffer of `bytes`, where the stage's mode wants it: device
 * memory of the stage's device (reused from the stage's pool of device
 * buffers) in device mode, else host memory (malloc). NULL on failure, with
 * err naming the size. The caller owns it and releases it with
 * model_stage_boundary_free of this stage or of any other stage of the same
 * process in the same mode (a rank's stages share one device): buffers are
 * handed from stage to stage. */
void *model_stage_boundary_alloc(model_stage *stage, size_t bytes, pp_err *err);
void model_stage_boundary_free(model_stage *stage, void *buf, size_t bytes); /* buf may be NULL */

/* --- data parallelism (docs/model.md, "Data parallel") ------------------ */

/* Makes the stage replica `replica` of `replicas` pipelines that split each
 * step's replicas·microbatches: its microbatch mb is the step's global
 * microbatch replica·microbatches + mb (the loss is averaged over all of
 * them, the timed model's bytes and gradients follow the global index), and
 * its W's add up the replica's parts of the gradient tree (model_tree.h)
 * rather than the whole gradient. A stage starts as replica 0 of 1. No
 * microbatch may be in flight. CPU or GPU stage (a GPU stage keeps its
 * parts on its device: model_stage_grad_fetch below). */
int model_stage_set_replica(model_stage *stage, int replica, int replicas, pp_err *err);

/* After the step's last W: the replica's parts of the gradient tree, in
 * order (*n of them, each model_stage_weight_count floats, owned by the
 * stage and valid until model_stage_step; the collective may overwrite
 * them). With one replica, the single part is the step's gradient itself.
 * -1 naming the first microbatch whose W has not run. */
int model_stage_grad_parts(model_stage *stage, float *const **parts, int *n, pp_err *err);
/* The step's gradient (weight_count floats): with several replicas the
 * collective writes the sum of every replica's parts here, before
 * model_stage_step. */
float *model_stage_grad(model_stage *stage);

/* By default the collective works on host memory whatever the stage
 * computes on (docs/gpu.md, "Data parallel"; a GPU stage can be switched
 * to device memory: model_stage_set_collective_device below). A GPU
 * stage's parts and gradient live on its device: the parts
 * model_stage_grad_parts gives are host copies,
 * filled for weights [lo, hi) by model_stage_grad_fetch (before the
 * collective reads that range), and model_stage_grad_written takes weights
 * [lo, hi) of what the collective wrote into model_stage_grad to the device
 * (before model_stage_step). Range by range, as the collective's
 * buckets, on the thread that overlaps them with the rank's other actions
 * (the copies are synchronous, from pageable host memory: one bucket's
 * copies do not overlap another's collective). Both return with the copy
 * done, may run on another thread than the stage's F/B/W (of other stages)
 * between the stage's last W and its optimizer step, and do nothing on a
 * CPU stage, whose parts and gradient are the host buffers themselves. -1
 * for a range outside the weights, or naming the device's error. */
int model_stage_grad_fetch(model_stage *stage, size_t lo, size_t hi, pp_err *err);
int model_stage_grad_written(model_stage *stage, size_t lo, size_t hi, pp_err *err);
/* The weights, in the export's layout (ZeRO-1's all-gather writes the
 * weights other ranks updated). */
float *model_stage_params(model_stage *stage);

/* ZeRO-1: from now on the optimizer updates only the weights [lo[i], hi[i])
 * for i < n (ascending, disjoint) and keeps only their moments, so AdamW's
 * state shrinks to that shard; the other weights are updated by the ranks
 * that own them (the engine all-gathers them after each step). The
 * optimizer state must be whole (a new or loaded stage, or after
 * model_stage_unshard_optimizer). AdamW updates each weight on its own, so
 * a shard's update is the whole update's bits on that shard. On a GPU
 * stage the moments on the device shrink to the shard too, and the step
 * brings the shard's new weights to the host (model_stage_params), where
 * the all-gather reads them. */
int model_stage_shard_optimizer(model_stage *stage, const size_t *lo, const size_t *hi, int n, pp_err *err);
/* ZeRO-1's all-gather wrote weights [lo, hi) of model_stage_params: a GPU
 * stage takes them to the device (nothing on a CPU stage); -1 for a range
 * outside the weights, or naming the device's error. */
int model_stage_params_written(model_stage *stage, size_t lo, size_t hi, pp_err *err);
/* The moments the stage keeps, packed in range order: *n floats each (the
 * weight count when not sharded). Owned by the stage (a GPU stage's host
 * copies, brought up to date). */
void model_stage_optimizer_state(model_stage *stage, float **m, float **v, size_t *n);
/* Makes the state whole again from every weight's moments (weight_count
 * floats each, copied): checkpoints hold the whole state. */
int model_stage_unshard_optimizer(model_stage *stage, const float *m, const float *v, pp_err *err);
/* Bytes of optimizer state the stage holds: AdamW's two moments (kept for
 * SGD too), of its shard under ZeRO-1. Included in model_stage_state_bytes. */
size_t model_stage_optimizer_bytes(const model_stage *stage);

/* --- the collective in device memory (docs/gpu.md, "Data parallel") -------
 *
 * A GPU stage's collective can work on the device's own buffers, moved GPU
 * to GPU (devcomm) and added by the stage's kernels, so that nothing of the
 * gradient or the weights goes through the host. After
 * model_stage_set_collective_device(stage, 1): model_stage_grad_parts gives
 * the device buffers of the parts, model_stage_grad the device gradient,
 * model_stage_params the device weights (ZeRO-1's all-gather writes there);
 * model_stage_grad_fetch and _grad_written do nothing (there is nothing to
 * copy), model_stage_params_written only rewrites what the device derives
 * from the weights (bf16: their copy), and ZeRO-1's optimizer step brings
 * no weights to the host (the host copies are refreshed when read, as
 * after any step). The order, and so the bits, are the host collective's:
 * model_stage_device_add is the float add of the host's loop. The switch
 * changes what those pointers mean, nothing else. -1 naming the stage on a
 * CPU stage, or in the middle of a step. */
int model_stage_set_collective_device(model_stage *stage, int on, pp_err *err);
/* The device ops the collective lends to the comm layer (comm_coll.h's
 * coll_device), on the stage's device and its stream, each returning with
 * its work complete; like _grad_fetch, from the collective's thread while
 * the stage is between its last W and its optimizer step. alloc: device
 * memory owned by the caller, back with model_stage_device_free of the same
 * stage (cudaMalloc: slow, keep it). add: out = a + b elementwise (out may be
 * a). copy: bytes from device src to device dst. */
void *model_stage_device_alloc(model_stage *stage, size_t bytes, pp_err *err);
void model_stage_device_free(model_stage *stage, void *p); /* p may be NULL */
int model_stage_device_add(model_stage *stage, float *out, const float *a, const float *b, size_t n, pp_err *err);
int model_stage_device_copy(model_stage *stage, void *dst, const void *src, size_t bytes, pp_err *err);

/* An evaluation's forward (docs/schedules.md, "Evaluation steps"): the same
 * arguments and loss as model_stage_forward, but nothing is kept for a B or
 * W. gmb: the microbatch's index in the evaluation step, which the timed
 * model's bytes follow. Between training steps only (no microbatch in
 * flight); CPU or GPU stage (on a GPU: the same kernels as F, so the loss
 * has the bits of a GPU F with these weights; boundary tensors in the
 * stage's mode, model_stage_set_boundary_device). */
int model_stage_evaluate(model_stage *stage, int gmb, const void *in, const uint8_t *tokens, const uint8_t *targets,
                         void *out, float *loss, pp_err *err);

#endif
