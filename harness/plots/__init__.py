"""Generic axes-level plots every report can reuse: a device heatmap, lines and grouped bars over settings."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..plan import systems
from . import figures


def series_style(name: str, marker: str = "o") -> tuple[str | None, str]:
    """(colour, marker) of a series: a system's own (its registry entry's `style`, the same in every
    figure), else matplotlib's next colour."""
    entry = systems.registered().get(name)
    return entry.style if entry is not None and entry.style else (None, marker)


# Records, CSV and JSON keep PFLOPS; figures show a FLOP rate in the unit where it reads 1-1000.
FLOP_RATE_UNITS = (("PFLOPS", 1.0), ("TFLOPS", 1e3), ("GFLOPS", 1e6), ("MFLOPS", 1e9), ("kFLOPS", 1e12))


def flop_rate_unit(pflops) -> tuple[str, float]:
    """(unit, factor): the largest unit of FLOP_RATE_UNITS in which the largest finite value of
    `pflops` is at least 1 (PFLOPS above 1000, kFLOPS below 1); plot `pflops * factor`."""
    v = np.abs(np.asarray(pflops, dtype=float).ravel())
    v = v[np.isfinite(v)]
    top = v.max() if v.size else 0.0
    for unit, factor in FLOP_RATE_UNITS:
        if top * factor >= 1.0:
            return unit, factor
    return FLOP_RATE_UNITS[-1]


def heatmap(ax, matrix: np.ndarray, title: str, label: str, cmap: str = "viridis"):
    """Device x device matrix, sender on rows; inf (the unused diagonal) is left blank."""
    m = np.where(np.isinf(matrix), np.nan, np.asarray(matrix, dtype=float))
    im = ax.imshow(m, cmap=cmap, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("receiver device", fontsize=8)
    ax.set_ylabel("sender device", fontsize=8)
    ax.figure.colorbar(im, ax=ax, shrink=0.8, label=label)
    return im


def lines(ax, xlabels: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, title: str = ""):
    x = np.arange(len(xlabels))
    for name, ys in series.items():
        color, marker = series_style(name)
        ax.plot(x, ys, marker=marker, color=color, label=name)
    ax.set_xticks(x, xlabels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def grouped_bars(ax, xlabels: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, title: str = "",
                 errors: Mapping[str, Sequence[float]] | None = None, log: bool = False):
    x = np.arange(len(xlabels))
    k = max(len(series), 1)
    width = 0.8 / k
    for n, (name, ys) in enumerate(series.items()):
        color, _ = series_style(name)
        err = errors.get(name) if errors else None
        ax.bar(x - 0.4 + width * (n + 0.5), ys, width, yerr=err, color=color, label=name, capsize=2)
    ax.set_xticks(x, xlabels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
