/* optim.c: AdamW and SGD over a stage's flat weights, with the gradients
 * accumulated over the microbatches of the step. */
#include "runner/model/model_internal.h"

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
        for (size_t i = 0; i < s->nparams; i++) {
            float g = s->grad[i];
            float m = opt->beta1 * s->adam_m[i] + (1.0f - opt->beta1) * g;
            float v = opt->beta2 * s->adam_v[i] + (1.0f - opt->beta2) * g * g;
            s->adam_m[i] = m, s->adam_v[i] = v;
            float mhat = m / c1, vhat = v / c2;
            s->params[i] -= opt->lr * (mhat / (sqrtf(vhat) + opt->eps) + opt->weight_decay * s->params[i]);
        }
    } else {
        for (size_t i = 0; i < s->nparams; i++)
            s->params[i] -= opt->lr * (s->grad[i] + opt->weight_decay * s->params[i]);
    }
    memset(s->grad, 0, sizeof(float) * s->nparams);
    s->next_acc = 0;
    s->steps_done = step + 1;
    return 0;
}
