"""Layer allocation: given one pipeline's devices in stage order, choose each device's block range.

Sky Computing (Zhu et al. 2022, `../shared/seeds/003_*`) states the problem: device i
holding blocks [a, b) carries the workload w_i = dt_i * sum(lf[a:b]) + ct_i (dt_i: its
seconds per FLOP, lf: the blocks' FLOPs, ct_i: its communication time) within its memory,
sum(lm[a:b]) <= dm_i; the pipeline runs at the pace of its largest w_i. Here w_i is the
device's modelled seconds of its blocks (forward and backward of one micro-batch at its
profile's speed) plus fixed parts: its communication, the embedding on the first device
and the LM head on the last (they ride with the first and last blocks).

Allocators, one registry entry each (registry.py), behind `allocate(name, problem)`:
- `even`: equal blocks per device (earlier devices take the remainder), as today.
- `sky-heuristic`: the paper's Algorithm 1 (coarse allocation by memory) then Algorithm 2
  (move single blocks between neighbours towards the mean workload), as the paper states
  them, with the communication term.
- `sky-mip`: the paper's mixed-integer program (scipy.optimize.milp, HiGHS), time-limited.
- `optimal`: the exact optimum of the contiguous partition for the fixed device order:
  dynamic programming over block prefixes, O(D L^2), memory respected.
Every device gets at least one block (a pipeline stage per device).

problem.py holds the problem and its answer, solvers.py `even` and `optimal`, sky.py Sky Computing's two,
stage_model.py the problem of a GPT on a scenario; this package's names are theirs.
"""
from __future__ import annotations

from .problem import Allocation, AllocationError, Problem  # noqa: F401
from .registry import ALLOCATORS, DEFAULT, Allocator, allocate, get, keeps_even_split, register  # noqa: F401
from .sky import HEURISTIC_MAX_ITER, MIP_TIME_LIMIT_S, sky_heuristic, sky_mip  # noqa: F401
from .solvers import even, optimal  # noqa: F401
from .stage_model import StageModel, allocate_if_it_fits, allocate_stages, problem_for  # noqa: F401
