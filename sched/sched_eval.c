/* sched_eval.c: the forward-only plan of an evaluation step
 * (sched_forward_only, docs/schedules.md "Evaluation steps"): the training
 * plan's stages on the same ranks, F only. */
#include "sched/sched.h"

#include <stdio.h>
#include <stdlib.h>

/* Wavefront order: F(s, mb) needs F(s-1, mb), whose key is one less, so a
 * rank never waits for an F that comes after its own in this order. */
static int wavefront_cmp(const void *pa, const void *pb) {
    const sched_action *a = pa, *b = pb;
    int ka = a->stage + a->mb, kb = b->stage + b->mb;
    if (ka != kb) return ka < kb ? -1 : 1;
    return a->stage < b->stage ? -1 : a->stage > b->stage;
}

int sched_forward_only(const sched_plan *train, int m, sched_plan **out, pp_err *err) {
    *out = NULL;
    int p = train->ranks, S = train->stages;
    if (m < 1) return pp_fail(err, "forward-only schedule: microbatches must be at least 1, got %d", m);
    sched_action **lists = calloc((size_t)p, sizeof *lists);
    int *lens = calloc((size_t)p, sizeof *lens);
    int rc = lists && lens ? 0 : pp_fail(err, "forward-only schedule: out of memory");
    for (int r = 0; rc == 0 && r < p; r++) {
        int held = 0;
        for (int s = 0; s < S; s++) held += train->stage_rank[s] == r;
        if (!(lists[r] = malloc(sizeof(sched_action) * (size_t)(held * m > 0 ? held * m : 1)))) {
            rc = pp_fail(err, "forward-only schedule: out of memory");
            break;
        }
        for (int s = 0; s < S; s++)
            for (int mb = 0; mb < m && train->stage_rank[s] == r; mb++)
                lists[r][lens[r]++] = (sched_action){s, SCHED_F, mb};
        qsort(lists[r], (size_t)lens[r], sizeof(sched_action), wavefront_cmp);
    }
    char name[64];
    snprintf(name, sizeof name, "forward-only");
    sched_plan *plan = NULL;
    if (rc == 0)
        rc = sched_plan_from_lists(name, p, S, train->virtual_stages, m, train->stage_rank, lists, lens, &plan, err);
    for (int r = 0; lists && r < p; r++) free(lists[r]);
    free(lists), free(lens);
    if (rc != 0) return -1;
    plan->forward_only = 1;
    if (sched_validate(plan, err) != 0) {
        sched_free(plan);
        return -1;
    }
    *out = plan;
    return 0;
}
