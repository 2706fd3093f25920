/* model_stage.c: the stage object shared by both workloads: creation, the
 * F/B/W dispatch with its order checks, and the accumulation of
 * per-microbatch weight gradients along the gradient tree, in microbatch
 * order (the numerics contract of model.h, model_tree.h). */
#include "runner/model/model_internal.h"
#include "runner/model/model_tree.h"

#include <stdlib.h>
#include <string.h>

static const char *state_name[] = {"not started", "after F", "after B"};

int model_mb_check(model_stage *s, int mb, int want_state, const char *op, pp_err *err) {
    if (mb < 0 || mb >= s->microbatches)
        return pp_fail(err, "model: %s of microbatch %d: microbatches are 0..%d", op, mb, s->microbatches - 1);
    if (s->mb_state[mb] != want_state)
        return pp_fail(err, "model: %s of microbatch %d on layers [%d, %d) out of order: the microbatch is %s", op,
                       mb, s->first_layer, s->last_layer, state_name[s->mb_state[mb]]);
    return 0;
}

void *model_pool_get(model_pool *pool, size_t size) {
    for (size_t i = pool->n; i-- > 0;)
        if (pool->free[i].size == size) {
            void *p = pool->free[i].p;
            pool->free[i] = pool->free[--pool->n];
            return p;
        }
    return malloc(size ? size : 1);
}

void model_pool_put(model_pool *pool, void *p, size_t size) {
    if (!p) return;
    if (pool->n == pool->cap) {
        size_t cap = pool->cap ? 2 * pool->cap : 64;
        struct pool_entry *nf = realloc(pool->free, cap * sizeof *nf);
        if (!nf) { /* keeping the buffer is an optimisation only */
            free(p);
            return;
        }
        pool->free = nf, pool->cap = cap;
    }
    pool->free[pool->n++] = (struct pool_entry){p, size};
}

void model_pool_clear(model_pool *pool) {
    for (size_t i = 0; i < pool->n; i++) free(pool->free[i].p);
    free(pool->free);
    memset(pool, 0, sizeof *pool);
}

float *model_pending(model_stage *s, int mb, pp_err *err) {
    if (!s->pending[mb] && !(s->pending[mb] = model_pool_get(&s->pool, sizeof(float) * s->nparams)))
        pp_fail(err, "model: out of memory for the weight gradient of microbatch %d", mb);
    return s->pending[mb];
}

/* Runs the tree program's adds up to its next push (or its end). */
static void tree_adds(model_stage *s) {
    while (s->tree_pc < s->ntree && s->tree[s->tree_pc] == MODEL_TREE_ADD) {
        float *right = s->stack[--s->depth], *left = s->stack[s->depth - 1];
        for (size_t i = 0; i < s->nparams; i++) left[i] += right[i];
        model_pool_put(&s->pool, right, sizeof(float) * s->nparams);
        s->tree_pc++;
    }
}

void model_commit(model_stage *s, int mb) {
    (void)mb;
    /* The same additions in the same tree whatever order W ran in: each
     * due buffer is the program's next leaf. */
    while (s->next_acc < s->microbatches && s->pending[s->next_acc] && s->mb_state[s->next_acc] == MB_EMPTY) {
        s->stack[s->depth++] = s->pending[s->next_acc]; /* the stack owns it now */
        s->pending[s->next_acc++] = NULL;
        s->tree_pc++; /* the push */
        tree_adds(s);
    }
    if (s->next_acc == s->microbatches && s->replicas == 1 && s->depth == 1) {
        /* One replica: its one part is the step's gradient. */
        float *old = s->grad;
        s->grad = s->stack[0];
        s->stack[0] = old;
    }
}

void model_tree_reset(model_stage *s) {
    while (s->depth > 0) model_pool_put(&s->pool, s->stack[--s->depth], sizeof(float) * s->nparams);
    s->tree_pc = 0;
}

/* The program of the stage's replica (model_tree.h). */
static int tree_build(model_stage *s, pp_err *err) {
    int cap = model_tree_max_steps(s->microbatches);
    int *tree = malloc(sizeof *tree * (size_t)cap);
    float **stack = calloc((size_t)cap, sizeof *stack);
    int lo = s->replica * s->microbatches;
    int n = tree && stack ? model_tree_replica_program(model_global_microbatches(s), lo, lo + s->microbatches, tree,
                                                       cap)
                          : -1;
    if (n < 0) {
        free(tree), free(stack);
        return pp_fail(err, "model: out of memory for the gradient tree of %d microbatches", s->microbatches);
    }
    free(s->tree);
    if (s->stack) model_tree_reset(s);
    free(s->stack);
    s->tree = tree, s->stack = stack, s->ntree = n, s->tree_pc = 0;
    return 0;
}

