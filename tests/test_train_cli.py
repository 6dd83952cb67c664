"""`harness run --network none`: records and manifest on success, a `failed` manifest naming the rank on a crash."""
from __future__ import annotations

import json
import re
import time

import pytest

from harness.cli import main
from harness.layout import Layout
from harness.results import RECORD_FIELDS, read_records

pytestmark = pytest.mark.timeout(180)

ARGS = ["run", "--scenario", "5", "--devices", "8", "--network", "none", "--model", "tiny", "--layers", "4",
        "--batch", "8", "--micro-batch", "1", "--iters", "2", "--warmup", "1"]


def only_run(root):
    dirs = [p for p in root.glob("5-worldwide/*") if p.is_dir()]
    assert len(dirs) == 1
    return dirs[0]


@pytest.mark.parametrize("system,scheduler", [("ours", "ga"), ("ours-random", "random-assignment")])
def test_run_writes_records_and_manifest(tmp_path, capsys, system, scheduler):
    assert main(ARGS + ["--system", system, "--seed", "2022", "--results", str(tmp_path)]) == 0
    d = only_run(tmp_path)
    assert capsys.readouterr().out.strip() == str(d)
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "ok" and m["placement"]["scheduler"] == scheduler
    assert m["spec"]["layout"]["pp"] * m["spec"]["layout"]["dp"] == 8 and m["spec"]["layout"]["tp"] == 1
    recs = read_records(d / "records.csv")
    assert [r["iteration"] for r in recs] == [1, 2]
    r = recs[0]
    assert set(r) == set(RECORD_FIELDS)
    assert (r["system"], r["backend"], r["kernel"], r["devices"], r["d_pp"], r["d_dp"]) == (system, "local", "none", 8, 4, 2)
    assert r["seconds"] > 0 and r["compute_seconds"] > 0 and 5 < r["loss"] < 8
    assert r["pflops"] == pytest.approx(r["pflop"] / r["seconds"])
    assert r["tokens_per_s"] == pytest.approx(8 * 128 / r["seconds"])
    assert [list(p) for p in Layout.from_json(json.loads(r["config"])).pipelines] == m["placement"]["pipelines"]


BASELINE_WARNINGS = ("find_unused_parameters=True was specified", "broadcast_buffers` is deprecated")


@pytest.mark.parametrize("system,layout", [("megatron", ["--tp", "1", "--pp", "4", "--dp", "2"]),
                                           ("deepspeed", ["--zero", "1", "--pp", "4", "--dp", "2"])])
def test_baseline_prints_progress_a_trace_of_its_operations_and_no_known_warnings(tmp_path, capfd, system, layout):
    """The ranks are forked: their stderr is fd 2, hence capfd. Every layout here wraps stages in DDP.

    With `--debug trace=1` every rank prints when each forward, backward and all-reduce ran: on one
    clock, so a micro-batch's forward on stage j ends before it begins on j + 1, its backward on j + 1
    ends before it begins on j, and DDP's all-reduce runs inside the last backward, over the bytes of
    the stage's gradients that the simulator charges (compute.stage_param_bytes)."""
    args = ARGS[:-4] + ["--iters", "1", "--warmup", "1", "--system", system, *layout, "--results", str(tmp_path),
                        "--debug", "trace=1"]
    assert main(args) == 0
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("harness: iteration")]
    assert [ln.split(":")[1] for ln in lines] == [" iteration 1/2 (warm-up)", " iteration 2/2"]
    assert all(ln.endswith(" s on rank 0") for ln in lines), lines  # (once under load in make test, 2026-12-06)
    assert not [w for w in BASELINE_WARNINGS if w in err], err

    from harness.compute import stage_param_bytes
    from harness.compute.model import get_model

    ops: dict[tuple, tuple[float, float]] = {}
    reduced: dict[tuple, int] = {}
    for ln in err.splitlines():
        if ln.startswith("[trace] rank") and " it 1 " in ln:
            f = ln.split()
            stage, replica, op, k, begin, end = int(f[4]), int(f[6]), f[9], int(f[10]), float(f[11]), float(f[12])
            assert (stage, replica, op, k) not in ops, ln
            ops[stage, replica, op, k] = (begin, end)
            if op == "AR":
                reduced[stage, replica] = reduced.get((stage, replica), 0) + int(f[13])
    pp, dp, micro = 4, 2, 4
    assert {key[3] for key in ops if key[2] in "FB"} == set(range(micro))
    split = [1, 1, 1, 1]
    want = [int(b) for b in stage_param_bytes(get_model("tiny", 4), split, 4)]
    assert reduced == {(j, r): want[j] for j in range(pp) for r in range(dp)}
    for r in range(dp):
        for k in range(micro):
            for j in range(pp - 1):
                assert ops[j, r, "F", k][1] <= ops[j + 1, r, "F", k][0]
                assert ops[j + 1, r, "B", k][1] <= ops[j, r, "B", k][0]
        for j in range(pp):
            last = ops[j, r, "B", micro - 1]
            for (js, rs, op, _), (begin, end) in ops.items():
                if (js, rs, op) == (j, r, "AR"):
                    assert last[0] <= begin and end <= last[1]


