/* sched_mem.c: schedules under a memory bound (--max-mem): what a rank
 * holds after each of its actions, the least bound an order can keep, zb-h1
 * and zb-v built within a bound, the validator's rule for it, and the
 * options that give it (docs/schedules.md, "Memory-bounded zero bubble").
 * A rank's count only moves with its own actions, so it is a replay of the
 * action list, not of time: the same count for any costs. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A count is a sum of whole bytes or units (exact in a double), replayed
 * in the same order the greedy kept it; the slack only absorbs a caller's
 * fractional units (db/whatif.c scales chunks). */
static int over(double held, double max) { return held > max + 1e-9 * (max > 1 ? max : 1); }

sched_act sched_mem_act(const sched_mem *mem, int stage) {
    if (!mem || !mem->act) return (sched_act){1, 1, 0};
    return mem->act[mem->nact == 1 ? 0 : stage];
}

const char *sched_mem_text(const sched_mem *mem, double value, char *buf, size_t size) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (!mem || !mem->bytes) {
        snprintf(buf, size, "%g microbatch-stage%s", value, value == 1 ? "" : "s");
        return buf;
    }
    int u = 0;
    double v = value;
    while (fabs(v) >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0) snprintf(buf, size, "%.0f B", value);
    else snprintf(buf, size, "%.1f %s", v, unit[u]);
    return buf;
}

int sched_act_valid(sched_act a) {
    return a.f >= 0 && a.b >= 0 && a.mid >= 0 && isfinite(a.f) && isfinite(a.b) && isfinite(a.mid);
}

/* mem's table against a plan of `stages` stages: one entry or one per
 * stage, none negative or not a number. */
static int check_act(const sched_mem *mem, int stages, pp_err *err) {
    if (!mem->act) return 0;
    if (mem->nact != 1 && mem->nact != stages)
        return pp_fail(err, "--act-bytes: %d entries for %d stages; give one for every stage or one per stage",
                       mem->nact, stages);
    for (int i = 0; i < mem->nact; i++) {
        if (!sched_act_valid(mem->act[i]))
            return pp_fail(err, "--act-bytes: entry %d (f=%g, b=%g) must not be negative", i, mem->act[i].f,
                           mem->act[i].b);
        if (mem->high && !(mem->high[i] >= 0 && isfinite(mem->high[i])))
            return pp_fail(err, "activation bytes during B: entry %d (%g) must not be negative", i, mem->high[i]);
    }
    return 0;
}

/* What one microbatch needs on a stage: its F's activations, or what it
 * holds after B when B saves more. */
static double unit_need(sched_act a) { return a.b > a.f ? a.b : a.f; }

int sched_mem_least(const char *kind, int p, const sched_mem *mem, double *least, int *rank, pp_err *err) {
    int zbv = strcmp(kind, "zb-v") == 0;
    if (!zbv && strcmp(kind, "zb-h1") != 0)
        return pp_fail(err, "--max-mem bounds the zero-bubble schedules, zb-h1 and zb-v, whose order the bound "
                            "shapes; --schedule %s holds what its order holds (pprun schedule shows it)", kind);
    int S = zbv ? 2 * p : p;
    if (mem && check_act(mem, S, err) != 0) return -1;
    *least = 0, *rank = 0;
    for (int r = 0; r < p; r++) {
        /* as the greedy's zg_f_room: zb-v's first-chunk F keeps room for the second chunk */
        double need = unit_need(sched_mem_act(mem, r));
        if (zbv) need += unit_need(sched_mem_act(mem, S - 1 - r));
        if (need > *least) *least = need, *rank = r;
    }
    return 0;
}

