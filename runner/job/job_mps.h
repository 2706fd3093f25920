/* job_mps.h: NVIDIA's MPS control daemon for the ranks of this node that
 * share a GPU (`pprun run --device cuda --mps auto|on|off`; docs/gpu.md,
 * "Ranks sharing a GPU: MPS").
 *
 * Without MPS a GPU runs one process's work at a time, so ranks on one GPU
 * take turns; through MPS their CUDA contexts share one server and their
 * kernels may run side by side. The launcher starts a daemon of its own for
 * the job (`nvidia-cuda-mps-control -d`) with its pipes and logs in a
 * private folder (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY), gives
 * every worker those two variables, and stops it when the workers are gone
 * (`echo quit | nvidia-cuda-mps-control`, then the daemon's pid killed if
 * it did not exit within --shutdown-timeout), whatever the job's end, and
 * removes the folder.
 *
 * Stop signals (SIGINT, SIGTERM, SIGHUP) from job_mps_start to
 * job_mps_stop are held while the supervisor's own handlers are not in
 * place (job_signals.h): one that came before the workers started is
 * handed to the supervisor (job_attempts.c), and job_mps_stop delivers one
 * that came after, once the daemon is gone. */
#ifndef PP_JOB_MPS_H
#define PP_JOB_MPS_H
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/pp.h"
#include "config/run_config.h"
#include "runner/launch/launch.h"

typedef struct job_mps {
    int start;          /* job_mps_decide: start a daemon */
    int required;       /* --mps on: one that cannot start fails the job */
    int ranks, devices; /* this node's, for the lines it prints */
    char state[320];    /* jobs.config_json "mps": "on", "off", "not needed: ...", "unavailable: ..."; "" none */
    char why_not[256];  /* the line said when auto starts none though ranks share a GPU */
    char control[4096]; /* nvidia-cuda-mps-control, as found on PATH */
    char dir[200];      /* the private folder; "" when there is none */
    char pipe_env[256]; /* CUDA_MPS_PIPE_DIRECTORY=DIR/pipe */
    char log_env[256];  /* CUDA_MPS_LOG_DIRECTORY=DIR/log */
    int launched;       /* `-d` ran and did not say it failed: a daemon may run, its pid known or not */
    pid_t daemon;       /* from its pid file; 0: none known */
    pid_t group;        /* its process group, which the guard kills with the ranks; 0: none */
    launch_guard *guard; /* the job's guard that knows the group, until it stops */
    uint64_t quit_ns;   /* how long it may take to quit */
    int catching;       /* this daemon holds the stop signals (job_signals_hold) */
} job_mps;

/* Whether this node's ranks get a daemon: --device cuda, pprun's own
 * worker, not --mps off, and with --mps auto more ranks (nproc_per_node)
 * than devices; the control program must be on PATH. -1 with err for --mps
 * on without it (exit 2, before anything starts). */
int job_mps_decide(job_mps *m, const run_config *cfg, int program, int nproc_per_node, int devices, pp_err *err);
/* Starts the daemon when decided, holding the stop signals from here on;
 * quit_ns bounds its quit. One that cannot start is a line on stderr and
 * the job goes on without it, or with --mps on -1 with err (the job
 * exits 2, nothing of the daemon left). Says why none starts when auto
 * would have wanted one. */
int job_mps_start(job_mps *m, uint64_t quit_ns, pp_err *err);
/* A worker's environment: the daemon's two variables, and no
 * CUDA_VISIBLE_DEVICES (the daemon applied it: a worker sees its devices,
 * renumbered from 0). Nothing without a daemon. */
int job_mps_env(const job_mps *m, launch_env *env, pp_err *err);
/* The job's guard (launch.h) SIGKILLs the daemon's process group with the
 * ranks when the launcher is killed (SIGKILL, the OOM killer), until
 * job_mps_stop. The private folder then stays (docs/gpu.md). */
void job_mps_guard(job_mps *m, launch_guard *guard);
/* Stops the daemon and removes the folder, then puts the handlers back and
 * delivers a stop signal held meanwhile. Again: nothing. */
void job_mps_stop(job_mps *m);

#endif
