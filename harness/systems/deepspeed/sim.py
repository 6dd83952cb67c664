"""DeepSpeed in `harness sim`: ZeRO-3 over all devices and ZeRO-1 + P of layout.deepspeed_degrees."""
from __future__ import annotations

from ... import layout as layouts
from ...compute.model import GPTConfig
from ...sim.sweep import Candidate, Simulator, grid_candidates
from ...compute import PAPER_BYTES
from ..baselines.sim import simulate_zero1_pp, simulate_zero3
from .partition import pipe_stages
from .zero3 import zero3_micro_batch


def candidates_deepspeed(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """ZeRO-3 over all devices, at the largest micro-batch that fits its devices (zero3.py), and ZeRO-1 + P of
    layout.deepspeed_degrees at the simulator's, its blocks split by parameters (partition.py), in each placement
    asked for."""
    grid = []
    memory = min(p.memory_gb for p in sim.topo.profiles) * 1e9
    for zero, p, d in layouts.deepspeed_degrees(sim.topo.n):
        if zero == 3:
            m = max(sim.micro_batch, zero3_micro_batch(cfg, batch, d, memory, PAPER_BYTES))
            grid.append(({"zero": 3, "dp": d, "micro_batch": m}, zero, 1, p, d, _zero3_at(m)))
        else:
            grid.append(({"zero": 1, "pp": p, "dp": d}, zero, 1, p, d, simulate_zero1_pp))
    # the pipeline engine splits its layers by parameters (partition.py)
    return grid_candidates(sim, "deepspeed", grid, cfg, batch, stages_of=lambda p: pipe_stages(cfg, p))


def _zero3_at(micro_batch: int):
    """simulate_zero3 at its own micro-batch, whatever the simulator's."""
    def simulate(links, profiles, cfg, batch, layout, _micro_batch=1, bytes_per_value=PAPER_BYTES):
        return simulate_zero3(links, profiles, cfg, batch, layout, micro_batch, bytes_per_value)
    return simulate
