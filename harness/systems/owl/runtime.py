"""One process of an FL round: the server sends its transfers, a worker receives, relays and computes.

Ranks 0..W-1 are the workers in rack order, rank W the server; gloo point-to-point over the
cluster's links carries the parameters as tensors (one flat fp32 tensor per transfer: its layers'
parameters in forward order). Every round of the spec runs the same way:

- warm-up: one small message on every pair the plan uses and one all-reduce of the workers, so
  connections exist before the clock starts (gloo connects pairs on first use);
- a worker's parameters are wiped (NaN), everyone meets at a barrier and takes t0;
- the server posts every transfer it sends (isend): those to different workers share its uplink,
  those to one worker go one after another as that worker's server lane posts its receives (gloo's
  send waits for the matching receive, the request of the simulator's lane);
- a worker runs a thread per lane (server, peers) receiving its transfers in plan order, and a
  relay thread that sends each transfer it is the source of once the transfer that brought it the
  layers has landed (constraint 9); its main thread computes a layer as soon as its parameters
  have arrived and its input exists (of the layers that can run, the first whose parameters
  arrived: the simulator's rule), each layer held to its modelled seconds (compute model); then
  the backward, the gradient all-reduce among the workers and the update;
- every worker checks that what it received is the server's model, to the bit.

Bytes are counted as sent (train/wire.py's WireCounter around each call), by where they go:
out of the server, inside each rack, across racks, and the all-reduce's; the server also reads what
its interface sent in the round as the kernel counts it (frames: payload plus TCP/IP/Ethernet headers).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ...network.egress import interface_tx_bytes
from ...train.compute_model import ComputePacer
from ...train.rank import leave_together, progress
from ...train.wire import WireCounter
from ...workloads.fl.flows import SERVER
from ...workloads.fl.models import get_branchy
from ...workloads.fl.nets import BranchyNet, forward_by_units, join

WARMUP_TAG = 1 << 20
WARMUP_NUMEL = 256
LR = 0.01


@dataclass(frozen=True)
class Transfer:
    """flows.Transfer as the launcher's spec carries it (JSON lists)."""

    index: int
    dst: int
    src: int  # flows.SERVER or a worker
    layers: tuple[int, ...]
    lane: str
    after: int | None

    @classmethod
    def of(cls, index: int, t) -> "Transfer":
        return cls(index, int(t.dst), int(t.src), tuple(int(l) for l in t.layers), t.lane, t.after)

    def to_json(self) -> list:
        return [self.dst, self.src, list(self.layers), self.lane, self.after]

    @classmethod
    def from_json(cls, index: int, v: list) -> "Transfer":
        dst, src, layers, lane, after = v
        return cls(index, dst, src, tuple(layers), lane, after)


@dataclass(frozen=True)
class RoundSpec:
    strategy: str
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class FLSpec:
    """What the launcher runs: the federation's shape, the modelled compute and one round per strategy."""

    model: str
    batch: int
    racks: tuple[int, ...]
    layer_seconds: tuple[tuple[float, ...], ...]  # per worker, per layer: a forward's modelled seconds
    backward_seconds: tuple[float, ...]  # per worker
    rounds: tuple[RoundSpec, ...]
    timeout_s: float
    seed: int = 0
    group_timeout_s: float = 120.0
    fault_rank: int | None = None  # dies (SIGKILL) in the first round: a worker once its first transfer
    #                                arrived, the server once it has posted its sends (tests)

    @property
    def workers(self) -> int:
        return sum(self.racks)

    def rack_of(self, w: int) -> int:
        acc = 0
        for r, n in enumerate(self.racks):
            acc += n
            if w < acc:
                return r
        raise ValueError(f"worker {w}: not in racks {self.racks}")

    def to_json(self) -> dict:
        return {"model": self.model, "batch": self.batch, "racks": list(self.racks),
                "layer_seconds": [list(s) for s in self.layer_seconds], "backward_seconds": list(self.backward_seconds),
                "rounds": [{"strategy": r.strategy, "transfers": [t.to_json() for t in r.transfers]}
                           for r in self.rounds],
                "timeout_s": self.timeout_s, "seed": self.seed, "group_timeout_s": self.group_timeout_s,
                "fault_rank": self.fault_rank}

    @classmethod
    def from_json(cls, d: dict) -> "FLSpec":
        rounds = tuple(RoundSpec(r["strategy"], tuple(Transfer.from_json(k, t) for k, t in enumerate(r["transfers"])))
                       for r in d["rounds"])
        return cls(d["model"], d["batch"], tuple(d["racks"]), tuple(tuple(s) for s in d["layer_seconds"]),
                   tuple(d["backward_seconds"]), rounds, d["timeout_s"], d.get("seed", 0),
                   d.get("group_timeout_s", 120.0), d.get("fault_rank"))


