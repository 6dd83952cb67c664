"""How fast an iteration of "ours" could possibly be on a given network: a communication lower bound.

The cost model (cost.py, the paper's eq. 1) ranks assignments; it charges every
pipeline edge the whole activation volume in sequence. The runtime pipelines
micro-batches, so transfers on different edges overlap. The bound here follows the
runtime's actual data flow on the emulated network (one-way delay A and rate B per
direction, every pair shaped separately), ignoring computation:

  pipeline of replica i, forward: n micro-batches of s = c_pp / n bytes pass a chain of
  store-and-forward links:  sum_e (A_e + s/B_e) + (n - 1) max_e s/B_e ; backward the same
  on the reverse links. DP of C_0 (the last group to get its gradients): scatter then
  gather of c_dp(stage 0)/D_DP shards, every pair concurrently: 2 max_{d != d'} (A + shard/B).
  bound = max_i (forward_i + backward_i) + DP(C_0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import Layout
from ..compute.model import GPTConfig, stage_params
from ..compute import c_pp_bytes
from ..scenario import Topology
from ..units import gbps_to_bytes_per_s, ms_to_s


@dataclass(frozen=True)
class CommBound:
    pipeline_s: float  # slowest replica's forward + backward transfers
    dp_s: float  # data-parallel exchange of stage 0's group
    total_s: float


def comm_lower_bound(topo: Topology, layout: Layout, cfg: GPTConfig, batch: int, micro_batch: int,
                     bytes_per_value: int = 4) -> CommBound:
    """`topo` as the run sees it (Topology.scaled)."""
    delay = ms_to_s(np.asarray(topo.delay_ms, dtype=float))
    rate = gbps_to_bytes_per_s(np.asarray(topo.bandwidth_gbps, dtype=float))
    n = batch // (layout.dp * micro_batch)
    msg = c_pp_bytes(cfg, batch, layout.dp, bytes_per_value) / n
    worst_pp = 0.0
    for pipe in layout.pipelines:
        t = 0.0
        for links in (list(zip(pipe[:-1], pipe[1:])), list(zip(pipe[1:], pipe[:-1]))):
            if not links:
                continue
            per = [msg / rate[a, b] for a, b in links]
            t += sum(delay[a, b] for a, b in links) + sum(per) + (n - 1) * max(per)
        worst_pp = max(worst_pp, t)
    shard = stage_params(cfg, layout.layers_per_stage)[0] * bytes_per_value / layout.dp
    group = layout.stage_group(0)
    dp = 0.0
    if len(group) > 1:
        dp = 2 * max(delay[a, b] + shard / rate[a, b] for a in group for b in group if a != b)
    return CommBound(pipeline_s=worst_pp, dp_s=dp, total_s=worst_pp + dp)
