"""The simulator's transport model (harness/netmodel/tcp.py): its physics on paths where the answer is
known in closed form, and its predictions against transfer curves measured in the emulated cluster
(tests/data/transfer-curves/: `harness net verify --scenario 5 --devices 8 --pairs sample --transfer-curves
DIR` at bandwidth scale 1, with the scenario's tuned TCP settings and with `--transport linux`)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.netmodel.tcp import INITIAL_WINDOW_SEGMENTS, TcpPath
from harness.report.transfer import modelled_seconds, side_by_side
from harness.scenario.transport import LINUX, Transport

DATA = Path(__file__).parent / "data" / "transfer-curves"
R = 125e6  # 1 Gbit/s of payload, in bytes/s
MSS = 1448


def _path(transport=LINUX, rtt=0.1, bucket=0.0, hz=1000):
    return TcpPath.of(R, rtt / 2, rtt, transport, bucket_bytes=bucket, hz=hz)


def test_a_window_that_covers_the_path_sends_at_the_rate_from_the_first_byte():
    big = Transport("cubic", False, 256 << 20, 256 << 20)  # W = 128 MiB >> BDP = 12.5 MB
    p = _path(big)
    b = np.array([1e3, 1e6, 1e8])
    assert p.message_seconds(b) == pytest.approx(0.05 + b / R)


def test_a_window_below_the_bandwidth_delay_product_sends_one_window_per_round_trip():
    p = _path(Transport("cubic", False, 6291456, 4194304))  # W = 3 MiB, BDP = 12.5 MB
    W = 3 << 20
    for k in (1, 2, 5):
        assert p.message_seconds(k * W) == pytest.approx((k - 1) * 0.1 + 0.05 + W / R)
    # Linux's default buffers on a 1 Gbit/s x 100 ms path: a quarter of the rate
    assert (100 * W) / (p.message_seconds(100 * W) - 0.05) == pytest.approx(W / 0.1, rel=0.01)


def test_slow_start_after_idle_halves_the_window_once_per_rto_down_to_the_initial_window():
    p = _path()  # RTO = 100 ms + 200 ms
    W2 = 2 * (3 << 20)
    assert p.rto_s() == pytest.approx(0.3)
    assert p.initial_cwnd(0.0) == pytest.approx(W2)  # 0.05 s of silence: no restart
    assert p.initial_cwnd(0.6 - 0.05 + 1e-6) == pytest.approx(W2 / 4)
    assert p.initial_cwnd(100.0) == pytest.approx(INITIAL_WINDOW_SEGMENTS * MSS)
    # 10 segments after a long idle: 64 KiB (46 segments) needs rounds of 10, 20, 40 segments
    assert p.message_seconds(64 << 10, idle_s=100.0) == pytest.approx(2 * 0.1 + 0.05 + ((64 << 10) - 30 * MSS) / R,
                                                                      rel=1e-3)
    off = _path(Transport("cubic", False, 6291456, 4194304))
    assert off.initial_cwnd(100.0) == pytest.approx(W2)
    # the RTO is kept in clock ticks: 22 ms + 200 ms is 230 ms at HZ=100
    assert _path(rtt=0.022, hz=100).rto_s() == pytest.approx(0.23)


def test_a_token_bucket_lets_its_bytes_through_at_once_once_the_link_has_refilled_it():
    big = Transport("cubic", False, 256 << 20, 256 << 20)
    p = _path(big, bucket=2e6)
    b = 10e6
    assert p.message_seconds(b, idle_s=1.0) == pytest.approx(0.05 + (b - 2e6) / R)
    # right after the last message the bucket holds what one delay refilled (0.05 s x R = 6.25 MB > 2 MB)
    assert p.message_seconds(b, idle_s=0.0) == pytest.approx(0.05 + (b - 2e6) / R)
    small = _path(big, rtt=0.002, bucket=2e6)
    assert small.message_seconds(b, idle_s=0.0) == pytest.approx(0.001 + (b - 0.001 * R) / R)


@pytest.mark.parametrize("name,transport", [("tuned", {"slow_start_after_idle": False}),
                                            ("linux", {"slow_start_after_idle": True, "rmem_max_bytes": 6291456})])
def test_the_model_reproduces_the_curves_measured_in_the_emulated_cluster(name, transport):
    doc = json.loads((DATA / f"case5-{name}.json").read_text())
    assert doc["bandwidth_scale"] == 1 and doc["kernel"] == "uml"
    assert {k: doc["transport"][k] for k in transport} == transport
    want = Transport(**doc["transport"]).sysctls()
    assert all(rb == want for rb in doc["transport_readback"].values())  # every namespace held the settings
    assert want["tcp_congestion_control"] == "cubic"  # measured with CUBIC named (the model has no loss in it)
    measured = np.array([p["seconds"] for p in doc["points"]])
    ideal = np.array([p["ideal_seconds"] for p in doc["points"]])
    err = np.abs(modelled_seconds(doc) / measured - 1)
    # The misses (notes of issue 55): sub-millisecond ones on the 22-28 ms links, where the bucket's bytes
    # take the user-mode kernel's CPU time; the first 32 MB message on a tuned short link, whose window
    # overflows the netem queue (loss, which the model leaves out); one round trip of noise on a long link.
    assert np.median(err) < 0.015 and (err <= 0.05).mean() >= 0.94, side_by_side(doc)
    # ... where delay + size / rate misses by far more on Linux's defaults
    if name == "linux":
        assert np.median(np.abs(ideal / measured - 1)) > 0.3


def test_a_device_to_itself_takes_no_time():
    p = TcpPath.of(np.array([np.inf, R]), np.array([0.0, 0.05]), np.array([0.0, 0.1]), LINUX, bucket_bytes=1e6)
    with np.errstate(all="raise"):
        t = p.message_seconds(1e6, idle_s=[0.0, 0.0])
    assert t[0] == 0.0 and t[1] == pytest.approx(0.05)


def test_sixteen_sockets_move_as_sixteen_connections_each_with_a_sixteenth():
    """NCCL's socket transport stripes a message evenly over its sockets, each at an equal share of the rate: the
    model's one path of 16 sockets takes what one connection takes for a sixteenth of the bytes at a sixteenth of
    the rate, after any silence (16 initial windows when slow start restarts, 16 ceilings on a long path)."""
    one = TcpPath.of(R / 16, 0.05, 0.1, LINUX, hz=1000)
    many = TcpPath.of(R, 0.05, 0.1, LINUX, hz=1000, sockets=16)
    b = np.array([16 * (64 << 10), 8e6, 40e6, 4e8])
    for idle in (0.0, 0.2, 100.0):
        assert many.message_seconds(b, idle) == pytest.approx(one.message_seconds(b / 16, idle), rel=1e-12)
    assert many.initial_window() == 16 * INITIAL_WINDOW_SEGMENTS * MSS
    # Linux's default buffers: 16 x 3 MiB in flight, the whole 1 Gbit/s x 100 ms path (12.5 MB), where one
    # connection moves a quarter of the rate
    assert many.message_seconds(4e8) == pytest.approx(0.05 + 4e8 / R)


def test_the_paper_cases_give_nccl_sixteen_sockets_a_peer_enough_for_every_link_at_linux_defaults():
    """The paper's instances (AWS, ENA NICs) open 16 NCCL sockets a peer; with Linux's default buffers those hold
    more than any link of cases 1-5 carries in a round trip, so the links are filled whatever the buffers."""
    from harness.netmodel.links import Links
    from harness.scenario import load_scenario

    window = min(LINUX.rmem_max_bytes / 2, LINUX.wmem_max_bytes)
    for case in "12345":
        topo = load_scenario(case)
        links = Links.per_device(topo)
        assert links.protocol.sockets == 16 and Links.per_device(topo, "gloo").protocol.sockets == 1
        rate = np.where(np.isinf(links.rate_Bps), 0.0, links.rate_Bps)
        bdp = rate * (links.delay_s + links.delay_s.T)
        assert bdp.max() < 16 * window, case
    assert Links.per_device(load_scenario("fluidstack")).protocol.sockets == 1  # NCCL's default off AWS and GCP
