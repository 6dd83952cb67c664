"""The timeline controller's clock and bookkeeping (harness/network/timeline_control.py), without a kernel: the
changes it would make are caught where they would go to netlink. The kernel side is
tests/test_timeline_emulated.py."""
import json
import threading
import time
import textwrap
from dataclasses import replace

import pytest

from harness.network.plan import build_plan, device_addresses
from harness.network.timeline_control import TimelineController, TimelineError, check_timeline
from harness.scenario import load_scenario, load_timeline


def wait_for(condition, what: str, deadline_s: float = 10.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.fixture
def world(tmp_path):
    topo = load_scenario("5", devices=8)
    (tmp_path / "t.yaml").write_text(textwrap.dedent("""
        events:
          - {at_s: 0.05, from: Tokyo, to: Seoul, one_way: true, delay_ms: 50}
          - {at_iteration: 2, from: Virginia, to: Ohio, bandwidth_factor: 0.5}
    """))
    topo = replace(topo, timeline=load_timeline(tmp_path / "t.yaml", topo))
    addrs, prefix = device_addresses(topo.n)
    plan = build_plan(topo, addrs, [f"d{i}" for i in range(topo.n)], prefix_len=prefix)
    return topo, plan


def test_the_marks_clock_waits_for_iteration_0_fires_iteration_events_and_restores_for_the_next_run(world, tmp_path):
    topo, plan = world
    marks, log = tmp_path / "marks", tmp_path / "log.jsonl"
    c = TimelineController(topo.timeline, topo, plan, [], clock="marks", marks_path=marks, log_path=log)
    calls, region_calls = [], []
    c._to_kernel = lambda touched, regions: (calls.append(touched), region_calls.append(regions),
                                             time.monotonic())[-1]
    c._problems = lambda sock, want: []  # the kernel holds at once what it is given
    c._t_command = time.monotonic()
    thread, verifier = threading.Thread(target=c._run, args=([],)), threading.Thread(target=c._verify, args=([],))
    thread.start()
    verifier.start()
    try:
        with open(marks, "a") as f:
            f.write("run 0\n")
        # training began a second ago (rank 0 marks iteration 0 as it ends): the 0.05 s event is due at once
        began = time.monotonic() - 1.0
        with open(marks, "a") as f:
            f.write(f"iteration 0 {began:.6f}\niteration 1 {began + 0.5:.6f}\n")
        wait_for(lambda: len(c.log) == 1, "the time event")
        first = c.log[0]
        assert first.run == 0 and first.due_s == 0.05 and first.applied_s >= 1.0 and first.iteration == 1
        assert first.pairs == 1  # one way, one device in each region at 8 devices
        (d, links), = calls[0].items()
        assert topo.regions[topo.device_region[d]].name == "Tokyo" and links[0].delay_us == 50_000
        # iteration 2 as two ranks mark it (ours: every rank): it begins with the last of them
        with open(marks, "a") as f:
            f.write(f"iteration 2 {time.monotonic():.6f} 2\n")
        wait_for(lambda: c.marks_read == marks.stat().st_size, "the first rank's mark read")
        assert len(c.log) == 1
        with open(marks, "a") as f:
            f.write(f"iteration 2 {time.monotonic():.6f} 2\n")
        wait_for(lambda: len(c.log) == 2, "the iteration event")
        second = c.log[1]
        assert second.iteration == 2 and second.due_s is None and second.pairs == 2
        halved = [lk for links in calls[1].values() for lk in links]
        base = {(dev.index, lk.dst): lk for dev in plan.devices for lk in dev.links}
        for d, links in calls[1].items():
            for lk in links:
                assert lk.rate_bps == pytest.approx(base[(d, lk.dst)].rate_bps / 2, rel=1e-6)
                assert lk.limit_packets < base[(d, lk.dst)].limit_packets  # the queue follows the rate
        assert len(halved) == 2
        # case 5 is shaped per destination region: each link's region class takes the halved rate first
        base_rc = {(dev.index, rc.region): rc for dev in plan.devices for rc in dev.region_classes}
        moved = {(d, rc.region): rc for d, rcs in region_calls[1].items() for rc in rcs}
        assert len(moved) == 2 and all(rc.rate_bps == pytest.approx(base_rc[k].rate_bps / 2, rel=1e-6)
                                       for k, rc in moved.items())
        assert all(lk.parent_minor == moved[(d, topo.device_region[lk.dst])].class_minor
                   for d, links in calls[1].items() for lk in links)
        d0 = next(iter(moved))[0]
        assert c._device_now(d0).region_classes != plan.devices[d0].region_classes  # what the verifier reads back
        # the next run of the boot: every changed link back to the scenario's, then its timeline from the start
        with open(marks, "a") as f:
            f.write("run 1\n")
        wait_for(lambda: len(calls) == 3, "the restore")
        restored = {(d, lk.dst): lk for d, links in calls[2].items() for lk in links}
        assert len(restored) == 3 and all(lk == base[k] for k, lk in restored.items())
        back = {(d, rc.region): rc for d, rcs in region_calls[2].items() for rc in rcs}
        assert back == {k: base_rc[k] for k in moved}
        with open(marks, "a") as f:
            f.write(f"iteration 0 {time.monotonic():.6f}\n")
        wait_for(lambda: len(c.log) == 3, "run 1's time event")
        assert c.log[2].run == 1 and c.log[2].applied_s >= 0.05
    finally:
        c._stop.set()
        thread.join()
        c._checks.put(None)
        verifier.join()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["run"] for x in lines] == [0, 0, 1] and lines[1]["iteration"] == 2
    assert all(x["verified_s"] >= x["effect_s"] >= x["applied_s"] for x in lines)


