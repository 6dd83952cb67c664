"""DiLoCo in the simulator: an inner step, the outer syncs and their bytes, from the compute model and the same
network model (netmodel/) as every system's.

The runtime's iteration (runtime.py), as a model:
- an inner step of replica r: each of its devices' share of the batch, micro-batch by micro-batch, forward and
  backward at the compute model's times, then (a replica of several devices) a ring all-reduce of every gradient
  over the replica's devices, then the inner optimizer; the replica's step is its slowest device's;
- replicas do not wait for each other between syncs, so a fragment's turn of H / fragments inner steps lasts
  the slowest replica's steps, then its sync: the pseudo-gradients of the fragment's parameters all-reduced over
  the replicas (a ring in replica order, one per position in a replica, all at once: gloo's for fp32 and bf16,
  codec.py's for int8) and the outer optimizer's step over them; under streaming the
  all-reduce starts `fragment_sync_delay` inner steps early, so only what outlasts them is exposed;
- an iteration's time is the average over a cycle of H inner steps (each fragment once);
- replicas that are ours' pipelines (`--replica-stages`): ours' model of the pipelines without their data-parallel sync,
  and each stage's outer sync over its stage group (_pipeline_replicas).
What it leaves out: the quorum's RPCs to the Lighthouse and the should-commit round (a few small messages a
sync, their delays), the pseudo-gradient's copies, and the split of a large fragment into torchft's buckets (one
all-reduce a bucket, one after another, where the model sends one tensor).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...compute import activation_bytes, micro_batches, optimizer_seconds, rank_phase_seconds
from ...compute.model import GPTConfig, stage_params
from ...netmodel import collectives
from ...plan.request import RunSection
from ...sim.quorum import QuorumModel
from .settings import BYTES_ON_WIRE, INT8_SCALE_OVERHEAD, DiLoCoSettings, fragment_cuts


def stage_fragment_params(cfg: GPTConfig, blocks: list[int], fragments: int) -> np.ndarray:
    """Parameters of each fragment of each stage, (stages, fragments), of a model whose stages hold `blocks`
    (a stage's fragments: its consecutive blocks cut as even as they go, as members.fragments_of; the embedding with
    the first stage's first, the head with the last stage's last)."""
    cuts = [fragment_cuts(n, fragments) for n in blocks]
    pieces = [b - a for c in cuts for a, b in zip(c, c[1:])]
    return np.asarray(stage_params(cfg, pieces), dtype=float).reshape(len(blocks), fragments)


def fragment_params(cfg: GPTConfig, fragments: int) -> list[int]:
    """Parameters of each fragment of the whole model (one stage)."""
    return [int(p) for p in stage_fragment_params(cfg, [cfg.layers], fragments)[0]]


def value_bytes(wire: str, bpv: int) -> float:
    """A pseudo-gradient value's bytes on the wire: the parameters' own precision (`bpv`) when the wire format is
    no narrower (codec.py passes other dtypes through), int8's byte and its share of a block's scale."""
    return 1.0 * INT8_SCALE_OVERHEAD if wire == "int8" else float(min(BYTES_ON_WIRE[wire], bpv))


def sync_bytes(values: float, wire: str, replicas: int, bpv: int) -> float:
    """What one rank sends for the all-reduce of `values` pseudo-gradient values over `replicas` replicas."""
    return 2 * (replicas - 1) / replicas * values * value_bytes(wire, bpv)


def sync_seconds(links, rings: np.ndarray, values, wire: str, bpv: int) -> float:
    """The all-reduce of `values` pseudo-gradient values (one count, or one a ring) in every ring of `rings`
    (positions x replicas) at once."""
    if rings.shape[1] < 2:
        return 0.0
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


def simulate_diloco_layout(links, profiles, cfg, batch: int, lay, mb: int, bpv: int, options: dict | None = None,
                           iterations: tuple[int, int] | None = None) -> tuple[float, float]:
    """(seconds an iteration averaged over a cycle of H inner steps, the busiest device's compute); with
    `iterations` (warm-up, timed), a measured run's length, the mean of its timed iterations, which hold the syncs
    the run's own steps reached (a run shorter than H / fragments holds none: its iterations are inner steps)."""
    if lay.pp > 1:
        return _pipeline_replicas(links, profiles, cfg, batch, lay, mb, bpv,
                                  DiLoCoSettings.of(options or {}, lay.devices, cfg.layers), iterations)
    devices = devices_of(lay)
    s = DiLoCoSettings.of(options or {}, len(devices), cfg.layers)
    n, k = len(devices), s.devices_per_replica(len(devices))
    steps, compute = inner_step_seconds(links, profiles, cfg, batch, lay, mb, bpv, s)
    step = float(steps.max())
    rings = np.asarray(devices).reshape(n // k, k).T  # position g of every replica, in replica order
    exposed = []
    for values in fragment_params(cfg, s.fragments):
        outer = max(optimizer_seconds(values, profiles[d]) for d in devices)
        exposed.append(max(0.0, sync_seconds(links, rings, values, s.wire, bpv) - s.fragment_sync_delay * step)
                       + outer)
    return iteration_seconds(step, exposed, s.sync_every // s.fragments, iterations), compute


def iteration_seconds(step: float, exposed: list[float], turn: int, iterations: tuple[int, int] | None) -> float:
    """An iteration's seconds: an inner step plus the exposed sync of each fragment (`exposed`, in turn), one every
    `turn` steps, averaged over a cycle; or over the timed iterations of a run of `iterations` (warm-up, timed),
    whose iteration i syncs fragment j % fragments when (i + 1) = (j + 1) * turn, as the runtime does."""
    if iterations is None:
        return step + sum(exposed) / len(exposed) / turn
    warmup, timed = iterations
    synced = sum(exposed[((i + 1) // turn - 1) % len(exposed)] for i in range(warmup, warmup + timed)
                 if (i + 1) % turn == 0)
    return step + synced / max(timed, 1)


def _pipelines_step(links, profiles, cfg, batch: int, lay, mb: int, bpv: int):
    """Ours' model of the pipelines with no data-parallel sync: the slowest pipeline's iteration."""
    from ..ours.sim import simulate_ours

    return simulate_ours(links, profiles, cfg, batch, replace(lay, dp_sync="sharded-ps"), mb,
                         dp_bytes=np.zeros(lay.pp), bytes_per_value=bpv)


def _pipeline_replicas(links, profiles, cfg, batch: int, lay, mb: int, bpv: int, s: DiLoCoSettings,
                       iterations: tuple[int, int] | None = None):
    """Replicas that are ours' pipelines (pipeline_replicas.py): ours' model of its pipelines with no data-parallel
    sync (the slowest pipeline's iteration), then every H / fragments steps a fragment of each stage all-reduced over
    its stage group (a ring a stage, all at once; streaming: started `fragment_sync_delay` steps early) and the outer
    step on it."""
    inner = _pipelines_step(links, profiles, cfg, batch, lay, mb, bpv)
    step = inner.seconds
    groups = lay.array()[:, :, 0]  # (stages, pipelines): stage j's devices
    params = stage_fragment_params(cfg, list(lay.layers_per_stage), s.fragments)
    exposed = []
    for f in range(s.fragments):
        sync = sync_seconds(links, groups, params[:, f], s.wire, bpv)
        outer = max(optimizer_seconds(params[j, f], profiles[d]) for j, row in enumerate(groups) for d in row)
        exposed.append(max(0.0, sync - s.fragment_sync_delay * step) + outer)
    return iteration_seconds(step, exposed, s.sync_every // s.fragments, iterations), inner.compute_seconds


def layout_cross_node_bytes(region, cfg, batch: int, lay, mb: int, bpv: int, options: dict | None = None) -> float:
    """Its runs' payload between devices of different nodes (`region[d]`) an iteration, averaged over a cycle:
    a replica's inner all-reduce (a ring over its devices, every step) and each fragment's outer sync (a ring
    over the replicas)."""
    if lay.pp > 1:  # replicas that are pipelines: activations between stages, each stage's outer sync
        s = DiLoCoSettings.of(options or {}, lay.devices, cfg.layers)
        groups = lay.array()[:, :, 0]  # (stages, pipelines)
        per_micro = 2 * activation_bytes(cfg, mb, bpv)  # forward activations and their gradients
        hops = sum(region[a] != region[b] for pipe in groups.T for a, b in zip(pipe, pipe[1:]))
        params = stage_params(cfg, list(lay.layers_per_stage))
        rings = sum(sum(region[a] != region[b] for a, b in zip(ring, np.roll(ring, -1)))
                    * sync_bytes(params[j], s.wire, lay.dp, bpv) for j, ring in enumerate(groups))
        return hops * micro_batches(batch, mb, lay.dp) * per_micro + rings / s.sync_every
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
        crossing = sum(region[a] != region[b] for a, b in zip(ring, np.roll(ring, -1)))
        per_cycle += crossing * sum(sync_bytes(v, s.wire, r, bpv) for v in fragment_params(cfg, s.fragments))
    return total + per_cycle / s.sync_every


#: torchft's Lighthouse (its default heartbeat_timeout_ms): a replica silent this long is out of the next quorum,
#: which waits for it until then
HEARTBEAT_TIMEOUT_S = 5.0
#: what a replica back receives from a peer to heal, a parameter's bytes: its value, the inner AdamW's two moments,
#: the fragment's parameters at the last sync and the outer momentum, fp32 each (torchft's state dicts)
HEAL_BYTES_PER_PARAM = 4 * 5


def quorum_model(cfg: GPTConfig, options: dict, devices: int) -> QuorumModel:
    """DiLoCo's quorums for the spot predictor (sim/preemption.py): one a fragment's sync, every H / fragments inner
    steps; torchft's Lighthouse timeouts; the heal's state."""
    s = DiLoCoSettings.of(options, devices, cfg.layers)
    return QuorumModel(turn=s.sync_every // s.fragments, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                       join_timeout_s=s.join_timeout, heal_bytes=cfg.params * HEAL_BYTES_PER_PARAM)


def quorum_recovery(links, profiles, cfg, batch: int, lay, mb: int, bpv: int, options: dict, device: int,
                    preempt_at: int, return_at: int | None = None, start_s: float = 0.0,
                    in_sync_s: float | None = None) -> dict:
    """What the model says of a replica (one device, or one of ours' pipelines: _replica_loss) preempted as inner
    step `preempt_at` (0-based, of the run) begins and, optionally, back as step `return_at` begins
    (train/quorum_agent.py measures the same), the replicas in lock step:
    - lost_iterations: the steps it completed since its last sync, which no outer step holds;
    - detect_s: from the preemption to the end of the first sync without it: the survivors' steps to their next
      sync, their quorum waiting for it (until its heartbeats have stopped, at most the join timeout:
      QuorumModel.wait_s), then the sync over the replicas left;
    - back: restart_s (`start_s`: a process's start), state_moved_s (from its start to its heal: its own turn of
      steps, waiting at its first quorum for the others' next sync, then the peer's state over the link from the
      first other replica) and its lost_iterations (those steps, on a stale model).
    `in_sync_s`: lost that long into the all-reduce of the sync that ends step `preempt_at` instead, a quorum that
    holds it (streaming's all-reduce is in flight for `fragment_sync_delay` steps; drifting replicas can be in it
    while it trains on). Its machine gone, its packets vanish: those in the sync wait for it until the sync
    timeout from the all-reduce's start, then drop the sync (torchft's should_commit is false: the parameters go
    back to the last sync's, so each replica's turn of steps is thrown away: dropped_iterations) and retry that
    fragment at the end of their next turn, whose quorum leaves it out."""
    s = DiLoCoSettings.of(options, lay.devices, cfg.layers)
    q = quorum_model(cfg, options, lay.devices)
    step, sync, heal = _replica_loss(links, profiles, cfg, batch, lay, mb, bpv, s, q, device)
    if in_sync_s is not None:
        if (preempt_at + 1) % q.turn:
            raise ValueError(f"in_sync_s: step {preempt_at} ends no sync (one every {q.turn} steps)")
        timeout = s.sync_timeout or RunSection().group_timeout_s  # the runtime's default: members.join_torchft
        to_quorum = max(0.0, timeout - in_sync_s) + q.turn * step
        return {"lost_iterations": q.turn - 1, "dropped_iterations": q.turn,
                "detect_s": to_quorum + q.wait_s(to_quorum) + sync}
    to_quorum = (q.turn - preempt_at % q.turn) * step
    out = {"lost_iterations": preempt_at % q.turn, "detect_s": to_quorum + q.wait_s(to_quorum) + sync}
    if return_at is None:
        return out
    ready = start_s + q.turn * step  # its first quorum, after its own turn of steps
    others = (q.turn - return_at % q.turn) * step  # the others' next quorum, from its return
    while others < ready:
        others += q.turn * step
    out["back"] = {"restart_s": start_s, "state_moved_s": others + heal, "lost_iterations": q.turn}
    return out


def _replica_loss(links, profiles, cfg, batch: int, lay, mb: int, bpv: int, s: DiLoCoSettings, q: QuorumModel,
                  device: int) -> tuple[float, float, float]:
    """(an inner step, a sync of the first fragment over the replicas left, the heal of `device`'s replica back)
    for quorum_recovery: its replica is one device, or the pipeline that holds it (`--replica-stages`: an inner
    step is ours' pipeline's, each stage's sync a ring over the same stage of the pipelines left, and each stage
    heals from the same stage of the first other pipeline, all at once)."""
    groups = lay.array()[:, :, 0]  # (stages, replicas); one stage: every device its own replica
    if lay.pp > 1:
        step = _pipelines_step(links, profiles, cfg, batch, lay, mb, bpv).seconds
    else:
        step = float(inner_step_seconds(links, profiles, cfg, batch, lay, mb, bpv, s)[0].max())
    mine = next(r for r in range(groups.shape[1]) if device in groups[:, r])
    left = np.delete(groups, mine, axis=1)
    params = stage_fragment_params(cfg, list(lay.layers_per_stage), s.fragments)
    sync = sync_seconds(links, left, params[:, 0], s.wire, bpv) + max(
        optimizer_seconds(params[j, 0], profiles[d]) for j, row in enumerate(left) for d in row)
    heal = max(replace(q, heal_bytes=params[j].sum() * HEAL_BYTES_PER_PARAM).heal_s(links, left[j, 0], groups[j, mine])
               for j in range(lay.pp))
    return step, sync, heal
