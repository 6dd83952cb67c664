"""`harness reproduce sky`: Sky Computing's evaluation simulated at the paper's scale, a verdict per claim."""
import csv
from pathlib import Path

import pytest

from harness.reproduce import get, reproduce
from harness.reproduce import sky
from harness.scenario import load_scenario


def test_the_server_holds_no_blocks_and_the_first_draw_is_the_scenarios_own():
    topo = sky.topology(16, sky.DRAWS[0])
    assert topo.n == 15  # Sec. VI-A: D - 1 devices train
    assert [p.slowdown for p in topo.profiles] == [p.slowdown for p in load_scenario("sky", 16).profiles[1:]]
    other = [p.slowdown for p in sky.topology(16, sky.DRAWS[1]).profiles]
    assert other != [p.slowdown for p in topo.profiles] and all(1 <= x <= 7 for x in other)


def test_a_pass_through_the_devices_is_the_simulated_iteration_less_the_optimizer():
    """One batch, no micro-batches: the simulator's iteration is the forward pass, the backward pass (twice its
    compute: no recomputation) and the optimizer step; the split reproduces it from the same compute model."""
    from harness.allocation import allocate, problem_for
    from harness.systems.ours.sim import simulate_allocation

    topo, cfg = sky.topology(8, 2022), sky.model(14)
    problem = problem_for(cfg, topo, list(range(topo.n)), sky.BATCH, 1, sky.DTYPE, recompute=False)
    for name in ("even", "optimal"):
        a = allocate(name, problem)
        fwd, bwd = sky.sequential_passes(cfg, topo, list(range(topo.n)), a.stages)
        it = simulate_allocation(cfg, topo, list(range(topo.n)), a, sky.BATCH, sky.BATCH, sky.DTYPE, recompute=False)
        assert 1.9 < bwd / fwd < 2.0  # backward is two forwards of compute, the sends the same each way
        assert 0.9 * it < fwd + bwd < it


def test_every_allocator_solves_one_setting_and_the_optimum_bounds_the_others():
    p = sky.solve(8, 14, 2023, ("even", "sky-heuristic", "sky-mip", "optimal"))
    assert p.bottleneck["optimal"] == pytest.approx(p.bottleneck["sky-mip"], rel=1e-6)  # the same program, solved
    assert p.bottleneck["optimal"] <= min(p.bottleneck.values()) * (1 + 1e-9)
    assert p.cut("optimal") > 0 and p.cut("even") == 0


def test_sky_reproduced_end_to_end_writes_every_figures_claims(tmp_path, monkeypatch):
    monkeypatch.setattr(sky, "NODES", (4, 8, 16))  # the shape of the paper's 16..64, smaller
    monkeypatch.setattr(sky, "STRONG_LAYERS", 16)
    monkeypatch.setattr(sky, "WEAK_LAYERS", {4: 8, 8: 16, 16: 32})
    monkeypatch.setattr(sky, "DRAWS", (2022, 2023))
    said = []
    report = reproduce("sky", tmp_path, quick=True, progress=said.append, emulated=False)
    text = report.read_text()
    for fig in ("Fig. 9", "Fig. 10", "Fig. 11", "Sec. IV", "Abstract"):
        assert fig in text
    for png in ("fig10.png", "fig11.png"):
        assert (tmp_path / png).stat().st_size > 0
    rows = list(csv.DictReader((tmp_path / "claims.csv").open()))
    assert len(rows) == 6 + 5 + 6 + 2 and all(r["simulated"] not in ("", "-") for r in rows)
    cuts = [r for r in rows if "cuts even allocation" in r["claim"]]
    assert all(float(r["simulated"]) >= 0 for r in cuts)  # no balanced allocation is slower than even's
    assert sum("sky-mip on" in m for m in said) == 5  # the paper's program on every setting, once
    assert sum("over 2 draws" in m for m in said) == 5  # each setting solved once for every figure showing it
    assert get("sky").parts[0].name == "fig9"


def test_sky_is_a_make_target():
    make = Path(__file__).resolve().parents[1] / "Makefile"
    lines = make.read_text().splitlines()
    assert any(line.startswith("REPRODUCE_PAPERS :=") and "sky" in line.split() for line in lines)


def test_the_settings_name_what_the_paper_leaves_open():
    names = {s.name for s in get("sky").settings}
    assert {"penalty factors", "the network", "the batch", "the server"} <= names


def test_each_network_puts_the_allocators_runs_beside_their_predictions():
    """Measured 10, 8, 7, 7 s (even, heuristic, sky-mip, optimal), predicted 9.5, 8, 7, 7.1: the heuristic cuts
    even's time by 20 % measured and 15.8 % predicted; the optimum by 30 % and 25.3 %; the heuristic is 14.3 %
    and 12.7 % above the optimum (the paper's 10 % differs); sky-mip trains as fast as the optimum."""
    from harness.reproduce import sky_emulated

    m = {"even": 10.0, "sky-heuristic": 8.0, "sky-mip": 7.0, "optimal": 7.0}
    p = {"even": 9.5, "sky-heuristic": 8.0, "sky-mip": 7.0, "optimal": 7.1}
    runs = {a: {"seconds": m[a], "measured-over-sim": m[a] / p[a], "host-bound": 0.0, "busy": 0.3,
                "blocks": [2] * 8} for a in m}
    s = sky_emulated.network_section("LAN", "sky", runs)
    got = [(f.measured, f.simulated) for f in s.findings]
    assert got == [pytest.approx((20.0, 100 * (1 - 8 / 9.5))), pytest.approx((30.0, 100 * (1 - 7.1 / 9.5))),
                   pytest.approx((100 * (8 / 7 - 1), 100 * (8 / 7.1 - 1))), pytest.approx((1.0, 7 / 7.1))]
    assert [f.measured_verdict for f in s.findings] == ["holds", "holds", "differs", "holds"]
    assert "| sky-mip | 7.000 | 7.000 | +0.0% | 30% | 0 |" in s.text and "even 2/2/2/2/2/2/2/2" in s.text
    del runs["optimal"]  # a run that did not finish leaves its claims not run
    assert [f.verdict for f in sky_emulated.network_section("LAN", "sky", runs).findings] == [
        "holds", "not run", "not run", "not run"]