int model_stage_create(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last,
                       uint64_t seed, int microbatches, model_stage **out, pp_err *err) {
    return model_stage_create_on(spec, first_layer, last_layer, is_first, is_last, seed, microbatches, NULL, out, err);
}

/* The GPU stage starts from the CPU's initialisation (same weights by
 * construction), drops the host activations' state and uploads. */
static int move_to_device(model_stage *s, const model_device *dev, pp_err *err) {
    if (s->spec.kind != MODEL_GPT) return pp_fail(err, "model: --device cuda runs the gpt model only (not timed)");
#ifdef PPRUN_HAVE_CUDA
    gpt_stage_free(s);
    return gpu_stage_init(s, dev, err);
#else
    (void)dev;
    return pp_fail(err, "model: this pprun was built without the GPU backend (no CUDA toolkit at build time)");
#endif
}

int model_stage_create_on(const model_spec *spec, int first_layer, int last_layer, int is_first, int is_last,
                          uint64_t seed, int microbatches, const model_device *dev, model_stage **out, pp_err *err) {
    *out = NULL;
    if (first_layer < 0 || last_layer > spec->layers || first_layer > last_layer)
        return pp_fail(err, "model: layer range [%d, %d) is not inside the model's %d layers", first_layer,
                       last_layer, spec->layers);
    if (microbatches < 1) return pp_fail(err, "model: microbatches must be at least 1, got %d", microbatches);
    if (first_layer == last_layer && !is_first && !is_last)
        return pp_fail(err, "model: stage [%d, %d) holds no layer", first_layer, last_layer);
    model_stage *s = calloc(1, sizeof *s);
    if (!s) return pp_fail(err, "model: out of memory");
    s->spec = *spec;
    s->first_layer = first_layer, s->last_layer = last_layer;
    s->is_first = is_first, s->is_last = is_last;
    s->seed = seed, s->microbatches = microbatches;
    s->replica = 0, s->replicas = 1;
    s->nparams = spec->kind == MODEL_GPT ? gpt_param_count(spec, first_layer, last_layer, is_first, is_last)
                                         : (size_t)(last_layer - first_layer);
    size_t n = s->nparams ? s->nparams : 1;
    s->params = calloc(n, sizeof(float));
    s->grad = calloc(n, sizeof(float));
    s->adam_m = calloc(n, sizeof(float));
    s->adam_v = calloc(n, sizeof(float));
    s->pending = calloc((size_t)microbatches, sizeof *s->pending);
    s->mb_state = calloc((size_t)microbatches, sizeof *s->mb_state);
    if (!s->params || !s->grad || !s->adam_m || !s->adam_v || !s->pending || !s->mb_state) {
        model_stage_free(s);
        return pp_fail(err, "model: out of memory for %zu weights", s->nparams);
    }
    int rc = tree_build(s, err);
    if (rc == 0) rc = spec->kind == MODEL_GPT ? gpt_stage_init(s, err) : timed_stage_init(s, err);
    if (rc == 0 && dev && dev->cuda) rc = move_to_device(s, dev, err);
    if (rc != 0) {
        model_stage_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void model_stage_free(model_stage *s) {
    if (!s) return;
    gpt_stage_free(s);
    timed_stage_free(s);
#ifdef PPRUN_HAVE_CUDA
    gpu_stage_free(s);
#endif
    if (s->pending)
        for (int i = 0; i < s->microbatches; i++) free(s->pending[i]);
    for (int i = 0; i < s->depth; i++) free(s->stack[i]);
    free(s->stack), free(s->tree);
    free(s->shard_lo), free(s->shard_hi);
    model_pool_clear(&s->pool);
    free(s->pending), free(s->mb_state);
    free(s->params), free(s->grad), free(s->adam_m), free(s->adam_v);
    free(s);
}

int model_stage_forward(model_stage *s, int mb, const void *in, const uint8_t *tokens, const uint8_t *targets,
                        void *out, float *loss, pp_err *err) {
    if (model_mb_check(s, mb, MB_EMPTY, "F", err) != 0) return -1;
    int rc;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) rc = gpu_stage_forward(s, mb, in, tokens, targets, out, loss, err);
    else
#endif
        rc = s->spec.kind == MODEL_GPT ? gpt_stage_forward(s, mb, in, tokens, targets, out, loss, err)
                                       : timed_stage_forward(s, mb, model_global_mb(s, mb), in, out, loss, err);
    if (rc == 0) s->mb_state[mb] = MB_FORWARD;
    return rc;
}

int model_stage_backward_input(model_stage *s, int mb, const void *grad_out, void *grad_in, pp_err *err) {
    if (model_mb_check(s, mb, MB_FORWARD, "B", err) != 0) return -1;
    int rc;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) rc = gpu_stage_backward_input(s, mb, grad_out, grad_in, err);
    else
#endif
        rc = s->spec.kind == MODEL_GPT ? gpt_stage_backward_input(s, mb, grad_out, grad_in, err)
                                       : timed_stage_backward_input(s, mb, model_global_mb(s, mb), grad_out, grad_in,
                                                                    err);
    if (rc == 0) s->mb_state[mb] = MB_BACKWARD;
    return rc;
}

