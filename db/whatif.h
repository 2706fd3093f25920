/* whatif.h: "would another schedule do better on this job?" Takes a job's
 * own op costs, measured (the medians of its F, B, W and send spans over its
 * latest complete steps), plays every built-in schedule out with them for
 * the same ranks and microbatches in the simulator, and estimates each
 * one's activation memory from the bytes the job held per microbatch. One
 * reading serves `pprun stats` and GET /api/jobs/{id}/whatif. */
#ifndef PP_DB_WHATIF_H
#define PP_DB_WHATIF_H
#include <sqlite3.h>
#include <stdint.h>

#include "db/balance.h"
#include "db/summary.h"
#include "base/pp.h"
#include "sched/sched.h"

#define WHATIF_KINDS 6  /* gpipe, 1f1b, interleaved-1f1b, zb-h1, dualpipev, zb-v */
#define WHATIF_ROWS 8   /* the kinds, zb-v with its order tuned to the measured costs, a csv: job's own */
#define WHATIF_STEPS 20 /* ops are measured over at most the latest this many complete steps */

/* What a simulation starts from: the job's shape and its costs. */
typedef struct whatif_input {
    int ranks, microbatches, virtual_stages; /* the job's p, m, v */
    char schedule[512];                      /* the job's --schedule ("1f1b", "csv:FILE" ...) */
    /* How op costs follow a chunk's size. 0 (gpt): a rank's layers are its
     * work, so with v chunks per rank an op costs 1/v of a whole rank's
     * layers. 1 (timed, per=stage): every op costs what the model says,
     * whatever v (timed, per=layer: 0, its ops follow their layers). */
    int fixed_op_costs;
    /* How activation bytes follow a chunk's size, apart from op costs. 0
     * (gpt): a chunk holds its layers' share of a rank's bytes. 1 (timed,
     * per=stage or per=layer): a chunk holds the model's `act` bytes per
     * microbatch, whatever its layers. */
    int fixed_act_bytes;
    sched_costs costs; /* ns per op of one of the job's chunks; comm = a send, between = a rank's between ops */
    /* What `pprun run` orders a schedule's actions by (ZB-V's greedy order
     * depends on costs): the job's --schedule-costs, else f=b=w=1 for gpt
     * and the model's own costs for timed. NULL: the measured costs. */
    const sched_costs *build_costs;
    /* Each stage's own costs and the layers it held (balance.h), or NULL:
     * every chunk costs `costs` (scaled). With it a schedule plays each
     * chunk at its layers' share of the measured stage costs (the job's own
     * split at its own stage costs); ignored with fixed_op_costs. */
    const balance_profile *profile;
    /* The plan the job ran when its schedule is none of the built-in kinds
     * (csv:FILE), or NULL: it gets a row of its own, at the job's costs. */
    const sched_plan *own_plan;
    /* [ranks] each, may be NULL: the most activation bytes a rank held in a
     * step (<= 0: unknown) and the job's plan peak in flight on it. */
    const int64_t *act_peak_by_rank;
    const int64_t *inflight_by_rank;
    /* NULL, or for a job that recomputed (--recompute): what one microbatch
     * held on each of its stages after its F (stage[k].f: what F kept, its
     * checkpointed inputs) and after its B (stage[k].b: what it holds again
     * from its recompute on, until its W), stage[k].w what it holds at the
     * moment after its recompute, before B lets go of what only B reads
     * (more than .b where the attention probabilities outweigh what B
     * saves for W: docs/model.md), in bytes, as measured, with the
     * layers each stage held (balance.h: a chunk of another split holds
     * its layers' share, and the first and last chunk what the first and
     * last stage hold beyond their layers: tokens, the head). With it each
     * schedule's estimate replays its actions with these bytes
     * (sched_mem_peaks): k microbatches in flight hold k kept ones and one
     * or more at their B's size, not k at the B's size. Without it (no
     * recompute: a microbatch holds about the same from F to W) the peak
     * per microbatch-stage times the peak in flight, as before. */
    const balance_profile *act_profile;
    /* The job's --max-mem ("6", "25165824B"), or NULL: its zb-h1 or zb-v
     * order was built under it, so its own row is own_plan, not a kind's. */
    const char *max_mem;
    /* A job of several pipelines (--dp): each stage's gradient all-reduce
     * (ns, [stages] of the job's own schedule), or NULL. With it, the job's
     * own schedule's row also has its step with the all-reduces played
     * (sched_sim_dp_step) in dp_step_time_ns. */
    const double *allreduce_ns;
} whatif_input;

