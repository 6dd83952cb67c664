"""`harness reproduce dtfm`: DT-FM's evaluation simulated at the paper's scale, a verdict per claim."""
import csv

import pytest

from harness.reproduce import Context, get, reproduce
from harness.plan.asked import request_of
from harness.reproduce import dtfm


@pytest.fixture
def small(monkeypatch):
    """Two cases (the data center and the world), the smallest and largest setting, a small search budget."""
    monkeypatch.setattr(dtfm, "CASES", ("1", "5"))
    monkeypatch.setattr(dtfm, "LAYERS", (24, 40))
    monkeypatch.setattr(dtfm, "BATCHES", (1024, 4096))
    monkeypatch.setattr(dtfm, "SIM", {"budget": 300})


def test_dtfm_reproduced_end_to_end_writes_every_figures_claims(tmp_path, small):
    said = []
    report = reproduce("dtfm", tmp_path, quick=True, progress=said.append, emulated=False)
    text = report.read_text()
    for fig in ("Fig. 3c", "Fig. 4", "Fig. 5", "Fig. 6", "App. D.5"):
        assert fig in text
    for png in ("fig3-case1.png", "fig3-case5.png", "fig4-case5/compare.png", "fig5-zero3.png", "fig6-case5.png"):
        assert (tmp_path / png).stat().st_size > 0
    rows = {r["claim"]: r for r in csv.DictReader((tmp_path / "claims.csv").open())}
    assert all(r["simulated"] not in ("", "-") for r in rows.values())
    mega = rows["case 5 (world-wide): ours over Megatron (mean PFLOPS)"]
    assert mega["paper"] == "4.8x" and float(mega["simulated"]) > 1  # the world-wide case: ours ahead
    assert float(rows["case 1: ours over Megatron (mean PFLOPS)"]["simulated"]) < float(mega["simulated"])
    assert 0 < float(rows["gpt3-xl (L40, B4096): ours' percent of peak"]["simulated"]) < 100
    assert sum(m.startswith("the five cases") for m in said) == 1  # one sweep for every figure that shows it
    assert get("dtfm").parts[0].name == "fig3c"


def test_the_scheduler_claims_read_the_sweeps_random_assignments(tmp_path, small):
    [s] = dtfm.scheduler(Context(tmp_path))
    top, *cases = s.findings
    assert top.claim.paper == 2.7 and len(cases) == 2
    assert top.simulated >= max(f.simulated for f in cases)  # the largest speedup bounds every case's smallest
    assert all(f.verdict == "holds" for f in cases)  # the scheduled layout is never slower than a random one


def _figures(seconds: dict[str, float], predicted: dict[str, float]) -> dict[str, dict]:
    return {k: {"seconds": v, "measured-over-sim": v / predicted[k], "host-bound": 0.0, "busy": 0.2}
            for k, v in seconds.items()}


