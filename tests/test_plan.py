"""Planning a run: flags become one validated Layout (degrees filled in), or one line naming the flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli.run_flags import run_request
from tests.conftest import assert_same_json

from harness.errors import HarnessError
from harness.layout import LayoutError
from harness.plan.request import ConfigError, LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
from harness.plan.layouts import plan_run


def plan(system: str, **layout):
    return plan_run(RunRequest(network=NetworkSection("5", devices=8, bandwidth_scale=0.01, mode="none"),
                               model=ModelSection("tiny", layers=4, batch=16),
                               layout=LayoutRequest(**layout), run=RunSection(system=system)))


@pytest.mark.parametrize("system, flags, degrees", [
    ("megatron", dict(tp=2, pp=2), (2, 2, 2, 0)),
    ("megatron", dict(dp=4), (1, 2, 4, 0)),
    ("megatron", dict(), (1, 1, 8, 0)),
    ("deepspeed", dict(zero=3), (1, 1, 8, 3)),
    ("deepspeed", dict(zero=1, pp=4), (1, 4, 2, 1)),
])
def test_baseline_flags_fill_the_missing_degrees(system, flags, degrees):
    spec = plan(system, **flags).spec
    lay = spec.layout
    assert (lay.tp, lay.pp, lay.dp, lay.zero) == degrees and lay.placement == "rank-order"
    assert spec.network.scenario == "5" and spec.network.kernel == "auto"  # as asked
    assert (spec.resolved.scenario, spec.resolved.scenario_source, spec.resolved.backend, spec.resolved.kernel) == \
        ("5-worldwide", "5-worldwide", "local", "none")  # as planned; the launcher fills in the kernel


def test_the_topology_is_scaled_once_where_the_run_is_planned():
    p = plan("megatron")
    assert p.topo.bandwidth_scale == 0.01 and p.spec.network.bandwidth_scale == 0.01


def test_transport_replaces_the_scenarios_tcp_settings_where_the_run_is_planned():
    """`harness run --transport linux`: the cluster (plan.topo) and the manifest get Linux's settings; the spec
    says what was asked; a name that is no preset is a one-line error."""
    from harness.scenario.transport import LINUX

    asked = run_request(["--scenario", "5", "--devices", "8", "--model", "tiny", "--layers", "4", "--batch", "16",
                         "--network", "none", "--system", "megatron", "--transport", "linux"])
    p = plan_run(asked)
    assert p.topo.transport == LINUX and p.spec.network.transport == "linux"
    assert plan("megatron").topo.transport.slow_start_after_idle is False  # the scenario's (tuned)
    with pytest.raises(ConfigError, match="network.transport: must be one of scenario, linux, tuned"):
        NetworkSection("5", transport="fast")


@pytest.mark.parametrize("system, flags, message", [
    ("megatron", dict(zero=1), "--zero: not an option of --system megatron (it takes --tp, --pp, --dp, "),
    ("deepspeed", dict(zero=1, tp=2), "--tp: not an option of --system deepspeed"),
    ("deepspeed", dict(), "--zero: must be 1 or 3"),
    ("deepspeed", dict(zero=3, pp=2), "--pp: ZeRO-3 runs without pipeline"),
    ("megatron", dict(tp=2, pp=2, dp=4), "tp*pp*dp = 2*2*4 = 16 != 8 devices"),
    ("megatron", dict(seed=2022, dp_sync="allreduce"), "--dp-sync: not an option of --system megatron"),
    ("megatron", dict(tp=8), "layout.tp: 8 does not divide the 4 heads"),
    ("ours", dict(tp=2), "--tp: not an option of --system ours (it takes --d-pp, --d-dp, --scheduler"),
    ("ours", dict(seed=3), "--rank-order: not an option of --system ours"),
    ("ours", dict(pp=3, dp=3), "--d-pp/--d-dp: 3 x 3 != 8 devices"),
    ("ours", dict(pp=8), "--d-pp: 8 stages exceed the 4 layers"),
    ("ours-random", dict(scheduler="ga"), "--scheduler: not an option of --system ours-random"),
])
def test_wrong_combinations_are_one_line_errors(system, flags, message):
    with pytest.raises(LayoutError) as e:
        plan(system, **flags)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_seed_that_is_not_an_integer_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"^layout.seed: must be an integer \(got 'shuffled'\)$"):
        LayoutRequest(seed="shuffled")


# `make scenario-5`'s emulated runs (Makefile: EMU5) and their layouts as planned before the system registry.
EMU5 = "--scenario 5 --devices 8 --model tiny --layers 4 --batch 8 --micro-batch 1 --bandwidth-scale 0.01".split()
PLAN_SNAPSHOT = Path(__file__).parent / "data" / "plan_snapshot_scenario5.json"


@pytest.mark.parametrize("i", range(7))
def test_make_scenario_5_runs_plan_the_layouts_they_planned_before(i):
    want = json.loads(PLAN_SNAPSHOT.read_text())[i]
    plan = plan_run(run_request([*EMU5, *want["cmd"]]))
    got = {"cmd": want["cmd"], "layout": plan.spec.layout.to_json(),
           "placement": None if plan.placement is None else plan.placement.to_json(plan.spec.layout)}
    assert_same_json(json.loads(json.dumps(got)), want, " ".join(want["cmd"]))


def test_a_run_asked_by_its_sections_takes_the_defaults_that_follow_and_refuses_in_one_line():
    """plan/asked.request_of: what `harness run`, the regression gate and a script build a run request with."""
    from harness.plan.asked import request_of
    from harness.scenario.preemption import HEARTBEAT_S, KEEPALIVE_S

    ours = request_of({"network": {"scenario": "5"}, "compute": {"model": True}})
    assert ours.run.system == "ours" and ours.run.keepalive_s == HEARTBEAT_S and ours.run.timeout_auto
    assert ours.compute.dilate and ours.model.dtype == "fp32"  # emulated with the compute model, no scale: probed
    het = request_of({"network": {"scenario": "hetpipe-testbed", "mode": "none"}, "compute": {"model": True},
                      "run": {"system": "hetpipe", "device_type": "cuda", "timeout_s": 30.0,
                              "options": {"staleness": 2}}})
    assert het.run.options == {"policy": "ed", "ps_placement": "default", "staleness": 2, "in_flight": None}
    assert het.run.keepalive_s == KEEPALIVE_S and not het.run.timeout_auto and not het.compute.dilate
    assert het.model.dtype == "bf16"
    for asked, msg in [({"model": {}}, "run request: network.scenario: missing"),
                       ({"network": {"scenario": "5"}, "runs": {}}, "run request: unknown section 'runs'"),
                       ({"network": {"scenario": "5"}, "run": {"iter": 2}}, "run request: run.iter: unknown field"),
                       ({"network": {"scenario": "5"}, "layout": {"tp": 2}},
                        "layout.tp: not a layout field --system ours takes"),
                       ({"network": {"scenario": "5"}, "run": {"options": {"staleness": 1}}},
                        "--staleness: not an option of --system ours")]:
        with pytest.raises(HarnessError) as e:
            request_of(asked)
        assert str(e.value).startswith(msg) and "\n" not in str(e.value), (asked, str(e.value))
