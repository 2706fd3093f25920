/* engine_eval.c: the evaluation step (engine.h; docs/schedules.md
 * "Evaluation steps"): after every --eval-every-th training step, the
 * forward-only plan's F's on held-out data, each replica on its own
 * --eval-microbatches (global index replica·n + mb), nothing kept for a
 * backward and no optimizer step; traced as EVAL_F, EVAL_SEND_F,
 * EVAL_RECV_F and EVAL_LOSS under the training step it follows, its
 * activations under COMM_DIR_EVAL tags (over devcomm when the stages'
 * boundary tensors are in device memory, as the training step's); every
 * replica's losses go to hooks.on_eval on replica 0's last stage. */
#include "runner/worker/engine_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct eval_state {
    int step, n;          /* the training step it follows; microbatches per replica */
    size_t bytes;
    void **mailbox;       /* [stages][n]: outputs handed between stages of this rank */
    float *losses;        /* [n] */
    uint8_t *tokens, *targets;
} eval_state;

/* The input of F(s, mb): from this rank's mailbox or from stage s-1's rank. */
static int eval_input(engine *e, eval_state *ev, int s, int mb, void **in, pp_err *err) {
    int peer = engine_stage_peer(e, s - 1);
    if (peer == e->rank) {
        void **slot = &ev->mailbox[(size_t)(s - 1) * (size_t)ev->n + (size_t)mb];
        if (!*slot)
            return pp_fail(err, "rank %d: evaluation: the activation of stage %d, microbatch %d is not ready", e->rank,
                           s - 1, mb);
        *in = *slot, *slot = NULL;
        return 0;
    }
    if (!(*in = model_stage_boundary_alloc(e->stages[s], ev->bytes, err))) return -1;
    uint64_t t0 = pp_now_ns();
    uint64_t tag = comm_tag((uint64_t)ev->step, (uint64_t)s, (uint64_t)mb, COMM_DIR_EVAL);
    int rc = e->device_boundaries ? devcomm_recv(e->devcomm, peer, tag, *in, ev->bytes, e->cfg->recv_timeout_ms, err)
                                  : comm_recv(e->comm, peer, tag, *in, ev->bytes, e->cfg->recv_timeout_ms, err);
    if (rc != 0) {
        model_stage_boundary_free(e->stages[s], *in, ev->bytes);
        *in = NULL;
        return pp_wrap(err, "rank %d: evaluation after step %d: receiving the activation of stage %d, microbatch %d "
                       "from rank %d", e->rank, ev->step, s - 1, mb, peer);
    }
    int g = e->replica * ev->n + mb;
    engine_trace(e, TRACE_EVAL_RECV_F, ev->step, g, s, peer, ev->bytes, t0, pp_now_ns(), 0);
    return 0;
}

/* F(s)'s output to stage s+1: into the mailbox or to its rank; takes out. */
static int eval_output(engine *e, eval_state *ev, int s, int mb, void *out, pp_err *err) {
    int peer = engine_stage_peer(e, s + 1);
    if (peer == e->rank) {
        ev->mailbox[(size_t)s * (size_t)ev->n + (size_t)mb] = out;
        return 0;
    }
    uint64_t t0 = pp_now_ns();
    uint64_t tag = comm_tag((uint64_t)ev->step, (uint64_t)(s + 1), (uint64_t)mb, COMM_DIR_EVAL);
    int rc = e->device_boundaries ? devcomm_send(e->devcomm, peer, tag, out, ev->bytes, err)
                                  : comm_send(e->comm, peer, tag, out, ev->bytes, err);
    model_stage_boundary_free(e->stages[s], out, ev->bytes);
    if (rc != 0)
        return pp_wrap(err, "rank %d: evaluation after step %d: sending the activation of stage %d, microbatch %d to "
                       "rank %d", e->rank, ev->step, s, mb, peer);
    engine_trace(e, TRACE_EVAL_SEND_F, ev->step, e->replica * ev->n + mb, s, peer, ev->bytes, t0, pp_now_ns(), 0);
    return 0;
}