@dataclass
class RankRound:
    """One round as one rank saw it; times in seconds from its t0."""

    rank: int
    arrivals: list[float] = field(default_factory=list)  # per layer (workers)
    forward_end: float = float("nan")
    end: float = float("nan")
    sent: dict = field(default_factory=dict)  # bytes by where they went: server, rack<r>, inter, allreduce
    overruns: int = 0
    late_s: float = 0.0  # how long after their deadlines its paced layers and backward ended (compute_model)
    interface_tx_bytes: int | None = None  # the server: what its interface sent in the round, headers and all
    wall_start: float = float("nan")  # time.time() at t0 (a UML guest shares its host's wall clock): the headroom


class _Model:
    """A runnable model's units and their parameters by profile layer (nets.BranchyNet's order)."""

    def __init__(self, name: str, seed: int):
        torch.manual_seed(seed)
        self.net = BranchyNet(get_branchy(name))
        self.bases, self.joins, self.image = self.net.bases, self.net.joins, get_branchy(name).image
        self.units = [u for base in self.bases for branch in base for u in branch]
        self.params = [list(u.parameters()) for u in self.units]

    def pack(self, layers) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for l in layers for p in self.params[l]])

    def unpack(self, layers, flat: torch.Tensor, keep=None) -> None:
        """Copy `flat` (pack's layout) into the layers' parameters; of those in `keep` only, when given."""
        at = 0
        with torch.no_grad():
            for l in layers:
                for p in self.params[l]:
                    if keep is None or l in keep:
                        p.copy_(flat[at:at + p.numel()].view_as(p))
                    at += p.numel()

    def numel(self, layers) -> int:
        return sum(p.numel() for l in layers for p in self.params[l])


def _fault():
    os.kill(os.getpid(), signal.SIGKILL)


def _warm_up(rank: int, W: int, rs: RoundSpec, workers_group) -> None:
    """One message on every pair the round uses (either way round: a gloo pair is one connection) and one
    all-reduce of the workers, then a barrier of everyone."""
    pairs = sorted({tuple(sorted((W if t.src == SERVER else t.src, t.dst))) for t in rs.transfers})
    works, ping = [], torch.zeros(WARMUP_NUMEL)
    for a, b in pairs:
        if rank == a:
            works.append(dist.isend(ping, b, tag=WARMUP_TAG))
        elif rank == b:
            works.append(dist.irecv(torch.zeros(WARMUP_NUMEL), a, tag=WARMUP_TAG))
    for w in works:
        w.wait()
    if rank < W:
        dist.all_reduce(torch.zeros(WARMUP_NUMEL), group=workers_group)
    dist.barrier()


