"""Grouping the branches of a base into D groups of similar size (OWL, Sec. 4.3, Problem 2).

`greedy_groups` is Algorithm 1: branches in descending size, each into the group that is smallest
so far (LPT; Theorem 2 bounds its largest group by (3/2 - 1/(2D)) x the optimum's).
`exact_groups` is the optimum of the same problem (the smallest possible largest group), by
depth-first search with the usual pruning, for the few branches of a base. `random_groups` is the
grouping of OWL-B (the ablation without Algorithm 1).
"""
from __future__ import annotations

from .federation import FLError

EXACT_LIMIT = 16  # branches; beyond, the search is not attempted


def bound(groups: int) -> float:
    """Theorem 2's approximation ratio for D groups."""
    return 1.5 - 1.0 / (2 * groups)


def _check(sizes, groups: int) -> None:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise FLError(f"groups: must be an integer >= 1 (got {groups!r})")
    if groups > len(sizes):
        raise FLError(f"groups: {groups} groups of {len(sizes)} branches would leave a group empty")
    if any(s < 0 for s in sizes):
        raise FLError(f"branch sizes must be >= 0 (got {list(sizes)})")


def greedy_groups(sizes, groups: int) -> list[list[int]]:
    """Algorithm 1: branch indices per group; groups in the order they were opened (largest first)."""
    _check(sizes, groups)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    out: list[list[int]] = [[] for _ in range(groups)]
    load = [0.0] * groups
    for i in order:
        g = min(range(groups), key=lambda k: (load[k], k))
        out[g].append(i)
        load[g] += sizes[i]
    return out


def random_groups(sizes, groups: int, rng) -> list[list[int]]:
    """A grouping that ignores the sizes (OWL-B's, Sec. 6.4): the branches shuffled, the first `groups` opening
    one group each, every other one into a group drawn at random (`rng`: a numpy Generator)."""
    _check(sizes, groups)
    order = [int(i) for i in rng.permutation(len(sizes))]
    out: list[list[int]] = [[i] for i in order[:groups]]
    for i in order[groups:]:
        out[int(rng.integers(groups))].append(i)
    return out


def largest(sizes, grouping: list[list[int]]) -> float:
    return max(sum(sizes[i] for i in g) for g in grouping)


def exact_groups(sizes, groups: int) -> list[list[int]]:
    """A grouping whose largest group is as small as possible (no group left empty)."""
    _check(sizes, groups)
    if len(sizes) > EXACT_LIMIT:
        raise FLError(f"exact grouping of {len(sizes)} branches: more than {EXACT_LIMIT}, not attempted")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    best = greedy_groups(sizes, groups)
    best_max = largest(sizes, best)
    lower = max(sum(sizes) / groups, max(sizes, default=0))
    cur: list[list[int]] = [[] for _ in range(groups)]
    load = [0.0] * groups

    def search(k: int) -> bool:
        nonlocal best, best_max
        left = len(order) - k
        if sum(1 for g in cur if not g) > left:
            return False
        if k == len(order):
            m = max(load)
            if m < best_max - 1e-12:
                best, best_max = [list(g) for g in cur], m
            return best_max <= lower * (1 + 1e-12)
        i = order[k]
        tried = set()
        for g in range(groups):
            if load[g] in tried:  # groups of equal load are interchangeable
                continue
            tried.add(load[g])
            if load[g] + sizes[i] >= best_max - 1e-12:
                continue
            cur[g].append(i)
            load[g] += sizes[i]
            done = search(k + 1)
            load[g] -= sizes[i]
            cur[g].pop()
            if done:
                return True
        return False

    if best_max > lower * (1 + 1e-12):
        search(0)
    return best


def partitions(n: int, max_groups: int):
    """Every partition of range(n) into at most max_groups non-empty groups (restricted growth strings)."""
    def rec(i: int, groups: list[list[int]]):
        if i == n:
            yield [list(g) for g in groups]
            return
        for g in groups:
            g.append(i)
            yield from rec(i + 1, groups)
            g.pop()
        if len(groups) < max_groups:
            groups.append([i])
            yield from rec(i + 1, groups)
            groups.pop()
    yield from rec(0, [])


def bell(n: int, max_groups: int) -> int:
    """How many partitions `partitions(n, max_groups)` yields (Stirling numbers of the second kind summed)."""
    s = [[0] * (max_groups + 1) for _ in range(n + 1)]
    s[0][0] = 1
    for i in range(1, n + 1):
        for k in range(1, max_groups + 1):
            s[i][k] = k * s[i - 1][k] + s[i - 1][k - 1]
    return sum(s[n][1:]) if n else 1

