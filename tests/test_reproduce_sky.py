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
