"""The regression gate (issue 23): figures, baseline, comparison, history, CLI."""
import json
from dataclasses import replace

import pytest

from harness import regress
from harness.regress import Figure, RegressError, Suite

from .test_scenario import write

SMALL = Suite(cases=(1, 4), devices=8, budget=40, wire=())  # bytes on the wire: their own test
FOUR = """
name: four
regions:
  - {name: a, devices: 4, device: {gpu: V100}}
intra_region: {delay_ms: 1, bandwidth_gbps: 10}
inter_region: {delay_ms: 1, bandwidth_gbps: 10}
"""


@pytest.fixture
def small_suite(monkeypatch):
    monkeypatch.setattr(regress, "SUITE", SMALL)
    return SMALL


def test_compare_fails_on_any_exact_change_and_on_a_missing_figure():
    base = {f.name: f for f in (Figure("a", 1.0, "s"), Figure("b", 2.0, "s"), Figure("c", 3.0, "s"),
                                Figure("gone", 4.0, "s"))}
    now = [Figure("a", 1.0 * (1 + 1e-12), "s"), Figure("b", 2.02, "s"), Figure("c", 2.97, "s"), Figure("d", 1.0, "s"),
           Figure("e", 1e6 + 16, "B/iter")]
    base["e"] = Figure("e", 1e6, "B/iter")
    rows = {r.figure: r for r in regress.compare(base, now)}
    assert rows["a"].verdict == "ok" and not rows["a"].fails  # float rounding
    assert rows["b"].verdict == "regressed" and rows["b"].change == pytest.approx(0.01)
    assert rows["c"].verdict == "changed" and rows["c"].fails  # faster, but unexplained: owned by a renewal
    assert rows["d"].verdict == "new" and not rows["d"].fails
    assert rows["gone"].verdict == "missing" and rows["gone"].fails
    table = regress.format_table(list(rows.values()))
    assert "REGRESSED" in table and "+1.00%" in table and "MISSING" in table
    assert rows["e"].verdict == "regressed" and "+2e-03%" in table  # 16 bytes more: shown, not +0.00%


def test_measured_figures_fail_only_beyond_their_noise_and_absolute_times_only_on_their_machine():
    base = {"r": Figure("r", 1.0, "ratio", "measured", True, (1.0, 1.02, 0.98)),
            "t": Figure("t", 2.0, "s/iter", "absolute", True, (2.0, 2.04, 1.96)),
            "q": Figure("q", 1.0, "ratio", "measured", True, (1.0,))}
    noise = regress.noise_threshold(base["r"], Figure("r", 1.1, "ratio", "measured", True, (1.1,)))
    assert noise == pytest.approx(6.965 * 0.02 * (1 / 3 + 1) ** 0.5, rel=1e-3)  # t(0.99, 2 dof) x s x sqrt(1/n + 1)
    verdicts = lambda now, same=True: {r.figure: r.verdict for r in regress.compare(base, now, same)}  # noqa: E731
    fig = lambda n, v: Figure(n, v, "x", "measured", True, (v,))  # noqa: E731
    assert verdicts([fig("r", 1.15), fig("t", 2.3), fig("q", 1.0)]) == {"r": "ok", "t": "ok", "q": "missing"}
    assert verdicts([fig("r", 1.17), fig("t", 2.4)])["r"] == "regressed"
    assert verdicts([fig("r", 0.8), fig("t", 2.4)], same=False) == {"r": "improved", "t": "other machine",
                                                                     "q": "missing"}
    assert verdicts([fig("t", 2.4)])["t"] == "regressed"


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


def test_a_host_bound_figure_is_marked_and_never_a_baseline(tmp_path):
    """Runs whose emulated CPU bounded their iterations measured the host: the gate's table says so beside the
    figure, and a baseline refuses them in one line, writing nothing."""
    base = {"r": Figure("r", 1.0, "ratio", "measured", True, (1.0, 1.02, 0.98))}
    now = [Figure("r", 1.01, "ratio", "measured", True, (1.01,), host_bound=1)]
    rows = regress.compare(base, now)
    assert rows[0].host_bound == 1 and "measured the host: 1 host-bound run(s)" in regress.format_table(rows)
    assert "measured the host" not in regress.format_table(regress.compare(base, [replace(now[0], host_bound=0)]))
    path = tmp_path / "baseline.json"
    with pytest.raises(RegressError, match=r"r: 1 of its runs were host-bound.*not a baseline"):
        regress.write_baseline(path, [Figure("x", 1.0, "s"), now[0]], SMALL)
    assert not path.exists()
    regress.write_baseline(path, [Figure("x", 1.0, "s"), replace(now[0], host_bound=0)], SMALL)
    assert "host_bound" not in json.loads(path.read_text())["figures"]["r"]


