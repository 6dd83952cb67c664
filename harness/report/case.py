"""One case of the paper as one page: `report.md` over what `make scenario-N` wrote to results/<case>/.

The page says for every table whether it is measured (emulated runs on this machine) or simulated (the
cost model and the simulator at paper scale), and which commit and machine made it, so a reader can tell a
prediction from a measurement without reading the Makefile."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pandas as pd

from ..errors import HarnessError
from ..plan import systems as registry
from ..regress import machine
from ..files import atomic_write_text
from ..results import git_commit

# What `make scenario-N` writes below its directory (see the Makefile and results/README.md).
REQUIRED = ("scenario/summary.txt", "schedule-ga.json", "compare/compare.csv", "sim.json", "emu/runs.csv",
            "sim-vs-emu.csv")
#: Written by older `make scenario-N` (a calibration on the compared runs themselves); read when present, to say so
CALIBRATION = "emu-profile.json"


def write_case_report(case_dir: Path) -> Path:
    """results/<case>/report.md from the outputs beside it; one line naming the first missing output."""
    case_dir = Path(case_dir)
    missing = [p for p in REQUIRED if not (case_dir / p).is_file()]
    if missing:
        raise HarnessError(f"{case_dir}: {missing[0]}: missing (run `make scenario-N` first; it writes every "
                           f"output this report reads: {', '.join(REQUIRED)})")
    path = case_dir / "report.md"
    atomic_write_text(path, render(case_dir))
    return path


def render(d: Path) -> str:
    sim = json.loads((d / "sim.json").read_text())
    ga = json.loads((d / "schedule-ga.json").read_text())
    runs = pd.read_csv(d / "emu/runs.csv")
    manifests = [json.loads(p.read_text()) for p in sorted((d / "emu").rglob("manifest.json"))]
    summary = (d / "scenario/summary.txt").read_text().rstrip()
    first = summary.splitlines()[0]
    L = [f"# {ga['scenario']}: {first.split(': ', 1)[1] if ': ' in first else first}", ""]
    L += _provenance(manifests)
    L += ["## What is measured, what is simulated", "",
          "| output | kind | scale |", "|---|---|---|",
          "| scenario summary, delay and bandwidth heatmaps | input (the scenario file) | paper (64 devices) and "
          "the 8-device version |",
          "| GA schedule, scheduler comparison | simulated: the paper's cost model (sec. 3) | paper |",
          "| simulator per system | simulated: `harness sim` from FLOPs, device profile and links | paper |",
          "| emulated runs (`emu/runs.csv`, `pflops.png`, `iterations.png`) | **measured** on this machine: "
          "CPU processes, links shaped by tc/netem; each run says whether it measured the network or the host "
          "(the emulated CPU's headroom) | 8 devices, tiny GPT |",
          "| simulator vs emulated runs (`sim-vs-emu.csv`) | simulated: " + _prediction_source(d) +
          " | 8 devices, tiny GPT |", ""]
    L += ["## Scenario", "", "Paper scale:", "", "```", summary, "```", ""]
    small = d / "scenario-8/summary.txt"
    images = ["![delay](scenario/delay.png) ![bandwidth](scenario/bandwidth.png)", ""]
    if small.is_file():
        L += ["The emulated version (how it was chosen: the comment at the top of the scenario file):", "",
              "```", small.read_text().rstrip(), "```", ""]
        images += ["8 devices:", "", "![delay](scenario-8/delay.png) ![bandwidth](scenario-8/bandwidth.png)", ""]
    L += images
    L += _schedule(d, ga)
    L += _simulated(sim)
    L += _measured(runs, manifests)
    L += _sim_vs_emu(d)
    L += paper_ratios(runs)
    return "\n".join(L) + "\n"


def _prediction_source(d: Path) -> str:
    """Where the simulator's compute speed beside the emulated runs came from."""
    if (d / CALIBRATION).is_file():
        return (f"compute calibrated on the compared runs themselves (`{CALIBRATION}`, written by an older "
                f"`make scenario-N`): part of the agreement is fitted")
    return ("compute from the compute model (the scenario's GPU table at each run's time dilation), the same the "
            "runs were paced to: nothing fitted on the runs it is compared with")


#: The paper's claims a case's emulated runs can be set beside (report/sim_text.PAPER): (claim, paper's ratio key,
#: the faster role, the slower role (plan/systems.PAPER_ROLES), whether the slower's slowest run counts ("up to"));
#: case 5's headline and the scheduler's gain over random placement
CLAIMS = (("ours vs Megatron (case 5)", "case5_vs_megatron", "ours", "megatron", False),
          ("ours vs DeepSpeed (case 5)", "case5_vs_deepspeed", "ours", "deepspeed", False),
          ("scheduler vs random placement (up to)", "scheduler_max", "ours", "ours-random", True))
