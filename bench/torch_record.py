#!/usr/bin/env python3
"""bench/torch_record.py: what one op's record costs a PyTorch rank right
after PyTorch's work, side by side (docs/torch.md, "What tracing costs"):
the record call through pprun._op and through ctypes, and a whole
compute op's wrapper, pprun._op's (in C) and the package's Python one.

A traced op is recorded just after the op itself, when the op's work has
pushed the interpreter's code, the call's and the library's out of the
caches; a loop of records alone measures them warm, some twenty times
cheaper. So each record here follows a few matrix products of the
example's size, the ways interleaved, and their medians and ratios are
printed; then the same calls back to back (warm). The wrappers wrap a
stage method that does nothing (a CPU stage's forward_one_chunk in a
training step: their common case). Run it under pprun (the records go to
a real ring; one rank):

    pprun run --nproc-per-node 1 --steps 1 -- scripts/torch-root.sh run \\
        python3 bench/torch_record.py [ROUNDS]
"""
import sys
import time

import torch
import torch.distributed.pipelining  # noqa: F401  (the import hook installs pprun.torch)

import pprun
import pprun.torch as pt
from pprun import _op, _trace


class Stage:
    """What a compute wrapper reads of a stage: a CPU one."""

    device = torch.device("cpu")
    stage_index = 0

    def forward_one_chunk(self, chunk_id):
        return None


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    t = _trace.tracer()
    if t is None or t.op is not getattr(_op, "put", None) or not pt._installed:
        raise SystemExit("torch_record.py: run it under `pprun run` (traced), with pprun._op built")
    now, ext, slow = t.now, t.op, t._op_ctypes
    step = pprun._step

    def through(put):
        def record():
            t0 = now()
            return put(b"F", 0, step[0], 0, 0, -1, 0, t0, now())
        return record

    stage, bare = Stage(), Stage.forward_one_chunk
    in_python, in_c = pt._wrap_compute(bare, b"F"), pt._fast(pt._wrap_compute)(bare, b"F")

    def wrapped(wrapper):
        def op():
            _op.context(step[0], True, 0)  # what the step's wrapper says at a training step's start
            return wrapper(stage, 0)
        return op

    ways = {"nothing (two clock reads)": lambda: (now(), now()), "pprun._op": through(ext),
            "ctypes": through(slow), "op alone": wrapped(bare), "op, Python's wrapper": wrapped(in_python),
            "op, pprun._op's wrapper": wrapped(in_c)}
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    clock = time.perf_counter_ns
    cold = {name: [] for name in ways}
    for _ in range(rounds):
        for name, record in ways.items():
            for _ in range(4):
                torch.mm(a, b)
            step[0] += 1
            start = clock()
            record()
            cold[name].append(clock() - start)
    warm = {}
    for name, record in ways.items():
        start = clock()
        for _ in range(rounds * 10):
            step[0] += 1
            record()
        warm[name] = (clock() - start) / (rounds * 10)
    median = {name: sorted(xs)[len(xs) // 2] / 1e3 for name, xs in cold.items()}
    print("%d records each way, each after 4 matrix products of 384 x 384 (cold), then %d back to back (warm)"
          % (rounds, rounds * 10))
    print("%-28s %12s %12s" % ("", "cold (us)", "warm (us)"))
    for name in ways:
        print("%-28s %12.2f %12.2f" % (name, median[name], warm[name] / 1e3))
    base = median["nothing (two clock reads)"]
    print("a record's own cost, cold: pprun._op %.2f us, ctypes %.2f us: ratio %.2f"
          % (median["pprun._op"] - base, median["ctypes"] - base,
             (median["pprun._op"] - base) / (median["ctypes"] - base)))
    op = median["op alone"]
    print("a compute op's wrapper and record, cold: pprun._op's %.2f us, Python's %.2f us: ratio %.2f"
          % (median["op, pprun._op's wrapper"] - op, median["op, Python's wrapper"] - op,
             (median["op, pprun._op's wrapper"] - op) / (median["op, Python's wrapper"] - op)))


if __name__ == "__main__":
    main()
