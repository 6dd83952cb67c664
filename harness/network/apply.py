"""Netlink (pyroute2) side of the plan: create, shape, read back, remove.

Idempotent: applying a device plan replaces its whole root qdisc tree, removing
what is already gone is not an error. Errors from the kernel are raised, never logged
and skipped.
"""
from __future__ import annotations

import platform
import socket
from pathlib import Path

from pyroute2 import IPRoute, netns, protocols
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import common as tc_common

from ..errors import HarnessError
from ..scenario.transport import SYSCTL_NAMES
from .plan import EGRESS_CLASS_MINOR, DevicePlan, RegionClass, ShapedLink
from .tree import ROOT, TC_H_ROOT, TcOp, egress_ops, link_ops, region_class_op

ENOENT, ENODEV, EINVAL = 2, 19, 22
SYSCTL_DIR = "/proc/sys/net/ipv4"


class ShapingError(HarnessError, RuntimeError):
    """The kernel refused a shaping step (one line: device, object, kernel message)."""


def _ticks_to_us(ticks: int) -> float:
    return ticks / tc_common.tick_in_usec


def _addr_key(addr: str) -> str:
    return "0x" + socket.inet_aton(addr).hex() + "/0xffffffff+16"


def clear_device(ipr: IPRoute, idx: int) -> None:
    try:
        ipr.tc("del", index=idx, handle=ROOT, parent=TC_H_ROOT)
    except NetlinkError as e:
        if e.code not in (ENOENT, EINVAL, ENODEV):
            raise


def _netlink_args(op: TcOp) -> dict:
    """The keyword arguments pyroute2 takes for `op` (rates in bytes/s)."""
    v = op.values
    if op.kind == "htb" and op.obj == "qdisc":
        return {"handle": op.handle, "default": v["default"], "r2q": v["r2q"]}
    if op.obj == "class":
        out = {"handle": op.handle, "parent": op.parent, "rate": v["rate_bps"] // 8, "ceil": v["ceil_bps"] // 8,
               "burst": v["burst_bytes"], "cburst": v["cburst_bytes"], "mtu": v["mtu_bytes"]}
        if "quantum_bytes" in v:
            out["quantum"] = v["quantum_bytes"]
        return out
    if op.kind == "netem":
        return {"handle": op.handle, "parent": op.parent, "delay": v["delay_us"], "jitter": v["jitter_us"],
                "loss": v["loss_pct"], "limit": v["limit_packets"]}
    return {"parent": op.parent, "prio": 1, "protocol": protocols.ETH_P_IP, "target": v["flowid"],
            "keys": [_addr_key(v["dst_addr"])]}


def _send(ipr: IPRoute, idx: int, op: TcOp, *, change: bool = False) -> None:
    """One operation of tree.py on interface `idx`: added, or changed in place."""
    command = {"qdisc": "add", "class": "add-class", "filter": "add-filter"}[op.obj]
    if change:
        command = command.replace("add", "change")
    ipr.tc(command, op.kind, index=idx, **_netlink_args(op))


def apply_device(ipr: IPRoute, idx: int, dev: DevicePlan, *, fresh: bool = False) -> None:
    """Install `dev`'s egress tree (tree.egress_ops) on interface `idx` (replacing any tree there, unless the
    caller just created the interface)."""
    if not fresh:
        clear_device(ipr, idx)
    for op in egress_ops(dev):
        try:
            _send(ipr, idx, op)
        except NetlinkError as e:
            if op.kind == "netem" and e.code == ENOENT:  # the qdisc kind is unknown to this kernel
                raise ShapingError(f"device {dev.index} ({dev.ifname}): {op.step}: this kernel ({platform.release()}) "
                                   "has no sch_netem (modprobe sch_netem, or run unshaped)") from None
            raise ShapingError(f"device {dev.index} ({dev.ifname}): {op.step}: kernel said {e}") from None


def change_link(ipr: IPRoute, idx: int, dev: DevicePlan, link: ShapedLink) -> None:
    """Change one destination's HTB class and netem qdisc in place (`tc class change`, `tc qdisc change`):
    the packets queued in them stay queued and the link is never without its shaping, unlike a delete and
    re-create (a timeline's event during a run). `link` is the destination's new values (plan.shaped_link)."""
    for op in link_ops(dev, link):
        try:
            _send(ipr, idx, op, change=True)
        except NetlinkError as e:
            raise ShapingError(f"device {dev.index} ({dev.ifname}) -> {link.dst}: {op.step}: change refused: "
                               f"kernel said {e}") from None


