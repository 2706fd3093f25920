#!/usr/bin/env python3
"""bench/torch_alternate.py: examples/torch_pipeline.py with pprun's
instrumentation of PyTorch on every other step, to measure what it costs a
step side by side in one job (bench/torch_overhead.c, "step by step").

Run under `pprun run` (traced): the import hook installs pprun.torch as for
any program; this driver then takes its wrappers off (the originals back on
PyTorch's classes and module, pprun's optimizer hooks out of torch's hook
tables) for the untraced steps and puts them back for the traced ones, at
each step's start (the example's opt.zero_grad(), inside the time the
example measures: the switch costs both kinds of step the same). Steps go
in pairs, ABBA: pair k = steps 2k and 2k+1, the traced one first in even
pairs, second in odd ones (pair_traced() below; bench/torch_overhead.c
computes the same). Every rank switches at the same step, so the pipeline's
sends and receives stay matched.

    pprun run --nproc-per-node 2 -- scripts/torch-root.sh run python3 \\
        bench/torch_alternate.py --steps 2000 --step-times      (the example's options)
"""
import os
import runpy
import sys

import torch
import torch.distributed.pipelining  # noqa: F401  (the import hook installs pprun.torch)
from torch.optim import optimizer as _optimizer

import pprun.torch as pt

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch_pipeline.py")


def pair_traced(step):
    """Whether step is a traced one: ABBA over pairs of steps."""
    return (step % 2 == 0) == ((step // 2) % 2 == 0)


def wrapped_attributes():
    """(owner, name, wrapper) for every attribute pprun.torch replaced."""
    found = []
    owners = [pt._stage._PipelineStageBase, pt._schedules, pt._schedules._PipelineSchedule] + pt._step_owners()
    runtime = pt._runtime_module()
    if runtime is not None:
        owners.append(runtime)
    for owner in owners:
        for name, value in list(vars(owner).items()):
            if getattr(value, "_pprun_wrapped", False):
                found.append((owner, name, value))
    return found


def main():
    if not pt._installed:
        raise SystemExit("torch_alternate.py: pprun.torch is not installed: run it under `pprun run` (traced)")
    wrappers = wrapped_attributes()
    hooks = [(table, key, fn) for table in (_optimizer._global_optimizer_pre_hooks,
                                             _optimizer._global_optimizer_post_hooks)
             for key, fn in table.items() if fn in (pt._opt_pre, pt._opt_post)]
    if len(hooks) != 2 or not wrappers:
        raise SystemExit("torch_alternate.py: pprun.torch's wrappers or optimizer hooks not found")

    def switch(on):
        for owner, name, wrapper in wrappers:
            setattr(owner, name, wrapper if on else wrapper.__wrapped__)
        for table, key, fn in hooks:
            if on:
                table[key] = fn
            else:
                table.pop(key, None)

    zero_grad, steps = torch.optim.Optimizer.zero_grad, [0]

    def zero_grad_switching(self, *args, **kwargs):
        switch(pair_traced(steps[0]))
        steps[0] += 1
        return zero_grad(self, *args, **kwargs)

    torch.optim.Optimizer.zero_grad = zero_grad_switching
    sys.argv = [EXAMPLE] + sys.argv[1:]
    runpy.run_path(EXAMPLE, run_name="__main__")


if __name__ == "__main__":
    main()
