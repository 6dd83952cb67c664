"""OWL in the emulated cluster (one boot): the server and four workers in their own namespaces, parameters over
the shaped links, the server's uplink shared by everything it sends, each worker's interface by everything it
sends, bytes counted as sent, and `sim compare`
predicting each round from the run's scenario and scales."""
from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.systems.owl.compare import compare_fl
from harness.workloads.fl.models import BYTES_PER_PARAM, get_branchy
from harness.workloads.fl.records import read
from tests import emulation

pytestmark = emulation.marks()

SCALE = 0.001  # owl-testbed's 10 / 5 Gbps -> 10 / 5 Mbps: distribution dominates the round
COMPUTE = 10000.0  # an RTX 3080's microseconds of a layer -> tens of milliseconds, above the CPU's own time


def test_five_strategies_over_shaped_links_with_a_shared_uplink(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["fl", "--scenario", "owl-testbed", "--devices", "4", "--model", "tiny", "--batch", "4",
               "--strategy", "naive,overlap,ipart,owl,optimal", "--backend", "emu", "--bandwidth-scale", str(SCALE),
               "--compute-time-scale", str(COMPUTE), "--repeat", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "round 10/10 (optimal)" in captured.err  # worker 0's progress lines came through, nothing else
    assert "socket" not in captured.err
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "ok" and man["backend"] == "emu"
    # the server (device 4) has its uplink as one parent class above the workers' classes
    server = man["boots"][0]["readback"]["4"]["classes"]
    assert {c["classid"]: c["rate_bps"] for c in server}[0xFFFE] == 5e9 * SCALE
    # and every worker what it sends to all its peers together as the simulator limits it: its fastest link
    for w in range(4):
        worker = man["boots"][0]["readback"][str(w)]["classes"]
        assert {c["classid"]: c["rate_bps"] for c in worker}[0xFFFE] == 10e9 * SCALE
    recs = {r.strategy: r for r in read([out])}
    assert set(recs) == {"naive", "overlap", "ipart", "owl", "optimal"}
    # every round's headroom measured over its own window: the emulated CPU's share, in the records and manifest
    assert all(0 < r.cpu_busy <= 1.05 for r in recs.values())
    assert man["headroom"]["measured"] and man["headroom"]["rounds"] == 5
    assert len(man["boots"][0]["headroom"]) == 10 and "dilation" not in man  # the scale was given: no probe
    assert "emulated CPU" in captured.out
    # --repeat 2: every round twice, the fastest recorded (the host's other work only adds to a round)
    rounds_s = man["boots"][0]["rounds_s"]
    assert {n: len(v) for n, v in rounds_s.items()} == dict.fromkeys(recs, 2)
    assert all(recs[n].seconds == min(v) for n, v in rounds_s.items())
    S = get_branchy("tiny").params * BYTES_PER_PARAM
    # counted as sent: a model per worker out of the server under naive, a model per rack under owl, and the
    # rest relayed inside the racks
    assert recs["naive"].server_bytes == 4 * S and sum(recs["naive"].rack_bytes) == 0
    assert recs["owl"].server_bytes == 2 * S and recs["owl"].rack_bytes == (S, S) and recs["owl"].inter_rack_bytes == 0
    # and the server's kernel agrees: its interface sent the payload plus headers (a veth counts a TCP
    # segmentation-offload packet's headers once, so at most 66 bytes per 1448 of payload) and little else: the
    # handshakes, and on a loaded machine retransmissions (CI saw 1.0658 for overlap: 11 segments of 1448 bytes
    # past a margin of 0.02); a miscounted strategy is off by a model (owl sends half of naive's)
    for r in recs.values():
        assert 1 < r.server_wire_bytes / r.server_bytes < 1514 / 1448 + 0.05, (r.strategy, r.server_wire_bytes)
    # the uplink is shared: naive's four models leave through 5 Mbps one after another in effect (unshared, each
    # worker's own 5 Mbps pair would take a quarter of this); 0.9: the shaper's burst
    assert recs["naive"].distribution_seconds > 0.9 * 4 * S / (5e9 * SCALE / 8)
    # owl and optimal beat naive (by 15 % and more on an idle machine, the simulator's margin below; beside two busy
    # loops owl's round measured 0.90 of naive's: the load slows the compute that all three share)
    assert recs["owl"].seconds < recs["naive"].seconds and recs["optimal"].seconds < recs["naive"].seconds
    # the simulator on the run's scenario and scales, uncalibrated (15 % in the proof): a loaded machine only slows
    # a measured round, so the prediction may not exceed one by 25 %. How far below one it may fall is what load
    # moves, and not alike for every strategy (beside two busy loops optimal's round measured 0.52 of naive's,
    # predicted 0.68): the other side is the proof's, on an idle machine; here the prediction orders the
    # strategies the paper does, as the rounds measured above do
    rows = {c.record.strategy: c for c in compare_fl(list(recs.values()))}
    for name, c in rows.items():
        assert c.error < 0.25, (name, c.record.seconds, c.simulated.seconds)
    sim = {name: c.simulated.seconds for name, c in rows.items()}
    assert sim["owl"] < 0.85 * sim["naive"] and sim["optimal"] < sim["naive"], sim
    assert main(["sim", "compare", str(out)]) == 0
    assert "largest round error" in capsys.readouterr().out
