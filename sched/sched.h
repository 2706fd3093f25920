/* sched.h: pipeline schedules as per-rank action lists (docs/design.md §4).
 *
 * A schedule says, for every rank, which actions it runs and in which order:
 * `{stage}{F|B|W}{mb}` (0F3 = stage 0, forward, microbatch 3). B is the
 * gradient with respect to the stage's input, W the weight gradient, BW
 * both in one op (`0BW3`: PyTorch's full backward, which schedules that do
 * not split the backward run); a BW counts as its (stage, mb)'s B and W,
 * and its input gradient leaves at its end.
 * Generators, the CSV reader, the validator and the simulator all work on
 * sched_plan; the engine executes plan->actions[rank] in order.
 *
 * CONTRACT: the engine (runner/worker/engine.c) relies on the fields and functions
 * below; extend, do not change them. */
#ifndef PP_SCHED_H
#define PP_SCHED_H
#include <stdint.h>

#include "base/pp.h"
#include "base/shape.h" /* the bounds of a shape every schedule keeps to */

typedef enum sched_op { SCHED_F = 0, SCHED_B = 1, SCHED_W = 2, SCHED_BW = 3 } sched_op;

typedef struct sched_action {
    int stage;  /* 0 .. stages-1 */
    int op;     /* sched_op */
    int mb;     /* 0 .. microbatches-1 */
} sched_action;

/* A BW costs b + w, or bw where that is set: a stage that runs BW only
 * can give its measured BW as b (0 as w); one that runs both, as
 * PyTorch's DualPipeV does, gives its split B and W as b and w and its
 * fused backward as bw (PyTorch's split costs more than its fused one). */
typedef struct sched_costs {
    double f, b, w, comm; /* time units of one F, B, W of one stage, and of one send */
    /* Additions, 0 in every plan that does not set them. bw: one BW, when
     * not b + w. between: a rank's own time between two of its ops, spent
     * even when the next op's input is there (issuing its sends and
     * receives, a program's own code between ops: docs/schedules.md, "What
     * if"); not before a rank's first op. */
    double bw, between;
} sched_costs;

/* What a BW costs at c: its bw where set, else its B and its W. */
static inline double sched_bw_cost(const sched_costs *c) { return c->bw > 0 ? c->bw : c->b + c->w; }

typedef struct sched_plan {
    char name[64];        /* "1f1b", "zb-v", "csv:FILE" ... */
    int ranks;            /* p */
    int stages;           /* S = p * v */
    int virtual_stages;   /* v: chunks per rank */
    int microbatches;     /* m */
    int *stage_rank;      /* [stages]: the rank that owns each stage */
    int *len;             /* [ranks]: actions per rank */
    sched_action **actions; /* [ranks][len[r]]: execution order, no idle cells */
    /* The grid as written (generators or CSV), with idle cells, for display and
     * CSV export: slots[r][i] for i < nslots; an idle cell has stage == -1.
     * The non-idle cells of row r, in order, are exactly actions[r]. */
    int nslots;
    sched_action **slots;
    /* Addition: 1 for a forward-only plan (an evaluation step's,
     * sched_forward_only): F actions only, and the validator requires no B
     * and no W. 0 for every training plan. */
    int forward_only;
    /* Overlapped pairs (PyTorch's OVERLAP_F_B), NULL in a plan that has
     * none. overlap[r][i] = 1 (for i < len[r]) when actions[r][i]
     * and actions[r][i+1] run at the same time: the pair's F, then its B or
     * BW, of another stage of the rank (the validator's rule). A pair stays
     * two actions of the list and two cells of the grid, so whoever reads
     * the lists as F, B, W and BW still can; sched_overlaps asks. */
    unsigned char **overlap;
} sched_plan;

/* 1 when actions[r][i] is the first half (the F) of an overlapped pair,
 * actions[r][i+1] its second. */
static inline int sched_overlaps(const sched_plan *plan, int r, int i) {
    return plan->overlap && plan->overlap[r][i];
}

/* Builds a named schedule: "gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
 * "zb-v", "dualpipev". p ranks, m microbatches, v chunks per rank (1 for
 * all but interleaved-1f1b, zb-v and dualpipev; the last two need 2).
 * costs guide greedy schedules (zb-v) and may be NULL (f=b=w=1, comm=0).
 * Impossible requests fail with a message that names the constraint and
 * the values. */
