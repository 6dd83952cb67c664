"""A device preempted at each point of an iteration (forward, backward, the data-parallel sync, the checkpoint
write), on loopback under the elastic agent: the debug section's preempt fault kills the device's rank where it
says (rank.arm_fault), the agent goes on without it. ours recovers from its survivors' memory, losing only the
iteration in flight; where no survivor holds a stage it goes on from the last complete checkpoint, as the
baselines do (a checkpoint the preempted rank did not finish is not one). In every case the losses after the
recovery are the single-process run's: the run went on from the same weights and momentum."""
from __future__ import annotations

import csv
import json
import multiprocessing
import os

import pytest

from harness.cli import main
from harness.compute.model import get_model
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(240)

BATCH, MICRO, WARMUP, ITERS, SEED, LR = 8, 2, 1, 4, 0, 0.1
ARGS = ["run", "--scenario", "2", "--devices", "4", "--network", "none", "--model", "tiny", "--layers", "4",
        "--batch", str(BATCH), "--micro-batch", str(MICRO), "--data", "markov", "--iters", str(ITERS),
        "--warmup", str(WARMUP), "--keepalive", "0.3", "--last-call", "0.5", "--checkpoint-every", "2"]
AT = 3  # the iteration (0-based, warm-up included) the device is preempted in; checkpoints after 2 and 4


def _preempted_run(tmp_path, system_args: list[str], phase: str, device: int = 1) -> tuple[dict, list[dict]]:
    rc = main(ARGS + system_args + ["--results", str(tmp_path), "--debug", "fault_mode=preempt",
                                    "--debug", f"fault_rank={device}", "--debug", f"fault_iteration={AT}",
                                    "--debug", f"fault_phase={phase}"])
    assert rc == 0
    # nothing left running, and the devices' memory is gone with the run
    assert multiprocessing.active_children() == []
    (run,) = [p for p in (tmp_path / "2-spot").iterdir() if p.is_dir()]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert not os.path.exists(manifest["elastic"].get("memory") or "/nonexistent")
    rows = list(csv.DictReader((run / "records.csv").open()))
    # every timed iteration once, and its loss the single-process run's
    ref, _ = reference_train(get_model("tiny", 4), BATCH, MICRO, WARMUP + ITERS, SEED, LR, "markov")
    assert [int(r["iteration"]) for r in rows] == list(range(WARMUP, WARMUP + ITERS))
    assert [float(r["loss"]) for r in rows] == pytest.approx(ref[WARMUP:], rel=1e-5)
    return manifest["elastic"], rows


@pytest.mark.parametrize("phase", ["forward", "backward", "dp_sync", "checkpoint"])
def test_ours_goes_on_from_memory_after_a_preemption_at_each_point_of_an_iteration(tmp_path, phase):
    elastic, rows = _preempted_run(tmp_path, ["--system", "ours", "--d-pp", "2", "--d-dp", "2"], phase)
    preempt, restart = elastic["events"]
    assert preempt == {**preempt, "event": "preempt", "device": 1, "by": "debug fault", "iteration": AT,
                       "during": phase}
    # known from its missed keep-alives, then on from the survivors' memory: after iteration 3, or after 4 when
    # it went in 4's checkpoint (every rank had done 4 and kept it); only the iteration in flight lost. In the
    # checkpoint case a loaded machine can hold a survivor between 4's step and its keep when the agent stops it
    # (seen once in CI beside the emulated tests): the survivors' memory then ends at 3, and 4 is in flight
    assert restart["after"] == "preempt" and restart["devices"] == [1] and restart["from"] == "memory"
    assert 0 < restart["detect_s"] < 3 * 0.3 + 2.0
    assert restart["resumed_from"] in ((AT, AT + 1) if phase == "checkpoint" else (AT,))
    late_keep = phase == "checkpoint" and restart["resumed_from"] == AT  # 4 done, one survivor had not kept it
    assert restart["lost_iterations"] in ((0, 1) if late_keep else (0,)) and restart["in_flight"] == 1
    gens = elastic["generations"]
    assert [g["devices"] for g in gens] == [[0, 1, 2, 3], [0, 2, 3]]
    assert [int(r["devices"]) for r in rows] == [4 if i < restart["resumed_from"] else 3 for i in range(1, 5)]


@pytest.mark.parametrize("system", [["ours", "--d-pp", "4", "--d-dp", "1"], ["megatron", "--tp", "1", "--pp", "2",
                                                                             "--dp", "2"]])
