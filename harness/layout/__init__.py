"""Which device runs which part of the model: degrees, placement and stage layer ranges, validated once.

One type for every system and every consumer (the trainer, the baselines, the simulator,
the cost model): torchtitan's ParallelDims idea, a validated degrees object from which
everything else is read.

- **degrees** (tp, pp, dp, zero): D_TP x D_PP x D_DP = devices; zero 0 = plain data
  parallel, 1 = ZeRO-1 (optimizer state sharded), 3 = ZeRO-3 (parameters sharded, tp = pp = 1).
- **mesh**: the device of every (stage j, replica i, tensor rank t), nested (pp, dp, tp).
  Pipeline P_i = mesh[:, i, 0] in stage order; data-parallel group C_j = mesh[j, :, 0] in
  replica order (member k of C_j owns shard k of the stage's gradients).
- **stages**: the [first, last) transformer blocks of every stage; contiguous, possibly uneven.
- **replicas** (pipelines that differ): a layout may instead hold one `Pipeline` per replica, each
  with its own devices in stage order and its own stage ranges, of different lengths (HetPipe's
  virtual workers, uneven allocations over devices that differ). Then tp = 1, zero = 0, dp = the
  replicas, pp = the longest, and mesh and stages are empty: what reads the mesh (array, coords,
  stage_group, layers_per_stage, ...) raises a one-line LayoutError, so a system that runs a
  uniform mesh refuses such a layout by name. `pipeline(i)` and `replica_pipelines()` read both kinds.
- **wsp** (wsp.py): the replicas train asynchronously, each its own pipeline with N_m minibatches in flight,
  meeting at a sharded parameter server under Wave Synchronous Parallel (HetPipe); None: in step.

Placements, each one function:
- `seeded(...)`: THE seeded placement rule. perm = default_rng(seed).permutation(n), read
  replica-major: device(j, i, t) = perm[(i*pp + j)*tp + t]. The paper's random assignment
  (Yuan et al. App. D.1) for ours-random, and with the same seed the baselines' random layouts
  (App. D.2): with tp = 1 and the same D_PP x D_DP, Megatron runs on exactly ours-random's
  assignment. The simulator's random placements are this rule too.
- `in_rank_order(...)`: device(j, i, t) = (j*dp + i)*tp + t, the rank numbering of Megatron-LM
  and of DeepSpeed's PipeDataParallelTopology (tensor fastest, pipeline slowest): the
  baselines' `default`.
- `from_pipelines(...)`: a scheduler's assignment sigma (tp = 1), rows = replicas.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import HarnessError
from ..compute import BatchError, micro_batches
from ..compute.compression import Compression, CompressionError
from ..compute.model import GPTConfig, ModelError, even_split
from .schedule_order import SCHEDULES
from .wsp import WSP

DEGREES = (1, 2, 4, 8)  # the paper's grid for the baselines (App. D.2)
RANDOM_SEEDS = (2022, 2023, 2024)  # the paper's random layouts (App. D.1)
DP_SYNCS = ("sharded-ps", "allreduce")
ZERO_STAGES = (0, 1, 3)


class LayoutError(HarnessError, ValueError):
    """A layout the devices, the model or the batch cannot run; str() is one line naming the field."""


@dataclass(frozen=True)
class Pipeline:
    """One replica: its devices in stage order and the [first, last) blocks of each of its stages."""

    devices: tuple[int, ...]
    stages: tuple[tuple[int, int], ...]

    @property
    def layers_per_stage(self) -> list[int]:
        return [b - a for a, b in self.stages]


def _check_stages(where: str, stages, empty_ok: bool = False) -> None:
    """Contiguous block ranges from block 0; `empty_ok`: a stage may hold no block (DeepSpeed's engine splits
    layers by parameters, so a stage may hold only the embedding or the LM head: systems/deepspeed/partition.py)."""
    start = 0
    for j, (a, b) in enumerate(stages):
        if a != start or b < a or (b == a and not empty_ok):
            kind = "a" if empty_ok else "a non-empty"
            raise LayoutError(f"{where}[{j}]: must be {kind} range starting at block {start} (got [{a}, {b}))")
        start = b


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    mesh: tuple  # device of (stage, replica, tensor rank): nested tuples of shape (pp, dp, tp)
    stages: tuple[tuple[int, int], ...]  # [first, last) block of each stage, contiguous from 0
    zero: int = 0
    placement: str = "rank-order"  # how the mesh was made: rank-order | seed-<S> | a scheduler's name
    schedule: str = "1f1b"  # pipeline schedule: gpipe | 1f1b
    dp_sync: str = "allreduce"  # ours: sharded-ps (the paper) | allreduce; baselines: DDP's all-reduce
    recompute: bool = False  # recompute each block's activations in backward
    dp_compress: str = "none"  # ours' sharded-ps: the data-parallel messages' codec (compute/compression.py)
    replicas: tuple[Pipeline, ...] = ()  # pipelines that differ (module docstring); () for a uniform mesh
    wsp: WSP | None = None  # replicas train asynchronously under Wave Synchronous Parallel (wsp.py); None: in step

    def __post_init__(self):
        for name in ("tp", "pp", "dp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LayoutError(f"layout.{name}: must be a positive integer (got {v!r})")
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"layout.zero: must be one of {ZERO_STAGES} (got {self.zero!r})")
        if self.zero == 3 and (self.tp, self.pp) != (1, 1):
            raise LayoutError("layout.zero: ZeRO-3 runs without tensor or pipeline parallelism (tp = pp = 1)")
        if self.zero == 1 and self.tp != 1:
            raise LayoutError("layout.zero: ZeRO-1 + pipeline runs without tensor parallelism (tp = 1)")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"layout.schedule: must be one of {', '.join(SCHEDULES)} (got {self.schedule!r})")
        if self.dp_sync not in DP_SYNCS:
            raise LayoutError(f"layout.dp_sync: must be one of {', '.join(DP_SYNCS)} (got {self.dp_sync!r})")
        if not self.compression.off and self.dp_sync != "sharded-ps":
            raise LayoutError(f"layout.dp_compress: {self.dp_compress} encodes the sharded parameter server's "
                              f"messages; dp_sync {self.dp_sync} has none")
        if self.replicas:
            self._check_replicas()
        else:
            self._check_mesh()
        if self.wsp is not None:
            self._check_wsp()

    def _check_mesh(self) -> None:
        arr = np.asarray(self.mesh)
        if arr.shape != (self.pp, self.dp, self.tp):
            raise LayoutError(f"layout.mesh: shape {arr.shape} != (pp, dp, tp) = ({self.pp}, {self.dp}, {self.tp})")
        if sorted(arr.ravel().tolist()) != list(range(self.devices)):
            raise LayoutError(f"layout.mesh: must place every device 0..{self.devices - 1} once "
                              f"(got {arr.ravel().tolist()})")
        if len(self.stages) != self.pp:
            raise LayoutError(f"layout.stages: {len(self.stages)} layer ranges for {self.pp} stages")
        _check_stages("layout.stages", self.stages, empty_ok=self.zero == 1)

    def _check_replicas(self) -> None:
        """Pipelines that differ: every device once over all replicas, every block once per replica."""
        if (self.tp, self.zero) != (1, 0) or self.mesh or self.stages:
            raise LayoutError("layout.replicas: pipelines that differ run with tp = 1, zero = 0 and no mesh or stages")
        lengths = [len(r.devices) for r in self.replicas]
        if (self.dp, self.pp) != (len(lengths), max(lengths)):
            raise LayoutError(f"layout.replicas: {len(lengths)} replicas of up to {max(lengths)} stages, but "
                              f"dp = {self.dp}, pp = {self.pp}")
        seen: dict[int, int] = {}
        for i, r in enumerate(self.replicas):
            where = f"layout.replicas[{i}]"
            if not r.devices:
                raise LayoutError(f"{where}.devices: a pipeline needs at least one device")
            if len(r.stages) != len(r.devices):
                raise LayoutError(f"{where}: {len(r.devices)} devices for {len(r.stages)} stage layer ranges")
            _check_stages(f"{where}.stages", r.stages)
            if r.stages[-1][1] != self.replicas[0].stages[-1][1]:
                raise LayoutError(f"{where}.stages: cover {r.stages[-1][1]} blocks, replica 0 covers "
                                  f"{self.replicas[0].stages[-1][1]} (every replica holds the whole model)")
            for d in r.devices:
                if d in seen:
                    raise LayoutError(f"{where}.devices: device {d} is placed twice (replicas {seen[d]} and {i})")
                seen[d] = i
        if sorted(seen) != list(range(len(seen))):
            raise LayoutError(f"layout.replicas: must place every device 0..{len(seen) - 1} once "
                              f"(got {sorted(seen)})")

    def _check_wsp(self) -> None:
        if (self.tp, self.zero) != (1, 0):
            raise LayoutError("layout.wsp: pipelines under Wave Synchronous Parallel run with tp = 1 and zero = 0")
        if len(self.wsp.ps_hosts) != self.layers:
            raise LayoutError(f"layout.wsp.ps_hosts: {len(self.wsp.ps_hosts)} shard hosts for {self.layers} blocks")
        if max(self.wsp.ps_hosts) >= self.devices:
            raise LayoutError(f"layout.wsp.ps_hosts: device {max(self.wsp.ps_hosts)} is not among the "
                              f"{self.devices} devices")

    # ------------------------------------------------------------------ reading
    @property
    def uniform(self) -> bool:
        """Every replica runs the same stages on a (pp, dp, tp) mesh."""
        return not self.replicas

    @property
    def devices(self) -> int:
        return sum(len(r.devices) for r in self.replicas) if self.replicas else self.tp * self.pp * self.dp

    @property
    def layers(self) -> int:
        return (self.replicas[0].stages if self.replicas else self.stages)[-1][1]

    @property
    def layers_per_stage(self) -> list[int]:
        self._uniform("layers_per_stage")
        return [b - a for a, b in self.stages]

    def _uniform(self, what: str) -> None:
        if self.replicas:
            raise LayoutError(f"layout.replicas: {what} needs a uniform mesh; this layout's pipelines differ "
                              f"(stages per replica: {', '.join(str(len(r.devices)) for r in self.replicas)})")

    def array(self) -> np.ndarray:
        """The mesh as an int array (pp, dp, tp)."""
        self._uniform("the device mesh")
        return np.asarray(self.mesh, dtype=int)

    def pipeline(self, replica: int) -> Pipeline:
        """Replica i's devices (tensor rank 0) in stage order and its stage ranges, for either kind of layout."""
        if self.replicas:
            return self.replicas[replica]
        return Pipeline(self.pipelines[replica], self.stages)

    def replica_pipelines(self) -> tuple[Pipeline, ...]:
        return self.replicas or tuple(self.pipeline(i) for i in range(self.dp))

    def device(self, stage: int, replica: int, shard: int = 0) -> int:
        self._uniform("device(stage, replica)")
        return int(self.mesh[stage][replica][shard])

    def coords(self, device: int) -> tuple[int, int, int]:
        """(stage, replica, tensor rank) of a device."""
        hit = np.argwhere(self.array() == device)
        if not len(hit):
            raise LayoutError(f"layout: device {device} is not placed")
        j, i, t = hit[0]
        return int(j), int(i), int(t)

    @property
    def pipelines(self) -> tuple[tuple[int, ...], ...]:
        """P_i for every replica i: devices (tensor rank 0) in stage order. Rows = replicas."""
        if self.replicas:
            return tuple(r.devices for r in self.replicas)
        return tuple(tuple(int(d) for d in row) for row in self.array()[:, :, 0].T)

    def stage_group(self, j: int) -> list[int]:
        """C_j: the devices (tensor rank 0) running stage j, in replica order."""
        return [int(d) for d in self.array()[j, :, 0]]

    def rank_order(self) -> tuple[int, ...]:
        """The mesh flattened in (stage, replica, tensor rank) order: device of Megatron's logical rank k."""
        return tuple(int(d) for d in self.array().ravel())

    def role(self, device: int) -> str:
        """What `device` runs, for messages: its stage and pipeline, and the parameter-server shard it hosts."""
        where = next((f"stage {p.devices.index(device)} of pipeline {i}"
                      for i, p in enumerate(self.replica_pipelines()) if device in p.devices), "not placed")
        if not self.replicas and self.tp > 1:
            where += f", tensor rank {self.coords(device)[2]}"
        if self.wsp is not None and device in self.wsp.shard_hosts:
            blocks = [b for b, h in enumerate(self.wsp.ps_hosts) if h == device]
            where += f"; parameter-server shard of blocks {', '.join(map(str, blocks))}"
        return where

    def label(self) -> str:
        if self.replicas:
            head = "pipelines " + "+".join(str(len(r.devices)) for r in self.replicas)
        elif self.zero == 3:
            head = f"zero3 dp={self.dp}"
        elif self.zero == 1:
            head = f"zero1 pp={self.pp} dp={self.dp} {self.schedule}"
        else:
            head = f"tp={self.tp} pp={self.pp} dp={self.dp} {self.schedule}"
        if self.wsp is not None:
            head += f" WSP N_m={self.wsp.in_flight} D={self.wsp.staleness}"
        return head if self.placement == "rank-order" else f"{head} ({self.placement})"

    # ------------------------------------------------------------------ checks
    def check(self, cfg: GPTConfig | int, batch: int, micro_batch: int, devices: int | None = None) -> "Layout":
        """Raise LayoutError unless the model and batch can run on this layout; returns it. `cfg`: a GPT, or
        the number of layers of a layer-profile model (a CNN: no heads to split, tp 1)."""
        if devices is not None and self.devices != devices:
            if self.replicas:
                raise LayoutError(f"layout.replicas: place {self.devices} devices, the run has {devices}")
            raise LayoutError(f"layout: tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = {self.devices} != {devices} devices")
        if isinstance(cfg, int):
            if self.layers != cfg:
                raise LayoutError(f"layout.stages: cover {self.layers} layers, the model has {cfg}")
            if self.tp != 1:
                raise LayoutError(f"layout.tp: {self.tp}; a layer-profile model has no heads to split (tp 1)")
        elif self.layers != cfg.layers:
            raise LayoutError(f"layout.stages: cover {self.layers} blocks, model {cfg.name} has {cfg.layers}")
        elif cfg.heads % self.tp or (cfg.ffn_mult * cfg.hidden) % self.tp:
            raise LayoutError(f"layout.tp: {self.tp} does not divide the {cfg.heads} heads of model {cfg.name}")
        try:
            micro_batches(batch, micro_batch, self.dp)
        except BatchError as e:
            raise LayoutError(f"layout.dp: {e}") from None
        return self

    @property
    def compression(self) -> Compression:
        try:
            return Compression.parse(self.dp_compress, "layout.dp_compress")
        except CompressionError as e:
            raise LayoutError(str(e)) from None

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        doc = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "zero": self.zero, "placement": self.placement,
               "schedule": self.schedule, "dp_sync": self.dp_sync, "recompute": self.recompute,
               "mesh": _lists(self.mesh), "stages": [list(s) for s in self.stages]}
        if self.replicas:  # only then: a uniform layout's JSON is as it always was
            doc["replicas"] = [{"devices": list(r.devices), "stages": [list(s) for s in r.stages]}
                               for r in self.replicas]
        if self.wsp is not None:
            doc["wsp"] = self.wsp.to_json()
        if not self.compression.off:  # only then, as replicas
            doc["dp_compress"] = self.dp_compress
        return doc

    @classmethod
    def from_json(cls, d: dict) -> "Layout":
        if not isinstance(d, dict):
            raise LayoutError(f"layout: must be a mapping (got {d!r})")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise LayoutError(f"layout: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        missing = [k for k in ("tp", "pp", "dp", "mesh", "stages") if k not in d]
        if missing:
            raise LayoutError(f"layout.{missing[0]}: missing")
        try:
            replicas = tuple(Pipeline(tuple(int(x) for x in r["devices"]), tuple((int(a), int(b)) for a, b in r["stages"]))
                             for r in d.get("replicas", ()))
            wsp = WSP.from_json(d["wsp"]) if d.get("wsp") is not None else None
            return cls(**{**d, "mesh": _nested(d["mesh"]), "stages": tuple((int(a), int(b)) for a, b in d["stages"]),
                          "replicas": replicas, "wsp": wsp})
        except (TypeError, ValueError, KeyError) as e:
            if isinstance(e, LayoutError):
                raise
            raise LayoutError(f"layout: malformed ({type(e).__name__}: {e})") from None


def _nested(a) -> tuple:
    return tuple(_nested(x) for x in a) if isinstance(a, (list, tuple, np.ndarray)) else int(a)


def _lists(a):
    return [_lists(x) for x in a] if isinstance(a, tuple) else a


# ---------------------------------------------------------------------- building
def even_stages(layers: int, pp: int) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges of model.stage_layers' even split (earlier stages take the remainder)."""
    try:
        bounds = np.cumsum([0] + even_split(layers, pp))
    except ModelError:
        raise LayoutError(f"layout.pp: {pp} stages cannot split the model's {layers} layers") from None
    return tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))


