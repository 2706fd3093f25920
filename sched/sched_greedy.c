/* sched_greedy.c: the zero-bubble greedy, the order of zb-v and of zb-h1
 * and zb-v under a memory bound (sched_internal.h). It plays the ranks out
 * in time from the costs, as the zero-bubble paper's ZB-V and its automatic
 * scheduler do (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, and
 * "Pipeline Parallelism with Controllable Memory", 2024): whenever a rank is
 * free it runs the first of
 *   1. a ready B (oldest microbatch first; it unblocks the rank upstream),
 *   2. a ready F, the chunk nearer the loss first, if the bound allows,
 *   3. its oldest pending W (it fills what would be a bubble, and frees
 *      what its microbatch held),
 * and otherwise sleeps until the next arrival. Two placements: one stage
 * per rank (stage r on rank r: zb-h1's, where the bound alone decides how
 * far the warm-up runs ahead, 1F1B's peak giving ZB-H1 and twice it
 * ZB-H2), and ZB-V's two chunks in a V (rank r holds stages r and 2p-1-r).
 * docs/schedules.md explains both. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The ranks that still have work, by clock (the lowest rank first on a tie):
 * the greedy takes the earliest at every action, which a scan made
 * O(ranks x actions). An indexed binary heap; pos[r] = -1 when r is out. */
typedef struct rank_heap {
    int *h, *pos, n;
    const double *clock;
} rank_heap;

static int rh_before(const rank_heap *q, int a, int b) {
    return q->clock[a] < q->clock[b] || (q->clock[a] == q->clock[b] && a < b);
}

static void rh_swap(rank_heap *q, int i, int j) {
    int a = q->h[i], b = q->h[j];
    q->h[i] = b, q->h[j] = a;
    q->pos[b] = i, q->pos[a] = j;
}

/* Restores the order around rank r after its clock changed. */
static void rh_fix(rank_heap *q, int r) {
    int i = q->pos[r];
    while (i > 0 && rh_before(q, q->h[i], q->h[(i - 1) / 2])) {
        rh_swap(q, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        int c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && rh_before(q, q->h[c + 1], q->h[c])) c++;
        if (!rh_before(q, q->h[c], q->h[i])) break;
        rh_swap(q, i, c);
        i = c;
    }
}

static void rh_remove(rank_heap *q, int r) {
    int i = q->pos[r], last = q->h[--q->n];
    q->pos[r] = -1;
    if (last == r) return;
    q->h[i] = last;
    q->pos[last] = i;
    rh_fix(q, last);
}

/* The greedy run's state. Owns every array (zg_free). */
typedef struct zg {
    int p, m, v, S;      /* v chunks per rank: 1 (stage r on rank r) or 2 (V) */
    const sched_costs *c;
    const sched_act *act; /* [S] */
    double limit;
    int wait_for_sooner; /* see wait_for_sooner */
    int bound;           /* the limit kept an F or a B from running at least once */
    double *end;         /* [S][m][3] end time, <0 = not scheduled */
    double *clock;       /* [p]: when each rank is free; HUGE_VAL: asleep until woken */
    int *nf, *nb;        /* [p][v]: F and B run so far per rank and chunk */
    int *wq, *wh, *wt;   /* per rank FIFO of the (stage, mb) of pending Ws: [p][v*m][2], head, tail */
    double *held;        /* [p]: what each rank holds (F run, W not yet) */
    int *left;           /* [p]: actions still to run */
    int *waiting;        /* [p]: asleep until an input arrives */
    rank_heap free_at;   /* the ranks with actions left, by clock */
    sched_action **out;  /* [p][3*v*m]: the lists being written */
    int *len;            /* [p] */
} zg;

/* Stage of chunk k on rank r, and the rank of stage s. */
static int zg_stage(const zg *z, int r, int k) { return k == 0 ? r : z->S - 1 - r; }
static int zg_rank(const zg *z, int s) { return z->v == 1 ? s : sched_place(SCHED_PLACE_V, s, z->p); }

static double *zend(zg *z, int s, int mb, int op) {
    return &z->end[((size_t)s * (size_t)z->m + (size_t)mb) * 3 + (size_t)op];
}

static double grow(double x) { return x > 0 ? x : 0; }

