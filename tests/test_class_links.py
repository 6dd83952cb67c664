"""Links held as classes (harness/scheduler/class_links.py) read as the device matrices do: the cost model,
the lower bound and the iteration model at scale give the device model's values without building them."""
import numpy as np
import pytest

from harness.compute.model import get_model
from harness.scenario import load_scenario
from harness.scheduler import bound, bound_classes
from harness.scenario.class_links import ClassLinks
from harness.scheduler.cost import CostModel
from harness.scheduler.iteration_cost import ComputeSetting, IterationModel
from harness.scheduler.lumped import LumpedCostModel
from harness.scheduler.search import random_labels, to_partition

CASES = [("5", None, 8), ("hetero-regional", None, 8), ("1", None, 4), ("worldwide-1k", 128, 8),
         ("hetero-worldwide-1k", 256, 16)]


def _pair(name, devices, d_pp, c_pp=8e6, c_dp=1e8):
    topo = load_scenario(name, devices)
    d_dp = topo.n // d_pp
    return CostModel(topo, d_pp, d_dp, c_pp, c_dp), LumpedCostModel(topo, d_pp, d_dp, c_pp, c_dp)


@pytest.mark.parametrize("name,devices,d_pp", CASES)
def test_class_links_are_the_device_matrices(name, devices, d_pp):
    dev, lumped = _pair(name, devices, d_pp)
    assert isinstance(lumped.pp_link, ClassLinks) and lumped.topo.region_links is not None
    every = np.arange(dev.topo.n)
    for got, want in ((lumped.pp_link, dev.pp_link), (lumped.dp_link, dev.dp_link)):
        assert np.array_equal(got[np.ix_(every, every)], want)  # the same arithmetic: equal, not close
        assert np.array_equal(got[every[:5]], want[:5]) and got[3, 3] == 0.0 and len(got) == len(want)
    G = to_partition(random_labels(np.random.default_rng(0), d_pp, dev.d_dp), d_pp)
    want = dev.dp_link[G[:, :, None], G[:, None, :]].sum(-1)
    assert np.allclose(lumped.dp_link.group_sums(G), want, rtol=1e-12, atol=0)
    rows = np.arange(0, dev.topo.n, 7)
    for d in (0, dev.topo.n - 1):
        want = np.abs(dev.pp_link[rows] - dev.pp_link[d]).sum(1)
        assert np.allclose(lumped.pp_link.row_distance(rows, d), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,devices,d_pp", CASES)
def test_the_bound_on_classes_is_the_bound_on_devices(name, devices, d_pp):
    dev, lumped = _pair(name, devices, d_pp)
    for k in (0, 1, dev.d_dp - 1, dev.topo.n - 1):
        assert np.allclose(bound._cheapest(lumped.dp_link, k), bound._cheapest(dev.dp_link, k), rtol=1e-12)
    dense = list(bound._thresholds(dev.pp_link))
    lumped_t = list(bound_classes.thresholds(lumped.pp_link))
    assert [v for _, v in lumped_t] == [v for _, v in dense]
    order = np.argsort(dev.dp_link + np.diag(np.full(dev.topo.n, np.inf)), axis=1)
    for (comp, _), (comp_l, _) in zip(dense, lumped_t):
        # the same components (labels may differ): equal labels on exactly the same pairs
        assert np.array_equal(comp[:, None] == comp[None, :], comp_l[:, None] == comp_l[None, :])
        want, got = bound._Ranked(dev.dp_link, order, comp), bound_classes.ClassRanked(lumped.dp_link, comp_l)
        sizes, sizes_l = np.bincount(comp), np.bincount(comp_l)
        for s in (1, 2, d_pp):
            for k in (1, dev.d_dp - 1):
                assert np.allclose(got.capped_sums(sizes_l // s, k), want.capped_sums(sizes // s, k), rtol=1e-12)
    b, bl = bound.comm_cost_bound(dev), bound.comm_cost_bound(lumped)
    assert bl.total == pytest.approx(b.total, rel=1e-12) and bl.dp == pytest.approx(b.dp, rel=1e-12)


@pytest.mark.parametrize("name,devices,d_pp", CASES[2:])
def test_the_iteration_model_on_classes_is_the_one_on_devices(name, devices, d_pp):
    dev, lumped = _pair(name, devices, d_pp)
    setting = ComputeSetting(get_model("gpt3-xl"), 1024, 1, "fp16", recompute=True)
    on_dev, on_classes = IterationModel(dev, setting), IterationModel(lumped, setting)
    rng = np.random.default_rng(1)
    for _ in range(3):
        P = to_partition(random_labels(rng, d_pp, dev.d_dp), d_pp)
        S = lumped.breakdown(P).pipelines
        a, b = on_dev.of_pipelines(S), on_classes.of_pipelines(S)
        assert (b.total, b.dp, b.pp) == pytest.approx((a.total, a.dp, a.pp), rel=1e-12)
        assert lumped.pipeline_cost(S) == pytest.approx(dev.pipeline_cost(S), rel=1e-12)
    assert bound.iteration_bound(on_classes).total == pytest.approx(bound.iteration_bound(on_dev).total, rel=1e-12)


@pytest.mark.parametrize("name,devices", [("worldwide-1k", 128), ("hetero-worldwide-1k", 256), ("1", None)])
def test_per_region_send_times_are_the_per_device_ones(name, devices):
    """The allocator's send times, computed on two devices of every region, are every pair's (TCP buffers
    sized by the largest round trip included)."""
    from harness.allocation import StageModel

    topo = load_scenario(name, devices)
    cfg = get_model("gpt3-xl")
    by_region = StageModel(cfg, topo, 1, 8, "fp16", True).send_seconds
    per_device = StageModel(cfg, topo.with_device_links(), 1, 8, "fp16", True).send_seconds
    assert isinstance(by_region, ClassLinks) and isinstance(per_device, np.ndarray)
    every = np.arange(topo.n)
    assert np.array_equal(by_region[np.ix_(every, every)], per_device)


def test_a_plan_at_ten_thousand_devices_builds_no_device_matrix():
    """worldwide-10k (8 regions x 1,280): the planner's degrees, a search, its bound and its allocation all
    on region links; the topology's device x device matrices (839 MB each) are never expanded."""
    from harness.scheduler.degrees import plan

    topo = load_scenario("worldwide-10k")
    assert topo.n == 10240 and topo.region_delay_ms.shape == (8, 8)
    p = plan(topo, get_model("gpt3-xl"), 1024, budget=60)
    a = p.assignment
    pipelines = np.array(a.pipelines)
    assert pipelines.shape == (a.d_dp, a.d_pp) and a.d_pp * a.d_dp == 10240
    assert sorted(pipelines.ravel().tolist()) == list(range(10240))  # every device once
    assert a.model["fits_memory"] and a.bound["total"] <= a.cost["total"]
    assert a.model["bound"]["total"] <= a.model["iteration_s"]
    assert "delay_ms" not in vars(topo) and "bandwidth_gbps" not in vars(topo)  # cached_property: never read


@pytest.mark.parametrize("name,devices,nic", [("worldwide-1k", 128, "shared"), ("hetero-regional", None, "shared"),
                                              ("2", None, "per-pair"), ("1", 8, "shared")])
def test_links_held_by_region_are_the_per_device_links(name, devices, nic):
    from harness.netmodel.links import Links

    topo = load_scenario(name, devices)
    held, dense = Links.from_topology(topo, "gloo", nic), Links.per_device(topo, "gloo", nic)
    assert isinstance(held.rate_Bps, ClassLinks) and isinstance(dense.rate_Bps, np.ndarray)
    every = np.arange(topo.n)
    assert np.array_equal(held.rate_Bps[np.ix_(every, every)], dense.rate_Bps)
    assert np.array_equal(held.delay_s[np.ix_(every, every)], dense.delay_s)
    assert np.array_equal(held.egress_Bps, dense.egress_Bps) and np.array_equal(held.ingress_Bps, dense.ingress_Bps)
    assert held.transport == dense.transport and held.protocol == dense.protocol


def test_pair_state_beyond_its_dense_size_keeps_only_the_pairs_set(monkeypatch):
    from harness.netmodel.links import PairState

    rng = np.random.default_rng(0)
    dense = PairState(50, -np.inf)
    monkeypatch.setattr(PairState, "DENSE_PAIRS", 100)
    sparse = PairState(50, -np.inf)
    assert dense.dense is not None and sparse.dense is None
    for _ in range(20):
        src, dst = rng.integers(0, 50, 7), rng.integers(0, 50, 7)
        v = rng.random(7)
        dense[src, dst] = v
        sparse[src, dst] = v
        a, b = rng.integers(0, 50, (2, 3, 4))
        assert np.array_equal(sparse[a, b], dense[a, b])
    assert sparse[3, 4] == dense[3, 4] and len(sparse.sparse) <= 140


def test_scenario_show_at_ten_thousand_devices_reads_the_region_links(tmp_path):
    from harness.report.scenario import scenario_summary, write_heatmaps

    topo = load_scenario("worldwide-10k")
    text = scenario_summary(topo)
    assert "10240 devices in 8 regions; one-way delay 5-238 ms, bandwidth 0.335-2 Gbps" in text
    assert all(p.stat().st_size > 0 for p in write_heatmaps(topo, tmp_path))
    assert "delay_ms" not in vars(topo) and "bandwidth_gbps" not in vars(topo)  # nothing expanded


def test_stage_matching_by_transport_is_the_least_sum_assignment_at_the_bottleneck():
    """From TRANSPORT_FROM replicas a stage's devices are matched by a transport on class counts: the same
    bottleneck and the same least sum as the assignment on the D_DP x D_DP block."""
    from harness.scheduler.lumped import TRANSPORT_FROM, _assignment

    topo = load_scenario("worldwide-1k")
    d_pp = topo.n // TRANSPORT_FROM
    lumped = LumpedCostModel(topo, d_pp, TRANSPORT_FROM, 8e6, 1e8)
    rng = np.random.default_rng(3)
    for _ in range(3):
        P = to_partition(random_labels(rng, d_pp, lumped.d_dp), d_pp)
        _, _, order, _ = lumped.path(P)
        staged = lumped.staged_on_path(P, order)
        assert sorted(staged.ravel().tolist()) == list(range(topo.n))
        W, _ = lumped.edges(lumped.counts(P).astype(float))
        for k in range(1, d_pp):
            assert sorted(staged[k].tolist()) == sorted(P[order[k]].tolist())
            links = lumped.pp_link[staged[k - 1], staged[k]]
            block = lumped.pp_link[staged[k - 1][:, None], staged[k][None, :]]
            best = block[np.arange(len(block)), _assignment(block, W[order[k - 1], order[k]])]
            assert links.max() == W[order[k - 1], order[k]] and links.sum() == pytest.approx(best.sum(), rel=1e-12)


def test_sim_says_when_a_system_has_no_layout(cli):
    """10,240 devices, batch 1024: Megatron's D_DP = 10,240 / (D_TP D_PP) holds a factor 5, the batch none."""
    rc, out, err = cli("sim", "--scenario", "worldwide-10k", "--system", "megatron", "--d-pp", "20", "--no-cache")
    assert rc == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("megatron")]
    assert "no layout" in line and "10,240 devices" in line and "batch 1024" in line
