"""Measured runs side by side: one row per (system, layout), mean over runs and iterations."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import HarnessError
from ..results import atomic_write_text, read_records


def runs_table(root: Path) -> pd.DataFrame:
    """Every records.csv below `root` (ok runs only) summarised per system and layout."""
    root = Path(root)
    if not root.exists():
        raise HarnessError(f"{root}: no such directory")
    rows = []
    for rec_file in sorted(root.rglob("records.csv")):
        manifest = rec_file.parent / "manifest.json"
        status = json.loads(manifest.read_text()).get("status") if manifest.exists() else "ok"
        if status != "ok":
            continue
        rows += read_records(rec_file)
    if not rows:
        raise HarnessError(f"{root}: no records.csv of a successful run below it")
    df = pd.DataFrame(rows)
    df["layout"] = df.apply(_layout, axis=1)
    per_run = df.groupby(["system", "layout", "backend", "kernel", "run_id"], as_index=False).agg(
        seconds=("seconds", "mean"), pflops=("pflops", "mean"), seed=("seed", "first"))
    table = per_run.groupby(["system", "layout", "backend", "kernel"], as_index=False).agg(
        runs=("run_id", "count"), seconds=("seconds", "mean"), seconds_min=("seconds", "min"),
        seconds_max=("seconds", "max"), pflops=("pflops", "mean"))
    return table.sort_values("seconds").reset_index(drop=True)


def _layout(r) -> str:
    cfg = r.get("config") or ""
    if cfg:
        try:
            # list values (pipelines, a permuted rank order) are marked, not spelled out: runs of
            # one system with and without a permutation stay apart, seeds of one kind together
            return ",".join(f"{k}=[...]" if isinstance(v, (list, dict)) else f"{k}={v}"
                            for k, v in json.loads(cfg).items())
        except (json.JSONDecodeError, AttributeError):
            return str(cfg)
    return f"tp={r['d_tp']},pp={r['d_pp']},dp={r['d_dp']}"


def write_runs_table(root: Path, out_dir: Path | None = None) -> tuple[str, list[Path]]:
    table = runs_table(root)
    out_dir = Path(out_dir or root)
    text = table.to_string(index=False, float_format=lambda x: f"{x:.4g}")
    csv = out_dir / "runs.csv"
    atomic_write_text(csv, table.to_csv(index=False))
    return text, [csv]
