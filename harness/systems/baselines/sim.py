"""The baselines in the simulator: Megatron-LM's and DeepSpeed's iterations (their designs, not torch's
runtime), the model `sim compare` holds a baseline run against, and the layouts of legacy records.

- megatron: tensor x pipeline x data parallel in Megatron-LM's rank order (tensor
  fastest, then data, then pipeline: rank = (pp*D + dp)*T + tp). Per layer and
  micro-batch two ring all-reduces of the activation in the forward, two in the
  recomputed forward and two in the backward (Shoeybi et al. 2019), blocking the
  stage; 1F1B with blocking point-to-point; with T > 1 each tensor rank sends 1/T of
  the activation to its peer and the next stage all-gathers it (Narayanan et al. 2021,
  scatter/gather); the last stage all-reduces each micro-batch's loss over its data-parallel
  group; then a ring all-reduce of the gradients per data-parallel group, then the tied word
  embedding's gradient all-reduced by the first and last stage (tied_gradients), then the
  found-inf flag and the gradient norm over each replica's model-parallel group.
- deepspeed ZeRO-3: all devices data-parallel; every module step (forward, recomputed
  forward, backward of the embedding, each block, the head) all-gathers the module's
  parameters unless they are still live (DeepSpeed keeps a module's parameters when it is
  used again within stage3_max_reuse_distance parameters: the recompute and backward of a
  block share one gather, the last blocks keep theirs from the forward, the first from
  one micro-batch to the next), and each backward reduce-scatters its gradients; the next
  module's gather is prefetched, so a step takes max(compute, communication).
- deepspeed ZeRO-1 + pipeline: the pipeline engine as Megatron's with T = 1, then the tied word embedding's
  gradient all-reduced by the first and last stage of each replica (tied_gradients), then the gradients
  reduced to each partition's owner in turn (collectives.reduce_to_each), the overflow flag and the
  gradient norm (data-parallel group, then the replica's stages), a ring all-gather of the updated
  parameters, and the loss all-reduced on the last stage and broadcast along each replica.
Small collectives (a flag, a norm, a loss) cost their delays only (collectives.small_allreduce).
"""
from __future__ import annotations

import functools

import numpy as np

from ... import compute as work
from ... import layout as layouts
from ...netmodel import collectives
from ...netmodel.links import Links
from ...compute.model import GPTConfig
from ...layout import Layout
from ...sim import pipeline, torch_runtime
from ...sim.systems import SimError, SimResult, check_layers, optimizer_step


# --------------------------------------------------------------------------- Megatron
def pipeline_1f1b(links: Links, profiles, cfg, batch, layout: Layout, micro_batch: int, bytes_per_value: int,
                  loss_allreduce: bool = False):
    """PipelineTimes of Megatron's / DeepSpeed's 1F1B engine on the layout's mesh (pp, dp, tp); `loss_allreduce`:
    the last stage all-reduces every micro-batch's loss over its data-parallel group before going on (Megatron's
    GPT loss_func, average_losses_across_data_parallel_group)."""
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
    if loss_allreduce and dp > 1:  # a few bytes over each tensor rank's data-parallel group, the replicas in step
        fwd = fwd.copy()
        fwd[-1] += collectives.small_allreduce(links, dev[-1].T).max(0)
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    layers = np.asarray(layout.layers_per_stage)
    if tp > 1:
        groups = dev.reshape(pp * dp, tp)
        ar = collectives.ring_allreduce(links, groups, act).max(1).reshape(pp, dp)
        ag = collectives.ring_allgather(links, groups, act).max(1).reshape(pp, dp)
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
        fser, fdel = collectives.step_times(links, src, dst, act / tp)
        bser, bdel = collectives.step_times(links, dst, src, act / tp)
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
                      bytes_per_value: int = work.PAPER_BYTES, tied_embedding: bool = True) -> SimResult:
    """Megatron-LM's iteration (module docstring); `tied_embedding`: its GPT's word embedding is the LM head's
    weight (False: this harness's runtime, whose head is its own)."""
    dev = layout.array()
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    tl, M, compute = pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value,
                                   loss_allreduce=True)
    opt = optimizer_step(cfg, profiles, layout)
    grads = work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value) / tp
    # one data-parallel ring per stage and tensor rank, all at once (they share the nodes' NICs)
    groups = dev.transpose(0, 2, 1).reshape(pp * tp, dp)
    start = np.broadcast_to(tl.finish[:, None, :], (pp, tp, dp)).reshape(pp * tp, dp)
    end = collectives.ring_allreduce(links, groups, np.repeat(grads, tp), start=start)
    end = end.reshape(pp, tp, dp).transpose(0, 2, 1)
    # then Megatron-LM's train_step all-reduces the tied word embedding's gradient (vocab-parallel: 1/T a tensor rank)
    if tied_embedding:
        end = tied_gradients(links, dev, end, cfg.vocab * cfg.hidden * bytes_per_value / tp)
    # the fp16 optimizer's found-inf flag, then the clipped gradients' norm: each all-reduced over a replica's
    # model-parallel group (its stages and tensor ranks, in rank order) before the step (optimizer.py, clip_grads.py)
    mp = dev.transpose(1, 0, 2).reshape(dp, pp * tp)
    t = end.transpose(1, 0, 2).reshape(dp, pp * tp)
    for _ in range(2):
        t = collectives.small_allreduce(links, mp, start=t)
    end = t.reshape(dp, pp, tp).transpose(1, 0, 2) + opt
    finish = tl.finish[:, :, None]
    return SimResult("megatron", {"tp": tp, "pp": pp, "dp": dp}, float(end.max()), float((compute + opt).max()),
                     pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if pp > 1 else 0.0,
                     dp_comm_seconds=float((end - finish).max()),
                     details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M})


