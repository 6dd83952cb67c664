"""What every search shares: partitions as group labels, and a budget-charging evaluator."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import CostModel


@dataclass
class SearchResult:
    partition: np.ndarray  # (D_PP, D_DP)
    cost: float
    trace: list[tuple[int, float]] = field(default_factory=list)


class BudgetExhausted(Exception):
    pass


class Evaluator:
    """Counts candidates, keeps the best one and the trace; raises BudgetExhausted when spent.

    Calls return (COMM-COST, tie-breaker) pairs, compared lexicographically (CostModel.score)."""

    def __init__(self, model: CostModel, budget: int, progress=None):
        self.model, self.budget, self.progress = model, budget, progress
        self.evaluated = 0
        self.best_cost = np.inf
        self.best_score = (np.inf, np.inf)
        self.best_labels: np.ndarray | None = None
        self.trace: list[tuple[int, float]] = []

    def __call__(self, labels: np.ndarray) -> tuple[float, float]:
        if self.evaluated >= self.budget:
            raise BudgetExhausted
        score = self.model.score(to_partition(labels, self.model.d_pp))
        self.evaluated += 1
        if score < self.best_score:
            improved = score[0] < self.best_cost
            self.best_score, self.best_cost, self.best_labels = score, score[0], labels.copy()
            if improved:
                self.trace.append((self.evaluated, score[0]))
        if self.progress:
            self.progress(self.evaluated, self.best_cost)
        return score

    @property
    def left(self) -> int:
        return self.budget - self.evaluated

    def result(self) -> SearchResult:
        trace = list(self.trace)
        if trace and trace[-1][0] != self.evaluated:
            trace.append((self.evaluated, self.best_cost))
        return SearchResult(to_partition(self.best_labels, self.model.d_pp), float(self.best_cost), trace)


def to_partition(labels: np.ndarray, d_pp: int) -> np.ndarray:
    """Group labels (N,) -> (D_PP, D_DP) device ids, row j = C_j."""
    return np.argsort(labels, kind="stable").reshape(d_pp, -1)


def random_labels(rng: np.random.Generator, d_pp: int, d_dp: int) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(d_pp), d_dp))
