"""One simulated training iteration per system, from a topology, a layout and a model config.

- ours: GPipe over the assignment's pipelines with overlapped point-to-point
  (pipeline.py, overlap runtime), then the sharded parameter server inside every
  data-parallel group C_j, each device starting as soon as its own backward is done.
- megatron: tensor x pipeline x data parallel in Megatron-LM's rank order (tensor
  fastest, then data, then pipeline: rank = (pp*D + dp)*T + tp). Per layer and
  micro-batch two ring all-reduces of the activation in the forward, two in the
  recomputed forward and two in the backward (Shoeybi et al. 2019), blocking the
  stage; 1F1B with blocking point-to-point; with T > 1 each tensor rank sends 1/T of
  the activation to its peer and the next stage all-gathers it (Narayanan et al. 2021,
  scatter/gather); then a ring all-reduce of the gradients per data-parallel group.
- deepspeed ZeRO-3: all devices data-parallel; per layer and micro-batch an all-gather
  of the layer's parameters for the forward, one for the recomputed forward, one for
  the backward, and a reduce-scatter of its gradients; the next layer's all-gather is
  prefetched, so a layer takes max(compute, communication).
- deepspeed ZeRO-1 + pipeline: the pipeline engine as Megatron's with T = 1, then a
  ring all-reduce of the gradients and a ring all-gather of the updated parameters.
Every device then runs its optimizer step over the parameters it updates (compute.optimizer_seconds:
its 1/T share, and 1/D of that under ZeRO). All collectives are rings in rank order (harness/compute/links.py). Every system takes its harness.layout.Layout:
devices of every (stage, replica, tensor rank), the blocks of every stage, schedule and sync.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import HarnessError
from ..layout import Layout
from ..compute.model import GPTConfig, stage_params
from ..compute.profiles import ComputeProfile
from .. import compute as work
from ..compute import links as network
from . import pipeline
from ..compute.links import Links


class SimError(HarnessError, ValueError):
    """A layout the simulator cannot run (sizes that do not divide); str() is one line."""


@dataclass
class SimResult:
    system: str
    config: dict
    seconds: float
    compute_seconds: float  # busiest device's compute time
    pp_comm_seconds: float = 0.0  # sum over stage boundaries of the slowest replica's link busy span (fwd + bwd)
    dp_comm_seconds: float = 0.0  # longest data-parallel synchronisation of a device, from its own start
    details: dict = field(default_factory=dict)


def _check_layers(cfg: GPTConfig, pp: int):
    if pp > cfg.layers:
        raise SimError(f"--layers: {cfg.layers} layers cannot fill {pp} pipeline stages")


def optimizer_step(cfg: GPTConfig, profiles, layout: Layout, shards: int = 1) -> np.ndarray:
    """(pp, dp, tp) seconds of every device's optimizer step: its 1/tp share of its stage's
    parameters (vocabulary-parallel ends, as Megatron-LM), and 1/shards of that (ZeRO)."""
    dev = layout.array()
    params = np.asarray(stage_params(cfg, list(layout.layers_per_stage)), dtype=float) / (layout.tp * shards)
    return np.vectorize(lambda j, d: work.optimizer_seconds(params[j], profiles[d]))(
        np.arange(dev.shape[0])[:, None, None], dev)


# --------------------------------------------------------------------------- ours
STEADY_ITERATIONS = 3  # ours: iterations chained to reach the steady-state period (simulate_ours)


def simulate_ours(links: Links, profiles: list[ComputeProfile], cfg: GPTConfig, batch: int,
                  layout: Layout, micro_batch: int = 1, system: str = "ours",
                  dp_bytes: np.ndarray | None = None, ps_mode: str = "grouped",
                  bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    """The layout's pipelines (D_DP, D_PP), its schedule (gpipe, the paper, or 1f1b), dp_sync (sharded-ps,
    the paper, or allreduce: ring) and recompute, as the trainer runs them. dp_bytes overrides the
    per-stage gradient bytes; ps_mode "grouped" or "rounds" (network.sharded_ps)."""
    pipelines = layout.array()[:, :, 0].T  # (D_DP, D_PP); a layout whose pipelines differ: one-line LayoutError
    R, P = pipelines.shape
    _check_layers(cfg, P)
    schedule, dp_sync = layout.schedule, layout.dp_sync
    M = work.micro_batches(batch, micro_batch, R, "pipelines")
    fwd, bwd = work.stage_compute(cfg, layout.layers_per_stage, micro_batch, profiles, pipelines,
                                      recompute=layout.recompute)  # (R, P)
    params = stage_params(cfg, list(layout.layers_per_stage))
    opt = np.array([[work.optimizer_seconds(params[j], profiles[d]) for j, d in enumerate(row)]
                    for row in pipelines])  # (R, P)
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    S = pipelines.T  # (P, R)
    fser, fdel = network.step_times(links, S[:-1], S[1:], act)
    bser, bdel = network.step_times(links, S[1:], S[:-1], act)
    times = pipeline.StageTimes(fwd.T, bwd.T, fser, fdel, bser, bdel)
    grads = (work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value) if dp_bytes is None
             else np.asarray(dp_bytes, dtype=float))
    # No barrier between iterations: a stage starts the next one when its own sync is done, so a
    # long sync tail of one stage overlaps the next iteration's fill on the others. One iteration
    # from a common start, then STEADY_ITERATIONS - 1 more; the last interval is the period.
    start, ends = None, []
    for _ in range(STEADY_ITERATIONS):
        tl = pipeline.timeline(times, M, schedule, overlap=True, start=start)
        end = np.empty_like(tl.finish)
        for j in range(P):
            if dp_sync == "sharded-ps":
                # the runtime posts every receive of the iteration up front (harness/train/dp_sync.py)
                end[j] = network.sharded_ps(links, S[j][None, :], grads[j], start=tl.finish[j][None, :],
                                            mode=ps_mode, preposted=True)[0]
            elif dp_sync == "allreduce":
                end[j] = network.ring_allreduce(links, S[j][None, :], grads[j], start=tl.finish[j][None, :])[0]
            else:
                raise SimError(f"dp_sync: unknown {dp_sync!r} (known: sharded-ps, allreduce)")
        end += opt.T  # then every device's optimizer step over its stage
        if start is None:  # the first iteration, from a common start: its spans are reported
            first = (tl, end)
        ends.append(float(end.max()))
        start = end
    seconds = ends[-1] - ends[-2] if len(ends) > 1 else ends[0]
    compute = float((M * (fwd + bwd) + opt).max())
    tl, end = first
    return SimResult(
        system, {"pp": P, "dp": R}, seconds, compute,
        pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if P > 1 else 0.0,
        dp_comm_seconds=float((end - tl.finish).max()),
        details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M, "first_iteration_seconds": ends[0]},
    )


# --------------------------------------------------------------------------- Megatron
def _pipeline_1f1b(links: Links, profiles, cfg, batch, layout: Layout, micro_batch: int, bytes_per_value: int):
    """Timeline of Megatron's / DeepSpeed's 1F1B engine on the layout's mesh (pp, dp, tp)."""
    dev = layout.array()
    pp, dp, tp = dev.shape
    _check_layers(cfg, pp)
    if cfg.heads % tp:
        raise SimError(f"tensor parallel {tp} does not divide the {cfg.heads} attention heads")
    M = work.micro_batches(batch, micro_batch, dp, "data-parallel replicas")
    # compute of each tensor rank; the stage runs at its slowest rank's pace
    f_all, b_all = work.stage_compute(cfg, layout.layers_per_stage, micro_batch, profiles,
                                          np.moveaxis(dev, 0, -1), tp)  # (dp, tp, pp)
    fwd = f_all.max(1).T  # (pp, dp)
    bwd = b_all.max(1).T
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    layers = np.asarray(layout.layers_per_stage)
    if tp > 1:
        groups = dev.reshape(pp * dp, tp)
        ar = network.ring_allreduce(links, groups, act).max(1).reshape(pp, dp)
        ag = network.ring_allgather(links, groups, act).max(1).reshape(pp, dp)
        n_f = 2 * layers.astype(float)
        n_b = 4 * layers.astype(float)  # recomputed forward (2) + backward (2)
        n_f[0] += 1  # vocab-parallel embedding output
        n_b[-1] += 1  # gradient of the column-parallel head's input
        fwd = fwd + n_f[:, None] * ar
        bwd = bwd + n_b[:, None] * ar
    else:
        ag = np.zeros((pp, dp))
    if pp > 1:
        src, dst = dev[:-1], dev[1:]  # (pp-1, dp, tp)
        fser, fdel = network.step_times(links, src, dst, act / tp)
        bser, bdel = network.step_times(links, dst, src, act / tp)
        # blocking runtime: only delivery time matters (after the receiver's ready notice, if the
        # library waits for one); the receiving stage all-gathers the slices
        h = links.protocol.p2p_handshake
        f_link = (fser + fdel + h * bdel).max(-1) + (ag[1:] if tp > 1 else 0.0)
        b_link = (bser + bdel + h * fdel).max(-1) + (ag[:-1] if tp > 1 else 0.0)
    else:
        f_link = b_link = np.zeros((0, dp))
    zeros = np.zeros_like(f_link)
    times = pipeline.StageTimes(fwd, bwd, f_link, zeros, b_link, zeros)
    tl = pipeline.timeline(times, M, "1f1b", overlap=False)
    compute = M * np.moveaxis(f_all + b_all, -1, 0)  # (pp, dp, tp)
    return tl, M, compute


