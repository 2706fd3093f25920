/* bounds.c: the ranges of values read back from a database (bounds.h). */
#include "db/bounds.h"

#include <stdio.h>

#include "base/shape.h"
#include "tracer/event.h"

const bounds_kind bounds_time = {"a time in ns", 0, (int64_t)1 << 62};
const bounds_kind bounds_rank = {"a rank", -1, 65535};
const bounds_kind bounds_stage = {"a stage", -1, PP_SHAPE_MAX_STAGES - 1};
const bounds_kind bounds_microbatch = {"a microbatch", -1, PP_SHAPE_MAX_MICROBATCHES - 1};
const bounds_kind bounds_bytes = {"a count of bytes", -1, (int64_t)TRACE_BYTES_MAX}; /* what a record may carry */
const bounds_kind bounds_id = {"a row id", 1, (int64_t)1 << 62};
const bounds_kind bounds_count = {"a count of records", 0, BOUNDS_COUNT_HI};
const bounds_kind bounds_world = {"ranks in the job", 1, 65536};
const bounds_kind bounds_node = {"a node", 0, 65535};
const bounds_kind bounds_step = {"a step", 0, INT32_MAX};

int bounds_fail(pp_err *err, const bounds_kind *k, int64_t job, const char *column, sqlite3_stmt *st, int col,
                int64_t v) {
    char shown[48];
    const unsigned char *text = st ? sqlite3_column_text(st, col) : NULL;
    if (text) snprintf(shown, sizeof shown, "%s", (const char *)text);
    else snprintf(shown, sizeof shown, "%lld", (long long)v);
    return pp_fail(err, "job %lld: %s holds %s, not %lld..%lld (%s): the database is damaged or was not written by "
                        "pprun",
                   (long long)job, column, shown, (long long)k->lo, (long long)k->hi, k->what);
}

int bounds_sum(const bounds_kind *k, int64_t *sum, int64_t v, int64_t job, const char *column, pp_err *err) {
    int64_t t;
    if (!__builtin_add_overflow(*sum, v, &t) && bounds_ok(k, t)) {
        *sum = t;
        return 0;
    }
    return pp_fail(err,
                   "job %lld: %s summed over its rows passes %lld..%lld (%s): the database is damaged or was not "
                   "written by pprun",
                   (long long)job, column, (long long)k->lo, (long long)k->hi, k->what);
}

int bounds_event_row(sqlite3_stmt *st, const bounds_event_cols *cols, int64_t job, pp_err *err) {
    enum { START = 4, END = 5 }; /* their places in checks[] */
    const struct {
        int col;
        const bounds_kind *kind;
        const char *name;
    } checks[] = {
        {cols->rank, &bounds_rank, "events.rank"},
        {cols->step, &bounds_step, "events.step"},
        {cols->stage, &bounds_stage, "events.stage"},
        {cols->microbatch, &bounds_microbatch, "events.microbatch"},
        {cols->start, &bounds_time, "events.start_ns"},
        {cols->end, &bounds_time, "events.end_ns"},
        {cols->peer, &bounds_rank, "events.peer"},
        {cols->bytes, &bounds_bytes, "events.bytes"},
    };
    int64_t v[sizeof checks / sizeof checks[0]];
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].col >= 0 && bounds_col(st, checks[i].col, checks[i].kind, job, checks[i].name, &v[i], err) != 0)
            return -1;
    /* the tracer takes no record that ends before it starts (trace_record_why) */
    if (cols->start >= 0 && cols->end >= 0 && v[END] < v[START])
        return pp_fail(err, "job %lld: an events row ends (end_ns %lld) before it starts (start_ns %lld): the "
                            "database is damaged or was not written by pprun",
                       (long long)job, (long long)v[END], (long long)v[START]);
    return 0;
}
