"""Real nodes: the one cluster inventory (`cluster.yaml`) that shaping, the trainer and
`harness cluster sbatch` all read, so the three can never disagree on who holds which device.

    scenario: 5                # case number, name or path; its device ids are used below
    devices: 16                # optional: scale the scenario down first
    bandwidth_scale: 1.0       # optional, default 1; the one source on real nodes (net apply, the trainer)
    subnet: 10.214.0.0/16      # optional; device i gets the (i+1)-th address; must be free on the NICs' L2 segment
    nodes:                     # every scenario device on exactly one node
      - {name: gpu-a, nic: eth0, host: 10.0.0.1, devices: [0, 1, 2, 3, 4, 5, 6, 7]}
      - {name: gpu-b, nic: ens5, devices: [8, 9, 10, 11, 12, 13, 14, 15]}

`name` is the node's Slurm/host name, `nic` the NIC the namespaces hang off, `devices` the
scenario devices its GPU processes play (local rank k plays devices[k]), and `host` (default:
`name`) the node's address on the NIC's network: torchrun's rendezvous uses it on the first
node, and an unshaped run's store on the node holding device 0.

Parsed once into frozen dataclasses; unknown keys are rejected; every error is one line
naming the file, the field and the value. No network code here: the namespaces and
interfaces of a node live in harness/network/node.py.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import HarnessError
from . import ScenarioError, Topology, load_scenario, load_yaml

DEFAULT_SUBNET = "10.214.0.0/16"
_TOP = ("scenario", "devices", "bandwidth_scale", "subnet", "nodes")
_NODE = ("name", "nic", "host", "devices")
_NODE_REQUIRED = ("name", "nic", "devices")


class InventoryError(HarnessError, ValueError):
    """The inventory is invalid or does not fit this process (one line: file: field: problem)."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    nic: str
    devices: tuple[int, ...]  # in local-rank order
    host: str = ""

    @property
    def address(self) -> str:
        """Where other nodes reach this one outside the namespaces (rendezvous, unshaped store)."""
        return self.host or self.name


@dataclass(frozen=True)
class Inventory:
    path: Path
    topo: Topology
    bandwidth_scale: float
    subnet: str
    nodes: tuple[NodeSpec, ...]

    def summary(self) -> dict:
        """What a run's manifest keeps of the inventory (JSON-ready)."""
        return {"path": str(self.path), "scenario": self.topo.name, "devices": self.topo.n,
                "bandwidth_scale": self.bandwidth_scale, "subnet": self.subnet,
                "nodes": [{"name": n.name, "nic": n.nic, "host": n.address, "devices": list(n.devices)}
                          for n in self.nodes]}

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InventoryError(f"{self.path}: nodes: no node named {name!r} "
                             f"(known: {', '.join(n.name for n in self.nodes)})")

    def node_of(self, device: int) -> NodeSpec:
        return next(n for n in self.nodes if device in n.devices)

    def device_of(self, node: str, local_rank: int) -> int:
        """The scenario device played by local rank `local_rank` on `node`."""
        spec = self.node(node)
        if not 0 <= local_rank < len(spec.devices):
            raise InventoryError(f"{self.path}: nodes: node {node!r} holds {len(spec.devices)} devices, "
                                 f"no local rank {local_rank}")
        return spec.devices[local_rank]


def _fail(path, field, problem, value=None):
    got = "" if value is None else f" (got {value!r})"
    raise InventoryError(f"{path}: {field}: {problem}{got}")


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")  # host names, IPs, interface names: safe in shell text


def _name(path, field, value, max_len: int = 253) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or len(value) > max_len:
        _fail(path, field, f"must be a name of letters, digits and . _ : -, at most {max_len} characters", value)
    return value


def _subnet(path, value, n: int) -> str:
    try:
        net = ipaddress.IPv4Network(str(value))
    except ValueError as e:
        _fail(path, "subnet", f"not an IPv4 network ({e})", value)
    if not net.is_private:
        _fail(path, "subnet", "must be a private range", value)
    if net.num_addresses - 2 < n:
        _fail(path, "subnet", f"has room for {net.num_addresses - 2} devices, need {n}", value)
    return str(value)


def _node(path, k: int, n, topo: Topology, seen: dict) -> NodeSpec:
    f = f"nodes[{k}]"
    if not isinstance(n, dict):
        _fail(path, f, "must be a mapping", n)
    bad = sorted(set(n) - set(_NODE))
    if bad:
        _fail(path, f"{f}.{bad[0]}", f"unknown key (allowed: {', '.join(_NODE)})")
    for key in _NODE_REQUIRED:
        if key not in n:
            _fail(path, f"{f}.{key}", "missing")
    name = _name(path, f"{f}.name", n["name"])
    nic = _name(path, f"{f}.nic", n["nic"], max_len=15)  # IFNAMSIZ - 1
    host = _name(path, f"{f}.host", n["host"]) if "host" in n else ""
    devs = n["devices"]
    if not isinstance(devs, list) or not devs or not all(isinstance(d, int) and not isinstance(d, bool)
                                                         for d in devs):
        _fail(path, f"{f}.devices", "must be a non-empty list of device ids", devs)
    for d in devs:
        if not 0 <= d < topo.n:
            _fail(path, f"{f}.devices", f"device {d} is not in the scenario (0..{topo.n - 1})")
        if d in seen:
            _fail(path, f"{f}.devices", f"device {d} is already on node {seen[d]!r}")
        seen[d] = name
    return NodeSpec(name, nic, tuple(devs), host)


def load_inventory(path: Path) -> Inventory:
    path = Path(path)
    try:
        doc = load_yaml(path, "inventory YAML")
    except HarnessError as e:  # missing, a directory, unreadable, binary
        raise InventoryError(str(e)) from None
    except yaml.YAMLError as e:
        raise InventoryError(f"{path}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict):
        _fail(path, "(top level)", "must be a mapping", doc)
    unknown = sorted(set(doc) - set(_TOP))
    if unknown:
        _fail(path, unknown[0], f"unknown key (allowed: {', '.join(_TOP)})")
    for k in ("scenario", "nodes"):
        if k not in doc:
            _fail(path, k, "missing")
    try:
        topo = load_scenario(str(doc["scenario"]), doc.get("devices"))
    except ScenarioError as e:
        raise InventoryError(f"{path}: scenario {doc['scenario']!r}, devices {doc.get('devices')!r}: {e}") from None
    scale = doc.get("bandwidth_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        _fail(path, "bandwidth_scale", "must be a number > 0", scale)
    subnet = _subnet(path, doc.get("subnet", DEFAULT_SUBNET), topo.n)
    if not isinstance(doc["nodes"], list) or not doc["nodes"]:
        _fail(path, "nodes", "must be a non-empty list", doc["nodes"])
    seen: dict[int, str] = {}
    nodes = tuple(_node(path, k, n, topo, seen) for k, n in enumerate(doc["nodes"]))
    names = [n.name for n in nodes]
    dup = next((x for x in names if names.count(x) > 1), None)
    if dup is not None:
        _fail(path, "nodes", "two nodes have the same name", dup)
    missing = sorted(set(range(topo.n)) - set(seen))
    if missing:
        _fail(path, "nodes", f"devices {missing} of the scenario are on no node")
    return Inventory(path, topo, float(scale), subnet, nodes)
