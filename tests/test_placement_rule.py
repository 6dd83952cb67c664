"""One seeded placement rule: `ours-random --seed 2022` is the same assignment in `harness run`, `harness sim`
and `harness sim compare` (and the baselines' `--rank-order 2022` with the same degrees)."""
from __future__ import annotations

import json

import pytest

from harness.sim.compare import record_layout
from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.train.experiment import to_records
from harness.plan.layouts import plan_run
from harness.train.stats import IterationStats

SEED = 2022


def planned(system: str, **layout):
    req = RunRequest(network=NetworkSection("5", devices=8, bandwidth_scale=0.01, mode="none"),
                     model=ModelSection("tiny", layers=4, batch=8, seed=SEED),
                     layout=LayoutRequest(**layout), run=RunSection(system=system, iters=1))
    return plan_run(req).spec


def test_seed_2022_is_one_assignment_in_run_sim_and_sim_compare(cli, tmp_path):
    run = planned("ours-random").layout  # what `harness run --system ours-random --seed 2022` trains on
    assert (run.pp, run.dp) == (4, 2) and run.placement == f"seed-{SEED}"

    # harness sim: its ours-random row averages over the seeded placements 2022-2024
    out = tmp_path / "sim.json"
    rc, _, err = cli("sim", "--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "8",
                     "--system", "ours-random", "--json", out, "--out", tmp_path / "sim")
    assert rc == 0, err
    (row,) = json.loads(out.read_text())
    assert row["config"]["seeds"][0] == SEED
    assert row["config"]["pipelines"][0] == [list(p) for p in run.pipelines]

    # harness sim compare: the layout it simulates for that run's records
    spec = planned("ours-random")
    rec = to_records(spec, [IterationStats(1.0, 0.5, 0.5, 6.0)])[0].__dict__
    assert record_layout(rec, spec.cfg, 8, "cpu", schedule_ours=None).mesh == run.mesh
    # a record written before the layout module (legacy config without pipelines) reads the same rule
    legacy = {**rec, "config": json.dumps({"d_pp": 4, "d_dp": 2})}
    assert record_layout(legacy, spec.cfg, 8, "cpu", schedule_ours=None).mesh == run.mesh


@pytest.mark.parametrize("system, flags", [("megatron", dict(pp=4, dp=2)), ("deepspeed", dict(zero=1, pp=4, dp=2))])
def test_baselines_rank_order_seed_is_ours_random_assignment(system, flags):
    ours = planned("ours-random").layout
    base = planned(system, seed=SEED, **flags).layout
    assert base.mesh == ours.mesh and base.schedule == "1f1b" and ours.schedule == "gpipe"
