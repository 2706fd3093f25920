/* sched_sim.c: the simulator: one step of a plan played out from F/B/W/comm
 * costs, as the engine runs it (sends asynchronous, receives blocking), and
 * the resulting timeline as text. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sched_sim_free(sched_sim *sim) {
    if (!sim) return;
    for (int r = 0; r < sim->ranks; r++)
        if (sim->spans) free(sim->spans[r]);
    free(sim->spans);
    free(sim->nspans);
    free(sim->peak_inflight);
    free(sim);
}

static double op_cost(const sched_costs *c, int op) { return op == SCHED_F ? c->f : op == SCHED_B ? c->b : c->w; }

int sched_simulate(const sched_plan *plan, const sched_costs *costs, sched_sim **out, pp_err *err) {
    static const sched_costs unit = {1, 1, 1, 0};
    if (!costs) costs = &unit;
    *out = NULL;
    sched_costs *each = malloc(sizeof *each * (size_t)(plan->stages > 0 ? plan->stages : 1));
    if (!each) return pp_fail(err, "simulate %s: out of memory", plan->name);
    for (int s = 0; s < plan->stages; s++) each[s] = *costs;
    int rc = sched_simulate_stages(plan, each, out, err);
    free(each);
    return rc;
}

int sched_simulate_stages(const sched_plan *plan, const sched_costs *stage_costs, sched_sim **out, pp_err *err) {
    *out = NULL;
    for (int s = 0; s < plan->stages; s++) {
        const sched_costs *c = &stage_costs[s];
        if (!(c->f >= 0 && c->b >= 0 && c->w >= 0 && c->comm >= 0)) /* NaN fails too */
            return pp_fail(err, "simulate %s: costs must not be negative (stage %d: f=%g b=%g w=%g comm=%g)",
                           plan->name, s, c->f, c->b, c->w, c->comm);
    }
    int p = plan->ranks;
    size_t nkeys = (size_t)plan->stages * (size_t)plan->microbatches * 3;
    double *end = malloc(sizeof(double) * (nkeys ? nkeys : 1));
    int *where = malloc(sizeof(int) * (nkeys ? nkeys : 1)); /* rank that ran it, -1 = not yet */
    int *pos = calloc((size_t)p, sizeof(int));
    double *clock = calloc((size_t)p, sizeof(double));
    sched_sim *sim = calloc(1, sizeof *sim);
    int rc = -1;
    if (!end || !where || !pos || !clock || !sim) {
        pp_fail(err, "simulate %s: out of memory", plan->name);
        goto done;
    }
    sim->ranks = p;
    sim->nspans = calloc((size_t)p, sizeof(int));
    sim->spans = calloc((size_t)p, sizeof(sched_span *));
    sim->peak_inflight = calloc((size_t)p, sizeof(int));
    if (!sim->nspans || !sim->spans || !sim->peak_inflight) {
        pp_fail(err, "simulate %s: out of memory", plan->name);
        goto done;
    }
    for (size_t i = 0; i < nkeys; i++) where[i] = -1;
    int total = 0;
    for (int r = 0; r < p; r++) {
        total += plan->len[r];
        sim->spans[r] = malloc(sizeof(sched_span) * (size_t)(plan->len[r] > 0 ? plan->len[r] : 1));
        if (!sim->spans[r]) {
            pp_fail(err, "simulate %s: out of memory", plan->name);
            goto done;
        }
        for (int i = 0; i < plan->len[r]; i++)
            if (!sched_action_ok(plan, &plan->actions[r][i])) {
                char buf[32];
                pp_fail(err, "simulate %s: rank %d action %s is outside %d stages x %d microbatches", plan->name, r,
                        sched_action_str(&plan->actions[r][i], buf), plan->stages, plan->microbatches);
                goto done;
            }
    }
    /* Start times only depend on the producers' end times, so running the
     * ranks round-robin until nothing moves gives the same timeline as any
     * other order. */
    int ran = 0;
    for (;;) {
        int moved = 0;
        for (int r = 0; r < p; r++) {
            while (pos[r] < plan->len[r]) {
                const sched_action *a = &plan->actions[r][pos[r]];
                int s = a->stage, mb = a->mb;
                /* deps: the input from another stage, and this stage's own earlier op */
                int dep_stage = -1, dep_op = 0, own_op = -1;
                if (a->op == SCHED_F) {
                    if (s > 0) dep_stage = s - 1, dep_op = SCHED_F;
                } else if (a->op == SCHED_B) {
                    own_op = SCHED_F;
                    if (s < plan->stages - 1) dep_stage = s + 1, dep_op = SCHED_B;
                } else {
                    own_op = SCHED_B;
                }
                double ready = 0;
                if (dep_stage >= 0) {
                    size_t k = sched_key(plan, dep_stage, mb, dep_op);
                    if (where[k] < 0) break;
                    ready = end[k] + (where[k] != r ? stage_costs[dep_stage].comm : 0);
                }
                if (own_op >= 0) {
                    size_t k = sched_key(plan, s, mb, own_op);
                    if (where[k] < 0) break;
                    double t = end[k] + (where[k] != r ? stage_costs[s].comm : 0);
                    if (t > ready) ready = t;
                }
                double start = clock[r] > ready ? clock[r] : ready;
                double stop = start + op_cost(&stage_costs[s], a->op);
                size_t k = sched_key(plan, s, mb, a->op);
                end[k] = stop;
                where[k] = r;
                clock[r] = stop;
                sim->spans[r][pos[r]] = (sched_span){*a, start, stop};
                pos[r]++;
                moved++;
            }
        }
        ran += moved;
        if (ran == total) break;
        if (!moved) {
            char buf[32];
            int r = 0;
            while (pos[r] >= plan->len[r]) r++;
            pp_fail(err, "simulate %s: the schedule deadlocks (rank %d waits forever at %s); sched_validate says why",
                    plan->name, r, sched_action_str(&plan->actions[r][pos[r]], buf));
            goto done;
        }
    }
    double step = 0, busy = 0;
    for (int r = 0; r < p; r++) {
        sim->nspans[r] = plan->len[r];
        int held = 0, peak = 0;
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_span *sp = &sim->spans[r][i];
            busy += sp->end - sp->start;
            if (sp->end > step) step = sp->end;
            if (sp->action.op == SCHED_F && ++held > peak) peak = held;
            if (sp->action.op == SCHED_W) held--;
        }
        sim->peak_inflight[r] = peak;
    }
    sim->step_time = step;
    sim->bubble_ratio = step > 0 ? (p * step - busy) / (p * step) : 0;
    if (sim->bubble_ratio < 0) sim->bubble_ratio = 0; /* rounding */
    *out = sim;
    sim = NULL;
    rc = 0;
