"""The typed run configuration: sections reject bad values in one line, the spec survives JSON, --debug is typed."""
from __future__ import annotations

import pytest

from harness import layout as layouts
from harness.plan.request import (ConfigError, DebugSection, ModelSection, NetworkSection, Resolved, RunSection,
                                  RunSpec)


@pytest.mark.parametrize("build, field", [
    (lambda: ModelSection(batch=0), "model.batch"),
    (lambda: ModelSection(dtype="fp8"), "model.dtype"),
    (lambda: NetworkSection("5", bandwidth_scale=0), "network.bandwidth_scale"),
    (lambda: NetworkSection("5", mode="tcp"), "network.mode"),
    (lambda: RunSection(warmup=-1), "run.warmup"),
    (lambda: RunSection(device_type="tpu"), "run.device_type"),
    (lambda: DebugSection(fault_mode="explode"), "debug.fault_mode"),
    (lambda: Resolved("r", backend="sim", scenario="5-worldwide", scenario_source="5-worldwide"), "resolved.backend"),
])
def test_bad_values_name_section_and_field(build, field):
    with pytest.raises(ConfigError) as e:
        build()
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_spec_round_trips_through_json_and_rejects_unknown_keys():
    spec = RunSpec(network=NetworkSection("5-worldwide", devices=8, bandwidth_scale=0.01),
                   model=ModelSection("tiny", layers=4), layout=layouts.seeded(1, 4, 2, 4, 2022, schedule="gpipe"),
                   run=RunSection(system="ours-random", run_id="x"),
                   resolved=Resolved("x", "emu", "5-worldwide", "5-worldwide", kernel="uml"),
                   debug=DebugSection(fault_rank=3, fault_after_s=2.5, trace=True))
    assert RunSpec.from_json(spec.to_json()) == spec
    doc = spec.to_json()
    doc["run"]["bogus"] = 1
    with pytest.raises(ConfigError, match="run.bogus: unknown key"):
        RunSpec.from_json(doc)
    with pytest.raises(ConfigError, match="unknown section 'extra'"):
        RunSpec.from_json({**spec.to_json(), "extra": {}})
    with pytest.raises(ConfigError, match="resolved: missing"):
        RunSpec.from_json({k: v for k, v in spec.to_json().items() if k != "resolved"})


def test_debug_options_are_parsed_by_their_field_type():
    d = DebugSection.parse(["fault_rank=2", "fault_after_s=1.5", "fault_mode=exit", "trace=1"])
    assert d == DebugSection(fault_rank=2, fault_after_s=1.5, fault_mode="exit", trace=True)
    assert DebugSection.parse(None) == DebugSection()
    with pytest.raises(ConfigError, match="fault_rank: not a valid int"):
        DebugSection.parse(["fault_rank=x"])
    with pytest.raises(ConfigError, match="KEY one of"):
        DebugSection.parse(["send_delay"])


def test_planted_regression_options_are_typed_and_checked():
    assert DebugSection.parse(["send_delay_s=0.02", "overlap=0"]) == DebugSection(send_delay_s=0.02, overlap=False)
    with pytest.raises(ConfigError, match=r"debug.send_delay_s: must be a number >= 0"):
        DebugSection(send_delay_s=-1)
    with pytest.raises(ConfigError, match=r"overlap: not a valid bool"):
        DebugSection.parse(["overlap=maybe"])
