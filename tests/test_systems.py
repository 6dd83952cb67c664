"""The system registry: a system is one entry; `harness run`, `harness sim` and `--help` look it up there."""
from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import layout as layouts
from harness.plan import systems
from harness.errors import HarnessError
from harness.results import read_records
from harness.train.stats import IterationStats

pytestmark = pytest.mark.timeout(180)
HARNESS = Path(systems.__file__).parents[1]


@pytest.fixture
def registry(monkeypatch):
    """The registry as a copy, so a test's entries are gone after it (forked ranks inherit it)."""
    monkeypatch.setattr(systems, "SYSTEMS", dict(systems.registered()))
    return systems


def _toy(registry) -> None:
    """A toy system in a few lines: its layout rule and its rank function, nothing else."""

    def every_device_a_replica(req, topo):
        return layouts.in_rank_order(1, 1, topo.n, req.model.cfg.layers), None

    def train(ctx, spec):
        out = []
        for _ in range(spec.run.warmup + spec.run.iters):
            t0 = time.monotonic()
            total = torch.tensor([float(ctx.rank + 1)])
            dist.all_reduce(total)
            out.append(IterationStats(time.monotonic() - t0, 0.0, time.monotonic() - t0, float(total)))
        return out[spec.run.warmup:]

    registry.register(registry.System("toy-dp", "every device a data-parallel replica", train=train,
                                      layout_rule=every_device_a_replica))


TOY_RUN = ["--scenario", "3", "--devices", "4", "--layers", "2", "--batch", "8"]


def test_a_toy_system_runs_and_simulates_without_touching_any_other_module(registry, cli, tmp_path):
    _toy(registry)
    rc, out, err = cli("run", "--system", "toy-dp", *TOY_RUN, "--network", "none", "--iters", "2", "--warmup", "0",
                       "--results", tmp_path / "runs")
    assert rc == 0, err
    rows = read_records(next((tmp_path / "runs").rglob("records.csv")))
    assert [r["system"] for r in rows] == ["toy-dp", "toy-dp"]
    assert {(r["d_pp"], r["d_dp"], r["devices"]) for r in rows} == {(1, 4, 4)}
    assert {r["loss"] for r in rows} == {1.0 + 2 + 3 + 4}  # the all-reduce ran on all four ranks
    assert json.loads(rows[0]["config"])["mesh"] == [[[0], [1], [2], [3]]]

    rc, out, err = cli("sim", "--system", "toy-dp", *TOY_RUN, "--model", "tiny", "--no-cache",
                       "--json", tmp_path / "sim.json", "--out", tmp_path / "sim")
    assert rc == 0, err
    docs = json.loads((tmp_path / "sim.json").read_text())
    assert [(d["system"], d["d_pp"], d["d_dp"], d["best"]) for d in docs] == [("toy-dp", 1, 4, True)]
    assert docs[0]["seconds"] > docs[0]["compute_seconds"] > 0  # a gradient all-reduce over the links
    assert "\ntoy-dp " in out


def test_flags_and_help_come_from_the_registry(registry, cli):
    _toy(registry)
    rc, out, err = cli("run", "--system", "toy-dp", *TOY_RUN, "--network", "none", "--d-pp", "2")
    assert rc == 2 and err.strip() == "harness: error: --d-pp: not an option of --system toy-dp (it takes no layout flags)"
    rc, out, err = cli("run", "--system", "ours", *TOY_RUN, "--network", "none", "--tp", "2")
    assert rc == 2 and "--tp: not an option of --system ours (it takes --d-pp, --d-dp" in err and err.count("\n") == 1
    rc, out, err = cli("run", "--system", "nope", *TOY_RUN, "--network", "none")
    assert rc == 2 and "--system: unknown system 'nope' (known: ours, ours-random, megatron, deepspeed" in err
    rc, out, err = cli("run", "--help")
    text = "".join(out.split())  # argparse wraps lines, also at hyphens
    assert rc == 0
    for s in registry.registered().values():
        assert "".join(f"{s.name}: {s.summary}".split()) in text


def test_an_entry_names_only_flags_that_exist_and_roles_of_the_paper():
    with pytest.raises(HarnessError, match="unknown flag '--pipeline'"):
        systems.System("x", "x", train=print, flags=("--pipeline",))
    with pytest.raises(HarnessError, match="two of its flags set the same layout field"):
        systems.System("x", "x", train=print, flags=("--pp", "--d-pp"))
    with pytest.raises(HarnessError, match="paper_role and report_role must be one of"):
        systems.System("x", "x", train=print, paper_role="hetpipe")
    assert systems.paper_systems() == {r: r for r in systems.PAPER_ROLES}


def test_a_systems_colour_comes_from_its_entry(registry):
    from harness.plots import series_style

    registry.register(registry.System("toy-styled", "x", train=print, style=("#123456", "D")))
    assert series_style("toy-styled") == ("#123456", "D")
    assert series_style("ours") == registry.get("ours").style
    assert series_style("case 1") == (None, "o")  # not a system: matplotlib's colours
    assert len({s.style for s in systems.registered().values() if s.style}) == len([s for s in systems.registered().values()
                                                                                 if s.style])


def test_every_reference_of_the_built_in_entries_imports():
    for s in systems.registered().values():
        for workload in s.simulate:
            assert callable(s.simulate_fn(workload))
        for getter in (s.train_fn, s.layout_rule_fn, s.simulate_fn, s.simulate_layout_fn, s.record_layout_fn,
                       s.tune_grid_fn):
            assert getter() is None or callable(getter())


def _name_comparisons(path: Path, names: set[str]) -> list[str]:
    """`x == "ours"`, `x in ("megatron", ...)` and the like: comparisons with a system's name."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                hits.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}")
    return hits


def test_no_code_outside_the_registry_compares_a_system_name(tmp_path):
    names = set(systems.registered())
    hits = [h for p in sorted(HARNESS.rglob("*.py")) if p != Path(systems.__file__)
            for h in _name_comparisons(p, names)]
    assert hits == []
    switch = HARNESS.parent / "tests" / "_switch_probe.py"  # the check finds a switch where there is one
    try:
        switch.write_text('def f(s):\n    return s == "ours" or s in ("megatron", "x") or "deepspeed" != s\n')
        assert _name_comparisons(switch, names) == ["tests/_switch_probe.py:2"] * 3
    finally:
        switch.unlink()
