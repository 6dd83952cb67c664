"""`harness reproduce`: verdicts by hand, a toy paper end to end (report last), HetPipe's parts on its testbed,
and WSP's waiting and idle times (Sec. 8.4) pinned to a hand-worked pipeline."""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import replace

import pytest

from harness import reproduce
from harness.reproduce import Context, Paper, Part, Setting
from harness.reproduce.claims import Claim, Section, fmt, verdict
from harness.systems.hetpipe import wsp
from harness.systems.hetpipe.planning import VirtualWorker


def test_a_number_holds_within_15_percent_else_its_direction_or_it_differs():
    speedup = Claim("Fig. 4", "ED-local over Horovod", "Sec. 8.3", paper=1.8, above=1.0, unit="x")
    assert verdict(speedup, 1.8 * 1.149) == "holds"
    assert verdict(speedup, 1.8 * 0.851) == "holds"
    assert verdict(speedup, 1.8 * 1.16) == "direction holds"  # off by 16 %, still a speedup
    assert verdict(speedup, 1.05) == "direction holds"
    assert verdict(speedup, 0.95) == "differs"  # a slowdown
    plain = Claim("Table 4", "samples/s", "Table 4", paper=300)
    assert verdict(plain, 340) == "holds" and verdict(plain, 350) == "differs"  # no direction to fall back on
    assert verdict(plain, None) == "not run" and verdict(plain, math.nan) == "not run"


def test_a_direction_holds_or_differs_and_its_threshold_is_not_past_it():
    above = Claim("Fig. 4", "Horovod above NP", "Sec. 8.3", above=1.0)
    assert verdict(above, 1.01) == "holds" and verdict(above, 0.99) == "differs"
    assert verdict(above, 1.0 + 1e-12) == "differs"  # equal up to rounding is not above
    below = Claim("Sec. 8.4", "waiting falls with D", "Sec. 8.4", paper=0.62, below=1.0)
    assert verdict(below, 1.0 - 1e-12) == "differs"
    assert verdict(below, 0.9) == "direction holds"
    with pytest.raises(ValueError, match="needs the paper's number or a direction"):
        Claim("Fig. 1", "nothing to check", "p. 1")


def test_a_figure_beside_a_threshold_is_not_rounded_onto_it():
    assert fmt(1.003, "x") == "1.003x" and fmt(0.9996, "x") == "0.9996x"  # not "1x" beside "> 1x"
    assert fmt(0.58412, "x") == "0.584x" and fmt(2.0, "x") == "2x" and fmt(41.62, "%") == "41.6%"
    assert fmt(1234.5, "samples/s") == "1234 samples/s" and fmt(None) == "-"


def _toy_paper(fail: bool = False) -> Paper:
    def part(ctx: Context) -> list[Section]:
        ctx.progress("toy part")
        s = Section("Toy figure", text="two claims")
        s.add(Claim("Fig. 1", "speedup", "p. 2", paper=2.0, above=1.0, unit="x", why="a toy model"), 1.5)
        s.add(Claim("Fig. 1", "throughput", "p. 2", paper=100, unit="samples/s"), 104.0, measured=80.0)
        return [s]

    def broken(ctx: Context) -> list[Section]:
        raise RuntimeError("part failed")

    parts = (Part("one", "the toy part", 1, part),) + ((Part("two", "a failing part", 1, broken),) if fail else ())
    return Paper("toy", "A toy paper", "999", "Nothing real.", parts, (Setting("latency", "5 us", "unstated"),))


def test_a_paper_is_reproduced_into_claims_csv_and_report_md(tmp_path, monkeypatch):
    monkeypatch.setitem(reproduce.PAPERS, "toy", "tests.test_reproduce:TOY")
    monkeypatch.setattr(sys.modules[__name__], "TOY", _toy_paper())
    said = []
    path = reproduce.reproduce("toy", tmp_path, progress=said.append)
    assert path == tmp_path / "report.md" and said == ["[1/1] the toy part", "toy part"]
    text = path.read_text()
    assert "| holds | 1 |" in text and "| direction holds | 1 |" in text
    assert "| speedup | 2x (p. 2) | 1.5x | direction holds |" in text and "a toy model" in text
    assert "| throughput | 100 samples/s (p. 2) | 104 samples/s | **holds** | 80 samples/s | differs |" in text
    assert "| latency | 5 us | unstated |" in text
    rows = list(csv.DictReader((tmp_path / "claims.csv").open()))
    assert [(r["claim"], r["verdict"], r["measured_verdict"]) for r in rows] == [
        ("speedup", "direction holds", "not run"), ("throughput", "holds", "differs")]


