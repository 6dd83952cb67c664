"""The paper's communication cost model (Yuan et al. 2022, eqs. 1-4), exactly.

A partition is an int array (D_PP, D_DP): row j is the data-parallel group C_j.
On the symmetrised graph G (mean of both directions), with alpha in seconds and
beta in bit/s:

  DATAP-COST(C_j)  = max_{d in C_j} sum_{d' in C_j - d} 2 (alpha + c_dp / (D_DP beta))   (eq. 2)
  DATAP-COST       = max_j DATAP-COST(C_j)
  edge(C_j, C_j')  = min over perfect matchings M of max_{(d,d') in M} 2 (alpha + c_pp / beta)  (eq. 3)
  PIPELINEP-COST   = open-loop TSP over the coarsened graph of those edges                (eq. 4)
  COMM-COST        = DATAP-COST + PIPELINEP-COST                                           (eq. 1)

The bottleneck matching is solved exactly as a min-sum assignment on weights
(D_DP + 1) ** rank, which makes one edge of a higher rank outweigh any D_DP edges of
lower ranks, so a min-sum matching minimises the maximum. The TSP is exact
(Held-Karp, vectorised per subset size) for D_PP <= 16.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..layout import LayoutError  # D_PP x D_DP does not match the devices, or a partition is malformed
from ..scenario import Topology

EXACT_TSP_MAX = 16




@dataclass(frozen=True)
class CommCost:
    """COMM-COST of a partition with what makes it up.

    partition[j][i] is the device of stage j (pipeline order) in replica i, and
    pipelines[i][j] the same device, so the full assignment sigma is explicit.
    """

    dp: float
    pp: float
    total: float
    partition: np.ndarray  # (D_PP, D_DP), rows in pipeline order, columns = replicas
    pipelines: np.ndarray  # (D_DP, D_PP) = partition.T
    stage_edges: tuple[float, ...]  # bottleneck matching cost between consecutive stages


class CostModel:
    """COMM-COST for one topology, layout and message sizes (bytes)."""

    def __init__(self, topo: Topology, d_pp: int, d_dp: int, c_pp_bytes: float, c_dp_bytes: float):
        if d_pp < 1 or d_dp < 1 or d_pp * d_dp != topo.n:
            raise LayoutError(f"{topo.source}: D_PP x D_DP = {d_pp} x {d_dp} must equal the {topo.n} devices")
        if c_pp_bytes < 0 or c_dp_bytes < 0:
            raise LayoutError(f"message sizes must be >= 0 (got c_pp={c_pp_bytes}, c_dp={c_dp_bytes})")
        self.topo, self.d_pp, self.d_dp = topo, d_pp, d_dp
        self.c_pp_bytes, self.c_dp_bytes = float(c_pp_bytes), float(c_dp_bytes)
        self.pp_link, self.dp_link = self._link_matrices()
        self._iu = np.triu_indices(d_pp, 1)
        self._base = float(d_dp + 1)
        # Rank weights stay exact while base ** -(D_DP^2) does not underflow (D_DP <= 24).
        self._rank_weights = (d_dp * d_dp - 1) * np.log(self._base) < 700

    def _link_matrices(self):
        """(pp_link, dp_link): eq. 3's and eq. 2's cost of every device pair, 0 on the diagonal."""
        pp, dp = link_costs(*self.topo.symmetric(), self.d_dp, self.c_pp_bytes, self.c_dp_bytes)
        np.fill_diagonal(pp, 0.0)
        np.fill_diagonal(dp, 0.0)
        return pp, dp

    def with_messages(self, c_pp_bytes: float, c_dp_bytes: float) -> "CostModel":
        """The same model with other message sizes (the bound's least and largest stages)."""
        return CostModel(self.topo, self.d_pp, self.d_dp, c_pp_bytes, c_dp_bytes)

    # --- eq. 2 -----------------------------------------------------------------
    def datap_cost(self, partition: np.ndarray) -> float:
        P = np.asarray(partition)
        return float(self.dp_link[P[:, :, None], P[:, None, :]].sum(-1).max())

    def datap_cost_per_group(self, partition: np.ndarray) -> np.ndarray:
        P = np.asarray(partition)
        return self.dp_link[P[:, :, None], P[:, None, :]].sum(-1).max(-1)

    # --- eq. 3 -----------------------------------------------------------------
    def coarsened_graph(self, partition: np.ndarray, mean_out: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """(D_PP, D_PP) bottleneck-matching costs and the matchings (col index per row) for j < j'.

        If `mean_out` (D_PP, D_PP) is given, it receives the mean link cost of each matching."""
        P = np.asarray(partition)
        a, b = self._iu
        if not len(a):  # one stage: no pipeline edges
            return np.zeros((self.d_pp, self.d_pp)), {}
        blocks = self.pp_link[P[a][:, :, None], P[b][:, None, :]]  # (pairs, D_DP, D_DP)
        if self._rank_weights:
            flat = blocks.reshape(len(a), -1)
            ranks = flat.argsort(1).argsort(1)
            weights = self._base ** (ranks - ranks.shape[1] + 1.0)  # scaled to <= 1, ordering kept
            weights = weights.reshape(blocks.shape)
        W = np.zeros((self.d_pp, self.d_pp))
        matchings = {}
        rows = np.arange(self.d_dp)
        for k in range(len(a)):
            if self._rank_weights:
                _, cols = linear_sum_assignment(weights[k])
            else:
                cols = bottleneck_matching(blocks[k])
            links = blocks[k, rows, cols]
            W[a[k], b[k]] = W[b[k], a[k]] = links.max()
            if mean_out is not None:
                mean_out[a[k], b[k]] = mean_out[b[k], a[k]] = links.mean()
            matchings[(int(a[k]), int(b[k]))] = cols
        return W, matchings

    # --- eqs. 4 and 1 --------------------------------------------------------------
    def total(self, partition: np.ndarray) -> float:
        W, _ = self.coarsened_graph(partition)
        return self.datap_cost(partition) + open_loop_tsp(W)[0]

    def score(self, partition: np.ndarray) -> tuple[float, float]:
        """(COMM-COST, a smooth tie-breaker) for search.

        COMM-COST is flat over wide plateaus (a bottleneck matching only improves when its
        last slow pair goes), so searches break ties by the same quantities averaged instead
        of maximised: the open-loop TSP over mean matched-link costs plus the mean group DP cost.
        """
        mean = np.zeros((self.d_pp, self.d_pp))
        W, _ = self.coarsened_graph(partition, mean)
        pp, _ = open_loop_tsp(W)
        per_group = self.datap_cost_per_group(partition)
        smooth = open_loop_tsp(mean)[0] + per_group.mean()
        return float(per_group.max() + pp), float(smooth)

    def breakdown(self, partition: np.ndarray) -> CommCost:
        P = self.check_partition(partition)
        dp = self.datap_cost(P)
        W, matchings = self.coarsened_graph(P)
        pp, order = open_loop_tsp(W)
        staged = self.staged(P, order, matchings)
        edges = tuple(float(W[order[k - 1], order[k]]) for k in range(1, self.d_pp))
        return CommCost(dp=dp, pp=pp, total=dp + pp, partition=staged, pipelines=staged.T.copy(), stage_edges=edges)

    def staged(self, P: np.ndarray, order: list[int], matchings: dict) -> np.ndarray:
        """Rows of `P` in pipeline `order`, each row's columns permuted so that column i is replica i:
        follows the matchings along the order to name every tasklet's device."""
        staged = np.empty_like(P)
        staged[0] = P[order[0]]
        pos = np.arange(self.d_dp)  # column in group order[k] of each replica
        for k in range(1, self.d_pp):
            u, v = order[k - 1], order[k]
            if u < v:
                pos = matchings[(u, v)][pos]
            else:
                inv = np.empty(self.d_dp, dtype=int)
                inv[matchings[(v, u)]] = np.arange(self.d_dp)
                pos = inv[pos]
            staged[k] = P[v][pos]
        return staged

    def check_partition(self, partition) -> np.ndarray:
        P = np.asarray(partition, dtype=int)
        if P.shape != (self.d_pp, self.d_dp):
            raise LayoutError(f"partition shape {P.shape} != (D_PP, D_DP) = ({self.d_pp}, {self.d_dp})")
        if sorted(P.ravel().tolist()) != list(range(self.topo.n)):
            raise LayoutError(f"partition must use every device 0..{self.topo.n - 1} exactly once")
        return P

    def pipeline_cost(self, pipelines: np.ndarray) -> float:
        """Cost of a fixed assignment (no re-matching, no re-ordering): dp + sum over stages of the
        slowest replica link. Equals breakdown().total for the assignment breakdown() returns."""
        S = np.asarray(pipelines).T  # (D_PP, D_DP)
        pp = sum(float(self.pp_link[S[k], S[k + 1]].max()) for k in range(self.d_pp - 1))
        return self.datap_cost(S) + pp


def link_costs(delay_s, bw_bps, d_dp: int, c_pp_bytes: float, c_dp_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """2 (alpha + c_pp / beta) and 2 (alpha + c_dp / (D_DP beta)) elementwise, on symmetric delay (s) and
    bandwidth (bit/s) matrices of devices or of regions (the same arithmetic: equal values)."""
    with np.errstate(divide="ignore"):
        return (2 * (delay_s + c_pp_bytes * 8 / bw_bps),  # eq. 3 per pair
                2 * (delay_s + c_dp_bytes * 8 / (d_dp * bw_bps)))  # eq. 2 per pair


def bottleneck_matching(M: np.ndarray) -> np.ndarray:
    """Perfect matching minimising the largest entry: binary search on the threshold,
    perfect-matching test by Hopcroft-Karp. Returns the column of every row."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    values = np.unique(M)
    lo, hi = 0, len(values) - 1
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        match = maximum_bipartite_matching(csr_matrix(M <= values[mid]), perm_type="column")
        if (match >= 0).all():
            best, hi = match, mid - 1
        else:
            lo = mid + 1
    return np.asarray(best)


@lru_cache(maxsize=None)
def _held_karp_layers(n: int):
    """Index tables per subset size: (mask, last, mask without last) for every last in mask."""
    layers = []
    masks = np.arange(1 << n)
    pop = np.array([bin(m).count("1") for m in range(1 << n)])
    for k in range(2, n + 1):
        ms = masks[pop == k]
        bits = (ms[:, None] >> np.arange(n)) & 1
        mi, last = np.nonzero(bits)
        m = ms[mi]
        layers.append((m, last, m ^ (1 << last)))
    return layers


def open_loop_tsp(W: np.ndarray) -> tuple[float, list[int]]:
    """Shortest Hamiltonian path (any start, any end) over a symmetric cost matrix.

    Exact (Held-Karp) for n <= 16; beyond, nearest-neighbour from every start plus 2-opt.
    """
    W = np.asarray(W, dtype=float)
    n = len(W)
    if n == 1:
        return 0.0, [0]
    if n > EXACT_TSP_MAX:
        return _tsp_heuristic(W)
    dp = np.full((1 << n, n), np.inf)
    parent = np.full((1 << n, n), -1, dtype=np.int64)
    dp[1 << np.arange(n), np.arange(n)] = 0.0
    for m, last, prev in _held_karp_layers(n):
        cand = dp[prev] + W[:, last].T  # cand[r, p] = dp[prev_r, p] + W[p, last_r]
        best = cand.argmin(1)
        dp[m, last] = cand[np.arange(len(m)), best]
        parent[m, last] = best
    full = (1 << n) - 1
    end = int(dp[full].argmin())
    cost = float(dp[full, end])
    order, mask = [end], full
    while parent[mask, order[-1]] >= 0:
        p = int(parent[mask, order[-1]])
        mask ^= 1 << order[-1]
        order.append(p)
    return cost, order[::-1]


def _tsp_heuristic(W: np.ndarray) -> tuple[float, list[int]]:
    n = len(W)
    best = (np.inf, [])
    for s in range(n):
        path, left = [s], set(range(n)) - {s}
        while left:
            nxt = min(left, key=lambda v: W[path[-1], v])
            path.append(nxt)
            left.remove(nxt)
        improved = True
        while improved:
            improved = False
            for i in range(n - 1):
                for j in range(i + 2, n):
                    before = W[path[i], path[i + 1]] + (W[path[j], path[j + 1]] if j + 1 < n else 0)
                    after = W[path[i], path[j]] + (W[path[i + 1], path[j + 1]] if j + 1 < n else 0)
                    if after < before - 1e-12:
                        path[i + 1 : j + 1] = path[i + 1 : j + 1][::-1]
                        improved = True
        cost = sum(W[path[k], path[k + 1]] for k in range(n - 1))
        if cost < best[0]:
            best = (float(cost), path)
    return best