int sched_build(const char *kind, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err);

/* Reads a schedule CSV (our notation or PyTorch's, detected): a regular
 * file of at most 64 MiB (file_input_read). */
int sched_load_csv(const char *path, sched_plan **out, pp_err *err);

/* Checks every rule of docs/design.md §4; a rejection names the rule, the rank and
 * the action, and (in err) prints the grid with the offending cell marked. */
int sched_validate(const sched_plan *plan, pp_err *err);

/* Simulated timeline of one step from costs: each action starts when its rank
 * is free and its input has arrived (comm after the producing action). */
typedef struct sched_span {
    sched_action action;
    double start, end;
} sched_span;

typedef struct sched_sim {
    int ranks;
    double step_time;     /* last end over all ranks (all ranks start at 0) */
    double bubble_ratio;  /* idle time / (ranks * step_time) */
    int *nspans;          /* [ranks] */
    sched_span **spans;   /* [ranks][nspans[r]] in execution order */
    int *peak_inflight;   /* [ranks]: peak microbatches whose activations are held */
    double *busy;         /* [ranks]: time running ops (an overlapped pair's union of spans) */
} sched_sim;

int sched_simulate(const sched_plan *plan, const sched_costs *costs, sched_sim **out, pp_err *err);
/* The same with costs of their own per stage: stage_costs[plan->stages],
 * stage s's F, B and W, and its comm the cost of each send out of stage s
 * (pipelines whose stages differ: a slow last stage, uneven cuts). */
int sched_simulate_stages(const sched_plan *plan, const sched_costs *stage_costs, sched_sim **out, pp_err *err);
void sched_sim_free(sched_sim *sim);
/* The step of plan as sim played it, with data parallelism: each stage's
 * gradient all-reduce (allreduce[s], in the costs' units; allreduce has
 * plan->stages entries) starts once the stage's last backward (W, or BW)
 * has ended and the rank's previous all-reduce is done, beside the rank's
 * later ops: one thread a rank takes its stages in the order their last
 * backward ended (docs/cli.md, "Data parallel"). The step ends when every
 * rank's ops and all-reduces have. A stage without a backward (a
 * forward-only plan) reduces nothing. -1 when out of memory. */
double sched_sim_dp_step(const sched_plan *plan, const sched_sim *sim, const double *allreduce);

/* A 64-bit digest of what a plan runs: its shape, stage placement, every
 * rank's actions and overlapped pairs (not its name or idle cells). Two
 * reads of one csv:FILE give the same digest unless the file changed. */
uint64_t sched_digest(const sched_plan *plan);

/* Releases a plan from sched_build or sched_load_csv. NULL is fine. */
void sched_free(sched_plan *plan);

/* Writes "0F3" style text for an action into buf (size >= 16). */
const char *sched_action_str(const sched_action *a, char *buf);
/* The same text into buf (room for 32) uncut, without printf (a big grid
 * formats millions); returns its length. */
size_t sched_action_fmt(const sched_action *a, char *buf);

/* ---- additions (schedules module) ------------------------------------- */

/* Notes on the fields above, as implemented (docs/schedules.md):
 * - sched_sim.peak_inflight counts (stage, microbatch) units, one per stage
 *   chunk, held from F to the end of W (or of BW); 1F1B's rank 0 holds p, GPipe's m,
 *   ZB-V's at most 2p (= p microbatches of a whole rank's layers).
 * - sched_simulate: a send costs comm only between different ranks; all
 *   ranks start at 0; the step's idle includes a rank's late start. An
 *   action starts when its input is there and `between` after its rank's
 *   previous op (or pair) ended.
 * - An overlapped pair: each half starts when the rank is free and its own
 *   input is there, the two run side by side at their own costs (no slowdown
 *   modelled: two cores, or a timed model's sleeps), and the rank is free
 *   again when both ended. Its busy time is the union of the two spans.
 * - A plan from sched_build or sched_load_csv may still break the rules:
 *   run sched_validate (sched_from_flag does) before executing it. */