def _build(mesh: np.ndarray, layers: int, stages=None, **opts) -> Layout:
    pp, dp, tp = mesh.shape
    return Layout(tp=tp, pp=pp, dp=dp, mesh=_nested(mesh), stages=tuple(stages or even_stages(layers, pp)), **opts)


def in_rank_order(tp: int, pp: int, dp: int, layers: int, **opts) -> Layout:
    """Megatron's / DeepSpeed's rank numbering: device(j, i, t) = (j*dp + i)*tp + t."""
    return _build(np.arange(tp * pp * dp).reshape(pp, dp, tp), layers, placement="rank-order", **opts)


def seeded(tp: int, pp: int, dp: int, layers: int, seed: int, **opts) -> Layout:
    """The seeded placement rule (module docstring): perm read replica-major."""
    n = tp * pp * dp
    perm = np.random.default_rng(seed).permutation(n)
    mesh = perm.reshape(dp, pp, tp).transpose(1, 0, 2)  # [i, j, t] = perm[(i*pp + j)*tp + t]
    return _build(mesh, layers, placement=f"seed-{seed}", **opts)


def from_pipelines(pipelines, layers: int, placement: str, **opts) -> Layout:
    """A scheduler's assignment: pipelines[i][j] = device of stage j of replica i (tp = 1)."""
    p = np.asarray(pipelines, dtype=int)
    if p.ndim != 2:
        raise LayoutError(f"layout.pipelines: must be a (replicas, stages) table (got shape {p.shape})")
    return _build(p.T[:, :, None], layers, placement=placement, **opts)


