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

/* What an op costs at c: a BW its B and its W. */
static inline double sched_op_cost(const sched_costs *c, int op) {
    if (op == SCHED_BW) return c->b + c->w;
    return op == SCHED_F ? c->f : op == SCHED_B ? c->b : c->w;
}

#endif
