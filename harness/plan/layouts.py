"""Planning a run: the scenario scaled once, the layout decided, the spec every rank receives.

`plan_run` is where user errors surface, before any rank starts. The topology is scaled
here (`Topology.scaled`) and travels as one value to the scheduler, the bounds, the
records and the shaping plan. The layout comes from the system's layout rule (its entry in
the registry, harness/plan/systems.py; the rules are in each system's package, harness/systems/),
which reads the one placement module (harness/layout/): the scheduler's assignment for `ours`, the
seeded placement rule for `ours-random` and for baselines given `--rank-order SEED` (`baseline_mesh`),
rank order otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .. import layout as layouts
from . import systems as registry
from ..layout import Layout, LayoutError
from ..errors import HarnessError
from ..compute.profiles import device_profiles
from ..results import new_run_id
from ..scenario import Topology, load_scenario, load_timeline, reload_name
from ..scenario.transport import with_preset
from .request import LayoutRequest, ModelSection, NetworkSection, ReplanSection, Resolved, RunRequest, RunSpec

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
class RunPlan:
    spec: RunSpec
    topo: Topology  # scaled by the run's bandwidth_scale
    placement: Placement | None  # ours only


def plan_run(req: RunRequest) -> RunPlan:
    """Validate the request and build the spec every rank receives."""
    entry = registry.get(req.run.system)  # unknown system: one line, now
    if entry.train is None:
        raise HarnessError(f"--system: {entry.name} runs only in the simulator so far (harness sim --system {entry.name})")
    check_cnn(req, entry)
    topo = run_topology(req.network)
    if topo.timeline is not None and (topo.timeline.devices or topo.timeline.spot):
        where = topo.timeline.devices[0].where if topo.timeline.devices else topo.timeline.spot.where
        if req.network.mode != "emulated":
            raise HarnessError(f"{where}: devices that leave and come back need the emulated cluster (--network "
                               f"emulated: their links are cut), not --network {req.network.mode}")
        if req.layout.replan:
            raise HarnessError(f"{where}: --replan follows link changes; with devices that leave, the elastic agent "
                               "restarts the run from its checkpoint (ours' recovery in the run: not yet)")
    layout, placement = resolve_layout(req, topo)
    check_fault(req, layout, entry)
    replan = replan_section(req, topo, layout, entry)
    resolved = Resolved(run_id=req.run.run_id or new_run_id(req.run.system),
                        backend="emu" if req.network.mode == "emulated" else "local",
                        scenario=topo.name, scenario_source=reload_name(topo))  # records name it as its file does
    compute = req.compute
    if compute.model:  # every device's profile at the run's precision travels to the ranks
        compute = replace(compute, devices=tuple(device_profiles(topo, dtype=req.model.dtype)))
    spec = RunSpec(network=req.network, model=req.model, layout=layout, run=req.run, resolved=resolved,
                   compute=compute, debug=req.debug, replan=replan)
    return RunPlan(spec, topo, placement)


def check_cnn(req: RunRequest, entry: registry.System) -> None:
    """A CNN trains under the systems whose runtime has it, without checkpoints: one line otherwise."""
    if not req.model.is_cnn:
        return
    if not entry.trains_cnn:
        able = [s.name for s in registry.registered().values() if s.trains_cnn]
        raise HarnessError(f"--model {req.model.name}: {entry.name} trains GPTs only (a CNN: {', '.join(able)})")
    if req.run.checkpoint_every is not None or req.run.resume is not None:
        raise HarnessError(f"--model {req.model.name}: a CNN's run writes no checkpoints (--checkpoint-every, "
                           "--resume: GPTs only)")


def check_fault(req: RunRequest, layout: Layout, entry: registry.System) -> None:
    """The debug section's fault must hit something in this run: one line where it cannot."""
    d, run = req.debug, req.run
    if d.fault_rank is None:
        if d.fault_iteration is not None:
            raise HarnessError("--debug fault_iteration: needs fault_rank (whose rank, or device, it hits)")
        return
    if d.fault_rank >= layout.devices:
        raise HarnessError(f"--debug fault_rank: {d.fault_rank} is not one of the run's {layout.devices} "
                           f"{'devices' if d.fault_mode == 'preempt' else 'ranks'}")
    if d.fault_iteration is None:
        return
    steps = run.warmup + run.iters
    if d.fault_iteration >= steps:
        raise HarnessError(f"--debug fault_iteration: the run's iterations are 0..{steps - 1} (warm-up included); "
                           f"got {d.fault_iteration}")
    if d.fault_phase not in entry.fault_phases:
        marks = ", ".join(entry.fault_phases) or "none"
        raise HarnessError(f"--debug fault_phase: {entry.name} marks {marks} of its iterations (got {d.fault_phase})")
    every = run.checkpoint_every
    if d.fault_phase == "checkpoint" and not (every and (d.fault_iteration + 1) % every == 0):
        raise HarnessError(f"--debug fault_phase: no checkpoint after iteration {d.fault_iteration} "
                           f"(--checkpoint-every {every or 'is unset'})")


