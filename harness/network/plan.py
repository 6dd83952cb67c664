"""The shaping plan: Topology -> per-device egress qdisc trees, as plain data.

Pure (no kernel, no root). Every number carries its unit in its field name; every
number is derived from the scenario (burst from the rate, netem limit from the
bandwidth-delay product), none is a fixed constant that silently caps a link.
The same plan is applied through netlink (`apply.py`) or printed as `tc`/`ip`
commands (`tree.render_commands`) for people to read and paste: tree.py writes the tree once for both.

Layout on every device's interface: one class per destination, so peers never share a
rate by accident, and the delay is one-way on the sender's egress, so RTT(d, d') =
A[d][d'] + A[d'][d] and asymmetric scenarios are exact:
  HTB root 1: (default 0: unclassified traffic such as ARP leaves unshaped)
    class 1:<dst+1>  rate = ceil = B[d][dst] of the (scaled) topology, burst = cburst from the rate
      netem <0x100+dst>:  delay = A[d][dst] (one-way), optional jitter/loss,
                        limit = in-flight packets + 2 round-trip BDPs of queue (>= 64)
    u32 filter: ip dst <addr of dst>/32 -> 1:<dst+1>
Pairs the scenario leaves unshaped (no delay and a node-internal bandwidth such as
NVLink, >= `unshaped_min_gbps`) get no class: they stay at full speed.
With `link_classes: region` (the paper's tc scripts for cases 3-5: one netem band per distinct delay and rate)
a device's destinations in one region hang from one class 1:<0xFF01 + region> at that region pair's rate, each
assured an equal share and borrowing up to its pair's rate; their netem delays stay per destination.
A device whose interface has a limit of its own (the scenario's `interface_gbps` of its region, or an FL
server's uplink: Topology.interface_gbps) gets
one parent class 1:fffe at that rate above its destinations' classes; each destination is then
assured an equal share of it (HTB `rate`) and may borrow up to its pair's rate (`ceil`), so
concurrent transfers share the interface max-min fairly, and one alone runs at its pair's rate.
"""
from __future__ import annotations

import ipaddress
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..errors import HarnessError
from ..netmodel.tcp import MTU, frame_bytes, tcp_efficiency
from ..scenario.transport import LINUX, Transport
from ..units import bits_to_bytes, gbps_to_bits_per_s, ms_to_us

#: Links with zero delay at or above this rate are inside a node (NVLink, PCIe): not shaped.
UNSHAPED_MIN_GBPS = 100.0
#: HTB burst = the bytes the rate sends in this many seconds (at least two full frames): enough
#: that a late timer (UML's clock) does not lose tokens, small next to any RTT we emulate.
BURST_SECONDS = 0.02
#: netem limit = packets in flight on the delay + a queue of this many round-trip BDPs (>= min).
QUEUE_BDP_FACTOR = 2
QUEUE_MIN_PACKETS = 64
HTB_QUANTUM_MAX_BYTES = 200_000  # above this HTB warns "quantum is big"
#: A device's TCP super-packets (GSO) are at most this long at its slowest shaped rate (one frame at least).
#: HTB sends a packet whenever its tokens are not negative, so a 64 KiB super-packet lets a message's tail
#: pass a small bucket at the veth's speed (measured in UML at 24 Mbit/s: 64 KiB messages up to 7 % faster
#: than the rate allows; one frame per packet: within 1 %, as on a WAN). Fast links keep large ones: one
#: frame per packet costs UML's one CPU 3-4x its throughput (net-4dev at bandwidth scale 0.25: 4 of 12 pairs
#: reach their rate, 10 of 12 with 64 KiB).
GSO_MAX_SECONDS = 0.001
#: Linux's default (and largest) gso_max_segs
KERNEL_GSO_MAX_SEGS = 65535
#: HTB class of a device's interface limit (above every destination's 1:<dst+1>, dst+1 <= 0xFF00).
EGRESS_CLASS_MINOR = 0xFFFE
#: HTB class 1:<REGION_CLASS_BASE + r> carries a device's destinations in region r (link_classes: region)
REGION_CLASS_BASE = 0xFF01
MAX_REGION_CLASSES = EGRESS_CLASS_MINOR - REGION_CLASS_BASE


class PlanError(HarnessError, ValueError):
    """The plan cannot be built from these inputs (one line naming the value)."""


