/* bounds.c: the ranges of values read back from a database (bounds.h). */
#include "db/bounds.h"

#include <stdio.h>

#include "base/shape.h"

const bounds_kind bounds_time = {"a time in ns", 0, (int64_t)1 << 62};
const bounds_kind bounds_rank = {"a rank", -1, 65535};
const bounds_kind bounds_stage = {"a stage", -1, PP_SHAPE_MAX_STAGES - 1};
const bounds_kind bounds_microbatch = {"a microbatch", -1, PP_SHAPE_MAX_MICROBATCHES - 1};
const bounds_kind bounds_bytes = {"a count of bytes", -1, (int64_t)1 << 50};
const bounds_kind bounds_id = {"a row id", 1, (int64_t)1 << 62};
const bounds_kind bounds_world = {"ranks in the job", 1, 65536};

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
