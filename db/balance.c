/* balance.c: a job's cost profile along its layers, other splits of them,
 * and the cuts that even its stages out (balance.h). */
#include "db/balance.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

/* Beyond this many steps of the cut search (stages x layers x layers) no
 * cuts are suggested: a request must stay quick. */
#define BALANCE_MAX_SEARCH 50000000.0

static sched_costs costs_minus_layers(sched_costs stage, sched_costs per_layer, int layers) {
    sched_costs c = {stage.f - per_layer.f * layers, stage.b - per_layer.b * layers, stage.w - per_layer.w * layers,
                     0, 0, 0};
    c.f = c.f > 0 ? c.f : 0, c.b = c.b > 0 ? c.b : 0, c.w = c.w > 0 ? c.w : 0;
    return c;
}

void balance_fit(balance_profile *p) {
    int S = p->stages;
    memset(&p->first_adds, 0, sizeof p->first_adds);
    memset(&p->last_adds, 0, sizeof p->last_adds);
    /* the middle stages hold layers and nothing else; with fewer than three
     * stages the first one stands in for them */
    int from = S >= 3 ? 1 : 0, to = S >= 3 ? S - 1 : 1;
    double f = 0, b = 0, w = 0, n = 0;
    for (int s = from; s < to; s++) {
        f += p->stage[s].f, b += p->stage[s].b, w += p->stage[s].w;
        n += p->bound[s + 1] - p->bound[s];
    }
    p->per_layer = n > 0 ? (sched_costs){f / n, b / n, w / n, 0, 0, 0} : (sched_costs){0, 0, 0, 0, 0, 0};
    if (!p->layers_known) return;
    if (S >= 3) p->first_adds = costs_minus_layers(p->stage[0], p->per_layer, p->bound[1] - p->bound[0]);
    if (S >= 2) p->last_adds = costs_minus_layers(p->stage[S - 1], p->per_layer, p->bound[S] - p->bound[S - 1]);
}

int balance_split(const balance_profile *p, int chunks, double *bound, pp_err *err) {
    if (chunks == p->stages) {
        for (int c = 0; c <= chunks; c++) bound[c] = p->bound[c];
        return 0;
    }
    if (!p->layers_known) {
        for (int c = 0; c <= chunks; c++) bound[c] = (double)c * p->layers / chunks;
        return 0;
    }
    int *first = malloc(sizeof *first * (size_t)(chunks + 1));
    if (!first) return pp_fail(err, "out of memory");
    int rc = sched_partition(p->layers, chunks, NULL, 0, first, err);
    for (int c = 0; rc == 0 && c <= chunks; c++) bound[c] = first[c];
    free(first);
    return rc;
}

/* Stage s's cost of one of its layers (its additions left out). */
static sched_costs balance_density(const balance_profile *p, int s) {
    sched_costs c = p->stage[s];
    const sched_costs *adds = s == 0 ? &p->first_adds : s == p->stages - 1 ? &p->last_adds : NULL;
    double layers = p->bound[s + 1] - p->bound[s];
    if (adds) c.f -= adds->f, c.b -= adds->b, c.w -= adds->w;
    return (sched_costs){c.f / layers, c.b / layers, c.w / layers, 0, 0, 0};
}

/* What stage s's BW costs against its B and W (1: a BW is b + w). */
static double balance_fused_share(const balance_profile *p, int s) {
    const sched_costs *c = &p->stage[s];
    return c->b + c->w > 0 ? sched_bw_cost(c) / (c->b + c->w) : 1;
}

void balance_chunk_costs(const balance_profile *p, const double *bound, int chunks, sched_costs *out) {
    for (int c = 0; c < chunks; c++) {
        sched_costs sum = {0, 0, 0, p->stage[0].comm, 0, p->stage[0].between};
        for (int s = 0; s < p->stages; s++) {
            double lo = bound[c] > p->bound[s] ? bound[c] : p->bound[s];
            double hi = bound[c + 1] < p->bound[s + 1] ? bound[c + 1] : p->bound[s + 1];
            if (hi <= lo) continue;
            sched_costs d = balance_density(p, s);
            sum.f += d.f * (hi - lo), sum.b += d.b * (hi - lo), sum.w += d.w * (hi - lo);
            sum.bw += (d.b + d.w) * balance_fused_share(p, s) * (hi - lo);
        }
        out[c] = sum;
    }
    const sched_costs *first = &p->first_adds, *last = &p->last_adds;
    int S = p->stages;
    out[0].f += first->f, out[0].b += first->b, out[0].w += first->w;
    out[0].bw += (first->b + first->w) * balance_fused_share(p, 0);
    out[chunks - 1].f += last->f, out[chunks - 1].b += last->b, out[chunks - 1].w += last->w;
    out[chunks - 1].bw += (last->b + last->w) * balance_fused_share(p, S - 1);
    int fused = 0; /* bw only where a stage measured one beside its B and W: else b + w, as unset */
    for (int s = 0; s < S; s++) fused |= p->stage[s].bw > 0;
    for (int c = 0; !fused && c < chunks; c++) out[c].bw = 0;
}

