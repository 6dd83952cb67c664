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

import logging
import os
import socket
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import TCPStore

os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers (read when it loads) log every quorum at info

from torchft import Manager  # noqa: E402 (after RUST_LOG) here, not in the rank: a job forks with them loaded
from torchft.local_sgd import DiLoCo  # noqa: E402

from ...plan.request import RunSpec
from ...files import atomic_write_text
from ...train import wire
from ...train.compute_model import pacer_for
from ...train.gpt import GPT, lm_loss, synthetic_batch
from ...train.rank import RankContext, iteration_progress, torch_dtype
from ...train.reference import make_optimizer
from ...train.quorum_agent import STAYING_MARK, ended_file, lighthouse_file
from ...train.stats import IterationStats
from .codec import WireProcessGroup
from .settings import DiLoCoSettings, fragment_cuts

ADAMW = {"weight_decay": 0.1, "betas": (0.9, 0.95)}  # DiLoCo's inner AdamW (Douillard et al. 2023, sec. 3)


def fragments_of(model: GPT, fragments: int) -> list[torch.nn.Module]:
    """The GPT in `fragments` runs of consecutive blocks, as even as they go (the embedding with the first, the
    head with the last): Streaming DiLoCo's fragments (one: the whole model)."""
    layers = len(model.blocks)
    cuts = fragment_cuts(layers, fragments)
    out = []
    for i in range(fragments):
        parts = [model.embed] if i == 0 else []
        parts += list(model.blocks[cuts[i]:cuts[i + 1]])
        parts += [model.head] if i == fragments - 1 else []
        out.append(torch.nn.ModuleList(parts))
    return out


def _lighthouse(ctx: RankContext, join_timeout_s: float):
    """torchft's Lighthouse on this rank's device: any quorum of at least one replica, formed as soon as every
    replica of the last quorum still heartbeating has asked, or `join_timeout_s` after the round's first request."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=f"{ctx.addr}:0", min_replicas=1, join_timeout_ms=int(join_timeout_s * 1000))
    port = int(server.address().rsplit(":", 1)[1])  # it names itself by host name: peers need the address
    return server, f"http://{ctx.addr}:{port}"


def _meet_lighthouse(ctx: RankContext, mine: str | None, timeout_s: float) -> str:
    """A replica started on its own (train/quorum_agent.py) learns the Lighthouse's address from the file its rank
    writes in the run's quorum directory (the parent of every replica's journal)."""
    path = lighthouse_file(ctx.journal)
    if mine is not None:
        atomic_write_text(path, mine)
        return mine
    _wait(path.exists, timeout_s, f"no Lighthouse address in {path}")
    return path.read_text()


def _all_heartbeating(ctx: RankContext, devices: int, timeout_s: float) -> None:
    """A replica started on its own says its manager is up (heartbeating) and waits until every device's has been,
    so that the first quorum waits for them all; a replica back mid-run finds them all there and goes on."""
    here = lighthouse_file(ctx.journal).parent
    atomic_write_text(here / f"up-{ctx.device_index}", "")
    _wait(lambda: len(list(here.glob("up-*"))) >= devices, timeout_s, "not every replica's manager was up")


def _wait(done, timeout_s: float, failing: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failing} after {timeout_s:g} s")
        time.sleep(0.05)


def _checkpoint_transport(addr: str, timeout: timedelta):
    """torchft's HTTP transport, advertised on the device's address (it would give the host name, which every
    rank of the emulated cluster shares)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class DeviceHTTPTransport(HTTPTransport):
        def address(self) -> str:
            return super().address().replace(f"//{socket.gethostname()}:", f"//{addr}:", 1)

    return DeviceHTTPTransport(timeout=timeout, num_chunks=0)


