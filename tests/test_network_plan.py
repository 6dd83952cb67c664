"""The shaping plan (pure: no kernel, no root): units, derived sizes, per-destination layout."""
from __future__ import annotations

import math

import pytest

from harness.errors import HarnessError
from harness.netmodel.tcp import frame_bytes, tcp_efficiency
from harness.network.plan import PlanError, build_plan, device_addresses, target_matrices
from harness.network.tree import render_commands
from harness.network.verify import bulk_rounds, goodput_ok, rtt_ok, select_pairs, warmup_s
from harness.scenario import load_scenario

NET4 = "tests/data/net-4dev.yaml"


def _plan(topo, scale=1.0, **kw):
    addrs, prefix = device_addresses(topo.n)
    return build_plan(topo.scaled(scale), addrs, [f"eth{i}" for i in range(topo.n)], prefix_len=prefix, **kw)


def test_every_ordered_pair_gets_its_own_class_rate_delay_and_filter():
    topo = load_scenario(NET4)
    plan = _plan(topo, scale=0.01)
    assert plan.classes == topo.n * (topo.n - 1)
    for dev in plan.devices:
        assert [link.dst for link in dev.links] == [e for e in range(topo.n) if e != dev.index]
        for link in dev.links:
            d, e = dev.index, link.dst
            assert link.rate_bps == round(topo.bandwidth_gbps[d][e] * 1e9 * 0.01)
            assert link.delay_us == round(topo.delay_ms[d][e] * 1000)  # one-way, on d's egress
            assert link.dst_addr == plan.devices[e].addr
    # the scenario is asymmetric, and so is the plan
    a = {(dev.index, link.dst): link for dev in plan.devices for link in dev.links}
    assert a[(0, 1)].delay_us != a[(1, 0)].delay_us
    assert a[(0, 1)].rate_bps != a[(1, 0)].rate_bps


def test_burst_cburst_and_limit_are_derived_not_constant():
    topo = load_scenario("5", devices=8)
    plan = _plan(topo, scale=0.01)
    links = [link for dev in plan.devices for link in dev.links]
    frame = frame_bytes(plan.mtu)
    for link in links:
        assert link.burst_bytes == link.cburst_bytes >= 2 * frame
        bdp_packets = link.rate_bps / 8 * 2 * link.delay_us / 1e6 / frame
        assert link.limit_packets >= 2 * bdp_packets and link.limit_packets >= 64
        assert frame <= link.quantum_bytes <= 200_000
    # a faster link gets a bigger burst; a longer, faster link a bigger netem limit
    full = _plan(topo, scale=1.0)
    f = {(d.index, link.dst): link for d in full.devices for link in d.links}
    s = {(d.index, link.dst): link for d in plan.devices for link in d.links}
    assert f[(0, 1)].burst_bytes > s[(0, 1)].burst_bytes
    far = max(f.values(), key=lambda link: link.delay_us * link.rate_bps)
    assert far.limit_packets > 10 * s[(0, 1)].limit_packets  # 1.14 Gbps x 124 ms one way
    assert far.limit_packets >= far.rate_bps / 8 * 2.5 * 2 * far.delay_us / 1e6 / frame


def test_bandwidth_scale_scales_rates_only():
    topo = load_scenario(NET4)
    one, small = _plan(topo, 1.0), _plan(topo, 0.25)
    for d1, d2 in zip(one.devices, small.devices):
        for l1, l2 in zip(d1.links, d2.links):
            assert l2.rate_bps == pytest.approx(l1.rate_bps * 0.25, abs=1)
            assert l2.delay_us == l1.delay_us
    assert small.bandwidth_scale == 0.25


@pytest.mark.parametrize("scale", [0, -1, float("inf"), float("nan"), True])
def test_bad_scale_is_a_clear_error(scale):
    from harness.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="bandwidth_scale: must be a finite number > 0"):
        _plan(load_scenario(NET4), scale)


