"""Layer allocation: given one pipeline's devices in stage order, choose each device's block range.

Sky Computing (Zhu et al. 2022, `../shared/seeds/003_*`) states the problem: device i
holding blocks [a, b) carries the workload w_i = dt_i * sum(lf[a:b]) + ct_i (dt_i: its
seconds per FLOP, lf: the blocks' FLOPs, ct_i: its communication time) within its memory,
sum(lm[a:b]) <= dm_i; the pipeline runs at the pace of its largest w_i. Here w_i is the
device's modelled seconds of its blocks (forward and backward of one micro-batch at its
profile's speed) plus fixed parts: its communication, the embedding on the first device
and the LM head on the last (they ride with the first and last blocks).

Allocators, one function each, behind `allocate(name, problem)`:
- `even`: equal blocks per device (earlier devices take the remainder), as today.
- `sky-heuristic`: the paper's Algorithm 1 (coarse allocation by memory) then Algorithm 2
  (move single blocks between neighbours towards the mean workload), as the paper states
  them, with the communication term.
- `sky-mip`: the paper's mixed-integer program (scipy.optimize.milp, HiGHS), time-limited.
- `optimal`: the exact optimum of the contiguous partition for the fixed device order:
  dynamic programming over block prefixes, O(D L^2), memory respected.
Every device gets at least one block (a pipeline stage per device).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import HarnessError
from ..compute.model import even_split

ALLOCATORS = ("even", "sky-heuristic", "sky-mip", "optimal")
HEURISTIC_MAX_ITER = 1000  # Algorithm 2's max_iter (the paper leaves it open); it stops earlier when pi settles
MIP_TIME_LIMIT_S = 60.0


class AllocationError(HarnessError, ValueError):
    """No allocation can run (too few blocks, a device without memory for its share); one line."""


@dataclass(frozen=True)
class Problem:
    """What an allocator sees, for D devices in pipeline order and L blocks.

    seconds_per_flop: (D,) dt_i; block_flop: (L,) lf_j; fixed_seconds: (D,) ct_i plus the device's
    fixed work (embedding on the first, head on the last); block_memory: (L,) lm_j bytes;
    memory: (D,) dm_i bytes the blocks may use (the device's memory less its fixed parts).

    Two optional terms for models whose cuts differ (a CNN's activations shrink layer by layer;
    HetPipe's partitioner, Park et al. 2020 Sec. 7, counts them), taken by `even` and `optimal`:
    receive_seconds (2, D, L+1): [0, i, a] device i receiving its input when its range starts at
    block a, [1, i, b] receiving the gradient back when its range ends at b; device_block_memory
    (D, L): lm_j on device i when it differs per device (activations kept for more micro-batches
    on earlier stages)."""

    seconds_per_flop: np.ndarray
    block_flop: np.ndarray
    fixed_seconds: np.ndarray
    block_memory: np.ndarray
    memory: np.ndarray
    names: tuple[str, ...] = ()  # the devices' names, for messages
    receive_seconds: np.ndarray | None = None
    device_block_memory: np.ndarray | None = None

    @property
    def uniform(self) -> bool:
        """No cut-dependent or per-device term: every allocator applies."""
        return self.receive_seconds is None and self.device_block_memory is None

    @property
    def devices(self) -> int:
        return len(self.seconds_per_flop)

    @property
    def blocks(self) -> int:
        return len(self.block_flop)

    def name(self, i: int) -> str:
        return self.names[i] if self.names else f"device {i}"

    def stage_seconds(self, counts) -> np.ndarray:
        """w_i of every device for blocks-per-device `counts`."""
        w = self.seconds_per_flop * _range_sums(self.block_flop, counts) + self.fixed_seconds
        if self.receive_seconds is not None:
            bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            i = np.arange(self.devices)
            w = w + self.receive_seconds[0, i, bounds[:-1]] + self.receive_seconds[1, i, bounds[1:]]
        return w

    def stage_memory(self, counts) -> np.ndarray:
        if self.device_block_memory is None:
            return _range_sums(self.block_memory, counts)
        return np.array([_range_sums(row, counts)[i] for i, row in enumerate(self.device_block_memory)])

    def overflow(self, counts) -> float:
        """Bytes over memory of blocks-per-device `counts`, summed over devices (0 when they fit)."""
        return float(np.maximum(self.stage_memory(counts) - self.memory, 0).sum())

    def _block_memory(self, i: int) -> np.ndarray:
        return self.block_memory if self.device_block_memory is None else self.device_block_memory[i]

    def check(self) -> None:
        if self.blocks < self.devices:
            raise AllocationError(f"allocation: {self.blocks} blocks cannot give {self.devices} devices one each")
        least = np.array([self._block_memory(i).min() for i in range(self.devices)])
        small = np.flatnonzero(self.memory < least)
        if small.size:
            i = int(small[0])
            raise AllocationError(f"allocation: {self.name(i)} has {self.memory[i] / 2**30:.2f} GiB for blocks, "
                                  f"less than one block needs ({least[i] / 2**30:.2f} GiB)")


def _range_sums(values: np.ndarray, counts) -> np.ndarray:
    """Sum of `values` over each device's contiguous range, for blocks-per-device `counts`."""
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    return prefix[bounds[1:]] - prefix[bounds[:-1]]


@dataclass(frozen=True)
class Allocation:
    allocator: str
    layers_per_device: tuple[int, ...]
    stage_seconds: tuple[float, ...]
    solve_seconds: float
    optimal: bool = False  # proven optimal (optimal; sky-mip when HiGHS closed the gap)

    @property
    def bottleneck(self) -> int:
        return int(np.argmax(self.stage_seconds))

    @property
    def stages(self) -> tuple[tuple[int, int], ...]:
        """[first, last) blocks of every device, as Layout.stages."""
        b = np.concatenate([[0], np.cumsum(self.layers_per_device)]).astype(int)
        return tuple((int(x), int(y)) for x, y in zip(b[:-1], b[1:]))


def allocate(name: str, problem: Problem, time_limit_s: float = MIP_TIME_LIMIT_S) -> Allocation:
    """Run allocator `name` on `problem`; AllocationError (one line) when none fits."""
    if name not in ALLOCATORS:
        raise AllocationError(f"--allocator: unknown {name!r} (known: {', '.join(ALLOCATORS)})")
    if not problem.uniform and name not in ("even", "optimal"):
        raise AllocationError(f"allocation {name}: models neither cut-dependent communication nor per-device "
                              "block memory (use optimal)")
    problem.check()
    t0 = time.perf_counter()
    if name == "even":
        counts, proven = even(problem), False
    elif name == "sky-heuristic":
        counts, proven = sky_heuristic(problem), False
    elif name == "sky-mip":
        counts, proven = sky_mip(problem, time_limit_s)
    else:
        counts, proven = optimal(problem), True
    solve = time.perf_counter() - t0
    over = np.flatnonzero(problem.stage_memory(counts) > problem.memory * (1 + 1e-12))
    if over.size:
        i = int(over[0])
        raise AllocationError(f"allocation {name}: {counts[i]} blocks need "
                              f"{problem.stage_memory(counts)[i] / 2**30:.2f} GiB on {problem.name(i)}, "
                              f"which has {problem.memory[i] / 2**30:.2f} GiB")
    return Allocation(name, tuple(int(c) for c in counts), tuple(float(s) for s in problem.stage_seconds(counts)),
                      solve, proven)


# ---------------------------------------------------------------------------- from a model and devices
class StageModel:
    """The allocation problem's inputs for one model, run and scenario, computed once so that a
    scheduler can build the problem of every candidate's pipelines cheaply (`problem`).

    Per micro-batch: a block's forward, backward (and recomputed forward) FLOPs at each device's
    profile (harness/compute/profiles.py at the run's precision: peak x efficiency / slowdown); ct_i the
    device's sends of one micro-batch's activation to the next device and its gradient to the
    previous (delay + bytes / bandwidth of the scenario's links, one transfer per link and direction
    at a time); the head's work on the last. Memory: every block's parameters in training
    (compute.training_bytes_per_param) and the activations of `micro_batches` micro-batches in flight
    (GPipe keeps them all), within the device's memory less the embedding (first) or the head and its
    logits (last)."""

    def __init__(self, cfg, topo, micro_batch: int, micro_batches: int, dtype: str = "fp16",
                 recompute: bool = True, profiles=None):
        from .. import compute as work
        from ..compute.profiles import device_profiles
        from ..compute.links import Links

        profs = profiles if profiles is not None else device_profiles(topo, dtype=dtype)
        bpv = work.BYTES_PER_VALUE[dtype]
        self.cfg, self.topo = cfg, topo
        self.per_flop = np.array([1.0 / p.flops_per_s("transformer") for p in profs])
        self.head_seconds = np.array([3 * work.head_fwd_flop(cfg, micro_batch) / p.flops_per_s("lm_head")
                                      for p in profs])
        # [a, b]: one micro-batch's activation (or gradient) from a to b, alone on its link (ours sends one
        # transfer per link and direction at a time, and no two stage pairs of a table share a link)
        links = Links.from_topology(topo, nic="per-pair")
        with np.errstate(divide="ignore"):
            self.send_seconds = work.activation_bytes(cfg, micro_batch, bpv) / links.rate_Bps + links.delay_s
        per_param = work.training_bytes_per_param(bpv)
        self.block_flop = np.full(cfg.layers, (4 if recompute else 3) * work.block_fwd_flop(cfg, micro_batch))
        self.block_memory = np.full(cfg.layers, cfg.block_params * per_param
                                    + micro_batches * work.block_activation_bytes(cfg, micro_batch, bpv, recompute))
        self.memory = np.array([d.memory_gb * 1e9 for d in topo.profiles], dtype=float)
        self.first_memory = cfg.embedding_params * per_param
        self.last_memory = cfg.head_params * per_param + micro_batches * micro_batch * cfg.seq * cfg.vocab * bpv

    def problem(self, pipelines, named: bool = True, limit_memory: bool = True) -> Problem:
        """The problem of `pipelines`: one pipeline's devices in stage order, or a table (replicas,
        stages) of pipelines that share one allocation (ours' data-parallel replicas hold the same
        blocks per stage); stage i then takes, per block, the slowest of its devices' times and the
        smallest of their memories (a bound: the replicas' worst case per stage, exact for one pipeline).
        limit_memory=False: every stage's memory unlimited."""
        table = np.atleast_2d(np.asarray(pipelines, dtype=int))  # (replicas, stages)
        fixed = np.zeros(table.shape)
        fixed[:, :-1] += self.send_seconds[table[:, :-1], table[:, 1:]]  # activations to the next device
        fixed[:, 1:] += self.send_seconds[table[:, 1:], table[:, :-1]]  # gradients to the previous
        fixed[:, -1] += self.head_seconds[table[:, -1]]
        memory = self.memory[table].min(0)
        memory[0] -= self.first_memory
        memory[-1] -= self.last_memory
        if not limit_memory:  # memory not limited (a model that cannot fit anywhere, ranked by time alone)
            memory = np.full(len(memory), np.inf)
        names = ()
        if named and len(table) == 1:
            names = tuple(f"device {d} ({self.topo.profiles[d].gpu}, slowdown {self.topo.profiles[d].slowdown:.3g})"
                          for d in table[0])
        elif named:
            names = tuple(f"stage {i} (devices {', '.join(map(str, table[:, i]))})" for i in range(table.shape[1]))
        return Problem(self.per_flop[table].max(0), self.block_flop, fixed.max(0), self.block_memory, memory, names)


def problem_for(cfg, topo, pipelines, micro_batch: int, micro_batches: int, dtype: str = "fp16",
                recompute: bool = True, profiles=None) -> Problem:
    """The allocation problem of `pipelines` over scenario devices (StageModel.problem)."""
    return StageModel(cfg, topo, micro_batch, micro_batches, dtype, recompute, profiles).problem(pipelines)


def allocate_stages(name: str, cfg, topo, pipelines, micro_batch: int, micro_batches: int, dtype: str,
                    recompute: bool, profiles=None) -> tuple[tuple[int, int], ...]:
    """Layout.stages of `pipelines` (replicas, stages) by allocator `name` (problem_for)."""
    problem = problem_for(cfg, topo, pipelines, micro_batch, max(1, micro_batches), dtype, recompute, profiles)
    return allocate(name, problem).stages


def allocate_if_it_fits(name: str, model: StageModel, pipelines) -> tuple[Allocation, float]:
    """(allocation, bytes over memory summed over stages) of `name` on `pipelines`: within memory when
    one fits, else its choice without memory limits and by how much that overflows. For models that
    rank or simulate time, which memory does not change (the simulator, ga-hetero's iteration time)."""
    problem = model.problem(pipelines, named=False)
    try:
        return allocate(name, problem), 0.0
    except AllocationError:
        pass
    free = allocate(name, model.problem(pipelines, named=False, limit_memory=False))
    return free, problem.overflow(free.layers_per_device)


# ---------------------------------------------------------------------------- even
def even(problem: Problem) -> list[int]:
    return even_split(problem.blocks, problem.devices)


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


# ---------------------------------------------------------------------------- the exact optimum
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
