"""The workloads: what is trained. A workload is one registry entry: its models, its layer profile type,
the kind of record its runs write, and the flags of `harness sim` it takes with their defaults, so a
command refuses a flag its workload does not use instead of ignoring it.

- gpt: the paper's GPT (harness/compute/model.py: shapes; its blocks are its layers), per-iteration
  records (records.csv, harness/results.py).
- cnn: HetPipe's VGG-19 and ResNet-152 as layer profiles (cnn.py, layers.Layer), one JSON record per
  simulated candidate (harness/systems/hetpipe/sim.py).
- fl: OWL's branchy models (fl/models.py, layers.Layer), one JSON record per strategy and round
  (fl/records.py); run by `harness fl`, not `harness sim`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..compute.model import MODELS, get_model
from ..errors import HarnessError
from .cnn import CNN_MODELS, get_cnn
from .fl.models import BRANCHY_MODELS, get_branchy
from .layers import Layer


class WorkloadError(HarnessError, ValueError):
    """An unknown model, or a flag the model's workload does not take; one line."""


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    models: tuple[str, ...]
    load: Callable[[str], object]  # model name -> its model (GPTConfig, LayerProfile, BranchyModel)
    layer_profile: type | None  # the layer type of its models (None: GPT's blocks come from its config)
    record_kind: str  # what its runs write
    sim_flags: dict = field(default_factory=dict)  # `harness sim` flag -> its default for this workload

    def take_flags(self, model: str, given: dict) -> dict:
        """`given` (flag -> value, None where not given) with this workload's defaults filled in; a flag
        given that this workload does not take is a one-line WorkloadError."""
        for flag, value in given.items():
            if value is not None and flag not in self.sim_flags:
                raise WorkloadError(f"{flag}: not an option of --model {model} (workload {self.name} takes "
                                    f"{', '.join(self.sim_flags) or 'no such flags'})")
        return {flag: self.sim_flags.get(flag) if value is None else value for flag, value in given.items()}


WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    WORKLOADS[workload.name] = workload
    return workload


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise WorkloadError(f"workload: unknown {name!r} (known: {', '.join(WORKLOADS)})")
    return WORKLOADS[name]


def of_model(model: str, among: tuple[str, ...]) -> Workload:
    """The workload of `among` (the workloads a command runs) whose models include `model`."""
    for name in among:
        if model in get(name).models:
            return get(name)
    known = [m for name in among for m in get(name).models]
    raise WorkloadError(f"--model: unknown model {model!r} (known: {', '.join(known)})")


def sim_flags(among: tuple[str, ...]) -> tuple[str, ...]:
    """Every `harness sim` flag some workload of `among` takes, in registration order."""
    return tuple(dict.fromkeys(f for name in among for f in get(name).sim_flags))


register(Workload(
    "gpt", "the paper's GPT: transformer blocks, per-iteration records", tuple(MODELS), get_model, None,
    "iteration records (records.csv)",
    sim_flags={"--batch": 1024, "--layers": None, "--micro-batch": 1, "--d-pp": None, "--budget": None,
               "--seed": 0, "--ps-mode": "grouped", "--no-cache": False, "--protocol": "nccl",
               "--allocator": None, "--scheduler": "ga", "--timeline": None, "--iterations": None,
               "--replan": False, "--preempt-rate": None, "--preempt-down": None, "--preempt-notice": None,
               "--preempt-seed": None, "--checkpoint-every": None, "--storage-gbps": None,
               "--recovery": None, "--keepalive": None, "--last-call": None},
))
register(Workload(
    "cnn", "HetPipe's CNNs as layer profiles (VGG-19, ResNet-152)", tuple(CNN_MODELS), get_cnn, Layer,
    "candidate records (records.json)",
    sim_flags={"--batch": 32, "--gpus": None},
))
register(Workload(
    "fl", "OWL's branchy models, distributed to racks of FL workers", tuple(BRANCHY_MODELS), get_branchy, Layer,
    "FL round records (records.json)",
))
