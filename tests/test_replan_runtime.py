"""ours re-plans during a run (--replan): rank 0 follows the timeline, the placement changes at an iteration
boundary, and the weights and momentum that move with it keep training exactly the single-process run's."""
from __future__ import annotations

import json

import pytest
import torch

from harness import layout as layouts
from harness.compute.model import get_model
from harness.errors import HarnessError
from harness.plan.layouts import plan_run
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection, RunSpec
from harness.layout.holdings import holdings
from harness.sim.replan import move_sources
from harness.systems.ours.replan import LEAD, item_of
from harness.train.experiment import replan_summary
from harness.train.gpt import GPT
from harness.train.local import run_local
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(180)

BATCH, MICRO, STEPS, SEED, LR = 8, 2, 12, 3, 0.1
# case 5 at 8 devices (one per region): the scheduler's plan exchanges stage 0's gradients over Tokyo <-> Seoul;
# at 1 % of its rate the search finds a plan without it
TIMELINE = """\
events:
  - {at_iteration: 1, from: Tokyo, to: Seoul, bandwidth_factor: 0.01}
"""


def request(tmp_path, *, replan=True, timeline=TIMELINE, system="ours", iters=STEPS, **layout) -> RunRequest:
    network = NetworkSection(scenario="5", devices=8, mode="none")
    if timeline is not None:
        (tmp_path / "t.yaml").write_text(timeline)
        network = NetworkSection(scenario="5", devices=8, mode="none", timeline=str(tmp_path / "t.yaml"))
    return RunRequest(network=network,
                      model=ModelSection(name="tiny", layers=4, batch=BATCH, micro_batch=MICRO, seed=SEED, lr=LR),
                      layout=LayoutRequest(replan=replan, **({"budget": 200} if system == "ours" else {}), **layout),
                      run=RunSection(system=system, iters=iters, warmup=0, timeout_s=90))


def test_a_replanned_run_moves_its_blocks_and_matches_the_single_process_reference(tmp_path):
    plan = plan_run(request(tmp_path, pp=4, dp=2))
    spec = plan.spec
    assert spec.replan.enabled and spec.replan.scheduler == "ga"
    assert RunSpec.from_json(json.loads(json.dumps(spec.to_json()))).replan == spec.replan
    run = run_local(spec, collect_state=True, timeout_s=150)

    rows = [row for r in run.ranks for row in (r.stats[-1].replans or [])]
    (decision,) = summary = replan_summary(rows)
    # the change is due at the end of iteration 0 (the mark of iteration 1): the new plan runs from 0 + LEAD
    assert decision["decided_after"] == 0 and decision["iteration"] == LEAD and decision["taken"]
    assert decision["cost_after_s"] < decision["cost_before_s"]
    # taken because its gain over the iterations left pays for its moves
    assert decision["saves_s"] == pytest.approx((decision["cost_before_s"] - decision["cost_after_s"]) * (STEPS - LEAD))
    assert decision["saves_s"] > decision["moves_estimate_s"] > 0
    old = [list(p) for p in spec.layout.pipelines]
    assert decision["pipelines"] != old
    tokyo, seoul = 3, 4
    new_groups = [{p[j] for p in decision["pipelines"]} for j in range(spec.layout.pp)]
    assert {tokyo, seoul} in [{p[j] for p in old} for j in range(spec.layout.pp)]  # the old plan used the link
    assert {tokyo, seoul} not in new_groups
    moves = [r for r in rows if r["kind"] == "move"]
    assert sorted(r["rank"] for r in moves) == list(range(8))
    assert sum(r["bytes_sent"] for r in moves) == sum(r["bytes_received"] for r in moves) \
        == summary[0]["moved_bytes"] > 0

    # what moved is exactly what each device lacked: values + momentum, fp32
    cfg = get_model("tiny", 4)
    full = dict(GPT(cfg, SEED).named_parameters())
    layout_after = layouts.from_pipelines(decision["pipelines"], 4, "ga",
                                          stages=tuple(map(tuple, decision["stages"])))
    lacking = move_sources(spec.layout, layout_after, torch.ones(8, 8).numpy())
    for r in moves:
        items = lacking.get(r["rank"], {})
        assert r["bytes_received"] == sum(2 * 4 * p.numel() for n, p in full.items() if item_of(n) in items)

    ref_losses, ref_state = reference_train(cfg, BATCH, MICRO, STEPS, SEED, LR)
    assert [s.loss for s in run.stats] == pytest.approx(ref_losses, rel=1e-5)
    state = run.state_dict()
    assert set(state) == set(ref_state)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-7, msg=k)
    # after the switch every device holds its new stage, and the replicas agree
    by_rank = {r.rank: r.state for r in run.ranks}
    for d, items in holdings(layout_after).items():
        assert {item_of(n) for n in by_rank[d]} == items
    for group in new_groups:
        first, *rest = sorted(group)
        for d in rest:
            for k, v in by_rank[first].items():
                assert torch.equal(v, by_rank[d][k]), (k, d)


def test_a_faster_plan_whose_gain_would_not_pay_for_its_moves_is_not_taken(tmp_path):
    spec = plan_run(request(tmp_path, pp=4, dp=2, iters=5)).spec  # 2 iterations left after the search
    run = run_local(spec, timeout_s=150)
    rows = [row for r in run.ranks for row in (r.stats[-1].replans or [])]
    (decision,) = rows
    assert decision["cost_after_s"] < decision["cost_before_s"] and not decision["taken"]
    assert decision["saves_s"] < decision["moves_estimate_s"]


def test_replan_needs_a_timeline_and_a_scheduled_system(tmp_path):
    with pytest.raises(HarnessError, match=r"^--replan: re-plans when the links change; 5-worldwide has no "
                                           r"timeline: \(give --timeline\)$"):
        plan_run(request(tmp_path, timeline=None))
    with pytest.raises(HarnessError, match=r"^--replan: not an option of --system megatron"):
        plan_run(request(tmp_path, system="megatron"))
    assert not plan_run(request(tmp_path, replan=None)).spec.replan.enabled


def test_replan_summary_pairs_each_decision_with_its_moves():
    rows = [{"kind": "decision", "decided_after": 4, "iteration": 7, "taken": False, "search_s": 0.5},
            {"kind": "decision", "decided_after": 0, "iteration": 3, "taken": True, "search_s": 1.5},
            {"kind": "move", "iteration": 3, "rank": 0, "move_s": 0.2, "rebuild_s": 0.1, "bytes_sent": 8,
             "bytes_received": 16},
            {"kind": "move", "iteration": 3, "rank": 1, "move_s": 0.7, "rebuild_s": 0.05, "bytes_sent": 16,
             "bytes_received": 8}]
    first, second = replan_summary(rows)
    assert (first["iteration"], first["move_s"], first["rebuild_s"], first["moved_bytes"]) == (3, 0.7, 0.1, 24)
    assert second["iteration"] == 7 and "move_s" not in second
