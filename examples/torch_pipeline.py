"""torch_pipeline.py: a small GPT split into pipeline stages and trained with
one of PyTorch's schedules (torch.distributed.pipelining), one process per
rank, launched as torchrun launches it. Nothing in it is for pprun: run it
under pprun and pprun traces it (docs/torch.md).

    torchrun --nproc-per-node 2 examples/torch_pipeline.py --schedule 1F1B
    pprun run --nproc-per-node 2 --steps 3 -- python3 examples/torch_pipeline.py --schedule 1F1B

--schedule: GPipe, 1F1B (one stage per rank), Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble (--stages-per-rank stages per rank, placed in a loop:
stage s on rank s mod p), ZBVZeroBubble and DualPipeV (two per rank,
placed in a V; DualPipeV from torch 2.8 on, with at least as many
microbatches as stages), or pprun: the schedule `pprun run --schedule
KIND` planned, run by PyTorch through pprun.torch.schedule (the one mode
that imports pprun). --spans
records spans of its own (imports pprun too): each step's batch making as
pprun.span("data", step=...), and the line it prints after each step in a
function decorated with @pprun.span("log"). --crash-at STEP: the rank of
the last stage kills itself (SIGKILL) computing microbatch 1's loss of
step STEP, a rank dying mid-step. --step-times: each rank prints each
step's time and the CPU time its process took in it ("step_time step=S
seconds=X cpu=Y", from zero_grad to the optimizer step): bench/torch.c
reads them, traced and untraced alike. --dp D: D replicas of the pipeline
(the world's ranks in D pipelines of consecutive ranks, as `pprun run
--dp D` lays them out), each on its slice of every global batch, their
gradients averaged by an all-reduce over the ranks holding the same
stages after each step (a span "allreduce" with --spans). --device cuda:
each rank on GPU LOCAL_RANK mod the GPUs it sees, over NCCL (one GPU per
rank: NCCL refuses two ranks on one GPU; stages of one rank share its GPU).
--eval-every K (GPipe and 1F1B): after every K-th step, an evaluation under
torch.no_grad(): a forward-only ScheduleGPipe (no loss function) of
--eval-microbatches N (2 x --microbatches) on the same stage, on a batch of
its own; --eval-first evaluates before the first step too. The last
stage prints the evaluation's loss, computed from the schedule's output:
"evaluation after=S value=V" (S: the steps done). --eval-losses: the
evaluation's GPipe has the loss function and runs by its eval() (a later
torch's; torch 2.6 has none), which computes each microbatch's loss; the
last stage prints them: "eval_loss after=S microbatch=M value=V".

Every rank builds the whole model from one seed and keeps its stages, so
the weights do not depend on the schedule. The rank of the last stage
prints each microbatch's loss as Python writes the float (it reads back
bit for bit): "loss step=S microbatch=M value=V".
Options: --steps N (PPRUN_STEPS when pprun runs it, else 3), --microbatches M
(PPRUN_MICROBATCHES when pprun runs it, else 4), --stages-per-rank V (2),
--layers L (8), --dim D (32), --seq T (16), --microbatch-size B (2),
--lr X (0.05), --seed S (0), --dp D (1), --device cpu|cuda (cpu)."""
import argparse
import inspect
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules

VOCAB = 64

SINGLE = {"GPipe": schedules.ScheduleGPipe, "1F1B": schedules.Schedule1F1B}
V_SHAPED = ["ZBVZeroBubble", "DualPipeV"]
LOOPED = {"Interleaved1F1B": schedules.ScheduleInterleaved1F1B, "LoopedBFS": schedules.ScheduleLoopedBFS,
          "InterleavedZeroBubble": schedules.ScheduleInterleavedZeroBubble}


