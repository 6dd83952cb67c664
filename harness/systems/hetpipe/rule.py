"""HetPipe's layout rule for a real run (`harness run --system hetpipe`): its plan of the model, as a Layout.

The model is planned as a layer profile (a GPT: harness/workloads/gpt_layers.py, one layer per block; the
small CNN: harness/workloads/cnn.py, one layer per unit), with the
planner the simulator uses (planning.plan): the policy's virtual workers, each one's stage order and
partition, N_m and the parameter server's shard placement. The run's minibatch is --micro-batch
samples (HetPipe's minibatch: what one VW's pipeline carries); an iteration of the records is --batch
samples, batch / (VWs x micro-batch) minibatches of every VW. N_m is, unless given, the fastest that
fits and no larger than one iteration's minibatches (so the run's waves complete within its iterations).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...compute import BatchError, micro_batches
from ...compute.profiles import device_profiles
from ...layout import Layout, LayoutError, WSP, from_replicas
from ...plan.request import RunRequest
from ...scenario import Topology
from . import planning
from .setting import HetPipeError

@dataclass(frozen=True)
class WSPPlan:
    """What the manifest says of a HetPipe run's plan (its `placement` entry)."""

    plan: planning.HetPipePlan
    ps_nodes: tuple[str, ...]  # per block: the node of its shard

    def to_json(self, layout: Layout) -> dict:
        p = self.plan
        return {"policy": p.policy, "placement": p.placement, "N_m": p.in_flight, "D": p.staleness,
                "max_N_m_tried": p.max_in_flight,
                "vws": [list(vw.devices) for vw in p.vws], "stages": [[list(s) for s in vw.stages] for vw in p.vws],
                "ps_nodes": list(self.ps_nodes), "ps_hosts": list(layout.wsp.ps_hosts),
                "predicted": {"samples_per_s": p.result.samples_per_s, "seconds_per_wave": p.result.seconds_per_wave,
                              "sync_seconds": p.sync_seconds}}


def place_hetpipe(req: RunRequest, topo: Topology) -> tuple[Layout, WSPPlan]:
    want, m = req.run.options, req.model  # its options, every one (hetpipe.OPTIONS)
    try:
        profile = m.profile
        groups_n = len(planning.group(topo, list(range(topo.n)), want["policy"]))
        per_vw = micro_batches(m.batch, m.micro_batch, groups_n, what="virtual workers")
        p = planning.plan(topo, profile, m.micro_batch, want["policy"], want["ps_placement"], want["staleness"],
                          in_flight=want["in_flight"], profiles=device_profiles(topo, dtype=m.dtype),
                          most_in_flight=per_vw)
        owners = planning.PLACEMENTS[p.placement](topo, profile, p.vws)
    except BatchError as e:
        raise LayoutError(f"{e} (hetpipe: an iteration is --batch samples, minibatches of --micro-batch "
                          "samples shared evenly by the virtual workers)") from None
    except HetPipeError as e:
        raise LayoutError(str(e)) from None
    host = {r: min(d for d in range(topo.n) if topo.device_region[d] == r) for r in set(owners)}
    wsp = WSP(p.in_flight, p.staleness, tuple(host[r] for r in owners), policy=p.policy, ps_placement=p.placement)
    layout = from_replicas([(vw.devices, vw.stages) for vw in p.vws], placement=f"hetpipe-{p.policy}", wsp=wsp)
    return layout, WSPPlan(p, tuple(topo.regions[r].name for r in owners))