def simulate_megatron(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout, micro_batch: int = 1,
                      bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    dev = layout.array()
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    tl, M, compute = _pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
    opt = optimizer_step(cfg, profiles, layout)
    grads = work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value) / tp
    end = np.empty((pp, dp, tp))
    for j in range(pp):
        groups = dev[j].T  # (tp, dp): one data-parallel ring per tensor rank
        start = np.broadcast_to(tl.finish[j][None, :], groups.shape)
        end[j] = network.ring_allreduce(links, groups, grads[j], start=start).T
    end += opt
    finish = tl.finish[:, :, None]
    return SimResult("megatron", {"tp": tp, "pp": pp, "dp": dp}, float(end.max()), float((compute + opt).max()),
                     pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if pp > 1 else 0.0,
                     dp_comm_seconds=float((end - finish).max()),
                     details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M})


# --------------------------------------------------------------------------- DeepSpeed
def simulate_zero1_pp(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout, micro_batch: int = 1,
                      bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    dev = layout.array()
    pp, dp = layout.pp, layout.dp
    tl, M, compute = _pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
    opt = optimizer_step(cfg, profiles, layout, shards=dp)[:, :, 0]  # each rank steps its 1/dp shard
    grads = work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value)
    end = np.empty((pp, dp))
    for j in range(pp):
        g = dev[j, :, 0][None, :]
        t = network.ring_allreduce(links, g, grads[j], start=tl.finish[j][None, :]) + opt[j][None, :]
        end[j] = network.ring_allgather(links, g, grads[j], start=t)[0]  # updated fp16 parameters
    return SimResult("deepspeed", {"zero": 1, "pp": pp, "dp": dp}, float(end.max()),
                     float((compute[:, :, 0] + opt).max()),
                     pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if pp > 1 else 0.0,
                     dp_comm_seconds=float((end - tl.finish).max()),
                     details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M})


