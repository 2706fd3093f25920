/* sched_gen.c: the schedule generators (gpipe, 1f1b, interleaved-1f1b,
 * zb-h1, zb-v): each writes per-rank action lists; sched_plan_from_lists
 * turns them into a plan with its display grid. docs/schedules.md explains
 * each one. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-rank lists being built; every rank gets exactly `cap` slots. */
typedef struct lists {
    int p, cap;
    sched_action **a;
    int *n;
} lists;

static int lists_init(lists *l, int p, int cap) {
    l->p = p;
    l->cap = cap;
    l->a = calloc((size_t)p, sizeof *l->a);
    l->n = calloc((size_t)p, sizeof *l->n);
    if (!l->a || !l->n) return -1;
    for (int r = 0; r < p; r++)
        if (!(l->a[r] = malloc(sizeof(sched_action) * (size_t)cap))) return -1;
    return 0;
}

static void lists_free(lists *l) {
    for (int r = 0; l->a && r < l->p; r++) free(l->a[r]);
    free(l->a);
    free(l->n);
}

static void put(lists *l, int r, int stage, int op, int mb) {
    if (l->n[r] < l->cap) l->a[r][l->n[r]++] = (sched_action){stage, op, mb};
}

/* GPipe: all forwards, then all backwards (B then W per microbatch). */
static void gen_gpipe(lists *l, int p, int m) {
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < m; i++) put(l, r, r, SCHED_F, i);
        for (int i = 0; i < m; i++) {
            put(l, r, r, SCHED_B, i);
            put(l, r, r, SCHED_W, i);
        }
    }
}

/* 1F1B and ZB-H1 share the F/B skeleton: p-1-r warm-up forwards, then one
 * forward and one backward alternately, then the remaining backwards.
 * 1F1B puts each W right after its B. ZB-H1 (zero-bubble paper, Qi et al.
 * 2023, handcrafted H1) holds r weight gradients back on rank r: W(j) runs
 * after B(j+r), and the held ones fill the cool-down, where rank r would
 * otherwise wait for gradients from downstream. Rank r then holds
 * (p-1-r) + 1 + r = p microbatches at most: rank 0's 1F1B peak. */
static void gen_1f1b_like(lists *l, int p, int m, int defer) {
    for (int r = 0; r < p; r++) {
        int lag = defer ? r : 0;
        int warm = p - 1 - r < m ? p - 1 - r : m;
        int nf = 0, nb = 0, nw = 0;
        for (; nf < warm; nf++) put(l, r, r, SCHED_F, nf);
        while (nb < m) {
            if (nf < m) put(l, r, r, SCHED_F, nf++);
            put(l, r, r, SCHED_B, nb++);
            if (nb - nw > lag) put(l, r, r, SCHED_W, nw++);
        }
        while (nw < m) put(l, r, r, SCHED_W, nw++);
    }
}

/* Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_
 * interleaving): microbatches go through the v chunks of a rank in groups
 * of p; k-th forward on a rank is chunk (k mod pv) / p of microbatch
 * (k / pv) p + k mod p; backwards run the chunks in reverse. Warm-up is
 * 2(p-1-r) + (v-1)p forwards. W right after each B. Stage of chunk c on
 * rank r is c p + r (loop placement). */
static void gen_interleaved(lists *l, int p, int m, int v) {
    int total = m * v;
    for (int r = 0; r < p; r++) {
        int warm = 2 * (p - 1 - r) + (v - 1) * p;
        if (warm > total) warm = total;
        int kf = 0, kb = 0;
#define IL_STAGE(k, fwd) ((((fwd) ? ((k) % (p * v)) / p : v - 1 - ((k) % (p * v)) / p)) * p + r)
#define IL_MB(k) (((k) / (p * v)) * p + (k) % p)
        for (; kf < warm; kf++) put(l, r, IL_STAGE(kf, 1), SCHED_F, IL_MB(kf));
        while (kb < total) {
            if (kf < total) {
                put(l, r, IL_STAGE(kf, 1), SCHED_F, IL_MB(kf));
                kf++;
            }
            put(l, r, IL_STAGE(kb, 0), SCHED_B, IL_MB(kb));
            put(l, r, IL_STAGE(kb, 0), SCHED_W, IL_MB(kb));
            kb++;
        }
#undef IL_STAGE
#undef IL_MB
    }
}

