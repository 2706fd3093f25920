"""torch_mesh.py: a PyTorch pipelining program on a 3-D mesh, for
tests/test_torch.c (docs/torch.md, "Data-parallel replicas"). 8 ranks as
(dp 2, pp 2, tp 2), tp innermost, as a DeviceMesh lays them out: rank =
4·dp + 2·pp + tp, so each pipeline is 2 ranks 2 apart ([0, 2], [1, 3],
[4, 6], [5, 7]) and pprun counts 4 replicas of it. The tp pair runs the
same pipeline (no tensor parallelism is computed here). ScheduleGPipe of
2 microbatches, 2 steps; the last stage prints its losses: "loss rank=R
step=S microbatch=M value=V" (M the pipeline's own)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from torch_pipeline import gloo_p2p  # noqa: E402 (the examples' gloo fix)

DIM = 8


def main():
    dist.init_process_group("gloo")
    gloo_p2p()
    rank = dist.get_rank()
    assert dist.get_world_size() == 8, "8 ranks: (dp 2, pp 2, tp 2)"
    pipelines = [[4 * d + t, 4 * d + 2 + t] for d in range(2) for t in range(2)]
    groups = [dist.new_group(ranks) for ranks in pipelines]  # every rank makes every group, in one order
    mine = next(g for ranks, g in zip(pipelines, groups) if rank in ranks)
    stage_index = (rank % 4) // 2
    torch.manual_seed(0)
    module = [nn.Linear(DIM, DIM), nn.Linear(DIM, 4)][stage_index]
    out_dim = DIM if stage_index == 0 else 4
    stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), input_args=torch.zeros(2, DIM),
                          output_args=torch.zeros(2, out_dim, requires_grad=True), group=mine)
    schedule = ScheduleGPipe(stage, 2, loss_fn=nn.CrossEntropyLoss())
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(10 * step + rank // 4)
        x, y = torch.randn(4, DIM, generator=g), torch.randint(0, 4, (4,), generator=g)
        losses = []
        opt.zero_grad()
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        opt.step()
        for mb, loss in enumerate(losses):
            print("loss rank=%d step=%d microbatch=%d value=%r" % (rank, step, mb, loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
