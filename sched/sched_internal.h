/* sched_internal.h: helpers shared by the sched_*.c files only (not a
 * contract): a growing string buffer and the per-(stage, mb, op) index. */
#ifndef PP_SCHED_INTERNAL_H
#define PP_SCHED_INTERNAL_H
#include <stddef.h>

#include "sched/sched.h"

/* Growing, always NUL-terminated string; oom is sticky. Owner frees s. */
typedef struct sched_sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sched_sbuf;

void sched_sb_add(sched_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends n bytes of s (no format: a big grid's cells). */
void sched_sb_mem(sched_sbuf *b, const char *s, size_t n);

/* Index of (stage, mb, op) into a flat array of stages * m * 3 entries
 * (op F, B or W: a BW has the keys of its B and its W). */
static inline size_t sched_key(const sched_plan *plan, int stage, int mb, int op) {
    return ((size_t)stage * (size_t)plan->microbatches + (size_t)mb) * 3 + (size_t)op;
}

/* 1 when the action's fields are in the plan's ranges. */
static inline int sched_action_ok(const sched_plan *plan, const sched_action *a) {
    return a->stage >= 0 && a->stage < plan->stages && a->mb >= 0 && a->mb < plan->microbatches && a->op >= 0 &&
           a->op <= SCHED_BW;
}

/* The op whose key an action's start depends on and sets first: a BW is
 * its B (it also sets its W's key, at the same end). */
static inline int sched_key_op(int op) { return op == SCHED_BW ? SCHED_B : op; }

/* sched_plan_from_lists with overlapped pairs: overlap[r][i] for i <
 * lens[r] (copied; NULL or all 0: none), sched_plan.overlap's meaning. A
 * plan with pairs gets its lists packed left as its grid. */
int sched_plan_from_lists_ov(const char *name, int p, int stages, int v, int m, const int *stage_rank,
                             sched_action *const *lists, const int *lens, const unsigned char *const *overlap,
                             sched_plan **out, pp_err *err);

/* DualPipeV's order (sched_dualpipe.c): sched_build's "dualpipev", p ranks,
 * m >= 2p microbatches, v = 2. */
int sched_build_dualpipev(int p, int m, int v, sched_plan **out, pp_err *err);

/* What an op costs at c (a BW: sched_bw_cost). */
static inline double sched_op_cost(const sched_costs *c, int op) {
    if (op == SCHED_BW) return sched_bw_cost(c);
    return op == SCHED_F ? c->f : op == SCHED_B ? c->b : c->w;
}

/* The zero-bubble greedy (sched_greedy.c): zb-v's order, and zb-h1's and
 * zb-v's under a memory bound. v = 1: stage r on rank r; v = 2: ZB-V's V.
 * act[p * v] says what each stage holds; no F leaves a rank unable to
 * take its oldest microbatch back through its chunks within limit. */
typedef struct sched_greedy_in {
    int p, m, v;
    const sched_costs *costs;
    const sched_act *act; /* [p * v] */
    double limit;         /* the most a rank holds, in act's unit */
    int wait_for_sooner;  /* wait for an action of a higher class arriving within half the chosen one's cost */
} sched_greedy_in;

/* The greedy's order as a plan named `name`; -1 with err when it got stuck
 * (a limit below what the order needs) or out of memory. *bound (may be
 * NULL) is 1 when the limit kept an action from running at least once: 0
 * means any higher limit gives the same order. */
int sched_greedy(const sched_greedy_in *in, const char *name, sched_plan **out, int *bound, pp_err *err);
/* The greedy plain and waiting for a sooner action (in->wait_for_sooner is
 * ignored), each simulated at in->costs: the shorter step wins, the plain
 * one on a tie. Neither is better everywhere: with send time (p=4, m=8,
 * f=b=w=1, comm=0.1) waiting idles 10.1% against 16.1%; with p=2 it can
 * lose. -1 with the plain one's error when it cannot be built; *bound as
 * sched_greedy's, for either; *step (may be NULL) the winner's simulated
 * step, so that a caller comparing plans does not simulate it again. */
int sched_greedy_best(const sched_greedy_in *in, const char *name, sched_plan **out, int *bound, double *step,
                      pp_err *err);

/* The validator's rejection (sched_validate.c), for the rule that
 * sched_validate_mem adds: "schedule NAME rejected: rule 'RULE': DETAIL"
 * and the grid around marks[ranks] (a slot per row, -1 for none); -1. */
int sched_reject(const sched_plan *plan, pp_err *err, const int *marks, const char *rule, const char *detail);
/* The grid slot of actions[r][i]. */
int sched_slot_of(const sched_plan *plan, int r, int i);

#endif
