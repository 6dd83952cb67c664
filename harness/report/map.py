"""Which system wins where: the map over scenarios x bandwidth (`harness sim report --map`).

For every scenario of MAP_SCENARIOS and every bandwidth scale of MAP_SCALES (each link's bandwidth times x, its
delay as it is), every contender of CONTENDERS is simulated at paper scale (GPT3-XL, batch 1024, the scenario's
devices; each system at its best layout, as `harness sim` picks it) and the one of the highest throughput
(samples per second: the same model and batch for all, so PFLOPS rank alike) wins its cell; the margin is its
throughput over the runner-up's. Throughput is not convergence: DiLoCo's and a codec's steps are not plain
synchronous SGD's, so the map ranks how fast samples go through, and the measured time to a loss (`harness report
convergence`) may order them otherwise.

Memory does not decide the winner (a contender over its devices' memory is still ranked, and starred): ours'
runtime keeps GPipe's logits of 128 micro-batches, over a V100 at this batch in every case (the paper's own runtime,
dtfm, fits), so a map that dropped it would have no ours; DiLoCo's replicas are whole models by default (a 1.3 B
model with Adam's state is over a V100; pipeline replicas fit, `--replica-stages`). Each cell also names the fastest
contender whose layout fits. A contender the simulator cannot lay out on a scenario is left out of its cell with
the reason.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..compute.model import get_model
from ..errors import HarnessError
from ..files import atomic_write_json, atomic_write_text
from ..plan import systems as registry
from ..scenario import load_scenario
from ..sim.request import SimRequest, SimSettings, simulate
from ..sim.sweep import Simulator, candidate_memory, candidates_of_rule

MAP_SCENARIOS = ("1", "2", "3", "4", "5", "fluidstack", "hetero-regional")
MAP_SCALES = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
MODEL, BATCH = "gpt3-xl", 1024


@dataclass(frozen=True)
class Contender:
    """A system with the options it runs with on the map."""

    label: str
    system: str
    options: tuple[tuple[str, str], ...] = ()


def syncs_every_h_steps(system: str) -> bool:
    """A DiLoCo-style system: its replicas exchange every H inner steps (an H, `sync_every`, among its options)."""
    return "sync_every" in registry.get(system).resolve_options({})


CONTENDERS = (
    Contender("ours", "ours"),
    Contender("ours+cocktail", "ours", (("dp_compress", "cocktail"),)),
    Contender("dtfm", "dtfm"),
    Contender("megatron", "megatron"),
    Contender("deepspeed", "deepspeed"),
    Contender("hetpipe", "hetpipe"),
    Contender("diloco", "diloco"),
    Contender("streaming-diloco", "streaming-diloco"),
)


@dataclass
class Cell:
    scenario: str
    scale: float
    samples_per_s: dict[str, float] = field(default_factory=dict)  # contender -> its best layout's throughput
    layout: dict[str, str] = field(default_factory=dict)
    over_memory: dict[str, bool] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # contender -> why it has no figure

    @property
    def ranked(self) -> list[tuple[str, float]]:
        return sorted(self.samples_per_s.items(), key=lambda kv: -kv[1])

    @property
    def best(self) -> str | None:
        return self.ranked[0][0] if self.samples_per_s else None

    @property
    def best_fitting(self) -> str | None:
        """The fastest contender whose layout fits its devices' memory."""
        return next((label for label, _ in self.ranked if not self.over_memory.get(label)), None)

    @property
    def margin(self) -> float:
        """The winner's throughput over the runner-up's (inf when it runs alone)."""
        r = self.ranked
        return r[0][1] / r[1][1] if len(r) > 1 else math.inf


def _short(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items() if k not in ("pipelines", "stages"))


def simulate_contender(c: Contender, scenario: str, scale: float, settings: SimSettings,
                       model: str = MODEL, batch: int = BATCH):
    """The contender's best candidate on the scenario at this bandwidth scale; a system `harness sim` does not sweep
    on a GPT (HetPipe: its sweep is the CNNs') is laid out by its rule, as `harness run` would plan it."""
    entry = registry.get(c.system)
    if entry.simulates(registry.LAYOUT_WORKLOAD):
        req = SimRequest(scenario, None, scale, (c.system,), model, None, batch, 1, None, dict(c.options), settings)
        result = simulate(req)
        return result.topo, result.cfg, result.best().get(c.system)
    topo, cfg = load_scenario(scenario).scaled(scale), get_model(model)
    sim = Simulator(topo, options=dict(c.options), **settings.simulator_kwargs())
    cands = candidates_of_rule(sim, entry, cfg, batch)
    return topo, cfg, min(cands, key=lambda x: x.seconds) if cands else None


