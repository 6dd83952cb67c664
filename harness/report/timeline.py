"""Runs under a timeline, iteration by iteration: measured against predicted (sim/compare.compare_iterations),
as a table and as one figure (a panel per run: both series, the iterations a change fell in marked)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from ..plots import figures, series_style

#: each side of a change: measured and predicted within this of each other (the issue's proof)
TARGET_ERROR = 0.10


def format_iterations(rows: list[dict]) -> str:
    lines = [f"{'run':<34} {'iteration':>9} {'measured_s':>11} {'sim_s':>10} {'error':>8}  change"]
    for r in rows:
        lines.append(f"{r['run_id']:<34} {r['iteration']:>9} {r['measured_s']:>11.4f} {r['simulated_s']:>10.4f} "
                     f"{100 * r['error']:>+7.1f}%  {'*' if r['changes'] else ''}")
    ok = sum(abs(r["error"]) <= TARGET_ERROR for r in rows)
    lines.append(f"{ok}/{len(rows)} iterations within {100 * TARGET_ERROR:.0f}% (* a change of the timeline was "
                 "applied before or during it)")
    return "\n".join(lines)


def iterations_figure(rows: list[dict], path: Path) -> Path:
    """One panel per run: measured and predicted seconds per iteration; a change's iterations shaded."""
    runs = list(dict.fromkeys(r["run_id"] for r in rows))
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 2.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        mine = [r for r in rows if r["run_id"] == run]
        its = [r["iteration"] for r in mine]
        colour, marker = series_style(mine[0]["system"])
        ax.plot(its, [r["measured_s"] for r in mine], marker=marker, color=colour, label="measured")
        ax.plot(its, [r["simulated_s"] for r in mine], linestyle="--", marker="x", color="0.3", label="simulated")
        for r in mine:
            if r["changes"]:
                ax.axvspan(r["iteration"] - 0.5, r["iteration"] + 0.5, color="orange", alpha=0.2, lw=0)
        ax.set_title(f"{mine[0]['system']}: {run} (shaded: a link changed)", fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    figures.save_figure(fig, path)
    plt.close(fig)
    return Path(path)
