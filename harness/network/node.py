"""Real nodes: `harness net apply|clear --inventory cluster.yaml --node NAME [--dry-run]`.

On a GPU node, every GPU process gets its own network namespace attached to the node's
NIC through a macvlan (bridge mode) with its own IP, shaped exactly like the local
emulated cluster (plan.py). Pairs the scenario leaves unshaped (NVLink inside a node)
get no class. The shaping stays until `net clear` (it is not a run: `net clean` leaves it).

The inventory (`cluster.yaml`, harness/scenario/inventory.py) says which devices each node holds and
on which NIC. Namespaces are named `harness-<id>-<device>` and interfaces `hnp-<id>-<device>`,
where <id> is derived from the node name, so `clear` finds them and the trainer and
`harness cluster sbatch` name them the same way (`device_names`, `rank_network`).
"""
from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from ..scenario.inventory import Inventory, InventoryError, load_inventory
from . import registry
from .plan import build_plan, device_addresses, namespace_commands, transport_sysctls
from .tree import render_commands

NETNS_DIR = "/var/run/netns"


def node_run_id(node: str) -> str:
    return hashlib.sha256(node.encode()).hexdigest()[:6]


def device_names(node: str, device: int) -> tuple[str, str]:
    """(namespace, interface) of `device`'s GPU process on `node`, as `apply` creates them."""
    rid = node_run_id(node)
    return registry.netns_name(rid, device), registry.device_ifname(rid, device)


@dataclass(frozen=True)
class RankNetwork:
    """How one GPU process of a real-node run reaches the others."""

    device: int  # the scenario device it plays; also its process-group rank
    netns: str  # its namespace on the node (there once `net apply` ran)
    ifname: str  # the interface gloo/NCCL must use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)
    addr: str  # its own address on that interface's network
    master_addr: str  # where device 0's process hosts the rendezvous store
    shaped: bool


def rank_network(inv: Inventory, node: str, local_rank: int, *, shaped: bool) -> RankNetwork:
    """The one rule for a rank's network: local rank k on `node` plays the node's k-th device.

    Shaped (the process runs in its device's namespace): it talks over the namespace's
    macvlan interface with the device's subnet address, and device 0's namespace address
    hosts the store (the namespaces see only the subnet: neither the node's own address
    nor torchrun's agent store is reachable from them). Unshaped: the node's NIC, and the
    store on the address of the node holding device 0."""
    device = inv.device_of(node, local_rank)
    netns, ifname = device_names(node, device)
    if shaped:
        addrs, _ = device_addresses(inv.topo.n, inv.subnet)
        return RankNetwork(device, netns, ifname, addrs[device], addrs[0], True)
    spec = inv.node(node)
    return RankNetwork(device, netns, spec.nic, spec.address, inv.node_of(0).address, False)


def this_rank_network(inv: Inventory, local_rank: int, *, node: str | None = None,
                      interfaces: set[str] | None = None) -> RankNetwork:
    """This process's `rank_network`: its node is HARNESS_NODE (else the host name), and it is
    shaped iff its device's interface is in its namespace (it was started inside it)."""
    node = node or os.environ.get("HARNESS_NODE") or socket.gethostname().split(".")[0]
    if node not in {n.name for n in inv.nodes}:
        raise InventoryError(f"{inv.path}: nodes: this node {node!r} (HARNESS_NODE, else the host name) is not in "
                             f"the inventory (known: {', '.join(n.name for n in inv.nodes)})")
    if interfaces is None:
        interfaces = {name for _, name in socket.if_nameindex()}
    _, ifname = device_names(node, inv.device_of(node, local_rank))
    return rank_network(inv, node, local_rank, shaped=ifname in interfaces)


def node_plan(inv: Inventory, node: str):
    """(node spec, run id, plan of the whole scenario) for `node`, at the inventory's bandwidth
    scale (the one source: the trainer records the same)."""
    spec = inv.node(node)
    rid = node_run_id(spec.name)
    addrs, prefix = device_addresses(inv.topo.n, inv.subnet)
    ifnames = [registry.device_ifname(rid, i) for i in range(inv.topo.n)]
    topo = inv.topo.scaled(inv.bandwidth_scale)
    plan = build_plan(topo, addrs, ifnames, prefix_len=prefix)
    return spec, rid, plan