typedef struct whatif_row {
    char schedule[64];
    int virtual_stages;
    int this_job;           /* the job's own schedule and v */
    int tuned;              /* zb-v with its order built for the measured costs (--schedule-costs) */
    char error[256];        /* non-empty: not possible for this p and m, and why */
    double step_time_ns;    /* simulated */
    double bubble_ratio;    /* simulated: idle / (ranks * step time) */
    int peak_inflight;      /* most microbatch-stages held on a rank */
    int64_t act_peak_bytes; /* estimated most bytes held on a rank; -1 unknown */
    double dp_step_time_ns; /* with in->allreduce_ns, the job's own kind: the step with its all-reduces; else NAN */
} whatif_row;

/* Fills rows[WHATIF_ROWS] and returns how many: one per built-in schedule
 * at its default v (the job's v for the job's own kind), ordered as `pprun
 * run` would order it, then zb-v ordered for the measured costs, then the
 * job's own_plan when given. A schedule that cannot be built for these p
 * and m gets its error in its row; only bad input fails (-1, err). The
 * activation estimate keeps each rank's bytes per microbatch-stage as the
 * job measured them, scaled by the chunk's layers unless fixed_act_bytes,
 * or with act_profile replays each schedule with them. */
int whatif_simulate(const whatif_input *in, whatif_row rows[WHATIF_ROWS], pp_err *err);

/* The memory curve: zb-h1 and zb-v built under a bound (--max-mem) for
 * each bound from 1F1B's peak, p microbatch-stages of a 1F1B stage (a
 * rank's layers, or a timed stage), to twice it, one apart, simulated at the
 * job's costs as the rows above are. A zb-v chunk counts its share of a
 * 1F1B stage (half for gpt; all of it with fixed_act_bytes: timed, per=stage
 * or per=layer, whose chunks hold `act` bytes each). Columns: zb-h1 and zb-v ordered as `pprun run --max-mem`
 * would order them, and zb-v tuned to the measured costs. */
#define WHATIF_CURVE_MAX 33 /* p + 1 bounds: jobs of up to 32 ranks */
#define WHATIF_CURVE_COLS 3
typedef struct whatif_curve_cell {
    char error[96];         /* non-empty: not built or not simulated, and why */
    double step_time_ns, bubble_ratio;
    int peak_inflight;      /* most chunk microbatch-stages held on a rank */
    int64_t act_peak_bytes; /* estimated most bytes held on a rank, as the rows'; -1 unknown */
} whatif_curve_cell;
typedef struct whatif_curve_row {
    int bound;           /* microbatch-stages of a 1F1B stage per rank */
    int64_t bound_bytes; /* the bound in bytes on the rank whose microbatch-stage holds most; -1 unknown */
    whatif_curve_cell cell[WHATIF_CURVE_COLS]; /* zb-h1, zb-v, zb-v tuned */
} whatif_curve_row;

/* Fills rows[WHATIF_CURVE_MAX] and returns how many (p + 1), or 0 with
 * why_not (size bytes) saying why there is no curve (more than 32 ranks,
 * more work than a request may take). */
int whatif_curve(const whatif_input *in, whatif_curve_row *rows, char *why_not, size_t size);

/* The measured costs of one op of a chunk when each rank holds v chunks:
 * the job's scaled by job_v / v for gpt, the same for timed. What the tuned
 * zb-v row (v = 2) was built for, and so what `--schedule-costs` would take
 * to run it. */
sched_costs whatif_chunk_costs(const whatif_input *in, int v);

/* The tuned zb-v row's costs as `pprun run --schedule-costs` takes them
 * ("f=3.851ms,b=3.53ms,w=1.62ms,comm=0.066ms") into buf. */
void whatif_tuned_flag(const whatif_input *in, char *buf, size_t size);

/* 1 when the rows (nrows of them, whatif_simulate's) are worth running
 * the tuned zb-v for: its row was built and simulated a step shorter than
 * zb-v ordered as `pprun run` orders it; 0 when it could not be built
 * (zb-v needs twice as many layers as ranks, ...) or is no faster. What
 * `pprun stats` and the API recommend the flag on. */
int whatif_tuned_pays(const whatif_row *rows, int nrows);

