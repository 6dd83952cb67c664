"""Which GPUs a HetPipe run uses and how they form virtual workers: the resource allocation policies
(Park et al. 2020, Sec. 8.1), one registry entry each, or an explicit grouping of device ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...scenario import Topology
from ...sim.cnn import DTYPE, nodes_of
from .setting import HetPipeError


@dataclass(frozen=True)
class Policy:
    """A resource allocation policy: how the GPUs used form virtual workers."""

    name: str
    summary: str
    vws: Callable[[Topology, dict[int, list[int]]], list[list[int]]]  # (topo, GPUs per node) -> VWs' GPUs
    same_gpus_per_node: bool = False  # needs the same number of GPUs on every node
    identical_vws: bool = False  # its VWs are alike, each layer on one node in all of them (local PS placement)


def _node_partition(topo: Topology, nodes: dict[int, list[int]]) -> list[list[int]]:
    return [list(v) for v in nodes.values()]


def _equal_distribution(topo: Topology, nodes: dict[int, list[int]]) -> list[list[int]]:
    if len(nodes) == 1:
        return [list(v) for v in nodes.values()]
    return [list(col) for col in zip(*nodes.values())]


def _hybrid_distribution(topo: Topology, nodes: dict[int, list[int]]) -> list[list[int]]:
    per = len(next(iter(nodes.values())))
    if len(nodes) % 2 or per % 2:
        raise HetPipeError(f"--policy hd: pairs nodes and splits each pair evenly: needs an even number of "
                           f"nodes and of GPUs per node (got {len(nodes)} x {per})")
    out = []
    for a, b in _balanced_pairs(topo, list(nodes)):
        for k in range(per // 2):
            out.append(nodes[a][2 * k:2 * k + 2] + nodes[b][2 * k:2 * k + 2])
    return out


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("np", "node partition: one VW per node", _node_partition),
    Policy("ed", "equal distribution: VW j takes GPU j of every node", _equal_distribution,
           same_gpus_per_node=True, identical_vws=True),
    Policy("hd", "hybrid distribution: balanced pairs of nodes, each pair's GPUs spread over its VWs",
           _hybrid_distribution, same_gpus_per_node=True),
)}


def group(topo: Topology, devices: list[int], policy: str) -> list[list[int]]:
    """The VWs' devices (unordered) under `policy` (a name of POLICIES, or an explicit "0,1;2,3")."""
    if policy not in POLICIES:
        return _explicit(topo, devices, policy)
    entry, nodes = POLICIES[policy], nodes_of(topo, devices)
    if entry.same_gpus_per_node and len({len(v) for v in nodes.values()}) != 1:
        raise HetPipeError(f"--policy {policy}: needs the same number of GPUs on every node "
                           f"(got {', '.join(f'{topo.regions[n].name}: {len(v)}' for n, v in nodes.items())})")
    return entry.vws(topo, nodes)


def _balanced_pairs(topo: Topology, nodes: list[int]) -> list[tuple[int, int]]:
    """The pairing of nodes whose pairs' compute (fp32 peak) and memory sums differ least: the largest
    relative spread (max - min) / max over the pairs, of either resource, minimised."""
    def spread(values):
        return (max(values) - min(values)) / max(values)

    best, best_cost = None, np.inf
    for pairing in _pairings(nodes):
        compute = [sum(topo.regions[n].profile.peak(DTYPE) for n in p) for p in pairing]
        memory = [sum(topo.regions[n].profile.memory_gb for n in p) for p in pairing]
        cost = max(spread(compute), spread(memory))
        if cost < best_cost - 1e-12:
            best, best_cost = pairing, cost
    return best


def _pairings(items: list[int]):
    if not items:
        yield []
        return
    first = items[0]
    for k in range(1, len(items)):
        rest = items[1:k] + items[k + 1:]
        for p in _pairings(rest):
            yield [(first, items[k])] + p


def _explicit(topo: Topology, devices: list[int], spec: str) -> list[list[int]]:
    try:
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in spec.split(";") if g.strip()]
    except ValueError:
        groups = []
    if not groups or not all(groups):
        raise HetPipeError(f"--policy: {spec!r} is neither one of {', '.join(POLICIES)} nor a grouping of "
                           "device ids like '0,4,8,12;1,5,9,13'")
    flat = [d for g in groups for d in g]
    outside = sorted(set(flat) - set(devices))
    if outside:
        raise HetPipeError(f"--policy: device {outside[0]} is not among the GPUs used ({len(devices)} of {topo.name})")
    twice = sorted({d for d in flat if flat.count(d) > 1})
    if twice:
        raise HetPipeError(f"--policy: device {twice[0]} is in two virtual workers")
    missing = sorted(set(devices) - set(flat))
    if missing:
        raise HetPipeError(f"--policy: device {missing[0]} is in no virtual worker (every GPU used must be in one)")
    return groups