class Block(nn.Module):
    """One pre-norm Transformer block with causal self-attention."""

    def __init__(self, dim, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """Layers [lo, hi) of the GPT; the first stage embeds, the last one
    ends with the final norm and the vocabulary head."""

    def __init__(self, gpt, lo, hi, first, last):
        super().__init__()
        self.embed = gpt["embed"] if first else None
        self.pos = gpt["pos"] if first else None
        self.blocks = nn.ModuleList(gpt["blocks"][lo:hi])
        self.norm = gpt["norm"] if last else None
        self.head = gpt["head"] if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            # a tensor of its own, not a view of the GEMM's output: the last
            # stage detaches its output in place after the backward
            x = self.head(self.norm(x)).clone()
        return x


class Batch:
    """The Works of one batch_isend_irecv as one Work that waits for all."""

    def __init__(self, works):
        self.works = works

    def wait(self, *args, **kwargs):
        for work in self.works:
            work.wait(*args, **kwargs)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self.works)


def gloo_p2p():
    """Two things PyTorch 2.6's schedules do that gloo does not take, put
    right around batch_isend_irecv (NCCL needs neither):
    - they keep only the last Work of a batch (`.pop()`) and wait for it;
      gloo cancels a send whose Work is freed before the peer took it, so
      1F1B and every multi-stage schedule hang. The batch is returned as
      one Work that waits for all of its ops.
    - a V placement (ZBVZeroBubble) has two adjacent stages on one rank,
      and the multi-stage schedules send and receive between them through
      the process group; gloo has no pair to its own rank. Such a send and
      its receive, in the same batch, are a copy here."""
    real, me = dist.batch_isend_irecv, dist.get_rank()

    def batch_isend_irecv(p2p_op_list):
        sends = [op for op in p2p_op_list if op.peer == me and op.op == dist.isend]
        recvs = [op for op in p2p_op_list if op.peer == me and op.op == dist.irecv]
        if len(sends) != len(recvs):
            raise RuntimeError("a send to this rank without its receive in the same batch")
        with torch.no_grad():
            for send, recv in zip(sends, recvs):
                recv.tensor.copy_(send.tensor)
        rest = [op for op in p2p_op_list if op.peer != me]
        return [Batch(real(rest) if rest else [])]

    dist.batch_isend_irecv = batch_isend_irecv


def build_gpt(args):
    torch.manual_seed(args.seed)
    return {
        "embed": nn.Embedding(VOCAB, args.dim),
        "pos": nn.Parameter(torch.randn(args.seq, args.dim) * 0.02),
        "blocks": [Block(args.dim) for _ in range(args.layers)],
        "norm": nn.LayerNorm(args.dim),
        "head": nn.Linear(args.dim, VOCAB),
    }


def batch(args, step, replica):
    """Next-token prediction on a fixed pseudo-random text: (tokens, targets),
    the replica's slice of the step's global batch."""
    g = torch.Generator().manual_seed(1000 + step)
    n = args.microbatches * args.microbatch_size
    text = torch.randint(0, VOCAB, (args.dp * n, args.seq + 1), generator=g)[replica * n:(replica + 1) * n]
    return text[:, :-1].contiguous(), text[:, 1:].contiguous()


def mesh(args, rank, world):
    """(replica, rank in the pipeline, pipeline size, the pipeline's group,
    the group of the ranks holding the same stages); groups None for one
    pipeline. new_group is collective: every rank makes every group."""
    if args.dp < 1 or world % args.dp:
        raise SystemExit("torch_pipeline.py: --dp %d does not divide the %d ranks" % (args.dp, world))
    pp = world // args.dp
    if args.dp == 1:
        return 0, rank, pp, None, None
    pipes = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(args.dp)]
    same_stage = [dist.new_group(list(range(k, world, pp))) for k in range(pp)]
    return rank // pp, rank % pp, pp, pipes[rank // pp], same_stage[rank % pp]


def average_gradients(params, group, replicas):
    """Every replica's gradients summed, then averaged: DDP's reduction."""
    for q in params:
        if q.grad is not None:
            dist.all_reduce(q.grad, group=group)
            q.grad /= replicas


