"""Schedulers: one interface, one registry, seeded and reproducible.

Every scheduler searches over balanced partitions (D_PP groups of D_DP devices)
and is charged one unit of budget per candidate whose COMM-COST it evaluates;
its trace lists (candidates evaluated, best cost so far). The best partition is
then expanded by the cost model into the full assignment sigma (pipelines).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..cost import CostModel
from ..errors import HarnessError
from ..scenario import Topology
from .search import SearchResult


class SchedulerError(HarnessError, ValueError):
    """Unknown scheduler, bad budget, or an instance a scheduler cannot handle."""


SCHEDULERS: dict[str, Callable[[CostModel, np.random.Generator, int], SearchResult]] = {}


def register(name: str):
    def deco(fn):
        SCHEDULERS[name] = fn
        return fn

    return deco


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
        }

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        missing = [k for k in cls.__dataclass_fields__ if k not in doc]
        if missing:
            raise SchedulerError(f"assignment JSON: missing key {missing[0]!r}")
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__})


def schedule(
    topo: Topology,
    d_pp: int,
    d_dp: int,
    c_pp_bytes: float,
    c_dp_bytes: float,
    scheduler: str = "ga",
    seed: int = 0,
    budget: int = 5000,
    progress: Callable[[int, float], None] | None = None,
) -> Assignment:
    """Search an assignment of D_PP x D_DP tasklets to the devices of `topo`."""
    if scheduler not in SCHEDULERS:
        raise SchedulerError(f"--scheduler: unknown scheduler {scheduler!r} (known: {', '.join(SCHEDULERS)})")
    if budget < 1:
        raise SchedulerError(f"--budget: must be >= 1 (got {budget})")
    model = CostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
    rng = np.random.default_rng(seed)
    result = SCHEDULERS[scheduler](model, rng, budget, progress)
    best = model.breakdown(result.partition)
    return Assignment(
        scenario=topo.name,
        devices=topo.n,
        d_pp=d_pp,
        d_dp=d_dp,
        scheduler=scheduler,
        seed=seed,
        c_pp_gb=c_pp_bytes / 1e9,
        c_dp_gb=c_dp_bytes / 1e9,
        partition=best.partition.tolist(),
        pipelines=best.pipelines.tolist(),
        cost={"dp": best.dp, "pp": best.pp, "total": best.total},
        trace=[[int(n), float(c)] for n, c in result.trace],
    )


from . import exhaustive, genetic, random_search  # noqa: E402,F401  (register the schedulers)
