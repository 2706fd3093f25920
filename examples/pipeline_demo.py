"""pipeline_demo.py: examples/pipeline_demo.c in Python, tracing through
libpprun_trace with ctypes, as a PyTorch training script would. Run it as

    pprun run --schedule 1f1b --microbatches 8 -- python3 examples/pipeline_demo.py

It follows PPRUN_ACTIONS (this rank's actions, in the schedule's order) and
wraps every op in pprun_trace_op; see docs/trace-api.md. The model: stage s
holds one weight w_s and maps x to tanh(w_s * x); the last stage's loss is
mean((y - 0.5)^2); plain SGD. Stages talk over abstract Unix datagram
sockets. Options: --op-ms MS (default 2), --lib PATH (default: next to the
pprun binary's build, then the loader's search path).
"""
import ctypes
import math
import os
import socket
import struct
import sys
import time

DIM = 64
# A message: kind (b"F" activation, b"B" gradient), stage, microbatch, step, then DIM doubles.
MSG = struct.Struct("=c3i%dd" % DIM)


def load_tracer(path):
    lib = ctypes.CDLL(path)
    lib.pprun_trace_init.restype = ctypes.c_int
    lib.pprun_trace_now_ns.restype = ctypes.c_uint64
    lib.pprun_trace_error.restype = ctypes.c_char_p
    lib.pprun_trace_op.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    lib.pprun_trace_loss.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double]
    return lib


def main():
    args = sys.argv[1:]
    opts = dict(zip(args[::2], args[1::2]))
    op_s = float(opts.get("--op-ms", "2")) / 1000
    here = os.path.dirname(os.path.abspath(__file__))
    lib_path = opts.get("--lib", os.path.join(here, "..", "build", "libpprun_trace.so"))
    if not os.path.exists(lib_path):
        lib_path = "libpprun_trace.so"
    t = load_tracer(lib_path)
    if t.pprun_trace_init() < 0:
        sys.exit("pipeline_demo.py: " + t.pprun_trace_error().decode())
    if "RANK" not in os.environ or "PPRUN_ACTIONS" not in os.environ:
        sys.exit("pipeline_demo.py: run me as `pprun run [options] -- python3 pipeline_demo.py`")

    env = os.environ
    rank, steps = int(env["RANK"]), int(env["PPRUN_STEPS"])
    stages, microbatches = int(env["PPRUN_NUM_STAGES"]), int(env["PPRUN_MICROBATCHES"])
    stage_rank = [int(r) for r in env["PPRUN_STAGE_RANKS"].split(",")]
    actions = [(int(a[:a.index(op)]), op, int(a[a.index(op) + 1:]))
               for a in env["PPRUN_ACTIONS"].split() for op in "FBW" if op in a]
    run = "%s/%s" % (env.get("PPRUN_RUN_ID", "run"), env.get("PPRUN_RESTART_COUNT", "0"))

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0pprun-demo-py/%s/%d" % (run, rank))
    early = {}

    def send(to, key, vec):
        kind, s, mb, step = key
        msg = MSG.pack(kind.encode(), s, mb, step, *vec)
        for _ in range(30000):  # the peer may not have bound its socket yet
            try:
                return sock.sendto(msg, "\0pprun-demo-py/%s/%d" % (run, to))
            except (ConnectionRefusedError, FileNotFoundError):
                time.sleep(0.001)
        sys.exit("pipeline_demo.py: rank %d cannot reach rank %d" % (rank, to))

    def recv(key):
        # Plain numbers, never pickle: anyone on this machine can send to an abstract socket.
        while key not in early:
            data = sock.recv(MSG.size + 1)
            if len(data) != MSG.size:
                continue  # not ours
            kind, s, mb, step, *vec = MSG.unpack(data)
            early[kind.decode(), s, mb, step] = list(vec)
        return early.pop(key)

    w = [0.9 + 0.05 * s for s in range(stages)]
    dw = [0.0] * stages
    x, y, dy = {}, {}, {}
    now = t.pprun_trace_now_ns
    for step in range(steps):
        for s, op, mb in actions:
            t0 = now()
            if op == "F":
                if s == 0:
                    x[s, mb] = [math.sin(0.1 * i + 0.37 * mb + 0.011 * step) for i in range(DIM)]
                elif stage_rank[s - 1] != rank:
                    x[s, mb] = recv(("F", s, mb, step))
                    t.pprun_trace_op(b"RECV_F", step, mb, s, stage_rank[s - 1], 512, t0, now())
                    t0 = now()
                else:
                    x[s, mb] = y[s - 1, mb]
                y[s, mb] = [math.tanh(w[s] * v) for v in x[s, mb]]
                time.sleep(op_s)
                t.pprun_trace_op(b"F", step, mb, s, -1, 0, t0, now())
                if s + 1 < stages and stage_rank[s + 1] != rank:
                    t1 = now()
                    send(stage_rank[s + 1], ("F", s + 1, mb, step), y[s, mb])
                    t.pprun_trace_op(b"SEND_F", step, mb, s, stage_rank[s + 1], 512, t1, now())
            elif op == "B":
                if s == stages - 1:
                    err = [v - 0.5 for v in y[s, mb]]
                    t.pprun_trace_loss(step, mb, s, sum(e * e for e in err) / len(err))
                    dy[s, mb] = [2 * e / len(err) for e in err]
                elif stage_rank[s + 1] != rank:
                    dy[s, mb] = recv(("B", s, mb, step))
                    t.pprun_trace_op(b"RECV_B", step, mb, s, stage_rank[s + 1], 512, t0, now())
                    t0 = now()
                grad = [g * (1 - v * v) * w[s] for g, v in zip(dy[s, mb], y[s, mb])]
                time.sleep(op_s)
                t.pprun_trace_op(b"B", step, mb, s, -1, 0, t0, now())
                if s > 0 and stage_rank[s - 1] == rank:
                    dy[s - 1, mb] = grad
                elif s > 0:
                    t1 = now()
                    send(stage_rank[s - 1], ("B", s - 1, mb, step), grad)
                    t.pprun_trace_op(b"SEND_B", step, mb, s, stage_rank[s - 1], 512, t1, now())
            else:
                dw[s] += sum(g * (1 - v * v) * u for g, v, u in zip(dy[s, mb], y[s, mb], x[s, mb]))
                time.sleep(op_s)
                t.pprun_trace_op(b"W", step, mb, s, -1, 0, t0, now())
        t0 = now()
        for s in range(stages):
            if stage_rank[s] == rank:
                w[s] -= 0.5 * dw[s] / microbatches
                dw[s] = 0.0
        t.pprun_trace_op(b"OPT", step, -1, -1, -1, 0, t0, now())


if __name__ == "__main__":
    main()