def test_a_failing_part_leaves_no_report(tmp_path, monkeypatch):
    monkeypatch.setitem(reproduce.PAPERS, "toy", "tests.test_reproduce:TOY")
    monkeypatch.setattr(sys.modules[__name__], "TOY", _toy_paper(fail=True))
    with pytest.raises(RuntimeError, match="part failed"):
        reproduce.reproduce("toy", tmp_path)
    assert not (tmp_path / "report.md").exists()


def test_without_emulation_the_measured_parts_are_left_out_and_named(tmp_path, monkeypatch):
    paper = _toy_paper(fail=True)
    measured = Part("two", "a measured part", 600, paper.parts[1].run, measured=True)  # it would fail if run
    monkeypatch.setitem(reproduce.PAPERS, "toy", "tests.test_reproduce:TOY")
    monkeypatch.setattr(sys.modules[__name__], "TOY", Paper("toy", "A toy paper", "999", "", (paper.parts[0], measured)))
    text = reproduce.reproduce("toy", tmp_path, emulated=False).read_text()
    assert "Not run (`--no-emulated`): a measured part." in text
    assert TOY.expected_seconds(quick=False) == 601 and TOY.expected_seconds(False, emulated=False) == 1


def test_quick_leaves_out_the_parts_too_long_for_a_first_look_and_names_them(tmp_path, monkeypatch):
    paper = _toy_paper(fail=True)
    long = Part("two", "a long measured part", 900, paper.parts[1].run, measured=True, in_quick=False)
    monkeypatch.setitem(reproduce.PAPERS, "toy", "tests.test_reproduce:TOY")
    monkeypatch.setattr(sys.modules[__name__], "TOY", Paper("toy", "A toy paper", "999", "", (paper.parts[0], long)))
    text = reproduce.reproduce("toy", tmp_path, quick=True).read_text()
    assert "Not run (QUICK): a long measured part." in text
    assert TOY.runs(quick=True) == [paper.parts[0]] and TOY.expected_seconds(quick=True) == 1
    assert TOY.runs(quick=False) == [paper.parts[0], long]


def test_an_unknown_paper_is_one_line(tmp_path):
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match=r"unknown paper 'nope' \(known: cocktail, dtfm, hetpipe, owl, sky\)"):
        reproduce.reproduce("nope", tmp_path)


def test_all_reproduces_every_paper_and_indexes_their_verdicts_going_past_one_that_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "PAPERS", {"toy": "tests.test_reproduce:TOY",
                                              "broken": "tests.test_reproduce:BROKEN"})
    monkeypatch.setattr(sys.modules[__name__], "TOY", _toy_paper(), raising=False)
    monkeypatch.setattr(sys.modules[__name__], "BROKEN", replace(_toy_paper(fail=True), name="broken",
                                                                 title="A broken paper"), raising=False)
    said = []
    index, failed = reproduce.reproduce_all(tmp_path, quick=True, progress=said.append)
    assert index == tmp_path / "index-quick.md" and failed == ["broken"]
    text = index.read_text()
    assert "| A toy paper | [toy/quick/report.md](toy/quick/report.md) | 1 | 1 | 0 | 0 | 0 | 0 | 1 |" in text
    assert "| A broken paper | failed: RuntimeError: part failed |" in text
    assert (tmp_path / "toy" / "quick" / "report.md").exists()
    assert not (tmp_path / "broken" / "quick" / "report.md").exists()
    assert said[0] == "paper 1/2: toy" and "paper 2/2: broken" in said


