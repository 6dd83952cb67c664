"""Lower bounds: how far from optimal a schedule may be.

COMM-COST = DATAP-COST + PIPELINEP-COST (eqs. 1-4, harness/scheduler/cost.py), bounded from below over
every balanced partition, first term by term:

DATAP-COST: every device d is in some group of D_DP devices, and that group's cost is at least d's
  summed links to its D_DP - 1 cheapest partners:  DATAP >= max_d (sum of the D_DP - 1 smallest
  dp_link[d, .]).
PIPELINEP-COST: the open-loop path visits every group and each edge's bottleneck matching pairs every
  device of both its groups with a device elsewhere, so an edge costs at least n(d) = min pp_link[d, .]
  of every device d of its two groups. Root the path at one end: every other group v has its own edge
  to the group before it, costing at least m(v) = max_{d in v} n(d); so PIPELINEP >= the sum of m(v)
  over all groups but one. Over every partition, the k-th largest group maximum is at least the
  (k D_DP + 1)-th largest n(d) (k D_DP + 1 devices do not fit in k groups), and the sum of the
  D_PP - 1 largest is what remains when the smallest is left out:
      PIPELINEP >= sum_{k=0}^{D_PP-2} n_sorted_desc[k D_DP].

Alone, each term may take its own best groups, and the two pull apart: cheap gradients want a node in
one group, cheap activations want it spread over stages (case 1). Jointly, at every link threshold T
(`_joint`): an edge below T matches devices within the components of the links below T, so the stages
of a run joined by such edges hold equal shares of every component; the fewer edges above T, the longer
the runs and the more spread (and dearer in DATAP-COST) every group. The bound is the largest over T of
the least over the ways the path may fall into runs. It is the optimum where the links cluster and
every cluster can be spread or kept as the bound assumes: uniform links, and the paper's cases 1-4.

The modelled iteration time of `ga-hetero` (harness/scheduler/iteration_cost.py) adds compute to
the same communication terms, each data-parallel group with its own stage's gradients. Compute: the
k-th fastest stage runs at most at the speed of the ((k+1) D_DP)-th fastest device (its slowest
device, and k+1 groups hold (k+1) D_DP devices), so with those speeds the least possible slowest
stage over whole-block allocations bounds max_j t_j, and all blocks on the fastest device bounds
sum_j t_j (plus the LM head on the device that runs it fastest). Its communication: the joint bound
with every stage's gradients at their least (one block; the first also the embedding, the last the
head), or the terms alone with the largest stage's (at least the mean of all parameters) on some group.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from . import bound_classes
from ..scenario.class_links import ClassLinks
from .cost import CostModel

MAX_THRESHOLDS = 48  # link thresholds the joint bound tries (all of them up to this many)
EXACT_RUNS_MAX = 16  # D_PP up to which the joint bound tries every way the path falls into runs


@dataclass(frozen=True)
class Bound:
    """Lower bounds (seconds) of a schedule's cost and its parts; `gap` of a cost above it."""

    total: float
    dp: float
    pp: float
    compute: float = 0.0

    def gap(self, cost: float) -> float:
        """(cost - bound) / cost: the most a better layout could save, as a share of this one's cost."""
        return 0.0 if cost <= 0 else max(0.0, (cost - self.total) / cost)

    def to_json(self) -> dict:
        return {"total": self.total, "dp": self.dp, "pp": self.pp, "compute": self.compute}


def _cheapest(links, k: int) -> np.ndarray:
    """Per row: the sum of its k smallest off-diagonal entries."""
    if isinstance(links, ClassLinks):
        return bound_classes.cheapest(links, k)
    off = links + np.diag(np.full(len(links), np.inf))
    return np.sort(off, axis=1)[:, :k].sum(1) if k else np.zeros(len(links))


def datap_bound(dp_link: np.ndarray, d_dp: int) -> float:
    return float(_cheapest(dp_link, d_dp - 1).max())


def pipelinep_bound(pp_link: np.ndarray, d_pp: int, d_dp: int) -> float:
    return float(_rooted_terms(pp_link, d_pp, d_dp).sum())


