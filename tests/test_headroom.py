"""The emulated CPU's headroom (network/headroom.py) and the time dilation chosen from it (plan/dilation.py):
no emulated cluster here (the emulated checks are in test_emulated_runs.py)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from harness.network.headroom import HOST_BOUND_BUSY, LATE_SHARE, CpuMonitor, Headroom, Sample, headroom, \
    host_bound, read_guest, tree_cpu_seconds
from harness.plan import dilation
from harness.plan.layouts import plan_run
from harness.plan.request import ComputeSection, LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.results import IterationRecord, read_records, write_records


def _samples(shares, step=0.1, steal=0.0):
    """Cumulative samples whose every step used `share` of one CPU."""
    out, cpu, st = [Sample(100.0, 0.0, 0.0, 1)], 0.0, 0.0
    for k, share in enumerate(shares, 1):
        cpu += share * step
        st += steal * step * 2
        out.append(Sample(100.0 + k * step, cpu, st, 1))
    return out


def test_a_window_weighs_each_step_by_its_overlap():
    s = _samples([1.0] * 10 + [0.0] * 10)
    h = headroom(s, 100.0, 102.0, capacity=1, host_cpus=2)
    assert h.busy == pytest.approx(0.5) and math.isnan(h.saturated)  # no guest samples
    assert headroom(s, 100.0, 101.0, 1, 2).busy == pytest.approx(1.0)
    assert headroom(s, 100.95, 101.05, 1, 2).busy == pytest.approx(0.5)  # half of a busy step, half of an idle one
    assert headroom(s, 100.0, 102.0, capacity=2, host_cpus=2).busy == pytest.approx(0.25)
    assert headroom(_samples([0.2] * 10, steal=0.5), 100.0, 101.0, 1, 2).steal == pytest.approx(0.5)
    assert headroom(s, 90.0, 101.0, 1, 2) is None  # before the first sample: not measured
    assert headroom(s, 101.0, 101.0, 1, 2) is None


def test_the_guest_run_queue_stands_beside_the_hosts_account():
    s = _samples([0.3] * 20)
    guest = [(100.0 + k * 0.1, n, 1) for k, n in enumerate([0, 1, 3, 1, 0, 0, 2, 1, 0, 0])]
    h = headroom(s, 100.0, 101.0, 1, 2, guest)
    assert h.busy == pytest.approx(0.3)  # the host's account is the mark's
    assert h.saturated == pytest.approx(0.2)  # 2 of 10 samples with more runnable tasks than the one CPU
    assert h.runnable == pytest.approx(0.8)
    busy = Headroom(busy=HOST_BOUND_BUSY, saturated=0, runnable=1, steal=0, run_queue=0)
    assert host_bound(busy, paced=False)  # computing for real on the shared CPU: the compute is the host's
    assert not host_bound(replace(busy, busy=HOST_BOUND_BUSY - 0.01), paced=False) and not host_bound(None, False)
    assert not host_bound(busy, paced=True, overruns=0, late_s=0.01, seconds=10.0)  # busy, but the phases on time
    assert host_bound(busy, paced=True, overruns=1, seconds=10.0)  # a real computation outran its modelled time
    assert host_bound(busy, paced=True, late_s=LATE_SHARE * 10.0, seconds=10.0)  # phases woke late
    no_guest = headroom(s, 100.0, 101.0, 1, 2, [])
    assert math.isnan(no_guest.runnable) and no_guest.to_json()["runnable"] is None


def test_guest_lines_read_back_and_bad_lines_are_skipped(tmp_path):
    p = tmp_path / "guest-cpu.txt"
    p.write_text("1.5 2 1\nhalf a line\n2.5 x 1\n3.0 0 1\n")
    assert read_guest(p) == [(1.5, 2, 1), (3.0, 0, 1)]
    assert read_guest(tmp_path / "missing") == []


def test_the_monitor_sees_a_child_burn_cpu_and_a_sleeping_one_not(tmp_path):
    """A real process tree: a child that burns CPU for a while, then one that sleeps as long; the monitor's
    windows over each tell them apart (a ratio in one test, no absolute time)."""
    burn = "import time\nt=time.time()\nwhile time.time()-t<1.0: pass\n"
    mon = CpuMonitor(interval_s=0.05)
    mon.watch(os.getpid(), capacity=1)
    try:
        t0 = time.time()
        subprocess.run([sys.executable, "-c", burn], check=True)
        t1 = time.time()
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1.0)"], check=True)
        t2 = time.time()
    finally:
        mon.stop()
    busy, idle = mon.window(t0, t1), mon.window(t1, t2)
    assert busy is not None and idle is not None
    assert busy.busy > 3 * idle.busy  # a ratio measured in one test: the load on the machine moves both
    assert tree_cpu_seconds(os.getpid()) > 0.5  # the reaped children's seconds count


def test_records_carry_the_mark_and_read_it_back(tmp_path):
    base = dict(run_id="r", scenario="s", system="ours", backend="emu", kernel="uml", devices=2, d_pp=1, d_dp=2,
                model="tiny", layers=2, hidden=8, seq=8, batch=2, micro_batch=1, seed=0, bandwidth_scale=1.0,
                iteration=1, seconds=1.0, pflop=1e-9, pflops=1e-9, tokens_per_s=16, compute_seconds=0.5,
                exposed_comm_seconds=0.5, loss=1.0)
    write_records(tmp_path / "records.csv", [IterationRecord(**base, cpu_busy=0.9, host_bound=True),
                                             IterationRecord(**{**base, "iteration": 2})])
    a, b = read_records(tmp_path / "records.csv")
    assert a["host_bound"] is True and a["cpu_busy"] == 0.9
    assert b["host_bound"] is False and math.isnan(b["cpu_busy"])


def _request(**compute) -> RunRequest:
    return RunRequest(model=ModelSection(name="tiny", layers=4, batch=8, micro_batch=1),
                      layout=LayoutRequest(pp=2, dp=4), network=NetworkSection(scenario="5", devices=8),
                      run=RunSection(system="megatron", iters=2, warmup=1, timeout_auto=True),
                      compute=ComputeSection(model=True, **compute))


def test_a_dilated_iteration_is_modelled_longer_and_the_factor_gives_the_target():
    plan = plan_run(_request(dilate=True))
    t1, t100 = (dilation.modelled_seconds(plan.spec, plan.topo, k) for k in (1, 100))
    assert t100 > 2 * t1  # compute and bandwidth dilate; the delays (world-wide here) do not
    probe = dilation.Probe("megatron", seconds=t1 * 50, busy=0.8, kernel="uml")  # the host bounded it
    d = dilation.choose([(plan.spec, plan.topo)], [probe])
    assert probe.cpu_s <= dilation.TARGET_BUSY * d.expected_s[0]
    smaller = d.factor * 0.9  # the factor is about the least that reaches the target
    assert probe.cpu_s > dilation.TARGET_BUSY * dilation.modelled_seconds(plan.spec, plan.topo, smaller)
    assert f"time dilation {d.factor:g}" in d.line() and d.to_json()["bandwidth_scale"] == pytest.approx(1 / d.factor)
    scaled = plan_run(replace(_request(dilate=True), network=NetworkSection(scenario="5", devices=8,
                                                                              bandwidth_scale=0.01)))
    ds = dilation.choose([(scaled.spec, scaled.topo)], [probe])  # the factor divides the run's own scale
    assert ds.bandwidth_scale == pytest.approx(0.01 / ds.factor)
    assert f"--bandwidth-scale {0.01 / ds.factor:.3g}" in ds.line()
    req = dilation.dilated(_request(dilate=True), d, d.expected_s[0])
    assert req.compute.time_scale == d.factor and req.network.bandwidth_scale == pytest.approx(1 / d.factor)
    assert req.run.timeout_s > (req.run.warmup + req.run.iters) * d.expected_s[0]
    given = dilation.dilated(replace(_request(dilate=True), run=RunSection(timeout_s=50.0)), d, d.expected_s[0])
    assert given.run.timeout_s == 50.0  # a timeout the user gave stays
    cheap = dilation.Probe("megatron", seconds=1.0, busy=1e-6, kernel="uml")
    assert dilation.choose([(plan.spec, plan.topo)], [cheap]).factor == 1.0


def test_a_diloco_probe_is_held_against_its_inner_step_and_its_run_times_out_by_its_syncs():
    """The probe times one iteration; DiLoCo's (H = 100) is an inner step, so the factor is the one that gives the
    inner step the target share, larger than the one its average over a cycle (a sync's share in it) would give;
    a run of its own length holds its syncs, whose expected time its timeout comes from."""
    def req(iters: int, warmup: int) -> RunRequest:
        return RunRequest(model=ModelSection(name="micro", layers=4, batch=32, micro_batch=4),
                          network=NetworkSection(scenario="5", devices=8),
                          run=RunSection(system="streaming-diloco", iters=iters, warmup=warmup, timeout_auto=True),
                          compute=ComputeSection(model=True, dilate=True))

    probed, whole = plan_run(req(1, 1)), plan_run(req(210, 0))
    probe = dilation.Probe("streaming-diloco", seconds=0.45, busy=0.94, kernel="uml")  # measured here
    d = dilation.choose([(probed.spec, probed.topo)], [probe])
    by_cycle = dilation.choose([(whole.spec, whole.topo)], [probe])  # the cycle's average: the sync's share in it
    assert d.factor > 3 * by_cycle.factor
    inner = dilation.modelled_seconds(probed.spec, probed.topo, d.factor)
    assert probe.cpu_s <= dilation.TARGET_BUSY * inner < probe.cpu_s * 1.05
    assert dilation.modelled_seconds(whole.spec, whole.topo, d.factor) > 2 * inner  # 4 syncs in 210 iterations


def test_round_up_keeps_two_digits():
    assert [dilation.round_up(x) for x in (0.3, 1, 1.01, 9.99, 123, 4410, 4500.0)] == [1, 1, 1.1, 10, 130, 4500, 4500]


def test_advice_names_the_flags_to_change():
    plan = plan_run(_request(time_scale=100))
    line = dilation.advice(plan.spec, 2, 3)
    assert "2 of 3" in line and "--compute-time-scale 1000" in line and "\n" not in line
    off = plan_run(replace(_request(), compute=ComputeSection()))
    assert "--compute-model" in dilation.advice(off.spec, 1, 1)


# ----------------------------------------------------------------------------- FL rounds (harness fl --backend emu)
def _fl_round(wall_start: float, end: float, late_s: float = 0.0, overruns: int = 0) -> list[dict]:
    from harness.workloads.fl.models import get_branchy

    n = len(get_branchy("tiny").layers)
    workers = [{"rank": w, "arrivals": [end / 4] * n, "forward_end": end / 2, "end": end, "sent": {},
                "overruns": overruns if w == 0 else 0, "late_s": late_s if w == 1 else 0.0,
                "wall_start": wall_start + 0.01 * w} for w in range(4)]
    return workers + [{"rank": 4, "arrivals": [], "forward_end": float("nan"), "end": end, "sent": {"server": 1},
                       "overruns": 0, "interface_tx_bytes": 1, "wall_start": wall_start}]


def test_an_fl_round_is_marked_host_bound_only_when_the_busy_cpu_made_its_layers_late():
    from harness.systems.owl.emulated import EmuSetting, measured_record, plan_rounds, round_headroom
    from harness.workloads.fl.federation import load_federation
    from harness.workloads.fl.models import get_branchy

    model, fed = get_branchy("tiny"), load_federation("owl-testbed", 4)
    planned = plan_rounds(model, fed, ["naive"], 4)[0]
    monitor = CpuMonitor()
    monitor.samples = _samples([0.9] * 20 + [0.2] * 20)  # 100-102 s busy, 102-104 s idle
    busy = round_headroom(monitor, _fl_round(100.0, 1.5)[:4], [])
    idle = round_headroom(monitor, _fl_round(102.2, 1.5)[:4], [])
    assert busy.busy == pytest.approx(0.9) and idle.busy == pytest.approx(0.2)
    assert round_headroom(monitor, [{"end": 1.0}], []) is None  # a round that did not say when it began

    def record(head, ranks):
        return measured_record(planned, ranks, fed=fed, scaled=fed, model=model, batch=4, run_id="r",
                               setting=EmuSetting(), head=head)
    late = 0.1 * 1.5  # one worker's phases woke 10 % of the round late
    assert record(busy, _fl_round(100.0, 1.5, late_s=late)).host_bound
    assert record(busy, _fl_round(100.0, 1.5, overruns=1)).host_bound
    on_time = record(busy, _fl_round(100.0, 1.5))
    assert not on_time.host_bound and on_time.cpu_busy == pytest.approx(0.9)  # busy, and kept up
    assert not record(idle, _fl_round(102.2, 1.5, late_s=late)).host_bound  # late, but not for the CPU
    assert record(None, _fl_round(100.0, 1.5)).cpu_busy is None


def test_an_fl_dilation_makes_each_probed_round_cost_the_target_share_of_its_modelled_round():
    from harness.systems.owl.emulated import advice, choose_dilation, emulated_federation, EmuSetting
    from harness.workloads.fl import strategies as st
    from harness.workloads.fl.federation import federation, load_topology
    from harness.workloads.fl.models import get_branchy

    model, topo = get_branchy("tiny"), load_topology("owl-testbed", 4)
    feds = [federation(topo, a) for a in (0.5, 1.0)]
    undilated = {n: st.run(n, model, feds[0], 4).seconds for n in ("naive", "owl")}
    probes = [dilation.Probe(n, seconds=200 * undilated[n], busy=0.8, kernel="uml") for n in undilated]
    d = choose_dilation(model, feds, 4, 0.01, probes)

    def modelled(n, k):  # the shortest round over the settings: alpha 1's, with the faster links
        return min(st.run(n, model, emulated_federation(f, 0.01 / k, k), 4).seconds for f in feds)
    for p, expected in zip(probes, d.expected_s):
        assert expected == pytest.approx(modelled(p.label, d.factor))
        assert p.cpu_s <= dilation.TARGET_BUSY * expected
    # the least factor that reaches the target for the dearer probe
    assert any(p.cpu_s > dilation.TARGET_BUSY * modelled(p.label, d.factor * 0.9) for p in probes)
    assert d.bandwidth_scale == pytest.approx(0.01 / d.factor) and "a round cost this host" in d.line()
    assert d.to_json()["unit"] == "round"
    line = advice(1, 5, EmuSetting(bandwidth_scale=0.001, compute_time_scale=300))
    assert "1 of 5 rounds" in line and "--compute-time-scale 3000 --bandwidth-scale 0.0001" in line


def test_fl_without_a_scale_probes_undilated_then_runs_at_the_chosen_dilation(tmp_path, monkeypatch, capsys):
    """The command's path (the emulated cluster replaced by what it returns: its boots are measured in
    test_owl_emulated.py and the issue's proof): a probe boot at scale 1, the rounds at the factor chosen from it,
    the choice in the manifest and on stderr."""
    import json
    from dataclasses import replace as _replace

    from harness.cli import main
    from harness.systems.owl import emulated

    boots = []

    def fake_boot(topo, fed, model, rounds, batch, setting, work, *, run_id, stream=None):
        boots.append(setting)
        scaled = emulated.emulated_federation(fed, setting.bandwidth_scale, setting.compute_time_scale)
        recs = [_replace(emulated.to_record(r, run_id=run_id, fed=fed, model=model, batch=batch), backend="emu",
                         seconds=r.seconds if setting.compute_time_scale > 1 else 2.0, cpu_busy=0.8,
                         bandwidth_scale=setting.bandwidth_scale, compute_time_scale=setting.compute_time_scale)
                for r in emulated.plan_rounds(model, scaled, [x.strategy for x in rounds], batch)]
        return recs, {"kernel": "uml", "readback": {}, "headroom": []}

    monkeypatch.setattr(emulated, "run_fl_emulated", fake_boot)
    out = tmp_path / "run"
    assert main(["fl", "--scenario", "owl-testbed", "--devices", "4", "--model", "tiny", "--strategy", "naive,owl",
                 "--backend", "emu", "--bandwidth-scale", "0.01", "--out", str(out)]) == 0
    probe, run = boots
    assert (probe.compute_time_scale, probe.bandwidth_scale) == (1.0, 0.01)  # undilated, at the user's links
    man = json.loads((out / "manifest.json").read_text())
    k = man["dilation"]["factor"]
    assert k > 1 and run.compute_time_scale == k and run.bandwidth_scale == pytest.approx(0.01 / k)
    assert man["compute_time_scale"] == k and [p["run"] for p in man["dilation"]["probes"]] == ["naive", "owl"]
    assert all(p["cpu_s"] == pytest.approx(1.6) for p in man["dilation"]["probes"])  # 2 s at 80 % busy
    assert f"time dilation {k:g}" in capsys.readouterr().err
    assert boots == [probe, run]
    given = tmp_path / "given"  # a scale given: no probe
    assert main(["fl", "--scenario", "owl-testbed", "--devices", "4", "--model", "tiny", "--strategy", "owl",
                 "--backend", "emu", "--compute-time-scale", "100", "--out", str(given)]) == 0
    assert len(boots) == 3 and boots[2].compute_time_scale == 100
    assert "dilation" not in json.loads((given / "manifest.json").read_text())
