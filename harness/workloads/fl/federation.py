"""A scenario read as OWL's cluster: one server plus racks of workers (Sec. 4.1.2).

Racks are the scenario's regions. Inside a rack workers talk at B_intra, across racks at
B_inter = alpha * B_intra, and the server reaches a worker at B_inter (it is outside every rack,
eq. 13) through its own uplink (the scenario's `server.uplink_gbps`, else B_inter). A worker's
network interface carries at most its fastest link (B_intra) in each direction, or the scenario's
`interface_gbps` where that is less, as in harness/netmodel/links.py. `--alpha` replaces B_inter (and a defaulted uplink) by alpha * B_intra.
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
        return replace(self, intra_Bps=self.intra_Bps * s, inter_Bps=self.inter_Bps * s,
                       uplink_Bps=self.uplink_Bps * s, flops_per_s=tuple(f / c for f in self.flops_per_s),
                       interface_Bps=self.worker_egress_Bps * s, per_pair=True)

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
    region = np.asarray(topo.device_region)
    same = region[:, None] == region[None, :]
    off = ~np.eye(topo.n, dtype=bool)
    flat = not (same & off).any()  # every rack one worker: no racks (Fig. 11), the workers' links alike
    if flat and topo.n < 2:
        raise FLError(f"{topo.source}: regions: one worker; a federation needs two or more")
    if flat:
        intra = _uniform(topo, topo.bandwidth_gbps[off], "inter_region.bandwidth_gbps")
        intra_delay = _uniform(topo, topo.delay_ms[off], "inter_region.delay_ms")
    else:
        intra = _uniform(topo, topo.bandwidth_gbps[same & off], "intra_region.bandwidth_gbps")
        intra_delay = _uniform(topo, topo.delay_ms[same & off], "intra_region.delay_ms")
    if len(topo.regions) > 1 and not flat:
        inter = _uniform(topo, topo.bandwidth_gbps[~same], "inter_region.bandwidth_gbps")
        inter_delay = _uniform(topo, topo.delay_ms[~same], "inter_region.delay_ms")
    else:
        inter, inter_delay = intra, intra_delay
    if inter > intra and alpha is None:
        raise FLError(f"{topo.source}: inter_region.bandwidth_gbps: above the intra-rack one ({inter} > {intra}); "
                      "alpha = B_inter / B_intra must be in (0, 1]")
    if alpha is not None:
        inter = alpha * intra
    uplink = topo.server.uplink_gbps if topo.server.uplink_gbps is not None else inter
    profs = device_profiles(topo, dtype=DTYPE)
    interface = (math.inf if topo.interface_gbps is None
                 else _uniform(topo, np.asarray(topo.interface_gbps, dtype=float), "interface_gbps"))
    return Federation(
        name=topo.name, source=topo.source, racks=(topo.n,) if flat else tuple(r.devices for r in topo.regions),
        intra_Bps=gbps_to_bytes_per_s(intra), inter_Bps=gbps_to_bytes_per_s(inter),
        uplink_Bps=gbps_to_bytes_per_s(uplink),
        intra_delay_s=ms_to_s(intra_delay), inter_delay_s=ms_to_s(inter_delay),
        server_delay_s=ms_to_s(topo.server.delay_ms),
        flops_per_s=tuple(p.flops_per_s("transformer") for p in profs), gpu=topo.profiles[0].gpu,
        interface_Bps=gbps_to_bytes_per_s(interface), flat=flat,
    )


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
    their racks, then the server (device `fed.workers`) in a region of its own, reached at B_inter after
    its delay, its interface limited to its uplink. Unscaled: Topology.scaled gives the run's."""
    W, R = fed.workers, len(fed.racks)
    if fed.flat:  # no racks: every worker its own region, every pair at the workers' one link
        R = len(topo.regions)
    elif tuple(topo.device_region) != tuple(fed.rack_of):
        raise FLError(f"{topo.source}: a federation's racks must be its regions, in order")
    delay = np.full((R + 1, R + 1), s_to_ms(fed.inter_delay_s))  # a region per rack, then the server's
    np.fill_diagonal(delay, s_to_ms(fed.intra_delay_s))
    delay[R, :] = delay[:, R] = s_to_ms(fed.server_delay_s)
    bw = np.full((R + 1, R + 1), bytes_per_s_to_gbps(fed.inter_Bps))
    np.fill_diagonal(bw[:R, :R], bytes_per_s_to_gbps(fed.intra_Bps))
    interface = np.full(W + 1, bytes_per_s_to_gbps(fed.worker_egress_Bps))  # as the simulator limits what it sends
    interface[W] = bytes_per_s_to_gbps(fed.uplink_Bps)
    host = Region("server", 1, Link(s_to_ms(fed.server_delay_s), bytes_per_s_to_gbps(fed.inter_Bps)),
                  topo.regions[0].profile)
    return Topology(name=topo.name, description=topo.description, source=topo.source,
                    regions=topo.regions + (host,), device_region=tuple(topo.device_region) + (len(topo.regions),),
                    region_delay_ms=delay, region_bandwidth_gbps=bw, bandwidth_scale=topo.bandwidth_scale,
                    server=topo.server, interface_gbps=interface)
