"""Ours' layout rules (Yuan et al. 2022): D_PP x D_DP, placed by the scheduler or by a fixed placement, the
stages' blocks by the allocator, and the cost model's figures of the placement."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import allocation as allocators
from ... import layout as layouts
from ...compute import c_dp_bytes, c_pp_bytes, micro_batches
from ...compute.compression import Compression
from ...compute.model import GPTConfig
from ...compute.profiles import device_profiles
from ...layout import Layout, LayoutError
from ...plan.bounds import comm_lower_bound
from ...plan.layouts import Placement
from ...plan.request import LayoutRequest, RunRequest
from ...scenario import Topology
from ...scheduler.cost import CostModel

RANDOM_ASSIGNMENT = "random-assignment"


def _ours_degrees(want: LayoutRequest, n: int, cfg: GPTConfig) -> tuple[int, int]:
    if want.pp and want.dp:
        d_pp, d_dp = want.pp, want.dp
    elif want.pp or want.dp:
        d_pp, d_dp = (want.pp, n // want.pp) if want.pp else (n // want.dp, want.dp)
    else:
        d_pp, d_dp = layouts.default_pipeline_degrees(n, cfg.layers)
    if d_pp * d_dp != n:
        raise LayoutError(f"--d-pp/--d-dp: {d_pp} x {d_dp} != {n} devices")
    if d_pp > cfg.layers:
        raise LayoutError(f"--d-pp: {d_pp} stages exceed the {cfg.layers} layers of {cfg.name}")
    return d_pp, d_dp


def _random_assignment(topo: Topology, d_pp: int, d_dp: int, cfg: GPTConfig, seed: int, opts: dict) -> Layout:
    """The paper's ablation ("ours without scheduler"): the seeded placement of the run's seed."""
    return layouts.seeded(1, d_pp, d_dp, cfg.layers, seed, **opts)


def _identity(topo: Topology, d_pp: int, d_dp: int, cfg: GPTConfig, seed: int, opts: dict) -> Layout:
    """Devices in id order: pipeline i holds devices i*D_PP ... (i+1)*D_PP - 1."""
    return layouts.from_pipelines(np.arange(topo.n).reshape(d_dp, d_pp), cfg.layers, "identity", **opts)


# --scheduler names that place without a search; every other name is a search of harness/scheduler/'s registry
FIXED_PLACEMENTS = {RANDOM_ASSIGNMENT: _random_assignment, "identity": _identity}


def place_ours(req: RunRequest, topo: Topology) -> tuple[Layout, Placement]:
    """Ours' layout rule: D_PP x D_DP (as square as possible unless given), placed by the request's scheduler."""
    return _place_ours(req, topo, req.layout.scheduler or "ga")


def place_ours_random(req: RunRequest, topo: Topology) -> tuple[Layout, Placement]:
    """ours-random's layout rule: ours' degrees on the seeded placement of the run's seed (the paper's ablation)."""
    return _place_ours(req, topo, RANDOM_ASSIGNMENT)


def _place_ours(req: RunRequest, topo: Topology, scheduler: str) -> tuple[Layout, Placement]:
    want, cfg = req.layout, req.model.cfg
    d_pp, d_dp = _ours_degrees(want, topo.n, cfg)
    bpv = req.model.bytes_per_value
    codec = Compression.parse(req.run.options.get("dp_compress") or "none")
    c_pp = c_pp_bytes(cfg, req.model.batch, d_dp, bpv)
    c_dp = codec.c_dp(c_dp_bytes(cfg, d_pp, bpv), bpv, d_dp)  # the scheduler places for what goes on the wire
    opts = dict(schedule=want.schedule or "gpipe", dp_sync=want.dp_sync, dp_compress=str(codec),
                recompute=want.recompute if want.recompute is not None else req.run.device_type == "cuda")
    # with the compute model, the devices compute at their profiles times the run's time scale
    profiles = ([replace(p, slowdown=p.slowdown * req.compute.time_scale)
                 for p in device_profiles(topo, dtype=req.model.dtype)] if req.compute.model else None)
    allocator, chosen = want.allocator or allocators.DEFAULT, None  # chosen: blocks a compute-aware scheduler chose
    if scheduler in FIXED_PLACEMENTS:
        lay = FIXED_PLACEMENTS[scheduler](topo, d_pp, d_dp, cfg, req.model.seed, opts)
    else:
        from ...scheduler.iteration_cost import ComputeSetting
        from ...scheduler import COMPUTE_AWARE, default_allocator, schedule

        allocator = default_allocator(scheduler, want.allocator)
        setting = (ComputeSetting(cfg, req.model.batch, req.model.micro_batch, req.model.dtype, opts["recompute"],
                                  None if profiles is None else tuple(profiles))
                   if scheduler in COMPUTE_AWARE else None)
        a = schedule(topo, d_pp, d_dp, c_pp, c_dp, scheduler=scheduler, seed=req.model.seed, budget=want.budget,
                     setting=setting)
        lay, chosen = layouts.from_pipelines(a.pipelines, cfg.layers, scheduler, **opts), a.stages
    if chosen is not None:
        lay = replace(lay, stages=chosen)
    elif not allocators.keeps_even_split(allocator):  # the placed pipelines' stages, by the allocator
        per_replica = micro_batches(req.model.batch, req.model.micro_batch, d_dp)
        lay = replace(lay, stages=allocators.allocate_stages(allocator, cfg, topo, lay.pipelines, req.model.micro_batch,
                                                             per_replica, req.model.dtype, lay.recompute, profiles))
    total, dp, c_pp, c_dp = placement_cost(topo, lay, cfg, req.model.batch, bpv)
    bound = comm_lower_bound(topo, lay, cfg, req.model.batch, req.model.micro_batch, bpv)
    return lay, Placement(scheduler, {"dp": dp, "pp": total - dp, "total": total}, c_pp, c_dp,
                          {"pipeline": bound.pipeline_s, "dp": bound.dp_s, "total": bound.total_s})


def placement_cost(topo: Topology, lay: Layout, cfg: GPTConfig, batch: int, bpv: int) -> tuple[float, float, float, float]:
    """The paper's cost model of a placement on `topo`'s links (what the scheduler minimises): (total
    seconds, data-parallel seconds, C_PP bytes, C_DP bytes: the largest stage's gradients, as allocated, and
    as the layout's codec sends them)."""
    c_pp = c_pp_bytes(cfg, batch, lay.dp, bpv)
    c_dp = lay.compression.c_dp(c_dp_bytes(cfg, lay.layers_per_stage, bpv), bpv, lay.dp)
    model = CostModel(topo, lay.pp, lay.dp, c_pp, c_dp)
    pipes = np.asarray(lay.pipelines)
    return float(model.pipeline_cost(pipes)), float(model.datap_cost(pipes.T)), c_pp, c_dp