def node_commands(inv: Inventory, node: str) -> list[str]:
    """The `ip`/`tc` commands that `apply` performs on `node`."""
    spec, rid, plan = node_plan(inv, node)
    out = [f"# node {spec.name}: devices {list(spec.devices)} on {spec.nic} (macvlan, bridge mode), "
           f"scenario {inv.topo.name}, bandwidth scale {plan.bandwidth_scale:g}"]
    for d in spec.devices:
        dev = plan.devices[d]
        name = registry.netns_name(rid, d)
        link_add = f"ip link add {dev.ifname} link {spec.nic} gso_max_segs {dev.gso_max_segs} type macvlan mode bridge"
        out += namespace_commands(name, dev.ifname, link_add, dev.addr, plan.prefix_len)
    sub = replace(plan, devices=tuple(plan.devices[d] for d in spec.devices))
    out += render_commands(sub, [registry.netns_name(rid, i) for i in range(inv.topo.n)])  # indexed by device id
    out.append("# start each GPU process in its device's namespace, gloo/NCCL on sockets over its interface:")
    for k, d in enumerate(spec.devices):
        net = rank_network(inv, spec.name, k, shaped=True)
        out.append(f"#   local rank {k} (device {d}): ip netns exec {net.netns} env HARNESS_NODE={spec.name} "
                   f"NCCL_NET=Socket NCCL_SOCKET_IFNAME={net.ifname} GLOO_SOCKET_IFNAME={net.ifname} ...")
    return out


def apply_node(inventory: Path, node: str, *, dry_run: bool = False, link_kind: str = "macvlan") -> list[str]:
    """Create and shape the namespaces of `node`; returns what was done (or would be, dry run).

    `link_kind="veth"` wires each namespace with a veth whose other end stays on the parent
    (tests: same namespaces and shaping, no physical NIC needed)."""
    inv = load_inventory(inventory)
    if dry_run:
        return node_commands(inv, node)
    from pyroute2 import IPRoute

    from . import netns as harness_netns
    from .apply import ShapingError, apply_device, compare, readback, set_transport

    spec, rid, plan = node_plan(inv, node)
    entry = registry.Entry(run_id=rid, pid=0, kind="node",
                           netns=[registry.netns_name(rid, d) for d in spec.devices],
                           links=[registry.host_veth_name(rid, d) for d in spec.devices] if link_kind == "veth" else [])
    clear_node(inventory, node)  # idempotent: re-applying replaces the previous state
    entry.save()
    lines = []
    try:
        with IPRoute() as ipr:
            parent = ipr.link_lookup(ifname=spec.nic)
            if not parent:
                raise InventoryError(f"{inv.path}: node {spec.name}: nic: no interface {spec.nic!r} here")
            for d in spec.devices:
                dev = plan.devices[d]
                path = f"{NETNS_DIR}/{registry.netns_name(rid, d)}"
                harness_netns.create(path)
                if link_kind == "macvlan":
                    ipr.link("add", ifname=dev.ifname, kind="macvlan", link=parent[0], macvlan_mode="bridge",
                             gso_max_segs=dev.gso_max_segs)
                else:
                    host_if = registry.host_veth_name(rid, d)
                    ipr.link("add", ifname=host_if, kind="veth",
                             peer={"ifname": dev.ifname, "gso_max_segs": dev.gso_max_segs})
                    h = ipr.link_lookup(ifname=host_if)[0]
                    ipr.link("set", index=h, master=parent[0], state="up")
                i = ipr.link_lookup(ifname=dev.ifname)[0]
                ipr.link("set", index=i, net_ns_fd=registry.netns_name(rid, d))
                with harness_netns.inside(path), IPRoute() as nsr:
                    set_transport(transport_sysctls(plan))
                    i = nsr.link_lookup(ifname=dev.ifname)[0]
                    nsr.addr("add", index=i, address=dev.addr, prefixlen=plan.prefix_len)
                    nsr.link("set", index=i, state="up")
                    nsr.link("set", index=nsr.link_lookup(ifname="lo")[0], state="up")
                    apply_device(nsr, i, dev, fresh=True)
                    problems = compare(dev, readback(nsr, i))
                if problems:
                    raise ShapingError(f"node {spec.name} device {d}: {problems[0]}")
                lines.append(f"device {d}: namespace {registry.netns_name(rid, d)}, {dev.ifname} {dev.addr}, "
                             f"{len(dev.links)} shaped destinations, {len(dev.unshaped)} unshaped")
    except BaseException:
        registry.teardown(entry)
        raise
    return lines


def clear_node(inventory: Path, node: str, *, dry_run: bool = False) -> list[str]:
    """Remove the namespaces (with their interfaces and shaping) that `apply` made on `node`."""
    inv = load_inventory(inventory)
    spec = inv.node(node)
    rid = node_run_id(spec.name)
    names = [registry.netns_name(rid, d) for d in spec.devices]
    if dry_run:
        return [f"ip netns del {n}" for n in names]
    entry = next((e for e in registry.entries() if e.kind == "node" and e.run_id == rid), None)
    if entry is None:
        entry = registry.Entry(run_id=rid, pid=0, kind="node", netns=names)
    existing = [n for n in entry.netns if os.path.exists(f"{NETNS_DIR}/{n}")]
    registry.teardown(entry)
    return [f"removed namespace {n}" for n in existing]
