"""DiLoCo's rank function, on torchft: replicas take H inner steps, then an outer step on their averaged
pseudo-gradients (torchft.local_sgd.DiLoCo; streaming: one fragment of the model at a time).

Every rank builds the whole GPT (the same seed: identical weights, so torchft's initial sync is off). The devices
split into `replicas` replicas of consecutive ranks (a replica's devices share its inner steps as synchronous
data parallelism, their gradients all-reduced over the replica's own group each step). An iteration is one inner
step of every replica on the global batch: replica r's devices take its 1/replicas share, so every system
trains on the same samples an iteration. Every `sync_every` inner steps (H) each fragment's pseudo-gradient
(its parameters at the last sync minus now) is averaged over the replicas in the quorum and the outer optimizer
(SGD with Nesterov momentum) steps with it.

torchft's pieces, placed on the emulated cluster:
- the Lighthouse (the quorum's coordinator) runs in the process of the rank on `--lighthouse-device` (device 0
  by default); it starts before the replicas' managers and stops when the run ends, with its rank, so nothing
  outlives the run. Its heartbeats and quorum RPCs go to that device's address: they cross the shaped links as
  all traffic;
- each replica's first device hosts its TCPStore and torchft's manager server (what peers reach for the quorum's
  process group and a recovering replica's checkpoint), on its own address;
- the cross-replica all-reduces go through torchft's reconfigurable ProcessGroupGloo, a fragment's
  pseudo-gradients in flat buckets (torchft's bucketization: one call, not one per parameter), encoded as `wire`
  asks (codec.py).

Inner steps are paced by the compute model as every system's (forward and backward per micro-batch, the inner
optimizer); the outer sync runs in the inner optimizer's post-step hook (torchft's design) after the paced step,
so its time is communication. Each outer step (each fragment's sync) is a row of the iteration's
`outer_syncs`: when, how long the sync blocked, what this rank sent, the quorum's size and whether it committed.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from .members import ADAMW, diloco_of, join_torchft, stay_for_the_others, sync_row  # first: torchft after RUST_LOG

from ...plan.request import RunSpec
from ...train import wire
from ...train.compute_model import pacer_for
from ...train.gpt import GPT, lm_loss, synthetic_batch
from ...train.rank import RankContext, iteration_progress, torch_dtype
from ...train.reference import make_optimizer
from ...train.stats import IterationStats
from .settings import DiLoCoSettings


def train_diloco(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    if spec.layout.pp > 1:  # a replica is one of ours' pipelines
        from .pipeline_replicas import train_diloco_pipelines

        return train_diloco_pipelines(ctx, spec)
    devices = spec.layout.devices
    s = DiLoCoSettings.of(spec.run.options, devices, spec.cfg.layers)
    m, k = spec.model, s.devices_per_replica(devices)
    replica, group_rank = divmod(ctx.device_index, k)
    one_job = ctx.world_size == devices  # else this replica is a job of its own (train/quorum_agent.py)
    inner_groups = [dist.new_group(list(range(r * k, (r + 1) * k))) for r in range(devices // k)] if k > 1 else None

    model = GPT(spec.cfg, m.seed).to(torch_dtype(spec))
    params = list(model.parameters())
    inner = (torch.optim.AdamW(params, lr=s.inner_lr, **ADAMW) if s.inner_optimizer == "adamw"
             else make_optimizer(params, m.lr))
    sent = [0, 0]  # bytes this rank sent in outer syncs: in all, and at the last sync's end

    def on_send(b: int) -> None:
        sent[0] += b

    where = {"it": spec.resolved.start_iteration}  # the iteration under way ("healed": a peer's, once healed)

    def load_state(sd: dict) -> None:  # a replica behind heals: the peer's model, inner optimizer and iteration
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        where["healed"] = sd["iteration"]

    member = join_torchft(
        ctx, spec, s, replica=replica, group_rank=group_rank, k=k, leader_rank=replica * k if one_job else 0,
        one_job=one_job, on_send=on_send,
        load_state_dict=load_state,
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict(), "iteration": where["it"]})
    manager = member.manager
    pacer = pacer_for(spec, 0, ctx.device_index, ctx.device)
    paced = [0.0, 0.0]  # when the inner step began and when its paced time ended

    def began(*_):
        paced[0] = pacer.begin()

    def ended(*_):
        pacer.finish("optimizer", paced[0])
        paced[1] = time.perf_counter()

    inner.register_step_pre_hook(began)
    inner.register_step_post_hook(ended)  # before DiLoCo's, whose post-step hook syncs
    try:
        with diloco_of(manager, model, inner, s):
            stats = _train(ctx, spec, s, model, inner, manager, pacer, paced, inner_groups, replica, k, sent, where)
        ctx.save_state(dict(model.named_parameters()))
        if member.lighthouse is not None and not one_job:
            stay_for_the_others(ctx, spec.run.timeout_s)
        return stats
    finally:
        member.shutdown()


def _train(ctx, spec, s, model, inner, manager, pacer, paced: list, inner_groups, replica: int, k: int, sent: list,
           where: dict):
    """The inner steps from spec.resolved.start_iteration on (a replica back mid-run starts where the others are);
    `where["it"]`: the iteration under way, which a peer's state carries to a replica that heals from it."""
    m, n = spec.model, spec.layout.devices
    share = m.batch // n  # this device's samples an inner step
    per_sync = s.sync_every // s.fragments  # inner steps between two fragments' syncs
    steps = spec.run.warmup + spec.run.iters
    stats = ctx.iteration_log()
    ctx.mark("training")
    end, taken, it = time.monotonic(), 0, spec.resolved.start_iteration
    while it < steps:
        where["it"] = it
        tokens, targets = synthetic_batch(spec.cfg, m.batch, it, m.seed, m.data)
        inner.zero_grad(set_to_none=True)
        compute, losses = 0.0, []
        ctx.reached("forward", it)
        for lo in range(ctx.device_index * share, (ctx.device_index + 1) * share, m.micro_batch):
            t0 = time.perf_counter()
            with pacer.phase("forward"):
                loss = lm_loss(model(tokens[lo:lo + m.micro_batch]), targets[lo:lo + m.micro_batch])
                loss = loss * (m.micro_batch / share)
            with pacer.phase("backward"):
                loss.backward()
            compute += time.perf_counter() - t0
            losses.append(float(loss.detach()) * share / m.micro_batch)
        if inner_groups is not None:  # the replica's devices: synchronous data parallel inside it
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=inner_groups[replica])
            flat /= k
            torch.nn.utils.vector_to_parameters(flat, [p.grad for p in model.parameters()])
        outer_step, taken = manager.current_step(), taken + 1
        fragment = outer_step % s.fragments
        if taken % per_sync == 0:
            ctx.reached("dp_sync", it)  # as the outer sync begins
        inner.step()  # paced by the hooks; then DiLoCo's post-step hook syncs a fragment every per_sync steps
        synced = time.perf_counter()
        compute += paced[1] - paced[0]
        now = time.monotonic()
        seconds, end = now - end, now
        syncs = None
        if taken % per_sync == 0:
            # the iteration of the sync this replica took part in: the others', when it healed from them in it
            syncs = [sync_row(ctx, manager, where.get("healed", it), replica, outer_step, fragment,
                              synced - paced[1], sent, now)]
        if it >= spec.run.warmup:
            busy = min(compute, seconds)
            stats.append(IterationStats(seconds, busy, seconds - busy, float(np.mean(losses)), now, iteration=it,
                                        outer_syncs=syncs, **pacer.take_iteration(), **wire.take_iteration()))
        else:
            pacer.take()
            wire.take_iteration()
        if ctx.device_index == s.lighthouse_device:  # the device that stays to the end
            iteration_progress(it, steps, spec.run.warmup, seconds)
        it = where.pop("healed", it) + 1  # healed in this step's sync: the peer's iteration
    return stats
