"""ZeRO-3 at paper scale: the micro-batch a run takes, from what a GPU holds under DeepSpeed 0.6.7's defaults.

The paper runs ZeRO-S3 "under the same settings" (batch 1024-4096, 64 V100s of 16 GB) and states no micro-batch;
a ZeRO-3 run holds no pipeline's micro-batches in flight, so it takes the largest micro-batch that fits (a power
of two dividing its samples per device), and every micro-batch gathers the parameters and reduce-scatters the
gradients: fewer, larger micro-batches move the model fewer times. A device holds (bytes_per_value b, P parameters
over N devices):
- its partition of the model states: P x compute.training_bytes_per_param(b) / N (as the rest of the DeepSpeed
  model: fp16 value and gradient, fp32 master and momentum);
- the gathered parameters, at most stage3_max_live_parameters (1e9) of them, or the whole model: min(1e9, P) x b;
- the gradient bucket of reduce_bucket_size (5e8) elements: 5e8 x b;
- one micro-batch's activations with checkpointing (every block's input, one block recomputed whole) and its
  logits (sequence x vocabulary), as layout/memory.py counts them.
"""
from __future__ import annotations

import numpy as np

from ...compute import block_activation_bytes, training_bytes_per_param
from ...compute.model import GPTConfig
from ...layout import Layout
from ...layout.memory import stage_bytes

MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed 0.6.7 stage3_max_live_parameters (runtime/zero/constants.py)
REDUCE_BUCKET_SIZE = 500_000_000  # reduce_bucket_size (runtime/zero/constants.py): the gradient bucket, elements


def zero3_bytes(cfg: GPTConfig, micro_batch: int, devices: int, bytes_per_value: int) -> float:
    """Bytes a device holds at its peak in ZeRO-3 over `devices` (module docstring)."""
    params = cfg.layers * cfg.block_params + cfg.embedding_params + cfg.head_params
    states = params * training_bytes_per_param(bytes_per_value) / devices
    live = min(MAX_LIVE_PARAMETERS, params) * bytes_per_value
    bucket = REDUCE_BUCKET_SIZE * bytes_per_value
    activations = (cfg.layers * block_activation_bytes(cfg, micro_batch, bytes_per_value, recompute=True)
                   + block_activation_bytes(cfg, micro_batch, bytes_per_value, recompute=False))
    logits = micro_batch * cfg.seq * cfg.vocab * bytes_per_value
    return float(states + live + bucket + activations + logits)


def zero3_micro_batch(cfg: GPTConfig, batch: int, devices: int, memory_bytes: float, bytes_per_value: int) -> int:
    """The largest power-of-two micro-batch dividing each device's samples that fits `memory_bytes`; 1 if none does
    (the run then does not fit at all: its memory note says by how much)."""
    per_device = batch // devices if batch % devices == 0 else 1
    best, m = 1, 1
    while per_device % m == 0 and m <= per_device:
        if zero3_bytes(cfg, m, devices, bytes_per_value) <= memory_bytes:
            best = m
        m *= 2
    return best


def stage_memory(layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int, bytes_per_value: int) -> np.ndarray:
    """DeepSpeed's memory of a layout: ZeRO-3's above; ZeRO-1 + pipeline as this harness's runtimes count it."""
    if layout.zero == 3:
        return np.array([zero3_bytes(cfg, micro_batch, layout.dp, bytes_per_value)])
    return stage_bytes(layout, cfg, batch, micro_batch, bytes_per_value)