def change_region_class(ipr: IPRoute, idx: int, dev: DevicePlan, rc: RegionClass) -> None:
    """Change the class a device's destinations in one region share, in place (a timeline's rate change)."""
    op = region_class_op(dev, rc)
    try:
        _send(ipr, idx, op, change=True)
    except NetlinkError as e:
        raise ShapingError(f"device {dev.index} ({dev.ifname}): {op.step}: change refused: kernel said {e}") from None


def readback(ipr: IPRoute, idx: int) -> dict:
    """The shaping state of interface `idx`, as plain data kept with the results."""
    qdiscs, classes, filters = [], [], []
    for m in ipr.get_qdiscs(index=idx):
        kind = m.get_attr("TCA_KIND")
        q = {"kind": kind, "handle": m["handle"] >> 16, "parent": m["parent"]}
        opts = m.get_attr("TCA_OPTIONS")
        if kind == "netem" and opts is not None:
            q["delay_us"] = round(_ticks_to_us(opts["delay"]))
            q["jitter_us"] = round(_ticks_to_us(opts["jitter"]))
            q["limit_packets"] = opts["limit"]
            q["loss_pct"] = round(opts["loss"] / (2**32 - 1) * 100, 6)
        qdiscs.append(q)
    for m in ipr.get_classes(index=idx):
        if m.get_attr("TCA_KIND") != "htb":
            continue
        opts = m.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_HTB_PARMS")
        rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
        ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
        classes.append({
            "classid": m["handle"] & 0xFFFF, "rate_bps": rate * 8, "ceil_bps": ceil * 8,
            "burst_bytes": round(_ticks_to_us(parms["buffer"]) * rate / 1e6),
            "cburst_bytes": round(_ticks_to_us(parms["cbuffer"]) * ceil / 1e6),
            "quantum_bytes": parms["quantum"],
        })
    for m in ipr.get_filters(index=idx, parent=ROOT):
        opts = m.get_attr("TCA_OPTIONS")
        if m.get_attr("TCA_KIND") != "u32" or opts is None:
            continue
        classid = opts.get_attr("TCA_U32_CLASSID")
        sel = opts.get_attr("TCA_U32_SEL")
        if classid is None or sel is None:
            continue  # the hash-table node, not a rule
        filters.append({"classid": classid & 0xFFFF, "dst": _u32_dst(sel.get("keys") or [])})
    gso = ipr.get_links(idx)[0].get_attr("IFLA_GSO_MAX_SEGS")
    return {"qdiscs": qdiscs, "classes": classes, "filters": filters, "gso_max_segs": gso}


def _u32_dst(keys: list[dict]) -> str | None:
    """The /32 destination address a u32 selector matches (offset 16 of the IPv4 header).

    pyroute2 0.9.7 decodes tc_u32_key 4 bytes late (mask lands in key_val, the value in
    key_off, the offset in key_offmask); accept that layout as well as the right one.
    """
    for k in keys:
        if k.get("key_off") == 16 and k.get("key_mask") == 0xFFFFFFFF:
            return socket.inet_ntoa(int(k["key_val"]).to_bytes(4, "big"))
        if k.get("key_offmask") == 16 and k.get("key_val") == 0xFFFFFFFF:
            return socket.inet_ntoa(int(k["key_off"]).to_bytes(4, "little", signed=k["key_off"] < 0))
    return None


