/* model_harness.h: runs a model split into stages inside one process, the
 * way the engine would across ranks: each stage executes its own action list
 * ({F,B,W} of microbatches), an action runs once its input has arrived, and
 * boundary tensors travel through copies. For tests of the model module. */
#ifndef PP_MODEL_HARNESS_H
#define PP_MODEL_HARNESS_H
#include <stdlib.h>
#include <string.h>

#include "runner/model/model.h"

#define H_MAX_STAGES 8
#define H_MAX_MB 16

typedef enum h_order {
    H_SEQUENTIAL,  /* per microbatch: F through all stages, B back, W at once */
    H_1F1B,        /* 1F1B per stage, W right after its B */
    H_GPIPE_LATE_W, /* all F, all B, then every W in reverse microbatch order */
    H_SHUFFLED_W,  /* 1F1B's F and B; W deferred and in a per-stage scrambled order */
} h_order;

typedef struct h_pipe {
    int nstages, m;
    model_spec spec;
    model_stage *st[H_MAX_STAGES];
    unsigned char *act[H_MAX_STAGES][H_MAX_MB];  /* output of stage s (input of s+1) */
    unsigned char *grad[H_MAX_STAGES][H_MAX_MB]; /* input gradient of stage s */
    int recompute_first; /* 1: model_stage_recompute before each B that has work, as the engine calls it */
    int recomputes;      /* how many of those calls ran */
} h_pipe;

/* cuts: nstages+1 layer indices, cuts[0] = 0, cuts[nstages] = layers.
 * dev: where every stage computes (NULL: the CPU). */
static inline int h_pipe_create_on(h_pipe *p, const char *spec_text, const int *cuts, int nstages, uint64_t seed,
                                   int m, const model_device *dev, pp_err *err) {
    memset(p, 0, sizeof *p);
    if (model_parse_spec(spec_text, &p->spec, err) != 0) return -1;
    p->nstages = nstages, p->m = m;
    size_t nb = model_boundary_bytes(&p->spec);
    for (int s = 0; s < nstages; s++) {
        if (model_stage_create_on(&p->spec, cuts[s], cuts[s + 1], s == 0, s == nstages - 1, seed, m, dev, &p->st[s],
                                  err))
            return -1;
        for (int i = 0; i < m; i++) {
            p->act[s][i] = malloc(nb);
            p->grad[s][i] = malloc(nb);
        }
    }
    return 0;
}

static inline int h_pipe_create(h_pipe *p, const char *spec_text, const int *cuts, int nstages, uint64_t seed, int m,
                                pp_err *err) {
    return h_pipe_create_on(p, spec_text, cuts, nstages, seed, m, NULL, err);
}

static inline void h_pipe_free(h_pipe *p) {
    for (int s = 0; s < p->nstages; s++) {
        model_stage_free(p->st[s]);
        for (int i = 0; i < p->m; i++) free(p->act[s][i]), free(p->grad[s][i]);
    }
}

typedef struct h_action {
    char op;
    int mb;
} h_action;

/* Builds stage s's action list for the order; returns its length (3m). */
static inline int h_actions(h_order order, int s, int S, int m, h_action *a) {
    int n = 0;
    if (order == H_GPIPE_LATE_W) {
        for (int i = 0; i < m; i++) a[n++] = (h_action){'F', i};
        for (int i = 0; i < m; i++) a[n++] = (h_action){'B', i};
        for (int i = m - 1; i >= 0; i--) a[n++] = (h_action){'W', i};
        return n;
    }
    int warm = S - s - 1 < m ? S - s - 1 : m, f = 0, b = 0;
    if (order == H_SEQUENTIAL) warm = 0;
    for (; f < warm; f++) a[n++] = (h_action){'F', f};
    while (b < m) {
        if (f < m) a[n++] = (h_action){'F', f++};
        a[n++] = (h_action){'B', b};
        if (order != H_SHUFFLED_W) a[n++] = (h_action){'W', b};
        b++;
    }
    if (order == H_SHUFFLED_W) /* a permutation of 0..m-1 that differs per stage */
        for (int i = 0; i < m; i++) a[n++] = (h_action){'W', (i * 3 + s + 1) % m};
    return n;
}

