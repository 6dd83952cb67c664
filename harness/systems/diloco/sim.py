"""DiLoCo in the simulator: an inner step, the outer syncs and their bytes, from the compute model and the same
network model (netmodel/) as every system's.

The runtime's iteration (runtime.py), as a model:
- an inner step of replica r: each of its devices' share of the batch, micro-batch by micro-batch, forward and
  backward at the compute model's times, then (a replica of several devices) a ring all-reduce of every gradient
  over the replica's devices, then the inner optimizer; the replica's step is its slowest device's;
- replicas do not wait for each other between syncs, so a fragment's turn of H / fragments inner steps lasts
  the slowest replica's steps, then its sync: the pseudo-gradients of the fragment's parameters all-reduced over
  the replicas (fp32 and bf16: gloo's ring, in replica order, one ring per position in a replica, all at once;
  int8: codec.py's all-to-all of quantized chunks and all-gather of their sums, the pattern of the sharded
  parameter server, collectives.sharded_ps) and the outer optimizer's step over them; under streaming the
  all-reduce starts `fragment_sync_delay` inner steps early, so only what outlasts them is exposed;
- an iteration's time is the average over a cycle of H inner steps (each fragment once).
What it leaves out: the quorum's RPCs to the Lighthouse and the should-commit round (a few small messages a
sync, their delays), the pseudo-gradient's copies, and the split of a large fragment into torchft's buckets (one
all-reduce a bucket, one after another, where the model sends one tensor).
"""
from __future__ import annotations

import numpy as np

from ...compute import optimizer_seconds, rank_phase_seconds
from ...compute.model import GPTConfig, stage_params
from ...netmodel import collectives
from .settings import BYTES_ON_WIRE, DiLoCoSettings

INT8_SCALE_OVERHEAD = 1 + 4 / 1024  # codec.BLOCK values share an fp32 scale


def fragment_params(cfg: GPTConfig, fragments: int) -> list[int]:
    """Parameters of each fragment (runtime.fragments_of: consecutive blocks, the embedding with the first, the
    head with the last)."""
    cuts = [round(i * cfg.layers / fragments) for i in range(fragments + 1)]
    return [int(p) for p in stage_params(cfg, [b - a for a, b in zip(cuts, cuts[1:])])]


def value_bytes(wire: str, bpv: int) -> float:
    """A pseudo-gradient value's bytes on the wire: the parameters' own precision (`bpv`) when the wire format is
    no narrower (codec.py passes other dtypes through), int8's byte and its share of a block's scale."""
    return 1.0 * INT8_SCALE_OVERHEAD if wire == "int8" else float(min(BYTES_ON_WIRE[wire], bpv))


def sync_bytes(values: float, wire: str, replicas: int, bpv: int) -> float:
    """What one rank sends for the all-reduce of `values` pseudo-gradient values over `replicas` replicas."""
    return 2 * (replicas - 1) / replicas * values * value_bytes(wire, bpv)


def sync_seconds(links, rings: np.ndarray, values: float, wire: str, bpv: int) -> float:
    """The all-reduce of `values` pseudo-gradient values in every ring of `rings` (positions x replicas) at once."""
    if rings.shape[1] < 2:
        return 0.0
    if wire == "int8":
        return float(collectives.sharded_ps(links, rings, values * value_bytes(wire, bpv)).max())
    return float(collectives.ring_allreduce(links, rings, values * value_bytes(wire, bpv)).max())


def devices_of(lay) -> list[int]:
    """The run's devices in rank order (the layout: one stage, every device a data-parallel rank)."""
    return [int(lay.mesh[0][i][0]) for i in range(lay.dp)]


def inner_step_seconds(links, profiles, cfg, batch: int, lay, mb: int, bpv: int, s: DiLoCoSettings):
    """(each replica's inner step, the busiest device's compute in one)."""
    devices = devices_of(lay)
    n, k = len(devices), s.devices_per_replica(len(devices))
    micro = batch // n // mb
    phases = [rank_phase_seconds(cfg, [cfg.layers], 0, mb, profiles[d], False) for d in devices]
    grads = [micro * (p["forward"] + p["backward"]) for p in phases]
    opt = [p["optimizer"] for p in phases]
    groups = np.asarray(devices).reshape(n // k, k)
    inner = collectives.ring_allreduce(links, groups, cfg.params * bpv).max(1) if k > 1 else np.zeros(n // k)
    step = [max(grads[r * k + g] for g in range(k)) + inner[r] + max(opt[r * k + g] for g in range(k))
            for r in range(n // k)]
    return np.asarray(step), max(g + o for g, o in zip(grads, opt))


def simulate_diloco_layout(links, profiles, cfg, batch: int, lay, mb: int, bpv: int,
                           options: dict | None = None) -> tuple[float, float]:
    """(seconds an iteration averaged over a cycle of H inner steps, the busiest device's compute)."""
    devices = devices_of(lay)
    s = DiLoCoSettings.of(options or {}, len(devices), cfg.layers)
    n, k = len(devices), s.devices_per_replica(len(devices))
    steps, compute = inner_step_seconds(links, profiles, cfg, batch, lay, mb, bpv, s)
    step = float(steps.max())
    rings = np.asarray(devices).reshape(n // k, k).T  # position g of every replica, in replica order
    turn = s.sync_every // s.fragments
    exposed = 0.0
    for values in fragment_params(cfg, s.fragments):
        outer = max(optimizer_seconds(values, profiles[d]) for d in devices)
        exposed += max(0.0, sync_seconds(links, rings, values, s.wire, bpv) - s.fragment_sync_delay * step) + outer
    return step + exposed / s.fragments / turn, compute


def layout_cross_node_bytes(region, cfg, batch: int, lay, mb: int, bpv: int, options: dict | None = None) -> float:
    """Its runs' payload between devices of different nodes (`region[d]`) an iteration, averaged over a cycle:
    a replica's inner all-reduce (a ring over its devices, every step) and each fragment's outer sync (a ring
    over the replicas for fp32 and bf16; int8's all-to-all and all-gather send a chunk to every other replica)."""
    devices = devices_of(lay)
    s = DiLoCoSettings.of(options or {}, len(devices), cfg.layers)
    n, k = len(devices), s.devices_per_replica(len(devices))
    r = n // k
    groups = np.asarray(devices).reshape(r, k)
    total = 0.0
    if k > 1:
        for g in groups:
            crossing = sum(region[a] != region[b] for a, b in zip(g, np.roll(g, -1)))
            total += crossing * 2 * (k - 1) / k * cfg.params * bpv
    per_cycle = 0.0
    for ring in groups.T:
        for values in fragment_params(cfg, s.fragments):
            if s.wire == "int8":  # each replica sends (r - 1) / r of it to the others, twice, evenly
                pairs = sum(region[a] != region[b] for a in ring for b in ring if a != b)
                per_cycle += pairs * 2 * values * value_bytes(s.wire, bpv) / r
            else:
                crossing = sum(region[a] != region[b] for a, b in zip(ring, np.roll(ring, -1)))
                per_cycle += crossing * sync_bytes(values, s.wire, r, bpv)
    return total + per_cycle / s.sync_every