static int zg_init(zg *z, const sched_greedy_in *in) {
    int p = in->p, m = in->m, v = in->v, S = p * v;
    *z = (zg){.p = p, .m = m, .v = v, .S = S, .c = in->costs, .act = in->act, .limit = in->limit,
              .wait_for_sooner = in->wait_for_sooner};
    z->end = malloc(sizeof(double) * (size_t)S * (size_t)m * 3);
    z->clock = calloc((size_t)p, sizeof(double));
    z->nf = calloc((size_t)p * (size_t)v, sizeof(int));
    z->nb = calloc((size_t)p * (size_t)v, sizeof(int));
    z->wq = malloc(sizeof(int) * (size_t)p * (size_t)(v * m) * 2);
    z->wh = calloc((size_t)p, sizeof(int));
    z->wt = calloc((size_t)p, sizeof(int));
    z->held = calloc((size_t)p, sizeof(double));
    z->left = malloc(sizeof(int) * (size_t)p);
    z->waiting = calloc((size_t)p, sizeof(int));
    z->free_at = (rank_heap){malloc(sizeof(int) * (size_t)p), malloc(sizeof(int) * (size_t)p), p, z->clock};
    z->out = calloc((size_t)p, sizeof *z->out);
    z->len = calloc((size_t)p, sizeof(int));
    if (!z->end || !z->clock || !z->nf || !z->nb || !z->wq || !z->wh || !z->wt || !z->held || !z->left ||
        !z->waiting || !z->free_at.h || !z->free_at.pos || !z->out || !z->len)
        return -1;
    for (int r = 0; r < p; r++)
        if (!(z->out[r] = malloc(sizeof(sched_action) * (size_t)(3 * v * m)))) return -1;
    for (size_t i = 0; i < (size_t)S * (size_t)m * 3; i++) z->end[i] = -1;
    for (int r = 0; r < p; r++) /* all clocks 0: in order */
        z->left[r] = 3 * v * m, z->free_at.h[r] = r, z->free_at.pos[r] = r;
    return 0;
}

static void zg_free(zg *z) {
    free(z->end);
    free(z->clock);
    free(z->nf);
    free(z->nb);
    free(z->wq);
    free(z->wh);
    free(z->wt);
    free(z->held);
    free(z->left);
    free(z->waiting);
    free(z->free_at.h);
    free(z->free_at.pos);
    for (int r = 0; z->out && r < z->p; r++) free(z->out[r]);
    free(z->out);
    free(z->len);
}

static double zg_cost(const zg *z, int op) { return op == SCHED_F ? z->c->f : op == SCHED_B ? z->c->b : z->c->w; }

/* The pending W at the head (i = wh) or the tail (i = wt) of rank r's FIFO. */
static int *zg_wq(zg *z, int r, int i) { return &z->wq[((size_t)r * (size_t)(z->v * z->m) + (size_t)i) * 2]; }

/* What an F of chunk k on rank r needs free: its own activations and its
 * B's growth, and, for the first chunk of a V, the same for the second
 * chunk and the first chunk's B: the microbatch must be able to come
 * back through both chunks while everything else the rank holds stays. So
 * no F ever fills a rank so far that the oldest microbatch cannot leave,
 * and a bound of sched_mem_least never gets stuck. */
static double zg_f_room(const zg *z, int r, int k) {
    const sched_act *a = &z->act[zg_stage(z, r, k)];
    double room = a->f + grow(a->b - a->f);
    if (z->v == 2 && k == 0) {
        const sched_act *a1 = &z->act[zg_stage(z, r, 1)];
        room += a1->f + grow(a1->b - a1->f);
    }
    return room;
}

/* What a free rank could run now, and the arrivals it might wait for. */
typedef struct choice {
    int stage, op, mb; /* op < 0: nothing is ready */
    int cls;           /* 0 B, 1 F of the second chunk, 2 F of the first (the only one with v = 1), 3 W */
    double next;       /* earliest future arrival among the candidates, -1 none */
    double soon[3];    /* earliest future arrival per class, -1 none */
} choice;

/* An input arriving after t: the rank may sleep until the earliest. */
static void note_arrival(choice *ch, double at, double t) {
    if (at > t && (ch->next < 0 || at < ch->next)) ch->next = at;
}

/* When the result (stage s, mb, op) is at rank r: its end, plus a send
 * from another rank. 0 while it has not been scheduled. */
