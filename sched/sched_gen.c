/* sched_gen.c: the schedule generators (gpipe, 1f1b, interleaved-1f1b,
 * zb-h1, zb-v): each writes per-rank action lists; sched_plan_from_lists
 * turns them into a plan with its display grid (zb-v's greedy is
 * sched_greedy.c). docs/schedules.md explains each one. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <ctype.h>
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

/* ZB-V: two chunks per rank in V placement (rank r holds stages r and
 * 2p-1-r), ordered by the zero-bubble greedy from the costs
 * (sched_greedy.c). Its bound is 1F1B's peak: 2p chunk activations (p
 * microbatches of a whole rank's layers). */
static int build_zbv(int p, int m, const sched_costs *c, sched_plan **out, pp_err *err) {
    sched_act *units = malloc(sizeof *units * (size_t)(2 * p));
    if (!units) return pp_fail(err, "schedule zb-v: out of memory");
    for (int s = 0; s < 2 * p; s++) units[s] = (sched_act){1, 1, 0};
    sched_greedy_in in = {.p = p, .m = m, .v = 2, .costs = c, .act = units, .limit = 2 * p};
    int rc = sched_greedy_best(&in, "zb-v", out, NULL, NULL, err);
    free(units);
    return rc;
}

int sched_kind_check(const char *kind, pp_err *err) {
    static const char *const kinds[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"};
    for (size_t i = 0; kind && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kind, kinds[i]) == 0) return 0;
    return pp_fail(err, "--schedule: unknown schedule '%s'; accepted: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, "
                        "dualpipev, csv:FILE",
                   kind ? kind : "");
}

