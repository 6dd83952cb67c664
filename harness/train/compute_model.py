"""The compute model: a rank's forward, backward and optimizer step take what its device's profile gives.

Emulated devices are CPU processes that share the host's cores, so their own speed says
nothing of the GPU they stand for, and moves with whatever else runs on the host. With
the compute model on, every phase runs the real computation (the numbers stay real) and
then waits until the phase has taken its modelled time: FLOPs / achieved FLOP/s of the
device (harness/compute/, harness/compute/profiles.py: peak x efficiency / slowdown), times the
run's time scale. A phase whose real computation took longer than that is an overrun:
counted, never hidden (the iteration's records and the manifest carry the counts).

Communication inside a phase is not compute: tensor parallelism (DTensor) and ZeRO-3
(FSDP2) run their collectives in hooks they put on the stage's submodules, and those
hooks, with the backward work they create, are timed apart and added to the phase's
deadline (`pace_stage_module`).
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..compute import backward_shares, layer_stage_phase_seconds, rank_phase_seconds
from ..plan.request import RunSpec

PHASES = ("forward", "backward", "optimizer")


class ComputePacer:
    """Holds one rank's phases to their modelled seconds (one micro-batch's forward or backward,
    one optimizer step). `phase(name)` is a context manager; `take()` returns and resets the
    overrun count since the last call (one iteration's)."""

    def __init__(self, seconds: dict[str, float], device: torch.device | None = None,
                 backward_shares: tuple[float, ...] = ()):
        self.seconds = dict(seconds)
        self.backward_shares = tuple(backward_shares)  # compute.backward_shares: where the pieces end (hold())
        self.cuda = device is not None and device.type == "cuda"
        self.overruns = 0  # since the last take()
        self.late_s = 0.0  # since the last take(): how long after their deadlines the phases ended
        self.excluded = 0.0  # communication seconds inside the open phase
        self.total_overruns = 0
        self.phases = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = self.begin()
        yield
        self.finish(name, t0)

    def begin(self) -> float:
        """Start a phase: its clock, and no communication counted in it yet."""
        self.excluded = 0.0
        return time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """`seconds` of the open phase were communication: its deadline moves by as much."""
        self.excluded += seconds

    def finish(self, name: str, t0: float) -> None:
        """End phase `name` begun at `t0` (begin()): wait for the rest of its modelled time plus its
        communication, or count an overrun (computation alone took longer than modelled)."""
        if self.cuda:  # the work is queued on the GPU: it is done only when the stream is
            torch.cuda.synchronize()
        self.phases += 1
        deadline = t0 + self.seconds[name] + self.excluded
        self.excluded = 0.0
        left = deadline - time.perf_counter()
        if left <= 0:
            self.overruns += 1
            self.total_overruns += 1
            self.late_s -= left
            return
        self.late_s -= _sleep_until(deadline)  # woken late: the CPU was busy with others (network/headroom.py)

    def hold(self, name: str, t0: float, share: float) -> None:
        """Inside phase `name` begun at `t0`: wait until `share` of its modelled time (and of the communication
        counted in it so far) has passed, so that what the rest of the phase depends on is ready when it would
        be on the device. Late is no overrun: the phase's end (finish) decides that."""
        if self.cuda:
            torch.cuda.synchronize()
        _sleep_until(t0 + share * self.seconds[name] + self.excluded)

    def take(self) -> int:
        n, self.overruns, self.late_s = self.overruns, 0, 0.0
        return n

    def take_iteration(self) -> dict:
        """The iteration's IterationStats fields (and reset): its overruns and its phases' lateness."""
        late = self.late_s
        return {"compute_overruns": self.take(), "compute_late_seconds": late}


def _sleep_until(deadline: float) -> float:
    """Sleep until `deadline` (perf_counter) and return how far before it we woke: 0 or less (sleep() may wake
    early on a signal: never end a phase short)."""
    left = deadline - time.perf_counter()
    while left > 0:
        time.sleep(left)
        left = deadline - time.perf_counter()
    return left


class _NoPacer:
    """Without the compute model: phases run as they run."""

    overruns = total_overruns = phases = 0
    seconds: dict = {}

    def phase(self, name: str):
        return contextlib.nullcontext()

    def begin(self) -> float:
        return time.perf_counter()

    def finish(self, name: str, t0: float) -> None:
        pass

    def take(self) -> int:
        return 0

    def take_iteration(self) -> dict:
        return {}


def pacer_for(spec: RunSpec, stage: int, device_index: int, device: torch.device | None = None,
              recompute: bool | None = None, vocab_parallel: bool = True, replica: int | None = None):
    """The pacer of the rank that runs `stage` (of spec.layout's stages; of replica `replica`'s when
    given, for pipelines that differ) on scenario device `device_index`, or a no-op one when the run's
    compute model is off. recompute: whether the runtime recomputes activations in backward (default:
    the layout's); vocab_parallel: whether tensor parallelism splits the embedding and head
    (compute.stage_compute). ZeRO shards the optimizer step over the data-parallel group."""
    c = spec.compute
    if not c.model:
        return _NoPacer()
    lay = spec.layout
    split = lay.pipeline(replica).layers_per_stage if replica is not None else lay.layers_per_stage
    if spec.model.is_cnn:  # a layer profile's stage: its layers' FLOPs and parameters
        modelled = layer_stage_phase_seconds(spec.model.profile.layers, list(split), stage, spec.model.micro_batch,
                                             c.devices[device_index])
        return ComputePacer({k: v * c.time_scale for k, v in modelled.items()}, device, (1.0,))
    recompute = lay.recompute if recompute is None else recompute
    modelled = rank_phase_seconds(spec.cfg, list(split), stage, spec.model.micro_batch,
                                  c.devices[device_index], recompute, lay.tp,
                                  vocab_parallel, optimizer_shards=lay.dp if lay.zero else 1)
    shares = backward_shares(spec.cfg, list(split), stage, spec.model.micro_batch, c.devices[device_index],
                             recompute, lay.tp, vocab_parallel)
    return ComputePacer({k: v * c.time_scale for k, v in modelled.items()}, device, tuple(shares))


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
    whose input is token ids, the embedding's output: the embedding's backward is not modelled).

    Call it once the module is parallelised: the forward hooks that tensor parallelism and ZeRO-3
    put on its submodules (and on the module itself) are where their collectives run, and are
    kept out of the phases (`_exclude_hooks`)."""
    if isinstance(pacer, _NoPacer):
        return
    for sub in module.modules():
        if sub is not module and (sub._forward_pre_hooks or sub._forward_hooks):
            _exclude_hooks(sub, pacer)
    t: dict[str, float] = {}

    def begin_backward():
        t["backward"] = pacer.begin()

    def end_backward():
        pacer.finish("backward", t["backward"])

    def before(mod, args):  # after the module's own pre-hooks (FSDP2's prepends its all-gather)
        t["forward"] = pacer.begin()
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.requires_grad:
            return (_Mark.apply(x, end_backward), *args[1:])
        return None

    def after(mod, args, out):  # before the module's own forward hooks, whose backward hooks then come first
        pacer.finish("forward", t["forward"])
        return _Mark.apply(out, begin_backward) if out.requires_grad else out

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after, prepend=True)
    embed = getattr(module, "embed", None)
    if embed is not None:
        embed.register_forward_hook(lambda mod, args, out: _Mark.apply(out, end_backward))
    _hold_backward_pieces(module, pacer, t)


def _hold_backward_pieces(module: torch.nn.Module, pacer, t: dict) -> None:
    """Inside the backward, hold each piece of the stage (the head, then the blocks from the last) until its
    share of the modelled time has passed as its gradient reaches it (compute.backward_shares), so that its
    parameters' gradients are ready when the device would have them. The real backward is over in moments:
    without the holds every gradient would be ready at the phase's start, and DDP's buckets, reduced as their
    gradients are ready, would overlap the whole modelled backward, which on the device they overlap only
    from the piece that completes them. The last piece is held by the phase's end (finish)."""
    head = getattr(module, "head", None)
    blocks = list(getattr(module, "blocks", ()))
    pieces = ([head] if head is not None else []) + blocks[::-1]
    if len(pieces) != len(pacer.backward_shares):  # not the GPT stage the shares were computed for
        return
    for piece, share in zip(pieces[:-1], pacer.backward_shares):
        def hold(mod, args, out, share=share):
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.requires_grad:
                return _Mark.apply(out, lambda: pacer.hold("backward", t["backward"], share))
            return out
        piece.register_forward_hook(hold)