def test_a_timeline_on_a_link_inside_a_node_is_refused_before_anything_boots(tmp_path):
    topo = load_scenario("1", devices=8)  # 2 nodes x 4 V100, NVLink inside: not shaped
    (tmp_path / "t.yaml").write_text("events: [{at_s: 1, from: node-0, to: node-0, delay_ms: 1}]\n")
    with pytest.raises(TimelineError, match="inside a node"):
        check_timeline(load_timeline(tmp_path / "t.yaml", topo), topo)
    (tmp_path / "ok.yaml").write_text("events: [{at_s: 1, from: node-0, to: node-1, delay_ms: 1}]\n")
    check_timeline(load_timeline(tmp_path / "ok.yaml", topo), topo)


def test_net_verify_timeline_takes_time_events_of_a_held_timeline_only(tmp_path):
    from harness.errors import HarnessError
    from harness.network.verify_timeline import planned_changes

    topo = load_scenario("5", devices=8)
    for text, message in (("events: [{at_iteration: 2, from: Tokyo, to: Seoul, delay_ms: 50}]", "at_iteration"),
                          ("trace: {file: t.csv, at_end: wrap}", "wrap")):
        (tmp_path / "t.csv").write_text("time_s,from,to,rate_gbps,delay_ms\n0,Tokyo,Seoul,1,\n1,Tokyo,Seoul,0.5,\n")
        (tmp_path / "t.yaml").write_text(text + "\n")
        with pytest.raises(HarnessError, match=message):
            planned_changes(replace(topo, timeline=load_timeline(tmp_path / "t.yaml", topo)))
    (tmp_path / "t.yaml").write_text("events: [{at_s: 1, from: Tokyo, to: Seoul, down: true}]\n")
    ((change, (d, e), rate, delay),) = planned_changes(replace(topo, timeline=load_timeline(tmp_path / "t.yaml", topo)))
    assert rate == 0 and delay == 34 and {topo.regions[topo.device_region[x]].name for x in (d, e)} == {"Tokyo", "Seoul"}


