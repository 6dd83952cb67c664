"""DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025) on torchft: low-communication
data parallelism, where replicas take H local steps between syncs of their pseudo-gradients.

The implementation its users run: torchft's `local_sgd.DiLoCo` with its `Manager`, Lighthouse and
ProcessGroupGloo (runtime.py); what torchft lacks on a CPU is ours: int8 pseudo-gradients (its quantized
all-reduce is fp8 in Triton kernels, CUDA only) and bf16 ones (codec.py). The knobs and their defaults are in
settings.py; the simulator's model in sim.py. Every device holds the whole model (one stage, every device a
data-parallel rank); `--replicas R` groups them into R replicas of consecutive devices; `--replica-stages P` makes each
replica one of ours' pipelines of P stages (pipeline_replicas.py).
"""
from __future__ import annotations

import numpy as np

from ...compute.model import stage_params
from ...layout import in_rank_order
from ...layout.memory import stage_bytes
from ...plan.arg_types import non_negative_int, number_in, one_of, positive_float, positive_int
from ...plan.systems import Option, System, register
from .settings import WIRE_FORMATS, DiLoCoSettings

D = DiLoCoSettings  # the defaults
OUTER_STATE_BYTES_PER_PARAM = 8  # the parameters at the last sync (fp32, torchft's backup) and the outer momentum

OPTIONS = (
    Option("sync_every", positive_int, "H, inner steps between two syncs of the pseudo-gradients (torchft's "
           "sync_every)", default=D.sync_every),
    Option("outer_lr", number_in(0, 1, low_open=True), "the outer SGD's learning rate, in (0, 1] (DiLoCo: 0.7)",
           default=D.outer_lr),
    Option("outer_momentum", number_in(0, 1, high_open=True), "the outer SGD's Nesterov momentum, in [0, 1) (0: "
           "plain SGD)", default=D.outer_momentum),
    Option("inner_optimizer", one_of("adamw", "sgd"), "adamw (DiLoCo's, at --inner-lr) | sgd (every other "
           "system's, SGD with momentum at --lr)", default=D.inner_optimizer),
    Option("inner_lr", positive_float, "the inner AdamW's learning rate", default=D.inner_lr),
    Option("wire", one_of(*WIRE_FORMATS), "the pseudo-gradients on the wire: fp32 | bf16 | int8 (INTELLECT-1's)",
           default=D.wire),
    Option("replicas", positive_int, "replicas, each of devices / replicas consecutive devices (default: one per "
           "device)", default=D.replicas),
    Option("lighthouse_device", non_negative_int, "the device whose rank runs torchft's Lighthouse (default 0)",
           default=D.lighthouse_device),
    Option("join_timeout", positive_float, "seconds a quorum waits for a replica of the last one that has not asked "
           "(torchft's Lighthouse: 60)", default=D.join_timeout),
    Option("sync_timeout", positive_float, "seconds a replica waits for the others inside a sync or a heal before "
           "it drops the sync (torchft's Manager timeout; default: the run's process-group timeout, 300 s at most)",
           default=D.sync_timeout),
)
PIPELINES = Option("replica_stages", positive_int, "P > 1: a replica is one of ours' pipelines of P stages on P "
                   "devices, placed by ours' scheduler (default 1: a replica of --replicas' devices, each the whole "
                   "model)", default=D.replica_stages)
STREAMING = (
    Option("fragments", positive_int, "Streaming DiLoCo's fragments of consecutive blocks, synced in turn",
           default=2),
    Option("fragment_sync_delay", non_negative_int, "tau: inner steps a fragment's all-reduce overlaps before it is "
           "needed", default=1),
    Option("fragment_update_alpha", number_in(0, 1), "how much of the local parameters a synced fragment keeps, in "
           "[0, 1] (torchft's default 0: the synced ones)", default=D.fragment_update_alpha),
)


