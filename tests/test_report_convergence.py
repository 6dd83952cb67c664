"""`harness report convergence DIR`: loss against wall time of the runs below DIR, their floor, and when each
reached floor x (1 + margin)."""
from __future__ import annotations

from dataclasses import replace

from harness.files import atomic_write_json
from harness.results import IterationRecord, write_records

BASE = IterationRecord(
    run_id="r", scenario="hetpipe-testbed", system="horovod", backend="emu", kernel="uml", devices=8, d_pp=1,
    d_dp=8, model="micro", layers=8, hidden=64, seq=64, batch=32, micro_batch=4, seed=0, bandwidth_scale=1.0,
    iteration=0, seconds=1.0, pflop=1e-5, pflops=1e-5, tokens_per_s=1.0, compute_seconds=0.5,
    exposed_comm_seconds=0.5, loss=7.0)


def run(root, name, seconds, losses, floor=2.0, status="ok", wsp=None, **kw):
    d = root / name
    write_records(d / "records.csv", [replace(BASE, run_id=name, iteration=i, seconds=s, loss=l, **kw)
                                      for i, (s, l) in enumerate(zip(seconds, losses))])
    layout = {"wsp": wsp} if wsp else {}
    atomic_write_json(d / "manifest.json", {"status": status, "data": {"set": "markov", "loss_floor": floor},
                                            "spec": {"layout": layout}})


def test_time_to_the_target_and_the_plot(tmp_path, cli):
    run(tmp_path, "h", [2.0, 2.0, 2.0], [4.0, 2.3, 2.1])  # reaches 2.2 (floor 2 + 10 %) at its 3rd iteration
    run(tmp_path, "p0", [1.0, 1.0, 1.0], [4.0, 3.0, 2.5], system="hetpipe",
        wsp={"staleness": 0, "in_flight": 4})  # never
    run(tmp_path, "p4", [1.0, 1.0], [3.0, 2.15], system="hetpipe", wsp={"staleness": 4, "in_flight": 4})
    run(tmp_path, "bad", [1.0], [1.0], status="failed")  # left out
    rc, out, err = cli("report", "convergence", tmp_path, "--out", tmp_path / "o")
    assert rc == 0, err
    lines = {ln.split()[0] + (" " + ln.split()[1] if ln.startswith("hetpipe") else ""): ln
             for ln in out.splitlines()[1:4]}
    assert lines["horovod"].endswith("6.0 s (96 samples)")
    assert lines["hetpipe D=0"].endswith("not reached") and "2.500" in lines["hetpipe D=0"]
    assert lines["hetpipe D=4"].endswith("2.0 s (64 samples)")
    assert (tmp_path / "o" / "convergence.png").stat().st_size > 0
    csv = (tmp_path / "o" / "convergence.csv").read_text().splitlines()
    assert csv[0] == "run,system,label,iteration_end_s,samples,loss,floor" and len(csv) == 1 + 3 + 3 + 2


def test_no_run_with_a_floor_is_one_line(tmp_path, cli):
    (tmp_path / "empty").mkdir()
    rc, out, err = cli("report", "convergence", tmp_path / "empty")
    assert rc == 2 and err.strip().count("\n") == 0 and "no successful run with a loss floor" in err
