"""The baselines in the simulator: Megatron-LM's and DeepSpeed's iterations (their designs, not torch's
runtime), the model `sim compare` holds a baseline run against, and the layouts of legacy records.

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
"""
from __future__ import annotations

import numpy as np

from ... import compute as work
from ... import layout as layouts
from ...compute import links as network
from ...compute.links import Links
from ...compute.model import GPTConfig
from ...layout import Layout
from ...sim import pipeline, torch_runtime
from ...sim.systems import SimError, SimResult, check_layers, optimizer_step


# --------------------------------------------------------------------------- Megatron
def pipeline_1f1b(links: Links, profiles, cfg, batch, layout: Layout, micro_batch: int, bytes_per_value: int):
    """Timeline of Megatron's / DeepSpeed's 1F1B engine on the layout's mesh (pp, dp, tp)."""
    dev = layout.array()
    pp, dp, tp = dev.shape
    check_layers(cfg, pp)
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
    if pp > 1 and tp == 1:  # each hop one message on one connection: its window remembers the iteration
        h = links.protocol.p2p_handshake
        times = pipeline.StageTimes(fwd, bwd, fser[..., 0], (fdel + h * bdel)[..., 0], bser[..., 0],
                                    (bdel + h * fdel)[..., 0], links, dev[..., 0], act)
    else:
        times = pipeline.StageTimes(fwd, bwd, f_link, zeros, b_link, zeros)
    tl = pipeline.timeline(times, M, "1f1b", overlap=False)
    compute = M * np.moveaxis(f_all + b_all, -1, 0)  # (pp, dp, tp)
    return tl, M, compute


def simulate_megatron(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout, micro_batch: int = 1,
                      bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    dev = layout.array()
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    tl, M, compute = pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
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
    tl, M, compute = pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
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


def simulate_runtime_of_layout(links, profiles, cfg, batch: int, lay: Layout, mb: int,
                               bpv: int) -> tuple[float, float]:
    """The baselines' runtime the layout names: ZeRO-3 (FSDP2), Megatron-LM's model when tensor parallel
    (the torch-runtime model has none), else torch.distributed.pipelining + DDP (+ ZeRO-1)."""
    if lay.zero == 3:
        r = simulate_zero3(links, profiles, cfg, batch, lay, mb, bpv)
    elif lay.tp > 1:
        r = simulate_megatron(links, profiles, cfg, batch, lay, mb, bpv)
    else:
        seconds, compute, _ = torch_runtime.simulate(links, profiles, cfg, batch, lay, mb, bpv)
        return seconds, compute
    return r.seconds, r.compute_seconds


def legacy_mesh_layout(rec: dict, conf: dict, cfg, n: int, device: str, schedule_ours, default_zero: int = 0) -> Layout:
    """The baselines' legacy records: degrees (tp, pp, dp, zero) and an optional rank order."""
    zero = int(conf.get("zero", default_zero))
    tp, pp = int(conf.get("tp", 1)), int(conf.get("pp", 1))
    dp = int(conf.get("dp", n // (tp * pp)))
    lay = layouts.in_rank_order(tp, pp, dp, cfg.layers, zero=zero, schedule=conf.get("schedule", "1f1b"))
    return layouts.with_rank_order(lay, conf["rank_order"]) if conf.get("rank_order") else lay


def legacy_zero3_layout(rec: dict, conf: dict, cfg, n: int, device: str, schedule_ours) -> Layout:
    """DeepSpeed's legacy records: ZeRO-3 unless they name a stage."""
    return legacy_mesh_layout(rec, conf, cfg, n, device, schedule_ours, default_zero=3)
