"""`harness sim --timeline`: each system's best layout predicted iteration by iteration (harness/sim/timeline.py)."""
from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pandas as pd
import numpy as np
import pytest

from harness.compute.model import get_model
from harness.scenario import load_scenario, load_timeline
from harness.sim.sweep import Simulator
from harness.sim.timeline import predict_candidate

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--scenario", "5", "--devices", "8", "--layers", "8", "--batch", "64", "--budget", "200", "--no-cache"]
SYSTEMS = ("ours", "ours-random", "megatron", "deepspeed", "dtfm", "dtfm-random")


def test_sim_predicts_every_system_per_iteration_and_the_scenarios_links_give_its_own_figure(cli, tmp_path):
    (tmp_path / "t.yaml").write_text(textwrap.dedent("""
        events:
          - {at_iteration: 2, from: "*", to: "*", bandwidth_factor: 0.5}
          - {at_iteration: 5, from: "*", to: "*", restore: true}
    """))
    rc, out, err = cli("sim", *SMALL, "--timeline", tmp_path / "t.yaml", "--iterations", "7", "--out", tmp_path / "run",
                       "--json", tmp_path / "s.json")
    assert rc == 0, err
    assert "under the timeline" in out

    best = {d["system"]: d["seconds"] for d in json.loads((tmp_path / "s.json").read_text()) if d["best"]}
    df = pd.read_csv(tmp_path / "run" / "timeline.csv", index_col="iteration")
    assert len(df) == 7
    for s in SYSTEMS:
        col = df[f"{s}_s"]
        # on the scenario's links an iteration is exactly what harness sim prints for the system
        assert col[[0, 1, 5, 6]].tolist() == pytest.approx([best[s]] * 4, rel=1e-12), s
        # every link at half its rate: every system slower while it lasts, and by at most twice
        assert (col[[2, 3, 4]] > best[s] * 1.01).all() and (col[[2, 3, 4]] <= best[s] * 2 + 1e-9).all(), s
        assert df[f"{s}_start_s"].diff()[1:].tolist() == pytest.approx(col[:-1].tolist())


def test_a_link_the_layout_does_not_cross_changes_nothing_and_one_it_crosses_does(tmp_path):
    topo = load_scenario("5", devices=8)
    cfg = get_model("gpt3-xl", 8)
    sim = Simulator(topo, d_pp=4, budget=200)
    (cand,) = sim.run("ours", cfg, 64)
    pipes = cand.config["pipelines"]
    used = {(a, b) for p in pipes for a, b in zip(p, p[1:])}
    name = lambda d: topo.regions[topo.device_region[d]].name  # noqa: E731 - one device per region at 8
    a, b = next(iter(used))
    crossed = {frozenset((name(x), name(y))) for x, y in used}
    crossed |= {frozenset((name(p[j]), name(q[j]))) for p in pipes for q in pipes for j in range(len(p)) if p != q}
    free = next((x, y) for x in range(8) for y in range(x + 1, 8) if frozenset((name(x), name(y))) not in crossed)
    for (x, y), slower in (((a, b), True), (free, False)):
        (tmp_path / "t.yaml").write_text(f"events: [{{at_iteration: 1, from: {name(x)}, to: {name(y)}, "
                                         "bandwidth_factor: 0.1}]\n")
        pred = predict_candidate(sim, cand, load_timeline(tmp_path / "t.yaml", topo), 3)
        assert pred[0].seconds == pytest.approx(cand.seconds, rel=1e-12)
        assert (pred[1].seconds > cand.seconds * 1.01) is slower, (name(x), name(y), pred)


