/* critpath.h: the critical path of a step, the chain of ops the step's end
 * waited on. Walking back from the compute op that ended last, each op's
 * predecessor is whichever of its two dependencies released it later: the
 * rank's previous op, or the op of another rank whose output it took (the F
 * of the previous stage for an F, the backward of the next stage for a
 * backward, same microbatch; a backward is a B, or a BW: PyTorch's full
 * backward, B and W in one op). The time between the two is a hand-off (the output crossing
 * to the other rank) or time on the rank between its ops (split into its
 * sends and receives and the rest). The path's ops and those waits add up
 * to the step's span exactly, so "rank 3's B is 40% of the path" means a B
 * of rank 3 twice as fast would shorten the step by up to 20%; an op off
 * the path shortens it by nothing. The rules are in docs/schema.md. One
 * reading serves `pprun stats` and GET /api/jobs/{id}/critpath. */
#ifndef PP_DB_CRITPATH_H
#define PP_DB_CRITPATH_H
#include <sqlite3.h>
#include <stdint.h>

#include "db/analyze.h"
#include "db/durations.h"
#include "db/summary.h" /* SQL_COMPLETE_STEPS */
#include "base/pp.h"

#define CRITPATH_STEPS 20 /* the report reads at most the latest this many complete steps, as whatif.h */

/* How the path came to an op from the one before it on the path. */
typedef enum critpath_via {
    CRITPATH_FIRST, /* the path's first op: nothing before it in the step */
    CRITPATH_RANK,  /* the rank's previous op */
    CRITPATH_DATA,  /* the op of another rank whose output it took */
    CRITPATH_DP     /* an OPT's: another replica's backward of its stage, which the all-reduce waited for */
} critpath_via;
extern const char *const critpath_via_names[4]; /* "first", "rank", "data", "dp" */

typedef struct critpath_op {
    analyze_op op;        /* the host span, as stored */
    int via;              /* critpath_via */
    int64_t lead_ns;      /* on the path before the op: from the previous path op's end (the step's start for
                           * the first) to this op's start */
    int64_t lead_comm_ns; /* via CRITPATH_RANK: the part of lead_ns inside the rank's own SEND/RECV spans */
    int64_t lead_dp_ns;   /* via CRITPATH_RANK, an OPT: the part inside its rank's all-reduce spans (ANALYZE_DP:
                           * waiting for its gradient's all-reduce after its own last backward; not in
                           * lead_comm_ns where a send overlaps it); 0 for any other op */
    int64_t path_ns;      /* the op's own time on the path: its span, cut at the next path op's start where
                           * the two overlap (clocks of two nodes) */
} critpath_op;

typedef struct critpath_path {
    int64_t start_ns, end_ns; /* the step's span: first compute op start to last compute op end */
    critpath_op *ops;         /* in time order, owned */
    size_t n;                 /* 0: the step has no compute op */
} critpath_path;

/* The path through spans[0..n) (one step's host spans, compute and
 * communication, any order). 0, or -1 with err when out of memory. Free out
 * with critpath_free, after either result. */
int critpath_build(const analyze_op *spans, size_t n, critpath_path *out, pp_err *err);
/* The path of step `step` of job `job` (its latest attempt). */
int critpath_step(sqlite3 *db, int64_t job, int step, critpath_path *out, pp_err *err);
void critpath_free(critpath_path *p);

/* The hand-offs of one step (spans[0..n), as critpath_build reads them)
 * whose op waited for its input: an F or a backward whose input came from
 * another rank's op that ended after the op's own rank had ended its
 * previous op. Each pushes its start less that producer's end into out:
 * the time the output took to cross to it, what the simulator calls a
 * send (comm, docs/schedules.md). An op that did not wait for its input
 * (its rank held it up, or its input came from no other rank) says
 * nothing of that time: where it and the rank's previous op are ops the
 * simulator plays (F, B, W, BW; a recompute starts its B), it pushes its
 * start less that op's end into `between` instead, the rank's own time
 * between two ops whose next one's input was there (sched_costs.between);
 * between may be NULL. An op that started before its rank's previous op
 * ended (an overlapped pair's second half) pushes nothing: the simulator
 * starts both halves together. less_core_waits (ranks that shared cores): each
 * less what its rank waited for a core in it, by the wait_cpu of its
 * sends and receives that end in it. 0, or -1 with err when out of
 * memory. */
