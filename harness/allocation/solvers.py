"""The allocators' algorithms, each a function of a Problem that returns blocks per device.

`even` and `optimal` (exact, dynamic programming) here; Sky Computing's heuristic and MIP in sky.py.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..compute.model import even_split
from .problem import AllocationError, Problem


# ---------------------------------------------------------------------------- even
def even(problem: Problem) -> list[int]:
    return even_split(problem.blocks, problem.devices)


# ---------------------------------------------------------------------------- the exact optimum
OPTIMAL_MAX_BYTES = 4 * 2**30  # the exact optimum's working arrays; larger problems are refused in one line


def optimal(problem: Problem) -> list[int]:
    """Minimise the largest w_i over contiguous partitions in device order, memory respected.

    best[i][b]: the smallest bottleneck of devices 0..i holding blocks [0, b); device i takes
    [a, b): best[i][b] = min over a of max(best[i-1][a], w_i(a, b)), infeasible where the range
    exceeds its memory. One (L+1) x (L+1) matrix per device: O(D L^2) time, O(D L) memory.
    Among the allocations with that bottleneck, a second pass of the same recursion takes one whose
    largest range holds the fewest blocks (the smallest gradients to synchronise): the bottleneck alone
    leaves the other devices' ranges free, and an arbitrary pick can load a fast stage with more
    blocks than its time needs."""
    D, L = problem.devices, problem.blocks
    need_bytes = 3 * D * (L + 1) ** 2 * 8  # seconds, memory and the fit mask, float64 per device and range
    if need_bytes > OPTIMAL_MAX_BYTES:
        raise AllocationError(f"allocation optimal: {D} devices x {L} blocks need about {need_bytes / 2**30:.0f} GiB "
                              f"of working memory (at most {OPTIMAL_MAX_BYTES / 2**30:.0f} GiB); use sky-heuristic or "
                              "fewer blocks (--layers)")
    flop = np.concatenate([[0.0], np.cumsum(problem.block_flop)])
    a, b, nonempty, span = _ranges(L)
    seconds = problem.seconds_per_flop[:, None, None] * (flop[b] - flop[a]) + problem.fixed_seconds[:, None, None]
    if problem.receive_seconds is not None:
        seconds = seconds + problem.receive_seconds[0][:, :, None] + problem.receive_seconds[1][:, None, :]
    if problem.device_block_memory is None:
        mem = np.concatenate([[0.0], np.cumsum(problem.block_memory)])
        need = np.broadcast_to(mem[b] - mem[a], (D, L + 1, L + 1))
    else:
        mem = np.concatenate([np.zeros((D, 1)), np.cumsum(problem.device_block_memory, axis=1)], axis=1)
        need = mem[:, b] - mem[:, a]
    fits = nonempty & (need <= problem.memory[:, None, None] * (1 + 1e-12))
    bottleneck = _min_max_ranges(seconds, fits)
    if not np.isfinite(bottleneck[0]):
        raise AllocationError(f"allocation optimal: no contiguous allocation fits every device's memory ({L} "
                              f"blocks need {problem.block_memory.sum() / 1e9:.1f} GB; the {D} devices have "
                              f"{max(problem.memory.sum(), 0) / 1e9:.1f} GB for blocks)")
    if max(bottleneck[1]) <= -(-L // D):  # already as even as blocks allow: the second pass cannot improve
        return bottleneck[1]
    limit = bottleneck[0] * (1 + 1e-9)
    return _min_max_ranges(np.broadcast_to(span, seconds.shape), fits & (seconds <= limit))[1]


@lru_cache(maxsize=64)
def _ranges(L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[a, b] grids of the ranges [a, b) over L blocks: a, b, b > a, and b - a (blocks)."""
    a, b = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    return a, b, b > a, (b - a).astype(float)


def _min_max_ranges(cost: np.ndarray, allowed: np.ndarray) -> tuple[float, list[int]]:
    """(smallest largest cost[i, a, b], blocks per device) over contiguous ranges [a, b) of the devices
    in order, range i within allowed[i]. best[b]: the smallest bottleneck of devices 0..i on [0, b)."""
    L = cost[0].shape[0] - 1
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((len(cost), L + 1), dtype=int)
    cols = np.arange(L + 1)
    masked = np.where(allowed, cost, np.inf)
    for i in range(len(cost)):
        cand = np.maximum(best[:, None], masked[i])  # [a, b]
        choice[i] = cand.argmin(0)
        best = cand[choice[i], cols]
    if not np.isfinite(best[L]):
        return np.inf, []
    counts, end = [], L
    for i in range(len(cost) - 1, -1, -1):
        start = int(choice[i][end])
        counts.append(end - start)
        end = start
    return float(best[L]), counts[::-1]
