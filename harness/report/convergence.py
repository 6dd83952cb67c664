"""Convergence of measured runs: loss against wall time, the data's loss floor, and the time to reach it.

Every ok run below a directory contributes its iterations (records.csv): the loss of each against the
wall time at its end (the sum of the run's iteration seconds; the warm-up iterations, unrecorded, are
not on the clock: run with --warmup 0 to see them) and the samples seen. The floor is the run's
manifest's (`data.loss_floor`: the Markov chain's entropy rate, or log V on uniform tokens); a run
reaches the target when an iteration's loss is at most floor x (1 + margin). Runs are told apart by
system and, for HetPipe, N_m and D, for others the options they set (DiLoCo's H, ...).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import HarnessError
from ..files import atomic_write_text
from ..plan import systems
from ..plots.figures import save_figure
from ..results import read_records

MARGIN = 0.10  # floor + 10 %


@dataclass
class Curve:
    run: Path
    label: str
    system: str
    floor: float
    seconds: np.ndarray  # wall time at the end of each iteration
    samples: np.ndarray  # samples seen by then
    loss: np.ndarray

    def reached(self, margin: float = MARGIN) -> tuple[float, int] | None:
        """(wall seconds, samples) when the loss first fell to floor x (1 + margin); None if it never did."""
        hit = np.flatnonzero(self.loss <= self.floor * (1 + margin))
        return (float(self.seconds[hit[0]]), int(self.samples[hit[0]])) if hit.size else None


def _label(system: str, manifest: dict) -> str:
    wsp = (((manifest.get("spec") or {}).get("layout") or {}).get("wsp")) or {}
    if wsp:
        return f"{system} D={wsp.get('staleness')} N_m={wsp.get('in_flight')}"
    return systems.named(system, ((manifest.get("spec") or {}).get("run") or {}).get("options") or {})


def load_curves(root: Path) -> list[Curve]:
    """One curve per ok run below `root` that recorded a loss floor; HarnessError when there is none."""
    out = []
    for rec in sorted(Path(root).rglob("records.csv")):
        man_path = rec.parent / "manifest.json"
        try:
            man = json.loads(man_path.read_text())
        except (OSError, ValueError):
            continue
        floor = (man.get("data") or {}).get("loss_floor")
        if man.get("status") != "ok" or floor is None:
            continue
        rows = sorted(read_records(rec), key=lambda r: r["iteration"])
        if not rows:
            continue
        first = rows[0]
        seconds = np.cumsum([r["seconds"] for r in rows])
        samples = np.array([(r["iteration"] + 1) * r["batch"] for r in rows])
        out.append(Curve(rec.parent, _label(first["system"], man), first["system"], float(floor), seconds,
                         samples, np.array([r["loss"] for r in rows], dtype=float)))
    if not out:
        raise HarnessError(f"{root}: no successful run with a loss floor below it (runs since --data: "
                           "manifest.json data.loss_floor)")
    dup = {c.label for c in out if sum(d.label == c.label for d in out) > 1}
    for c in out:
        if c.label in dup:
            c.label = f"{c.label} ({c.run.name})"
    return out


def table(curves: list[Curve], margin: float = MARGIN) -> str:
    """One line per run: samples, wall time, final loss, and when it reached floor x (1 + margin)."""
    head = f"{'run':<28} {'samples':>8} {'wall_s':>9} {'final':>7} {'floor':>7}  time to floor+{100 * margin:g}%"
    lines = [head]
    for c in sorted(curves, key=lambda c: c.label):
        hit = c.reached(margin)
        when = f"{hit[0]:.1f} s ({hit[1]} samples)" if hit else "not reached"
        lines.append(f"{c.label:<28} {c.samples[-1]:>8} {c.seconds[-1]:>9.1f} {c.loss[-1]:>7.3f} {c.floor:>7.3f}  {when}")
    return "\n".join(lines)


def write_convergence(root: Path, out: Path | None = None, margin: float = MARGIN) -> tuple[str, list[Path]]:
    """convergence.png (loss against wall time, the floor and the target) and convergence.csv in `out`
    (default `root`); returns the table and the paths."""
    import matplotlib.pyplot as plt

    from ..plots import series_style

    if not (margin > 0 and math.isfinite(margin)):
        raise HarnessError(f"--margin: must be a number > 0 (got {margin!r})")
    curves = load_curves(root)
    out = Path(out or root)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    own = {}  # a system's own colour for its first run; its other runs (HetPipe's D) matplotlib's next ones
    for c in sorted(curves, key=lambda c: c.label):
        colour, _ = series_style(c.system)
        colour = None if own.setdefault(c.system, c.label) != c.label else colour
        ax.plot(c.seconds, c.loss, color=colour, label=c.label, lw=1.4)
        hit = c.reached(margin)
        if hit:
            ax.plot([hit[0]], [c.floor * (1 + margin)], "o", color=ax.lines[-1].get_color(), ms=4)
    for floor in sorted({c.floor for c in curves}):
        ax.axhline(floor, color="k", lw=0.8, ls="--")
        ax.axhline(floor * (1 + margin), color="grey", lw=0.8, ls=":")
        ax.text(ax.get_xlim()[1], floor, f" floor {floor:.3f}", va="center", fontsize=7)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("training loss (nats)")
    ax.set_title(f"loss against wall time (dots: floor + {100 * margin:g}% reached)", fontsize=9)
    ax.legend(fontsize=7)
    png = save_figure(fig, out / "convergence.png")
    plt.close(fig)
    rows = ["run,system,label,iteration_end_s,samples,loss,floor"]
    for c in curves:
        rows += [f"{c.run.name},{c.system},{c.label},{t:.6f},{s},{l:.6f},{c.floor:.6f}"
                 for t, s, l in zip(c.seconds, c.samples, c.loss)]
    csv = out / "convergence.csv"
    atomic_write_text(csv, "\n".join(rows) + "\n")
    return table(curves, margin), [png, csv]