/* Placement of stage s over p ranks: loop (s mod p) or V (zb-v: s < p ? s :
 * 2p-1-s). */
typedef enum sched_placement { SCHED_PLACE_LOOP = 0, SCHED_PLACE_V = 1 } sched_placement;
int sched_place(sched_placement how, int stage, int p);

/* Splits `layers` layers over `stages` stages: stage s holds layers
 * [first[s], first[s+1]); first must hold stages+1 ints (first[stages] =
 * layers). cuts == NULL: even split, the remainder going to the later stages
 * (as NxD's auto partition). Otherwise cuts[0..ncuts-1] are the first layer
 * of stages 1..stages-1 (ncuts == stages-1, strictly increasing, in
 * [1, layers-1]). Errors name the constraint and the values. */
int sched_partition(int layers, int stages, const int *cuts, int ncuts, int *first, pp_err *err);
/* Parses "--pipeline-cuts 3,6,9" into a malloc'd array (caller frees);
 * "even" is no cuts (*cuts NULL, *ncuts 0): the even split. */
int sched_parse_cuts(const char *text, int **cuts, int *ncuts, pp_err *err);
/* The inverse: "3,6,9" into buf ("even" for no cuts), cut short when buf
 * is full (a cut of up to 5 digits takes at most 6 bytes); returns buf. */
const char *sched_cuts_text(const int *cuts, int ncuts, char *buf, size_t size);

/* Parses one action in our notation ("0F3"; op F, B, W or BW). */
int sched_action_parse(const char *s, sched_action *out, pp_err *err);

/* Builds a plan from per-rank action lists (copied; the caller keeps
 * lists). stage_rank[stages] is copied too. The display grid is the order
 * of the actions' start times in a simulation with f=b=w=1, comm=0 (idle
 * cells where a rank waits); when that simulation cannot run (a deadlocked
 * list) the grid is the lists packed left. Caller frees with sched_free. */
int sched_plan_from_lists(const char *name, int p, int stages, int v, int m, const int *stage_rank,
                          sched_action *const *lists, const int *lens, sched_plan **out, pp_err *err);

/* The grid as text, one row per rank ("rank 0 | 0F0  0F1  .    ..."; the
 * second half of an overlapped pair written "&7BW0", after its F),
 * with cell marks[r] of row r (a slot index, -1 for none; marks may be
 * NULL) written as [0F3]. max_cols > 0 shows only a window of that many
 * slots around the first mark (and max_rows rows around it); 0 = all.
 * Returns a malloc'd string (caller frees) or NULL when out of memory. */
char *sched_grid_text(const sched_plan *plan, const int *marks, int max_cols, int max_rows);

/* CSV export: one row per rank, one action per cell, empty cell = idle.
 * notation "pprun" writes F/B/W/BW; "pytorch" writes F/I/W/B (PyTorch's
 * newer notation, I = input gradient, B = full backward). An overlapped
 * pair is one cell in either, PyTorch's "(0F4;7B0)OVERLAP_F_B" (BW in
 * ours). The file appears whole or not at all, and only where nothing
 * but a regular file was (file_output_begin). */
int sched_write_csv(const sched_plan *plan, const char *path, const char *notation, pp_err *err);
/* Reads a CSV from memory (sched_load_csv reads a file and calls this);
 * `what` names the source in messages. */
int sched_parse_csv(const char *text, size_t len, const char *what, sched_plan **out, pp_err *err);

/* The simulated timeline as text, one row per rank, one character per
 * `unit` time units: F, B, W, X (a BW), '.' idle (a cell shows the action
 * running at its middle). A rank with overlapped pairs gets a second line
 * under its row, the pairs' second halves (blank where none runs): two
 * lanes. unit <= 0 picks one (1 for integer costs; at most ~160 columns).
 * Returns a malloc'd string (caller frees); *unit_out gets the unit used. */
char *sched_timeline_text(const sched_sim *sim, const sched_plan *plan, double unit, double *unit_out);

/* The chunks per rank (--virtual-stages) a generator runs unless told:
 * 2 for interleaved-1f1b, zb-v and dualpipev, else 1. */
