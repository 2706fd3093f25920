"""torch_program.py: a small PyTorch pipelining program for tests/test_torch.c
that does what users' programs do and examples/torch_pipeline.py does not
(docs/torch.md). Two ranks, one stage each, ScheduleGPipe of 2
microbatches (loss: cross entropy over 4 classes), 3 steps; the last stage
prints "loss step=S microbatch=M value=V" and every rank "done rank R".
Its stage's device is the string "cpu", as a program may give it
(PipelineStage keeps it as given; examples/torch_pipeline.py gives a
torch.device).

--mode loader: the batches come from a DataLoader with 2 worker processes
  (forked), whose dataset marks each item with pprun.span("load"); each
  step's batch is fetched in pprun.span("batch"); before the first step a
  pprun.span("setup", stage=7, microbatch=9), outside the job's shape.
--mode remicrobatch: from step 1 on, training goes on with a second
  ScheduleGPipe of 4 microbatches on the same stage (twice the first's, of
  the same size: twice the batch); each step's batch is made in
  pprun.span("batch").
--mode raise: rank 1's stage raises RuntimeError("boom at step 1") in its
  forward at step 1.
--mode longjob: after step 0, pprun's step counter is set to 2^31 - 1, as
  if the job had run that many steps: the next is past what a record holds.
--mode longjob-ctypes: the same, with pprun._op made unimportable before
  anything of pprun's loads: the package records through ctypes, as where
  its extension was not built.
--mode plain: nothing more; rank 0 prints which wrapper forward_one_chunk
  has ("wrapper=wrapper": pprun._op's, "wrapper=function": Python's).
--mode ctypes: plain with pprun._op unimportable, as longjob-ctypes.
--mode rebuild: at step 1 the program builds its model, stage, schedule
  (the same class, the same microbatches) and optimizer anew, and trains
  on with those.
--mode keywords: plain with every call of the stage's chunk methods made
  by keyword (fwd_chunk_id=..., args=..., as a schedule of the program's
  own may call them); rank 0 prints how many ("keywords=N").
--mode per-direction: plain with a _batch_p2p that calls itself, as torch
  2.14's with per-direction p2p (TORCH_DISTRIBUTED_PIPELINE_PER_DIRECTION_P2P)
  issues a batch of two communicators' ops: each communicator's through
  the module's _batch_p2p, pprun's wrapper (emulated: every batch taken
  as two communicators', its ops at even and at odd places); rank 0 prints
  how many batches were issued from within one ("nested=N").
--mode evals-wrap: plain, after 5 forward-only evaluations of 8
  microbatches before the first step, with pprun.torch's bound of an
  evaluation's microbatch numbers set to 24: its numbers start again
  from 0 at the fourth.
--mode raise-first (one rank): its stage raises RuntimeError("boom") at
  its second forward (step 0, microbatch 1); the program catches it,
  prints "caught boom", clears the stage's state and trains on.
--mode torch-first: plain, with pprun.torch imported before torch (a
  program that calls pprun.torch.schedule() may import it first).
--mode works: plain with torch >= 2.8's batched p2p (_batch_p2p returns
  every Work of a batch, [] for none, and the schedule waits for each, as
  2.8's _wait_batch_p2p), under pprun's wrapper as install() makes it
  (emulated in torch 2.6, torch's own in a later one); rank 0 prints how
  many Works it waited for ("works=N").
--mode slow-peer: plain, with rank 1's stage asleep for 2 s in its first
  forward of step 1: rank 0 waits on it that long (for it to take an
  activation, or for a gradient).
--mode slow-peer-ctypes: the same with pprun._op unimportable.
--mode own-batch-p2p: plain, with the schedules' _batch_p2p replaced by the
  program after it imported them (after pprun wrapped it): a gloo
  workaround of its own that waits for every Work of a batch.
--mode own-batch-p2p-waits: the same with a _batch_p2p that waits itself
  and returns None, under Schedule1F1B (whose steps take None for "nothing
  to wait for"; GPipe's do not).
--mode own-batch-p2p-ctypes: own-batch-p2p-waits with pprun._op
  unimportable: pprun's wrappers are Python's, and the program's, made
  with functools.wraps of one (as all three are), copies its attributes.
--mode early-pool: plain, with a fork multiprocessing pool made before the
  program imports torch's pipelining, whose worker then imports it (a
  task's lazy import) and stays until the program ends; the worker prints
  "worker imported pipelining".
--mode optimizers: the stage's SGD is stepped through a Lookahead-style
  optimizer whose step() calls it (one optimizer step, two torch.optim
  step()s, as ZeroRedundancyOptimizer's), and after it each step the
  program sleeps 50 ms and steps an auxiliary model's own optimizer.

Under pprun, pprun is imported for its spans (else they do nothing)."""
import argparse
import inspect
import contextlib
import os
import sys
import time

