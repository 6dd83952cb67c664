"""The registry of training systems: one entry per system, everything the harness needs to know of it.

torchtitan's train-spec idea: a `System` bundles
- `train`: the function every rank of a real run calls, `train(ctx: RankContext, spec: RunSpec) ->
  list[IterationStats]`, with the default process group initialised (gloo on CPU, NCCL on GPU)
  (None: the system runs only in the simulator so far);
- `layout_rule`: `(RunRequest, Topology) -> (Layout, Placement | None)`, how planning turns the
  request into the run's layout (None: the request must give an explicit layout), with `flags`,
  the `harness run` layout flags the system takes, and `defaults`, the LayoutRequest fields it
  fills in when the user leaves them unset;
- `simulate`: workload -> its model in `harness sim` of that workload (harness/workloads/):
  gpt: `(Simulator, GPTConfig, batch) -> list[Candidate]`, its layouts; the candidates' `config` is
  how its simulated records describe them (default: the layout its rule picks on the scenario,
  simulated by the runtime the layout names, `sweep.candidates_of_rule`); cnn: `(Topology,
  LayerProfile, minibatch, CNNOptions) -> list[CNNCandidate]` (harness/systems/hetpipe/sim.py);
- `simulate_layout`: `(Links, profiles, cfg, batch, Layout, micro_batch, bytes_per_value) ->
  (seconds, busiest compute seconds)`, the model `sim compare` holds a measured run against;
- `cross_node_bytes`: `(region, cfg, batch, Layout, micro_batch, bytes_per_value) -> bytes` (and `options=` for a
  system with options, as simulate_layout), the payload its runtime
  sends between devices of different nodes (`region[d]`) in an iteration, as its simulate_layout models it (what
  an emulated run's count on the wire is held against);
- `run_length`: its simulate_layout also takes `iterations=(warm-up, timed)`, a measured run's length, because
  its iterations differ over a run (WSP: the first D + 1 waves pull nothing); `sim compare` passes the run's;
- `record_layout`: the layout a measured record ran on, for records older than the layout JSON;
- `stage_memory`: `(Layout, cfg, batch, micro_batch, bytes_per_value) -> bytes a device of each stage holds`, what
  `harness sim` checks a layout's memory with (default layout/memory.stage_bytes: this harness's runtimes);
- `tune_grid`: `(cfg, devices, batch, micro_batch, schedule) -> [Layout]`, the layouts `harness tune`
  runs (None: not tunable);
- `compute_observed`: its records' compute_seconds are timed inside the iteration;
- `scheduled`: its layout comes from the scheduler (the simulator shows the scheduler's progress);
- `style`: (colour, marker) of its series in every figure;
- `sweep_by_rule`: `harness sim` of the GPT simulates the layouts its rule picks (False: the runtime its
  layout names is not its model there; `sim compare` still holds its runs against `simulate_layout`);
- `report_section`: its own section of `harness sim report` (a ReportSection: its sweep, files and
  markdown), beside the paper's evaluation the roles fill;
- `gate_runs`: what it contributes to the regression gate (harness/regress/): "wire" -> its short loopback run
  whose bytes on the wire are exact figures, "measured" -> its emulated runs (noisy figures), each the run's
  sections as asked over the gate's own (plan/asked.py: {"layout": {"tp": 2}}; {}: the gate's run as it is);
- `sources`: (setting, how it is modelled, where that comes from) of its paper-scale configuration, the
  table `harness sim report` prints (a tuple, or "module:NAME" of one);
- `paper_role`: the role it fills among the harness's runnable systems: ours, ours-random (ours without
  the scheduler), megatron or deepspeed (the regression gate's ratios, emulated runs);
- `fault_phases`: the points of an iteration (plan/request.FAULT_PHASES) its runtime marks, where the
  debug section's fault may hit (`--debug fault_iteration=K fault_phase=P`);
- `report_role`: the role it fills in the paper's evaluation (`sim report`) in place of the system whose
  paper_role it is: a model of the paper's own runtime (dtfm). The report compares roles; which system
  fills a role is this registry's call;
- `options`: its own knobs (`Option`: name, type, help, default), from which `harness run` and `harness sim`
  build their flags and --help, and which reach its code as one mapping: the run request's and every rank's
  `run.options`, its layout rule's `req.run.options`, its simulate_layout's `options=`. A new system with
  new knobs is its package and its line in harness/systems/__init__.py, nothing else.

Functions may be given as "module:function" and are imported on first use, so `harness run
--system ours` never imports the baselines' torch.distributed modules and this module imports
nothing heavy. Nothing outside this module compares a system's name. The built-in entries are
registered by their packages in harness/systems/ (`registered()` imports them at the first lookup).
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable, Union

from ..errors import HarnessError

Ref = Union[Callable, str]  # a function, or "module:function" imported when first used


@dataclass(frozen=True)
class Option:
    """One knob of a system: `--<name with dashes>` on `harness run` and `harness sim`, `type` turns its text
    into the value (argparse's type: a bad one is a one-line error naming the flag), `default` when not given."""

    name: str  # a Python identifier: the key in run.options
    type: Callable[[str], object]
    help: str
    default: object = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """Its attribute on argparse's namespace: apart from every other flag's."""
        return f"option__{self.name}"

# The `harness run` flags that set LayoutRequest fields: flag -> field.
LAYOUT_FLAGS = {
    "--d-pp": "pp", "--d-dp": "dp", "--tp": "tp", "--pp": "pp", "--dp": "dp", "--zero": "zero",
    "--scheduler": "scheduler", "--rank-order": "seed", "--schedule": "schedule", "--dp-sync": "dp_sync",
    "--recompute": "recompute", "--budget": "budget", "--allocator": "allocator",
    "--replan": "replan",
}
BASELINE_FLAGS = ("--tp", "--pp", "--dp", "--rank-order", "--schedule")
PAPER_ROLES = ("ours", "ours-random", "megatron", "deepspeed")  # Yuan et al. 2022, sec. 4
LAYOUT_WORKLOAD = "gpt"  # the workload layout rules place (harness/workloads/)
RECOVERIES = ("replan", "restart", "quorum")


def _resolve(ref: Ref | None) -> Callable | None:
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


@dataclass(frozen=True)
class System:
    name: str
    summary: str  # one line for --help
    train: Ref | None = None
    layout_rule: Ref | None = None
    flags: tuple[str, ...] = ()
    defaults: dict = field(default_factory=dict)  # LayoutRequest fields filled in when unset
    simulate: dict = field(default_factory=dict)  # workload -> Ref
    simulate_layout: Ref | None = None  # None: no simulator model (`harness sim` and `sim compare` say so)
    run_length: bool = False
    cross_node_bytes: Ref | None = None  # None: no model of its traffic between nodes
    record_layout: Ref = "harness.systems.baselines.sim:legacy_mesh_layout"
    stage_memory: Ref = "harness.layout.memory:stage_bytes"
    tune_grid: Ref | None = None
    compute_observed: bool = False
    scheduled: bool = False
    paper_role: str | None = None
    report_role: str | None = None
    sources: Ref | tuple = ()
    style: tuple[str, str] | None = None
    gate_runs: dict = field(default_factory=dict)  # "wire" | "measured" -> its run's sections as asked
    report_section: Ref | None = None  # a ReportSection
    sweep_by_rule: bool = True  # `harness sim` of the GPT runs its layout rule (False: its runs are compared only)
    # when a device leaves: "replan" (the survivors re-plan and go on: ours), "quorum" (the replicas left go on and
    # one back heals from a peer, no restart: torchft's, train/quorum_agent.py) or "restart" (from the last
    # checkpoint on the devices left, as torchrun's elastic agent restarts a job: every other system)
    recovery: str = "restart"
    quorum_model: Ref | None = None  # a "quorum" system's: (cfg, options, devices) -> sim.quorum.QuorumModel
    checkpoints: bool = False  # its runtime writes checkpoints and resumes from them (--checkpoint-every, --resume)
    # the points of an iteration its runtime marks (RankContext.reached), where a debug fault_iteration may hit
    fault_phases: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()  # its own knobs (Option), the flags built from them
    trains_cnn: bool = False  # its runtime also trains a CNN of workloads/cnn.TRAINABLE_CNNS (every system: GPTs)

    def __post_init__(self):
        unknown = [f for f in self.flags if f not in LAYOUT_FLAGS]
        if unknown:
            raise HarnessError(f"system {self.name}: unknown flag {unknown[0]!r} (known: {', '.join(LAYOUT_FLAGS)})")
        for role in (self.paper_role, self.report_role):
            if role not in (None, *PAPER_ROLES):
                raise HarnessError(f"system {self.name}: paper_role and report_role must be one of "
                                   f"{', '.join(PAPER_ROLES)}")
        if self.recovery not in RECOVERIES:
            raise HarnessError(f"system {self.name}: recovery must be one of {', '.join(RECOVERIES)}")
        if (self.recovery == "quorum") != (self.quorum_model is not None):
            raise HarnessError(f"system {self.name}: a quorum_model is what recovery=\"quorum\" needs, and only it")
        fields_ = [LAYOUT_FLAGS[f] for f in self.flags]
        if len(set(fields_)) != len(fields_):
            raise HarnessError(f"system {self.name}: two of its flags set the same layout field ({self.flags})")
        for o in self.options:
            if not o.name.isidentifier() or o.flag in LAYOUT_FLAGS:
                raise HarnessError(f"system {self.name}: option {o.name!r}: must be an identifier whose flag "
                                   f"{o.flag} is not a layout flag")
        if len({o.name for o in self.options}) != len(self.options):
            raise HarnessError(f"system {self.name}: two options of one name")

    def resolve_options(self, given: dict) -> dict:
        """Its options' values: `given` (name -> value, as typed) over their defaults; an option it does not have is a
        one-line error naming the flag."""
        mine = {o.name: o for o in self.options}
        for name in given:
            if name not in mine:
                raise HarnessError(f"--{name.replace('_', '-')}: not an option of --system {self.name} (its own: "
                                   f"{', '.join(o.flag for o in self.options) or 'none'})")
        return {name: given.get(name, o.default) for name, o in mine.items()}

    def named(self, options: dict) -> str:
        """Its name with the options set away from their defaults (runs of one system told apart in reports),
        e.g. "diloco sync_every=10"."""
        defaults = self.resolve_options({})
        return " ".join([self.name, *(f"{k}={v}" for k, v in sorted(options.items())
                                      if k in defaults and defaults[k] != v)])

    def train_fn(self) -> Callable:
        return _resolve(self.train)

    def layout_rule_fn(self) -> Callable | None:
        return _resolve(self.layout_rule)

    def simulate_fn(self, workload: str = LAYOUT_WORKLOAD) -> Callable | None:
        return _resolve(self.simulate.get(workload))

    def simulates(self, workload: str) -> bool:
        """`harness sim` of `workload` can run it: a model of its own, or a layout rule (for the workload
        layouts place)."""
        return workload in self.simulate or (workload == LAYOUT_WORKLOAD and self.layout_rule is not None
                                             and self.sweep_by_rule)

    def simulate_layout_fn(self, options: dict | None = None) -> Callable:
        """Its simulate_layout, given its options (`options`: those set, over their defaults); a system without a
        model is a one-line error, not another system's model."""
        fn = _resolve(self.simulate_layout)
        if fn is None:
            raise HarnessError(f"--system {self.name}: no simulator model (its registry entry gives no "
                               "simulate_layout), so nothing predicts its runs")
        return functools.partial(fn, options=self.resolve_options(options or {})) if self.options else fn

    def cross_node_bytes_fn(self, options: dict | None = None) -> Callable:
        """Its cross_node_bytes, given its options as simulate_layout_fn gives them."""
        fn = _resolve(self.cross_node_bytes)
        if fn is None:
            raise HarnessError(f"--system {self.name}: no model of its traffic between nodes (its registry entry "
                               "gives no cross_node_bytes)")
        return functools.partial(fn, options=self.resolve_options(options or {})) if self.options else fn

    def quorum_model_of(self, cfg, options: dict | None, devices: int):
        """Its quorums' model (sim/quorum.py) for `cfg` on `devices`, given its options over their defaults."""
        return _resolve(self.quorum_model)(cfg, self.resolve_options(options or {}), devices)

    def record_layout_fn(self) -> Callable:
        return _resolve(self.record_layout)

    def stage_memory_fn(self) -> Callable:
        return _resolve(self.stage_memory)

    def sources_list(self) -> tuple:
        return _resolve(self.sources) or ()

    def report_section_obj(self) -> "ReportSection | None":
        return _resolve(self.report_section)

    def tune_grid_fn(self) -> Callable | None:
        return _resolve(self.tune_grid)

    @property
    def layout_fields(self) -> set[str]:
        """The LayoutRequest fields its `harness run` flags set."""
        return {LAYOUT_FLAGS[f] for f in self.flags}

    def flag_of(self, field_name: str) -> str:
        """The flag that sets LayoutRequest.`field_name` for this system (the generic one if it takes none)."""
        mine = [f for f in self.flags if LAYOUT_FLAGS[f] == field_name]
        return mine[0] if mine else next(f for f, v in LAYOUT_FLAGS.items() if v == field_name)


@dataclass(frozen=True)
class ReportSection:
    """A system's own section of `harness sim report`: `sweep(progress)` simulates what it shows (`steps`
    progress calls), `write(out_dir, result)` its files, `markdown(result)` its text."""

    title: str
    steps: int
    sweep: Callable
    write: Callable
    markdown: Callable


def report_sections() -> list[ReportSection]:
    """The systems' own report sections, in registration order."""
    return [s.report_section_obj() for s in registered().values() if s.report_section is not None]


SYSTEMS: dict[str, System] = {}  # read it through registered(), which first registers the built-in systems
BUILTIN = "harness.systems"  # the package whose import registers the built-in systems, one package each
_builtin_loaded = False


def registered() -> dict[str, System]:
    """Every registered system, the built-in ones first: their packages (harness/systems/) register them when
    imported, which happens here, at the first lookup, once every module is whole. The registry names
    system code by module, as entry points do: the one reference from this layer to the systems above."""
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        importlib.import_module(BUILTIN)
    return SYSTEMS


def register(system: System) -> System:
    """Add (or replace) a registry entry; returns it."""
    registered()  # the built-in systems first, whoever registers
    SYSTEMS[system.name] = system
    return system


def register_system(name: str, **entry):
    """Decorator for a system that is only a rank function (tests, experiments): it runs on an
    explicit layout unless `entry` gives a layout_rule. `@register_system("x") def train(ctx, spec)`."""

    def deco(fn: Callable) -> Callable:
        register(System(name, entry.pop("summary", fn.__doc__ or name), train=fn, **entry))
        return fn

    return deco


def get(name: str) -> System:
    """The entry of `name`; HarnessError naming --system and the known systems otherwise."""
    systems = registered()
    if name not in systems:
        raise HarnessError(f"--system: unknown system {name!r} (known: {', '.join(systems)})")
    return systems[name]


def named(system: str, options: dict) -> str:
    """`system` with the options a run set away from their defaults (System.named); the bare name for a system not
    registered here (a record of another version)."""
    return get(system).named(options) if options and system in registered() else system


def names(*, simulated: bool = False, tunable: bool = False, workload: str = LAYOUT_WORKLOAD) -> tuple[str, ...]:
    """Registered names in registration order; `simulated`: only those `harness sim` runs on a model of
    `workload` (default gpt: a simulator model or a layout rule); `tunable`: only those with a tune grid."""
    return tuple(s.name for s in registered().values()
                 if (not simulated or s.simulates(workload)) and (not tunable or s.tune_grid))


def paper_systems() -> dict[str, str]:
    """role -> system name for every role of PAPER_ROLES (the first system registered with it)."""
    out = {}
    for s in registered().values():
        if s.paper_role is not None:
            out.setdefault(s.paper_role, s.name)
    missing = [r for r in PAPER_ROLES if r not in out]
    if missing:
        raise HarnessError(f"systems: no system fills the paper's role {missing[0]!r}")
    return {r: out[r] for r in PAPER_ROLES}


def report_systems() -> dict[str, str]:
    """role -> the system `harness sim report` shows in it: the first registered with that report_role,
    else paper_systems()'s."""
    out = paper_systems()
    for s in reversed(list(registered().values())):
        if s.report_role is not None:
            out[s.report_role] = s.name
    return out


def gate_runs(kind: str) -> dict[str, dict]:
    """system -> its `kind` run in the regression gate ("wire" or "measured"), as asked (plan/asked.py)."""
    return {s.name: s.gate_runs[kind] for s in registered().values() if kind in s.gate_runs}


def options() -> dict[str, tuple[Option, list[str]]]:
    """Every registered system's options by name: (the option, the systems that take it). Two systems may
    share an option of one name only with the same type and default."""
    out: dict[str, tuple[Option, list[str]]] = {}
    for s in registered().values():
        for o in s.options:
            if o.name in out and (out[o.name][0].type, out[o.name][0].default) != (o.type, o.default):
                raise HarnessError(f"system {s.name}: option {o.name!r}: another system has it with another type "
                                   "or default")
            out.setdefault(o.name, (o, []))[1].append(s.name)
    return out


def help_text() -> str:
    return "; ".join(f"{s.name}: {s.summary}" for s in registered().values())
