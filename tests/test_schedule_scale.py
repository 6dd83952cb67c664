"""The scheduler at scale (issue 58): COMM-COST on link classes equals the device model's, and the
searches use it from LUMPED_FROM devices on."""
import itertools
import json

import numpy as np
import pytest

from harness.compute import c_dp_bytes, c_pp_bytes
from harness.compute.model import get_model
from harness.scenario import load_scenario
from harness.scheduler import cost_model, schedule
from harness.scheduler.cost import CostModel, open_loop_tsp
from harness.scheduler.iteration_cost import ComputeSetting, IterationModel
from harness.scheduler.lumped import LUMPED_FROM, LumpedCostModel, link_classes, path_2opt
from harness.scheduler.search import random_labels, to_partition


def _models(name, d_pp=8, devices=None, c_pp=8e6, c_dp=1e8):
    topo = load_scenario(name, devices)
    d_dp = topo.n // d_pp
    return topo, CostModel(topo, d_pp, d_dp, c_pp, c_dp), LumpedCostModel(topo, d_pp, d_dp, c_pp, c_dp)


@pytest.mark.parametrize("name", ["1", "2", "3", "4", "5", "hetero-regional"])
def test_lumped_comm_cost_equals_the_device_model(name):
    _, dev, lumped = _models(name)
    rng = np.random.default_rng(0)
    for _ in range(30):
        P = to_partition(random_labels(rng, dev.d_pp, dev.d_dp), dev.d_pp)
        W, _ = dev.coarsened_graph(P)
        K = lumped.counts(P).astype(float)
        Wl, _ = lumped.edges(K)
        assert np.array_equal(W, Wl)  # the same link values: bottlenecks are maxima, no rounding
        assert np.allclose(lumped.group_datap(K), dev.datap_cost_per_group(P), rtol=1e-12, atol=0)
        assert lumped.score(P)[0] == pytest.approx(dev.total(P), rel=1e-12)


def test_link_classes_merge_alike_regions_and_refuse_per_device_links():
    _, dev, lumped = _models("hetero-regional")
    assert lumped.classes == 4  # each US region's two GPU halves share every link: one class
    assert [len(set(lumped.device_class[r * 8:(r + 1) * 8])) for r in range(8)] == [1] * 8
    assert _models("5")[2].classes == 8 and _models("1")[2].classes == 8
    topo = load_scenario("5")
    delay = topo.delay_ms.copy()
    delay[0, 1] = delay[1, 0] = 99.0  # one pair of Oregon's devices differs from the rest
    odd = topo.with_device_links(delay_ms=delay)
    assert link_classes(CostModel(odd, 8, 8, 8e6, 1e8)) is None


def test_path_2opt_is_a_path_never_shorter_than_the_tsp():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 11))
        W = rng.integers(1, 30, (n, n)).astype(float)
        W = W + W.T
        np.fill_diagonal(W, 0)
        cost, path = path_2opt(W)
        assert sorted(path) == list(range(n))
        assert cost == pytest.approx(sum(W[path[k], path[k + 1]] for k in range(n - 1)))
        assert cost >= open_loop_tsp(W)[0] - 1e-9
    line = np.abs(np.subtract.outer(np.arange(9.0), np.arange(9.0)))  # points on a line: 2-opt finds the order
    assert path_2opt(line[np.ix_(p := rng.permutation(9), p)])[0] == 8.0


def test_staged_path_meets_every_bottleneck():
    topo, dev, lumped = _models("worldwide-1k", devices=256)
    rng = np.random.default_rng(2)
    for _ in range(5):
        P = to_partition(random_labels(rng, dev.d_pp, dev.d_dp), dev.d_pp)
        dp, pp, order, _ = lumped.path(P)
        staged = lumped.staged_on_path(P, order)
        assert sorted(staged.ravel()) == list(range(topo.n))
        assert [sorted(r) for r in staged] == [sorted(P[j]) for j in order]
        assert dev.pipeline_cost(staged.T) == pytest.approx(dp + pp, rel=1e-12)


def test_searches_lump_from_lumped_from_devices_and_cost_exactly():
    small, big = load_scenario("5"), load_scenario("worldwide-1k", 128)
    assert small.n < LUMPED_FROM <= big.n
    assert type(cost_model(small, 8, 8, 8e6, 1e8)) is CostModel  # the paper's sizes: today's model, as it was
    assert isinstance(cost_model(big, 8, 16, 8e6, 1e8), LumpedCostModel)
    cfg, batch = get_model("gpt3-xl"), 256
    c_pp, c_dp = c_pp_bytes(cfg, batch, 16, 2), c_dp_bytes(cfg, 8, 2)
    setting = ComputeSetting(cfg, batch, 1)
    for scheduler in ("ga", "ga-hetero"):
        a = schedule(big, 8, 16, c_pp, c_dp, scheduler=scheduler, budget=300, setting=setting)
        exact = CostModel(big, 8, 16, c_pp, c_dp)
        pipes = np.asarray(a.pipelines)
        assert sorted(pipes.ravel()) == list(range(big.n))
        assert a.cost["total"] == pytest.approx(exact.pipeline_cost(pipes), rel=1e-12)
        assert a.cost["total"] >= a.bound["total"] - 1e-9
        of = IterationModel(exact, setting).of_pipelines(pipes, stages=a.stages)
        assert a.model["iteration_s"] == pytest.approx(of.total, rel=1e-9)


