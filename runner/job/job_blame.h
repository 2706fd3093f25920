/* job_blame.h: which rank a failure of a `pprun run` job comes from, when
 * the rank that failed first only waited for another (the launcher's blame
 * hook, runner/launch/launch.h).
 *
 * A rank that is stopped, frozen or stuck fails nothing itself: the ranks
 * that wait for it time out, and the first of them to give up is the first
 * failure the launcher sees. Every rank says whom it waits for once a
 * receive has waited a while (runner/comm/comm.h, COMM_WAIT_KEY_FMT); from
 * the failed rank this follows who waited for whom to a rank that waits
 * for nobody, or that is stopped: that one is the root cause, and the
 * ranks that waited for it are named as how we know. */
#ifndef PP_JOB_BLAME_H
#define PP_JOB_BLAME_H
#include <stddef.h>

#include "runner/job/job.h"

/* The blame hook: the global rank failed_rank's failure comes from, with
 * one line in why; -1 when failed_rank was waiting for nobody (its own
 * failure) or the store cannot say. May wait a little more than
 * comm_wait_note_ms(--recv-timeout) for a rank to say whom it waits for. */
int job_blame(run_job *job, const launch_info *info, int failed_rank, char *why, size_t cap);

#endif
