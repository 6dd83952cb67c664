"""`harness reproduce owl`: OWL's evaluation simulated at the paper's scale, a verdict per claim."""
import csv
from pathlib import Path

import pytest

from harness.reproduce import Context, get, reproduce
from harness.reproduce import owl
from harness.workloads.fl import strategies as st


def test_eq_15_is_the_ratio_of_eqs_13_and_14():
    S, B_intra = 170e6, 10e9 / 8
    for alpha in (0.2, 0.5, 1.0):
        for n, D in ((2, 1), (4, 2), (8, 4), (8, 8)):
            B_inter = alpha * B_intra
            t_ce = S / B_inter + (n * S / D - S) / B_intra  # eq. 13
            t_de = n * S / (B_inter * D)  # eq. 14, M_r = D_r groups
            assert st.eq15(alpha, D, n) == pytest.approx(t_ce / t_de)
    assert st.eq15(0.5, 8, 8) == 1.0 and st.eq15(0.2, 4, 8) < st.eq15(0.5, 4, 8) < 1


def test_the_deployment_part_puts_each_simulated_ratio_beside_eq_15(tmp_path):
    [s] = owl.deployment(Context(tmp_path))
    assert len(s.findings) == 6
    for f in s.findings:
        label, alpha = f.claim.text.split(",")[0], float(f.claim.text.split("alpha ")[1].split(":")[0])
        D = int(f.claim.text.split("D = ")[1].split(" ")[0])
        n = {"4x20": 4, "8x10": 8}[label]
        assert f.claim.paper == pytest.approx(st.eq15(alpha, D, n))
        assert 0 < f.simulated < 1  # centralized is the faster (the paper's direction), here by more than eq. 15


def test_owl_reproduced_end_to_end_writes_every_figures_claims(tmp_path, monkeypatch):
    monkeypatch.setattr(owl, "WORKERS", (4, 10, 20))  # the shape of the paper's 10..100, smaller
    monkeypatch.setattr(owl, "ALPHAS", (0.2, 1.0))
    monkeypatch.setattr(owl, "OWL_B_SEEDS", range(2))
    said = []
    report = reproduce("owl", tmp_path, quick=True, progress=said.append, emulated=False)
    text = report.read_text()
    for fig in ("Fig. 7", "Fig. 8a", "Fig. 8b", "Fig. 9", "Fig. 10a", "Fig. 10b", "Fig. 11", "eqs. 13-15"):
        assert fig in text
    for png in ("fig7.png", "fig8b.png", "fig9.png", "fig11.png"):
        assert (tmp_path / png).stat().st_size > 0
    rows = list(csv.DictReader((tmp_path / "claims.csv").open()))
    assert len(rows) > 30 and all(r["simulated"] not in ("", "-") for r in rows)
    oos = [r for r in rows if "offline optimum" in r["claim"]]
    assert len(oos) == 2 and all(float(r["simulated"]) >= 0 for r in oos)  # OOS bounds OWL from below
    assert any(m.startswith("[1/7]") for m in said)
    assert get("owl").parts[0].name == "fig7" and "`--no-emulated`" in text  # the measured part named as left out


def test_owl_is_a_make_target():
    make = Path(__file__).resolve().parents[1] / "Makefile"
    lines = make.read_text().splitlines()
    assert any(line.startswith("REPRODUCE_PAPERS :=") and "owl" in line.split() for line in lines)


