"""HetPipe in `harness sim` of the CNN workload: one candidate per policy and parameter-server placement."""
from __future__ import annotations

from ...scenario import Topology
from ...sim.cnn import CNNCandidate, CNNOptions
from ...workloads.gpt_layers import layer_chain
from ...workloads.layers import LayerProfile
from . import planning as hp
from .policies import POLICIES


def candidates_hetpipe(topo: Topology, model: LayerProfile, batch: int, opts: CNNOptions, progress=None) -> list[CNNCandidate]:
    """One candidate per policy (the one given, else np, ed and hd) and parameter-server placement (the one given,
    else default and, where the policy's VWs are alike, local)."""
    from ...plan import systems as registry

    given = opts.options
    resolved = registry.get("hetpipe").resolve_options(given)  # given over the defaults
    out = []
    for policy in [given["policy"]] if "policy" in given else POLICIES:
        for placement in [given["ps_placement"]] if "ps_placement" in given else hp.PLACEMENTS:
            if "ps_placement" not in given and placement == "local" and not (
                    policy in POLICIES and POLICIES[policy].identical_vws):
                continue
            p = hp.plan(topo, model, batch, policy, placement, resolved["staleness"], opts.gpus, resolved["in_flight"],
                        profiles=opts.profiles)
            out.append(_of_plan("hetpipe", p, opts.gpus))
            if progress:
                progress(f"{policy}-{placement}")
    return out


def _of_plan(system: str, p: hp.HetPipePlan, gpus: str | None) -> CNNCandidate:
    r = p.result
    config = {"policy": p.policy, "placement": p.placement, "N_m": p.in_flight, "D": p.staleness,
              "max_N_m": p.max_in_flight, "gpus": gpus or "all", "vws": [list(vw.devices) for vw in p.vws],
              "stages": [[list(s) for s in vw.stages] for vw in p.vws]}
    return CNNCandidate(system, config, r.seconds_per_wave, r.samples_per_s, p.samples_per_wave,
                        p.cross_node_bytes, len(p.devices),
                        details={"sync_seconds": p.sync_seconds,
                                 "max_clock_distance": max(r.distance_at_resume, default=0)})



def _stage_phases(cfg, split, k: int, mb: int, profile) -> dict[str, float]:
    """Stage k's forward, backward and local update on `profile` (the compute model's times, as the runtime's
    pacer takes them: a GPT's blocks, or a CNN's layers)."""
    from ...compute import layer_stage_phase_seconds, rank_phase_seconds

    if isinstance(cfg, LayerProfile):
        return layer_stage_phase_seconds(cfg.layers, split, k, mb, profile)
    return rank_phase_seconds(cfg, split, k, mb, profile, False, 1, vocab_parallel=False)


def _cut_bytes(chain: LayerProfile, split, k: int, mb: int, bpv: int) -> float:
    """The activation stage k sends on (its last layer's output; the gradient back is as large)."""
    return float(chain.layers[sum(split[:k + 1]) - 1].out_values * mb * bpv)


