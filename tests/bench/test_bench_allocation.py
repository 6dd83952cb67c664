"""Issue 27 target: the exact allocator on 64 devices x 160 blocks in <= 1 s, next to Sky Computing's
heuristic on the same instance (bottlenecks side by side in the benchmark's extra info)."""
import numpy as np

from harness.allocation import allocate
from tests.test_allocation import random_problem


def test_optimal_64_devices_160_blocks(benchmark):
    prob = random_problem(np.random.default_rng(0), 64, 160)
    best = benchmark.pedantic(lambda: allocate("optimal", prob), rounds=3, iterations=1)
    assert benchmark.stats.stats.max <= 1.0
    for name in ("even", "sky-heuristic"):
        other = allocate(name, prob)
        benchmark.extra_info[f"{name}_over_optimal"] = max(other.stage_seconds) / max(best.stage_seconds)
        assert max(best.stage_seconds) <= max(other.stage_seconds)
