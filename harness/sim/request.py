"""`harness sim` of the GPT as a library call: a SimRequest (what is asked, plain data) -> `simulate` -> Simulated
(every system's simulated layouts, the best of each), as `harness run` is a RunRequest -> train.experiment.execute.
The CLI parses its flags into the request, calls `simulate` and prints; a script or a notebook calls it itself:

    from harness.sim.request import SimRequest, simulate
    best = simulate(SimRequest("5", devices=8, model="tiny", layers=4, batch=8)).best()   # system -> Candidate

SimSettings is how the simulator models a setting (scheduler, placements, protocol, ...), shared by `harness sim`
and `sim report`; SimRequest is one scenario and model under them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..compute import micro_batches
from ..compute.model import GPTConfig, get_model
from ..errors import HarnessError
from ..plan import systems as registry
from ..scenario import Topology, load_scenario
from ..scheduler import DEFAULT_BUDGET, SCHEDULERS
from .sweep import PLACEMENTS, Candidate, Simulator

PS_MODES = ("grouped", "rounds")


@dataclass(frozen=True)
class SimSettings:
    """How the simulator models a setting; each field is a `harness sim` flag, and a bad value is one line naming
    it."""

    scheduler: str = "ga"  # ours' scheduler (harness/scheduler/)
    budget: int = DEFAULT_BUDGET  # its evaluations
    seed: int = 0  # its seed
    allocator: str | None = None  # ours' blocks per stage (harness/allocation/); None: even, or a plan's own
    ps_mode: str = "grouped"  # ours' sharded parameter server: one grouped all-to-all, or the cost model's rounds
    placements: tuple[str, ...] = PLACEMENTS  # the GPT baselines' placements tried
    protocol: str = "nccl"  # the communication library's handshakes
    transport: str = "scenario"  # TCP settings: the scenario's, or a preset (scenario/transport.py)
    profile: str | None = None  # a compute profile JSON (`sim calibrate`) in place of the default efficiencies
    cache_dir: str | None = None  # scheduled assignments cached there; None: not cached

    def __post_init__(self):
        from ..scenario.transport import PRESETS

        if self.scheduler not in SCHEDULERS:
            raise HarnessError(f"--scheduler: unknown scheduler {self.scheduler!r} (known: {', '.join(SCHEDULERS)})")
        bad = [p for p in self.placements if p not in PLACEMENTS]
        if bad:
            raise HarnessError(f"--placement: unknown placement {bad[0]!r} (the GPT baselines': "
                               f"{', '.join(PLACEMENTS)}; HetPipe's parameter server: --ps-placement)")
        if self.ps_mode not in PS_MODES:
            raise HarnessError(f"--ps-mode: must be one of {', '.join(PS_MODES)} (got {self.ps_mode!r})")
        if self.transport != "scenario" and self.transport not in PRESETS:
            raise HarnessError(f"--transport: must be scenario or one of {', '.join(PRESETS)} (got {self.transport!r})")

    def simulator_kwargs(self, allocator: str | None = None) -> dict:
        """The Simulator's keyword arguments; `allocator` where none is set (a plan's own)."""
        from ..compute.profiles import load_profiles
        from ..scenario.transport import PRESETS

        return {"profile_overrides": load_profiles(Path(self.profile)) if self.profile else None,
                "budget": self.budget, "schedule_seed": self.seed, "ps_mode": self.ps_mode,
                "placements": tuple(self.placements), "protocol": self.protocol,
                "allocator": self.allocator or allocator, "scheduler": self.scheduler,
                "transport": None if self.transport == "scenario" else PRESETS[self.transport],
                "cache_dir": None if self.cache_dir is None else Path(self.cache_dir)}


@dataclass(frozen=True)
class SimRequest:
    """One scenario and GPT, every system `harness sim` runs on it (or those named), under `settings`."""

    scenario: str  # a case number, a name or a path
    devices: int | None = None  # the scenario scaled down to this many
    bandwidth_scale: float = 1.0  # every link's bandwidth times this, as `harness run --bandwidth-scale`
    systems: tuple[str, ...] = ()  # () : every system simulated on the GPT
    model: str = "gpt3-xl"
    layers: int | None = None
    batch: int = 1024
    micro_batch: int = 1
    d_pp: int | None = None  # ours' pipeline depth; None: `harness run`'s rule, the degrees planner at scale
    options: dict = field(default_factory=dict)  # the systems' own options given (plan/systems.Option): name -> value
    settings: SimSettings = field(default_factory=SimSettings)

    def topology(self) -> Topology:
        return load_scenario(self.scenario, self.devices).scaled(self.bandwidth_scale)


@dataclass
class Simulated:
    """What `simulate` gives: the scenario and model simulated, the simulator (to predict the candidates again, e.g.
    under a timeline), every candidate (`best` set on each system's fastest) and the degrees planner's plan at
    scale (None where ours' depth came from --d-pp or `harness run`'s rule)."""

    topo: Topology
    cfg: GPTConfig
    systems: tuple[str, ...]
    sim: Simulator
    candidates: list[Candidate]
    planned: object = None

    def best(self) -> dict[str, Candidate]:
        return {c.system: c for c in self.candidates if c.best}


def chosen_systems(names: tuple[str, ...], cfg: GPTConfig) -> tuple[str, ...]:
    """The systems simulated on the GPT: `names`, or every one; one line for a name that is not."""
    from .. import workloads

    known = registry.names(simulated=True)
    for s in names:
        if s in registry.names(simulated=True, workload="cnn"):
            raise HarnessError(f"--system {s}: trains the CNN models ({', '.join(workloads.get('cnn').models)}), "
                               f"not {cfg.name}; give --model with one of them")
        if s not in known:
            raise HarnessError(f"--system: unknown system {s!r} (known: all, {', '.join(known)})")
    return tuple(names) or known


def check_options(options: dict, which: tuple[str, ...], model: str, one: str | None = None) -> None:
    """Every option given is taken by a system simulated (`one`: the system named, whose own the message lists)."""
    if one is not None:
        registry.get(one).resolve_options(options)
    for name in options:
        owner, owners = registry.options()[name]
        if not set(owners) & set(which):
            raise HarnessError(f"{owner.flag}: an option of {', '.join(owners)}, not of the systems `harness sim` runs "
                               f"on --model {model} here ({', '.join(which)})")


def ours_depth(req: SimRequest, topo: Topology, cfg: GPTConfig, on_plan: Callable | None = None):
    """(D_PP of ours, the planner's DegreesPlan or None): --d-pp when given; at the paper's sizes the rule `harness
    run` uses (8 x 8 for 64 devices); at scale the planner's degrees within memory (harness/scheduler/degrees.py),
    `on_plan` its progress (harness schedule's option bars)."""
    from ..compute import PAPER_DTYPE
    from ..layout import default_pipeline_degrees
    from ..scheduler.degrees import plan
    from ..scheduler.lumped import LUMPED_FROM
    from .sweep import PAPER_RUNTIME

    if req.d_pp:
        return req.d_pp, None
    if topo.n < LUMPED_FROM:
        return default_pipeline_degrees(topo.n, cfg.layers)[0], None
    s = req.settings
    planned = plan(topo, cfg, req.batch, req.micro_batch, PAPER_DTYPE, s.scheduler, s.seed, s.budget,
                   PAPER_RUNTIME["recompute"], s.allocator, on_plan)
    return planned.chosen.d_pp, planned


def simulate(req: SimRequest, topo: Topology | None = None, *, on_plan: Callable | None = None,
             on_search: Callable | None = None) -> Simulated:
    """Every system's layouts of `req` simulated (one iteration each, on fixed links). `topo`: the request's
    scenario as loaded by the caller (e.g. with a timeline in place); `on_plan`: the degrees planner's progress at
    scale; `on_search(sim, cfg)`: runs ours' schedule search itself (a progress bar), else it runs when needed."""
    from ..scheduler.degrees import MEMORY_AWARE_ALLOCATOR

    topo = topo or req.topology()
    cfg = get_model(req.model, req.layers)
    which = chosen_systems(req.systems, cfg)
    check_options(req.options, which, cfg.name, req.systems[0] if len(req.systems) == 1 else None)
    d_pp, planned = ours_depth(req, topo, cfg, on_plan)
    sim = Simulator(topo, d_pp=d_pp, micro_batch=req.micro_batch, options=req.options,  # a plan's blocks: by
                    **req.settings.simulator_kwargs(None if planned is None else MEMORY_AWARE_ALLOCATOR))  # its allocator
    if planned is not None:
        sim.prime(cfg, req.batch, planned.assignment.to_json())
    if any(registry.get(s).scheduled for s in which):  # ours' batch must split before its schedule is searched
        micro_batches(req.batch, req.micro_batch, topo.n // d_pp, "replicas of ours")
        if on_search is not None and sim.missing(cfg, req.batch) is not None:
            on_search(sim, cfg)
    return Simulated(topo, cfg, which, sim, sim.sweep(cfg, req.batch, which), planned)
