#!/usr/bin/env python3
"""bench/torch_gpt.py: pprun's gpt model (docs/model.md) in PyTorch, trained
with the same 1F1B schedule over gloo, one process per stage, one thread
each: the other side of bench_torch's comparison (bench/torch.c runs both).

Same model as pprun's: byte vocabulary, learned positions, pre-LayerNorm
blocks (causal attention, 4C MLP with tanh GELU), final LayerNorm, an untied
LM head without bias; weights stored [out][in] as pprun's. Same
initialisation, drawn here from the same splitmix64 streams per (seed,
layer) and the same Box-Muller, so both start from the same floats. Same
batches: the same windows of the same --data file. Same partition (an even
split of the layers, the remainder to the later stages), same AdamW (lr
1e-3, betas 0.9/0.95, eps 1e-8, no weight decay), loss the mean over
microbatches.

Written the way a PyTorch user writes it (nanoGPT's attention, F.linear,
F.layer_norm, F.gelu, F.cross_entropy, torch.optim.AdamW, autograd for B
and W together); nothing tuned for the comparison.

Prints one JSON line per step from the last stage's rank: the step's loss,
the losses of its microbatches and step_ms (that rank's time from the
start of its step to the end of its optimizer step, as pprun's
--metrics step_ms).

  python3 bench/torch_gpt.py --model gpt:layers=8,dim=64,heads=4,seq=64,batch=4 \\
      --ranks 4 --microbatches 8 --steps 20 --data FILE [--seed 1234]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

VOCAB = 256
GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


def parse_model(text):
    spec = {"layers": 8, "dim": 64, "heads": 4, "seq": 64, "batch": 4}
    name, _, rest = text.partition(":")
    if name != "gpt":
        sys.exit("torch_gpt.py: --model must be gpt[:key=value,...]")
    for kv in filter(None, rest.split(",")):
        key, _, value = kv.partition("=")
        if key not in spec:
            sys.exit(f"torch_gpt.py: unknown key '{key}'; accepted: {', '.join(spec)}")
        spec[key] = int(value)
    return spec


# ---- pprun's PRNG (runner/model/model_internal.h), vectorised ---------------

def mix64(z):
    """splitmix64's output function over a uint64 array."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Stream:
    """A splitmix64 state: the k-th draw is mix64(state + k * golden)."""

    def __init__(self, seed, ident):
        state = (seed ^ ((0xA0761D6478BD642F * (ident + 1)) & MASK64)) & MASK64
        self.state = (state + GOLDEN) & MASK64  # rng_for's one discarded draw
        self.used = 0

    def draws(self, n):
        k = np.arange(self.used + 1, self.used + n + 1, dtype=np.uint64)
        self.used += n
        with np.errstate(over="ignore"):
            return mix64(np.uint64(self.state) + k * np.uint64(GOLDEN))

    def normal(self, n, std):
        """fill_normal: Box-Muller in double from two uniforms in (0, 1], then float."""
        z = self.draws(2 * n)
        u = ((z >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 9007199254740992.0)
        u1, u2 = u[0::2], u[1::2]
        return (float(std) * np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)).astype(np.float32)


def f32(x):
    return float(np.float32(x))


def block_params(seed, layer, L, C):
    """One block in pprun's order: ln1g ln1b wqkv bqkv wo bo ln2g ln2b wfc bfc wp bp."""
    s = Stream(seed, layer)
    proj_std = f32(np.float32(0.02) / np.sqrt(np.float32(2.0 * L), dtype=np.float32))
    p = {}
    p["ln1g"], p["ln1b"] = np.ones(C, np.float32), np.zeros(C, np.float32)
    p["wqkv"], p["bqkv"] = s.normal(3 * C * C, f32(0.02)).reshape(3 * C, C), np.zeros(3 * C, np.float32)
    p["wo"], p["bo"] = s.normal(C * C, proj_std).reshape(C, C), np.zeros(C, np.float32)
    p["ln2g"], p["ln2b"] = np.ones(C, np.float32), np.zeros(C, np.float32)
    p["wfc"], p["bfc"] = s.normal(4 * C * C, f32(0.02)).reshape(4 * C, C), np.zeros(4 * C, np.float32)
    p["wp"], p["bp"] = s.normal(4 * C * C, proj_std).reshape(C, 4 * C), np.zeros(C, np.float32)
    return p


# ---- batches (runner/model/data.c) -----------------------------------------

def batch(data, seed, step, mb, B, T):
    span = len(data) - T - 1 if len(data) > T + 1 else 1
    tok = np.empty((B, T), np.int64)
    tgt = np.empty((B, T), np.int64)
    for b in range(B):
        st = (seed ^ ((((step & 0xFFFFFFFF) << 32 | (mb & 0xFFFFFFFF)) * 0xD1342543DE82EF95) & MASK64)) & MASK64
        st = (st + b * 0x632BE59BD9B4E019) & MASK64
        st = (st + GOLDEN) & MASK64  # one draw discarded
        st = (st + GOLDEN) & MASK64
        off = int(mix64(np.array([st], dtype=np.uint64))[0]) % span
        idx = (off + np.arange(T + 1)) % len(data)
        window = data[idx]
        tok[b], tgt[b] = window[:-1], window[1:]
    return torch.from_numpy(tok), torch.from_numpy(tgt)


