"""What makes each baseline what it is, observed on the ranks: ZeRO-1 shards optimizer state,
ZeRO-3 shards parameters, tensor parallel shards the block weights, DDP/pipeline do neither."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from harness.train.baselines.layout import from_json, validate
from harness.train.baselines.train import build_rank, train_step
from harness.train.runner import RunSpec, register_system, run_local

pytestmark = pytest.mark.timeout(90)


@register_system("test-baseline-inspect")
def _inspect(ctx, s):
    system = s.layout["system"]
    layout = validate(from_json(system, {k: v for k, v in s.layout.items() if k != "system"}, ctx.world_size),
                      s.cfg, ctx.world_size, s.batch, s.micro_batch)
    br = build_rank(layout, s.cfg, s.batch, s.micro_batch, s.seed, s.lr)
    train_step(br, s.cfg, s.batch, 0, s.seed)
    local = sum(_numel(p) for p in br.schedule._stage.submod.parameters())
    opt = getattr(br.optimizer, "optim", br.optimizer)  # ZeroRedundancyOptimizer wraps the local one
    with_state = sum(_numel(p) for p in opt.state if opt.state[p])
    ctx.save_state({f"r{ctx.rank}.local": torch.tensor([local]), f"r{ctx.rank}.state": torch.tensor([with_state])})
    return []


def _numel(p: torch.Tensor) -> int:
    """Elements this rank stores (a DTensor's local shard)."""
    return (p.to_local() if isinstance(p, DTensor) else p).numel()


def inspect(devices: int, layout: dict) -> dict[int, tuple[int, int]]:
    spec = RunSpec(run_id="inspect", scenario="none", system="test-baseline-inspect", backend="local", kernel="none",
                   devices=devices, model="tiny", layers=2, batch=8, micro_batch=2, iters=1, warmup=0, seed=0,
                   bandwidth_scale=1.0, lr=0.1, dtype="fp32", device_type="cpu", layout=layout, timeout_s=60)
    state = run_local(spec, devices, collect_state=True, timeout_s=80).state_dict()
    return {r: (int(state[f"r{r}.local"]), int(state[f"r{r}.state"])) for r in range(devices)}


def full_params() -> int:
    from harness.model import get_model

    return get_model("tiny", 2).params


def test_zero3_shards_parameters_and_state():
    got = inspect(4, {"system": "deepspeed", "zero": 3})
    total = full_params()
    assert sum(local for local, _ in got.values()) == pytest.approx(total, rel=0.01)
    assert all(local < total / 3 and state == local for local, state in got.values())


def test_zero1_shards_optimizer_state_not_parameters():
    got = inspect(2, {"system": "deepspeed", "zero": 1, "pp": 1, "dp": 2})
    total = full_params()
    assert all(local == total for local, _ in got.values())  # every replica holds the whole model
    states = [state for _, state in got.values()]
    assert sum(states) == total and all(0 < s < total for s in states)


def test_ddp_keeps_everything_and_tp_halves_the_blocks():
    total = full_params()
    ddp = inspect(2, {"system": "megatron", "tp": 1, "pp": 1, "dp": 2})
    assert all(local == total and state == total for local, state in ddp.values())
    tp = inspect(2, {"system": "megatron", "tp": 2, "pp": 1, "dp": 1})
    from harness.model import get_model

    cfg = get_model("tiny", 2)
    replicated = cfg.embedding_params + cfg.head_params + cfg.layers * 4 * cfg.hidden  # + LayerNorms
    # q/k/v/fc weights and biases split by columns, proj weights by rows (their biases stay whole).
    split = cfg.layers * (cfg.block_params - 4 * cfg.hidden - 2 * cfg.hidden)
    assert all(local == replicated + split // 2 + cfg.layers * 2 * cfg.hidden for local, _ in tp.values())
