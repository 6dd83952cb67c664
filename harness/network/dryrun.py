"""The local emulated cluster as `ip`/`tc` commands: what Cluster does, for people to read or paste."""
from __future__ import annotations

from . import registry
from .plan import build_plan, device_addresses, namespace_commands
from .tree import render_commands


def local_cluster_commands(topo, *, run_id: str | None = None) -> list[str]:
    rid = run_id or registry.new_run_id()
    n = topo.n
    addrs, prefix = device_addresses(n)
    ifnames = [registry.device_ifname(rid, i) for i in range(n)]
    plan = build_plan(topo, addrs, ifnames, prefix_len=prefix)
    ns = [registry.netns_name(rid, i) for i in range(n)]
    br = registry.bridge_name(rid)
    out = [f"# {topo.name}: {n} devices, {plan.classes} shaped classes, bandwidth scale {topo.bandwidth_scale:g}",
           f"ip link add {br} type bridge", f"ip link set {br} up"]
    for i in range(n):
        hv = registry.host_veth_name(rid, i)
        link_add = f"ip link add {hv} type veth peer name {ifnames[i]} gso_max_segs {plan.devices[i].gso_max_segs}"
        out += namespace_commands(ns[i], ifnames[i], link_add, addrs[i], prefix)
        out += [f"ip link set {hv} master {br}", f"ip link set {hv} up"]
    out += render_commands(plan, ns)
    out.append(f"# teardown: ip link del {br}; " + "; ".join(f"ip netns del {x}" for x in ns[:2])
               + ("; ..." if n > 2 else ""))
    return out