if {"longjob-ctypes", "ctypes", "slow-peer-ctypes", "own-batch-p2p-ctypes"} & set(sys.argv):
    sys.modules["pprun._op"] = None  # `from pprun import _op` raises ImportError
if "torch-first" in sys.argv:
    import pprun.torch  # noqa: F401 (it imports torch.distributed.pipelining itself)

if "early-pool" in sys.argv:
    import multiprocessing

    def _import_pipelining(_):
        import torch.distributed.pipelining  # noqa: F401 (the site hook's finder is the parent's)

        print("worker imported pipelining", flush=True)

    _pool = multiprocessing.get_context("fork").Pool(1)
    _pool.map(_import_pipelining, [0])

import torch  # noqa: E402
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from torch_pipeline import gloo_p2p  # noqa: E402 (the examples' gloo fix)

try:
    import pprun

    span = pprun.span
except ImportError:
    def span(*args, **kwargs):
        return contextlib.nullcontext()

STEPS, BATCH, DIM = 3, 8, 16


class Items(Dataset):
    def __len__(self):
        return STEPS * BATCH

    def __getitem__(self, i):
        with span("load"):
            g = torch.Generator().manual_seed(i)
            return torch.randn(DIM, generator=g), torch.randint(0, 4, (), generator=g)


class WaitAll:
    """Works waited for as one, for 2.6's callers, which wait for one object."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()


def batches_of_works(waited):
    """torch >= 2.8's _batch_p2p in this torch 2.6, under pprun's wrapper
    (pprun.torch._fast, as install() wraps _batch_p2p): every Work of the
    batch, each waited for. waited[0] counts them."""
    import pprun.torch as pt
    from torch.distributed.pipelining import schedules

    if hasattr(schedules, "_wait_batch_p2p"):  # a torch >= 2.8: its own batches, counted where it waits
        wait_each = schedules._wait_batch_p2p

        def wait_counted(works):
            works = list(works)
            waited[0] += len(works)
            wait_each(works)

        schedules._wait_batch_p2p = wait_counted
        return

    def batch_p2p(p2p_ops, desc=None):  # torch 2.8's
        return dist.batch_isend_irecv(p2p_ops) if p2p_ops else []

    traced = pt._fast(pt._wrap_batch_p2p)(batch_p2p)

    class WaitEach:  # what 2.8's _wait_batch_p2p does, for 2.6's callers, which wait for one object
        def __init__(self, works):
            self.works = works

        def wait(self):
            for w in self.works:
                w.wait()
                waited[0] += 1

    def batch_p2p_as_2_6_calls_it(p2p_ops, desc=None):
        works = traced(p2p_ops, desc)
        return WaitEach(works) if works else None

    schedules._batch_p2p = batch_p2p_as_2_6_calls_it


def batches_per_direction(nested):
    """torch 2.14's _batch_p2p with per-direction p2p, under pprun's wrapper
    as install() wraps _batch_p2p: a batch of two communicators' ops is
    issued a communicator at a time through the module's _batch_p2p, which
    is pprun's wrapper again; the schedule waits for what the outer call
    returns. nested[0] counts the inner calls."""
    import pprun.torch as pt
    from torch.distributed.pipelining import schedules

    torch_batch = schedules._batch_p2p.__wrapped__  # torch's own, under pprun's wrapper
    inner = [False]

    def batch_p2p(p2p_ops, desc=None):
        if inner[0] or not p2p_ops:
            return torch_batch(p2p_ops, desc)
        inner[0] = True
        try:
            works = [schedules._batch_p2p(ops, desc) for ops in (p2p_ops[0::2], p2p_ops[1::2]) if ops]
        finally:
            inner[0] = False
        nested[0] += len(works)
        works = [w for w in works if w is not None]
        return WaitAll(works) if works else None

    schedules._batch_p2p = pt._fast(pt._wrap_batch_p2p)(batch_p2p)


def own_batch_p2p(waits):
    """The program's own _batch_p2p, set after pprun wrapped torch's: each
    batch's Works, waited for together by the schedule, or here (waits:
    then it returns None)."""
    import functools

    from torch.distributed.pipelining import schedules

    @functools.wraps(schedules._batch_p2p)  # as a program does: pprun's wrapper's attributes copied
    def batch_p2p(p2p_ops, desc=None):
        if not p2p_ops:
            return None
        works = WaitAll(dist.batch_isend_irecv(p2p_ops))
        if not waits:
            return works
        works.wait()
        return None

    schedules._batch_p2p = batch_p2p


class Stage(nn.Module):
    def __init__(self, rank, fail):
        super().__init__()
        self.layer = nn.Linear(DIM, DIM if rank == 0 else 4)
        self.rank, self.fail, self.step, self.calls, self.slept = rank, fail, 0, 0, False

    def forward(self, x):
        self.calls += 1
        if self.fail == "raise" and self.rank == 1 and self.step == 1:
            raise RuntimeError("boom at step 1")
        if self.fail == "raise-first" and self.calls == 2:
            raise RuntimeError("boom")
        if self.fail.startswith("slow-peer") and self.rank == 1 and self.step == 1 and not self.slept:
            self.slept = True
            time.sleep(2)
        return torch.relu(self.layer(x)) if self.rank == 0 else self.layer(x)


class Lookahead(torch.optim.Optimizer):
    """An optimizer whose step() steps another (a Lookahead's, a
    ZeroRedundancyOptimizer's way): its slow weights left out."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups[0]["params"], {"lr": inner.defaults["lr"]})

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def step(self, closure=None):
        return self.inner.step(closure)


def keyword_calls(stage, calls):
    """Every call of stage's chunk methods made with each argument by its
    name (calls[0] counts them)."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk", "get_fwd_send_ops",
                 "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops"):
        method = getattr(type(stage), name)  # pprun's wrapper under pprun, PyTorch's method outside it
        signature = inspect.signature(method)

        def by_keyword(*a, _method=method, _signature=signature, **kw):
            named = dict(_signature.bind(stage, *a, **kw).arguments)
            named.pop("self")
            calls[0] += 1
            return _method(stage, **named)

        setattr(stage, name, by_keyword)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=["loader", "remicrobatch", "raise", "longjob", "longjob-ctypes",
                                                          "plain", "ctypes", "works", "per-direction",
                                                          "torch-first", "evals-wrap", "raise-first", "slow-peer",
                                                          "slow-peer-ctypes", "early-pool",
                                                          "own-batch-p2p", "own-batch-p2p-waits",
                                                          "own-batch-p2p-ctypes", "optimizers", "keywords", "rebuild"])
    args = p.parse_args()
    dist.init_process_group("gloo")
    gloo_p2p()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = Stage(rank, args.mode)
    stage = PipelineStage(module, rank, world, "cpu")  # a string, as PipelineStage takes it too
    loss_fn = nn.CrossEntropyLoss()
    waits = args.mode in ("own-batch-p2p-waits", "own-batch-p2p-ctypes")
    kind = Schedule1F1B if waits else ScheduleGPipe
    schedule = kind(stage, 2, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    if args.mode == "optimizers":
        opt, aux = Lookahead(opt), nn.Linear(DIM, DIM)
        aux_opt = torch.optim.SGD(aux.parameters(), lr=0.05)
    waited = [0]
    if args.mode == "keywords":
        keyword_calls(stage, waited)
    if args.mode == "works":
        batches_of_works(waited)
    if args.mode == "per-direction":
        batches_per_direction(waited)
    if args.mode.startswith("own-batch-p2p"):
        own_batch_p2p(waits)
    if args.mode == "evals-wrap":
        if "pprun.torch" in sys.modules:  # under pprun
            sys.modules["pprun.torch"]._EVAL_MICROBATCHES_MAX = 24
        evaluation = ScheduleGPipe(stage, 8)  # no loss function: forward only
        stage.has_backward = schedule._has_backward  # torch 2.6: the training schedule's stage keeps its own
        for k in range(5):
            with torch.no_grad():
                if rank == 0:
                    evaluation.step(torch.randn(8 * BATCH // 2, DIM, generator=torch.Generator().manual_seed(k)))
                else:
                    evaluation.step()
    if rank == 0 and args.mode in ("plain", "ctypes", "torch-first"):
        from torch.distributed.pipelining.stage import _PipelineStageBase  # where pprun wraps it

        print("wrapper=%s" % type(vars(_PipelineStageBase)["forward_one_chunk"]).__name__, flush=True)
    if args.mode == "loader":
        with span("setup", stage=7, microbatch=9):
            pass
        batches = iter(DataLoader(Items(), batch_size=BATCH, num_workers=2))
    for step in range(STEPS):
        module.step = step
        if args.mode == "loader":
            with span("batch"):
                x, y = next(batches)
        else:
            if args.mode == "remicrobatch" and step == 1:  # microbatches of the same size, twice as many
                schedule = ScheduleGPipe(stage, 4, loss_fn=loss_fn)
            if args.mode == "rebuild" and step == 1:
                module = Stage(rank, args.mode)
                stage = PipelineStage(module, rank, world, "cpu")
                schedule = kind(stage, 2, loss_fn=loss_fn)
                opt = torch.optim.SGD(module.parameters(), lr=0.05)
            n = BATCH * schedule._n_microbatches // 2
            with span("batch") if args.mode == "remicrobatch" else contextlib.nullcontext():
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(n, DIM, generator=g), torch.randint(0, 4, (n,), generator=g)
        opt.zero_grad()
        losses = []
        try:
            if world == 1:  # first and last stage
                schedule.step(x, target=y, losses=losses)
            elif rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
        except RuntimeError as e:
            if args.mode != "raise-first" or "boom" not in str(e.__cause__):  # PyTorch's stage error, from ours
                raise
            print("caught boom", flush=True)
            stage.clear_runtime_states()
            schedule._internal_losses.clear()
            continue
        opt.step()
        if args.mode == "optimizers":
            time.sleep(0.05)  # the program's own work, between steps
            aux_opt.zero_grad()
            aux(torch.ones(1, DIM)).sum().backward()
            aux_opt.step()
        for mb, loss in enumerate(losses):
            print("loss step=%d microbatch=%d value=%r" % (step, mb, loss.item()), flush=True)
        if args.mode.startswith("longjob") and step == 0:
            pprun._step[0] = 2**31 - 1
    if rank == 0 and args.mode in ("works", "per-direction", "keywords"):
        print("%s=%d" % ("nested" if args.mode == "per-direction" else args.mode, waited[0]), flush=True)
    if args.mode == "early-pool":
        _pool.close()
        _pool.join()
    print("done rank %d" % rank, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