int model_stage_backward_weight(model_stage *s, int mb, pp_err *err) {
    if (model_mb_check(s, mb, MB_BACKWARD, "W", err) != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_backward_weight(s, mb, err); /* pending gradients live on the device */
#endif
    float *dst = model_pending(s, mb, err);
    if (!dst) return -1;
    int rc = s->spec.kind == MODEL_GPT ? gpt_stage_backward_weight(s, mb, dst, err)
                                       : timed_stage_backward_weight(s, mb, model_global_mb(s, mb), dst, err);
    if (rc != 0) return -1;
    s->mb_state[mb] = MB_EMPTY;
    model_commit(s, mb);
    return 0;
}

size_t model_stage_weight_count(const model_stage *s) { return s->nparams; }
void model_stage_export_weights(const model_stage *s, float *dst) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) {
        gpu_stage_export_weights(s, dst);
        return;
    }
#endif
    memcpy(dst, s->params, sizeof(float) * s->nparams);
}
void model_stage_export_grads(const model_stage *s, float *dst) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) {
        gpu_stage_export_grads(s, dst);
        return;
    }
#endif
    memcpy(dst, s->grad, sizeof(float) * s->nparams);
}
void model_stage_import_weights(model_stage *s, const float *src) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) {
        gpu_stage_import(s, src);
        return;
    }
#endif
    memcpy(s->params, src, sizeof(float) * s->nparams);
}
int model_stage_steps_done(const model_stage *s) { return s->steps_done; }
model_gemm_stats model_stage_gemm_stats(const model_stage *s) { return s->gemm; }
size_t model_stage_optimizer_bytes(const model_stage *s) {
    return 2 * sizeof(float) * (s->sharded ? s->shard_owned : s->nparams);
}
size_t model_stage_state_bytes(const model_stage *s) {
    size_t bytes = 2 * sizeof(float) * s->nparams + model_stage_optimizer_bytes(s);
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) bytes += gpu_stage_bf16_bytes(s);
#endif
    return bytes;
}
size_t model_stage_saved_bytes(const model_stage *s) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_saved_bytes(s);
#endif
    return s->gpt ? gpt_stage_saved_bytes(s) : timed_stage_saved_bytes(s);
}

/* --- boundary tensors in device memory --------------------------------------- */

int model_stage_set_boundary_device(model_stage *s, int on, pp_err *err) {
    if (on && !s->gpu)
        return pp_fail(err, "model: the stage with layers [%d, %d) computes on the CPU: its boundary tensors cannot "
                       "live in device memory", s->first_layer, s->last_layer);
    for (int mb = 0; mb < s->microbatches; mb++)
        if (s->mb_state[mb] != MB_EMPTY)
            return pp_fail(err, "model: boundary memory of the stage with layers [%d, %d) changed while microbatch %d "
                           "is in flight", s->first_layer, s->last_layer, mb);
    s->boundary_device = on != 0;
    return 0;
}

void *model_stage_boundary_alloc(model_stage *s, size_t bytes, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->boundary_device) return gpu_stage_boundary_alloc(s, bytes, err);
#endif
    (void)s; /* host buffers: the stage does not matter */
    void *p = malloc(bytes ? bytes : 1);
    if (!p) pp_fail(err, "model: out of memory for a boundary tensor of %zu bytes", bytes);
    return p;
}

void model_stage_boundary_free(model_stage *s, void *buf, size_t bytes) {
#ifdef PPRUN_HAVE_CUDA
    if (s->boundary_device) {
        gpu_stage_boundary_free(s, buf, bytes);
        return;
    }
#endif
    (void)s, (void)bytes;
    free(buf);
}

/* --- data parallelism ---------------------------------------------------------- */

