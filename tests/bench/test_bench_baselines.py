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
from pathlib import Path

import pytest

from harness import layout as layouts
from harness.layout import RANDOM_SEEDS, Layout
from harness.network import kernel
from harness.files import atomic_write_json, atomic_write_text
from harness.results import RESULTS_DIR, read_records
from harness.systems.baselines.tune import tune
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.train.experiment import execute

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])

TUNE_ITERS, ITERS, WARMUP = 1, 2, 1


def request(root: Path, system: str = "ours", *, layout: Layout | None = None, seed: int = 0, iters: int = ITERS,
            timeout_s: float = 900.0, schedule: str | None = None) -> RunRequest:
    return RunRequest(network=NetworkSection("5", devices=8, bandwidth_scale=1.0),
                      model=ModelSection("tiny", batch=16, micro_batch=1, seed=seed),
                      layout=LayoutRequest(explicit=layout, schedule=schedule),
                      run=RunSection(system=system, iters=iters, warmup=WARMUP, timeout_s=timeout_s,
                                     results_root=str(root)))
# A grid point whose run (start-up, warm-up and timed iteration) exceeds this is recorded as
# failed ("timed out") and pruned: tensor parallel over the world-wide links takes minutes per
# iteration, an order of magnitude slower than the pipeline layouts, and cannot be the best.
TUNE_POINT_LIMIT_S = 240.0


def _mean(run_dir: Path) -> tuple[float, float]:
    recs = read_records(Path(run_dir) / "records.csv")
    return statistics.mean(r["seconds"] for r in recs), statistics.mean(r["pflops"] for r in recs)


def compare(root: Path) -> dict:
    """Tune both baselines, then run every row 3 times; returns the table as data."""
    tune_req = request(root, iters=TUNE_ITERS, timeout_s=TUNE_POINT_LIMIT_S, schedule="1f1b")
    tuned = {system: tune(tune_req, system, progress=False) for system in ("megatron", "deepspeed")}
    mega, deep = (Layout.from_json(tuned[s].best.layout) for s in ("megatron", "deepspeed"))
    seeded = [layouts.seeded(mega.tp, mega.pp, mega.dp, mega.layers, s, schedule=mega.schedule) for s in RANDOM_SEEDS]
    rows: dict[str, list[RunRequest]] = {
        "ours (ga)": [request(root) for _ in range(3)],
        "ours-random": [request(root, "ours-random", seed=s) for s in RANDOM_SEEDS],
        f"megatron best ({mega.label()}), default rank order": [request(root, "megatron", layout=mega) for _ in range(3)],
        f"megatron best ({mega.label()}), random layouts": [request(root, "megatron", layout=lay) for lay in seeded],
        f"deepspeed best ({deep.label()})": [request(root, "deepspeed", layout=deep) for _ in range(3)],
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