/* A job of D pipelines (--dp): what D' pipelines of m' microbatches each
 * would do, from the job's own median step and the simulator with the
 * all-reduces as costed ops (whatif_dp). */
#define WHATIF_DP_ROWS 5 /* (D, m) the job's, (2D, m), (4D, m), (D, 2m), (2D, 2m) */
typedef struct whatif_dp_row {
    int dp, microbatches;
    double step_time_ns; /* NAN: the schedule could not be simulated at these m */
    double throughput;   /* microbatches a second against the job's: (D'm' / step') / (D m / step) */
} whatif_dp_row;

typedef struct whatif_report {
    int measured;              /* 0: no complete step with F, B and W yet (nothing below is set) */
    int gpu;                   /* costs from GPU spans (CUPTI) rather than host spans */
    int bw_split;              /* the job's backward was BW only: in.costs.b and .w are halves of its median */
    int64_t bw_ns;             /* that BW median (ns) */
    int first_step, last_step; /* the steps whose ops were measured */
    whatif_input in;
    sched_costs build; /* in.build_costs points here when the job's model is known */
    char model[256];   /* the job's canonical --model */
    char max_mem[32];  /* the job's --max-mem (config_json), "" none; in.max_mem points here when set */
    int recomputed;    /* the window has RECOMPUTE spans (--recompute) */
    balance_profile act_profile; /* in.act_profile points here when recomputed and every stage's bytes are known */
    int stages;        /* the job's stages (p * v) */
    int nrows;         /* rows filled */
    whatif_row rows[WHATIF_ROWS];
    int ncurve;        /* curve rows filled (whatif_curve); 0: no_curve says why */
    whatif_curve_row curve[WHATIF_CURVE_MAX];
    char no_curve[160];
    /* Stage balance, when every stage has F, B and W spans in the window
     * (has_profile; in.profile points at profile): */
    int has_profile;
    balance_profile profile;
    double bottleneck_ns;    /* the slowest stage's F + B + W */
    double own_step_ns;      /* the job's schedule simulated at its stages' own costs; NAN if not */
    double equal_step_ns;    /* the same with every stage at their mean; NAN if not */
    int ncuts;               /* > 0: cuts[] even the stages out better than the job's (layers known) */
    int cuts[BALANCE_MAX_STAGES - 1];
    double cuts_bottleneck_ns, cuts_step_ns; /* the slowest stage and the simulated step with cuts */
    char no_cuts[200];       /* why no cuts are suggested */
    /* > 0 when the job computed on the CPU (gpt, or a program: a PyTorch job) with more ranks on node
     * 0's host (every launcher's there, ranks.host) than it had cores: its op times include waiting for a core, so
     * they say less about the ops than about the OS's scheduler. The
     * medians are then taken of each op's time less the wait for a core it
     * recorded (events.wait_cpu_ns, at most its time): the schedules are
     * played with a core per rank. wait_cpu_share: the part of those ops'
     * time that was waiting (NAN when not shared). */
    int shared_ranks, shared_cores;
    double wait_cpu_share;
    /* --dp D > 1 and a built-in schedule: ndp rows (whatif_dp). A step at
     * (D', m') is the job's median step plus the simulated step at (D', m')
     * less at (D, m): the job's schedule at its costs and m' microbatches,
     * each stage's gradient all-reduce a costed op after its last W
     * (sched_sim_dp_step), costing what the job measured (allreduce_ns: the
     * stage's ALLREDUCE or REDUCE_SCATTER spans a step, mean over its ranks)
     * scaled by a ring's 2(D'-1)/D' over 2(D-1)/D on the same transport.
     * exposed_allreduce_ns: the ranks' mean wait_dp a step, as measured. */
    int dp, ndp;
    double exposed_allreduce_ns;
    double allreduce_ns[BALANCE_MAX_STAGES]; /* [stages]; NAN where the stage had no all-reduce span */
    whatif_dp_row dp_rows[WHATIF_DP_ROWS];
    /* > 1 when ranks of one node computed on one GPU (shared_gpu, "cuda:0"):
     * without MPS a GPU runs one process's kernels at a time, so their op
     * times include waiting for the others' (docs/gpu.md, "Measured");
     * shared_gpu_mps: they ran under the job's MPS daemon (config_json
     * "mps" is "on"), their kernels side by side. */
    int shared_gpu_ranks;
    char shared_gpu[24];
    int shared_gpu_mps;
} whatif_report;