def test_sim_refuses_a_timeline_for_a_cnn_and_a_bad_file_in_one_line(cli, tmp_path):
    rc, out, err = cli("sim", "--scenario", "hetpipe-testbed", "--model", "vgg19", "--timeline",
                       "scenarios/timelines/4-regional-link-down.yaml")
    assert rc == 2 and "--timeline" in err and err.strip().count("\n") == 0
    (tmp_path / "bad.yaml").write_text("events: [{at_s: 1, from: Mars, to: Ohio, delay_ms: 3}]\n")
    rc, out, err = cli("sim", *SMALL, "--timeline", tmp_path / "bad.yaml")
    assert rc == 2 and "unknown region" in err and "Mars" in err and err.strip().count("\n") == 0
    rc, out, err = cli("sim", *SMALL, "--replan")
    assert rc == 2 and "--replan" in err and "no timeline" in err and err.strip().count("\n") == 0


def test_compare_holds_a_run_under_a_timeline_iteration_by_iteration(cli, tmp_path):
    """A measured run (fabricated here: 1 s an iteration) whose manifest names a timeline: sim compare predicts
    every iteration under it, the mean row from those predictions, and writes the per-iteration CSV and figure."""
    from harness.cli.run_flags import run_request
    from harness.plan.layouts import plan_run
    from harness.results import IterationRecord, write_records
    from harness.sim.compare import simulate_record

    timeline = ROOT / "scenarios" / "timelines" / "5-worldwide-link-halves.yaml"
    flags = ["--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8",
             "--bandwidth-scale", "0.01", "--timeline", str(timeline)]
    spec = plan_run(run_request(flags)).spec
    assert spec.network.timeline == str(timeline)
    base = dict(run_id="r1", scenario="5-worldwide", system="ours", backend="emu", kernel="uml", devices=8,
                d_pp=spec.layout.pp, d_dp=spec.layout.dp, model="tiny", layers=4, hidden=64, seq=64, batch=8,
                micro_batch=1, seed=0, bandwidth_scale=0.01, pflop=1e-6, pflops=1e-6, tokens_per_s=1.0,
                compute_seconds=0.1, exposed_comm_seconds=0.9, loss=2.0, config=json.dumps(spec.layout.to_json()))
    recs = [IterationRecord(**base, iteration=it, seconds=1.0) for it in range(1, 12)]
    run = tmp_path / "run"
    write_records(run / "records.csv", recs)
    (run / "manifest.json").write_text(json.dumps({"spec": spec.to_json()}))
    rc, out, err = cli("sim", "compare", run, "--csv", tmp_path / "cmp.csv")
    assert rc == 0, err
    assert "iteration by iteration" in out
    its = pd.read_csv(tmp_path / "cmp-iterations.csv").set_index("iteration")
    assert (tmp_path / "cmp-iterations.png").stat().st_size > 0
    still = simulate_record({**base, "dtype": "fp32", "device_type": "cpu",
                             "scenario_source": "5-worldwide"})  # the run's links, no timeline
    sim = its["simulated_s"]
    assert sim[[1, 2, 3, 8, 9, 10, 11]].tolist() == pytest.approx([still] * 7, rel=1e-12)
    assert (sim[[4, 5, 6, 7]] > 1.2 * still).all()  # Tokyo <-> Seoul at half its rate: on the critical path
    assert its["changes"][[4, 8]].tolist() == [1, 1] and its["changes"].sum() == 2
    assert its["measured_s"].tolist() == [1.0] * 11
    row = next(csv.DictReader(open(tmp_path / "cmp.csv")))
    assert float(row["simulated_s"]) == pytest.approx(sim.mean(), rel=1e-5)  # written to 6 digits


