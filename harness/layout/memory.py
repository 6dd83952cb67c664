"""What a layout keeps in each device's memory, for every system alike: does a plan fit?

Per device of stage j, the counts `harness allocate` uses for ours (harness/allocation/stage_model.py),
extended to tensor parallelism, ZeRO and 1F1B:

  parameters   the stage's parameters (its blocks, the embedding on the first, the head on the last)
               over D_TP, each at compute.training_bytes_per_param: value and gradient at the training
               precision plus fp32 optimizer state; ZeRO-1 keeps the optimizer state over D_DP, ZeRO-3
               every part (plus one block's values gathered for its turn)
  activations  the micro-batches in flight, each block's (compute.block_activation_bytes: Korthikanti et
               al. 2022, only the input with recomputation) over D_TP: GPipe keeps all M of a replica,
               1F1B at most D_PP - j on stage j
  logits       on the last stage, the in-flight micro-batches' seq x vocab values over D_TP

A stage fits when that total is within the smallest memory among its devices. Activations of tensor
parallel blocks are not all sharded in Megatron (layer norms and dropout masks are, with sequence
parallelism only); dividing them all by D_TP makes this a lower bound for D_TP > 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compute import block_activation_bytes, micro_batches, training_bytes_per_param
from ..compute.model import GPTConfig, stage_params
from ..scenario import Topology
from . import Layout


@dataclass(frozen=True)
class MemoryFit:
    need_gb: tuple[float, ...]  # per stage: bytes a device of it holds (GB)
    have_gb: tuple[float, ...]  # per stage: the least memory among its devices (GB)

    @property
    def fits(self) -> bool:
        return all(n <= h for n, h in zip(self.need_gb, self.have_gb))

    @property
    def over_gb(self) -> float:
        """The most any stage needs beyond its memory (0 when it fits)."""
        return max(0.0, max(n - h for n, h in zip(self.need_gb, self.have_gb)))

    def describe(self) -> str:
        return "fits" if self.fits else f"{self.over_gb:.1f} GB over"


def stage_bytes(layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int, bytes_per_value: int) -> np.ndarray:
    """Bytes a device of each stage holds (module docstring)."""
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    per_param = float(training_bytes_per_param(bytes_per_value))
    values = 2.0 * bytes_per_value  # value and gradient
    if layout.zero == 1:
        per_param = values + (per_param - values) / dp
    elif layout.zero == 3:
        per_param = per_param / dp
    blocks = np.asarray(layout.layers_per_stage, dtype=float)
    params = np.asarray(stage_params(cfg, layout.layers_per_stage), dtype=float) / tp
    m = micro_batches(batch, micro_batch, dp)
    in_flight = np.full(pp, float(m)) if layout.schedule == "gpipe" else np.minimum(pp - np.arange(pp), m).astype(float)
    act = block_activation_bytes(cfg, micro_batch, bytes_per_value, layout.recompute) / tp
    need = params * per_param + in_flight * blocks * act
    if layout.zero == 3:
        need += cfg.block_params * bytes_per_value  # the block being computed, gathered whole
    need[-1] += in_flight[-1] * micro_batch * cfg.seq * cfg.vocab * bytes_per_value / tp
    return need


def memory_fit(layout: Layout, topo: Topology, cfg: GPTConfig, batch: int, micro_batch: int,
               bytes_per_value: int, stage_bytes_of=stage_bytes) -> MemoryFit:
    """Whether every stage of `layout` fits its devices' memory on `topo` (uniform layouts). `stage_bytes_of`: the
    system's memory model (a registry entry's stage_memory; default this harness's runtimes', above)."""
    need = stage_bytes_of(layout, cfg, batch, micro_batch, bytes_per_value)
    memory = np.array([p.memory_gb for p in topo.profiles])
    have = memory[layout.array().reshape(layout.pp, -1)].min(1)
    return MemoryFit(tuple(float(x) / 1e9 for x in need), tuple(float(x) for x in have))