# ---------------------------------------------------------------------------- the degrees planner
from harness.allocation import StageModel, allocate_if_it_fits  # noqa: E402
from harness.compute import micro_batches  # noqa: E402
from harness.scheduler.degrees import degree_options, memory_short, plan  # noqa: E402


@pytest.mark.parametrize("name", ["5", "hetero-regional"])
def test_memory_check_agrees_with_the_allocator(name):
    """An option fits (roomiest placement) exactly when the optimal allocator finds blocks within memory
    for the groups of the largest memories with the two largest at the ends."""
    topo, cfg = load_scenario(name), get_model("gpt3-xl")
    by_memory = np.argsort(-np.array([p.memory_gb for p in topo.profiles]), kind="stable")
    seen = set()
    for batch, d_pp, recompute in itertools.product((1024, 64), (1, 2, 4, 8, 16), (True, False)):
        d_dp = topo.n // d_pp
        sm = StageModel(cfg, topo, 1, micro_batches(batch, 1, d_dp), "fp16", recompute)
        groups = by_memory.reshape(d_pp, d_dp)
        orders = [[0]] if d_pp == 1 else [[0, *range(2, d_pp), 1], [1, *range(2, d_pp), 0]]
        fits = any(allocate_if_it_fits("optimal", sm, groups[o].T)[1] == 0 for o in orders)
        short = memory_short(sm, d_pp, d_dp)
        assert (short == 0) == fits, (d_pp, short)
        seen.add(fits)
        if len({p.memory_gb for p in topo.profiles}) == 1:
            assert memory_short(sm, d_pp, d_dp, any_placement=True) == short
    assert seen == {True, False}  # both outcomes occur: the check is not vacuous


def test_planner_searches_by_bound_and_keeps_the_fastest_plan_that_fits():
    topo, cfg = load_scenario("5"), get_model("gpt3-xl")
    p = plan(topo, cfg, 1024, budget=150)
    options = degree_options(topo, cfg, 1024)
    assert p.options == options and all(o.d_pp * o.d_dp == 64 and o.d_pp <= cfg.layers for o in options)
    assert {(o.d_pp, o.d_dp) for o in options} == {(1, 64), (2, 32), (4, 16), (8, 8), (16, 4)}
    fitting = [o for o, _, fits in p.searched if fits]
    best = min(t for _, t, fits in p.searched if fits)
    assert p.chosen in fitting and p.assignment.model["iteration_s"] == best
    assert p.assignment.model["fits_memory"] and (p.assignment.d_pp, p.assignment.d_dp) == (p.chosen.d_pp, p.chosen.d_dp)
    assert [o.bound_s for o, _, _ in p.searched] == sorted(o.bound_s for o, _, _ in p.searched)
    for o in options:  # an option left out either does not fit or cannot beat the plan chosen
        if o not in [s for s, _, _ in p.searched]:
            assert not o.fits or o.bound_s >= best
        assert o.bound_s <= min([t for s, t, _ in p.searched if s == o] or [np.inf]) + 1e-9


def test_planner_says_when_nothing_fits(cli):
    p = plan(load_scenario("5", 8), get_model("gpt3-xl"), 1024, budget=40)
    assert not any(o.fits for o in p.options)
    assert p.chosen == min(p.options, key=lambda o: o.bound_s) and not p.assignment.model["fits_memory"]
    rc, out, err = cli("schedule", "--scenario", "5", "--devices", "8", "--budget", "40", "--quiet")
    assert rc == 0, err
    assert "degrees by the planner" in out and "<- chosen" in out and "warning: no plan fits memory" in out
    assert "does not fit memory" in out
    rc, out, err = cli("schedule", "--scenario", "5", "--devices", "8", "--d-pp", "4", "--budget", "40", "--quiet")
    assert rc == 0 and "degrees by the planner" not in out and "D_PP=4 x D_DP=2" in out


# ---------------------------------------------------------------------------- the simulator at scale
from harness.layout import DEGREES, megatron_degrees  # noqa: E402


def test_megatron_grid_beyond_512_devices_scales_out_by_data_parallelism():
    paper = megatron_degrees(64)
    assert len(paper) == 10 and all(max(g) <= 8 and np.prod(g) == 64 for g in paper)  # App. D.2, unchanged
    big = megatron_degrees(1024)
    assert big and all(np.prod(g) == 1024 and g[0] in DEGREES and g[1] in DEGREES for g in big)
    assert (1, 8, 128) in big and len(big) == 16
    mid = megatron_degrees(256)  # beyond the paper's 64: its grid (only D_TP >= 4 here) and data parallelism
    assert set(g for g in itertools.product(DEGREES, repeat=3) if np.prod(g) == 256) < set(mid)
    assert (1, 8, 32) in mid and len(mid) == 16


