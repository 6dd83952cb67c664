"""What an agent reads of the ranks it started (elastic.py, quorum_agent.py): their journals (the iterations they
took, their keep-alives, their milestones), their results, and how it stops one as a cloud takes a machine."""
from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

from .stats import IterationStats


def kill(p) -> None:
    if p.pid is not None and p.exitcode is None:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_time(path: Path) -> float | None:
    """The time.monotonic() a rank wrote to `path`; None before it did."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def result(outdir: Path, rank: int):
    with open(outdir / f"rank{rank}.pkl", "rb") as f:
        return pickle.load(f)


def journaled(path: Path) -> list[IterationStats]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(IterationStats(**json.loads(line)))
        except (ValueError, TypeError):  # the line the rank was writing when it was stopped
            break
    return out


def rank_marks(journal: Path, rank: int) -> dict[str, float]:
    """The milestones one rank reached (time.monotonic())."""
    path = journal / f"marks-{rank}.jsonl"
    return {} if not path.exists() else {k: v for line in path.read_text().splitlines() if line.endswith("}")
                                         for k, v in json.loads(line).items()}


def marks(journal: Path, ranks: int) -> dict[str, float]:
    """When the last rank of a generation reached each milestone every rank reached (time.monotonic()):
    "process_group", "model", "training" (ready to train: process group, model, state loaded), ..."""
    every: dict[str, list[float]] = {}
    for r in range(ranks):
        for k, v in rank_marks(journal, r).items():
            every.setdefault(k, []).append(v)
    return {k: max(v) for k, v in every.items() if len(v) == ranks}
