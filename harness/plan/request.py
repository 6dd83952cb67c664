"""Typed configuration of one training run, in sections: model, layout, network, run, debug.

`RunRequest` is what a user asks for (`harness run` flags map one to one onto its
sections); `plan.plan_run` resolves its `LayoutRequest` into a `harness.layout.Layout`
and gives a `RunSpec`: the same sections as asked, the layout decided, and a `resolved`
section with what planning and the launcher decided (run id, backend, kernel, the
scenario's name and how to load it again), which every rank receives as JSON. Sections are frozen and checked at construction; `from_json`
rejects unknown keys. Nothing here imports torch.

The debug section holds what tests and experiments inject into a run (faults, traces);
it travels to the ranks with the rest of the spec, so production code reads no test
hooks from the environment. `--debug KEY=VALUE` sets its fields (`DebugSection.parse`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

from ..errors import HarnessError
from ..layout import DP_SYNCS, SCHEDULES, Layout
from ..compute.model import MODELS, GPTConfig, get_model
from ..compute.profiles import ComputeProfile
from ..compute import BYTES_PER_VALUE
from ..scenario.preemption import KEEPALIVE_S, LAST_CALL_S
from ..scenario.transport import PRESETS
from ..scheduler import DEFAULT_BUDGET
from ..workloads.cnn import CNN_DATA_SETS, TRAINABLE_CNNS, get_cnn
from ..workloads.gpt_layers import gpt_layer_profile
from ..workloads.layers import LayerProfile
from ..workloads.markov import DATA_SETS

DTYPE_NAMES = tuple(BYTES_PER_VALUE)
NETWORK_MODES = ("emulated", "none", "shaped")
KERNELS = ("auto", "host", "uml")
TRANSPORTS = ("scenario", *PRESETS)
FAULT_MODES = ("kill", "exit", "preempt")
#: where in an iteration a fault with debug.fault_iteration fires (RankContext.reached)
FAULT_PHASES = ("forward", "backward", "dp_sync", "checkpoint")


class ConfigError(HarnessError, ValueError):
    """A run configuration value is invalid; str() is one line naming section.field and the value."""


def _one_of(where: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: must be one of {', '.join(map(str, allowed))} (got {value!r})")


def _positive(where: str, value, kind=int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or not value > 0:
        raise ConfigError(f"{where}: must be a positive {'number' if kind is float else 'integer'} (got {value!r})")


@dataclass(frozen=True)
class ModelSection:
    """What is trained: the model, the batch and the optimizer. A GPT (compute/model.py) on synthetic
    tokens, or a CNN of workloads/cnn.TRAINABLE_CNNS on teacher-labelled images (train/cnn.py)."""

    name: str = "tiny"
    layers: int | None = None  # None: the model's own depth (GPT only)
    batch: int = 8  # global batch, samples
    micro_batch: int = 1  # samples per micro-batch
    dtype: str = "fp32"  # compute and wire precision: fp32 | bf16 | fp16
    lr: float = 0.1
    seed: int = 0  # data and initialisation (and the seeded placement of ours-random)
    # synthetic data set: uniform | markov for a GPT (harness/workloads/markov.py), teacher for a CNN;
    # None: the model's first
    data: str | None = None

    def __post_init__(self):
        _positive("model.batch", self.batch)
        _positive("model.micro_batch", self.micro_batch)
        _positive("model.lr", self.lr, float)
        _one_of("model.dtype", self.dtype, DTYPE_NAMES)
        if self.name not in MODELS and not self.is_cnn:
            raise ConfigError(f"--model: unknown model {self.name!r} (known: {', '.join((*MODELS, *TRAINABLE_CNNS))})")
        if self.is_cnn and self.layers is not None:
            raise ConfigError(f"model.layers: {self.name} is a CNN of fixed depth (got {self.layers!r})")
        if self.data is None:
            object.__setattr__(self, "data", self.data_sets[0])
        _one_of("model.data", self.data, self.data_sets)
        self.profile if self.is_cnn else self.cfg  # unknown model or bad layer count: one line, now

    @property
    def is_cnn(self) -> bool:
        return self.name in TRAINABLE_CNNS

    @property
    def data_sets(self) -> tuple[str, ...]:
        return CNN_DATA_SETS if self.is_cnn else DATA_SETS

    @property
    def cfg(self) -> GPTConfig:
        if self.is_cnn:
            raise ConfigError(f"model.name: {self.name} is a CNN, not a GPT (only hetpipe and horovod train it)")
        return get_model(self.name, self.layers)

    @property
    def profile(self) -> LayerProfile:
        """The model as its chain of layers (what HetPipe's planner partitions; a GPT's blocks)."""
        if self.is_cnn:
            return get_cnn(self.name)
        return gpt_layer_profile(self.cfg)

    @property
    def simulated(self) -> GPTConfig | LayerProfile:
        """What the simulator's model of a run takes: a GPT's config, or a CNN's chain of layers."""
        return self.profile if self.is_cnn else self.cfg

    @property
    def bytes_per_value(self) -> int:
        return BYTES_PER_VALUE[self.dtype]


