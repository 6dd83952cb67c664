"""Wave Synchronous Parallel's bounds, checked from per-minibatch records (harness/systems/hetpipe/wsp.py).

The checker is what every WSP run's records go through; here it reads the simulator's records over
random per-device delays: no minibatch misses an update the global staleness bound requires, and the
clock distance never exceeds D. The checker itself is shown to catch both violations.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest

from harness.systems.hetpipe import wsp


@dataclass
class VW:
    devices: list[int]
    fwd: list[float]
    bwd: list[float]
    send_fwd: list[float]
    send_bwd: list[float]


def random_vws(rng: random.Random, n_vws: int) -> list[VW]:
    """VWs of 1-4 stages whose speeds differ up to 20x (stragglers make the bounds bind)."""
    out = []
    for v in range(n_vws):
        k = rng.randint(1, 4)
        slow = rng.choice([1.0, 1.0, 5.0, 20.0])
        out.append(VW(list(range(k)), [rng.uniform(0.1, 1) * slow for _ in range(k)],
                      [rng.uniform(0.2, 2) * slow for _ in range(k)],
                      [rng.uniform(0, 0.5) for _ in range(k - 1)], [rng.uniform(0, 0.5) for _ in range(k - 1)]))
    return out


CASES = [(seed, n_vws, n_m, d) for seed in range(4) for n_vws in (1, 2, 4) for n_m in (1, 2, 4) for d in (0, 1, 4)]


@pytest.mark.parametrize("seed,n_vws,n_m,d", CASES)
def test_simulated_runs_keep_both_bounds(seed, n_vws, n_m, d):
    rng = random.Random(seed * 1000 + n_vws * 100 + n_m * 10 + d)
    res = wsp.simulate(random_vws(rng, n_vws), n_m, 1, d, rng.uniform(0, 2), rng.uniform(0, 2), waves=12)
    records = res.records(n_m)
    assert len(records) == n_vws * 12 * n_m
    assert wsp.check_bounds(records, n_m, d) == []
    if n_vws > 1 and d < 4:  # the gate was needed: some minibatch read a newer global version than w0
        assert max(r.global_version for r in records) > 0


def test_global_staleness_of_the_papers_example():
    """D = 0, s_local = 3: minibatch 11 must hold the updates of minibatches 1 to 4 (Sec. 5)."""
    assert wsp.global_staleness(4, 0) == 6
    ok = wsp.MinibatchRecord(vw=0, minibatch=10, clock=2, global_version=1, admitted=0.0)
    assert wsp.check_bounds([ok], 4, 0) == []
    missed = replace(ok, global_version=0)
    [line] = wsp.check_bounds([missed], 4, 0)
    assert "minibatch 11" in line and "1..4" in line


def test_the_checker_catches_a_run_without_the_gate():
    """The same straggler run simulated with D = 4 breaks D = 0's bounds: the checker says so."""
    rng = random.Random(7)
    vws = random_vws(rng, 3)
    vws[0] = replace(vws[0], fwd=[f * 20 for f in vws[0].fwd], bwd=[b * 20 for b in vws[0].bwd])
    records = wsp.simulate(vws, 2, 1, 4, 0.1, 0.1, waves=12).records(2)
    assert wsp.check_bounds(records, 2, 4) == []
    bad = wsp.check_bounds(records, 2, 0)
    assert any("clock distance" in b for b in bad) and any("the bound needs" in b for b in bad)
