"""HetPipe's plan (Park et al. 2020, `../shared/seeds/004_*`): virtual workers, their layers, N_m, parameter shards.

A virtual worker (VW) is a group of GPUs running one pipeline over a CNN's layers (harness/workloads/cnn.py);
VWs train data-parallel through a parameter server under Wave Synchronous Parallel (wsp.py).
Nodes are the scenario's regions (one GPU type each, as the paper's testbed).

Resource allocation policies (Sec. 8.1):
- `np`, node partition: one VW per node (homogeneous VWs; no VW crosses nodes).
- `ed`, equal distribution: VW j takes GPU j of every node (identical VWs); on one node, the
  node is one VW (the paper's V4).
- `hd`, hybrid distribution: nodes paired so that the pairs' summed compute and memory are
  closest (the smallest worst relative difference of the two), then each pair's GPUs spread
  evenly over its VWs (the paper's VVQQ / RRGG).
- an explicit grouping, "0,1,2,3;4,5,6,7": device ids per VW.
Each VW's stage order is the ordering of its GPU types whose partition is fastest; the partition
is the `optimal` allocator (harness/allocation/) with HetPipe's objective (Sec. 7): the largest
stage time (its layers' forward and backward plus receiving its input and its gradient) within
each GPU's memory, where a stage keeps the activations of every minibatch in flight on it (N_m
on all but the last, which runs a minibatch's forward and backward back to back: one).
N_m is the same on every VW (Sec. 4): every value up to the smallest VW's Max_m is simulated and
the fastest kept. Training is fp32 (TensorFlow 1.12, as the paper).

Trained for real (`harness run --system hetpipe`): rule.py plans the GPT (its blocks as layers) into a
layout whose replicas are the VWs, with a `wsp` section (N_m, D, each block's shard host); runtime.py is
one rank (a stage of a VW, and its node's shard when it hosts one, ps.py); sim.py's `simulate_wsp_layout`
is what `sim compare` holds such a run against.
"""
from __future__ import annotations

from .planning import (PLACEMENTS, Costs, HetPipePlan, VirtualWorker, best_order, cut_bytes, max_in_flight,  # noqa: F401
                       partition, plan, ps_traffic, sync_seconds, virtual_workers)
from .policies import POLICIES, Policy, group  # noqa: F401
from .setting import BYTES_PER_VALUE, DTYPE, GIB, MAX_NM, PARAM_BYTES, HetPipeError  # noqa: F401
from ...sim.cnn import nodes_of, select_gpus  # noqa: F401
from ...plan.arg_types import non_negative_int, nonempty, one_of, positive_int
from ...plan.systems import Option, System, register

#: HetPipe's own knobs: `harness run --system hetpipe`, `harness sim` of the CNNs and `harness hetpipe plan` take them
#: (`harness sim` tries every policy and placement the policy allows when those are not given)
OPTIONS = (
    Option("policy", nonempty, "how GPUs form virtual workers: np | ed | hd | a grouping of device ids "
           "'0,4,8,12;1,5,9,13' (harness sim: np, ed and hd unless given)", default="ed"),
    Option("ps_placement", one_of(*PLACEMENTS), "where the parameter-server shards live: default (round-robin over "
           "the nodes) | local (each stage's on its node; VWs alike) (harness sim: both where the policy allows, "
           "unless given)", default="default"),
    Option("staleness", non_negative_int, "D, the most waves a virtual worker may run ahead of the slowest (0: "
           "BSP-like)", default=0),
    Option("in_flight", positive_int, "N_m, minibatches in flight per virtual worker (default: the fastest that "
           "fits, up to Max_m)"),
)

register(System(
    "hetpipe", "HetPipe: virtual workers (pipelines over heterogeneous GPUs), data parallel under Wave Synchronous "
    "Parallel through a sharded parameter server (--policy, --ps-placement, --staleness, --in-flight; the simulator "
    "also runs it on --model vgg19|resnet152)",
    train="harness.systems.hetpipe.runtime:train_hetpipe", layout_rule="harness.systems.hetpipe.rule:place_hetpipe",
    options=OPTIONS, trains_cnn=True,
    simulate_layout="harness.systems.hetpipe.sim:simulate_wsp_layout", run_length=True,
    cross_node_bytes="harness.systems.hetpipe.sim:wsp_layout_cross_node_bytes",
    sweep_by_rule=False, simulate={"cnn": "harness.systems.hetpipe.sim:candidates_hetpipe"}, style=("#9467bd", "D"),
    report_section="harness.systems.hetpipe.report:SECTION",
))
