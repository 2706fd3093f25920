/* optim.c: AdamW and SGD over a stage's flat weights, with the gradients
 * accumulated over the microbatches of the step (the update itself is
 * gk_adamw / gk_sgd, vectorised). */
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
    if (opt->kind == MODEL_ADAMW) {
        /* bias correction in double: beta^t for large t must not round to 1 */
        float c1 = (float)(1.0 - pow(opt->beta1, step + 1)), c2 = (float)(1.0 - pow(opt->beta2, step + 1));
        gk_adamw(s->params, s->grad, s->adam_m, s->adam_v, s->nparams, opt->lr, opt->beta1, opt->beta2, c1, c2,
                 opt->eps, opt->weight_decay);
    } else {
        gk_sgd(s->params, s->grad, s->nparams, opt->lr, opt->weight_decay);
    }
    memset(s->grad, 0, sizeof(float) * s->nparams);
    s->next_acc = 0;
    s->steps_done = step + 1;
    return 0;
}