# ---- the model ----------------------------------------------------------------

class Stage(torch.nn.Module):
    """Blocks [first, last), plus the embeddings (first stage) and the head (last)."""

    def __init__(self, spec, seed, first, last, is_first, is_last):
        super().__init__()
        L, C, T = spec["layers"], spec["dim"], spec["seq"]
        self.C, self.H, self.is_first, self.is_last = C, spec["heads"], is_first, is_last
        P = lambda a: torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a)))
        if is_first:
            s = Stream(seed, 1000001)
            self.wte = P(s.normal(VOCAB * C, f32(0.02)).reshape(VOCAB, C))
            self.wpe = P(s.normal(T * C, f32(0.01)).reshape(T, C))
        self.blocks = torch.nn.ModuleList()
        for layer in range(first, last):
            m = torch.nn.Module()
            for name, value in block_params(seed, layer, L, C).items():
                setattr(m, name, P(value))
            self.blocks.append(m)
        if is_last:
            s = Stream(seed, 1000002)
            self.lnfg, self.lnfb = P(np.ones(C, np.float32)), P(np.zeros(C, np.float32))
            self.whead = P(s.normal(VOCAB * C, f32(0.02)).reshape(VOCAB, C))
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def attention(self, m, x):
        B, T, C = x.shape
        hs = C // self.H
        h = F.layer_norm(x, (C,), m.ln1g, m.ln1b, 1e-5)
        q, k, v = F.linear(h, m.wqkv, m.bqkv).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return F.linear(y, m.wo, m.bo)

    def forward(self, x, tokens=None, targets=None):
        if self.is_first:
            T = tokens.shape[1]
            x = self.wte[tokens] + self.wpe[:T]
        for m in self.blocks:
            x = x + self.attention(m, x)
            h = F.layer_norm(x, (self.C,), m.ln2g, m.ln2b, 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, m.wfc, m.bfc), approximate="tanh"), m.wp, m.bp)
        if not self.is_last:
            return x
        logits = F.linear(F.layer_norm(x, (self.C,), self.lnfg, self.lnfb, 1e-5), self.whead)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def partition(layers, stages):
    """sched_partition's even split: the remainder to the later stages."""
    base, rem = divmod(layers, stages)
    first = [0]
    for s in range(stages):
        first.append(first[-1] + base + (1 if s >= stages - rem else 0))
    return first


def one_f_one_b(stage, stages, m):
    """The order of F and B (B and W together) on one stage: warm-up F's, then
    alternate, then the remaining B's (PipeDream-flush)."""
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def run(rank, args):
    torch.set_num_threads(1)
    spec, P, M = parse_model(args.model), args.ranks, args.microbatches
    if P > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=P)
    first = partition(spec["layers"], P)
    stage = Stage(spec, args.seed, first[rank], first[rank + 1], rank == 0, rank == P - 1)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    data = np.fromfile(args.data, dtype=np.uint8)
    B, T, C = spec["batch"], spec["seq"], spec["dim"]
    order = one_f_one_b(rank, P, M)
    for step in range(args.steps):
        t0 = time.perf_counter()
        outs, ins, losses, sends = {}, {}, [0.0] * M, []
        for op, mb in order:
            if op == "F":
                tok, tgt = batch(data, args.seed, step, mb, B, T) if rank in (0, P - 1) else (None, None)
                x = None
                if rank > 0:
                    x = torch.empty(B, T, C)
                    dist.recv(x, rank - 1)
                    x.requires_grad_()
                ins[mb] = x
                y = stage(x, tok, tgt)
                if rank == P - 1:
                    losses[mb] = y.item()
                    outs[mb] = y / M  # the step's loss is the mean over microbatches
                else:
                    sends.append(dist.isend(y.detach(), rank + 1))
                    outs[mb] = y
            else:
                if rank == P - 1:
                    outs.pop(mb).backward()
                else:
                    g = torch.empty(B, T, C)
                    dist.recv(g, rank + 1)
                    outs.pop(mb).backward(g)
                x = ins.pop(mb)
                if rank > 0:
                    sends.append(dist.isend(x.grad, rank - 1))
        opt.step()
        opt.zero_grad(set_to_none=False)
        for s in sends:
            s.wait()
        if rank == P - 1:
            ms = (time.perf_counter() - t0) * 1e3
            print(json.dumps({"step": step, "loss": sum(losses) / M, "losses": losses, "step_ms": ms}), flush=True)
    if P > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data", required=True)
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    if args.ranks == 1:
        run(0, args)
    else:
        mp.spawn(run, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