def test_a_case_puts_ours_beside_each_tuned_baseline_and_random_layouts():
    """Measured: ours 10 s, ours-random 20 / 30 s, Megatron's two points 40 and 35 s, DeepSpeed's 50 s; the
    tuned Megatron is its fastest run (35 s: 3.5x ours), the scheduler 2.5x random's mean; predicted from each
    run's simulation as it ran."""
    from harness.reproduce import dtfm_emulated as de

    grids = {b: de.tuned_grid(merged_base("5"), b, 2) for b in de.BASELINES}
    mega, deep = grids["megatron"], grids["deepspeed"]
    assert len(mega["run"]) == 2 and len(deep["run"]) == 2
    assert all(mega["predicted"][k] <= min(p for j, p in enumerate(mega["predicted"]) if j not in mega["run"])
               for k in mega["run"])
    m0, m1 = (f"megatron {mega['labels'][k]}" for k in mega["run"])
    d0, d1 = (f"deepspeed {deep['labels'][k]}" for k in deep["run"])
    measured = {"ours": 10.0, "ours-random 2022": 20.0, "ours-random 2023": 30.0, m0: 40.0, m1: 35.0, d0: 50.0,
                d1: 60.0}
    predicted = {**measured, "ours": 12.0, m1: 30.0}
    s = de.case_section("5", _figures(measured, predicted), grids)
    found = {f.claim.text: f for f in s.findings}
    mf = found["case 5: ours over Megatron tuned (seconds an iteration)"]
    assert (mf.measured, mf.simulated) == pytest.approx((3.5, min(30.0, 40.0) / 12.0))
    assert mf.claim.paper == 4.8 and mega["labels"][mega["run"][1]] in mf.note
    df = found["case 5: ours over DeepSpeed tuned (seconds an iteration)"]
    assert (df.measured, df.simulated) == pytest.approx((5.0, 50.0 / 12.0))
    rf = next(f for t, f in found.items() if "random layouts" in t)
    assert (rf.measured, rf.simulated) == pytest.approx((2.5, 25.0 / 12.0)) and "2022, 2023" in rf.claim.text
    tp = next(f for t, f in found.items() if "tensor parallelism" in t)
    assert tp.measured == mega["tp"][mega["run"][1]] and tp.simulated == mega["tp"][mega["run"][0]]
    for label in mega["labels"]:
        assert f"| {label} |" in s.text
    assert "not run |" in s.text and "| ours | 10.000 | 12.000 |" in s.text


def merged_base(case: str) -> dict:
    from harness.plan.asked import merged
    from harness.reproduce import dtfm_emulated as de

    return merged(de.BASE, {"network": {"scenario": case}, "run": {"iters": 1, "warmup": 1}})


def test_the_emulated_part_boots_once_a_case_with_every_run_of_it(tmp_path, monkeypatch):
    import harness.regress
    from harness.plan.request import RunRequest
    from harness.reproduce import dtfm_emulated as de

    booted = []

    def emulate(ctx, what, asked):
        booted.append(asked)
        return {k: tmp_path / k for k in asked}

    monkeypatch.setattr(de, "emulate", emulate)
    monkeypatch.setattr(harness.regress, "run_figures",
                        lambda run: {"seconds": 1.0 + len(run.name), "measured-over-sim": 1.0, "host-bound": 0.0})
    monkeypatch.setattr(de, "busy", lambda run: 0.1)
    [s] = de.emulated(Context(tmp_path, quick=True))
    [asked] = booted
    assert list(asked) == ["ours", "ours-random 2022"]  # QUICK: the scheduler against one random layout
    reqs = [request_of(a) for a in asked.values()]
    assert {r.network.scenario for r in reqs} == {"5"} and {r.run.iters for r in reqs} == {1}
    assert reqs[1].model.seed == 2022 and reqs[1].run.system == "ours-random"
    assert all(r.compute.model and r.network.bandwidth_scale == 0.01 and r.model.layers == 4 for r in reqs)
    assert "Case 5" in s.title and [f.measured_verdict for f in s.findings] == ["not run", "not run", "holds",
                                                                                 "not run"]
    assert "QUICK runs no baseline" in s.findings[0].note
    booted.clear()
    assert len(de.emulated(Context(tmp_path))) == len(de.CASES) == len(booted)
    ours = 1 + len(de.RANDOM_SEEDS)  # every case: each baseline's fastest predicted, and at most BUDGET points
    assert all(ours + 2 <= len(b) <= ours + 2 * de.BUDGET for b in booted)
    assert len(booted[0]) < len(booted[-1]) == ours + 2 * de.BUDGET  # case 1's second DeepSpeed point: over 2x
    reqs = [a if isinstance(a, RunRequest) else request_of(a) for a in booted[-1].values()]
    assert [r.run.system for r in reqs] == (["ours"] + ["ours-random"] * len(de.RANDOM_SEEDS) + ["megatron"] * de.BUDGET
                                            + ["deepspeed"] * de.BUDGET)
    assert {r.layout.explicit.placement for r in reqs[4:]} == {"seed-2022"}