/* The ranks that still have work, by clock (the lowest rank first on a tie):
 * gen_zbv takes the earliest at every action, which a scan made
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

/* ZB-V: two chunks per rank in V placement (rank r holds stages r and
 * 2p-1-r), scheduled greedily from the costs like the zero-bubble paper's
 * ZB-V: every rank, whenever it is free, runs the first of
 *   1. a ready B (oldest microbatch first; it unblocks the rank upstream),
 *   2. a ready F, the second chunk first, if the memory limit allows,
 *   3. a pending W (fills what would be a bubble),
 * and otherwise waits for the next arrival. The limit is 1F1B's peak: 2p
 * chunk activations (p microbatches of a whole rank's layers); F of the
 * second chunk is always allowed so a microbatch that entered can leave. */

/* The greedy run's state. Owns every array (zbv_free). */
typedef struct zbv {
    int p, m, S;
    const sched_costs *c;
    int wait_for_sooner; /* see wait_for_sooner */
    double *end;         /* [2p][m][3] end time, <0 = not scheduled */
    double *clock;       /* [p]: when each rank is free; HUGE_VAL: asleep until woken */
    int *nf, *nb;        /* [p][2]: F and B run so far per rank and chunk */
    int *wq, *wh, *wt;   /* per rank FIFO of the (stage, mb) of pending Ws: [p][2m][2], head, tail */
    int *held;           /* [p]: chunk activations held (F run, W not yet) */
    int *left;           /* [p]: actions still to run */
    int *waiting;        /* [p]: asleep until an input arrives */
    rank_heap free_at;   /* the ranks with actions left, by clock */
} zbv;

static double *zend(zbv *z, int s, int mb, int op) {
    return &z->end[((size_t)s * (size_t)z->m + (size_t)mb) * 3 + (size_t)op];
}

static int zbv_init(zbv *z, int p, int m, const sched_costs *c, int wait_for_sooner) {
    int S = 2 * p;
    *z = (zbv){.p = p, .m = m, .S = S, .c = c, .wait_for_sooner = wait_for_sooner};
    z->end = malloc(sizeof(double) * (size_t)S * (size_t)m * 3);
    z->clock = calloc((size_t)p, sizeof(double));
    z->nf = calloc((size_t)p * 2, sizeof(int));
    z->nb = calloc((size_t)p * 2, sizeof(int));
    z->wq = malloc(sizeof(int) * (size_t)p * (size_t)(2 * m) * 2);
    z->wh = calloc((size_t)p, sizeof(int));
    z->wt = calloc((size_t)p, sizeof(int));
    z->held = calloc((size_t)p, sizeof(int));
    z->left = malloc(sizeof(int) * (size_t)p);
    z->waiting = calloc((size_t)p, sizeof(int));
    z->free_at = (rank_heap){malloc(sizeof(int) * (size_t)p), malloc(sizeof(int) * (size_t)p), p, z->clock};
    if (!z->end || !z->clock || !z->nf || !z->nb || !z->wq || !z->wh || !z->wt || !z->held || !z->left ||
        !z->waiting || !z->free_at.h || !z->free_at.pos)
        return -1;
    for (size_t i = 0; i < (size_t)S * (size_t)m * 3; i++) z->end[i] = -1;
    for (int r = 0; r < p; r++) /* all clocks 0: in order */
        z->left[r] = 6 * m, z->free_at.h[r] = r, z->free_at.pos[r] = r;
    return 0;
}

static void zbv_free(zbv *z) {
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
}

static double zbv_cost(const zbv *z, int op) { return op == SCHED_F ? z->c->f : op == SCHED_B ? z->c->b : z->c->w; }