/* Measures job s->job_id's op costs in db and simulates (s from
 * summary_read, without SUMMARY_OPS being needed; it must outlive r, which
 * points into it). 0 with r->measured = 0 when there is nothing to measure
 * yet; -1 with err on a database error. */
int whatif_read(sqlite3 *db, const job_summary *s, whatif_report *r, pp_err *err);
/* Only whether job `job`'s ranks shared cores or a GPU (r->shared_ranks,
 * shared_cores, shared_gpu_ranks, shared_gpu; the rest zero), as
 * whatif_read sets them, measuring and simulating nothing: all that
 * `pprun run`'s end-of-job lines show (report_brief), where whatif_read's
 * simulations cost the launcher more CPU than storing the job's trace
 * (bench_overhead, docs/design.md §6 "What tracing costs"). -1 with err on a
 * database error or no such job. */
int whatif_read_sharing(sqlite3 *db, int64_t job, whatif_report *r, pp_err *err);
/* The index of r's row for the job's own schedule that simulated, -1 when
 * there is none (or it could not be built). */
int whatif_own_row(const whatif_report *r);

/* Job js's plan as it ran (its plan table), played at another job's
 * costs `in` (its what-if's, whatif_read) as in's rows are played: what
 * `pprun stats --vs` predicts for a job whose order no row rebuilds, a
 * zb-h1 or zb-v built under its --max-mem (docs/cli.md, "Two jobs side by
 * side"). jw is js's what-if (its shape and schedule). row is named as
 * js's schedule at its chunks; its error says why it was not played (no
 * whole plan in the database, another shape). -1 with err on a database
 * error only. */
int whatif_play_job_plan(sqlite3 *db, const job_summary *js, const whatif_report *jw, const whatif_input *in,
                         whatif_row *row, pp_err *err);

/* A --max-mem as a job stored it (config_json: bytes as "8388608B", or a
 * count of microbatch-stages) as the user would type it: "8MiB", "5";
 * buf, or stored itself. */
const char *whatif_max_mem_text(const char *stored, char buf[24]);

/* The costs to order a new job's zb-v by (`pprun run --schedule-costs
 * DB[:JOB]`), read off job `job` in db as whatif_read measures them: for a
 * chunk of a job with `ranks` ranks of v chunks each, running `model` (a
 * canonical spec, which must be the measured job's). gpt costs scale with
 * the chunk's share of the layers, timed ones do not. `about` gets where
 * they came from ("job 3: medians of host spans, steps 10-29"). */
int whatif_costs_for(sqlite3 *db, int64_t job, const char *model, int ranks, int v, sched_costs *out, char *about,
                     size_t about_size, pp_err *err);

/* How a job split its layers over its stages and what each recomputes, as
 * jobs.config_json records them (runner/job/job_rows.c): pipeline_cuts
 * ("even", "2,4,6"), recompute ("none", "full", "selective") and
 * recompute_stages ("" for every stage, "1,2"). */
#define WHATIF_LAYOUT_TEXT 2064 /* the longest of them pprun writes: 257 numbers of up to 7 characters */
typedef struct whatif_layout {
    char cuts[WHATIF_LAYOUT_TEXT];
    char recompute[16];
    char recompute_stages[WHATIF_LAYOUT_TEXT];
} whatif_layout;

/* What one microbatch held on each stage of job `job` in db, as measured:
 * each F, B and W event carries what its rank held right after it, so an
 * F's rise over the rank's op before it is what its microbatch holds after
 * F, and a B's rise what B added (the recompute between them is not an F,
 * B or W: its moment is not counted, as step_stats.act_peak_bytes does
 * not). Medians over the steps whatif_read measures, into act[stages]
 * (bytes; `pprun run --max-mem 64MiB --schedule-costs DB[:JOB]`). The job
 * must have run `model` on `stages` stages, split as `layout` splits them
 * (the same layers on each stage) and recomputing what `layout` recomputes
 * on each (-1 naming both otherwise: bytes per stage do not carry over to
 * another split, nor to another --recompute), and recorded bytes (-1
 * otherwise). `about` as whatif_costs_for's. */
int whatif_act_for(sqlite3 *db, int64_t job, const char *model, int stages, const whatif_layout *layout,
                   sched_act *act, char *about, size_t about_size, pp_err *err);

#endif