def test_a_replan_moves_only_what_a_device_did_not_hold_over_the_links_as_they_are():
    from harness.layout import from_pipelines
    from harness.compute import training_bytes_per_param
    from harness.sim.replan import move_seconds

    topo = load_scenario("5", devices=8)
    sim = Simulator(topo, d_pp=4, budget=200)
    cfg = get_model("gpt3-xl", 8)
    old = from_pipelines([[0, 1, 2, 3], [4, 5, 6, 7]], cfg.layers, "x")
    assert move_seconds(old, old, cfg, sim.links) == (0.0, 0.0)
    swapped = from_pipelines([[1, 0, 2, 3], [4, 5, 6, 7]], cfg.layers, "x")  # devices 0 and 1 trade stages 0, 1
    seconds, moved = move_seconds(old, swapped, cfg, sim.links)
    per_param = training_bytes_per_param(2) - 2
    stage0 = 2 * cfg.block_params + cfg.embedding_params
    stage1 = 2 * cfg.block_params
    # device 1 gets stage 0 from device 0 or 4 (whichever link to it is faster), device 0 gets stage 1 from 1 or 5
    assert moved == pytest.approx((stage0 + stage1) * per_param)
    r, dl = sim.links.rate_Bps, sim.links.delay_s
    src1 = max((0, 4), key=lambda s: r[s, 1])
    src0 = max((1, 5), key=lambda s: r[s, 0])

    def fresh(s, d, nbytes):  # a new connection: handshake, then slow start from the initial window (10
        # segments a socket; NCCL opens the scenario's 16 a peer)
        path = sim.links.path(np.array([s]), np.array([d]))
        assert path.sockets == 16
        return float(path.rtt_s[0] + path.transfer(np.array([nbytes]), 16 * 10 * path.mss_bytes)[0][0])
    get1, get0 = fresh(src1, 1, stage0 * per_param), fresh(src0, 0, stage1 * per_param)
    assert seconds == pytest.approx(max(get1, get0))
    # slow start costs round trips beyond the bytes at the link's rate
    assert get1 > dl[src1, 1] + dl[1, src1] + dl[src1, 1] + stage0 * per_param / r[src1, 1]


def test_ours_replans_after_a_change_and_pays_for_it_once(tmp_path):
    from harness.sim.replan import REPLAN_LEAD, predict_replanned

    topo = load_scenario("5", devices=8)
    cfg = get_model("gpt3-xl", 8)
    sim = Simulator(topo, d_pp=4, budget=200)
    (cand,) = sim.run("ours", cfg, 64)
    a, b = cand.config["pipelines"][1][:2]  # a pipeline hop of the plan
    name = lambda d: topo.regions[topo.device_region[d]].name  # noqa: E731
    (tmp_path / "t.yaml").write_text(f"events: [{{at_iteration: 2, from: {name(a)}, to: {name(b)}, "
                                     "bandwidth_factor: 0.02}]\n")
    timeline = load_timeline(tmp_path / "t.yaml", topo)
    still = predict_candidate(sim, cand, timeline, 6)
    pred, replans = predict_replanned(sim, cand, cfg, 64, timeline, 6)
    assert [p.seconds for p in pred[:2]] == pytest.approx([cand.seconds] * 2)
    (r,) = replans  # one change: one search at the boundary it falls on, its plan two iterations later
    assert (r.searched, r.iteration) == (2, 2 + REPLAN_LEAD - 1)
    assert r.seconds_after < r.seconds_before and r.moved_bytes > 0
    assert pred[2].pause_s == pytest.approx(r.plan_seconds)  # the search
    assert pred[2].seconds == pytest.approx(r.plan_seconds + still[2].seconds)  # still the old plan
    assert pred[3].pause_s == 0 and pred[3].seconds == pytest.approx(still[3].seconds)
    assert pred[4].pause_s == pytest.approx(r.move_seconds)  # the moves, then the new plan
    assert pred[4].seconds == pytest.approx(r.move_seconds + r.seconds_after)
    assert pred[5].seconds == pytest.approx(r.seconds_after)
    assert r.seconds_after < still[5].seconds  # the new plan beats the old on the changed links
    assert r.pipelines != cand.config["pipelines"]


def test_sim_replan_prints_each_replan_and_its_cost(cli, tmp_path):
    (tmp_path / "t.yaml").write_text("events: [{at_iteration: 1, from: '*', to: '*', bandwidth_factor: 0.5}]\n")
    rc, out, err = cli("sim", *SMALL, "--system", "ours", "--timeline", tmp_path / "t.yaml", "--replan",
                       "--iterations", "3", "--out", tmp_path / "run")
    assert rc == 0, err
    df = pd.read_csv(tmp_path / "run" / "timeline.csv", index_col="iteration")
    assert "ours+replan_s" in df and ("ours: re-plan searched before iteration 1" in out or "no re-plan" in out)


