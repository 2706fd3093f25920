/* model_internal.h: what the model's own files share (not part of the
 * contract): the stage struct, the flat parameter/gradient storage that the
 * optimizer and checkpoints work on, and the deterministic PRNG. */
#ifndef PP_MODEL_INTERNAL_H
#define PP_MODEL_INTERNAL_H
#include <stdint.h>

#include "runner/model/model.h"
#include "runner/model/gpt_layers.h"

typedef struct gpt_state gpt_state;
typedef struct gpu_stage gpu_stage; /* runner/model/cuda/gpu_stage.c */

/* Free buffers kept for reuse: activations are allocated and released every
 * microbatch, and fresh pages from the kernel would be faulted in inside the
 * GEMMs (measured: a third of their time). Owned by the stage; holds at most
 * the peak of what was in use. */
typedef struct model_pool {
    size_t n, cap;
    struct pool_entry { void *p; size_t size; } *free;
} model_pool;
void *model_pool_get(model_pool *pool, size_t size); /* NULL when out of memory */
void model_pool_put(model_pool *pool, void *p, size_t size); /* p may be NULL */
void model_pool_clear(model_pool *pool);
typedef struct timed_state timed_state;

/* Per-microbatch progress: F, then B, then W, then back to empty. */
enum { MB_EMPTY = 0, MB_FORWARD = 1, MB_BACKWARD = 2 };

struct model_stage {
    model_spec spec;
    int first_layer, last_layer, is_first, is_last;
    uint64_t seed;
    int microbatches;
    /* All weights of the stage in global layer order, so that export and
     * checkpoints are a memcpy and the optimizer is one loop. */
    size_t nparams;
    float *params, *grad, *adam_m, *adam_v; /* grad: accumulated over the step */
    int steps_done;                         /* optimizer steps applied so far */
    /* Numerics contract: W(mb) writes its gradient into pending[mb] (owned,
     * nparams floats); pending buffers are taken strictly in microbatch
     * order, next_acc being the next one due, and added along the gradient
     * tree (model_tree.h) by the replica's program: tree[tree_pc] is its next
     * step, stack[0 .. depth-1] its partial sums (owned, from the pool).
     * When the program ends the stack holds the replica's parts: with one
     * replica a single part, swapped into grad; with several, the
     * data-parallel collective sums every replica's parts into grad
     * (model_stage_grad_parts, model_stage_grad). */
    float **pending;
    int next_acc;
    int replica, replicas; /* global microbatch of mb: replica·microbatches + mb, of replicas·microbatches */
    int *tree, ntree, tree_pc;
    float **stack;
    int depth;
    /* ZeRO-1 (model_stage_shard_optimizer): the optimizer updates only
     * weights [shard_lo[i], shard_hi[i]), and adam_m/adam_v hold just those,
     * packed in range order (shard_owned floats; possibly none). */
    int sharded, nshard;
    size_t *shard_lo, *shard_hi, shard_owned;
    int *mb_state; /* [microbatches]: MB_* */
    gpt_state *gpt;
    timed_state *timed;
    gpu_stage *gpu; /* set: the gpt stage runs on a CUDA device (gpt is NULL) */
    int boundary_device; /* 1: F/B's boundary tensors are device pointers (gpu only) */
    int coll_device;     /* 1: the data-parallel collective works on the device's buffers (gpu only) */
    int recompute;       /* model_recompute: what F drops for model_stage_recompute to compute again */
    model_gemm_stats gemm;
    model_pool pool; /* activations and pending gradients */
};

/* The global microbatch index of mb (data parallelism: the replica's
 * block), and the step's microbatches over all replicas: what the loss is
 * averaged over and what the timed model's patterns follow. */
static inline int model_global_mb(const model_stage *s, int mb) { return s->replica * s->microbatches + mb; }
static inline int model_global_microbatches(const model_stage *s) { return s->replicas * s->microbatches; }

/* model_stage.c: checks that op may run on mb now ("F"/"B"/"W"). */
int model_mb_check(model_stage *s, int mb, int want_state, const char *op, pp_err *err);
/* Returns pending[mb] (allocating it), to be filled completely by W. */
float *model_pending(model_stage *s, int mb, pp_err *err);
/* Marks pending[mb] complete and runs the gradient tree's program over every
 * due buffer, in mb order. */
void model_commit(model_stage *s, int mb);
/* Returns the stack's buffers to the pool and restarts the program (the
 * optimizer step, after the collective read the parts). */
void model_tree_reset(model_stage *s);

/* gpt_stage.c / timed_stage.c */
int gpt_stage_init(model_stage *s, pp_err *err);
void gpt_stage_free(model_stage *s);
int gpt_stage_forward(model_stage *s, int mb, const float *in, const uint8_t *tokens, const uint8_t *targets,
                      float *out, float *loss, pp_err *err);
int gpt_stage_backward_input(model_stage *s, int mb, const float *grad_out, float *grad_in, pp_err *err);
int gpt_stage_backward_weight(model_stage *s, int mb, float *dst, pp_err *err);
size_t gpt_param_count(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last);
size_t gpt_stage_saved_bytes(const model_stage *s); /* model_stage_saved_bytes of a CPU gpt stage */
/* model_stage_recompute_pending / model_stage_recompute of a CPU gpt stage
 * (mb after F, before B); B calls the recompute itself when needed. */
