"""HetPipe's plan of a run: each virtual worker's pipeline (stage order, layers, N_m), the parameter server's
shards and their traffic, and the simulated throughput under Wave Synchronous Parallel (wsp.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ...allocation import AllocationError, Problem, allocate
from ...compute.profiles import device_profiles
from ...scenario import Topology
from ...units import gbps_to_bytes_per_s, ms_to_s
from ...workloads.layers import LayerProfile
from ...sim.cnn import nodes_of, select_gpus
from .policies import group
from .setting import BYTES_PER_VALUE, DTYPE, GIB, MAX_NM, PARAM_BYTES, HetPipeError



# ----------------------------------------------------------------------------- one virtual worker
@dataclass(frozen=True)
class VirtualWorker:
    """A VW's pipeline: per stage (in order) its device, layers [first, last), and per minibatch its
    forward and backward seconds, the transfer seconds to the next stage (activation forward,
    gradient backward), and its memory in use and capacity (bytes)."""

    devices: tuple[int, ...]
    stages: tuple[tuple[int, int], ...]
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    send_fwd: tuple[float, ...]  # stage k -> k+1
    send_bwd: tuple[float, ...]  # stage k+1 -> k
    memory: tuple[float, ...]
    capacity: tuple[float, ...]

    @property
    def bottleneck_seconds(self) -> float:
        return float(max(np.add(self.fwd, self.bwd)))


@dataclass(frozen=True)
class Costs:
    """Per-layer seconds on every device and transfer times on every device pair, for one model and batch."""

    model: LayerProfile
    batch: int
    flop: np.ndarray  # (layers,) forward FLOPs of a minibatch (the backward: twice)
    flops_per_s: np.ndarray  # (devices,) what each device achieves
    capacity: np.ndarray  # (devices,) bytes
    delay: np.ndarray  # (devices, devices) seconds
    rate: np.ndarray  # (devices, devices) bytes/s, inter-node pairs divided by the VWs sharing the node pair

    @classmethod
    def of(cls, topo: Topology, model: LayerProfile, batch: int, vws: list[list[int]], profiles=None) -> "Costs":
        profs = profiles if profiles is not None else device_profiles(topo, dtype=DTYPE)
        flop = np.array([l.fwd_flop for l in model.layers]) * batch
        # the dense-GEMM efficiency of harness/compute/profiles.py stands for cuDNN's convolutions (no CNN measurement)
        speed = np.array([p.flops_per_s("transformer") for p in profs])
        capacity = np.array([p.memory_gb * GIB for p in topo.profiles], dtype=float)
        delay = ms_to_s(np.asarray(topo.delay_ms, dtype=float))
        rate = gbps_to_bytes_per_s(np.asarray(topo.bandwidth_gbps, dtype=float))
        # VWs whose pipelines cross between two nodes send there at about the same time (identical VWs run in
        # lockstep): they share the nodes' link, one share per VW spanning both nodes.
        region = np.asarray(topo.device_region)
        share = np.ones_like(rate)
        spans = [set(region[g]) for g in vws]
        for a, b in itertools.permutations(set(region), 2):
            n = sum(1 for s in spans if a in s and b in s)
            if n > 1:
                share[np.ix_(region == a, region == b)] = n
        return cls(model, batch, flop, speed, capacity, delay, rate / share)

    def transfer(self, src: int, dst: int, values: float) -> float:
        return float(self.delay[src, dst] + values * self.batch * BYTES_PER_VALUE / self.rate[src, dst])


def partition(costs: Costs, devices: list[int], in_flight: int) -> VirtualWorker:
    """HetPipe's partition of the model over `devices` in this order with `in_flight` minibatches
    (the `optimal` allocator); HetPipeError when no partition fits the GPUs' memory."""
    m = costs.model
    K, L = len(devices), len(m.layers)
    out = np.array([l.out_values for l in m.layers], dtype=float)
    recv = np.zeros((2, K, L + 1))
    for k in range(K):
        if k > 0:  # its input: the previous layer's output from the previous stage
            recv[0, k, 1:] = [costs.transfer(devices[k - 1], devices[k], v) for v in out]
        if k < K - 1:  # the gradient of its last layer's output from the next stage
            recv[1, k, 1:] = [costs.transfer(devices[k + 1], devices[k], v) for v in out]
    kept = np.array([l.kept_values for l in m.layers], dtype=float) * costs.batch * BYTES_PER_VALUE
    params = np.array([l.params for l in m.layers], dtype=float) * PARAM_BYTES
    stash = [in_flight if k < K - 1 else 1 for k in range(K)]
    block_mem = np.array([params + s * kept for s in stash])
    per_flop = 1.0 / costs.flops_per_s[devices]
    problem = Problem(seconds_per_flop=per_flop, block_flop=3 * costs.flop, fixed_seconds=np.zeros(K),
                      block_memory=block_mem.min(0), memory=costs.capacity[devices], receive_seconds=recv,
                      device_block_memory=block_mem,
                      names=tuple(f"stage {k} (device {d})" for k, d in enumerate(devices)))
    try:
        alloc = allocate("optimal", problem)
    except AllocationError as e:
        raise HetPipeError(f"virtual worker {vw_name(devices)}: cannot hold {m.name} with "
                           f"{in_flight} minibatch(es) of {costs.batch} in flight ({e})") from None
    stages = alloc.stages
    fwd = [float(costs.flop[a:b].sum() * per_flop[k]) for k, (a, b) in enumerate(stages)]
    send_f = [costs.transfer(devices[k], devices[k + 1], out[stages[k][1] - 1]) for k in range(K - 1)]
    send_b = [costs.transfer(devices[k + 1], devices[k], out[stages[k][1] - 1]) for k in range(K - 1)]
    return VirtualWorker(tuple(devices), stages, tuple(fwd), tuple(2 * f for f in fwd), tuple(send_f),
                         tuple(send_b), tuple(float(x) for x in problem.stage_memory(alloc.layers_per_device)),
                         tuple(float(x) for x in costs.capacity[devices]))


