"""`harness run --network emulated`: ranks train inside the emulated cluster (namespaces, shaping)
and a rank killed there fails the run with a manifest naming it."""
from __future__ import annotations

import json
import os

import pytest

from harness.cli import main
from harness.network import kernel
from harness.results import read_records


def _missing() -> str:
    try:
        kernel.choose("auto")
    except kernel.KernelError as e:
        return str(e)
    return "" if os.geteuid() == 0 else "needs root for namespaces"


pytestmark = [pytest.mark.net, pytest.mark.timeout(300),
              pytest.mark.skipif(bool(_missing()), reason=f"emulated cluster unavailable: {_missing()}")]

ARGS = ["run", "--scenario", "3", "--devices", "4", "--network", "emulated", "--model", "tiny", "--layers", "2",
        "--batch", "4", "--micro-batch", "1", "--d-pp", "2", "--d-dp", "2"]


def only_run(root):
    dirs = [p for p in root.glob("3-multi-dc/*") if p.is_dir()]
    assert len(dirs) == 1
    return dirs[0]


def test_trains_in_the_emulated_cluster(tmp_path, capsys):
    assert main(ARGS + ["--iters", "2", "--warmup", "1", "--out", str(tmp_path)]) == 0
    d = only_run(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "ok" and m["kernel"] in ("host", "uml") and m["startup_s"] > 0
    recs = read_records(d / "records.csv")
    assert [(r["backend"], r["kernel"], r["iteration"]) for r in recs] == [("emu", m["kernel"], 1), ("emu", m["kernel"], 2)]
    # Case 3's cross-region link (10 ms one way) is in every iteration: the pipeline or the DP
    # group spans the two regions, so no iteration can be faster than one round trip.
    assert all(r["seconds"] > 0.02 and 5 < r["loss"] < 8 for r in recs)
    assert (d / "ranks.log").exists()


def test_killed_rank_in_the_emulated_cluster_fails_the_run(tmp_path, capsys):
    rc = main(ARGS + ["--iters", "100000", "--warmup", "0", "--out", str(tmp_path), "--timeout", "120",
                      "--debug", "fault_rank=2", "--debug", "fault_after_s=3"])
    err = capsys.readouterr().err
    assert rc == 2 and "rank 2 (device 2, " in err and "killed by signal SIGKILL" in err
    m = json.loads((only_run(tmp_path) / "manifest.json").read_text())
    assert m["status"] == "failed" and m["reason"].startswith("rank 2 (device 2, ")
    assert not (only_run(tmp_path) / "records.csv").exists()