def comm_cost_bound(model: CostModel) -> Bound:
    """A lower bound on the COMM-COST of every partition of `model`'s devices (module docstring): the
    larger of the separate terms' and of every threshold's joint bound."""
    best = _separate(model)
    for _, runs in _threshold_runs(model):  # runs of one stage each always fit: never empty
        joint = min(runs, key=lambda r: r[0].total)[0]
        if joint.total > best.total:
            best = joint
    return best


def run_layouts(model: CostModel, limit: int) -> list[np.ndarray]:
    """Up to `limit` partitions (group labels) the joint bound's runs describe, lowest bound first: at a
    threshold, runs of groups (longest first, each from the devices the longer ones left) that hold equal
    shares of every component, as many of the largest shares as fit, each component's devices in
    consecutive blocks. On links clustered in nodes or regions this is the layout that meets the bound
    when one does; a search seeded with them need not find, one swap at a time, a layout whose cost falls
    only once all its groups are in place (case 2: every four-GPU node spread over four stages)."""
    thresholds = _threshold_runs(model)
    ranked = sorted((bound.total, k, runs) for k, (_, found) in enumerate(thresholds) for bound, runs in found)
    out, seen = [], set()
    for _, k, runs in ranked:
        if len(out) >= limit:
            break
        labels = _run_layout(thresholds[k][0], runs, model.d_dp)
        if labels is None:
            continue
        key = frozenset(frozenset(np.flatnonzero(labels == g)) for g in range(model.d_pp))
        if key not in seen:
            seen.add(key)
            out.append(labels)
    return out


def _run_layout(comp: np.ndarray, runs: tuple[int, ...], d_dp: int) -> np.ndarray | None:
    labels = np.full(len(comp), -1)
    group = 0
    for s in runs:
        free = labels < 0
        caps = np.bincount(comp[free], minlength=comp.max() + 1) // s
        if caps.sum() < d_dp:
            return None
        take = np.zeros_like(caps)
        left = d_dp
        for c in np.argsort(-caps, kind="stable"):
            take[c] = min(caps[c], left)
            left -= take[c]
        for c in np.flatnonzero(take):
            members = np.flatnonzero(free & (comp == c))
            for g in range(s):
                labels[members[g * take[c]:(g + 1) * take[c]]] = group + g
        group += s
    return labels


def _separate(model: CostModel) -> Bound:
    dp = datap_bound(model.dp_link, model.d_dp)
    pp = pipelinep_bound(model.pp_link, model.d_pp, model.d_dp)
    return Bound(dp + pp, dp, pp)


_ANALYSED: "weakref.WeakKeyDictionary[CostModel, list]" = weakref.WeakKeyDictionary()


def _threshold_runs(model: CostModel) -> list[tuple[np.ndarray, list[tuple[Bound, tuple[int, ...]]]]]:
    """Per threshold: (its components, [(the joint bound, the runs it assumes)] over the feasible runs);
    once per CostModel (a schedule's bound and `ga`'s seed layouts read the same)."""
    if model not in _ANALYSED:
        _ANALYSED[model] = _analyse(model)
    return _ANALYSED[model]


def _analyse(model: CostModel) -> list:
    d_pp, d_dp = model.d_pp, model.d_dp
    if d_pp < 2 or d_dp < 2:
        return []
    dp = datap_bound(model.dp_link, d_dp)
    rooted = _rooted_terms(model.pp_link, d_pp, d_dp)
    if isinstance(model.dp_link, ClassLinks):  # at scale: on classes, no device x device matrix
        thresholds = list(bound_classes.thresholds(model.pp_link))
        ranked = lambda comp: bound_classes.ClassRanked(model.dp_link, comp)  # noqa: E731
    else:
        order = np.argsort(model.dp_link + np.diag(np.full(len(model.dp_link), np.inf)), axis=1)
        thresholds = list(_thresholds(model.pp_link))
        ranked = lambda comp: _Ranked(model.dp_link, order, comp)  # noqa: E731
    if len(thresholds) > MAX_THRESHOLDS:  # any of them bounds; evenly spaced ones keep large instances quick
        thresholds = [thresholds[k] for k in np.linspace(0, len(thresholds) - 1, MAX_THRESHOLDS).astype(int)]
    return [(comp, _joint(ranked(comp), comp, above, rooted, dp, d_pp, d_dp)) for comp, above in thresholds]


