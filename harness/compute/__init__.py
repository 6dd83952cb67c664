"""The compute module: what training a GPT costs, in FLOPs, bytes and seconds on a device.

One place for the trainer, the baselines, the cost model and the simulator:
- FLOPs per block and phase. FLOP_FORMULA's 96 = 4 x 24: a block's forward is
  24*b*s*h^2*(1+s/(6h)) FLOP, its backward twice that, and activation recomputation one
  more forward. The LM head (2*b*s*h*V forward, twice that backward, not recomputed) is
  real work on the last stage even though the formula leaves it out, so it is timed but
  not counted in PFLOPS (as the paper counts). The optimizer step (SGD with momentum)
  is a few FLOPs and 20 bytes of memory traffic per parameter: memory-bound.
- Bytes per value of every training precision, and the message sizes built on them:
  c_pp (activation bytes of a tasklet per iteration; the same amount of gradient comes
  back), c_dp (gradient bytes of the largest stage), one micro-batch's activation.
- A stage's seconds on a device profile (harness/compute/profiles.py): FLOPs / achieved FLOP/s.
"""
from __future__ import annotations

import numpy as np

from ..errors import HarnessError
from .model import GPTConfig, stage_params
from .profiles import ComputeProfile

# The formula of the paper's tables (Narayanan et al. 2021 without the vocabulary term).
FLOP_FORMULA = "96*B*s*l*h^2*(1+s/(6h))"
# Bytes of one activation, gradient or parameter value per training precision.
BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2}
PAPER_DTYPE = "fp16"  # the paper trains in fp16: the simulator's and the cost model's default
PAPER_BYTES = BYTES_PER_VALUE[PAPER_DTYPE]
# SGD with momentum (harness/train/reference.make_optimizer): buf = m*buf + g, p -= lr*buf: 4 FLOP, and
# 5 fp32 values moved (read p, g, buf; write p, buf) per parameter; the step is memory-bound on a GPU.
OPTIMIZER_FLOP_PER_PARAM = 4
OPTIMIZER_BYTES_PER_PARAM = 5 * 4


# FLOPs of each phase in forwards of the same work: a backward is two (gradients of inputs and of weights),
# and recomputing the activations in the backward is one more (blocks only; the head keeps its activations)
FORWARD, BACKWARD, RECOMPUTE = 1, 2, 1


def block_phases(recompute: bool) -> tuple[int, int]:
    """(forward, backward incl. the recomputed forward) of a transformer block, in forwards."""
    return FORWARD, BACKWARD + (RECOMPUTE if recompute else 0)


HEAD_PHASES = (FORWARD, BACKWARD)  # the LM head: forward, backward


class BatchError(HarnessError, ValueError):
    """A batch that does not split into whole micro-batches; str() is one line."""


def micro_batches(batch: int, micro_batch: int, replicas: int = 1, what: str = "replicas") -> int:
    """Micro-batches per replica when `batch` samples split over `replicas` data-parallel `what` in
    micro-batches of `micro_batch` samples; the one check of it (BatchError)."""
    if micro_batch < 1 or replicas < 1 or batch % (replicas * micro_batch):
        raise BatchError(f"--batch {batch}: does not split into {replicas} {what} x whole micro-batches of "
                         f"{micro_batch} (--micro-batch)")
    return batch // (replicas * micro_batch)


def conv_flop(cin: int, cout: int, kh: int, kw: int, h_out: int, w_out: int) -> float:
    """Forward FLOPs per sample of a kh x kw convolution with an h_out x w_out output (2 per multiply-add)."""
    return 2.0 * kh * kw * cin * cout * h_out * w_out


def pflop_per_iteration(cfg: GPTConfig, batch: int) -> float:
    """PFLOP of one training iteration (forward + backward, with recompute), per FLOP_FORMULA."""
    return 4 * cfg.layers * block_fwd_flop(cfg, batch) / 1e15


def block_fwd_flop(cfg: GPTConfig, samples: int) -> float:
    s, h = cfg.seq, cfg.hidden
    return 24.0 * samples * s * h * h * (1 + s / (6 * h))


