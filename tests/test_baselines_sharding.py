"""What makes each baseline what it is, observed on the ranks: ZeRO-1 shards optimizer state,
ZeRO-3 shards parameters, tensor parallel shards the block weights, DDP/pipeline do neither."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from harness import layout as layouts
from harness.systems.baselines.train import build_rank, train_step
from harness.train.local import local_spec, run_local
from harness.plan.systems import register_system

pytestmark = pytest.mark.timeout(90)


@register_system("test-baseline-inspect")
def _inspect(ctx, s):
    m = s.model
    br = build_rank(s.layout, s.cfg, m.batch, m.micro_batch, m.seed, m.lr)
    train_step(br, s.cfg, m.batch, 0, m.seed)
    local = sum(_numel(p) for p in br.schedule._stage.submod.parameters())
    opt = getattr(br.optimizer, "optim", br.optimizer)  # ZeroRedundancyOptimizer wraps the local one
    with_state = sum(_numel(p) for p in opt.state if opt.state[p])
    ctx.save_state({f"r{ctx.rank}.local": torch.tensor([local]), f"r{ctx.rank}.state": torch.tensor([with_state])})
    return []


def _numel(p: torch.Tensor) -> int:
    """Elements this rank stores (a DTensor's local shard)."""
    return (p.to_local() if isinstance(p, DTensor) else p).numel()


def inspect(tp: int, pp: int, dp: int, zero: int = 0) -> dict[int, tuple[int, int]]:
    devices = tp * pp * dp
    spec = local_spec(layouts.in_rank_order(tp, pp, dp, 2, zero=zero), "test-baseline-inspect",
                      batch=8, micro_batch=2, iters=1, timeout_s=60)
    state = run_local(spec, collect_state=True, timeout_s=80).state_dict()
    return {r: (int(state[f"r{r}.local"]), int(state[f"r{r}.state"])) for r in range(devices)}


def full_params() -> int:
    from harness.compute.model import get_model

    return get_model("tiny", 2).params


def test_zero3_shards_parameters_and_state():
    got = inspect(1, 1, 4, zero=3)
    total = full_params()
    assert sum(local for local, _ in got.values()) == pytest.approx(total, rel=0.01)
    assert all(local < total / 3 and state == local for local, state in got.values())


def test_zero1_shards_optimizer_state_not_parameters():
    got = inspect(1, 1, 2, zero=1)
    total = full_params()
    assert all(local == total for local, _ in got.values())  # every replica holds the whole model
    states = [state for _, state in got.values()]
    assert sum(states) == total and all(0 < s < total for s in states)


def test_ddp_keeps_everything_and_tp_halves_the_blocks():
    total = full_params()
    ddp = inspect(1, 1, 2)
    assert all(local == total and state == total for local, state in ddp.values())
    tp = inspect(2, 1, 1)
    from harness.compute.model import get_model

    cfg = get_model("tiny", 2)
    replicated = cfg.embedding_params + cfg.head_params + cfg.layers * 4 * cfg.hidden  # + LayerNorms
    # q/k/v/fc weights and biases split by columns, proj weights by rows (their biases stay whole).
    split = cfg.layers * (cfg.block_params - 4 * cfg.hidden - 2 * cfg.hidden)
    assert all(local == replicated + split // 2 + cfg.layers * 2 * cfg.hidden for local, _ in tp.values())
