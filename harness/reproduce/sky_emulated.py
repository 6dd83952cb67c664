"""Sky Computing's allocators trained for real at the testbed's scale: the paper's LAN and a world-wide network.

Through the emulated cluster, 8 of `sky`'s penalised P100 nodes (the paper's HPC fabric) and the same 8 in case 5's
world-wide regions (`sky-worldwide`: Sec. VII-A's Internet, where the paper expects communication to dominate),
the tiny GPT's blocks as one pipeline (ours' runtime, one pass of the batch: no micro-batches, as SCAELUM), each
device's compute its P100's modelled time times its penalty, dilated as the probe chooses: even allocation, the
heuristic, the paper's program (HiGHS) and the optimum side by side, each beside the simulator's prediction of it.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..plan.asked import merged
from . import Context
from .claims import Claim, Section
from .emulated import busy, emulate, runs_table, seconds

NETWORKS = {"LAN": "sky", "world-wide": "sky-worldwide"}  # label -> scenario
QUICK_NETWORKS = ("LAN",)
ALLOCATORS = ("even", "sky-heuristic", "sky-mip", "optimal")
MODEL, DTYPE = "tiny", "fp32"  # a CPU rank's model and precision (the run's default)
DEVICES, LAYERS, BATCH = 8, 16, 8  # two blocks a device when even; the batch in one pass
LENGTH = {"iters": 2, "warmup": 1}
QUICK_LENGTH = {"iters": 1, "warmup": 1}
BASE = {"compute": {"model": True}, "model": {"name": MODEL, "layers": LAYERS, "batch": BATCH, "micro_batch": BATCH},
        "layout": {"pp": DEVICES, "dp": 1}}
WHY_TESTBED = ("the tiny GPT's 16 blocks over 8 devices, not BERT's 80 over 15 to 63: an allocation here moves whole "
               "blocks of an eighth of the model, so the directions the paper states are checked, not its numbers")


def emulated(ctx: Context) -> list[Section]:
    """Every allocator on each network, one probe boot and one boot of the runs each."""
    from ..regress import run_figures

    sections = []
    for label, scenario in NETWORKS.items():
        if ctx.quick and label not in QUICK_NETWORKS:
            continue
        base = merged(BASE, {"network": {"scenario": scenario, "devices": DEVICES}})
        length = QUICK_LENGTH if ctx.quick else LENGTH
        asked = {a: merged(base, {"layout": {"allocator": a}, "run": {
            **length, "results_root": str(ctx.out / "emu" / scenario)}}) for a in ALLOCATORS}
        results = emulate(ctx, f"the allocators on {scenario} ({label}, {DEVICES} devices)", asked)
        runs = {a: {**run_figures(r), "busy": busy(r), "blocks": _blocks(r)} for a, r in results.items()}
        sections.append(network_section(label, scenario, runs))
        sections[-1].text += "\n\n" + benchmark_text(scenario, results["even"], runs)
    return sections


def benchmark(scenario: str, run: Path) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Sky Computing's benchmark stage (Sec. IV-B: every device runs the same work; the ratio of their times is
    their relative speed), measured on the devices the run had: even allocation gives every device the same blocks,
    and each rank's computation an iteration is what its device took (the compute model's time of its GPU and
    penalty, as the emulated cluster ran it). Returns the pipeline (devices in stage order) and, per stage, the
    seconds measured and the seconds the devices' profiles give for the same work (time scale included)."""
    from .. import compute as work
    from ..compute.model import get_model
    from ..compute.profiles import device_profiles
    from ..scenario import load_scenario

    manifest = json.loads((run / "manifest.json").read_text())
    config = _layout(run)
    pipeline = [stage[0][0] for stage in config["mesh"]]
    split = [b - a for a, b in config["stages"]]
    measured = np.array(manifest["compute_model"]["rank_compute_seconds"])[pipeline]
    cfg, profiles = get_model(MODEL, LAYERS), device_profiles(load_scenario(scenario, DEVICES), dtype=DTYPE)
    modelled = np.array([sum(work.rank_phase_seconds(cfg, split, k, BATCH, profiles[d], recompute=False).values())
                         for k, d in enumerate(pipeline)]) * manifest["compute_model"]["time_scale"]
    return pipeline, measured, modelled


