"""The lower bound's reads of links held as classes (harness/scenario/class_links.py), without N x N matrices.

The bound (harness/scheduler/bound.py) reads each device's row sorted, the components of the links below a
threshold and capped sums over them: on classes every device of a class has the same row (each other class's
value, as many times as it has devices, and its own class's one time fewer), so those are computed per class
and spread to devices (arrays of N, never N x N).
"""
from __future__ import annotations

import numpy as np

from ..scenario.class_links import ClassLinks


def cheapest(links: ClassLinks, k: int) -> np.ndarray:
    """Per device: the sum of its k smallest off-diagonal entries (bound._cheapest on classes)."""
    per_class = np.zeros(len(links.values))
    for c, entries in enumerate(links.row_entries()):
        left, total = k, 0.0
        for value, _, count in entries:
            take = min(left, count)
            total, left = total + take * value, left - take
        per_class[c] = total if left == 0 else np.inf
    return per_class[links.device_class]


def thresholds(links: ClassLinks):
    """bound._thresholds on classes: (components of the links below v, v) at every value v that joins two
    of them. A class's devices stay apart until its own link, or a link to another class, joins them all."""
    V, s = links.values, links.sizes
    C = len(V)
    parent = np.arange(C)
    joined = s <= 1  # a class of one device is one component from the start

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    pairs = [(float(V[a, b]), a, b) for a in range(C) for b in range(a, C)
             if s[a] and s[b] and (a != b or s[a] > 1)]
    pairs.sort()
    k = 0
    while k < len(pairs):
        v = pairs[k][0]
        same = [p for p in pairs[k:] if p[0] == v]
        k += len(same)
        if all(joined[a] and joined[b] and find(a) == find(b) for _, a, b in same):
            continue  # every link of this value is inside a component already
        yield _components(links, parent, joined, find), v
        for _, a, b in same:
            joined[a] = joined[b] = True
            parent[find(a)] = find(b)


def _components(links: ClassLinks, parent, joined, find) -> np.ndarray:
    """Component label (0..K-1, in order of first device) of every device: a joined class's devices are in
    their union's component, an unjoined class's each in its own."""
    cls = links.device_class
    root = np.array([find(c) for c in range(len(links.values))])
    key = np.where(joined[cls], root[cls], len(links.values) + np.arange(len(cls)))
    return np.unique(key, return_inverse=True)[1]


class ClassRanked:
    """bound._Ranked on classes: capped sums per device from each class's sorted row."""

    def __init__(self, links: ClassLinks, comp: np.ndarray):
        self.links, self.comp = links, comp
        first = np.unique(links.device_class, return_index=True)[1]
        self.entries = links.row_entries()
        cls = links.device_class
        # a class in one component (joined), or -1: a component per device (self.single: one of them)
        self.class_comp = np.full(len(links.values), -1)
        self.single = np.full(len(links.values), -1)
        for c, d in zip(np.unique(cls), first):
            self.single[c] = comp[d]
            if (comp[cls == c] == comp[d]).all():
                self.class_comp[c] = comp[d]

    def capped_sums(self, caps: np.ndarray, k: int) -> np.ndarray:
        """Per device: its k cheapest dp links when its group holds at most caps[X] devices of each component
        X, itself among its own (the greedy choice on a partition matroid, as bound._Ranked)."""
        per_class = np.full(len(self.links.values), np.inf)
        for c, entries in enumerate(self.entries):
            if not self.links.sizes[c]:
                continue
            own = self.class_comp[c]
            quota: dict[int, int] = {}
            left, total = k, 0.0
            for value, other, count in entries:
                if left == 0:
                    break
                X = self.class_comp[other]
                if X < 0:  # each device its own component: at most caps[it] of each, itself not among them
                    take = count if caps[self.single[other]] >= 1 else 0
                else:
                    q = quota.setdefault(int(X), int(caps[X]) - (1 if X == own else 0))
                    take = max(0, min(count, q))
                    quota[int(X)] = q - take
                take = min(take, left)
                total, left = total + take * value, left - take
            per_class[c] = total if left == 0 else np.inf
        return per_class[self.links.device_class]
