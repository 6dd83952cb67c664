"""ours writes checkpoints by parameter name and goes on from one on another layout (the restart a run falls
back on when no copy of a stage survives a preemption): the resumed run trains exactly the single-process run."""
from __future__ import annotations

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


def request(tmp_path, iters, *, system="ours", every=None, resume=None, **layout) -> RunRequest:
    return RunRequest(network=NetworkSection(scenario="5", devices=8, mode="none"),
                      model=ModelSection(name="tiny", layers=4, batch=BATCH, micro_batch=MICRO, seed=SEED, lr=LR),
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
    run = run_local(resumed, collect_state=True, timeout_s=150)
    ref_losses, ref_state = reference_train(get_model("tiny", 4), BATCH, MICRO, 7, SEED, LR)
    # iterations 3..6, on the new layout, from the checkpoint's values and momentum
    assert [s.loss for s in run.stats] == pytest.approx(ref_losses[3:], rel=1e-5)
    state = run.state_dict()
    assert set(state) == set(ref_state)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-7, msg=k)


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
    with pytest.raises(HarnessError, match=r"^--checkpoint-every: ours and ours-random checkpoint and resume so far \(not megatron\)$"):
        with_checkpoints(plan_run(request(tmp_path, 3, system="megatron", every=2, tp=1, pp=4, dp=2)))
