"""Ours in the simulator: its iteration, its candidates in `harness sim`, its model in `sim compare` and the
layouts of its legacy records.

- ours: GPipe over the assignment's pipelines with overlapped point-to-point
  (harness/systems/ours/pipeline.py, overlap runtime), then the sharded parameter server inside every
  data-parallel group C_j, each device starting as soon as its own backward is done, then the optimizer step.
  A compressed exchange (layout.dp_compress: CocktailSGD's) comes after the device's own step: it encodes its
  delta, sends its codec's messages and decodes the means (the codec's memory traffic at the device's memory
  bandwidth, compute/compression.py).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import compute as work
from ... import layout as layouts
from ...allocation import StageModel, allocate_if_it_fits, keeps_even_split
from ...compute import PAPER_DTYPE
from ...compute.compression import Compression, shard_sizes
from ...netmodel import collectives
from ...netmodel.links import Links
from ...compute.model import GPTConfig, stage_params
from ...compute.profiles import ComputeProfile
from ...layout import RANDOM_SEEDS, Layout
from ...sim import pipeline
from ...sim.sweep import PAPER_RUNTIME, Candidate, Simulator, mean_candidate, on_links
from ...sim.systems import SimError, SimResult, check_layers


STEADY_ITERATIONS = 3  # ours: iterations chained to reach the steady-state period (simulate_ours)


def simulate_ours(links: Links, profiles: list[ComputeProfile], cfg: GPTConfig, batch: int,
                  layout: Layout, micro_batch: int = 1, system: str = "ours",
                  dp_bytes: np.ndarray | None = None, ps_mode: str = "grouped",
                  bytes_per_value: int = work.PAPER_BYTES) -> SimResult:
    """The layout's pipelines (D_DP, D_PP), its schedule (gpipe, the paper, or 1f1b), dp_sync (sharded-ps,
    the paper, or allreduce: ring) and recompute, as the trainer runs them. dp_bytes overrides the
    per-stage gradient bytes; ps_mode "grouped" or "rounds" (collectives.sharded_ps)."""
    pipelines = layout.array()[:, :, 0].T  # (D_DP, D_PP); a layout whose pipelines differ: one-line LayoutError
    R, P = pipelines.shape
    check_layers(cfg, P)
    schedule, dp_sync = layout.schedule, layout.dp_sync
    M = work.micro_batches(batch, micro_batch, R, "pipelines")
    fwd, bwd = work.stage_compute(cfg, layout.layers_per_stage, micro_batch, profiles, pipelines,
                                      recompute=layout.recompute)  # (R, P)
    params = stage_params(cfg, list(layout.layers_per_stage))
    opt = np.array([[work.optimizer_seconds(params[j], profiles[d]) for j, d in enumerate(row)]
                    for row in pipelines])  # (R, P)
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    S = pipelines.T  # (P, R)
    fser, fdel = collectives.step_times(links, S[:-1], S[1:], act)
    bser, bdel = collectives.step_times(links, S[1:], S[:-1], act)
    times = pipeline.StageTimes(fwd.T, bwd.T, fser, fdel, bser, bdel, links, S, act)
    grads = (work.stage_param_bytes(cfg, layout.layers_per_stage, bytes_per_value) if dp_bytes is None
             else np.asarray(dp_bytes, dtype=float))
    codec = layout.compression
    encode = decode = np.zeros((P, R))
    if not codec.off:  # the messages as encoded (compute/compression.py), and the codec's work on each device
        grads = np.array([codec.shard_bytes(int(n), R) for n in params], dtype=float)
        work_s = np.array([[codec.device_seconds(int(params[j]), R, profiles[d].memory_bandwidth_gbs,
                                                 profiles[d].slowdown) for d in S[j]] for j in range(P)])  # (P, R, 2)
        encode, decode = work_s[:, :, 0], work_s[:, :, 1]
    # No barrier between iterations: a stage starts the next one when its own sync is done, so a
    # long sync tail of one stage overlaps the next iteration's fill on the others. One iteration
    # from a common start, then STEADY_ITERATIONS - 1 more; the last interval is the period.
    start, ends = None, []
    for _ in range(STEADY_ITERATIONS):
        tl = pipeline.timeline(times, M, schedule, overlap=True, start=start)
        # every stage's sync in one call: they run together (shared NICs carry them all)
        if dp_sync == "sharded-ps" and not codec.off:  # CocktailSGD's order: the replica's step, then the exchange
            end = collectives.sharded_ps(links, S, grads, start=tl.finish + opt.T + encode, mode=ps_mode,
                                         preposted=True) + decode
        elif dp_sync == "sharded-ps":
            # the runtime posts every receive of the iteration up front (harness/systems/ours/dp_sync.py)
            end = collectives.sharded_ps(links, S, grads, start=tl.finish, mode=ps_mode, preposted=True) + opt.T
        elif dp_sync == "allreduce":
            end = collectives.ring_allreduce(links, S, grads, start=tl.finish) + opt.T
        else:
            raise SimError(f"dp_sync: unknown {dp_sync!r} (known: sharded-ps, allreduce)")
        if start is None:  # the first iteration, from a common start: its spans are reported
            first = (tl, end)
        ends.append(float(end.max()))
        start = end
    seconds = ends[-1] - ends[-2] if len(ends) > 1 else ends[0]
    compute = float((M * (fwd + bwd) + opt).max())
    tl, end = first
    return SimResult(
        system, {"pp": P, "dp": R}, seconds, compute,
        pp_comm_seconds=float((tl.fwd_span + tl.bwd_span).max(1).sum()) if P > 1 else 0.0,
        dp_comm_seconds=float((end - tl.finish).max()),
        details={"pipeline_seconds": float(tl.finish.max()), "micro_batches": M, "first_iteration_seconds": ends[0]},
    )



def simulate_allocation(cfg, topo, devices, allocation, batch: int, micro_batch: int, dtype: str = "fp16",
                        recompute: bool = True) -> float:
    """Seconds of one iteration of ours' runtime (GPipe, one pipeline over `devices` in stage order,
    the allocation's uneven stages; harness.allocation.Allocation) in the simulator, at the devices' profiles."""
    from ...compute.profiles import device_profiles

    lay = layouts.from_replicas([(list(devices), allocation.stages)], placement=allocation.allocator,
                                schedule="gpipe", recompute=recompute)
    r = simulate_ours(Links.from_topology(topo), device_profiles(topo, dtype=dtype), cfg, batch, lay,
                      micro_batch, bytes_per_value=work.BYTES_PER_VALUE[dtype])
    return r.seconds


def candidates_ours(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """The scheduler's assignment (cached) with the paper's runtime."""
    codec = _codec(sim)
    pipelines = sim.assignment(cfg, batch, codec=codec)  # placed for the bytes the codec sends
    lay = layouts.from_pipelines(pipelines, cfg.layers, sim.scheduler, **PAPER_RUNTIME, dp_compress=str(codec))
    stages = sim.assigned_stages(cfg, batch, codec)
    lay = replace(lay, stages=stages) if stages is not None else _allocated(sim, lay, cfg, batch)
    r = simulate_ours(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch, ps_mode=sim.ps_mode)
    return [Candidate("ours", {"pp": sim.d_pp, "dp": sim.d_dp, "scheduler": sim.scheduler,
                               "pipelines": pipelines.tolist(), **_allocation_config(sim, lay), **_codec_config(lay)},
                      r.seconds, r.compute_seconds, (sim.schedule_seed,), layout=lay,
                      resimulate=on_links(simulate_ours, sim, cfg, batch, [lay], ps_mode=sim.ps_mode))]


def _allocated(sim: Simulator, lay: Layout, cfg: GPTConfig, batch: int) -> Layout:
    """`lay` with its stages chosen by the simulator's allocator (harness/allocation/) over its
    pipelines, at the simulated devices' profiles, within memory when they fit (else without memory
    limits: the simulator does not model memory); even: as it is."""
    if keeps_even_split(sim.allocator):
        return lay

    micro_batches = max(1, batch // sim.d_dp // sim.micro_batch)
    model = StageModel(cfg, sim.topo, sim.micro_batch, micro_batches, PAPER_DTYPE, lay.recompute, sim.profiles)
    alloc, _ = allocate_if_it_fits(sim.allocator, model, lay.pipelines)  # the simulator does not limit memory
    return replace(lay, stages=alloc.stages)


def _codec(sim: Simulator) -> Compression:
    """The data-parallel codec asked (ours' option dp_compress), none by default."""
    return Compression.parse(sim.options.get("dp_compress") or "none")


def _codec_config(lay: Layout) -> dict:
    return {} if lay.compression.off else {"dp_compress": lay.dp_compress}


def _allocation_config(sim: Simulator, lay: Layout) -> dict:
    return {} if keeps_even_split(sim.allocator) else {"allocator": sim.allocator, "stages": [list(s) for s in lay.stages]}


def candidates_ours_random(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """The paper's runtime on the seeded placements of RANDOM_SEEDS, averaged."""
    lays = [_allocated(sim, replace(lay, dp_compress=str(_codec(sim))), cfg, batch) for lay in sim.random_layouts(cfg)]
    runs = [simulate_ours(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch, system="ours-random",
                                  ps_mode=sim.ps_mode) for lay in lays]
    return [mean_candidate("ours-random", {"pp": sim.d_pp, "dp": sim.d_dp, "placement": "random",
                                  "pipelines": [[list(p) for p in lay.pipelines] for lay in lays],
                                  **({} if keeps_even_split(sim.allocator) else {"allocator": sim.allocator}),
                                  **_codec_config(lays[0])},
                  runs, RANDOM_SEEDS, lays[0],
                  on_links(simulate_ours, sim, cfg, batch, lays, system="ours-random", ps_mode=sim.ps_mode))]


def simulate_ours_layout(links, profiles, cfg, batch: int, lay: Layout, mb: int, bpv: int,
                         options: dict | None = None) -> tuple[float, float]:
    """Ours' runtime (pre-posted receives, the layout's schedule, data-parallel sync and codec: the layout rule
    put the option dp_compress in the layout, so `options` adds nothing)."""
    r = simulate_ours(links, profiles, cfg, batch, lay, mb, bytes_per_value=bpv)
    return r.seconds, r.compute_seconds


def _legacy_ours_opts(conf: dict, device: str) -> dict:
    return dict(schedule=conf.get("schedule", "gpipe"), dp_sync=conf.get("dp_sync", "sharded-ps"),
                recompute=bool(conf.get("recompute", device == "cuda")))


def legacy_ours_layout(rec: dict, conf: dict, cfg, n: int, device: str, schedule_ours) -> Layout:
    """Ours' legacy records: their pipelines, else the scheduler's."""
    opts = _legacy_ours_opts(conf, device)
    if "pipelines" in conf:
        return layouts.from_pipelines(conf["pipelines"], cfg.layers, "recorded", **opts)
    return layouts.from_pipelines(schedule_ours(), cfg.layers, "ga", **opts)


def legacy_random_layout(rec: dict, conf: dict, cfg, n: int, device: str, schedule_ours) -> Layout:
    """ours-random's legacy records: their pipelines, else the seeded placement of the record's seed."""
    opts = _legacy_ours_opts(conf, device)
    if "pipelines" in conf:
        return layouts.from_pipelines(conf["pipelines"], cfg.layers, "recorded", **opts)
    d_pp = int(conf.get("d_pp", rec.get("d_pp") or 1))
    return layouts.seeded(1, d_pp, n // d_pp, cfg.layers, int(rec["seed"]), **opts)


def ours_cross_node_bytes(region, cfg: GPTConfig, batch: int, lay: Layout, mb: int, bpv: int,
                          options: dict | None = None) -> float:
    """Its runs' payload between devices of different nodes (`region[d]`) an iteration: each pipeline's activations
    and their gradients between consecutive stages, and each stage's data-parallel exchange: the sharded parameter
    server's messages (every member's shard to its owner, the owner's sum back to every member), under the layout's
    codec as compute/compression.py counts them, or a ring all-reduce's."""
    groups = lay.array()[:, :, 0]  # (stages, pipelines)
    hops = sum(region[a] != region[b] for pipe in groups.T for a, b in zip(pipe, pipe[1:]))
    total = hops * 2 * work.c_pp_bytes(cfg, batch, lay.dp, bpv)
    codec, params = lay.compression, stage_params(cfg, list(lay.layers_per_stage))
    for members, numel in zip(groups, params):
        k = len(members)
        if lay.dp_sync == "allreduce":
            crossing = sum(region[a] != region[b] for a, b in zip(members, np.roll(members, -1)))
            total += crossing * 2 * (k - 1) / k * numel * bpv
            continue
        sizes = shard_sizes(numel, k)
        message = [x * bpv if codec.off else codec.message_bytes(x) for x in sizes]
        total += sum(2 * message[owner] for i, a in enumerate(members) for owner, b in enumerate(members)
                     if i != owner and region[a] != region[b])
    return float(total)