int sched_build(const char *kind, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err) {
    static const sched_costs unit = {1, 1, 1, 0, 0, 0};
    *out = NULL;
    if (!costs) costs = &unit;
    if (p < 1 || p > PP_SHAPE_MAX_RANKS)
        return pp_fail(err, "--pp: %d ranks is out of range; accepted: 1 to %d", p, PP_SHAPE_MAX_RANKS);
    if (m < 1 || m > PP_SHAPE_MAX_MICROBATCHES)
        return pp_fail(err, "--microbatches: %d is out of range; accepted: 1 to %d", m, PP_SHAPE_MAX_MICROBATCHES);
    if (sched_kind_check(kind, err) != 0) return -1;
    if (strcmp(kind, "dualpipev") == 0) return sched_build_dualpipev(p, m, v, out, err);
    int is_il = strcmp(kind, "interleaved-1f1b") == 0, is_zbv = strcmp(kind, "zb-v") == 0;
    if (is_il) {
        if (v < 2)
            return pp_fail(err, "interleaved-1f1b needs --virtual-stages >= 2 (chunks per rank), got %d; "
                                "use 1f1b for one chunk", v);
        if (v > PP_SHAPE_MAX_VIRTUAL)
            return pp_fail(err, "--virtual-stages: %d is out of range; accepted: 2 to %d", v, PP_SHAPE_MAX_VIRTUAL);
        if (m % p != 0)
            return pp_fail(err, "interleaved-1f1b needs the microbatches to be a multiple of the pipeline ranks "
                                "(Megatron's group size p): m=%d, p=%d", m, p);
    } else if (is_zbv) {
        if (v != 2)
            return pp_fail(err, "zb-v needs exactly two chunks per rank (--virtual-stages 2, V placement), got %d", v);
        if (!(costs->f > 0 && costs->b > 0 && costs->w >= 0 && costs->comm >= 0 && costs->between >= 0))
            return pp_fail(err,
                           "zb-v: costs must have f > 0, b > 0, w >= 0, comm >= 0, between >= 0 (f=%g b=%g w=%g "
                           "comm=%g between=%g)",
                           costs->f, costs->b, costs->w, costs->comm, costs->between);
    } else if (v != 1) {
        return pp_fail(err, "%s runs one chunk per rank: --virtual-stages must be 1, got %d "
                            "(interleaved-1f1b and zb-v use more)", kind, v);
    }
    int S = p * v;
    if ((long)S * m * 3 > PP_SHAPE_MAX_ACTIONS)
        return pp_fail(err, "schedule too large: %d stages x %d microbatches x 3 ops is over " PP_SHAPE_MAX_ACTIONS_TEXT
                            " actions", S, m);
    if (is_zbv) return build_zbv(p, m, costs, out, err);
    int *stage_rank = malloc(sizeof(int) * (size_t)S);
    lists l = {0};
    int rc = -1;
    if (!stage_rank) return pp_fail(err, "schedule %s: out of memory", kind);
    for (int s = 0; s < S; s++) stage_rank[s] = sched_place(SCHED_PLACE_LOOP, s, p);
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

int sched_default_virtual(const char *kind) {
    return strcmp(kind, "interleaved-1f1b") == 0 || strcmp(kind, "zb-v") == 0 || strcmp(kind, "dualpipev") == 0 ? 2 : 1;
}

int sched_from_csv(const char *file, sched_plan *plan, int p, int m, sched_plan **out, pp_err *err) {
    *out = NULL;
    if ((p > 0 && p != plan->ranks) || (m > 0 && m != plan->microbatches)) {
        /* a caller that asks for a shape of its own (pprun run takes the file's unless told): say what the file needs */
        pp_fail(err, "%s has %d ranks (rows) and %d microbatches, but %d ranks and %d microbatches were asked for; "
                     "the file sets both: run it on %d ranks with --microbatches %d",
                file, plan->ranks, plan->microbatches, p > 0 ? p : plan->ranks, m > 0 ? m : plan->microbatches,
                plan->ranks, plan->microbatches);
        sched_free(plan);
        return -1;
    }
    if (sched_validate(plan, err) != 0) {
        sched_free(plan);
        return -1;
    }
    *out = plan;
    return 0;
}

int sched_from_flag(const char *spec, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err) {
    *out = NULL;
    sched_plan *plan = NULL;
    if (strncmp(spec, "csv:", 4) == 0) {
        if (!spec[4]) return pp_fail(err, "--schedule csv:FILE: the file name is missing");
        if (sched_load_csv(spec + 4, &plan, err) != 0) return -1;
        return sched_from_csv(spec + 4, plan, p, m, out, err);
    }
    if (v <= 0) v = sched_default_virtual(spec);
    if (sched_build(spec, p, m, v, costs, &plan, err) != 0) return -1;
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
    double *allreduce; /* NULL: the key is not accepted */
    const char *what;
    int with_unit, without_unit;
} costs_parse;

static int costs_set(void *ctx, const char *key, const char *value, pp_err *err) {
    costs_parse *cp = ctx;
    double *slot = strcmp(key, "f") == 0                        ? &cp->out->f
                   : strcmp(key, "b") == 0                      ? &cp->out->b
                   : strcmp(key, "w") == 0                      ? &cp->out->w
                   : strcmp(key, "comm") == 0                   ? &cp->out->comm
                   : strcmp(key, "bw") == 0                     ? &cp->out->bw
                   : strcmp(key, "between") == 0                ? &cp->out->between
                   : strcmp(key, "allreduce") == 0 && cp->allreduce ? cp->allreduce
                                                                : NULL;
    if (!slot)
        return pp_fail(err, "%s: unknown key '%s'; accepted: f, b, w, comm, bw, between%s (e.g. f=1,b=1,w=1,comm=0)",
                       cp->what, key, cp->allreduce ? ", allreduce" : "");
    char what[64];
    snprintf(what, sizeof what, "%s %s", cp->what, key);
    size_t n = strlen(value);
    /* 3.85ms, 66us: a duration, in ns; nan and inf end in a letter too, but
     * are no number with a unit: the plain number's message says why */
    if (n && isalpha((unsigned char)value[n - 1]) && strchr("0123456789.-", value[0])) {
        uint64_t ns;
        if (pp_parse_duration_ns(value, what, &ns, err) != 0) return -1;
        *slot = (double)ns;
        cp->with_unit++;
        return 0;
    }
    cp->without_unit++;
    return pp_parse_double(value, 0, 1e13, what, slot, err);
}

void sched_costs_text(const sched_costs *c, char *buf, size_t size) {
    /* + 0.0: a measured -0.0 would be written "-0", which the parser refuses
     * (no '-' where nothing is negative) when the text is read back */
    int n =
        snprintf(buf, size, "f=%.17g,b=%.17g,w=%.17g,comm=%.17g", c->f + 0.0, c->b + 0.0, c->w + 0.0, c->comm + 0.0);
    if (n > 0 && (size_t)n < size && c->bw != 0) n += snprintf(buf + n, size - (size_t)n, ",bw=%.17g", c->bw);
    if (n > 0 && (size_t)n < size && c->between != 0)
        snprintf(buf + n, size - (size_t)n, ",between=%.17g", c->between);
}

int sched_parse_costs(const char *text, const char *what, sched_costs *out, pp_err *err) {
    return sched_parse_costs_dp(text, what, out, NULL, NULL, err);
}

int sched_parse_costs_dp(const char *text, const char *what, sched_costs *out, double *allreduce, int *in_ns,
                         pp_err *err) {
    if (!text) text = "";
    /* "" or ",," would leave the defaults in silently; either is no costs at
     * all, not an empty item among them */
    if (strspn(text, ",") == strlen(text))
        return pp_fail(err, "%s: expected costs like f=1,b=1,w=1,comm=0, got '%s'", what, text);
    char *copy = strdup(text);
    if (!copy) return pp_fail(err, "out of memory");
    sched_costs c = *out;
    double ar = allreduce ? *allreduce : 0;
    costs_parse cp = {&c, allreduce ? &ar : NULL, what, 0, 0};
    int rc = pp_parse_kv_list(copy, what, costs_set, &cp, err);
    free(copy);
    if (rc != 0) return -1;
    /* "f=2,comm=66us" would weigh 2 time units against 66000 ns */
    if (cp.with_unit && cp.without_unit)
        return pp_fail(err, "%s: '%s' mixes durations and plain numbers; give every cost a unit (ns, us, ms, s) or none",
                       what, text);
    *out = c;
    if (allreduce) *allreduce = ar;
    if (in_ns) *in_ns = cp.with_unit > 0;
    return 0;
}