def test_every_paper_is_a_make_target_and_make_reproduce_all_runs_them():
    from pathlib import Path

    make = (Path(__file__).resolve().parents[1] / "Makefile").read_text().splitlines()
    [listed] = [line.split(":=")[1].split() for line in make if line.startswith("REPRODUCE_PAPERS :=")]
    assert listed == list(reproduce.PAPERS)
    assert any(line.startswith("$(addprefix reproduce-,$(REPRODUCE_PAPERS) all)") for line in make)


# ------------------------------------------------------------------ WSP's waiting and idle time (Sec. 8.4)
def _vw(fwd, bwd) -> VirtualWorker:
    k = len(fwd)
    return VirtualWorker(tuple(range(k)), tuple((i, i + 1) for i in range(k)), tuple(fwd), tuple(bwd),
                         (0.0,) * (k - 1), (0.0,) * (k - 1), (0,) * k, (1,) * k)


def test_waiting_is_push_and_pull_and_idle_the_first_stage_without_work():
    """Two stages (first: forward 1 s, backward 2 s; last: 0.5 + 0.5), N_m = 2, push and pull 1 s each.
    Minibatch 0: stage 0 forward [0, 1], last [1, 2], backward [2, 4]; minibatch 1: [1, 2], [2, 3], [4, 6]:
    wave 0 ends at 6, pushed at 7, pulled at 8, when minibatch 3 (closing wave 1) is admitted. Meanwhile
    minibatch 2 (admitted at 4) runs its forward on stage 0 in [6, 7]: waiting 2 s, idle 1 s."""
    r = wsp.simulate([_vw((1.0, 0.5), (2.0, 0.5))], 2, 1, 0, 1.0, 1.0, waves=4)
    waiting, idle = r.gate_waits()
    assert r.wave_done[0, 0] == 6.0 and r.pulled[0, 0] == 8.0
    assert waiting.tolist() == [2.0, 2.0, 2.0]
    assert idle[0] == 1.0 and (idle <= waiting).all()


def test_a_larger_D_shortens_the_fast_VWs_wait_for_a_straggler():
    fast, slow = _vw((1.0,), (2.0,)), _vw((2.0,), (4.0,))
    waits = {d: wsp.simulate([fast, slow], 2, 1, d, 0.1, 0.1, waves=12).gate_waits()[0].mean() for d in (0, 4)}
    assert waits[4] < waits[0]


# ------------------------------------------------------------------ HetPipe's parts, simulated on its testbed
def test_hetpipe_sync_overhead_part_states_its_two_claims(tmp_path):
    from harness.reproduce import hetpipe

    (s,) = hetpipe.sync_overhead(Context(tmp_path))
    by = {f.claim.text: f for f in s.findings}
    ratio = by["waiting at D = 4 / waiting at D = 0"]
    assert ratio.claim.paper == 0.62 and 0 < ratio.simulated <= 1.0 + 1e-9
    assert 0 <= by["idle / waiting (D = 4)"].simulated <= 1.0 + 1e-9
    assert all(f.verdict in ("holds", "direction holds", "differs") for f in s.findings)
    assert all(f.measured is None for f in s.findings)  # no convergence runs before it


def test_hetpipe_sync_overhead_measures_the_convergence_runs_records(tmp_path):
    """Runs at D = 0 and D = 4 (N_m = 2) whose one gate each waited 1.0 s (0.5 blocked) and 0.5 s (0.1 blocked):
    waiting 0.5x, idle / waiting 0.2, measured."""
    import json

    from harness.reproduce import hetpipe
    from harness.results import write_minibatches

    def fake(d: int, waiting: float, blocked: float):
        run = tmp_path / f"D{d}"
        run.mkdir()
        (run / "manifest.json").write_text(json.dumps({"placement": {"N_m": 2}}))
        rows = [{"vw": 0, "minibatch": p, "clock": p // 2, "global_version": 0, "admitted": float(p), "pushed": 0.0,
                 "loss": 1.0} for p in range(4)]
        rows[1]["wave_done"] = 10.0
        rows[3].update(pulled=10.0 + waiting, blocked=blocked)
        write_minibatches(run / "minibatches.csv", rows)
        return run

    ctx = Context(tmp_path, found={"convergence": {"horovod": tmp_path, "D=0": fake(0, 1.0, 0.5),
                                                   "D=4": fake(4, 0.5, 0.1)}})
    (s,) = hetpipe.sync_overhead(ctx)
    assert [f.measured for f in s.findings] == pytest.approx([0.5, 0.2])
    assert "D = 4: waiting 500.0 ms, idle 100.0 ms over 1 gates" in s.text


