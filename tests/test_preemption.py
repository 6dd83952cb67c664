"""Devices that leave and come back: a timeline's device events and spot market (scenario/preemption.py), and
the simulator's time to N iterations under them for a system that re-plans (ours) and for those that restart
from a checkpoint (sim/preemption.py)."""
from __future__ import annotations

import textwrap
from dataclasses import replace

import numpy as np
import pytest

from harness.compute.model import get_model, stage_params
from harness.plan.request import LayoutRequest
from harness.scenario import load_scenario, load_timeline
from harness.scenario.preemption import device_events
from harness.scenario.topology import ScenarioError
from harness.sim.preemption import DETECT_S, TORCHRUN_DETECT_S, TORCHRUN_LAST_CALL_S, RecoveryModel, predict_spot
from harness.sim.sweep import Simulator
from harness.sim.systems import SimError

CFG = get_model("tiny", 4)
BATCH = 8
START_S = 2.0  # a process start, given (measured_start_s times one on the machine)
SEARCH_S = 0.5  # a re-plan's search, given (timed as it runs, it grows with the machine's load)


@pytest.fixture(scope="module")
def topo():
    return load_scenario("2-spot", devices=8).scaled(0.01)


@pytest.fixture(scope="module")
def sim(topo):
    return Simulator(topo, d_pp=4)


def timeline(tmp_path, topo, text: str):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    return load_timeline(path, topo)


def test_device_events_and_a_seeded_spot_market(tmp_path, topo):
    tl = timeline(tmp_path, topo, """
        events:
          - {at_s: 30, preempt: 3, notice_s: 10}
          - {at_s: 90, return: 3}
          - {at_iteration: 4, preempt: 0}
        spot: {rate_per_hour: {p3.2xlarge: 6}, down_s: 300, seed: 7}
    """)
    timed, by_iteration = device_events(tl, topo, 7200.0)
    assert [e.describe() for e in by_iteration] == ["iteration 4: device 0 preempted"]
    explicit = [e for e in timed if "draw" not in e.where]
    assert [e.describe() for e in explicit] == ["t=30 s: device 3 preempted (10 s notice)", "t=90 s: device 3 returns"]
    drawn = [e for e in timed if "draw" in e.where]
    # only the single-GPU nodes (devices 4..7 of the 8-device case) are on the market; each alternates
    assert drawn and {e.device for e in drawn} <= {4, 5, 6, 7}
    for d in {e.device for e in drawn}:
        kinds = [e.kind for e in drawn if e.device == d]
        assert kinds == ["preempt", "return"] * (len(kinds) // 2) + ["preempt"] * (len(kinds) % 2)
    assert [e.at_s for e in timed] == sorted(e.at_s for e in timed)
    # seeded: the same draws again; a device's draws are its own (another seed moves them)
    again, _ = device_events(tl, topo, 7200.0)
    assert again == timed
    other = timeline(tmp_path, topo, "spot: {rate_per_hour: {p3.2xlarge: 6}, down_s: 300, seed: 8}")
    assert [e.at_s for e in device_events(other, topo, 7200.0)[0]] != [e.at_s for e in drawn]
    # the rate is per device-hour: over many hours the count of preemptions is near rate x hours x devices
    busy = timeline(tmp_path, topo, "spot: {rate_per_hour: 2, down_s: 60, seed: 1}")
    hours = 200
    n = sum(e.kind == "preempt" for e in device_events(busy, topo, hours * 3600.0)[0])
    expected = 8 * hours / (1 / 2 + 60 / 3600)  # a device is away for down_s after each
    assert abs(n - expected) < 4 * np.sqrt(expected), (n, expected)


@pytest.mark.parametrize("text, message", [
    ("events: [{at_s: 1, preempt: 3, return: 3}]", "timeline.events[0]: give preempt or return, not both"),
    ("events: [{at_s: 1, return: 3, notice_s: 5}]", "timeline.events[0].notice_s: only a preempt has a notice"),
    ("events: [{at_s: 1, preempt: -1}]", "timeline.events[0].preempt: must be an integer >= 0 (got -1)"),
    ("events: [{preempt: 1}]", "timeline.events[0]: needs exactly one of at_s, at_iteration"),
    ("events: [{at_s: 1, preempt: 1, delay_ms: 4}]", "timeline.events[0].delay_ms: not a key of a device event"),
    ("events: [{at_s: 1, preempt: 1, notice_s: -2}]", "timeline.events[0].notice_s: must be >= 0 (got -2)"),
    ("spot: {down_s: 5}", "timeline.spot.rate_per_hour: missing"),
    ("spot: {rate_per_hour: {mars: 1}}", "timeline.spot.rate_per_hour: unknown region 'mars'"),
    ("spot: {rate_per_hour: 1, down_s: 0}", "timeline.spot.down_s: must be > 0 (got 0)"),
    ("spot: {rate_per_hour: 1, every: 3}", "timeline.spot.every: unknown key"),
])
def test_bad_device_events_are_one_line(tmp_path, topo, text, message):
    with pytest.raises(ScenarioError) as e:
        timeline(tmp_path, topo, text)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("events: [{at_s: 1, preempt: 8}]", "timeline.events[0].preempt: device 8 is not in the run (devices 0..7)"),
    ("events: [{at_s: 1, preempt: 2}, {at_s: 2, preempt: 2}]", "timeline.events[1].preempt: device 2 is already"),
    ("events: [{at_s: 1, return: 2}]", "timeline.events[0].return: device 2 was not preempted before"),
])
def test_events_that_do_not_fit_the_run_are_one_line(tmp_path, topo, text, message):
    with pytest.raises(ScenarioError) as e:
        device_events(timeline(tmp_path, topo, text), topo, 100.0)
    assert message in str(e.value) and "\n" not in str(e.value)


