"""Real nodes: `harness net apply|clear --inventory cluster.yaml --node NAME [--dry-run]`.

On a GPU node, every GPU process gets its own network namespace attached to the node's
NIC through a macvlan (bridge mode) with its own IP, shaped exactly like the local
emulated cluster (plan.py). Pairs the scenario leaves unshaped (NVLink inside a node)
get no class. The shaping stays until `net clear` (it is not a run: `net clean` leaves it).

Inventory (YAML):
    scenario: 5                # case number, name or path; its device ids are used below
    devices: 16                # optional: scale the scenario down first
    bandwidth_scale: 1.0       # optional, default 1 (the --bandwidth-scale flag overrides it)
    subnet: 10.214.0.0/16      # device i gets the (i+1)-th address; must be free on the NICs' L2 segment
    nodes:
      - {name: gpu-a, nic: eth0, devices: [0, 1, 2, 3, 4, 5, 6, 7]}
      - {name: gpu-b, nic: ens5, devices: [8, 9, 10, 11, 12, 13, 14, 15]}
Every scenario device must appear on exactly one node. Namespaces are named
`harness-<id>-<device>` where <id> is derived from the node name, so `clear` finds them.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import HarnessError
from ..scenario import load_scenario
from . import registry
from .plan import build_plan, device_addresses, render_commands

NETNS_DIR = "/var/run/netns"
_TOP = {"scenario", "devices", "bandwidth_scale", "subnet", "nodes"}
_NODE = {"name", "nic", "devices"}


class InventoryError(HarnessError, ValueError):
    """The inventory file is invalid (one line: file: field: problem)."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    nic: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Inventory:
    path: Path
    topo: object
    bandwidth_scale: float
    subnet: str
    nodes: tuple[NodeSpec, ...]

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InventoryError(f"{self.path}: nodes: no node named {name!r} "
                             f"(known: {', '.join(n.name for n in self.nodes)})")


def _fail(path, field, problem):
    raise InventoryError(f"{path}: {field}: {problem}")


