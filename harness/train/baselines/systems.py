"""The `megatron` and `deepspeed` systems, registered with the trainer's rank interface.

`harness.train.runner.get_system` imports every module of this package, which registers
both names. Each rank parses `RunSpec.layout`, trains with `train.train_baseline` and
hands back one IterationStats per timed iteration (and, for parity tests, its parameters).
"""
from __future__ import annotations

from ..runner import IterationStats, RankContext, RunSpec, register_system
from .layout import from_json, validate
from .train import train_baseline


def _train(system: str, ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    cfg = spec.cfg
    layout = validate(from_json(system, spec.layout, ctx.world_size), cfg, ctx.world_size, spec.batch, spec.micro_batch)
    timings, state = train_baseline(
        layout, cfg, spec.batch, spec.micro_batch, spec.iters, spec.seed, spec.lr,
        warmup=spec.warmup, want_state=ctx.collect_state, device=ctx.device, dtype=spec.torch_dtype,
    )
    if state is not None:
        ctx.save_state(state)
    return [IterationStats(t.seconds, t.compute_seconds, t.exposed_comm_seconds, t.loss, t.end) for t in timings]


@register_system("megatron")
def train_megatron(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """Megatron-style: tensor x pipeline x data parallel, ranks in Megatron's order or permuted."""
    return _train("megatron", ctx, spec)


@register_system("deepspeed")
def train_deepspeed(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    """DeepSpeed-style: ZeRO-3 (FSDP2) or ZeRO-1 + pipeline."""
    return _train("deepspeed", ctx, spec)
