"""Schedulers: one interface, one registry, seeded and reproducible.

Every scheduler searches over balanced partitions (D_PP groups of D_DP devices)
and is charged one unit of budget per candidate whose COMM-COST it evaluates;
its trace lists (candidates evaluated, best cost so far). The best partition is
then expanded by the cost model into the full assignment sigma (pipelines).

A compute-aware scheduler (`ga-hetero`) searches the same partitions on the modelled iteration
time instead (harness/scheduler/iteration_cost.py: communication, the slowest stage's compute and the
bubble, with the optimal layer allocation of each candidate); it needs a ComputeSetting. Given one,
every scheduler's assignment also carries its stages' blocks and the modelled parts.

Every assignment carries a lower bound on the COMM-COST of any layout and its gap above it (and, given a
ComputeSetting, the same for the modelled iteration time): harness/scheduler/bound.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .bound import comm_cost_bound, iteration_bound
from .cost import CostModel
from .lumped import LUMPED_FROM, LumpedCostModel, cost_model  # noqa: F401
from .iteration_cost import ComputeSetting, IterationModel
from ..allocation import DEFAULT as DEFAULT_ALLOCATOR
from ..scenario import Topology
from .registry import COMPUTE_AWARE, COMPUTE_AWARE_ALLOCATOR, SCHEDULERS, SchedulerError, register  # noqa: F401
from .search import Evaluator, SearchResult


def default_allocator(scheduler: str, allocator: str | None) -> str:
    """The allocator of a run with `scheduler`: a compute-aware scheduler's own (an explicit other one is
    an error), else `allocator` or even."""
    if scheduler in COMPUTE_AWARE:
        if allocator not in (None, COMPUTE_AWARE_ALLOCATOR):
            raise SchedulerError(f"--allocator: {scheduler} takes every stage's blocks from the "
                                 f"{COMPUTE_AWARE_ALLOCATOR} allocator (got {allocator})")
        return COMPUTE_AWARE_ALLOCATOR
    return allocator or DEFAULT_ALLOCATOR


@dataclass
class Assignment:
    """The scheduler's output; `to_json()` keys are read by other tools, keep them."""

    scenario: str
    devices: int
    d_pp: int
    d_dp: int
    scheduler: str
    seed: int
    c_pp_gb: float
    c_dp_gb: float
    partition: list[list[int]]  # device ids of C_j, for each stage j in pipeline order
    pipelines: list[list[int]]  # device of stage 0..D_PP-1, for each replica i
    cost: dict  # {"dp": s, "pp": s, "total": s}
    trace: list[list[float]] = field(default_factory=list)  # [candidates evaluated, best total]
    # given a ComputeSetting: [first, last) blocks of stage j, per pipeline (replicas share them),
    # and the modelled iteration's parts (IterationCost.to_json)
    layers: list[list[list[int]]] | None = None
    model: dict | None = None
    # a lower bound on the COMM-COST of every layout (harness/scheduler/bound.py) and how far above it this one is
    bound: dict | None = None  # {"total": s, "dp": s, "pp": s}
    gap: float | None = None  # (cost - bound) / cost
    # the planner's options when it chose the degrees (harness/scheduler/degrees.py, Plan.to_json)
    plan: dict | None = None

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario,
            "devices": self.devices,
            "d_pp": self.d_pp,
            "d_dp": self.d_dp,
            "scheduler": self.scheduler,
            "seed": self.seed,
            "c_pp_gb": self.c_pp_gb,
            "c_dp_gb": self.c_dp_gb,
            "partition": self.partition,
            "pipelines": self.pipelines,
            "cost": self.cost,
            "trace": self.trace,
            "layers": self.layers,
            "model": self.model,
            "bound": self.bound,
            "gap": self.gap,
            "plan": self.plan,
        }

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        optional = ("trace", "layers", "model", "bound", "gap", "plan")
        missing = [k for k in cls.__dataclass_fields__ if k not in doc and k not in optional]
        if missing:
            raise SchedulerError(f"assignment JSON: missing key {missing[0]!r}")
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    @property
    def stages(self) -> tuple[tuple[int, int], ...] | None:
        """[first, last) blocks of every stage (Layout.stages), when the assignment carries them."""
        return tuple(tuple(r) for r in self.layers[0]) if self.layers else None


#: Candidates a scheduler evaluates unless told otherwise: one default for every command (run, schedule, sim).
DEFAULT_BUDGET = 5000

def schedule(
    topo: Topology,
    d_pp: int,
    d_dp: int,
    c_pp_bytes: float,
    c_dp_bytes: float,
    scheduler: str = "ga",
    seed: int = 0,
    budget: int = DEFAULT_BUDGET,
    progress: Callable[[int, float], None] | None = None,
    setting: ComputeSetting | None = None,
    allocator: str | None = None,
) -> Assignment:
    """Search an assignment of D_PP x D_DP tasklets to the devices of `topo`.

    With `setting`, the assignment also carries its stages' blocks (the compute-aware scheduler's own,
    else `allocator`'s, default even) and the modelled iteration's parts."""
    if scheduler not in SCHEDULERS:
        raise SchedulerError(f"--scheduler: unknown scheduler {scheduler!r} (known: {', '.join(SCHEDULERS)})")
    if budget < 1:
        raise SchedulerError(f"--budget: must be >= 1 (got {budget})")
    allocator = default_allocator(scheduler, allocator)
    if scheduler in COMPUTE_AWARE and setting is None:
        raise SchedulerError(f"--scheduler: {scheduler} needs the model and batch (a ComputeSetting)")
    comm = cost_model(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
    model = IterationModel(comm, setting) if setting is not None else None
    rng = np.random.default_rng(seed)
    searched = model if scheduler in COMPUTE_AWARE else comm
    if d_pp == 1:  # one group holds every device: the only partition, nothing to search
        ev = Evaluator(searched, budget, progress)
        ev(np.zeros(topo.n, dtype=int))
        result = ev.result()
    else:
        result = SCHEDULERS[scheduler](searched, rng, budget, progress)
    if scheduler in COMPUTE_AWARE:
        modelled = model.breakdown(result.partition)
        pipelines = modelled.pipelines
    else:
        pipelines = comm.breakdown(result.partition).pipelines
        modelled = None if model is None else model.of_pipelines(pipelines, allocator=allocator)
    total = comm.pipeline_cost(pipelines)
    dp = comm.datap_cost(pipelines.T)
    bound = comm_cost_bound(comm)
    modelled_json = None
    if modelled is not None:
        at_least = iteration_bound(model)
        modelled_json = {**modelled.to_json(), "bound": at_least.to_json(), "gap": at_least.gap(modelled.total)}
    return Assignment(
        scenario=topo.name,
        devices=topo.n,
        d_pp=d_pp,
        d_dp=d_dp,
        scheduler=scheduler,
        seed=seed,
        c_pp_gb=c_pp_bytes / 1e9,
        c_dp_gb=c_dp_bytes / 1e9,
        partition=pipelines.T.tolist(),
        pipelines=pipelines.tolist(),
        cost={"dp": dp, "pp": total - dp, "total": total},
        trace=[[int(n), float(c)] for n, c in result.trace],
        layers=None if modelled is None else [[list(s) for s in modelled.stages]] * d_dp,
        model=modelled_json,
        bound={"total": bound.total, "dp": bound.dp, "pp": bound.pp},
        gap=bound.gap(total),
    )


from . import exhaustive, genetic, random_search  # noqa: E402,F401  (register the schedulers)