def test_timeline_flags_refuse_what_they_cannot_do_in_one_line(cli, tmp_path):
    flags = ["--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8"]
    tl = "scenarios/timelines/5-worldwide-link-halves.yaml"
    rc, out, err = cli("run", *flags, "--network", "none", "--timeline", tl)
    assert rc == 2 and "--timeline" in err and "--network none" in err and err.strip().count("\n") == 0
    (tmp_path / "bad.yaml").write_text("events: [{at_s: 1, from: Tokyo, to: Seoul}]\n")
    rc, out, err = cli("emulate", "--scenario", "5", "--devices", "8", "--timeline", tmp_path / "bad.yaml", "--",
                       "true")
    assert rc == 2 and "changes nothing" in err and err.strip().count("\n") == 0
    rc, out, err = cli("run", *flags, "--timeline", tmp_path / "missing.yaml")
    assert rc == 2 and "missing.yaml" in err and err.strip().count("\n") == 0


def test_a_preempted_device_has_every_link_cut_until_it_returns_and_the_launcher_is_told(tmp_path):
    topo = load_scenario("5", devices=8)
    (tmp_path / "t.yaml").write_text(textwrap.dedent("""
        events:
          - {at_s: 0.2, preempt: 3, notice_s: 0.1}
          - {at_s: 0.25, from: Tokyo, to: Seoul, bandwidth_factor: 0.5}
          - {at_s: 0.5, return: 3}
    """))
    topo = replace(topo, timeline=load_timeline(tmp_path / "t.yaml", topo))
    addrs, prefix = device_addresses(topo.n)
    plan = build_plan(topo, addrs, [f"d{i}" for i in range(topo.n)], prefix_len=prefix)
    marks, moves = tmp_path / "marks", tmp_path / "devices"
    c = TimelineController(topo.timeline, topo, plan, [], clock="marks", marks_path=marks, devices_path=moves)
    calls = []
    c._to_kernel = lambda touched, regions: (calls.append(touched), time.monotonic())[1]
    c._problems = lambda sock, want: []
    thread, verifier = threading.Thread(target=c._run, args=([],)), threading.Thread(target=c._verify, args=([],))
    thread.start()
    verifier.start()
    try:
        began = time.monotonic()
        with open(marks, "a") as f:
            f.write(f"run 0\niteration 0 {began:.6f}\n")
        wait_for(lambda: len(c.log) == 2, "the preemption and the link event")
        cut = {(d, lk.dst): lk.loss_pct for d, links in calls[0].items() for lk in links}
        assert len(cut) == 2 * 7 and all(3 in pair for pair in cut) and set(cut.values()) == {100.0}
        tokyo, seoul = (next(d for d in range(8) if topo.regions[topo.device_region[d]].name == n)
                        for n in ("Tokyo", "Seoul"))
        halved = {(d, lk.dst): lk for d, links in calls[1].items() for lk in links}
        if 3 in (tokyo, seoul):  # the preempted device's links stay cut through a link event
            assert all(lk.loss_pct == 100.0 for lk in halved.values())
        else:
            assert all(lk.loss_pct == 0.0 for lk in halved.values())
        wait_for(lambda: len(c.log) == 3, "the return")
        back = {(d, lk.dst): lk for d, links in calls[2].items() for lk in links}
        assert len(back) == 14 and all(lk.loss_pct == 0.0 for lk in back.values())
        assert back[(tokyo, seoul)].rate_bps < plan.devices[tokyo].links[0].rate_bps * 10  # as the timeline has it
    finally:
        c._stop.set()
        thread.join()
        c._checks.put(None)
        verifier.join()
    told = [line.split() for line in moves.read_text().splitlines()]
    assert [(k, int(d)) for k, d, _ in told] == [("notice", 3), ("preempt", 3), ("return", 3)]
    notice, preempt = float(told[0][2]), float(told[1][2])
    assert preempt - notice == pytest.approx(0.1, abs=0.05) and preempt - began >= 0.2
    assert [e.event for e in c.log][0] == "t=0.2 s: device 3 preempted (0.1 s notice)"


def test_a_device_that_shares_a_node_cannot_be_preempted(tmp_path):
    topo = load_scenario("1", devices=8)  # 2 nodes x 4 V100, NVLink inside: not shaped
    (tmp_path / "t.yaml").write_text("events: [{at_s: 1, preempt: 2}]\n")
    with pytest.raises(TimelineError, match="device 2's link node-0 -> node-0 is inside a node"):
        check_timeline(load_timeline(tmp_path / "t.yaml", topo), topo)