def test_the_emulated_part_puts_each_measured_round_beside_its_prediction(tmp_path, monkeypatch):
    """The boots faked: each run's records are the simulator's rounds at the run's scales, every measured round
    `slower` times its prediction, so the claims' two columns and emu.md's errors are known."""
    from dataclasses import replace

    from harness.reproduce import owl_emulated as oe
    from harness.systems.owl.emulated import emulated_federation
    from harness.workloads.fl import strategies as st
    from harness.workloads.fl.records import to_record

    slower, scale, compute = {"naive": 1.0, "owl": 1.25}, 0.001, 500.0
    runs = []

    def fake(topo, feds, model, names, batch, setting, out, *, run_id, finish=None, **_):
        runs.append(topo.name)
        recs = []
        for fed in feds:
            sc = emulated_federation(fed, scale, compute)
            recs += [replace(to_record(st.run(n, model, sc, batch), run_id=run_id, fed=fed, model=model, batch=batch),
                             backend="emu", bandwidth_scale=scale, compute_time_scale=compute, cpu_busy=0.2)
                     for n in names if n != "optimal"]  # no claim reads optimal, whose search is long
        recs = [replace(r, seconds=r.seconds * slower.get(r.strategy, 1.1),
                        distribution_seconds=r.distribution_seconds * slower.get(r.strategy, 1.1)) for r in recs]
        head = {"line": "emulated CPU 20% busy over the rounds: measured the network"}
        finish(recs, setting, head)
        return recs, setting, head

    monkeypatch.setattr(oe, "run_recorded", fake)
    [s] = oe.emulated(Context(tmp_path, quick=True))
    assert runs == ["owl-regional"] and "QUICK: the geo-distributed federation only" in s.text
    [naive, ipart] = s.findings
    assert naive.measured == pytest.approx(naive.simulated * 1.25)  # OWL's round measured 1.25 x its prediction
    assert ipart.measured == pytest.approx(ipart.simulated * 1.25 / 1.1)
    assert naive.simulated < 1  # the simulator puts OWL ahead of naive on the regional federation
    table = (tmp_path / "emu.md").read_text()
    assert any(line.startswith("| regional | mini-inception |") and "| owl | " in line and "-20.0%" in line
               for line in table.splitlines())
    assert (tmp_path / "emu" / "regional" / "records.json").exists()
    [full] = oe.emulated(Context(tmp_path / "full"))
    assert runs[1:] == ["owl-testbed", "owl-8x10", "owl-norack", "owl-regional"] + ["owl-testbed"] * 3
    by = {f.claim.text.split(":")[0].split(" (")[0] + " " + f.claim.figure: [] for f in full.findings}
    for f in full.findings:
        by[f.claim.text.split(":")[0].split(" (")[0] + " " + f.claim.figure].append(f)
    assert [len(by[k]) for k in ("testbed Fig. 7", "8x10 Fig. 10a", "8x10 Fig. 10b", "8x10 Sec. 4.4",
                                 "norack Fig. 11", "regional beyond the paper", "alpha Fig. 9", "workers-4 Fig. 7",
                                 "workers-20 Fig. 7", "testbed Fig. 8a", "testbed Fig. 8b")
            ] == [2, 2, 2, 1, 2, 2, 3, 1, 1, 1, 1]
    [share], [busy], owl_naive = by["testbed Fig. 8a"], by["testbed Fig. 8b"], by["testbed Fig. 7"][0]
    assert 0 < share.simulated < share.measured < 100  # OWL's round measured longer: more of it communication
    assert busy.simulated > 1 and busy.measured == pytest.approx(1 / owl_naive.measured)  # naive: the fastest
    [widens] = [f for f in full.findings if "widens with the workers" in f.claim.text]
    most, four = by["workers-20 Fig. 7"][0], by["workers-4 Fig. 7"][0]  # OWL's round / naive's at 20 and 4 workers
    assert widens.simulated == pytest.approx(most.simulated / four.simulated) and widens.simulated < 1
    assert widens.measured == pytest.approx(most.measured / four.measured)
    owl_a, owl_b = by["8x10 Fig. 10b"]
    assert owl_a.measured == pytest.approx(owl_a.simulated * 1.1 / 1.25) and owl_a.simulated > 1  # one relay: slower
    [ce_de] = by["8x10 Sec. 4.4"]
    assert ce_de.measured == pytest.approx(ce_de.simulated * 1.25 / 1.1) and ce_de.simulated < 1
    assert ce_de.claim.paper is None or 0.5 < ce_de.claim.paper < 1  # eq. 15 at alpha 0.5, D < n
    at_02, at_1, widens = by["alpha Fig. 9"]
    assert "alpha 0.2" in at_02.claim.text and at_02.simulated > 0 and widens.simulated == pytest.approx(
        at_02.simulated - at_1.simulated)
    assert "| alpha | tiny | 0.2 | owl |" in (tmp_path / "full" / "emu.md").read_text()
