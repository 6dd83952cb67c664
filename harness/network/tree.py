"""One device's HTB/netem tree as a list of operations, written once.

`apply.py` sends each operation through netlink; `render_commands` prints the same list as `tc`
commands (`--dry-run`, `net plan`), so what people read is what runs. Values keep the plan's
units (bit/s, bytes, microseconds); each side converts to its own (netlink takes bytes/s).
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import EGRESS_CLASS_MINOR, DevicePlan, NetworkPlan, RegionClass, ShapedLink, transport_sysctls

ROOT = 0x10000  # the HTB root qdisc, handle 1:
TC_H_ROOT = 0xFFFFFFFF  # its parent: the interface itself
#: HTB's rate tables are computed for packets up to this size (an MTU-1500 frame and its headers fit)
HTB_MTU_BYTES = 2048
HTB_R2Q = 10


@dataclass(frozen=True)
class TcOp:
    """One tc object: `obj` qdisc, class or filter; `kind` htb, netem or u32; handles as 32-bit tc handles
    (major << 16 | minor); `values` in the plan's units; `step` is what a refusal names."""

    obj: str
    kind: str
    handle: int
    parent: int
    values: dict
    step: str


def _htb_class(handle: int, parent: int, *, rate_bps: int, ceil_bps: int, burst_bytes: int, cburst_bytes: int,
               quantum_bytes: int | None, step: str) -> TcOp:
    values = {"rate_bps": rate_bps, "ceil_bps": ceil_bps, "burst_bytes": burst_bytes, "cburst_bytes": cburst_bytes,
              "mtu_bytes": HTB_MTU_BYTES}
    if quantum_bytes is not None:
        values["quantum_bytes"] = quantum_bytes
    return TcOp("class", "htb", handle, parent, values, step)


def _parent_of_links(dev: DevicePlan) -> int:
    """The class every destination's class hangs from: the interface's limit, or the root."""
    return ROOT if dev.egress_bps is None else ROOT | EGRESS_CLASS_MINOR


def link_ops(dev: DevicePlan, link: ShapedLink) -> list[TcOp]:
    """One destination's class and its netem qdisc (what a timeline's change changes in place)."""
    cls = ROOT | link.class_minor
    parent = ROOT | link.parent_minor if link.parent_minor else _parent_of_links(dev)
    return [
        _htb_class(cls, parent, rate_bps=link.assured_bps, ceil_bps=link.rate_bps,
                   burst_bytes=link.burst_bytes, cburst_bytes=link.cburst_bytes, quantum_bytes=link.quantum_bytes,
                   step=f"htb class 1:{link.class_minor:x}"),
        TcOp("qdisc", "netem", link.netem_major << 16, cls,
             {"delay_us": link.delay_us, "jitter_us": link.jitter_us, "loss_pct": link.loss_pct,
              "limit_packets": link.limit_packets}, f"netem {link.netem_major:x}:"),
    ]


def region_class_op(dev: DevicePlan, rc: RegionClass) -> TcOp:
    """The class a device's destinations in one region share (what a timeline's rate change changes)."""
    return _htb_class(ROOT | rc.class_minor, _parent_of_links(dev), rate_bps=rc.assured_bps, ceil_bps=rc.rate_bps,
                      burst_bytes=rc.burst_bytes, cburst_bytes=rc.burst_bytes, quantum_bytes=rc.quantum_bytes,
                      step=f"htb class 1:{rc.class_minor:x} (region {rc.region})")


def egress_ops(dev: DevicePlan) -> list[TcOp]:
    """The whole egress tree of one device, in the order it is built (see plan.py's docstring)."""
    ops = [TcOp("qdisc", "htb", ROOT, 0, {"default": 0, "r2q": HTB_R2Q}, "htb root")]
    if dev.egress_bps is not None:
        burst = max(link.burst_bytes for link in dev.links)
        ops.append(_htb_class(ROOT | EGRESS_CLASS_MINOR, ROOT, rate_bps=dev.egress_bps, ceil_bps=dev.egress_bps,
                              burst_bytes=burst, cburst_bytes=burst, quantum_bytes=None,
                              step=f"htb class 1:{EGRESS_CLASS_MINOR:x} (interface limit)"))
    ops += [region_class_op(dev, rc) for rc in dev.region_classes]
    for link in dev.links:
        ops += link_ops(dev, link)
        ops.append(TcOp("filter", "u32", 0, ROOT, {"dst_addr": link.dst_addr, "flowid": ROOT | link.class_minor},
                        f"u32 filter dst {link.dst_addr}"))
    return ops


def _h(handle: int) -> str:
    """A tc handle as tc writes it: 1:, 1:fffe, 100:."""
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" + (f"{minor:x}" if minor else "")


def tc_command(op: TcOp, ifname: str) -> str:
    """`op` as the `tc` command that does what apply.py sends (replace: the command can be run again)."""
    v = op.values
    where = "root" if op.parent == 0 else f"parent {_h(op.parent)}"
    if op.obj == "qdisc" and op.kind == "htb":
        return f"tc qdisc replace dev {ifname} {where} handle {_h(op.handle)} htb default {v['default']} r2q {v['r2q']}"
    if op.obj == "class":
        text = (f"tc class replace dev {ifname} {where} classid {_h(op.handle)} htb rate {v['rate_bps']}bit "
                f"ceil {v['ceil_bps']}bit burst {v['burst_bytes']}b cburst {v['cburst_bytes']}b")
        if "quantum_bytes" in v:
            text += f" quantum {v['quantum_bytes']}"
        return text + f" mtu {v['mtu_bytes']}"
    if op.kind == "netem":
        netem = f"delay {v['delay_us']}us"
        if v["jitter_us"]:
            netem += f" {v['jitter_us']}us"
        if v["loss_pct"]:
            netem += f" loss {v['loss_pct']:g}%"
        return f"tc qdisc replace dev {ifname} {where} handle {_h(op.handle)} netem {netem} limit {v['limit_packets']}"
    # the handle is the command's own, so that `replace` finds the filter again; netlink lets the kernel number it
    return (f"tc filter replace dev {ifname} {where} protocol ip prio 1 handle 800::{v['flowid'] & 0xFFFF:x} u32 "
            f"match ip dst {v['dst_addr']}/32 flowid {_h(v['flowid'])}")


def render_commands(plan: NetworkPlan, netns: list[str] | None = None) -> list[str]:
    """The commands equivalent to applying `plan` (one device's namespace each, if given)."""
    out = []
    for dev in plan.devices:
        pre = f"ip netns exec {netns[dev.index]} " if netns else ""
        out += [f"{pre}sysctl -qw net.ipv4.{k}='{v}'" for k, v in transport_sysctls(plan).items()]
        out.append(f"# device {dev.index} ({dev.addr}): {len(dev.links)} shaped destinations"
                   + (f", unshaped: {list(dev.unshaped)}" if dev.unshaped else ""))
        out += [pre + tc_command(op, dev.ifname) for op in egress_ops(dev)]
    return out