def _fake_run(path, stages, rank_compute, time_scale=1.0):
    """A run directory as the emulated cluster leaves one: its records' layout (pipeline in device order) and each
    rank's computation an iteration."""
    import csv
    import json

    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps(
        {"compute_model": {"time_scale": time_scale, "rank_compute_seconds": list(rank_compute)}}))
    config = {"mesh": [[[d]] for d in range(len(stages))], "stages": [list(x) for x in stages]}
    with (path / "records.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "scenario", "system", "backend", "devices", "seconds", "config"])
        w.writerow(["r", "sky", "ours", "emu", len(stages), 1.0, json.dumps(config)])
    return path


def test_the_benchmark_stage_measures_each_device_and_the_allocators_follow_it(tmp_path):
    """Ranks that took exactly their profiles' time give the profiles' allocation back; a device measured twice as
    slow as its profile (a GPU shared with another job) is given fewer blocks."""
    from harness import compute as work
    from harness.allocation import allocate, problem_for
    from harness.compute.model import get_model
    from harness.compute.profiles import device_profiles
    from harness.reproduce import sky_emulated as se

    even = [(2 * k, 2 * k + 2) for k in range(8)]
    cfg, profiles = get_model("tiny", se.LAYERS), device_profiles(load_scenario("sky", 8), dtype="fp32")
    modelled = [sum(work.rank_phase_seconds(cfg, [2] * 8, k, se.BATCH, profiles[k], recompute=False).values())
                for k in range(8)]
    pipeline, measured, model = se.benchmark("sky", _fake_run(tmp_path / "a", even, [10 * m for m in modelled], 10))
    assert pipeline == list(range(8)) and measured == pytest.approx(model)
    ran = list(allocate("optimal", problem_for(cfg, load_scenario("sky", 8), pipeline, se.BATCH, 1, "fp32",
                                               recompute=False)).layers_per_device)
    runs = {"optimal": {"blocks": ran}}
    assert f"optimal {'/'.join(map(str, ran))} (as ran)" in se.benchmark_text("sky", tmp_path / "a", runs)
    fast = int(min(range(8), key=lambda d: profiles[d].slowdown))
    slowed = [m * (2 if d == fast else 1) for d, m in enumerate(modelled)]
    text = se.benchmark_text("sky", _fake_run(tmp_path / "b", even, slowed), runs)
    got = [int(x) for x in text.split("; optimal ")[1].split(" ")[0].split("/")]
    assert got[fast] < ran[fast] and sum(got) == se.LAYERS and f"| {fast} | 1 | " in text


def test_the_emulated_part_runs_every_allocator_on_one_pipeline_a_boot_per_network(tmp_path, monkeypatch):
    import harness.regress
    from harness.plan.asked import request_of
    from harness.reproduce import Context, sky_emulated

    booted = []

    def emulate(ctx, what, asked):
        booted.append(asked)
        for a in asked.values():
            request_of(a)  # every run a valid request
        stages = [(0, 3)] + [(k, k + 2) for k in range(3, 15, 2)] + [(15, 16)]
        return {k: _fake_run(tmp_path / f"run{len(list(tmp_path.glob('run*')))}", stages, [1.0] * 8) for k in asked}

    monkeypatch.setattr(sky_emulated, "emulate", emulate)
    monkeypatch.setattr(harness.regress, "run_figures",
                        lambda run: {"seconds": 1.0, "measured-over-sim": 1.0, "host-bound": 0.0})
    monkeypatch.setattr(sky_emulated, "benchmark_text", lambda *a: "the benchmark")
    sections = sky_emulated.emulated(Context(tmp_path, quick=True))
    assert len(booted) == 1 and len(sections) == 1 and "even 3/2/2/2/2/2/2/1" in sections[0].text
    assert sections[0].text.endswith("the benchmark")
    [asked] = booted
    assert list(asked) == ["even", "sky-heuristic", "sky-mip", "optimal"]
    assert {a["layout"]["allocator"] for a in asked.values()} == set(asked)
    assert all(a["layout"]["pp"] == 8 and a["layout"]["dp"] == 1 and a["model"]["micro_batch"] == a["model"]["batch"]
               and a["network"]["scenario"] == "sky" and a["run"]["iters"] == 1 for a in asked.values())
    booted.clear()
    assert len(sky_emulated.emulated(Context(tmp_path))) == 2
    assert [next(iter(b.values()))["network"]["scenario"] for b in booted] == ["sky", "sky-worldwide"]
