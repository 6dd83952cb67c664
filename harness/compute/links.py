"""Messages over the device-level delay/bandwidth matrices, and collectives as their point-to-point steps.

Link model. A transfer of b bytes from d to e takes delay_ms[d][e] (one way) plus
its serialisation: b / rate when the connection's window covers the path, more when the scenario's TCP
settings leave it smaller (the window sends one window per round trip: compute/transport.py, on a
connection in use). The rate is the max-min fair share of three capacities the transfer
crosses: the pair path d->e (bandwidth_gbps[d][e]), the sender's egress and the
receiver's ingress. A device's egress (ingress) capacity is its fastest outgoing
(incoming) pair: its network interface can at least do that, and nothing in a
scenario says more (`nic="shared"`, the paper-scale model). So transfers that
share a sender's or receiver's link share its bandwidth; a pattern in which every
device sends to one peer and receives from one (a ring step, a pipeline hop) runs
every pair at its own rate. The emulated cluster shapes every destination in its
own HTB class with rate = ceil and no common parent (harness/network/plan.py), so
there pairs never share (`nic="per-pair"`: egress and ingress unlimited).

Collectives (the algorithm NCCL uses for these sizes, and the paper's own for ours):
- ring all-reduce = reduce-scatter + all-gather, 2(D-1) steps of bytes/D;
  ring all-gather / reduce-scatter alone: D-1 steps; ring in rank order.
  A device starts step k once it has sent step k-1 and received the chunk of step
  k-1 from its predecessor (it needs it to reduce or forward).
- sharded parameter server (ours, Yuan et al. sec. 3.2): every device sends shard i
  of its gradient to device i, sums what it receives, and sends the sum back to all.
  `sharded_ps(mode="grouped")`: each exchange is one grouped all-to-all (all sends
  and receives posted in one NCCL group, as the paper's runtime does) that starts
  when the whole group is ready; it lasts as long as its busiest resource: the
  slowest pair (delay + shard / rate) or a device's egress/ingress carrying its
  D-1 shards (the makespan bound of a fluid schedule, exact when one resource
  dominates). `mode="rounds"`: D-1 rounds of a shifted all-to-all; in
  round k device p sends bytes/D to p+k and receives from p-k, each exchange a
  rendezvous (it starts when both ends reached the round, and the send completes
  when the receiver has the data, as a blocking NCCL send/recv pair).
Protocols. Before data flows, a library may wait for the receiver's "ready" notice,
one more one-way delay (receiver -> sender). NCCL posts receive buffers ahead
through its proxy FIFO, so in steady state neither a point-to-point message nor a
ring step waits for one (`nccl`: 0, 0). Gloo's unbound-buffer send/recv is a
rendezvous: the receiver notifies it is ready, then the sender sends, for blocking
point-to-point and for every ring step (`gloo`: 1, 1); the emulated cluster runs gloo.
Every function is vectorised over concurrent groups: arrays (G, D) of device ids.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..scenario import Topology
from ..scenario.class_links import held_by_region, representatives
from ..scenario.transport import LINUX, Transport
from ..units import gbps_to_bytes_per_s, ms_to_s
from .transport import HOST_HZ, TcpPath


@dataclass(frozen=True)
class Protocol:
    """Extra one-way delays (the receiver's ready notice) a library pays before data flows."""

    name: str
    p2p_handshake: int  # per blocking point-to-point message
    step_handshake: int  # per ring step / all-to-all exchange


PROTOCOLS = {"nccl": Protocol("nccl", 0, 0), "gloo": Protocol("gloo", 1, 1)}


@dataclass(frozen=True)
class Links:
    """Delay (s) and rate (bytes/s) of every ordered device pair, per-device link capacities, and the protocol."""

    delay_s: np.ndarray
    rate_Bps: np.ndarray  # diagonal inf
    egress_Bps: np.ndarray
    ingress_Bps: np.ndarray
    protocol: Protocol = PROTOCOLS["nccl"]
    transport: Transport = LINUX  # resolved TCP settings (compute/transport.py)
    hz: int = HOST_HZ  # the senders' kernel clock (their retransmission timeouts are in its ticks)

    def path(self, src, dst, rate_Bps=None) -> TcpPath:
        """The TCP path of each pair src[k] -> dst[k], at the pair's rate or `rate_Bps` (its fair share)."""
        src, dst = np.asarray(src), np.asarray(dst)
        rate = self.rate_Bps[src, dst] if rate_Bps is None else np.asarray(rate_Bps, dtype=float)
        delay = self.delay_s[src, dst]
        return TcpPath.of(rate, delay, delay + self.delay_s[dst, src], self.transport, hz=self.hz)

    def serialization_s(self, src, dst, nbytes, rate_Bps=None) -> np.ndarray:
        """Seconds a message of nbytes on each pair src[k] -> dst[k] takes beyond the one-way delay, at the
        pair's rate (or `rate_Bps`, its fair share): a connection in use, under the scenario's TCP settings."""
        path = self.path(src, dst, rate_Bps)
        return np.maximum(path.message_seconds(nbytes) - path.delay_s, 0.0)

    @classmethod
    def from_topology(cls, topo: Topology, protocol: Protocol | str = "nccl", nic: str = "shared") -> "Links":
        """The links of `topo`: held by region (ClassLinks, no N x N matrix) where they are the regions',
        computed on two devices of every region, whose pairs, fastest links and largest round trip are
        the whole's; else per device."""
        if topo.region_links is None:
            return cls.per_device(topo, protocol, nic)
        devices, first, _ = representatives(topo)
        few = cls.per_device(topo.subset(devices), protocol, nic)
        region = np.asarray(topo.device_region)
        return replace(few, delay_s=held_by_region(topo, few.delay_s), rate_Bps=held_by_region(topo, few.rate_Bps),
                       egress_Bps=few.egress_Bps[first][region], ingress_Bps=few.ingress_Bps[first][region])

    @classmethod
    def per_device(cls, topo: Topology, protocol: Protocol | str = "nccl", nic: str = "shared") -> "Links":
        """The links of `topo` as N x N matrices."""
        rate = gbps_to_bytes_per_s(np.asarray(topo.bandwidth_gbps, dtype=float))
        rate = rate.copy()
        np.fill_diagonal(rate, np.inf)
        off = rate.copy()
        np.fill_diagonal(off, 0.0)
        n = rate.shape[0]
        if nic == "shared":
            egress = off.max(1) if n > 1 else np.full(n, np.inf)
            ingress = off.max(0) if n > 1 else np.full(n, np.inf)
        elif nic == "per-pair":
            egress = ingress = np.full(n, np.inf)
        else:
            raise ValueError(f"unknown nic model {nic!r} (known: shared, per-pair)")
        delay = ms_to_s(np.asarray(topo.delay_ms, dtype=float))
        delay = delay.copy()
        np.fill_diagonal(delay, 0.0)
        if isinstance(protocol, str):
            if protocol not in PROTOCOLS:
                raise ValueError(f"unknown protocol {protocol!r} (known: {', '.join(PROTOCOLS)})")
            protocol = PROTOCOLS[protocol]
        finite = np.where(np.isinf(rate), 0.0, rate)
        bdp = float((finite * (delay + delay.T)).max(initial=0.0))  # the largest round trip's, as the plan sizes `auto`
        transport = topo.transport.resolved(bdp)
        return cls(delay, rate, egress, ingress, protocol, transport)

    def fair_rates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Max-min fair rate of every concurrent transfer src[k] -> dst[k] (bytes/s)."""
        src = np.asarray(src).ravel()
        dst = np.asarray(dst).ravel()
        pair = self.rate_Bps[src, dst]
        local = src == dst
        if len(np.unique(src[~local])) == (~local).sum() and len(np.unique(dst[~local])) == (~local).sum():
            # A permutation: no resource carries two transfers.
            return np.where(local, np.inf, np.minimum(pair, np.minimum(self.egress_Bps[src], self.ingress_Bps[dst])))
        return _progressive_filling(src, dst, pair, self.egress_Bps, self.ingress_Bps)


class Connections:
    """Every ordered pair's TCP connection through one exchange or iteration: when its sender last sent and
    the window it holds, so that a message after a silence longer than the retransmission timeout restarts
    slow start (the scenario's `slow_start_after_idle`), and a connection that carried only small messages
    keeps a small window. Each connection begins long silent, as the previous iteration left it: a
    pipeline's and a data-parallel group's connections carry nothing for most of an iteration. With slow
    start after idle off a connection's window never shrinks, and every message takes what
    `Links.serialization_s` says."""

    def __init__(self, links: Links):
        n = links.rate_Bps.shape[0]
        self.links = links
        self.last_sent = PairState(n, -np.inf)  # when each sender's last byte left
        self.cwnd = PairState(n, np.inf)  # inf: full (twice the window)

    @property
    def idle_matters(self) -> bool:
        return bool(self.links.transport.slow_start_after_idle)

    def send(self, src, dst, nbytes, depart, rate_Bps=None) -> np.ndarray:
        """Seconds beyond the one-way delay of messages src[k] -> dst[k] whose first byte leaves at
        depart[k] (concurrent: distinct pairs); the connections remember them."""
        src, dst = np.asarray(src), np.asarray(dst)
        depart = np.broadcast_to(np.asarray(depart, dtype=float), np.broadcast(src, dst).shape)
        if not self.idle_matters:
            ser = self.links.serialization_s(src, dst, nbytes, rate_Bps)
        else:
            path = self.links.path(src, dst, rate_Bps)
            start = path.restarted(np.minimum(self.cwnd[src, dst], path.full_cwnd()),
                                   depart - self.last_sent[src, dst])
            seconds, self.cwnd[src, dst] = path.transfer(nbytes, start)
            ser = np.maximum(seconds - path.delay_s, 0.0)
        self.last_sent[src, dst] = depart + ser
        return ser


class PairState:
    """A value per ordered device pair, `fill` until set, indexed [src, dst] (arrays or scalars): an N x N
    array up to DENSE_PAIRS pairs, beyond (10,240 devices: 839 MB an array) only the pairs that were set."""

    DENSE_PAIRS = 1 << 24  # 4,096 devices

    def __init__(self, n: int, fill: float):
        self.n, self.fill = n, fill
        self.dense = np.full((n, n), fill) if n * n <= self.DENSE_PAIRS else None
        self.sparse: dict[int, float] = {}

    def __getitem__(self, key):
        if self.dense is not None:
            return self.dense[key]
        src, dst = np.broadcast_arrays(*(np.asarray(k) for k in key))
        flat = (src * self.n + dst).ravel().tolist()
        out = np.array([self.sparse.get(k, self.fill) for k in flat], dtype=float).reshape(src.shape)
        return out if out.ndim else float(out)

    def __setitem__(self, key, value):
        if self.dense is not None:
            self.dense[key] = value
            return
        src, dst = np.broadcast_arrays(*(np.asarray(k) for k in key))
        values = np.broadcast_to(np.asarray(value, dtype=float), src.shape).ravel().tolist()
        self.sparse.update(zip((src * self.n + dst).ravel().tolist(), values))


def _progressive_filling(src, dst, pair, egress, ingress) -> np.ndarray:
    """Water-filling over pair, egress and ingress resources (the textbook max-min fair allocation)."""
    k = len(src)
    rate = np.full(k, np.inf)
    local = src == dst
    active = ~local
    n = max(int(src.max(initial=0)), int(dst.max(initial=0))) + 1
    pair_id = src * n + dst
    resources = [("pair", pair_id, {p: pair[np.argmax(pair_id == p)] for p in np.unique(pair_id)}),
                 ("egress", src, {s: egress[s] for s in np.unique(src)}),
                 ("ingress", dst, {d: ingress[d] for d in np.unique(dst)})]
    used = {(name, key): 0.0 for name, ids, caps in resources for key in caps}
    while active.any():
        best, best_share = None, np.inf
        for name, ids, caps in resources:
            for key, cap in caps.items():
                members = active & (ids == key)
                cnt = members.sum()
                if cnt == 0:
                    continue
                share = (cap - used[(name, key)]) / cnt
                if share < best_share:
                    best, best_share = (name, ids, key), share
        name, ids, key = best
        frozen = active & (ids == key)
        rate[frozen] = max(best_share, 0.0)
        active &= ~frozen
        for rname, rids, caps in resources:
            for idx in np.flatnonzero(frozen):
                used[(rname, rids[idx])] += rate[idx]
    return rate


def step_times(links: Links, src: np.ndarray, dst: np.ndarray, nbytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(serialisation seconds, delay seconds) of concurrent transfers of nbytes each, at their fair shares."""
    rate = links.fair_rates(src, dst).reshape(src.shape)
    return links.serialization_s(src, dst, nbytes, rate), links.delay_s[src, dst]


def ring(links: Links, groups: np.ndarray, chunk_bytes: float, steps: int, start=None,
         conns: Connections | None = None) -> np.ndarray:
    """Finish time of every device after `steps` ring steps of chunk_bytes (groups: (G, D) in ring order);
    `conns`: the connections' state so far (default: silent since the previous iteration)."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = np.zeros((G, D)) if start is None else np.broadcast_to(np.asarray(start, dtype=float), (G, D)).copy()
    if D == 1 or steps == 0 or chunk_bytes <= 0:
        return ready
    succ = np.roll(groups, -1, axis=1)
    rate = links.fair_rates(groups, succ).reshape(groups.shape)
    ser, delay = links.serialization_s(groups, succ, chunk_bytes, rate), links.delay_s[groups, succ]
    conns = Connections(links) if conns is None else conns
    notice = links.protocol.step_handshake * links.delay_s[succ, groups]  # receiver's ready notice
    for _ in range(steps):
        begin = np.maximum(ready, np.roll(ready, -1, axis=1) + notice) if notice.any() else ready
        if conns.idle_matters:  # the first steps run on windows restarted after the iteration's silence
            ser = conns.send(groups, succ, chunk_bytes, begin, rate)
        sent = begin + ser
        arrive = np.roll(sent + delay, 1, axis=1)  # position p receives from p-1
        ready = np.maximum(sent, arrive)
    return ready


def ring_allreduce(links: Links, groups, nbytes: float, start=None, conns: Connections | None = None) -> np.ndarray:
    groups = np.atleast_2d(groups)
    D = groups.shape[1]
    return ring(links, groups, nbytes / D, 2 * (D - 1), start, conns)


def ring_allgather(links: Links, groups, nbytes: float, start=None, conns: Connections | None = None) -> np.ndarray:
    """All-gather (or reduce-scatter, the same traffic) of a tensor of nbytes in total."""
    groups = np.atleast_2d(groups)
    D = groups.shape[1]
    return ring(links, groups, nbytes / D, D - 1, start, conns)


def sharded_ps(links: Links, groups, nbytes: float, start=None, mode: str = "grouped",
               preposted: bool = False) -> np.ndarray:
    """Finish times of the sharded parameter-server exchange of nbytes per device (groups: (G, D)).

    preposted: every receive was posted before the exchange (ours' runtime posts an iteration's
    receives up front), so no transfer waits for a ready notice whatever the protocol."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = np.zeros((G, D)) if start is None else np.broadcast_to(np.asarray(start, dtype=float), (G, D)).copy()
    if D == 1 or nbytes <= 0:
        return ready
    shard = nbytes / D
    handshake = 0 if preposted else links.protocol.step_handshake
    if mode == "grouped":
        return sharded_ps_phases(links, groups, nbytes, ready, preposted)[1]
    if mode != "rounds":
        raise ValueError(f"unknown sharded-PS mode {mode!r}")
    pos = np.arange(D)
    conns = Connections(links)
    for _phase in range(2):  # scatter gradient shards, then gather the aggregated shards
        for k in range(1, D):
            to = (pos + k) % D
            rate = links.fair_rates(groups, groups[:, to]).reshape(groups.shape)
            delay = links.delay_s[groups, groups[:, to]]
            notice = handshake * links.delay_s[groups[:, to], groups]
            begin = np.maximum(ready, ready[:, to] + notice)  # rendezvous with the receiver
            ser = conns.send(groups, groups[:, to], shard, begin, rate)
            arrive = begin + ser + delay  # at device `to`; the send completes on delivery
            recv_end = np.empty_like(arrive)
            recv_end[:, to] = arrive
            ready = np.maximum(arrive, recv_end)
    return ready


def sharded_ps_phases(links: Links, groups, nbytes: float, start=None,
                      preposted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(end of the scatter, end of the gather) of every device's grouped sharded parameter server (G, D),
    each phase one all-to-all of every pair at once that starts when the whole group is in it (a
    library's grouped send/receive calls: NCCL's groupStart/groupEnd); preposted as sharded_ps."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = np.zeros((G, D)) if start is None else np.broadcast_to(np.asarray(start, dtype=float), (G, D)).copy()
    if D == 1 or nbytes <= 0:
        return ready, ready
    scatter, gather = _grouped_all_to_all(links, groups, nbytes / D, ready, exchanges=2,
                                          handshake=0 if preposted else links.protocol.step_handshake)
    return scatter, gather


def dissemination_barrier(links: Links, ranks, arrive) -> np.ndarray:
    """When each rank leaves gloo's barrier (gloo/barrier.cc: the dissemination barrier of Hensgen, Finkel and
    Manber 1988), entered at `arrive` by ranks whose devices are `ranks` in rank order: in round k = 1, 2, 4,
    ... < N, rank r sends an empty message to r + k and waits for the one from r - k (mod N)."""
    ranks = np.asarray(ranks, dtype=int)
    t = np.asarray(arrive, dtype=float).copy()
    n, k = len(ranks), 1
    while k < n:
        src = (np.arange(n) - k) % n
        t = np.maximum(t, t[src] + links.delay_s[ranks[src], ranks])
        k <<= 1
    return t


def _grouped_all_to_all(links: Links, groups: np.ndarray, shard: float, ready: np.ndarray, exchanges: int,
                        handshake: int) -> list[np.ndarray]:
    """Every device's finish time (G, D) after each exchange."""
    G, D = groups.shape
    src = np.repeat(groups[:, :, None], D, axis=2)  # (G, D, D): src[g, p, q] = groups[g, p]
    dst = np.repeat(groups[:, None, :], D, axis=1)
    off = ~np.eye(D, dtype=bool)[None].repeat(G, 0)
    notice = handshake * links.delay_s[dst, src]
    out_load = (D - 1) * shard / links.egress_Bps[groups]  # (G, D)
    in_load = (D - 1) * shard / links.ingress_Bps[groups]
    min_delay = np.where(off, links.delay_s[src, dst], np.inf)
    busiest = np.maximum(out_load + min_delay.min(2), in_load + min_delay.min(1)).max(1)
    conns = Connections(links)
    ser = links.serialization_s(src, dst, shard)  # on connections in use
    t = ready.max(1)
    ends = []
    for _ in range(exchanges):  # every ordered pair carries a shard in each: scatter, then gather back
        if conns.idle_matters:  # the scatter's windows restarted after the iteration's silence
            ser = conns.send(src, dst, shard, t[:, None, None] + notice)
        pair = np.where(off, notice + links.delay_s[src, dst] + ser, 0.0).max((1, 2))
        t = t + np.maximum(pair, busiest)
        ends.append(np.repeat(t[:, None], D, axis=1))
    return ends
