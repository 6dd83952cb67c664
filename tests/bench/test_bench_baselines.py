"""Baselines against ours on emulated case 5 (8 devices), one invocation, one table (issue 5).

Megatron and DeepSpeed are first tuned on the same emulated network as the paper tuned them
(`harness tune`: every layout of the grid), then every row runs 3 times: ours (ga schedule,
3 executions), ours-random (seeds 2022-2024), Megatron's best layout in default rank order
(3 executions) and with the random layouts of seeds 2022-2024 (the paper's way, appendix D.2),
and DeepSpeed's best. The table (iteration seconds and PFLOPS, mean and each run) is printed
and written to results/5-worldwide/bench-baselines-<stamp>/table.md with every run's records.

Needs the emulated cluster (root + user-mode Linux or a host kernel with netem); ~60 min on 2 cores.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.network import kernel
from harness.results import RESULTS_DIR, atomic_write_json, atomic_write_text, read_records
from harness.train.baselines.layout import RANDOM_LAYOUT_SEEDS, random_rank_order
from harness.train.baselines.tune import tune
from harness.train.experiment import RunRequest, execute

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])

BASE = dict(scenario="5", devices=8, model="tiny", batch=16, micro_batch=1, bandwidth_scale=1.0,
            network="emulated", seed=0, timeout_s=900.0)
TUNE_ITERS, ITERS, WARMUP = 1, 2, 1
# A grid point whose run (start-up, warm-up and timed iteration) exceeds this is recorded as
# failed ("timed out") and pruned: tensor parallel over the world-wide links takes minutes per
# iteration, an order of magnitude slower than the pipeline layouts, and cannot be the best.
TUNE_POINT_LIMIT_S = 240.0


def _mean(run_dir: Path) -> tuple[float, float]:
    recs = read_records(Path(run_dir) / "records.csv")
    return statistics.mean(r["seconds"] for r in recs), statistics.mean(r["pflops"] for r in recs)


def compare(root: Path) -> dict:
    """Tune both baselines, then run every row 3 times; returns the table as data."""
    tune_req = RunRequest(**{**BASE, "timeout_s": TUNE_POINT_LIMIT_S}, iters=TUNE_ITERS, warmup=WARMUP,
                          schedule="1f1b", results_root=root)
    tuned = {system: tune(tune_req, system, progress=False) for system in ("megatron", "deepspeed")}
    req = RunRequest(**BASE, iters=ITERS, warmup=WARMUP, results_root=root)
    mega, deep = tuned["megatron"].best, tuned["deepspeed"].best
    rows: dict[str, list[RunRequest]] = {
        "ours (ga)": [replace(req, system="ours", scheduler="ga") for _ in range(3)],
        "ours-random": [replace(req, system="ours-random", seed=s) for s in RANDOM_LAYOUT_SEEDS],
        f"megatron best ({mega.label}), default rank order": [
            replace(req, system="megatron", extra_layout=mega.layout) for _ in range(3)],
        f"megatron best ({mega.label}), random layouts": [
            replace(req, system="megatron", extra_layout={**mega.layout, "rank_order": list(random_rank_order(8, s, mega.d_tp, mega.d_pp))})
            for s in RANDOM_LAYOUT_SEEDS],
        f"deepspeed best ({deep.label})": [replace(req, system="deepspeed", extra_layout=deep.layout) for _ in range(3)],
    }
    table = {}
    for name, reqs in rows.items():
        runs = [_mean(execute(r)) for r in reqs]
        table[name] = {"seconds": [s for s, _ in runs], "pflops": [p for _, p in runs]}
    return {"tuned": {k: v.to_json() for k, v in tuned.items()}, "rows": table}


def render(result: dict) -> str:
    lines = ["| system | iteration s (mean) | runs (s) | PFLOPS (mean) |", "|---|---:|---|---:|"]
    for name, row in result["rows"].items():
        runs = ", ".join(f"{s:.2f}" for s in row["seconds"])
        lines.append(f"| {name} | {statistics.mean(row['seconds']):.2f} | {runs} | "
                     f"{statistics.mean(row['pflops']):.3g} |")
    for system, t in result["tuned"].items():
        lines.append("")
        lines.append(f"{system} grid (1 timed iteration each): " + "; ".join(
            f"{p['label']}: {p['seconds']:.2f} s" if p["status"] == "ok"
            else f"{p['label']}: " + ("pruned, run > limit" if "timed out" in p["reason"] else "failed")
            for p in t["points"]))
    return "\n".join(lines)


@pytest.mark.bench
@pytest.mark.net
@pytest.mark.timeout(5400)
@pytest.mark.skipif(bool(_missing), reason=f"emulated cluster unavailable: {', '.join(_missing)}")
def test_bench_baselines_against_ours_on_case5(benchmark):
    root = Path(os.environ.get("HARNESS_RESULTS", RESULTS_DIR))
    out = root / "5-worldwide" / f"bench-baselines-{time.strftime('%Y%m%d-%H%M%S')}"
    result = benchmark.pedantic(lambda: compare(root), rounds=1, iterations=1)
    text = render(result)
    atomic_write_json(out / "table.json", result)
    atomic_write_text(out / "table.md", text + "\n")
    print("\n" + text)
    rows = result["rows"]
    assert all(len(r["seconds"]) == 3 and min(r["seconds"]) > 0 for r in rows.values())
    mean = {name: statistics.mean(r["seconds"]) for name, r in rows.items()}
    ours = mean["ours (ga)"]
    # The paper's direction off the data center: ours fastest, ZeRO-3 slower than ZeRO-1 + pipeline.
    assert all(ours < m for name, m in mean.items() if name.startswith(("megatron", "deepspeed"))), mean
    # A point pruned at the limit counts as slower than every point that finished.
    ds = {p["label"]: p["seconds"] if p["status"] == "ok" else float("inf")
          for p in result["tuned"]["deepspeed"]["points"]}
    zero1 = [s for label, s in ds.items() if label.startswith("zero1")]
    assert zero1 and ds["zero3 dp=8"] > min(zero1), ds