int sched_mem_peaks(const sched_plan *plan, const sched_mem *mem, double *peak, int *at, pp_err *err) {
    if (mem && check_act(mem, plan->stages, err) != 0) return -1;
    for (int r = 0; r < plan->ranks; r++) {
        double held = 0, pair_f = 0; /* pair_f: an overlapped pair's F at its most, beyond what it keeps */
        peak[r] = 0;
        if (at) at[r] = -1;
        for (int i = 0; i < plan->len[r]; i++) {
            const sched_action *a = &plan->actions[r][i];
            if (!sched_action_ok(plan, a)) {
                char buf[32];
                return pp_fail(err, "schedule %s: rank %d action %s is outside %d stages x %d microbatches",
                               plan->name, r, sched_action_str(a, buf), plan->stages, plan->microbatches);
            }
            sched_act u = sched_mem_act(mem, a->stage);
            int has_high = mem && mem->act && mem->high;
            double high = has_high ? mem->high[mem->nact == 1 ? 0 : a->stage] : 0;
            /* during a B (or a BW, a B and its W at once) the microbatch
             * may hold more than after it: with mem->high, its moment
             * after the recompute. The second half of an overlapped pair
             * runs beside its F, and the trace's count, read at one
             * half's end, catches the other midway: at the F's end the B
             * part-way (u.mid where known, else what the recompute
             * brought back and B's growth: high + b - f), at the B's
             * recompute the F before its drop (block by block: at most
             * high - f beyond what it keeps). The larger counts
             * (docs/schedules.md, "What counts"). */
            double during = -INFINITY;
            if (a->op == SCHED_B || a->op == SCHED_BW) {
                double start = has_high ? high : u.f; /* the B's start, its recompute done */
                if (has_high) during = held - u.f + high;
                if (i > 0 && sched_overlaps(plan, r, i - 1)) {
                    double mid = u.mid > 0 ? u.mid : start + u.b - u.f;
                    double f_end = held - u.f + mid, b_start = held - u.f + start + pair_f;
                    during = f_end > during ? f_end : during;
                    during = b_start > during ? b_start : during;
                }
            }
            pair_f = a->op == SCHED_F && has_high && sched_overlaps(plan, r, i) && high > u.f ? high - u.f : 0;
            /* F holds f; B turns it into b; W (or a BW, B and W at once) lets go */
            held += a->op == SCHED_F ? u.f : a->op == SCHED_B ? u.b - u.f : a->op == SCHED_W ? -u.b : -u.f;
            double most = during > held ? during : held;
            if (i == 0 || most > peak[r]) {
                peak[r] = most;
                if (at) at[r] = i;
            }
        }
    }
    return 0;
}

int sched_validate_mem(const sched_plan *plan, const sched_mem *mem, pp_err *err) {
    if (sched_validate(plan, err) != 0) return -1;
    if (!mem || mem->max <= 0) return 0;
    double *peak = malloc(sizeof(double) * (size_t)plan->ranks);
    int *at = malloc(sizeof(int) * (size_t)plan->ranks), *marks = malloc(sizeof(int) * (size_t)plan->ranks);
    int rc = !peak || !at || !marks ? pp_fail(err, "validate %s: out of memory", plan->name)
                                    : sched_mem_peaks(plan, mem, peak, at, err);
    for (int r = 0; rc == 0 && r < plan->ranks; r++) {
        if (!over(peak[r], mem->max)) continue;
        char a1[32], held[64], bound[64], detail[512];
        for (int q = 0; q < plan->ranks; q++) marks[q] = q == r ? sched_slot_of(plan, r, at[r]) : -1;
        snprintf(detail, sizeof detail, "rank %d holds %s after %s, more than the bound of %s", r,
                 sched_mem_text(mem, peak[r], held, sizeof held), sched_action_str(&plan->actions[r][at[r]], a1),
                 sched_mem_text(mem, mem->max, bound, sizeof bound));
        rc = sched_reject(plan, err, marks, "no rank holds more than --max-mem", detail);
    }
    free(peak);
    free(at);
    free(marks);
    return rc;
}

/* The act table of every stage of a plan of S stages (a copy of mem's, or
 * {1, 1} each). Caller frees; NULL when out of memory. */
static sched_act *act_table(const sched_mem *mem, int S) {
    sched_act *t = malloc(sizeof *t * (size_t)S);
    for (int s = 0; t && s < S; s++) t[s] = sched_mem_act(mem, s);
    return t;
}

/* The step of plan at costs; HUGE_VAL when it does not play. */
static double step_at(const sched_plan *plan, const sched_costs *costs) {
    sched_sim *sim = NULL;
    pp_err ignored;
    double step = sched_simulate(plan, costs, &sim, &ignored) == 0 ? sim->step_time : HUGE_VAL;
    sched_sim_free(sim);
    return step;
}

/* 1 when every rank of plan stays within mem. */
static int fits(const sched_plan *plan, const sched_mem *mem) {
    double *peak = malloc(sizeof(double) * (size_t)plan->ranks);
    pp_err ignored;
    int ok = peak && sched_mem_peaks(plan, mem, peak, NULL, &ignored) == 0;
    for (int r = 0; ok && r < plan->ranks; r++) ok = !over(peak[r], mem->max);
    free(peak);
    return ok;
}

/* The candidates so far: the shortest step, the first on a tie. */
typedef struct pick {
    sched_plan *plan;
    double step;
} pick;

/* plan, whose step at the build costs is `step`, against the best so far. */
static void offer(pick *best, sched_plan *plan, double step) {
    if (!best->plan || step < best->step) {
        sched_free(best->plan);
        best->plan = plan, best->step = step;
    } else {
        sched_free(plan);
    }
}