def test_a_scaled_topology_is_one_value_scaled_once():
    topo = load_scenario(NET4)
    twice = topo.scaled(0.5).scaled(0.5)
    assert twice.bandwidth_scale == 0.25
    assert twice.bandwidth_gbps[0, 1] == pytest.approx(topo.bandwidth_gbps[0, 1] / 4)
    assert topo.scaled(1.0) is topo and (twice.delay_ms == topo.delay_ms).all()
    assert topo.scaled(0.5).subset([0, 1]).bandwidth_scale == 0.5


def test_node_internal_links_stay_unshaped():
    topo = load_scenario("1", devices=16)  # 4 nodes x 4 GPUs, NVLink inside
    plan = _plan(topo)
    for dev in plan.devices:
        same = {e for e in range(topo.n) if e != dev.index and topo.device_region[e] == topo.device_region[dev.index]}
        assert set(dev.unshaped) == same
        assert {link.dst for link in dev.links} == set(range(topo.n)) - same - {dev.index}


def test_sixteen_devices_make_240_classes():
    assert _plan(load_scenario("5", devices=16), 0.01).classes == 240


def test_targets_rtt_is_sum_of_both_directions_and_goodput_has_tcp_efficiency():
    topo = load_scenario(NET4)
    rtt, gp = target_matrices(_plan(topo, 0.01))
    for d in range(topo.n):
        for e in range(topo.n):
            if d != e:
                assert rtt[d, e] == pytest.approx(topo.delay_ms[d][e] + topo.delay_ms[e][d])
                assert gp[d, e] == pytest.approx(topo.bandwidth_gbps[d][e] * 1e7 * 1448 / 1514, rel=1e-6)
    assert tcp_efficiency(1500) == pytest.approx(1448 / 1514)
    assert tcp_efficiency(9000) > tcp_efficiency(1500)


def test_render_commands_carry_units_and_every_object():
    plan = _plan(load_scenario(NET4), 0.01)
    cmds = render_commands(plan, [f"ns{i}" for i in range(4)])
    text = "\n".join(cmds)
    assert text.count("htb default 0") == 4
    assert text.count("tc class replace") == text.count("netem delay") == text.count("u32") == 12
    link = plan.devices[0].links[0]
    assert f"rate {link.rate_bps}bit ceil {link.rate_bps}bit burst {link.burst_bytes}b cburst {link.cburst_bytes}b" in text
    assert f"netem delay {link.delay_us}us limit {link.limit_packets}" in text
    assert f"match ip dst {link.dst_addr}/32 flowid 1:{link.class_minor:x}" in text
    assert all(c.startswith(("ip netns exec ns", "#")) for c in cmds)


def test_addresses_are_private_and_errors_name_the_field():
    addrs, prefix = device_addresses(300)
    assert addrs[0] == "10.213.0.1" and len(set(addrs)) == 300 and prefix == 16
    with pytest.raises(PlanError, match="private"):
        device_addresses(4, "8.8.8.0/24")
    with pytest.raises(PlanError, match="room for 2"):
        device_addresses(3, "10.1.1.0/30")
    assert issubclass(PlanError, HarnessError)


def test_bulk_rounds_never_share_a_link_or_its_ack_path():
    for n in (2, 4, 7, 8):
        pairs = select_pairs(n, "all", lambda s, d: True)
        assert len(pairs) == n * (n - 1) and len(set(pairs)) == len(pairs)
        rounds = bulk_rounds(pairs)
        assert sorted(p for r in rounds for p in r) == sorted(pairs)
        for rnd in rounds:
            assert len({s for s, _ in rnd}) == len(rnd) and len({d for _, d in rnd}) == len(rnd)
            assert not any((d, s) in rnd for s, d in rnd)
        assert len(rounds) <= n + 1
    sample = select_pairs(8, "sample", lambda s, d: True)
    assert len(sample) == 16 and (0, 1) in sample and (0, 7) in sample


