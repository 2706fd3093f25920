/* job.h: a `pprun run` job as its launcher holds it, from the command line
 * to the job's end (docs/design.md §1, §3).
 *
 * One module of runner/job/ per part of running it, in the order
 * runner/cmd/cmd_run.c calls them:
 *   job_options      the command line; the workers' command line
 *   job_checks       every check before anything starts (bad input exits 2)
 *   job_nodes        this node's address; with several nodes, agreeing with node 0
 *   job_rows         the job in the database: its rows at the start and at the end
 *   job_serve        --serve: the dashboard, kept up after the job until Ctrl-C
 *   job_attempts     the workers' attempts, through the supervisor (runner/launch)
 *   job_blame        the rank a failure comes from, when the first to fail only waited for it
 *   job_salvage      the guard's will: a killed launcher's rings and job's end still reach the database
 *   job_tracing      the trace collector and each rank's ring
 *   job_program_env  `-- PROGRAM`: the schedule in the program's environment
 *   job_mps          NVIDIA's MPS daemon for ranks that share a GPU, for the job's time
 *
 * The job owns everything it points to; job_free releases what is left. */
#ifndef PP_JOB_H
#define PP_JOB_H
#include <netinet/in.h>
#include <stdint.h>

#include "base/pp.h"
#include "config/run_config.h"
#include "db/db.h"
#include "runner/job/collector.h"
#include "runner/job/job_mps.h"
#include "runner/job/run_progress.h"
#include "runner/launch/launch.h"
#include "sched/sched.h"
#include "tracer/ring.h"
#include "web/http.h"

typedef struct run_job {
    run_config cfg;
    launch_options lo;
    sched_plan *plan;
    sched_plan *csv_plan; /* --schedule csv:FILE as the checks read it, once, until run_config_plan takes it */
    db *db;         /* the job's writer; only the collector thread writes while it runs */
    int db_created; /* this run created --db (a refused --serve removes it again) */
    int64_t job_id;
    collector *coll;
    trace_ring **rings; /* [nrings], owned by the collector once added */
    int nrings;         /* this node's ranks (launch_info's nproc_per_node) */
    int *ring_writers;  /* [nrings]: each ring's writer (trace_ring_writer) when the latest attempt began, owned */
    pp_err ring_fault;  /* the first rank's ring found corrupt ("" none; the collector's thread until it stops) */
    http_server *web;
    run_progress *progress;
    int progress_next;  /* the next step the display shows, across attempts */
    int plan_refreshed; /* the plan has simulated times at measured costs (the collector's thread) */
    int plan_passed_first; /* the collector saw the job's first step, which the refresh passes (start-up) */
    char node_addr[INET6_ADDRSTRLEN];
    char self_exe[4096];
    char *worker_argv[RUN_CONFIG_MAX_ARGS + 8];
    char *worker_args[RUN_CONFIG_MAX_ARGS + 1];
    int cuda_devices;      /* --device cuda: devices this node sees */
    char costs_about[256]; /* --schedule-costs DB: which job and steps its numbers are from */
    char act_about[256];   /* and the activation bytes per stage --max-mem bounds by, when they are from there */
    int program;           /* 1: `-- PROGRAM` runs instead of the built-in worker */
    char worker_flag[32];  /* the first option given that only the built-in worker takes */
    int microbatches_given; /* --microbatches was on the command line (a csv: schedule sets it otherwise) */
    int db_given;          /* --db was on the command line (another node than 0 says it writes none) */
    char model[256];       /* jobs.model: the canonical --model, or "program:COMMAND LINE" */
    pid_t rank_pids[LAUNCH_MAX_NPROC]; /* this node's ranks, latest attempt (the started hook) */
    launch_guard *guard;   /* outlives a SIGKILLed launcher: kills the ranks, then records the job's end */
    job_mps mps;           /* --device cuda: the MPS daemon of this node's ranks, when they share a GPU */
    int late_holding; /* job_attempts_hold holds the stop signals until job_attempts_release (job_signals.h) */
} run_job;

/* How the workers' attempts ended (job_attempts_run), and the trace with
 * them (job_tracing_stop). */
typedef struct job_outcome {
    int launch_rc;     /* launch_job's: -1 when the launcher could not run the job */
    pp_err launch_err; /* why, when launch_rc is -1 */
    launch_result res;
    pp_err trace_err; /* "" unless the trace stopped early */
    pp_err ring_err;  /* "" unless a rank's trace ring was corrupt (its trace cut, the others' kept) */
    int rings_claimed; /* this node's ranks whose program loaded libpprun_trace (trace_ring_writer) */
    int exit_code;    /* what pprun run exits with */
    int late_signal;  /* a stop signal that came once the workers were gone, held until the end was recorded, or 0 */
} job_outcome;

/* Releases what the job still holds, whichever step it stopped at. */
void job_free(run_job *job);

#endif
