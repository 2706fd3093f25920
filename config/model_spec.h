/* model_spec.h: what the model is (--model), before any stage exists: the
 * gpt and timed workloads' parameters, parsed and checked once, their
 * canonical text, the sizes and timed costs that follow from them, and the
 * optimizer's settings. The launcher, the analyses (db/whatif.c) and the
 * stages (runner/model/model.h) all read a job's model through this. */
#ifndef PP_CONFIG_MODEL_SPEC_H
#define PP_CONFIG_MODEL_SPEC_H
#include <stddef.h>
#include <stdint.h>

#include "base/pp.h"

typedef enum model_kind { MODEL_GPT = 0, MODEL_TIMED = 1 } model_kind;

typedef struct model_spec {
    model_kind kind;
    /* gpt */
    int layers, dim, heads, seq, batch; /* batch: sequences per microbatch */
    /* timed (layers is also set, so that any partition is possible) */
    uint64_t f_ns, b_ns, w_ns, act_bytes;
    int per_layer; /* timed, per=layer: f, b, w are one layer's; a stage's ops cost them times its layers */
} model_spec;

/* Parses "gpt:..." or "timed:..." (missing keys take defaults; "gpt" alone is
 * the default model). Unknown keys and bad values name the key. */
int model_parse_spec(const char *text, model_spec *out, pp_err *err);
/* Canonical text of a spec, every key spelled out (for the jobs table). */
void model_spec_format(const model_spec *spec, char *buf, size_t n);
/* Bytes of the activation (and of its gradient) between two stages, per microbatch. */
size_t model_boundary_bytes(const model_spec *spec);
/* What one F, B or W (op 0, 1, 2) of a timed stage of `layers` layers
 * sleeps, in ns: the spec's, times layers with per=layer (a mean stage may
 * hold a fraction of a layer more). */
double model_timed_op_ns(const model_spec *spec, int op, double layers);
/* Tokens per microbatch (batch * seq for gpt; 0 for timed). */
size_t model_tokens_per_microbatch(const model_spec *spec);

typedef enum model_optim_kind { MODEL_ADAMW = 0, MODEL_SGD = 1 } model_optim_kind;
typedef struct model_optim {
    model_optim_kind kind;
    float lr, beta1, beta2, eps, weight_decay;
} model_optim;
void model_optim_default(model_optim *opt); /* AdamW, lr 1e-3, 0.9, 0.95, 1e-8, 0.0 */

#endif
