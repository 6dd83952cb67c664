"""`harness reproduce`: verdicts by hand, a toy paper end to end (report last), HetPipe's parts on its testbed,
and WSP's waiting and idle times (Sec. 8.4) pinned to a hand-worked pipeline."""
from __future__ import annotations

import csv
import math
import sys

import pytest

from harness import reproduce
from harness.reproduce import Context, Paper, Part, Setting
from harness.reproduce.claims import Claim, Section, verdict
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


def _toy_paper(fail: bool = False) -> Paper:
    def part(ctx: Context) -> list[Section]:
        ctx.progress("toy part")
        s = Section("Toy figure", text="two claims")
        s.add(Claim("Fig. 1", "speedup", "p. 2", paper=2.0, above=1.0, unit="x", why="a toy model"), 1.5)
        s.add(Claim("Fig. 1", "throughput", "p. 2", paper=100, unit="samples/s"), 104.0, emulated=80.0)
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
    assert [(r["claim"], r["verdict"], r["emulated_verdict"]) for r in rows] == [
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


def test_an_unknown_paper_is_one_line(tmp_path):
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match=r"unknown paper 'nope' \(known: hetpipe\)"):
        reproduce.reproduce("nope", tmp_path)


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
    from harness.reproduce import hetpipe

    seconds = {"np": (2.0, 1.8), "ed": (1.0, 1.1), "hd": (1.25, 1.0), "ed-local": (0.8, 0.9), "horovod": (1.6, 2.0)}
    runs = {k: {"seconds": m, "measured-over-sim": m / p, "host-bound": 0.0, "busy": 0.2}
            for k, (m, p) in seconds.items()}
    s = hetpipe.emulated_section(runs)
    assert [f.emulated for f in s.findings] == pytest.approx([1.6, 1.25, 2.0])
    assert [f.simulated for f in s.findings] == pytest.approx([1.8 / 1.1, 1.1 / 0.9, 2.0 / 0.9])
    assert all(f.verdict == "holds" and f.emulated_verdict == "holds" for f in s.findings)
    assert "| hd | 1.250 | 1.000 | +25.0% | 20% | 0 |" in s.text
    runs["horovod"]["seconds"] = 0.5  # Horovod measured faster than ED-local: that claim differs, measured
    assert [f.emulated_verdict for f in hetpipe.emulated_section(runs).findings][-1] == "differs"


def test_hetpipe_emulated_claims_whose_runs_did_not_run_say_so():
    from harness.reproduce import hetpipe

    runs = {k: {"seconds": m, "measured-over-sim": 1.0, "host-bound": 0.0, "busy": 0.2}
            for k, m in (("ed-local", 1.0), ("horovod", 3.0))}  # QUICK's pair
    s = hetpipe.emulated_section(runs)
    assert [f.verdict for f in s.findings] == ["not run", "not run", "holds"]
    assert s.findings[-1].emulated == 3.0
