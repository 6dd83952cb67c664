"""What one micro-batch costs a stage: FLOP per task and bytes per message, from the model config.

Consistent with harness.model.FLOP_FORMULA, whose 96 = 4 x 24: a block's forward is
24*b*s*h^2*(1+s/(6h)) FLOP, its backward twice that, and activation recomputation
one more forward. The LM head (2*b*s*h*V forward, twice that backward, not
recomputed) is real work on the last stage even though the formula leaves it out,
so it is simulated but not counted in PFLOPS (as the paper counts).
"""
from __future__ import annotations

import numpy as np

from ..model import GPTConfig, stage_params
from ..profiles import ComputeProfile

BYTES_PER_VALUE = 2  # fp16 activations, gradients and parameters on the wire


def block_fwd_flop(cfg: GPTConfig, samples: int) -> float:
    s, h = cfg.seq, cfg.hidden
    return 24.0 * samples * s * h * h * (1 + s / (6 * h))


def head_fwd_flop(cfg: GPTConfig, samples: int) -> float:
    return 2.0 * samples * cfg.seq * cfg.hidden * cfg.vocab


def activation_bytes(cfg: GPTConfig, samples: int, bytes_per_value: int = BYTES_PER_VALUE) -> float:
    """One micro-batch's activation (or its gradient) between two stages."""
    return float(samples * cfg.seq * cfg.hidden * bytes_per_value)


def stage_param_bytes(cfg: GPTConfig, split: list[int], bytes_per_value: int = BYTES_PER_VALUE) -> np.ndarray:
    """split: blocks of every stage (Layout.layers_per_stage)."""
    return np.asarray(stage_params(cfg, list(split)), dtype=float) * bytes_per_value


def stage_compute(cfg: GPTConfig, split: list[int], micro_batch: int, profiles: list[ComputeProfile],
                  devices: np.ndarray, tp: int = 1, recompute: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward incl. recompute) seconds per micro-batch of the stage each device runs.

    split: blocks of every stage (Layout.layers_per_stage, possibly uneven);
    devices: int array (..., d_pp) of device ids in stage order (the last axis is the stage);
    with tensor parallelism every device does 1/tp of its stage's work. recompute=False: the
    blocks' backward is 2 forwards (the harness's CPU runs and its baselines keep activations).
    """
    layers = np.asarray(split, dtype=float)
    d_pp = len(split)
    devices = np.asarray(devices)
    rate_t = np.array([p.flops_per_s("transformer") for p in profiles])[devices]
    rate_h = np.array([p.flops_per_s("lm_head") for p in profiles])[devices]
    f_block = layers * block_fwd_flop(cfg, micro_batch) / tp
    head = np.zeros(d_pp)
    head[-1] = head_fwd_flop(cfg, micro_batch) / tp
    fwd = f_block / rate_t + head / rate_h
    bwd = (3 if recompute else 2) * f_block / rate_t + 2 * head / rate_h  # backward (2x) + recomputed forward (1x); head: 2x
    return fwd, bwd
