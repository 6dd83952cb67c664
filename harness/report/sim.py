"""`harness sim report`: the paper's evaluation at paper scale, simulated; tables, figures, report.md.

Sweeps cases 1-5 x layers {24, 32, 40} x batch {1024, 2048, 4096} over every system,
layout and placement (harness.sim.sweep), and FluidStack (App. D.5) for GPT3-XL
(40 layers, batch 4096), GPT3-6.7B and GPT3-13B (batch 1024). The paper's numbers
appear here only as references next to what the simulator predicts.

Tables and figures speak of the paper's roles (systems.PAPER_ROLES: ours, ours-random, megatron,
deepspeed), filled by the registry's report_systems() (the paper's own runtime, dtfm, as ours), and of
`harness-ours`, this harness's runtime on the same schedules, in a column of its own; `CaseSweep.best`
finds the system in each.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compute.model import get_model
from ..compute import pflop_per_iteration
from ..files import atomic_write_json, atomic_write_text
from ..results import manifest, write_records
from ..scenario import PAPER_CASES, Topology, load_scenario
from ..plan import systems as registry
from ..sim.sweep import Candidate, Simulator, prefetch_assignments, record_json, to_record
from .. import plots
from ..plots.figures import save_figure
from .sim_text import MODEL_TEXT, PAPER, disagreements, rng, sources_markdown

CASES = PAPER_CASES
LAYERS = (24, 32, 40)
BATCHES = (1024, 2048, 4096)
FLUIDSTACK_RUNS = (("gpt3-xl", 40, 4096), ("gpt3-6.7b", None, 1024), ("gpt3-13b", None, 1024))
ROLES = registry.PAPER_ROLES
HARNESS_OURS = "harness-ours"  # the harness's own runtime (registry paper_role "ours"), beside the paper's
COLUMNS = ROLES + (HARNESS_OURS,)
FLUIDSTACK_ROLES = ("ours", "ours-random", "megatron", HARNESS_OURS)  # what the report shows of FluidStack (Fig. 7)


def role_systems() -> dict[str, str]:
    """column -> the system the report shows in it (HARNESS_OURS: paper_systems()'s ours)."""
    return {**registry.report_systems(), HARNESS_OURS: registry.paper_systems()["ours"]}


def column_label(role: str) -> str:
    system = role_systems()[role]
    return f"harness {system}" if role == HARNESS_OURS else role if system == role else f"{role} ({system})"


@dataclass
class CaseSweep:
    topo: Topology
    settings: list[tuple[int, int]]  # (layers, batch)
    candidates: dict[tuple[int, int], list[Candidate]] = field(default_factory=dict)

    def best(self, setting, role: str, placement: str | None = None) -> Candidate | None:
        """The fastest candidate of the system in the paper's `role` (in `placement`, if given)."""
        system = role_systems()[role]
        cands = [c for c in self.candidates[setting] if c.system == system
                 and (placement is None or c.config.get("placement") in (None, placement))]
        return min(cands, key=lambda c: c.seconds) if cands else None


def default_workers() -> int:
    """Processes for scheduling: the machine's cores, at most 4 (the GA is single-threaded numpy)."""
    return max(1, min(os.cpu_count() or 1, 4))


def sweep_cases(cases=CASES, layers=LAYERS, batches=BATCHES, model: str = "gpt3-xl", progress=None,
                workers: int | None = None, schedule_progress=None, **sim_kwargs) -> dict[str, CaseSweep]:
    out = {}
    sims = {case: Simulator(load_scenario(case), **sim_kwargs) for case in cases}
    jobs = [(sims[c], get_model(model, L), B) for c in cases for L in layers for B in batches]
    prefetch_assignments(jobs, default_workers() if workers is None else workers, schedule_progress)
    for case in cases:
        sim = sims[case]
        topo = sim.topo
        cs = CaseSweep(topo, [(L, B) for L in layers for B in batches])
        for L, B in cs.settings:
            cs.candidates[(L, B)] = sim.sweep(get_model(model, L), B, _systems(COLUMNS))
            if progress:
                progress(f"{topo.name} L={L} B={B}")
        out[case] = cs
    return out


def sweep_fluidstack(progress=None, workers: int | None = None, schedule_progress=None, **sim_kwargs) -> CaseSweep:
    topo = load_scenario("fluidstack")
    sim = Simulator(topo, **sim_kwargs)
    prefetch_assignments([(sim, get_model(n, L), B) for n, L, B in FLUIDSTACK_RUNS],
                         default_workers() if workers is None else workers, schedule_progress)
    cs = CaseSweep(topo, [])
    for name, L, B in FLUIDSTACK_RUNS:
        cfg = get_model(name, L)
        key = (cfg.layers, B, name)
        cs.settings.append(key)
        cs.candidates[key] = sim.sweep(cfg, B, _systems(FLUIDSTACK_ROLES))
        if progress:
            progress(f"fluidstack {name} L={cfg.layers} B={B}")
    return cs


def _systems(roles) -> list[str]:
    systems = role_systems()
    return list(dict.fromkeys(systems[r] for r in roles))


# ----------------------------------------------------------------------------- tables
def _speedups(cs: CaseSweep, base: str, placement: str | None = None) -> np.ndarray:
    return np.array([cs.best(s, base, placement).seconds / cs.best(s, "ours").seconds for s in cs.settings])


def _mean_pflops_ratio(cs: CaseSweep, base: str, placement: str | None = None, model: str = "gpt3-xl") -> float:
    """Ratio of the mean PFLOPS over the settings (the paper's Fig. 3(c) averages PFLOPS)."""
    def pf(system, pl=None):
        return np.mean([pflop_per_iteration(get_model(model, s[0]), s[1]) / cs.best(s, system, pl).seconds
                        for s in cs.settings])
    return pf("ours") / pf(base, placement)


def summary_rows(sweeps: dict[str, CaseSweep]) -> list[dict]:
    rows = []
    for case, cs in sweeps.items():
        rows.append({
            "case": case, "scenario": cs.topo.name,
            "vs_megatron": _speedups(cs, "megatron"), "vs_megatron_mean": _mean_pflops_ratio(cs, "megatron"),
            "vs_megatron_random": _speedups(cs, "megatron", "random"),
            "vs_deepspeed": _speedups(cs, "deepspeed"), "vs_deepspeed_mean": _mean_pflops_ratio(cs, "deepspeed"),
            "vs_random": _speedups(cs, "ours-random"),
        })
    return rows


def case5_vs_case1(sweeps: dict[str, CaseSweep]) -> dict[str, np.ndarray] | None:
    if "1" not in sweeps or "5" not in sweeps:
        return None
    c1, c5 = sweeps["1"], sweeps["5"]
    common = [s for s in c5.settings if s in c1.settings]
    return {b: np.array([c5.best(s, "ours").seconds / c1.best(s, b).seconds for s in common])
            for b in ("megatron", "deepspeed")}


def _label(setting) -> str:
    return f"L{setting[0]} B{setting[1]}" + (f" {setting[2]}" if len(setting) > 2 else "")


def _cfg_text(c: Candidate) -> str:
    return ",".join(f"{k}={v}" for k, v in c.config.items() if k not in ("scheduler", "pipelines"))


def case_table(cs: CaseSweep) -> str:
    o_, r_, h_ = (column_label(k) for k in ("ours", "ours-random", HARNESS_OURS))
    lines = [f"| setting | {o_} s | {r_} s | Megatron s (best layout) | DeepSpeed s (best layout) | "
             f"vs Megatron | vs DeepSpeed | vs random | {h_} s |", "|---|---|---|---|---|---|---|---|---|"]
    for s in cs.settings:
        o, r, m, d, h = (cs.best(s, k) for k in COLUMNS)
        lines.append(f"| {_label(s)} | {o.seconds:.2f} | {r.seconds:.2f} | {m.seconds:.2f} ({_cfg_text(m)}) | "
                     f"{d.seconds:.2f} ({_cfg_text(d)}) | {m.seconds / o.seconds:.2f}x | "
                     f"{d.seconds / o.seconds:.2f}x | {r.seconds / o.seconds:.2f}x | {h.seconds:.2f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures
def figure3(cs: CaseSweep, out: Path, model: str = "gpt3-xl") -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), gridspec_kw={"width_ratios": [1, 1, 1.5]})
    plots.heatmap(axes[0], cs.topo.delay_ms, f"{cs.topo.name}: (a) delay", "one-way delay (ms)", "viridis")
    plots.heatmap(axes[1], cs.topo.bandwidth_gbps, f"{cs.topo.name}: (b) bandwidth", "Gbps", "magma")
    series = {column_label(k): np.array([pflop_per_iteration(get_model(model, s[0]), s[1]) / cs.best(s, k).seconds
                                         for s in cs.settings]) for k in COLUMNS}
    unit, factor = plots.flop_rate_unit(list(series.values()))
    plots.lines(axes[2], [_label(s) for s in cs.settings], {k: v * factor for k, v in series.items()},
                f"{unit} (simulated)", "(c) throughput")
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def figure6(cs: CaseSweep, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    series = {column_label(k): [cs.best(s, k).seconds for s in cs.settings] for k in COLUMNS}
    values = [v for ys in series.values() for v in ys]
    plots.grouped_bars(ax, [_label(s) for s in cs.settings], series, "iteration seconds (simulated)",
                       f"{cs.topo.name}: runtime of one iteration", log=max(values) > 20 * min(values))
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def figure5(sweeps: dict[str, CaseSweep], out: Path) -> Path:
    """ZeRO-3 alone (the paper's Fig. 5): iteration time per case and setting."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    first = next(iter(sweeps.values()))
    series = {}
    for case, cs in sweeps.items():
        series[f"case {case}"] = [min(c.seconds for c in cs.candidates[s] if c.config.get("zero") == 3)
                                  for s in cs.settings]
    plots.grouped_bars(ax, [_label(s) for s in first.settings], series, "iteration seconds (simulated)",
                       "DeepSpeed ZeRO-3: runtime of one iteration", log=True)
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def figure7(fs: CaseSweep, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{s[2]} L{s[0]} B{s[1]}" for s in fs.settings]
    pflops = {column_label(k): np.array([pflop_per_iteration(get_model(s[2], s[0]), s[1]) / fs.best(s, k).seconds
                                         for s in fs.settings]) for k in FLUIDSTACK_ROLES}
    secs = {column_label(k): [fs.best(s, k).seconds for s in fs.settings] for k in FLUIDSTACK_ROLES}
    unit, factor = plots.flop_rate_unit(list(pflops.values()))
    plots.grouped_bars(axes[0], labels, {k: v * factor for k, v in pflops.items()}, f"{unit} (simulated)",
                       f"(a) cluster {unit}")
    plots.grouped_bars(axes[1], labels, secs, "iteration seconds", "(b) runtime of one iteration")
    path = save_figure(fig, out)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- report
def fluidstack_rows(fs: CaseSweep) -> list[dict]:
    peak = sum(p.peak_tflops for p in fs.topo.profiles) / 1e3  # PFLOPS
    rows = []
    for s in fs.settings:
        cfg = get_model(s[2], s[0])
        row = {"model": s[2], "layers": s[0], "batch": s[1], "peak_pflops": peak}
        for k in FLUIDSTACK_ROLES:
            c = fs.best(s, k)
            row[k] = 100 * pflop_per_iteration(cfg, s[1]) / c.seconds / peak
        rows.append(row)
    return rows


def write_report(out_dir: Path, sweeps: dict[str, CaseSweep], fs: CaseSweep | None, run_id: str,
                 notes: dict, sections: list = ()) -> list[Path]:
    """report.md and its files; `sections`: (ReportSection, its sweep's result) of the systems' own sections."""
    out_dir = Path(out_dir)
    paths: list[Path] = []
    records, jdocs = [], []
    for cs in list(sweeps.values()) + ([fs] if fs else []):
        for s in cs.settings:
            cfg = get_model(s[2] if len(s) > 2 else "gpt3-xl", s[0])
            for c in cs.candidates[s]:
                rec = to_record(c, run_id=run_id, topo=cs.topo, cfg=cfg, batch=s[1])
                records.append(rec)
                jdocs.append(record_json(rec, c.best))
    write_records(out_dir / "records.csv", records)
    atomic_write_json(out_dir / "records.json", jdocs)
    paths += [out_dir / "records.csv", out_dir / "records.json"]
    for case, cs in sweeps.items():
        paths.append(figure3(cs, out_dir / f"fig3-case{case}.png"))
        paths.append(figure6(cs, out_dir / f"fig6-case{case}.png"))
    if sweeps and all(cs.settings == next(iter(sweeps.values())).settings for cs in sweeps.values()):
        paths.append(figure5(sweeps, out_dir / "fig5-zero3.png"))
    if fs:
        paths.append(figure7(fs, out_dir / "fig7-fluidstack.png"))
    text = render_markdown(sweeps, fs, notes)
    for section, result in sections:
        paths += section.write(out_dir, result)
        text += "\n" + section.markdown(result)
    atomic_write_text(out_dir / "report.md", text)
    paths.append(out_dir / "report.md")
    atomic_write_json(out_dir / "manifest.json", manifest(run_id, "ok", **notes))
    paths.append(out_dir / "manifest.json")
    return paths


def render_markdown(sweeps: dict[str, CaseSweep], fs: CaseSweep | None, notes: dict) -> str:
    L = ["# Simulated paper-scale evaluation (Yuan et al. 2022, sec. 4, Fig. 3, 5, 6, 7)", ""]
    L += [f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by `harness sim report`. "
          f"Model GPT3-XL (hidden 2048, 16 heads, seq 2048), fp16, micro-batch 1, D_PP = 8 x D_DP = 8 for ours; "
          f"Megatron best over T x P x D in {{1,2,4,8}}^3 = 64 and placements (rank order `default`, or the random "
          f"layouts of seeds 2022-2024, averaged); DeepSpeed best of ZeRO-3 and ZeRO-1 + P in {{1,2,4,8}}. "
          f"Schedules: {notes.get('scheduler', 'ga')} (seed {notes.get('schedule_seed', 0)}, budget "
          f"{notes.get('budget', '?')}); sharded-PS model `{notes.get('ps_mode', 'grouped')}`; communication "
          f"library `{notes.get('protocol', 'nccl')}`; TCP settings: {notes.get('transport', 'as each scenario states')}.", ""]
    L += ["Compute: peak from the scenario's device profile x efficiency "
          f"({notes.get('efficiency_source', '')}). Nothing in the simulator is fitted to the paper's results; "
          "the paper's numbers below are references only.", ""]
    rows = summary_rows(sweeps)
    L += ["## Speedup of ours per case (iteration time of the baseline / ours; range over the 9 settings, "
          "and the ratio of mean PFLOPS as Fig. 3(c) averages)", ""]
    L += ["| case | vs Megatron (range) | vs Megatron (mean PFLOPS) | vs Megatron, random layouts only | "
          "vs DeepSpeed (range) | vs DeepSpeed (mean PFLOPS) | scheduler vs random | paper |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        paper = (f"{PAPER['case5_vs_megatron']}x Megatron, {PAPER['case5_vs_deepspeed']}x DeepSpeed"
                 if r["case"] == "5" else "1.2-2.5x (cases 1-4 together)")
        L.append(f"| {r['case']} ({r['scenario']}) | {rng(r['vs_megatron'])} | {r['vs_megatron_mean']:.2f}x | "
                 f"{rng(r['vs_megatron_random'])} | {rng(r['vs_deepspeed'])} | {r['vs_deepspeed_mean']:.2f}x | "
                 f"{rng(r['vs_random'])} | {paper} |")
    L.append("")
    sched_max = max(r["vs_random"].max() for r in rows)
    L.append(f"Scheduler over random placement: up to {sched_max:.2f}x (paper: up to {PAPER['scheduler_max']}x).")
    c51 = case5_vs_case1(sweeps)
    if c51:
        L.append(f"Ours in case 5 vs case 1: {rng(c51['megatron'])} slower than Megatron, "
                 f"{rng(c51['deepspeed'])} slower than DeepSpeed (paper: {PAPER['case5_vs_case1_range'][0]}-"
                 f"{PAPER['case5_vs_case1_range'][1]}x).")
        s0, s1 = sweeps["5"].settings[0], sweeps["5"].settings[-1]
        if s0 in sweeps["1"].settings and s1 in sweeps["1"].settings and s0 != s1:
            g = lambda s: sweeps["5"].best(s, "ours").seconds / sweeps["1"].best(s, "megatron").seconds  # noqa: E731
            L.append(f"Gap to case-1 Megatron at {_label(s0)}: {g(s0):.2f}x; at {_label(s1)}: {g(s1):.2f}x "
                     "(paper: larger batches and deeper models narrow it).")
    L.append("")
    if fs:
        L += ["## FluidStack (App. D.5, Fig. 7): percent of the cluster's peak", "",
              f"| model | layers | batch | {' | '.join(column_label(k) for k in FLUIDSTACK_ROLES)} | paper (ours) |",
              "|---|---|---|---|---|---|---|---|"]
        for r in fluidstack_rows(fs):
            L.append(f"| {r['model']} | {r['layers']} | {r['batch']} | {r['ours']:.1f}% | {r['ours-random']:.1f}% | "
                     f"{r['megatron']:.1f}% | {r[HARNESS_OURS]:.1f}% | {PAPER['fluidstack_percent_peak'][r['model']]}% |")
        L += ["", "![fig7](fig7-fluidstack.png)", ""]
    L += ["## Where the model disagrees with the paper, and why", ""]
    L += disagreements(rows, c51, fluidstack_rows(fs) if fs else None)
    L += ["", "## Per case", ""]
    for case, cs in sweeps.items():
        L += [f"### Case {case}: {cs.topo.description}", "", case_table(cs), "",
              f"![fig3](fig3-case{case}.png)", "", f"![fig6](fig6-case{case}.png)", ""]
    if sweeps and all(cs.settings == next(iter(sweeps.values())).settings for cs in sweeps.values()):
        L += ["### DeepSpeed ZeRO-3 alone (Fig. 5)", "", "![fig5](fig5-zero3.png)", ""]
    L += ["## Model (what is simulated)", "", MODEL_TEXT, "", sources_markdown()]
    return "\n".join(L) + "\n"


def sweep_notes(sim_kwargs: dict) -> dict:
    from ..compute.profiles import device_profiles

    prof = device_profiles(load_scenario("5"), sim_kwargs.get("profile_overrides"))[0]
    return {"scheduler": sim_kwargs.get("scheduler", "ga"), "schedule_seed": sim_kwargs.get("schedule_seed", 0),
            "budget": sim_kwargs.get("budget", 5000), "ps_mode": sim_kwargs.get("ps_mode", "grouped"),
            "protocol": sim_kwargs.get("protocol", "nccl"),
            "transport": "as each scenario states" if sim_kwargs.get("transport") is None else sim_kwargs["transport"].to_json(),
            "efficiency_source": f"{prof.gpu} {json.dumps(prof.efficiency)}: {prof.source}"}


def sweep_sections(progress=None) -> list[tuple]:
    """Every system's own report section (harness/plan/systems.py: report_section), swept in registration
    order: (section, result); `progress(label)` once per step (`section.steps` of each)."""
    return [(section, section.sweep(progress)) for section in registry.report_sections()]


def write_sections_only(out_dir: Path, run_id: str, sections: list[tuple]) -> list[Path]:
    """report.md of the systems' own sections alone (`sim report --hetpipe-only`), and their files."""
    paths = [p for section, result in sections for p in section.write(out_dir, result)]
    text = "# Simulated evaluation\n\n" + "\n".join(section.markdown(result) for section, result in sections)
    atomic_write_text(Path(out_dir) / "report.md", text)
    atomic_write_json(Path(out_dir) / "manifest.json", manifest(run_id, "ok", backend="sim"))
    return paths + [Path(out_dir) / "report.md", Path(out_dir) / "manifest.json"]