def predict(sim, tl, system, iterations=40, **kw):
    layout = kw.pop("layout", None)
    return predict_spot(sim, system, CFG, BATCH, tl, iterations, RecoveryModel(start_s=START_S, search_s=SEARCH_S, **kw),
                        layout=layout)


def test_without_events_every_iteration_is_the_plans(tmp_path, topo, sim):
    tl = timeline(tmp_path, topo, "events: [{at_s: 1e9, preempt: 1}]")
    p = predict(sim, tl, "megatron", iterations=10, checkpoint_every=4)
    assert [i.iteration for i in p.iterations] == list(range(10)) and not p.recoveries
    assert p.checkpoints == 2 and p.total_s == pytest.approx(p.accounted_s())
    assert len({i.seconds for i in p.iterations}) == 1


def test_links_that_change_and_devices_that_leave_are_predicted_in_one_loop(tmp_path, topo, sim):
    def slowed(at):  # every link at a quarter of its rate from `at` on
        return f"{{at_s: {at}, from: '*', to: '*', bandwidth_factor: 0.25}}"

    T = predict(sim, timeline(tmp_path, topo, "events: [{at_s: 1e9, preempt: 1}]"), "megatron", 6).iterations[0].seconds
    T_slow = predict(sim, timeline(tmp_path, topo, f"events: [{slowed(0)}, {{at_s: 1e9, preempt: 1}}]"), "megatron",
                     6).iterations[0].seconds
    assert T_slow > 1.5 * T
    # a change halfway through iteration 3: the half done stays done, the rest goes at the slow links' pace
    p = predict(sim, timeline(tmp_path, topo, f"events: [{slowed(3.5 * T)}, {{at_s: 1e9, preempt: 1}}]"),
                "megatron", iterations=12)
    assert [i.seconds for i in p.iterations[:3]] == pytest.approx([T] * 3, rel=1e-9)
    assert p.iterations[3].seconds == pytest.approx(0.5 * T + 0.5 * T_slow, rel=1e-9)
    assert [i.seconds for i in p.iterations[4:]] == pytest.approx([T_slow] * 8, rel=1e-9)
    # and with a device that leaves after the change: its restart, then iterations at the slow links' pace
    both = predict(sim, timeline(tmp_path, topo, f"events: [{slowed(3.5 * T)}, {{at_s: {p.iterations[6].start_s + 1e-3}, "
                                                 "preempt: 3}]"), "megatron", iterations=12)
    (r,) = both.recoveries
    assert r.kind == "restart" and r.lost_iterations == 7  # no checkpoint: iterations 0-5 and the one in flight
    assert [i.iteration for i in both.iterations] == list(range(12)) and both.iterations[0].start_s > r.at_s
    assert both.total_s == pytest.approx(both.accounted_s()) and both.total_s > p.total_s