def from_replicas(replicas, placement: str, **opts) -> Layout:
    """Pipelines given per replica: replicas[i] = (devices in stage order, [first, last) blocks of each stage).
    Replicas that are all alike make the uniform mesh (from_pipelines with their stages); otherwise a
    layout whose pipelines differ."""
    pipes = tuple(Pipeline(tuple(int(d) for d in devs), tuple((int(a), int(b)) for a, b in stages))
                  for devs, stages in replicas)
    if not pipes:
        raise LayoutError("layout.replicas: at least one replica")
    if len({(len(p.devices), p.stages) for p in pipes}) == 1:
        return _build(np.asarray([p.devices for p in pipes], dtype=int).T[:, :, None], pipes[0].stages[-1][1],
                      stages=pipes[0].stages, placement=placement, **opts)
    return Layout(tp=1, pp=max(len(p.devices) for p in pipes), dp=len(pipes), mesh=(), stages=(),
                  placement=placement, replicas=pipes, **opts)


def with_rank_order(layout: Layout, order) -> Layout:
    """The same degrees on an explicit Megatron rank order (order[k] = device of logical rank k)."""
    layout._uniform("a rank order")
    arr = np.asarray(order, dtype=int)
    if arr.size != layout.devices:
        raise LayoutError(f"layout.rank_order: {arr.size} devices for {layout.devices}")
    return replace(layout, mesh=_nested(arr.reshape(layout.pp, layout.dp, layout.tp)), placement="explicit")