def train_diloco(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    logging.getLogger("torchft").setLevel(logging.WARNING)
    # at every quorum, on every rank: NCCL's flight recorder, which a CPU run has none of
    logging.getLogger("torchft.manager").addFilter(lambda rec: "flight recorder" not in rec.getMessage())
    devices = spec.layout.devices
    s = DiLoCoSettings.of(spec.run.options, devices, spec.cfg.layers)
    m, k = spec.model, s.devices_per_replica(devices)
    replica, group_rank = divmod(ctx.device_index, k)
    timeout = timedelta(seconds=spec.run.group_timeout_s)
    sync_timeout = timedelta(seconds=s.sync_timeout or spec.run.group_timeout_s)  # settings.py: a peer lost in a sync
    one_job = ctx.world_size == devices  # else this replica is a job of its own (train/quorum_agent.py)
    inner_groups = [dist.new_group(list(range(r * k, (r + 1) * k))) for r in range(devices // k)] if k > 1 else None

    lighthouse, lighthouse_addr, store = None, None, None
    if ctx.device_index == s.lighthouse_device:
        lighthouse, lighthouse_addr = _lighthouse(ctx, s.join_timeout)
    if group_rank == 0:
        store = TCPStore(ctx.addr, 0, is_master=True, wait_for_workers=False)
    if one_job:  # every rank's addresses over the default group
        every = [None] * devices
        dist.all_gather_object(every, [ctx.addr, store.port if store else None, lighthouse_addr])
        leader = every[replica * k]
        lighthouse_addr = next(e[2] for e in every if e[2])
    else:  # a replica of one device: its own store; the Lighthouse's address where its rank wrote it
        leader = [ctx.addr, store.port]
        lighthouse_addr = _meet_lighthouse(ctx, lighthouse_addr, spec.run.group_timeout_s)

    model = GPT(spec.cfg, m.seed).to(torch_dtype(spec))
    params = list(model.parameters())
    inner = (torch.optim.AdamW(params, lr=s.inner_lr, **ADAMW) if s.inner_optimizer == "adamw"
             else make_optimizer(params, m.lr))
    fragments = fragments_of(model, s.fragments)
    # one outer optimizer a fragment: a shared one would also step the other fragments' parameters on the inner
    # gradients they still hold
    outer = [torch.optim.SGD(f.parameters(), lr=s.outer_lr, momentum=s.outer_momentum,
                             nesterov=s.outer_momentum > 0) for f in fragments]
    sent = [0, 0]  # bytes this rank sent in outer syncs: in all, and at the last sync's end

    def on_send(b: int) -> None:
        sent[0] += b

    where = {"it": spec.resolved.start_iteration}  # the iteration under way ("healed": a peer's, once healed)

    def load_state(sd: dict) -> None:  # a replica behind heals: the peer's model, inner optimizer and iteration
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        where["healed"] = sd["iteration"]

    manager = Manager(
        pg=WireProcessGroup(s.wire, sync_timeout, on_send), min_replica_size=1, use_async_quorum=False,
        load_state_dict=load_state,
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict(), "iteration": where["it"]},
        rank=group_rank, world_size=k, store_addr=leader[0], store_port=leader[1], lighthouse_addr=lighthouse_addr,
        replica_id=f"replica{replica}", hostname=ctx.addr, init_sync=False, timeout=sync_timeout,
        quorum_timeout=timeout, connect_timeout=timeout,
        checkpoint_transport=_checkpoint_transport(ctx.addr, timeout))
    if one_job:
        dist.barrier()  # every manager heartbeats before the first quorum: it waits for them all
    else:
        _all_heartbeating(ctx, devices, spec.run.group_timeout_s)
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
        with DiLoCo(manager, fragments, inner, outer, sync_every=s.sync_every, backup_device=torch.device("cpu"),
                    pin_memory=False, use_bucketization=True, fragment_sync_delay=s.fragment_sync_delay,
                    fragment_update_alpha=s.fragment_update_alpha):
            stats = _train(ctx, spec, s, model, inner, manager, pacer, paced, inner_groups, replica, k, sent, where)
        ctx.save_state(dict(model.named_parameters()))
        if lighthouse is not None and not one_job:  # replicas behind (a sync timed out) still need its quorums
            ctx.mark(STAYING_MARK)
            _wait(ended_file(ctx.journal).exists, spec.run.timeout_s, "the other replicas did not end")
        return stats
    finally:
        manager.shutdown(wait=False)
        if lighthouse is not None:
            lighthouse.shutdown()


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
            syncs = [{"iteration": where.get("healed", it), "rank": ctx.device_index, "replica": replica,
                      "outer_step": manager.current_step(), "fragment": fragment, "seconds": synced - paced[1],
                      "bytes": sent[0] - sent[1], "participants": manager.num_participants(),
                      "committed": int(manager.current_step() > outer_step), "end": now}]
            sent[1] = sent[0]  # a fragment's bytes leave from its prepare step on (fragment_sync_delay)
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
