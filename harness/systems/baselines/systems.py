"""The rank functions of the `megatron` and `deepspeed` systems (their entries: harness/plan/systems.py).

Each rank checks `RunSpec.layout`, trains with `train.train_baseline` and
hands back one IterationStats per timed iteration (and, for parity tests, its parameters).
"""
from __future__ import annotations

from ...train.compute_model import pacer_for
from ...plan.request import RunSpec
from ...train.rank import RankContext, torch_dtype
from ...train.stats import IterationStats
from .train import train_baseline


def _train(system: str, ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    cfg, m = spec.cfg, spec.model
    layout = spec.layout.check(cfg, m.batch, m.micro_batch, ctx.world_size)
    timings, state = train_baseline(
        layout, cfg, m.batch, m.micro_batch, spec.run.iters, m.seed, m.lr,
        warmup=spec.run.warmup, want_state=ctx.collect_state, device=ctx.device, dtype=torch_dtype(spec),
        progress=ctx.rank == 0, data=m.data, out=ctx.iteration_log(), mark=ctx.mark, reached=ctx.reached,
        start=spec.resolved.start_iteration, resume=spec.run.resume, checkpoint_every=spec.run.checkpoint_every,
        checkpoint_dir=spec.resolved.checkpoint_dir, trace=spec.debug.trace,
        # the compute model, if on: these runtimes keep activations (no recompute) and replicate the
        # embedding and head over the tensor-parallel group (parallelize.apply_tp)
        pace=(lambda stage: pacer_for(spec, stage, ctx.device_index, ctx.device, recompute=False,
                                      vocab_parallel=False))
        if spec.compute.model else None,
    )
    if state is not None:
        ctx.save_state(state)
    return timings


def train_megatron(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """Megatron-style: tensor x pipeline x data parallel, ranks in Megatron's order or permuted."""
    return _train("megatron", ctx, spec)


def train_deepspeed(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """DeepSpeed-style: ZeRO-3 (FSDP2) or ZeRO-1 + pipeline."""
    return _train("deepspeed", ctx, spec)


def train_horovod(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """Horovod-style (HetPipe's baseline): every device holds the whole model, gradients all-reduced (DDP's
    ring over the group), one synchronous step per iteration."""
    return _train("horovod", ctx, spec)
