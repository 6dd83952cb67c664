"""The regression gate's history: one JSON line per gate run (commit, time, verdict, every figure's value), and
its plot, one panel per figure over the runs."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..files import read_text
from . import Figure, RegressError


def append_history(path: Path, figures: list[Figure], failed: bool) -> None:
    """One JSON line per gate run: commit, time, verdict and every figure's value."""
    from ..results import git_commit

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"commit": git_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "failed": failed, "figures": {f.name: f.value for f in figures}}
    with path.open("a") as fh:
        fh.write(json.dumps(line) + "\n")


def read_history(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise RegressError(f"regress history: {path}: no history yet (run `harness regress` first)")
    out = []
    for i, line in enumerate(read_text(path, "history file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc.get("figures"), dict):
                raise ValueError
        except (json.JSONDecodeError, ValueError, AttributeError):
            raise RegressError(f"regress history: {path}:{i}: expected a JSON object with figures") from None
        out.append(doc)
    return out


def plot_history(history: list[dict], out: Path) -> Path:
    """One panel per figure over the gate's runs (x: run, labelled by short commit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for h in history for n in h["figures"]})
    cols = 3
    rows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.4 * rows), squeeze=False)
    labels = [str(h.get("commit", "?"))[:7] for h in history]
    for ax, name in zip(axes.flat, names):
        xs = [i for i, h in enumerate(history) if name in h["figures"]]
        ax.plot(xs, [history[i]["figures"][name] for i in xs], marker="o", ms=3)
        ax.set_title(name, fontsize=8)
        ax.set_xticks(range(len(history)), labels, rotation=90, fontsize=6)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

