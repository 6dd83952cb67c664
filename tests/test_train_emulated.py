"""`harness run --network emulated`: ranks train inside the emulated cluster (namespaces, shaping)
and a rank killed there fails the run with a manifest naming it."""
from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.results import read_records
from tests import emulation


pytestmark = emulation.marks()

ARGS = ["run", "--scenario", "3", "--devices", "4", "--network", "emulated", "--model", "tiny", "--layers", "2",
        "--batch", "4", "--micro-batch", "1", "--d-pp", "2", "--d-dp", "2"]


def test_runs_share_one_boot_and_a_killed_rank_fails_only_its_own_run(tmp_path, capsys):
    """Ranks train inside the emulated cluster (namespaces, shaping). `--each`: three runs in one boot of
    the cluster (a run alone takes the same path, with one); the second's rank 2 is killed. That run fails
    with a manifest naming the rank and no records; the ones before and after it train, each with
    its own manifest, records and log, and only the first pays the imports."""
    each = ["--each", "--system ours --iters 2",
            "--each", "--system ours --iters 100000 --timeout 120 --debug fault_rank=2 --debug fault_after_s=3",
            "--each", "--system ours-random --seed 1 --iters 1"]
    rc = main(ARGS + ["--warmup", "1", "--results", str(tmp_path)] + each)
    err = capsys.readouterr().err
    assert rc == 1 and "1 of 3 runs did not finish" in err and "rank 2 (device 2, " in err
    dirs = sorted((p for p in tmp_path.glob("3-multi-dc/*") if p.is_dir()),
                  key=lambda p: json.loads((p / "manifest.json").read_text())["cluster_boot"]["position"])
    mans = [json.loads((d / "manifest.json").read_text()) for d in dirs]
    assert [m["status"] for m in mans] == ["ok", "failed", "ok"]
    assert all(m["cluster_boot"]["runs"] == [x["run_id"] for x in mans] for m in mans)
    killed = mans[1]
    assert killed["reason"].startswith("rank 2 (device 2, ") and "killed by signal SIGKILL" in killed["reason"]
    assert not (dirs[1] / "records.csv").exists()
    assert "imports" in mans[0]["startup_breakdown_s"] and "imports" not in mans[2]["startup_breakdown_s"]
    assert 0 < mans[2]["startup_s"] < mans[0]["startup_s"]  # no imports, no warm-up
    for d, m, iters in ((dirs[0], mans[0], 2), (dirs[2], mans[2], 1)):
        recs = read_records(d / "records.csv")
        assert m["readback"] and m["kernel"] in ("host", "uml")
        # case 3 keeps the window between bursts: the scenario's TCP settings, set in every device's namespace
        assert m["transport"]["slow_start_after_idle"] is False
        assert {rb["transport"]["tcp_slow_start_after_idle"] for rb in m["readback"].values()} == {"0"}
        assert [(r["backend"], r["kernel"], r["iteration"]) for r in recs] == [
            ("emu", m["kernel"], i) for i in range(1, iters + 1)]
        # Case 3's cross-region link (10 ms one way) is in every iteration: the pipeline or the DP
        # group spans the two regions, so no iteration can be faster than one round trip.
        assert all(r["seconds"] > 0.02 and 5 < r["loss"] < 8 for r in recs)
        log = (d / "ranks.log").read_text()  # its own progress lines only
        assert log.count("harness: iteration") == 1 + iters, log
