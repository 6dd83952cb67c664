"""Issue 2 targets: one 64-device COMM-COST evaluation <= 2 ms (median); ga at least as good as ga-kl,
both far better than random. Issue 57: `ga` with 5000 candidates on 64 devices (its seeding by the lower
bound's run layouts included) <= 10 s."""
import time

import numpy as np
import pytest

from harness.scheduler.cost import CostModel
from harness.compute.model import get_model
from harness.compute import c_dp_bytes, c_pp_bytes
from harness.scenario import load_scenario
from harness.scheduler import schedule

CFG = get_model("gpt3-xl")
SIZES = (c_pp_bytes(CFG, 1024, 8), c_dp_bytes(CFG, 8))


def test_cost_evaluation_64_devices(benchmark):
    cm = CostModel(load_scenario("5"), 8, 8, *SIZES)
    rng = np.random.default_rng(0)
    partitions = [rng.permutation(64).reshape(8, 8) for _ in range(64)]
    it = iter(range(10**9))
    benchmark(lambda: cm.total(partitions[next(it) % 64]))
    assert benchmark.stats.stats.median <= 2e-3


@pytest.mark.parametrize("case", ["2", "5"])
def test_ga_5000_candidates_64_devices(case, benchmark):
    topo = load_scenario(case)
    a = benchmark.pedantic(lambda: schedule(topo, 8, 8, *SIZES, scheduler="ga", seed=0, budget=5000),
                           rounds=1, iterations=1)
    assert a.trace[-1][0] == 5000
    assert benchmark.stats.stats.max <= 10.0


@pytest.mark.parametrize("case", ["1", "2", "3", "4", "5"])
def test_quality_ga_vs_ga_kl_vs_random(case, benchmark):
    topo = load_scenario(case)
    costs = {}

    def run():
        for name in ("random", "ga-kl", "ga"):
            t0 = time.perf_counter()
            costs[name] = [schedule(topo, 8, 8, *SIZES, scheduler=name, seed=s, budget=5000).cost["total"]
                           for s in (0, 1, 2)]
            costs[name + "_s"] = (time.perf_counter() - t0) / 3

    benchmark.pedantic(run, rounds=1, iterations=1)
    print(f"\ncase {case}: " + "  ".join(
        f"{n}: mean {np.mean(costs[n]):.3f} s (seeds {', '.join(f'{c:.2f}' for c in costs[n])}; "
        f"{costs[n + '_s']:.1f} s/run)" for n in ("random", "ga-kl", "ga")))
    assert np.mean(costs["ga"]) <= np.mean(costs["ga-kl"]) + 1e-9
    assert min(costs["ga"]) <= min(costs["random"]) + 1e-9


def test_ga_hetero_5000_candidates_64_devices(benchmark):
    """Issue 28 target: ga-hetero, 5000 candidates (each with its optimal allocation) on 64 devices <= 10 s."""
    from harness.scheduler.iteration_cost import ComputeSetting

    topo = load_scenario("hetero-regional")
    a = benchmark.pedantic(lambda: schedule(topo, 8, 8, *SIZES, scheduler="ga-hetero", seed=0, budget=5000,
                                            setting=ComputeSetting(CFG, 1024)), rounds=1, iterations=1)
    assert a.trace[-1][0] == 5000
    assert benchmark.stats.stats.max <= 10.0
