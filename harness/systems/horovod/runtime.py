"""Horovod's rank function: the GPT through the baselines' runtime, the small CNN through its own loop.

A CNN step (HetPipe's baseline for its convergence figures, Figs. 5-6): every rank holds the whole
model, trains its share of the batch (--batch / ranks samples, in minibatches of --micro-batch whose
gradients add up), then the gradients are averaged with one all-reduce (gloo's ring on the CPU, as
Horovod's) and every rank takes the same SGD step. The all-reduce follows the backward rather than
overlapping it: the small CNN's 43 k parameters make it short beside the compute model's minibatch.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from ...plan.request import RunSpec
from ...train import wire
from ...train.compute_model import pacer_for
from ...train.nets import net_of
from ...train.rank import RankContext, iteration_progress, torch_dtype
from ...train.reference import make_optimizer
from ...train.stats import IterationStats
from ..baselines.systems import train_horovod as train_horovod_gpt


def train_horovod(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """Horovod-style (HetPipe's baseline): every device holds the whole model, gradients all-reduced, one
    synchronous step per iteration."""
    if not spec.model.is_cnn:
        return train_horovod_gpt(ctx, spec)
    return _train_cnn(ctx, spec)


def _train_cnn(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    m, n = spec.model, ctx.world_size  # the batch splits into n ranks' minibatches: Layout.check said so
    net, dtype = net_of(m), torch_dtype(spec)
    model = net.build().to(dtype)
    params = list(model.parameters())
    opt = make_optimizer(params, m.lr)
    pacer = pacer_for(spec, 0, ctx.device_index, ctx.device)
    share = m.batch // n
    steps = spec.run.warmup + spec.run.iters
    stats = ctx.iteration_log()
    ctx.mark("training")
    end = time.monotonic()
    for it in range(steps):
        images, labels = net.batch(it)
        compute, losses = 0.0, []
        opt.zero_grad(set_to_none=True)
        for lo in range(ctx.rank * share, (ctx.rank + 1) * share, m.micro_batch):
            x, y = images[lo:lo + m.micro_batch].to(dtype), labels[lo:lo + m.micro_batch]
            t0 = time.perf_counter()
            with pacer.phase("forward"):
                loss = net.loss(model(x), y) * (m.micro_batch / share)
            with pacer.phase("backward"):
                loss.backward()
            compute += time.perf_counter() - t0
            losses.append(float(loss.detach()) * share / m.micro_batch)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        t0 = time.perf_counter()
        with pacer.phase("optimizer"):
            opt.step()
        compute += time.perf_counter() - t0
        now = time.monotonic()
        seconds, end = now - end, now
        if it >= spec.run.warmup:
            busy = min(compute, seconds)
            stats.append(IterationStats(seconds, busy, seconds - busy, float(np.mean(losses)), now,
                                        **pacer.take_iteration(), **wire.take_iteration()))
        else:
            pacer.take()
            wire.take_iteration()
        if ctx.rank == 0:
            iteration_progress(it, steps, spec.run.warmup, seconds)
    ctx.save_state(dict(model.named_parameters()))
    return stats
