"""A scenario as the harness holds it: `Topology`, one-way delay (ms) and bandwidth (Gbps) between regions,
regions and per-device compute profiles; frozen, and scaled or cut down into new ones.

Links are held by region (R x R, the diagonal each region's own link): a scenario of 10,240 devices in eight
regions holds two 8 x 8 matrices, not two 800 MB device x device ones. The device x device matrices that
small-scale consumers read (`delay_ms`, `bandwidth_gbps`) are expanded on first read; the consumers at
scale (the planner on link classes) read `region_links` and never expand them. A topology whose links
differ inside a region (a test that perturbs one pair, the FL emulation's server) carries device-level
links instead (`with_device_links`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..errors import HarnessError
from ..units import gbps_to_bits_per_s, ms_to_s
from .transport import LINUX, Transport


class ScenarioError(HarnessError, ValueError):
    """A scenario file or request is invalid; str() is one line: file: field: problem."""


#: what one shaped rate carries: each destination on its own (`pair`), or all of a device's destinations in one region
#: together (`region`: the paper's tc scripts give every distinct delay and rate one netem band)
LINK_CLASSES = ("pair", "region")

#: float64 N x N matrices alive at once while link matrices of N rows are built and read (delay, bandwidth
#: and their intermediates; the scheduler and simulator hold a few more)
LINK_MATRICES = 6


def check_fits(source, rows: int, what: str) -> None:
    """One line, before any allocation, when link matrices of `rows` rows (devices or regions) would not
    fit in this machine's memory (a traceback from numpy, or the machine swapping, otherwise)."""
    need = LINK_MATRICES * 8 * rows ** 2
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        most = math.isqrt(have // (LINK_MATRICES * 8))
        raise ScenarioError(f"{source}: regions: {rows:,} {what} need {need / 2**30:,.1f} GiB for their "
                            f"{rows:,} x {rows:,} link matrices, more than this machine's "
                            f"{have / 2**30:.1f} GiB (at most about {most:,} here)")


@dataclass(frozen=True)
class DeviceProfile:
    """Compute of one device. The peaks are data (the scenario's, or harness/scenario/gpus.py's vendor sheet for
    its `gpu`), never a literal in code. slowdown: Sky Computing's penalty factor, the device computes
    that many times slower than its type (> 1: a slower device)."""

    gpu: str
    peak_tflops: float  # fp16 / bf16 (mixed precision) peak
    memory_gb: float
    peak_tflops_fp32: float | None = None  # None: the same as peak_tflops
    slowdown: float = 1.0
    memory_bandwidth_gbs: float | None = None  # GB/s; None: memory-bound work is not modelled

    def peak(self, dtype: str) -> float:
        """Peak TFLOPS for a training precision (fp32 runs use the single-precision peak)."""
        if dtype == "fp32" and self.peak_tflops_fp32 is not None:
            return self.peak_tflops_fp32
        return self.peak_tflops


@dataclass(frozen=True)
class Link:
    delay_ms: float
    bandwidth_gbps: float


@dataclass(frozen=True)
class Server:
    """A federated-learning server (OWL's FL workload, harness/workloads/fl/): not a device that trains, the host
    every worker pulls the model from. uplink_gbps None: its uplink is the inter-region link (it sits
    behind the same fabric as a rack)."""

    delay_ms: float  # one way to a worker, where the server is outside every region
    uplink_gbps: float | None = None
    region: str | None = None  # a region it sits in: its links to the workers are that region's (delay_ms unused)


@dataclass(frozen=True)
class Region:
    name: str
    devices: int
    intra: Link
    profile: DeviceProfile
    group: str = ""  # the scenario entry it came from (entries with `count` make several)


@dataclass(frozen=True)
class Topology:
    """The world a run happens in.

    region_delay_ms[r][s] is the one-way delay applied on the egress of r's devices towards s's,
    region_bandwidth_gbps[r][s] the rate; the diagonal is the link between two devices of one region.
    At device level (`delay_ms`, `bandwidth_gbps`, device ids are row indices) the diagonal is unused
    (delay 0, bandwidth inf).
    """

    name: str
    description: str
    source: str
    regions: tuple[Region, ...]
    device_region: tuple[int, ...]  # region index of every device
    region_delay_ms: np.ndarray
    region_bandwidth_gbps: np.ndarray  # already multiplied by bandwidth_scale
    bandwidth_scale: float = 1.0  # the factor applied to the scenario file's bandwidths (scaled())
    server: Server | None = None  # only scenarios of the FL workload have one
    # per device, the most its network interface carries each way, all its flows together (Gbps, scaled like
    # bandwidth_gbps): the scenario's `interface_gbps` of its region, or an FL server's uplink
    # (workloads/fl/federation.py); None or inf: no limit beyond each pair's own rate
    interface_gbps: np.ndarray | None = None
    # per region, one NIC its devices share for everything they send to (and receive from) other regions, each
    # way (Gbps, scaled like bandwidth_gbps): the scenario's `shared_nic_gbps`, a multi-GPU node's; None or inf:
    # none (netmodel/links.py)
    region_nic_gbps: np.ndarray | None = None
    transport: Transport = LINUX  # every device's TCP settings (transport.py)
    # TCP connections NCCL's socket transport opens per peer on these machines' NICs (netmodel/links.py)
    nccl_sockets: int = 1
    # `pair`: a device's rate to each destination is its own; `region`: its destinations in one region share one
    # rate, the region pair's, and its interface is interface_gbps alone (netmodel/links.py, network/plan.py)
    link_classes: str = "pair"
    # device x device links where they are not the regions' (with_device_links); None: the regions'
    device_delay_ms: np.ndarray | None = None
    device_bandwidth_gbps: np.ndarray | None = None
    # links that change during the run (timeline.py's Timeline: the scenario's `timeline:` or --timeline); None:
    # they hold still
    timeline: object | None = None

    @property
    def n(self) -> int:
        return len(self.device_region)

    @property
    def region_links(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(delay ms, bandwidth Gbps), R x R with each region's own link on the diagonal, when they are every
        device pair's links (None when device-level links were given)."""
        if self.device_delay_ms is not None or self.device_bandwidth_gbps is not None:
            return None
        return self.region_delay_ms, self.region_bandwidth_gbps

    @cached_property
    def delay_ms(self) -> np.ndarray:
        """(N, N) one-way delays, device level (expanded once, on first read)."""
        if self.device_delay_ms is not None:
            return self.device_delay_ms
        return self._expand(self.region_delay_ms, 0.0)

    @cached_property
    def bandwidth_gbps(self) -> np.ndarray:
        """(N, N) rates in Gbps, device level (expanded once, on first read)."""
        if self.device_bandwidth_gbps is not None:
            return self.device_bandwidth_gbps
        return self._expand(self.region_bandwidth_gbps, np.inf)

    def _expand(self, region: np.ndarray, diagonal: float) -> np.ndarray:
        check_fits(self.source, self.n, "devices")
        dr = np.asarray(self.device_region)
        out = region[np.ix_(dr, dr)]
        np.fill_diagonal(out, diagonal)
        return out

    def with_device_links(self, delay_ms: np.ndarray | None = None,
                          bandwidth_gbps: np.ndarray | None = None) -> "Topology":
        """This topology with device-level links (N x N) in place of the regions' (either one, or both)."""
        delay = self.delay_ms if delay_ms is None else np.asarray(delay_ms, dtype=float)
        bw = self.bandwidth_gbps if bandwidth_gbps is None else np.asarray(bandwidth_gbps, dtype=float)
        for what, m in (("delay_ms", delay), ("bandwidth_gbps", bw)):
            if m.shape != (self.n, self.n):
                raise ScenarioError(f"{self.source}: {what}: must be {self.n} x {self.n} (got {m.shape})")
        return replace(self, device_delay_ms=delay, device_bandwidth_gbps=bw)

    def scaled(self, bandwidth_scale: float) -> "Topology":
        """Every bandwidth multiplied by `bandwidth_scale` (delays unchanged), applied once where a run is
        planned: every consumer (shaping plan, scheduler, bounds, simulator) then reads the link as one value."""
        s = bandwidth_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < math.inf):
            raise ScenarioError(f"{self.source}: bandwidth_scale: must be a finite number > 0 (got {s!r})")
        if s == 1.0:
            return self
        egress = None if self.interface_gbps is None else self.interface_gbps * s
        nic = None if self.region_nic_gbps is None else self.region_nic_gbps * s
        device_bw = None if self.device_bandwidth_gbps is None else self.device_bandwidth_gbps * s
        return replace(self, region_bandwidth_gbps=self.region_bandwidth_gbps * s,
                       bandwidth_scale=self.bandwidth_scale * s, interface_gbps=egress, region_nic_gbps=nic,
                       device_bandwidth_gbps=device_bw)

    def region_of(self, device: int) -> Region:
        return self.regions[self.device_region[device]]

    @property
    def profiles(self) -> tuple[DeviceProfile, ...]:
        return tuple(self.regions[r].profile for r in self.device_region)

    def symmetric(self) -> tuple[np.ndarray, np.ndarray]:
        """(A+A^T)/2 in seconds and (B+B^T)/2 in bit/s, as the paper's communication graph G."""
        delay_s = ms_to_s((self.delay_ms + self.delay_ms.T) / 2)
        bw = self.bandwidth_gbps.copy()
        np.fill_diagonal(bw, np.inf)
        bw_bps = gbps_to_bits_per_s((bw + bw.T) / 2)
        np.fill_diagonal(delay_s, 0.0)
        return delay_s, bw_bps

    def symmetric_regions(self) -> tuple[np.ndarray, np.ndarray] | None:
        """symmetric() between regions (R x R, the diagonal each region's own link), with the same arithmetic:
        equal to every device pair's value; None when device-level links were given."""
        if self.region_links is None:
            return None
        delay, bw = self.region_links
        return ms_to_s((delay + delay.T) / 2), gbps_to_bits_per_s((bw + bw.T) / 2)

    def to_export(self) -> dict:
        """The `scenario export --json` document (diagonal bandwidth is null)."""
        bw = [[None if i == j else float(self.bandwidth_gbps[i, j]) for j in range(self.n)]
              for i in range(self.n)]
        return {
            "scenario": self.name,
            "delay_ms": [[float(x) for x in row] for row in self.delay_ms],
            "bandwidth_gbps": bw,
            "regions": [self.regions[r].name for r in self.device_region],
            "profiles": [vars(p) for p in self.profiles],
        }

    def subset(self, devices: list[int]) -> "Topology":
        """The topology restricted to `devices` (in that order)."""
        idx = np.asarray(devices)
        used = sorted({self.device_region[d] for d in devices})
        remap = {r: k for k, r in enumerate(used)}
        counts = {r: sum(1 for d in devices if self.device_region[d] == r) for r in used}
        regions = tuple(
            replace(self.regions[r], devices=counts[r]) for r in used
        )
        keep = np.ix_(used, used)
        by_device = np.ix_(idx, idx)
        return Topology(
            name=self.name,
            description=self.description,
            source=self.source,
            regions=regions,
            device_region=tuple(remap[self.device_region[d]] for d in devices),
            region_delay_ms=self.region_delay_ms[keep].copy(),
            region_bandwidth_gbps=self.region_bandwidth_gbps[keep].copy(),
            bandwidth_scale=self.bandwidth_scale,
            server=self.server,
            interface_gbps=None if self.interface_gbps is None else self.interface_gbps[idx].copy(),
            region_nic_gbps=None if self.region_nic_gbps is None else self.region_nic_gbps[used].copy(),
            transport=self.transport,
            nccl_sockets=self.nccl_sockets,
            link_classes=self.link_classes,
            device_delay_ms=None if self.device_delay_ms is None else self.device_delay_ms[by_device].copy(),
            device_bandwidth_gbps=(None if self.device_bandwidth_gbps is None
                                   else self.device_bandwidth_gbps[by_device].copy()),
            timeline=self.timeline,  # names regions: events on regions left out change nothing
        )


def scale_down(topo: Topology, devices: int) -> Topology:
    """Keep the structure with fewer devices: every region kind keeps the same share.

    With factor f = N/K, a region of its own keeps devices/f of its devices (case 5 with 8
    devices keeps 1 per region, with 16 keeps 2). A group of identical regions (an entry with
    `count`) shrinks both the number of regions and the devices in each, as evenly as the
    divisors allow, so that both its links survive: case 1 (8 nodes x 8) at 8 devices keeps
    2 nodes x 4, case 2's 4-GPU nodes keep 2 nodes x 2 beside 4 of its 1-GPU nodes; a group
    whose regions cannot shrink keeps count/f whole regions. Kept devices are the first ones,
    so ids stay in region order.
    """
    n = topo.n
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ScenarioError(f"{topo.source}: --devices: must be a positive integer (got {devices!r})")
    if devices == n:
        return topo
    keep = _kept_devices(topo, devices) if devices < n else None
    if keep is None:
        valid = [k for k in range(1, n + 1) if k == n or _kept_devices(topo, k) is not None]
        raise ScenarioError(
            f"{topo.source}: --devices: {devices} does not keep the structure of {n} devices in "
            f"{len(topo.regions)} regions (every region kind must keep the same share; valid: "
            f"{', '.join(map(str, valid))})"
        )
    return topo.subset(keep)


def _kept_devices(topo: Topology, k: int) -> list[int] | None:
    if topo.n % k:
        return None
    f = topo.n // k
    starts, start = [], 0
    for reg in topo.regions:
        starts.append(start)
        start += reg.devices
    groups: dict[str, list[int]] = {}
    for r, reg in enumerate(topo.regions):
        groups.setdefault(reg.group or reg.name, []).append(r)
    keep = []
    for members in groups.values():
        sizes = {topo.regions[r].devices for r in members}
        if len(sizes) != 1:
            if not all(s % f == 0 for s in sizes):
                return None
            keep += [d for r in members for d in range(starts[r], starts[r] + topo.regions[r].devices // f)]
            continue
        split = _even_split(len(members), sizes.pop(), f)
        if split is None:
            return None
        regions, per_region = split
        keep += [d for r in members[:regions] for d in range(starts[r], starts[r] + per_region)]
    return sorted(keep)


def _even_split(count: int, size: int, f: int) -> tuple[int, int] | None:
    """(regions kept, devices kept per region) of `count` regions of `size` devices shrunk by f:
    f = f_regions x f_devices with each factor dividing its dimension, the two as close as possible
    (ties: fewer regions of more devices); None when no such split exists."""
    splits = [(f // fd, fd) for fd in range(1, f + 1)
              if f % fd == 0 and size % fd == 0 and count % (f // fd) == 0]
    if not splits:
        return None
    fr, fd = min(splits, key=lambda s: (abs(math.log(s[0] / s[1])), s[1]))
    return count // fr, size // fd