def placement(args, rank, world):
    """This rank's stage indices, the number of stages, and each stage's rank."""
    if args.schedule == "pprun":
        import pprun.torch

        ranks = [int(r) for r in os.environ["PPRUN_STAGE_RANKS"].split(",")]
        return pprun.torch.stage_indices(rank), len(ranks), ranks
    if args.schedule in SINGLE:
        return [rank], world, list(range(world))
    if args.schedule in V_SHAPED:
        n = 2 * world
        ranks = [s if s < world else n - 1 - s for s in range(n)]
        return [rank, n - 1 - rank], n, ranks
    n = args.stages_per_rank * world
    return [s for s in range(n) if s % world == rank], n, [s % world for s in range(n)]


def from_pprun(name, default):
    """What `pprun run` asked for (its --steps, --microbatches), when it runs
    this program: so `pprun run --microbatches 8 -- ... --schedule pprun`
    needs the number once. A flag given to the program still wins."""
    v = os.environ.get(name)
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise SystemExit("torch_pipeline.py: %s=%r is not a whole number" % (name, v))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--schedule", default="1F1B", choices=list(SINGLE) + list(LOOPED) + V_SHAPED + ["pprun"])
    p.add_argument("--steps", type=int, default=from_pprun("PPRUN_STEPS", 3))
    p.add_argument("--microbatches", type=int, default=from_pprun("PPRUN_MICROBATCHES", 4))
    p.add_argument("--stages-per-rank", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spans", action="store_true", help="spans of its own: 'data' and 'log'")
    p.add_argument("--crash-at", type=int, default=-1, metavar="STEP")
    p.add_argument("--step-times", action="store_true", help="print each step's time and CPU time")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--eval-every", type=int, default=0, metavar="K")
    p.add_argument("--eval-microbatches", type=int, default=0, metavar="N")
    p.add_argument("--eval-first", action="store_true")
    p.add_argument("--eval-losses", action="store_true", help="evaluate by the schedule's eval(), with losses")
    args = p.parse_args()
    if (args.eval_every or args.eval_first) and args.schedule not in SINGLE:
        raise SystemExit("torch_pipeline.py: --eval-every and --eval-first take GPipe or 1F1B")
    if args.schedule == "DualPipeV" and not hasattr(schedules, "ScheduleDualPipeV"):
        raise SystemExit("torch_pipeline.py: torch %s has no ScheduleDualPipeV (torch 2.8 on)" % torch.__version__)
    if args.eval_losses and not hasattr(schedules.ScheduleGPipe, "eval"):
        raise SystemExit("torch_pipeline.py: torch %s's schedules have no eval() (--eval-losses)" % torch.__version__)

    if args.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    gloo_p2p()
    replica, rank, world, pipe, same_stage = mesh(args, dist.get_rank(), dist.get_world_size())
    mine, nstages, stage_rank = placement(args, rank, world)
    if args.layers < nstages:
        raise SystemExit("torch_pipeline.py: %d layers cannot fill %d stages" % (args.layers, nstages))

    gpt = build_gpt(args)
    bounds = [args.layers * s // nstages for s in range(nstages + 1)]
    mb, t, d = args.microbatch_size, args.seq, args.dim
    stages, modules = [], []
    for s in mine:
        first, last = s == 0, s == nstages - 1
        module = Stage(gpt, bounds[s], bounds[s + 1], first, last).to(dev)
        # Shapes given: no shape inference by p2p at the first step (it
        # assumes ranks in a loop, which a V placement is not). The examples
        # require grad as the real activations do: later torch takes the
        # stage's gradient traffic from them (an output that does not gets
        # no gradient back).
        x = (torch.zeros(mb, t, dtype=torch.long, device=dev) if first
             else torch.zeros(mb, t, d, device=dev, requires_grad=True))
        y = torch.zeros(mb, t, VOCAB if last else d, device=dev, requires_grad=True)
        stages.append(PipelineStage(module, s, nstages, dev, input_args=x, output_args=y, group=pipe))
        modules.append(module)

    step_now, losses_now = [0], [0]

    def loss_fn(logits, target):
        losses_now[0] += 1
        if step_now[0] == args.crash_at and losses_now[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))

    if args.schedule == "pprun":
        import pprun.torch

        schedule = pprun.torch.schedule(stages, args.microbatches, loss_fn)
    elif args.schedule in SINGLE:
        schedule = SINGLE[args.schedule](stages[0], args.microbatches, loss_fn=loss_fn)
    elif args.schedule == "ZBVZeroBubble":
        # torch 2.6 takes the V placement; later versions place the V themselves (the same one)
        extra = {}
        if "stage_index_to_group_rank" in inspect.signature(schedules.ScheduleZBVZeroBubble.__init__).parameters:
            extra["stage_index_to_group_rank"] = dict(enumerate(stage_rank))
        schedule = schedules.ScheduleZBVZeroBubble(stages, args.microbatches, loss_fn=loss_fn, **extra)
    elif args.schedule == "DualPipeV":
        schedule = schedules.ScheduleDualPipeV(stages, args.microbatches, loss_fn=loss_fn)
    else:
        schedule = LOOPED[args.schedule](stages, args.microbatches, loss_fn=loss_fn)

    params = [q for m in modules for q in m.parameters()]
    opt = torch.optim.SGD(params, lr=args.lr)
    has_first, has_last = 0 in mine, nstages - 1 in mine

    def log(step, losses):
        first = replica * args.microbatches  # the step's global microbatch numbers
        for i, loss in enumerate(losses):
            print("loss step=%d microbatch=%d value=%r" % (step, first + i, loss.item()), flush=True)

    evaluation = None
    if args.eval_every or args.eval_first:
        n_eval = args.eval_microbatches or 2 * args.microbatches
        if args.eval_losses:  # forward only by eval(), which computes the losses
            evaluation = schedules.ScheduleGPipe(stages[0], n_eval, loss_fn=loss_fn)
        else:  # no loss function: forward only
            evaluation = schedules.ScheduleGPipe(stages[0], n_eval)
        # a schedule sets its stage's has_backward (torch 2.6): the training
        # schedule's stage must keep its own, or its backward computes NaN
        stages[0].has_backward = schedule._has_backward

    def evaluate(done):
        g = torch.Generator().manual_seed(7 + done)
        text = torch.randint(0, VOCAB, (n_eval * args.microbatch_size, args.seq + 1), generator=g)
        inputs = (text[:, :-1].contiguous().to(dev),) if has_first else ()
        if args.eval_losses:
            losses = []
            out = evaluation.eval(*inputs, target=text[:, 1:].to(dev) if has_last else None,
                                  losses=losses if has_last else None)
            for i, loss in enumerate(losses):
                print("eval_loss after=%d microbatch=%d value=%r" % (done, i, loss.item()), flush=True)
        else:
            with torch.no_grad():
                out = evaluation.step(*inputs)
        if has_last:
            loss = F.cross_entropy(out.reshape(-1, VOCAB), text[:, 1:].to(dev).reshape(-1))
            print("evaluation after=%d value=%r" % (done, loss.item()), flush=True)

    if args.eval_first:
        evaluate(0)
    data, reduce = None, average_gradients
    if args.spans:
        import pprun

        log = pprun.span("log")(log)
        data = pprun.span
        nbytes = sum(q.numel() * q.element_size() for q in params)
        reduce = pprun.span("allreduce", bytes=nbytes)(average_gradients)
    for step in range(args.steps):
        step_now[0], losses_now[0] = step, 0
        t0, cpu0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        if data:
            with data("data", step=step):
                tokens, targets = batch(args, step, replica)
        else:
            tokens, targets = batch(args, step, replica)
        tokens, targets = tokens.to(dev), targets.to(dev)
        losses = []
        inputs = (tokens,) if has_first else ()
        schedule.step(*inputs, target=targets if has_last else None, losses=losses if has_last else None)
        if same_stage is not None:
            reduce(params, same_stage, args.dp)
        opt.step()
        if args.step_times:
            print("step_time step=%d seconds=%r cpu=%r" % (step, time.perf_counter() - t0, time.process_time() - cpu0),
                  flush=True)
        log(step, losses)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            evaluate(step + 1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
