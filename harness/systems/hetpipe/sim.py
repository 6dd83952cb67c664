"""HetPipe in `harness sim` of the CNN workload: one candidate per policy and parameter-server placement."""
from __future__ import annotations

from ...scenario import Topology
from ...sim.cnn import CNNCandidate, CNNOptions
from ...workloads.cnn import CNNModel
from . import planning as hp
from .policies import POLICIES


def candidates_hetpipe(topo: Topology, model: CNNModel, batch: int, opts: CNNOptions, progress=None) -> list[CNNCandidate]:
    out = []
    explicit = bool(opts.placements)
    for policy in opts.policies or POLICIES:
        for placement in opts.placements or hp.PLACEMENTS:
            if not explicit and placement == "local" and not (policy in POLICIES and POLICIES[policy].identical_vws):
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
