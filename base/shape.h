/* shape.h: the bounds of a pipeline's shape (ranks, stages, microbatches,
 * actions), the one definition of them. The CLI's schedules (sched/:
 * pprun schedule, pprun run's --schedule, csv:FILE) accept nothing past
 * them; a program's own schedule (pprun_trace_schedule, libpprun_trace) is
 * refused past them; and whoever reads a shape back from a database (db/,
 * report/) refuses one past them instead of allocating from it, since a
 * damaged or forged file may hold any number. Here in base/ because the
 * tracer library may include nothing else (scripts/check-layers.sh). */
#ifndef PP_BASE_SHAPE_H
#define PP_BASE_SHAPE_H
#include "base/pp.h"

#define PP_SHAPE_MAX_RANKS 1024          /* a pipeline's ranks: pprun schedule --pp P */
#define PP_SHAPE_MAX_VIRTUAL 64          /* chunks per rank: --virtual-stages */
#define PP_SHAPE_MAX_STAGES (PP_SHAPE_MAX_RANKS * PP_SHAPE_MAX_VIRTUAL) /* S = P x chunks */
#define PP_SHAPE_MAX_MICROBATCHES 100000 /* pprun schedule --microbatches */
#define PP_SHAPE_MAX_ACTIONS 10000000L   /* stages x microbatches x 3 ops (F, B, W) */
#define PP_SHAPE_MAX_ACTIONS_TEXT "10 million"
/* A schedule's grid (ranks x time steps, idle cells too: the CSV form,
 * the validator's): 4 cells an action of the largest schedule, for its
 * bubbles. A CSV's rows are as wide as their commas make them; a plan
 * pprun makes whose grid by time would be wider has its rows packed left
 * (its CSV reads back). */
#define PP_SHAPE_MAX_GRID_CELLS (4 * PP_SHAPE_MAX_ACTIONS)
#define PP_SHAPE_MAX_GRID_CELLS_TEXT "40 million"

/* The upper bounds alone, for a shape read back from a database: there a
 * count below 1 means the job has no pipeline shape (pprun launch), which
 * readers already take as nothing to show; a count past a bound is a file
 * pprun did not write as it is. 0, or -1 with err naming the value and
 * the bound. */
static inline int pp_shape_check_upper(long stages, long virtual_stages, long microbatches, pp_err *err) {
    if (stages > PP_SHAPE_MAX_STAGES)
        return pp_fail(err, "%ld stages: more than %d (%d ranks x %d chunks)", stages, PP_SHAPE_MAX_STAGES,
                       PP_SHAPE_MAX_RANKS, PP_SHAPE_MAX_VIRTUAL);
    if (virtual_stages > PP_SHAPE_MAX_VIRTUAL)
        return pp_fail(err, "%ld chunks per rank: more than %d", virtual_stages, PP_SHAPE_MAX_VIRTUAL);
    if (microbatches > PP_SHAPE_MAX_MICROBATCHES)
        return pp_fail(err, "%ld microbatches: more than %d", microbatches, PP_SHAPE_MAX_MICROBATCHES);
    if (stages > 0 && microbatches > 0 && stages * microbatches * 3 > PP_SHAPE_MAX_ACTIONS)
        return pp_fail(err, "%ld stages x %ld microbatches x 3 ops is over " PP_SHAPE_MAX_ACTIONS_TEXT " actions",
                       stages, microbatches);
    return 0;
}

/* Whether a schedule of `ranks` ranks, `stages` stages and `microbatches`
 * microbatches is within the bounds above (and ranks <= stages: every rank
 * runs a stage). 0, or -1 with err naming the value and the bound it
 * passes; the caller says whose shape it was. */
static inline int pp_shape_check(long ranks, long stages, long microbatches, pp_err *err) {
    if (ranks < 1 || ranks > PP_SHAPE_MAX_RANKS)
        return pp_fail(err, "%ld ranks: out of range; accepted: 1 to %d", ranks, PP_SHAPE_MAX_RANKS);
    if (stages < ranks || stages > PP_SHAPE_MAX_STAGES)
        return pp_fail(err, "%ld stages on %ld ranks: out of range; accepted: %ld (one a rank) to %d (%d ranks x %d "
                            "chunks)", stages, ranks, ranks, PP_SHAPE_MAX_STAGES, PP_SHAPE_MAX_RANKS,
                       PP_SHAPE_MAX_VIRTUAL);
    if (microbatches < 1 || microbatches > PP_SHAPE_MAX_MICROBATCHES)
        return pp_fail(err, "%ld microbatches: out of range; accepted: 1 to %d", microbatches,
                       PP_SHAPE_MAX_MICROBATCHES);
    return pp_shape_check_upper(stages, 1, microbatches, err);
}

#endif