# --------------------------------------------------------------------------- DeepSpeed
def tied_gradients(links: Links, dev: np.ndarray, ready: np.ndarray, nbytes: float) -> np.ndarray:
    """When each device of the mesh `dev` (pp, ...) is done, after the first and the last stage reduced the
    gradient of the weight they share (`ready`: when each was ready for it; the GPT's word embedding, tied to the
    LM head, `nbytes` a device): the two holders of each replica (and tensor rank) all-reduce it once both are
    ready; the other stages go on. DeepSpeed's pipeline engine does it before the data-parallel reduction, Megatron-LM
    after it."""
    out = np.array(ready, dtype=float)
    if dev.shape[0] > 1:
        pair = np.stack([dev[0].ravel(), dev[-1].ravel()], axis=1)  # (replicas x tensor ranks, 2)
        both = np.maximum(out[0], out[-1]).ravel()[:, None].repeat(2, 1)
        done = collectives.ring_allreduce(links, pair, nbytes, start=both)
        out[0], out[-1] = done[:, 0].reshape(out[0].shape), done[:, 1].reshape(out[-1].shape)
    return out


def simulate_zero1_pp(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout, micro_batch: int = 1,
                      bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    dev = layout.array()
    pp, dp = layout.pp, layout.dp
    tl, M, compute = pipeline_1f1b(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
    opt = optimizer_step(cfg, profiles, layout, shards=dp)[:, :, 0]  # each rank steps its 1/dp shard
    grads = work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value)
    # DeepSpeed's TrainSchedule ends ReduceTiedGrads, ReduceGrads, OptimizerStep
    ready = tied_gradients(links, dev[..., 0], tl.finish, cfg.vocab * cfg.hidden * bytes_per_value)
    g = dev[:, :, 0]  # every stage's data-parallel group at once
    # ZeRO-1 reduces each partition's gradients to its owner, then each owner steps and all-gathers its partition
    t = collectives.reduce_to_each(links, g, grads, start=ready)
    for _ in range(2):  # the overflow flag, then the gradients' norm: over each data-parallel group, then each
        # replica's stages (stage_1_and_2.py has_overflow, get_grad_norm_direct: dp group, then the model-parallel one)
        t = collectives.small_allreduce(links, g, start=t)
        t = collectives.small_allreduce(links, g.T, start=t.T).T
    end = collectives.ring_allgather(links, g, grads, start=t + opt)  # updated fp16 parameters
    # then the engine's loss: all-reduced over the last stage's data-parallel group, broadcast to each replica's
    # stages (pipe/engine.py _aggregate_total_loss)
    end[-1] = collectives.small_allreduce(links, g[-1:], start=end[-1:])[0]
    end = collectives.small_broadcast(links, g.T, pp - 1, start=end.T).T
    return SimResult("deepspeed", {"zero": 1, "pp": pp, "dp": dp}, float(end.max()),
                     float((compute[:, :, 0] + opt).max()),
                     pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if pp > 1 else 0.0,
                     dp_comm_seconds=float((end - tl.finish).max()),
                     details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M})


# DeepSpeed 0.6.7's ZeRO-3 defaults (deepspeed/runtime/zero/constants.py): a module's gathered parameters stay
# when the module is used again within this many parameters' worth of modules (stage3_max_reuse_distance;
# partitioned_param_coordinator.py __params_to_release); the next module's are prefetched
# (stage3_prefetch_bucket_size 5e7, about one GPT3-XL block)
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000


