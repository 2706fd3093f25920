/* run_progress.h: what `pprun run` shows while a job runs.
 *
 * The rank holding the last stage publishes each finished step in the job's
 * store ("run/progress": step, loss, step ms, tokens/s). A thread of the
 * launcher polls it and prints a progress bar on a terminal (step/steps,
 * loss, step time, tokens/s, ETA) or plain lines otherwise. */
#ifndef PP_RUN_PROGRESS_H
#define PP_RUN_PROGRESS_H
#include "base/pp.h"
#include "config/run_config.h"

typedef struct run_progress run_progress;

/* store_token: the job token (NULL = none), copied.
 * mode: --progress: auto (a bar on a terminal, lines otherwise), on, off (no
 * thread: *out NULL). first_step: the first step to show (a restarted
 * attempt resumes after its checkpoint). */
int run_progress_start(const char *store_addr, const char *store_token, int steps, int first_step,
                       run_progress_mode mode, run_progress **out, pp_err *err);
/* Shows what is left to show, stops and frees; NULL is fine. Call it
 * while the store is still up. Returns the next step it would have shown
 * (where the next attempt's display picks up). */
int run_progress_stop(run_progress *p);

#endif
