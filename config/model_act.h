/* model_act.h: the activation bytes a stage of the model holds for one
 * microbatch, from the model's shapes alone (docs/model.md, "Activation
 * memory" and "Activation recompute"): what `pprun run --max-mem 64MiB`
 * bounds zb-h1 and zb-v by before anything ran, in the unit the trace
 * measures (events.bytes, step_stats.act_peak_bytes). The stage's own
 * counter, model_stage_saved_bytes, is held against it op by op in
 * tests/test_maxmem.c. */
#ifndef PP_CONFIG_MODEL_ACT_H
#define PP_CONFIG_MODEL_ACT_H

#include "config/model_spec.h"
#include "sched/sched.h"

/* What one microbatch holds on a stage of `layers` layers after its F (f)
 * and after its B (b), until its W, and the most part-way through its B,
 * its recompute done (mid; the timed model holds b throughout: 0). For gpt its
 * blocks' saved tensors (less what recompute drops: `recompute` is 0 none, 1 full, 2 selective, as
 * model_recompute), the first stage's tokens, the last stage's head, probs
 * and targets; timed, `act` bytes (F's copy of its input, freed by W). The
 * recompute's own moment, between F and B, is not counted, as the trace
 * does not count it (model.md). */
sched_act model_act_bytes(const model_spec *spec, int layers, int is_first, int is_last, int recompute);

#endif