def benchmark_text(scenario: str, even_run: Path, runs: dict[str, dict]) -> str:
    """The benchmark stage measured (`benchmark`), and the allocations the allocators choose from it: each device's
    time per FLOP scaled by its measured over modelled seconds, beside the allocation that ran (from the profiles)."""
    from ..allocation import allocate, problem_for
    from ..compute.model import get_model
    from ..scenario import load_scenario

    pipeline, measured, modelled = benchmark(scenario, even_run)
    topo = load_scenario(scenario, DEVICES)
    problem = problem_for(get_model(MODEL, LAYERS), topo, pipeline, BATCH, 1, DTYPE, recompute=False)
    benchmarked = replace(problem, seconds_per_flop=problem.seconds_per_flop * measured / modelled)
    rows = "\n".join(f"| {d} | {topo.profiles[d].slowdown:.3g} | {m:.3f} | {p:.3f} | {m / p:.3f} |"
                      for d, m, p in zip(pipeline, measured, modelled))
    chosen = []
    for name in ALLOCATORS[1:]:
        blocks = list(allocate(name, benchmarked).layers_per_device)
        ran = runs.get(name, {}).get("blocks")
        chosen.append(f"{name} {'/'.join(map(str, blocks))}" + (" (as ran)" if blocks == ran else
                                                                 f" (ran {'/'.join(map(str, ran or []))})"))
    return ("The benchmark stage (Sec. IV-B), measured: even allocation gives every device the same two blocks, so "
            "each rank's computation an iteration is its device's time for the same work (the first and last add "
            "the embedding and the head); its ratio to the profiles' scales each device's time per FLOP, and the "
            "allocators solve the program again on it. Seconds an iteration, in pipeline order:\n\n"
            "| device | penalty | measured | profile's | measured / profile's |\n|---|---|---|---|---|\n" + rows +
            "\n\nFrom the benchmark: " + "; ".join(chosen) + " (the program has many allocations of one slowest "
            "stage, and HiGHS returns one of them).")


def _layout(run: Path) -> dict:
    """The layout the run ran on (its records' config: mesh, stages)."""
    from ..results import read_records

    return json.loads(read_records(run / "records.csv")[0]["config"])


def _blocks(run: Path) -> list[int]:
    """Each stage's blocks, as the run ran them."""
    return [b - a for a, b in _layout(run)["stages"]]


def network_section(label: str, scenario: str, runs: dict[str, dict]) -> Section:
    """Figs. 10-11's directions and Sec. IV's gap on one network, measured and predicted (`runs`: allocator ->
    seconds, measured-over-sim, host-bound, busy, blocks); a claim whose runs are not among them is "not run"."""
    measured, predicted = seconds(runs)
    blocks = "; ".join(f"{a} {'/'.join(map(str, r['blocks']))}" for a, r in runs.items())
    s = Section(f"The allocators trained for real: {label} (`{scenario}`, {DEVICES} devices)",
                text=f"The tiny GPT's {LAYERS} blocks as one pipeline over the devices, a batch of {BATCH} in one "
                     "pass; each device's compute its P100's modelled time times its penalty, dilated as the probe "
                     "chose; *simulated* is the simulator's prediction of each run as it ran. Blocks a stage, in "
                     f"pipeline order: {blocks}. Seconds per iteration:\n\n" + runs_table(runs))

    def cut(t, name):
        return 100 * (1 - t[name] / t["even"])

    def gap(t):
        return 100 * (t["sky-heuristic"] / t["optimal"] - 1)

    checks = [(Claim("Figs. 10-11", f"{label}: the heuristic cuts even allocation's training time", "Sec. VI-F",
                     above=0.0, unit="%", why=WHY_TESTBED), ("even", "sky-heuristic"),
               lambda t: cut(t, "sky-heuristic")),
              (Claim("Figs. 10-11", f"{label}: the optimum cuts even allocation's training time", "Sec. VI-G",
                     above=0.0, unit="%", why=WHY_TESTBED), ("even", "optimal"), lambda t: cut(t, "optimal")),
              (Claim("Sec. IV", f"{label}: the heuristic within 10 % of the optimum (training time, heuristic / "
                     "optimum - 1)", "Sec. IV-B", paper=10.0, below=10.0 + 1e-6, unit="%", why=WHY_TESTBED),
               ("sky-heuristic", "optimal"), gap),
              (Claim("Sec. IV", f"{label}: the paper's program solved (HiGHS) trains as fast as the optimum "
                     "(sky-mip / optimum)", "Sec. IV-A", paper=1.0, unit="x",
                     why="the program and the dynamic programme minimise the same slowest stage; where several "
                         "allocations reach it, they may differ in the other stages"),
               ("sky-mip", "optimal"), lambda t: t["sky-mip"] / t["optimal"])]
    for claim, needs, value in checks:
        ran = all(k in runs for k in needs)
        s.add(claim, value(predicted) if ran else None, measured=value(measured) if ran else None)
    return s
