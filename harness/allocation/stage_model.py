"""The allocation problem of a GPT on a scenario's devices: StageModel computes its inputs once, so a scheduler
can build the problem of every candidate's pipelines cheaply."""
from __future__ import annotations

import numpy as np

from .problem import Allocation, AllocationError, Problem
from .registry import allocate


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
        from ..netmodel.links import Links
        from ..scenario.class_links import by_region

        profs = profiles if profiles is not None else device_profiles(topo, dtype=dtype)
        bpv = work.BYTES_PER_VALUE[dtype]
        self.cfg, self.topo = cfg, topo
        self.per_flop = np.array([1.0 / p.flops_per_s("transformer") for p in profs])
        self.head_seconds = np.array([sum(work.HEAD_PHASES) * work.head_fwd_flop(cfg, micro_batch) / p.flops_per_s("lm_head")
                                      for p in profs])
        # [a, b]: one micro-batch's activation (or gradient) from a to b, alone on its link (ours sends one
        # transfer per link and direction at a time, and no two stage pairs of a table share a link)
        activation = work.activation_bytes(cfg, micro_batch, bpv)

        def send_seconds(t):
            links = Links.per_device(t, nic="per-pair")
            src, dst = np.indices(links.rate_Bps.shape)
            return links.serialization_s(src, dst, activation) + links.delay_s

        # by region where the links are the regions' (no N x N matrix at 10,240 devices), else per device
        self.send_seconds = by_region(topo, send_seconds) if topo.region_links is not None else send_seconds(topo)
        per_param = work.training_bytes_per_param(bpv)
        self.block_flop = np.full(cfg.layers, sum(work.block_phases(recompute)) * work.block_fwd_flop(cfg, micro_batch))
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