done:
    sched_sim_free(sim);
    free(end);
    free(where);
    free(pos);
    free(clock);
    return rc;
}

static int is_multiple(double x, double q) {
    double n = x / q;
    return fabs(n - round(n)) < 1e-6;
}

char *sched_timeline_text(const sched_sim *sim, const sched_plan *plan, double unit, double *unit_out) {
    (void)plan;
    if (unit <= 0) {
        /* The coarsest unit that every span boundary falls on, so integer
         * costs give one character per time unit. */
        static const double steps[] = {1, 0.5, 0.25, 0.2, 0.1, 0.05, 0.025, 0.02, 0.01};
        unit = 0;
        for (size_t i = 0; i < sizeof steps / sizeof steps[0] && unit == 0; i++) {
            int ok = 1;
            for (int r = 0; r < sim->ranks && ok; r++)
                for (int j = 0; j < sim->nspans[r] && ok; j++)
                    ok = is_multiple(sim->spans[r][j].start, steps[i]) && is_multiple(sim->spans[r][j].end, steps[i]);
            if (ok) unit = steps[i];
        }
        if (unit == 0) unit = sim->step_time / 160;
        if (sim->step_time / unit > 160) unit = sim->step_time / 160;
        if (unit <= 0) unit = 1;
    }
    if (unit_out) *unit_out = unit;
    int cols = (int)ceil(sim->step_time / unit - 1e-9);
    sched_sbuf b = {0};
    int label = sim->ranks > 10 ? 2 : 1;
    for (int r = 0; r < sim->ranks; r++) {
        sched_sb_add(&b, "rank %*d |", label, r);
        int j = 0;
        for (int c = 0; c < cols; c++) {
            double mid = (c + 0.5) * unit;
            while (j < sim->nspans[r] && sim->spans[r][j].end <= mid) j++;
            char ch = '.';
            if (j < sim->nspans[r] && sim->spans[r][j].start <= mid) ch = "FBW"[sim->spans[r][j].action.op];
            sched_sb_add(&b, "%c", ch);
        }
        sched_sb_add(&b, "|\n");
    }
    if (!b.s) sched_sb_add(&b, "%s", "");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
