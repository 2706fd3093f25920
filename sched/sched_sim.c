/* sched_sim.c: the simulator: one step of a plan played out from F/B/W/comm
 * costs, as the engine runs it (sends asynchronous, receives blocking), and
 * the resulting timeline as text. A BW is one op: its B and its W both end
 * where it ends, so the input gradient leaves then. An overlapped pair's
 * halves run side by side, each from when the rank is free and its own
 * input is there, at its own cost; the rank goes on when both ended. */
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
    free(sim->busy);
    free(sim);
}

int sched_simulate(const sched_plan *plan, const sched_costs *costs, sched_sim **out, pp_err *err) {
    static const sched_costs unit = {1, 1, 1, 0, 0, 0};
    if (!costs) costs = &unit;
    *out = NULL;
    sched_costs *each = malloc(sizeof *each * (size_t)(plan->stages > 0 ? plan->stages : 1));
    if (!each) return pp_fail(err, "simulate %s: out of memory", plan->name);
    for (int s = 0; s < plan->stages; s++) each[s] = *costs;
    int rc = sched_simulate_stages(plan, each, out, err);
    free(each);
    return rc;
}

/* Costs cannot be negative (nor NaN: the comparisons fail for it too). */
static int check_costs(const sched_plan *plan, const sched_costs *stage_costs, pp_err *err) {
    for (int s = 0; s < plan->stages; s++) {
        const sched_costs *c = &stage_costs[s];
        if (!(c->f >= 0 && c->b >= 0 && c->w >= 0 && c->comm >= 0 && c->bw >= 0 && c->between >= 0))
            return pp_fail(err,
                           "simulate %s: costs must not be negative (stage %d: f=%g b=%g w=%g comm=%g bw=%g "
                           "between=%g)",
                           plan->name, s, c->f, c->b, c->w, c->comm, c->bw, c->between);
    }
    return 0;
}

/* Every action names a stage and microbatch of the plan. */
static int check_ranges(const sched_plan *plan, pp_err *err) {
    for (int r = 0; r < plan->ranks; r++)
        for (int i = 0; i < plan->len[r]; i++)
            if (!sched_action_ok(plan, &plan->actions[r][i])) {
                char buf[32];
                return pp_fail(err, "simulate %s: rank %d action %s is outside %d stages x %d microbatches",
                               plan->name, r, sched_action_str(&plan->actions[r][i], buf), plan->stages,
                               plan->microbatches);
            }
    return 0;
}

/* A sim with room for a span per action of each rank. */
static sched_sim *sim_new(const sched_plan *plan) {
    int p = plan->ranks;
    sched_sim *sim = calloc(1, sizeof *sim);
    if (!sim) return NULL;
    sim->ranks = p;
    sim->nspans = calloc((size_t)p, sizeof(int));
    sim->spans = calloc((size_t)p, sizeof(sched_span *));
    sim->peak_inflight = calloc((size_t)p, sizeof(int));
    sim->busy = calloc((size_t)p, sizeof(double));
    if (!sim->nspans || !sim->spans || !sim->peak_inflight || !sim->busy) goto oom;
    for (int r = 0; r < p; r++)
        if (!(sim->spans[r] = malloc(sizeof(sched_span) * (size_t)(plan->len[r] > 0 ? plan->len[r] : 1)))) goto oom;
    return sim;
oom:
    sched_sim_free(sim);
    return NULL;
}

/* One simulation as it runs; owns the arrays but sim. */
typedef struct player {
    const sched_plan *plan;
    const sched_costs *cost; /* [stages] */
    double *end;             /* [stages * m * 3]: when each action ended */
    int *where;              /* [stages * m * 3]: the rank that ran it, -1 = not yet */
    int *pos;                /* [ranks]: each rank's next action */
    double *clock;           /* [ranks]: when each rank may start its next op (its costs' between after the last) */
    unsigned char *half;     /* [ranks]: at an overlapped pair, bit k when its half k ran */
    double *pair_end;        /* [ranks]: the latest end of a pair's halves that ran */
    sched_sim *sim;
} player;

/* When the input of (stage s) has arrived at rank r: the end of the
 * action at key k, plus the send's cost from another rank. 0 if it has not
 * run yet. */
static int arrival(const player *pl, size_t k, int s, int r, double *t) {
    if (pl->where[k] < 0) return 0;
    *t = pl->end[k] + (pl->where[k] != r ? pl->cost[s].comm : 0);
    return 1;
}

/* When action a of rank r may start, once its inputs are there: the input
 * from another stage (F(s-1) for F, B(s+1) for B and BW but the last
 * stage's) and this stage's own earlier op (F for B and BW, B for W). 0
 * while one is missing. */
