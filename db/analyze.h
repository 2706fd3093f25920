/* analyze.h: per-step analyses written by the collector: step_stats (span,
 * busy, bubble per rank) and gaps (each idle gap and its cause). The rules
 * are in docs/schema.md. Idempotent: re-running a step replaces its rows.
 * Only the step's latest attempt is analysed. */
#ifndef PP_DB_ANALYZE_H
#define PP_DB_ANALYZE_H
#include <stdint.h>

#include "db/db.h"

/* One transaction. A step without compute events gets no rows. */
int db_analyze_step(db *d, int64_t job_id, int step, pp_err *err);
/* Every step that has events. */
int db_analyze_job(db *d, int64_t job_id, pp_err *err);

#endif
