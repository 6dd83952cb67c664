"""ours and the baselines write checkpoints by parameter name and go on from one on another layout (how the
baselines restart after a preemption, and ours where no copy of a stage survives one): the resumed run trains
exactly the single-process run."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.compute.model import get_model
from harness.errors import HarnessError
from harness.plan.layouts import plan_run
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.train import checkpoint
from harness.train.experiment import with_checkpoints
from harness.train.local import run_local
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(180)

BATCH, MICRO, SEED, LR = 8, 2, 3, 0.1


def request(tmp_path, iters, *, system="ours", every=None, resume=None, micro=MICRO, **layout) -> RunRequest:
    return RunRequest(network=NetworkSection(scenario="5", devices=8, mode="none"),
                      model=ModelSection(name="tiny", layers=4, batch=BATCH, micro_batch=micro, seed=SEED, lr=LR),
                      layout=LayoutRequest(**({"budget": 200} if system == "ours" else {}), **layout),
                      run=RunSection(system=system, iters=iters, warmup=0, timeout_s=90, results_root=str(tmp_path),
                                     checkpoint_every=every, resume=None if resume is None else str(resume)))


def test_a_run_resumed_on_another_layout_trains_as_the_single_process_run(tmp_path):
    first = with_checkpoints(plan_run(request(tmp_path, 4, every=3, pp=4, dp=2))).spec
    run_local(first, timeout_s=150)
    saved = tmp_path / first.resolved.scenario / first.resolved.run_id
    # after iteration 3 (of 4): one file per rank, complete
    assert sorted(p.name for p in (saved / "checkpoints" / "iter-3").iterdir()) == [f"rank-{r}.pt" for r in range(8)]
    assert checkpoint.latest(saved) == 3

    resumed = with_checkpoints(plan_run(request(tmp_path, 7, resume=saved, pp=2, dp=4))).spec
    assert resumed.resolved.start_iteration == 3 and resumed.layout.pp == 2
    # iterations 3..6, on the new layout, from the checkpoint's values and momentum
    assert_trains_as_reference(run_local(resumed, collect_state=True, timeout_s=150), MICRO, 3, 7, atol=1e-7)


def assert_trains_as_reference(run, micro: int, start: int, steps: int, atol: float) -> None:
    ref_losses, ref_state = reference_train(get_model("tiny", 4), BATCH, micro, steps, SEED, LR)
    assert [s.loss for s in run.stats] == pytest.approx(ref_losses[start:], rel=1e-5)
    state = run.state_dict()
    assert set(state) == set(ref_state)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=atol, msg=k)


def test_an_incomplete_checkpoint_is_not_resumed_and_bad_requests_are_one_line(tmp_path):
    where = tmp_path / "run" / "checkpoints"
    checkpoint.save(where, 2, 0, 2, {"x": (torch.ones(2), torch.zeros(2))})
    assert checkpoint.latest(tmp_path / "run") is None  # rank 1 of 2 never wrote
    checkpoint.save(where, 1, 0, 1, {"x": (torch.ones(2), torch.zeros(2))})
    assert checkpoint.latest(tmp_path / "run") == 1
    checkpoint.drop_after(where, 1)  # what a restart from 1 does: the later one (incomplete here) goes
    assert sorted(p.name for p in where.iterdir()) == ["iter-1"] and checkpoint.latest(tmp_path / "run") == 1
    checkpoint.save(where, 2, 0, 2, {"x": (torch.ones(2), torch.zeros(2))})
    with pytest.raises(HarnessError, match=r"^--resume: .*: its checkpoint is after iteration 1, and this run ends "
                                           r"at 1 \(--warmup \+ --iters\): nothing to run$"):
        with_checkpoints(plan_run(request(tmp_path, 1, resume=tmp_path / "run", pp=4, dp=2)))
    with pytest.raises(HarnessError, match=r"^--resume: .*: no complete checkpoint"):
        with_checkpoints(plan_run(request(tmp_path, 3, resume=tmp_path, pp=4, dp=2)))
    with pytest.raises(HarnessError, match=r"^--checkpoint-every: hetpipe does not checkpoint \(these do: .*megatron.*\)$"):
        planned = plan_run(request(tmp_path, 3, every=2, pp=4, dp=2))  # as planned for ours, then for hetpipe
        spec = planned.spec
        with_checkpoints(replace(planned, spec=replace(spec, run=replace(spec.run, system="hetpipe"))))


@pytest.mark.parametrize("system, micro, first, then", [
    # tensor-parallel shards gathered, then split again four ways
    ("megatron", MICRO, {"tp": 2, "pp": 2, "dp": 2}, {"tp": 4, "pp": 2, "dp": 1}),
    # ZeRO-1's optimizer shards (each rank writes the momentum it owns), then ZeRO-3 (every tensor sharded)
    ("deepspeed", 1, {"zero": 1, "pp": 2, "dp": 4}, {"zero": 3}),
])
def test_a_baseline_resumed_on_other_degrees_trains_as_the_single_process_run(tmp_path, system, micro, first, then):
    spec = with_checkpoints(plan_run(request(tmp_path, 4, system=system, every=3, micro=micro, **first))).spec
    run_local(spec, timeout_s=150)
    saved = tmp_path / spec.resolved.scenario / spec.resolved.run_id
    assert checkpoint.latest(saved) == 3
    resumed = with_checkpoints(plan_run(request(tmp_path, 6, system=system, resume=saved, micro=micro, **then))).spec
    assert_trains_as_reference(run_local(resumed, collect_state=True, timeout_s=150), micro, 3, 6, atol=1e-6)