/* The greedy is not monotone in its limit: a rank with room for one more
 * F sometimes starts it just before a B arrives, and the B waits (zb-v,
 * p=4, m=4, f=b=w=1: 31 at 6 microbatch-stages, 32 at 7). A bound allows
 * every order of a lower one, so the greedy runs at every level from the
 * least up to the bound, one microbatch-stage of the smallest stage apart
 * (whole microbatch-stages, or the bound's bytes rounded down to a level),
 * and the shortest step wins, the lowest level on a tie: a higher bound
 * has every candidate of a lower one, so more memory never costs time. The
 * sweep stops at the first level the limit did not bind (every higher one
 * gives the same order); past SWEEP_ACTIONS actions' worth of levels it
 * goes straight to the highest level (a bigger plan than tests or jobs
 * here build: there the monotony is not promised). */
#define SWEEP_ACTIONS 50000000L

static int sweep(const sched_greedy_in *base, const char *kind, double least, pick *best, pp_err *err) {
    double q = HUGE_VAL; /* a level apart: the smallest stage's microbatch */
    for (int s = 0; s < base->p * base->v; s++) {
        double need = unit_need(base->act[s]);
        if (need > 0 && need < q) q = need;
    }
    /* the levels: least + j q for j = 0..top (no stage holds anything: one) */
    long top = q == HUGE_VAL ? 0 : (long)floor((base->limit - least) / q + 1e-9);
    long actions = 3L * base->p * base->v * base->m, budget = SWEEP_ACTIONS / (2 * actions);
    int built = 0;
    for (long j = 0; j <= top; j++) {
        if (j >= budget && j < top) j = top; /* out of budget: the highest level only */
        sched_greedy_in in = *base;
        in.limit = q == HUGE_VAL ? base->limit : least + (double)j * q;
        sched_plan *plan = NULL;
        int bound = 1;
        pp_err e;
        double step;
        if (sched_greedy_best(&in, kind, &plan, &bound, &step, &e) == 0) offer(best, plan, step), built = 1;
        else if (!built && err) *err = e;
        if (!bound) break; /* every higher level gives this order too */
    }
    return best->plan ? 0 : -1;
}

int sched_build_bounded(const char *kind, int p, int m, int v, const sched_costs *costs, const sched_mem *mem,
                        sched_plan **out, pp_err *err) {
    static const sched_costs unit = {1, 1, 1, 0, 0, 0};
    *out = NULL;
    if (!mem || mem->max <= 0) return sched_build(kind, p, m, v, costs, out, err);
    if (!costs) costs = &unit;
    double least;
    int rank;
    if (sched_mem_least(kind, p, mem, &least, &rank, err) != 0) return -1;
    /* the unbounded order checks the shape (p, m, v, costs), and is the
     * first candidate: a bound that does not bind changes nothing */
    pick best = {0};
    if (sched_build(kind, p, m, v, costs, &best.plan, err) != 0) return -1;
    if (over(least, mem->max)) {
        char a[64], b[64];
        sched_free(best.plan);
        return pp_fail(err, "--max-mem %s is below what %s needs: at least %s per rank (rank %d: one microbatch "
                            "through %s)",
                       sched_mem_text(mem, mem->max, a, sizeof a), kind, sched_mem_text(mem, least, b, sizeof b), rank,
                       strcmp(kind, "zb-v") == 0 ? "both of its chunks" : "its stage");
    }
    if (fits(best.plan, mem)) {
        best.step = step_at(best.plan, costs);
    } else {
        sched_free(best.plan);
        best.plan = NULL;
    }
    int zbv = strcmp(kind, "zb-v") == 0;
    sched_act *act = act_table(mem, zbv ? 2 * p : p);
    if (!act) {
        sched_free(best.plan);
        return pp_fail(err, "schedule %s: out of memory", kind);
    }
    sched_greedy_in in = {.p = p, .m = m, .v = zbv ? 2 : 1, .costs = costs, .act = act, .limit = mem->max};
    int rc = sweep(&in, kind, least, &best, err);
    free(act);
    if (rc != 0) return -1;
    *out = best.plan;
    return 0;
}