def test_a_preemption_in_a_checkpoint_write_goes_on_from_the_last_complete_one(tmp_path, system):
    # ours without replicas: no survivor holds the preempted device's stage; megatron always restarts. The
    # checkpoint after iteration 3 misses the preempted rank's file: the run goes on from the one after 2
    elastic, rows = _preempted_run(tmp_path, ["--system", *system], "checkpoint")
    restart = elastic["events"][1]
    assert restart["from"] == "checkpoint" and restart["resumed_from"] == 2
    if system[0] == "ours":
        assert "no survivor" in restart["why_not_memory"]
    # what every rank had done when the agent stopped them is redone from 2, the one they were in is in flight:
    # iterations 2 and 3 redone and 4 in flight, unless a loaded machine held a rank in 3 until its stop (3 in
    # flight then; the preempted rank was in 3's checkpoint: every rank had done 2, none had done 4)
    done = WARMUP + elastic["generations"][0]["iterations"]
    assert done in (AT, AT + 1)
    assert (restart["lost_iterations"], restart["in_flight"]) == (done - 2, 1)
    assert 1 not in elastic["generations"][1]["devices"]


def test_ours_leaves_a_device_on_notice_at_the_next_boundary_and_loses_nothing(tmp_path):
    # warned in iteration 3's backward (a cloud's notice, 60 s before the device goes): ours re-plans as the
    # iteration in flight ends, without the device, from its survivors' memory; the notice's minute never passes
    elastic, rows = _preempted_run(tmp_path, ["--system", "ours", "--d-pp", "2", "--d-dp", "2", "--debug",
                                              "fault_notice_s=60"], "backward")
    notice, restart = elastic["events"]
    assert (notice["event"], notice["device"], notice["during"]) == ("notice", 1, "backward")
    assert restart["after"] == "notice" and restart["from"] == "memory" and restart["detect_s"] is None
    assert (restart["resumed_from"], restart["lost_iterations"], restart["in_flight"]) == (AT + 1, 0, 0)
    assert restart["at_s"] - notice["at_s"] < 30  # the iteration's end, not the device's
    assert [g["devices"] for g in elastic["generations"]] == [[0, 1, 2, 3], [0, 2, 3]]


def test_the_baselines_do_not_act_on_a_notice(tmp_path):
    # torchrun's agent knows nothing of it: the run goes on with the device until it goes (after the run here)
    elastic, _ = _preempted_run(tmp_path, ["--system", "megatron", "--tp", "1", "--pp", "2", "--dp", "2", "--debug",
                                           "fault_notice_s=60"], "checkpoint")
    assert [e["event"] for e in elastic["events"]] == ["notice"]
    assert [g["devices"] for g in elastic["generations"]] == [[0, 1, 2, 3]]


@pytest.mark.parametrize("debug,error", [
    (["fault_mode=preempt"], "debug.fault_mode: preempt needs fault_rank (the device preempted)"),
    (["fault_rank=4", "fault_mode=preempt"], "--debug fault_rank: 4 is not one of the run's 4 devices"),
    (["fault_rank=1", "fault_iteration=5"], "--debug fault_iteration: the run's iterations are 0..4 "
                                            "(warm-up included); got 5"),
    (["fault_rank=1", "fault_iteration=2", "fault_phase=checkpoint"],
     "--debug fault_phase: no checkpoint after iteration 2 (--checkpoint-every 2)"),
    (["fault_rank=1", "fault_iteration=1", "fault_phase=forward", "--system=megatron"],
     "--debug fault_phase: megatron marks checkpoint of its iterations (got forward)"),
    (["fault_rank=1", "fault_phase=sync"], "debug.fault_phase: must be one of forward, backward, dp_sync, "
                                           "checkpoint (got 'sync')"),
    (["fault_iteration=1"], "--debug fault_iteration: needs fault_rank (whose rank, or device, it hits)"),
    (["fault_rank=1", "fault_notice_s=5"], "debug.fault_notice_s: a preemption's notice (with fault_mode=preempt)"),
])
def test_a_fault_that_cannot_hit_is_one_line(tmp_path, capsys, debug, error):
    flags = [a for d in debug if not d.startswith("--") for a in ("--debug", d)]
    flags += [a for d in debug if d.startswith("--") for a in d.split("=")]
    assert main(ARGS + flags + ["--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"harness: error: {error}"
    assert not (tmp_path / "2-spot").exists()