static int ready_at(const player *pl, int r, const sched_action *a, double *ready) {
    const sched_plan *plan = pl->plan;
    int s = a->stage, mb = a->mb, dep_stage = -1, dep_op = 0, own_op = -1;
    if (a->op == SCHED_F) {
        if (s > 0) dep_stage = s - 1, dep_op = SCHED_F;
    } else if (a->op == SCHED_B || a->op == SCHED_BW) {
        own_op = SCHED_F;
        if (s < plan->stages - 1) dep_stage = s + 1, dep_op = SCHED_B;
    } else {
        own_op = SCHED_B;
    }
    double t;
    *ready = 0;
    if (dep_stage >= 0 && !arrival(pl, sched_key(plan, dep_stage, mb, dep_op), dep_stage, r, ready)) return 0;
    if (own_op >= 0) {
        if (!arrival(pl, sched_key(plan, s, mb, own_op), s, r, &t)) return 0;
        if (t > *ready) *ready = t;
    }
    return 1;
}

/* Runs actions[r][i] on rank r, free from `from` on, once its inputs are
 * there: its span, and its end as its keys'. 0 while an input is missing. */
static int play_one(player *pl, int r, int i, double from, double *stop_out) {
    const sched_plan *plan = pl->plan;
    const sched_action *a = &plan->actions[r][i];
    double ready;
    if (!ready_at(pl, r, a, &ready)) return 0;
    double start = from > ready ? from : ready;
    double stop = start + sched_op_cost(&pl->cost[a->stage], a->op);
    size_t k = sched_key(plan, a->stage, a->mb, sched_key_op(a->op));
    pl->end[k] = stop;
    pl->where[k] = r;
    if (a->op == SCHED_BW) { /* its W is done too */
        size_t kw = sched_key(plan, a->stage, a->mb, SCHED_W);
        pl->end[kw] = stop;
        pl->where[kw] = r;
    }
    pl->sim->spans[r][i] = (sched_span){*a, start, stop};
    *stop_out = stop;
    return 1;
}

/* Runs rank r's list from pos[r] while each action's inputs are there;
 * returns how many ran. A pair's halves both start from the rank's clock
 * (each when its input is there) and the clock moves past the pair to the
 * later end once both ran. */
static int play_rank(player *pl, int r) {
    const sched_plan *plan = pl->plan;
    int moved = 0;
    double stop;
    while (pl->pos[r] < plan->len[r]) {
        int i = pl->pos[r];
        if (!sched_overlaps(plan, r, i) || i + 1 >= plan->len[r]) { /* (a pair at the end: the validator says no) */
            if (!play_one(pl, r, i, pl->clock[r], &stop)) break;
            pl->clock[r] = stop + pl->cost[plan->actions[r][i].stage].between;
            pl->pos[r]++;
            moved++;
            continue;
        }
        for (int k = 0; k < 2; k++)
            if (!(pl->half[r] >> k & 1) && play_one(pl, r, i + k, pl->clock[r], &stop)) {
                pl->half[r] |= (unsigned char)(1 << k);
                if (stop > pl->pair_end[r]) pl->pair_end[r] = stop;
                moved++;
            }
        if (pl->half[r] != 3) break;
        /* both halves started at or after the clock: the later end is past it */
        pl->clock[r] = pl->pair_end[r] + pl->cost[plan->actions[r][i].stage].between;
        pl->half[r] = 0, pl->pair_end[r] = 0;
        pl->pos[r] += 2;
    }
    return moved;
}

/* Start times only depend on the producers' end times, so running the
 * ranks round-robin until nothing moves gives the same timeline as any
 * other order. */
static int play(player *pl, pp_err *err) {
    const sched_plan *plan = pl->plan;
    int total = 0, ran = 0;
    for (int r = 0; r < plan->ranks; r++) total += plan->len[r];
    for (;;) {
        int moved = 0;
        for (int r = 0; r < plan->ranks; r++) moved += play_rank(pl, r);
        ran += moved;
        if (ran == total) return 0;
        if (!moved) {
            char buf[32];
            int r = 0;
            while (pl->pos[r] >= plan->len[r]) r++;
            return pp_fail(err, "simulate %s: the schedule deadlocks (rank %d waits forever at %s); sched_validate "
                                "says why", plan->name, r, sched_action_str(&plan->actions[r][pl->pos[r]], buf));
        }
    }
}

/* The step time, the bubble and each rank's peak of held activations
 * (a unit is held from its F to the end of its W or BW), from the spans. */
static void summarize(sched_sim *sim, const sched_plan *plan) {
    int p = plan->ranks;
    double step = 0, busy = 0;
    for (int r = 0; r < p; r++) {
        sim->nspans[r] = plan->len[r];
        int held = 0, peak = 0;
        double rbusy = 0;
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_span *sp = &sim->spans[r][i];
            rbusy += sp->end - sp->start;
            if (i > 0 && sched_overlaps(plan, r, i - 1)) { /* a pair: busy is the union of its halves */
                const sched_span *f = &sim->spans[r][i - 1];
                double lo = f->start > sp->start ? f->start : sp->start, hi = f->end < sp->end ? f->end : sp->end;
                if (hi > lo) rbusy -= hi - lo;
            }
            if (sp->end > step) step = sp->end;
            if (sp->action.op == SCHED_F && ++held > peak) peak = held;
            /* a W or a BW releases what its F saved; an evaluation's F keeps nothing */
            if (sp->action.op == SCHED_W || sp->action.op == SCHED_BW || plan->forward_only) held--;
        }
        sim->peak_inflight[r] = peak;
        sim->busy[r] = rbusy;
        busy += rbusy;
    }
    sim->step_time = step;
    sim->bubble_ratio = step > 0 ? (p * step - busy) / (p * step) : 0;
    if (sim->bubble_ratio < 0) sim->bubble_ratio = 0; /* rounding */
}