def server_round(spec: FLSpec, rs: RoundSpec, model: _Model, fault: bool, ifname: str = "") -> RankRound:
    W = spec.workers
    out = RankRound(W)
    dist.barrier()
    tx0 = interface_tx_bytes(ifname)
    out.wall_start, t0 = time.time(), time.perf_counter()
    works, counter = [], WireCounter()
    with counter:
        for t in rs.transfers:
            if t.src == SERVER:
                works.append(dist.isend(model.pack(t.layers), t.dst, tag=t.index))
    out.sent = {"server": counter.take()}
    if fault:
        _fault()
    for w in works:
        w.wait()
    out.end = time.perf_counter() - t0
    dist.barrier()  # every worker has everything: the last frames have left (a finished send may sit in a queue)
    if tx0 is not None:
        out.interface_tx_bytes = interface_tx_bytes(ifname) - tx0
    return out


class _Worker:
    def __init__(self, spec: FLSpec, rs: RoundSpec, model: _Model, reference: _Model, rank: int, fault: bool):
        self.spec, self.rs, self.model, self.rank, self.fault = spec, rs, model, rank, fault
        self.reference = reference
        L = len(model.units)
        self.ready = [threading.Event() for _ in range(L)]
        self.landed = {t.index: threading.Event() for t in rs.transfers if t.dst == rank}
        self.arrivals = [float("nan")] * L
        self.lock = threading.Condition()
        self.sent: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self.t0 = 0.0

    def _charge(self, where: str, n: int) -> None:
        with self.lock:
            self.sent[where] = self.sent.get(where, 0) + n

    def _receive(self, lane: str) -> None:
        W, model = self.spec.workers, self.model
        try:
            for t in self.rs.transfers:
                if t.dst != self.rank or t.lane != lane:
                    continue
                buf = torch.empty(model.numel(t.layers))
                dist.recv(buf, W if t.src == SERVER else t.src, tag=t.index)
                now = time.perf_counter() - self.t0
                with self.lock:
                    fresh = [l for l in t.layers if not self.ready[l].is_set()]
                    model.unpack(t.layers, buf, keep=fresh)  # a later copy of a layer changes nothing
                    for l in fresh:
                        self.arrivals[l] = now
                        self.ready[l].set()
                    self.landed[t.index].set()
                    self.lock.notify_all()
                if self.fault:
                    _fault()
        except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
            self.errors.append(e)
            with self.lock:
                self.lock.notify_all()

    def _relay(self) -> None:
        spec, model = self.spec, self.model
        try:
            works = []
            for t in self.rs.transfers:
                if t.src != self.rank:
                    continue
                while not self.landed[t.after].wait(0.5):
                    if self.errors:
                        return
                counter = WireCounter()
                with counter:
                    works.append(dist.isend(model.pack(t.layers), t.dst, tag=t.index))
                same = spec.rack_of(t.dst) == spec.rack_of(self.rank)
                self._charge(f"rack{spec.rack_of(self.rank)}" if same else "inter", counter.take())
            for w in works:
                w.wait()
        except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
            self.errors.append(e)

    def _wait_any(self, candidates: list[int]) -> int:
        """The candidate layer to run next: of those whose parameters are here, the first to arrive."""
        with self.lock:
            while True:
                if self.errors:
                    raise self.errors[0]
                here = [l for l in candidates if self.ready[l].is_set()]
                if here:
                    return min(here, key=lambda l: (self.arrivals[l], l))
                self.lock.wait(0.5)

    def run(self, workers_group) -> RankRound:
        spec, model, rank = self.spec, self.model, self.rank
        with torch.no_grad():
            for ps in model.params:
                for p in ps:
                    p.fill_(float("nan"))
        g = torch.Generator().manual_seed(spec.seed * 1000 + rank)
        x = torch.randn(spec.batch, 3, model.image, model.image, generator=g)
        y = torch.randint(0, 10, (spec.batch,), generator=g)
        pacer = ComputePacer({**{f"layer{l}": s for l, s in enumerate(spec.layer_seconds[rank])},
                              "backward": spec.backward_seconds[rank]})
        threads = [threading.Thread(target=self._receive, args=(lane,), daemon=True) for lane in ("server", "peer")]
        threads.append(threading.Thread(target=self._relay, daemon=True))
        dist.barrier()
        wall_start, self.t0 = time.time(), time.perf_counter()
        for th in threads:
            th.start()
        logits = self._forward(x, pacer)
        out = RankRound(rank, wall_start=wall_start)
        out.forward_end = time.perf_counter() - self.t0
        t = pacer.begin()
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        pacer.finish("backward", t)
        for th in threads:
            th.join()
        if self.errors:
            raise self.errors[0]
        check_received(model, self.reference, rank)
        params = [p for ps in model.params for p in ps]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        counter = WireCounter()
        with counter:
            dist.all_reduce(flat, group=workers_group)
        self._charge("allreduce", counter.take())
        flat /= spec.workers
        at = 0
        with torch.no_grad():
            for p in params:
                p -= LR * flat[at:at + p.numel()].view_as(p)
                p.grad = None
                at += p.numel()
        out.end = time.perf_counter() - self.t0
        paced = pacer.take_iteration()
        out.arrivals, out.sent = list(self.arrivals), dict(self.sent)
        out.overruns, out.late_s = paced["compute_overruns"], paced["compute_late_seconds"]
        return out

    def _forward(self, x: torch.Tensor, pacer: ComputePacer) -> torch.Tensor:
        """The bases in order; inside a base, its branches' layers in the order their parameters arrive."""
        model, first = self.model, 0
        for base, how in zip(model.bases, model.joins):
            pos = [first + sum(len(br) for br in base[:j]) for j in range(len(base))]  # each branch's first layer
            h = [x] * len(base)
            step = [0] * len(base)
            left = sum(len(br) for br in base)
            while left:
                cands = [pos[j] + step[j] for j in range(len(base)) if step[j] < len(base[j])]
                l = self._wait_any(cands)
                j = max(j for j in range(len(base)) if pos[j] <= l)
                t = pacer.begin()
                h[j] = base[j][step[j]](h[j])
                pacer.finish(f"layer{l}", t)
                step[j] += 1
                left -= 1
            x = join(h, how)
            first += sum(len(br) for br in base)
        return x


