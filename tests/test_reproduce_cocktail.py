"""`harness reproduce cocktail`: CocktailSGD's claims and the map's, simulated and (faked) measured runs."""
import csv
import math

import pytest

from harness.plan.asked import request_of
from harness.report.map import CONTENDERS, Cell
from harness.reproduce import Context, get, reproduce
from harness.reproduce import cocktail, cocktail_emulated as ce


def test_cocktail_reproduced_without_emulation_writes_every_claim_and_the_map(tmp_path, monkeypatch):
    monkeypatch.setattr(cocktail, "QUICK_MAP", (("5",), (0.1, 1.0)))
    monkeypatch.setattr(cocktail, "SIM", {"budget": 200})
    said = []
    text = reproduce("cocktail", tmp_path, quick=True, progress=said.append, emulated=False).read_text()
    assert "Not run (`--no-emulated`): case 5 at 8 devices" in text and "The paper: Wang et al." in text
    assert (tmp_path / "map" / "map.png").stat().st_size > 0 and (tmp_path / "map" / "map.csv").exists()
    rows = {r["claim"]: r for r in csv.DictReader((tmp_path / "claims.csv").open())}
    assert len(rows) == 1 + 2 + 4 and all(r["simulated"] not in ("", "-") for r in rows.values())
    wire = rows["CocktailSGD's compression of the exchange (fp32 bytes over the message's)"]
    assert wire["paper"] == "117x" and wire["simulated"] == wire["measured"]  # the formula is what the encoder sends
    assert 8 < float(wire["simulated"]) < 16  # a quarter of the values at 8 bits, less the mask and the scales
    slow = rows["over 500 Mbps, compression speeds training up (plain ours over ours + cocktail)"]
    assert float(slow["simulated"]) > 1
    assert any("DiLoCo-style" in k for k in rows) and any("gains more the slower" in k for k in rows)
    assert get("cocktail").parts[-1].name == "points" and not get("cocktail").parts[-1].in_quick


def _runs(seconds, predicted, to_target, samples, wire=None, payload=None):
    return {k: {"seconds": s, "measured-over-sim": s / predicted[k], "host-bound": 0.0, "busy": 0.2,
                "to_target_s": to_target[k], "to_target_samples": samples[k], "final_loss": 1.8, "floor": 1.7,
                "batch": 32, **({"wire_bytes": wire[k], "payload_bytes": payload[k]} if wire else {})}
            for k, s in seconds.items()}


def test_the_codecs_section_puts_plain_over_each_codec_in_bytes_and_in_time_to_the_loss():
    """Plain sends 4 MB an iteration (payload 3.6 MB), cocktail 1 MB (0.9), int8 2 MB (1.8); plain reaches the
    target in 1000 s, cocktail in 800 s, int8 never: bytes 4x and 2x, wall time 1.25x, int8's not run."""
    names = ["ours", "ours + cocktail", "ours + int8"]
    runs = _runs(dict(zip(names, (5.0, 4.0, 4.5))), dict(zip(names, (5.5, 4.4, 4.6))),
                 dict(zip(names, (1000.0, 800.0, math.nan))), dict(zip(names, (5000, 5600, math.nan))),
                 dict(zip(names, (4e6, 1e6, 2e6))), dict(zip(names, (3.6e6, 0.9e6, 1.8e6))))
    s = ce.section(runs)
    cb, ct, ib, it = s.findings
    assert (cb.simulated, cb.measured) == (pytest.approx(4.0), pytest.approx(4.0))
    assert (ib.simulated, ib.measured) == (pytest.approx(2.0), pytest.approx(2.0))
    assert ct.simulated == pytest.approx(5.5 / 4.4) and ct.measured == pytest.approx(1.25)
    assert ct.measured_verdict == "holds" and it.measured_verdict == "not run"
    assert "| ours + int8 | 4.50 | 62500 / 56250 |" in s.text and "not reached" in s.text
    assert ct.note == "samples to it: 5600 against plain's 5000" and it.note == "samples to it: not reached " \
        "against plain's 5000"


def _cell(samples_per_s: dict) -> Cell:
    return Cell("5", 1.0, dict(samples_per_s), {k: "" for k in samples_per_s}, {k: False for k in samples_per_s})


def test_a_points_contenders_are_its_fastest_that_train_here_and_dtfm_runs_as_ours_once():
    cell = _cell({"streaming-diloco": 110, "diloco": 108, "dtfm": 55, "ours+cocktail": 60, "ours": 53,
                  "megatron": 11})
    assert [c.label for c in ce.point_contenders(cell, CONTENDERS)] == ["streaming-diloco", "ours+cocktail",
                                                                        "dtfm"]  # DiLoCo's family once
    cell = _cell({"dtfm": 90, "ours": 80, "deepspeed": 70, "megatron": 60})
    chosen = ce.point_contenders(cell, CONTENDERS)
    assert [c.label for c in chosen] == ["dtfm", "deepspeed", "megatron"]  # ours is dtfm's stand-in, run once
    req = request_of(ce.point_request("5", 0.3, chosen[0], 7, "/tmp/x"))
    assert (req.run.system, req.network.bandwidth_scale, req.run.iters, req.model.data) == ("ours", 0.3, 7, "markov")
    assert req.network.mode == "none" and not req.compute.model  # loopback: only its losses are read
    by_label = {c.label: c for c in CONTENDERS}
    assert ce.point_iters(by_label["streaming-diloco"], False) == ce.H_POINT_ITERS > ce.POINT_ITERS
    assert ce.point_iters(by_label["ours+cocktail"], False) == ce.POINT_ITERS
    assert ce.point_iters(by_label["diloco"], True) == ce.QUICK_ITERS
    ds = request_of(ce.laid_out(ce.point_request("1", 1.0, by_label["deepspeed"], 7, "/tmp/x"), "1", 1.0,
                                by_label["deepspeed"]))  # its rule needs --zero: the testbed's fastest layout
    assert ds.layout.zero in (1, 3) and ds.layout.pp * ds.layout.dp * (ds.layout.tp or 1) == 8
    mine = ce.point_request("1", 1.0, by_label["ours"], 7, "/tmp/x")
    assert ce.laid_out(mine, "1", 1.0, by_label["ours"]) is mine  # its scheduler lays it out


