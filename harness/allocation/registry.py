"""The allocators by name: one entry each (`register`), looked up by `get`; `allocate` runs one."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .problem import Allocation, AllocationError, Problem
from .sky import MIP_TIME_LIMIT_S, sky_heuristic, sky_mip
from .solvers import even, optimal


@dataclass(frozen=True)
class Allocator:
    name: str
    solve: Callable[[Problem, float], tuple[list[int], bool]]  # (problem, time limit s) -> (blocks, proven optimal)
    cut_terms: bool = False  # takes a Problem's cut-dependent communication and per-device block memory
    even_split: bool = False  # its stages are the layout's even split: nothing to allocate, nothing to record


ALLOCATORS: dict[str, Allocator] = {}
DEFAULT = "even"  # the allocator of a run that names none


def register(allocator: Allocator) -> Allocator:
    ALLOCATORS[allocator.name] = allocator
    return allocator


def get(name: str) -> Allocator:
    if name not in ALLOCATORS:
        raise AllocationError(f"--allocator: unknown {name!r} (known: {', '.join(ALLOCATORS)})")
    return ALLOCATORS[name]


def keeps_even_split(name: str | None) -> bool:
    """The allocator `name` (None: the default) leaves a layout's even stages as they are."""
    return get(name or DEFAULT).even_split


register(Allocator("even", lambda p, t: (even(p), False), cut_terms=True, even_split=True))
register(Allocator("sky-heuristic", lambda p, t: (sky_heuristic(p), False)))
register(Allocator("sky-mip", lambda p, t: sky_mip(p, t)))
register(Allocator("optimal", lambda p, t: (optimal(p), True), cut_terms=True))


def allocate(name: str, problem: Problem, time_limit_s: float = MIP_TIME_LIMIT_S) -> Allocation:
    """Run allocator `name` on `problem`; AllocationError (one line) when none fits."""
    entry = get(name)
    if not problem.uniform and not entry.cut_terms:
        raise AllocationError(f"allocation {name}: models neither cut-dependent communication nor per-device "
                              "block memory (use optimal)")
    problem.check()
    t0 = time.perf_counter()
    counts, proven = entry.solve(problem, time_limit_s)
    solve = time.perf_counter() - t0
    over = np.flatnonzero(problem.stage_memory(counts) > problem.memory * (1 + 1e-12))
    if over.size:
        i = int(over[0])
        raise AllocationError(f"allocation {name}: {counts[i]} blocks need "
                              f"{problem.stage_memory(counts)[i] / 2**30:.2f} GiB on {problem.name(i)}, "
                              f"which has {problem.memory[i] / 2**30:.2f} GiB")
    return Allocation(name, tuple(int(c) for c in counts), tuple(float(s) for s in problem.stage_seconds(counts)),
                      solve, proven)