int sched_default_virtual(const char *kind);
/* 0 when kind names a schedule sched_build makes, else -1 with err saying
 * which are (csv:FILE too, which its callers read themselves). */
int sched_kind_check(const char *kind, pp_err *err);

/* The --schedule flag as a user wrote it: a generator name or csv:FILE.
 * v <= 0 picks the default (sched_default_virtual). For csv:FILE, p and m (when > 0) must match the file's ranks
 * (rows) and microbatches. The plan is validated too: on success it is safe to run.
 * Caller frees with sched_free. */
int sched_from_flag(const char *spec, int p, int m, int v, const sched_costs *costs, sched_plan **out, pp_err *err);
/* sched_from_flag's csv:FILE for a file already read (sched_load_csv), so
 * that a caller that needs the file's shape first reads it only once:
 * plan is taken over, *out on success and freed on failure. */
int sched_from_csv(const char *file, sched_plan *plan, int p, int m, sched_plan **out, pp_err *err);

/* A forward-only plan for an evaluation step (docs/schedules.md,
 * "Evaluation steps"): the stages and placement of `train`, m microbatches,
 * each rank running the F of its stages in wavefront order ((stage +
 * microbatch), then stage: every F's input comes from an F earlier in that
 * order, so no rank waits on one that waits for it). Validated; caller frees
 * with sched_free. */
int sched_forward_only(const sched_plan *train, int m, sched_plan **out, pp_err *err);

/* 1 when some rank of the plan has an overlapped pair (sched_overlaps):
 * its engine runs two ops at a time. */
int sched_has_overlap(const sched_plan *plan);

/* Parses costs as a user writes them, "f=1,b=2,w=1,comm=0" (`what` names the
 * flag in errors): plain numbers are time units, durations with a unit
 * (3.85ms, 66us) are ns; one list uses one or the other. Keys not given
 * keep *out's values; on an error *out is unchanged. */
int sched_parse_costs(const char *text, const char *what, sched_costs *out, pp_err *err);
/* The same with one more key, `allreduce`: each stage's gradient all-reduce
 * under data parallelism (sched_sim_dp_step), in the list's units, into
 * *allreduce (kept when not given; unchanged on an error); and *in_ns (when
 * not NULL) says which units: 1 for durations (ns), 0 for time units. */
int sched_parse_costs_dp(const char *text, const char *what, sched_costs *out, double *allreduce, int *in_ns,
                         pp_err *err);
/* c as sched_parse_costs reads it back exactly ("f=..,b=..,w=..,comm=..",
 * then bw and between where set), into buf (256 bytes hold any). */
void sched_costs_text(const sched_costs *c, char *buf, size_t size);

/* ---- memory-bounded zero bubble (sched_mem.c, sched_greedy.c) ---------------
 *
 * docs/schedules.md, "Memory-bounded zero bubble". What a rank holds counts
 * per (stage, microbatch), from the end of its F to the end of its W (or
 * BW), as sched_sim.peak_inflight and step_stats.act_peak_bytes do: `f`
 * after the F, `b` after the B (B may free some, or save more for W).
 * Microbatch-stages are {1, 1}; bytes are a model's (config/model_act.h) or a
 * job's measured ones. `mid`, where known (0: not), is the most it holds
 * part-way through its B (after any recompute), which a rank's count can
 * show only beside an overlapped pair's F (sched_mem_peaks). */
typedef struct sched_act {
    double f, b, mid;
} sched_act;

/* 1 when both of a's numbers are numbers and none is negative: what every
 * table of bytes must hold, wherever it comes from. */
int sched_act_valid(sched_act a);

/* A bound on what each rank holds at once, after any of its F, B and W. */
typedef struct sched_mem {
    double max;           /* the most a rank may hold, in act's unit; <= 0: no bound */
    const sched_act *act; /* NULL: {1, 1} for every stage (microbatch-stages) */
    int nact;             /* entries in act: 1 (every stage the same) or the plan's stages */
    int bytes;            /* 1: max and act are bytes (for messages); 0: microbatch-stages */
    /* NULL, or one entry per act entry (nact): the most a microbatch holds
     * on the stage during its B, before B lets go of what only B reads.
     * Under --recompute that is the moment after its recompute (docs/model.md,
     * "Activation recompute"), above b where the attention probabilities
     * outweigh what B saves for W. sched_mem_peaks (and so the validator)
     * counts it at the B (or BW), and at the second half of an overlapped
     * pair (dualpipev) with the first half's midway moment beside it: the
     * what-if's replay of a measured job, db/whatif.c. The greedy and the least bound do not read it, and
     * nothing builds an order with it: a bound in bytes leaves that moment
     * out (docs/schedules.md, "Memory-bounded zero bubble"). */
    const double *high;
} sched_mem;

