"""A device x device matrix held as classes: at 10,240 devices a dense float64 link matrix is 839 MB, and
the cost model, the allocator and the simulator each hold several. Where devices of one class (a region,
or regions alike: harness/scheduler/lumped.py) share every link, the matrix is a C x C one and each
device's class. `ClassLinks` answers the indexing its readers use (`m[rows, cols]` with broadcasting index
arrays, `m[np.ix_(a, b)]`, scalars, whole rows) with the dense matrix's values, building only what is
asked for. `by_region` computes any pairwise quantity that way: on a few representative devices.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .topology import Topology


class ClassLinks:
    """values[c, c'] between devices of classes c and c' (the diagonal: two devices of one class);
    device_class[d] the class of device d. Reads like the dense (N, N) matrix with `diagonal` (a device
    with itself) on its diagonal."""

    def __init__(self, values: np.ndarray, device_class: np.ndarray, diagonal: float = 0.0):
        self.values = np.asarray(values, dtype=float)
        self.device_class = np.asarray(device_class)
        self.diagonal = float(diagonal)
        self.sizes = np.bincount(self.device_class, minlength=len(self.values))
        alone = np.flatnonzero(self.sizes < 2)  # a class of one device never meets itself: 0, not inf or nan
        if len(alone):
            self.values = self.values.copy()
            self.values[alone, alone] = 0.0

    def __len__(self) -> int:
        return len(self.device_class)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), len(self)

    def __getitem__(self, key):
        if not isinstance(key, tuple):  # whole rows
            key = (np.asarray(key)[..., None], np.arange(len(self)))
        rows, cols = (np.asarray(k) for k in key)
        cls = self.device_class
        return np.where(rows == cols, self.diagonal, self.values[cls[rows], cls[cols]])

    def group_sums(self, groups: np.ndarray) -> np.ndarray:
        """Per device of every group (rows of `groups`): its summed entries to the others of its group
        (m[G[:, :, None], G[:, None, :]].sum(-1) with a zero diagonal), from the groups' class counts."""
        G = np.asarray(groups)
        cls = self.device_class[G]
        K = np.zeros((len(G), len(self.values)))
        np.add.at(K, (np.repeat(np.arange(len(G)), G.shape[1]), cls.ravel()), 1)
        return np.take_along_axis(self.class_sums(K), cls, 1)

    def class_sums(self, K: np.ndarray) -> np.ndarray:
        """(groups, C): a device of class c's summed entries to the others of a group holding K[g] devices of
        each class (itself counted in K at its class's value, taken off)."""
        return K @ self.values.T - np.diag(self.values)[None, :]

    def row_distance(self, rows: np.ndarray, d: int) -> np.ndarray:
        """sum_e |m[r, e] - m[d, e]| for every r in `rows` (the speed move's likeness), on classes (a zero
        diagonal)."""
        V, s, cls = self.values, self.sizes, self.device_class
        cr, cd = cls[np.asarray(rows)], cls[d]
        by_class = (np.abs(V[cr] - V[cd][None, :]) * s[None, :]).sum(1)
        # e = r and e = d were counted at the class's value; their entries are 0 and m[d, r] (m[r, d])
        own = np.abs(V[cr, cr] - V[cd, cr]) + np.abs(V[cr, cd] - V[cd, cd])
        return np.where(np.asarray(rows) == d, 0.0, by_class - own + V[cd, cr] + V[cr, cd])

    def row_entries(self) -> list[list[tuple[float, int, int]]]:
        """Per class: its devices' off-diagonal row as (value, class, count), cheapest first."""
        out = []
        for c in range(len(self.values)):
            counts = self.sizes - (np.arange(len(self.values)) == c)
            out.append(sorted((float(self.values[c, k]), k, int(counts[k]))
                              for k in range(len(self.values)) if counts[k] > 0))
        return out


def representatives(topo: Topology) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(devices, first, second): the first two devices of every region (one where it has one), and per
    region the positions of its first and second among them (the second = the first where it has one)."""
    devices, first, second = [], [], []
    start = 0
    for reg in topo.regions:
        first.append(len(devices))
        devices += list(range(start, start + min(reg.devices, 2)))
        second.append(len(devices) - 1)
        start += reg.devices
    return devices, np.array(first), np.array(second)


def by_region(topo: Topology, build: Callable[[Topology], np.ndarray]) -> ClassLinks:
    """The device x device matrix `build` returns for a topology, held by region: `build` runs on the
    topology cut down to two devices of every region (one where it has one), whose pairs take every value
    of the whole (and whose largest round trip is the whole's, for TCP buffers sized by it). Exact where
    the links are the regions' (Topology.region_links); the diagonal is taken from the first device's."""
    if topo.region_links is None:
        raise ValueError(f"{topo.source}: links differ inside a region; by_region needs the regions' links")
    devices, _, _ = representatives(topo)
    return held_by_region(topo, build(topo.subset(devices)))


def held_by_region(topo: Topology, M: np.ndarray) -> ClassLinks:
    """The device x device matrix whose values on representatives(topo)'s devices are M, held by region."""
    _, first, second = representatives(topo)
    M = np.asarray(M)
    values = M[np.ix_(first, first)].copy()
    values[np.arange(len(first)), np.arange(len(first))] = M[first, second]
    return ClassLinks(values, np.asarray(topo.device_region), diagonal=float(M[0, 0]))
