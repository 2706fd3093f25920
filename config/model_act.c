/* model_act.c: a stage's activation bytes per microbatch from the model's
 * shapes (model_act.h): docs/model.md's tables as arithmetic. */
#include "config/model_act.h"

#define ACT_VOCAB 256 /* a byte-level model: the LM head's width */

sched_act model_act_bytes(const model_spec *spec, int layers, int is_first, int is_last, int recompute) {
    if (spec->kind == MODEL_TIMED) return (sched_act){(double)spec->act_bytes, (double)spec->act_bytes, 0};
    double N = (double)spec->batch * spec->seq, C = spec->dim, NC = N * C, L = layers;
    double att = (double)spec->batch * spec->heads * spec->seq * spec->seq; /* attention probabilities */
    /* per block, in floats: kept to W (9NC + 4N), what only B reads (qkv, fch, att) and what B saves for W */
    double keep = 9 * NC + 4 * N, b_only = 7 * NC + att, b_saves = 11 * NC;
    double f = NC + L * (keep + b_only), b = NC + L * (keep + b_saves); /* NC: the stage's input */
    if (is_last) /* lnf, its mean and rstd, probs; B adds dlnf */
        f += NC + 2 * N + N * ACT_VOCAB, b += NC + 2 * N + N * ACT_VOCAB + NC;
    if (is_first) b += NC; /* dx0 */
    /* F drops per block: selective what no GEMM produces, full all but the
     * block's input; full also the last block's output on a stage that
     * hands it on (nothing reads it after F), which B does not bring back */
    double drop = recompute == 2 ? 7 * NC + att : recompute == 1 ? 15 * NC + 4 * N + att : 0;
    double gone = recompute == 1 && !is_last && layers > 0 ? NC : 0;
    double bytes = (double)(is_first + is_last) * N; /* the tokens, the targets: a byte each */
    /* part-way through B (recompute done: f whole, less `gone`): the last
     * stage's dlnf, then block by block from the last, each taking what it
     * saves for W before it lets go of what only B reads; the most is at
     * the first block's take or, where a block's growth is positive, the
     * last one's (runner/model/gpt_stage.c, gpt_stage_backward_input) */
    double growth = b_saves - b_only;
    double mid = f - gone + (is_last ? NC : 0) + (L > 0 ? b_saves + (growth > 0 ? (L - 1) * growth : 0) : 0);
    if (mid < b - gone) mid = b - gone;
    return (sched_act){4 * (f - L * drop - gone) + bytes, 4 * (b - gone) + bytes, 4 * mid + bytes};
}
