"""The rank interface and loopback launcher: results come back, failures name the rank and never hang."""
from __future__ import annotations

import math
import re
import os
import time

import pytest
import torch
import torch.distributed as dist

from harness.train.launch import RankFailure
from harness.compute.model import get_model
from harness import layout as layouts
from harness.plan.request import RunSpec
from harness.train.local import local_spec, run_local
from harness.train.reference import reference_train
from harness.plan.systems import register_system
from harness.train.stats import IterationStats, merge_stats

pytestmark = pytest.mark.timeout(120)


def spec(system: str, devices: int = 2, **kw) -> RunSpec:
    base = dict(batch=4 * devices, micro_batch=2, iters=2, timeout_s=30)
    return local_spec(layouts.in_rank_order(1, 1, devices, 2), system, **{**base, **kw})


@register_system("test-allreduce")
def _allreduce(ctx, s):
    out = []
    for i in range(s.run.iters):
        t = torch.full((4,), float(ctx.rank + 1))
        dist.all_reduce(t)
        out.append(IterationStats(seconds=0.1 * (ctx.rank + 1), compute_seconds=0.05, exposed_comm_seconds=0.0,
                                  loss=t[0].item() if ctx.rank == 0 else math.nan))
    ctx.save_state({f"rank{ctx.rank}": torch.tensor([ctx.rank]), "shared": torch.tensor([ctx.rank])})
    return out


@register_system("test-raise")
def _raise(ctx, s):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # rank 0 blocks on the dead peer
    return []


@register_system("test-block")
def _block(ctx, s):
    for _ in range(10_000):  # the victim is killed by the debug fault while everyone is in collectives
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)
    return []


def test_run_local_returns_every_rank_and_merges():
    run = run_local(spec("test-allreduce", devices=3), collect_state=True)
    assert [r.rank for r in run.ranks] == [0, 1, 2]
    merged = run.stats
    assert len(merged) == 2
    assert merged[0].seconds == pytest.approx(0.3)  # slowest rank
    assert merged[0].exposed_comm_seconds == pytest.approx(0.25)
    assert merged[0].loss == 6.0  # 1+2+3 all-reduced, only rank 0 reports
    sd = run.state_dict()
    assert set(sd) == {"rank0", "rank1", "rank2", "shared"} and sd["shared"].item() == 0


def test_raising_rank_fails_run_naming_it():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec("test-raise"), timeout_s=60)
    assert time.monotonic() - t0 < 30
    assert re.match(r"rank 1 \(stage \d of pipeline \d\) failed: ValueError: boom on purpose", str(e.value))
    assert e.value.rank == 1


def test_the_rank_that_raised_first_is_named_first_however_the_ends_were_seen(tmp_path):
    """A busy machine may show a peer's end (the closed connection) before the raising rank's: the report
    still names the earliest exception; a rank killed by a signal is the cause wherever it was seen."""
    from harness.train.launch import _cause

    (tmp_path / "rank0.err").write_text("2000\nRuntimeError: Connection closed by peer")
    (tmp_path / "rank1.err").write_text("1000\nValueError: boom on purpose")
    assert _cause([0, 1], [], tmp_path) == 1 and _cause([0], [1], tmp_path) == 1
    assert _cause([2, 0], [1], tmp_path) == 2  # rank 2: no exception of its own (killed)
    assert _cause([0, 2], [1], tmp_path) == 2  # its peer's exception seen first: the kill is still the cause
    (tmp_path / "rank0.err").write_text("500\nValueError: first")
    assert _cause([1], [0], tmp_path) == 0


def test_killed_rank_stops_all_ranks_in_bounded_time():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(spec("test-block", devices=3, fault_rank=2, fault_after_s=1.0), timeout_s=60)
    assert time.monotonic() - t0 < 30
    assert re.match(r"rank 2 \(stage \d of pipeline \d\) was killed by signal SIGKILL", str(e.value))


def test_timeout_names_running_ranks():
    @register_system("test-sleep")
    def _sleep(ctx, s):
        time.sleep(60)
        return []

    with pytest.raises(RankFailure, match=r"timed out after 2 s; still running: rank 0 \(stage 0 of pipeline 0\), rank 1 \("):
        run_local(spec("test-sleep"), timeout_s=2)


def test_reference_micro_batching_does_not_change_the_math():
    cfg = get_model("tiny", 2)
    l1, s1 = reference_train(cfg, batch=4, micro_batch=4, steps=3, seed=1, lr=0.1)
    l2, s2 = reference_train(cfg, batch=4, micro_batch=1, steps=3, seed=1, lr=0.1)
    assert l1 == pytest.approx(l2, rel=1e-5)
    assert l1[2] < l1[0]  # it trains
    for k in s1:
        torch.testing.assert_close(s2[k], s1[k], rtol=1e-5, atol=1e-6)


def test_merge_stats_on_one_clock_sums_to_the_wall_time_not_the_ranks_worst_noise():
    # two ranks with a common period of 1.2 s, alternating 1.0 / 1.4 s out of phase
    a_dur, b_dur = [1.0, 1.4, 1.0, 1.4], [1.4, 1.0, 1.4, 1.0]

    def ranks(durations, start):
        out, t = [], start
        for d in durations:
            t += d
            out.append(IterationStats(d, 0.1, d - 0.1, math.nan, end=t))
        return out

    per_rank = [ranks(a_dur, 10.0), ranks(b_dur, 9.8)]
    merged = merge_stats(per_rank, shared_clock=True)
    wall = max(r[-1].end for r in per_rank) - max(r[0].end - r[0].seconds for r in per_rank)
    assert sum(m.seconds for m in merged) == pytest.approx(wall)
    assert sum(m.seconds for m in merged) < sum(max(a, b) for a, b in zip(a_dur, b_dur))
    # different hosts (or no timestamps): the slowest rank's own duration
    assert [m.seconds for m in merge_stats(per_rank)] == [1.4] * 4
    no_end = [[IterationStats(d, 0.1, 0.0, math.nan) for d in a_dur], [IterationStats(d, 0.1, 0.0, math.nan) for d in b_dur]]
    assert [m.seconds for m in merge_stats(no_end, shared_clock=True)] == [1.4] * 4
