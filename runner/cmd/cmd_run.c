/* cmd_run.c: `pprun run`: a pipeline training job on this node (docs/design.md §1, §3).
 *
 * The launcher side of a job: parses and checks the job's options (bad input
 * exits 2 before anything starts), writes the job, its ranks and its plan
 * into the database, creates one trace ring per local rank and the collector
 * that drains them, optionally serves the dashboard, then runs the workers
 * (`pprun worker`) through the same supervisor as `pprun launch`, so every
 * failure, signal and restart rule holds. At the end the job's outcome is
 * written and, with --serve, the dashboard stays up until Ctrl-C. Each of
 * these steps is a module of runner/job/ (job.h lists them).
 *
 * `pprun run [options] -- PROGRAM [ARGS]` (or `-m MODULE [ARGS]`, python3
 * -m MODULE as torchrun runs it) runs the user's own program in place of
 * the built-in worker: the same job, rings and dashboard, with the schedule
 * in the program's environment (job_program_env.h) and its ops recorded
 * through libpprun_trace (tracer/pprun_trace.h, docs/trace-api.md), or, for
 * PyTorch's pipelining, through pprun's Python package (docs/torch.md). Such
 * a job has no step bound: the program runs as many steps as it likes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/pp.h"
#include "runner/cmd/cli.h"
#include "runner/job/job.h"
#include "runner/job/job_attempts.h"
#include "runner/job/job_checks.h"
#include "runner/job/job_nodes.h"
#include "runner/job/job_options.h"
#include "runner/job/job_rows.h"
#include "runner/job/job_serve.h"
#include "runner/job/job_tracing.h"
#include "runner/launch/launch.h"

/* The job's database and dashboard, then its rows. The server starts
 * before the job is written: a refused --serve (a taken port, no token for
 * a public address) leaves no job behind, and no database either when this
 * run created it (the server reads it, so it must exist first). */
static int open_outputs(run_job *job) {
    if (job_rows_open(job) != 0) return -1;
    if (job_serve_start(job) != 0) {
        job_rows_discard(job);
        return -1;
    }
    return job_rows_start(job);
}

int cmd_run(int argc, char **argv) {
    static run_job job; /* large: keep it off the stack */
    pp_err err;
    int rc = job_options_parse(&job, argc, argv, &err);
    if (rc == 1) return 0; /* --help */
    /* PPRUN_CLOCK reaches every rank, whose clock takes a value it does not
     * know as unset: refused here, before anything starts, not ignored. */
    /* A taken --master-port or a --log-dir path that is no regular file: refused
     * before the database, leaving no job behind. */
    if (rc != 0 || pp_clock_env_check(getenv(PP_CLOCK_ENV), &err) != 0 || job_check(&job, &err) != 0 ||
        job_options_worker_argv(&job, &err) != 0 || launch_check_start(&job.lo, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        job_free(&job);
        return 2;
    }
    job_checks_say_costs(&job);
    job_checks_say_threads(&job);
    job_nodes_address(&job);
    /* Before the database: --mps on without a daemon exits 2, leaving nothing. */
    if (job_mps_start(&job.mps, job.lo.shutdown_timeout_ns, &err) != 0) {
        fprintf(stderr, "pprun run: %s\n", err.msg);
        job_free(&job);
        return 2;
    }

    job_attempts_hold(&job); /* a stop signal from here on stops the job, recorded */
    /* zeroed: the guard's will is told end's fields (trace_err among them)
     * before job_tracing_stop fills them */
    job_outcome end = {0};
    if (open_outputs(&job) != 0) {
        job_attempts_release(&job, &end);
        job_free(&job);
        if (end.late_signal) raise(end.late_signal); /* nothing was written: it acts as it would have */
        return 2;
    }
    job_attempts_run(&job, &end);
    job_mps_stop(&job.mps); /* the workers are gone: so is the daemon, before the job's end is written */
    job_tracing_stop(&job, &end);
    /* The ranks' output that did not all reach standard output (a closed
     * pipe, a full disk) makes main exit 1 (check_stdout): the job's row
     * says the same exit status. */
    if (end.exit_code == 0 && (fflush(stdout) != 0 || ferror(stdout))) end.exit_code = 1;
    job_rows_finish(&job, &end);
    job_attempts_release(&job, &end); /* the end is recorded: a stop signal may act again */
    job_serve_until_interrupt(&job, &end);
    job_free(&job);
    return end.exit_code;
}
