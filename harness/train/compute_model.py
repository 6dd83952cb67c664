"""The compute model: a rank's forward, backward and optimizer step take what its device's profile gives.

Emulated devices are CPU processes that share the host's cores, so their own speed says
nothing of the GPU they stand for, and moves with whatever else runs on the host. With
the compute model on, every phase runs the real computation (the numbers stay real) and
then waits until the phase has taken its modelled time: FLOPs / achieved FLOP/s of the
device (harness/compute.py, harness/profiles.py: peak x efficiency / slowdown), times the
run's time scale. A phase whose real computation took longer than that is an overrun:
counted, never hidden (the iteration's records and the manifest carry the counts).
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..compute import rank_phase_seconds
from .config import RunSpec

PHASES = ("forward", "backward", "optimizer")


class ComputePacer:
    """Holds one rank's phases to their modelled seconds (one micro-batch's forward or backward,
    one optimizer step). `phase(name)` is a context manager; `take()` returns and resets the
    overrun count since the last call (one iteration's)."""

    def __init__(self, seconds: dict[str, float], device: torch.device | None = None):
        self.seconds = dict(seconds)
        self.cuda = device is not None and device.type == "cuda"
        self.overruns = 0  # since the last take()
        self.total_overruns = 0
        self.phases = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        yield
        if self.cuda:  # the work is queued on the GPU: it is done only when the stream is
            torch.cuda.synchronize()
        self.phases += 1
        deadline = t0 + self.seconds[name]
        left = deadline - time.perf_counter()
        if left <= 0:
            self.overruns += 1
            self.total_overruns += 1
            return
        while left > 0:  # sleep() may wake early on a signal; never end a phase short
            time.sleep(left)
            left = deadline - time.perf_counter()

    def take(self) -> int:
        n, self.overruns = self.overruns, 0
        return n


class _NoPacer:
    """Without the compute model: phases run as they run."""

    overruns = total_overruns = phases = 0

    def phase(self, name: str):
        return contextlib.nullcontext()

    def take(self) -> int:
        return 0


def pacer_for(spec: RunSpec, stage: int, device_index: int, device: torch.device | None = None):
    """The pacer of the rank that runs `stage` (of spec.layout's stages) on scenario device
    `device_index`, or a no-op one when the run's compute model is off."""
    c = spec.compute
    if not c.model:
        return _NoPacer()
    lay = spec.layout
    modelled = rank_phase_seconds(spec.cfg, list(lay.layers_per_stage), stage, spec.model.micro_batch,
                                  c.devices[device_index], lay.recompute, lay.tp)
    return ComputePacer({k: v * c.time_scale for k, v in modelled.items()}, device)
