"""One rank of a HetPipe run: a stage of a virtual worker's pipeline, and maybe a parameter-server shard.

Each virtual worker (VW, a replica of the layout) runs its own pipeline with N_m minibatches in flight
(HetPipe, Park et al. 2020, Sec. 3-4). A stage forwards minibatches in order and runs their backwards
in order, stage k up to N_m - k forwards ahead (`schedule`; the last stage runs a minibatch's forward and
backward back to back), so that minibatch p reads local weights updated by minibatches up to p - N_m
at the first stage (local staleness N_m - 1) and by more recent ones further down. Each forward runs on a snapshot of the stage's weights that its backward reuses (weight
stashing); each backward is followed by the VW's local update (SGD with momentum, as every system).

Wave Synchronous Parallel (wsp.py): after the backward of a wave's last minibatch a stage pushes the
wave's aggregated update of its blocks to their shards (ps.py) while it goes on computing; before the
forward of the minibatch gated at the end of wave c (the last of wave c + 1), once c >= D, it pulls
its blocks' global weights, which waits until every VW has pushed wave c - D (the first stage waits on
every shard: the gate is the whole VW's), and keeps its updates not yet pushed on top of them.

Records: an iteration is --batch samples, batch / (VWs x micro-batch) minibatches of every VW; per
minibatch, its VW, clock, the global version it read (the fewest of its stages), when it entered the
first stage, when its wave's update was applied (a wave's last) and its loss, gathered on rank 0.
"""
from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.func import functional_call

from ...layout import Layout
from ...plan.request import RunSpec
from ...results import GATE_FIELDS
from ...train.compute_model import pacer_for
from ...train.nets import net_of
from ...train.rank import RankContext, iteration_progress, torch_dtype
from ...train.reference import make_optimizer
from ...train.stats import IterationStats
from ...train import wire
from .ps import ShardClient, ShardServer

STORE_PREFIX = "hetpipe/"


def locate(layout: Layout, device: int) -> tuple[int, int]:
    """(VW, stage) of `device`."""
    for v, pipe in enumerate(layout.replica_pipelines()):
        if device in pipe.devices:
            return v, pipe.devices.index(device)
    raise ValueError(f"device {device} is in no virtual worker of the layout")


def schedule(stage: int, stages: int, in_flight: int, minibatches: int) -> list[tuple[str, int]]:
    """A stage's tasks in order: N_m - k forwards on stage k (at least one), then a backward and a forward
    by turns (PipeDream's 1F1B with N_m admitted); the last stage runs each minibatch's forward and
    backward back to back ("FB"). Each stage holds one minibatch fewer than the one before it, so the
    activation stage k + 1 needs after a backward was sent a round earlier: no stage waits on the round
    trip through the stages before it (with as many forwards on every stage, the pipeline would run
    one minibatch at a time)."""
    if stage == stages - 1:
        return [("FB", p) for p in range(minibatches)]
    head = min(max(1, in_flight - stage), minibatches)
    out = [("F", p) for p in range(head)]
    for p in range(minibatches):
        out.append(("B", p))
        if p + head < minibatches:
            out.append(("F", p + head))
    return out