static double stage_total(const balance_profile *p, int k) { return p->stage[k].f + p->stage[k].b + p->stage[k].w; }

double balance_mean_stage(const balance_profile *p) {
    double mean = 0;
    for (int k = 0; k < p->stages; k++) mean += stage_total(p, k) / p->stages;
    return mean;
}

int balance_stage_ranks(const balance_profile *p) { return p->replicas > 1 ? p->replicas : 1; }

int balance_stage_rank(const balance_profile *p, int k, int d) { return p->rank[k] + d * p->pipeline_ranks; }

int balance_listed(const balance_profile *p, int k) {
    if (p->stages <= BALANCE_LIST_ALL) return 1;
    double mine = stage_total(p, k);
    int ahead = 0; /* stages slower than k, or as slow and earlier */
    for (int j = 0; j < p->stages; j++) ahead += stage_total(p, j) > mine || (stage_total(p, j) == mine && j < k);
    return ahead < BALANCE_LIST_SLOWEST;
}

double balance_bottleneck(const sched_costs *each, int chunks) {
    double most = 0;
    for (int c = 0; c < chunks; c++)
        if (each[c].f + each[c].b + each[c].w > most) most = each[c].f + each[c].b + each[c].w;
    return most;
}

int balance_best_cuts(const balance_profile *p, int *cuts, pp_err *err) {
    int S = p->stages, L = p->layers;
    if (!p->layers_known) return pp_fail(err, "the model does not say which layers each stage held");
    if ((double)S * L * L > BALANCE_MAX_SEARCH)
        return pp_fail(err, "%d stages over %d layers: too many splits to search here", S, L);
    double *prefix = malloc(sizeof *prefix * (size_t)(L + 1));
    double *best = malloc(sizeof *best * (size_t)S * (size_t)(L + 1));
    int *from = malloc(sizeof *from * (size_t)S * (size_t)(L + 1));
    if (!prefix || !best || !from) {
        free(prefix), free(best), free(from);
        return pp_fail(err, "out of memory");
    }
    prefix[0] = 0;
    for (int s = 0; s < S; s++) {
        sched_costs d = balance_density(p, s);
        for (int l = p->bound[s]; l < p->bound[s + 1]; l++) prefix[l + 1] = prefix[l] + d.f + d.b + d.w;
    }
    double first = p->first_adds.f + p->first_adds.b + p->first_adds.w;
    double last = p->last_adds.f + p->last_adds.b + p->last_adds.w;
    /* best[c * (L+1) + e]: the least slowest-stage cost of stages 0..c over
     * layers [0, e), stage c ending at e; from[]: where stage c begins */
#define AT(c, e) ((size_t)(c) * (size_t)(L + 1) + (size_t)(e))
    for (int c = 0; c < S; c++)
        for (int e = c + 1; e <= L - (S - 1 - c); e++) {
            double adds = (c == 0 ? first : 0) + (c == S - 1 ? last : 0);
            if (c == 0) {
                best[AT(0, e)] = prefix[e] + adds, from[AT(0, e)] = 0;
                continue;
            }
            best[AT(c, e)] = DBL_MAX;
            for (int a = c; a < e; a++) {
                double own = prefix[e] - prefix[a] + adds, worst = best[AT(c - 1, a)] > own ? best[AT(c - 1, a)] : own;
                if (worst < best[AT(c, e)]) best[AT(c, e)] = worst, from[AT(c, e)] = a;
            }
        }
    for (int c = S - 1, e = L; c > 0; c--) e = cuts[c - 1] = from[AT(c, e)];
#undef AT
    free(prefix), free(best), free(from);
    return 0;
}