def _converged(samples: dict) -> dict:
    return {k: {"to_target_s": math.nan, "to_target_samples": n, "final_loss": 1.9 if math.isnan(n) else 1.8,
                "floor": 1.7, "batch": 32} for k, n in samples.items()}


def test_a_point_says_where_the_order_to_the_loss_disagrees_with_the_map():
    """The map ranks diloco (100 samples/s) over ours+cocktail (60) over ours (50); ours+cocktail reaches the target
    in 6000 samples (100 s at its rate), ours in 5500 (110 s); diloco never does: the map's leader is not first."""
    cell = _cell({"diloco": 100, "ours+cocktail": 60, "ours": 50})
    runs = _converged({"diloco": math.nan, "ours+cocktail": 6000, "ours": 5500})
    s = ce.point_section(cell, runs)
    assert "They disagree: by throughput the map orders them diloco > ours+cocktail > ours; to the loss, " \
           "ours+cocktail > ours > diloco." in s.text
    assert "| diloco | 100.0 | not reached (loss 1.900) | - | 1 / - |" in s.text
    assert "| ours | 50.0 | 5500 | 110 | 3 / 2 |" in s.text
    [f] = s.findings
    assert f.measured == math.inf and f.measured_verdict == "differs"
    runs["diloco"]["to_target_samples"] = 12000  # 120 s at its rate: later than ours+cocktail's 100 s
    [f] = ce.point_section(cell, runs).findings
    assert f.measured == pytest.approx(1.2) and f.measured_verdict == "differs"
    runs["diloco"]["to_target_samples"] = 9000  # 90 s
    [f] = ce.point_section(cell, runs).findings
    assert f.measured == pytest.approx(0.9) and f.measured_verdict == "holds"


def test_the_codecs_boot_once_and_the_points_run_on_loopback(tmp_path, monkeypatch):
    import harness.regress

    booted = []

    def emulate(ctx, what, asked):
        booted.append(asked)
        return {k: tmp_path / k for k in asked}

    monkeypatch.setattr(ce, "emulate", emulate)
    monkeypatch.setattr(harness.regress, "run_figures",
                        lambda run: {"seconds": 1.0 + len(run.name), "measured-over-sim": 1.0, "host-bound": 0.0})
    monkeypatch.setattr(ce, "busy", lambda run: 0.1)
    monkeypatch.setattr(ce, "convergence", lambda run: {"to_target_s": 10.0 * len(run.name), "to_target_samples": 320,
                                                        "final_loss": 1.8, "floor": 1.7, "batch": 32})
    monkeypatch.setattr(ce, "traffic", lambda run: {"wire_bytes": 1e6 / len(run.name), "payload_bytes": 9e5})
    [s] = ce.emulated(Context(tmp_path, quick=True))
    [asked] = booted  # the codecs alone: a DiLoCo-style run's probe would dilate their boot many times over
    reqs = {k: request_of(a) for k, a in asked.items()}
    assert {k: r.run.options.get("dp_compress") for k, r in reqs.items()} == {
        "ours": "none", "ours + cocktail": "cocktail", "ours + int8": "int8"}
    assert {(r.network.scenario, r.network.devices, r.run.iters, r.run.warmup, r.model.data) for r in reqs.values()} \
        == {("5", 8, ce.QUICK_ITERS, 0, "markov")}
    assert len(s.findings) == 4
    booted.clear()
    cells = [_cell({"streaming-diloco": 110, "diloco": 108, "ours+cocktail": 60, "ours": 53})]
    monkeypatch.setattr(ce, "POINTS", (("5", 1.0),))
    import harness.train.experiment

    ran = []

    def execute_many(reqs):
        ran.append(reqs)
        return [tmp_path / r.run.system for r in reqs]

    monkeypatch.setattr(harness.train.experiment, "execute_many", execute_many)
    [p] = ce.points(Context(tmp_path, quick=True, found={"map": cells}))
    assert not booted and len(ran) == 1  # a point's runs: on loopback, none in a boot
    assert [(r.run.system, r.network.mode) for r in ran[0]] == [("streaming-diloco", "none"), ("ours", "none"),
                                                                  ("ours", "none")]
    assert p.title.startswith("The map at 5 x1") and "| ours+cocktail |" in p.text
