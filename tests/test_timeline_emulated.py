"""A timeline applied live in the emulated cluster (user-mode Linux): the link changes under a running
stream without being reset, and `net verify --timeline` measures each change.

One boot: device 0 sends a numbered UDP stream to device 1 (net verify's delay probe) while the controller
raises the delay, halves the rate, cuts the link and brings it back. Every packet carries its send time on the
guest's monotonic clock (one kernel: both ends read the same clock), so the one-way delay of each is measured
directly.
"""
from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

from harness.network.emulate import run_emulated
from harness.scenario import load_scenario

from .emulation import marks

pytestmark = marks(240)

SCENARIO = """
name: timeline-2dev
device: {gpu: V100}
regions:
  - {name: a, devices: 1}
  - {name: b, devices: 1}
intra_region: {delay_ms: 1, bandwidth_gbps: 1}
inter_region: {delay_ms: 20, bandwidth_gbps: 0.02}
timeline:
  events:
    - {at_s: 2.0, from: a, to: b, delay_ms: 60}
    - {at_s: 2.5, from: a, to: b, bandwidth_factor: 0.5}
    - {at_s: 3.0, from: a, to: b, down: true}
    - {at_s: 3.5, from: a, to: b, down: false}
"""

def test_a_link_changed_live_keeps_its_packets_and_takes_the_new_delay(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO))
    # net verify --timeline's delay probe: 200 stamped, numbered datagrams a second from device 0 to device 1
    spec = tmp_path / "probe.json"
    spec.write_text(json.dumps({"mode": "delay", "pairs": [[0, 1]], "duration_s": 5.6}))
    res = run_emulated(load_scenario(str(scenario)),
                       [sys.executable, "-m", "harness.network.timeline_probe", str(spec), str(tmp_path)],
                       kernel="uml", timeout_s=60, timeline_clock="marks")
    assert res.ok, res.outputs
    log = res.timeline
    assert [e["event"].split(":")[0] for e in log] == ["t=2 s", "t=2.5 s", "t=3 s", "t=3.5 s"]
    assert all(e["pairs"] == 2 for e in log)  # both directions: one class on each device
    # each change was issued when due (UML's one CPU, shared with the host's other work, can stall the
    # guest for a few hundred ms: the log says by how much) and acknowledged by the kernel before its read-back
    # (its read-back too, unless the next change to the same device came first: it is verified with that one)
    # (late by no bound: a loaded host stalls the guest, by 1.5 s beside two busy loops; the windows below are
    # taken between the times the changes were applied, whenever that was)
    for e in log:
        assert e["due_s"] <= e["applied_s"], e
        verified = e["verified_ms"] if e["verified_ms"] is not None or e is log[-1] else e["took_ms"]
        assert 0 <= e["took_ms"] <= verified < 5000, e
    got = np.array(json.loads((tmp_path / "delay-0-1.json").read_text()))
    seq, send, recv = got[:, 0].astype(int), got[:, 1], got[:, 2]
    delay_ms = (recv - send) * 1e3
    raised, halved, cut, back = (e["applied_monotonic"] for e in log)
    cut_on, back_on = (e["applied_monotonic"] + e["took_ms"] / 1e3 for e in log[2:])  # acknowledged
    # no packet sent before the cut was lost: changing the class and netem in place drops nothing queued
    # (from the first that arrived: the receiver may bind its socket after the sender's first datagrams; the
    # clock started once the stream was steady, so it ran for 2 s and more before the first change)
    before_cut = set(seq[send < cut - 0.07])  # minus the new delay: those had arrived before the cut
    expected = set(range(min(before_cut), max(before_cut) + 1))
    assert np.min(recv) < raised - 2.0 and before_cut == expected, f"lost: {sorted(expected - before_cut)}"
    # the delay before the change is the scenario's, after it the event's (UML's timer: a few ms late): read on the
    # fastest tenth of each, since a loaded machine delays packets and cannot speed them up (the median moves)
    # (after it: from its acknowledgement on, which a loaded host delays, as it does cut_on's below)
    raised_on = log[0]["applied_monotonic"] + log[0]["took_ms"] / 1e3
    early, late = delay_ms[send < raised - 0.01], delay_ms[(send > raised_on + 0.01) & (send < cut)]
    assert early.size >= 20 and late.size >= 20, ("packets sent in each window", early.size, late.size)
    fast = (np.percentile(early, 10), np.percentile(late, 10))
    assert 19 <= fast[0] <= 26 and 59 <= fast[1] <= 66, fast
    # never unshaped for a moment (a re-created tree lets packets through at once), and no gap in arrivals
    # above the new delay beyond what the sender's own pauses explain (a stall of the guest shows in both)
    assert np.min(delay_ms[send < cut]) >= 19
    arrive, sent_at = np.sort(recv[send < cut - 0.07]), np.sort(send[send < cut - 0.07])
    gap_ms, send_gap_ms = np.max(np.diff(arrive)) * 1e3, np.max(np.diff(sent_at)) * 1e3
    assert gap_ms < 60 + send_gap_ms + 10, (gap_ms, send_gap_ms)
    # while cut nothing arrives; once back the stream goes on with nothing lost from then on (how many packets
    # that leaves depends on how late the guest applied "back": beside two busy loops, 127 of the 5.6 s stream;
    # at least 20, as in each window above)
    # (a packet stamped just before `back` may arrive: its sender, stamped, waited for the guest's one CPU while the
    # controller brought the link back, so it left after the link was up and arrives no earlier than the link's
    # 60 ms after `back`, where one let through the cut would have arrived within them; found beside ci-local:
    # stamped 2.6 ms before `back`)
    during = (send > cut_on) & (send < back)
    late_sent = recv[during] >= back + 0.059
    assert np.all(late_sent), (send[during] - cut_on, recv[during] - back, cut_on - cut, back - cut_on)
    after = seq[send > back + 0.005]
    assert len(after) >= 20 and set(after) == set(range(int(after.min()), int(after.max()) + 1)), len(after)