def zero3_trace(cfg: GPTConfig) -> list[tuple[str, str, int]]:
    """One micro-batch's modules in the order ZeRO-3 fetches them, (module, phase, parameters): the embedding,
    the blocks and the LM head forward; the head backward; each block's recomputed forward and its backward,
    last block first (activation checkpointing); the embedding backward."""
    blocks = [f"block{i}" for i in range(cfg.layers)]
    trace = [("embedding", "forward", cfg.embedding_params)] + [(b, "forward", cfg.block_params) for b in blocks]
    trace += [("head", "forward", cfg.head_params), ("head", "backward", cfg.head_params)]
    for b in reversed(blocks):
        trace += [(b, "recompute", cfg.block_params), (b, "backward", cfg.block_params)]
    return trace + [("embedding", "backward", cfg.embedding_params)]


@functools.lru_cache(maxsize=256)
def zero3_gathers(cfg: GPTConfig, micro_batches: int, max_reuse: float = ZERO3_MAX_REUSE_DISTANCE) -> tuple[bool, ...]:
    """Whether each step of `micro_batches` repetitions of zero3_trace(cfg) gathers its module's parameters: a
    module's parameters are released after a step unless it is used again before `max_reuse` parameters' worth
    of modules have passed (DeepSpeed's reuse distance); the optimizer step ends the iteration, releasing all."""
    steps = zero3_trace(cfg) * micro_batches
    live, out = set(), []
    for s, (module, _, _) in enumerate(steps):
        out.append(module not in live)
        live.add(module)
        traversed, keep = 0, False
        for other, _, numel in steps[s + 1:]:
            if traversed >= max_reuse:
                break
            if other == module:
                keep = True
                break
            traversed += numel
        if not keep:
            live.discard(module)
    return tuple(out)


def simulate_zero3(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout,
                   micro_batch: int = 1, bytes_per_value: int = work.PAPER_BYTES,
                   max_reuse: float = ZERO3_MAX_REUSE_DISTANCE) -> SimResult:
    """Every module step of every micro-batch takes the longer of its compute and its communication (the
    gather of its parameters, unless still live, prefetched behind the previous step; its gradients'
    reduce-scatter in its backward); then every rank's optimizer step over its shard."""
    ring = layout.array()[0, :, 0][None, :]  # ZeRO-3: one stage, every device a replica, in rank order
    N = ring.shape[1]
    M = work.micro_batches(batch, micro_batch, N, "data-parallel devices")
    rate_t = min(p.flops_per_s("transformer") for p in profiles)  # synchronous collectives: slowest device paces
    rate_h = min(p.flops_per_s("lm_head") for p in profiles)
    forward = {"embedding": 0.0, "head": work.head_fwd_flop(cfg, micro_batch) / rate_h,
               "block": work.block_fwd_flop(cfg, micro_batch) / rate_t}  # the embedding is a lookup
    phase = {"forward": 1, "recompute": 1, "backward": 2}
    ring_s = {}

    def gather(params: int) -> float:  # reduce-scatter moves the same bytes as all-gather
        if params not in ring_s:
            ring_s[params] = float(collectives.ring_allgather(links, ring, params * bytes_per_value).max())
        return ring_s[params]

    trace = zero3_trace(cfg)
    seconds = compute_s = comm_s = 0.0
    for (module, ph, params), gathered in zip(trace * M, zero3_gathers(cfg, M, max_reuse)):
        c = phase[ph] * forward["block" if module.startswith("block") else module]
        comm = (gather(params) if gathered else 0.0) + (gather(params) if ph == "backward" else 0.0)
        seconds += max(c, comm)
        compute_s += c
        comm_s += comm
    opt = float(optimizer_step(cfg, profiles, layout, shards=N).max())  # every rank steps its 1/N shard
    # the overflow flag, then the gradients' norm, all-reduced over every device (stage3.py has_overflow,
    # get_grad_norm_direct)
    seconds += 2 * float(collectives.small_allreduce(links, ring).max())
    return SimResult("deepspeed", {"zero": 3, "dp": N}, seconds + opt, compute_s + opt, dp_comm_seconds=comm_s,
                     details={"micro_batches": M, "allgather_block_seconds": gather(cfg.block_params)})


def simulate_runtime_of_layout(links, profiles, cfg, batch: int, lay: Layout, mb: int,
                               bpv: int) -> tuple[float, float]:
    """The baselines' runtime the layout names: ZeRO-3 (FSDP2), Megatron-LM's model when tensor parallel
    (the torch-runtime model has none), else torch.distributed.pipelining + DDP (+ ZeRO-1)."""
    if lay.zero == 3:  # FSDP2 reshards after each use: DeepSpeed's reuse distance does not apply
        r = simulate_zero3(links, profiles, cfg, batch, lay, mb, bpv, max_reuse=0)
    elif lay.tp > 1:  # this harness's runtime: an LM head of its own, nothing tied across stages
        r = simulate_megatron(links, profiles, cfg, batch, lay, mb, bpv, tied_embedding=False)
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
