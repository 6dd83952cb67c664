"""A scenario as the harness holds it: `Topology`, device-level one-way delay (ms) and bandwidth (Gbps)
matrices, regions and per-device compute profiles; frozen, and scaled or cut down into new ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import HarnessError
from ..units import gbps_to_bits_per_s, ms_to_s
from .transport import LINUX, Transport


class ScenarioError(HarnessError, ValueError):
    """A scenario file or request is invalid; str() is one line: file: field: problem."""


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

    delay_ms: float
    uplink_gbps: float | None = None


@dataclass(frozen=True)
class Region:
    name: str
    devices: int
    intra: Link
    profile: DeviceProfile
    group: str = ""  # the scenario entry it came from (entries with `count` make several)


@dataclass(frozen=True)
class Topology:
    """The world a run happens in, at device level.

    delay_ms[d][e] is the one-way delay applied on d's egress towards e;
    bandwidth_gbps[d][e] the rate from d to e. The diagonal is unused
    (delay 0, bandwidth inf). Device ids are row indices.
    """

    name: str
    description: str
    source: str
    regions: tuple[Region, ...]
    device_region: tuple[int, ...]  # region index of every device
    delay_ms: np.ndarray
    bandwidth_gbps: np.ndarray  # already multiplied by bandwidth_scale
    bandwidth_scale: float = 1.0  # the factor applied to the scenario file's bandwidths (scaled())
    server: Server | None = None  # only scenarios of the FL workload have one
    # per device, the most its interface sends in all (Gbps, scaled like bandwidth_gbps); None or inf:
    # no limit beyond each pair's own rate (an FL server's uplink is one: workloads/fl/federation.py)
    egress_gbps: np.ndarray | None = None
    transport: Transport = LINUX  # every device's TCP settings (transport.py)

    @property
    def n(self) -> int:
        return len(self.device_region)

    def scaled(self, bandwidth_scale: float) -> "Topology":
        """Every bandwidth multiplied by `bandwidth_scale` (delays unchanged), applied once where a run is
        planned: every consumer (shaping plan, scheduler, bounds, simulator) then reads the link as one value."""
        s = bandwidth_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < math.inf):
            raise ScenarioError(f"{self.source}: bandwidth_scale: must be a finite number > 0 (got {s!r})")
        if s == 1.0:
            return self
        egress = None if self.egress_gbps is None else self.egress_gbps * s
        return replace(self, bandwidth_gbps=self.bandwidth_gbps * s, bandwidth_scale=self.bandwidth_scale * s,
                       egress_gbps=egress)

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
        return Topology(
            name=self.name,
            description=self.description,
            source=self.source,
            regions=regions,
            device_region=tuple(remap[self.device_region[d]] for d in devices),
            delay_ms=self.delay_ms[np.ix_(idx, idx)].copy(),
            bandwidth_gbps=self.bandwidth_gbps[np.ix_(idx, idx)].copy(),
            bandwidth_scale=self.bandwidth_scale,
            server=self.server,
            egress_gbps=None if self.egress_gbps is None else self.egress_gbps[idx].copy(),
            transport=self.transport,
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
