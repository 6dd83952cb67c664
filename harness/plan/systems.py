"""The registry of training systems: one entry per system, everything the harness needs to know of it.

torchtitan's train-spec idea: a `System` bundles
- `train`: the function every rank of a real run calls, `train(ctx: RankContext, spec: RunSpec) ->
  list[IterationStats]`, with the default process group initialised (gloo on CPU, NCCL on GPU)
  (None: the system runs only in the simulator so far);
- `layout_rule`: `(RunRequest, Topology) -> (Layout, Placement | None)`, how planning turns the
  request into the run's layout (None: the request must give an explicit layout), with `flags`,
  the `harness run` layout flags the system takes, and `defaults`, the LayoutRequest fields it
  fills in when the user leaves them unset;
- `simulate`: `(Simulator, GPTConfig, batch) -> list[Candidate]`, its layouts in `harness sim`; the
  candidates' `config` is how its simulated records describe them (default: the layout its rule
  picks on the scenario, simulated by the runtime the layout names, `sweep.candidates_of_rule`);
- `simulate_layout`: `(Links, profiles, cfg, batch, Layout, micro_batch, bytes_per_value) ->
  (seconds, busiest compute seconds)`, the model `sim compare` holds a measured run against;
- `record_layout`: the layout a measured record ran on, for records older than the layout JSON;
- `simulate_cnn`: `(Topology, CNNModel, minibatch, CNNOptions) -> list[CNNCandidate]`, its model in
  `harness sim` of the layer-profile CNNs (harness/workloads/cnn.py, harness/hetpipe/sim.py);
- `tune_grid`: `(cfg, devices, batch, micro_batch, schedule) -> [Layout]`, the layouts `harness tune`
  runs (None: not tunable);
- `compute_observed`: its records' compute_seconds are timed inside the iteration;
- `scheduled`: its layout comes from the scheduler (the simulator shows the scheduler's progress);
- `style`: (colour, marker) of its series in every figure;
- `paper_role`: the column it fills in the paper's evaluation (`sim report`): ours, ours-random
  (ours without the scheduler), megatron or deepspeed. The report compares roles; which system
  fills a role is this registry's call.

Functions may be given as "module:function" and are imported on first use, so `harness run
--system ours` never imports the baselines' torch.distributed modules and this module imports
nothing heavy. Nothing outside this module compares a system's name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Union

from ..errors import HarnessError

Ref = Union[Callable, str]  # a function, or "module:function" imported when first used

# The `harness run` flags that set LayoutRequest fields: flag -> field.
LAYOUT_FLAGS = {
    "--d-pp": "pp", "--d-dp": "dp", "--tp": "tp", "--pp": "pp", "--dp": "dp", "--zero": "zero",
    "--scheduler": "scheduler", "--rank-order": "seed", "--schedule": "schedule", "--dp-sync": "dp_sync",
    "--recompute": "recompute", "--budget": "budget", "--allocator": "allocator",
}
OURS_FLAGS = ("--d-pp", "--d-dp", "--scheduler", "--budget", "--schedule", "--dp-sync", "--recompute", "--allocator")
BASELINE_FLAGS = ("--tp", "--pp", "--dp", "--rank-order", "--schedule")
PAPER_ROLES = ("ours", "ours-random", "megatron", "deepspeed")  # Yuan et al. 2022, sec. 4


def _resolve(ref: Ref | None) -> Callable | None:
    if ref is None or callable(ref):
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
    simulate: Ref | None = None
    simulate_layout: Ref = "harness.sim.compare:simulate_runtime_of_layout"
    record_layout: Ref = "harness.sim.compare:legacy_mesh_layout"
    simulate_cnn: Ref | None = None
    tune_grid: Ref | None = None
    compute_observed: bool = False
    scheduled: bool = False
    paper_role: str | None = None
    style: tuple[str, str] | None = None

    def __post_init__(self):
        unknown = [f for f in self.flags if f not in LAYOUT_FLAGS]
        if unknown:
            raise HarnessError(f"system {self.name}: unknown flag {unknown[0]!r} (known: {', '.join(LAYOUT_FLAGS)})")
        if self.paper_role not in (None, *PAPER_ROLES):
            raise HarnessError(f"system {self.name}: paper_role must be one of {', '.join(PAPER_ROLES)}")
        fields_ = [LAYOUT_FLAGS[f] for f in self.flags]
        if len(set(fields_)) != len(fields_):
            raise HarnessError(f"system {self.name}: two of its flags set the same layout field ({self.flags})")

    def train_fn(self) -> Callable:
        return _resolve(self.train)

    def layout_rule_fn(self) -> Callable | None:
        return _resolve(self.layout_rule)

    def simulate_fn(self) -> Callable | None:
        return _resolve(self.simulate)

    def simulate_layout_fn(self) -> Callable:
        return _resolve(self.simulate_layout)

    def record_layout_fn(self) -> Callable:
        return _resolve(self.record_layout)

    def tune_grid_fn(self) -> Callable | None:
        return _resolve(self.tune_grid)

    def simulate_cnn_fn(self) -> Callable | None:
        return _resolve(self.simulate_cnn)

    def flag_of(self, field_name: str) -> str:
        """The flag that sets LayoutRequest.`field_name` for this system (the generic one if it takes none)."""
        mine = [f for f in self.flags if LAYOUT_FLAGS[f] == field_name]
        return mine[0] if mine else next(f for f, v in LAYOUT_FLAGS.items() if v == field_name)


SYSTEMS: dict[str, System] = {}


def register(system: System) -> System:
    """Add (or replace) a registry entry; returns it."""
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
    if name not in SYSTEMS:
        raise HarnessError(f"--system: unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    return SYSTEMS[name]


def names(*, simulated: bool = False, tunable: bool = False, cnn: bool = False) -> tuple[str, ...]:
    """Registered names in registration order; `simulated`: only those `harness sim` can place on a GPT
    (a simulator model or a layout rule); `tunable`: only those with a tune grid; `cnn`: only those
    `harness sim` runs on a layer-profile CNN."""
    return tuple(s.name for s in SYSTEMS.values()
                 if (not simulated or s.simulate or s.layout_rule) and (not tunable or s.tune_grid)
                 and (not cnn or s.simulate_cnn))


def paper_systems() -> dict[str, str]:
    """role -> system name for every role of PAPER_ROLES (the first system registered with it)."""
    out = {}
    for s in SYSTEMS.values():
        if s.paper_role is not None:
            out.setdefault(s.paper_role, s.name)
    missing = [r for r in PAPER_ROLES if r not in out]
    if missing:
        raise HarnessError(f"systems: no system fills the paper's role {missing[0]!r}")
    return {r: out[r] for r in PAPER_ROLES}


def help_text() -> str:
    return "; ".join(f"{s.name}: {s.summary}" for s in SYSTEMS.values())


# ----------------------------------------------------------------------------- the built-in systems
register(System(
    "ours", "the paper's scheduled pipeline x data parallel (--d-pp/--d-dp, --scheduler)",
    train="harness.train.pipeline:train_ours", layout_rule="harness.plan.layouts:place_ours", flags=OURS_FLAGS,
    defaults={"scheduler": "ga", "schedule": "gpipe"}, simulate="harness.sim.sweep:candidates_ours",
    simulate_layout="harness.sim.compare:simulate_ours_layout", record_layout="harness.sim.compare:legacy_ours_layout",
    compute_observed=True, scheduled=True, paper_role="ours", style=("#d62728", "o"),
))
register(System(
    "ours-random", "ours' runtime on the seeded random assignment (the paper's ablation; --seed)",
    train="harness.train.pipeline:train_ours", layout_rule="harness.plan.layouts:place_ours_random",
    flags=tuple(f for f in OURS_FLAGS if f not in ("--scheduler", "--budget")),
    defaults={"scheduler": "random-assignment", "schedule": "gpipe"},
    simulate="harness.sim.sweep:candidates_ours_random",
    simulate_layout="harness.sim.compare:simulate_ours_layout", record_layout="harness.sim.compare:legacy_random_layout",
    compute_observed=True, paper_role="ours-random", style=("#ff9896", "s"),
))
register(System(
    "megatron", "tensor x pipeline x data parallel in Megatron-LM's rank order (--tp/--pp/--dp)",
    train="harness.train.baselines.systems:train_megatron", layout_rule="harness.plan.layouts:megatron_layout",
    flags=BASELINE_FLAGS, defaults={"schedule": "1f1b"}, simulate="harness.sim.sweep:candidates_megatron",
    tune_grid="harness.layout:megatron_grid", paper_role="megatron", style=("#1f77b4", "^"),
))
register(System(
    "deepspeed", "ZeRO-3 over every device, or ZeRO-1 + pipeline (--zero, --pp/--dp)",
    train="harness.train.baselines.systems:train_deepspeed", layout_rule="harness.plan.layouts:deepspeed_layout",
    flags=BASELINE_FLAGS[1:] + ("--zero",), defaults={"schedule": "1f1b"},
    simulate="harness.sim.sweep:candidates_deepspeed", record_layout="harness.sim.compare:legacy_zero3_layout",
    tune_grid="harness.layout:deepspeed_grid", paper_role="deepspeed", style=("#2ca02c", "v"),
))
register(System(
    "hetpipe", "HetPipe: virtual workers (pipelines over heterogeneous GPUs), data parallel under Wave Synchronous "
    "Parallel through a parameter server (simulator; --model vgg19|resnet152)",
    simulate_cnn="harness.hetpipe.sim:candidates_hetpipe", style=("#9467bd", "D"),
))
register(System(
    "horovod", "synchronous data parallel with a ring all-reduce, HetPipe's baseline (simulator; --model "
    "vgg19|resnet152)",
    simulate_cnn="harness.hetpipe.sim:candidates_horovod", style=("#8c564b", "P"),
))
