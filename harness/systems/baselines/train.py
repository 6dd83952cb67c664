"""One rank of a Megatron- or DeepSpeed-style run: build the layout's groups, parallelise, train.

Every layout runs the same loop: the rank's model part (a pipeline stage, the whole model
when D_PP = 1) parallelised by `parallelize.py`, stepped by a torch.distributed.pipelining
schedule over its replica's micro-batches, then the optimizer (plain, or ZeRO-1 sharded).
Same model (`GPT(cfg, seed)`), data (`synthetic_batch`), loss and optimizer as the reference.

With the compute model (compute_model.py), the stage module is held to its device's modelled
forward and backward times (hooks on the module: the schedules call it themselves), and
compute_seconds is that modelled time. The optimizer step runs at its real speed, as the
simulator's model of these runtimes leaves it out. Without it, compute_seconds is
calibrated, not observed inside the distributed step (PyTorch's
collectives run inside the modules' forward/backward, where a hook cannot separate
them): before training, the rank times forward+backward of one micro-batch through its
unsharded part, and an iteration's compute is that time x its micro-batches, divided by
D_TP (each shard runs 1/D_TP of every block); CPU ranks take turns, so each times an
idle host. exposed_comm_seconds = seconds - compute.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from ...layout import Layout
from ...compute.model import GPTConfig
from ...train.compute_model import pace_optimizer, pace_stage_module
from ...train.gpt import GPT, lm_loss, synthetic_batch
from ...train.rank import iteration_progress
from ...compute import micro_batches
from ...train.reference import make_optimizer
from ...train.stats import IterationStats
from ...train import wire
from . import checkpoints
from .trace import OpTrace
from .parallelize import (
    apply_ddp,
    apply_fsdp,
    apply_tp,
    full_state,
    model_part,
    pipeline_schedule,
    pipeline_stage,
    zero1_optimizer,
)


def torch_mesh(layout: Layout) -> np.ndarray:
    """The layout's (pp, dp, tp) device mesh with each tensor-parallel group's ranks ascending.

    A process group numbers its members by global rank and DTensor gives shard i to member i,
    whatever the mesh says; sorting inside each TP group makes the mesh coordinate equal that
    shard index, so data-parallel and pipeline peers hold the same shard. Which devices form a
    group (what a layout decides) is unchanged."""
    return np.sort(layout.array(), axis=2)


@dataclass
class BaselineRank:
    """Everything one rank built for a layout: its groups, model part, schedule and optimizer."""

    layout: Layout
    model: GPT
    stage: int
    replica: int
    shard: int
    schedule: object
    optimizer: torch.optim.Optimizer
    n_local_mb: int
    compute_seconds: float
    device: torch.device
    pacer: object = None  # the compute model's (compute_model.py); None: off
    trace: OpTrace | None = None  # --debug trace=1


def build_rank(
    layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int, seed: int, lr: float,
    device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32, pace=None, trace: bool = False,
) -> BaselineRank:
    """Create the device mesh (pp, dp, tp) of the layout and this rank's parallel model part.

    pace(stage) -> the compute model's pacer for this rank's stage (compute_model.pacer_for): its
    stage module is then held to the modelled times, and compute_seconds is the modelled time.
    trace: print when each of the rank's operations ran (trace.py).
    Collective: every rank of the default group calls it with the same layout.
    """
    rank = dist.get_rank()
    ranks = torch_mesh(layout)
    stage, replica, shard = (int(x) for x in np.argwhere(ranks == rank)[0])
    mesh = DeviceMesh(device.type, torch.as_tensor(ranks), mesh_dim_names=("pp", "dp", "tp"))
    n_local_mb = micro_batches(batch, micro_batch, layout.dp)

    model = GPT(cfg, seed)
    part = model_part(model, layout.stages[stage]).to(device=device, dtype=dtype)
    pacer = pace(stage) if pace is not None else None
    if pacer is not None:  # the modelled time is the compute: nothing to calibrate
        compute = n_local_mb * (pacer.seconds["forward"] + pacer.seconds["backward"]) + pacer.seconds["optimizer"]
    elif device.type == "cpu":
        # CPU ranks share the host's cores: calibrate one rank at a time, so that no rank times
        # its compute while the others run theirs (8 ranks on 2 cores read about 5x slow)
        for turn in range(dist.get_world_size()):
            if turn == rank:
                one = _calibrate(part, cfg, micro_batch, seed, stage == 0, device, dtype)
            dist.barrier()
        compute = one * n_local_mb / layout.tp
    else:
        compute = _calibrate(part, cfg, micro_batch, seed, stage == 0, device, dtype) * n_local_mb / layout.tp

    part = inner = apply_tp(part, mesh["tp"])
    if layout.zero == 3:
        part = apply_fsdp(part, mesh["dp"])
    else:
        part = apply_ddp(part, mesh["dp"])
    if pacer is not None:  # once parallelised: the collectives' hooks are then kept out of the phases
        pace_stage_module(inner, pacer)
    stage_ranks = [int(r) for r in ranks[:, replica, shard]]
    ps = pipeline_stage(part, stage, layout.pp, mesh["pp"].get_group(), stage_ranks, device)
    op_trace = OpTrace(rank, stage, replica) if trace else None
    if op_trace is not None:
        op_trace.wrap_stage(ps)
        if isinstance(part, DistributedDataParallel):
            op_trace.hook_ddp(part)
    schedule = pipeline_schedule(ps, n_local_mb, layout.schedule)

    params = [p for p in part.parameters() if p.requires_grad]
    if layout.zero == 1:
        optimizer = zero1_optimizer(params, lr, mesh["dp"].get_group())
    else:
        optimizer = make_optimizer(params, lr)
    if pacer is not None:
        pace_optimizer(optimizer, pacer)
    return BaselineRank(layout, model, stage, replica, shard, schedule, optimizer, n_local_mb, compute, device, pacer,
                        op_trace)


def _calibrate(
    part: torch.nn.Module, cfg: GPTConfig, micro_batch: int, seed: int, first: bool,
    device: torch.device, dtype: torch.dtype,
) -> float:
    """Seconds of forward+backward of one micro-batch through an unsharded copy of `part`.

    Best of 3: the minimum drops the moments something else held the core."""
    probe = copy.deepcopy(part)
    tokens, targets = synthetic_batch(cfg, micro_batch, 0, seed)
    tokens, targets = tokens.to(device), targets.to(device)
    x = tokens if first else torch.randn(micro_batch, cfg.seq, cfg.hidden, device=device, dtype=dtype, requires_grad=True)
    best = math.inf
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        out = probe(x)
        (lm_loss(out, targets) if probe.head is not None else out.float().mean()).backward()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del probe
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(br: BaselineRank, cfg: GPTConfig, batch: int, iteration: int, seed: int,
               data: str = "uniform") -> IterationStats:
    """One iteration: the replica's slice of the global batch through the pipeline, then the update."""
    lay = br.layout
    tokens, targets = synthetic_batch(cfg, batch, iteration, seed, data)
    per = batch // lay.dp
    sl = slice(br.replica * per, (br.replica + 1) * per)
    first, last = br.stage == 0, br.stage == lay.pp - 1
    losses: list[torch.Tensor] = []
    args = (tokens[sl].to(br.device),) if first else ()
    kwargs = {"target": targets[sl].to(br.device), "losses": losses} if last else {}
    _sync(br.device)
    t0 = time.perf_counter()
    br.optimizer.zero_grad(set_to_none=True)
    br.schedule.step(*args, **kwargs)
    br.optimizer.step()
    _sync(br.device)
    seconds = time.perf_counter() - t0
    end = time.monotonic()
    loss = float(torch.stack(losses).detach().mean()) if last else math.nan
    compute = min(br.compute_seconds, seconds)
    paced = br.pacer.take_iteration() if br.pacer is not None else {}
    return IterationStats(seconds, compute, seconds - compute, loss, end, **paced, **wire.take_iteration())