@dataclass(frozen=True)
class ShapedLink:
    """One destination on one device's egress: HTB class + netem child + u32 filter."""

    dst: int
    dst_addr: str
    class_minor: int  # HTB class 1:<class_minor>
    netem_major: int  # netem qdisc handle <netem_major>:
    rate_bps: int  # bit/s: the pair's rate (HTB ceil)
    burst_bytes: int
    cburst_bytes: int
    quantum_bytes: int
    delay_us: int  # one-way delay on this egress
    jitter_us: int
    loss_pct: float
    limit_packets: int
    assured_bps: int  # HTB rate: rate_bps, or under an interface limit its equal share of it
    parent_minor: int = 0  # the HTB class it hangs from (a region class), 0: the device's interface limit or root


@dataclass(frozen=True)
class RegionClass:
    """The class a device's destinations in one region share (link_classes: region)."""

    region: int
    class_minor: int
    rate_bps: int  # HTB ceil: the region pair's rate (under an interface limit, at most it)
    assured_bps: int  # HTB rate: rate_bps, or under an interface limit its equal share of it
    burst_bytes: int
    quantum_bytes: int


@dataclass(frozen=True)
class DevicePlan:
    index: int
    addr: str  # own IPv4 address (no prefix)
    ifname: str
    links: tuple[ShapedLink, ...]
    unshaped: tuple[int, ...]  # destinations left at full speed
    egress_bps: int | None = None  # the interface's limit (parent class 1:fffe), None: none
    gso_max_segs: int = KERNEL_GSO_MAX_SEGS  # the interface's super-packet limit (GSO_MAX_SECONDS)
    region_classes: tuple[RegionClass, ...] = ()  # link_classes: region


@dataclass(frozen=True)
class NetworkPlan:
    scenario: str
    bandwidth_scale: float
    mtu: int
    prefix_len: int
    devices: tuple[DevicePlan, ...]
    #: every namespace's TCP settings (harness/scenario/transport.py), `auto` buffers resolved for these links
    transport: dict = field(default_factory=lambda: LINUX.to_json())

    @property
    def n(self) -> int:
        return len(self.devices)

    @property
    def classes(self) -> int:
        return sum(len(d.links) for d in self.devices)

    def to_json(self) -> dict:
        return asdict(self)


def htb_burst_bytes(rate_bps: float, mtu: int = MTU) -> int:
    """The bucket of a shaped link: what its rate sends in BURST_SECONDS, at least two frames. After an idle
    moment that many bytes pass at once (the simulator's transport model counts them: netmodel/tcp.py)."""
    return max(2 * frame_bytes(mtu), math.ceil(bits_to_bytes(rate_bps) * BURST_SECONDS))


def device_addresses(n: int, subnet: str = "10.213.0.0/16") -> tuple[list[str], int]:
    """IPv4 address of each device in the dedicated private subnet, and the prefix length."""
    try:
        net = ipaddress.IPv4Network(subnet)
    except ValueError as e:
        raise PlanError(f"subnet: {e} (got {subnet!r})") from None
    if not net.is_private:
        raise PlanError(f"subnet: must be a private range (got {subnet!r})")
    hosts = net.num_addresses - 2
    if n > hosts:
        raise PlanError(f"subnet: {subnet} has room for {hosts} devices, need {n}")
    return [str(net.network_address + i + 1) for i in range(n)], net.prefixlen


def build_plan(
    topo,
    addrs: list[str],
    ifnames: list[str],
    *,
    prefix_len: int = 16,
    mtu: int = MTU,
    jitter_ms: float = 0.0,
    loss_pct: float = 0.0,
    unshaped_min_gbps: float = UNSHAPED_MIN_GBPS,
) -> NetworkPlan:
    """Per-device egress plans for `topo` as the run sees it (Topology.scaled: its bandwidths already carry
    the run's bandwidth_scale). The one place where Gbps becomes the bit/s that HTB is given."""
    n = topo.n
    if len(addrs) != n or len(ifnames) != n:
        raise PlanError(f"devices: {n} in the scenario but {len(addrs)} addresses and {len(ifnames)} interfaces")
    if not (68 <= mtu <= 65535):
        raise PlanError(f"mtu: must be in 68..65535 (got {mtu})")
    if not (0 <= jitter_ms) or not (0 <= loss_pct <= 100):
        raise PlanError(f"jitter_ms/loss_pct: must be >= 0 and loss <= 100 (got {jitter_ms}, {loss_pct})")
    if n > 0xFF00:
        raise PlanError(f"devices: at most {0xFF00} (got {n})")
    frame = frame_bytes(mtu)
    egress = _interface_bps(topo, frame)
    devices = []
    for d in range(n):
        links, unshaped = [], []
        for e in range(n):
            if e == d:
                continue
            delay_ms = float(topo.delay_ms[d][e])
            gbps = float(topo.bandwidth_gbps[d][e])
            if not (math.isfinite(delay_ms) and delay_ms >= 0):
                raise PlanError(f"{topo.source}: delay_ms[{d}][{e}]: must be a finite number >= 0 (got {delay_ms})")
            if not (gbps > 0):
                raise PlanError(f"{topo.source}: bandwidth_gbps[{d}][{e}]: must be > 0 (got {gbps})")
            if delay_ms == 0 and gbps >= unshaped_min_gbps:
                unshaped.append(e)
                continue
            links.append(shaped_link(e, addrs[e], delay_ms, gbps, jitter_ms, loss_pct, mtu,
                                     f"{topo.source}: bandwidth_gbps[{d}][{e}] x bandwidth_scale "
                                     f"{topo.bandwidth_scale:g}"))
        regions: tuple[RegionClass, ...] = ()
        if getattr(topo, "link_classes", "pair") == "region" and links:
            links, regions = region_classes(topo, d, links, mtu, egress[d])
        elif egress[d] is not None and links:
            links = [under_egress(lk, egress[d], len(links), frame) for lk in links]
        devices.append(DevicePlan(d, addrs[d], ifnames[d], tuple(links), tuple(unshaped),
                                  egress[d] if links else None, gso_segments(links, frame), regions))
    transport = topo.transport.resolved(_largest_bdp_bytes(devices))
    return NetworkPlan(topo.name, float(topo.bandwidth_scale), mtu, prefix_len, tuple(devices), transport.to_json())


