"""Layer allocators over one pipeline's devices: every block placed once, contiguous, within memory, and
`optimal` the exact optimum (checked against enumeration) that no other allocator beats."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.allocation import ALLOCATORS, AllocationError, Problem, allocate

GIB = 2**30


def random_problem(rng, devices: int, blocks: int, tight: bool = False) -> Problem:
    """Slowdowns over [1, 7] (Sky Computing's penalty), blocks of varied FLOPs, and memory that is
    either ample or just enough for about the mean share on some devices."""
    flop = rng.uniform(0.5, 2.0, blocks) * 1e12
    per_flop = rng.uniform(1, 7, devices) / 1e13
    block_mem = rng.uniform(0.5, 1.5, blocks) * GIB
    if tight:
        memory = rng.uniform(1.0, 3.0, devices) * block_mem.sum() / devices
    else:
        memory = np.full(devices, block_mem.sum() + GIB)
    fixed = rng.uniform(0, 0.05, devices)
    return Problem(per_flop, flop, fixed, block_mem, memory)


def brute_force(problem: Problem) -> float:
    """Smallest feasible bottleneck over every composition of the blocks into the devices."""
    D, L = problem.devices, problem.blocks
    best = np.inf
    for cuts in itertools.combinations(range(1, L), D - 1):
        counts = np.diff((0, *cuts, L))
        if (problem.stage_memory(counts) <= problem.memory).all():
            best = min(best, problem.stage_seconds(counts).max())
    return best


def test_optimal_is_the_exact_optimum_and_never_worse_than_the_others():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(120):
        D = int(rng.integers(1, 6))
        L = int(rng.integers(D, 11))
        prob = random_problem(rng, D, L, tight=bool(rng.integers(2)))
        exact = brute_force(prob)
        if not np.isfinite(exact):
            with pytest.raises(AllocationError):
                allocate("optimal", prob)
            continue
        results = {}
        for name in ALLOCATORS:
            try:
                results[name] = allocate(name, prob)
            except AllocationError:
                assert name != "optimal"  # the others may fail where a fit exists (even ignores memory)
        best = results["optimal"]
        assert max(best.stage_seconds) == pytest.approx(exact, rel=1e-12) and best.optimal
        for name, a in results.items():
            counts = np.array(a.layers_per_device)
            assert counts.sum() == L and (counts >= 1).all() and len(counts) == D, name  # every block once, one or more each
            assert a.stages[0][0] == 0 and a.stages[-1][1] == L
            assert all(s[1] == t[0] for s, t in zip(a.stages, a.stages[1:]))  # contiguous
            assert (prob.stage_memory(counts) <= prob.memory * (1 + 1e-12)).all()
            assert max(best.stage_seconds) <= max(a.stage_seconds) * (1 + 1e-12)
        if "sky-mip" in results and results["sky-mip"].optimal:  # in pipeline order the program is exact
            assert max(results["sky-mip"].stage_seconds) == pytest.approx(exact, rel=1e-6)
        checked += 1
    assert checked > 60


def test_the_heuristic_gives_slow_devices_fewer_blocks_and_beats_even():
    slowdown = np.array([1.0, 7.0, 1.0, 4.0])
    prob = Problem(slowdown / 1e13, np.full(32, 1e12), np.zeros(4), np.full(32, GIB), np.full(4, 64.0 * GIB))
    even, sky = allocate("even", prob), allocate("sky-heuristic", prob)
    assert even.layers_per_device == (8, 8, 8, 8)
    assert sky.layers_per_device[1] < min(sky.layers_per_device[0], sky.layers_per_device[2])  # the slowest
    assert max(sky.stage_seconds) < max(even.stage_seconds)


def test_the_heuristic_moves_blocks_off_a_device_short_of_memory():
    # device 0 can hold 2 blocks; the even split gives it 4
    prob = Problem(np.full(3, 1e-13), np.full(12, 1e12), np.zeros(3), np.full(12, GIB),
                   np.array([2.5, 12.0, 12.0]) * GIB)
    sky = allocate("sky-heuristic", prob)
    assert sky.layers_per_device[0] <= 2 and sum(sky.layers_per_device) == 12
    with pytest.raises(AllocationError, match="device 0"):
        allocate("even", prob)


@pytest.mark.parametrize("devices,blocks,memory,match", [
    (4, 3, 64.0, "3 blocks cannot give 4 devices one each"),
    (2, 8, 0.5, "device 0 has 0.50 GiB for blocks, less than one block"),
])
def test_bad_inputs_are_one_line(devices, blocks, memory, match):
    prob = Problem(np.full(devices, 1e-13), np.full(blocks, 1e12), np.zeros(devices), np.full(blocks, GIB),
                   np.full(devices, memory * GIB))
    for name in ALLOCATORS:
        with pytest.raises(AllocationError, match=match) as e:
            allocate(name, prob)
        assert "\n" not in str(e.value)
    with pytest.raises(AllocationError, match="unknown 'greedy'"):
        allocate("greedy", prob)
