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
        self.finish(name, t0)

    def finish(self, name: str, t0: float) -> None:
        """End phase `name` begun at perf_counter() `t0`: wait for the rest of its modelled time,
        or count an overrun."""
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


def pacer_for(spec: RunSpec, stage: int, device_index: int, device: torch.device | None = None,
              recompute: bool | None = None):
    """The pacer of the rank that runs `stage` (of spec.layout's stages) on scenario device
    `device_index`, or a no-op one when the run's compute model is off. recompute: whether the
    runtime recomputes activations in backward (default: the layout's)."""
    c = spec.compute
    if not c.model:
        return _NoPacer()
    lay = spec.layout
    modelled = rank_phase_seconds(spec.cfg, list(lay.layers_per_stage), stage, spec.model.micro_batch,
                                  c.devices[device_index], lay.recompute if recompute is None else recompute, lay.tp)
    return ComputePacer({k: v * c.time_scale for k, v in modelled.items()}, device)


class _Mark(torch.autograd.Function):
    """Identity whose backward calls `callback` when the gradient reaches it."""

    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None


def pace_stage_module(module: torch.nn.Module, pacer) -> None:
    """Pace a pipeline stage's module from inside (the baselines: torch's pipelining schedules call
    its forward and backward themselves). Forward: from the module's call to its return. Backward:
    from the gradient reaching its output to the gradient leaving its input (on the first stage,
    whose input is token ids, the embedding's output: the embedding's backward is not modelled)."""
    if isinstance(pacer, _NoPacer):
        return
    t: dict[str, float] = {}

    def begin_backward():
        t["backward"] = time.perf_counter()

    def end_backward():
        pacer.finish("backward", t["backward"])

    def before(mod, args):
        t["forward"] = time.perf_counter()
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.requires_grad:
            return (_Mark.apply(x, end_backward), *args[1:])
        return None

    def after(mod, args, out):
        pacer.finish("forward", t["forward"])
        return _Mark.apply(out, begin_backward) if out.requires_grad else out

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)
    embed = getattr(module, "embed", None)
    if embed is not None:
        embed.register_forward_hook(lambda mod, args, out: _Mark.apply(out, end_backward))