def test_cli_missing_baseline_or_bad_debug_is_one_line_and_writes_nothing(cli, tmp_path):
    rc, out, err = cli("regress", "--baseline", str(tmp_path / "b.json"), "--history", str(tmp_path / "h.jsonl"))
    assert rc == 2 and "baseline" in err and "--update-baseline" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "h.jsonl").exists()
    rc, out, err = cli("regress", "--debug", "nonsense=1", "--baseline", str(tmp_path / "b.json"))
    assert rc == 2 and "--debug" in err and "nonsense" in err


def test_cli_update_then_gate_passes_then_catches_a_planted_change(cli, tmp_path, small_suite, monkeypatch):
    base, hist = tmp_path / "b.json", tmp_path / "h.jsonl"
    rc, out, err = cli("regress", "--quick", "--update-baseline", "--baseline", str(base))
    assert rc == 0 and base.exists() and not hist.exists()
    # a renewal of the exact figures keeps the baseline's measured ones
    doc = json.loads(base.read_text())
    doc["figures"]["emulated/ours/seconds"] = {"value": 2.0, "unit": "s/iter", "kind": "absolute",
                                               "samples": [2.0, 2.1]}
    measured_on = {**doc["machine"], "cpu": "another CPU"}
    base.write_text(json.dumps({**doc, "machine": measured_on}))
    rc, out, err = cli("regress", "--quick", "--update-baseline", "--baseline", str(base))
    renewed = json.loads(base.read_text())
    # and the machine they were measured on: a time is compared on that machine only
    assert rc == 0 and "emulated/ours/seconds" in renewed["figures"] and renewed["machine"] == measured_on
    base.write_text(json.dumps({**renewed, "machine": doc["machine"]}))
    rc, out, err = cli("regress", "--quick", "--baseline", str(base), "--history", str(hist))
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["figure", "unit", "baseline", "now", "change", "noise", "verdict"]
    assert "emulated" not in out  # --quick runs no emulation: its figures are neither compared nor missing
    assert "figures ok" in out

    import harness.scenario as scenario

    load = scenario.load_scenario
    monkeypatch.setattr(scenario, "load_scenario", lambda *a, **k: load(*a, **k).scaled(0.95))
    rc, out, err = cli("regress", "--quick", "--baseline", str(base), "--history", str(hist))
    assert rc == 1 and "REGRESSED" in out and "case-1/schedule/comm-cost" in err
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert [x["failed"] for x in lines] == [False, True] and len(lines[0]["figures"]) > 4

    png = tmp_path / "h.png"
    rc, out, err = cli("regress", "history", "--history", str(hist), "--png", str(png))
    assert rc == 0 and png.stat().st_size > 1000 and "2 runs" in out
    hist.write_text(hist.read_text() + "[1]\n")
    rc, out, err = cli("regress", "history", "--history", str(hist), "--png", str(png))
    assert rc == 2 and "h.jsonl:3" in err


def test_measured_figures_from_repeated_runs_and_a_planted_delay_is_caught(tmp_path):
    """The measured suite's machinery on loopback (no shaping): one sample per run, the ratios of
    ours to ours-random and to the simulator; a planted send delay moves ours' seconds beyond its noise."""
    scenario = write(tmp_path, FOUR)
    asked = {"network": {"mode": "none", "scenario": str(scenario)}, "model": {"name": "tiny", "layers": 4, "batch": 8},
             "run": {"iters": 2, "warmup": 1}}
    systems = {"ours": {}, "ours-random": {"model": {"seed": 2022}}}
    base = regress.measured_figures(tmp_path / "a", asked=asked, systems=systems, repeats=3)
    names = {f.name: f for f in base}
    assert set(names) >= {"emulated/ours/seconds", "emulated/ours/measured-over-sim",
                          "emulated/ours/measured-over-comm-bound", "emulated/ours-random/seconds",
                          "emulated/ours-over-ours-random"}
    assert all(len(f.samples) == 3 and f.value == pytest.approx(sum(f.samples) / 3) for f in base)
    seconds = names["emulated/ours/seconds"]
    # 2 x 2 devices, 4 micro-batches a replica: every iteration's critical path holds the first stage's
    # 4 activation sends and the last stage's 4 gradient sends, each delayed; by enough to be beyond
    # the baseline's noise with a margin (a busy machine spreads the baseline's runs)
    noise = regress.noise_threshold(seconds, Figure(seconds.name, 0.0, seconds.unit, samples=(0.0,)))  # vs 1 run
    delay = max(0.25, 1.5 * seconds.value * (1 + noise) / 8)
    assert delay < 2.5, f"the baseline's runs spread too much to plant a delay: {seconds.samples}"
    slow = regress.measured_figures(tmp_path / "b", debug=(f"send_delay_s={delay}",), asked=asked,
                                    systems={"ours": systems["ours"]}, repeats=1)
    row = {r.figure: r for r in regress.compare({f.name: f for f in base}, slow)}["emulated/ours/seconds"]
    assert row.now >= 8 * delay > seconds.value
    assert row.verdict == "regressed"