def vw_name(devices) -> str:
    """A virtual worker in a message: its device ids, or their count and range when there are many."""
    ds = sorted(devices)
    return ",".join(map(str, ds)) if len(ds) <= 8 else f"of {len(ds)} GPUs ({ds[0]}..{ds[-1]})"


MAX_ORDERS = 40320  # stage orders best_order tries (8 GPUs of 8 types); beyond, a one-line refusal


def type_orders(counts: dict[str, int]):
    """Every distinct sequence with counts[t] of each type t, in sorted order: GPUs of one type are
    interchangeable, so 64 identical GPUs have one order, not 64! permutations."""
    types = sorted(counts)
    left = dict(counts)
    n = sum(counts.values())
    seq: list[str] = []

    def rec():
        if len(seq) == n:
            yield tuple(seq)
            return
        for t in types:
            if left[t]:
                left[t] -= 1
                seq.append(t)
                yield from rec()
                seq.pop()
                left[t] += 1
    return rec()


def best_order(topo: Topology, costs: Costs, devices: list[int], in_flight: int) -> VirtualWorker:
    """The stage order of the VW's GPU types (devices of one type in id order) whose partition has the
    smallest bottleneck; HetPipeError when none fits."""
    by_type: dict[str, list[int]] = {}
    for d in sorted(devices):
        by_type.setdefault(topo.profiles[d].gpu, []).append(d)
    counts = {t: len(ds) for t, ds in by_type.items()}
    orders = math.factorial(len(devices)) // math.prod(math.factorial(c) for c in counts.values())
    if orders > MAX_ORDERS:
        raise HetPipeError(f"virtual worker {vw_name(devices)}: {orders} stage orders of its "
                           f"GPU types to try (at most {MAX_ORDERS}); give smaller virtual workers or fewer GPU types")
    best, last_error = None, None
    for order in type_orders(counts):
        pools = {t: list(ds) for t, ds in by_type.items()}
        devs = [pools[t].pop(0) for t in order]
        try:
            vw = partition(costs, devs, in_flight)
        except HetPipeError as e:
            last_error = e
            continue
        if best is None or vw.bottleneck_seconds < best.bottleneck_seconds - 1e-15:
            best = vw
    if best is None:
        raise last_error
    return best


def max_in_flight(topo: Topology, costs: Costs, devices: list[int], limit: int = MAX_NM) -> int:
    """Max_m of a VW: the most minibatches in flight some order and partition fits (0: not even one)."""
    lo = 0
    for n in range(1, limit + 1):
        try:
            best_order(topo, costs, devices, n)
        except HetPipeError:
            break
        lo = n
    return lo


