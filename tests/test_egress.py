"""What an interface sent to whom, as the kernel counts it (harness/network/egress.py), and how a run's
ranks take it per iteration (train/wire.py) into the manifest's matrix (train/stats.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import uuid

import pytest

from harness.network import egress, netns
from harness.train import wire
from harness.train.stats import IterationStats, egress_summary

UDP_HEADERS = 8 + 20 + 14  # UDP, IPv4, Ethernet: what a frame adds to a datagram's payload


@pytest.fixture
def shaped_pair(tmp_path):
    """Namespace a (10.250.7.1) with an HTB class per destination device on its veth (1:<dst+1>, as plan.py
    lays them): device 1 at 10.250.7.2, device 2 at 10.250.7.3, all addresses on b's end; 10.250.7.4 has no class
    (a pair the plan leaves unshaped)."""
    tag = uuid.uuid4().hex[:6]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    ifa, ifb = f"egA{tag}", f"egB{tag}"
    netns.create(a)
    netns.create(b)

    def sh(*cmd, ns=None):
        subprocess.run((["nsenter", f"--net={ns}"] if ns else []) + list(cmd), check=True, capture_output=True)

    try:
        sh("ip", "link", "add", ifa, "type", "veth", "peer", "name", ifb)
        sh("ip", "link", "set", ifa, "netns", a)
        sh("ip", "link", "set", ifb, "netns", b)
        sh("ip", "addr", "add", "10.250.7.1/24", "dev", ifa, ns=a)
        for addr in ("10.250.7.2/24", "10.250.7.3/24", "10.250.7.4/24"):
            sh("ip", "addr", "add", addr, "dev", ifb, ns=b)
        sh("sysctl", "-qw", f"net.ipv6.conf.{ifa}.disable_ipv6=1", ns=a)  # no router solicitations in the counts
        sh("ip", "link", "set", ifa, "up", ns=a)
        sh("ip", "link", "set", ifb, "up", ns=b)
        sh("tc", "qdisc", "add", "dev", ifa, "root", "handle", "1:", "htb", "default", "0", ns=a)
        for dst, addr in ((1, "10.250.7.2"), (2, "10.250.7.3")):
            sh("tc", "class", "add", "dev", ifa, "parent", "1:", "classid", f"1:{dst + 1:x}", "htb", "rate", "1gbit",
               "quantum", "1514", ns=a)
            sh("tc", "filter", "add", "dev", ifa, "parent", "1:", "protocol", "ip", "u32", "match", "ip", "dst",
               f"{addr}/32", "flowid", f"1:{dst + 1:x}", ns=a)
        yield a, ifa
    finally:
        for path in (a, b):  # the veth goes with its namespace
            subprocess.run(["umount", path], check=False)
            os.unlink(path)


NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root")


@NEEDS_ROOT
def test_egress_per_destination_is_what_the_kernel_sent(shaped_pair):
    ns, ifname = shaped_pair
    with netns.inside(ns), egress.EgressReader(ifname) as reader:
        before = reader.read()
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for _ in range(10):
                s.sendto(b"x" * 1000, ("10.250.7.2", 9))
            for _ in range(3):
                s.sendto(b"y" * 500, ("10.250.7.3", 9))
            for _ in range(2):
                s.sendto(b"z" * 700, ("10.250.7.4", 9))
        finally:
            s.close()
        sent = reader.read().since(before)
        with egress.EgressReader("lo") as lo:
            assert lo.read() is None  # an interface without the harness's classes
        with pytest.raises(RuntimeError, match="no interface"):
            egress.EgressReader("nosuch0")
    assert sent.to == {1: 10 * (1000 + UDP_HEADERS), 2: 3 * (500 + UDP_HEADERS)}
    # what no class carries: the unshaped pair's datagrams and ARP's frames (the neighbour was not known yet)
    assert 2 * (700 + UDP_HEADERS) <= sent.unclassified <= 2 * (700 + UDP_HEADERS) + 3 * 64


@NEEDS_ROOT
def test_a_rank_takes_its_egress_per_iteration_and_late_bytes_join_the_last(shaped_pair):
    ns, ifname = shaped_pair
    with netns.inside(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with wire.counting(False, ifname):
                s.sendto(b"x" * 100, ("10.250.7.2", 9))
                first = IterationStats(1.0, 0.5, 0.5, 0.0, **wire.take_iteration())
                s.sendto(b"x" * 200, ("10.250.7.3", 9))
                s.sendto(b"x" * 300, ("10.250.7.3", 9))
                second = IterationStats(1.0, 0.5, 0.5, 0.0, **wire.take_iteration())
                s.sendto(b"x" * 400, ("10.250.7.2", 9))
                wire.add_late(second, wire.take_iteration())
            assert wire.take_iteration() == {"wire_bytes": None, "egress_bytes": None}  # outside: nothing counts
        finally:
            s.close()
    assert first.wire_bytes is None and first.egress_bytes["to"] == {1: 100 + UDP_HEADERS, 2: 0}
    assert second.egress_bytes["to"] == {1: 400 + UDP_HEADERS, 2: 500 + 2 * UDP_HEADERS}


def test_the_runs_egress_matrix_sums_the_timed_iterations_of_every_rank():
    def it(to: dict, other: int = 0) -> IterationStats:
        return IterationStats(1.0, 0.5, 0.5, 0.0, egress_bytes={"to": to, "unclassified": other})

    per_rank = [[it({1: 10, 2: 1}), it({1: 20, 2: 2}, 5), it({1: 99})],  # a third iteration the others lack
                [it({"0": 7, "2": 0}), it({"0": 3, "2": 4})],  # from a journal: JSON's keys are strings
                [it({0: 0, 1: 0}), it({0: 1, 1: 1}, 2)]]
    assert egress_summary(per_rank) == {"iterations": 2, "bytes": [[0, 30, 3], [10, 0, 4], [1, 1, 0]],
                                        "unclassified": [5, 0, 2]}
    per_rank[1][0].egress_bytes = None  # a rank off the emulated cluster: no matrix
    assert egress_summary(per_rank) is None
    assert egress_summary([]) is None