/* One training step: all microbatches through all stages, then the
 * optimizer. losses[m] receives the per-microbatch losses. */
static inline int h_pipe_step(h_pipe *p, const data_source *data, uint64_t seed, int step, h_order order,
                              const model_optim *opt, float *losses, pp_err *err) {
    int S = p->nstages, m = p->m;
    h_action acts[H_MAX_STAGES][3 * H_MAX_MB];
    int len[H_MAX_STAGES], at[H_MAX_STAGES] = {0};
    int fdone[H_MAX_STAGES][H_MAX_MB] = {{0}}, bdone[H_MAX_STAGES][H_MAX_MB] = {{0}};
    size_t ntok = model_tokens_per_microbatch(&p->spec);
    unsigned char *tokens = malloc(ntok ? ntok : 1), *targets = malloc(ntok ? ntok : 1);
    for (int s = 0; s < S; s++) len[s] = h_actions(order, s, S, m, acts[s]);
    int left = 0, rc = 0;
    for (int s = 0; s < S; s++) left += len[s];
    /* In the sequential order stages run one microbatch through the whole
     * pipeline at a time; otherwise each stage goes as far as it can. */
    while (left > 0 && rc == 0) {
        int progress = 0;
        for (int s = 0; s < S && rc == 0; s++) {
            while (at[s] < len[s] && rc == 0) {
                h_action a = acts[s][at[s]];
                if (a.op == 'F') {
                    if (s > 0 && !fdone[s - 1][a.mb]) break;
                    if (ntok) data_batch(data, seed, step, a.mb, p->spec.batch, p->spec.seq, tokens, targets);
                    rc = model_stage_forward(p->st[s], a.mb, s > 0 ? p->act[s - 1][a.mb] : NULL,
                                             s == 0 ? tokens : NULL, s == S - 1 ? targets : NULL,
                                             s < S - 1 ? p->act[s][a.mb] : NULL, s == S - 1 ? &losses[a.mb] : NULL,
                                             err);
                    fdone[s][a.mb] = 1;
                } else if (a.op == 'B') {
                    if (s < S - 1 && !bdone[s + 1][a.mb]) break;
                    if (p->recompute_first && model_stage_recompute_pending(p->st[s], a.mb)) {
                        rc = model_stage_recompute(p->st[s], a.mb, err);
                        p->recomputes++;
                    }
                    if (rc == 0)
                        rc = model_stage_backward_input(p->st[s], a.mb, s < S - 1 ? p->grad[s + 1][a.mb] : NULL,
                                                    s > 0 ? p->grad[s][a.mb] : NULL, err);
                    bdone[s][a.mb] = 1;
                } else {
                    rc = model_stage_backward_weight(p->st[s], a.mb, err);
                }
                at[s]++, left--, progress = 1;
                if (order == H_SEQUENTIAL) break;
            }
        }
        if (!progress && rc == 0) rc = pp_fail(err, "harness: the action lists deadlock");
    }
    for (int s = 0; s < S && rc == 0; s++) rc = model_stage_step(p->st[s], opt, step, err);
    free(tokens), free(targets);
    return rc;
}

/* Concatenated export of all stages (caller frees). */
static inline float *h_pipe_weights(const h_pipe *p, size_t *n) {
    size_t total = 0;
    for (int s = 0; s < p->nstages; s++) total += model_stage_weight_count(p->st[s]);
    float *w = malloc(sizeof(float) * (total ? total : 1)), *at = w;
    for (int s = 0; s < p->nstages; s++) {
        model_stage_export_weights(p->st[s], at);
        at += model_stage_weight_count(p->st[s]);
    }
    *n = total;
    return w;
}
#endif
