"""`harness sim report`'s scale section (issue 58): the planner and the simulator from the paper's 64 devices to
10,240, in one world.

The world is case 5's (eight regions on three continents, the paper's measured links) with 8, 32, 128 and 1,280
devices a region (5-worldwide, worldwide-1k cut down, worldwide-1k, worldwide-10k). The batch grows with the
devices (SAMPLES_PER_DEVICE each, the paper's 1024 on 64 devices): at 10,240 devices and batch 1024 neither
Megatron nor DeepSpeed has a layout (D_DP = 10,240 / (D_TP D_PP) has a factor 5, a power-of-two batch none),
and a replica of ours would run two micro-batches. Per size: the planner's seconds (every option's memory and
bound, the searches the bound does not rule out) with `ga` and with `ga-hetero`, the degrees it chose, and the
simulated iteration of its plan; beside, Megatron's and DeepSpeed's fastest grid layouts in rank order that fit
memory (the paper's default placement; random placements, averaged over seeds, are slower and left out at these
sizes), as harness/layout/memory.py counts it (the simulator itself does not limit memory); where none fits, the
fastest, marked over.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..compute import PAPER_DTYPE, pflop_per_iteration
from ..compute.model import get_model
from ..files import atomic_write_json
from ..plots.figures import save_figure
from ..scenario import load_scenario
from ..scheduler.degrees import MEMORY_AWARE_ALLOCATOR, plan
from ..sim.sweep import PAPER_RUNTIME, Simulator, candidate_memory

SIZES = {64: ("5", None), 256: ("worldwide-1k", 256), 1024: ("worldwide-1k", None), 10240: ("worldwide-10k", None)}
SAMPLES_PER_DEVICE = 16  # the paper's batch 1024 on 64 devices, kept per device
SCHEDULERS = ("ga", "ga-hetero")
BASELINES = ("megatron", "deepspeed")
MODEL = "gpt3-xl"


@dataclass
class ScaleRow:
    devices: int
    scenario: str
    batch: int
    ours: dict = field(default_factory=dict)  # scheduler -> plan_s, d_pp, d_dp, seconds, pflops, memory
    baselines: dict = field(default_factory=dict)  # system -> seconds, pflops, layout, memory; None: no layout


def steps(sizes) -> int:
    """Progress calls of sweep_scale: one per scheduler and one for the baselines, per size."""
    return len(sizes) * (len(SCHEDULERS) + 1)


def sweep_scale(sizes=tuple(SIZES), budget: int = 5000, seed: int = 0, progress=None, on_search=None,
                **sim_kwargs) -> list[ScaleRow]:
    """Every size's row (module docstring). `progress(label)` after each step; `on_search(scheduler)` returns
    the planner's per-option progress callback factory (harness.scheduler.degrees.plan's on_search)."""
    cfg = get_model(MODEL)
    rows = []
    for n in sizes:
        name, devices = SIZES[n]
        topo = load_scenario(name, devices)
        row = ScaleRow(n, topo.name, SAMPLES_PER_DEVICE * n)
        for scheduler in SCHEDULERS:
            t0 = time.perf_counter()
            p = plan(topo, cfg, row.batch, 1, PAPER_DTYPE, scheduler, seed, budget, PAPER_RUNTIME["recompute"],
                     None, on_search and on_search(scheduler))
            planning = time.perf_counter() - t0
            sim = Simulator(topo, d_pp=p.chosen.d_pp, scheduler=scheduler, schedule_seed=seed, budget=budget,
                            allocator=MEMORY_AWARE_ALLOCATOR, placements=("default",), **sim_kwargs)
            sim.prime(cfg, row.batch, p.assignment.to_json())  # ga: the planner's search; ga-hetero searches again
            (c,) = sim.run("ours", cfg, row.batch)
            row.ours[scheduler] = {"plan_s": planning, "d_pp": p.chosen.d_pp, "d_dp": p.chosen.d_dp,
                                   "plan_fits": bool(p.assignment.model["fits_memory"]),
                                   **_simulated(c, topo, cfg, row.batch)}
            if progress:
                progress(f"{n} devices, ours ({scheduler})")
        sim = Simulator(topo, placements=("default",), **sim_kwargs)
        for system in BASELINES:  # the fastest layout that fits memory, else the fastest (marked over)
            cands = [_simulated(c, topo, cfg, row.batch) for c in sim.run(system, cfg, row.batch)]
            fitting = [c for c in cands if c["fits"]] or cands
            row.baselines[system] = min(fitting, key=lambda c: c["seconds"]) if fitting else None
        if progress:
            progress(f"{n} devices, baselines")
        rows.append(row)
    return rows


def _simulated(c, topo, cfg, batch: int) -> dict:
    fit = candidate_memory(c, topo, cfg, batch, 1)
    return {"seconds": c.seconds, "pflops": pflop_per_iteration(cfg, batch) / c.seconds,
            "layout": ", ".join(f"{k}={v}" for k, v in c.config.items() if k in ("tp", "pp", "dp", "zero")),
            "memory": None if fit is None else fit.describe(), "fits": None if fit is None else fit.fits}


def scale_markdown(rows: list[ScaleRow]) -> str:
    L = ["## At scale: 64 to 10,240 devices (issue 58)", "",
         f"Case 5's eight regions and links with 8, 32, 128 and 1,280 devices each; {MODEL}, batch "
         f"{SAMPLES_PER_DEVICE} samples a device; ours on the planner's degrees and plan (its blocks by the "
         f"{MEMORY_AWARE_ALLOCATOR} allocator), the baselines' fastest grid layout in rank order that fits memory. "
         "Simulated "
         "seconds per iteration; planning: the planner's wall-clock seconds on this machine (degrees, searches, "
         "bounds).", "",
         "| devices | batch | planning s (ga / ga-hetero) | degrees (ga / ga-hetero) | ours ga s | ours ga-hetero s "
         "| Megatron best s | DeepSpeed best s | ours vs Megatron | ours vs DeepSpeed |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ga, gh = r.ours["ga"], r.ours["ga-hetero"]
        ours = min(ga["seconds"], gh["seconds"])
        base = [r.baselines[s] for s in BASELINES]
        L.append(f"| {r.devices:,} | {r.batch:,} | {ga['plan_s']:.1f} / {gh['plan_s']:.1f} | "
                 f"{ga['d_pp']}x{ga['d_dp']} / {gh['d_pp']}x{gh['d_dp']} | {_cell(ga)} | {_cell(gh)} | "
                 + " | ".join("no layout" if b is None else f"{_cell(b)} ({b['layout']})" for b in base) + " | "
                 + " | ".join("-" if b is None else f"{b['seconds'] / ours:.2f}x" for b in base) + " |")
    L += ["", "Memory: [fits] or how much the fullest stage is over, as harness/layout/memory.py counts it "
          "(the simulator does not limit memory; a layout over it would not run).", "", "![scale](fig-scale.png)", ""]
    return "\n".join(L)


def _cell(d: dict) -> str:
    return f"{d['seconds']:.2f} [{d['memory'] or '?'}]"


def scale_figure(rows: list[ScaleRow], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r.devices for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in SCHEDULERS:
        a.plot(n, [r.ours[s]["pflops"] for r in rows], "o-", label=f"ours ({s})")
        b.plot(n, [r.ours[s]["plan_s"] for r in rows], "o-", label=s)
    for s in BASELINES:
        pts = [(r.devices, r.baselines[s]["pflops"]) for r in rows if r.baselines[s] is not None]
        a.plot([x for x, _ in pts], [y for _, y in pts], "s--", label=f"{s} (best grid)")
    for ax, title, unit in ((a, "Simulated throughput", "PFLOPS"), (b, "Planning time", "seconds")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def write_scale(out_dir: Path, rows: list[ScaleRow]) -> list[Path]:
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "scale.json", [asdict(r) for r in rows])
    return [out_dir / "scale.json", scale_figure(rows, out_dir / "fig-scale.png")]
