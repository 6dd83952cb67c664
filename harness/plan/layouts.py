"""Planning a run: the scenario scaled once, the layout decided, the spec every rank receives.

`plan_run` is where user errors surface, before any rank starts. The topology is scaled
here (`Topology.scaled`) and travels as one value to the scheduler, the bounds, the
records and the shaping plan. The layout comes from the system's layout rule (its entry
in harness/plan/systems.py), which reads the one placement module (harness/layout/): the
scheduler's assignment for `ours`, the seeded placement rule for `ours-random` and for
baselines given `--rank-order SEED`, rank order otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from .. import layout as layouts
from . import systems as registry
from ..scheduler.cost import CostModel
from ..layout import Layout, LayoutError
from ..compute.model import GPTConfig
from ..compute import c_dp_bytes, c_pp_bytes
from ..errors import HarnessError
from ..compute.profiles import device_profiles
from ..results import new_run_id
from ..scenario import Topology, load_scenario, reload_name
from .bounds import comm_lower_bound
from .request import LayoutRequest, Resolved, RunRequest, RunSpec

RANDOM_ASSIGNMENT = "random-assignment"


@dataclass(frozen=True)
class Placement:
    """How ours' assignment was found and what the models say of it."""

    scheduler: str
    cost: dict  # cost model figures of this exact assignment: dp, pp, total (seconds)
    c_pp_bytes: float
    c_dp_bytes: float
    comm_bound: dict  # bounds.comm_lower_bound of this assignment (seconds)

    def to_json(self, layout: Layout) -> dict:
        return {"scheduler": self.scheduler, "pipelines": [list(p) for p in layout.pipelines],
                "cost_model_s": self.cost, "comm_lower_bound_s": self.comm_bound,
                "c_pp_bytes": self.c_pp_bytes, "c_dp_bytes": self.c_dp_bytes}


@dataclass(frozen=True)
class Plan:
    spec: RunSpec
    topo: Topology  # scaled by the run's bandwidth_scale
    placement: Placement | None  # ours only


def plan_run(req: RunRequest) -> Plan:
    """Validate the request and build the spec every rank receives."""
    entry = registry.get(req.run.system)  # unknown system: one line, now
    if entry.train is None:
        raise HarnessError(f"--system: {entry.name} runs only in the simulator so far (harness sim --system {entry.name})")
    topo = load_scenario(req.network.scenario, devices=req.network.devices).scaled(req.network.bandwidth_scale)
    layout, placement = resolve_layout(req, topo)
    resolved = Resolved(run_id=req.run.run_id or new_run_id(req.run.system),
                        backend="emu" if req.network.mode == "emulated" else "local",
                        scenario=topo.name, scenario_source=reload_name(topo))  # records name it as its file does
    compute = req.compute
    if compute.model:  # every device's profile at the run's precision travels to the ranks
        compute = replace(compute, devices=tuple(device_profiles(topo, dtype=req.model.dtype)))
    spec = RunSpec(network=req.network, model=req.model, layout=layout, run=req.run, resolved=resolved,
                   compute=compute, debug=req.debug)
    return Plan(spec, topo, placement)


def resolve_layout(req: RunRequest, topo: Topology) -> tuple[Layout, Placement | None]:
    """The Layout of this run (checked against devices, model and batch) and, for ours, its placement figures:
    an explicit layout as given, else the system's layout rule on the request with the entry's defaults."""
    cfg, mb, batch = req.model.cfg, req.model.micro_batch, req.model.batch
    if req.layout.explicit is not None:
        return req.layout.explicit.check(cfg, batch, mb, topo.n), None
    system = registry.get(req.run.system)
    rule = system.layout_rule_fn()
    if rule is None:
        raise LayoutError(f"--system: {system.name} has no layout rule; give it an explicit layout")
    want = _with_defaults(req.layout, system)
    lay, placement = rule(replace(req, layout=want), topo)
    return lay.check(cfg, batch, mb, topo.n), placement