def diloco_layout(req, topo):
    """Every device a replica's rank holding the whole model, or (`--replica-stages`) each replica one of ours'
    pipelines; the knobs checked against the devices, the model and the timeline: replicas that leave and come back
    are each a job of their own (train/quorum_agent.py), one device or one pipeline (not --replicas' groups), and
    the Lighthouse's replica stays (the quorum would go with it)."""
    from ...errors import HarnessError

    layers = len(req.model.profile.layers)
    s = DiLoCoSettings.of(req.run.options, topo.n, layers)
    pp = s.replica_stages
    events = topo.timeline.devices if topo.timeline is not None else ()
    leaving = events or req.debug.fault_mode == "preempt"
    if leaving and s.devices_per_replica(topo.n) > 1:
        raise HarnessError(f"--replicas: devices leave and come back in this run: a replica must be one device or "
                           f"one pipeline (--replica-stages; got replicas of {s.devices_per_replica(topo.n)} "
                           "devices in data parallel)")
    if req.layout.recompute and pp == 1:
        raise HarnessError("--recompute: DiLoCo recomputes activations in its pipelines' stages only "
                           "(--replica-stages P > 1); a replica of whole models keeps them")
    if pp > 1:  # replicas that are ours' pipelines (pipeline_replicas.py): ours' layout rule and scheduler
        from dataclasses import replace

        from ..ours.layout import place_ours

        lay, placement = place_ours(replace(req, layout=replace(req.layout, pp=pp, dp=topo.n // pp,
                                                                schedule="1f1b")), topo)
        if min(lay.layers_per_stage) < s.fragments:
            raise HarnessError(f"--fragments: {s.fragments} fragments are cut inside each stage, and the scheduler "
                               f"gave a stage {min(lay.layers_per_stage)} blocks (blocks a stage: "
                               f"{list(lay.layers_per_stage)})")
    else:
        lay, placement = in_rank_order(1, 1, topo.n, layers, schedule="1f1b"), None
    if leaving:
        home = next(tuple(int(d) for d in p) for p in lay.pipelines if s.lighthouse_device in p)
        gone = [e for e in events if e.device in home and e.kind == "preempt"]
        if gone or (req.debug.fault_mode == "preempt" and req.debug.fault_rank in home):
            where = gone[0].where if gone else "--debug fault_rank"
            whose = "" if len(home) == 1 else f"'s replica (devices {list(home)})"
            raise HarnessError(f"--lighthouse-device: device {s.lighthouse_device}{whose} leaves in this run "
                               f"({where}), and the Lighthouse with it: give a device that stays")
    return lay, placement


def diloco_stage_bytes(layout, cfg, batch: int, micro_batch: int, bytes_per_value: int):
    """This harness's runtime's memory plus torchft's DiLoCo state: each stage's parameters at the last sync and
    the outer optimizer's momentum, fp32 each."""
    params = np.asarray(stage_params(cfg, layout.layers_per_stage), dtype=float)
    return stage_bytes(layout, cfg, batch, micro_batch, bytes_per_value) + OUTER_STATE_BYTES_PER_PARAM * params


COMMON = dict(
    train="harness.systems.diloco.runtime:train_diloco", layout_rule=diloco_layout, recovery="quorum",
    quorum_model="harness.systems.diloco.sim:quorum_model",
    fault_phases=("forward", "dp_sync"),
    simulate_layout="harness.systems.diloco.sim:simulate_diloco_layout", run_length=True,  # its syncs: 1 in H
    cross_node_bytes="harness.systems.diloco.sim:layout_cross_node_bytes", stage_memory=diloco_stage_bytes,
    flags=("--recompute",),  # pipeline replicas: ours' stages (default: on for cuda, as ours)
)
register(System(
    "diloco", "DiLoCo on torchft: replicas take --sync-every inner AdamW steps, then average their "
    "pseudo-gradients for an outer Nesterov step (--outer-lr, --outer-momentum, --wire fp32|bf16|int8, --replicas; "
    "--replica-stages P: a replica is one of ours' pipelines of P devices)",
    options=OPTIONS + (PIPELINES,), style=("#17becf", "v"), **COMMON,
))
register(System(
    "streaming-diloco", "Streaming DiLoCo on torchft: DiLoCo syncing --fragments in turn, each all-reduce "
    "overlapping --fragment-sync-delay inner steps (--replica-stages P: each stage of ours' pipelines so cut)",
    options=OPTIONS + STREAMING + (PIPELINES,), style=("#bcbd22", "^"), **COMMON,
))
