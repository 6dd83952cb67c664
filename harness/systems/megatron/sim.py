"""Megatron in `harness sim`: every T x P x D of layout.megatron_degrees, in each placement asked for."""
from __future__ import annotations

from ... import layout as layouts
from ...compute.model import GPTConfig
from ...sim.sweep import Candidate, Simulator, grid_candidates
from ..baselines.sim import simulate_megatron


def candidates_megatron(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """Every T x P x D of layout.megatron_degrees, in each placement asked for."""
    grid = [({"tp": t, "pp": p, "dp": d}, 0, t, p, d, simulate_megatron)
            for t, p, d in layouts.megatron_degrees(sim.topo.n)]
    return grid_candidates(sim, "megatron", grid, cfg, batch)