def test_the_ddp_note_filter_keeps_everything_else_on_stderr(capfd):
    """Only the first forward runs with fd 2 captured; other lines of that window reach stderr."""
    import os

    import torch

    from harness.systems.baselines.parallelize import _drop_unused_parameter_note

    class Noisy(torch.nn.Module):
        def forward(self, x):
            os.write(2, b"[W reducer.cpp] Warning: find_unused_parameters=True was specified in DDP constructor, "
                        b"but did not find any unused parameters in the forward pass.\nreal warning\n")
            return x

    m = Noisy()
    _drop_unused_parameter_note(m)
    m(torch.zeros(1))
    assert capfd.readouterr().err == "real warning\n"
    m(torch.zeros(1))  # hooks are gone after the first forward
    assert "find_unused_parameters" in capfd.readouterr().err


def test_killed_rank_fails_the_run_in_bounded_time(tmp_path, capsys):
    t0 = time.monotonic()
    rc = main(ARGS[:-4] + ["--iters", "100000", "--warmup", "0", "--results", str(tmp_path), "--timeout", "120",
                           "--debug", "fault_rank=3", "--debug", "fault_after_s=2.5"])
    assert time.monotonic() - t0 < 40
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"rank 3 \(stage \d of pipeline \d\) was killed by signal SIGKILL", err)
    assert "Traceback" not in err.splitlines()[-1]
    d = only_run(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "failed" and re.match(r"rank 3 \(.*\) was killed", m["reason"])
    assert not (d / "records.csv").exists()


def test_crashing_rank_fails_the_run(tmp_path, capsys):
    rc = main(ARGS[:-4] + ["--iters", "100000", "--warmup", "0", "--results", str(tmp_path), "--timeout", "120",
                           "--debug", "fault_rank=0", "--debug", "fault_after_s=2.5", "--debug", "fault_mode=exit"])
    assert rc == 2 and re.search(r"rank 0 \(.*\) exited with status 17", capsys.readouterr().err)
    assert json.loads((only_run(tmp_path) / "manifest.json").read_text())["status"] == "failed"


def test_bad_degrees_are_one_line_user_errors(tmp_path, capsys):
    assert main(ARGS + ["--d-pp", "3", "--d-dp", "3", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "harness: error: --d-pp/--d-dp: 3 x 3 != 8 devices"
    # torch's pipelining (the baselines) needs a micro-batch per stage at least: refused before any rank starts
    assert main(ARGS[:-6] + ["--batch", "8", "--micro-batch", "4", "--system", "megatron", "--tp", "1", "--pp", "4",
                             "--dp", "2", "--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("harness: error: --pp: 4 stages need at least 4 micro-batches per "
                                               "replica (torch's pipelining); batch 8 over 2 replicas in "
                                               "micro-batches of 4 gives 1")
    assert not list(tmp_path.iterdir())


def test_a_run_without_a_scenario_is_a_one_line_user_error(tmp_path, cli):
    """`--scenario` is optional only because --inventory can give it: without either, one line, nothing written."""
    rc, _, err = cli("run", "--system", "ours", "--network", "none", "--devices", "4", "--iters", "1",
                     "--results", tmp_path / "r")
    assert rc == 2 and err.strip() == ("harness: error: --scenario: required (a case number, name or scenario file), "
                                       "unless --inventory gives it")
    assert not (tmp_path / "r").exists()


def test_real_nodes_path_under_torchrun(tmp_path):
    """`harness run --inventory` as torchrun starts it on real nodes (here: one node, loopback)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    inv = tmp_path / "cluster.yaml"
    inv.write_text("scenario: 3\ndevices: 2\nbandwidth_scale: 0.25\n"
                   "nodes:\n  - {name: local, nic: lo, host: 127.0.0.1, devices: [0, 1]}\n")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    port, store_port = ports
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HARNESS_RESULTS": str(tmp_path), "HARNESS_NODE": "local",
           "HARNESS_STORE_PORT": str(store_port)}
    r = subprocess.run([str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(port), "-m", "harness", "run", "--inventory", str(inv),
                        "--network", "none", "--model", "tiny", "--layers", "2", "--batch", "4",
                        "--iters", "2"], env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-2000:]
    d = [p for p in tmp_path.glob("3-multi-dc/*") if p.is_dir()]
    assert len(d) == 1 and r.stdout.strip() == str(d[0])
    recs = read_records(d[0] / "records.csv")
    assert [(x["backend"], x["kernel"], x["d_pp"], x["iteration"]) for x in recs] == [("cluster", "host", 2, 1), ("cluster", "host", 2, 2)]
    # scenario, devices and bandwidth scale: the inventory's, in the records and the manifest
    assert {(x["scenario"], x["devices"], x["bandwidth_scale"]) for x in recs} == {("3-multi-dc", 2, 0.25)}
    man = json.loads((d[0] / "manifest.json").read_text())
    net = man["spec"]["network"]
    assert (man["status"], net["mode"], net["bandwidth_scale"], net["devices"]) == ("ok", "none", 0.25, 2)
    assert man["inventory"]["bandwidth_scale"] == 0.25 and man["cpus_allowed"] >= 1


@pytest.mark.parametrize("args, needle", [
    (["--scenario", "4"], "--scenario 4: the inventory {inv} plays scenario 3-multi-dc, not 4-regional "
                          "(leave --scenario out: on real nodes the inventory says it)"),
    (["--devices", "4"], "--devices 4: the inventory {inv} has 2 devices"),
    (["--bandwidth-scale", "1"], "--bandwidth-scale 1: the inventory {inv} shapes at 0.01"),
    (["--network", "emulated"], "--network emulated: not on real nodes (shaped, by `harness net apply`, or none)"),
    ([], "--network shaped: device 1's process is not in its namespace harness-"),
])
def test_run_arguments_that_disagree_with_the_inventory_fail_in_one_line(tmp_path, cli, monkeypatch, args, needle):
    for k, v in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1"),
                 ("LOCAL_RANK", "1"), ("HARNESS_NODE", "local")):
        monkeypatch.setenv(k, v)
    inv = tmp_path / "cluster.yaml"
    inv.write_text("scenario: 3\ndevices: 2\nbandwidth_scale: 0.01\nnodes:\n  - {name: local, nic: lo, devices: [0, 1]}\n")
    rc, out, err = cli("run", "--inventory", inv, *args, "--results", tmp_path)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert needle.format(inv=inv) in err
    assert not list(tmp_path.glob("*/*/manifest.json"))  # refused before any run directory


def test_inventory_outside_torchrun_is_a_user_error(tmp_path, capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    inv = tmp_path / "cluster.yaml"
    inv.write_text("scenario: 3\ndevices: 2\nnodes:\n  - {name: local, nic: lo, devices: [0, 1]}\n")
    assert main(["run", "--inventory", str(inv)]) == 2
    assert "run under torchrun" in capsys.readouterr().err


def test_a_scenario_given_as_a_path_reloads_from_the_records(tmp_path, cli, monkeypatch):
    scenario = "tests/data/net-4dev.yaml"  # relative to the checkout, where the run starts
    rc, out, err = cli("run", "--scenario", scenario, "--network", "none", "--model", "tiny", "--layers", "2",
                       "--batch", "4", "--iters", "2", "--d-pp", "2", "--scheduler", "identity", "--results", tmp_path)
    assert rc == 0, err
    run = next(tmp_path.glob("net-4dev/*"))
    spec = json.loads((run / "manifest.json").read_text())["spec"]
    assert spec["network"]["scenario"] == scenario  # as asked
    assert spec["resolved"]["scenario"] == "net-4dev"  # the records' name
    source = spec["resolved"]["scenario_source"]
    assert source.endswith("/tests/data/net-4dev.yaml") and source.startswith("/")
    monkeypatch.chdir(tmp_path)  # elsewhere, later: the records still find their scenario
    rc, out, err = cli("sim", "compare", run)
    assert rc == 0, err
    row = out.splitlines()[1].split()
    assert row[:4] == ["net-4dev", "ours", "local", "4"] and float(row[9]) > 0  # simulated seconds


BLOCKED_RANK = """
import sys
from datetime import timedelta

import torch.distributed as dist

from harness.plan.request import ModelSection, NetworkSection, RunRequest, RunSection
from harness.train.experiment import record_run
from harness.plan.layouts import plan_run

req = RunRequest(network=NetworkSection(scenario="3", devices=2, mode="none"),
                 model=ModelSection(name="tiny", layers=2, batch=4), run=RunSection(results_root=sys.argv[1]))


def launch(spec, topo, out):  # rank 0 waiting on a peer that never comes: blocked in C++, not in Python
    (out / "blocking").touch()
    dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=300)).get("never")


record_run(plan_run(req), launch)
"""


def test_sigterm_fails_the_manifest_while_the_rank_is_blocked_in_cxx(tmp_path):
    """Slurm and torchrun SIGKILL a rank that does not stop within their grace time: the failed
    manifest must be written at SIGTERM, not when the blocked call returns."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED_RANK)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stderr=subprocess.PIPE, text=True)

    def status():
        found = list(tmp_path.glob("3-multi-dc/*/manifest.json"))
        return json.loads(found[0].read_text()) if found else None

    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("3-multi-dc/*/blocking")):  # about to block
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
            time.sleep(0.1)
        assert status()["status"] == "running"
        p.send_signal(signal.SIGTERM)
        while status()["status"] == "running":
            assert time.monotonic() < deadline, "the manifest stayed running after SIGTERM"
            time.sleep(0.1)
        assert (status()["status"], status()["reason"]) == ("failed", "terminated by SIGTERM")
    finally:
        p.kill()
        p.wait()
        p.stderr.close()


def test_each_runs_in_turn_on_the_shared_flags(tmp_path, capsys):
    """`--each`: the flags outside are every run's, each adds its own; one directory per run, in order."""
    assert main(ARGS[:-4] + ["--iters", "1", "--warmup", "0", "--results", str(tmp_path), "--seed", "7",
                              "--each", "--system ours", "--each", "--system ours-random --iters 2",
                              "--each", "--system ours-random --seed 2022"]) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == 3 and len(set(out)) == 3  # distinct run ids, though planned in one second
    mans = [json.loads((tmp_path / "5-worldwide" / p.rsplit("/", 1)[1] / "manifest.json").read_text()) for p in out]
    got = [(m["spec"]["run"]["system"], m["spec"]["model"]["seed"], m["spec"]["run"]["iters"]) for m in mans]
    assert got == [("ours", 7, 1), ("ours-random", 7, 2), ("ours-random", 2022, 1)]
    assert mans[1]["placement"]["pipelines"] != mans[2]["placement"]["pipelines"]  # the seed places the devices


@pytest.mark.parametrize("each,message", [
    ("--system ours --devices 4", "--devices is shared by every run of one command"),
    ("--system ours --bandwidth-scale 2", "--bandwidth-scale is shared by every run of one command"),
    ("--system ours --iters x", "argument --iters: must be a positive integer"),
    ("--system ours --pp 2", "--pp: not an option of --system ours"),
    ("--system 'ours", "No closing quotation"),
])
def test_each_mistake_is_one_line_and_nothing_runs(tmp_path, capsys, each, message):
    rc = main(ARGS + ["--results", str(tmp_path), "--each", "--system ours-random", "--each", each])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