/* What stage s of a plan holds per microbatch under mem ({1, 1} without act). */
sched_act sched_mem_act(const sched_mem *mem, int stage);

/* The least bound an order of `kind` (zb-h1: one stage per rank; zb-v: two
 * in a V) can run in for p ranks: one microbatch at a time through a rank's
 * stages, room for its F and its B's growth on each (for zb-v, the second
 * chunk's F and B on top of the first's); *rank gets the rank that needs it.
 * 1 microbatch-stage for zb-h1, 2 for zb-v. -1 for another kind or a bad
 * act table (err). */
int sched_mem_least(const char *kind, int p, const sched_mem *mem, double *least, int *rank, pp_err *err);

/* Builds zb-h1 or zb-v with no rank ever holding more than mem->max
 * (mem NULL or max <= 0: sched_build). Each is the zero-bubble greedy
 * (sched_greedy.c) under the bound, plain and waiting for a sooner action,
 * and, when it fits, the unbounded order; the shortest simulated step at
 * costs wins. A bound below sched_mem_least is refused naming the least;
 * any other kind is refused (its order sets its memory). */
int sched_build_bounded(const char *kind, int p, int m, int v, const sched_costs *costs, const sched_mem *mem,
                        sched_plan **out, pp_err *err);

/* Each rank's most held at once, peak[ranks], playing its actions in order
 * (time does not matter: a rank's own ops set its count; with mem->high a
 * B's moment counts too); at[ranks] (may be
 * NULL) the index in actions[r] where the peak is first reached. -1 when
 * an action is outside the plan (err). */
int sched_mem_peaks(const sched_plan *plan, const sched_mem *mem, double *peak, int *at, pp_err *err);

/* sched_validate, then one more rule: no rank holds more than mem->max
 * after any action (named with the rank, the action, what it holds and
 * the bound; the grid marked). mem NULL or max <= 0: sched_validate. */
int sched_validate_mem(const sched_plan *plan, const sched_mem *mem, pp_err *err);

/* sched_from_flag under a bound: zb-h1's and zb-v's order built within it
 * (sched_build_bounded), every other schedule's (a CSV's, 1F1B's ...)
 * checked against it (sched_validate_mem). */
int sched_from_flag_mem(const char *spec, int p, int m, int v, const sched_costs *costs, const sched_mem *mem,
                        sched_plan **out, pp_err *err);

/* --max-mem as a user writes it: a whole number is microbatch-stages per
 * rank (*bytes = 0), a size with a unit ("64MiB", "1.5GiB", "4096B":
 * pp_parse_size) bytes (*bytes = 1). */
int sched_parse_max_mem(const char *text, const char *what, double *max, int *bytes, pp_err *err);

/* --act-bytes: what a (stage, microbatch) holds, "F" or "F:B" (sizes,
 * pp_parse_size) for every stage, or a comma list of those, one per stage,
 * an entry followed by "*N" standing for N stages alike. *out is malloc'd
 * (caller frees), *n entries. */
int sched_parse_act(const char *text, const char *what, sched_act **out, int *n, pp_err *err);
/* The inverse, in whole bytes, runs written with *N ("2695424B:2760960B,
 * 2695168B:2695168B*2,3025152B:3090688B"); -1 when buf is too small. */
int sched_act_text(const sched_act *act, int n, char *buf, size_t size);

/* An amount in mem's unit as text for people: "6 microbatch-stages",
 * "24.0 MiB" (bytes: B, KiB, MiB or GiB with 1 decimal, exact below 1 KiB). */
const char *sched_mem_text(const sched_mem *mem, double value, char *buf, size_t size);

#endif
