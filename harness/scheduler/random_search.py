"""`random`: the best of `budget` uniformly random balanced partitions (the paper's baseline)."""
from __future__ import annotations

from .registry import register
from .search import BudgetExhausted, Evaluator, random_labels


@register("random")
def random_search(model, rng, budget, progress=None):
    ev = Evaluator(model, budget, progress)
    try:
        while True:
            ev(random_labels(rng, model.d_pp, model.d_dp))
    except BudgetExhausted:
        pass
    return ev.result()