int sched_from_flag_mem(const char *spec, int p, int m, int v, const sched_costs *costs, const sched_mem *mem,
                        sched_plan **out, pp_err *err) {
    *out = NULL;
    int shaped = strcmp(spec, "zb-h1") == 0 || strcmp(spec, "zb-v") == 0;
    if (!mem || mem->max <= 0 || !shaped) {
        /* a CSV's order is its own, and so is every other generator's: the bound is only checked */
        if (sched_from_flag(spec, p, m, v, costs, out, err) != 0) return -1;
    } else {
        if (v <= 0) v = sched_default_virtual(spec);
        if (sched_build_bounded(spec, p, m, v, costs, mem, out, err) != 0) return -1;
    }
    if (sched_validate_mem(*out, mem, err) != 0) {
        sched_free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

/* ---- the options ------------------------------------------------------------ */

int sched_parse_max_mem(const char *text, const char *what, double *max, int *bytes, pp_err *err) {
    if (!text || !*text)
        return pp_fail(err, "%s: expected microbatch-stages per rank (6) or bytes with a unit (64MiB), got nothing",
                       what);
    if (strspn(text, "0123456789") == strlen(text)) {
        long n;
        if (pp_parse_long(text, 1, 1000000, what, &n, err) != 0) return -1;
        *max = (double)n, *bytes = 0;
        return 0;
    }
    /* a number without a unit that is not whole (3.0, 2.5, 1e3) is neither:
     * read as bytes it bounded a rank to 3 B */
    char last = text[strlen(text) - 1];
    if ((last >= '0' && last <= '9') || last == '.' || strpbrk(text, "xX")) /* 0x1F: a hex number, no unit */
        return pp_fail(err,
                       "%s: '%s' is neither a whole number of microbatch-stages per rank (such as 6) nor bytes "
                       "with a unit (such as 64MiB or 1.5GiB)",
                       what, text);
    uint64_t b;
    if (pp_parse_size(text, what, &b, err) != 0) return -1;
    if (b == 0) return pp_fail(err, "%s: '%s' bounds a rank to nothing", what, text);
    *max = (double)b, *bytes = 1;
    return 0;
}

/* One entry, "F" or "F:B" (B = F when not given), and "*N" after it for N
 * stages alike; *count gets N (1 without). */
static int parse_one_act(const char *item, const char *what, sched_act *out, long *count, pp_err *err) {
    char f[64], b[64];
    const char *star = strchr(item, '*'), *colon = strchr(item, ':');
    size_t n = star ? (size_t)(star - item) : strlen(item);
    *count = 1;
    if (star && pp_parse_long(star + 1, 1, 65536, what, count, err) != 0) return -1;
    if (colon && star && colon > star) colon = NULL;
    size_t nf = colon ? (size_t)(colon - item) : n, nb = colon ? n - nf - 1 : 0;
    if (nf == 0 || nf >= sizeof f || (colon && (nb == 0 || nb >= sizeof b)))
        return pp_fail(err, "%s: '%s' is not F or F:B (sizes, e.g. 2.5MiB or 2.5MiB:2.6MiB, and *N for N stages)",
                       what, item);
    memcpy(f, item, nf);
    f[nf] = '\0';
    if (colon) memcpy(b, colon + 1, nb), b[nb] = '\0';
    uint64_t fb, bb;
    if (pp_parse_size(f, what, &fb, err) != 0 || (colon && pp_parse_size(b, what, &bb, err) != 0)) return -1;
    *out = (sched_act){(double)fb, colon ? (double)bb : (double)fb, 0};
    return 0;
}

int sched_parse_act(const char *text, const char *what, sched_act **out, int *n, pp_err *err) {
    *out = NULL, *n = 0;
    if (!text || !*text) return pp_fail(err, "%s: expected F or F:B per stage (e.g. 2.5MiB:2.6MiB), got nothing", what);
    /* strtok would skip an empty entry ("a,,b", a trailing comma) */
    if (strstr(text, ",,") || text[0] == ',' || text[strlen(text) - 1] == ',')
        return pp_fail(err, "%s: '%s' has an empty entry", what, text);
    char *copy = strdup(text), *save = NULL;
    sched_act *t = NULL;
    int rc = copy ? 0 : pp_fail(err, "out of memory"), used = 0;
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; rc == 0 && tok; tok = strtok_r(NULL, ",", &save)) {
        sched_act a;
        long count;
        if ((rc = parse_one_act(tok, what, &a, &count, err)) != 0) break;
        if (used + count > 65536) {
            rc = pp_fail(err, "%s: more than 65536 stages", what);
            break;
        }
        sched_act *grown = realloc(t, sizeof *t * (size_t)(used + count));
        if (!grown) {
            rc = pp_fail(err, "out of memory");
            break;
        }
        t = grown;
        while (count-- > 0) t[used++] = a;
    }
    free(copy);
    if (rc != 0) {
        free(t);
        return -1;
    }
    *out = t, *n = used;
    return 0;
}

int sched_act_text(const sched_act *act, int n, char *buf, size_t size) {
    size_t len = 0;
    if (size) buf[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && act[j + 1].f == act[i].f && act[j + 1].b == act[i].b) j++;
        int w = snprintf(buf + len, len < size ? size - len : 0, "%s%.0fB:%.0fB", i ? "," : "", act[i].f, act[i].b);
        len += (size_t)w;
        if (j > i) len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "*%d", j - i + 1);
        i = j + 1;
    }
    return len < size ? 0 : -1;
}
