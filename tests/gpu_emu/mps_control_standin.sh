#!/bin/bash
# mps_control_standin.sh: NVIDIA's nvidia-cuda-mps-control played for the
# tests (test_gpu_mps_emu puts it first on PATH under that name), as far as
# pprun uses it (runner/job/job_mps.c, docs/gpu.md "Ranks sharing a GPU: MPS"):
#
#   -d          starts the daemon in the background and returns: a process
#               of its own session that writes its pid into
#               $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid and
#               reads commands from the FIFO "control" there
#   (no option) the client: each line of its standard input is sent to the
#               daemon; "quit" makes the daemon exit (removing its pid file)
#
# A CUDA process connects as cudart_standin.c does: one line "client ..."
# into the FIFO. Everything the daemon and the client see is appended to
# $MPS_STANDIN_LOG (when set): "start PID pipe=... log=...", "client ...",
# "command quit", "exit PID". With MPS_STANDIN_IGNORE_QUIT=1 in its
# environment the daemon logs "ignored quit", stays, and ignores SIGTERM:
# only SIGKILL ends it. With MPS_STANDIN_START_DELAY=S it logs "starting
# PID" and waits S seconds before it writes its pid file (a slow start);
# with MPS_STANDIN_FAIL_START=1, -d says so on stderr and exits 1.
log() { if [ -n "$MPS_STANDIN_LOG" ]; then echo "$*" >>"$MPS_STANDIN_LOG"; fi; }

pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
pidfile=$pipe/nvidia-cuda-mps-control.pid

case "$1" in
-d)
    if [ -n "$MPS_STANDIN_FAIL_START" ]; then
        echo "nvidia-cuda-mps-control (stand-in): cannot start (MPS_STANDIN_FAIL_START)" >&2
        exit 1
    fi
    [ -d "$pipe" ] || { echo "nvidia-cuda-mps-control (stand-in): no folder $pipe" >&2; exit 1; }
    mkfifo -m 600 "$pipe/control" || exit 1
    setsid "$0" --standin-daemon </dev/null >/dev/null 2>&1 &
    exit 0
    ;;
--standin-daemon)
    if [ -n "$MPS_STANDIN_IGNORE_QUIT" ]; then trap '' TERM; fi
    exec 3<>"$pipe/control" # read and write: a reader while it lives, never an end of file
    if [ -n "$MPS_STANDIN_START_DELAY" ]; then
        log "starting $$"
        sleep "$MPS_STANDIN_START_DELAY"
    fi
    echo $$ >"$pidfile"
    echo "control daemon $$ started" >>"${CUDA_MPS_LOG_DIRECTORY:-/tmp}/control.log"
    log "start $$ pipe=$pipe log=$CUDA_MPS_LOG_DIRECTORY"
    while read -r line <&3; do
        case "$line" in
        quit)
            log "command quit"
            if [ -n "$MPS_STANDIN_IGNORE_QUIT" ]; then
                log "ignored quit"
                continue
            fi
            rm -f "$pidfile"
            log "exit $$"
            exit 0
            ;;
        *) log "$line" ;;
        esac
    done
    ;;
*)
    pid=$(cat "$pidfile" 2>/dev/null)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "Cannot find MPS control daemon process" >&2
        exit 1
    fi
    while read -r line; do
        log "client sends $line"
        echo "$line" >"$pipe/control"
    done
    ;;
esac