/* No microbatch between its F and its W, nothing of the step's tree yet. */
static int idle(const model_stage *s, const char *what, pp_err *err) {
    for (int mb = 0; mb < s->microbatches; mb++)
        if (s->mb_state[mb] != MB_EMPTY || s->pending[mb])
            return pp_fail(err, "model: %s on layers [%d, %d) while microbatch %d is in flight", what, s->first_layer,
                           s->last_layer, mb);
    if (s->next_acc != 0)
        return pp_fail(err, "model: %s on layers [%d, %d) in the middle of a step", what, s->first_layer, s->last_layer);
    return 0;
}

int model_stage_set_replica(model_stage *s, int replica, int replicas, pp_err *err) {
    if (replicas < 1 || replica < 0 || replica >= replicas || (long)replicas * s->microbatches > (1L << 24))
        return pp_fail(err, "model: replica %d of %d (of %d microbatches each) is out of range", replica, replicas,
                       s->microbatches);
    if (idle(s, "changing the replica", err) != 0) return -1;
    int old = s->replica, olds = s->replicas;
    s->replica = replica, s->replicas = replicas;
    if (tree_build(s, err) != 0) {
        s->replica = old, s->replicas = olds;
        return -1;
    }
    return 0;
}

int model_stage_grad_parts(model_stage *s, float *const **parts, int *n, pp_err *err) {
    if (s->next_acc != s->microbatches)
        return pp_fail(err, "model: the gradient of layers [%d, %d) is not complete: W of microbatch %d has not run",
                       s->first_layer, s->last_layer, s->next_acc);
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && s->coll_device) {
        *parts = gpu_stage_device_parts(s, n);
        return 0;
    }
    if (s->gpu) return gpu_stage_grad_parts(s, parts, n, err); /* host mirrors, filled by model_stage_grad_fetch */
#endif
    if (s->replicas == 1) {
        *parts = &s->grad;
        *n = 1;
    } else {
        *parts = s->stack;
        *n = s->depth;
    }
    return 0;
}

static int check_range(const model_stage *s, size_t lo, size_t hi, const char *what, pp_err *err) {
    if (lo > hi || hi > s->nparams)
        return pp_fail(err, "model: %s of weights [%zu, %zu) outside the %zu of layers [%d, %d)", what, lo, hi,
                       s->nparams, s->first_layer, s->last_layer);
    return 0;
}

int model_stage_grad_fetch(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    if (check_range(s, lo, hi, "the gradient parts", err) != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && !s->coll_device) return gpu_stage_grad_fetch(s, lo, hi, err);
#endif
    return 0; /* a CPU stage's parts are the host buffers themselves */
}

int model_stage_grad_written(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    if (check_range(s, lo, hi, "the reduced gradient", err) != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && !s->coll_device) return gpu_stage_grad_written(s, lo, hi, err);
#endif
    return 0; /* a CPU stage's gradient is the host buffer; a device collective wrote the device's */
}

float *model_stage_grad(model_stage *s) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && s->coll_device) return gpu_stage_device_grad(s);
#endif
    return s->grad;
}

float *model_stage_params(model_stage *s) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && s->coll_device) return gpu_stage_device_params(s);
#endif
    return s->params;
}

int model_stage_shard_optimizer(model_stage *s, const size_t *lo, const size_t *hi, int n, pp_err *err) {
    if (s->sharded) return pp_fail(err, "model: the optimizer state of layers [%d, %d) is sharded already",
                                  s->first_layer, s->last_layer);
    if (n < 0) return pp_fail(err, "model: %d shard ranges", n);
    size_t owned = 0;
    for (int i = 0; i < n; i++) {
        if (lo[i] > hi[i] || hi[i] > s->nparams || (i > 0 && lo[i] < hi[i - 1]))
            return pp_fail(err, "model: shard range %d [%zu, %zu) is not ascending inside the %zu weights", i, lo[i],
                           hi[i], s->nparams);
        owned += hi[i] - lo[i];
    }
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && gpu_stage_fetch_state(s, err) != 0) return -1; /* the moments to pack are the device's */
#endif
    size_t *l = malloc(sizeof *l * (size_t)(n ? n : 1)), *h = malloc(sizeof *h * (size_t)(n ? n : 1));
    float *m = malloc(sizeof(float) * (owned ? owned : 1)), *v = malloc(sizeof(float) * (owned ? owned : 1));
    if (!l || !h || !m || !v) {
        free(l), free(h), free(m), free(v);
        return pp_fail(err, "model: out of memory for the optimizer's shard");
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        l[i] = lo[i], h[i] = hi[i];
        memcpy(m + at, s->adam_m + lo[i], sizeof(float) * (hi[i] - lo[i]));
        memcpy(v + at, s->adam_v + lo[i], sizeof(float) * (hi[i] - lo[i]));
        at += hi[i] - lo[i];
    }
    free(s->adam_m), free(s->adam_v);
    s->adam_m = m, s->adam_v = v;
    s->shard_lo = l, s->shard_hi = h, s->nshard = n, s->shard_owned = owned, s->sharded = 1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_moments_resized(s, err);