/* The pending W at the head (i = wh) or the tail (i = wt) of rank r's FIFO. */
static int *zbv_wq(zbv *z, int r, int i) { return &z->wq[((size_t)r * (size_t)(2 * z->m) + (size_t)i) * 2]; }

/* What a free rank could run now, and the arrivals it might wait for. */
typedef struct choice {
    int stage, op, mb; /* op < 0: nothing is ready */
    int cls;           /* 0 B, 1 F of chunk 1, 2 F of chunk 0, 3 W */
    double next;       /* earliest future arrival among the candidates, -1 none */
    double soon[3];    /* earliest future arrival per class, -1 none */
} choice;

/* An input arriving after t: the rank may sleep until the earliest. */
static void note_arrival(choice *ch, double at, double t) {
    if (at > t && (ch->next < 0 || at < ch->next)) ch->next = at;
}

/* When the result (stage s, mb, op) is at rank r: its end, plus a send
 * from another rank. 0 while it has not been scheduled. */
static int arrival(zbv *z, int r, int s, int mb, int op, double *at) {
    double e = *zend(z, s, mb, op);
    if (e < 0) return 0;
    *at = e + (sched_place(SCHED_PLACE_V, s, z->p) != r ? z->c->comm : 0);
    return 1;
}

/* 1. A ready B, oldest microbatch first, the chunk nearer the loss first.
 * The last stage's B takes its own F (on this rank: no send). */
static void pick_b(zbv *z, int r, double t, choice *ch) {
    int st[2] = {r, z->S - 1 - r};
    for (int k = 1; k >= 0; k--) {
        int s = st[k], mb = z->nb[r * 2 + k];
        double ready;
        if (mb >= z->m || mb >= z->nf[r * 2 + k]) continue;
        if (!(s == z->S - 1 ? arrival(z, r, s, mb, SCHED_F, &ready) : arrival(z, r, s + 1, mb, SCHED_B, &ready)))
            continue;
        if (ready > t) {
            note_arrival(ch, ready, t);
            if (ch->soon[0] < 0 || ready < ch->soon[0]) ch->soon[0] = ready;
            continue;
        }
        if (ch->op < 0 || mb < ch->mb) ch->stage = s, ch->op = SCHED_B, ch->mb = mb, ch->cls = 0;
    }
}

/* 2. A ready F, the second chunk first, within the memory limit (1F1B's
 * peak, 2p chunk activations): chunk 0 leaves one slot free so the oldest
 * microbatch can always come back through chunk 1 and leave. */
