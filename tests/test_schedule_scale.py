"""The scheduler at scale (issue 58): COMM-COST on link classes equals the device model's, and the
searches use it from LUMPED_FROM devices on."""
from dataclasses import replace

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
    odd = replace(topo, delay_ms=delay)
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
