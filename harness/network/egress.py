"""What a device's interface sent, to whom, as its kernel counts it.

The shaping plan gives every shaped destination its own HTB class (plan.py: 1:<dst+1>), and HTB counts
the bytes each class sends, frames as they leave (Ethernet and IP headers, TCP acknowledgements and
retransmissions included). So a device's egress per destination device is read off its classes, with no
counter of our own on the data path; what no class carries (ARP, pairs left unshaped) is what the root HTB
sent minus theirs. Both count a GSO super-packet as the frames it becomes (the interface's own tx_bytes counts
one header per super-packet, a little less). Read from inside the device's namespace (a rank's own), through
netlink.
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import REGION_CLASS_BASE
from .tree import TC_H_ROOT


@dataclass(frozen=True)
class Egress:
    """Bytes sent so far: `to[dst]` through destination `dst`'s class, `unclassified` by no class."""

    to: dict[int, int]
    unclassified: int

    def since(self, before: "Egress") -> "Egress":
        return Egress({d: b - before.to.get(d, 0) for d, b in self.to.items()}, self.unclassified - before.unclassified)


class EgressReader:
    """Reads interface `ifname`'s egress (in the calling thread's namespace) through one netlink socket, kept
    open between reads: a rank reads once an iteration, a millisecond or two of Python each time."""

    def __init__(self, ifname: str):
        from pyroute2 import IPRoute

        self.ipr = IPRoute()
        found = self.ipr.link_lookup(ifname=ifname)
        if not found:
            self.ipr.close()
            raise RuntimeError(f"egress: no interface {ifname} in this namespace")
        self.idx = found[0]

    def read(self) -> Egress | None:
        """Bytes sent so far per destination device; None where the interface has no per-destination classes
        (one the harness did not shape)."""
        to = {}
        for m in self.ipr.get_classes(index=self.idx):
            minor = m["handle"] & 0xFFFF
            if m.get_attr("TCA_KIND") == "htb" and 0 < minor < REGION_CLASS_BASE:  # a destination's leaf
                to[minor - 1] = _bytes(m)
        if not to:
            return None
        root = [m for m in self.ipr.get_qdiscs(index=self.idx) if m["parent"] == TC_H_ROOT]
        return Egress(to, _bytes(root[0]) - sum(to.values()))

    def close(self) -> None:
        self.ipr.close()

    def __enter__(self) -> "EgressReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bytes(msg) -> int:
    return int(msg.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["bytes"])


def interface_tx_bytes(ifname: str) -> int | None:
    """Bytes this namespace's interface `ifname` has sent, as the kernel counts them (/proc/net/dev is the
    calling process's namespace); None without an interface (loopback runs)."""
    if not ifname:
        return None
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == ifname:
                return int(rest.split()[8])
    raise RuntimeError(f"/proc/net/dev: no interface {ifname}")