def test_compare_predicts_a_replanned_run_on_the_plans_it_had(tmp_path):
    """A --replan run's manifest says when rank 0 searched and which plan ran from which iteration: the
    iteration after a search pays it, a new plan's first iteration pays its moves, and from there on the
    iterations are the new plan's."""
    from harness.cli.run_flags import run_request
    from harness.plan.layouts import plan_run
    from harness.results import IterationRecord, write_records
    from harness.sim.compare import load_measured, predict_run, replanned, run_model
    from harness.sim.replan import move_seconds
    from harness.scenario.timeline import LinkState

    timeline = ROOT / "scenarios" / "timelines" / "5-worldwide-link-drops.yaml"
    flags = ["--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8",
             "--bandwidth-scale", "0.01", "--timeline", str(timeline), "--replan"]
    spec = plan_run(run_request(flags)).spec
    assert spec.replan.enabled
    new_pipes = [list(reversed(p)) for p in spec.layout.pipelines]  # any other plan will do
    decisions = [{"decided_after": 2, "iteration": 5, "taken": True, "search_s": 0.5, "pipelines": new_pipes,
                  "stages": [list(s) for s in spec.layout.stages]},
                 {"decided_after": 11, "iteration": 14, "taken": False, "search_s": 0.25,
                  "pipelines": new_pipes, "stages": [list(s) for s in spec.layout.stages]}]
    base = dict(run_id="r1", scenario="5-worldwide", system="ours", backend="emu", kernel="uml", devices=8,
                d_pp=spec.layout.pp, d_dp=spec.layout.dp, model="tiny", layers=4, hidden=64, seq=64, batch=8,
                micro_batch=1, seed=0, bandwidth_scale=0.01, pflop=1e-6, pflops=1e-6, tokens_per_s=1.0,
                compute_seconds=0.1, exposed_comm_seconds=0.9, loss=2.0, config=json.dumps(spec.layout.to_json()))
    run = tmp_path / "run"
    write_records(run / "records.csv", [IterationRecord(**base, iteration=it, seconds=1.0) for it in range(1, 16)])
    (run / "manifest.json").write_text(json.dumps({"spec": spec.to_json(), "replans": decisions}))
    rec = max(load_measured(run), key=lambda r: int(r["iteration"]))
    pred = predict_run(rec)
    model = run_model(rec)
    still = predict_run({**rec, "replans": None})
    new = replanned(model.layout, new_pipes, spec.layout.stages)
    assert [p.seconds for p in pred[:3]] == pytest.approx([p.seconds for p in still[:3]])
    assert pred[3].pause_s == 0.5 and pred[3].seconds == pytest.approx(still[3].seconds + 0.5)  # the search
    assert pred[4].seconds == pytest.approx(still[4].seconds)  # the old plan on the dropped link
    state = LinkState.initial(model.topo)
    state.apply(model.topo.timeline.events[0])
    dropped = state.topology(model.topo)
    moves = move_seconds(model.layout, new, model.cfg, model.links(dropped), model.bytes_per_value)[0]
    on_new = model.simulate(dropped, new)[0]
    assert moves > 0 and pred[5].pause_s == pytest.approx(moves)
    assert pred[5].seconds == pytest.approx(moves + on_new)
    assert [p.seconds for p in pred[6:12]] == pytest.approx([on_new] * 6)
    restored = model.simulate(None, new)[0]  # the links back, still the new plan (the second search kept it)
    assert pred[12].pause_s == 0.25 and pred[12].seconds == pytest.approx(0.25 + restored)
    assert [p.seconds for p in pred[13:]] == pytest.approx([restored] * 3)