def test_bytes_on_the_wire_are_exact_figures_and_more_micro_batches_regress_them(tmp_path, monkeypatch):
    """Counted in short loopback runs: the same per rank in every iteration (so exact); a change that
    sends more (here twice the batch: twice the activations) is a regression of the busiest rank's bytes."""
    scenario = write(tmp_path, FOUR)
    asked = {"network": {"scenario": str(scenario)}, "model": {"name": "tiny", "layers": 4, "batch": 8},
             "layout": {"pp": 2}}
    monkeypatch.setitem(regress.WIRE_SYSTEMS, "ours", {})
    suite = Suite(wire=("ours",))
    base = regress.wire_figures(tmp_path / "a", suite=suite, asked=asked)
    assert [f.name for f in base] == ["wire/ours/busiest-rank", "wire/ours/mean-rank"]
    assert all(f.kind == "exact" and f.value > 0 for f in base)
    again = regress.wire_figures(tmp_path / "b", suite=suite, asked=asked)
    assert [r.verdict for r in regress.compare({f.name: f for f in base}, again)] == ["ok", "ok"]
    more = regress.wire_figures(tmp_path / "c", suite=suite, asked=regress.merged(asked, {"model": {"batch": 16}}))
    rows = regress.compare({f.name: f for f in base}, more)
    assert [r.verdict for r in rows] == ["regressed", "regressed"]
    uncounted = regress.emulated_run(regress.merged(asked, {"network": {"mode": "none"}, "run": {"iters": 1}}),
                                     tmp_path / "d")
    with pytest.raises(RegressError, match="no bytes on the wire counted"):
        regress.wire_bytes(uncounted)


def test_the_gates_runs_are_the_requests_harness_run_makes_of_the_same_flags(tmp_path):
    """Gate runs are requests as asked (plan/asked.py), not argv the library parses: each is exactly what `harness
    run` makes of the flags it stands for (the defaults that follow from other fields are decided in one place)."""
    from harness.cli.run_flags import run_request

    case5 = ["--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8",
             "--micro-batch", "1", "--results", str(tmp_path)]
    wire = {"ours": [], "megatron": ["--tp", "2", "--pp", "2", "--dp", "2"],
            "deepspeed": ["--pp", "2", "--dp", "4", "--zero", "1"]}
    assert set(regress.WIRE_SYSTEMS) == set(wire)
    for name, flags in wire.items():
        asked = regress._of(name, regress.EMULATED, regress.WIRE_SYSTEMS[name], regress.WIRE_RUN)
        assert regress._request(asked, tmp_path, ("count_wire=1",)) == run_request(
            [*case5, "--bandwidth-scale", "0.01", "--system", name, *flags, "--network", "none", "--iters", "2",
             "--warmup", "1", "--debug", "count_wire=1"])
    measured = {"ours": [], "ours-random": ["--seed", "2022"],
                "megatron": ["--tp", "1", "--pp", "4", "--dp", "2", "--warmup", "1", "--iters", "2"]}
    assert set(regress.MEASURED_SYSTEMS) == set(measured)
    for name, flags in measured.items():
        req = regress._request(regress._of(name, regress.MEASURED, regress.MEASURED_SYSTEMS[name]), tmp_path, ())
        assert req == run_request([*case5, "--bandwidth-scale", "0.0025", "--compute-model", "--compute-time-scale",
                                   "4", "--iters", "2", "--warmup", "1", "--system", name, *flags])
        assert not req.compute.dilate and req.run.timeout_auto  # a fixed dilation; the timeout from it