# ----------------------------------------------------------------------------- the parameter server
def ps_traffic(topo: Topology, model: LayerProfile, vws: list[VirtualWorker], placement: str) -> np.ndarray:
    """Bytes every device sends to each node's parameter-server shard per wave (its stages' aggregated
    update; the pull brings the same back): (devices, regions).

    default: layer l's shard on node l mod (nodes used), round-robin as TensorFlow places variables;
    local: every layer's shard on the node of the GPUs that hold it, which needs every VW to hold
    each layer on one node (ED, where VWs are identical)."""
    if placement not in PLACEMENTS:
        raise HetPipeError(f"--ps-placement: unknown {placement!r} (known: {', '.join(PLACEMENTS)})")
    owner = PLACEMENTS[placement](topo, model, vws)
    out = np.zeros((topo.n, len(topo.regions)))
    for vw in vws:
        for k, (a, b) in enumerate(vw.stages):
            for l in range(a, b):
                out[vw.devices[k], owner[l]] += model.layers[l].params * BYTES_PER_VALUE
    return out


def _round_robin_owners(topo: Topology, model: LayerProfile, vws: list[VirtualWorker]) -> list[int]:
    used = sorted({topo.device_region[d] for vw in vws for d in vw.devices})
    return [used[l % len(used)] for l in range(len(model.layers))]


def _local_owners(topo: Topology, model: LayerProfile, vws: list[VirtualWorker]) -> list[int]:
    owner = []
    for l in range(len(model.layers)):
        homes = {topo.device_region[vw.devices[_stage_of(vw, l)]] for vw in vws}
        if len(homes) > 1:
            raise HetPipeError(f"--ps-placement local: layer {model.layers[l].name} is on nodes "
                               f"{', '.join(sorted(topo.regions[h].name for h in homes))} in different virtual "
                               "workers; local placement needs every VW to hold a layer on one node (policy ed)")
        owner.append(homes.pop())
    return owner


# the parameter server's shard placements: layer -> the node holding its shard
PLACEMENTS = {"default": _round_robin_owners, "local": _local_owners}


def _stage_of(vw: VirtualWorker, layer: int) -> int:
    return next(k for k, (a, b) in enumerate(vw.stages) if a <= layer < b)


def sync_seconds(topo: Topology, traffic: np.ndarray) -> float:
    """One push (or pull) of every VW at once: the busiest of each node's network link (bytes leaving
    or entering it for other nodes), each GPU's PCIe link to its host and each GPU's own interface where
    the scenario limits it (interface_gbps), plus a delay."""
    region = np.asarray(topo.device_region)
    bw = gbps_to_bytes_per_s(np.asarray(topo.bandwidth_gbps, dtype=float))
    R = len(topo.regions)
    cross = np.array([[traffic[region == a, b].sum() if a != b else 0.0 for b in range(R)] for a in range(R)])
    t = 0.0
    for a in range(R):
        others = np.flatnonzero(region != a)
        if not len(others):
            continue
        nic = bw[np.ix_(region == a, others)].max()
        t = max(t, cross[a].sum() / nic, cross[:, a].sum() / nic)
    for d in range(topo.n):  # the GPU's own link to its host: as fast as to its node's other GPUs
        peers = np.flatnonzero((region == region[d]) & (np.arange(topo.n) != d))
        if len(peers) and traffic[d].sum():
            t = max(t, traffic[d].sum() / bw[d, peers].max())
    if topo.interface_gbps is not None:
        t = max(t, float((traffic.sum(1) / gbps_to_bytes_per_s(np.asarray(topo.interface_gbps, dtype=float))).max()))
    return t + ms_to_s(float(np.asarray(topo.delay_ms).max()))


def cut_bytes(topo: Topology, model: LayerProfile, vw: VirtualWorker, batch: int) -> float:
    """Bytes of one minibatch's activations crossing between nodes in `vw` (the gradients come back alike)."""
    region = topo.device_region
    return float(sum(model.layers[vw.stages[k][1] - 1].out_values * batch * BYTES_PER_VALUE
                     for k in range(len(vw.devices) - 1) if region[vw.devices[k]] != region[vw.devices[k + 1]]))


def cross_node_bytes(topo: Topology, model: LayerProfile, vws: list[VirtualWorker], traffic: np.ndarray,
                     batch: int, in_flight: int) -> float:
    """Bytes crossing between nodes per wave: activations and gradients between stages on different
    nodes for the wave's N_m minibatches of every VW, and the parameter-server push and pull."""
    pipeline = sum(2 * cut_bytes(topo, model, vw, batch) * in_flight for vw in vws)
    region = np.asarray(topo.device_region)
    remote = sum(traffic[d, r] for d in range(topo.n) for r in range(traffic.shape[1]) if r != region[d])
    return pipeline + 2 * remote