def _rooted_terms(pp_link: np.ndarray, d_pp: int, d_dp: int) -> np.ndarray:
    """The D_PP - 1 edge bounds of the rooted path, largest first (module docstring)."""
    if d_pp < 2:
        return np.zeros(0)
    nearest = np.sort(_cheapest(pp_link, 1))[::-1]
    return nearest[np.arange(d_pp - 1) * d_dp]


def _thresholds(pp_link: np.ndarray):
    """(components of the links below v, v) at every link value v that joins two of them (Kruskal): between
    such values the components stay, and an edge above the threshold costs at least v."""
    n = len(pp_link)
    parent = np.arange(n)

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    iu = np.triu_indices(n, 1)
    values = pp_link[iu]
    order = np.argsort(values, kind="stable")
    ascending = values[order]
    k = 0
    while k < len(order):
        v = ascending[k]
        end = int(np.searchsorted(ascending, v, side="right"))
        same, k = order[k:end], end  # every link of this value (ties: one threshold)
        if all(find(iu[0][x]) == find(iu[1][x]) for x in same):
            continue
        roots = np.array([find(x) for x in range(n)])
        yield np.unique(roots, return_inverse=True)[1], float(v)
        for x in same:
            a, b = find(iu[0][x]), find(iu[1][x])
            parent[a] = b


class _Ranked:
    """Each row's links cheapest first with, per entry, its component and how many cheaper entries of the
    row share that component: what every capped sum of one threshold reads."""

    def __init__(self, dp_link, order, comp):
        n = len(dp_link)
        self.comp_sorted = comp[order]  # (n, n)
        by_comp = np.argsort(self.comp_sorted, axis=1, kind="stable")
        grouped = np.take_along_axis(self.comp_sorted, by_comp, 1)
        pos = np.broadcast_to(np.arange(n), (n, n))
        starts = np.maximum.accumulate(np.where(np.diff(grouped, axis=1, prepend=-1) != 0, pos, 0), axis=1)
        self.rank = np.empty((n, n), dtype=int)
        np.put_along_axis(self.rank, by_comp, pos - starts, 1)
        self.own = self.comp_sorted == comp[:, None]
        self.other = order != np.arange(n)[:, None]
        self.links = np.take_along_axis(dp_link, order, 1)

    def capped_sums(self, caps, k):
        """Per device d: its k cheapest dp links to others when its group holds at most caps[C] devices of
        each component C (d itself among its own): a partition matroid, so the greedy choice is optimal."""
        allowed = (self.rank < caps[self.comp_sorted] - self.own) & self.other
        taken = allowed & (allowed.cumsum(1) <= k)
        sums = np.where(taken, self.links, 0.0).sum(1)
        return np.where(taken.sum(1) == k, sums, np.inf)


