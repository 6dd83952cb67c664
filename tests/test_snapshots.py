"""ours' recovery from its survivors' memory (train/snapshots.py): every device keeps what it held after its last
two iterations; after a preemption the agent picks the last iteration every item of the new layout survived in,
and the next generation's ranks take what their device held and receive the rest over the links; the run then
trains exactly as the single-process run. Where no survivor holds some item, there is no such plan."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.compute.model import get_model
from harness.layout import in_rank_order
from harness.layout.holdings import holdings
from harness.plan.layouts import plan_run
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.train import snapshots
from harness.train.local import run_local
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(180)

BATCH, MICRO, SEED, LR = 8, 2, 3, 0.1
X = {"x": (torch.ones(2), torch.zeros(2))}


def test_a_device_keeps_its_last_two_iterations_of_its_generation_and_forgets_them_when_preempted(tmp_path):
    for k in range(4):
        snapshots.save(tmp_path, 1, 0, k, X)
    assert snapshots.saved(tmp_path, 1) == [(0, 2), (0, 3)]
    snapshots.save(tmp_path, 1, 1, 3, {"x": (2 * torch.ones(2), torch.ones(2))})  # the next generation's
    assert snapshots.saved(tmp_path, 1) == [(1, 3)]
    assert snapshots.load(tmp_path, 1, 1, 3)["x"][0].tolist() == [2.0, 2.0]
    assert snapshots.load(tmp_path, 1, 0, 3) == {} and snapshots.load(tmp_path, 7, 0, 3) == {}
    snapshots.forget(tmp_path, 1)
    assert snapshots.saved(tmp_path, 1) == []


def _files(root, generation, iterations: dict) -> None:
    for d, ks in iterations.items():
        for k in ks:
            snapshots.save(root, d, generation, k, X)


def test_the_plan_is_the_last_iteration_every_item_survived_in_from_the_fastest_holder(tmp_path):
    old = in_rank_order(1, 2, 2, 4)  # stage 0 on devices 0, 1; stage 1 on 2, 3
    new = in_rank_order(1, 3, 1, 4)  # one pipeline of 3 on devices 0, 2, 3
    bw = np.ones((5, 5))
    bw[3, 2] = 9.0  # device 3 reaches device 2 fastest
    # device 1 gone; device 3 finished iteration 5, device 2 not yet: 5 is there for every item (3 holds stage 1)
    _files(tmp_path, 0, {0: [4, 5], 2: [3, 4], 3: [4, 5]})
    plan, why = snapshots.recovery_plan(tmp_path, 0, (0, 1, 2, 3), old, (0, 2, 3), new, bw)
    assert why == "" and plan.iteration == 5
    had = {0: holdings(old)[0], 1: set(), 2: holdings(old)[3]}  # at 5: device 2's file is not there
    for r, items in holdings(new).items():
        got = plan.sources.get(r, {})
        assert set(got) == items - had[r] and all(item in had[s] for item, s in got.items())
    assert snapshots.RecoveryPlan.sources_from_json(plan.to_json()) == plan.sources
    # device 3 behind too: 4 is the last iteration every item survived in
    snapshots.forget(tmp_path, 3)
    _files(tmp_path, 0, {3: [3, 4]})
    plan, _ = snapshots.recovery_plan(tmp_path, 0, (0, 1, 2, 3), old, (0, 2, 3), new, bw)
    assert plan.iteration == 4
    # another generation's files are not this one's
    assert snapshots.recovery_plan(tmp_path, 1, (0, 1, 2, 3), old, (0, 2, 3), new, bw)[0] is None
    # a device that comes back (4) holds nothing: it receives all of its stage, here from device 0
    plan, _ = snapshots.recovery_plan(tmp_path, 0, (0, 1, 2, 3), old, (4, 0, 3), new, bw)
    assert plan.sources[0] == {item: 1 for item in holdings(new)[0]}
    # the only holders of stage 0 not in the new layout (device 0 a spare), or gone: no plan, and why
    assert snapshots.recovery_plan(tmp_path, 0, (0, 1, 2, 3), old, (4, 2, 3), new, bw)[0] is None
    snapshots.forget(tmp_path, 0)
    plan, why = snapshots.recovery_plan(tmp_path, 0, (0, 1, 2, 3), old, (2, 3), in_rank_order(1, 2, 1, 4), bw)
    assert plan is None and why == "after iteration 4 no survivor of the new layout holds block:0"


def test_a_generation_stopped_before_it_kept_anything_leaves_the_copies_of_the_one_before(tmp_path):
    old, mid, new = in_rank_order(1, 2, 2, 4), in_rank_order(1, 3, 1, 4), in_rank_order(1, 2, 1, 4)
    _files(tmp_path, 0, {d: [6, 7] for d in range(4)})  # generation 1 (on 0, 2, 3) never got to keep anything
    history = [(0, (0, 1, 2, 3), old), (1, (0, 2, 3), mid)]
    plan, source, why = snapshots.latest_recovery_plan(tmp_path, history, (1, 2), new, np.ones((4, 4)))
    assert (plan.iteration, source, why) == (7, 0, "")
    # generation 1 kept iteration 8 on every device: it is the source
    _files(tmp_path, 1, {d: [8] for d in (0, 2, 3)})
    plan, source, _ = snapshots.latest_recovery_plan(tmp_path, history, (0, 2, 3), mid, np.ones((4, 4)))
    assert (plan.iteration, source, plan.sources) == (8, 1, {})
    # nothing covers the new layout: the latest generation's reason
    snapshots.forget(tmp_path, 0)
    plan, source, why = snapshots.latest_recovery_plan(tmp_path, history, (2, 3), new, np.ones((4, 4)))
    assert plan is None and source is None and why.startswith("after iteration 8 no survivor")


def _request(tmp_path, iters, **layout) -> RunRequest:
    return RunRequest(network=NetworkSection(scenario="5", devices=8, mode="none"),
                      model=ModelSection(name="tiny", layers=4, batch=BATCH, micro_batch=MICRO, seed=SEED, lr=LR),
                      layout=LayoutRequest(budget=200, **layout),
                      run=RunSection(system="ours", iters=iters, warmup=0, timeout_s=90, results_root=str(tmp_path)))


def test_the_survivors_go_on_from_their_memory_on_a_new_layout_as_the_single_process_run(tmp_path):
    memory = tmp_path / "memory"
    first = plan_run(_request(tmp_path, 3, pp=2, dp=4)).spec
    first = first.with_resolved(snapshots={"root": str(memory), "generation": 0, "recover": None})
    run_local(first, timeout_s=150)
    assert all(snapshots.saved(memory, d) == [(0, 2), (0, 3)] for d in range(8))
    # devices 0 and 5 preempted; the survivors 1, 2, 3, 4, 6, 7 run as ranks 0..5 and two fresh devices as
    # 6 and 7 (the local launcher's device ids are its ranks: each survivor's memory moves to its new id)
    survivors = (1, 2, 3, 4, 6, 7)
    for d in (0, 5):
        snapshots.forget(memory, d)
    moved = tmp_path / "moved"
    moved.mkdir()
    for r, d in enumerate(survivors):
        snapshots.device_dir(memory, d).rename(snapshots.device_dir(moved, r))
    new = plan_run(_request(tmp_path, 7, pp=4, dp=2)).spec
    old_devices = tuple({d: r for r, d in enumerate(survivors)}.get(d, 100 + d) for d in range(8))
    plan, why = snapshots.recovery_plan(moved, 0, old_devices, first.layout, tuple(range(8)), new.layout,
                                        np.ones((8, 8)))
    assert why == "" and plan.iteration == 3
    assert {6, 7} <= set(plan.sources) and all(s < 6 for items in plan.sources.values() for s in items.values())
    resumed = new.with_resolved(start_iteration=3, snapshots={"root": str(moved), "generation": 1,
                                                              "recover": {**plan.to_json(), "generation": 0}})
    run = run_local(resumed, collect_state=True, timeout_s=150)
    ref_losses, ref_state = reference_train(get_model("tiny", 4), BATCH, MICRO, 7, SEED, LR)
    assert [s.loss for s in run.stats] == pytest.approx(ref_losses[3:], rel=1e-5)
    state = run.state_dict()
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-7, msg=k)
    # the new generation's memory: its own files, on its own layout
    assert all(snapshots.saved(moved, r) == [(1, 6), (1, 7)] for r in range(8))
