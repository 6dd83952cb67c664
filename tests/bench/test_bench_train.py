"""Speed targets of "ours" (issue 4), measured figures in each benchmark's extra_info and printed.

1. Loopback (--network none): the pipeline's overhead over pure computation, bubble excluded,
   <= 15 %. Two stages on two cores, GPipe with 8 micro-batches. With c_j the compute seconds
   of stage j in an iteration (forward, backward, optimizer, timed inside the runtime), a
   GPipe iteration without any overhead takes sum_j c_j / n + (n - 1)/n * max_j c_j
   (the fill/drain bubble of the critical path); overhead = measured / that - 1. The same
   ideal from a single-process run of the whole model (pure compute, no runtime) is reported.

2. Emulated case 5, 8 devices (one per region), D_PP x D_DP = 4 x 2: square as the paper's
   8 x 8, pipeline on the longer side, and both pipeline and data-parallel traffic large, so
   the scheduler has to trade one off against the other as in the paper (8 x 1 leaves no DP
   traffic, 2 x 4 lets DP dominate). Bandwidth scale 0.01 (2 Gbps -> 20 Mbps): every
   transfer takes seconds, so communication dominates the ~0.1 s of computation per rank, as
   GPT3-XL's GB-sized activations do on the real links. `ours` (ga) must beat `ours-random`
   (seeds 2022-2024, the paper's) and stay within 1.3x of the communication lower bound of its
   assignment (harness/plan/bounds.py); the cost model's COMM-COST (eq. 1) is reported too.
   The 8 ranks must be training within 20 s of the launcher's start inside the cluster.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest

from harness import layout as layouts
from harness.compute.model import get_model
from harness.train.local import local_spec, run_local
from harness.train.reference import reference_train
from tests import emulation

pytestmark = pytest.mark.bench

OVERHEAD_MAX = 0.15
BOUND_RATIO_MAX = 1.3
STARTUP_MAX_S = 20.0


def test_pipeline_overhead_over_compute_loopback(benchmark):
    n, d_pp, iters = 8, 2, 6
    layout = layouts.from_pipelines([list(range(d_pp))], 4, "identity", schedule="gpipe", dp_sync="sharded-ps")
    spec = local_spec(layout, name="small", batch=n, micro_batch=1, iters=iters, warmup=2, timeout_s=300)
    run = benchmark.pedantic(lambda: run_local(spec, timeout_s=600), rounds=1, iterations=1)
    per_stage = [r.stats for r in sorted(run.ranks, key=lambda r: layout.coords(r.rank)[0])]
    ratios = []
    for i in range(iters):
        c = [s[i].compute_seconds for s in per_stage]
        ideal = sum(c) / n + (n - 1) / n * max(c)
        ratios.append(max(s[i].seconds for s in per_stage) / ideal - 1)
    overhead = statistics.median(ratios)
    # Pure compute from one process (no runtime at all): the whole model's step over d_pp stages.
    cfg = get_model("small", 4)
    reference_train(cfg, n, 1, 1, 0, 0.1)  # warm
    t0 = time.perf_counter()
    reference_train(cfg, n, 1, 2, 0, 0.1)
    ref_step = (time.perf_counter() - t0) / 2
    ideal_ref = ref_step / d_pp * (n + d_pp - 1) / n
    measured = statistics.median(max(s[i].seconds for s in per_stage) for i in range(iters))
    compute_sum = statistics.median(sum(s[i].compute_seconds for s in per_stage) for i in range(iters))
    benchmark.extra_info.update(overhead=overhead, overhead_each=ratios, iteration_s=measured,
                                overhead_vs_single_process=measured / ideal_ref - 1,
                                stage_compute_sum_s=compute_sum, single_process_step_s=ref_step)
    print(f"\npipeline overhead over compute (bubble excluded): {overhead:.1%} "
          f"(each iteration {[f'{r:.1%}' for r in ratios]}); vs a single-process step: "
          f"{measured / ideal_ref - 1:.1%} (iteration {measured:.3f} s, single-process step {ref_step:.3f} s, "
          f"stages' compute summed {compute_sum:.3f} s: above the single-process step when the ranks share cores)")
    assert overhead <= OVERHEAD_MAX


def case5(system: str, seed: int, root: Path):
    from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection

    return RunRequest(network=NetworkSection("5", devices=8, bandwidth_scale=0.01),
                      model=ModelSection("tiny", layers=4, batch=8, micro_batch=1, seed=seed),
                      layout=LayoutRequest(pp=4, dp=2),
                      run=RunSection(system=system, iters=3, warmup=3, timeout_s=600.0, results_root=str(root)))


RANDOM_SEEDS = (2022, 2023, 2024)


def test_case5_scheduled_vs_random_and_lower_bound(benchmark, tmp_path):
    missing = emulation.missing()
    if missing:
        pytest.skip(f"emulated cluster unavailable: {missing}")
    from harness.results import read_records
    from harness.train.experiment import execute

    def one(system: str, seed: int) -> dict:
        out = execute(case5(system, seed, tmp_path))
        m = json.loads((Path(out) / "manifest.json").read_text())
        secs = [r["seconds"] for r in read_records(Path(out) / "records.csv")]
        return {"median_s": statistics.median(secs), "each_s": secs, "startup_s": m.get("startup_s"),
                "bound_s": m["placement"]["comm_lower_bound_s"]["total"],
                "cost_model_s": m["placement"]["cost_model_s"]["total"], "pipelines": m["placement"]["pipelines"],
                "kernel": m.get("kernel")}

    def runs():
        return {"ga": one("ours", 0), **{f"random-{s}": one("ours-random", s) for s in RANDOM_SEEDS}}

    res = benchmark.pedantic(runs, rounds=1, iterations=1)
    ga = res["ga"]
    benchmark.extra_info.update(res)
    print("\ncase 5, 8 devices, 4 x 2, bandwidth x0.01, tiny (4 layers), batch 8, micro-batch 1:")
    for name, r in res.items():
        print(f"  {name:12s} iteration {r['median_s']:.2f} s (each {[round(x, 2) for x in r['each_s']]}), "
              f"comm lower bound {r['bound_s']:.2f} s (ratio {r['median_s'] / r['bound_s']:.2f}), "
              f"cost model {r['cost_model_s']:.2f} s, start-up {r['startup_s']:.1f} s, {r['pipelines']}, {r['kernel']}")
    for s in RANDOM_SEEDS:
        assert ga["median_s"] < res[f"random-{s}"]["median_s"]
    assert ga["median_s"] <= BOUND_RATIO_MAX * ga["bound_s"]
    assert all(r["startup_s"] <= STARTUP_MAX_S for r in res.values())
