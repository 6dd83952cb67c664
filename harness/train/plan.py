"""Planning a run: the scenario scaled once, the layout decided, the spec every rank receives.

`plan_run` is where user errors surface, before any rank starts. The topology is scaled
here (`Topology.scaled`) and travels as one value to the scheduler, the bounds, the
records and the shaping plan. The layout comes from the one placement module
(harness/layout.py): the scheduler's assignment for `ours`, the seeded placement rule
for `ours-random` and for baselines given `--rank-order SEED`, rank order otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import layout as layouts
from ..cost import CostModel
from ..errors import HarnessError
from ..layout import Layout, LayoutError
from ..model import GPTConfig, c_dp_bytes, c_pp_bytes
from ..results import new_run_id
from ..scenario import Topology, load_scenario
from .bounds import comm_lower_bound
from .config import LayoutRequest, RunRequest, RunSpec

OURS_SYSTEMS = ("ours", "ours-random")
BASELINE_SYSTEMS = ("megatron", "deepspeed")
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
    from .registry import get_system

    get_system(req.run.system)  # unknown system: one line, now
    topo = load_scenario(req.network.scenario, devices=req.network.devices).scaled(req.network.bandwidth_scale)
    layout, placement = resolve_layout(req, topo)
    backend = "emu" if req.network.mode == "emulated" else "local"
    run = replace(req.run, run_id=req.run.run_id or new_run_id(req.run.system), backend=req.run.backend or backend)
    network = replace(req.network, scenario=topo.name)  # records name the scenario as its file does
    spec = RunSpec(network=network, model=req.model, layout=layout, run=run, debug=req.debug)
    return Plan(spec, topo, placement)


def resolve_layout(req: RunRequest, topo: Topology) -> tuple[Layout, Placement | None]:
    """The Layout of this run (checked against devices, model and batch) and, for ours, its placement figures."""
    want, cfg, system = req.layout, req.model.cfg, req.run.system
    mb, batch = req.model.micro_batch, req.model.batch
    if want.explicit is not None:
        return want.explicit.check(cfg, batch, mb, topo.n), None
    if system in OURS_SYSTEMS:
        lay, placement = _place_ours(req, topo, cfg)
        return lay.check(cfg, batch, mb, topo.n), placement
    if system in BASELINE_SYSTEMS:
        return _baseline_layout(system, want, cfg, topo.n).check(cfg, batch, mb, topo.n), None
    raise HarnessError(f"--system: {system!r} has no layout rule (known: {', '.join(OURS_SYSTEMS + BASELINE_SYSTEMS)})")


def _ours_degrees(want: LayoutRequest, n: int, cfg: GPTConfig) -> tuple[int, int]:
    for flag, v in (("--tp", want.tp not in (None, 1)), ("--zero", want.zero is not None)):
        if v:
            raise LayoutError(f"{flag}: a baseline flag; ours runs pipeline x data parallel (--d-pp/--d-dp)")
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


def _place_ours(req: RunRequest, topo: Topology, cfg: GPTConfig) -> tuple[Layout, Placement]:
    """The scheduler's assignment for `ours`, the seeded placement rule for `ours-random`."""
    want, system = req.layout, req.run.system
    d_pp, d_dp = _ours_degrees(want, topo.n, cfg)
    bpv = req.model.bytes_per_value
    c_pp, c_dp = c_pp_bytes(cfg, req.model.batch, d_dp, bpv), c_dp_bytes(cfg, d_pp, bpv)
    scheduler = want.placement or (RANDOM_ASSIGNMENT if system == "ours-random" else "ga")
    if system == "ours-random" and scheduler != RANDOM_ASSIGNMENT:
        raise LayoutError(f"--scheduler: ours-random is the random assignment (got {scheduler!r}); "
                          "use --system ours --scheduler ...")
    opts = dict(schedule=want.schedule or "gpipe", dp_sync=want.dp_sync,
                recompute=want.recompute if want.recompute is not None else req.run.device_type == "cuda")
    if scheduler == RANDOM_ASSIGNMENT:  # the paper's ablation ("ours without scheduler")
        lay = layouts.seeded(1, d_pp, d_dp, cfg.layers, req.model.seed, **opts)
    elif scheduler == "identity":
        lay = layouts.from_pipelines(np.arange(topo.n).reshape(d_dp, d_pp), cfg.layers, "identity", **opts)
    else:
        from ..scheduler import schedule

        a = schedule(topo, d_pp, d_dp, c_pp, c_dp, scheduler=scheduler, seed=req.model.seed, budget=want.budget)
        lay = layouts.from_pipelines(a.pipelines, cfg.layers, scheduler, **opts)
    model = CostModel(topo, d_pp, d_dp, c_pp, c_dp)
    pipes = np.asarray(lay.pipelines)
    total, dp = model.pipeline_cost(pipes), model.datap_cost(pipes.T)
    bound = comm_lower_bound(topo, lay, cfg, req.model.batch, req.model.micro_batch, bpv)
    return lay, Placement(scheduler, {"dp": dp, "pp": total - dp, "total": total}, c_pp, c_dp,
                          {"pipeline": bound.pipeline_s, "dp": bound.dp_s, "total": bound.total_s})


def _baseline_layout(system: str, want: LayoutRequest, cfg: GPTConfig, n: int) -> Layout:
    """Megatron: tp x pp x dp (missing degrees filled: dp, then pp); DeepSpeed: ZeRO-3 over all devices,
    or ZeRO-1 + pipeline. Rank order by default; `placement` = a seed gives the seeded placement."""
    if want.pp and want.dp and want.tp and want.tp * want.pp * want.dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {want.tp}*{want.pp}*{want.dp} = {want.tp * want.pp * want.dp} "
                          f"!= {n} devices")
    if system == "megatron":
        if want.zero is not None:
            raise LayoutError("--zero: only for --system deepspeed")
        tp = want.tp or 1
        pp = want.pp or (n // (tp * want.dp) if want.dp else 1)
        dp, zero = want.dp or n // (tp * pp), 0
    else:
        if want.tp not in (None, 1):
            raise LayoutError("--tp: DeepSpeed-style runs have no tensor parallelism (use --system megatron)")
        if want.zero not in (1, 3):
            raise LayoutError(f"--zero: must be 1 or 3 for --system deepspeed (got {want.zero!r})")
        tp, zero = 1, want.zero
        if zero == 3:
            if want.pp not in (None, 1):
                raise LayoutError(f"--pp: ZeRO-3 runs without pipeline (got {want.pp})")
            pp, dp = 1, n
        else:
            pp = want.pp or (n // want.dp if want.dp else n)
            dp = want.dp or n // pp
    if tp * pp * dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} != {n} devices")
    opts = dict(zero=zero, schedule=want.schedule or "1f1b")
    order = want.placement or "default"
    if order == "default":
        return layouts.in_rank_order(tp, pp, dp, cfg.layers, **opts)
    try:
        seed = int(order)
    except ValueError:
        raise LayoutError(f"--rank-order: must be default or an integer seed (got {order!r})") from None
    return layouts.seeded(tp, pp, dp, cfg.layers, seed, **opts)