def sweep_map(scenarios=MAP_SCENARIOS, scales=MAP_SCALES, contenders=CONTENDERS, settings: SimSettings | None = None,
              progress: Callable[[str], None] | None = None) -> list[Cell]:
    settings = settings or SimSettings()
    cells = []
    for scenario in scenarios:
        for scale in scales:
            cell = Cell(scenario, scale)
            for c in contenders:
                try:
                    topo, cfg, best = simulate_contender(c, scenario, scale, settings)
                except HarnessError as e:
                    cell.left_out[c.label] = str(e)
                else:
                    if best is None:
                        cell.left_out[c.label] = "no layout of its rule fits this scenario and batch"
                    else:
                        cell.samples_per_s[c.label] = BATCH / best.seconds
                        cell.layout[c.label] = _short(best.config)
                        fit = candidate_memory(best, topo, cfg, BATCH, 1)
                        cell.over_memory[c.label] = bool(fit is not None and not fit.fits)
                if progress:
                    progress(f"{scenario} x{scale:g} {c.label}")
            cells.append(cell)
    return cells


def scenario_names(cells: list[Cell]) -> list[str]:
    return list(dict.fromkeys(c.scenario for c in cells))


def scales_of(cells: list[Cell]) -> list[float]:
    return sorted({c.scale for c in cells})


def map_rows(cells: list[Cell], contenders=CONTENDERS) -> list[dict]:
    """One row per cell: the winner, its margin, every contender's samples/s (blank: left out)."""
    rows = []
    for cell in cells:
        row = {"scenario": cell.scenario, "bandwidth_scale": cell.scale, "best": cell.best or "",
               "margin": round(cell.margin, 4) if cell.best else "", "best_that_fits": cell.best_fitting or ""}
        for c in contenders:
            v = cell.samples_per_s.get(c.label)
            row[c.label] = "" if v is None else round(v, 4)
        row["over_memory"] = " ".join(k for k, v in cell.over_memory.items() if v)
        rows.append(row)
    return rows