def _with_defaults(want: LayoutRequest, system: registry.System) -> LayoutRequest:
    """`want` with the fields the system does not take rejected (one line naming the flag) and its
    registry defaults filled in where unset."""
    taken = {registry.LAYOUT_FLAGS[f] for f in system.flags}
    for f in fields(LayoutRequest):
        if f.name in ("explicit",) or f.name in taken:
            continue
        if getattr(want, f.name) != f.default:
            flag = system.flag_of(f.name)
            takes = ", ".join(system.flags) or "no layout flags"
            raise LayoutError(f"{flag}: not an option of --system {system.name} (it takes {takes})")
    return replace(want, **{k: v for k, v in system.defaults.items() if getattr(want, k) is None})


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
    c_pp, c_dp = c_pp_bytes(cfg, req.model.batch, d_dp, bpv), c_dp_bytes(cfg, d_pp, bpv)
    opts = dict(schedule=want.schedule or "gpipe", dp_sync=want.dp_sync,
                recompute=want.recompute if want.recompute is not None else req.run.device_type == "cuda")
    # with the compute model, the devices compute at their profiles times the run's time scale
    profiles = ([replace(p, slowdown=p.slowdown * req.compute.time_scale)
                 for p in device_profiles(topo, dtype=req.model.dtype)] if req.compute.model else None)
    allocator, chosen = want.allocator or "even", None  # chosen: blocks a compute-aware scheduler chose
    if scheduler == RANDOM_ASSIGNMENT:  # the paper's ablation ("ours without scheduler")
        lay = layouts.seeded(1, d_pp, d_dp, cfg.layers, req.model.seed, **opts)
    elif scheduler == "identity":
        lay = layouts.from_pipelines(np.arange(topo.n).reshape(d_dp, d_pp), cfg.layers, "identity", **opts)
    else:
        from ..scheduler.iteration_cost import ComputeSetting
        from ..scheduler import COMPUTE_AWARE, default_allocator, schedule

        allocator = default_allocator(scheduler, want.allocator)
        setting = (ComputeSetting(cfg, req.model.batch, req.model.micro_batch, req.model.dtype, opts["recompute"],
                                  None if profiles is None else tuple(profiles))
                   if scheduler in COMPUTE_AWARE else None)
        a = schedule(topo, d_pp, d_dp, c_pp, c_dp, scheduler=scheduler, seed=req.model.seed, budget=want.budget,
                     setting=setting)
        lay, chosen = layouts.from_pipelines(a.pipelines, cfg.layers, scheduler, **opts), a.stages
    if chosen is not None:
        lay = replace(lay, stages=chosen)
    elif allocator != "even":  # the placed pipelines' stages, by the allocator
        from ..allocation import allocate_stages

        lay = replace(lay, stages=allocate_stages(allocator, cfg, topo, lay.pipelines, req.model.micro_batch,
                                                  req.model.batch // d_dp // req.model.micro_batch,
                                                  req.model.dtype, lay.recompute, profiles))
    c_dp = c_dp_bytes(cfg, lay.layers_per_stage, bpv)  # the largest stage's gradients, as allocated
    model = CostModel(topo, d_pp, d_dp, c_pp, c_dp)
    pipes = np.asarray(lay.pipelines)
    total, dp = model.pipeline_cost(pipes), model.datap_cost(pipes.T)
    bound = comm_lower_bound(topo, lay, cfg, req.model.batch, req.model.micro_batch, bpv)
    return lay, Placement(scheduler, {"dp": dp, "pp": total - dp, "total": total}, c_pp, c_dp,
                          {"pipeline": bound.pipeline_s, "dp": bound.dp_s, "total": bound.total_s})


def megatron_layout(req: RunRequest, topo: Topology) -> tuple[Layout, None]:
    """Megatron's layout rule: tp x pp x dp, missing degrees filled (dp, then pp)."""
    want, n = req.layout, topo.n
    _check_product(want, n)
    tp = want.tp or 1
    pp = want.pp or (n // (tp * want.dp) if want.dp else 1)
    dp = want.dp or n // (tp * pp)
    return _baseline_mesh(want, req.model.cfg, tp, pp, dp, 0, n), None


def deepspeed_layout(req: RunRequest, topo: Topology) -> tuple[Layout, None]:
    """DeepSpeed's layout rule: ZeRO-3 over all devices, or ZeRO-1 + pipeline (missing degree filled)."""
    want, n = req.layout, topo.n
    _check_product(want, n)
    if want.zero not in (1, 3):
        raise LayoutError(f"--zero: must be 1 or 3 for --system deepspeed (got {want.zero!r})")
    if want.zero == 3:
        if want.pp not in (None, 1):
            raise LayoutError(f"--pp: ZeRO-3 runs without pipeline (got {want.pp})")
        pp, dp = 1, n
    else:
        pp = want.pp or (n // want.dp if want.dp else n)
        dp = want.dp or n // pp
    return _baseline_mesh(want, req.model.cfg, 1, pp, dp, want.zero, n), None


def _check_product(want: LayoutRequest, n: int) -> None:
    if want.pp and want.dp and want.tp and want.tp * want.pp * want.dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {want.tp}*{want.pp}*{want.dp} = {want.tp * want.pp * want.dp} "
                          f"!= {n} devices")


def _baseline_mesh(want: LayoutRequest, cfg: GPTConfig, tp: int, pp: int, dp: int, zero: int, n: int) -> Layout:
    """Rank order by default; `want.seed` gives the seeded placement."""
    if tp * pp * dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} != {n} devices")
    opts = dict(zero=zero, schedule=want.schedule or "1f1b")
    if want.seed is None:
        return layouts.in_rank_order(tp, pp, dp, cfg.layers, **opts)
    return layouts.seeded(tp, pp, dp, cfg.layers, want.seed, **opts)