int gpt_stage_recompute_pending(const model_stage *s, int mb);
int gpt_stage_recompute(model_stage *s, int mb, pp_err *err);
void gpt_stage_discard(model_stage *s, int mb);     /* drops what F saved for mb (an evaluation's F) */

/* gpu_stage.c (only in builds with the GPU backend, PPRUN_HAVE_CUDA): the
 * gpt stage on a device. init uploads the weights the host already holds;
 * W commits in microbatch order on the device; step refreshes the host's
 * params, adam_m and adam_v; upload after a checkpoint load or an import. */
int gpu_stage_init(model_stage *s, const model_device *dev, pp_err *err);
void gpu_stage_free(model_stage *s);
int gpu_stage_forward(model_stage *s, int mb, const float *in, const uint8_t *tokens, const uint8_t *targets,
                      float *out, float *loss, pp_err *err);
int gpu_stage_backward_input(model_stage *s, int mb, const float *grad_out, float *grad_in, pp_err *err);
int gpu_stage_backward_weight(model_stage *s, int mb, pp_err *err); /* also marks mb done and commits */
int gpu_stage_step(model_stage *s, const model_optim *opt, int step, pp_err *err);
int gpu_stage_upload(model_stage *s, pp_err *err);
int gpu_stage_fetch_state(const model_stage *s, pp_err *err); /* host copies of params, adam_m, adam_v */
/* Failures of these void calls are reported by the next F. host_current:
 * gpu_stage_fetch_state for a void caller (model_stage_optimizer_state). */
void gpu_stage_host_current(model_stage *s);
void gpu_stage_import(model_stage *s, const float *weights);
void gpu_stage_export_weights(const model_stage *s, float *dst);
void gpu_stage_export_grads(const model_stage *s, float *dst);
/* Device boundary buffers from and back to the stage's pool of device memory. */
void *gpu_stage_boundary_alloc(model_stage *s, size_t bytes, pp_err *err);
void gpu_stage_boundary_free(model_stage *s, void *buf, size_t bytes);
size_t gpu_stage_saved_bytes(const model_stage *s); /* device bytes, as gpt_stage_saved_bytes counts them */
/* The device bytes of the weights' bf16 copy (--dtype bf16; else 0), which
 * model_stage_state_bytes adds to a GPU stage's */
size_t gpu_stage_bf16_bytes(const model_stage *s);
/* Data parallel (model_stage_grad_parts, _grad_fetch, _grad_written): host
 * mirrors of the replica's parts, filled range by range from the device,
 * and the host gradient the collective wrote, uploaded range by range. */
int gpu_stage_grad_parts(model_stage *s, float *const **parts, int *n, pp_err *err);
int gpu_stage_grad_fetch(model_stage *s, size_t lo, size_t hi, pp_err *err);
int gpu_stage_grad_written(model_stage *s, size_t lo, size_t hi, pp_err *err);
void gpu_stage_discard(model_stage *s, int mb); /* drops what F saved for mb (an evaluation's F) */
/* ZeRO-1 (model_stage_params_written, model_stage_shard_optimizer and
 * _unshard_optimizer): host weights [lo, hi) to the device; the device's
 * moments reallocated and uploaded after the host's were packed or made
 * whole. */
int gpu_stage_params_written(model_stage *s, size_t lo, size_t hi, pp_err *err);
int gpu_stage_moments_resized(model_stage *s, pp_err *err);
/* The collective on the device (model_stage_set_collective_device): the
 * parts, gradient and weights as device pointers, and the ops it needs. */
float *const *gpu_stage_device_parts(model_stage *s, int *n);
float *gpu_stage_device_grad(model_stage *s);
float *gpu_stage_device_params(model_stage *s);
void *gpu_stage_device_alloc(model_stage *s, size_t bytes, pp_err *err);
void gpu_stage_device_free(model_stage *s, void *p);
int gpu_stage_device_add(model_stage *s, float *out, const float *a, const float *b, size_t n, pp_err *err);
int gpu_stage_device_copy(model_stage *s, void *dst, const void *src, size_t bytes, pp_err *err);
int gpu_stage_recompute_pending(const model_stage *s, int mb); /* as gpt_stage_recompute_*, on the device */
int gpu_stage_recompute(model_stage *s, int mb, pp_err *err);

int timed_stage_init(model_stage *s, pp_err *err);
void timed_stage_free(model_stage *s);
/* gmb: the microbatch's global index (model_global_mb), which its byte
 * patterns and gradient follow; mb its slot on this stage. */
int timed_stage_forward(model_stage *s, int mb, int gmb, const uint8_t *in, uint8_t *out, float *loss, pp_err *err);
int timed_stage_backward_input(model_stage *s, int mb, int gmb, const uint8_t *grad_out, uint8_t *grad_in,
                               pp_err *err);
int timed_stage_backward_weight(model_stage *s, int mb, int gmb, float *dst, pp_err *err);
size_t timed_stage_saved_bytes(const model_stage *s);
void timed_stage_discard(model_stage *s, int mb); /* drops F's copy of mb's input (an evaluation's F) */

/* splitmix64: the one PRNG of the model (init and data sampling). */
static inline uint64_t model_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in (0, 1], never 0 so that log() is finite. */
static inline double model_uniform(uint64_t *state) {
    return ((double)(model_splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}
#endif
