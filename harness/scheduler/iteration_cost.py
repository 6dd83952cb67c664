"""The modelled iteration time of an assignment and its layer allocation: what `ga-hetero` minimises.

Neither seed system chooses placement and layer allocation together: the paper's scheduler
(Yuan et al. 2022, sec. 3) minimises communication only, Sky Computing (Zhu et al. 2022)
balances compute on a fixed device order. For an assignment sigma (D_DP pipelines of D_PP
devices, rows of one stage forming a data-parallel group) and its stages' blocks, one GPipe
iteration of M = batch / D_DP / micro_batch micro-batches is modelled as

  compute   = sum_j t_j + (M - 1) max_j t_j      (the slowest stage paces M micro-batches; the
                                                  others' single pass is the fill and drain bubble)
  DATAP     = max_j max_{d in C_j} sum_{d' in C_j - d} 2 (alpha + c_dp,j / (D_DP beta))   (eq. 2, but
                                                  each stage's own c_dp,j: its blocks' gradients)
  PIPELINEP = sum over consecutive stages of the slowest replica's 2 (alpha + c_pp / beta)  (eqs. 3-4)
  iteration = compute + DATAP + PIPELINEP

with t_j the forward and backward (and recomputed forward) seconds of stage j's blocks per
micro-batch on its slowest device, plus the LM head on the last stage, at the devices' profiles.
Communication is counted in full beside compute (no overlap), as the paper's cost model counts it.
The blocks of every stage come from an allocator of harness/allocation/ over the assignment's
pipelines (all replicas share one allocation, balanced on each stage's slowest device).

Memory does not enter the search: under GPipe the last stage keeps every micro-batch's logits
(26 GB for GPT3-XL at 128 micro-batches), which no 16 GB device holds, and a penalty for it leaves
a search on a plateau it cannot leave; the simulator does not limit memory either. The assignment
found is then allocated within memory where it fits, and `overflow_bytes` says by how much it
does not.

For a partition (the groups C_j, what the genetic search moves), the stage order and replicas
are the paper's: the open-loop TSP over the bottleneck matchings (harness/scheduler/cost.py); of that path
and its reverse (equal communication, different first and last stage) the faster is kept.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..allocation import DEFAULT as DEFAULT_ALLOCATOR
from ..allocation import AllocationError, StageModel, allocate_if_it_fits, optimal
from ..scenario.class_links import ClassLinks
from .cost import CostModel, open_loop_tsp
from .lumped import LumpedCostModel
from ..compute.model import GPTConfig


@dataclass(frozen=True)
class ComputeSetting:
    """What the compute part needs beyond the topology; picklable (scheduler worker processes)."""

    cfg: GPTConfig
    batch: int
    micro_batch: int = 1
    dtype: str = "fp16"
    recompute: bool = True
    profiles: tuple | None = None  # ComputeProfile per device; None: the scenario's at `dtype`

    def digest(self) -> str:
        """Stable digest of everything the objective reads (cache keys of scheduled assignments)."""
        text = repr((self.cfg, self.batch, self.micro_batch, self.dtype, self.recompute, self.profiles))
        return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class IterationCost:
    """A modelled iteration: its parts (seconds), the assignment and the allocation."""

    total: float
    compute: float
    dp: float
    pp: float
    pipelines: np.ndarray  # (D_DP, D_PP): device of stage j in replica i
    stages: tuple[tuple[int, int], ...]  # [first, last) blocks of every stage
    stage_seconds: tuple[float, ...]  # t_j per micro-batch
    micro_batches: int
    allocator: str
    overflow_bytes: float = 0.0  # summed over stages: > 0 when no allocation fits memory

    def to_json(self) -> dict:
        return {"iteration_s": self.total, "compute_s": self.compute, "dp_s": self.dp, "pp_s": self.pp,
                "micro_batches": self.micro_batches, "allocator": self.allocator,
                "stage_seconds": list(self.stage_seconds), "fits_memory": self.overflow_bytes == 0,
                "overflow_gb": self.overflow_bytes / 1e9}


SMOOTH_POWER = 8  # the tie-breaker's power mean of a stage's seconds per FLOP (near the max, not flat)


class IterationModel:
    """Modelled iteration time of partitions (search) and of fixed assignments (reports).

    Exposes what the schedulers read of a CostModel (d_pp, d_dp, pp_link, dp_link, score,
    breakdown), so the genetic search runs on it, and each device's seconds_per_flop."""

    def __init__(self, comm: CostModel, setting: ComputeSetting):
        from ..compute import BYTES_PER_VALUE, micro_batches

        self.comm, self.setting = comm, setting
        self.d_pp, self.d_dp = comm.d_pp, comm.d_dp
        self.pp_link, self.dp_link = comm.pp_link, comm.dp_link
        cfg = setting.cfg
        if self.d_pp > cfg.layers:
            raise AllocationError(f"allocation: {self.d_pp} stages cannot split the {cfg.layers} blocks of {cfg.name}")
        self.micro_batches = micro_batches(setting.batch, setting.micro_batch, self.d_dp)
        self.stage_model = StageModel(cfg, comm.topo, setting.micro_batch, self.micro_batches, setting.dtype,
                                      setting.recompute, None if setting.profiles is None else list(setting.profiles))
        self.bytes_per_value = BYTES_PER_VALUE[setting.dtype]
        lumped = isinstance(comm, LumpedCostModel)  # at scale: held as classes, no device x device matrix
        delay_s, bw_bps = comm.class_symmetric() if lumped else comm.topo.symmetric()
        with np.errstate(divide="ignore"):
            self._dp_delay = 2 * delay_s
            self._dp_per_byte = 2 * 8 / (self.d_dp * bw_bps)
        if lumped:
            self._dp_delay = ClassLinks(self._dp_delay, comm.device_class)
            self._dp_per_byte = ClassLinks(self._dp_per_byte, comm.device_class)
        else:
            np.fill_diagonal(self._dp_delay, 0.0)
            np.fill_diagonal(self._dp_per_byte, 0.0)
        self._flop_prefix = np.concatenate([[0.0], np.cumsum(self.stage_model.block_flop)])
        self.seconds_per_flop = self.stage_model.per_flop  # per device, for the search's speed move

    # ---------------------------------------------------------------- fixed assignment
    def of_pipelines(self, pipelines, stages=None, allocator: str = DEFAULT_ALLOCATOR) -> IterationCost:
        """The model of a fixed assignment (no re-matching, no re-ordering); its stages as given, or
        by `allocator` over its pipelines (without memory limits when none fits: `overflow_bytes`)."""
        S = np.asarray(pipelines, dtype=int)
        if stages is None:
            alloc, over = allocate_if_it_fits(allocator, self.stage_model, S)
            counts = np.array(alloc.layers_per_device)
        else:
            counts = np.array([b - a for a, b in stages])
            over = self.stage_model.problem(S, named=False).overflow(counts)
        pp = sum(float(self.pp_link[S[:, k], S[:, k + 1]].max()) for k in range(self.d_pp - 1))
        return self._parts(S, counts, pp, allocator, over=over)

    # ---------------------------------------------------------------- partitions (search)
    def score(self, partition) -> tuple[float, float]:
        """(modelled iteration seconds, a smooth tie-breaker): CostModel.score's averaged communication
        plus the compute part with each stage's speed a power mean (SMOOTH_POWER) of its devices' instead
        of the slowest. The slowest is flat while a stage keeps one slow device; the power mean falls
        with every slow device a stage gives away, and, being concave in their number, rewards gathering
        them in few stages, which is the way off the plateau."""
        best, smooth = self._best_orientation(np.asarray(partition))
        S = best.pipelines
        spf = self.seconds_per_flop[S]
        soft = np.mean(spf ** SMOOTH_POWER, axis=0) ** (1 / SMOOTH_POWER)
        bounds = np.concatenate([[0], np.cumsum([b - a for a, b in best.stages])])
        t = soft * (self._flop_prefix[bounds[1:]] - self._flop_prefix[bounds[:-1]])
        return best.total, smooth + float(t.sum() + (self.micro_batches - 1) * t.max())

    def breakdown(self, partition) -> IterationCost:
        """The best orientation of `partition`, its blocks re-allocated within memory where they fit."""
        best, _ = self._best_orientation(self.comm.check_partition(partition))
        return self.of_pipelines(best.pipelines, allocator="optimal")

    def _best_orientation(self, P: np.ndarray) -> tuple[IterationCost, float]:
        if isinstance(self.comm, LumpedCostModel):  # at scale: the path on link classes, its D_PP - 1 matchings
            _, pp, order, smooth = self.comm.path(P)
            staged = self.comm.staged_on_path(P, order)
        else:
            mean = np.zeros((self.d_pp, self.d_pp))
            W, matchings = self.comm.coarsened_graph(P, mean)
            pp, order = open_loop_tsp(W)
            staged = self.comm.staged(P, order, matchings)
            smooth = open_loop_tsp(mean)[0] + float(self.comm.datap_cost_per_group(P).mean())
        links = self._group_links(staged)
        best = None
        for S, G in ((staged.T, links), (staged.T[:, ::-1], tuple(x[::-1] for x in links))):
            counts = np.array(optimal(self.stage_model.problem(S, named=False, limit_memory=False)))
            cost = self._parts(S, counts, pp, "optimal", G)
            if best is None or cost.total < best.total:
                best = cost
        return best, smooth

    # ---------------------------------------------------------------- the parts
    def _group_links(self, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per device of every data-parallel group (rows of G): its summed 2 alpha to the others, and
        its summed 2 * 8 / (D_DP beta) (seconds per byte of c_dp)."""
        if isinstance(self._dp_delay, ClassLinks):  # from class counts, not D_DP^2 pairs per group
            return self._dp_delay.group_sums(G), self._dp_per_byte.group_sums(G)
        ix = (G[:, :, None], G[:, None, :])
        return self._dp_delay[ix].sum(-1), self._dp_per_byte[ix].sum(-1)

    def _parts(self, S: np.ndarray, counts: np.ndarray, pp: float, allocator: str,
               links: tuple[np.ndarray, np.ndarray] | None = None, over: float = 0.0) -> IterationCost:
        sm, cfg = self.stage_model, self.setting.cfg
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        flop = self._flop_prefix[bounds[1:]] - self._flop_prefix[bounds[:-1]]
        t = sm.per_flop[S].max(0) * flop
        t[-1] += sm.head_seconds[S[:, -1]].max()
        compute = float(t.sum() + (self.micro_batches - 1) * t.max())
        params = counts * float(cfg.block_params)  # model.stage_params, vectorised
        params[0] += cfg.embedding_params
        params[-1] += cfg.head_params
        delay, per_byte = links if links is not None else self._group_links(S.T)
        dp = float((delay + (params * self.bytes_per_value)[:, None] * per_byte).max())
        stages = tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
        return IterationCost(compute + dp + pp, compute, dp, pp, S.copy(), stages, tuple(float(x) for x in t),
                             self.micro_batches, allocator, over)
