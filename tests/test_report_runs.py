import json
from dataclasses import replace

import pandas as pd
import pytest

from harness.results import IterationRecord, atomic_write_json, write_records

BASE = IterationRecord(
    run_id="r", scenario="5-worldwide", system="ours", backend="emu", kernel="uml", devices=8, d_pp=4, d_dp=2,
    model="tiny", layers=4, hidden=128, seq=128, batch=8, micro_batch=1, seed=0, bandwidth_scale=0.01,
    iteration=0, seconds=1.0, pflop=1e-5, pflops=1e-5, tokens_per_s=1.0, compute_seconds=0.5,
    exposed_comm_seconds=0.5, loss=7.0)


def run(root, run_id, status, seconds, **kw):
    d = root / run_id
    recs = [replace(BASE, run_id=run_id, iteration=i, seconds=s, pflops=1e-5 / s, **kw) for i, s in enumerate(seconds)]
    write_records(d / "records.csv", recs)
    atomic_write_json(d / "manifest.json", {"status": status})


def test_runs_table_groups_by_system_and_layout_and_skips_failed_runs(tmp_path, cli):
    run(tmp_path, "a", "ok", [2.0, 4.0])
    run(tmp_path, "b", "ok", [6.0])
    run(tmp_path, "c", "failed", [100.0])
    run(tmp_path, "d", "ok", [1.0], system="megatron", config=json.dumps({"tp": 1, "pp": 4, "dp": 2}))
    run(tmp_path, "e", "ok", [8.0], system="megatron",
        config=json.dumps({"tp": 1, "pp": 4, "dp": 2, "rank_order": [1, 0, 2, 3]}))
    rc, out, _ = cli("report", "runs", tmp_path)
    assert rc == 0
    table = pd.read_csv(tmp_path / "runs.csv")
    assert list(table.system) == ["megatron", "ours", "megatron"]  # fastest first
    assert table.layout[0] == "tp=1,pp=4,dp=2" and table.layout[1] == "tp=1,pp=4,dp=2"
    assert table.layout[2] == "tp=1,pp=4,dp=2,rank_order=[...]"  # a permuted layout is its own row
    ours = table.iloc[1]
    assert ours.runs == 2 and ours.seconds == pytest.approx((3.0 + 6.0) / 2)  # failed run c left out
    assert ours.seconds_min == pytest.approx(3.0) and ours.seconds_max == pytest.approx(6.0)
    assert "megatron" in out


def test_runs_table_needs_successful_runs(tmp_path, cli):
    run(tmp_path, "c", "failed", [1.0])
    rc, _, err = cli("report", "runs", tmp_path)
    assert rc == 2 and "no records.csv of a successful run" in err
    rc, _, err = cli("report", "runs", tmp_path / "missing")
    assert rc == 2 and "no such directory" in err
