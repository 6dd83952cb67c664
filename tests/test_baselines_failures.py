"""Baselines never hang: a dead or silent peer fails the run in bounded time, naming a rank.

The gloo/CPU paths these baselines depend on (pipelining p2p, FSDP2 on a CPU mesh, DDP
under a pipeline schedule) are proven to train by tests/test_baselines_parity.py; here the
failure side: pipelining's blocking receives and FSDP's collectives end with an error once
the process-group timeout passes, and the launcher stops every rank.
"""
from __future__ import annotations

import time

import pytest

from harness.launch import RankFailure
from harness.train.baselines.systems import train_deepspeed, train_megatron
from harness.train.runner import RunSpec, register_system, run_local

pytestmark = pytest.mark.timeout(90)


def spec(system: str, devices: int, layout: dict, timeout_s: float = 30) -> RunSpec:
    return RunSpec(
        run_id="fail", scenario="none", system=system, backend="local", kernel="none", devices=devices,
        model="tiny", layers=2, batch=8, micro_batch=1, iters=200, warmup=0, seed=0,
        bandwidth_scale=1.0, lr=0.1, dtype="fp32", device_type="cpu", layout=layout, timeout_s=timeout_s,
    )


def test_killed_pipeline_peer_fails_the_run_naming_it(monkeypatch):
    monkeypatch.setenv("HARNESS_FAULT", "rank=1,after=3.0,mode=kill")
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec("megatron", 4, {"tp": 1, "pp": 2, "dp": 2}), 4, timeout_s=60)
    assert time.monotonic() - t0 < 45
    assert str(e.value).startswith("rank 1 was killed by signal SIGKILL")


def _stall_rank_mid_training() -> None:
    """Make this rank's third iteration stall (alive, never sending) inside training."""
    from harness.train.baselines import train as train_mod

    real = train_mod.train_step

    def stalling(br, cfg, batch, iteration, seed):
        if iteration == 2:
            time.sleep(120)
        return real(br, cfg, batch, iteration, seed)

    train_mod.train_step = stalling  # only in this forked rank


@register_system("test-megatron-stalled-rank")
def _stalled_megatron(ctx, s):
    if ctx.rank == 1:  # its pipeline peer waits in a receive that never completes
        _stall_rank_mid_training()
    return train_megatron(ctx, s)


@register_system("test-zero3-stalled-rank")
def _stalled_zero3(ctx, s):
    if ctx.rank == 0:  # its peer waits in FSDP's all-gather
        _stall_rank_mid_training()
    return train_deepspeed(ctx, s)


@pytest.mark.parametrize("system, layout", [
    ("test-megatron-stalled-rank", {"tp": 1, "pp": 2, "dp": 1, "schedule": "1f1b"}),
    ("test-zero3-stalled-rank", {"zero": 3}),
])
def test_stalled_peer_becomes_a_timeout_error_not_a_hang(system, layout):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec(system, 2, layout, timeout_s=4), 2, timeout_s=60)
    assert time.monotonic() - t0 < 40
    # The waiting rank reports gloo's timeout; the stalled one is stopped by the launcher.
    assert str(e.value).startswith("rank ") and "Timed out" in str(e.value)
