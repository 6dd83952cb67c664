"""The regression gate (issue 23): figures, baseline, comparison, history, CLI."""
import json

import pytest

from harness import regress
from harness.regress import Figure, RegressError, Suite

SMALL = Suite(cases=(1, 4), devices=8, budget=40)


@pytest.fixture
def small_suite(monkeypatch):
    monkeypatch.setattr(regress, "SUITE", SMALL)
    return SMALL


def test_compare_fails_on_any_exact_change_and_on_a_missing_figure():
    base = {f.name: f for f in (Figure("a", 1.0, "s"), Figure("b", 2.0, "s"), Figure("c", 3.0, "s"),
                                Figure("gone", 4.0, "s"))}
    now = [Figure("a", 1.0 * (1 + 1e-12), "s"), Figure("b", 2.02, "s"), Figure("c", 2.97, "s"), Figure("d", 1.0, "s")]
    rows = {r.figure: r for r in regress.compare(base, now)}
    assert rows["a"].verdict == "ok" and not rows["a"].fails  # float rounding
    assert rows["b"].verdict == "regressed" and rows["b"].change == pytest.approx(0.01)
    assert rows["c"].verdict == "changed" and rows["c"].fails  # faster, but unexplained: owned by a renewal
    assert rows["d"].verdict == "new" and not rows["d"].fails
    assert rows["gone"].verdict == "missing" and rows["gone"].fails
    table = regress.format_table(list(rows.values()))
    assert "REGRESSED" in table and "+1.00%" in table and "MISSING" in table


def test_exact_figures_are_deterministic_and_a_slower_network_regresses_every_one(monkeypatch):
    first = regress.exact_figures(SMALL)
    assert [f.name for f in first][:2] == ["case-1/schedule/comm-cost", "case-1/sim/ours"]
    assert {f.name.split("/")[-1] for f in first} >= {"comm-cost", "ours", "megatron", "deepspeed"}
    again = regress.exact_figures(SMALL)
    assert all(r.verdict == "ok" for r in regress.compare({f.name: f for f in first}, again))

    import harness.scenario as scenario

    load = scenario.load_scenario
    monkeypatch.setattr(scenario, "load_scenario", lambda *a, **k: load(*a, **k).scaled(0.98))  # links 2 % slower
    slower = regress.exact_figures(SMALL)
    rows = regress.compare({f.name: f for f in first}, slower)
    comm = [r for r in rows if r.figure.endswith("comm-cost")]
    assert comm and all(r.verdict == "regressed" and r.change > 0.005 for r in comm)
    assert any(r.verdict == "regressed" for r in rows if "/sim/" in r.figure)


def test_baseline_round_trip_and_one_line_errors(tmp_path):
    path = tmp_path / "baseline.json"
    figs = [Figure("x", 1.5, "s"), Figure("y", 2.5, "s/iter")]
    regress.write_baseline(path, figs, SMALL)
    doc = json.loads(path.read_text())
    assert {"commit", "machine", "versions", "suite"} <= set(doc) and doc["machine"]["cpus"] >= 1
    assert regress.read_baseline(path, SMALL) == {f.name: f for f in figs}
    with pytest.raises(RegressError, match=r"suite: recorded for"):
        regress.read_baseline(path, Suite())
    with pytest.raises(RegressError, match=r"missing; renew it with `harness regress --update-baseline`"):
        regress.read_baseline(tmp_path / "none.json", SMALL)
    path.write_text("{not json")
    with pytest.raises(RegressError, match=r"unreadable"):
        regress.read_baseline(path, SMALL)
    path.write_text(json.dumps({**doc, "figures": {"x": {"unit": "s"}}}))
    with pytest.raises(RegressError, match=r"figures.x: expected value and unit"):
        regress.read_baseline(path, SMALL)


def test_cli_missing_baseline_is_one_line_and_writes_nothing(cli, tmp_path):
    rc, out, err = cli("regress", "--baseline", str(tmp_path / "b.json"), "--history", str(tmp_path / "h.jsonl"))
    assert rc == 2 and "baseline" in err and "--update-baseline" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "h.jsonl").exists()


def test_cli_update_then_gate_passes_then_catches_a_planted_change(cli, tmp_path, small_suite, monkeypatch):
    base, hist = tmp_path / "b.json", tmp_path / "h.jsonl"
    rc, out, err = cli("regress", "--update-baseline", "--baseline", str(base))
    assert rc == 0 and base.exists() and not hist.exists()
    rc, out, err = cli("regress", "--baseline", str(base), "--history", str(hist))
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["figure", "unit", "baseline", "now", "change", "verdict"]
    assert "figures ok" in out

    import harness.scenario as scenario

    load = scenario.load_scenario
    monkeypatch.setattr(scenario, "load_scenario", lambda *a, **k: load(*a, **k).scaled(0.95))
    rc, out, err = cli("regress", "--baseline", str(base), "--history", str(hist))
    assert rc == 1 and "REGRESSED" in out and "case-1/schedule/comm-cost" in err
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert [x["failed"] for x in lines] == [False, True] and len(lines[0]["figures"]) > 4

    png = tmp_path / "h.png"
    rc, out, err = cli("regress", "history", "--history", str(hist), "--out", str(png))
    assert rc == 0 and png.stat().st_size > 1000 and "2 runs" in out
    hist.write_text(hist.read_text() + "[1]\n")
    rc, out, err = cli("regress", "history", "--history", str(hist), "--out", str(png))
    assert rc == 2 and "h.jsonl:3" in err