def test_sim_at_scale_takes_the_planners_degrees_and_its_schedule(cli, tmp_path):
    out_json = tmp_path / "sim.json"
    # batch 2048: the planner's 4 x 32 fits memory with its blocks (optimal), not with even ones (5.3 GB over)
    rc, out, err = cli("sim", "--scenario", "worldwide-1k", "--devices", "128", "--system", "ours", "--budget", "60",
                       "--batch", "2048", "--no-cache", "--out", str(tmp_path / "run"), "--json", str(out_json))
    assert rc == 0, err
    assert "degrees by the planner: D_PP" in out and "its plan fits memory" in out
    assert "[memory: fits]" in out  # ours on the planner's degrees and blocks, as harness/layout/memory.py counts it
    (rec,) = [r for r in json.loads(out_json.read_text()) if r["system"] == "ours"]
    p = plan(load_scenario("worldwide-1k", 128), get_model("gpt3-xl"), 2048, budget=60, recompute=True)
    assert rec["config"]["pp"] == p.chosen.d_pp and rec["config"]["pipelines"] == p.assignment.pipelines
    assert rec["config"]["stages"] == p.assignment.layers[0] != [list(s) for s in layouts.even_stages(24, p.chosen.d_pp)]
    from harness.sim.sweep import Simulator

    sim = Simulator(load_scenario("worldwide-1k", 128), d_pp=p.chosen.d_pp, budget=60)
    assert sim.missing(get_model("gpt3-xl"), 2048) is not None
    sim.prime(get_model("gpt3-xl"), 2048, p.assignment.to_json())  # the planner's search is the sim's: not run again
    assert sim.missing(get_model("gpt3-xl"), 2048) is None
    other = Simulator(load_scenario("worldwide-1k", 128), d_pp=p.chosen.d_pp, budget=61)
    other.prime(get_model("gpt3-xl"), 2048, p.assignment.to_json())  # another budget: another search
    assert other.missing(get_model("gpt3-xl"), 2048) is not None


# ---------------------------------------------------------------------------- every system's memory
from harness import layout as layouts  # noqa: E402
from harness.layout.memory import memory_fit, stage_bytes  # noqa: E402


def test_layout_memory_counts_ours_as_harness_allocate_does():
    topo, cfg, batch = load_scenario("5"), get_model("gpt3-xl"), 256
    seen = set()
    for d_pp in (1, 2, 4, 8):
        d_dp = 64 // d_pp
        lay = layouts.in_rank_order(1, d_pp, d_dp, cfg.layers, schedule="gpipe", recompute=True)
        sm = StageModel(cfg, topo, 1, micro_batches(batch, 1, d_dp), "fp16", True)
        want = sm.block_memory[0] * np.array(lay.layers_per_stage, dtype=float)
        want[0] += sm.first_memory
        want[-1] += sm.last_memory
        assert np.allclose(stage_bytes(lay, cfg, batch, 1, 2), want, rtol=1e-12, atol=0)
        fit = memory_fit(lay, topo, cfg, batch, 1, 2)
        over = sm.problem(np.asarray(lay.pipelines)).overflow(lay.layers_per_stage)
        assert fit.fits == (over == 0) and fit.have_gb == (16.0,) * d_pp
        seen.add(fit.fits)
    assert seen == {True, False}


def test_layout_memory_of_tensor_parallelism_zero_and_1f1b():
    cfg, batch = get_model("gpt3-xl"), 1024
    base = stage_bytes(layouts.in_rank_order(1, 4, 16, cfg.layers), cfg, batch, 1, 2)  # 1F1B, no recompute
    gpipe = stage_bytes(layouts.in_rank_order(1, 4, 16, cfg.layers, schedule="gpipe"), cfg, batch, 1, 2)
    assert (gpipe > base).all()  # GPipe keeps all 64 micro-batches, 1F1B at most 4 - j
    tp2 = stage_bytes(layouts.in_rank_order(2, 4, 8, cfg.layers), cfg, batch, 1, 2)
    assert (tp2 < base).all()
    zero1 = stage_bytes(layouts.in_rank_order(1, 4, 16, cfg.layers, zero=1), cfg, batch, 1, 2)
    assert (zero1 < base).all() and (base - zero1 > 0).all()
    zero3 = stage_bytes(layouts.in_rank_order(1, 1, 64, cfg.layers, zero=3), cfg, batch, 1, 2)
    plain = stage_bytes(layouts.in_rank_order(1, 1, 64, cfg.layers), cfg, batch, 1, 2)
    assert zero3[0] < plain[0]