@dataclass(frozen=True)
class LayoutRequest:
    """The layout as asked; unset fields are chosen by planning: the system's registry defaults
    (harness/plan/systems.py), then its layout rule. Which fields a system takes is its entry's `flags`."""

    tp: int | None = None
    pp: int | None = None  # ours: D_PP (--d-pp); baselines: --pp
    dp: int | None = None  # ours: D_DP (--d-dp); baselines: --dp
    zero: int | None = None  # deepspeed: 1 (with pipeline) or 3
    scheduler: str | None = None  # ours: the scheduler placing the assignment (ga, ..., random-assignment)
    seed: int | None = None  # baselines: the seeded placement of this seed (--rank-order); None: rank order
    schedule: str | None = None  # ours: gpipe by default (the paper); baselines: 1f1b
    dp_sync: str = "sharded-ps"  # ours only
    recompute: bool | None = None  # ours: default on for cuda
    budget: int = DEFAULT_BUDGET  # scheduler evaluations
    allocator: str | None = None  # ours: each stage's blocks (harness/allocation/); None: even
    explicit: Layout | None = None  # a full layout (e.g. a grid point of `harness tune`)
    replan: bool | None = None  # ours under a timeline: the scheduler runs again when the links change (--replan)

    def __post_init__(self):
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) is not None:
                _positive(f"layout.{name}", getattr(self, name))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"layout.seed: must be an integer (got {self.seed!r})")
        if self.schedule is not None:
            _one_of("layout.schedule", self.schedule, SCHEDULES)
        _one_of("layout.dp_sync", self.dp_sync, DP_SYNCS)
        _positive("layout.budget", self.budget)
        if self.allocator is not None:
            from ..allocation import ALLOCATORS

            _one_of("layout.allocator", self.allocator, ALLOCATORS)


@dataclass(frozen=True)
class NetworkSection:
    """Where the ranks run and what links they see."""

    scenario: str  # as asked: a case number, a name or a path (resolved.scenario is its name)
    devices: int | None = None  # scale the scenario down to this many devices
    bandwidth_scale: float = 1.0  # applied once: Topology.scaled
    mode: str = "emulated"  # emulated: namespaces + shaping; none: no shaping; shaped: real nodes after `net apply`
    kernel: str = "auto"  # emulated: auto | host | uml as asked (network/kernel.py); resolved.kernel: what ran
    transport: str = "scenario"  # TCP settings: the scenario's, or a preset in place of them (scenario/transport.py)
    # links that change during the run (scenario/timeline.py): a timeline file's absolute path, in place of the
    # scenario's own `timeline:`; None: the scenario's, if it has one
    timeline: str | None = None

    def __post_init__(self):
        _positive("network.bandwidth_scale", self.bandwidth_scale, float)
        _one_of("network.mode", self.mode, NETWORK_MODES)
        _one_of("network.kernel", self.kernel, KERNELS)
        _one_of("network.transport", self.transport, TRANSPORTS)


@dataclass(frozen=True)
class ReplanSection:
    """ours under a timeline with --replan (harness/systems/ours/replan.py): the search the run re-plans with
    when its links change, filled in by planning from the layout request; off by default. A new plan is taken
    when the cost model finds it faster than the one in use, on the links as they are, by more than `min_gain`."""

    enabled: bool = False
    scheduler: str = "ga"
    budget: int = DEFAULT_BUDGET
    allocator: str | None = None
    min_gain: float = 0.0

    def __post_init__(self):
        _positive("replan.budget", self.budget)
        if isinstance(self.min_gain, bool) or not isinstance(self.min_gain, (int, float)) \
                or not 0 <= self.min_gain < 1:
            raise ConfigError(f"replan.min_gain: must be a fraction in [0, 1) (got {self.min_gain!r})")


