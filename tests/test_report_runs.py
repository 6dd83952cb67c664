import json
from dataclasses import replace

import pandas as pd
import pytest

from harness.files import atomic_write_json
from harness.results import IterationRecord, write_records

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
    assert table.layout[2] == "tp=1,pp=4,dp=2,placement=seeded"  # a permuted layout is its own row
    ours = table.iloc[1]
    assert ours.runs == 2 and ours.seconds == pytest.approx((3.0 + 6.0) / 2)  # failed run c left out
    assert ours.seconds_min == pytest.approx(3.0) and ours.seconds_max == pytest.approx(6.0)
    assert "megatron" in out


def test_runs_left_out_are_listed_with_their_state_and_a_running_one_whose_harness_is_gone_is_killed(tmp_path, cli):
    import os
    import platform
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that ran and is gone
    run(tmp_path, "a", "ok", [2.0])
    run(tmp_path, "b", "failed", [1.0])
    atomic_write_json(tmp_path / "b/manifest.json", {"status": "failed", "reason": "rank 2 failed: boom"})
    for name, pid in (("c", gone.pid), ("d", os.getpid())):
        atomic_write_json(tmp_path / name / "manifest.json", {"status": "running", "host": platform.node(), "pid": pid})
    rc, out, _ = cli("report", "runs", tmp_path)
    assert rc == 0
    left = [ln for ln in out.splitlines() if ln.startswith("left out: ")]
    assert left == [f"left out: {tmp_path / 'b'}: failed (rank 2 failed: boom)", f"left out: {tmp_path / 'c'}: killed",
                    f"left out: {tmp_path / 'd'}: running"]


def test_runs_table_needs_successful_runs(tmp_path, cli):
    run(tmp_path, "c", "failed", [1.0])
    rc, _, err = cli("report", "runs", tmp_path)
    assert rc == 2 and "no records.csv of a successful run" in err
    rc, _, err = cli("report", "runs", tmp_path / "missing")
    assert rc == 2 and "no such directory" in err


MEGATRON = json.dumps({"dp": 2, "pp": 4, "schedule": "1f1b", "tp": 1}, sort_keys=True)
MEGATRON_RANKS = json.dumps({"dp": 2, "pp": 4, "rank_order": [1, 0, 2, 3, 4, 5, 6, 7], "schedule": "1f1b", "tp": 1},
                            sort_keys=True)


def fake_runs(root):
    """ours x2 (PFLOPS 1e-5/2 and 1e-5/4), two megatron layouts, a failed run, a failed run without records."""
    run(root, "a", "ok", [2.0, 2.0])
    run(root, "b", "ok", [4.0, 4.0])
    run(root, "c", "failed", [100.0])
    run(root, "m", "ok", [1.0, 1.5], system="megatron", config=MEGATRON)
    run(root, "r", "ok", [5.0], system="megatron", config=MEGATRON_RANKS)
    atomic_write_json(root / "dead" / "manifest.json", {"status": "failed", "reason": "boom"})


def sim_csv(path, with_config=True):
    """`sim compare --csv` rows: ours predicted 2.5 s, megatron 0.5 s, megatron with the rank order 10 s."""
    rows = [("ours", "", 2.5), ("megatron", MEGATRON, 0.5), ("megatron", MEGATRON_RANKS, 10.0)]
    df = pd.DataFrame([dict(scenario="5-worldwide", system=s, backend="emu", devices=8, config=c, measured_s=1.0,
                            simulated_s=t) for s, c, t in rows])
    df.drop(columns=[] if with_config else ["config"]).to_csv(path, index=False)
    return path


def _row(table, label):
    return table.set_index("label").loc[label]


def test_pflops_rows_come_from_the_records_without_sim(tmp_path):
    from harness.report.runs import runs_table

    fake_runs(tmp_path)
    table = runs_table(tmp_path)
    assert list(table.label) == ["megatron tp1 pp4 dp2", "ours tp1 pp4 dp2", "megatron tp1 pp4 dp2 seeded"]
    ours = _row(table, "ours tp1 pp4 dp2")
    assert ours.runs == 2  # the failed runs are left out
    assert ours.pflops == pytest.approx((1e-5 / 2 + 1e-5 / 4) / 2)
    assert ours.pflops_min == pytest.approx(1e-5 / 4) and ours.pflops_max == pytest.approx(1e-5 / 2)
    assert "sim_pflops" not in table


def test_simulated_pflops_matched_by_system_and_config(tmp_path):
    from harness.report.runs import runs_table

    fake_runs(tmp_path / "emu")
    table = runs_table(tmp_path / "emu", sim_csv(tmp_path / "sim-vs-emu.csv"))
    assert _row(table, "ours tp1 pp4 dp2").sim_pflops == pytest.approx(1e-5 / 2.5)  # record pflop / simulated s
    assert _row(table, "megatron tp1 pp4 dp2").sim_pflops == pytest.approx(1e-5 / 0.5)
    assert _row(table, "megatron tp1 pp4 dp2 seeded").sim_pflops == pytest.approx(1e-5 / 10.0)