def test_hetpipe_fig3_covers_table3s_seven_vws_per_model_and_draws_them(tmp_path):
    from harness.reproduce import hetpipe

    sections = hetpipe.fig3(Context(tmp_path))
    assert [s.title.split(":")[0] for s in sections] == ["Fig. 3 (VGG-19)", "Fig. 3 (ResNet-152)"]
    for s in sections:
        grows = [f for f in s.findings if "grows with N_m" in f.claim.text]
        assert len(grows) == 7 and all(f.simulated > 0 for f in grows)
    assert (tmp_path / "fig3.png").stat().st_size > 0 and sections[-1].plots == ["fig3.png"]


def test_the_cli_refuses_an_unknown_paper_in_one_line(capsys):
    from harness.cli import main

    assert main(["reproduce", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid choice: 'nope'" in err


TOY = None  # the toy Paper the registry names, set per test


def test_hetpipe_emulated_directions_come_from_the_runs_and_their_predictions():
    """Seconds per iteration (measured, predicted): NP 2.0 (1.8), ED 1.0 (1.1), HD 1.25 (1.0), ED-local 0.8 (0.9),
    Horovod 1.6 (2.0). Measured: NP / slower of ED and HD 2.0 / 1.25 = 1.6, ED / ED-local 1.25, Horovod / ED-local
    2.0; predicted: 1.8 / 1.1, 1.1 / 0.9, 2.0 / 0.9."""
    from harness.reproduce import hetpipe_emulated as hetpipe

    seconds = {"np": (2.0, 1.8), "ed": (1.0, 1.1), "hd": (1.25, 1.0), "ed-local": (0.8, 0.9), "horovod": (1.6, 2.0)}
    runs = {k: {"seconds": m, "measured-over-sim": m / p, "host-bound": 0.0, "busy": 0.2}
            for k, (m, p) in seconds.items()}
    s = hetpipe.emulated_section(runs)
    assert [f.measured for f in s.findings] == pytest.approx([1.6, 1.25, 2.0])
    assert [f.simulated for f in s.findings] == pytest.approx([1.8 / 1.1, 1.1 / 0.9, 2.0 / 0.9])
    assert all(f.verdict == "holds" and f.measured_verdict == "holds" for f in s.findings)
    assert "| hd | 1.250 | 1.000 | +25.0% | 20% | 0 |" in s.text
    runs["horovod"]["seconds"] = 0.5  # Horovod measured faster than ED-local: that claim differs, measured
    assert [f.measured_verdict for f in hetpipe.emulated_section(runs).findings][-1] == "differs"


def test_hetpipe_emulated_claims_whose_runs_did_not_run_say_so():
    from harness.reproduce import hetpipe_emulated as hetpipe

    runs = {k: {"seconds": m, "measured-over-sim": 1.0, "host-bound": 0.0, "busy": 0.2}
            for k, m in (("ed-local", 1.0), ("horovod", 3.0))}  # a run failed or was left out
    s = hetpipe.emulated_section(runs)
    assert [f.verdict for f in s.findings] == ["not run", "not run", "holds"]
    assert s.findings[-1].measured == 3.0


def test_hetpipe_fig3_at_the_testbeds_scale_from_the_runs_and_their_predictions():
    """N_m = 1: 4.0 s measured (3.6 predicted), N_m = 4: 2.5 s (2.4): throughput grows 1.6x measured, 1.5x
    predicted; the busiest stage computes 1.2 s an iteration: 30 % of 4.0 s busy (33 % of 3.6); without the N_m = 4
    run, not run."""
    from harness.reproduce import hetpipe_emulated

    runs = {k: {"seconds": m, "measured-over-sim": m / p, "host-bound": 0.0, "busy": 0.3, "compute": 1.2}
            for k, (m, p) in {"N_m=1": (4.0, 3.6), "N_m=2": (3.0, 2.9), "N_m=4": (2.5, 2.4)}.items()}
    s = hetpipe_emulated.fig3_section(runs)
    assert "measured and simulated: N_m=1 30% and 33%, N_m=2 40% and 41%, N_m=4 48% and 50%." in s.text
    (f,) = s.findings
    assert (f.measured, f.simulated) == (pytest.approx(1.6), pytest.approx(1.5))
    assert f.verdict == f.measured_verdict == "holds"
    del runs["N_m=4"]
    assert hetpipe_emulated.fig3_section(runs).findings[0].verdict == "not run"


def test_hetpipe_bytes_across_nodes_counted_beside_the_payload_model():
    """ED sends 10 MB an iteration across nodes by the model and 11 on the wire, ED-local 4 and 4.6: local placement
    cuts them to 0.4x (model) and 0.418x (counted); a run without a model of its own moves 0 payload (no ratio)."""
    from harness.reproduce import hetpipe_emulated as hetpipe

    runs = {"ed": {"cross-node": 11e6, "cross-node-payload": 10e6},
            "ed-local": {"cross-node": 4.6e6, "cross-node-payload": 4e6},
            "horovod": {"cross-node": 0.1e6, "cross-node-payload": 0.0}}
    s = hetpipe.bytes_section(runs)
    (f,) = s.findings
    assert (f.simulated, f.measured) == (pytest.approx(0.4), pytest.approx(4.6 / 11))
    assert f.verdict == f.measured_verdict == "holds"
    assert "| ed | 11.000 | 10.000 | 1.100 |" in s.text and "| horovod | 0.100 | 0 | - |" in s.text
    del runs["ed"]  # QUICK ran no ED
    assert hetpipe.bytes_section(runs).findings[0].verdict == "not run"


def test_time_to_target_is_the_first_smoothed_loss_at_or_under_it(monkeypatch):
    """Averaged over 5: means of the last five losses 2.2 (it. 5), 1.8 (6), 1.4 (7): the target 1.5 is first met
    at the seventh iteration, after 7 x 0.5 s."""
    from harness.reproduce import hetpipe_convergence
    from harness.reproduce.hetpipe_convergence import time_to_target

    monkeypatch.setattr(hetpipe_convergence, "SMOOTH", 5)
    losses = [2.2] * 5 + [0.2, 0.2]
    assert time_to_target([0.5] * 7, losses, 1.5) == (3.5, 7)
    assert time_to_target([0.5] * 7, losses, 0.1) == (pytest.approx(math.nan, nan_ok=True), -1)


def test_hetpipe_convergence_claims_divide_samples_to_target_by_the_paper_scale_throughput():
    """Runs to target: Horovod 10 iterations in 20 s, D=0 5 in 8 s, D=4 4 in 6 s, D=32 5 in 7.5 s (64 images an
    iteration). At the paper's scale with 100 samples/s everywhere the times follow the samples: D=0 is 50 % sooner
    than Horovod (640 vs 320 samples), D=4 20 % sooner than D=0, D=32 25 % later than D=4; measured: 60 %, 25 %,
    25 %."""
    from harness.reproduce import hetpipe_convergence as hc

    def run(n, t, batch=64):
        return {"iterations": n, "time": t, "seconds": [t / n] * n, "losses": [1.0] * n, "overruns": 0,
                "simulated": t / n * 0.9, "batch": batch}

    runs = {"horovod": run(10, 20.0), "D=0": run(5, 8.0), "D=4": run(4, 6.0), "D=32": run(5, 7.5)}
    sps = {k: 100.0 for k in ("resnet152 horovod", "resnet152 D=0 12", "resnet152 D=0 16", "vgg19 horovod",
                               "vgg19 D=0", "vgg19 D=4", "vgg19 D=32")}
    s = hc.convergence_section(runs, sps, floor=0.85, target=1.2)
    assert "| horovod | 2.00 | 1.80 | 10 | 640 | 20.0 |" in s.text  # measured and simulated seconds an iteration
    got = {f.claim.text: (f.simulated, f.measured) for f in s.findings}
    assert got["VGG-19: HetPipe D = 0 sooner than Horovod"] == pytest.approx((50.0, 60.0))
    assert got["VGG-19: D = 4 sooner than D = 0"] == pytest.approx((20.0, 25.0))
    assert got["VGG-19: D = 32 later than D = 4 (global staleness)"] == pytest.approx((25.0, 25.0))
    sps["resnet152 D=0 16"] = 200.0  # twice the throughput: half the time
    s = hc.convergence_section(runs, sps, floor=0.85, target=1.2)
    assert s.findings[1].simulated == pytest.approx(75.0)
    quick = hc.convergence_section({k: runs[k] for k in hc.QUICK_RUNS}, sps, floor=0.85, target=1.2)
    assert [f.verdict for f in quick.findings][3:] == ["not run"] * 3 and quick.findings[0].simulated is not None
    assert "runs horovod, D=0;" in s.findings[0].note  # no run without the G node: the 8-device runs stand in
    # Fig. 5's 12 GPUs: Horovod without the G node 12 iterations of 48 (576 samples) in 18 s, HetPipe 6 of 64 (384)
    # in 9 s: at the paper's scale (100 samples/s each) 1/3 sooner, measured 50 %; HetPipe on 16 (D=0: 320
    # samples at 200/s) against it: 1 - 1.6 / 5.76
    runs.update({"horovod VRQ": run(12, 18.0, batch=48), "D=0 VRQ": run(6, 9.0)})
    s = hc.convergence_section(runs, sps, floor=0.85, target=1.2)
    assert (s.findings[0].simulated, s.findings[0].measured) == (pytest.approx(100 / 3), pytest.approx(50.0))
    assert (s.findings[1].simulated, s.findings[1].measured) == (pytest.approx(100 * (1 - 1.6 / 5.76)),
                                                                 pytest.approx(100 * (1 - 8 / 18)))
    assert "| horovod VRQ | 1.50 | 1.35 | 12 | 576 | 18.0 |" in s.text


def test_recorded_gate_waits_run_from_a_wave_end_to_the_pull_after_the_next():
    """N_m = 2: wave 0 ends with minibatch 1 (its first stage done at 1.0 s); the gate after it is minibatch 3's
    pull, done at 1.5 s after 0.2 s blocked: waiting 0.5, idle 0.2. Wave 1 ends at 2.0 (minibatch 3), minibatch
    5's pull done at 2.8 after 0.4 s: waiting 0.8, idle 0.4."""
    nan = math.nan

    def row(p, wave_done=nan, pulled=nan, blocked=nan):
        return {"vw": 0, "minibatch": p, "wave_done": wave_done, "pulled": pulled, "blocked": blocked}

    rows = [row(0), row(1, wave_done=1.0), row(2), row(3, wave_done=2.0, pulled=1.5, blocked=0.2), row(4),
            row(5, wave_done=3.0, pulled=2.8, blocked=0.4)]
    waiting, idle = wsp.recorded_gate_waits(rows, 2)
    assert waiting == pytest.approx([0.5, 0.8]) and idle == pytest.approx([0.2, 0.4])


def test_hetpipe_table4_at_the_testbeds_scale_from_the_runs_and_their_predictions():
    """Samples/s = batch / seconds. HetPipe (64 images) 1.0, 0.5, 0.4, 0.32 s measured: 64 -> 200 samples/s (3.125x),
    steps 2.0, 1.25, 1.25, the smallest 1.25; predicted 0.9, 0.5, 0.45, 0.3: 3.0x, steps 1.8, 1.11, 1.5. Horovod (8
    a GPU) 0.2, 0.3, 0.4, 0.5 s on 2, 4, 6, 8 GPUs: 80, 106.7, 120, 128 samples/s, 1.6x, smallest step 1.067; a
    Horovod slower on VRQG than on VRQ differs; a set dilated twice as much ran twice as fast; a set that did not
    run leaves every claim not run."""
    from harness.reproduce import hetpipe_emulated as emulated

    hetpipe = {"V2": (1.0, 0.9), "VR4": (0.5, 0.5), "VRQ6": (0.4, 0.45), "VRQG8": (0.32, 0.3)}
    horovod = {"V2": 0.2, "VR4": 0.3, "VRQ6": 0.4, "VRQG8": 0.5}
    common = {"time-scale": 1000.0}  # seconds of modelled time a second: samples per modelled ms = samples/s
    runs = {g: {"ed-local": {"seconds": m, "measured-over-sim": m / p, "batch": 64, "busy": 0.2, **common},
                "horovod": {"seconds": horovod[g], "measured-over-sim": 1.0, "batch": 8 * int(g[-1]), "busy": 0.3,
                            **common}}
            for g, (m, p) in hetpipe.items()}
    s = emulated.table4_section(runs)
    got = [(f.measured, f.simulated) for f in s.findings]
    assert got == [pytest.approx((3.125, 3.0)), pytest.approx((1.25, 0.5 / 0.45)), pytest.approx((1.6, 1.6)),
                   pytest.approx((128 / 120, 128 / 120))]
    assert all(v == "holds" for f in s.findings for v in (f.verdict, f.measured_verdict))
    assert "| VR4 | 128.0 | 128.0 | +0.0% | 106.7 | 106.7 | +0.0% | 30% |" in s.text
    runs["VRQG8"]["horovod"]["seconds"] = 0.8  # 80 samples/s on 8 GPUs, below VRQ6's 120
    assert emulated.table4_section(runs).findings[3].measured_verdict == "differs"
    runs["V2"]["horovod"]["time-scale"] = 2000.0  # dilated twice as much: its 0.2 s are 0.1 of modelled time
    assert emulated.table4_section(runs).findings[2].measured == pytest.approx(80 / 160)
    del runs["VR4"]
    assert {f.verdict for f in emulated.table4_section(runs).findings} == {"not run"}


def test_hetpipe_table4_at_the_testbeds_scale_emulates_each_set_on_its_own_nodes_and_reuses_fig4s(tmp_path,
                                                                                                 monkeypatch):
    """V, VR and VRQ each boot a scenario of their nodes only (2 GPUs each; Horovod at 8 images a GPU); VRQG is
    Fig. 4's ED-local and Horovod runs when that part ran, else its own."""
    import json

    import harness.regress
    from harness.reproduce import hetpipe_emulated as emulated
    from harness.scenario import load_scenario

    booted = []

    def emulate(ctx, what, asked):
        net = {a["network"]["scenario"] for a in asked.values()}
        assert len(net) == 1 and set(asked) == set(emulated.TABLE4_RUNS)
        booted.append((load_scenario(net.pop(), asked["horovod"]["network"]["devices"]),
                       asked["horovod"]["model"]["batch"], asked["ed-local"]["model"]["batch"]))
        return {k: fake(k) for k in asked}

    def fake(label):
        run = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
        run.mkdir()
        (run / "manifest.json").write_text(json.dumps({"spec": {"compute": {"time_scale": 1000}}}))
        return run

    monkeypatch.setattr(emulated, "emulate", emulate)
    monkeypatch.setattr(harness.regress, "run_figures",
                        lambda run: {"seconds": 1.0, "measured-over-sim": 1.0, "host-bound": 0.0})
    ctx = Context(tmp_path, found={"fig4-emulated": {k: fake(k) for k in ("np", "ed-local", "horovod")}})
    (s,) = emulated.table4_emulated(ctx)
    assert [([r.name for r in t.regions], t.n, hv, ed) for t, hv, ed in booted] == [
        (["V"], 2, 16, 64), (["V", "R"], 4, 32, 64), (["V", "R", "Q"], 6, 48, 64)]
    assert (tmp_path / "scenarios" / "hetpipe-testbed-VR.yaml").exists()
    assert "| VRQG8 | 64.0 | 64.0 |" in s.text  # Fig. 4's runs
    booted.clear()
    emulated.table4_emulated(Context(tmp_path))
    assert [t.n for t, _, _ in booted] == [2, 4, 6, 8] and booted[-1][0].name == "hetpipe-testbed"
