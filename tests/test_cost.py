"""The cost model against brute force and hand-worked examples."""
import itertools

import numpy as np
import pytest

from harness.scheduler.cost import CostModel, LayoutError, bottleneck_matching, open_loop_tsp
from harness.scenario import load_scenario

from .conftest import make_topology, random_topology


def brute_bottleneck(M):
    n = len(M)
    return min(max(M[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))


def brute_open_tsp(W):
    n = len(W)
    return min(sum(W[p[k], p[k + 1]] for k in range(n - 1)) for p in itertools.permutations(range(n)))


@pytest.mark.parametrize("seed", range(20))
def test_bottleneck_matching_is_exact(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    M = rng.integers(0, 6, (n, n)).astype(float)  # small integers: many ties
    cols = bottleneck_matching(M)
    assert sorted(cols) == list(range(n))
    assert M[np.arange(n), cols].max() == brute_bottleneck(M)


@pytest.mark.parametrize("seed", range(20))
def test_open_loop_tsp_is_exact(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    A = rng.uniform(0, 10, (n, n))
    W = A + A.T
    np.fill_diagonal(W, 0)
    cost, order = open_loop_tsp(W)
    assert sorted(order) == list(range(n))
    assert cost == pytest.approx(sum(W[order[k], order[k + 1]] for k in range(n - 1)))
    assert cost == pytest.approx(brute_open_tsp(W) if n > 1 else 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_coarsened_graph_edges_are_bottleneck_matchings(seed):
    topo = random_topology(12, seed)
    cm = CostModel(topo, 3, 4, c_pp_bytes=1e8, c_dp_bytes=5e7)
    P = np.random.default_rng(seed).permutation(12).reshape(3, 4)
    W, matchings = cm.coarsened_graph(P)
    for a, b in itertools.combinations(range(3), 2):
        M = cm.pp_link[np.ix_(P[a], P[b])]
        assert W[a, b] == pytest.approx(brute_bottleneck(M))
        assert M[np.arange(4), matchings[(a, b)]].max() == pytest.approx(W[a, b])


def test_rank_weights_and_threshold_search_agree():
    topo = random_topology(16, 3)
    cm = CostModel(topo, 2, 8, 1e8, 1e8)
    P = np.random.default_rng(0).permutation(16).reshape(2, 8)
    W, _ = cm.coarsened_graph(P)
    M = cm.pp_link[np.ix_(P[0], P[1])]
    assert W[0, 1] == pytest.approx(M[np.arange(8), bottleneck_matching(M)].max())


def test_hand_worked_example():
    # 4 devices, D_PP = 2 stages x D_DP = 2 replicas. Groups C_0 = {0, 1}, C_1 = {2, 3}.
    # Symmetric links: delay 10 ms everywhere; bandwidth 1 Gbps except 0-2 and 1-3 at 8 Gbps.
    d = np.full((4, 4), 10.0)
    b = np.full((4, 4), 1.0)
    b[0, 2] = b[2, 0] = b[1, 3] = b[3, 1] = 8.0
    topo = make_topology(d, b)
    c_pp, c_dp = 1e9, 5e8  # bytes
    cm = CostModel(topo, 2, 2, c_pp, c_dp)
    out = cm.breakdown([[0, 1], [2, 3]])
    # eq. 2: each device has one peer at 1 Gbps: 2 * (0.01 + 5e8 * 8 / (2 * 1e9)) = 4.02 s
    assert out.dp == pytest.approx(4.02)
    # eq. 3: match 0-2 and 1-3 (8 Gbps): 2 * (0.01 + 8e9 / 8e9) = 2.02 s; one edge, so eq. 4 = 2.02 s
    assert out.pp == pytest.approx(2.02)
    assert out.total == pytest.approx(6.04)
    assert sorted(map(sorted, out.pipelines.tolist())) == [[0, 2], [1, 3]]
    # The other grouping keeps the fast links inside groups: DP gets cheap, PP pays 1 Gbps.
    other = cm.breakdown([[0, 2], [1, 3]])
    assert other.dp == pytest.approx(2 * (0.01 + 5e8 * 8 / (2 * 8e9)))
    assert other.pp == pytest.approx(2 * (0.01 + 8.0))


def test_breakdown_expands_to_a_consistent_assignment():
    topo = load_scenario("5")
    cm = CostModel(topo, 8, 8, 1.07e9, 5.2e8)
    P = np.random.default_rng(1).permutation(64).reshape(8, 8)
    out = cm.breakdown(P)
    assert sorted(out.pipelines.ravel()) == list(range(64))
    assert {frozenset(r) for r in out.partition.tolist()} == {frozenset(r) for r in P.tolist()}
    assert cm.pipeline_cost(out.pipelines) == pytest.approx(out.total)
    assert cm.total(P) == pytest.approx(out.total) and cm.score(P)[0] == pytest.approx(out.total)
    assert out.total == pytest.approx(out.dp + out.pp) and len(out.stage_edges) == 7


def test_slower_links_never_cost_less():
    topo = random_topology(8, 5)
    slow = make_topology(topo.delay_ms * 2, topo.bandwidth_gbps / 2)
    P = np.arange(8).reshape(4, 2)
    assert CostModel(slow, 4, 2, 1e8, 1e8).total(P) > CostModel(topo, 4, 2, 1e8, 1e8).total(P)


def test_layout_must_match_devices():
    with pytest.raises(LayoutError, match="3 x 3 must equal the 8 devices"):
        CostModel(random_topology(8, 0), 3, 3, 1.0, 1.0)
    cm = CostModel(random_topology(4, 0), 2, 2, 1.0, 1.0)
    with pytest.raises(LayoutError, match="every device"):
        cm.breakdown([[0, 0], [1, 2]])