#: A measured ratio within this factor of the paper's reproduces its magnitude
MAGNITUDE = 1.25


def paper_ratios(runs: pd.DataFrame) -> list[str]:
    """The measured ratios beside the paper's, a verdict each: reproduced (within MAGNITUDE of the paper's),
    the same direction (faster, by a different amount), or not reproduced. A ratio over runs that measured the
    host says so (their times are not the links')."""
    from .sim_text import PAPER

    per = runs.groupby("system").agg(seconds=("seconds", "min"), seconds_max=("seconds", "max"),
                                     bound=("host_bound", "sum") if "host_bound" in runs else ("runs", "size"))
    if "host_bound" not in runs:
        per["bound"] = 0
    L = ["## Against the paper's claims", "",
         "The paper's runs are GPT3-XL on 64 V100s; these are a tiny GPT on 8 emulated devices with the links scaled "
         "and time dilated, so a magnitude is not expected to carry over; the direction should. Measured: mean "
         "iteration seconds of the slower system over the faster's (the scheduler: the slowest random placement "
         "over ours).", "", "| claim | paper | measured | verdict |", "|---|---|---|---|"]
    roles = registry.paper_systems()
    for claim, key, fast_role, slow_role, up_to in CLAIMS:
        fast, slow = roles[fast_role], roles[slow_role]
        if fast not in per.index or slow not in per.index:
            L.append(f"| {claim} | {PAPER[key]}x | - | no {slow if fast in per.index else fast} run |")
            continue
        ratio = float(per.seconds_max[slow] if up_to else per.seconds[slow]) / float(per.seconds[fast])
        paper = float(PAPER[key])
        if ratio <= 1:
            verdict = "not reproduced: not faster"
        elif paper / MAGNITUDE <= ratio <= paper * MAGNITUDE:
            verdict = "reproduced"
        else:
            verdict = f"same direction, {'smaller' if ratio < paper else 'larger'} than the paper's"
        if per.bound[fast] or per.bound[slow]:
            verdict += " (host-bound runs: measured the host)"
        L.append(f"| {claim} | {paper:g}x | {ratio:.2f}x | {verdict} |")
    return L + [""]