static int arrival(zg *z, int r, int s, int mb, int op, double *at) {
    double e = *zend(z, s, mb, op);
    if (e < 0) return 0;
    *at = e + (zg_rank(z, s) != r ? z->c->comm : 0);
    return 1;
}

/* 1. A ready B within the bound, oldest microbatch first, the chunk nearer
 * the loss first. The last stage's B takes its own F (on this rank: no
 * send). */
static void pick_b(zg *z, int r, double t, choice *ch) {
    for (int k = z->v - 1; k >= 0; k--) {
        int s = zg_stage(z, r, k), mb = z->nb[r * z->v + k];
        double ready;
        if (mb >= z->m || mb >= z->nf[r * z->v + k]) continue;
        if (!(s == z->S - 1 ? arrival(z, r, s, mb, SCHED_F, &ready) : arrival(z, r, s + 1, mb, SCHED_B, &ready)))
            continue;
        if (ready > t) {
            note_arrival(ch, ready, t);
            if (ch->soon[0] < 0 || ready < ch->soon[0]) ch->soon[0] = ready;
            continue;
        }
        if (z->held[r] + grow(z->act[s].b - z->act[s].f) > z->limit) { /* a W must free room first */
            z->bound = 1;
            continue;
        }
        if (ch->op < 0 || mb < ch->mb) ch->stage = s, ch->op = SCHED_B, ch->mb = mb, ch->cls = 0;
    }
}

/* 2. A ready F within the bound (zg_f_room), the chunk nearer the loss
 * first. */
static void pick_f(zg *z, int r, double t, choice *ch) {
    for (int k = z->v - 1; k >= 0 && ch->op < 0; k--) {
        int s = zg_stage(z, r, k), mb = z->nf[r * z->v + k];
        double ready = 0;
        if (mb >= z->m) continue;
        if (z->held[r] + zg_f_room(z, r, k) > z->limit) {
            z->bound = 1;
            continue;
        }
        if (s > 0 && !arrival(z, r, s - 1, mb, SCHED_F, &ready)) continue;
        if (ready > t) {
            note_arrival(ch, ready, t);
            ch->soon[2 - k] = ready;
            continue;
        }
        ch->stage = s, ch->op = SCHED_F, ch->mb = mb, ch->cls = 2 - k;
    }
}

/* What rank r, free at t, runs: a ready B, else a ready F, else its oldest
 * pending W (3: fills what would be a bubble). */
static choice pick(zg *z, int r, double t) {
    choice ch = {-1, -1, -1, 3, -1, {-1, -1, -1}};
    pick_b(z, r, t, &ch);
    if (ch.op < 0) pick_f(z, r, t, &ch);
    if (ch.op < 0 && z->wh[r] < z->wt[r]) {
        const int *q = zg_wq(z, r, z->wh[r]);
        ch.stage = q[0], ch.op = SCHED_W, ch.mb = q[1];
    }
    return ch;
}

/* wait_for_sooner: an action of a higher class whose input arrives
 * within half the chosen one's cost is waited for (the idle is shorter
 * than the delay starting the other would cause it). With send time
 * (comm > 0) the ties the order relies on at comm = 0 become near misses,
 * and each one a wrong turn. 1 when rank r waits (its clock moved). */
static int wait_for_sooner(zg *z, int r, double t, const choice *ch) {
    double cost = zg_cost(z, ch->op), first = -1;
    for (int k = 0; k < ch->cls; k++)
        if (ch->soon[k] >= 0 && (first < 0 || ch->soon[k] < first)) first = ch->soon[k];
    if (first < 0 || first >= t + cost / 2) return 0;
    z->clock[r] = first;
    rh_fix(&z->free_at, r);
    return 1;
}

/* Nothing to do yet: sleep until the first of our inputs we know of
 * arrives; one that another rank schedules later wakes us earlier
 * (wake_receiver). With none in sight, sleep until woken. Only an input
 * can make an action ready (W never waits, and the bound only moves when
 * we run), so waking at any other rank's result, only to sleep again,
 * would change nothing but cost ranks x actions. */
static void sleep_until(zg *z, int r, double next) {
    z->clock[r] = next < 0 ? HUGE_VAL : next;
    z->waiting[r] = 1;
    rh_fix(&z->free_at, r);
}

/* The result of (stage, op) at done may be what the rank of the stage that
 * takes it sleeps for: it wakes when the result arrives. */