def run_topology(network: NetworkSection) -> Topology:
    """The run's topology: its scenario scaled to its devices and bandwidth, its TCP settings, its timeline
    (a rank that re-plans rebuilds it from its spec the same way)."""
    topo = load_scenario(network.scenario, devices=network.devices).scaled(network.bandwidth_scale)
    topo = with_preset(topo, network.transport)  # the run's TCP settings in place of the scenario's
    if network.timeline is not None:  # the run's timeline in place of the scenario's
        topo = replace(topo, timeline=load_timeline(network.timeline, topo))
    return topo


def replan_section(req: RunRequest, topo: Topology, layout: Layout, entry: registry.System) -> ReplanSection:
    """--replan: the search the run re-plans with (its scheduler, budget, allocator); one line when the run
    cannot re-plan."""
    if not req.layout.replan:
        return ReplanSection()
    if not entry.scheduled:
        raise HarnessError(f"--replan: only a scheduled system re-plans (not {entry.name})")
    if topo.timeline is None:
        raise HarnessError(f"--replan: re-plans when the links change; {topo.name} has no timeline: (give --timeline)")
    return ReplanSection(enabled=True, scheduler=layout.placement, budget=req.layout.budget,
                         allocator=req.layout.allocator)


def resolve_layout(req: RunRequest, topo: Topology) -> tuple[Layout, Placement | None]:
    """The Layout of this run (checked against devices, model and batch) and, for ours, its placement figures:
    an explicit layout as given, else the system's layout rule on the request with the entry's defaults."""
    cfg = len(req.model.profile.layers) if req.model.is_cnn else req.model.cfg  # what Layout.check takes
    mb, batch = req.model.micro_batch, req.model.batch
    if req.layout.explicit is not None:
        return _runnable(req.layout.explicit).check(cfg, batch, mb, topo.n), None
    system = registry.get(req.run.system)
    rule = system.layout_rule_fn()
    if rule is None:
        raise LayoutError(f"--system: {system.name} has no layout rule; give it an explicit layout")
    want = _with_defaults(req.layout, system)
    lay, placement = rule(replace(req, layout=want), topo)
    return lay.check(cfg, batch, mb, topo.n), placement


def _runnable(lay: Layout) -> Layout:
    """`lay` if this harness's runtimes can run it: a block on every stage (DeepSpeed's engine may leave a stage
    only the embedding or the head, systems/deepspeed/partition.py; the simulator models that, no runtime here)."""
    empty = [j for j, (a, b) in enumerate(lay.stages) if b == a]
    if empty:
        raise LayoutError(f"layout.stages[{empty[0]}]: this harness's runtimes run at least one block on every stage")
    return lay


def _with_defaults(want: LayoutRequest, system: registry.System) -> LayoutRequest:
    """`want` with the fields the system does not take rejected (one line naming the flag) and its
    registry defaults filled in where unset."""
    taken = system.layout_fields
    for f in fields(LayoutRequest):
        if f.name in ("explicit",) or f.name in taken:
            continue
        if getattr(want, f.name) != f.default:
            flag = system.flag_of(f.name)
            takes = ", ".join(system.flags) or "no layout flags"
            raise LayoutError(f"{flag}: not an option of --system {system.name} (it takes {takes})")
    return replace(want, **{k: v for k, v in system.defaults.items() if getattr(want, k) is None})


def check_product(want: LayoutRequest, n: int) -> None:
    if want.pp and want.dp and want.tp and want.tp * want.pp * want.dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {want.tp}*{want.pp}*{want.dp} = {want.tp * want.pp * want.dp} "
                          f"!= {n} devices")


def baseline_mesh(want: LayoutRequest, model: ModelSection, tp: int, pp: int, dp: int, zero: int, n: int) -> Layout:
    """Rank order by default; `want.seed` gives the seeded placement. One line for a pipeline torch's
    pipelining cannot run: fewer micro-batches per replica than stages."""
    if tp * pp * dp != n:
        raise LayoutError(f"layout: tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} != {n} devices")
    if pp > 1 and model.batch % dp == 0 and (model.batch // dp) // model.micro_batch < pp:
        raise LayoutError(f"--pp: {pp} stages need at least {pp} micro-batches per replica (torch's pipelining); "
                          f"batch {model.batch} over {dp} replicas in micro-batches of {model.micro_batch} gives "
                          f"{(model.batch // dp) // model.micro_batch}")
    opts = dict(zero=zero, schedule=want.schedule or "1f1b")
    if want.seed is None:
        return layouts.in_rank_order(tp, pp, dp, model.cfg.layers, **opts)
    return layouts.seeded(tp, pp, dp, model.cfg.layers, want.seed, **opts)