def head_fwd_flop(cfg: GPTConfig, samples: int) -> float:
    return 2.0 * samples * cfg.seq * cfg.hidden * cfg.vocab


def activation_bytes(cfg: GPTConfig, samples: int, bytes_per_value: int = PAPER_BYTES) -> float:
    """One micro-batch's activation (or its gradient) between two stages."""
    return float(samples * cfg.seq * cfg.hidden * bytes_per_value)


def training_bytes_per_param(bytes_per_value: int) -> int:
    """Device memory a parameter holds in training: value and gradient at the training precision,
    SGD's momentum in fp32 and, in 16-bit training, an fp32 master copy (mixed precision)."""
    return 2 * bytes_per_value + 4 + (4 if bytes_per_value < 4 else 0)


def block_activation_bytes(cfg: GPTConfig, samples: int, bytes_per_value: int = PAPER_BYTES,
                           recompute: bool = True) -> float:
    """Activation memory one block keeps for its backward, per micro-batch of `samples`: Korthikanti
    et al. 2022 (Eq. 2, no tensor or sequence parallelism), s*b*h*(34 + 5*a*s/h) bytes in 16-bit
    training; with recomputation only the block's input, 2*s*b*h. Scaled by bytes_per_value / 2 (the
    formula's 16-bit values; its 1-byte dropout masks are scaled too, a slight overestimate in fp32)."""
    s, h, a = cfg.seq, cfg.hidden, cfg.heads
    per_16bit = 2 * s * samples * h if recompute else s * samples * h * (34 + 5 * a * s / h)
    return per_16bit * bytes_per_value / 2


def stage_param_bytes(cfg: GPTConfig, split: list[int], bytes_per_value: int = PAPER_BYTES) -> np.ndarray:
    """split: blocks of every stage (Layout.layers_per_stage)."""
    return np.asarray(stage_params(cfg, list(split)), dtype=float) * bytes_per_value


def c_pp_bytes(cfg: GPTConfig, batch: int, d_dp: int, bytes_per_value: int = PAPER_BYTES) -> float:
    """Activation bytes a tasklet sends to the next stage per iteration: (B/D_DP) x s x h values."""
    return batch / d_dp * cfg.seq * cfg.hidden * bytes_per_value


def c_dp_bytes(cfg: GPTConfig, split: int | list[int], bytes_per_value: int = PAPER_BYTES) -> float:
    """Gradient bytes of one stage (the largest: the data-parallel cost is a max over groups).
    split: the number of stages (even split) or the blocks of every stage (Layout.layers_per_stage)."""
    return max(stage_params(cfg, split)) * bytes_per_value