def simulate_zero3(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout,
                   micro_batch: int = 1, bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    ring = layout.array()[0, :, 0][None, :]  # ZeRO-3: one stage, every device a replica, in rank order
    N = ring.shape[1]
    M = work.micro_batches(batch, micro_batch, N, "data-parallel devices")
    rate_t = min(p.flops_per_s("transformer") for p in profiles)  # synchronous collectives: slowest device paces
    rate_h = min(p.flops_per_s("lm_head") for p in profiles)
    c_f = work.block_fwd_flop(cfg, micro_batch) / rate_t
    h_f = work.head_fwd_flop(cfg, micro_batch) / rate_h
    bpv = bytes_per_value

    def gather(params: float) -> float:
        return float(network.ring_allgather(links, ring, params * bpv).max())

    ag_block = gather(cfg.block_params)
    ag_emb = gather(cfg.embedding_params)
    ag_head = gather(cfg.head_params)
    rs_block, rs_emb, rs_head = ag_block, ag_emb, ag_head  # reduce-scatter moves the same bytes as all-gather
    per_layer = max(c_f, ag_block) + max(c_f, ag_block) + max(2 * c_f, ag_block + rs_block)
    per_micro = (cfg.layers * per_layer
                 + ag_emb + rs_emb  # embedding lookup: no compute to hide behind
                 + max(h_f, ag_head) + max(2 * h_f, ag_head + rs_head))
    compute_mb = cfg.layers * 4 * c_f + 3 * h_f
    comm_mb = cfg.layers * (3 * ag_block + rs_block) + ag_emb + rs_emb + 2 * ag_head + rs_head
    opt = float(optimizer_step(cfg, profiles, layout, shards=N).max())  # every rank steps its 1/N shard
    return SimResult("deepspeed", {"zero": 3, "dp": N}, M * per_micro + opt, M * compute_mb + opt,
                     dp_comm_seconds=M * comm_mb,
                     details={"micro_batches": M, "allgather_block_seconds": ag_block})


def simulate_allocation(cfg, topo, devices, allocation, batch: int, micro_batch: int, dtype: str = "fp16",
                        recompute: bool = True) -> float:
    """Seconds of one iteration of ours' runtime (GPipe, one pipeline over `devices` in stage order,
    the allocation's uneven stages; harness.allocation.Allocation) in the simulator, at the devices' profiles."""
    from .. import layout as layouts
    from ..compute.profiles import device_profiles

    lay = layouts.from_replicas([(list(devices), allocation.stages)], placement=allocation.allocator,
                                schedule="gpipe", recompute=recompute)
    r = simulate_ours(Links.from_topology(topo), device_profiles(topo, dtype=dtype), cfg, batch, lay,
                      micro_batch, bytes_per_value=work.BYTES_PER_VALUE[dtype])
    return r.seconds