def test_ours_replans_on_the_survivors_and_loses_only_the_iteration_in_flight(tmp_path, topo, sim):
    base = predict(sim, timeline(tmp_path, topo, "events: [{at_s: 1e9, preempt: 1}]"), "ours", checkpoint_every=5)
    T = base.iterations[0].seconds
    at = base.iterations[10].start_s + 0.5 * T  # halfway through iteration 10
    p = predict(sim, timeline(tmp_path, topo, f"events: [{{at_s: {at}, preempt: 3}}]"), "ours", checkpoint_every=5)
    (r,) = p.recoveries
    assert r.kind == "replan" and r.detect_s == DETECT_S and r.lost_iterations == 1
    assert r.lost_s == pytest.approx(0.5 * T, rel=0.05)
    assert r.replan_s == SEARCH_S and r.transfer_s > 0 and r.restart_s == START_S and r.devices_after < 8
    # its runtime starts the processes again (train/snapshots.py): a process start, and no checkpoint load
    assert [i.iteration for i in p.iterations] == list(range(40))  # nothing redone but the one in flight
    after = [i for i in p.iterations if i.start_s > at]
    assert after[0].iteration == 10 and after[0].start_s == pytest.approx(at + r.seconds)
    assert {i.devices for i in after} == {r.devices_after}
    assert p.total_s == pytest.approx(p.accounted_s())
    # by default the search is the scheduler's, timed as it runs
    timed = predict_spot(sim, "ours", CFG, BATCH, timeline(tmp_path, topo, f"events: [{{at_s: {at}, preempt: 3}}]"),
                         40, RecoveryModel(start_s=START_S, checkpoint_every=5))
    assert timed.recoveries[0].replan_s not in (0.0, SEARCH_S)


