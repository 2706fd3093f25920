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

/* Measured costs of a step, to re-simulate the plan with: the median
 * duration (ns) of F, B and W per stage, over the step's latest attempt,
 * into med[stage * 3 + phase] (phase TRACE_F/B/W) for stage < stages;
 * -1 where the step has no such op. */
int db_phase_medians(db *d, int64_t job_id, int step, int stages, int64_t *med, pp_err *err);

#endif