# ---------------------------------------------------------------------- degrees and grids
def default_pipeline_degrees(devices: int, layers: int) -> tuple[int, int]:
    """(D_PP, D_DP) as square as possible with the pipeline on the longer side (the paper's 8 x 8 for
    64 devices; 8 -> 4 x 2, 4 -> 2 x 2), D_PP limited by the layer count."""
    divisors = sorted((d for d in range(1, devices + 1) if devices % d == 0), key=lambda d: abs(d - math.sqrt(devices)))
    for d_dp in divisors:
        d_pp = devices // d_dp
        if d_dp <= d_pp <= layers:
            return d_pp, d_dp
    raise LayoutError(f"--devices: cannot split {devices} devices into stages of a {layers}-layer model")


PAPER_DEVICES = 64  # the paper's cases: Megatron's grid is App. D.2's up to here


def megatron_degrees(devices: int) -> list[tuple[int, int, int]]:
    """Every (D_TP, D_PP, D_DP) in {1, 2, 4, 8}^3 with product = devices (App. D.2) up to the paper's 64
    devices. Beyond, D_TP and D_PP from the same set and D_DP the rest: data parallelism is how Megatron
    scales out past a node (the paper's grid alone would leave 256 devices only D_TP >= 4 across regions,
    and 1,024 none)."""
    paper = [(t, p, d) for t, p, d in itertools.product(DEGREES, repeat=3) if t * p * d == devices]
    if paper and devices <= PAPER_DEVICES:
        return paper
    return [(t, p, devices // (t * p)) for t, p in itertools.product(DEGREES, repeat=2) if devices % (t * p) == 0]


def deepspeed_degrees(devices: int) -> list[tuple[int, int, int]]:
    """(zero, D_PP, D_DP): ZeRO-3 over all devices, ZeRO-1 + pipeline for every D_PP > 1 (App. D.2)."""
    return [(3, 1, devices)] + [(1, p, devices // p) for p in DEGREES if p > 1 and devices % p == 0]


def megatron_grid(cfg: GPTConfig, devices: int, batch: int, micro_batch: int, schedule: str = "1f1b") -> list[Layout]:
    """Megatron's grid (megatron_degrees) that the model and batch allow, in rank order."""
    return _fitting([(0, t, p, d) for t, p, d in megatron_degrees(devices)], cfg, batch, micro_batch, schedule)


def deepspeed_grid(cfg: GPTConfig, devices: int, batch: int, micro_batch: int, schedule: str = "1f1b") -> list[Layout]:
    """DeepSpeed's grid (deepspeed_degrees) that the model and batch allow, in rank order."""
    return _fitting([(z, 1, p, d) for z, p, d in deepspeed_degrees(devices)], cfg, batch, micro_batch, schedule)


def _fitting(degrees, cfg: GPTConfig, batch: int, micro_batch: int, schedule: str) -> list[Layout]:
    out = []
    for zero, t, p, d in degrees:
        try:
            out.append(in_rank_order(t, p, d, cfg.layers, zero=zero, schedule=schedule).check(cfg, batch, micro_batch))
        except LayoutError:
            continue
    return out