int critpath_handoffs(const analyze_op *spans, size_t n, int less_core_waits, durations *out, durations *between,
                      pp_err *err);
/* critpath_handoffs of step `step` of job `job` (its latest attempt), over
 * its spans of source "cpu" (host) or "gpu" (analyze_load_step). */
int critpath_step_handoffs(sqlite3 *db, int64_t job, int step, const char *source, int less_core_waits,
                           durations *out, durations *between, pp_err *err);

/* The path's time between ops, in the order every table lists it. */
typedef enum critpath_wait {
    CRITPATH_HANDOFF, /* via CRITPATH_DATA: outputs crossing to another rank */
    CRITPATH_COMM,    /* via CRITPATH_RANK, inside the rank's sends and receives */
    CRITPATH_OTHER,   /* via CRITPATH_RANK outside them, before the first op, and ops of unknown ranks */
    CRITPATH_ALLREDUCE, /* via CRITPATH_DP: the data-parallel all-reduce between a replica's backward and an OPT */
    CRITPATH_WAITS
} critpath_wait;
/* "handoff_ns", "comm_ns", "other_ns": their keys in the API's JSON. */
extern const char *const critpath_wait_keys[CRITPATH_WAITS];

/* Where paths' time went, summed over steps. */
typedef struct critpath_totals {
    int ranks;
    int64_t span_ns;                 /* the steps' spans; the sum of everything below */
    int64_t (*op_ns)[5];             /* [ranks] owned: F, B, W, OPT, BW time on the path (BW last:
                                      * PyTorch's full backward, added after the first four) */
    int64_t wait_ns[CRITPATH_WAITS]; /* critpath_wait */
} critpath_totals;

/* A rank's F + B + W + OPT + BW time on the path. */
int64_t critpath_rank_ns(const critpath_totals *t, int rank);
/* Whether a table of t (pprun stats, the dashboard) lists rank k: every
 * rank with time on the path while there are at most CRITPATH_LIST_ALL of
 * them, else the CRITPATH_LIST_MOST with the most (ties: the lower rank). */
#define CRITPATH_LIST_ALL 16
#define CRITPATH_LIST_MOST 8
int critpath_listed(const critpath_totals *t, int k);
/* Adds p to t (t->ranks wide; ops of other ranks count in CRITPATH_OTHER). */
void critpath_add(critpath_totals *t, const critpath_path *p);

typedef struct critpath_report {
    int steps;                 /* 0: no complete step yet (nothing below is set) */
    int first_step, last_step; /* the steps read: the latest CRITPATH_STEPS complete ones after the
                                * job's first (that one only when it is the only one) */
    critpath_totals t;
} critpath_report;

/* An amount of r's totals (one of r->t's ns) per step read, and rank k's
 * ops on the path per step: NAN without steps or for a rank r lacks. */
double critpath_per_step(const critpath_report *r, int64_t ns);
double critpath_rank_per_step(const critpath_report *r, int k);
/* Two jobs side by side (pprun stats --vs, /compare): the ranks either has
 * time on its path, in rank order, into on[] (room for the wider job's
 * ranks); returns their count. A table gives each its own row while there
 * are at most CRITPATH_LIST_ALL, else one row with their sum. */
int critpath_ranks_on_either(const critpath_report *a, const critpath_report *b, int *on);

/* Reads job `job`'s paths (`ranks` wide: jobs.world_size). 0, or -1 with
 * err on a database error; free r with critpath_report_free after either. */
int critpath_read(sqlite3 *db, int64_t job, int ranks, critpath_report *r, pp_err *err);
void critpath_report_free(critpath_report *r);

#endif
