"""What a GPU of each stage holds in DT-FM's runs (DS3Lab/DT-FM, the paper's code), read from its source; the
harness's own runtimes' model (layout/memory.py) trains a language model with its head and keeps a replica's
every micro-batch, which the paper's runs do not:

- parameters (sim.stage_params: its QQP classifier, a BERT vocabulary, no LM head), in fp16 (`--fp16`): the value,
  its gradient, and with data parallelism the sharded parameter server's gradient buffer, one chunk per member of
  the flattened gradient (data_parallel/dist_dp_sharded_ps.py `_declare_grad_buffer`); the fp32 master copy and
  SGD's step live on the host (optimizer/optimizer.py Fp16Optimizer, `--use-offload` default True);
- per gradient-accumulation step, its micro-batches (sim.step_micro_batches: 64 samples a step in the paper's
  scripts), each keeping every block's input (activation checkpointing, modules/gpt_modules.py
  use_checkpoint=True) and the stage's output until the step's backward; the preallocated receive buffers for the
  gradients from the next stage (`output_micro_batches_grad`, all but the last stage);
- one block's activations while it is recomputed in the backward (one micro-batch; Korthikanti et al. 2022).
The first stage's inputs are token ids and the last stage's head keeps a pooled first token: neither is counted.
"""
from __future__ import annotations

import numpy as np

from ...compute import block_activation_bytes
from ...compute.model import GPTConfig
from ...layout import Layout
from .sim import stage_params, step_micro_batches


def stage_memory(layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int, bytes_per_value: int) -> np.ndarray:
    """Bytes a device of each stage holds at its peak (module docstring)."""
    blocks = np.asarray(layout.layers_per_stage, dtype=float)
    per_param = (3 if layout.dp > 1 else 2) * bytes_per_value  # value, gradient, the PS's gradient buffer
    _, in_flight = step_micro_batches(batch, micro_batch, layout.dp)
    held = block_activation_bytes(cfg, micro_batch, bytes_per_value, recompute=True)  # a block's input
    per_micro_batch = (blocks + 1) * held  # every block's input and the stage's output
    per_micro_batch[:-1] += held  # the gradient receive buffer
    recomputed = block_activation_bytes(cfg, micro_batch, bytes_per_value, recompute=False)
    return stage_params(cfg, list(layout.layers_per_stage)) * per_param + in_flight * per_micro_batch + recomputed
