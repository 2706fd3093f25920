/* model_recompute.c: activation recompute behind model.h (docs/model.md,
 * "Activation recompute"): the stage's mode, and the call that computes
 * what F dropped before B needs it. The work itself is the gpt stages'
 * (gpt_stage.c on the CPU, cuda/gpu_stage.c on a device); this file checks
 * and dispatches. */
#include "runner/model/model_internal.h"

int model_stage_set_recompute(model_stage *s, model_recompute mode, pp_err *err) {
    if (mode != MODEL_RECOMPUTE_NONE && mode != MODEL_RECOMPUTE_FULL && mode != MODEL_RECOMPUTE_SELECTIVE)
        return pp_fail(err, "model: recompute mode %d is none of none, full, selective", (int)mode);
    if (mode != MODEL_RECOMPUTE_NONE && s->spec.kind != MODEL_GPT)
        return pp_fail(err, "model: activation recompute applies to the gpt model; a timed stage's F keeps only a "
                            "copy of its input");
    for (int mb = 0; mb < s->microbatches; mb++)
        if (s->mb_state[mb] != MB_EMPTY)
            return pp_fail(err, "model: recompute of the stage with layers [%d, %d) changed while microbatch %d is in "
                           "flight", s->first_layer, s->last_layer, mb);
    s->recompute = mode;
    return 0;
}

int model_stage_recompute_pending(const model_stage *s, int mb) {
    if (mb < 0 || mb >= s->microbatches || s->mb_state[mb] != MB_FORWARD) return 0;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_recompute_pending(s, mb);
#endif
    return s->gpt ? gpt_stage_recompute_pending(s, mb) : 0;
}

int model_stage_recompute(model_stage *s, int mb, pp_err *err) {
    if (model_mb_check(s, mb, MB_FORWARD, "recompute", err) != 0) return -1;
#ifdef PPRUN_HAVE_CUDA
    if (s->gpu) return gpu_stage_recompute(s, mb, err);
#endif
    return s->gpt ? gpt_stage_recompute(s, mb, err) : 0;
}
