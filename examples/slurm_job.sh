#!/bin/bash
# slurm_job.sh: pprun run as a Slurm batch job (docs/cli.md, "Slurm").
#
#   sbatch examples/slurm_job.sh --steps 100 --db train.db
#   sbatch --nodes=4 examples/slurm_job.sh ...    the same on four nodes
#
# The batch script runs on the allocation's first node only, so it starts
# one pprun launcher per node with srun; each launcher starts
# --nproc-per-node workers and takes the nodes, its node rank and node 0's
# address from the step's Slurm environment. The arguments go to pprun run
# (a later --nproc-per-node wins over this one's 4); PPRUN names the pprun
# binary when it is not on PATH.
#SBATCH --job-name=pprun
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --output=pprun-%j.out
set -eu
# The job token of a multi-node job (docs/cli.md, "The job token"): one per
# job unless given, passed to every node's launcher in the environment.
PPRUN_RDZV_TOKEN=${PPRUN_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
export PPRUN_RDZV_TOKEN
exec srun --ntasks-per-node=1 "${PPRUN:-pprun}" run --nproc-per-node 4 "$@"
