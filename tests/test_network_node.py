"""Real nodes: inventory parsing (harness/scenario/inventory.py), dry-run commands (the physical-NIC part), and the namespace
wiring + shaping of `net apply`/`net clear` run for real inside user-mode Linux (macvlan on
a dummy NIC, and veth on a bridge)."""
from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.network import kernel
from harness.network.emulate import run_emulated
from harness.scenario.inventory import InventoryError, load_inventory
from harness.network.node import node_commands
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
NET4 = str(ROOT / "tests/data/net-4dev.yaml")
pytestmark = pytest.mark.machine  # the network registry, namespaces, the emulated cluster


def _inventory(tmp_path, text: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text(textwrap.dedent(text))
    return p


# case 1 scaled to 16 devices: 4 nodes x 4 GPUs, NVLink inside a node, 25 Gbps between
CASE1 = """
    scenario: 1
    devices: 16
    subnet: 10.214.0.0/16
    nodes:
      - {name: gpu-a, nic: eth0, devices: [0, 1, 2, 3]}
      - {name: gpu-b, nic: ens5, devices: [4, 5, 6, 7]}
      - {name: gpu-c, nic: ens5, devices: [8, 9, 10, 11]}
      - {name: gpu-d, nic: ens5, devices: [12, 13, 14, 15]}
"""


def test_dry_run_shapes_only_pairs_between_nodes(tmp_path, capsys):
    inv = _inventory(tmp_path, CASE1.replace("devices: 16\n", "devices: 16\n    bandwidth_scale: 0.5\n"))
    assert main(["net", "apply", "--inventory", str(inv), "--node", "gpu-a", "--dry-run"]) == 0
    out = capsys.readouterr().out
    topo = load_scenario("1", devices=16)
    assert topo.device_region[0] == topo.device_region[3] != topo.device_region[4]
    assert out.count("ip netns add harness-") == 4
    assert len(re.findall(r"link eth0 gso_max_segs \d+ type macvlan mode bridge", out)) == 4 and "ens5" not in out
    # NVLink among devices 0-3 stays unshaped: 4 devices x 12 destinations on other nodes
    assert out.count(" htb rate ") == 48
    assert "rate 12500000000bit ceil 12500000000bit" in out  # 25 Gbps x 0.5
    assert "match ip dst 10.214.0.5/32" in out and "match ip dst 10.214.0.2/32" not in out
    assert "10.214.0.1/16 dev hnp-" in out and "NCCL_NET=Socket" in out
    assert main(["net", "clear", "--inventory", str(inv), "--node", "gpu-d", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("ip netns del harness-") == 4


def test_bandwidth_scale_comes_only_from_the_inventory(tmp_path, capsys):
    """The trainer records the inventory's scale, so `net apply` shapes at no other."""
    inv = _inventory(tmp_path, CASE1)
    assert main(["net", "apply", "--inventory", str(inv), "--node", "gpu-a", "--dry-run"]) == 0
    assert "rate 25000000000bit" in capsys.readouterr().out  # default 1
    assert main(["net", "apply", "--inventory", str(inv), "--node", "gpu-a", "--dry-run", "--bandwidth-scale", "1"]) == 2
    assert "unrecognized arguments: --bandwidth-scale 1" in capsys.readouterr().err


@pytest.mark.parametrize("text, needle", [
    (CASE1.replace("[12, 13, 14, 15]", "[12, 13, 14]"), "nodes: devices [15] of the scenario are on no node"),
    (CASE1.replace("[4, 5, 6, 7]", "[1, 5, 6, 7]"), "nodes[1].devices: device 1 is already on node 'gpu-a'"),
    (CASE1.replace("[4, 5, 6, 7]", "[4, 5, 6, 33]"), "nodes[1].devices: device 33 is not in the scenario"),
    (CASE1.replace("[4, 5, 6, 7]", "[4, true]"), "nodes[1].devices: must be a non-empty list of device ids (got [4, True])"),
    (CASE1.replace("subnet:", "sub_net:"), "sub_net: unknown key"),
    (CASE1.replace("{name: gpu-b,", "{name: gpu-b, gpus: 2,"), "nodes[1].gpus: unknown key"),
    (CASE1.replace("10.214.0.0/16", "8.8.0.0/16"), "subnet: must be a private range (got '8.8.0.0/16')"),
    (CASE1.replace("10.214.0.0/16", "10.214.0.0/29"), "subnet: has room for 6 devices, need 16 (got '10.214.0.0/29')"),
    (CASE1.replace("nic: ens5, ", ""), "nodes[1].nic: missing"),
    (CASE1.replace("nic: ens5, devices: [4", "nic: averyveryverylongnic, devices: [4"),
     "nodes[1].nic: must be a name of letters, digits and . _ : -, at most 15 characters (got 'averyveryverylongnic')"),
    (CASE1.replace("{name: gpu-b, nic: ens5,", "{name: gpu-b, nic: ens5, host: 'a b',"), "nodes[1].host: must be a name"),
    (CASE1.replace("name: gpu-c", "name: gpu-b"), "nodes: two nodes have the same name (got 'gpu-b')"),
    (CASE1.replace("devices: 16", "devices: 16\n    bandwidth_scale: -1"), "bandwidth_scale: must be a number > 0 (got -1)"),
    (CASE1.replace("devices: 16", "devices: 12"), "scenario 1, devices 12: "),
    ("- just a list\n", "(top level): must be a mapping (got ['just a list'])"),
    ("nodes: [\n", "YAML syntax error"),
])
def test_bad_inventories_are_one_line_errors(tmp_path, capsys, text, needle):
    inv = _inventory(tmp_path, text)
    assert main(["net", "apply", "--inventory", str(inv), "--node", "gpu-a", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"harness: error: {inv}: ") and needle in err and len(err.splitlines()) == 1, err


def test_a_timeline_on_a_node_is_checked_and_scheduled_before_anything_is_shaped(tmp_path, capsys):
    inv = _inventory(tmp_path, CASE1)
    t = tmp_path / "t.yaml"
    t.write_text("events: [{at_s: 5, from: node-0, to: node-1, bandwidth_factor: 0.5}, "
                 "{at_s: 10, from: node-0, to: node-1, restore: true}]\n")
    apply = ["net", "apply", "--inventory", str(inv), "--node", "gpu-a", "--dry-run"]
    assert main([*apply, "--timeline", str(t), "--start", "2026-12-04T10:30:00Z"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-3:] == [
        f"# timeline {t} on node gpu-a (devices [0, 1, 2, 3]), t = 0 at --start:",
        "#   t=5 s: node-0 <-> node-1: bandwidth_factor=0.5", "#   t=10 s: node-0 <-> node-1: restore=True"]
    inside = tmp_path / "inside.yaml"
    inside.write_text("events: [{at_s: 1, from: node-0, to: node-0, delay_ms: 1}]\n")
    by_iteration = tmp_path / "it.yaml"
    by_iteration.write_text("events: [{at_iteration: 3, from: node-0, to: node-1, delay_ms: 3}]\n")
    for extra, needle in (
            (["--start", "now"], "--start: only with --timeline"),
            (["--log", str(tmp_path / "l.jsonl")], "--log: only with --timeline"),
            (["--timeline", str(t), "--start", "2026-12-04T10:30:00"], "--start: give the time's zone"),
            (["--timeline", str(t), "--start", "soon"], "--start: must be now, seconds since the epoch"),
            (["--timeline", str(by_iteration)], "events[0]: at_iteration: on real nodes a timeline follows the "
                                                "wall clock"),
            (["--timeline", str(inside)], "inside a node (not shaped)")):
        assert main([*apply, *extra]) == 2
        err = capsys.readouterr()
        assert needle in err.err and len(err.err.strip().splitlines()) == 1 and not err.out, (extra, err)


def test_missing_inventory_file(tmp_path):
    with pytest.raises(InventoryError, match=r"nope.yaml: no such file"):
        load_inventory(tmp_path / "nope.yaml")


def test_unknown_node(tmp_path):
    inv = load_inventory(_inventory(tmp_path, CASE1))
    with pytest.raises(InventoryError, match="no node named 'gpu-z'"):
        node_commands(inv, "gpu-z")


GUEST = textwrap.dedent("""
    # Inside UML (root, netem): a dummy NIC for macvlan, a bridge for veth; apply, measure, clear.
    import json, os, socket, sys, time, traceback
    from pyroute2 import IPRoute
    from harness.network import registry
    from harness.network.netns import enter
    from harness.scenario.inventory import load_inventory
    from harness.network.node import apply_node, clear_node, node_run_id
    inv_path = sys.argv[1]
    with IPRoute() as ipr:
        ipr.link("add", ifname="nic0", kind="dummy")
        ipr.link("set", index=ipr.link_lookup(ifname="nic0")[0], state="up")
        ipr.link("add", ifname="brt0", kind="bridge")
        ipr.link("set", index=ipr.link_lookup(ifname="brt0")[0], state="up")
    before = registry.leftovers()["netns"]
    print("\\n".join(apply_node(inv_path, "a")))
    print("\\n".join(apply_node(inv_path, "a")))  # idempotent
    print("\\n".join(apply_node(inv_path, "b", link_kind="veth")))
    inv = load_inventory(inv_path)
    ns = lambda node, d: f"/var/run/netns/harness-{node_run_id(node)}-{d}"
    addr = lambda d: f"10.214.0.{d + 1}"

    def forked(work):
        # work(w) in a child that always exits, never returning into this script; (pid, read end): the parent
        # reads what the child wrote, or EOF if it failed (its traceback printed)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                work(w)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(0)
        os.close(w)
        return pid, r

    def echo_server(dst_ns, dst_addr, w):
        enter(dst_ns)
        srv = socket.create_server((dst_addr, 7100))
        os.write(w, b"R")
        c, _ = srv.accept()
        srv.close()  # the port is free for the next measurement at once
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (b := c.recv(1)):
            c.sendall(b)

    def pinger(src_ns, dst_addr, w):
        enter(src_ns)
        s = socket.create_connection((dst_addr, 7100), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        xs = []
        for _ in range(7):
            t = time.perf_counter(); s.sendall(b"x"); s.recv(1); xs.append((time.perf_counter() - t) * 1e3)
        # the least RTT: netem's delay is a floor, and a busy host only adds to it
        os.write(w, json.dumps(min(xs)).encode())

    def rtt(src_ns, dst_ns, dst_addr):
        srv, ready = forked(lambda w: echo_server(dst_ns, dst_addr, w))
        assert os.read(ready, 1) == b"R", "the echo server did not start"
        cli, result = forked(lambda w: pinger(src_ns, dst_addr, w))
        got = os.read(result, 100)
        os.waitpid(cli, 0)
        os.waitpid(srv, 0)  # its listener is closed before the next call binds the same port
        for fd in (ready, result):
            os.close(fd)
        assert got, "the RTT measurement failed"
        return json.loads(got)

    def read_sysctls(netns, w):
        enter(netns)
        names = ("tcp_congestion_control", "tcp_slow_start_after_idle", "tcp_rmem", "tcp_wmem")
        os.write(w, json.dumps({n: " ".join(open(f"/proc/sys/net/ipv4/{n}").read().split()) for n in names}).encode())

    def sysctls(netns):
        pid, r = forked(lambda w: read_sysctls(netns, w))
        got = os.read(r, 1000)
        os.waitpid(pid, 0)
        os.close(r)
        assert got, f"reading {netns}'s sysctls failed"
        return json.loads(got)

    # the scenario's TCP settings hold in every namespace, whichever way it is wired
    want = {"tcp_congestion_control": "bbr", "tcp_slow_start_after_idle": "0",
            "tcp_rmem": "4096 131072 8388608", "tcp_wmem": "4096 16384 4194304"}
    for node, d in (("a", 0), ("a", 1), ("b", 2), ("b", 3)):
        assert sysctls(ns(node, d)) == want, (node, d, sysctls(ns(node, d)))
    a = rtt(ns("a", 0), ns("a", 1), addr(1))   # macvlan, same node
    b = rtt(ns("b", 2), ns("b", 3), addr(3))   # veth on a bridge
    topo = inv.topo
    print("rtt", a, b, flush=True)
    assert abs(a - (topo.delay_ms[0][1] + topo.delay_ms[1][0])) < 3, a
    assert abs(b - (topo.delay_ms[2][3] + topo.delay_ms[3][2])) < 3, b
    # a timeline on node a (`net apply --timeline`): its controller changes the egress of devices 0 and 1
    import threading
    from harness.network.node_timeline import run_node_timeline
    tl = os.path.join(os.path.dirname(inv_path), "t.yaml")
    with open(tl, "w") as f:
        f.write("events: [{at_s: 0.2, from: a, to: b, delay_ms: 40}]\\n")
    log = run_node_timeline(inv_path, "a", tl, time.time(), stop=threading.Event())
    assert len(log) == 1 and log[0]["pairs"] == 2 and log[0]["verified_ms"] is not None, log
    assert log[0]["applied_s"] >= 0.2, log
    slow = rtt(ns("a", 0), ns("a", 1), addr(1))
    print("rtt after the timeline", slow, flush=True)
    assert abs(slow - 80) < 3, slow  # its end state holds
    # stopped early: the scenario's links again
    with open(tl, "w") as f:
        f.write("events: [{at_s: 0.1, from: a, to: b, delay_ms: 60}, {at_s: 900, from: a, to: b, delay_ms: 1}]\\n")
    stop, out = threading.Event(), {}
    runner = threading.Thread(target=lambda: out.update(log=run_node_timeline(inv_path, "a", tl, time.time(),
                                                                              stop=stop, say=lambda line: print(line, flush=True))))
    runner.start()
    deadline = time.monotonic() + 20
    while (now := rtt(ns("a", 0), ns("a", 1), addr(1))) < 110:  # the first change shows: 2 x 60 ms
        assert time.monotonic() < deadline, now
    stop.set()
    runner.join(20)
    assert not runner.is_alive() and len(out["log"]) == 1, out
    back = rtt(ns("a", 0), ns("a", 1), addr(1))
    print("rtt after the stop", back, flush=True)
    assert abs(back - a) < 3, (back, a)
    assert len(registry.leftovers()["netns"]) == len(before) + 4
    registry.clean()  # `net clean` leaves node shaping alone
    assert len(registry.leftovers()["netns"]) == len(before) + 4
    print("\\n".join(clear_node(inv_path, "a")))
    print("\\n".join(clear_node(inv_path, "b")))
    assert registry.leftovers()["netns"] == before, registry.leftovers()
    assert not [e for e in registry.entries() if e.kind == "node"]
    print("NODE-CHECKS OK", flush=True)
""")

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])


@pytest.mark.net
@pytest.mark.skipif(bool(_missing), reason=f"user-mode Linux unavailable: {', '.join(_missing)}")
@pytest.mark.timeout(150)
def test_apply_and_clear_wire_and_shape_namespaces_in_a_kernel(tmp_path):
    scenario = tmp_path / "net4-tcp.yaml"
    scenario.write_text(Path(NET4).read_text() + "transport: {congestion_control: bbr, slow_start_after_idle: false, "
                        "rmem_max_bytes: 8388608}\n")
    inv = _inventory(tmp_path, f"""
        scenario: {scenario}
        bandwidth_scale: 0.01
        subnet: 10.214.0.0/16
        nodes:
          - {{name: a, nic: nic0, devices: [0, 1]}}
          - {{name: b, nic: brt0, devices: [2, 3]}}
    """)
    script = tmp_path / "node_checks.py"
    script.write_text(GUEST)
    res = run_emulated(load_scenario(NET4).subset([0, 1]), [sys.executable, str(script), str(inv)],
                       mode="launcher", kernel="uml", timeout_s=120)
    assert res.returncodes == [0], res.outputs[0][-3000:]
    assert "NODE-CHECKS OK" in res.outputs[0]
