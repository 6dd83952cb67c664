"""Device compute profiles: how fast a device turns FLOPs into time, and where that number comes from.

The peak is data from the scenario (DeviceProfile.peak_tflops); what a device
achieves is peak x efficiency, with one efficiency per operation class. Defaults
are published measurements, each with its source; `harness sim calibrate`
(harness.sim.compare.calibrate_records) replaces them with what measured records
show (the efficiency at which the simulator's busiest device computes as long
as the measured one did), so the simulator can be checked against real runs.

Operation classes:
  transformer  the dense GEMM-heavy transformer blocks (forward, backward, recompute)
  lm_head      the vocabulary projection on the last stage (one large GEMM)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import HarnessError
from ..files import atomic_write_json, read_text
from ..scenario import DeviceProfile, Topology

OP_CLASSES = ("transformer", "lm_head")

# Achieved fraction of the fp16 tensor-core peak, per GPU type and operation class.
# V100: Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053, section 5.1): a 1.2B-parameter
#   GPT-2 on ONE V100 sustains 39 TFLOPS "which is 30% of the theoretical peak FLOPS"
#   (fp16, activation checkpointing, no communication).
# A40: no published single-GPU GPT training measurement we know of; we assume the V100
#   fraction (same GEMM shapes, Ampere tensor cores, lower memory bandwidth). Calibrate
#   with `harness sim calibrate RECORDS` once measured A40 runs exist.
DEFAULT_EFFICIENCY: dict[str, dict[str, float]] = {
    "V100": {"transformer": 0.30, "lm_head": 0.30},
    "A40": {"transformer": 0.30, "lm_head": 0.30},
}
EFFICIENCY_SOURCES: dict[str, str] = {
    "V100": "Shoeybi et al. 2019 (Megatron-LM), sec. 5.1: 39 TFLOPS = 30% of peak on one V100, 1.2B GPT-2",
    "A40": "assumed equal to the V100 fraction (no published measurement); calibrate from records",
}
# Any other GPU: the V100 measurement is the only first-principles anchor we have.
FALLBACK_GPU = "V100"


class ProfileError(HarnessError, ValueError):
    """A profile file or calibration input is invalid; str() is one line."""


@dataclass(frozen=True)
class ComputeProfile:
    """Achieved compute of one device type."""

    gpu: str
    peak_tflops: float  # the peak of the run's precision (DeviceProfile.peak)
    efficiency: dict[str, float] = field(default_factory=dict)
    source: str = ""
    slowdown: float = 1.0  # the scenario's penalty factor for this device (Sky Computing)
    memory_bandwidth_gbs: float | None = None  # the scenario's; None: memory-bound work is not modelled

    def flops_per_s(self, op_class: str) -> float:
        """What the device achieves: peak x efficiency / slowdown."""
        return self.peak_tflops * 1e12 * self.efficiency[op_class] / self.slowdown

    def seconds(self, flop: float, op_class: str = "transformer") -> float:
        return flop / self.flops_per_s(op_class)


def default_profile(device: DeviceProfile, dtype: str = "fp16") -> ComputeProfile:
    gpu = device.gpu if device.gpu in DEFAULT_EFFICIENCY else FALLBACK_GPU
    src = EFFICIENCY_SOURCES[gpu] if gpu == device.gpu else f"{device.gpu}: no default, using {gpu}: {EFFICIENCY_SOURCES[gpu]}"
    return ComputeProfile(device.gpu, device.peak(dtype), dict(DEFAULT_EFFICIENCY[gpu]), src, device.slowdown,
                          device.memory_bandwidth_gbs)


def device_profiles(topo: Topology, overrides: dict[str, ComputeProfile] | None = None,
                    dtype: str = "fp16") -> list[ComputeProfile]:
    """One ComputeProfile per device: the scenario's peak for `dtype` and slowdown, with an override
    (by GPU name) or the default efficiency.

    An override keeps the scenario's peak unless it names its own (peak_tflops > 0); the slowdown
    is the scenario's."""
    out = []
    overrides = overrides or {}
    for dev in topo.profiles:
        base = default_profile(dev, dtype)
        ov = overrides.get(dev.gpu) or overrides.get("*")
        if ov is not None:
            base = ComputeProfile(dev.gpu, ov.peak_tflops if ov.peak_tflops > 0 else base.peak_tflops,
                                  {**base.efficiency, **ov.efficiency}, ov.source, dev.slowdown,
                                  dev.memory_bandwidth_gbs)
        out.append(base)
    return out


def save_profiles(path: Path, profiles: dict[str, ComputeProfile]) -> None:
    atomic_write_json(Path(path), {"profiles": {k: asdict(v) for k, v in profiles.items()}})


def load_profiles(path: Path) -> dict[str, ComputeProfile]:
    path = Path(path)
    try:
        doc = json.loads(read_text(path, "profile JSON"))
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("profiles"), dict):
        raise ProfileError(f"{path}: profiles: must be a mapping of GPU name to profile")
    out = {}
    for name, p in doc["profiles"].items():
        eff = p.get("efficiency") if isinstance(p, dict) else None
        if not isinstance(eff, dict) or not eff:
            raise ProfileError(f"{path}: profiles.{name}.efficiency: must be a non-empty mapping")
        for k, v in eff.items():
            if k not in OP_CLASSES:
                raise ProfileError(f"{path}: profiles.{name}.efficiency.{k}: unknown class (known: {', '.join(OP_CLASSES)})")
            if not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ProfileError(f"{path}: profiles.{name}.efficiency.{k}: must be in (0, 1] (got {v!r})")
        out[name] = ComputeProfile(str(p.get("gpu", name)), float(p.get("peak_tflops", 0) or 0), dict(eff), str(p.get("source", "")))
    return out
