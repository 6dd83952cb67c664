"""Scenario files -> `Topology`: device-level one-way delay and bandwidth matrices.

A scenario file describes regions (groups of devices sharing link properties), the
link inside a region and the links between regions (scalar, or a matrix in an
`order` of region names, possibly asymmetric). It is parsed once into frozen data;
unknown keys and bad values raise `ScenarioError` whose message names the file,
the field and the value, so the CLI can print one line and exit non-zero.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from .errors import HarnessError
from .gpus import GPU_TYPES, find_gpu

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


class ScenarioError(HarnessError, ValueError):
    """A scenario file or request is invalid; str() is one line: file: field: problem."""


@dataclass(frozen=True)
class DeviceProfile:
    """Compute of one device. The peaks are data (the scenario's, or harness/gpus.py's vendor sheet for
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
    """A federated-learning server (OWL's FL workload, harness/fl/): not a device that trains, the host
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
        return replace(self, bandwidth_gbps=self.bandwidth_gbps * s, bandwidth_scale=self.bandwidth_scale * s)

    def region_of(self, device: int) -> Region:
        return self.regions[self.device_region[device]]

    @property
    def profiles(self) -> tuple[DeviceProfile, ...]:
        return tuple(self.regions[r].profile for r in self.device_region)

    def symmetric(self) -> tuple[np.ndarray, np.ndarray]:
        """(A+A^T)/2 in seconds and (B+B^T)/2 in bit/s, as the paper's communication graph G."""
        delay_s = (self.delay_ms + self.delay_ms.T) / 2e3
        bw = self.bandwidth_gbps.copy()
        np.fill_diagonal(bw, np.inf)
        bw_bps = (bw + bw.T) / 2 * 1e9
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
        )


_TOP_KEYS = {"name", "description", "device", "regions", "intra_region", "inter_region", "server"}
_SERVER_KEYS = {"delay_ms", "uplink_gbps"}
_REGION_KEYS = {"name", "devices", "count", "intra_region", "device"}
_LINK_KEYS = {"delay_ms", "bandwidth_gbps"}
_MATRIX_KEYS = {"order", "delay_ms", "bandwidth_gbps"}
_PROFILE_KEYS = {"gpu", "peak_tflops", "peak_tflops_fp32", "memory_gb", "memory_bandwidth_gbs", "slowdown"}