def check_received(model: _Model, reference: _Model, rank: int) -> None:
    """The parameters a worker received are the server's, exactly (before its update)."""
    for l, (mine, ref) in enumerate(zip(model.params, reference.params)):
        for a, b in zip(mine, ref):
            if not torch.equal(a, b):
                raise RuntimeError(f"worker {rank}: layer {l}: the parameters received differ from the server's")


def fl_rank_main(rank: int, spec: FLSpec, master_addr: str, master_port: int, ifname: str = "") -> list[RankRound]:
    """One process (rank W: the server, else a worker) through every round of `spec`."""
    torch.set_num_threads(1)
    W = spec.workers
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(W + 1))
    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=W + 1,
                            timeout=timedelta(seconds=spec.group_timeout_s))
    workers_group = dist.new_group(list(range(W)))
    reference = _Model(spec.model, spec.seed)
    if rank < W:  # the first forward and backward are slow (allocations, kernels): not in a round
        size = reference.image
        forward_by_units(reference.bases, reference.joins, torch.randn(spec.batch, 3, size, size)).sum().backward()
    out = []
    for k, rs in enumerate(spec.rounds):
        fault = k == 0 and spec.fault_rank == rank
        _warm_up(rank, W, rs, workers_group)
        model = _Model(spec.model, spec.seed)  # the server's model, every round (the workers' update stays theirs)
        if rank == W:
            out.append(server_round(spec, rs, model, fault, ifname))
        else:
            out.append(_Worker(spec, rs, model, reference, rank, fault).run(workers_group))
            dist.barrier()  # the server reads its interface's count once every worker is done
            if rank == 0:
                progress(f"round {k + 1}/{len(spec.rounds)} ({rs.strategy}): {out[-1].end:.2f} s on worker 0")
    leave_together(rank, W + 1, spec.group_timeout_s)
    dist.destroy_process_group()
    return out
