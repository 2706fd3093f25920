/* optim.c: AdamW and SGD over a stage's flat weights, with the step's
 * gradient (the update itself is gk_adamw / gk_sgd, vectorised). Under
 * ZeRO-1 over the stage's shard only: each weight's update reads only its
 * own gradient and moments, so a shard's update has the whole update's bits
 * there. */
#include "runner/model/model_internal.h"
#include "runner/model/gpt_kernels.h"

#include <math.h>
#include <string.h>

int model_stage_step(model_stage *s, const model_optim *opt, int step, pp_err *err) {
    if (step < 0) return pp_fail(err, "model: optimizer step %d: steps count from 0", step);
    if (s->next_acc != s->microbatches)
        return pp_fail(err, "model: optimizer step %d on layers [%d, %d) before the W of microbatch %d", step,
                       s->first_layer, s->last_layer, s->next_acc);
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) {
        if (gpu_stage_step(s, opt, step, err) != 0) return -1;
        s->next_acc = 0;
        s->steps_done = step + 1;
        return 0;
    }
#endif
    /* bias correction in double: beta^t for large t must not round to 1 */
    float c1 = (float)(1.0 - pow(opt->beta1, step + 1)), c2 = (float)(1.0 - pow(opt->beta2, step + 1));
    int n = s->sharded ? s->nshard : 1;
    size_t at = 0; /* into the packed moments */
    for (int i = 0; i < n; i++) {
        size_t lo = s->sharded ? s->shard_lo[i] : 0, len = s->sharded ? s->shard_hi[i] - lo : s->nparams;
        if (opt->kind == MODEL_ADAMW)
            gk_adamw(s->params + lo, s->grad + lo, s->adam_m + at, s->adam_v + at, len, opt->lr, opt->beta1,
                     opt->beta2, c1, c2, opt->eps, opt->weight_decay);
        else
            gk_sgd(s->params + lo, s->grad + lo, len, opt->lr, opt->weight_decay);
        at += len;
    }
    model_tree_reset(s);
    memset(s->grad, 0, sizeof(float) * s->nparams);
    s->next_acc = 0;
    s->steps_done = step + 1;
    return 0;
}