def stage_compute(cfg: GPTConfig, split: list[int], micro_batch: int, profiles: list[ComputeProfile],
                  devices: np.ndarray, tp: int = 1, recompute: bool = True,
                  vocab_parallel: bool = True, lm_head: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward incl. recompute) seconds per micro-batch of the stage each device runs.

    split: blocks of every stage (Layout.layers_per_stage, possibly uneven);
    devices: int array (..., d_pp) of device ids in stage order (the last axis is the stage);
    with tensor parallelism every device does 1/tp of its stage's blocks, and of the LM head
    when it is vocab-parallel (Megatron-LM; the harness's baselines replicate it: False).
    recompute=False: the blocks' backward is 2 forwards (the harness's CPU runs and its
    baselines keep activations). lm_head=False: the last stage ends in a head too small to time (a
    sequence classifier's, as the paper's own runs trained: dtfm).
    """
    layers = np.asarray(split, dtype=float)
    d_pp = len(split)
    devices = np.asarray(devices)
    rate_t = np.array([p.flops_per_s("transformer") for p in profiles])[devices]
    rate_h = np.array([p.flops_per_s("lm_head") for p in profiles])[devices]
    f_block = layers * block_fwd_flop(cfg, micro_batch) / tp
    head = np.zeros(d_pp)
    head[-1] = head_fwd_flop(cfg, micro_batch) / (tp if vocab_parallel else 1) if lm_head else 0.0
    block_f, block_b = block_phases(recompute)
    head_f, head_b = HEAD_PHASES
    fwd = block_f * f_block / rate_t + head_f * head / rate_h
    bwd = block_b * f_block / rate_t + head_b * head / rate_h
    return fwd, bwd


def backward_shares(cfg: GPTConfig, split: list[int], stage: int, micro_batch: int, profile: ComputeProfile,
                    recompute: bool, tp: int = 1, vocab_parallel: bool = True) -> list[float]:
    """Where a stage's backward stands as its gradient leaves each piece, in backward order: the LM head (last
    stage), then its blocks from the last to the first, each a share of the stage's backward seconds,
    cumulative (the last is 1). A runtime that reduces gradients as they are produced (DDP's buckets) sees
    them ready at these points of the phase, as on the device."""
    zeros = np.zeros(len(split), dtype=int)
    whole = float(stage_compute(cfg, split, micro_batch, [profile], zeros, tp, recompute, vocab_parallel)[1][stage])
    blocks = float(stage_compute(cfg, split, micro_batch, [profile], zeros, tp, recompute, vocab_parallel,
                                 lm_head=False)[1][stage])
    n = split[stage]
    pieces = ([whole - blocks] if stage == len(split) - 1 else []) + [blocks / n] * n
    return [float(x) for x in np.cumsum(pieces) / whole] if whole > 0 else [1.0] * len(pieces)


def optimizer_seconds(params: int, profile: ComputeProfile) -> float:
    """The optimizer step over `params` parameters on the device: the longer of its FLOPs at the
    device's rate and its memory traffic at the device's peak memory bandwidth (a roofline; both
    slowed by the device's slowdown)."""
    flop_s = OPTIMIZER_FLOP_PER_PARAM * params / profile.flops_per_s("transformer")
    if not profile.memory_bandwidth_gbs:
        return flop_s
    return max(flop_s, OPTIMIZER_BYTES_PER_PARAM * params / (profile.memory_bandwidth_gbs * 1e9) * profile.slowdown)


def layer_phase_seconds(fwd_flop: float, params: int, micro_batch: int, profile: ComputeProfile) -> dict[str, float]:
    """What one rank's phases take on its device for a stage of a layer-profile model (a CNN: its layers'
    forward FLOPs and parameters per sample): the forward at the device's rate, the backward twice it
    (the gradients of inputs and of weights), the optimizer step over the stage's parameters. The
    dense-GEMM efficiency stands for cuDNN's convolutions, as the HetPipe simulator takes it."""
    fwd = fwd_flop * micro_batch / profile.flops_per_s("transformer")
    return {"forward": fwd, "backward": 2 * fwd, "optimizer": optimizer_seconds(params, profile)}


def layer_stage_phase_seconds(layers, split, stage: int, micro_batch: int, profile: ComputeProfile) -> dict[str, float]:
    """layer_phase_seconds of stage `stage` of a layer chain cut `split` (layers per stage): its layers' FLOPs
    and parameters."""
    first = sum(split[:stage])
    mine = layers[first:first + split[stage]]
    return layer_phase_seconds(sum(l.fwd_flop for l in mine), sum(l.params for l in mine), micro_batch, profile)


def rank_phase_seconds(cfg: GPTConfig, split: list[int], stage: int, micro_batch: int, profile: ComputeProfile,
                       recompute: bool, tp: int = 1, vocab_parallel: bool = True,
                       optimizer_shards: int = 1) -> dict[str, float]:
    """What one rank's phases take on its device: forward and backward of one micro-batch of
    stage `stage`, and the optimizer step over the rank's parameters: a 1/tp share of the
    stage's blocks (and of its embedding and head when vocab-parallel), then a
    1/optimizer_shards share of that (ZeRO shards the optimizer over the data-parallel group)."""
    fwd, bwd = stage_compute(cfg, split, micro_batch, [profile], np.zeros(len(split), dtype=int), tp, recompute,
                             vocab_parallel)
    blocks = split[stage] * cfg.block_params
    ends = stage_params(cfg, list(split))[stage] - blocks
    params = (blocks / tp + ends / (tp if vocab_parallel else 1)) / optimizer_shards
    return {"forward": float(fwd[stage]), "backward": float(bwd[stage]),
            "optimizer": optimizer_seconds(params, profile)}
