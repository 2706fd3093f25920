/* balance.h: how a job's work lies along its model's depth. From each
 * stage's measured op costs and the layers it held, a cost profile of the
 * layers: what any other split of the same layers would cost per chunk
 * (what the what-if plays), how uneven the job's stages were, and the cuts
 * that even them out. Pure computation: db/whatif.c reads the costs.
 *
 * The profile spreads each stage's cost evenly over its layers, except what
 * the first and the last stage do beyond their layers (embedding; final
 * norm, LM head and loss): that is fitted from the middle stages' cost per
 * layer and stays with the first and last chunk of any split. */
#ifndef PP_DB_BALANCE_H
#define PP_DB_BALANCE_H

#include "base/pp.h"
#include "sched/sched.h"

#define BALANCE_MAX_STAGES 256 /* a job with more stages gets no profile (the what-if plays one cost for all) */

typedef struct balance_profile {
    int stages;       /* S, 1..BALANCE_MAX_STAGES */
    int layers;       /* L: the layers the stages split; S when the model is not pprun's (a stage is one unit) */
    int layers_known; /* the job's model says what each stage held (gpt, timed per=layer): cuts mean something */
    /* The ranks that ran each stage, whose spans its medians are of: rank[s]
     * in the first pipeline and, in a job of several (--dp D), the same
     * pipeline rank of each of the others, rank[s] + d * pipeline_ranks for
     * d < replicas (docs/cli.md, "Rank layout"; balance_stage_rank).
     * replicas <= 1: one pipeline, rank[s] alone. */
    int rank[BALANCE_MAX_STAGES];
    int replicas, pipeline_ranks;
    int bound[BALANCE_MAX_STAGES + 1];           /* stage s held layers [bound[s], bound[s+1]) */
    sched_costs stage[BALANCE_MAX_STAGES];       /* measured: medians of F, B, W (ns); comm: the job's send median */
    sched_costs per_layer;                       /* the middle stages' cost of one layer (all stages' when S < 3) */
    sched_costs first_adds, last_adds;           /* what stage 0 and stage S-1 cost beyond their layers, >= 0 */
} balance_profile;

/* Fits per_layer, first_adds and last_adds from stages, layers, bound and
 * stage (the caller fills those). With two stages the first adds nothing
 * (an embedding lookup is cheap next to a layer); without known layers no
 * stage adds anything. */
void balance_fit(balance_profile *p);

/* Splits the profile's layers into `chunks` chunks: the job's own bound
 * when chunks == stages, else as `pprun run` splits them (sched_partition's
 * even split) when the layers are known, else in equal fractions of the
 * model. bound gets chunks + 1 entries, in layers (fractions for a program);
 * -1 with err when the layers cannot be split that finely. */
int balance_split(const balance_profile *p, int chunks, double *bound, pp_err *err);

/* The costs of each chunk (out[chunks]) when the same layers are split at
 * bound[chunks + 1]: the layers' share of their stages' costs, plus the
 * first and last stage's additions on the first and last chunk; a BW's
 * (bw), where a stage measured one of its own (else 0: b + w), as its B
 * and W at each stage's BW against its B and W; comm and between the
 * first stage's. */
void balance_chunk_costs(const balance_profile *p, const double *bound, int chunks, sched_costs *out);

/* How many ranks ran stage k (the job's --dp, 1 for one pipeline), and the
 * d-th of them in rank order (d < balance_stage_ranks). */
int balance_stage_ranks(const balance_profile *p);
int balance_stage_rank(const balance_profile *p, int k, int d);

/* The mean of the stages' F + B + W, what a stage table's "vs mean" is
 * against. */
double balance_mean_stage(const balance_profile *p);
/* Whether a stage table (pprun stats, the dashboard) lists stage k: every
 * stage of up to BALANCE_LIST_ALL, else the BALANCE_LIST_SLOWEST slowest
 * (ties: the earlier stage). */
#define BALANCE_LIST_ALL 16
#define BALANCE_LIST_SLOWEST 4
int balance_listed(const balance_profile *p, int k);

/* One microbatch's F + B + W of the slowest chunk at these costs. */
double balance_bottleneck(const sched_costs *each, int chunks);

/* The whole-layer cuts (cuts[stages - 1], the first layer of stages 1..S-1)
 * that make the slowest stage's F + B + W least, by dynamic programming over
 * the profile. 0; -1 with err when the layers are not known, or too many to
 * search here. */
int balance_best_cuts(const balance_profile *p, int *cuts, pp_err *err);

#endif
