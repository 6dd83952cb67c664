"""Speed target of the simulator: cases 1-5 x layers {24,32,40} x batch {1024,2048,4096}, every system,
layout and placement, in <= 2 minutes (issue 6). Scheduling for ours is part of the sweep, from a cold cache."""
from __future__ import annotations

import pytest

from harness.report import sim as report

TARGET_S = 120.0


@pytest.mark.bench
@pytest.mark.timeout(900)
def test_bench_paper_sweep(benchmark, tmp_path):
    settings = []

    def sweep():
        out = report.sweep_cases(cache_dir=tmp_path / "schedules", progress=settings.append)
        return out

    sweeps = benchmark.pedantic(sweep, rounds=1, iterations=1)
    assert len(settings) == 5 * 3 * 3
    assert all(len(cs.candidates) == 9 for cs in sweeps.values())
    assert benchmark.stats.stats.max <= TARGET_S


@pytest.mark.bench
@pytest.mark.timeout(300)
def test_bench_sweep_with_cached_schedules(benchmark, tmp_path):
    """The simulation alone (schedules cached): what repeated `harness sim report` runs cost."""
    cache = tmp_path / "schedules"
    report.sweep_cases(cases=("5",), cache_dir=cache)

    def sweep():
        return report.sweep_cases(cases=("5",), cache_dir=cache)

    benchmark.pedantic(sweep, rounds=3, iterations=1)
    assert benchmark.stats.stats.max <= TARGET_S / 5