static int eval_forward(engine *e, eval_state *ev, int s, int mb, pp_err *err) {
    const model_spec *spec = &e->cfg->model;
    int S = e->plan->stages, first = s == 0, last = s == S - 1, g = e->replica * ev->n + mb;
    void *in = NULL, *out = NULL;
    if ((first || last) && spec->kind == MODEL_GPT)
        data_batch(e->eval_data, e->cfg->seed, ev->step, g, spec->batch, spec->seq, ev->tokens, ev->targets);
    if (!first && eval_input(e, ev, s, mb, &in, err) != 0) return -1;
    if (!last && !(out = model_stage_boundary_alloc(e->stages[s], ev->bytes, err))) {
        model_stage_boundary_free(e->stages[s], in, ev->bytes);
        return -1;
    }
    float loss = 0;
    uint64_t t0 = pp_now_ns();
    int rc = model_stage_evaluate(e->stages[s], g, in, ev->tokens, ev->targets, out, last ? &loss : NULL, err);
    uint64_t t1 = pp_now_ns();
    model_stage_boundary_free(e->stages[s], in, ev->bytes);
    if (rc != 0) {
        model_stage_boundary_free(e->stages[s], out, ev->bytes);
        return pp_wrap(err, "rank %d: evaluation after step %d: F of stage %d, microbatch %d", e->rank, ev->step, s,
                       g);
    }
    engine_trace(e, TRACE_EVAL_F, ev->step, g, s, -1, model_stage_saved_bytes(e->stages[s]), t0, t1, 0);
    if (last) {
        ev->losses[mb] = loss;
        engine_trace(e, TRACE_EVAL_LOSS, ev->step, g, s, -1, 0, t1, t1, loss);
        return 0;
    }
    return eval_output(e, ev, s, mb, out, err);
}

/* On the ranks of the last stage: every replica's losses to replica 0's,
 * which reports them. */
static int eval_report(engine *e, eval_state *ev, uint64_t t_start, pp_err *err) {
    int total = ev->n * e->replicas;
    float *all = malloc(sizeof(float) * (size_t)total);
    if (!all) return pp_fail(err, "out of memory");
    int rc = engine_dp_losses(e, ev->step, 1, ev->losses, ev->n, all, err);
    if (rc == 0 && e->replica == 0 && e->hooks.on_eval) {
        double sum = 0;
        for (int i = 0; i < total; i++) sum += all[i];
        uint64_t ns = pp_now_ns() - t_start;
        engine_step_report rep = {
            .step = ev->step,
            .microbatches = total,
            .losses = all,
            .loss = sum / total,
            .step_ns = ns,
            .tokens_per_s = ns ? (double)model_tokens_per_microbatch(&e->cfg->model) * total * 1e9 / (double)ns : 0,
        };
        rc = e->hooks.on_eval(e->hooks.ctx, &rep, err);
    }
    free(all);
    return rc;
}

int engine_eval_step(engine *e, int step, pp_err *err) {
    const run_config *cfg = e->cfg;
    if (!cfg->eval_every || (step + 1) % cfg->eval_every != 0 || !e->eval_plan) return 0;
    const sched_plan *ep = e->eval_plan;
    size_t tokens = model_tokens_per_microbatch(&cfg->model);
    eval_state ev = {
        .step = step,
        .n = ep->microbatches,
        .bytes = model_boundary_bytes(&cfg->model),
        .mailbox = calloc((size_t)ep->stages * (size_t)ep->microbatches, sizeof(void *)),
        .losses = calloc((size_t)ep->microbatches, sizeof(float)),
        .tokens = malloc(tokens ? tokens : 1),
        .targets = malloc(tokens ? tokens : 1),
    };
    int rc = ev.mailbox && ev.losses && ev.tokens && ev.targets ? 0 : pp_fail(err, "out of memory");
    uint64_t t_start = pp_now_ns();
    for (int i = 0; rc == 0 && i < ep->len[e->prank]; i++)
        rc = eval_forward(e, &ev, ep->actions[e->prank][i].stage, ep->actions[e->prank][i].mb, err);
    if (rc == 0 && ep->stage_rank[ep->stages - 1] == e->prank) rc = eval_report(e, &ev, t_start, err);
    for (size_t i = 0; ev.mailbox && i < (size_t)ep->stages * (size_t)ev.n; i++)
        if (ev.mailbox[i]) model_stage_boundary_free(e->stages[e->local_stage[0]], ev.mailbox[i], ev.bytes);
    free(ev.mailbox), free(ev.losses), free(ev.tokens), free(ev.targets);
    return rc;
}