class _Stage:
    """This rank's part of its VW: weights, stashes, shards, and what it records."""

    def __init__(self, ctx: RankContext, spec: RunSpec):
        lay, m = spec.layout, spec.model
        self.spec, self.ctx, self.wsp = spec, ctx, lay.wsp
        self.net = net_of(m)  # the GPT or the CNN: its layers are the blocks the shards hold
        self.vw, self.stage = locate(lay, ctx.device_index)
        self.pipe = lay.pipeline(self.vw)
        self.K = len(self.pipe.devices)
        first, last = self.pipe.stages[self.stage]
        self.dtype = torch_dtype(spec)
        full = self.net.build()
        self.part = full.stage(first, last).to(self.dtype)
        self.names = {n: self.net.global_name(n, first) for n, _ in self.part.named_parameters()}  # -> whole model's
        self.params = dict(self.part.named_parameters())
        self.anchor = {n: p.detach().clone() for n, p in self.params.items()}  # what the shards know of
        self.opt = make_optimizer(list(self.params.values()), m.lr)
        self.pacer = pacer_for(spec, self.stage, ctx.device_index, ctx.device, recompute=False,
                               vocab_parallel=False, replica=self.vw)
        self.version = 0
        self.server = self._serve(full, lay.dp)
        self.clients = self._connect()

    # ---------------------------------------------------------------- parameter server
    def _serve(self, full: torch.nn.Module, vws: int) -> ShardServer | None:
        dev = self.ctx.device_index
        if dev not in self.wsp.shard_hosts:
            return None
        mine = {n: p.detach().float().numpy() for n, p in full.named_parameters()
                if self.wsp.ps_hosts[self.net.layer_of(n)] == dev}
        server = ShardServer(mine, {n: self.net.layer_of(n) for n in mine}, vws, self.ctx.addr,
                             self.spec.run.group_timeout_s)
        dist.distributed_c10d._get_default_store().set(f"{STORE_PREFIX}ps/{dev}", server.address)
        return server

    def _connect(self) -> dict[int, tuple[ShardClient, list[str], list[int]]]:
        """host -> (client, my local names it holds, my blocks it holds); the first stage connects to every
        shard (its gate waits on all of them)."""
        store = dist.distributed_c10d._get_default_store()
        hosts = self.wsp.ps_hosts
        out = {}
        for h in self.wsp.shard_hosts:
            names = [n for n in self.params if hosts[self.net.layer_of(self.names[n])] == h]
            if not names and self.stage != 0:
                continue
            addr = store.get(f"{STORE_PREFIX}ps/{h}").decode()
            client = ShardClient(addr, f"parameter-server shard on device {h}", self.spec.run.group_timeout_s)
            blocks = sorted({self.net.layer_of(self.names[n]) for n in names})
            out[h] = (client, names, [] if self.stage == 0 else blocks)
        return out

    def push(self, wave: int) -> list:
        """The wave's aggregated update of this stage's weights to their shards; futures of when it was applied."""
        futures = []
        with torch.no_grad():
            for client, names, _ in self.clients.values():
                if names:
                    ups = [(self.params[n] - self.anchor[n]).float().numpy() for n in names]
                    futures.append(client.push(self.vw, wave, [self.names[n] for n in names], ups))
            for n, p in self.params.items():
                self.anchor[n] = p.detach().clone()
        return futures

    def pull(self, needs: int) -> None:
        """Wait until every VW pushed `needs` waves, then take the global weights with this stage's
        updates not yet pushed on top."""
        futures = {h: c.pull(self.vw, needs, blocks, [self.names[n] for n in names],
                             [tuple(self.params[n].shape) for n in names])
                   for h, (c, names, blocks) in self.clients.items()}
        version = None
        with torch.no_grad():
            for h, f in futures.items():
                v, arrays = f.result()
                version = v if version is None else min(version, v)
                for n, a in zip(self.clients[h][1], arrays):
                    g = torch.from_numpy(a.copy()).to(self.dtype)
                    self.params[n].add_(g - self.anchor[n])
                    self.anchor[n] = g
        self.version = version

    def close(self) -> None:
        for client, _, _ in self.clients.values():
            client.close()