def load_inventory(path: Path) -> Inventory:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise InventoryError(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise InventoryError(f"{path}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict):
        _fail(path, "(top level)", "must be a mapping")
    unknown = sorted(set(doc) - _TOP)
    if unknown:
        _fail(path, unknown[0], f"unknown key (allowed: {', '.join(sorted(_TOP))})")
    for k in ("scenario", "nodes"):
        if k not in doc:
            _fail(path, k, "missing")
    topo = load_scenario(str(doc["scenario"]), doc.get("devices"))
    scale = doc.get("bandwidth_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        _fail(path, "bandwidth_scale", f"must be a number > 0 (got {scale!r})")
    subnet = str(doc.get("subnet", "10.214.0.0/16"))
    if not isinstance(doc["nodes"], list) or not doc["nodes"]:
        _fail(path, "nodes", "must be a non-empty list")
    nodes, seen = [], {}
    for k, n in enumerate(doc["nodes"]):
        f = f"nodes[{k}]"
        if not isinstance(n, dict):
            _fail(path, f, "must be a mapping")
        bad = sorted(set(n) - _NODE)
        if bad:
            _fail(path, f"{f}.{bad[0]}", f"unknown key (allowed: {', '.join(sorted(_NODE))})")
        for key in _NODE:
            if key not in n:
                _fail(path, f"{f}.{key}", "missing")
        devs = n["devices"]
        if not isinstance(devs, list) or not devs or not all(isinstance(d, int) and not isinstance(d, bool)
                                                             for d in devs):
            _fail(path, f"{f}.devices", f"must be a non-empty list of device ids (got {devs!r})")
        for d in devs:
            if not 0 <= d < topo.n:
                _fail(path, f"{f}.devices", f"device {d} is not in the scenario (0..{topo.n - 1})")
            if d in seen:
                _fail(path, f"{f}.devices", f"device {d} is already on node {seen[d]!r}")
            seen[d] = n["name"]
        if len(str(n["nic"])) > 15:
            _fail(path, f"{f}.nic", f"not an interface name (got {n['nic']!r})")
        nodes.append(NodeSpec(str(n["name"]), str(n["nic"]), tuple(devs)))
    missing = sorted(set(range(topo.n)) - set(seen))
    if missing:
        _fail(path, "nodes", f"devices {missing} of the scenario are on no node")
    device_addresses(topo.n, subnet)  # validates the subnet
    return Inventory(path, topo, float(scale), subnet, tuple(nodes))


def node_run_id(node: str) -> str:
    return hashlib.sha256(node.encode()).hexdigest()[:6]


def node_plan(inv: Inventory, node: str, bandwidth_scale: float | None = None):
    """(node spec, run id, plan of the whole scenario, names) for `node`."""
    spec = inv.node(node)
    rid = node_run_id(spec.name)
    addrs, prefix = device_addresses(inv.topo.n, inv.subnet)
    ifnames = [registry.device_ifname(rid, i) for i in range(inv.topo.n)]
    plan = build_plan(inv.topo, addrs, ifnames, prefix_len=prefix,
                      bandwidth_scale=bandwidth_scale if bandwidth_scale is not None else inv.bandwidth_scale)
    return spec, rid, plan


def node_commands(inv: Inventory, node: str, bandwidth_scale: float | None = None) -> list[str]:
    """The `ip`/`tc` commands that `apply` performs on `node`."""
    spec, rid, plan = node_plan(inv, node, bandwidth_scale)
    out = [f"# node {spec.name}: devices {list(spec.devices)} on {spec.nic} (macvlan, bridge mode), "
           f"scenario {inv.topo.name}, bandwidth scale {plan.bandwidth_scale:g}"]
    ns = {}
    for d in spec.devices:
        dev = plan.devices[d]
        name = registry.netns_name(rid, d)
        ns[d] = name
        out += [
            f"ip netns add {name}",
            f"ip link add {dev.ifname} link {spec.nic} type macvlan mode bridge",
            f"ip link set {dev.ifname} netns {name}",
            f"ip -n {name} addr add {dev.addr}/{plan.prefix_len} dev {dev.ifname}",
            f"ip -n {name} link set {dev.ifname} up",
            f"ip -n {name} link set lo up",
        ]
    sub = type(plan)(plan.scenario, plan.bandwidth_scale, plan.mtu, plan.prefix_len,
                     tuple(plan.devices[d] for d in spec.devices))
    out += render_commands(sub, [ns[d] for d in spec.devices])
    out.append("# NCCL over sockets for shaped pairs: NCCL_NET=Socket NCCL_SOCKET_IFNAME=<device ifname> "
               "(run each GPU process with `ip netns exec <namespace>`)")
    return out


def apply_node(inventory: Path, node: str, *, bandwidth_scale: float | None = None, dry_run: bool = False,
               link_kind: str = "macvlan") -> list[str]:
    """Create and shape the namespaces of `node`; returns what was done (or would be, dry run).

    `link_kind="veth"` wires each namespace with a veth whose other end stays on the parent
    (tests: same namespaces and shaping, no physical NIC needed)."""
    inv = load_inventory(inventory)
    if dry_run:
        return node_commands(inv, node, bandwidth_scale)
    from pyroute2 import IPRoute

    from . import netns as harness_netns
    from .apply import ShapingError, apply_device, compare, readback

    spec, rid, plan = node_plan(inv, node, bandwidth_scale)
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
                    ipr.link("add", ifname=dev.ifname, kind="macvlan", link=parent[0], macvlan_mode="bridge")
                else:
                    host_if = registry.host_veth_name(rid, d)
                    ipr.link("add", ifname=host_if, kind="veth", peer=dev.ifname)
                    h = ipr.link_lookup(ifname=host_if)[0]
                    ipr.link("set", index=h, master=parent[0], state="up")
                i = ipr.link_lookup(ifname=dev.ifname)[0]
                ipr.link("set", index=i, net_ns_fd=registry.netns_name(rid, d))
                with harness_netns.inside(path), IPRoute() as nsr:
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
