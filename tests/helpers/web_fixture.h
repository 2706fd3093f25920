/* web_fixture.h: synthetic trace databases for the web and query tests.
 *
 * fixture_create writes a database from db/schema.sql with one job: 4 ranks,
 * 1F1B, 8 microbatches, F = B = W = 1 ms (W right after its B), OPT 0.5 ms,
 * each SEND/RECV a thin mark, the step's gaps with their causes, step_stats,
 * losses and the plan, exactly as the collector would store them. Times are
 * exact: a step spans 30.5 ms (compute 30 ms, (p-1)(F+B) = 6 ms longer than
 * a rank's 24 ms of F/B/W, then OPT), each rank is busy 24.5 ms of it, so
 * every rank's bubble ratio is 6/30.5. Steps are 40 ms
 * apart; step s starts at t0 + 5 ms + s * 40 ms.
 *
 * fixture_append_steps adds steps to a job later (a running job), through
 * its own connection, the way the collector writes. */
#ifndef PP_TEST_WEB_FIXTURE_H
#define PP_TEST_WEB_FIXTURE_H
#include <stdint.h>

#include "base/pp.h"

#define FIXTURE_RANKS 4
#define FIXTURE_MB 8
#define FIXTURE_T0_NS 1000000000000ll     /* job start on the job clock */
#define FIXTURE_MS 1000000ll
#define FIXTURE_STEP_PERIOD_NS (40 * FIXTURE_MS)
#define FIXTURE_STEP_OFFSET_NS (5 * FIXTURE_MS)
#define FIXTURE_STEP_SPAN_NS (30 * FIXTURE_MS + FIXTURE_MS / 2)
/* Events per step: 4 ranks x (24 F/B/W + OPT) + SEND/RECV: 16 + 32 + 32 + 16. */
#define FIXTURE_EVENTS_PER_STEP (4 * 25 + 96)

/* Creates db_path (must not exist) with job 1 and `steps` steps; status is
 * "running", "succeeded" ... Returns 0 or -1. */
int fixture_create(const char *db_path, int steps, const char *status, pp_err *err);
/* Appends steps [first, first + n) to job 1; returns 0 or -1. */
int fixture_append_steps(const char *db_path, int first, int n, pp_err *err);
/* Appends step `step` as it is while it runs: its events and losses, no
 * step_stats or gaps yet. Returns 0 or -1. */
int fixture_append_running_step(const char *db_path, int step, pp_err *err);
/* Adds job 2, "fixture-1f1b-gpu" (device cuda): a copy of job 1's host
 * trace as it is now, plus what `--cupti on` stores for it. Each host op but
 * OPT gets a gpu span inside it: F/B/W [start + 50 us, end - 50 us] with two
 * kernels on stream 7 (400 us, a 50 us pause, then to the span's end),
 * SEND/RECV [start + 10 us, end - 10 us] with one ncclDevKernel_SendRecv on
 * stream 13 covering it; plus one adam_update_kernel per rank and step on
 * stream 7 inside OPT with no span (event_id NULL). Returns 0 or -1. */
int fixture_add_gpu_job(const char *db_path, pp_err *err);
#define FIXTURE_GPU_JOB 2
#define FIXTURE_GPU_SPANS_PER_STEP (4 * 24 + 96)
#define FIXTURE_KERNELS_PER_STEP (2 * 4 * 24 + 96 + 4)
/* Adds steps [first, first + n) to job 1 with step_stats and losses only,
 * no events (a long job's history), and sets the job's step count to
 * first + n. Returns 0 or -1. */
int fixture_add_history(const char *db_path, int first, int n, pp_err *err);
/* Gives job 1's host F/B/W the activation bytes the timed model would
 * hold after each (per_mb per microbatch between its F and its W), and its
 * step_stats the peak of them per (step, rank), as the analysis stores it:
 * 1F1B on 4 ranks peaks at 4, 3, 2, 1 microbatches. Steps without events
 * get 0. Returns 0 or -1. */
int fixture_add_activations(const char *db_path, int64_t per_mb, pp_err *err);
/* Gives job 1's host OPT spans the bytes of weights, gradients and
 * optimizer state the engine records: per_rank * (rank + 1). Returns 0 or -1. */
int fixture_add_state(const char *db_path, int64_t per_rank, pp_err *err);
/* Adds a copy of job 1's jobs row named "starting", running and without
 * any step, trace or plan (a job that has just begun). Returns 0 or -1. */
int fixture_add_starting_copy(const char *db_path, pp_err *err);
/* Job 1's plan without simulated times (simulated 0), as a gpt job's is
 * until its first steps are measured, or with them (1), as it is after.
 * Returns 0 or -1. */
int fixture_set_plan_simulated(const char *db_path, int simulated, pp_err *err);
/* Sets job 1's status (and ended_at / exit_code when not running). */
int fixture_set_status(const char *db_path, const char *status, pp_err *err);
/* Runs sql (statements separated by ';') on the file. Returns 0, or -1 with
 * err saying what SQLite said. */
int fixture_exec(const char *db_path, const char *sql, pp_err *err);
/* The expected loss of (step, microbatch). */
double fixture_loss(int step, int mb);
/* A fresh path under /tmp for a test database (removes leftovers). */
void fixture_tmp_path(char *out, size_t n, const char *tag);
/* fixture_tmp_path, then fixture_create there; the test fails naming the
 * error if it cannot be made. */
void fixture_fresh(char *out, size_t n, const char *tag, int steps, const char *status);
/* Removes a database file with its -wal and -shm (a reader that opened it
 * read-only leaves them behind). */
void fixture_remove(const char *db_path);
/* Reads the whole file into a malloc'd NUL-terminated string, or NULL. */
char *fixture_read_file(const char *path);

#endif
