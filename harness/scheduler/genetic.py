"""Hybrid genetic algorithm (paper section 3.4), with two local searches.

`ga`    : the paper's local search. Within groups C_j and C_j' take the fastest link
          (d1-d2, d1'-d2'), form the four swaps d1<->d1', d1<->d2', d2<->d1', d2<->d2' and
          rank them by the paper's gain
              (1/|C_j'|) sum_{d'' in C_j'} w(d, d'') - w(d, partner(d))
            + (1/|C_j|)  sum_{d'' in C_j}  w(d', d'') - w(d', partner(d'))
          with w the pipeline link cost 2(alpha + c_pp/beta). Its circular version moves
          fastest-link devices around a cycle of three groups (C_a -> C_b -> C_c -> C_a).
`ga-kl` : the same GA with Kernighan-Lin passes between two groups on the data-parallel
          link costs (the textbook graph-partitioning local search the paper compares to).
`ga-hetero`: the same GA on the modelled iteration time of each candidate with its optimal
          layer allocation (harness/scheduler/iteration_cost.py), not communication alone, warm-started by
          `ga` on COMM-COST for 70 % of the budget (communication dominates the time on slow links, and
          a search on the sum alone finds the communication optimum less reliably). Its local search
          alternates the paper's move with a speed move: a group's slowest device changes places
          with a faster device whose links are most alike (the links cannot tell them apart,
          compute can), preferring one whose group already has devices as slow (the most first),
          so that slow devices gather in few stages and the others run at faster devices' pace.

GA (after Bui & Moon): a population of random partitions; two random parents; the
child keeps whole groups of one parent and takes the other's labels elsewhere (after
aligning the parents' group labels by overlap), is rebalanced and mutated by one
random swap at times (a random immigrant replaces a child that copies a member);
local search from the child; the child replaces the worst member when better and new.
After STAGNATION candidates without a new best, all but the best member are re-seeded. Every full COMM-COST evaluation
costs one candidate of the budget.

`ga` (and `ga-hetero`'s warm start) first evaluates up to SEEDS layouts that the lower bound's runs describe
(harness/scheduler/bound.py: at a link threshold, s groups holding equal shares of every cluster of fast links)
and starts from the best half a population of them beside random members; the paper's GA starts from random
partitions only. Seeding is what finds case 2's best layout (each four-GPU node spread over four consecutive
stages, one device per stage): a pipeline edge is as slow as its slowest matched pair, so COMM-COST falls only
when all eight pairs of an edge are inside nodes at once, and every swap on the way there leaves it where it
was; the paper's swaps cross that plateau by the luck of the seed, and to three fast edges in a row not at all.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from .bound import run_layouts
from ..scenario.class_links import ClassLinks
from .registry import register
from .search import BudgetExhausted, Evaluator, random_labels

POPULATION = 8
PATIENCE = 24  # local search stops after this many rejected moves in a row
MUTATION = 0.5  # chance of one random swap in a child
STAGNATION = 1000  # candidates without a new best before the population is re-seeded
EXTRA_SWAPS = 3  # random swaps tried after the two fastest-link swaps with the best gain
SAMPLE_SWAPS_FROM = 1 << 14  # pairs of two groups beyond which those swaps are drawn, not listed
SEEDS = 16  # ga: layouts of the lower bound's runs (harness/scheduler/bound.py) evaluated first
WARM_START = 0.7  # ga-hetero: share of the budget spent by `ga` on COMM-COST before the iteration time


@register("ga")
def ga(model, rng, budget, progress=None):
    return _genetic(model, rng, budget, progress, _paper_move, seeds=run_layouts(model, SEEDS))


@register("ga-kl")
def ga_kl(model, rng, budget, progress=None):
    return _genetic(model, rng, budget, progress, _kl_move)


@register("ga-hetero", compute_aware=True)
def ga_hetero(model, rng, budget, progress=None):
    """WARM_START of the budget runs `ga` on COMM-COST; the rest goes on from its population on the
    modelled iteration time. The trace holds the second part only (its best iteration seconds)."""
    first = int(budget * WARM_START)
    if first < POPULATION or budget - first < POPULATION:
        return _genetic(model, rng, budget, progress, _hetero_move)
    warm = []
    _genetic(model.comm, rng, first, progress and (lambda n, best: progress(n, float("nan"))), _paper_move, warm,
             seeds=run_layouts(model.comm, SEEDS))
    second = _genetic(model, rng, budget - first, progress and (lambda n, best: progress(first + n, best)),
                      _hetero_move, warm)
    second.trace = [(first + n, c) for n, c in second.trace]
    return second


def _genetic(model, rng, budget, progress, move, population: list | None = None, seeds=()):
    """The GA; `population`: members to start from (else random), and on return the final members;
    `seeds`: layouts evaluated first, the best half a population of them start beside random ones."""
    ev = Evaluator(model, budget, progress)
    d_pp, d_dp = model.d_pp, model.d_dp
    pop: list[np.ndarray] = population if population is not None else []
    start = list(pop)
    pop.clear()
    costs: list[tuple[float, float]] = []
    try:
        if seeds:
            scored = sorted(((ev(s), k) for k, s in enumerate(seeds)), key=lambda t: t[0])
            start = [seeds[k] for _, k in scored[:POPULATION // 2]]
        for k in range(min(POPULATION, budget)):
            labels = start[k] if k < len(start) else random_labels(rng, d_pp, d_dp)
            pop.append(labels)
            costs.append(ev(labels))
        if start:  # a warm start: first improve its best member by local search on this objective
            k = min(range(len(costs)), key=costs.__getitem__)
            pop[k], costs[k] = _local_search(model, ev, pop[k], costs[k], rng, move)
        if len(pop) < 2:  # a budget below two members: nothing to cross, the best of what was drawn
            return ev.result()
        last_best = (ev.evaluated, ev.best_score)
        while True:
            if ev.best_score < last_best[1]:
                last_best = (ev.evaluated, ev.best_score)
            elif ev.evaluated - last_best[0] > STAGNATION:
                # Converged: keep the best member, re-seed the rest at random.
                keep = min(range(len(costs)), key=costs.__getitem__)
                for k in range(len(pop)):
                    if k != keep:
                        pop[k] = random_labels(rng, d_pp, d_dp)
                        costs[k] = ev(pop[k])
                last_best = (ev.evaluated, ev.best_score)
            i, j = rng.choice(len(pop), 2, replace=False)
            child = _crossover(pop[i], pop[j], d_pp, d_dp, rng)
            if any(np.array_equal(child, p) for p in pop):
                child = random_labels(rng, d_pp, d_dp)  # an immigrant instead of a copy keeps diversity
            elif rng.random() < MUTATION:
                child = _random_swap(child, rng, d_pp)
            cost = ev(child)
            child, cost = _local_search(model, ev, child, cost, rng, move)
            worst = max(range(len(costs)), key=costs.__getitem__)
            if cost < costs[worst] and not any(np.array_equal(child, p) for p in pop):
                pop[worst], costs[worst] = child, cost
    except BudgetExhausted:
        pass
    return ev.result()


def _crossover(p1, p2, d_pp, d_dp, rng):
    """Group-wise crossover: after relabelling p2's groups to best overlap p1's, the child keeps
    a random half of p1's groups whole and takes p2's labels elsewhere, then is rebalanced."""
    overlap = np.zeros((d_pp, d_pp))
    np.add.at(overlap, (p2, p1), 1)
    _, to = linear_sum_assignment(-overlap)
    p2 = to[p2]
    keep = rng.random(d_pp) < 0.5
    child = np.where(keep[p1], p1, p2)
    counts = np.bincount(child, minlength=d_pp)
    over = [g for g in range(d_pp) for _ in range(max(0, counts[g] - d_dp))]
    if over:
        under = [g for g in range(d_pp) for _ in range(max(0, d_dp - counts[g]))]
        rng.shuffle(under)
        for g, target in zip(over, under):
            members = np.flatnonzero(child == g)
            child[rng.choice(members)] = target
    return child


def _local_search(model, ev, labels, cost, rng, move):
    rejected = 0
    while rejected < PATIENCE:
        for candidate in move(model, labels, rng):
            c = ev(candidate)
            if c < cost:
                labels, cost, rejected = candidate, c, 0
                break
        else:
            rejected += 1
    return labels, cost


def _fastest_link(w, members, rng):
    """Endpoints of the cheapest link inside a group; ties (a homogeneous region) broken at random."""
    if isinstance(w, ClassLinks):
        return _fastest_class_link(w, members, rng)
    sub = w[np.ix_(members, members)] + np.diag(np.full(len(members), np.inf))
    ties = np.argwhere(sub <= sub.min() * (1 + 1e-9))
    a, b = ties[rng.integers(len(ties))]
    return members[a], members[b]


def _fastest_class_link(w: ClassLinks, members, rng):
    """_fastest_link on classes: the cheapest class pair the group holds (a class with itself where it
    holds two), ties drawn by their number of device pairs, then a device of each class at random."""
    held = np.bincount(w.device_class[members], minlength=len(w.values))
    pairs = np.outer(held, held) - np.diag(held)  # ordered device pairs of each class pair
    cost = np.where(pairs > 0, w.values, np.inf)
    ties = np.flatnonzero(cost.ravel() <= cost.min() * (1 + 1e-9))
    c, c2 = divmod(int(rng.choice(ties, p=pairs.ravel()[ties] / pairs.ravel()[ties].sum())), len(w.values))
    a = rng.choice(members[w.device_class[members] == c])
    others = members[(w.device_class[members] == c2) & (members != a)]
    return a, rng.choice(others)


def _paper_move(model, labels, rng):
    """One move of the paper's local search: a fastest-link swap, or its circular version.

    Returns candidate label arrays, most promising first (by the paper's gain)."""
    w = model.pp_link
    d_pp = model.d_pp
    if model.d_dp < 2:
        return [_random_swap(labels, rng, d_pp)]
    if d_pp >= 3 and rng.random() < 0.5:
        groups = rng.choice(d_pp, 3, replace=False)
        out = labels.copy()
        picks = []
        for k, g in enumerate(groups):
            dest = groups[(k + 1) % 3]
            members = np.flatnonzero(labels == g)
            d1, d2 = _fastest_link(w, members, rng)
            dest_members = np.flatnonzero(labels == dest)
            # move the end of the fast link whose expected cost into the destination is worst
            gain = [w[d, dest_members].mean() - w[d, p] for d, p in ((d1, d2), (d2, d1))]
            picks.append((d1, d2)[int(np.argmax(gain))])
        for k, d in enumerate(picks):
            out[d] = groups[(k + 1) % 3]
        return [out]
    j, jj = rng.choice(d_pp, 2, replace=False)
    cj, cjj = np.flatnonzero(labels == j), np.flatnonzero(labels == jj)
    d1, d2 = _fastest_link(w, cj, rng)
    e1, e2 = _fastest_link(w, cjj, rng)
    scored = []
    for d, dp_ in ((d1, d2), (d2, d1)):
        for e, ep in ((e1, e2), (e2, e1)):
            gain = w[d, cjj].mean() - w[d, dp_] + w[e, cj].mean() - w[e, ep]
            scored.append((gain, d, e))
    scored.sort(key=lambda t: -t[0])
    pairs = [(d, e) for _, d, e in scored[:2]]
    # Then a few other swaps between the same two groups: on fully heterogeneous links the
    # improving swap often involves neither end of the fastest link.
    if len(cj) * len(cjj) <= SAMPLE_SWAPS_FROM:
        others = [(d, e) for d in cj for e in cjj if (d, e) not in pairs]
        pairs += [others[k] for k in rng.permutation(len(others))[:EXTRA_SWAPS]]
    else:  # drawn without listing every pair (1.6 M of them between two groups of 1,280)
        for d, e in zip(rng.choice(cj, 2 * EXTRA_SWAPS), rng.choice(cjj, 2 * EXTRA_SWAPS)):
            if len(pairs) < 2 + EXTRA_SWAPS and (d, e) not in pairs:
                pairs.append((d, e))
    out = []
    for d, e in pairs:
        cand = labels.copy()
        cand[d], cand[e] = jj, j
        out.append(cand)
    return out


def _hetero_move(model, labels, rng):
    """The paper's move or, half the time, the speed move (module docstring)."""
    return _speed_move(model, labels, rng) if rng.random() < 0.5 else _paper_move(model, labels, rng)


def _speed_move(model, labels, rng):
    slow = model.seconds_per_flop  # per device: larger is slower
    j = rng.integers(model.d_pp)
    members = np.flatnonzero(labels == j)
    worst = members[slow[members] >= slow[members].max() * (1 - 1e-9)]
    d = rng.choice(worst)
    faster = np.flatnonzero((slow < slow[d] * (1 - 1e-9)) & (labels != j))
    if not faster.size:  # no faster device elsewhere (identical devices): the paper's move
        return _paper_move(model, labels, rng)
    as_slow = np.bincount(labels, weights=slow >= slow[d] * (1 - 1e-9), minlength=model.d_pp)[labels[faster]]
    new_straggler = as_slow == 0  # e's group would slow down
    w = model.pp_link
    # how far e's links are from d's
    unlike = w.row_distance(faster, d) if isinstance(w, ClassLinks) else np.abs(w[faster] - w[d]).sum(1)
    # no new straggler first, then the likest links, then the group with the most devices as slow as d
    order = np.lexsort((rng.random(faster.size), -as_slow, unlike, new_straggler))
    out = []
    for e in faster[order[:2]]:
        cand = labels.copy()
        cand[d], cand[e] = labels[e], j
        out.append(cand)
    return out


def _kl_move(model, labels, rng):
    """One Kernighan-Lin pass between two random groups on data-parallel link costs.

    Swaps the best unlocked pair repeatedly, then keeps the prefix of swaps with the
    largest total reduction of intra-group cost; no candidate when no prefix helps.
    """
    c = model.dp_link
    j, jj = rng.choice(model.d_pp, 2, replace=False)
    A, B = np.flatnonzero(labels == j), np.flatnonzero(labels == jj)
    n = len(A)
    free_a, free_b = np.ones(n, bool), np.ones(n, bool)
    swaps, gains = [], []
    for _ in range(n):
        # reduction of intra-group cost if A[x] and B[y] change sides
        d_a = c[np.ix_(A, A)].sum(1) - c[np.ix_(A, B)].sum(1)
        d_b = c[np.ix_(B, B)].sum(1) - c[np.ix_(B, A)].sum(1)
        g = d_a[:, None] + d_b[None, :] + 2 * c[np.ix_(A, B)]
        g[~free_a, :] = -np.inf
        g[:, ~free_b] = -np.inf
        x, y = np.unravel_index(np.argmax(g), g.shape)
        gains.append(g[x, y])
        A[x], B[y] = B[y], A[x]
        free_a[x] = free_b[y] = False
        swaps.append((A[x], B[y]))
    prefix = np.cumsum(gains)
    k = int(np.argmax(prefix))
    if prefix[k] <= 1e-12:
        return []
    out = labels.copy()
    for now_in_a, now_in_b in swaps[: k + 1]:
        out[now_in_a], out[now_in_b] = j, jj
    return [out]


def _random_swap(labels, rng, d_pp):
    j, jj = rng.choice(d_pp, 2, replace=False)
    a = rng.choice(np.flatnonzero(labels == j))
    b = rng.choice(np.flatnonzero(labels == jj))
    out = labels.copy()
    out[a], out[b] = jj, j
    return out