static void wake_receiver(zg *z, int r, int stage, int op, double done) {
    int to = op == SCHED_F ? stage + 1 : op == SCHED_B ? stage - 1 : -1;
    if (to < 0 || to >= z->S) return;
    int q = zg_rank(z, to);
    if (z->waiting[q] && q != r && done + z->c->comm < z->clock[q]) {
        z->clock[q] = done + z->c->comm;
        rh_fix(&z->free_at, q);
    }
}

/* Rank r runs the chosen action from t: its end, the rank's clock and
 * place in the heap, the receiver woken, the counts, what it holds, the
 * pending Ws. */
static void run_choice(zg *z, int r, double t, const choice *ch) {
    double done = t + zg_cost(z, ch->op);
    const sched_act *a = &z->act[ch->stage];
    *zend(z, ch->stage, ch->mb, ch->op) = done;
    z->clock[r] = done + z->c->between; /* the rank's own time before its next op */
    z->left[r]--;
    z->waiting[r] = 0;
    if (z->left[r] == 0) rh_remove(&z->free_at, r);
    else rh_fix(&z->free_at, r);
    wake_receiver(z, r, ch->stage, ch->op, done);
    int k = ch->stage == r ? 0 : 1;
    if (ch->op == SCHED_F) {
        z->nf[r * z->v + k]++;
        z->held[r] += a->f;
    } else if (ch->op == SCHED_B) {
        z->nb[r * z->v + k]++;
        z->held[r] += a->b - a->f;
        int *q = zg_wq(z, r, z->wt[r]++);
        q[0] = ch->stage;
        q[1] = ch->mb;
    } else {
        z->wh[r]++;
        z->held[r] -= a->b;
    }
    z->out[r][z->len[r]++] = (sched_action){ch->stage, ch->op, ch->mb};
}

/* Until every rank ran all its actions, the free rank with the earliest
 * clock runs what pick chooses. -1 when every rank is asleep (stuck). */
static int zg_run(zg *z) {
    while (z->free_at.n > 0) {
        int r = z->free_at.h[0];
        double t = z->clock[r];
        if (t == HUGE_VAL) return -1; /* all asleep: reported by the caller */
        choice ch = pick(z, r, t);
        if (ch.op < 0) sleep_until(z, r, ch.next);
        else if (!(z->wait_for_sooner && wait_for_sooner(z, r, t, &ch))) run_choice(z, r, t, &ch);
    }
    return 0;
}

int sched_greedy(const sched_greedy_in *in, const char *name, sched_plan **out, int *bound, pp_err *err) {
    *out = NULL;
    int S = in->p * in->v;
    int *stage_rank = malloc(sizeof(int) * (size_t)S);
    zg z;
    int rc = zg_init(&z, in);
    if (rc != 0 || !stage_rank) {
        rc = pp_fail(err, "schedule %s: out of memory", name);
    } else if (zg_run(&z) != 0) {
        rc = pp_fail(err, "schedule %s: the greedy placement got stuck (p=%d, m=%d)", name, in->p, in->m);
    } else {
        for (int s = 0; s < S; s++) stage_rank[s] = zg_rank(&z, s);
        rc = sched_plan_from_lists(name, in->p, S, in->v, in->m, stage_rank, z.out, z.len, out, err);
    }
    if (bound) *bound = z.bound;
    zg_free(&z);
    free(stage_rank);
    return rc;
}

int sched_greedy_best(const sched_greedy_in *in, const char *name, sched_plan **out, int *bound, double *step,
                      pp_err *err) {
    sched_plan *best = NULL;
    double best_step = 0;
    if (bound) *bound = 0;
    for (int wait = 0; wait < 2; wait++) {
        sched_greedy_in each = *in;
        each.wait_for_sooner = wait;
        sched_plan *plan = NULL;
        sched_sim *sim = NULL;
        pp_err e;
        int hit = 0, rc = sched_greedy(&each, name, &plan, &hit, &e);
        if (bound) *bound |= hit;
        if (rc == 0 && sched_simulate(plan, in->costs, &sim, &e) == 0 && (!best || sim->step_time < best_step)) {
            sched_free(best);
            best = plan, best_step = sim->step_time;
            plan = NULL;
        }
        sched_sim_free(sim);
        sched_free(plan);
        if (!best) { /* the plain order is the one that must exist */
            if (err) *err = e;
            return -1;
        }
    }
    *out = best;
    if (step) *step = best_step;
    return 0;
}
