"""`exhaustive`: every balanced partition, for tiny instances and tests."""
from __future__ import annotations

from itertools import combinations
from math import comb, factorial

import numpy as np

from .registry import SchedulerError, register
from .search import BudgetExhausted, Evaluator

MAX_PARTITIONS = 200_000


def count_partitions(n: int, d_pp: int) -> int:
    """Unordered partitions of n devices into d_pp groups of n/d_pp."""
    size = n // d_pp
    total, left = 1, n
    for _ in range(d_pp):
        total *= comb(left, size)
        left -= size
    return total // factorial(d_pp)


def balanced_partitions(n: int, d_pp: int):
    """Yield label arrays; the lowest unassigned device always opens the next group."""
    size = n // d_pp
    labels = np.full(n, -1)

    def rec(group):
        if group == d_pp:
            yield labels.copy()
            return
        free = np.flatnonzero(labels < 0)
        first, rest = free[0], free[1:]

        for others in combinations(rest, size - 1):
            members = (first, *others)
            labels[list(members)] = group
            yield from rec(group + 1)
            labels[list(members)] = -1

    yield from rec(0)


@register("exhaustive")
def exhaustive(model, rng, budget, progress=None):
    n = model.topo.n
    total = count_partitions(n, model.d_pp)
    if total > MAX_PARTITIONS:
        raise SchedulerError(
            f"--scheduler exhaustive: {total} partitions of {n} devices into {model.d_pp} groups "
            f"(limit {MAX_PARTITIONS}); use ga"
        )
    ev = Evaluator(model, max(budget, total), progress)
    try:
        for labels in balanced_partitions(n, model.d_pp):
            ev(labels)
    except BudgetExhausted:  # pragma: no cover - budget is raised to the total above
        pass
    return ev.result()
