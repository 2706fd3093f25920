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

Under pprun, pprun is imported for its spans (else they do nothing)."""
import argparse
import contextlib
import os
import sys

if "longjob-ctypes" in sys.argv:
    sys.modules["pprun._op"] = None  # `from pprun import _op` raises ImportError

import torch  # noqa: E402
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
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


class Stage(nn.Module):
    def __init__(self, rank, fail):
        super().__init__()
        self.layer = nn.Linear(DIM, DIM if rank == 0 else 4)
        self.rank, self.fail, self.step = rank, fail, 0

    def forward(self, x):
        if self.fail and self.rank == 1 and self.step == 1:
            raise RuntimeError("boom at step 1")
        return torch.relu(self.layer(x)) if self.rank == 0 else self.layer(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=["loader", "remicrobatch", "raise", "longjob", "longjob-ctypes"])
    args = p.parse_args()
    dist.init_process_group("gloo")
    gloo_p2p()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = Stage(rank, args.mode == "raise")
    stage = PipelineStage(module, rank, world, "cpu")  # a string, as PipelineStage takes it too
    loss_fn = nn.CrossEntropyLoss()
    schedule = ScheduleGPipe(stage, 2, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
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
            n = BATCH * schedule._n_microbatches // 2
            with span("batch") if args.mode == "remicrobatch" else contextlib.nullcontext():
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(n, DIM, generator=g), torch.randint(0, 4, (n,), generator=g)
        opt.zero_grad()
        losses = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        opt.step()
        for mb, loss in enumerate(losses):
            print("loss step=%d microbatch=%d value=%r" % (step, mb, loss.item()), flush=True)
        if args.mode.startswith("longjob") and step == 0:
            pprun._step[0] = 2**31 - 1
    print("done rank %d" % rank, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