def gso_segments(links: list[ShapedLink], frame_bytes: int) -> int:
    """The frames a super-packet may carry on an interface with these links (GSO_MAX_SECONDS)."""
    if not links:
        return KERNEL_GSO_MAX_SEGS
    slowest_Bps = bits_to_bytes(min(lk.assured_bps for lk in links))
    return int(min(KERNEL_GSO_MAX_SEGS, max(1, slowest_Bps * GSO_MAX_SECONDS // frame_bytes)))


def shaped_link(dst: int, dst_addr: str, delay_ms: float, gbps: float, jitter_ms: float, loss_pct: float,
                mtu: int, what: str = "rate") -> ShapedLink:
    """The egress class and netem of one destination at these link values: the one place where Gbps becomes
    the bit/s HTB is given, and where burst, quantum and the netem limit follow from the rate and delay
    (build_plan at the start, a timeline's change during the run)."""
    frame = frame_bytes(mtu)
    rate_bps = int(round(gbps_to_bits_per_s(gbps)))
    if rate_bps < 8 * frame:
        raise PlanError(f"{what} = {rate_bps} bit/s: below one {frame}-byte frame per second")
    rate_Bps = bits_to_bytes(rate_bps)
    burst = htb_burst_bytes(rate_bps, mtu)
    quantum = int(min(HTB_QUANTUM_MAX_BYTES, max(frame, rate_Bps / 10)))
    # netem holds the packets in flight on this one-way delay, plus a queue of two
    # round trips' worth (a buffer of ~1-2 BDP lets one TCP flow fill the link; much more
    # only adds bufferbloat and makes slow start overshoot for seconds).
    in_flight = rate_Bps * (delay_ms + jitter_ms) / 1e3 / frame
    bdp_rtt = rate_Bps * 2 * (delay_ms + jitter_ms) / 1e3 / frame
    limit = math.ceil(in_flight + max(QUEUE_MIN_PACKETS, QUEUE_BDP_FACTOR * bdp_rtt))
    return ShapedLink(
        dst=dst, dst_addr=dst_addr, class_minor=dst + 1, netem_major=0x100 + dst,
        rate_bps=rate_bps, assured_bps=rate_bps, burst_bytes=burst, cburst_bytes=burst, quantum_bytes=quantum,
        delay_us=int(round(ms_to_us(delay_ms))), jitter_us=int(round(ms_to_us(jitter_ms))),
        loss_pct=float(loss_pct), limit_packets=limit,
    )


def under_egress(link, egress_bps: int, destinations: int, frame: int):
    """A destination's (or region's) class under a parent of egress_bps: assured an equal share, up to its rate."""
    share = max(8 * frame, egress_bps // destinations)
    return replace(link, rate_bps=min(link.rate_bps, egress_bps), assured_bps=min(link.rate_bps, share))


def region_classes(topo, d: int, links: list[ShapedLink], mtu: int,
                   egress_bps: int | None) -> tuple[list[ShapedLink], tuple[RegionClass, ...]]:
    """Device d's destinations under one class a region, at the region pair's (scaled) rate, the region classes
    sharing the device's interface limit where it has one (as under_egress), each destination its class."""
    frame = frame_bytes(mtu)
    by_region: dict[int, list[ShapedLink]] = {}
    for lk in links:
        by_region.setdefault(topo.device_region[lk.dst], []).append(lk)
    if max(by_region) >= MAX_REGION_CLASSES:
        raise PlanError(f"{topo.source}: link_classes: region shapes at most {MAX_REGION_CLASSES} regions "
                        f"(got {len(topo.regions)})")
    out, classes = [], []
    mine = topo.device_region[d]
    for r, members in sorted(by_region.items()):
        rc = region_class(r, float(topo.region_bandwidth_gbps[mine, r]), mtu, egress_bps, len(by_region))
        classes.append(rc)
        out += [under_region(lk, rc, len(members), frame) for lk in members]
    return sorted(out, key=lambda lk: lk.dst), tuple(classes)


def region_class(r: int, gbps: float, mtu: int, egress_bps: int | None, regions: int) -> RegionClass:
    """The class of a device's destinations in region r at the region pair's rate, under its interface limit
    (shared by its `regions` region classes) where it has one (build_plan, and a timeline's change)."""
    frame = frame_bytes(mtu)
    rate_bps = int(round(gbps_to_bits_per_s(gbps)))
    quantum = int(min(HTB_QUANTUM_MAX_BYTES, max(frame, bits_to_bytes(rate_bps) / 10)))
    rc = RegionClass(r, REGION_CLASS_BASE + r, rate_bps, rate_bps, htb_burst_bytes(rate_bps, mtu), quantum)
    return rc if egress_bps is None else under_egress(rc, egress_bps, regions, frame)


def under_region(link: ShapedLink, rc: RegionClass, members: int, frame: int) -> ShapedLink:
    """A destination's class under its region's: assured an equal share of it, up to its own rate."""
    return replace(link, rate_bps=min(link.rate_bps, rc.rate_bps), parent_minor=rc.class_minor,
                   assured_bps=min(link.rate_bps, max(8 * frame, rc.assured_bps // members)))


def _largest_bdp_bytes(devices: list[DevicePlan]) -> float:
    """The largest round-trip bandwidth-delay product of any shaped link (what `auto` buffers are sized from)."""
    one_way = {(dev.index, lk.dst): (lk.delay_us + lk.jitter_us) / 1e6 for dev in devices for lk in dev.links}
    return max((bits_to_bytes(lk.rate_bps) * (one_way[(dev.index, lk.dst)] + one_way.get((lk.dst, dev.index), 0.0))
                for dev in devices for lk in dev.links), default=0.0)


def _interface_bps(topo, frame: int) -> list[int | None]:
    """Each device's interface limit in bit/s (None: none), checked like a pair's rate."""
    caps = getattr(topo, "interface_gbps", None)
    if caps is None:
        return [None] * topo.n
    out = []
    for d, gbps in enumerate(np.asarray(caps, dtype=float)):
        if gbps == math.inf:
            out.append(None)
            continue
        rate = int(round(gbps_to_bits_per_s(gbps))) if gbps > 0 else 0
        if not (math.isfinite(gbps) and rate >= 8 * frame):
            raise PlanError(f"{topo.source}: interface_gbps of device {d} (region {topo.region_of(d).name}) x "
                            f"bandwidth_scale {topo.bandwidth_scale:g}: must be at least one {frame}-byte frame per "
                            f"second or inf (got {gbps:g} Gbps)")
        out.append(rate)
    return out


def target_matrices(plan: NetworkPlan) -> tuple[np.ndarray, np.ndarray]:
    """(RTT target in ms, TCP goodput target in bit/s) per ordered pair (src, dst); nan if unshaped."""
    n = plan.n
    one_way = np.full((n, n), np.nan)
    rate = np.full((n, n), np.nan)
    for dev in plan.devices:
        for link in dev.links:
            one_way[dev.index, link.dst] = link.delay_us / 1000
            rate[dev.index, link.dst] = link.rate_bps
        for e in dev.unshaped:
            one_way[dev.index, e] = 0.0
    rtt = one_way + one_way.T
    return rtt, rate * tcp_efficiency(plan.mtu)


def transport_sysctls(plan: NetworkPlan) -> dict[str, str]:
    """The plan's TCP settings as net.ipv4 sysctl values (set inside every device's namespace)."""
    return Transport(**plan.transport).sysctls()


def namespace_commands(netns: str, ifname: str, link_add: str, addr: str, prefix_len: int) -> list[str]:
    """`ip` commands that give a device namespace its interface (created by `link_add`) and address."""
    return [
        f"ip netns add {netns}",
        link_add,
        f"ip link set {ifname} netns {netns}",
        f"ip -n {netns} addr add {addr}/{prefix_len} dev {ifname}",
        f"ip -n {netns} link set {ifname} up",
        f"ip -n {netns} link set lo up",
    ]