# ----------------------------------------------------------------------------- the whole plan
@dataclass
class HetPipePlan:
    """HetPipe on a set of GPUs: its VWs, N_m, the parameter server's sync time and the simulated run."""

    policy: str
    placement: str
    staleness: int
    in_flight: int  # N_m
    max_in_flight: int  # the smallest VW's Max_m
    devices: list[int]
    vws: list[VirtualWorker]
    sync_seconds: float  # one push (or pull) of every VW's wave update
    cross_node_bytes: float  # per wave
    result: "object"  # sim.wsp.WSPResult

    @property
    def samples_per_wave(self) -> int:
        """Minibatches per wave over all VWs."""
        return len(self.vws) * self.in_flight

    def layout(self):
        """The VWs as a harness Layout whose pipelines differ per replica (harness/layout/), each stage's
        [first, last) layers of the CNN: what a real run of HetPipe will place."""
        from ...layout import from_replicas

        return from_replicas([(vw.devices, vw.stages) for vw in self.vws], placement=f"hetpipe-{self.policy}")


def _signature(topo: Topology, devices) -> tuple[int, ...]:
    return tuple(sorted(topo.device_region[d] for d in devices))


def _same_order(topo: Topology, like: VirtualWorker, devices) -> list[int]:
    """`devices` in the node order of `like` (a VW over the same nodes), each node's devices in id order."""
    pools = {r: list(ds) for r, ds in nodes_of(topo, devices).items()}
    return [pools[topo.device_region[d]].pop(0) for d in like.devices]


def virtual_workers(topo: Topology, costs: Costs, groups: list[list[int]], in_flight: int) -> list[VirtualWorker]:
    """Every group's best order and partition for `in_flight` (groups over the same nodes share the search)."""
    found: dict[tuple, VirtualWorker] = {}
    out = []
    for g in groups:
        sig = _signature(topo, g)
        if sig not in found:
            found[sig] = best_order(topo, costs, g, in_flight)
            out.append(found[sig])
        else:
            out.append(partition(costs, _same_order(topo, found[sig], g), in_flight))
    return out


def plan(topo: Topology, model: LayerProfile, batch: int, policy: str, placement: str = "default", staleness: int = 0,
         gpus: str | None = None, in_flight: int | None = None, progress=None, profiles=None,
         most_in_flight: int = MAX_NM) -> HetPipePlan:
    """HetPipe's plan and its simulated throughput; N_m the fastest up to Max_m (and `most_in_flight`) unless
    given. profiles: every device's ComputeProfile at fp32 (default: the scenario's, harness/compute/profiles.py)."""
    from . import wsp

    if placement not in PLACEMENTS:
        raise HetPipeError(f"--ps-placement: unknown {placement!r} (known: {', '.join(PLACEMENTS)})")
    if staleness < 0:
        raise HetPipeError(f"--staleness: must be >= 0 (got {staleness})")
    devices = select_gpus(topo, gpus)
    groups = group(topo, devices, policy)
    costs = Costs.of(topo, model, batch, groups, profiles)
    best, n = None, 0
    tries = [in_flight] if in_flight else range(1, min(MAX_NM, most_in_flight) + 1)
    for n in tries:
        try:
            vws = virtual_workers(topo, costs, groups, n)
        except HetPipeError as e:
            if in_flight:
                raise HetPipeError(f"--in-flight {in_flight}: N_m too large for --policy {policy} ({e}); leave "
                                   "--in-flight out for the fastest N_m that fits") from None
            if n == 1:
                raise HetPipeError(f"--policy {policy}: {e}") from None
            n -= 1
            break
        traffic = ps_traffic(topo, model, vws, placement)
        sync = sync_seconds(topo, traffic)
        result = wsp.simulate(vws, n, batch, staleness, sync, sync)
        if best is None or result.samples_per_s > best.result.samples_per_s * (1 + 1e-9):
            best = HetPipePlan(policy, placement, staleness, n, 0, devices, vws, sync,
                        cross_node_bytes(topo, model, vws, traffic, batch, n), result)
        if progress:
            progress(n)
    best.max_in_flight = n
    return best
