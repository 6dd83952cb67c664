"""`make scenario-N` end to end once, at the smallest scale that still takes every step of it (QUICK on the cheapest
case, fewer scheduler candidates, two of its emulated systems in the shared boot), and `harness report case` on bad
input."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from harness.network import kernel
from harness.report.case import REQUIRED
from harness.results import read_records

ROOT = Path(__file__).resolve().parent.parent
#: ours alone: the steps after the runs (the time dilation's probe, compare, report) are the same for one or four
#: systems; the baselines, ours-random and Megatron are emulated in tests/test_train_emulated.py and
#: tests/test_preemption_emulated.py, and the Makefile's systems are checked against the registry by
#: test_the_makefile_runs_every_system_it_names below
SYSTEMS = {"ours"}
EACH = "EACH=--each '--system ours'"
pytestmark = pytest.mark.machine  # the network registry, namespaces, the emulated cluster


def _no_emulation() -> str:
    try:
        kernel.choose("auto")
        return ""
    except kernel.KernelError as e:
        return str(e)


@pytest.mark.skipif(bool(_no_emulation()), reason=f"no kernel to emulate links with: {_no_emulation()}")
def test_quick_case_1_writes_consistent_outputs(tmp_path):
    out = tmp_path / "case1"
    # fewer scheduler candidates than QUICK's 2000, two systems of its four: the outputs and their consistency
    # are the same
    proc = subprocess.run(["make", "-C", str(ROOT), "scenario-1", "QUICK=1", "SEARCH=--budget 300", EACH,
                           f"SCENARIO_OUT={out}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rel in REQUIRED + ("report.md", "scenario/delay.png", "scenario-8/summary.txt", "compare/compare.png",
                           "emu/pflops.png", "emu/iterations.png"):
        assert (out / rel).is_file(), rel
    assert "8 devices in 2 regions" in (out / "scenario-8/summary.txt").read_text()  # 2 nodes x 4

    runs, boots = {}, []
    for manifest in (out / "emu").rglob("manifest.json"):
        m = json.loads(manifest.read_text())
        assert m["status"] == "ok", m
        assert m["spec"]["run"]["iters"] == 1 and m["spec"]["run"]["warmup"] == 1  # QUICK's iterations
        runs[m["run_id"]] = (m["spec"]["run"]["system"], read_records(manifest.parent / "records.csv"))
        boots.append(m["cluster_boot"]["runs"])
        # each run paced to its devices' modelled times, dilated as the probe chose, its CPU headroom measured
        assert m["spec"]["compute"]["model"] and m["dilation"]["factor"] == m["spec"]["compute"]["time_scale"]
        assert m["spec"]["network"]["bandwidth_scale"] == pytest.approx(0.01 / m["dilation"]["factor"])
        assert m["headroom"]["measured"] and len(m["headroom"]["per_iteration"]) == 1
    assert sorted(s for s, _ in runs.values()) == sorted(SYSTEMS)  # one run each: QUICK's repetitions
    assert all(sorted(b) == sorted(runs) for b in boots)  # every run of the case in one boot

    # The plot's data (runs.csv) is the records': per system the mean over its runs of each run's mean.
    table = pd.read_csv(out / "emu/runs.csv")
    assert set(table.system) == SYSTEMS
    for row in table.itertuples():
        recs = [r for s, rr in runs.values() if s == row.system for r in rr]
        assert row.pflops == pytest.approx(sum(r["pflops"] for r in recs) / len(recs), rel=1e-9)
        assert row.seconds == pytest.approx(sum(r["seconds"] for r in recs) / len(recs), rel=1e-9)
    # The simulator's prediction per run is next to the same measurement.
    sim = pd.read_csv(out / "sim-vs-emu.csv")
    assert len(sim) == len(runs)
    measured = sorted(sum(r["seconds"] for r in rr) / len(rr) for _, rr in runs.values())
    assert sorted(sim.measured_s) == pytest.approx(measured, rel=1e-4)

    report = (out / "report.md").read_text()
    assert report.startswith("# 1-datacenter: ")
    for row in table.itertuples():  # every measured row, with its figures as in runs.csv
        assert f"| {row.label} | {row.runs} | {row.seconds:.3f} | {row.pflops * 1e6:.3g} (" in report
    assert "**measured**" in report and "simulated" in report
    assert "nothing fitted on the runs it is compared with" in report and not (out / "emu-profile.json").exists()
    assert "## Against the paper's claims" in report and "| ours vs DeepSpeed (case 5) | 3.6x | - | no deepspeed run |" \
        in report
    assert {"cpu_busy", "measured"} <= set(sim.columns)
    ga = json.loads((out / "schedule-ga.json").read_text())  # the schedule's lower bound and gap (issue 57)
    assert f"no layout costs less than {ga['bound']['total']:.3f} s" in report and f"{ga['gap']:.1%}" in report
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert f"`{head}`" in report


def test_report_case_names_the_missing_output(cli, tmp_path):
    (tmp_path / "scenario").mkdir()
    (tmp_path / "scenario/summary.txt").write_text("scenario 1-datacenter: x\n")
    rc, out, err = cli("report", "case", str(tmp_path))
    assert rc != 0 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path}: schedule-ga.json: missing" in err
    assert not (tmp_path / "report.md").exists()


def test_the_makefile_runs_every_system_it_names():
    """What the end-to-end test above leaves out: the Makefile's emulated runs (every system, QUICK or not) as
    `make -n` prints them, each a system of the registry, all in one `harness run --each`."""
    import harness.systems  # noqa: F401  (registers them)
    from harness.plan.systems import names

    for quick, want in ((["QUICK=1"], ["ours", "ours-random", "megatron", "deepspeed"]),
                        ([], ["ours", "ours-random", "ours-random", "ours-random", "megatron", "megatron", "deepspeed"])):
        proc = subprocess.run(["make", "-n", "-C", str(ROOT), "scenario-1", *quick, "SCENARIO_OUT=/nonexistent"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        (line,) = [ln for ln in proc.stdout.splitlines() if " run --scenario 1 " in ln]
        systems = [each.split("'")[0].split()[1] for each in line.split("--each '")[1:]]
        assert systems == want and set(systems) <= set(names()), line