def train_hetpipe(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    lay, m = spec.layout, spec.model
    st = _Stage(ctx, spec)
    N, D, K, k = lay.wsp.in_flight, lay.wsp.staleness, st.K, st.stage
    per_vw = m.batch // (lay.dp * m.micro_batch)
    steps = spec.run.warmup + spec.run.iters
    prev = st.pipe.devices[k - 1] if k > 0 else None
    nxt = st.pipe.devices[k + 1] if k < K - 1 else None
    first, last = st.pipe.stages[k]
    in_shape = st.net.boundary(first - 1, m.micro_batch) if k > 0 else None  # what the stage before sends
    out_shape = st.net.boundary(last - 1, m.micro_batch)  # and the gradient of it that comes back
    stash: dict[int, tuple] = {}
    sends: collections.deque = collections.deque()
    rows: dict[int, dict] = {}  # minibatch -> this stage's row of it
    pushes: dict[int, list] = {}  # minibatch -> futures of its wave's push
    stats: list[IterationStats] = []
    losses: list[float] = []
    batches: dict[int, tuple] = {}
    compute = 0.0

    def data(p: int) -> tuple[torch.Tensor, torch.Tensor]:
        it, j = divmod(p, per_vw)
        if it not in batches:
            batches.clear()
            batches[it] = st.net.batch(it)
        lo = (st.vw * per_vw + j) * m.micro_batch
        tokens, targets = batches[it]
        return tokens[lo:lo + m.micro_batch], targets[lo:lo + m.micro_batch]

    def send(t: torch.Tensor, dst: int) -> None:
        sends.append(dist.isend(t.detach().contiguous(), dst))
        while len(sends) > N + 1:
            sends.popleft().wait()

    rng = np.random.default_rng([m.seed, ctx.device_index])
    speed = rng.uniform()  # debug.jitter_s: this device's draw

    def timed(phase: str, fn):
        nonlocal compute
        t0 = time.perf_counter()
        with st.pacer.phase(phase):
            out = fn()
        if spec.debug.jitter_s:
            time.sleep(rng.uniform(0, 2 * spec.debug.jitter_s * speed))
        compute += time.perf_counter() - t0
        return out

    def forward(p: int):
        gate = {}
        if (p + 1) % N == 0 and (p + 1) // N - 2 >= D:  # the gated minibatch of wave c = (p+1)/N - 2
            t0 = time.monotonic()
            st.pull((p + 1) // N - 2 - D + 1)
            t1 = time.monotonic()
            gate = {"pulled": t1, "blocked": t1 - t0}
        if k == 0:
            x = data(p)[0].to(ctx.device)
            x = x.to(st.dtype) if x.is_floating_point() else x  # images in the stage's precision; token ids stay
        else:
            x = torch.empty(in_shape, dtype=st.dtype)
            dist.recv(x, prev)
            x.requires_grad_(True)
        start = time.monotonic()
        snap = {n: w.detach().clone().requires_grad_(True) for n, w in st.params.items()}
        out = timed("forward", lambda: functional_call(st.part, snap, (x,)))
        rows[p] = {"vw": st.vw, "minibatch": p, "clock": p // N, "stage": k, "version": st.version,
                   "start": start, "loss": math.nan, **gate}
        return x, snap, out

    def finish(p: int, x, snap) -> None:
        if k > 0:
            send(x.grad, prev)
        st.opt.zero_grad(set_to_none=True)
        for n, w in st.params.items():
            w.grad = snap[n].grad
        timed("optimizer", st.opt.step)
        if (p + 1) % N == 0:
            rows[p]["wave_done"] = time.monotonic()  # this stage's part of the wave is done: its update goes
            pushes[p] = st.push(p // N)

    ctx.mark("training")
    ends = [time.monotonic()]
    for op, p in schedule(k, K, N, steps * per_vw):
        if op == "B":
            x, snap, out = stash.pop(p)
            g = torch.empty(out_shape, dtype=st.dtype)
            dist.recv(g, nxt)
            timed("backward", lambda: out.backward(g))
            finish(p, x, snap)
        else:
            x, snap, out = forward(p)
            if op == "F":
                send(out, nxt)
                stash[p] = (x, snap, out)
                continue
            loss = st.net.loss(out, data(p)[1])
            timed("backward", loss.backward)
            rows[p]["loss"] = float(loss.detach())
            losses.append(rows[p]["loss"])
            finish(p, x, snap)
        if (p + 1) % per_vw == 0:  # this rank's last task of iteration `it`
            it = p // per_vw
            ends.append(time.monotonic())
            seconds = ends[-1] - ends[-2]
            if it >= spec.run.warmup:
                busy = min(compute, seconds)
                stats.append(IterationStats(seconds, busy, seconds - busy,
                                            float(np.mean(losses)) if losses else math.nan, ends[-1],
                                            **st.pacer.take_iteration(), **wire.take_iteration()))
            else:
                st.pacer.take()
                wire.take_iteration()
            compute, losses = 0.0, []
            if ctx.rank == 0:
                iteration_progress(it, steps, spec.run.warmup, seconds)
    while sends:
        sends.popleft().wait()
    for p, futures in pushes.items():
        applied = max(f.result() for f in futures) if futures else math.nan
        rows[p]["pushed"] = applied
    st.close()
    _leave(st, ctx)
    # the last pushes (and a shard's last replies) went out after the last iteration ended
    wire.add_late(stats[-1], wire.take_iteration())
    stats[0].minibatches = _gather(list(rows.values()), ctx.rank == 0)
    ctx.save_state({st.names[n]: w for n, w in st.params.items()})
    return stats


def _leave(st: _Stage, ctx: RankContext) -> None:
    """Every rank says it is done with the shards; a shard's host serves until all have."""
    store = dist.distributed_c10d._get_default_store()
    store.add(f"{STORE_PREFIX}done", 1)
    if st.server is not None:
        deadline = time.monotonic() + st.spec.run.group_timeout_s
        while store.add(f"{STORE_PREFIX}done", 0) < ctx.world_size:
            if time.monotonic() > deadline:
                raise RuntimeError("ranks did not finish with the parameter server in time")
            time.sleep(0.02)
        st.server.close()


def _gather(rows: list[dict], root: bool) -> list[dict] | None:
    """Every rank's per-stage rows, merged on rank 0 into one row per (VW, minibatch): admitted = its
    start on the first stage, global_version = the fewest of its stages', pushed = the latest of its
    stages' pushes applied, loss = the last stage's; the first stage's gate: wave_done (a wave's last
    minibatch: when the first stage finished it), pulled (a gated minibatch: when its pull completed) and
    blocked (how long the first stage waited in that pull, with nothing else to do)."""
    everyone = [None] * dist.get_world_size() if root else None
    dist.gather_object(rows, everyone, dst=0)
    if not root:
        return None
    merged: dict[tuple, dict] = {}
    for r in (r for part in everyone for r in part):
        key = (r["vw"], r["minibatch"])
        row = merged.setdefault(key, {"vw": r["vw"], "minibatch": r["minibatch"], "clock": r["clock"],
                                      "global_version": r["version"],
                                      "admitted": math.nan, "pushed": math.nan, "loss": math.nan})
        row["global_version"] = min(row["global_version"], r["version"])
        if r["stage"] == 0:
            row["admitted"] = r["start"]
            row.update({k: r[k] for k in GATE_FIELDS if k in r})
        if not math.isnan(r.get("pushed", math.nan)):
            row["pushed"] = r["pushed"] if math.isnan(row["pushed"]) else max(row["pushed"], r["pushed"])
        if not math.isnan(r["loss"]):
            row["loss"] = r["loss"]
    return [merged[k] for k in sorted(merged)]