def test_sim_csv_without_config_matches_only_unambiguous_systems(tmp_path):
    from harness.report.runs import runs_table

    fake_runs(tmp_path / "emu")
    table = runs_table(tmp_path / "emu", sim_csv(tmp_path / "sim.csv", with_config=False))
    assert _row(table, "ours tp1 pp4 dp2").sim_pflops == pytest.approx(1e-5 / 2.5)
    assert table[table.system == "megatron"].sim_pflops.isna().all()  # two megatron layouts: no guess


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("with_sim", [False, True])
def test_report_runs_writes_both_plots(tmp_path, cli, with_sim):
    fake_runs(tmp_path / "emu")
    if with_sim:
        sim_csv(tmp_path / "sim-vs-emu.csv")  # found beside DIR without an option
    rc, out, err = cli("report", "runs", tmp_path / "emu")
    assert rc == 0, err
    for name in ("runs.csv", "pflops.png", "iterations.png"):
        assert f"wrote {tmp_path / 'emu' / name}" in out
    assert _is_png(tmp_path / "emu" / "pflops.png") and _is_png(tmp_path / "emu" / "iterations.png")
    assert ("sim_pflops" in pd.read_csv(tmp_path / "emu" / "runs.csv")) == with_sim
    assert not list((tmp_path / "emu").glob(".*"))  # no temporary files left


def test_report_runs_sim_csv_option(tmp_path, cli):
    fake_runs(tmp_path / "emu")
    rc, _, err = cli("report", "runs", tmp_path / "emu", "--sim-csv", tmp_path / "missing.csv")
    assert rc == 2 and "no such file" in err
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    rc, _, err = cli("report", "runs", tmp_path / "emu", "--sim-csv", tmp_path / "bad.csv")
    assert rc == 2 and "not a `sim compare --csv` file" in err
    rc, _, _ = cli("report", "runs", tmp_path / "emu", "--sim-csv", sim_csv(tmp_path / "x.csv"), "--out", tmp_path / "o")
    assert rc == 0 and (tmp_path / "o" / "pflops.png").exists()


def test_colliding_labels_get_the_layout(tmp_path):
    from harness.report.runs import runs_table

    run(tmp_path, "a", "ok", [1.0], config=json.dumps({"d_pp": 4, "d_dp": 2, "schedule": "gpipe"}))
    run(tmp_path, "b", "ok", [2.0], config=json.dumps({"d_pp": 4, "d_dp": 2, "schedule": "1f1b"}))
    labels = list(runs_table(tmp_path).label)
    assert labels == ["ours pp4 dp2 d_pp=4,d_dp=2,schedule=gpipe emu/uml", "ours pp4 dp2 d_pp=4,d_dp=2,schedule=1f1b emu/uml"]


def test_layouts_of_the_layout_module_group_seeds_and_keep_rank_order_apart(tmp_path):
    from harness import layout as layouts
    from harness.report.runs import runs_table

    for k, seed in enumerate((2022, 2023)):
        lay = layouts.seeded(1, 4, 2, 4, seed, schedule="gpipe", dp_sync="sharded-ps")
        run(tmp_path, f"r{k}", "ok", [2.0 + k], system="ours-random", config=json.dumps(lay.to_json()))
    run(tmp_path, "m0", "ok", [5.0], system="megatron", config=json.dumps(layouts.in_rank_order(1, 4, 2, 4).to_json()))
    run(tmp_path, "m1", "ok", [6.0], system="megatron", config=json.dumps(layouts.seeded(1, 4, 2, 4, 2022).to_json()))
    table = runs_table(tmp_path)
    assert sorted(table.label) == ["megatron tp1 pp4 dp2", "megatron tp1 pp4 dp2 seeded (seeds 2022)",
                                   "ours-random tp1 pp4 dp2 seeded (seeds 2022, 2023)"]  # which seeds, not just "seeded"
    seeded = table[table.system == "ours-random"].iloc[0]
    assert seeded.runs == 2 and seeded.seconds_min == pytest.approx(2.0) and seeded.seconds_max == pytest.approx(3.0)


@pytest.mark.parametrize("pflops,unit,scaled", [(3e-7, "MFLOPS", 300.0), (0.5, "TFLOPS", 500.0),
                                                (2000.0, "PFLOPS", 2000.0), (1.0, "PFLOPS", 1.0),
                                                (1e-16, "kFLOPS", 1e-4)])
def test_flop_rate_unit_reads_between_1_and_1000(pflops, unit, scaled):
    from harness.plots import flop_rate_unit

    got, factor = flop_rate_unit([pflops / 10, pflops, float("nan")])  # the largest finite value decides
    assert got == unit and pflops * factor == pytest.approx(scaled)


