"""The parallel degrees a plan uses: D_PP x D_DP and recompute, within every device's memory.

The paper fixes D_PP x D_DP (8 x 8 for 64 devices) and its scheduler ignores memory; beyond 64 devices
the square-ish default is a guess (16 x 64 at 1,024 devices) and may not fit. Here every split of the
devices into D_PP stages of D_DP replicas that the model (D_PP <= layers) and batch (whole micro-batches
per replica) allow is an option, with and without activation recomputation:

  memory   the stages' blocks, as `harness allocate` counts them (harness/allocation/stage_model.py:
           every block's parameters and optimizer state, GPipe's activations of all micro-batches in
           flight, the embedding on the first stage, the head and its logits on the last), fit if some
           placement holds them: groups of the D_DP largest memories, the next D_DP, ... (each group as
           large as any placement makes it), the two largest-memory groups tried at both ends. Under
           GPipe the micro-batch size does not change memory (batch / D_DP samples are in flight either
           way); recomputation does (a block keeps its input alone), at a third more compute. Recompute stays
           off where the stages fit without it in every placement, else in the roomiest one.
  bound    a lower bound on the modelled iteration time of every placement (bound.iteration_bound).

Options that fit are searched in order of their bound, each with the full budget, until the next
option's bound is above the best modelled iteration of a plan that fits (branch and bound: no option
skipped could have been faster in the model). A search that ignores memory may put a small memory in
every group, so a plan that does not fit is kept only when no plan does. When no option fits, memory
cannot decide: the one with the least bound is searched, and the plan says by how much it does not fit.
Each plan's stages take their blocks from the optimal allocator within memory (unless another is asked
for): an even split may not fit where the option does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..allocation import StageModel
from ..compute import BYTES_PER_VALUE, BatchError, c_dp_bytes, c_pp_bytes, micro_batches
from ..compute.model import GPTConfig
from ..scenario import Topology


MEMORY_AWARE_ALLOCATOR = "optimal"  # a plan's blocks unless told otherwise: the fastest allocation within memory


@dataclass(frozen=True)
class Degrees:
    """One option: its degrees, whether its stages fit memory (short_gb: the least memory missing
    where they do not) and the lower bound of its modelled iteration (seconds)."""

    d_pp: int
    d_dp: int
    recompute: bool
    fits: bool  # in the roomiest placement
    short_gb: float
    bound_s: float
    fits_any: bool = False  # in every placement (a search that ignores memory cannot miss)

    def to_json(self) -> dict:
        return {"d_pp": self.d_pp, "d_dp": self.d_dp, "recompute": self.recompute, "fits_memory": self.fits,
                "fits_any_placement": self.fits_any, "short_gb": self.short_gb, "bound_s": self.bound_s}


def splits(n: int, cfg: GPTConfig, batch: int, micro_batch: int) -> list[tuple[int, int]]:
    """(D_PP, D_DP) with D_PP x D_DP = n that the model's layers and the batch allow."""
    out = []
    for d_pp in range(1, min(n, cfg.layers) + 1):
        if n % d_pp:
            continue
        try:
            micro_batches(batch, micro_batch, n // d_pp)
        except BatchError:
            continue
        out.append((d_pp, n // d_pp))
    return out


def memory_short(sm: StageModel, d_pp: int, d_dp: int, any_placement: bool = False) -> float:
    """Bytes the roomiest placement (any_placement: every placement) misses to hold the model's blocks in
    D_PP stages; 0 when they fit."""
    layers = len(sm.block_memory)
    block = float(sm.block_memory.max())
    if any_placement:  # a placement may put the smallest memory in every group
        groups = np.full(d_pp, sm.memory.min())
    else:  # each group's least, largest first
        groups = np.sort(sm.memory)[::-1][(np.arange(d_pp) + 1) * d_dp - 1]
    if d_pp == 1:
        extra = [np.array([sm.first_memory + sm.last_memory])]
    else:  # the largest groups at the ends, either way round
        ends = [(0, 1), (1, 0)]
        extra = []
        for first, last in ends:
            e = np.zeros(d_pp)
            e[first] += sm.first_memory
            e[last] += sm.last_memory
            extra.append(e)
    best = np.inf
    for e in extra:
        free = groups - e
        blocks = np.floor(np.maximum(free, 0) / block)
        # every stage holds at least one block; then the blocks left must fit the room left
        short_one = np.maximum(block - free, 0).sum()
        room = np.maximum(blocks - 1, 0).sum()
        best = min(best, short_one + max(0.0, (layers - d_pp) - room) * block)
    return float(best)


def degree_options(topo: Topology, cfg: GPTConfig, batch: int, micro_batch: int = 1, dtype: str = "fp16",
                   recompute: bool | None = None, bounds: bool = True) -> list[Degrees]:
    """Every option (module docstring), recompute off where it fits unless `recompute` is given;
    sorted: those that fit first, then by bound (or by the memory they miss)."""
    from .bound import iteration_bound
    from .iteration_cost import ComputeSetting, IterationModel
    from .lumped import cost_model

    bpv = BYTES_PER_VALUE[dtype]
    out = []
    for d_pp, d_dp in splits(topo.n, cfg, batch, micro_batch):
        m = micro_batches(batch, micro_batch, d_dp)
        tried = [recompute] if recompute is not None else [False, True]
        fit = {}  # recompute -> (bytes short in the roomiest placement, fits every placement)
        for rc in tried:
            sm = StageModel(cfg, topo, micro_batch, m, dtype, rc)
            fit[rc] = (memory_short(sm, d_pp, d_dp), memory_short(sm, d_pp, d_dp, any_placement=True) == 0)
        # recompute off where the stages fit without it: in every placement, else in the roomiest
        rc = next((r for r in tried if fit[r][1]), None)
        rc = next((r for r in tried if fit[r][0] == 0), tried[-1]) if rc is None else rc
        short, fits_any = fit[rc]
        bound = np.nan
        if bounds:
            comm = cost_model(topo, d_pp, d_dp, c_pp_bytes(cfg, batch, d_dp, bpv), c_dp_bytes(cfg, d_pp, bpv))
            model = IterationModel(comm, ComputeSetting(cfg, batch, micro_batch, dtype, rc))
            bound = iteration_bound(model).total
        out.append(Degrees(d_pp, d_dp, rc, short == 0, short / 1e9, float(bound), fits_any))
    return sorted(out, key=lambda o: (not o.fits, o.short_gb, o.bound_s))


@dataclass
class DegreesPlan:
    """The planner's answer: the assignment of the degrees it chose, every option it weighed, and the
    modelled iteration of each one it searched (in search order)."""

    assignment: object  # harness.scheduler.Assignment
    chosen: Degrees
    options: list[Degrees]
    searched: list[tuple[Degrees, float, bool]]  # option, its plan's modelled iteration, whether that plan fits

    def to_json(self) -> dict:
        return {"chosen": self.chosen.to_json(), "options": [o.to_json() for o in self.options],
                "searched": [{**o.to_json(), "iteration_s": t, "plan_fits_memory": f} for o, t, f in self.searched]}


def plan(topo: Topology, cfg: GPTConfig, batch: int, micro_batch: int = 1, dtype: str = "fp16",
         scheduler: str = "ga", seed: int = 0, budget: int | None = None, recompute: bool | None = None,
         allocator: str | None = None, on_search=None) -> DegreesPlan:
    """Choose the degrees and search their assignment (module docstring). `on_search(option)` returns the
    progress callback of that option's search (or None)."""
    from . import DEFAULT_BUDGET, schedule
    from .iteration_cost import ComputeSetting

    options = degree_options(topo, cfg, batch, micro_batch, dtype, recompute)
    allocator = allocator or MEMORY_AWARE_ALLOCATOR
    if not options:
        raise BatchError(f"--batch {batch}: no split of the {topo.n} devices into at most {cfg.layers} stages "
                         f"of replicas with whole micro-batches of {micro_batch}")
    fitting = [o for o in options if o.fits] or [min(options, key=lambda o: o.bound_s)]  # none fits: the fastest
    bpv = BYTES_PER_VALUE[dtype]
    best, searched = None, []  # best: (fits memory, iteration seconds, assignment, option)
    for o in sorted(fitting, key=lambda o: o.bound_s):
        if best is not None and best[0] and o.bound_s >= best[1]:
            break  # no placement of this option (nor of any later one) beats the best found
        setting = ComputeSetting(cfg, batch, micro_batch, dtype, o.recompute)
        a = schedule(topo, o.d_pp, o.d_dp, c_pp_bytes(cfg, batch, o.d_dp, bpv), c_dp_bytes(cfg, o.d_pp, bpv),
                     scheduler, seed, budget or DEFAULT_BUDGET, on_search and on_search(o), setting, allocator)
        found = (bool(a.model["fits_memory"]), a.model["iteration_s"], a, o)
        searched.append((o, found[1], found[0]))
        if best is None or (found[0], -found[1]) > (best[0], -best[1]):
            best = found
    return DegreesPlan(best[2], best[3], options, searched)
