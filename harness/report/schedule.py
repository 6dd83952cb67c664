"""Scheduler comparison (paper Fig. 4): best COMM-COST vs candidates evaluated, per scheduler, against the
lower bound no layout goes below."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..files import atomic_write_text
from ..scenario import Topology
from ..plots.figures import save_figure


def best_so_far(trace: list[list[float]], grid: np.ndarray) -> np.ndarray:
    """The step function of a trace [[evaluated, best], ...] sampled at `grid`."""
    t = np.asarray(trace, dtype=float)
    idx = np.searchsorted(t[:, 0], grid, side="right") - 1
    return np.where(idx >= 0, t[np.clip(idx, 0, None), 1], np.nan)


def compare_schedulers(topo: Topology, d_pp, d_dp, c_pp, c_dp, schedulers, seeds, budget, out_dir: Path):
    """Run every scheduler with every seed; write compare.csv (traces) and compare.png."""
    import matplotlib.pyplot as plt

    from ..scheduler import schedule

    rows, finals = [], []
    runs = [(s, seed) for s in schedulers for seed in seeds]
    for name, seed in tqdm(runs, desc=f"compare {topo.name}", unit="run", file=sys.stderr, leave=False):
        a = schedule(topo, d_pp, d_dp, c_pp, c_dp, name, seed, budget)
        rows += [{"scheduler": name, "seed": seed, "candidates": int(n), "best_total_s": c} for n, c in a.trace]
        finals.append({"scheduler": name, "seed": seed, "dp_s": a.cost["dp"], "pp_s": a.cost["pp"],
                       "total_s": a.cost["total"], "bound_s": a.bound["total"], "gap": a.gap})
    traces = pd.DataFrame(rows)
    final = pd.DataFrame(finals)
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "compare.csv", traces.to_csv(index=False))
    atomic_write_text(out_dir / "final.csv", final.to_csv(index=False))

    grid = np.unique(np.geomspace(1, budget, 200).astype(int))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in schedulers:
        curves = np.array([
            best_so_far(traces[(traces.scheduler == name) & (traces.seed == s)][["candidates", "best_total_s"]]
                        .values.tolist(), grid) for s in seeds
        ])
        ax.plot(grid, np.nanmean(curves, 0), label=f"{name} (mean of seeds {', '.join(map(str, seeds))})")
        ax.fill_between(grid, np.nanmin(curves, 0), np.nanmax(curves, 0), alpha=0.2)
    bound = float(final.bound_s.iloc[0])
    ax.axhline(bound, color="black", linestyle=":", label=f"lower bound {bound:.3f} s")
    ax.set_xscale("log")
    ax.set_xlabel("candidates evaluated")
    ax.set_ylabel("best COMM-COST (s)")
    ax.set_title(f"{topo.name}: D_PP={d_pp} x D_DP={d_dp}, c_pp={c_pp / 1e9:.3g} GB, c_dp={c_dp / 1e9:.3g} GB")
    ax.legend()
    png = save_figure(fig, out_dir / "compare.png")
    plt.close(fig)
    summary = final.groupby("scheduler", sort=False)["total_s"].agg(["mean", "min", "max"])
    summary["gap of min"] = (summary["min"] - bound) / summary["min"]
    table = (f"{topo.name}: best COMM-COST (s) after {budget} candidates, seeds {seeds}; no layout below "
             f"{bound:.3f} s (harness/scheduler/bound.py)\n"
             + summary.to_string(formatters={"mean": "{:.3f}".format, "min": "{:.3f}".format,
                                             "max": "{:.3f}".format, "gap of min": "{:.1%}".format}))
    return table, [out_dir / "compare.csv", out_dir / "final.csv", png]
