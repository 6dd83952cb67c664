"""`harness sim` for the layer-profile CNNs (harness/workloads/cnn.py): what HetPipe and Horovod share: the options, the candidates and their records,
fp32 training and the GPUs a run uses.

These systems train VGG-19 / ResNet-152 minibatches, not GPT iterations, so their records are their own
(JSON, one per candidate): system, scenario, model, minibatch, the GPUs used, `config` (HetPipe: policy,
placement, N_m, D, the VWs and their layers; Horovod: the GPUs that hold the model), `seconds` (HetPipe:
per wave, the global clock's steady-state tick; Horovod: per iteration), `samples_per_s`,
`cross_node_bytes` (per wave / iteration) and `best` (the system's fastest candidate).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import compute as work
from ..errors import HarnessError
from ..scenario import Topology
from ..workloads.layers import LayerProfile

DTYPE = "fp32"  # TensorFlow 1.12's training, as HetPipe's evaluation
BYTES_PER_VALUE = work.BYTES_PER_VALUE[DTYPE]
GIB = 2**30  # a GPU's "12 GB" is 12 GiB


class CNNSimError(HarnessError, ValueError):
    """A CNN run that cannot be simulated (GPUs a spec does not name, a model no GPU holds); one line."""


@dataclass
class CNNOptions:
    gpus: str | None = None  # the nodes used (select_gpus); None: every GPU
    profiles: list | None = None  # every device's ComputeProfile at fp32 (None: the scenario's defaults)
    # the systems' own options given (plan/systems.Option: name -> value); a system reads its own, and where one
    # is not given, its default or a sweep of its values (HetPipe: every policy)
    options: dict = field(default_factory=dict)


@dataclass
class CNNCandidate:
    system: str
    config: dict
    seconds: float
    samples_per_s: float
    minibatches: int  # per wave / iteration
    cross_node_bytes: float
    devices: int
    best: bool = False
    details: dict = field(default_factory=dict)


def nodes_of(topo: Topology, devices) -> dict[int, list[int]]:
    """node (region index) -> its devices among `devices`, in id order."""
    out: dict[int, list[int]] = {}
    for d in sorted(devices):
        out.setdefault(topo.device_region[d], []).append(d)
    return out


def select_gpus(topo: Topology, spec: str | None) -> list[int]:
    """Devices of the nodes a spec names: each letter a one-letter region, an optional total, as the
    paper's Table 4 (`V4`, `VR8`, `VRQ12`, `VRQG16`); None: every device."""
    if not spec:
        return list(range(topo.n))
    letters = spec.rstrip("0123456789")
    count = spec[len(letters):]
    names = {r.name: k for k, r in enumerate(topo.regions)}
    unknown = [c for c in letters if c not in names]
    if not letters or unknown or len(set(letters)) != len(letters):
        raise CNNSimError(f"--gpus: {spec!r} must be distinct node letters of {topo.name} "
                           f"({', '.join(names)}) and an optional GPU count, e.g. VR8")
    picked = {names[c] for c in letters}
    devices = [d for d in range(topo.n) if topo.device_region[d] in picked]
    if count and int(count) != len(devices):
        raise CNNSimError(f"--gpus: {spec!r} names {len(devices)} GPUs, not {count}")
    return devices


def record(c: CNNCandidate, *, run_id: str, topo: Topology, model: LayerProfile, batch: int) -> dict:
    return {"run_id": run_id, "scenario": topo.name, "system": c.system, "backend": "sim", "model": model.name,
            "minibatch": batch, "devices": c.devices, "config": c.config, "seconds": c.seconds,
            "samples_per_s": c.samples_per_s, "samples": c.minibatches * batch, "cross_node_bytes": c.cross_node_bytes,
            "cross_node_bytes_per_sample": c.cross_node_bytes / (c.minibatches * batch), "best": c.best, **c.details}