#endif
    return 0;
}

void model_stage_optimizer_state(model_stage *s, float **m, float **v, size_t *n) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) gpu_stage_host_current(s); /* the moments are the device's */
#endif
    *m = s->adam_m, *v = s->adam_v;
    *n = s->sharded ? s->shard_owned : s->nparams;
}

int model_stage_unshard_optimizer(model_stage *s, const float *m, const float *v, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu && gpu_stage_fetch_state(s, err) != 0) return -1; /* the weights; the moments are replaced */
#endif
    size_t n = s->nparams ? s->nparams : 1;
    float *fm = malloc(sizeof(float) * n), *fv = malloc(sizeof(float) * n);
    if (!fm || !fv) {
        free(fm), free(fv);
        return pp_fail(err, "model: out of memory for the whole optimizer state of %zu weights", s->nparams);
    }
    memcpy(fm, m, sizeof(float) * s->nparams);
    memcpy(fv, v, sizeof(float) * s->nparams);
    free(s->adam_m), free(s->adam_v), free(s->shard_lo), free(s->shard_hi);
    s->adam_m = fm, s->adam_v = fv;
    s->shard_lo = s->shard_hi = NULL, s->nshard = 0, s->shard_owned = 0, s->sharded = 0;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_moments_resized(s, err);
#endif
    return 0;
}

int model_stage_params_written(model_stage *s, size_t lo, size_t hi, pp_err *err) {
    if (check_range(s, lo, hi, "the gathered weights", err) != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_params_written(s, lo, hi, err);
#endif
    return 0;
}

/* --- the collective in device memory ------------------------------------------ */

int model_stage_set_collective_device(model_stage *s, int on, pp_err *err) {
    if (on && !s->gpu)
        return pp_fail(err, "model: the stage with layers [%d, %d) computes on the CPU: its collective cannot work "
                       "in device memory", s->first_layer, s->last_layer);
    if (idle(s, "switching the collective's memory", err) != 0) return -1;
    s->coll_device = on != 0;
    return 0;
}

static int not_on_gpu(const model_stage *s, const char *what, pp_err *err) {
    return pp_fail(err, "model: %s on the stage with layers [%d, %d), which computes on the CPU", what,
                   s->first_layer, s->last_layer);
}

void *model_stage_device_alloc(model_stage *s, size_t bytes, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_device_alloc(s, bytes, err);
#endif
    (void)bytes;
    not_on_gpu(s, "device memory", err);
    return NULL;
}

void model_stage_device_free(model_stage *s, void *p) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) gpu_stage_device_free(s, p);
#endif
    (void)s, (void)p; /* a CPU stage allocated none */
}

int model_stage_device_add(model_stage *s, float *out, const float *a, const float *b, size_t n, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_device_add(s, out, a, b, n, err);
#endif
    (void)out, (void)a, (void)b, (void)n;
    return not_on_gpu(s, "a device add", err);
}

int model_stage_device_copy(model_stage *s, void *dst, const void *src, size_t bytes, pp_err *err) {
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_device_copy(s, dst, src, bytes, err);
#endif
    (void)dst, (void)src, (void)bytes;
    return not_on_gpu(s, "a device copy", err);
}

int model_stage_evaluate(model_stage *s, int gmb, const void *in, const uint8_t *tokens, const uint8_t *targets,
                         void *out, float *loss, pp_err *err) {
    if (idle(s, "an evaluation's F", err) != 0) return -1;
    /* Slot 0 is free between steps; F fills it, and it is emptied at once. */
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) {
        int rc = gpu_stage_forward(s, 0, in, tokens, targets, out, loss, err);
        gpu_stage_discard(s, 0);
        return rc;
    }
#endif
    int rc = s->spec.kind == MODEL_GPT ? gpt_stage_forward(s, 0, in, tokens, targets, out, loss, err)
                                       : timed_stage_forward(s, 0, gmb, in, out, loss, err);
    if (s->gpt) gpt_stage_discard(s, 0);
    if (s->timed) timed_stage_discard(s, 0);
    return rc;
}
