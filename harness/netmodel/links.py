"""The links between devices: every ordered pair's delay and TCP payload rate, each device's interface,
and the protocol a library speaks over them. Collectives built on them: netmodel/collectives.py.

Link model. A transfer of b bytes from d to e takes delay_ms[d][e] (one way) plus
its serialisation: b / rate when the connection's window covers the path, more when the scenario's TCP
settings leave it smaller (the window sends one window per round trip: netmodel/tcp.py, on a
connection in use). The rate is the max-min fair share (netmodel/fair_share.py) of three capacities the
transfer crosses: the pair path d->e (bandwidth_gbps[d][e]), the sender's egress and the
receiver's ingress. Real interfaces (`nic="shared"`, the paper-scale model): a device's egress (ingress)
capacity is its fastest outgoing (incoming) pair, or the scenario's `interface_gbps` of its region where
that is less (Topology.interface_gbps). So transfers that share a sender's or receiver's interface share
its bandwidth; a pattern in which every device sends to one peer and receives from one (a ring step, a
pipeline hop) runs every pair at its own rate. A region whose devices share one NIC (the scenario's
`shared_nic_gbps`: a multi-GPU node, such as the paper's p3.16xlarge, 8 V100 behind 25 Gbps) adds two more: what
its devices send to other regions crosses the region's NIC out, what they receive from them its NIC in. The
paper's own scheduler prices case 1 the same way, 25 / 8 = 3.125 Gbps between two GPUs of different nodes
(DT-FM scheduler/generate_sim_com_matrices.py). A scenario whose links are shaped per destination region
(`link_classes: region`, as the paper's tc scripts shaped cases 3-5: one netem band per distinct delay and rate,
DT-FM scheduler/generate_heterogeneous_tc.py) adds one more: a device's transfers to one region share that
region pair's rate; its interface is then the scenario's `interface_gbps` alone, each way (the bands have no
common limit below the NIC). The emulated cluster (`nic="per-pair"`) shapes every
destination in its own HTB class, under one parent class at `interface_gbps` where the scenario sets one
(harness/network/plan.py): its egress is that limit (else unlimited) and its ingress unlimited, since
nothing shapes a device's receiving side, and no shared NIC, since nothing shapes a region's devices together.

Protocols. Before data flows, a library may wait for the receiver's "ready" notice,
one more one-way delay (receiver -> sender). NCCL posts receive buffers ahead
through its proxy FIFO, so in steady state neither a point-to-point message nor a
ring step waits for one (`nccl`: 0, 0). Gloo's unbound-buffer send/recv is a
rendezvous: the receiver notifies it is ready, then the sender sends, for blocking
point-to-point and for every ring step (`gloo`: 1, 1); the emulated cluster runs gloo.
Sockets. Gloo keeps one TCP connection per peer. NCCL's socket transport stripes each message over
NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD connections in chunks of at least 64 KiB, which it picks by the
NIC when unset: 2 x 8 on AWS's ENA, 4 x 1 on GCP's gVNIC, else one (NCCL 2.8.4 net_socket.cc
ncclSocketGetNsockNthread); the scenario says which (`nccl_sockets`). Its sends complete when the sockets take
the data, with no credit from the receiver, so only TCP bounds the data in flight.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..scenario import Topology
from ..scenario.class_links import held_by_region, representatives
from ..scenario.transport import LINUX, Transport
from ..units import gbps_to_bytes_per_s, ms_to_s
from .fair_share import max_min_fair
from .tcp import HOST_HZ, TcpPath


@dataclass(frozen=True)
class Protocol:
    """Extra one-way delays (the receiver's ready notice) a library pays before data flows."""

    name: str
    p2p_handshake: int  # per blocking point-to-point message
    step_handshake: int  # per ring step / all-to-all exchange
    sockets: int = 1  # TCP connections a peer's data is striped over


PROTOCOLS = {"nccl": Protocol("nccl", 0, 0), "gloo": Protocol("gloo", 1, 1)}


@dataclass(frozen=True)
class Links:
    """Delay (s) and rate (bytes/s) of every ordered device pair, per-device link capacities, and the protocol."""

    delay_s: np.ndarray
    rate_Bps: np.ndarray  # diagonal inf
    egress_Bps: np.ndarray
    ingress_Bps: np.ndarray
    protocol: Protocol = PROTOCOLS["nccl"]
    transport: Transport = LINUX  # resolved TCP settings (netmodel/tcp.py)
    hz: int = HOST_HZ  # the senders' kernel clock (their retransmission timeouts are in its ticks)
    # every device's region, when a resource is a region's: its NIC (bytes/s each way, inf: none; None: no region
    # has one) and, with link_classes region, the R x R rate a device's transfers to one region share (else None)
    device_region: np.ndarray | None = None
    nic_Bps: np.ndarray | None = None
    class_Bps: np.ndarray | None = None

    def path(self, src, dst, rate_Bps=None) -> TcpPath:
        """The TCP path of each pair src[k] -> dst[k], at the pair's rate or `rate_Bps` (its fair share)."""
        src, dst = np.asarray(src), np.asarray(dst)
        rate = self.rate_Bps[src, dst] if rate_Bps is None else np.asarray(rate_Bps, dtype=float)
        delay = self.delay_s[src, dst]
        return TcpPath.of(rate, delay, delay + self.delay_s[dst, src], self.transport, hz=self.hz,
                          sockets=self.protocol.sockets)

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
                       egress_Bps=few.egress_Bps[first][region], ingress_Bps=few.ingress_Bps[first][region],
                       **_region_resources(topo, nic))

    @classmethod
    def per_device(cls, topo: Topology, protocol: Protocol | str = "nccl", nic: str = "shared") -> "Links":
        """The links of `topo` as N x N matrices."""
        rate = gbps_to_bytes_per_s(np.asarray(topo.bandwidth_gbps, dtype=float))
        rate = rate.copy()
        np.fill_diagonal(rate, np.inf)
        off = rate.copy()
        np.fill_diagonal(off, 0.0)
        n = rate.shape[0]
        interface = (np.full(n, np.inf) if topo.interface_gbps is None
                     else gbps_to_bytes_per_s(np.asarray(topo.interface_gbps, dtype=float)))
        if nic == "shared" and topo.link_classes == "region":
            egress, ingress = interface, interface
        elif nic == "shared":
            egress = np.minimum(off.max(1), interface) if n > 1 else interface
            ingress = np.minimum(off.max(0), interface) if n > 1 else interface
        elif nic == "per-pair":
            egress, ingress = interface, np.full(n, np.inf)
        else:
            raise ValueError(f"unknown nic model {nic!r} (known: shared, per-pair)")
        delay = ms_to_s(np.asarray(topo.delay_ms, dtype=float))
        delay = delay.copy()
        np.fill_diagonal(delay, 0.0)
        if isinstance(protocol, str):
            if protocol not in PROTOCOLS:
                raise ValueError(f"unknown protocol {protocol!r} (known: {', '.join(PROTOCOLS)})")
            protocol = PROTOCOLS[protocol]
        if protocol.name == "nccl":
            protocol = replace(protocol, sockets=topo.nccl_sockets)
        finite = np.where(np.isinf(rate), 0.0, rate)
        bdp = float((finite * (delay + delay.T)).max(initial=0.0))  # the largest round trip's, as the plan sizes `auto`
        transport = topo.transport.resolved(bdp)
        return cls(delay, rate, egress, ingress, protocol, transport, **_region_resources(topo, nic))

    def fair_rates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Max-min fair rate of every concurrent transfer src[k] -> dst[k] (bytes/s)."""
        src = np.asarray(src).ravel()
        dst = np.asarray(dst).ravel()
        pair = self.rate_Bps[src, dst]
        local = src == dst
        s, d = src[~local], dst[~local]
        nics = self._nic_crossings(s, d)
        if len(np.unique(s)) == len(s) and len(np.unique(d)) == len(d) and nics is None:
            # A permutation: no resource carries two transfers (a region class carries its sender's one).
            if self.class_Bps is not None:
                pair = np.minimum(pair, self.class_Bps[self.device_region[src], self.device_region[dst]])
            return np.where(local, np.inf, np.minimum(pair, np.minimum(self.egress_Bps[src], self.ingress_Bps[dst])))
        rate = np.full(len(src), np.inf)
        # resources: the pairs in use, then the senders' egress, then the receivers' ingress, then shared NICs
        pairs, pair_of = np.unique(s * (max(s.max(), d.max()) + 1) + d, return_inverse=True)
        senders, sender_of = np.unique(s, return_inverse=True)
        receivers, receiver_of = np.unique(d, return_inverse=True)
        pair_cap = np.empty(len(pairs))
        pair_cap[pair_of] = pair[~local]  # every transfer of a pair has its rate
        crossings = [pair_of, len(pairs) + sender_of, len(pairs) + len(senders) + receiver_of]
        capacity = [pair_cap, self.egress_Bps[senders], self.ingress_Bps[receivers]]
        if nics is not None:  # a transfer inside a region crosses an infinite NIC (its region's last resource)
            base = len(pairs) + len(senders) + len(receivers)
            crossings += [base + nics[0], base + nics[1]]
            capacity.append(np.append(np.repeat(self.nic_Bps, 2), np.inf))
        if self.class_Bps is not None:  # a sender's transfers to one region share that region pair's rate
            r_src, r_dst = self.device_region[s], self.device_region[d]
            classes, class_of = np.unique(s * len(self.class_Bps) + r_dst, return_inverse=True)
            class_cap = np.empty(len(classes))
            class_cap[class_of] = self.class_Bps[r_src, r_dst]
            crossings.append(sum(len(c) for c in capacity) + class_of)
            capacity.append(class_cap)
        rate[~local] = max_min_fair(crossings, np.concatenate(capacity))
        return rate

    def _nic_crossings(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(NIC out, NIC in) of every transfer src[k] -> dst[k] between devices (indices 2r, 2r + 1 of region r's
        NIC; 2R, an unlimited one, for a transfer inside a region), or None when none crosses a shared NIC."""
        if self.nic_Bps is None:
            return None
        r_src, r_dst = self.device_region[src], self.device_region[dst]
        across = (r_src != r_dst) & (np.isfinite(self.nic_Bps[r_src]) | np.isfinite(self.nic_Bps[r_dst]))
        if not across.any():
            return None
        R = len(self.nic_Bps)
        return np.where(across, 2 * r_src, 2 * R), np.where(across, 2 * r_dst + 1, 2 * R)

    def shared_seconds(self, src: np.ndarray, dst: np.ndarray, nbytes) -> np.ndarray | None:
        """Seconds the busiest region resource (a shared NIC, a region class) that transfer k crosses needs to carry
        all of them together (nbytes[k] from src[k] to dst[k]): a lower bound on their makespan (0 for one that
        crosses none); None without region resources."""
        if self.device_region is None:
            return None
        src, dst = np.asarray(src).ravel(), np.asarray(dst).ravel()
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape)
        r_src, r_dst = self.device_region[src], self.device_region[dst]
        out = np.zeros(len(src))
        if self.nic_Bps is not None:
            across = r_src != r_dst
            R = len(self.nic_Bps)
            sent = np.bincount(r_src[across], weights=nbytes[across], minlength=R) / self.nic_Bps
            taken = np.bincount(r_dst[across], weights=nbytes[across], minlength=R) / self.nic_Bps
            out = np.where(across, np.maximum(sent[r_src], taken[r_dst]), 0.0)
        if self.class_Bps is not None:
            _, cls = np.unique(src * len(self.class_Bps) + r_dst, return_inverse=True)
            out = np.maximum(out, np.bincount(cls, weights=nbytes)[cls] / self.class_Bps[r_src, r_dst])
        return out


def _region_resources(topo: Topology, nic: str) -> dict:
    """Links' region fields of `topo`: its regions' shared NICs under the paper-scale model (`nic="shared"`; the
    emulated cluster shapes no region's devices together), its region classes under both (the cluster shapes them).
    """
    nics = None if nic != "shared" or topo.region_nic_gbps is None else topo.region_nic_gbps
    if nics is None and topo.link_classes != "region":
        return {}
    out = {"device_region": np.asarray(topo.device_region)}
    if nics is not None:
        out["nic_Bps"] = gbps_to_bytes_per_s(np.asarray(nics, dtype=float))
    if topo.link_classes == "region":
        out["class_Bps"] = gbps_to_bytes_per_s(np.asarray(topo.region_bandwidth_gbps, dtype=float))
    return out


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