def list_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve_scenario(name: str) -> Path:
    """Accept a path, a file stem (`5-worldwide`) or a case number (`5`)."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ScenarioError(f"{p}: file not found")
        return p
    matches = [s for s in list_scenarios() if s == name or s.split("-", 1)[0] == name]
    if len(matches) != 1:
        raise ScenarioError(
            f"{name}: unknown scenario (known: {', '.join(list_scenarios())}, or a path to a .yaml file)"
        )
    return SCENARIO_DIR / f"{matches[0]}.yaml"


def reload_name(topo: Topology) -> str:
    """What load_scenario takes to load `topo` again anywhere: the name of one of scenarios/, else the
    absolute path of its file (records keep it, so a scenario given as a path can be simulated later)."""
    path = Path(topo.source).resolve()
    return path.stem if path.parent == SCENARIO_DIR.resolve() else str(path)


def load_scenario(name: str, devices: int | None = None) -> Topology:
    """Load a scenario by case number, name or path; optionally scale it to `devices`."""
    path = resolve_scenario(name)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ScenarioError(f"{path}: YAML syntax error at {where}: {getattr(e, 'problem', e)}") from None
    topo = _parse(doc, path)
    return scale_down(topo, devices) if devices is not None else topo


def _fail(path: Path, field: str, problem: str, value=None):
    got = "" if value is None else f" (got {value!r})"
    raise ScenarioError(f"{path}: {field}: {problem}{got}")


def _check_keys(path, field, d, allowed):
    if not isinstance(d, dict):
        _fail(path, field, "must be a mapping", d)
    unknown = sorted(set(d) - allowed)
    if unknown:
        _fail(path, field, f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _number(path, field, value, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(path, field, "must be a finite number", value)
    if positive and value <= 0:
        _fail(path, field, "must be > 0", value)
    if not positive and value < 0:
        _fail(path, field, "must be >= 0", value)
    return float(value)


def _link(path, field, d) -> Link:
    _check_keys(path, field, d, _LINK_KEYS)
    for k in _LINK_KEYS:
        if k not in d:
            _fail(path, f"{field}.{k}", "missing")
    return Link(
        _number(path, f"{field}.delay_ms", d["delay_ms"], positive=False),
        _number(path, f"{field}.bandwidth_gbps", d["bandwidth_gbps"], positive=True),
    )


def _profile(path, field, d, default: dict | None) -> DeviceProfile:
    """A device entry -> DeviceProfile. `default` is the top-level `device` as written: a region's
    entry that names a `gpu` replaces it, one that does not (e.g. only a slowdown) overlays it.
    A GPU of harness/gpus.py fills the figures the entry leaves out; any other must give them."""
    if d is None:
        if default is None:
            _fail(path, field, "missing")
        d, field = default, "device"
    _check_keys(path, field, d, _PROFILE_KEYS)
    if default is not None and "gpu" not in d:
        d = {**default, **d}
    if "gpu" not in d:
        _fail(path, f"{field}.gpu", "missing")
    known = find_gpu(d["gpu"])
    if known is None and "peak_tflops" not in d:
        _fail(path, f"{field}.gpu", f"unknown GPU (known: {', '.join(GPU_TYPES)}; or give peak_tflops and "
              "memory_gb)", d["gpu"])
    if known is None and "memory_gb" not in d:
        _fail(path, f"{field}.memory_gb", "missing (needed for a GPU harness/gpus.py does not know)")
    peak = _number(path, f"{field}.peak_tflops", d.get("peak_tflops", known and known.fp16_tflops), positive=True)
    fp32 = d.get("peak_tflops_fp32", known.fp32_tflops if known else None)
    mem_bw = d.get("memory_bandwidth_gbs", known.memory_bandwidth_gbs if known else None)
    return DeviceProfile(
        known.name if known else str(d["gpu"]),
        peak,
        _number(path, f"{field}.memory_gb", d.get("memory_gb", known and known.memory_gb), positive=True),
        None if fp32 is None else _number(path, f"{field}.peak_tflops_fp32", fp32, positive=True),
        1.0 if isinstance(d.get("slowdown"), dict)  # a draw: one value per region (_slowdowns)
        else _number(path, f"{field}.slowdown", d.get("slowdown", 1.0), positive=True),
        None if mem_bw is None else _number(path, f"{field}.memory_bandwidth_gbs", mem_bw, positive=True),
    )


_DRAW_KEYS = {"normal", "within", "seed"}


def _slowdowns(path, field, d, count: int) -> list[float]:
    """Sky Computing's penalty factors (Zhu et al. 2022, Sec. VI-D: between 1 and 7, normally
    distributed): `{normal: [mean, std], within: [low, high], seed: S}` draws one slowdown per
    region of the entry from numpy's default_rng(S), clipped to [low, high]; reproducible, and
    the first regions keep their values when a scenario is scaled down."""
    _check_keys(path, field, d, _DRAW_KEYS)
    for k in _DRAW_KEYS:
        if k not in d:
            _fail(path, f"{field}.{k}", "missing")

    def pair(k: str, positive: bool) -> list[float]:
        if not isinstance(d[k], list) or len(d[k]) != 2:
            _fail(path, f"{field}.{k}", "must be a list of two numbers", d[k])
        return [_number(path, f"{field}.{k}", v, positive=positive) for v in d[k]]

    mean, std = pair("normal", positive=False)
    low, high = pair("within", positive=True)
    if std < 0 or low > high:
        _fail(path, field, "needs std >= 0 and low <= high", d)
    seed = d["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        _fail(path, f"{field}.seed", "must be an integer >= 0", seed)
    draws = np.random.default_rng(seed).normal(mean, std, count)
    return [float(x) for x in np.clip(draws, low, high)]


def _parse(doc, path: Path) -> Topology:
    if not isinstance(doc, dict):
        _fail(path, "(top level)", "must be a mapping")
    _check_keys(path, "(top level)", doc, _TOP_KEYS)
    for k in ("name", "regions", "inter_region"):
        if k not in doc:
            _fail(path, k, "missing")
    default_profile = doc.get("device")
    if default_profile is not None:
        _profile(path, "device", default_profile, None)  # its errors name the top-level field
    default_intra = _link(path, "intra_region", doc["intra_region"]) if "intra_region" in doc else None

    regions: list[Region] = []
    if not isinstance(doc["regions"], list) or not doc["regions"]:
        _fail(path, "regions", "must be a non-empty list", doc["regions"])
    for k, r in enumerate(doc["regions"]):
        f = f"regions[{k}]"
        _check_keys(path, f, r, _REGION_KEYS)
        if "name" not in r:
            _fail(path, f"{f}.name", "missing")
        n = r.get("devices")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            _fail(path, f"{f}.devices", "must be an integer >= 1", n)
        count = r.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            _fail(path, f"{f}.count", "must be an integer >= 1", count)
        if "intra_region" in r:
            intra = _link(path, f"{f}.intra_region", r["intra_region"])
        elif default_intra is not None:
            intra = default_intra
        else:
            _fail(path, f"{f}.intra_region", "missing (and no top-level intra_region)")
        profile = _profile(path, f"{f}.device", r.get("device"), default_profile)
        names = [str(r["name"])] if count == 1 else [f"{r['name']}-{c}" for c in range(count)]
        entry = r.get("device") or {}
        slow = (entry if "gpu" in entry else {**(default_profile or {}), **entry}).get("slowdown")
        profiles = ([replace(profile, slowdown=x) for x in _slowdowns(path, f"{f}.device.slowdown", slow, count)]
                    if isinstance(slow, dict) else [profile] * count)
        regions.extend(Region(nm, n, intra, prof, group=str(r["name"])) for nm, prof in zip(names, profiles))
    seen = set()
    for r in regions:
        if r.name in seen:
            _fail(path, "regions", "duplicate region name", r.name)
        seen.add(r.name)

    R = len(regions)
    _check_fits(path, sum(r.devices for r in regions), R)
    inter_delay, inter_bw = _inter(path, doc["inter_region"], regions)
    device_region = tuple(r for r, reg in enumerate(regions) for _ in range(reg.devices))
    dr = np.asarray(device_region)
    delay = inter_delay[np.ix_(dr, dr)]
    bw = inter_bw[np.ix_(dr, dr)]
    same = dr[:, None] == dr[None, :]
    intra_delay = np.array([reg.intra.delay_ms for reg in regions])[dr]
    intra_bw = np.array([reg.intra.bandwidth_gbps for reg in regions])[dr]
    delay = np.where(same, intra_delay[:, None], delay)
    bw = np.where(same, intra_bw[:, None], bw)
    np.fill_diagonal(delay, 0.0)
    np.fill_diagonal(bw, np.inf)
    assert R == len(regions)
    server = _server(path, doc["server"]) if "server" in doc else None
    return Topology(
        name=str(doc["name"]),
        description=str(doc.get("description", "")),
        source=str(path),
        regions=tuple(regions),
        device_region=device_region,
        delay_ms=delay,
        bandwidth_gbps=bw,
        server=server,
    )


#: float64 N x N matrices alive at once while a scenario of N devices is parsed (delay, bandwidth and
#: their intermediates); consumers (scheduler, simulator, shaping plan) hold a few more.
PARSE_MATRICES = 6


def _check_fits(path: Path, devices: int, regions: int) -> None:
    """One line, before any allocation, when the link matrices would not fit in this machine's memory
    (a traceback from numpy, or the machine swapping, otherwise)."""
    need = PARSE_MATRICES * 8 * (devices ** 2 + regions ** 2)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        most = math.isqrt(have // (PARSE_MATRICES * 8))
        _fail(path, "regions", f"{devices:,} devices in {regions:,} region(s) need {need / 2**30:,.1f} GiB for "
                               f"their device x device link matrices, more than this machine's "
                               f"{have / 2**30:.1f} GiB (at most about {most:,} devices here)")


def _server(path, d) -> Server:
    _check_keys(path, "server", d, _SERVER_KEYS)
    if "delay_ms" not in d:
        _fail(path, "server.delay_ms", "missing")
    uplink = d.get("uplink_gbps")
    return Server(_number(path, "server.delay_ms", d["delay_ms"], positive=False),
                  None if uplink is None else _number(path, "server.uplink_gbps", uplink, positive=True))


def _inter(path, d, regions: list[Region]) -> tuple[np.ndarray, np.ndarray]:
    """Region-level (R, R) delay and bandwidth matrices (diagonal filled later)."""
    R = len(regions)
    f = "inter_region"
    if not isinstance(d, dict):
        _fail(path, f, "must be a mapping", d)
    if "order" not in d:  # one link between every pair of regions
        link = _link(path, f, d)
        return np.full((R, R), link.delay_ms), np.full((R, R), link.bandwidth_gbps)
    _check_keys(path, f, d, _MATRIX_KEYS)
    order = d["order"]
    names = [r.name for r in regions]
    if not isinstance(order, list):
        _fail(path, f"{f}.order", "must be a list of region names", order)
    for o in order:
        if o not in names:
            _fail(path, f"{f}.order", f"unknown region (regions: {', '.join(names)})", o)
    if sorted(order) != sorted(names):
        missing = sorted(set(names) - set(order))
        _fail(path, f"{f}.order", f"must list every region once; missing {missing}")
    pos = [order.index(n) for n in names]  # matrix row of each region
    out = []
    for key, positive in (("delay_ms", False), ("bandwidth_gbps", True)):
        m = d.get(key)
        if not isinstance(m, list) or len(m) != R or any(not isinstance(row, list) or len(row) != R for row in m):
            shape = (len(m), [len(r) if isinstance(r, list) else None for r in m]) if isinstance(m, list) else m
            _fail(path, f"{f}.{key}", f"must be a {R}x{R} matrix in the order of {f}.order", shape)
        arr = np.zeros((R, R))
        for i in range(R):
            for j in range(R):
                v = m[i][j]
                if i == j:
                    if v not in (None, "-"):
                        _fail(path, f"{f}.{key}[{i}][{j}]", "diagonal must be ~ (the intra_region link applies)", v)
                    continue
                arr[i, j] = _number(path, f"{f}.{key}[{i}][{j}]", v, positive=positive)
        out.append(arr[np.ix_(pos, pos)])
    return out[0], out[1]


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
