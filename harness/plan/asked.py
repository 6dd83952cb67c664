"""A run request from what was asked, section by section: the one place where a run's defaults that depend on
its other fields are decided.

`harness run`'s flags (cli/run_flags.py), the regression gate's runs (harness/regress/: a system's `gate_runs`)
and a script all describe a run as its sections' fields, `{"network": {"scenario": "5", "devices": 8},
"run": {"system": "megatron"}, "layout": {"tp": 2}}`, and `request_of` turns that into the RunRequest: a field
not given takes its section's default, and these follow from the others:
- run.options: the system's options given, over their defaults (an option it does not have: one line);
- run.keepalive_s: a system that re-plans detects a lost device with its own heartbeat, the others with torchrun's;
- run.timeout_auto: no timeout given (a dilated run's then follows from its expected time, plan/dilation.py);
- model.dtype: bf16 on cuda, fp32 on cpu;
- compute.dilate: the compute model without a time scale, emulated: the probe chooses the dilation;
- a layout field the system does not take: one line.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from ..scenario.preemption import HEARTBEAT_S, KEEPALIVE_S
from . import systems
from .request import (ComputeSection, ConfigError, DebugSection, LayoutRequest, ModelSection, NetworkSection,
                      RunRequest, RunSection)

SECTIONS = {"network": NetworkSection, "model": ModelSection, "layout": LayoutRequest, "run": RunSection,
            "compute": ComputeSection, "debug": DebugSection}


def merged(*asked: Mapping[str, Mapping]) -> dict[str, dict]:
    """Several descriptions of a run, section by section, the later's fields over the earlier's."""
    out: dict[str, dict] = {}
    for a in asked:
        for section, values in a.items():
            out.setdefault(section, {}).update(values)
    return out


def describe(asked: Mapping[str, Mapping]) -> str:
    """A run as asked, in one line: section.field=value ..."""
    return " ".join(f"{s}.{k}={v}" for s, values in asked.items() for k, v in values.items())


def default_keepalive(system: str) -> float:
    """A system that re-plans detects a lost device with its own heartbeat; the others with torchrun's."""
    return HEARTBEAT_S if systems.get(system).recovery == "replan" else KEEPALIVE_S


def request_of(asked: Mapping[str, Mapping | object]) -> RunRequest:
    """The RunRequest of `asked` (section -> its fields given, or the section itself); see the module docstring.
    An unknown section or field is one line naming it."""
    unknown = sorted(set(asked) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"run request: unknown section {unknown[0]!r} (known: {', '.join(SECTIONS)})")
    given: dict[str, dict] = {}
    for name, cls in SECTIONS.items():
        values = asked.get(name, {})
        if isinstance(values, cls):
            values = {f.name: getattr(values, f.name) for f in fields(cls)}
        bad = sorted(set(values) - {f.name for f in fields(cls)})
        if bad:
            raise ConfigError(f"run request: {name}.{bad[0]}: unknown field")
        given[name] = dict(values)
    net, model, layout, run, compute = (given[k] for k in ("network", "model", "layout", "run", "compute"))
    if "scenario" not in net:
        raise ConfigError("run request: network.scenario: missing")
    entry = systems.get(run.setdefault("system", RunSection.system))
    taken = entry.layout_fields | {"explicit"}
    extra = [k for k, v in layout.items() if k not in taken and v is not None and v != getattr(LayoutRequest, k)]
    if extra:
        raise ConfigError(f"layout.{extra[0]}: not a layout field --system {entry.name} takes "
                          f"(its flags: {', '.join(entry.flags) or 'none'})")
    run["options"] = entry.resolve_options(run.get("options") or {})
    run.setdefault("keepalive_s", default_keepalive(entry.name))
    run.setdefault("timeout_auto", "timeout_s" not in run)
    model.setdefault("dtype", "bf16" if run.get("device_type") == "cuda" else "fp32")
    compute.setdefault("dilate", bool(compute.get("model")) and "time_scale" not in compute
                       and net.get("mode", NetworkSection.mode) == "emulated")
    return RunRequest(network=NetworkSection(**net), model=ModelSection(**model), layout=LayoutRequest(**layout),
                      run=RunSection(**run), compute=ComputeSection(**compute), debug=DebugSection(**given["debug"]))
