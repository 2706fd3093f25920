"""torch_mesh.py: a PyTorch pipelining program on a 3-D mesh, for
tests/test_torch.c (docs/torch.md, "Data-parallel replicas"). 8 ranks as
(dp 2, pp 2, tp 2), tp innermost, as a DeviceMesh lays them out: rank =
4·dp + 2·pp + tp, so each pipeline is 2 ranks 2 apart ([0, 2], [1, 3],
[4, 6], [5, 7]) and pprun counts 4 replicas of it. The tp pair runs the
same pipeline: its "tensor-parallel" all-reduce in each forward (the
pair's outputs averaged, equal already) is the collectives an op runs.
ScheduleGPipe of 2 microbatches, 2 steps; the last stage prints its
losses: "loss rank=R step=S microbatch=M value=V" (M the pipeline's own).

The collectives pprun.torch records as the data-parallel ones
(docs/torch.md, "Data-parallel replicas") and those it must not: before
the first step, the dp pair averages its initial weights (no step yet);
after each step's schedule, the dp pair ({r mod 4, r mod 4 + 4})
all-reduces the weight's gradient, then the bias's with async_op=True
(torch's own Work: asserted), waited for through its future after a
pause, each printed "allreduce rank=R step=S bucket=B t0=NS t1=NS" (the
monotonic clock around the call, or from the call to the wait); after the optimizer, the loss over the world (logging:
a group with the rank's pipeline peer in it), then a backward of its own
whose gradient hook all-reduces over the dp pair (a backward's collective,
as autograd runs hooks on a thread of its own on a GPU). Stage 1's device is the
string "cpu" (pprun's Python wrappers run its ops; stage 0's, a
torch.device, run in pprun._op)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from torch_pipeline import gloo_p2p  # noqa: E402 (the examples' gloo fix)

DIM = 8


class TensorParallel(nn.Module):
    """A layer whose output the tp pair all-reduces in its forward, as a
    tensor-parallel layer does (both compute the whole here: the mean is
    the output)."""

    def __init__(self, layer, group):
        super().__init__()
        self.layer, self.group = layer, group

    def forward(self, x):
        out = self.layer(x)
        summed = out.detach().clone()
        dist.all_reduce(summed, group=self.group)
        return out + (summed / 2 - out.detach())


def main():
    dist.init_process_group("gloo")
    gloo_p2p()
    rank = dist.get_rank()
    assert dist.get_world_size() == 8, "8 ranks: (dp 2, pp 2, tp 2)"
    pipelines = [[4 * d + t, 4 * d + 2 + t] for d in range(2) for t in range(2)]
    groups = [dist.new_group(ranks) for ranks in pipelines]  # every rank makes every group, in one order
    mine = next(g for ranks, g in zip(pipelines, groups) if rank in ranks)
    pairs = [[4 * d + 2 * p, 4 * d + 2 * p + 1] for d in range(2) for p in range(2)]
    tp = [dist.new_group(ranks) for ranks in pairs][rank // 2]
    dp = [dist.new_group([k, k + 4]) for k in range(4)][rank % 4]
    stage_index = (rank % 4) // 2
    torch.manual_seed(0)
    module = TensorParallel([nn.Linear(DIM, DIM), nn.Linear(DIM, 4)][stage_index], tp)
    out_dim = DIM if stage_index == 0 else 4
    device = torch.device("cpu") if stage_index == 0 else "cpu"
    # The examples require grad as the real tensors do: stage 1's input is
    # stage 0's activation, and later torch (2.14) takes a stage's gradient
    # traffic from them: an input that does not sends no gradient back,
    # and stage 0, whose output does, waits for it (step 0 hung there).
    # Stage 0's input is the batch, which needs none.
    example_in = torch.zeros(2, DIM, requires_grad=stage_index > 0)
    stage = PipelineStage(module, stage_index, 2, device, input_args=example_in,
                          output_args=torch.zeros(2, out_dim, requires_grad=True), group=mine)
    schedule = ScheduleGPipe(stage, 2, loss_fn=nn.CrossEntropyLoss())
    params = list(module.parameters())
    with torch.no_grad():
        for q in params:
            dist.all_reduce(q, group=dp)
            q /= 2
    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(10 * step + rank // 4)
        x, y = torch.randn(4, DIM, generator=g), torch.randint(0, 4, (4,), generator=g)
        losses = []
        opt.zero_grad()
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        weight, bias = params
        t0 = time.monotonic_ns()
        dist.all_reduce(weight.grad, group=dp)
        t1 = time.monotonic_ns()
        print("allreduce rank=%d step=%d bucket=0 t0=%d t1=%d" % (rank, step, t0, t1), flush=True)
        t0 = time.monotonic_ns()
        work = dist.all_reduce(bias.grad, group=dp, async_op=True)
        assert isinstance(work, dist.Work), "torch's own Work, under pprun too: %r" % type(work)
        time.sleep(0.01)
        work.get_future().wait()
        t1 = time.monotonic_ns()
        print("allreduce rank=%d step=%d bucket=1 t0=%d t1=%d" % (rank, step, t0, t1), flush=True)
        for q in params:
            q.grad /= 2
        opt.step()
        logged = torch.stack(losses).mean() if losses else torch.zeros(())
        dist.all_reduce(logged)
        probe = torch.ones(1, requires_grad=True)  # a backward's own collective: a hook's, as on autograd's thread
        probe.register_hook(lambda grad: dist.all_reduce(grad.clone(), group=dp))
        (probe * 2).sum().backward()
        for mb, loss in enumerate(losses):
            print("loss rank=%d step=%d microbatch=%d value=%r" % (rank, step, mb, loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