def test_pflops_figure_is_in_the_unit_that_fits_and_the_csv_stays_in_pflops(tmp_path, cli):
    import matplotlib.pyplot as plt

    from harness.report.runs import pflops_figure, runs_table

    fake_runs(tmp_path / "emu")  # 2.5e-6 .. 1e-5 PFLOPS: GFLOPS
    table = runs_table(tmp_path / "emu")
    fig = pflops_figure(table)
    try:
        ax = fig.axes[0]
        assert ax.get_ylabel() == "GFLOPS" and ax.get_title().startswith("GFLOPS ")
        heights = sorted(p.get_height() for p in ax.patches)
        assert heights == pytest.approx(sorted(table.pflops * 1e6))
        assert 1 <= max(heights) < 1000 and ax.yaxis.get_offset_text().get_text() == ""
    finally:
        plt.close(fig)
    assert cli("report", "runs", tmp_path / "emu")[0] == 0
    assert sorted(pd.read_csv(tmp_path / "emu" / "runs.csv").pflops) == pytest.approx(sorted(table.pflops))


def test_a_run_whose_devices_changed_stays_one_row_and_gets_devices_png(tmp_path, cli):
    planned = json.dumps({"tp": 1, "pp": 4, "dp": 2})
    d = tmp_path / "elastic"
    recs = [replace(BASE, run_id="elastic", iteration=i, seconds=s, pflops=1e-5 / s, devices=n, d_pp=pp,
                    config=json.dumps({"tp": 1, "pp": pp, "dp": 2}))
            for i, (s, n, pp) in enumerate([(1.0, 8, 4), (9.0, 6, 3), (1.0, 6, 3), (5.0, 8, 4)])]
    write_records(d / "records.csv", recs)
    atomic_write_json(d / "manifest.json", {"status": "ok"})
    run(tmp_path, "steady", "ok", [2.0], config=planned)
    rc, out, err = cli("report", "runs", tmp_path)
    assert rc == 0, err
    table = pd.read_csv(tmp_path / "runs.csv")
    # one row for both: the elastic run under the layout it was planned with, its mean over every iteration
    assert len(table) == 1 and table.runs[0] == 2 and table.layout[0] == "tp=1,pp=4,dp=2"
    assert table.seconds_max[0] == pytest.approx(4.0)
    assert f"wrote {tmp_path / 'devices.png'}" in out and _is_png(tmp_path / "devices.png")
    run(tmp_path / "only-steady", "s", "ok", [2.0])
    rc, out, err = cli("report", "runs", tmp_path / "only-steady")
    assert rc == 0 and "devices.png" not in out and not (tmp_path / "only-steady" / "devices.png").exists()


def test_a_host_bound_run_is_marked_in_the_table_and_the_summary(tmp_path, cli):
    """What each row measured: the network (headroom measured, no iteration host-bound), the host, or unknown."""
    run(tmp_path, "net", "ok", [2.0, 2.0], cpu_busy=0.2)
    run(tmp_path, "host", "ok", [3.0, 3.0], system="megatron", cpu_busy=0.9, host_bound=True)
    run(tmp_path, "old", "ok", [1.0], system="deepspeed")  # written before the headroom was measured
    rc, out, _ = cli("report", "runs", tmp_path)
    assert rc == 0 and "measured host" in out
    table = pd.read_csv(tmp_path / "runs.csv").set_index("system")
    assert table.measured.to_dict() == {"ours": "network", "megatron": "host", "deepspeed": "unknown"}
    assert table.host_bound["megatron"] == 2 and table.label["megatron"].endswith("[host-bound]")
    from harness.report.runs import run_summary

    advice = "host-bound: the emulated cluster's CPU was busy ... (the manifest's line)"
    atomic_write_json(tmp_path / "host/manifest.json", {"status": "ok", "headroom": {
        "measured": True, "busy": 0.9, "steal": 0.0, "host_bound": True, "host_bound_iterations": 2, "iterations": 2,
        "advice": advice}})
    summary = run_summary(tmp_path / "host")
    assert "emulated CPU 90% busy" in summary and "HOST-BOUND, 2/2 iterations host-bound" in summary
    assert summary.endswith("\n" + advice)
    assert "HOST-BOUND" not in run_summary(tmp_path / "net") and "busy" not in run_summary(tmp_path / "net")


def test_the_paper_claims_sit_beside_the_measured_ratios_with_a_verdict():
    from harness.report.case import paper_ratios

    runs = pd.DataFrame({"system": ["ours", "megatron", "deepspeed", "ours-random", "ours-random"],
                         "seconds": [1.0, 4.5, 0.9, 1.5, 2.0], "host_bound": [0, 0, 0, 0, 1], "runs": [1] * 5})
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in paper_ratios(runs) if ln.startswith("| ") and "x |" in ln}
    assert rows["ours vs Megatron (case 5)"].endswith("| 4.8x | 4.50x | reproduced |")
    assert rows["ours vs DeepSpeed (case 5)"].endswith("| 3.6x | 0.90x | not reproduced: not faster |")
    # the slowest random placement over ours; one of those runs measured the host, which the verdict says
    assert rows["scheduler vs random placement (up to)"].endswith(
        "| 2.7x | 2.00x | same direction, smaller than the paper's (host-bound runs: measured the host) |")
    alone = paper_ratios(runs[runs.system == "ours"])
    assert any("| ours vs Megatron (case 5) | 4.8x | - | no megatron run |" in ln for ln in alone)
