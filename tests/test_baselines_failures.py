"""Baselines never hang: a dead or silent peer fails the run in bounded time, naming a rank.

The gloo/CPU paths these baselines depend on (pipelining p2p, FSDP2 on a CPU mesh, DDP
under a pipeline schedule) are proven to train by tests/test_baselines_parity.py; here the
failure side: pipelining's blocking receives and FSDP's collectives end with an error once
the process-group timeout passes, and the launcher stops every rank.
"""
from __future__ import annotations

import time

import pytest

from harness.train.launch import RankFailure
from harness import layout as layouts
from harness.layout import Layout
from harness.systems.baselines.systems import train_deepspeed, train_megatron
from harness.plan.request import RunSpec
from harness.train.local import local_spec, run_local
from harness.plan.systems import register_system

pytestmark = pytest.mark.timeout(90)


def spec(system: str, layout: Layout, timeout_s: float = 30, **debug) -> RunSpec:
    return local_spec(layout, system, batch=8, micro_batch=1, iters=200, timeout_s=timeout_s, **debug)


def test_killed_pipeline_peer_fails_the_run_naming_it():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec("megatron", layouts.in_rank_order(1, 2, 2, 2), fault_rank=1, fault_after_s=3.0), timeout_s=60)
    assert time.monotonic() - t0 < 45
    # the rank is named with what it ran (harness.layout.Layout.role)
    assert str(e.value).startswith("rank 1 (stage 0 of pipeline 1) was killed by signal SIGKILL")


def _stall_rank_mid_training() -> None:
    """Make this rank's third iteration stall (alive, never sending) inside training."""
    from harness.systems.baselines import train as train_mod

    real = train_mod.train_step

    def stalling(br, cfg, batch, iteration, *args, **kwargs):
        if iteration == 2:
            time.sleep(120)
        return real(br, cfg, batch, iteration, *args, **kwargs)

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
    ("test-megatron-stalled-rank", layouts.in_rank_order(1, 2, 1, 2)),
    ("test-zero3-stalled-rank", layouts.in_rank_order(1, 1, 2, 2, zero=3)),
])
def test_stalled_peer_becomes_a_timeout_error_not_a_hang(system, layout):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec(system, layout, timeout_s=4), timeout_s=60)
    assert time.monotonic() - t0 < 40
    # The waiting rank reports gloo's timeout; the stalled one is stopped by the launcher.
    assert str(e.value).startswith("rank ") and "Timed out" in str(e.value)