def compare(dev: DevicePlan, rb: dict) -> list[str]:
    """Differences between the plan and the kernel's read-back (empty when they agree)."""
    problems = []
    classes = {c["classid"]: c for c in rb["classes"]}
    netems = {q["handle"]: q for q in rb["qdiscs"] if q["kind"] == "netem"}
    filters = {f["classid"]: f for f in rb["filters"]}

    def check_class(where: str, minor: int, assured_bps: int, ceil_bps: int) -> None:
        c = classes.get(minor)
        if c is None:
            problems.append(f"{where}: class 1:{minor:x} missing")
        elif abs(c["rate_bps"] - assured_bps) > 8 or abs(c["ceil_bps"] - ceil_bps) > 8:
            problems.append(f"{where}: rate {c['rate_bps']} ceil {c['ceil_bps']} bit/s, planned "
                            f"{assured_bps} ceil {ceil_bps}")

    for link in dev.links:
        where = f"device {dev.index} -> {link.dst}"
        check_class(where, link.class_minor, link.assured_bps, link.rate_bps)
        q = netems.get(link.netem_major)
        if q is None:
            problems.append(f"{where}: netem {link.netem_major:x}: missing")
        elif (abs(q["delay_us"] - link.delay_us) > 1 or q["limit_packets"] != link.limit_packets
              or abs(q["jitter_us"] - link.jitter_us) > 1 or abs(q["loss_pct"] - link.loss_pct) > 1e-4):
            problems.append(f"{where}: netem delay {q['delay_us']} us jitter {q['jitter_us']} us loss "
                            f"{q['loss_pct']:g}% limit {q['limit_packets']}, planned {link.delay_us} us jitter "
                            f"{link.jitter_us} us loss {link.loss_pct:g}% limit {link.limit_packets}")
        f = filters.get(link.class_minor)
        if f is None or f["dst"] != link.dst_addr:
            problems.append(f"{where}: filter to {link.dst_addr} missing")
    planned = len(dev.links)
    if dev.egress_bps is not None:
        planned += 1
        c = classes.get(EGRESS_CLASS_MINOR)
        where = f"device {dev.index}: interface limit class 1:{EGRESS_CLASS_MINOR:x}"
        if c is None:
            problems.append(f"{where} missing")
        elif abs(c["rate_bps"] - dev.egress_bps) > 8 or abs(c["ceil_bps"] - dev.egress_bps) > 8:
            problems.append(f"{where}: rate {c['rate_bps']} bit/s, planned {dev.egress_bps}")
    for rc in dev.region_classes:
        planned += 1
        check_class(f"device {dev.index}: region {rc.region}", rc.class_minor, rc.assured_bps, rc.rate_bps)
    if len(classes) != planned:
        problems.append(f"device {dev.index}: {len(classes)} classes, planned {planned}")
    if rb.get("gso_max_segs") != dev.gso_max_segs:
        problems.append(f"device {dev.index} ({dev.ifname}): gso_max_segs {rb.get('gso_max_segs')}, planned "
                        f"{dev.gso_max_segs}")
    return problems


def set_transport(sysctls: dict[str, str]) -> dict[str, str]:
    """Write the plan's TCP settings (plan.transport_sysctls) in the current network namespace and return the
    namespace's settings as the kernel reads them back (SYSCTL_NAMES); a value it does not take is a
    ShapingError."""
    for name, value in sysctls.items():
        try:
            Path(f"{SYSCTL_DIR}/{name}").write_text(value)
        except OSError as e:
            hint = (" (a namespace takes only the host's net.ipv4.tcp_allowed_congestion_control; for bbr: "
                    "modprobe tcp_bbr)" if name == "tcp_congestion_control" else "")
            raise ShapingError(f"net.ipv4.{name} = {value!r}: {e.strerror or e}{hint}") from None
    got = read_transport(SYSCTL_NAMES)
    wrong = [k for k, v in sysctls.items() if got[k].split() != v.split()]
    if wrong:
        raise ShapingError(f"net.ipv4.{wrong[0]}: set {sysctls[wrong[0]]!r}, kernel holds {got[wrong[0]]!r}")
    return got


def read_transport(names) -> dict[str, str]:
    """The current namespace's net.ipv4 values of `names`, whitespace as in the plan (one space)."""
    return {n: " ".join(Path(f"{SYSCTL_DIR}/{n}").read_text().split()) for n in names}


def delete_netns(names: list[str]) -> None:
    existing = set(netns.listnetns())
    for name in names:
        if name in existing:
            try:
                netns.remove(name)
            except OSError:
                pass


def delete_links(names: list[str]) -> None:
    with IPRoute() as ipr:
        for name in names:
            for idx in ipr.link_lookup(ifname=name):
                try:
                    ipr.link("del", index=idx)
                except NetlinkError as e:
                    if e.code not in (ENOENT, ENODEV):
                        raise
