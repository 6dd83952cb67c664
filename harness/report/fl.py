"""`harness fl report`: OWL's comparison from FL records; the paper's claims are `harness reproduce owl`'s.

Figures: (a) normalised training time (seconds / naive's, per setting) of every strategy in every
setting; (b) where a model and rack shape ran at several alphas, OWL's and the baselines' normalised
time over alpha. fl.md holds the same figures as a table with distribution time and server bytes.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..workloads.fl.records import FLRecord, normalised
from .. import plots
from ..plots.figures import save_figure

# Han et al. 2024: its numbers and their verdicts live in one place (harness/reproduce/owl.py)
REFERENCE = ("the paper's claims, each beside the harness's figure and a verdict: `harness reproduce owl` "
             "(results/reproduce/owl/report.md)")


def _label(r: FLRecord) -> str:
    return f"{r.model} {r.rack_shape} a{r.alpha:g}"


def figure(records: list[FLRecord], out: Path) -> Path:
    import matplotlib.pyplot as plt

    norm = normalised(records)
    settings = list(dict.fromkeys(_label(r) for r in records))
    strategies = list(dict.fromkeys(r.strategy for r in records))
    value = {(_label(r), r.strategy): norm.get(k, float("nan")) for k, r in enumerate(records)}
    trends = defaultdict(dict)  # (model, shape) -> alpha -> strategy -> normalised
    for k, r in enumerate(records):
        if k in norm:
            trends[(r.model, r.rack_shape)].setdefault(r.alpha, {})[r.strategy] = norm[k]
    trends = {k: v for k, v in trends.items() if len(v) > 1}
    fig, axes = plt.subplots(1, 1 + len(trends), figsize=(6 + 4 * len(trends), 4), squeeze=False)
    plots.grouped_bars(axes[0][0], settings, {s: [value.get((x, s), float("nan")) for x in settings]
                                              for s in strategies},
                       "training time / naive's (simulated)", "(a) strategies per setting")
    for ax, ((model, shape), by_alpha) in zip(axes[0][1:], sorted(trends.items())):
        alphas = sorted(by_alpha)
        plots.lines(ax, [f"{a:g}" for a in alphas],
                    {s: [by_alpha[a].get(s, float("nan")) for a in alphas] for s in strategies},
                    "training time / naive's", f"(b) {model}, {shape} racks, over alpha")
        ax.set_xlabel("alpha = B_inter / B_intra", fontsize=8)
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def markdown(records: list[FLRecord]) -> str:
    norm = normalised(records)
    L = ["# OWL: model distribution strategies, simulated", "",
         "One round: every worker's forward as its parameters arrive (max-min fair flows from the server and between "
         "rack peers), then backward, a ring all-reduce of the gradients and the update (the same for every "
         "strategy). Normalised: seconds / naive's in the same setting.", "",
         "| scenario | model | racks | alpha | strategy | round s | distribution s | server GB | / naive | config |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for k, r in enumerate(records):
        vs = f"{norm[k]:.3f}" if k in norm else "-"
        L.append(f"| {r.scenario} | {r.model} | {r.rack_shape} | {r.alpha:g} | {r.strategy} | {r.seconds:.3f} | "
                 f"{r.distribution_seconds:.3f} | {r.server_bytes / 1e9:.2f} | {vs} | `{r.config}` |")
    L += ["", f"Reference: {REFERENCE}.", "", "![fl](fl.png)", ""]
    return "\n".join(L) + "\n"


def write(out_dir: Path, records: list[FLRecord]) -> list[Path]:
    from ..files import atomic_write_text

    out_dir = Path(out_dir)
    md = out_dir / "fl.md"
    png = figure(records, out_dir / "fl.png")
    atomic_write_text(md, markdown(records))
    return [png, md]
