"""Horovod (Sergeev & Del Balso 2018), HetPipe's baseline: synchronous data parallel with a ring all-reduce.

Every GPU that can hold the whole model trains a minibatch per iteration (those that cannot are left
out, as HetPipe's evaluation leaves the RTX 2060s out for ResNet-152); the iteration lasts as long as
the slowest GPU's forward, then the longer of its backward and the ring all-reduce of the fp32
gradients (Horovod reduces gradients as the backward produces them: a perfect overlap, the baseline's
best case). The ring runs in device order, node after node (NCCL's ring crosses each node link once).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...workloads.layers import LayerProfile
from ...compute import training_bytes_per_param
from ...sim.cnn import BYTES_PER_VALUE, DTYPE, GIB, CNNCandidate, CNNOptions, CNNSimError, select_gpus
from ...compute.profiles import device_profiles
from ...plan.systems import System, register
from ...scenario import Topology
from ...netmodel import collectives
from ...netmodel.links import Links


@dataclass
class HorovodResult:
    devices: list[int]  # the GPUs that hold the model
    left_out: list[int]
    seconds: float  # one iteration
    samples_per_s: float
    allreduce_seconds: float
    cross_node_bytes: float  # per iteration


def model_bytes(model: LayerProfile, batch: int) -> float:
    """Memory a GPU needs to train the whole model on one minibatch (fp32, SGD with momentum)."""
    kept = sum(l.kept_values for l in model.layers) * batch * BYTES_PER_VALUE
    return model.params * training_bytes_per_param(BYTES_PER_VALUE) + kept


def simulate(topo: Topology, model: LayerProfile, batch: int, gpus: str | None = None, profiles=None) -> HorovodResult:
    devices = select_gpus(topo, gpus)
    need = model_bytes(model, batch)
    fits = [d for d in devices if topo.profiles[d].memory_gb * GIB >= need]
    if not fits:
        raise CNNSimError(f"horovod: no GPU can hold {model.name} with a minibatch of {batch} "
                           f"({need / GIB:.1f} GiB)")
    profs = profiles if profiles is not None else device_profiles(topo, dtype=DTYPE)
    fwd = max(model.fwd_flop * batch / profs[d].flops_per_s("transformer") for d in fits)
    grads = model.params * BYTES_PER_VALUE
    ring = np.asarray(fits)[None, :]
    allreduce = float(collectives.ring_allreduce(Links.from_topology(topo), ring, grads).max()) if len(fits) > 1 else 0.0
    seconds = fwd + max(2 * fwd, allreduce)
    cross = ring_cross_node_bytes(topo.device_region, fits, grads)
    n = len(fits)
    return HorovodResult(fits, [d for d in devices if d not in fits], seconds, n * batch / seconds, allreduce, cross)


def ring_cross_node_bytes(region, ring: list[int], grad_bytes: float) -> float:
    """What a ring all-reduce of `grad_bytes` over `ring` (in its order) sends between devices of different nodes
    (`region[d]`): each rank sends 2 (n - 1) / n of the data to the next, so each edge that leaves a node moves
    that much."""
    n = len(ring)
    crossing = sum(region[a] != region[b] for a, b in zip(ring, ring[1:] + ring[:1])) if n > 1 else 0
    return crossing * 2 * (n - 1) / n * grad_bytes


def simulate_horovod_layout(links, profiles, cfg, batch: int, lay, mb: int, bpv: int) -> tuple[float, float]:
    """The model `sim compare` holds its runs against: a GPT's, the baselines' runtime it hands them to; a CNN's
    (`cfg` its LayerProfile), runtime.py's loop: each rank its share of the batch, micro-batch by micro-batch
    (the compute model's times), then one ring all-reduce of every gradient in rank order once the slowest rank
    is done, then the update. (seconds an iteration, the busiest device's compute)."""
    if not isinstance(cfg, LayerProfile):
        from ..baselines.sim import simulate_runtime_of_layout

        return simulate_runtime_of_layout(links, profiles, cfg, batch, lay, mb, bpv)
    from ...compute import layer_phase_seconds

    n = lay.devices
    phases = [layer_phase_seconds(cfg.fwd_flop, cfg.params, mb, profiles[d]) for d in range(n)]
    steps = batch // n // mb  # micro-batches of a rank's share
    compute = [steps * (p["forward"] + p["backward"]) for p in phases]
    ring = np.arange(n)[None, :]
    allreduce = float(collectives.ring_allreduce(links, ring, cfg.params * bpv).max()) if n > 1 else 0.0
    update = [p["optimizer"] for p in phases]
    return max(compute) + allreduce + max(update), max(c + u for c, u in zip(compute, update))


def layout_cross_node_bytes(region, cfg, batch: int, lay, mb: int, bpv: int) -> float:
    """Its runs' traffic between nodes an iteration (a GPT's: the baselines' runtime; both: one all-reduce of
    every gradient, a ring in rank order; plan/systems.py `cross_node_bytes`)."""
    from ...workloads.gpt_layers import layer_chain

    return ring_cross_node_bytes(region, list(range(lay.devices)), layer_chain(cfg).params * bpv)


def candidates_horovod(topo: Topology, model: LayerProfile, batch: int, opts: CNNOptions, progress=None) -> list[CNNCandidate]:
    r = simulate(topo, model, batch, opts.gpus, opts.profiles)
    config = {"gpus": opts.gpus or "all", "devices": r.devices, "left_out": r.left_out}
    return [CNNCandidate("horovod", config, r.seconds, r.samples_per_s, len(r.devices), r.cross_node_bytes,
                         len(r.devices), details={"allreduce_seconds": r.allreduce_seconds})]


def horovod_layout(req, topo: Topology):
    """The runtime's layout: every device a replica of the whole model (pp = 1, dp = devices)."""
    from ...layout import in_rank_order

    return in_rank_order(1, 1, topo.n, len(req.model.profile.layers), schedule="1f1b"), None


register(System(
    "horovod", "synchronous data parallel with a ring all-reduce over every device, HetPipe's baseline (the "
    "simulator also runs it on --model vgg19|resnet152)",
    train="harness.systems.horovod.runtime:train_horovod", checkpoints=True, trains_cnn=True,
    fault_phases=("checkpoint",), layout_rule=horovod_layout,
    simulate_layout="harness.systems.horovod:simulate_horovod_layout",
    cross_node_bytes="harness.systems.horovod:layout_cross_node_bytes",
    sweep_by_rule=False, simulate={"cnn": candidates_horovod}, style=("#8c564b", "P"),
))
