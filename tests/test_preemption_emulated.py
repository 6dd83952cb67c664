"""Devices that leave and come back in the emulated cluster (user-mode Linux): the timeline controller cuts a
preempted device's links and the launcher kills its rank; the elastic agent (train/elastic.py) learns of it from
the missed keep-alives and starts the run again on the devices left, and again with the device when it is back:
ours from its survivors' memory (train/snapshots.py: what a stage lost in one replica comes from another over the
links), losing only the iteration in flight; Megatron from its last checkpoint, as torchrun's agent restarts it.
One boot, a run of each on case 2 (8 devices)."""
from __future__ import annotations

import csv
import json
import os
import textwrap

import pytest

from harness.compute.model import get_model
from harness.network import registry
from harness.train.reference import reference_train

from .emulation import marks, unaccounted_namespaces

pytestmark = marks(900)  # a hang guard: the two-system boot took 437 and 481 s on a slow day (2026-12-07)

KEEPALIVE_S, LAST_CALL_S = 1.0, 2.0


def test_ours_goes_on_from_its_survivors_memory_after_a_preemption_and_uses_the_device_again_when_back(cli, tmp_path):
    timeline = tmp_path / "t.yaml"
    timeline.write_text(textwrap.dedent("""
        events:
          - {at_iteration: 3, preempt: 5}
          - {at_iteration: 6, return: 5}
    """))
    rc, out, err = cli("run", "--scenario", "2", "--devices", "8", "--network", "emulated", "--model", "tiny",
                       "--layers", "4", "--batch", "8", "--micro-batch", "1", "--bandwidth-scale", "0.01",
                       "--data", "markov", "--iters", "8", "--warmup", "1", "--timeline", timeline,
                       "--keepalive", KEEPALIVE_S, "--last-call", LAST_CALL_S, "--checkpoint-every", "2",
                       "--each", "--system ours", "--each", "--system megatron --tp 1 --pp 4 --dp 2",
                       "--results", tmp_path / "res")
    assert rc == 0, err
    assert err.count("devices left and came back: 2 restarts (1 after a preemption)") == 2
    # nothing left running: the cluster, its namespaces and every generation's ranks are gone
    assert not [e for e in registry.entries() if e.pid == os.getpid()] and not unaccounted_namespaces()
    rc, shown, _ = cli("net", "show")
    assert rc == 0 and "namespaces here:" in shown
    runs = {p.name.split("-")[-2]: p for p in (tmp_path / "res" / "2-spot").iterdir()}
    assert sorted(runs) == ["megatron", "ours"]
    run = runs["ours"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    gens, events = manifest["elastic"]["generations"], manifest["elastic"]["events"]
    # three generations: all 8, then without device 5 (7 do not lay out the batch of 8: one waits as a spare),
    # then all 8 again: the device that came back is used
    assert [5 in g["devices"] for g in gens] == [True, False, True] and len(gens[1]["devices"]) == 6
    starts = [g["start_iteration"] for g in gens]
    # (the return comes as iteration 6 begins; ours takes it as the iteration the last rank is in ends)
    assert starts[:2] == [0, 3] and starts[2] in (7, 8)
    preempt, lost, ret, joined = events
    assert (preempt["event"], preempt["device"], ret["event"], ret["device"]) == ("preempt", 5, "return", 5)
    # the preemption: known after the keep-alives missed (the last one came at most an interval before it),
    # then the run went on from the survivors' memory after
    # iteration 3 (the last every rank had done; a checkpoint was at 2): only iteration 3, in flight, was lost
    assert lost["event"] == "restart" and lost["after"] == "preempt" and lost["devices"] == [5]
    # (no upper bound of its own: a loaded machine delays the agent; it is bounded by the iteration it hit, below)
    assert (3 - 1) * KEEPALIVE_S - 0.5 <= lost["detect_s"], lost
    assert lost["last_call_s"] == 0  # ours re-plans on the devices there (torchrun's rendezvous would wait)
    assert lost["resumed_from"] == 3 and lost["from"] == "memory"
    assert (lost["lost_iterations"], lost["in_flight"]) == (0, 1)
    # each part of the recovery: the re-plan, then (after the processes started) the process group, the state
    # moved to the new layout, ready to train
    marks = lost["restart_marks_s"]
    assert lost["replan_s"] >= 0 and 0 < marks["process_group"] < marks["state_moved"] < marks["training"]
    assert lost["restart_s"] == marks["training"]
    # the return: from the survivors' memory too, where the ranks were when it came back
    assert joined["after"] == "return" and joined["resumed_from"] == starts[2] and joined["last_call_s"] == 0
    assert joined["from"] == "memory" and (joined["lost_iterations"], joined["in_flight"]) == (0, 0)
    recoveries = list(csv.DictReader((run / "recoveries.csv").open()))
    assert [(r["after"], r["devices"], int(r["lost_iterations"])) for r in recoveries] == \
        [("preempt", "5", 0), ("return", "5", 0)]
    assert [r["from"] for r in recoveries] == ["memory", "memory"] and float(recoveries[0]["state_moved_s"]) > 0
    # the controller's log: the device's 14 links (7 each way) cut, then back
    changes = manifest["timeline"]["changes"]
    assert [c["event"] for c in changes] == ["iteration 3: device 5 preempted", "iteration 6: device 5 returns"]
    assert all(c["pairs"] == 14 for c in changes)
    # per iteration the devices it ran on; every useful iteration once, and the losses are the single-process
    # run's: each restart went on from the same weights and momentum, on its new layout
    rows = list(csv.DictReader((run / "records.csv").open()))
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9))
    assert [int(r["devices"]) for r in rows] == [8 if i < 3 or i >= starts[2] else 6 for i in range(1, 9)]
    ref, _ = reference_train(get_model("tiny", 4), 8, 1, 9, 0, 0.1, "markov")
    assert [float(r["loss"]) for r in rows] == pytest.approx(ref[1:], rel=1e-5)
    # the first iteration after each restart carries its recovery
    seconds = [float(r["seconds"]) for r in rows]
    # they add up to the run's time from its first timed iteration on, every restart in it
    assert min(seconds) > 0 and sum(seconds) > lost["detect_s"] + lost["last_call_s"] + lost["restart_s"]
    assert seconds[2] > lost["detect_s"] + lost["last_call_s"] and seconds[starts[2] - 1] > joined["stop_s"]

    # Megatron restarts as torchrun's agent does, from its own checkpoint (at 2; the rendezvous waits its last
    # call), on 4 devices (its pipeline of 4 kept), and trains as the single-process run too
    manifest = json.loads((runs["megatron"] / "manifest.json").read_text())
    gens, events = manifest["elastic"]["generations"], manifest["elastic"]["events"]
    lost = events[1]
    assert [len(g["devices"]) for g in gens] == [8, 4, 8] and [g["start_iteration"] for g in gens][:2] == [0, 2]
    assert lost["from"] == "checkpoint" and lost["resumed_from"] == 2 and lost["in_flight"] == 1
    assert LAST_CALL_S <= lost["last_call_s"]
    rows = list(csv.DictReader((runs["megatron"] / "records.csv").open()))
    assert [float(r["loss"]) for r in rows] == pytest.approx(ref[1:], rel=1e-5)
    # the detection and the wait are in the records' time (no absolute upper bound: load delays the agent)
    assert sum(float(r["seconds"]) for r in rows) > lost["detect_s"] + lost["last_call_s"]
