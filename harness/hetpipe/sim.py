"""`harness sim` for the layer-profile CNNs (harness/workloads/cnn.py): HetPipe's and Horovod's candidates and their records.

These systems train VGG-19 / ResNet-152 minibatches, not GPT iterations, so their records are their own
(JSON, one per candidate): system, scenario, model, minibatch, the GPUs used, `config` (HetPipe: policy,
placement, N_m, D, the VWs and their layers; Horovod: the GPUs that hold the model), `seconds` (HetPipe:
per wave, the global clock's steady-state tick; Horovod: per iteration), `samples_per_s`,
`cross_node_bytes` (per wave / iteration) and `best` (the system's fastest candidate).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import hetpipe as hp
from ..workloads.cnn import CNNModel
from ..scenario import Topology
from . import horovod


@dataclass
class CNNOptions:
    policies: tuple[str, ...] = ()  # HetPipe's policies (np, ed, hd or a grouping); () = np, ed, hd
    placements: tuple[str, ...] = ()  # () = default for every policy, and local where the policy allows it (ed)
    staleness: int = 0
    gpus: str | None = None
    in_flight: int | None = None
    profiles: list | None = None  # every device's ComputeProfile at fp32 (None: the scenario's defaults)


@dataclass
class CNNCandidate:
    system: str
    config: dict
    seconds: float
    samples_per_s: float
    minibatches: int  # per wave / iteration
    cross_node_bytes: float
    devices: int
    best: bool = False
    details: dict = field(default_factory=dict)


def candidates_hetpipe(topo: Topology, model: CNNModel, batch: int, opts: CNNOptions, progress=None) -> list[CNNCandidate]:
    out = []
    explicit = bool(opts.placements)
    for policy in opts.policies or hp.POLICIES:
        for placement in opts.placements or ("default", "local"):
            if not explicit and placement == "local" and policy != "ed":
                continue
            p = hp.plan(topo, model, batch, policy, placement, opts.staleness, opts.gpus, opts.in_flight,
                        profiles=opts.profiles)
            out.append(_of_plan("hetpipe", p, opts.gpus))
            if progress:
                progress(f"{policy}-{placement}")
    return out


def _of_plan(system: str, p: hp.Plan, gpus: str | None) -> CNNCandidate:
    r = p.result
    config = {"policy": p.policy, "placement": p.placement, "N_m": p.in_flight, "D": p.staleness,
              "max_N_m": p.max_in_flight, "gpus": gpus or "all", "vws": [list(vw.devices) for vw in p.vws],
              "stages": [[list(s) for s in vw.stages] for vw in p.vws]}
    return CNNCandidate(system, config, r.seconds_per_wave, r.samples_per_s, p.samples_per_wave,
                        p.cross_node_bytes, len(p.devices),
                        details={"sync_seconds": p.sync_seconds,
                                 "max_clock_distance": max(r.distance_at_resume, default=0)})


def candidates_horovod(topo: Topology, model: CNNModel, batch: int, opts: CNNOptions, progress=None) -> list[CNNCandidate]:
    r = horovod.simulate(topo, model, batch, opts.gpus, opts.profiles)
    config = {"gpus": opts.gpus or "all", "devices": r.devices, "left_out": r.left_out}
    return [CNNCandidate("horovod", config, r.seconds, r.samples_per_s, len(r.devices), r.cross_node_bytes,
                         len(r.devices), details={"allreduce_seconds": r.allreduce_seconds})]


def record(c: CNNCandidate, *, run_id: str, topo: Topology, model: CNNModel, batch: int) -> dict:
    return {"run_id": run_id, "scenario": topo.name, "system": c.system, "backend": "sim", "model": model.name,
            "minibatch": batch, "devices": c.devices, "config": c.config, "seconds": c.seconds,
            "samples_per_s": c.samples_per_s, "samples": c.minibatches * batch, "cross_node_bytes": c.cross_node_bytes,
            "cross_node_bytes_per_sample": c.cross_node_bytes / (c.minibatches * batch), "best": c.best, **c.details}
