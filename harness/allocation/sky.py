"""Sky Computing's allocators (Zhu et al. 2022, `../shared/seeds/003_*`): Algorithm 1 + 2 (the heuristic),
and the paper's mixed-integer program (scipy.optimize.milp, HiGHS), time-limited.
"""
from __future__ import annotations

import numpy as np

from .problem import AllocationError, Problem
from .solvers import even

HEURISTIC_MAX_ITER = 1000  # Algorithm 2's max_iter (the paper leaves it open); it stops earlier when pi settles
MIP_TIME_LIMIT_S = 60.0


# ---------------------------------------------------------------------------- Sky Computing's heuristic
def sky_heuristic(problem: Problem, max_iter: int = HEURISTIC_MAX_ITER) -> list[int]:
    """Algorithm 1 then Algorithm 2 of the paper, on the partition index pi (device i holds blocks
    pi[i] .. pi[i+1]-1)."""
    pi = np.concatenate([[0], np.cumsum(even(problem))]).astype(int)
    pi = _coarse_by_memory(problem, pi)
    return list(np.diff(_optimise_workload(problem, pi, max_iter)))


def _memory(problem: Problem, pi: np.ndarray) -> np.ndarray:
    return problem.stage_memory(np.diff(pi))


def _coarse_by_memory(problem: Problem, pi: np.ndarray) -> np.ndarray:
    """Algorithm 1: sweep the devices; one over its memory gives away its last blocks to the next,
    one with room for the next block takes it, each keeping at least one block; raise when a sweep
    changes nothing and memory is still short."""
    D, lm, dm = problem.devices, problem.block_memory, problem.memory
    while True:
        am = _memory(problem, pi)
        if (am <= dm).all():
            return pi
        before = pi.copy()
        for i in range(D - 1):
            while _memory(problem, pi)[i] > dm[i] and pi[i + 1] - pi[i] > 1:
                pi[i + 1] -= 1
            while dm[i] > _memory(problem, pi)[i] + lm[pi[i + 1]] and pi[i + 2] - pi[i + 1] > 1:
                pi[i + 1] += 1
        if (pi == before).all():
            i = int(np.flatnonzero(_memory(problem, pi) > dm)[0])
            raise AllocationError(f"allocation sky-heuristic: cannot fit the blocks in memory "
                                  f"({problem.name(i)} needs {_memory(problem, pi)[i] / 2**30:.2f} GiB, "
                                  f"has {dm[i] / 2**30:.2f} GiB)")


def _optimise_workload(problem: Problem, pi: np.ndarray, max_iter: int) -> np.ndarray:
    """Algorithm 2: towards the mean workload, a device under it takes the next device's first
    block; one over it gives its last block to an under-loaded next device when it stays over the
    mean without it; every move keeps each device at one block or more and within memory."""
    D, dm = problem.devices, problem.memory
    flop = problem.block_flop
    for _ in range(max_iter):
        before = pi.copy()
        target = problem.stage_seconds(np.diff(pi)).mean()
        for i in range(D - 1):
            w = problem.stage_seconds(np.diff(pi))
            if w[i] < target and pi[i + 2] - pi[i + 1] > 1 and _fits_after(problem, pi, i, +1):
                pi[i + 1] += 1
            else:
                last = problem.seconds_per_flop[i] * flop[pi[i + 1] - 1]
                if (w[i + 1] < target and w[i] - last > target and pi[i + 1] - pi[i] > 1
                        and _fits_after(problem, pi, i, -1)):
                    pi[i + 1] -= 1
        if (pi == before).all():
            break
    return pi


def _fits_after(problem: Problem, pi: np.ndarray, i: int, move: int) -> bool:
    """Whether moving boundary pi[i+1] by `move` keeps devices i and i+1 within memory."""
    trial = pi.copy()
    trial[i + 1] += move
    am = _memory(problem, trial)
    return bool(am[i] <= problem.memory[i] and am[i + 1] <= problem.memory[i + 1])


# ---------------------------------------------------------------------------- the paper's MIP
def sky_mip(problem: Problem, time_limit_s: float = MIP_TIME_LIMIT_S) -> tuple[list[int], bool]:
    """The mixed-integer program of the paper (Sec. IV-C): x_ij binary (device i holds block j),
    y_i / z_i the last / first block of device i, contiguity by y_i - z_i = sum_j x_ij - 1, and
    q >= w_i minimised. Returns (blocks per device, proven optimal). Devices are in pipeline order,
    so device i's range must also follow device i-1's (z_i = y_(i-1) + 1); the paper's program
    leaves the order free, which the pipeline does not."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    D, L = problem.devices, problem.blocks
    nx = D * L
    iy, iz, iq = nx, nx + D, nx + 2 * D  # variables: x (row-major i, j), y, z, q
    n = iq + 1
    rows, lo, hi = [], [], []

    def row(entries, low, high):
        r = np.zeros(n)
        for k, v in entries:
            r[k] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    x = lambda i, j: i * L + j  # noqa: E731
    M = L + 1
    for i in range(D):
        row([(x(i, j), problem.block_memory[j]) for j in range(L)], -np.inf, problem.memory[i])
        for j in range(L):
            row([(iy + i, 1), (x(i, j), -(j + 1))], 0, np.inf)  # y_i >= j x_ij (blocks numbered 1..L)
            row([(iz + i, 1), (x(i, j), M - (j + 1))], -np.inf, M)  # z_i <= j x_ij + M (1 - x_ij)
        row([(iy + i, 1), (iz + i, -1)] + [(x(i, j), -1) for j in range(L)], -1, -1)
        row([(x(i, j), 1) for j in range(L)], 1, np.inf)  # a block or more: a pipeline stage per device
        row([(iq, 1)] + [(x(i, j), -problem.seconds_per_flop[i] * problem.block_flop[j]) for j in range(L)],
            problem.fixed_seconds[i], np.inf)
        if i:
            row([(iz + i, 1), (iy + i - 1, -1)], 1, 1)  # pipeline order
    for j in range(L):
        row([(x(i, j), 1) for i in range(D)], 1, 1)
    c = np.zeros(n)
    c[iq] = 1.0
    integrality = np.ones(n)
    integrality[iq] = 0
    lb = np.zeros(n)
    ub = np.ones(n)
    lb[iy:iq], ub[iy:iq] = 1, L
    ub[iq] = np.inf
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
               bounds=Bounds(lb, ub), options={"time_limit": time_limit_s})
    if res.x is None:
        raise AllocationError(f"allocation sky-mip: no feasible allocation found in {time_limit_s:g} s "
                              f"({res.message})")
    counts = np.rint(res.x[:nx]).reshape(D, L).sum(1).astype(int)
    return list(counts), res.status == 0
