"""A scenario read as OWL's cluster: one server plus racks of workers (Sec. 4.1.2).

Racks are the scenario's regions. Inside a rack workers talk at B_intra, across racks at
B_inter = alpha * B_intra, and the server reaches a worker at B_inter (it is outside every rack,
eq. 13) through its own uplink (the scenario's `server.uplink_gbps`, else B_inter). A worker's
network interface carries at most its fastest link (B_intra) in each direction, or the scenario's
`interface_gbps` where that is less, as in harness/netmodel/links.py. `--alpha` replaces B_inter (and a
defaulted uplink) by alpha * B_intra.
Scaling down keeps the rack shape: it keeps whole racks, the same share of every scenario entry.
A scenario whose racks each hold one worker has no racks (the paper's Fig. 11): one rack of every worker,
B_intra = B_inter the workers' one link (they must be alike), so OWL's peers relay across the whole federation.

The emulated cluster (`harness fl --backend emu`) runs this federation as a topology of its own
(`emulated_topology`): the workers, then the server as one more device in a region of its own,
whose interface is limited to the uplink (Topology.interface_gbps); a worker's interface sends at most what
the simulator lets it send (its fastest link, or the scenario's `interface_gbps` where less: a relay to 7
peers shares one link's rate, as on the testbed) and receives limited by each pair alone (the emulated
cluster shapes what leaves an interface), which `scaled` says to the simulator when it predicts such a run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...errors import HarnessError
from ...compute.profiles import device_profiles
from ...scenario import Topology, load_scenario
from ...scenario.topology import Link, Region
from ...units import bytes_per_s_to_gbps, gbps_to_bytes_per_s, ms_to_s, s_to_ms

DTYPE = "fp32"  # OWL trains in fp32 (PyTorch 1.9 defaults): 4 bytes per parameter, the fp32 peak


class FLError(HarnessError, ValueError):
    """A federated-learning request or input is invalid; str() is one line."""


@dataclass(frozen=True)
class Federation:
    name: str
    source: str
    racks: tuple[int, ...]  # workers per rack
    intra_Bps: float  # bytes/s between two workers of one rack
    inter_Bps: float  # bytes/s between workers of two racks, and from the server to a worker
    uplink_Bps: float  # the server's uplink, shared by everything it sends
    intra_delay_s: float
    inter_delay_s: float
    server_delay_s: float
    flops_per_s: tuple[float, ...]  # what every worker achieves (fp32 peak x efficiency)
    gpu: str
    interface_Bps: float = math.inf  # a worker's interface limit (the scenario's interface_gbps), each direction
    per_pair: bool = False  # the emulated cluster: pairs shaped alone, an interface limits what it sends only
    flat: bool = False  # no racks (the scenario's racks each of one worker): one rack of every worker, peers alike
    # a geo-distributed federation: rack pairs' own links (R x R, bytes/s and s; the diagonal B_intra), where they
    # differ; None: every pair at inter_Bps after inter_delay_s (then B_inter is the slowest pair, inter_delay_s
    # the longest)
    rack_Bps: tuple[tuple[float, ...], ...] | None = None
    rack_delay_s: tuple[tuple[float, ...], ...] | None = None
    # the server's link to each rack where it sits in a region (`server.region`); None: inter_Bps after
    # server_delay_s to every rack
    server_Bps: tuple[float, ...] | None = None
    server_rack_delay_s: tuple[float, ...] | None = None

    def rack_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, one-way s) between racks, R x R; the diagonal a rack's own link (B_intra)."""
        R = len(self.racks)
        if self.rack_Bps is not None:
            rate, delay = np.array(self.rack_Bps), np.array(self.rack_delay_s)
        else:
            rate, delay = np.full((R, R), self.inter_Bps), np.full((R, R), self.inter_delay_s)
        np.fill_diagonal(rate, self.intra_Bps)
        np.fill_diagonal(delay, self.intra_delay_s)
        return rate, delay

    def server_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, one-way s) from the server to a worker of each rack."""
        R = len(self.racks)
        if self.server_Bps is None:
            return np.full(R, self.inter_Bps), np.full(R, self.server_delay_s)
        return np.array(self.server_Bps), np.array(self.server_rack_delay_s)

    @property
    def worker_egress_Bps(self) -> float:
        """What a worker's interface sends in all: its fastest link (B_intra) or the scenario's limit."""
        return self.interface_Bps if self.per_pair else min(self.intra_Bps, self.interface_Bps)

    @property
    def worker_ingress_Bps(self) -> float:
        """What it receives in all: the same, except where nothing shapes a receiving side (emulated)."""
        return math.inf if self.per_pair else min(self.intra_Bps, self.interface_Bps)

    def scaled(self, bandwidth_scale: float, compute_time_scale: float, payload_share: float = 1.0) -> "Federation":
        """The federation as the emulated cluster runs it: every bandwidth x bandwidth_scale, of which the
        parameters get `payload_share` (the rest is the frames' headers: netmodel/tcp.tcp_efficiency), every
        computation compute_time_scale times longer, and the workers' interfaces limited as the emulated
        cluster shapes them: what each sends, all its pairs together, under its interface's limit (one HTB
        parent class: worker_egress_Bps), what it receives only by each pair; the server's uplink stays one
        shared limit."""
        s, c = bandwidth_scale * payload_share, compute_time_scale
        times = (lambda row: tuple(x * s for x in row))
        return replace(self, intra_Bps=self.intra_Bps * s, inter_Bps=self.inter_Bps * s,
                       uplink_Bps=self.uplink_Bps * s, flops_per_s=tuple(f / c for f in self.flops_per_s),
                       interface_Bps=self.worker_egress_Bps * s, per_pair=True,
                       rack_Bps=None if self.rack_Bps is None else tuple(times(r) for r in self.rack_Bps),
                       server_Bps=None if self.server_Bps is None else times(self.server_Bps))

    @property
    def workers(self) -> int:
        return sum(self.racks)

    @property
    def alpha(self) -> float:
        return self.inter_Bps / self.intra_Bps

    @property
    def rack_of(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.racks)), self.racks)

    def members(self, rack: int) -> list[int]:
        start = sum(self.racks[:rack])
        return list(range(start, start + self.racks[rack]))

    @property
    def shape(self) -> str:
        if self.flat:
            return f"{self.workers}x1"
        sizes = sorted(set(self.racks))
        return f"{len(self.racks)}x{sizes[0]}" if len(sizes) == 1 else f"{len(self.racks)} racks"


def _uniform(topo: Topology, values: np.ndarray, what: str) -> float:
    vals = np.unique(values)
    if len(vals) != 1:
        raise FLError(f"{topo.source}: {what}: a federation needs one value for every pair (got {sorted(vals)})")
    return float(vals[0])


def federation(topo: Topology, alpha: float | None = None) -> Federation:
    """The OWL cluster of a scenario with a `server` block."""
    if topo.server is None:
        raise FLError(f"{topo.source}: server: missing (an FL scenario names its server, e.g. owl-testbed)")
    if alpha is not None and (isinstance(alpha, bool) or not (0 < alpha <= 1)):
        raise FLError(f"--alpha: must be in (0, 1] (B_inter = alpha x B_intra; got {alpha!r})")
    if topo.n < 2:
        raise FLError(f"{topo.source}: regions: one worker; a federation needs two or more")
    R = len(topo.regions)
    bw, delay = np.asarray(topo.region_bandwidth_gbps, dtype=float), np.asarray(topo.region_delay_ms, dtype=float)
    off = ~np.eye(R, dtype=bool)
    single = all(r.devices == 1 for r in topo.regions)
    flat = single and len(np.unique(bw[off])) == 1 and len(np.unique(delay[off])) == 1  # Fig. 11: no racks
    if flat:
        intra, intra_delay = float(bw[off][0]), float(delay[off][0])
    else:
        intra = _uniform(topo, np.diag(bw), "intra_region.bandwidth_gbps")
        intra_delay = _uniform(topo, np.diag(delay), "intra_region.delay_ms")
    geo = R > 1 and not flat and (len(np.unique(bw[off])) > 1 or len(np.unique(delay[off])) > 1)
    if geo and alpha is not None:
        raise FLError(f"--alpha: {topo.source}'s racks have links of their own (a geo-distributed federation); "
                      "alpha sets one B_inter for every pair of racks")
    if R > 1 and not flat:
        inter, inter_delay = float(bw[off].min()), float(delay[off].max())  # geo: the slowest pair of racks
    else:
        inter, inter_delay = intra, intra_delay
    if inter > intra and alpha is None and not geo:
        raise FLError(f"{topo.source}: inter_region.bandwidth_gbps: above the intra-rack one ({inter} > {intra}); "
                      "alpha = B_inter / B_intra must be in (0, 1]")
    if alpha is not None:
        inter = alpha * intra
    server = _server_links(topo, bw, delay, flat)
    uplink = topo.server.uplink_gbps
    if uplink is None:
        uplink = inter if server is None else float(max(server[0]))
    profs = device_profiles(topo, dtype=DTYPE)
    interface = (math.inf if topo.interface_gbps is None
                 else _uniform(topo, np.asarray(topo.interface_gbps, dtype=float), "interface_gbps"))
    rates = (lambda m: tuple(tuple(gbps_to_bytes_per_s(x) for x in row) for row in m))
    waits = (lambda m: tuple(tuple(ms_to_s(x) for x in row) for row in m))
    return Federation(
        name=topo.name, source=topo.source, racks=(topo.n,) if flat else tuple(r.devices for r in topo.regions),
        intra_Bps=gbps_to_bytes_per_s(intra), inter_Bps=gbps_to_bytes_per_s(inter),
        uplink_Bps=gbps_to_bytes_per_s(uplink),
        intra_delay_s=ms_to_s(intra_delay), inter_delay_s=ms_to_s(inter_delay),
        server_delay_s=ms_to_s(topo.server.delay_ms if server is None else max(server[1])),
        flops_per_s=tuple(p.flops_per_s("transformer") for p in profs), gpu=topo.profiles[0].gpu,
        interface_Bps=gbps_to_bytes_per_s(interface), flat=flat,
        rack_Bps=rates(bw) if geo else None, rack_delay_s=waits(delay) if geo else None,
        server_Bps=None if server is None else rates([server[0]])[0],
        server_rack_delay_s=None if server is None else waits([server[1]])[0],
    )


def _server_links(topo: Topology, bw: np.ndarray, delay: np.ndarray, flat: bool):
    """(Gbps, ms) from the server to each rack where it sits in a region (`server.region`): that region's links;
    None where it sits outside every rack."""
    name = topo.server.region
    if name is None:
        return None
    names = [r.name for r in topo.regions]
    if name not in names:
        raise FLError(f"{topo.source}: server.region: {name!r} is not among the racks kept ({', '.join(names)})")
    x = names.index(name)
    if flat:  # one rack of every worker: the server is one more peer
        return [float(bw[x, (x + 1) % len(names)])], [float(delay[x, (x + 1) % len(names)])]
    return [float(v) for v in bw[x]], [float(v) for v in delay[x]]


def whole_racks(topo: Topology, devices: int) -> Topology:
    """`topo` with `devices` workers in whole racks: of every scenario entry the same share of its racks."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise FLError(f"--devices: must be a positive integer (got {devices!r})")
    if devices == topo.n:
        return topo
    groups: dict[str, list[int]] = {}
    for r, reg in enumerate(topo.regions):
        groups.setdefault(reg.group or reg.name, []).append(r)

    def kept(k: int) -> list[int] | None:
        if topo.n % k:
            return None
        f = topo.n // k
        if any(len(m) % f for m in groups.values()):
            return None
        return sorted(r for m in groups.values() for r in m[: len(m) // f])

    racks = kept(devices) if devices < topo.n else None
    if racks is None:
        valid = [k for k in range(1, topo.n + 1) if kept(k) is not None]
        raise FLError(f"{topo.source}: --devices: {devices} workers are not whole racks of the same shape "
                      f"(valid: {', '.join(map(str, valid))})")
    starts = np.cumsum([0] + [reg.devices for reg in topo.regions])
    return topo.subset([d for r in racks for d in range(starts[r], starts[r + 1])])


def load_topology(name: str, devices: int | None = None) -> Topology:
    """An FL scenario, kept to `devices` workers in whole racks."""
    topo = load_scenario(name)
    return topo if devices is None else whole_racks(topo, devices)


def load_federation(name: str, devices: int | None = None, alpha: float | None = None) -> Federation:
    return federation(load_topology(name, devices), alpha)


def emulated_topology(topo: Topology, fed: Federation) -> Topology:
    """`fed` (the federation of `topo`, at its alpha) as devices of the emulated cluster: the workers in
    their racks, then the server (device `fed.workers`) in a region of its own, reached as the federation
    says (B_inter after its delay, or its region's links), its interface limited to its uplink. Unscaled:
    Topology.scaled gives the run's."""
    W = fed.workers
    if fed.flat:  # no racks: every worker its own region, every pair at the workers' one link
        R = len(topo.regions)
        rate, wait = np.full((R, R), fed.intra_Bps), np.full((R, R), fed.intra_delay_s)
    elif tuple(topo.device_region) != tuple(fed.rack_of):
        raise FLError(f"{topo.source}: a federation's racks must be its regions, in order")
    else:
        R = len(fed.racks)
        rate, wait = fed.rack_links()
    srate, swait = fed.server_links()
    rack = np.zeros(R, dtype=int) if fed.flat else np.arange(R)
    bw, delay = np.zeros((R + 1, R + 1)), np.zeros((R + 1, R + 1))  # a region per rack, then the server's
    bw[:R, :R], delay[:R, :R] = rate, wait
    bw[R, :R] = bw[:R, R] = srate[rack]
    delay[R, :R] = delay[:R, R] = swait[rack]
    bw[R, R], delay[R, R] = srate.max(), swait.min()  # unused: the server's region has one device
    bw, delay = bytes_per_s_to_gbps(bw), s_to_ms(delay)
    interface = np.full(W + 1, bytes_per_s_to_gbps(fed.worker_egress_Bps))  # as the simulator limits what it sends
    interface[W] = bytes_per_s_to_gbps(fed.uplink_Bps)
    host = Region("server", 1, Link(float(delay[R, R]), float(bw[R, R])), topo.regions[0].profile)
    return Topology(name=topo.name, description=topo.description, source=topo.source,
                    regions=topo.regions + (host,), device_region=tuple(topo.device_region) + (len(topo.regions),),
                    region_delay_ms=delay, region_bandwidth_gbps=bw, bandwidth_scale=topo.bandwidth_scale,
                    server=topo.server, interface_gbps=interface)
