"""`harness reproduce dtfm`: DT-FM's evaluation simulated at the paper's scale, a verdict per claim."""
import csv

import pytest

from harness.reproduce import Context, get, reproduce
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