@dataclass(frozen=True)
class RunSection:
    """How long, on what, and under which name."""

    system: str = "ours"  # a name of the system registry (harness/plan/systems.py)
    iters: int = 3  # timed iterations
    warmup: int = 1  # untimed iterations before them
    device_type: str = "cpu"  # cpu (gloo) | cuda (NCCL)
    timeout_s: float = 600.0  # the whole run; the process-group timeout is capped below it
    timeout_auto: bool = False  # no --timeout: a dilated run's follows from its expected time (plan/dilation.py)
    threads: int = 1  # torch intra-op threads per rank
    run_id: str | None = None  # None: planning names the run (resolved.run_id)
    results_root: str | None = None  # default: results/
    checkpoint_every: int | None = None  # every rank writes what it holds every N iterations (train/checkpoint.py)
    resume: str | None = None  # a run directory: start from its last complete checkpoint (absolute path)
    # the elastic agent's rendezvous (train/elastic.py; torchrun's defaults): a device gone after
    # KEEPALIVE_MISSED keep-alives missed; fewer devices than the run's wait this long for more
    keepalive_s: float = KEEPALIVE_S
    last_call_s: float = LAST_CALL_S
    # the system's own options (its registry entry's `options`), every one of them: name -> value
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        _positive("run.iters", self.iters)
        if not isinstance(self.options, dict) or not all(isinstance(k, str) for k in self.options):
            raise ConfigError(f"run.options: must be a mapping of option names (got {self.options!r})")
        _positive("run.keepalive_s", self.keepalive_s, float)
        if isinstance(self.last_call_s, bool) or not isinstance(self.last_call_s, (int, float)) or self.last_call_s < 0:
            raise ConfigError(f"run.last_call_s: must be a number >= 0 (got {self.last_call_s!r})")
        if self.checkpoint_every is not None:
            _positive("run.checkpoint_every", self.checkpoint_every)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"run.warmup: must be an integer >= 0 (got {self.warmup!r})")
        _one_of("run.device_type", self.device_type, ("cpu", "cuda"))
        _positive("run.timeout_s", self.timeout_s, float)

    @property
    def group_timeout_s(self) -> float:
        """torch.distributed's timeout: a silent peer fails the run after this."""
        return min(self.timeout_s, 300.0)


@dataclass(frozen=True)
class ComputeSection:
    """The compute model (harness/train/compute_model.py): with `model`, every forward, backward and
    optimizer step of a rank takes what its device's profile gives for that work, times `time_scale`
    (the rank computes for real, then waits for the rest), so CPU processes stand in for the
    scenario's GPUs whatever else runs on the host. `devices`: every device's ComputeProfile at the
    run's precision, filled in by planning."""

    model: bool = False
    time_scale: float = 1.0
    devices: tuple = ()
    # emulated, no time scale given: time_scale and the network's bandwidth_scale (divided further) are chosen before
    # the run from a probe of its cost on this host (plan/dilation.py), so that the emulated CPU does not bound it
    dilate: bool = False

    def __post_init__(self):
        _positive("compute.time_scale", self.time_scale, float)
        if self.time_scale != 1.0 and not self.model:
            raise ConfigError("--compute-time-scale: needs --compute-model")
        if self.dilate and not self.model:
            raise ConfigError("compute.dilate: needs --compute-model")
        object.__setattr__(self, "devices", tuple(
            d if isinstance(d, ComputeProfile) else ComputeProfile(**d) for d in self.devices))