def _provenance(manifests: list[dict]) -> list[str]:
    m = machine()
    commits = sorted({x.get("git_commit", "unknown") for x in manifests}) or ["none"]
    kernels = sorted({str(x.get("kernel")) for x in manifests})
    versions = manifests[0].get("versions", {}) if manifests else {}
    return [f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `harness report case` at commit "
            f"`{git_commit()}`; the emulated runs were made at commit(s) {', '.join(f'`{c}`' for c in commits)}.",
            "",
            f"Machine: {m['cpu']} ({m['cpus']} CPUs, {m['arch']}), {m['system']} {platform.release()}; "
            f"links shaped by the `{', '.join(kernels)}` kernel; "
            + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", ""]


def _schedule(d: Path, ga: dict) -> list[str]:
    cost = ga["cost"]
    cmp = pd.read_csv(d / "compare/compare.csv")
    final = cmp.loc[cmp.groupby(["scheduler", "seed"]).candidates.idxmax()]
    L = ["## Scheduler (simulated, paper scale)", "",
         f"GA assignment (`schedule-ga.json`, D_PP = {ga['d_pp']} x D_DP = {ga['d_dp']} on {ga['devices']} devices, "
         f"seed {ga['seed']}): modelled communication {cost['total']:.3f} s per iteration "
         f"(data parallel {cost['dp']:.3f} s + pipeline {cost['pp']:.3f} s)" + _bound(ga), "",
         "Best communication cost each scheduler found (`compare/compare.csv`, paper Fig. 4):", "",
         "| scheduler | seed | candidates | best total s | gap to the bound |", "|---|---|---|---|---|"]
    bound = (ga.get("bound") or {}).get("total")
    L += [f"| {r.scheduler} | {r.seed} | {r.candidates} | {r.best_total_s:.3f} | "
          f"{'-' if bound is None else f'{max(0.0, (r.best_total_s - bound) / r.best_total_s):.1%}'} |"
          for r in final.itertuples()]
    return L + ["", "![compare](compare/compare.png)", ""]


def _bound(ga: dict) -> str:
    """The lower bound sentence of an assignment (older assignments carry none)."""
    if not ga.get("bound"):
        return "."
    b = ga["bound"]
    return (f"; no layout costs less than {b['total']:.3f} s (the lower bound of harness/scheduler/bound.py), "
            f"so this one is at most {ga['gap']:.1%} above the best" + (": optimal." if ga["gap"] < 1e-9 else "."))


def _simulated(sim: list[dict]) -> list[str]:
    best = [r for r in sim if r.get("best")]
    if not best:
        return ["## Simulator (paper scale)", "", "`sim.json` holds no best layout.", ""]
    r0 = best[0]
    L = ["## Simulator (simulated, paper scale)", "",
         f"{r0['model']} ({r0['layers']} layers), batch {r0['batch']}, {r0['devices']} devices; the best layout of "
         "each system (`sim.json`, every layout with `best: true` per system):", "",
         "| system | layout | iteration s | PFLOPS |", "|---|---|---|---|"]
    for r in best:
        cfg = {k: v for k, v in (r.get("config") or {}).items() if k not in ("pipelines", "seeds")}
        L.append(f"| {r['system']} | {', '.join(f'{k}={v}' for k, v in cfg.items())} | {r['seconds']:.2f} | "
                 f"{r['pflops']:.3f} |")
    return L + [""]


def _measured(runs: pd.DataFrame, manifests: list[dict]) -> list[str]:
    spec = manifests[0].get("spec", {}) if manifests else {}
    model, net, run = spec.get("model", {}), spec.get("network", {}), spec.get("run", {})
    L = ["## Emulated runs (measured)", "",
         f"{net.get('devices', '?')} devices, {model.get('name', '?')} GPT ({model.get('layers', '?')} layers), "
         f"batch {model.get('batch', '?')}, links at {net.get('bandwidth_scale', '?')} of the scenario's bandwidth; "
         f"{run.get('warmup', '?')} warm-up and {run.get('iters', '?')} timed iteration(s) per run. GFLOPS: the "
         "measured FLOP rate (mean over runs, min-max in brackets); simulated: `sim compare`'s prediction of the "
         "same runs.", "",
         "| system | runs | iteration s | GFLOPS measured | GFLOPS simulated |", "|---|---|---|---|---|"]
    for r in runs.itertuples():
        sim = f"{r.sim_pflops * 1e6:.3g}" if "sim_pflops" in runs and pd.notna(r.sim_pflops) else "-"
        L.append(f"| {r.label} | {r.runs} | {r.seconds:.3f} | {r.pflops * 1e6:.3g} ({r.pflops_min * 1e6:.3g}-"
                 f"{r.pflops_max * 1e6:.3g}) | {sim} |")
    failed = [m for m in manifests if m.get("status") != "ok"]
    if failed:
        L += ["", f"Left out: {len(failed)} run(s) not ok: " +
              "; ".join(f"{m.get('run_id')}: {m.get('status')} ({m.get('reason', '')})" for m in failed)]
    return L + ["", "![pflops](emu/pflops.png)", "", "![iterations](emu/iterations.png)", ""]


def _sim_vs_emu(d: Path) -> list[str]:
    cmp = pd.read_csv(d / "sim-vs-emu.csv")
    source = _prediction_source(d)
    if (d / CALIBRATION).is_file():
        prof = json.loads((d / CALIBRATION).read_text()).get("profiles", {})
        source += ": " + "; ".join(f"{g}: {p['efficiency']['transformer']:.3g} of {p['peak_tflops']:g} TFLOPS "
                                   f"({p['source']})" for g, p in prof.items())
    L = ["## Simulator against the emulated runs", "", f"The simulator's compute: {source}.", "",
         "| system | measured s | simulated s | error | emulated CPU busy | measured |", "|---|---|---|---|---|---|"]
    busy = cmp.cpu_busy if "cpu_busy" in cmp else pd.Series([float("nan")] * len(cmp))
    what = cmp.measured if "measured" in cmp else pd.Series(["unknown"] * len(cmp))
    L += [f"| {r.system} | {r.measured_s:.3f} | {r.simulated_s:.3f} | {r.error * 100:+.1f} % | "
          f"{'-' if pd.isna(b) else f'{b:.2f}'} | {w} |" for r, b, w in zip(cmp.itertuples(), busy, what)]
    busy = cmp.host_load.dropna()
    if (busy >= 0.5).any():
        L += ["", f"{int((busy >= 0.5).sum())} run(s) kept the host's CPUs busy (load >= 0.5: ranks x busiest "
              "compute / (seconds x cores)): the emulated devices slowed each other, which the simulator (a "
              "processor per device) does not model; its prediction is then too fast."]
    return L + [""]