def _exclude_hooks(module: torch.nn.Module, pacer) -> None:
    """Time `module`'s forward pre-hooks and forward hooks, and the backward of what they return,
    as communication: marks go on either side of each group (the first and last hooks of its
    list), so the backward of a redistribution or of FSDP2's gradient hooks falls between them."""
    t: dict[str, float] = {}

    def start(key):
        t[key] = time.perf_counter()

    def stop(key):
        if key in t:  # several marked inputs: the first to finish closes the interval
            pacer.exclude(time.perf_counter() - t.pop(key))

    def marked(value, callback):
        if isinstance(value, torch.Tensor) and value.requires_grad:
            return _Mark.apply(value, callback)
        return value

    def pre_first(mod, args):
        start("pre")
        return tuple(marked(a, lambda: stop("pre-bwd")) for a in args)

    def pre_last(mod, args):
        stop("pre")
        return tuple(marked(a, lambda: start("pre-bwd")) for a in args)

    def post_first(mod, args, out):
        start("post")
        return marked(out, lambda: stop("post-bwd"))

    def post_last(mod, args, out):
        stop("post")
        return marked(out, lambda: start("post-bwd"))

    module.register_forward_pre_hook(pre_first, prepend=True)
    module.register_forward_pre_hook(pre_last)
    module.register_forward_hook(post_first, prepend=True)
    module.register_forward_hook(post_last)


def pace_optimizer(optimizer: torch.optim.Optimizer, pacer) -> None:
    """Hold the optimizer's own update to its modelled time; with ZeRO-1 (ZeroRedundancyOptimizer)
    the local shard's step, so that the broadcast of the updated parameters stays communication."""
    if isinstance(pacer, _NoPacer):
        return
    local = getattr(optimizer, "optim", optimizer)
    t: dict[str, float] = {}

    def before(opt, args, kwargs):
        t["step"] = pacer.begin()

    def after(opt, args, kwargs):
        pacer.finish("optimizer", t.pop("step"))

    local.register_step_pre_hook(before)
    local.register_step_post_hook(after)