double sched_sim_dp_step(const sched_plan *plan, const sched_sim *sim, const double *allreduce) {
    double *ready = malloc(sizeof *ready * (size_t)(plan->stages > 0 ? plan->stages : 1)), step = 0;
    int *order = malloc(sizeof *order * (size_t)(plan->stages > 0 ? plan->stages : 1));
    if (!ready || !order) {
        free(ready), free(order);
        return -1;
    }
    for (int r = 0; r < sim->ranks; r++) {
        /* when each of the rank's stages ended its last backward (-1: none) */
        int n = 0;
        double rank_end = 0;
        for (int s = 0; s < plan->stages; s++) ready[s] = -1;
        for (int i = 0; i < sim->nspans[r]; i++) {
            const sched_span *sp = &sim->spans[r][i];
            if (sp->end > rank_end) rank_end = sp->end;
            if ((sp->action.op == SCHED_W || sp->action.op == SCHED_BW) && sp->end > ready[sp->action.stage])
                ready[sp->action.stage] = sp->end;
        }
        for (int s = 0; s < plan->stages; s++) /* insertion sort by ready time: a rank holds a few stages */
            if (ready[s] >= 0) {
                int k = n++;
                for (; k > 0 && ready[order[k - 1]] > ready[s]; k--) order[k] = order[k - 1];
                order[k] = s;
            }
        double t = 0;
        for (int k = 0; k < n; k++) t = (t > ready[order[k]] ? t : ready[order[k]]) + allreduce[order[k]];
        if (t > rank_end) rank_end = t;
        if (rank_end > step) step = rank_end;
    }
    free(ready), free(order);
    return step;
}

int sched_simulate_stages(const sched_plan *plan, const sched_costs *stage_costs, sched_sim **out, pp_err *err) {
    *out = NULL;
    if (check_costs(plan, stage_costs, err) != 0) return -1;
    size_t nkeys = (size_t)plan->stages * (size_t)plan->microbatches * 3;
    player pl = {.plan = plan, .cost = stage_costs};
    pl.end = malloc(sizeof(double) * (nkeys ? nkeys : 1));
    pl.where = malloc(sizeof(int) * (nkeys ? nkeys : 1));
    pl.pos = calloc((size_t)plan->ranks, sizeof(int));
    pl.clock = calloc((size_t)plan->ranks, sizeof(double));
    pl.half = calloc((size_t)plan->ranks, 1);
    pl.pair_end = calloc((size_t)plan->ranks, sizeof(double));
    pl.sim = sim_new(plan);
    int rc = -1;
    if (!pl.end || !pl.where || !pl.pos || !pl.clock || !pl.half || !pl.pair_end || !pl.sim) {
        pp_fail(err, "simulate %s: out of memory", plan->name);
    } else if (check_ranges(plan, err) == 0) {
        for (size_t i = 0; i < nkeys; i++) pl.where[i] = -1;
        rc = play(&pl, err);
    }
    if (rc == 0) {
        summarize(pl.sim, plan);
        *out = pl.sim;
        pl.sim = NULL;
    }
    sched_sim_free(pl.sim);
    free(pl.end);
    free(pl.where);
    free(pl.pos);
    free(pl.clock);
    free(pl.half);
    free(pl.pair_end);
    return rc;
}

/* 1 for span j of rank r that is the second half of an overlapped pair
 * (the timeline's second lane), 0 for every other. */
static int second_half(const sched_plan *plan, int r, int j) {
    return plan && j > 0 && sched_overlaps(plan, r, j - 1);
}

static int is_multiple(double x, double q) {
    double n = x / q;
    return fabs(n - round(n)) < 1e-6;
}

char *sched_timeline_text(const sched_sim *sim, const sched_plan *plan, double unit, double *unit_out) {
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
        int lanes = 1; /* a second lane for the second halves of overlapped pairs, when there are any */
        for (int j = 0; j < sim->nspans[r] && lanes == 1; j++) lanes += second_half(plan, r, j);
        for (int lane = 0; lane < lanes; lane++) {
            if (lane == 0) sched_sb_add(&b, "rank %*d |", label, r);
            else sched_sb_add(&b, "     %*s |", label, "");
            int j = 0;
            for (int c = 0; c < cols; c++) {
                double mid = (c + 0.5) * unit;
                while (j < sim->nspans[r] && (second_half(plan, r, j) != lane || sim->spans[r][j].end <= mid)) j++;
                char ch = lane ? ' ' : '.';
                if (j < sim->nspans[r] && sim->spans[r][j].start <= mid) ch = "FBWX"[sim->spans[r][j].action.op];
                sched_sb_add(&b, "%c", ch);
            }
            sched_sb_add(&b, "|\n");
        }
    }
    if (!b.s) sched_sb_add(&b, "%s", "");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