@dataclass(frozen=True)
class DebugSection:
    """Injected behaviour for tests and experiments; off by default."""

    fault_rank: int | None = None  # this rank dies fault_after_s after joining the process group
    fault_after_s: float = 0.0
    # kill: SIGKILL itself; exit: os._exit(17); preempt: its device is taken (SIGKILL), and the elastic agent
    # (train/elastic.py) goes on without it, as after a timeline's preempt: (fault_rank: the device)
    fault_mode: str = "kill"
    # instead of fault_after_s: the fault fires when the rank reaches fault_phase of this iteration (0-based,
    # warm-up included): forward or backward (after its first micro-batch's), dp_sync (its shard sent, the
    # others' not yet taken), checkpoint (before its file of the checkpoint after the iteration is written)
    fault_iteration: int | None = None
    fault_phase: str = "forward"
    # preempt: the device is warned at the fault's point (a cloud's notice) and taken this many seconds later
    fault_notice_s: float = 0.0
    trace: bool = False  # ours: per-iteration phase times of every rank on stderr
    # planted regressions (harness regress --debug): ours' point-to-point sends
    send_delay_s: float = 0.0  # every send waits this long before it is posted
    overlap: bool = True  # off: every send is a rendezvous, done once the peer took the data (GPipe, CPU)
    count_wire: bool = False  # every rank counts its bytes on the wire per iteration (wire.py; slows compute)
    # hetpipe: after every compute phase a rank waits a random time, up to 2 x jitter_s x a speed drawn once
    # per device (seeded by the run's seed and the device), so that virtual workers run at random speeds
    jitter_s: float = 0.0

    def __post_init__(self):
        _one_of("debug.fault_mode", self.fault_mode, FAULT_MODES)
        _one_of("debug.fault_phase", self.fault_phase, FAULT_PHASES)
        if self.fault_mode == "preempt" and self.fault_rank is None:
            raise ConfigError("debug.fault_mode: preempt needs fault_rank (the device preempted)")
        for name in ("fault_rank", "fault_iteration"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"debug.{name}: must be an integer >= 0 (got {v!r})")
        if self.fault_notice_s and self.fault_mode != "preempt":
            raise ConfigError("debug.fault_notice_s: a preemption's notice (with fault_mode=preempt)")
        for name in ("send_delay_s", "jitter_s", "fault_notice_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
                raise ConfigError(f"debug.{name}: must be a number >= 0 (got {v!r})")

    @classmethod
    def parse(cls, items: list[str] | None) -> "DebugSection":
        """`KEY=VALUE` strings (the --debug flag), typed by the field they name."""
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for item in items or []:
            key, sep, text = item.partition("=")
            if not sep or key not in types:
                raise ConfigError(f"--debug: expected KEY=VALUE with KEY one of {', '.join(types)} (got {item!r})")
            t = types[key].replace(" | None", "")
            try:
                if "bool" in t:
                    if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError(text)
                    out[key] = text.lower() in ("1", "true", "yes", "on")
                elif "int" in t:
                    out[key] = int(text)
                elif "float" in t:
                    out[key] = float(text)
                else:
                    out[key] = text
            except ValueError:
                raise ConfigError(f"--debug: {key}: not a valid {t} (got {text!r})") from None
        return cls(**out)


@dataclass(frozen=True)
class Resolved:
    """What planning and the launcher decided, kept apart from what was asked."""

    run_id: str
    backend: str  # emu | local | cluster: from network.mode, or the torchrun launcher
    scenario: str  # the scenario's name: the records' scenario and results/<scenario>/
    scenario_source: str  # how to load it again: the name of a scenario of scenarios/, else its file's absolute path
    kernel: str = "none"  # host | uml | none: what shaped the links; the launcher fills it in
    checkpoint_dir: str | None = None  # where the ranks write checkpoints (absolute): run.checkpoint_every
    start_iteration: int = 0  # run.resume: the iterations its checkpoint had done; this run goes on from there
    # the elastic agent, for a system that recovers from its survivors' memory (train/snapshots.py):
    # {"root", "generation", "recover": a RecoveryPlan's JSON for the generation after a preemption, or None}
    snapshots: dict | None = None

    def __post_init__(self):
        _one_of("resolved.backend", self.backend, BACKENDS)
        _one_of("resolved.kernel", self.kernel, ("host", "uml", "none"))


BACKENDS = ("emu", "local", "cluster")
SECTIONS = {"model": ModelSection, "network": NetworkSection, "run": RunSection, "compute": ComputeSection,
            "replan": ReplanSection,
            "debug": DebugSection, "resolved": Resolved}


@dataclass(frozen=True)
class RunRequest:
    """What `harness run` asks for, before planning."""

    network: NetworkSection
    model: ModelSection = field(default_factory=ModelSection)
    layout: LayoutRequest = field(default_factory=LayoutRequest)
    run: RunSection = field(default_factory=RunSection)
    compute: ComputeSection = field(default_factory=ComputeSection)
    debug: DebugSection = field(default_factory=DebugSection)


@dataclass(frozen=True)
class RunSpec:
    """A planned run: the request's sections as asked, the layout decided and what planning resolved.
    Every rank receives it (JSON)."""

    network: NetworkSection
    model: ModelSection
    layout: Layout
    run: RunSection
    resolved: Resolved
    compute: ComputeSection = field(default_factory=ComputeSection)
    debug: DebugSection = field(default_factory=DebugSection)
    replan: ReplanSection = field(default_factory=ReplanSection)

    @property
    def cfg(self) -> GPTConfig:
        return self.model.cfg

    def with_resolved(self, **changes) -> "RunSpec":
        return replace(self, resolved=replace(self.resolved, **changes))

    def to_json(self) -> dict:
        doc = {name: asdict(getattr(self, name)) for name in SECTIONS}
        doc["layout"] = self.layout.to_json()
        return json.loads(json.dumps(doc))

    @classmethod
    def from_json(cls, doc: dict) -> "RunSpec":
        if not isinstance(doc, dict):
            raise ConfigError(f"run spec: must be a mapping (got {type(doc).__name__})")
        unknown = sorted(set(doc) - set(SECTIONS) - {"layout"})
        if unknown:
            raise ConfigError(f"run spec: unknown section {unknown[0]!r} (known: layout, {', '.join(SECTIONS)})")
        parts = {}
        for name, section in SECTIONS.items():
            if name == "resolved" and name not in doc:
                raise ConfigError("run spec: resolved: missing (a spec is a planned run)")
            d = doc.get(name, {})
            bad = sorted(set(d) - {f.name for f in fields(section)})
            if bad:
                raise ConfigError(f"run spec: {name}.{bad[0]}: unknown key")
            parts[name] = section(**d)
        return cls(layout=Layout.from_json(doc.get("layout")), **parts)