def test_net_verify_timeline_measures_each_change_and_how_long_it_took_to_show(cli, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO).split("timeline:")[0])
    (tmp_path / "t.yaml").write_text(textwrap.dedent("""
        events:
          - {at_s: 2, from: a, to: b, bandwidth_factor: 0.5}
          - {at_s: 4, from: a, to: b, delay_ms: 50}
    """))
    rc, out, err = cli("net", "verify", "--scenario", scenario, "--timeline", tmp_path / "t.yaml", "--kernel", "uml",
                       "--json", tmp_path / "r.json")
    assert rc == 0, out + err
    effects = json.loads((tmp_path / "r.json").read_text())["effects"]
    rate, delay = effects
    assert rate["quantity"] == "rate_mbps" and rate["target"] == pytest.approx(20 * 0.5 * 1448 / 1514, rel=1e-3)
    assert rate["before"] == pytest.approx(20 * 1448 / 1514, rel=0.1) and rate["ok"]
    # shown by the time the kernel acknowledged the change (its tc calls, which a loaded host slows: applied_ms;
    # the class may take the new rate before the last of them returns) plus the old rate's queue draining in
    # 100 ms bins
    assert rate["applied_ms"] >= 0 and 0 < rate["shown_ms"] < rate["applied_ms"] + 1500, rate
    assert delay["quantity"] == "delay_ms" and delay["target"] == 50 and delay["ok"]
    # before and after: medians of one probe on one cluster, so a load that delays packets adds to both; the step
    # between them is the change's (30 ms) within a few of UML's timer ticks
    assert delay["before"] >= 19 and abs((delay["after"] - delay["before"]) - 30) <= 4, delay
    assert 0 <= delay["applied_ms"] and 0 <= delay["shown_ms"] < delay["applied_ms"] + 250, delay