static void pick_f(zbv *z, int r, double t, choice *ch) {
    int st[2] = {r, z->S - 1 - r}, limit = 2 * z->p;
    for (int k = 1; k >= 0 && ch->op < 0; k--) {
        int s = st[k], mb = z->nf[r * 2 + k];
        double ready = 0;
        if (mb >= z->m) continue;
        if (z->held[r] + (k == 0 ? 2 : 1) > limit) continue;
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
static choice pick(zbv *z, int r, double t) {
    choice ch = {-1, -1, -1, 3, -1, {-1, -1, -1}};
    pick_b(z, r, t, &ch);
    if (ch.op < 0) pick_f(z, r, t, &ch);
    if (ch.op < 0 && z->wh[r] < z->wt[r]) {
        const int *q = zbv_wq(z, r, z->wh[r]);
        ch.stage = q[0], ch.op = SCHED_W, ch.mb = q[1];
    }
    return ch;
}

/* wait_for_sooner: an action of a higher class whose input arrives
 * within half the chosen one's cost is waited for (the idle is shorter
 * than the delay starting the other would cause it). With send time
 * (comm > 0) the ties the order relies on at comm = 0 become near misses,
 * and each one a wrong turn. 1 when rank r waits (its clock moved). */
static int wait_for_sooner(zbv *z, int r, double t, const choice *ch) {
    double cost = zbv_cost(z, ch->op), first = -1;
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
 * can make an action ready (W never waits, and F's memory limit only moves
 * when we run), so waking at any other rank's result, only to sleep
 * again, would change nothing but cost ranks x actions. */
static void sleep_until(zbv *z, int r, double next) {
    z->clock[r] = next < 0 ? HUGE_VAL : next;
    z->waiting[r] = 1;
    rh_fix(&z->free_at, r);
}

/* The result of (stage, op) at done may be what the rank of the stage that
 * takes it sleeps for: it wakes when the result arrives. */
static void wake_receiver(zbv *z, int r, int stage, int op, double done) {
    int to = op == SCHED_F ? stage + 1 : op == SCHED_B ? stage - 1 : -1;
    if (to < 0 || to >= z->S) return;
    int q = sched_place(SCHED_PLACE_V, to, z->p);
    if (z->waiting[q] && q != r && done + z->c->comm < z->clock[q]) {
        z->clock[q] = done + z->c->comm;
        rh_fix(&z->free_at, q);
    }
}

/* Rank r runs the chosen action from t: its end, the rank's clock and
 * place in the heap, the receiver woken, the counts, the pending Ws. */
static void run_choice(zbv *z, lists *l, int r, double t, const choice *ch) {
    double done = t + zbv_cost(z, ch->op);
    *zend(z, ch->stage, ch->mb, ch->op) = done;
    z->clock[r] = done;
    z->left[r]--;
    z->waiting[r] = 0;
    if (z->left[r] == 0) rh_remove(&z->free_at, r);
    else rh_fix(&z->free_at, r);
    wake_receiver(z, r, ch->stage, ch->op, done);
    int k = ch->stage == r ? 0 : 1;
    if (ch->op == SCHED_F) {
        z->nf[r * 2 + k]++;
        z->held[r]++;
    } else if (ch->op == SCHED_B) {
        z->nb[r * 2 + k]++;
        int *q = zbv_wq(z, r, z->wt[r]++);
        q[0] = ch->stage;
        q[1] = ch->mb;
    } else {
        z->wh[r]++;
        z->held[r]--;
    }
    put(l, r, ch->stage, ch->op, ch->mb);
}

/* Until every rank ran all its actions, the free rank with the earliest
 * clock runs what pick chooses. -1 when every rank is asleep (stuck). */
static int zbv_run(zbv *z, lists *l) {
    while (z->free_at.n > 0) {
        int r = z->free_at.h[0];
        double t = z->clock[r];
        if (t == HUGE_VAL) return -1; /* all asleep: reported by the caller */
        choice ch = pick(z, r, t);
        if (ch.op < 0) sleep_until(z, r, ch.next);
        else if (!(z->wait_for_sooner && wait_for_sooner(z, r, t, &ch))) run_choice(z, l, r, t, &ch);
    }
    return 0;
}

static int gen_zbv(lists *l, int p, int m, const sched_costs *c, int wait_for_sooner) {
    zbv z;
    int rc = zbv_init(&z, p, m, c, wait_for_sooner) == 0 ? zbv_run(&z, l) : -1;
    zbv_free(&z);
    return rc;
}

/* ZB-V's greedy run twice, plain and waiting for a sooner action of a
 * higher class (gen_zbv), each simulated at the costs: the shorter step
 * wins, the plain one on a tie. Neither is better everywhere: with send
 * time (p=4, m=8, f=b=w=1, comm=0.1) waiting idles 10.1% against 16.1%;
 * with p=2 it can lose. */
static int build_zbv(int p, int m, const int *stage_rank, const sched_costs *c, sched_plan **out, pp_err *err) {
    sched_plan *best = NULL;
    double best_step = 0;
    for (int wait = 0; wait < 2; wait++) {
        lists l = {0};
        sched_plan *plan = NULL;
        sched_sim *sim = NULL;
        if (lists_init(&l, p, 6 * m) != 0) {
            sched_free(best);
            return pp_fail(err, "schedule zb-v: out of memory");
        }
        int stuck = gen_zbv(&l, p, m, c, wait) != 0;
        int rc = stuck ? -1 : sched_plan_from_lists("zb-v", p, 2 * p, 2, m, stage_rank, l.a, l.n, &plan, err);
        lists_free(&l);
        if (rc == 0 && sched_simulate(plan, c, &sim, err) == 0 && (!best || sim->step_time < best_step)) {
            sched_free(best);
            best = plan, best_step = sim->step_time;
            plan = NULL;
        }
        sched_sim_free(sim);
        sched_free(plan);
        if (!best) /* the plain order is the one that must exist */
            return stuck ? pp_fail(err, "schedule zb-v: the greedy placement got stuck (p=%d, m=%d)", p, m) : -1;
    }
    *out = best;
    return 0;
}

int sched_build(const char *kind, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err) {
    static const sched_costs unit = {1, 1, 1, 0};
    *out = NULL;
    if (!costs) costs = &unit;
    if (p < 1 || p > 1024) return pp_fail(err, "--stages: %d ranks is out of range; accepted: 1 to 1024", p);
    if (m < 1 || m > 100000)
        return pp_fail(err, "--microbatches: %d is out of range; accepted: 1 to 100000", m);
    if (strcmp(kind, "dualpipev") == 0) return sched_build_dualpipev(p, m, v, out, err);
    int is_il = strcmp(kind, "interleaved-1f1b") == 0, is_zbv = strcmp(kind, "zb-v") == 0;
    if (!is_il && !is_zbv && strcmp(kind, "gpipe") && strcmp(kind, "1f1b") && strcmp(kind, "zb-h1"))
        return pp_fail(err, "--schedule: unknown schedule '%s'; accepted: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, "
                            "dualpipev, csv:FILE",
                       kind);
    if (is_il) {
        if (v < 2)
            return pp_fail(err, "interleaved-1f1b needs --virtual-stages >= 2 (chunks per rank), got %d; "
                                "use 1f1b for one chunk", v);
        if (v > 64) return pp_fail(err, "--virtual-stages: %d is out of range; accepted: 2 to 64", v);
        if (m % p != 0)
            return pp_fail(err, "interleaved-1f1b needs the microbatches to be a multiple of the pipeline ranks "
                                "(Megatron's group size p): m=%d, p=%d", m, p);
    } else if (is_zbv) {
        if (v != 2)
            return pp_fail(err, "zb-v needs exactly two chunks per rank (--virtual-stages 2, V placement), got %d", v);
        if (costs->f <= 0 || costs->b <= 0 || costs->w < 0 || costs->comm < 0)
            return pp_fail(err, "zb-v: costs must have f > 0, b > 0, w >= 0, comm >= 0 (f=%g b=%g w=%g comm=%g)",
                           costs->f, costs->b, costs->w, costs->comm);
    } else if (v != 1) {
        return pp_fail(err, "%s runs one chunk per rank: --virtual-stages must be 1, got %d "
                            "(interleaved-1f1b and zb-v use more)", kind, v);
    }
    int S = p * v;
    if ((long)S * m * 3 > 10000000L)
        return pp_fail(err, "schedule too large: %d stages x %d microbatches x 3 ops is over 10 million actions", S, m);
    int *stage_rank = malloc(sizeof(int) * (size_t)S);
    lists l = {0};
    int rc = -1;
    if (!stage_rank) return pp_fail(err, "schedule %s: out of memory", kind);
    for (int s = 0; s < S; s++) stage_rank[s] = sched_place(is_zbv ? SCHED_PLACE_V : SCHED_PLACE_LOOP, s, p);
    if (is_zbv) {
        rc = build_zbv(p, m, stage_rank, costs, out, err);
        goto done;
    }
    if (lists_init(&l, p, 3 * v * m) != 0) {
        pp_fail(err, "schedule %s: out of memory", kind);
        goto done;
    }
    if (strcmp(kind, "gpipe") == 0) gen_gpipe(&l, p, m);
    else if (strcmp(kind, "1f1b") == 0) gen_1f1b_like(&l, p, m, 0);
    else if (strcmp(kind, "zb-h1") == 0) gen_1f1b_like(&l, p, m, 1);
    else gen_interleaved(&l, p, m, v);
    rc = sched_plan_from_lists(kind, p, S, v, m, stage_rank, l.a, l.n, out, err);
done:
    lists_free(&l);
    free(stage_rank);
    return rc;
}

int sched_from_flag(const char *spec, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err) {
    *out = NULL;
    sched_plan *plan = NULL;
    if (strncmp(spec, "csv:", 4) == 0) {
        if (!spec[4]) return pp_fail(err, "--schedule csv:FILE: the file name is missing");
        if (sched_load_csv(spec + 4, &plan, err) != 0) return -1;
        if ((p > 0 && p != plan->ranks) || (m > 0 && m != plan->microbatches)) {
            /* pprun run asks for its default 8 microbatches and 4 ranks unless told: say what the file needs */
            pp_fail(err, "%s has %d ranks (rows) and %d microbatches, but %d ranks and %d microbatches were asked for; "
                         "the file sets both: run it on %d ranks with --microbatches %d",
                    spec + 4, plan->ranks, plan->microbatches, p > 0 ? p : plan->ranks, m > 0 ? m : plan->microbatches,
                    plan->ranks, plan->microbatches);
            sched_free(plan);
            return -1;
        }
    } else {
        if (v <= 0)
            v = strcmp(spec, "interleaved-1f1b") == 0 || strcmp(spec, "zb-v") == 0 || strcmp(spec, "dualpipev") == 0
                    ? 2
                    : 1;
        if (sched_build(spec, p, m, v, costs, &plan, err) != 0) return -1;
    }
    if (sched_validate(plan, err) != 0) {
        sched_free(plan);
        return -1;
    }
    *out = plan;
    return 0;
}

/* ---- costs as a user writes them ----------------------------------------- */

typedef struct costs_parse {
    sched_costs *out;
    const char *what;
    int with_unit, without_unit;
} costs_parse;

static int costs_set(void *ctx, const char *key, const char *value, pp_err *err) {
    costs_parse *cp = ctx;
    double *slot = strcmp(key, "f") == 0      ? &cp->out->f
                   : strcmp(key, "b") == 0    ? &cp->out->b
                   : strcmp(key, "w") == 0    ? &cp->out->w
                   : strcmp(key, "comm") == 0 ? &cp->out->comm
                                              : NULL;
    if (!slot)
        return pp_fail(err, "%s: unknown key '%s'; accepted: f, b, w, comm (e.g. f=1,b=1,w=1,comm=0)", cp->what, key);
    char what[64];
    snprintf(what, sizeof what, "%s %s", cp->what, key);
    size_t n = strlen(value);
    if (n && isalpha((unsigned char)value[n - 1])) { /* 3.85ms, 66us: a duration, in ns */
        uint64_t ns;
        if (pp_parse_duration_ns(value, what, &ns, err) != 0) return -1;
        *slot = (double)ns;
        cp->with_unit++;
        return 0;
    }
    cp->without_unit++;
    return pp_parse_double(value, 0, 1e13, what, slot, err);
}

int sched_parse_costs(const char *text, const char *what, sched_costs *out, pp_err *err) {
    char *copy = strdup(text ? text : "");
    if (!copy) return pp_fail(err, "out of memory");
    sched_costs c = *out;
    costs_parse cp = {&c, what, 0, 0};
    int rc = pp_parse_kv_list(copy, costs_set, &cp, err);
    free(copy);
    if (rc != 0) return -1;
    if (cp.with_unit + cp.without_unit == 0) /* "" or ",," would leave the defaults in silently */
        return pp_fail(err, "%s: expected costs like f=1,b=1,w=1,comm=0, got '%s'", what, text ? text : "");
    /* "f=2,comm=66us" would weigh 2 time units against 66000 ns */
    if (cp.with_unit && cp.without_unit)
        return pp_fail(err, "%s: '%s' mixes durations and plain numbers; give every cost a unit (ns, us, ms, s) or none",
                       what, text);
    *out = c;
    return 0;
}
