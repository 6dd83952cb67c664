"""Parsing a scenario file (YAML) into a `Topology`: once, into frozen data, with unknown keys and bad values
refused in one line that names the file, the field and the value.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from .gpus import GPU_TYPES, find_gpu
from .transport import AUTO, AUTO_MAX_BYTES, CONGESTION_CONTROLS, LINUX, LINUX_RMEM, LINUX_WMEM, Transport
from .transport import KEYS as TRANSPORT_KEYS
from .timeline import parse_timeline, region_names
from .topology import LINK_CLASSES, DeviceProfile, Link, Region, ScenarioError, Server, Topology, check_fits


_TOP_KEYS = {"name", "description", "device", "regions", "intra_region", "inter_region", "interface_gbps", "server",
             "transport", "timeline", "nccl_sockets", "link_classes"}
_SERVER_KEYS = {"delay_ms", "uplink_gbps", "region"}
_REGION_KEYS = {"name", "devices", "count", "intra_region", "interface_gbps", "shared_nic_gbps", "device"}
_LINK_KEYS = {"delay_ms", "bandwidth_gbps"}
_MATRIX_KEYS = {"order", "delay_ms", "bandwidth_gbps"}
_PROFILE_KEYS = {"gpu", "peak_tflops", "peak_tflops_fp32", "memory_gb", "memory_bandwidth_gbs", "slowdown"}


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
    A GPU of harness/scenario/gpus.py fills the figures the entry leaves out; any other must give them."""
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
        _fail(path, f"{field}.memory_gb", "missing (needed for a GPU harness/scenario/gpus.py does not know)")
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


def parse_scenario(doc, path: Path) -> Topology:
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

    default_interface = (_number(path, "interface_gbps", doc["interface_gbps"], positive=True)
                         if "interface_gbps" in doc else math.inf)
    regions: list[Region] = []
    interfaces: list[float] = []
    shared_nics: list[float] = []
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
        interface = (_number(path, f"{f}.interface_gbps", r["interface_gbps"], positive=True)
                     if "interface_gbps" in r else default_interface)
        interfaces += [interface] * (n * count)
        shared_nics += [_number(path, f"{f}.shared_nic_gbps", r["shared_nic_gbps"], positive=True)
                        if "shared_nic_gbps" in r else math.inf] * count
    seen = set()
    for r in regions:
        if r.name in seen:
            _fail(path, "regions", "duplicate region name", r.name)
        seen.add(r.name)

    check_fits(path, len(regions), "region(s)")
    inter_delay, inter_bw = _inter(path, doc["inter_region"], regions)
    np.fill_diagonal(inter_delay, [reg.intra.delay_ms for reg in regions])
    np.fill_diagonal(inter_bw, [reg.intra.bandwidth_gbps for reg in regions])
    device_region = tuple(r for r, reg in enumerate(regions) for _ in range(reg.devices))
    server = _server(path, doc["server"], regions) if "server" in doc else None
    return Topology(
        name=str(doc["name"]),
        description=str(doc.get("description", "")),
        source=str(path),
        regions=tuple(regions),
        device_region=device_region,
        region_delay_ms=inter_delay,
        region_bandwidth_gbps=inter_bw,
        server=server,
        interface_gbps=None if all(math.isinf(x) for x in interfaces) else np.array(interfaces),
        region_nic_gbps=None if all(math.isinf(x) for x in shared_nics) else np.array(shared_nics),
        transport=parse_transport(path, doc["transport"]) if "transport" in doc else LINUX,
        nccl_sockets=_nccl_sockets(path, doc.get("nccl_sockets", 1)),
        link_classes=_link_classes(path, doc.get("link_classes", "pair")),
        timeline=(parse_timeline(doc["timeline"], path, region_names(regions))
                  if "timeline" in doc else None),
    )


def _nccl_sockets(path, n) -> int:
    """`nccl_sockets`: NCCL's sockets per peer, 1 to its MAX_SOCKETS (64)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        _fail(path, "nccl_sockets", "must be an integer from 1 to 64", n)
    return n


def _link_classes(path, v) -> str:
    """`link_classes`: what one shaped rate carries, a destination (`pair`) or a destination region (`region`)."""
    if v not in LINK_CLASSES:
        _fail(path, "link_classes", f"must be one of {', '.join(LINK_CLASSES)}", v)
    return v


def _server(path, d, regions: list[Region]) -> Server:
    """`server`: outside every rack after `delay_ms`, or in `region` (its links that region's), not both."""
    _check_keys(path, "server", d, _SERVER_KEYS)
    if ("delay_ms" in d) == ("region" in d):
        _fail(path, "server", "needs delay_ms (a server outside every region) or region (one inside it), not both",
              sorted(d))
    uplink = d.get("uplink_gbps")
    uplink = None if uplink is None else _number(path, "server.uplink_gbps", uplink, positive=True)
    if "region" in d:
        if d["region"] not in {r.name for r in regions}:
            _fail(path, "server.region", f"not a region (regions: {', '.join(r.name for r in regions)})", d["region"])
        return Server(0.0, uplink, str(d["region"]))
    return Server(_number(path, "server.delay_ms", d["delay_ms"], positive=False), uplink)


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


def parse_transport(path, d) -> Transport:
    """The `transport:` mapping of a scenario file; every key optional (Linux's value)."""
    def fail(field: str, problem: str, value=None):
        got = "" if value is None else f" (got {value!r})"
        raise ScenarioError(f"{path}: transport.{field}: {problem}{got}")

    if not isinstance(d, dict):
        raise ScenarioError(f"{path}: transport: must be a mapping (got {d!r})")
    unknown = sorted(set(d) - TRANSPORT_KEYS)
    if unknown:
        fail(unknown[0], f"unknown key (allowed: {', '.join(sorted(TRANSPORT_KEYS))})")
    cc = d.get("congestion_control", LINUX.congestion_control)
    if cc is not None and cc not in CONGESTION_CONTROLS:
        fail("congestion_control", f"must be one of {', '.join(CONGESTION_CONTROLS)}", cc)
    idle = d.get("slow_start_after_idle", LINUX.slow_start_after_idle)
    if not isinstance(idle, bool):
        fail("slow_start_after_idle", "must be true or false", idle)
    buffers = {}
    for key, default, low in (("rmem_max_bytes", LINUX.rmem_max_bytes, LINUX_RMEM[1]),
                              ("wmem_max_bytes", LINUX.wmem_max_bytes, LINUX_WMEM[1])):
        v = d.get(key, default)
        if v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or not (low <= v <= AUTO_MAX_BYTES)):
            fail(key, f"must be an integer in {low}..{AUTO_MAX_BYTES} or {AUTO}", v)
        buffers[key] = v
    return Transport(cc, idle, **buffers)