def train_baseline(
    layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int, iters: int, seed: int, lr: float,
    warmup: int = 0, want_state: bool = False,
    device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32, progress: bool = False,
    pace=None, data: str = "uniform", out: list | None = None, mark=None, reached=None,
    start: int = 0, resume: str | None = None, checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
    trace: bool = False,
) -> tuple[list[IterationStats], dict[str, torch.Tensor] | None]:
    """Run `warmup + iters` iterations on this rank; returns the timed ones (and, if asked, the
    rank's parameters under reference names, restricted to its own stage). With `progress`, one
    line per iteration on stderr (rank 0 asks for it, as `ours` does). pace: see build_rank. out: the list the
    timed iterations are appended to (the rank's journal under the elastic agent); mark: RankContext.mark, told
    when the rank is ready to train; reached: RankContext.reached, told of the checkpoint's point. start: the
    iterations done (resumed from the checkpoint after them in `resume`); checkpoint_every: a checkpoint
    (checkpoints.py) in `checkpoint_dir` every so many iterations. trace: see build_rank."""
    br = build_rank(layout, cfg, batch, micro_batch, seed, lr, device, dtype, pace, trace)
    named = [(n, p) for n, p in br.model.named_parameters() if _owned(br, n)]
    if start:
        checkpoints.load_into(resume, start, named, br.optimizer)
    if mark is not None:
        mark("training")
    out = [] if out is None else out
    steps = warmup + iters
    for it in range(start, steps):
        if br.trace is not None:
            br.trace.iteration = it
        try:
            timing = train_step(br, cfg, batch, it, seed, data)
        except RuntimeError as e:
            where = f"stage {br.stage} replica {br.replica} shard {br.shard}"
            raise RuntimeError(f"{layout.label()}: iteration {it}, {where}: {root_message(e)}") from e
        if it >= warmup:  # done with its update (journaled under the elastic agent), as ours counts it
            out.append(timing)
        if checkpoint_every and (it + 1) % checkpoint_every == 0:  # after the update, outside the iteration's time
            if reached is not None:
                reached("checkpoint", it)
            checkpoints.save(checkpoint_dir, it + 1, dist.get_rank(), dist.get_world_size(), named, br.optimizer)
        if progress:
            iteration_progress(it, steps, warmup, timing.seconds)
    state = None
    if want_state:
        full = full_state(br.model)
        own = {n for n, p in br.model.named_parameters() if _owned(br, n)}
        state = {n: t for n, t in full.items() if n in own}
    return out, state


def root_message(e: BaseException) -> str:
    """First non-empty line of the innermost cause (pipelining wraps errors in a multi-line banner)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _owned(br: BaselineRank, name: str) -> bool:
    """Whether parameter `name` (reference naming) lives in this rank's pipeline stage."""
    first, last = br.layout.stages[br.stage]
    if name.startswith("embed."):
        return br.stage == 0
    if name.startswith("head."):
        return br.stage == br.layout.pp - 1
    block = int(name.split(".")[1])
    return first <= block < last