def test_baselines_restart_from_their_last_checkpoint(tmp_path, topo, sim):
    tl = timeline(tmp_path, topo, "events: [{at_s: 3.1, preempt: 3}, {at_s: 200, return: 3}]")
    for system, layout in (("megatron", None), ("deepspeed", LayoutRequest(zero=1, pp=2, dp=4))):
        p = predict(sim, tl, system, iterations=40, checkpoint_every=4, layout=layout)
        r = p.recoveries[0]
        T = p.iterations[0].seconds
        done = int(3.1 // T)  # iterations done before the preemption (checkpoints are short here)
        assert r.kind == "restart" and r.detect_s == TORCHRUN_DETECT_S
        # a node is missing: the rendezvous waits its last call; every process starts; the checkpoint loads
        assert r.restart_s > TORCHRUN_LAST_CALL_S + START_S
        assert r.lost_iterations == done - (done // 4) * 4 + 1, (system, done)
        assert r.devices_after < 8 and [i.iteration for i in p.iterations] == list(range(40))
        assert p.total_s == pytest.approx(p.accounted_s())
        # its device back at 200 s: torchrun restarts the job again, on all of them
        if p.total_s > 200:
            assert p.recoveries[1].event.startswith("device(s) [3] back") and p.recoveries[1].devices_after == 8


def test_diloco_goes_on_without_a_lost_replica_and_heals_one_back_with_no_restart(tmp_path, topo, sim):
    """A quorum system (sim/quorum.py): device 3 lost halfway through iteration 6 (H = 4: 2 steps since its sync
    at 3); the others finish iterations 6 and 7, then their quorum waits out its heartbeats; they go on as 7 replicas,
    nothing redone. Back later, its process starts, takes its own 4 steps, joins the others' next quorum and
    heals from a peer: the peer's state over the link, which that sync waits for."""
    from harness.plan import systems as registry

    opts, N = {"sync_every": 4}, 100
    q = registry.get("diloco").quorum_model_of(CFG, opts, 8)
    never = predict_spot(sim, "diloco", CFG, BATCH, timeline(tmp_path, topo, "events: [{at_s: 1e9, preempt: 1}]"), N,
                         RecoveryModel(start_s=START_S), options=opts)
    T = never.iterations[0].seconds
    lost_at = never.iterations[6].start_s + 0.5 * T
    back_at = lost_at + q.heartbeat_timeout_s + 10 * T  # after the others' quorum went on without it
    tl = timeline(tmp_path, topo, f"events: [{{at_s: {lost_at}, preempt: 3}}, {{at_s: {back_at}, return: 3}}]")
    p = predict_spot(sim, "diloco", CFG, BATCH, tl, N, RecoveryModel(start_s=START_S), options=opts)
    lost, join = p.recoveries
    assert lost.kind == "quorum" and lost.lost_iterations == 2 and lost.devices_after == 7
    assert lost.detect_s == pytest.approx(max(0.0, min(q.heartbeat_timeout_s - 1.5 * T, q.join_timeout_s)))
    assert lost.detect_s > 0  # here its heartbeats outlast the others' steps to their quorum
    assert lost.restart_s == 0 and lost.lost_s == 0  # no restart, nothing of the run thrown away
    assert [i.iteration for i in p.iterations] == list(range(N))
    assert [i.devices for i in p.iterations[:7]] == [8] * 7 and p.iterations[7].devices == 7
    joined = next(i for i in p.iterations if i.start_s >= join.at_s)
    assert join.kind == "join" and join.event == "device(s) [3] back" and join.devices_after == 8
    assert joined.iteration % 4 == 0 and joined.devices == 8  # at a quorum
    assert join.at_s >= back_at + START_S + 4 * p.iterations[7].seconds  # started, then its own 4 steps
    assert join.transfer_s == pytest.approx(q.heal_s(sim.links, 0, 3)) and join.lost_iterations == 4
    assert p.total_s == pytest.approx(p.accounted_s())
    # the quorum's replicas keep their share of the batch: 7 of them take less than 8
    assert p.iterations[9].seconds <= T
    restarted = predict_spot(sim, "diloco", CFG, BATCH, tl, N, RecoveryModel(start_s=START_S, restart_all=True),
                             options=opts)
    assert restarted.recoveries[0].kind == "restart" and restarted.total_s > p.total_s


def test_diloco_pipeline_replicas_keep_their_pipelines_through_a_loss_and_a_return(tmp_path, topo, sim):
    """Replicas that are ours' pipelines (--replica-stages 2, as pipeline_replicas.py trains them): device 3 lost
    takes its pipeline; the other three go on as they were placed (not laid out anew); back, the pipeline joins a
    quorum once both its devices are, each stage healing from the same stage of the first pipeline in it."""
    from harness.plan import systems as registry
    from harness.sim.survivor_plans import SurvivorPlanner
    from harness.systems.diloco.sim import HEAL_BYTES_PER_PARAM

    opts, N = {"sync_every": 4, "replica_stages": 2}, 120
    planner = SurvivorPlanner(sim, "diloco", CFG, BATCH, None, opts)
    whole = planner.plan(range(8))
    pipelines = [tuple(whole.devices[d] for d in p) for p in whole.layout.pipelines]
    mine = next(p for p in pipelines if 3 in p)
    others = [p for p in pipelines if p != mine]
    q = registry.get("diloco").quorum_model_of(CFG, opts, 8)
    never = predict_spot(sim, "diloco", CFG, BATCH, timeline(tmp_path, topo, "events: [{at_s: 1e9, preempt: 1}]"), N,
                         RecoveryModel(start_s=START_S), options=opts)
    T = never.iterations[0].seconds
    assert T == pytest.approx(whole.seconds)
    lost_at = never.iterations[6].start_s + 0.5 * T
    back_at = lost_at + q.heartbeat_timeout_s + 10 * T
    tl = timeline(tmp_path, topo, f"events: [{{at_s: {lost_at}, preempt: 3}}, {{at_s: {back_at}, return: 3}}]")
    p = predict_spot(sim, "diloco", CFG, BATCH, tl, N, RecoveryModel(start_s=START_S), options=opts)
    lost, join = p.recoveries
    assert lost.kind == "quorum" and lost.lost_iterations == 2 and lost.devices_after == 6
    kept = planner.keeping_pipelines(whole, [d for p in others for d in p])
    assert [tuple(kept.devices[d] for d in p) for p in kept.layout.pipelines] == others  # as placed
    assert p.iterations[7].devices == 6 and p.iterations[8].seconds == pytest.approx(kept.seconds)
    assert join.event == f"device(s) {sorted(mine)} back" and join.devices_after == 8 and join.lost_iterations == 4
    assert join.at_s >= back_at + START_S + 4 * kept.seconds
    stages = stage_params(CFG, list(whole.layout.layers_per_stage))
    heal = max(replace(q, heal_bytes=stages[j] * HEAL_BYTES_PER_PARAM).heal_s(sim.links, others[0][j], mine[j])
               for j in range(2))
    assert join.transfer_s == pytest.approx(heal)
    assert p.iterations[-1].devices == 8 and p.total_s == pytest.approx(p.accounted_s())


def test_a_notice_lets_ours_leave_the_device_before_it_goes(tmp_path, topo, sim):
    tl = timeline(tmp_path, topo, "events: [{at_s: 20, preempt: 3, notice_s: 15}]")
    p = predict(sim, tl, "ours", iterations=400)
    assert p.total_s > 20
    (r,) = p.recoveries
    assert r.kind == "graceful" and r.lost_iterations == 0 and r.detect_s == 0 and r.lost_s == 0
    assert r.at_s >= 5.0 and r.at_s + r.seconds <= 20.0
    assert p.total_s == pytest.approx(p.accounted_s())


def test_a_device_back_joins_ours_at_a_boundary(tmp_path, topo, sim):
    tl = timeline(tmp_path, topo, "events: [{at_s: 1, preempt: 3}, {at_s: 12, return: 3}]")
    p = predict(sim, tl, "ours", iterations=200)
    kinds = [r.kind for r in p.recoveries]
    assert kinds == ["replan", "join"], p.recoveries
    join = p.recoveries[1]
    assert join.at_s >= 12 + START_S and join.devices_after == 8 and join.lost_iterations == 0
    assert p.iterations[-1].devices == 8 and p.total_s == pytest.approx(p.accounted_s())


def test_ours_restarts_from_its_checkpoint_when_no_copy_of_a_stage_survives(tmp_path, topo, sim):
    tl = timeline(tmp_path, topo, "events: [{at_s: 0.5, preempt: 5}]")
    model = RecoveryModel(start_s=START_S, checkpoint_every=3)
    deep = get_model("tiny", 8)  # one pipeline of 8 stages: every device holds the only copy of its stage
    q = predict_spot(sim, "ours", deep, BATCH, tl, 30, model, layout=LayoutRequest(pp=8, dp=1))
    r = q.recoveries[0]
    assert r.kind == "restart" and "no copy of some stage survives" in r.event
    assert r.detect_s == DETECT_S and r.restart_s >= START_S and r.lost_iterations >= 1
    assert [i.iteration for i in q.iterations] == list(range(30)) and q.total_s == pytest.approx(q.accounted_s())
    # 4 x 2 keeps a copy of every stage: re-planned
    p = predict_spot(sim, "ours", deep, BATCH, tl, 30, model, layout=LayoutRequest(pp=4, dp=2))
    assert p.recoveries[0].kind == "replan"


SIM = ("sim", "--scenario", "2", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8", "--d-pp", "4")


def test_sim_predicts_every_system_under_devices_that_leave(cli, tmp_path, topo):
    import pandas as pd

    path = tmp_path / "t.yaml"
    path.write_text("events: [{at_s: 0.05, preempt: 3}, {at_s: 12, return: 3}]")
    # --process-start and --replan-search given: by default each is timed on this machine, which load makes longer
    rc, out, err = cli(*SIM, "--timeline", path, "--checkpoint-every", "5", "--iterations", "10000",
                       "--process-start", START_S, "--replan-search", SEARCH_S, "--out", tmp_path / "run")
    assert rc == 0, err
    table = out.split("devices that leave and come back")[1].split("\n\n")[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert rows["ours"][1] == "replan" and rows["megatron"][1] == "restart" and rows["deepspeed"][1] == "restart"
    assert rows["diloco"][1] == "quorum"  # torchft's: the others go on
    assert "no layout rule" in table  # dtfm: said, not left out
    rec = pd.read_csv(tmp_path / "run" / "recoveries.csv")
    ours, megatron = rec[rec.system == "ours"], rec[rec.system == "megatron"]
    assert list(ours.kind) == ["replan", "join"] and set(megatron.kind) == {"restart"}
    assert list(rec[rec.system == "diloco"].kind) == ["quorum"]  # it ends before device 3 is back
    assert (megatron.detect_s.iloc[0], ours.detect_s.iloc[0]) == (TORCHRUN_DETECT_S, DETECT_S)
    assert list(ours.replan_s) == [SEARCH_S, SEARCH_S]
    it = pd.read_csv(tmp_path / "run" / "spot.csv")
    assert (it.groupby("system").iteration.count() == 10000).all()
    # time to the 10,000 useful iterations, as printed: the last iteration's end
    ends = it.assign(end=it.start_s + it.seconds).groupby("system").end.max()
    assert float(rows["ours"][2]) == pytest.approx(ends["ours"], abs=0.06)
    # a seeded market, by region
    rc, out, err = cli(*SIM, "--system", "megatron", "--preempt-rate", "p3.2xlarge=120", "--preempt-down", "20",
                       "--preempt-seed", "3", "--iterations", "3000", "--process-start", START_S,
                       "--out", tmp_path / "market")
    assert rc == 0, err
    drawn = pd.read_csv(tmp_path / "market" / "recoveries.csv")
    assert len(drawn) >= 2 and set(drawn.kind) == {"restart"}


def test_sim_recovery_restart_predicts_ours_as_harness_run_recovers_it_with_the_runs_agent_timers(cli, tmp_path):
    import pandas as pd

    path = tmp_path / "t.yaml"
    path.write_text("events: [{at_s: 0.05, preempt: 3}, {at_s: 12, return: 3}]")
    rc, out, err = cli(*SIM, "--system", "ours", "--timeline", path, "--checkpoint-every", "5", "--iterations", "10000",
                       "--recovery", "restart", "--keepalive", "1", "--last-call", "2", "--out", tmp_path / "run")
    assert rc == 0, err
    rec = pd.read_csv(tmp_path / "run" / "recoveries.csv")
    assert set(rec.kind) == {"restart"} and rec.detect_s.iloc[0] == 3.0
    # the last call waits only while a device is missing: after the preemption, not after the return
    assert rec.restart_s.iloc[0] - rec.restart_s.iloc[1] == pytest.approx(2.0, abs=0.5)


def test_sim_predicts_an_emulated_run_at_its_scale_with_its_process_start(cli, tmp_path):
    import pandas as pd

    path = tmp_path / "t.yaml"
    path.write_text("events: [{at_iteration: 3, preempt: 5}]")
    flags = ("--timeline", path, "--checkpoint-every", "2", "--iterations", "8", "--keepalive", "1",
             "--last-call", "2", "--process-start", "4.5")
    got = {}
    for scale in ("1", "0.01"):
        rc, out, err = cli(*SIM, "--system", "ours", *flags, "--bandwidth-scale", scale, "--out", tmp_path / scale)
        assert rc == 0, err
        got[scale] = (pd.read_csv(tmp_path / scale / "records.csv"), pd.read_csv(tmp_path / scale / "recoveries.csv"))
    (full, _), (scaled, rec) = got["1"], got["0.01"]
    # the links at 1 % of the scenario's: the records say so, and the iteration takes longer
    assert list(scaled.bandwidth_scale) == [0.01] and list(full.bandwidth_scale) == [1.0]
    assert scaled.seconds.iloc[0] > full.seconds.iloc[0]
    # the restart pays the process start given (an emulated run's, measured there), not this machine's
    assert list(rec.kind) == ["replan"] and rec.restart_s.iloc[0] == 4.5 and rec.detect_s.iloc[0] == 3.0
    rc, out, err = cli(*SIM, "--process-start", "2", "--out", tmp_path / "x")
    assert rc == 2 and "--process-start: only when devices leave" in err


@pytest.mark.parametrize("args, message", [
    (("--preempt-down", "5"), "--preempt-down: only with --preempt-rate"),
    (("--keepalive", "1"), "--keepalive: only when devices leave"),
    (("--checkpoint-every", "3"), "--checkpoint-every: only when devices leave"),
    (("--preempt-rate", "mars=1"), "--preempt-rate: unknown region 'mars'"),
    (("--preempt-rate", "0"), "--preempt-rate: every rate is 0"),
    (("--preempt-rate", "1", "--replan"), "--replan: re-plans when the links change; when devices leave"),
])
def test_sim_spot_flags_refuse_bad_input_in_one_line(cli, tmp_path, args, message):
    rc, out, err = cli(*SIM, *args, "--out", tmp_path / "x")
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


def test_run_refuses_device_events_it_cannot_apply_before_anything_is_written(cli, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("events: [{at_s: 5, preempt: 1}]")
    flags = ("run", "--scenario", "2", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8",
             "--timeline", path, "--results", tmp_path / "res")
    for extra, message in ((("--network", "none"), "--network none has none"),
                           (("--replan",), "timeline.events[0]: --replan follows link changes")):
        rc, out, err = cli(*flags, *extra)
        assert rc == 2 and message in err, err
        assert err.count("\n") == 1 and not (tmp_path / "res").exists()


def test_the_layout_on_the_devices_left_is_one_rule_with_spares_where_the_batch_does_not_split():
    from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
    from harness.plan.survivors import layout_on

    topo = load_scenario("2", devices=8)

    def base(system, **layout):
        return RunRequest(network=NetworkSection(scenario="2", devices=8, mode="none"),
                          model=ModelSection(name="tiny", layers=4, batch=8, micro_batch=1),
                          run=RunSection(system=system), layout=LayoutRequest(**layout))

    left = [d for d in range(8) if d != 5]
    # ours may take another pipeline depth: 7 devices split no batch of 8, so 6 (pp 3 x dp 2) and one spare
    ours, _ = layout_on(base("ours", budget=50), topo, left)
    assert len(ours.devices) == 6 and set(ours.devices) < set(left)
    assert (ours.layout.pp, ours.layout.dp, ours.layout.devices) == (3, 2, 6)
    # a restart keeps megatron's model-parallel degrees: pp 4, so 4 of the 7
    meg, _ = layout_on(base("megatron", tp=1, pp=4, dp=2), topo, left)
    assert (meg.layout.tp, meg.layout.pp, meg.layout.dp, len(meg.devices)) == (1, 4, 1, 4)
    # every device there: the options as given
    full, _ = layout_on(base("megatron", tp=1, pp=4, dp=2), topo, range(8))
    assert full.devices == tuple(range(8)) and full.layout.dp == 2
    # nothing lays out on no device: None and the rule's reason
    assert layout_on(base("megatron", tp=1, pp=4, dp=2), topo, [])[0] is None
    # going on from the survivors' memory: the device that alone holds what device 5 held (its stage's other
    # replica) does not wait as the spare, though it would on bandwidth alone
    from harness.layout import in_rank_order
    from harness.layout.holdings import holdings

    old = in_rank_order(1, 4, 2, 4)  # stage j on devices 2j, 2j + 1
    partner = 4
    held = {d: items for d, items in holdings(old).items() if d != 5}
    by_bandwidth, _ = layout_on(base("ours", budget=50), topo, left)
    kept, _ = layout_on(base("ours", budget=50), topo, left, held)
    assert partner in kept.devices and len(kept.devices) == 6
    assert set().union(*(held[d] for d in kept.devices)) == set().union(*held.values())
    assert partner not in by_bandwidth.devices


def test_calibrate_and_compare_leave_out_an_elastic_runs_iterations_on_fewer_devices(cli, tmp_path):
    """After a preemption an elastic run's iterations ran on a layout of the survivors (numbered as they are):
    not the run's scenario at its devices. They are left out, and said; the others are held as before."""
    import json

    from harness.cli.run_flags import run_request
    from harness.plan.layouts import plan_run
    from harness.results import IterationRecord, write_records
    from harness.sim.compare import load_measured

    spec = plan_run(run_request(["--scenario", "2", "--devices", "8", "--model", "tiny", "--layers", "4",
                                 "--batch", "8", "--network", "none"])).spec
    base = dict(run_id="r1", scenario="2-spot", system="ours", backend="emu", kernel="uml", model="tiny", layers=4,
                hidden=128, seq=128, batch=8, micro_batch=1, seed=0, bandwidth_scale=1.0, seconds=1.0, pflop=1e-6,
                pflops=1e-6, tokens_per_s=1.0, compute_seconds=0.5, exposed_comm_seconds=0.5, loss=2.0)
    whole = dict(devices=8, d_pp=spec.layout.pp, d_dp=spec.layout.dp, config=json.dumps(spec.layout.to_json()))
    survivors = dict(devices=6, d_pp=3, d_dp=2, config=json.dumps({**spec.layout.to_json(), "pp": 3}))
    run = tmp_path / "run"
    write_records(run / "records.csv", [IterationRecord(**base, **(survivors if 3 <= it < 6 else whole),
                                                        iteration=it) for it in range(1, 9)])
    (run / "manifest.json").write_text(json.dumps({"spec": spec.to_json(), "elastic": {"generations": [
        {"devices": list(range(8))}, {"devices": [0, 1, 2, 3, 4, 6]}, {"devices": list(range(8))}]}}))
    notes = []
    assert [r["iteration"] for r in load_measured(run, notes)] == [1, 2, 6, 7, 8]
    assert notes == [f"{run / 'records.csv'}: 3 iterations ran on fewer devices than the run's 8 (after a "
                     "preemption): not compared"]
    rc, out, err = cli("sim", "calibrate", run, "--json", tmp_path / "p.json")
    assert rc == 0, err
    assert "3 iterations ran on fewer devices" in out and (tmp_path / "p.json").exists()
