"""Layer allocators over one pipeline's devices: every block placed once, contiguous, within memory, and
`optimal` the exact optimum (checked against enumeration) that no other allocator beats."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from harness.allocation import ALLOCATORS, AllocationError, Problem, allocate, problem_for

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


def test_the_heuristics_give_away_branch_fires():
    """A slow first device over the mean can only shed blocks by giving its last one to the next
    (Algorithm 2, line 11); the branch that the public code can never reach."""
    prob = Problem(np.array([7.0, 1.0]) / 1e13, np.full(16, 1e12), np.zeros(2), np.full(16, GIB),
                   np.full(2, 64.0 * GIB))
    sky = allocate("sky-heuristic", prob)
    assert sky.layers_per_device[0] < 8 and max(sky.stage_seconds) < max(allocate("even", prob).stage_seconds)


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


# ---------------------------------------------------------------------------- the sky scenario and the CLI
def test_sky_draws_one_reproducible_slowdown_per_device_within_the_papers_range():
    from harness.scenario import load_scenario

    full = load_scenario("sky")
    slow = [p.slowdown for p in full.profiles]
    assert full.n == 64 and all(1 <= s <= 7 for s in slow) and len(set(slow)) > 32
    assert [p.slowdown for p in load_scenario("sky").profiles] == slow  # seeded
    assert [p.slowdown for p in load_scenario("sky", devices=16).profiles] == slow[:16]  # scaled: the first nodes
    assert {p.gpu for p in full.profiles} == {"P100"}


@pytest.mark.parametrize("draw,field", [
    ("{normal: [4, 1.5], within: [1, 7]}", "device.slowdown.seed: missing"),
    ("{normal: [4], within: [1, 7], seed: 0}", "device.slowdown.normal: must be a list of two numbers"),
    ("{normal: [4, 1], within: [0, 7], seed: 0}", "device.slowdown.within: must be > 0"),
    ("{normal: [4, 1], within: [7, 1], seed: 0}", "device.slowdown: needs std >= 0 and low <= high"),
])
def test_a_bad_slowdown_draw_is_one_line(tmp_path, draw, field):
    from harness.scenario import ScenarioError, load_scenario
    from tests.test_scenario import write

    path = write(tmp_path, f"""\
        name: bad
        device: {{gpu: P100, slowdown: {draw}}}
        regions:
          - {{name: node, devices: 1, count: 4}}
        intra_region: {{delay_ms: 0, bandwidth_gbps: 100}}
        inter_region: {{delay_ms: 0.01, bandwidth_gbps: 100}}
        """)
    with pytest.raises(ScenarioError, match=field) as e:
        load_scenario(str(path))
    assert "\n" not in str(e.value) and "s.yaml" in str(e.value)


def test_the_model_problem_slows_each_device_by_its_penalty_and_puts_the_head_last():
    from harness import compute
    from harness.compute.model import get_model
    from harness.scenario import load_scenario

    topo, cfg = load_scenario("sky", devices=16), get_model("bert-large", 32)
    prob = problem_for(cfg, topo, range(16), 1, 4)
    slow = np.array([p.slowdown for p in topo.profiles])
    assert prob.seconds_per_flop / prob.seconds_per_flop[0] == pytest.approx(slow / slow[0])
    assert prob.block_flop[0] == 4 * compute.block_fwd_flop(cfg, 1)  # forward, backward (2x), recompute
    assert prob.fixed_seconds[-1] > 10 * prob.fixed_seconds[1]  # the LM head rides with the last device
    assert prob.memory[0] < prob.memory[1] > prob.memory[-1]  # embedding first, head and logits last


def test_allocate_cli_prints_every_allocator_and_writes_json(cli, tmp_path):
    out = tmp_path / "a.json"
    rc, text, err = cli("allocate", "--scenario", "sky", "--devices", 16, "--layers", 48, "--time-limit", 10,
                        "--json", out)
    assert rc == 0, err
    docs = {d["allocator"]: d for d in json.loads(out.read_text())}
    assert list(docs) == list(ALLOCATORS) and text.count("<- bottleneck") == 4
    for d in docs.values():
        assert set(d) >= {"allocator", "layers_per_device", "stage_seconds", "iteration_seconds", "solve_seconds"}
        assert sum(d["layers_per_device"]) == 48 and len(d["stage_seconds"]) == 16
        assert max(docs["optimal"]["stage_seconds"]) <= max(d["stage_seconds"]) * (1 + 1e-12)
    # balancing the slow nodes shortens the simulated iteration
    assert docs["optimal"]["iteration_seconds"] < docs["even"]["iteration_seconds"]
    rc, _, err = cli("allocate", "--scenario", "sky", "--devices", 16, "--layers", 8)
    assert rc == 2 and err.count("\n") == 1 and "8 blocks cannot give 16 devices one each" in err


def test_allocate_names_the_device_short_of_memory(cli, tmp_path):
    from tests.test_scenario import write

    path = write(tmp_path, """\
        name: small-memory
        device: {gpu: P100}
        regions:
          - {name: a, devices: 1}
          - {name: b, devices: 1, device: {gpu: tiny-gpu, peak_tflops: 10, memory_gb: 0.05}}
        intra_region: {delay_ms: 0, bandwidth_gbps: 100}
        inter_region: {delay_ms: 0.01, bandwidth_gbps: 100}
        """)
    rc, _, err = cli("allocate", "--scenario", path, "--layers", 8, "--allocator", "optimal")
    assert rc == 2 and err.count("\n") == 1 and "device 1 (tiny-gpu, slowdown 1)" in err


def test_ours_runs_the_allocators_uneven_stages_and_sim_compare_reads_them(cli, tmp_path):
    """Half the devices 4x slower: the optimum gives them fewer blocks, the run trains on those stages
    (records and manifest carry them), and the baselines refuse the flag."""
    from harness.allocation import allocate_stages
    from dataclasses import replace

    from harness.compute.model import get_model
    from harness.compute.profiles import device_profiles
    from harness.results import read_records
    from harness.scenario import load_scenario
    from tests.test_compute_model import SCENARIO
    from tests.test_scenario import write

    scen, scale = write(tmp_path, SCENARIO), 300.0
    rc, out, err = cli("run", "--scenario", scen, "--network", "none", "--d-pp", 4, "--d-dp", 1, "--batch", 4,
                       "--iters", 1, "--scheduler", "identity", "--allocator", "optimal", "--results", tmp_path / "res",
                       "--compute-model", "--compute-time-scale", scale)
    assert rc == 0, err
    run = next((tmp_path / "res" / "half-slow").iterdir())
    stages = [tuple(s) for s in json.loads((run / "manifest.json").read_text())["spec"]["layout"]["stages"]]
    topo = load_scenario(str(scen))
    # the compute model's devices: their profiles times the run's scale (as sim compare predicts them)
    profiles = [replace(p, slowdown=p.slowdown * scale) for p in device_profiles(topo, dtype="fp32")]
    want = allocate_stages("optimal", get_model("tiny"), topo, [[0, 1, 2, 3]], 1, 4, "fp32", False, profiles)
    assert tuple(stages) == want and stages != [(0, 2), (2, 4), (4, 6), (6, 8)]
    blocks = [b - a for a, b in stages]
    assert max(blocks[2:]) < min(blocks[:2])  # the slow devices hold fewer blocks
    assert [tuple(s) for s in json.loads(read_records(run)[0]["config"])["stages"]] == stages
    # sim compare simulates those stages: its busiest device computes what the allocation modelled
    from harness import compute
    from harness.sim.compare import load_measured, simulate_run

    modelled = [4 * sum(compute.rank_phase_seconds(get_model("tiny"), blocks, j, 1, profiles[j], False)[k]
                        for k in ("forward", "backward"))
                + compute.rank_phase_seconds(get_model("tiny"), blocks, j, 1, profiles[j], False)["optimizer"]
                for j in range(4)]
    assert simulate_run(load_measured(tmp_path / "res")[0])[1] == pytest.approx(max(modelled), rel=1e-9)
    rc, _, err = cli("run", "--scenario", scen, "--network", "none", "--system", "megatron", "--allocator", "optimal")
    assert rc == 2 and "--allocator: not an option of --system megatron" in err


def test_sim_allocator_balances_ours_stages_on_sky(cli, tmp_path):
    common = ("sim", "--scenario", "sky", "--devices", 16, "--model", "bert-large", "--layers", 64, "--batch", 16,
              "--system", "ours", "--d-pp", 16, "--budget", 20, "--no-cache")
    seconds = {}
    for name in ("even", "optimal"):
        rc, out, err = cli(*common, "--allocator", name, "--json", tmp_path / f"{name}.json", "--out", tmp_path / name)
        assert rc == 0, err
        best = [d for d in json.loads((tmp_path / f"{name}.json").read_text()) if d["best"]][0]
        seconds[name] = best["seconds"]
        if name == "optimal":
            stages = best["config"]["stages"]
            assert best["config"]["allocator"] == "optimal" and stages[0][0] == 0 and stages[-1][1] == 64
            assert len({b - a for a, b in stages}) > 1  # uneven
        else:
            assert "stages" not in best["config"]  # even runs keep their records as before
    assert seconds["optimal"] < 0.9 * seconds["even"]  # slowdowns over [1, 7]: balancing pays


def test_optimal_counts_cut_dependent_receives_and_per_device_memory_exactly():
    """HetPipe's terms (a CNN's cuts differ in size; earlier stages keep more minibatches): the optimum
    still equals enumeration over the same stage times and memories, and sky's allocators refuse them."""
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(80):
        D = int(rng.integers(2, 5))
        L = int(rng.integers(D, 10))
        base = random_problem(rng, D, L, tight=bool(rng.integers(2)))
        recv = rng.uniform(0, 0.3, (2, D, L + 1))
        per_device = base.block_memory[None, :] * rng.uniform(0.5, 2.0, (D, 1))
        prob = Problem(base.seconds_per_flop, base.block_flop, base.fixed_seconds, base.block_memory, base.memory,
                       receive_seconds=recv, device_block_memory=per_device)
        exact = brute_force(prob)
        if not np.isfinite(exact):
            with pytest.raises(AllocationError):
                allocate("optimal", prob)
            continue
        got = allocate("optimal", prob)
        assert max(got.stage_seconds) == pytest.approx(exact, rel=1e-12)
        counts = got.layers_per_device
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for i in range(D):  # the receive terms are those of the device's own boundaries
            work = prob.seconds_per_flop[i] * prob.block_flop[bounds[i]:bounds[i + 1]].sum() + prob.fixed_seconds[i]
            assert got.stage_seconds[i] == pytest.approx(work + recv[0, i, bounds[i]] + recv[1, i, bounds[i + 1]])
        checked += 1
    assert checked > 30
    for name in ("sky-heuristic", "sky-mip"):
        with pytest.raises(AllocationError, match="use optimal"):
            allocate(name, prob)
