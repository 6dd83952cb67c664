"""`harness tune`: every grid point runs as a `harness run`, all are reported and kept, the best is the fastest."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from harness import layout as layouts
from harness.errors import HarnessError
from harness.layout import Layout
from harness.compute.model import get_model
from harness.results import read_records
from harness.systems.baselines.tune import tune
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection

pytestmark = pytest.mark.timeout(240)

ARGS = ["--scenario", "3", "--devices", "4", "--network", "none", "--model", "tiny", "--layers", "2",
        "--batch", "4", "--micro-batch", "1", "--iters", "2", "--warmup", "0"]


def each(execute):
    """execute_many of a one-request execute: its directory or its error, per request."""
    def many(reqs):
        out = []
        for r in reqs:
            try:
                out.append(execute(r))
            except HarnessError as e:
                out.append(e)
        return out
    return many


def request(tmp_path, schedule=None) -> RunRequest:
    return RunRequest(network=NetworkSection("3", devices=4, mode="none"),
                      model=ModelSection("tiny", layers=2, batch=4, micro_batch=1),
                      layout=LayoutRequest(schedule=schedule), run=RunSection(iters=1, warmup=0, results_root=str(tmp_path)))


@pytest.mark.parametrize("system", ["megatron", "deepspeed"])
def test_tune_runs_every_point_and_reports_the_best(cli, tmp_path, system):
    rc, out, err = cli("tune", "--system", system, *ARGS, "--results", tmp_path)
    assert rc == 0, err
    expected = [lay.label() for lay in getattr(layouts, f"{system}_grid")(get_model("tiny", 2), 4, 4, 1)]
    summary = json.loads(next(tmp_path.rglob("tune.json")).read_text())
    assert [p["label"] for p in summary["points"]] == expected
    assert all(p["status"] == "ok" for p in summary["points"])
    for p in summary["points"]:
        assert p["label"] in out
        recs = read_records(Path(p["run_dir"]) / "records.csv")
        assert len(recs) == 2 and {r["system"] for r in recs} == {system}
        assert json.loads(recs[0]["config"]) == p["layout"]
        assert p["seconds"] == pytest.approx(sum(r["seconds"] for r in recs) / 2)
        assert all(math.isfinite(r["loss"]) for r in recs)
    best = min(summary["points"], key=lambda p: p["seconds"])
    assert summary["best"] == best
    assert f"best: {best['label']}" in out


def test_failed_point_is_recorded_and_the_search_goes_on(tmp_path):
    req = request(tmp_path, schedule="gpipe")
    seen = []

    def fake_execute(r):
        seen.append(r)
        if r.layout.explicit.tp == 2:
            raise HarnessError("run failed: rank 1 failed: out of memory")
        out = tmp_path / r.run.run_id
        out.mkdir()
        secs = 1.0 + len(seen)
        (out / "records.csv").write_text("run_id,scenario,system,backend,devices,seconds,pflops,loss\n"
                                         f"{r.run.run_id},5-worldwide,megatron,local,4,{secs},{1 / secs},5.0\n")
        return out

    result = tune(req, "megatron", progress=False, execute_many=each(fake_execute))
    assert len(seen) == len(result.points) == len(layouts.megatron_grid(get_model("tiny", 2), 4, 4, 1))
    assert all(r.run.system == "megatron" and r.layout.explicit.schedule == "gpipe" for r in seen)
    failed = [p for p in result.points if p.status == "failed"]
    assert failed and all(p.d_tp == 2 and "out of memory" in p.reason for p in failed)
    assert result.best.seconds == 2.0 and result.best.status == "ok"
    saved = json.loads((result.summary_dir / "tune.json").read_text())
    assert len(saved["points"]) == len(result.points) and saved["best"]["label"] == result.best.label


def test_rank_order_seed_applies_one_permutation_to_every_point(tmp_path):
    orders = []

    def fake_execute(r):
        orders.append(r.layout.explicit)
        raise HarnessError("not run")

    result = tune(request(tmp_path), "megatron", rank_order=2022, progress=False, execute_many=each(fake_execute))
    assert result.best is None and all(result.points[k].status == "failed" for k in range(len(orders)))
    for p, lay in zip(result.points, orders):
        assert lay.mesh == layouts.seeded(p.d_tp, p.d_pp, p.d_dp, 2, 2022).mesh and lay.placement == "seed-2022"


def test_tune_user_errors_are_one_line(cli, tmp_path):
    # 8 devices, 1 layer, batch 3: no D_DP divides the batch but 1, and D_TP = 8 exceeds the 4 heads.
    rc, out, err = cli("tune", "--system", "megatron", "--scenario", "3", "--devices", "8", "--model", "tiny",
                       "--layers", "1", "--batch", "3", "--network", "none", "--results", tmp_path)
    assert rc == 2 and err.count("\n") == 1 and "no layout" in err
    rc, out, err = cli("tune", "--system", "megatron", "--scenario", "3", "--devices", "4", "--rank-order", "x",
                       "--network", "none", "--layers", "2", "--batch", "4", "--results", tmp_path)
    assert rc == 2 and "--rank-order" in err and err.count("\n") == 1


def test_budget_runs_the_points_the_simulator_predicts_fastest(tmp_path):
    """--budget K: the K points of least predicted seconds run (in one call, one boot when emulated); the rest are
    listed as skipped with their predictions. On case 5's world-wide links at 1/100 of their bandwidth, tensor
    parallelism across regions is the slowest layout the model predicts."""
    req = RunRequest(network=NetworkSection("5", devices=8, mode="none", bandwidth_scale=0.01),
                     model=ModelSection("tiny", layers=4, batch=8, micro_batch=1),
                     layout=LayoutRequest(), run=RunSection(iters=1, warmup=0, results_root=str(tmp_path)))
    calls = []

    def fake_many(reqs):
        calls.append(reqs)
        return [HarnessError("not run here") for _ in reqs]

    result = tune(req, "megatron", budget=2, progress=False, execute_many=fake_many)
    assert len(calls) == 1 and len(calls[0]) == 2
    ran = [p for p in result.points if p.status == "failed"]
    skipped = [p for p in result.points if p.status == "skipped"]
    assert len(ran) == 2 and len(skipped) == len(result.points) - 2 >= 1
    assert all(math.isfinite(p.predicted) and p.predicted > 0 for p in result.points)
    assert max(p.predicted for p in ran) <= min(p.predicted for p in skipped)
    assert {r.layout.explicit.label() for r in calls[0]} == {p.label for p in ran}
    assert all("not among the fastest predicted" in p.reason for p in skipped)
    slowest = max(result.points, key=lambda p: p.predicted)
    assert slowest.d_tp == max(p.d_tp for p in result.points) > 1
    saved = json.loads((result.summary_dir / "tune.json").read_text())
    assert [p["status"] for p in saved["points"]] == [p.status for p in result.points]
    calls.clear()
    close = tune(req, "megatron", budget=8, within=2.0, progress=False, execute_many=fake_many).points
    best = min(p.predicted for p in close)
    assert {r.layout.explicit.label() for r in calls[0]} == {p.label for p in close if p.predicted <= 2 * best}
    assert 1 <= len(calls[0]) < len(close)  # the widest tensor parallelism is far slower than 2x the best


def test_budget_from_the_cli_runs_one_point(cli, tmp_path):
    rc, out, err = cli("tune", "--system", "deepspeed", *ARGS, "--budget", "1", "--results", tmp_path)
    assert rc == 0, err
    summary = json.loads(next(tmp_path.rglob("tune.json")).read_text())
    statuses = [p["status"] for p in summary["points"]]
    assert statuses.count("ok") == 1 and statuses.count("skipped") == len(statuses) - 1 >= 1
    assert summary["best"]["status"] == "ok" and "the 1 the simulator predicts fastest" in err
    assert summary["best"]["predicted"] == min(p["predicted"] for p in summary["points"])
