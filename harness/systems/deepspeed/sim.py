"""DeepSpeed in `harness sim`: ZeRO-3 over all devices and ZeRO-1 + P of layout.deepspeed_degrees."""
from __future__ import annotations

from ... import layout as layouts
from ...compute.model import GPTConfig
from ...sim.sweep import Candidate, Simulator, grid_candidates
from ..baselines.sim import simulate_zero1_pp, simulate_zero3


def candidates_deepspeed(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """ZeRO-3 over all devices and ZeRO-1 + P of layout.deepspeed_degrees, in each placement asked for."""
    grid = []
    for zero, p, d in layouts.deepspeed_degrees(sim.topo.n):
        config = {"zero": 3, "dp": d} if zero == 3 else {"zero": 1, "pp": p, "dp": d}
        grid.append((config, zero, 1, p, d, simulate_zero3 if zero == 3 else simulate_zero1_pp))
    return grid_candidates(sim, "deepspeed", grid, cfg, batch)
