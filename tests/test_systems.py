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
    """A toy system in a few lines: its layout rule, its rank function, its simulator model and two options of its
    own (a low-communication trainer's knobs: how often the replicas meet, what each one adds)."""
    from harness.plan.arg_types import positive_float, positive_int
    from harness.systems.baselines.sim import simulate_runtime_of_layout

    def every_device_a_replica(req, topo):
        return layouts.in_rank_order(1, 1, topo.n, req.model.cfg.layers), None

    def train(ctx, spec):
        every, weight = spec.run.options["all_reduce_every"], spec.run.options["weight"]
        out = []
        for i in range(spec.run.warmup + spec.run.iters):
            t0 = time.monotonic()
            total = torch.tensor([(ctx.rank + 1) * weight])
            if (i + 1) % every == 0:
                dist.all_reduce(total)
            out.append(IterationStats(time.monotonic() - t0, 0.0, time.monotonic() - t0, float(total)))
        return out[spec.run.warmup:]

    def simulate(links, profiles, cfg, batch, lay, mb, bpv, options):
        """The data-parallel runtime's iteration, its gradient exchange paid once every all_reduce_every iterations."""
        seconds, compute = simulate_runtime_of_layout(links, profiles, cfg, batch, lay, mb, bpv)
        return compute + (seconds - compute) / options["all_reduce_every"], compute

    registry.register(registry.System(
        "toy-dp", "every device a data-parallel replica", train=train, layout_rule=every_device_a_replica,
        simulate_layout=simulate,
        options=(registry.Option("all_reduce_every", positive_int, "all-reduce every N iterations", default=1),
                 registry.Option("weight", positive_float, "what every rank adds", default=1.0))))


TOY_RUN = ["--scenario", "3", "--devices", "4", "--layers", "2", "--batch", "8"]


def _spec(root: Path) -> dict:
    return json.loads(next(root.rglob("manifest.json")).read_text())["spec"]


def test_a_toy_system_with_options_of_its_own_runs_and_simulates_without_touching_any_other_module(
        registry, cli, tmp_path):
    _toy(registry)
    rc, out, err = cli("run", "--system", "toy-dp", *TOY_RUN, "--network", "none", "--iters", "2", "--warmup", "0",
                       "--results", tmp_path / "runs")
    assert rc == 0, err
    rows = read_records(next((tmp_path / "runs").rglob("records.csv")))
    assert [r["system"] for r in rows] == ["toy-dp", "toy-dp"]
    assert {(r["d_pp"], r["d_dp"], r["devices"]) for r in rows} == {(1, 4, 4)}
    assert {r["loss"] for r in rows} == {1.0 + 2 + 3 + 4}  # the all-reduce ran on all four ranks
    assert json.loads(rows[0]["config"])["mesh"] == [[[0], [1], [2], [3]]]
    assert _spec(tmp_path / "runs")["run"]["options"] == {"all_reduce_every": 1, "weight": 1.0}  # its defaults
    # its options reach every rank: weight 0.5, the replicas meet every second iteration only
    rc, out, err = cli("run", "--system", "toy-dp", *TOY_RUN, "--network", "none", "--iters", "2", "--warmup", "0",
                       "--all-reduce-every", "2", "--weight", "0.5", "--results", tmp_path / "runs2")
    assert rc == 0, err
    rows = read_records(next((tmp_path / "runs2").rglob("records.csv")))
    assert [r["loss"] for r in rows] == [0.5 * (1 + 2 + 3 + 4) / 4, 0.5 * (1 + 2 + 3 + 4)]  # the ranks' mean, then the sum
    assert _spec(tmp_path / "runs2")["run"]["options"] == {"all_reduce_every": 2, "weight": 0.5}
    from harness.sim.compare import load_measured, simulate_record

    # sim compare holds the run against its model at the run's options
    rec = load_measured(tmp_path / "runs2")[0]
    assert json.loads(rec["options"]) == {"all_reduce_every": 2, "weight": 0.5}
    every_run = simulate_record({**rec, "options": json.dumps({"all_reduce_every": 1})})
    assert simulate_record(rec) < every_run

    seconds = {}
    for every in ("1", "4"):
        rc, out, err = cli("sim", "--system", "toy-dp", *TOY_RUN, "--model", "tiny", "--no-cache",
                           "--all-reduce-every", every, "--json", tmp_path / "sim.json", "--out", tmp_path / "sim")
        assert rc == 0, err
        docs = json.loads((tmp_path / "sim.json").read_text())
        assert [(d["system"], d["d_pp"], d["d_dp"], d["best"]) for d in docs] == [("toy-dp", 1, 4, True)]
        assert docs[0]["seconds"] > docs[0]["compute_seconds"] > 0  # a gradient all-reduce over the links
        assert "\ntoy-dp " in out
        seconds[every] = docs[0]["seconds"] - docs[0]["compute_seconds"]
    assert seconds["4"] == pytest.approx(seconds["1"] / 4)  # its model read the option


def test_flags_and_help_come_from_the_registry(registry, cli):
    _toy(registry)
    rc, out, err = cli("run", "--system", "toy-dp", *TOY_RUN, "--network", "none", "--d-pp", "2")
    assert rc == 2 and err.strip() == "harness: error: --d-pp: not an option of --system toy-dp (it takes no layout flags)"
    # a system's own options: refused on another system, their type checked by the flag, in --help with their owner
    for command, *where in (("run", "--network", "none"), ("sim", "--no-cache")):
        rc, out, err = cli(command, "--system", "ours", *TOY_RUN, *where, "--all-reduce-every", "2")
        assert rc == 2 and err.strip() == ("harness: error: --all-reduce-every: not an option of --system ours "
                                           "(its own: --dp-compress)"), err
        rc, out, err = cli(command, "--system", "toy-dp", *TOY_RUN, *where, "--weight", "-1")
        assert rc == 2 and "--weight" in err and err.count("\n") == 1, err
        rc, out, err = cli(command, "--help")
        assert "toy-dp: all-reduce every N iterations (default 1)" in " ".join(out.split())
    # a system without a simulator model: `harness sim` says so, rather than simulate another system's runtime
    registry.register(registry.System("toy-unmodelled", "x", train=print,
                                      layout_rule=registry.get("toy-dp").layout_rule))
    rc, out, err = cli("sim", "--system", "toy-unmodelled", *TOY_RUN, "--no-cache")
    assert rc == 2 and err.strip() == ("harness: error: --system toy-unmodelled: no simulator model (its registry "
                                       "entry gives no simulate_layout), so nothing predicts its runs"), err
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
        for getter in (s.train_fn, s.layout_rule_fn, s.simulate_fn, s.record_layout_fn, s.tune_grid_fn):
            assert getter() is None or callable(getter())
        if s.simulate_layout is None:  # a system without a model says so (one line), borrowing none
            with pytest.raises(HarnessError, match=f"--system {s.name}: no simulator model"):
                s.simulate_layout_fn()
        else:
            assert callable(s.simulate_layout_fn())


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
