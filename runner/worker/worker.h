/* worker.h: one rank of a `pprun run` job, as `pprun worker` runs it.
 *
 * The launcher starts it with the job's options (run_config, the same on
 * every rank) and torchrun's environment (RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, PPRUN_STORE, PPRUN_RUN_ID, PPRUN_RESTART_COUNT,
 * PPRUN_TRACE_FD). The rank builds the same schedule as every other rank
 * (one pipeline's: with --dp the world is --pp ranks per pipeline times
 * --dp pipelines, rank r being pipeline rank r % pp of replica r / pp),
 * connects to its neighbours and its data-parallel group (comm, over the
 * job's store), runs the engine from the checkpoint it starts from, reports
 * each step and evaluation on replica 0's last stage (the --metrics file,
 * the progress key the launcher's display reads) and counts itself in for
 * each checkpoint, the last rank in marking it complete (checkpoint_dir.h).
 *
 * With --device cuda and a GPU transport (auto, cuda-ipc, nccl) it also opens
 * devcomm on its GPU, after the host comm (devcomm sends its control
 * messages over it), and says on stderr which transport each neighbour
 * gets; it flushes and closes devcomm before the host comm. */
#ifndef PP_WORKER_H
#define PP_WORKER_H
#include "base/pp.h"
#include "config/run_config.h"

/* Runs this rank's part of the job to its end. *rank: the rank, from RANK
 * (0 until it is read), for the caller's messages. */
int worker_run(const run_config *cfg, int *rank, pp_err *err);

#endif