def test_pass_rules_and_warmup():
    assert rtt_ok(10.79, 10.0) and rtt_ok(9.21, 10.0) and not rtt_ok(10.81, 10.0)  # 0.5 ms + 3 %
    assert rtt_ok(206.4, 200.0) and not rtt_ok(206.6, 200.0) and not rtt_ok(193.4, 200.0)
    assert not rtt_ok(None, 10.0)
    assert goodput_ok(95.1, 100.0) and goodput_ok(104.9, 100.0) and not goodput_ok(94.9, 100.0)
    # slow start needs more time on a long, fast link
    assert warmup_s(1e9, 400, 1500) > warmup_s(1e7, 400, 1500) > warmup_s(1e7, 10, 1500) > 0
    assert math.isfinite(warmup_s(1e6, 0.0, 1500))


def test_plan_rejects_mismatched_inputs():
    topo = load_scenario(NET4)
    with pytest.raises(PlanError, match="addresses"):
        build_plan(topo, ["10.0.0.1"], ["a"])
    with pytest.raises(PlanError, match="mtu"):
        _plan(topo, mtu=10)
    doc = _plan(topo).to_json()
    assert len(doc["devices"]) == 4 and doc["devices"][0]["links"][0]["rate_bps"] == 2_000_000_000


def test_an_interface_limit_is_a_parent_class_that_its_destinations_share():
    """The FL server's uplink: one parent class at the limit; each destination assured an equal share and
    allowed up to its pair's rate (or the limit, when that is lower)."""
    import numpy as np
    from dataclasses import replace

    topo = load_scenario(NET4)
    egress = np.array([np.inf, np.inf, np.inf, 0.5])  # Gbps: device 3's interface
    plan = _plan(replace(topo, interface_gbps=egress), scale=0.01)
    dev = plan.devices[3]
    assert dev.egress_bps == 5_000_000 and [d.egress_bps for d in plan.devices[:3]] == [None] * 3
    for link in dev.links:
        pair = round(topo.bandwidth_gbps[3][link.dst] * 1e9 * 0.01)
        assert link.rate_bps == min(pair, 5_000_000) and link.assured_bps == min(pair, 5_000_000 // 3)
    assert all(link.assured_bps == link.rate_bps for d in plan.devices[:3] for link in d.links)
    cmds = "\n".join(render_commands(plan))
    assert "parent 1: classid 1:fffe htb rate 5000000bit ceil 5000000bit" in cmds
    assert cmds.count("parent 1:fffe classid") == 3
    with pytest.raises(PlanError, match=r"interface_gbps of device 3 \(region .*\) x bandwidth_scale 1: must be at least one"):
        _plan(replace(topo, interface_gbps=np.array([np.inf, np.inf, np.inf, 1e-9])))


def test_a_regions_interface_gbps_is_shaped_as_the_parent_class_of_its_devices(tmp_path):
    from tests.test_scenario import GOOD, write

    p = write(tmp_path, GOOD.replace("{name: A, devices: 2}", "{name: A, devices: 2, interface_gbps: 1.5}"))
    plan = _plan(load_scenario(str(p)), scale=0.01)
    assert [d.egress_bps for d in plan.devices] == [15_000_000, 15_000_000, None, None]
    for dev in plan.devices[:2]:  # three destinations share 15 Mbit/s, each up to its pair's rate
        assert [lk.rate_bps for lk in dev.links] == [15_000_000] * 3
        assert [lk.assured_bps for lk in dev.links] == [5_000_000] * 3
    cmds = "\n".join(render_commands(plan))
    assert cmds.count("classid 1:fffe htb rate 15000000bit ceil 15000000bit") == 2


def test_the_plan_carries_the_scenarios_tcp_settings_with_auto_buffers_sized_from_its_links():
    topo = load_scenario("5", devices=8)
    assert topo.transport.rmem_max_bytes == "auto"
    plan = _plan(topo)
    # the largest round-trip BDP of case 5: 1.15 Gbps x (67 + 67) ms between Oregon and Virginia
    bdp = max(topo.bandwidth_gbps[d, e] * 1e9 / 8 * (topo.delay_ms[d, e] + topo.delay_ms[e, d]) / 1e3
              for d in range(8) for e in range(8) if d != e)
    assert plan.transport["rmem_max_bytes"] == plan.transport["wmem_max_bytes"] == pytest.approx(4 * bdp, rel=1e-6)
    assert plan.to_json()["transport"]["slow_start_after_idle"] is False
    # at 1 % of the bandwidth the links' BDPs are small: Linux's 6 MiB floor
    assert _plan(topo, 0.01).transport["rmem_max_bytes"] == 6291456
    cmds = render_commands(plan, [f"ns{i}" for i in range(8)])
    assert f"ip netns exec ns3 sysctl -qw net.ipv4.tcp_slow_start_after_idle='0'" in cmds
    assert any(c.startswith("ip netns exec ns0 sysctl -qw net.ipv4.tcp_rmem='4096 131072 ") for c in cmds)
    assert not any("tcp_congestion_control" in c for c in cmds)  # the kernel's own
    linux = _plan(load_scenario(NET4))
    assert linux.transport == {"congestion_control": None, "slow_start_after_idle": True,
                               "rmem_max_bytes": 6291456, "wmem_max_bytes": 4194304}


def test_a_super_packet_takes_at_most_a_millisecond_of_the_slowest_link_on_its_interface():
    """HTB lets a whole GSO super-packet through on any tokens left: a slow link gets packets of one frame
    (its small bucket would otherwise pass a message's tail at the veth's speed), a fast one keeps large
    ones (one frame per packet costs UML's CPU its throughput)."""
    topo = load_scenario(NET4)
    frame = frame_bytes(1500)
    for scale, at_least in ((0.01, 1), (1.0, 16)):
        plan = _plan(topo, scale=scale)
        for dev in plan.devices:
            slowest = min(lk.assured_bps for lk in dev.links) / 8
            assert dev.gso_max_segs == max(1, int(slowest * 1e-3 // frame)) >= at_least
    assert {dev.gso_max_segs for dev in _plan(topo, scale=0.01).devices} == {1}
    # a device with no shaped link keeps the kernel's default
    node = _plan(load_scenario("1", devices=8).subset([0, 1, 2, 3]))  # one node: NVLink only
    assert all(not dev.links and dev.gso_max_segs == 65535 for dev in node.devices)


class _RecordingNetlink:
    """Stands in for pyroute2's IPRoute: keeps every tc call apply.py makes."""

    def __init__(self):
        self.calls = []

    def tc(self, command, kind, **kw):
        self.calls.append((command, kind, kw))


def _read_tc(line: str) -> tuple[str, str, dict]:
    """A rendered `tc` command as (pyroute2 command, kind, pyroute2's keyword arguments): parsed from the text,
    independently of tree.py, in netlink's units (rates in bytes/s)."""
    import socket

    words = line.split()[line.split().index("tc"):]
    obj, kind = words[1], next(k for k in ("htb", "netem", "u32") if k in words)
    command = {"qdisc": "add", "class": "add-class", "filter": "add-filter"}[obj]

    def handle(text):
        major, _, minor = text.partition(":")
        return int(major, 16) << 16 | int(minor or "0", 16)

    def after(word, cast=int, strip=""):
        return cast(words[words.index(word) + 1].removesuffix(strip)) if word in words else None

    kw = {}
    if "parent" in words:
        kw["parent"] = handle(after("parent", str))
    if obj == "class":
        kw.update(handle=handle(after("classid", str)), rate=after("rate", strip="bit") // 8,
                  ceil=after("ceil", strip="bit") // 8, burst=after("burst", strip="b"),
                  cburst=after("cburst", strip="b"), mtu=after("mtu"))
        if "quantum" in words:
            kw["quantum"] = after("quantum")
    elif kind == "htb":
        kw.update(handle=handle(after("handle", str)), default=after("default"), r2q=after("r2q"))
    elif kind == "netem":
        delays = words[words.index("delay") + 1:words.index("delay") + 3]
        kw.update(handle=handle(after("handle", str)), delay=int(delays[0].removesuffix("us")),
                  jitter=int(delays[1].removesuffix("us")) if delays[1].endswith("us") else 0,
                  loss=after("loss", float, "%") or 0.0, limit=after("limit"))
    else:
        addr = after("dst", str).removesuffix("/32")
        kw.update(prio=after("prio"), protocol=0x0800, target=handle(after("flowid", str)),
                  keys=["0x" + socket.inet_aton(addr).hex() + "/0xffffffff+16"])
    return command, kind, kw


def test_the_dry_run_prints_exactly_what_apply_sends_the_kernel():
    """`--dry-run` and `net plan` print tree.render_commands; the cluster applies apply.apply_device: every
    object, parent and value the same, the interface limit's class included (its burst and MTU were missing
    from the printed commands when the tree was written twice)."""
    from dataclasses import replace

    import numpy as np

    from harness.network.apply import apply_device, change_link

    topo = load_scenario(NET4)
    egress = np.array([np.inf, np.inf, np.inf, 0.5])  # device 3 has an interface limit
    plan = _plan(replace(topo, interface_gbps=egress), scale=0.01)
    for dev in plan.devices:
        sent = _RecordingNetlink()
        apply_device(sent, 7, dev, fresh=True)
        printed = [_read_tc(c) for c in render_commands(replace(plan, devices=(dev,)))
                   if not c.startswith(("#", "sysctl"))]
        assert [(c, k, {"index": 7, **kw}) for c, k, kw in printed] == sent.calls
        assert len(sent.calls) == 1 + (dev.egress_bps is not None) + 3 * len(dev.links)
        link = replace(dev.links[0], delay_us=dev.links[0].delay_us + 1000, rate_bps=dev.links[0].rate_bps // 2)
        changed = _RecordingNetlink()
        change_link(changed, 7, dev, link)
        now = [_read_tc(c) for c in render_commands(replace(plan, devices=(replace(dev, links=(link,)),)))
               if f" 1:{link.class_minor:x} " in c]  # its class and its netem qdisc
        assert [(c.replace("add", "change"), k, {"index": 7, **kw}) for c, k, kw in now] == changed.calls


def test_links_shaped_per_destination_region_share_one_class_a_region(tmp_path):
    """link_classes: region (the paper's tc scripts for cases 3-5): device 0's two destinations in B hang from one
    class at A -> B's rate, each assured half and allowed all of it; under an interface limit the region classes
    share it. Applied exactly as printed."""
    from dataclasses import replace

    import numpy as np

    from harness.network.apply import apply_device
    from tests.test_scenario import GOOD, write

    topo = load_scenario(str(write(tmp_path, GOOD.replace("name: t\n", "name: t\nlink_classes: region\n"))))
    dev = _plan(topo, scale=0.01).devices[0]
    assert [(rc.region, rc.class_minor, rc.rate_bps, rc.assured_bps) for rc in dev.region_classes] == [
        (0, 0xFF01, 100_000_000, 100_000_000), (1, 0xFF02, 15_000_000, 15_000_000)]
    assert [(lk.dst, lk.parent_minor, lk.rate_bps, lk.assured_bps) for lk in dev.links] == [
        (1, 0xFF01, 100_000_000, 100_000_000), (2, 0xFF02, 15_000_000, 7_500_000), (3, 0xFF02, 15_000_000, 7_500_000)]
    cmds = "\n".join(render_commands(replace(_plan(topo, scale=0.01), devices=(dev,))))
    assert "parent 1: classid 1:ff02 htb rate 15000000bit ceil 15000000bit" in cmds
    assert "parent 1:ff02 classid 1:3 htb rate 7500000bit ceil 15000000bit" in cmds
    # an interface limit of 20 Mbit/s: the two region classes share it, their destinations share theirs
    limited = _plan(replace(topo, interface_gbps=np.full(4, 2.0)), scale=0.01).devices[0]
    assert [(rc.rate_bps, rc.assured_bps) for rc in limited.region_classes] == [(20_000_000, 10_000_000),
                                                                                 (15_000_000, 10_000_000)]
    for d in (dev, limited):
        sent = _RecordingNetlink()
        apply_device(sent, 7, d, fresh=True)
        printed = [_read_tc(c) for c in render_commands(replace(_plan(topo), devices=(d,)))
                   if not c.startswith(("#", "sysctl"))]
        assert [(c, k, {"index": 7, **kw}) for c, k, kw in printed] == sent.calls
        assert len(sent.calls) == 1 + (d.egress_bps is not None) + len(d.region_classes) + 3 * len(d.links)
