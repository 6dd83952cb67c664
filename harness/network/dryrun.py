"""The local emulated cluster as `ip`/`tc` commands: what Cluster does, for people to read or paste."""
from __future__ import annotations

from . import registry
from .plan import build_plan, device_addresses, render_commands


def local_cluster_commands(topo, *, bandwidth_scale: float = 1.0, run_id: str | None = None) -> list[str]:
    rid = run_id or registry.new_run_id()
    n = topo.n
    addrs, prefix = device_addresses(n)
    ifnames = [registry.device_ifname(rid, i) for i in range(n)]
    plan = build_plan(topo, addrs, ifnames, prefix_len=prefix, bandwidth_scale=bandwidth_scale)
    ns = [registry.netns_name(rid, i) for i in range(n)]
    br = registry.bridge_name(rid)
    out = [f"# {topo.name}: {n} devices, {plan.classes} shaped classes, bandwidth scale {bandwidth_scale:g}",
           f"ip link add {br} type bridge", f"ip link set {br} up"]
    for i in range(n):
        hv = registry.host_veth_name(rid, i)
        out += [
            f"ip netns add {ns[i]}",
            f"ip link add {hv} type veth peer name {ifnames[i]}",
            f"ip link set {ifnames[i]} netns {ns[i]}",
            f"ip link set {hv} master {br}",
            f"ip link set {hv} up",
            f"ip -n {ns[i]} addr add {addrs[i]}/{prefix} dev {ifnames[i]}",
            f"ip -n {ns[i]} link set {ifnames[i]} up",
            f"ip -n {ns[i]} link set lo up",
        ]
    out += render_commands(plan, ns)
    out.append(f"# teardown: ip link del {br}; " + "; ".join(f"ip netns del {x}" for x in ns[:2])
               + ("; ..." if n > 2 else ""))
    return out