def simulate_wsp_layout(links, profiles, cfg, batch: int, lay, mb: int, bpv: int,
                        iterations: tuple[int, int] | None = None, options: dict | None = None) -> tuple[float, float]:
    """The model `sim compare` holds a real HetPipe run against (runtime.py): (seconds per iteration of
    `batch` samples, the busiest device's compute in it). Every VW of the layout with its stages' forward,
    backward and local update on its devices (the compute model's times, harness/compute/), its
    activations and gradients between stages over the links (the library's rendezvous included), and the
    wave's push and pull: each stage sends its blocks' fp32 update to their shards at once, the slowest
    shard's transfer is the push, and a pull is a request and the weights back (wsp.simulate).
    `cfg`: a GPTConfig, or a CNN's LayerProfile (its layers are the blocks).
    `iterations` (warm-up, timed) of a measured run: its own length, whose timed iterations' mean is the figure
    (a run of D + 1 waves or fewer never reaches WSP's gate, and pulls nothing); None: the steady state.
    `options`: HetPipe's (hetpipe.OPTIONS); what they decided is in the layout's wsp section, read from there."""
    import numpy as np

    from . import wsp
    from .planning import BYTES_PER_VALUE, VirtualWorker

    hosts = lay.wsp.ps_hosts
    chain = layer_chain(cfg)
    block_bytes = [layer.params * BYTES_PER_VALUE for layer in chain.layers]
    hop = lambda a, b, act: (links.delay_s[a, b] * (1 + links.protocol.p2p_handshake)  # noqa: E731
                             + (0.0 if a == b else float(links.serialization_s(a, b, act))))
    per_vw = batch // (lay.dp * mb)  # minibatches of every VW in an iteration
    vws, push, pull, busiest = [], 0.0, 0.0, 0.0
    for pipe in lay.replica_pipelines():
        devs, split = pipe.devices, pipe.layers_per_stage
        phases = [_stage_phases(cfg, split, k, mb, profiles[d]) for k, d in enumerate(devs)]
        fwd = tuple(p["forward"] for p in phases)
        bwd = tuple(p["backward"] + p["optimizer"] for p in phases)  # the local update follows each backward
        for k, (d, (a, b)) in enumerate(zip(devs, pipe.stages)):
            to = {}
            for blk in range(a, b):
                to[hosts[blk]] = to.get(hosts[blk], 0.0) + block_bytes[blk]
            for h in (set(hosts) if k == 0 else to):  # the first stage's pull waits on every shard
                ser = 0.0 if h == d else float(links.serialization_s(d, h, to.get(h, 0.0)))
                if h in to:
                    push = max(push, links.delay_s[d, h] + ser)
                pull = max(pull, 2 * links.delay_s[d, h] + ser)
        cuts = [_cut_bytes(chain, split, k, mb, bpv) for k in range(len(devs) - 1)]
        vws.append(VirtualWorker(devs, pipe.stages, fwd, bwd,
                                 tuple(hop(devs[k], devs[k + 1], cuts[k]) for k in range(len(devs) - 1)),
                                 tuple(hop(devs[k + 1], devs[k], cuts[k]) for k in range(len(devs) - 1)),
                                 (0.0,) * len(devs), (0.0,) * len(devs)))
        busiest = max(busiest, per_vw * float(np.max(np.add(fwd, bwd))))
    N = lay.wsp.in_flight
    if iterations is None:
        r = wsp.simulate(vws, N, mb, lay.wsp.staleness, push, pull)
        return batch / r.samples_per_s, busiest
    warmup, timed = iterations
    waves = -(-(warmup + timed) * per_vw // N)  # whole waves that hold the run's minibatches
    r = wsp.simulate(vws, N, mb, lay.wsp.staleness, push, pull, waves=max(waves, 2))
    return r.run_seconds(per_vw, warmup, timed), busiest


def wsp_layout_cross_node_bytes(region, cfg, batch: int, lay, mb: int, bpv: int,
                                options: dict | None = None) -> float:
    """The payload a HetPipe run on `lay` sends between devices of different nodes (`region[d]`) in an
    iteration of `batch` samples, in the steady state simulate_wsp_layout models: every minibatch's
    activations forward and their gradients back at each cut, and every wave each stage's push of its blocks'
    fp32 update to their shards and the pull of their weights back (the names a pull waits on left out).
    `options`: its own, which the layout already carries."""
    from .planning import BYTES_PER_VALUE

    hosts = lay.wsp.ps_hosts
    chain = layer_chain(cfg)
    block_bytes = [layer.params * BYTES_PER_VALUE for layer in chain.layers]
    per_vw = batch // (lay.dp * mb)  # minibatches of every VW in an iteration
    waves = per_vw / lay.wsp.in_flight
    out = 0.0
    for pipe in lay.replica_pipelines():
        devs, split = pipe.devices, pipe.layers_per_stage
        out += per_vw * sum(2 * _cut_bytes(chain, split, k, mb, bpv)
                            for k in range(len(devs) - 1) if region[devs[k]] != region[devs[k + 1]])
        for d, (a, b) in zip(devs, pipe.stages):
            out += waves * 2 * sum(block_bytes[blk] for blk in range(a, b) if region[hosts[blk]] != region[d])
    return float(out)
