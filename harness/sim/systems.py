"""What the simulator's system models share: their result and error types, the layer check and every
device's optimizer step. The models themselves live with their systems (harness/systems/<name>/sim.py,
the baselines' in harness/systems/baselines/sim.py): one simulated iteration per system, from links,
device profiles, a model config and a Layout. Every device runs its optimizer step over the parameters
it updates (compute.optimizer_seconds: its 1/T share, and 1/D of that under ZeRO); all collectives are
rings in rank order (harness/netmodel/links.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import HarnessError
from ..layout import Layout
from ..compute.model import GPTConfig, stage_params
from .. import compute as work


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


def check_layers(cfg: GPTConfig, pp: int):
    if pp > cfg.layers:
        raise SimError(f"--layers: {cfg.layers} layers cannot fill {pp} pipeline stages")


def optimizer_step(cfg: GPTConfig, profiles, layout: Layout, shards: int = 1) -> np.ndarray:
    """(pp, dp, tp) seconds of every device's optimizer step: its 1/tp share of its stage's
    parameters (vocabulary-parallel ends, as Megatron-LM), and 1/shards of that (ZeRO)."""
    dev = layout.array()
    params = np.asarray(stage_params(cfg, list(layout.layers_per_stage)), dtype=float) / (layout.tp * shards)
    return np.vectorize(lambda j, d: work.optimizer_seconds(params[j], profiles[d]))(
        np.arange(dev.shape[0])[:, None, None], dev)