def _joint(ranked, comp, above, rooted, dp_alone, d_pp, d_dp) -> list[tuple[Bound, tuple[int, ...]]]:
    """The bounds at one threshold T (the links below `above`), per way the path may fall into runs: with
    j pipeline edges above T (each at least `above`), the path is j + 1 runs of groups joined by edges
    below T; matched pairs of such an edge lie in one component of the links below T, so the groups of a
    run hold the same number of devices of every component, at most |C| / s of C for a run of s groups.
    With the runs s_1 >= s_2 >= ..., the k longest hold (s_1 + ... + s_k) D_DP devices, each in a run of
    at least s_k groups, so DATAP-COST is at least the ((s_1 + ... + s_k) D_DP)-th smallest capped sum at
    s_k, for every k. The threshold's bound is the least over the runs (every partition of D_PP)."""
    sizes = np.bincount(comp)
    sums = {}
    out = []
    exact = d_pp <= EXACT_RUNS_MAX
    # beyond, per number of runs the most even split: its longest run alone bounds every way with as many runs
    ways = _integer_partitions(d_pp) if exact else (
        tuple(d_pp // (j + 1) + (k < d_pp % (j + 1)) for k in range(j + 1)) for j in range(d_pp))
    for runs in ways:
        dp, held = dp_alone, 0
        for s in runs if exact else runs[:1]:
            if s not in sums:
                sums[s] = np.sort(ranked.capped_sums(sizes // s, d_dp - 1))
            held += s
            dp = max(dp, float(sums[s][held * d_dp - 1]))
        if not np.isfinite(dp):
            continue  # some run cannot hold equal shares of every component
        j = len(runs) - 1
        lifted = rooted.copy()
        lifted[:j] = np.maximum(lifted[:j], above)  # the least rise: the edges already the dearest
        pp = float(lifted.sum())
        out.append((Bound(dp + pp, dp, pp), runs))
    return out


def _integer_partitions(n: int, most: int | None = None):
    """Every way to write n as a sum of parts, largest first (22 for n = 8, 231 for 16)."""
    most = n if most is None else most
    if n == 0:
        yield ()
        return
    for first in range(min(n, most), 0, -1):
        for rest in _integer_partitions(n - first, first):
            yield (first,) + rest


def iteration_bound(model) -> Bound:
    """A lower bound on the modelled iteration time (harness/scheduler/iteration_cost.py) of every
    partition and allocation of an IterationModel (module docstring): compute alone, plus communication
    as the larger of the joint COMM-COST bound with every stage's gradients at their least and of the
    terms alone with the largest stage's; loose where fast links and fast devices pull groups apart."""
    comm, cfg = model.comm, model.setting.cfg
    d_pp, d_dp = model.d_pp, model.d_dp
    compute = _compute_bound(model.stage_model, d_pp, d_dp, model.micro_batches)
    bpv, layers = model.bytes_per_value, cfg.layers
    whole = (layers * cfg.block_params + cfg.embedding_params + cfg.head_params) * bpv
    first = (cfg.block_params + cfg.embedding_params) * bpv
    last = (cfg.block_params + cfg.head_params) * bpv
    least = whole if d_pp == 1 else cfg.block_params * bpv if d_pp >= 3 else min(first, last)
    most = max(first, last, whole / d_pp)
    joint = comm_cost_bound(comm.with_messages(comm.c_pp_bytes, least))  # every stage >= least
    largest = comm.with_messages(comm.c_pp_bytes, most)  # some group holds the largest stage
    dp_most = float(_cheapest(largest.dp_link, d_dp - 1).min())
    pp_alone = pipelinep_bound(comm.pp_link, d_pp, d_dp)
    alone = Bound(dp_most + pp_alone, dp_most, pp_alone)
    dp, pp = (joint.dp, joint.pp) if joint.total >= alone.total else (alone.dp, alone.pp)
    return Bound(compute + dp + pp, dp, pp, compute)


def _compute_bound(sm, d_pp: int, d_dp: int, micro_batches: int) -> float:
    """sum_j t_j + (M - 1) max_j t_j at its least: every block on the fastest device and the head on the
    device fastest at it; the slowest stage the least over whole blocks with the k-th fastest stage at the
    ((k+1) D_DP)-th fastest device's speed, one stage also running the head."""
    layers, block = len(sm.block_flop), float(sm.block_flop.max())
    speed = np.sort(1.0 / sm.per_flop)[::-1][(np.arange(d_pp) + 1) * d_dp - 1]  # (stages,)
    head = float(sm.head_seconds.min())
    steps = np.arange(1, layers + 1)[:, None] * block / speed[None, :]
    times = np.unique(np.concatenate([steps.ravel(), head + steps.ravel()]))
    blocks = np.floor(times[:, None] * speed[None, :] / block * (1 + 1e-12))  # (times, stages)
    with_head = np.floor(np.maximum(times[:, None] - head, 0) * speed[None, :] / block * (1 + 1e-12))
    most = (blocks.sum(1)[:, None] - blocks + with_head).max(1)  # the best stage to run the head
    slowest = float(times[most >= layers].min())
    return float(sm.block_flop.sum() * sm.per_flop.min()) + head + (micro_batches - 1) * slowest