def map_csv(cells: list[Cell], contenders=CONTENDERS) -> str:
    rows = map_rows(cells, contenders)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def figure(cells: list[Cell], out: Path, contenders=CONTENDERS) -> Path:
    """The heatmaps: a row per scenario, a column per bandwidth scale, each cell its winner's colour, name and
    margin over the runner-up; left among every contender, right among those whose layout fits memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    from ..plots import series_style
    from ..plots.figures import save_figure

    names, scales = scenario_names(cells), scales_of(cells)
    labels = [c.label for c in contenders]
    colours = [series_style(c.system)[0] or "#7f7f7f" for c in contenders]
    colours = [("#ffbf00" if c.options else colour) for c, colour in zip(contenders, colours)]  # a codec: its own
    fig, axes = plt.subplots(1, 2, figsize=(2.4 * len(scales) + 3, 0.7 * len(names) + 2), sharey=True)
    for ax, fitting in zip(axes, (False, True)):
        grid = np.full((len(names), len(scales)), np.nan)
        for cell in cells:
            ranked = [(k, v) for k, v in cell.ranked if not (fitting and cell.over_memory.get(k))]
            if not ranked:
                continue
            i, j = names.index(cell.scenario), scales.index(cell.scale)
            grid[i, j] = labels.index(ranked[0][0])
            margin = f"x{ranked[0][1] / ranked[1][1]:.2f}" if len(ranked) > 1 else "alone"
            star = "*" if cell.over_memory.get(ranked[0][0]) else ""
            ax.text(j, i, f"{ranked[0][0]}{star}\n{margin}", ha="center", va="center", fontsize=6)
        ax.imshow(grid, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto", alpha=0.75)
        ax.set_xticks(range(len(scales)), [f"x{s:g}" for s in scales], fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_xlabel("bandwidth of every link, times the scenario's", fontsize=8)
        ax.set_title("among those that fit their devices' memory" if fitting
                     else "among every contender (* over its devices' memory)", fontsize=9)
    fig.suptitle(f"fastest system by simulated throughput ({MODEL}, batch {BATCH}) and its margin over the runner-up",
                 fontsize=10)
    return save_figure(fig, out / "map.png")


def render_markdown(cells: list[Cell], contenders=CONTENDERS) -> str:
    names, scales = scenario_names(cells), scales_of(cells)
    by = {(c.scenario, c.scale): c for c in cells}
    lines = ["## Which system wins where", "",
             f"Simulated at paper scale ({MODEL}, batch {BATCH}, each scenario's devices, each system at its best "
             "layout); every link's bandwidth times the column's factor, delays as they are. A cell: the fastest "
             "contender by throughput and its margin over the runner-up, starred when its layout is over its devices' "
             "memory, and then the fastest that fits (`harness/report/map.py`; map.csv has every contender's "
             "samples/s). Throughput is not convergence: see the measured time to the loss target.", "",
             "![map](map.png)", "",
             "| scenario | " + " | ".join(f"x{s:g}" for s in scales) + " |",
             "|---|" + "---|" * len(scales)]
    for name in names:
        row = []
        for s in scales:
            cell = by.get((name, s))
            if cell is None or not cell.best:
                row.append("-")
            else:
                second = cell.ranked[1][0] if len(cell.ranked) > 1 else "-"
                star = "*" if cell.over_memory.get(cell.best) else ""
                fits = "" if cell.best_fitting in (cell.best, None) else f"; fits: {cell.best_fitting}"
                row.append(f"{cell.best}{star} x{cell.margin:.2f} (then {second}{fits})")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    gains = [(c, d) for c in contenders for d in contenders
             if c.system == d.system and c.options and not d.options]  # a codec against its plain system
    for coded, plain in gains:
        lines += ["", f"`{coded.label}` over `{plain.label}` (throughput; the codec's gain):", "",
                  "| scenario | " + " | ".join(f"x{s:g}" for s in scales) + " |", "|---|" + "---|" * len(scales)]
        for name in names:
            row = []
            for s in scales:
                cell = by.get((name, s))
                a = None if cell is None else cell.samples_per_s.get(coded.label)
                b = None if cell is None else cell.samples_per_s.get(plain.label)
                row.append("-" if a is None or b is None else f"{a / b:.2f}")
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", "Contenders: " + ", ".join(
        f"`{c.label}` (`--system {c.system}" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in c.options) + "`)"
        for c in contenders) + "."]
    over = sorted({k for c in cells for k, v in c.over_memory.items() if v})
    if over:
        lines.append(f"Over their devices' memory in some cell (ranked all the same, starred; module docstring): "
                     f"{', '.join(over)}.")
    why = {(k, v) for c in cells for k, v in c.left_out.items()}
    for label, reason in sorted(why):
        where = [f"{c.scenario} x{c.scale:g}" for c in cells if c.left_out.get(label) == reason]
        short = reason if len(reason) <= 240 else reason[:240] + " ..."
        lines.append(f"- left out: {label} in {len(where)} cell(s) ({', '.join(where[:4])}"
                     f"{', ...' if len(where) > 4 else ''}): {short}")
    return "\n".join(lines) + "\n"


def write_map(out: Path, cells: list[Cell], run_id: str, contenders=CONTENDERS) -> list[Path]:
    """map.csv, map.json, map.png and report.md (the map's section) in `out`."""
    from ..results import manifest

    if not cells:
        raise HarnessError("sim report --map: no cell to draw")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "map.csv", map_csv(cells, contenders))
    atomic_write_json(out / "map.json", [{"scenario": c.scenario, "bandwidth_scale": c.scale, "best": c.best,
                                          "margin": None if math.isinf(c.margin) else c.margin,
                                          "samples_per_s": c.samples_per_s, "layout": c.layout,
                                          "over_memory": c.over_memory, "left_out": c.left_out} for c in cells])
    paths = [out / "map.csv", out / "map.json", figure(cells, out, contenders)]
    page = "# Simulated: which system wins where\n\n" + render_markdown(cells, contenders)
    atomic_write_text(out / "report.md", page)
    atomic_write_json(out / "manifest.json", manifest(run_id, "ok", backend="sim"))
    return paths + [out / "report.md", out / "manifest.json"]

