"""One training run end to end: place, launch, collect, write records and manifest.

`plan_run` turns a `RunRequest` into a `RunSpec` (placement from the scheduler for
`ours`, a seeded random assignment for `ours-random`); `execute` launches the ranks
(loopback or the emulated cluster), merges their per-iteration figures into
`IterationRecord`s and writes results/<scenario>/<run-id>/ atomically. A run that
fails leaves manifest.json with status `failed` and the reason, and no records.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..cost import CostModel
from ..errors import HarnessError
from ..model import GPTConfig, c_dp_bytes, c_pp_bytes, get_model, pflop_per_iteration
from ..results import IterationRecord, atomic_write_json, manifest, new_run_id, run_dir, write_records
from ..scenario import Topology, load_scenario
from .bounds import comm_lower_bound
from .layout import PipelineLayout
from .runner import IterationStats, RunSpec, merge_stats

OURS_SYSTEMS = ("ours", "ours-random")
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class RunRequest:
    """What `harness run` asks for (CLI flags, one to one)."""

    scenario: str
    system: str = "ours"
    devices: int | None = None
    model: str = "tiny"
    layers: int | None = None
    batch: int = 8
    micro_batch: int = 1
    iters: int = 3
    warmup: int = 1
    bandwidth_scale: float = 1.0
    network: str = "emulated"  # emulated | none
    kernel: str = "auto"  # emulated: auto | host | uml (network/kernel.py)
    seed: int = 0
    scheduler: str | None = None  # ours: ga (default) | ga-kl | random | exhaustive | identity
    d_pp: int | None = None
    d_dp: int | None = None
    dp_sync: str = "sharded-ps"
    recompute: bool | None = None  # ours: activation recomputation; default on for cuda, off for cpu
    schedule: str | None = None  # ours: gpipe (default) | 1f1b; baselines: their default (1f1b)
    lr: float = 0.1
    dtype: str = "fp32"
    device_type: str = "cpu"
    budget: int = 2000
    timeout_s: float = 600.0
    results_root: Path | None = None
    run_id: str | None = None
    extra_layout: dict = field(default_factory=dict)  # baselines: a full layout (e.g. from `harness tune`)
    # Baseline layout flags (harness/train/baselines/layout.py: layout_from_flags).
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero: int | None = None
    rank_order: str = "default"  # or a seed of a random layout (ours-random's permutation)


def default_degrees(devices: int, layers: int) -> tuple[int, int]:
    """(D_PP, D_DP) as square as possible with the pipeline on the longer side (the paper's
    8 x 8 for 64 devices; 8 -> 4 x 2, 4 -> 2 x 2), D_PP limited by the layer count."""
    for d_dp in sorted((d for d in range(1, devices + 1) if devices % d == 0), key=lambda d: abs(d - math.sqrt(devices))):
        d_pp = devices // d_dp
        if d_pp >= d_dp and d_pp <= layers:
            return d_pp, d_dp
    raise HarnessError(f"--devices: cannot split {devices} devices into stages of a {layers}-layer model")


@dataclass
class Placement:
    layout: PipelineLayout
    scheduler: str
    cost: dict  # cost model figures of this exact assignment: dp, pp, total (seconds)
    c_pp_bytes: float
    c_dp_bytes: float
    comm_bound: dict  # bounds.comm_lower_bound of this assignment (seconds)


def place(topo: Topology, cfg: GPTConfig, req: RunRequest, d_pp: int, d_dp: int) -> Placement:
    """Assign tasklets to devices: the scheduler for `ours`, a random permutation for `ours-random`."""
    bpv = BYTES[req.dtype]
    c_pp, c_dp = c_pp_bytes(cfg, req.batch, d_dp, bpv), c_dp_bytes(cfg, d_pp, bpv)
    # Schedule for the network the run will see: --bandwidth-scale changes the weight of
    # bandwidth against delay.
    topo = scaled(topo, req.bandwidth_scale)
    model = CostModel(topo, d_pp, d_dp, c_pp, c_dp)
    scheduler = req.scheduler or ("random-assignment" if req.system == "ours-random" else "ga")
    if req.system == "ours-random" and scheduler != "random-assignment":
        raise HarnessError(f"--scheduler: ours-random is the random assignment (got {scheduler!r}); "
                           "use --system ours --scheduler ...")
    if scheduler == "random-assignment":
        # The paper's ablation ("ours without scheduler"): a seeded random sigma, used as is.
        pipelines = np.random.default_rng(req.seed).permutation(topo.n).reshape(d_dp, d_pp)
    elif scheduler == "identity":
        pipelines = np.arange(topo.n).reshape(d_dp, d_pp)
    else:
        from ..scheduler import schedule

        pipelines = np.asarray(schedule(topo, d_pp, d_dp, c_pp, c_dp, scheduler=scheduler, seed=req.seed,
                                        budget=req.budget).pipelines)
    total = model.pipeline_cost(pipelines)
    dp = model.datap_cost(pipelines.T)
    layout = PipelineLayout(d_pp, d_dp, tuple(tuple(int(x) for x in p) for p in pipelines),
                            dp_sync=req.dp_sync, schedule=req.schedule or "gpipe",
                            recompute=req.recompute if req.recompute is not None else req.device_type == "cuda")
    bound = comm_lower_bound(topo, layout, cfg, req.batch, req.micro_batch, 1.0, bpv)
    return Placement(layout, scheduler, {"dp": dp, "pp": total - dp, "total": total}, c_pp, c_dp,
                     {"pipeline": bound.pipeline_s, "dp": bound.dp_s, "total": bound.total_s})


def scaled(topo: Topology, bandwidth_scale: float) -> Topology:
    """The topology with every bandwidth multiplied by `bandwidth_scale` (delays unchanged)."""
    if bandwidth_scale == 1.0:
        return topo
    return replace(topo, bandwidth_gbps=np.asarray(topo.bandwidth_gbps) * bandwidth_scale)


@dataclass
class Plan:
    spec: RunSpec
    topo: Topology
    placement: Placement | None  # ours only
    degrees: tuple[int, int, int]  # (D_TP, D_PP, D_DP) for the records


def plan_run(req: RunRequest) -> Plan:
    """Validate the request and build the spec every rank receives (user errors raise here,
    before any rank starts)."""
    if req.network not in ("emulated", "none"):
        raise HarnessError(f"--network: must be emulated or none (got {req.network!r})")
    topo = load_scenario(req.scenario, devices=req.devices)
    cfg = get_model(req.model, req.layers)
    placement = None
    if req.system in OURS_SYSTEMS:
        for flag, v in (("--tp", req.tp), ("--pp", req.pp), ("--dp", req.dp), ("--zero", req.zero)):
            if v is not None:
                raise HarnessError(f"{flag}: a baseline flag; {req.system} takes --d-pp/--d-dp")
        d_pp, d_dp = (req.d_pp, req.d_dp) if req.d_pp and req.d_dp else default_degrees(topo.n, cfg.layers)
        if req.d_pp and not req.d_dp:
            d_pp, d_dp = req.d_pp, topo.n // req.d_pp
        if req.d_dp and not req.d_pp:
            d_pp, d_dp = topo.n // req.d_dp, req.d_dp
        if d_pp * d_dp != topo.n:
            raise HarnessError(f"--d-pp/--d-dp: {d_pp} x {d_dp} != {topo.n} devices")
        if d_pp > cfg.layers:
            raise HarnessError(f"--d-pp: {d_pp} stages exceed the {cfg.layers} layers of {cfg.name}")
        if req.batch % (d_dp * req.micro_batch):
            raise HarnessError(f"--batch: {req.batch} is not a multiple of D_DP x micro-batch = {d_dp} x {req.micro_batch}")
        req = replace(req, schedule=req.schedule or "gpipe")
        placement = place(topo, cfg, req, d_pp, d_dp)
        layout, degrees = placement.layout.to_json(), (1, d_pp, d_dp)
    else:
        from .baselines.layout import plan_layout
        from .runner import get_system

        get_system(req.system)  # unknown system: one line, now
        flags = dict(tp=req.tp, pp=req.pp, dp=req.dp, zero=req.zero, ranks=req.rank_order)
        if req.schedule:
            flags["schedule"] = req.schedule
        layout, degrees = plan_layout(req.system, cfg, topo.n, req.batch, req.micro_batch,
                                      layout=req.extra_layout or None, **flags)
    run_id = req.run_id or new_run_id(req.system)
    spec = RunSpec(
        run_id=run_id, scenario=topo.name, system=req.system,
        backend="emu" if req.network == "emulated" else "local",
        kernel="none",  # the emulated launcher fills in host|uml once it knows
        devices=topo.n, model=req.model, layers=cfg.layers, batch=req.batch, micro_batch=req.micro_batch,
        iters=req.iters, warmup=req.warmup, seed=req.seed, bandwidth_scale=req.bandwidth_scale, lr=req.lr,
        dtype=req.dtype, device_type=req.device_type, layout=layout,
        timeout_s=min(req.timeout_s, 300.0),
    )
    return Plan(spec, topo, placement, degrees)


def to_records(spec: RunSpec, stats: list[IterationStats], d_pp: int, d_dp: int, d_tp: int = 1) -> list[IterationRecord]:
    cfg = spec.cfg
    pflop = pflop_per_iteration(cfg, spec.batch)
    cfg_json = json.dumps(spec.layout, sort_keys=True)
    return [
        IterationRecord(
            run_id=spec.run_id, scenario=spec.scenario, system=spec.system, backend=spec.backend,
            kernel=spec.kernel, devices=spec.devices, d_pp=d_pp, d_dp=d_dp, model=spec.model,
            layers=cfg.layers, hidden=cfg.hidden, seq=cfg.seq, batch=spec.batch,
            micro_batch=spec.micro_batch, seed=spec.seed, bandwidth_scale=spec.bandwidth_scale,
            iteration=spec.warmup + k, seconds=s.seconds, pflop=pflop, pflops=pflop / s.seconds,
            tokens_per_s=spec.batch * cfg.seq / s.seconds, compute_seconds=s.compute_seconds,
            exposed_comm_seconds=s.exposed_comm_seconds, loss=s.loss, d_tp=d_tp, config=cfg_json,
        )
        for k, s in enumerate(stats)
    ]


def _launch(spec: RunSpec, topo: Topology, req: RunRequest, out: Path) -> tuple[str, list[list[IterationStats]], dict]:
    """Run the ranks; returns (kernel, per-rank stats, extra manifest fields)."""
    if req.network == "none":
        from .runner import run_local

        run = run_local(spec, topo.n, timeout_s=req.timeout_s)
        return "none", [r.stats for r in run.ranks], {}
    from .emulated import run_in_emulated_cluster

    return run_in_emulated_cluster(spec, topo, timeout_s=req.timeout_s, kernel=req.kernel,
                                   log_path=out / "ranks.log")


class _Interrupted(BaseException):
    pass


def execute(req: RunRequest) -> Path:
    """Run `req`; returns the run directory. Raises HarnessError (after writing a failed manifest)."""
    return record_run(req, plan_run(req), lambda spec, topo, out: _launch(spec, topo, req, out))


def record_run(req: RunRequest, plan: Plan, launch) -> Path:
    """Write the manifest (running), call `launch(spec, topo, out) -> (kernel, per-rank stats,
    extra manifest fields)`, then the records and the final manifest; `failed` + reason on any error."""
    spec, topo, placement = plan.spec, plan.topo, plan.placement
    d_tp, d_pp, d_dp = plan.degrees
    out = run_dir(spec.scenario, spec.run_id, req.results_root)
    info = {
        "spec": spec.to_json(),
        "host_cpus": os.cpu_count(),  # emulated ranks share them (sim compare's cpu load)
        "network": req.network,
        "placement": None if placement is None else {
            "scheduler": placement.scheduler, "pipelines": [list(p) for p in placement.layout.pipelines],
            "cost_model_s": placement.cost, "comm_lower_bound_s": placement.comm_bound,
            "c_pp_bytes": placement.c_pp_bytes, "c_dp_bytes": placement.c_dp_bytes,
        },
    }
    atomic_write_json(out / "manifest.json", manifest(spec.run_id, "running", **info))

    def on_term(signum, frame):
        raise _Interrupted(f"terminated by {signal.Signals(signum).name}")

    old = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    t0 = time.monotonic()
    try:
        kernel, per_rank, extra = launch(spec, topo, out)
        spec = replace(spec, kernel=kernel)
        stats = merge_stats(per_rank, shared_clock=spec.backend != "cluster")  # cluster: one clock per host
        records = to_records(spec, stats, d_pp, d_dp, d_tp)
        write_records(out / "records.csv", records)
        atomic_write_json(out / "manifest.json", manifest(
            spec.run_id, "ok", wall_seconds=time.monotonic() - t0, kernel=kernel, **info, **extra))
        return out
    except (HarnessError, _Interrupted, KeyboardInterrupt, Exception) as e:
        reason = str(e) or type(e).__name__
        if isinstance(e, KeyboardInterrupt):
            reason = "interrupted"
        atomic_write_json(out / "manifest.json", manifest(
            spec.run_id, "failed", reason=reason, wall_seconds=time.monotonic() - t0, **info))
        if isinstance(e, HarnessError):
            raise
        if isinstance(e, (KeyboardInterrupt, _Interrupted)):
            raise KeyboardInterrupt from None
        raise HarnessError(f"run {spec.run_id} failed: {type(e).__name__}: {e}") from e
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
