"""COMM-COST on link classes: the search's objective at scale, computed on counts, not devices.

Devices whose links are alike (the same cost to every other device, and among themselves the same
intra cost: a region, or regions joined by links equal to their own) are interchangeable for the cost
model, so a group C_j is what it holds of each class: a count vector K[j] over C classes. On counts
(Yuan et al. 2022, eqs. 2-4, as harness/scheduler/cost.py):

  DATAP-COST(C_j)  = max over classes c in C_j of  sum_c' K[j, c'] L_dp[c, c'] - L_dp[c, c]
  edge(C_j, C_j')  = the least link value t at which the class graph {L_pp <= t} holds a perfect
                     b-matching of K[j] to K[j'], by Hall's condition: every set S of classes in
                     C_j has at least |S| partners in the classes its links below t reach
  PIPELINEP-COST   = the open-loop TSP over those edges: exact (cost.open_loop_tsp) up to
                     SEARCH_EXACT_TSP_MAX stages; beyond, where Held-Karp costs 30-70 ms a candidate,
                     the best 2-opt path of the cheapest nearest-neighbour ones (path_2opt)

These are the device model's values (the same maxima and sums, summed in another order: equal to
rounding, tests/test_schedule_scale.py), at a cost that grows with D_PP and C, not with D_DP: a
1,024-device case-5 candidate costs about 1 ms instead of 0.3 s. Edges and group costs are cached
by their count vectors: a local-search swap changes two groups, so most of a candidate's edges were
seen before; the path is cached on its edge matrix, which takes few values.

The tie-breaker (CostModel.score's averaged terms) is the same in kind with one change: each
matching's mean link is that of the cheapest-first transport of K[j] to K[j'] (the device model's
is the mean of its lexicographic bottleneck matching), and the path is the bottleneck path, not a
second TSP over the means. Search at scale therefore ranks ties slightly differently from the
device model; the returned assignment is expanded and costed by the device model (`breakdown`).
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from scipy.optimize import linear_sum_assignment, linprog

from ..scenario.class_links import ClassLinks
from .cost import CommCost, CostModel, link_costs, open_loop_tsp

LUMPED_FROM = 128  # devices from which the schedulers search on link classes (the paper's cases stop at 64)
MAX_CLASSES = 12  # Hall's condition enumerates the 2^C sets of classes; beyond, the device model
CACHE_MAX = 1 << 20  # entries kept per cache before it is cleared
SEARCH_EXACT_TSP_MAX = 12  # stages up to which the search's path is the exact TSP; beyond, 2-opt (path_2opt)
TWO_OPT_STARTS = 8  # nearest-neighbour paths that 2-opt improves, the cheapest first
TRANSPORT_FROM = 512  # replicas from which a stage's matching is a transport on class counts (HiGHS), not an
# assignment on the D_DP x D_DP block (measured on case 5's classes: 0.2 ms at 128 replicas, 0.5 at 256, 4 at 512,
# 5.4 at 1,024 and growing with D_DP^2 memory; the transport 1.5-2 ms at any size)


def group_links(pp_link, dp_link, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pp, dp) link values between the groups of devices labelled 0..G-1 by `group`: any device pair of
    two groups; on the diagonal two distinct devices of the group (0 where it has one device)."""
    G = int(group.max()) + 1
    members = [np.flatnonzero(group == g) for g in range(G)]
    first = np.array([m[0] for m in members])
    pp, dp = pp_link[np.ix_(first, first)].copy(), dp_link[np.ix_(first, first)].copy()
    for g, m in enumerate(members):
        pp[g, g], dp[g, g] = (pp_link[m[0], m[1]], dp_link[m[0], m[1]]) if len(m) > 1 else (0.0, 0.0)
    return pp, dp


def link_classes(model: CostModel) -> np.ndarray | None:
    """Class of every device (0..C-1, in order of first device), or None when the links do not lump
    into at most MAX_CLASSES classes (per-device links: the device model is the only exact one)."""
    return _device_classes(model.topo, model.pp_link, model.dp_link)


def _device_classes(topo, pp_link: np.ndarray, dp_link: np.ndarray) -> np.ndarray | None:
    region = np.asarray(topo.device_region)
    pp, dp = group_links(pp_link, dp_link, region)
    # the device matrices must be the expansion of the region ones (off the diagonal)
    off = ~np.eye(len(region), dtype=bool)
    if not (np.array_equal(pp[np.ix_(region, region)][off], pp_link[off])
            and np.array_equal(dp[np.ix_(region, region)][off], dp_link[off])):
        return None
    return _merged(pp, dp, region)


def region_classes(topo, d_dp: int, c_pp_bytes: float, c_dp_bytes: float) -> tuple[np.ndarray, ClassLinks,
                                                                                        ClassLinks] | None:
    """(class of every device, pp_link, dp_link held as classes) from the scenario's region links, without a
    device x device matrix; None when the topology has device-level links or more than MAX_CLASSES classes."""
    sym = topo.symmetric_regions()
    if sym is None:
        return None
    region = np.asarray(topo.device_region)
    by_region = [ClassLinks(m, region) for m in link_costs(*sym, d_dp, c_pp_bytes, c_dp_bytes)]
    classes = _merged(*group_links(*by_region, region), region)
    if classes is None:
        return None
    cpp, cdp = group_links(*by_region, classes)
    return classes, ClassLinks(cpp, classes), ClassLinks(cdp, classes)


def _merged(pp: np.ndarray, dp: np.ndarray, region: np.ndarray) -> np.ndarray | None:
    """Class of every device from its region's, regions whose links equal their own intra links merged."""
    R = len(pp)
    sizes = np.bincount(region, minlength=R)
    cls = np.arange(R)
    for r, s in combinations(range(R), 2):
        if cls[s] == s and all(_alike(m, r, s, sizes) for m in (pp, dp)):
            cls[s] = cls[r]
    _, cls = np.unique(cls, return_inverse=True)
    return cls[region] if cls.max() + 1 <= MAX_CLASSES else None


def _alike(m: np.ndarray, r: int, s: int, sizes: np.ndarray) -> bool:
    """Devices of regions r and s are interchangeable: the same links to every other region, and the
    link between them equal to each one's own intra link (where it has two devices to have one)."""
    others = [x for x in range(len(m)) if x not in (r, s)]
    if not np.array_equal(m[r, others], m[s, others]):
        return False
    intra = [m[x, x] for x in (r, s) if sizes[x] > 1]
    return all(v == m[r, s] for v in intra) and m[r, s] == m[s, r]


def cost_model(topo, d_pp: int, d_dp: int, c_pp_bytes: float, c_dp_bytes: float) -> CostModel:
    """The searches' CostModel: on link classes from LUMPED_FROM devices where the links lump
    (harness/scheduler/lumped.py), else on devices."""
    if topo.n < LUMPED_FROM:
        return CostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
    if topo.region_links is not None:  # no device x device matrix at all
        try:
            return LumpedCostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
        except ValueError:  # more classes than the counts handle: the device model
            return CostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
    comm = CostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)
    classes = link_classes(comm)
    return comm if classes is None else LumpedCostModel(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes, classes)


class LumpedCostModel(CostModel):
    """A CostModel on link classes: `score` (the searches' objective) runs on counts, and pp_link and
    dp_link are held as classes (ClassLinks: no device x device matrix), so every other method reads
    the device model's values without building them."""

    def __init__(self, topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes, classes: np.ndarray | None = None):
        self._given_classes = classes
        super().__init__(topo, d_pp, d_dp, c_pp_bytes, c_dp_bytes)  # calls _link_matrices
        C = self.classes
        sizes = np.bincount(self.device_class, minlength=C)
        self.class_pp = self.pp_link.values  # a one-device class never meets itself
        usable = ~np.eye(C, dtype=bool) | (sizes > 1)[:, None]
        self._values = np.unique(self.class_pp[usable])  # the edge values, ascending
        subsets = ((np.arange(1, 1 << C)[:, None] >> np.arange(C)) & 1).astype(np.int64)  # (2^C - 1, C)
        # reach[t, S, c']: class c' has a link <= values[t] to some class of S
        allowed = (self.class_pp[None] <= self._values[:, None, None]) & usable[None]  # (T, C, C)
        self._subsets = subsets
        reach = np.einsum("sc,tcd->dts", subsets, allowed.astype(np.int64)) > 0
        self._reach = reach.reshape(C, -1).astype(float)  # (C, T * (2^C - 1)), for one matrix product
        self._pairs_by_cost = np.argsort(self.class_pp, axis=None, kind="stable")
        self._edges: dict[bytes, tuple[float, float]] = {}
        self._tsp: dict[bytes, tuple[float, list[int]]] = {}
        self._flows: dict[bytes, np.ndarray] = {}

    def _link_matrices(self):
        classes = self._given_classes
        found = region_classes(self.topo, self.d_dp, self.c_pp_bytes, self.c_dp_bytes)
        if found is not None and classes is None:
            self.device_class, pp, dp = found
        else:  # other classes than the regions', or device-level links: read from the given matrices
            pp, dp = (found[1], found[2]) if found is not None else CostModel._link_matrices(self)
            if classes is None:
                classes = _device_classes(self.topo, pp, dp)
            if classes is None:
                raise ValueError(f"{self.topo.source}: the links do not lump into at most {MAX_CLASSES} classes")
            self.device_class = np.asarray(classes)
            pp, dp = (ClassLinks(v, self.device_class) for v in group_links(pp, dp, self.device_class))
        self.classes = int(self.device_class.max()) + 1
        return pp, dp

    def with_messages(self, c_pp_bytes: float, c_dp_bytes: float) -> "LumpedCostModel":
        return LumpedCostModel(self.topo, self.d_pp, self.d_dp, c_pp_bytes, c_dp_bytes, self.device_class)

    def class_symmetric(self) -> tuple[np.ndarray, np.ndarray]:
        """Topology.symmetric() between classes (C x C: delay s, bandwidth bit/s), what IterationModel reads."""
        sym = self.topo.symmetric_regions()
        if sym is None:
            return group_links(*self.topo.symmetric(), self.device_class)
        region = np.asarray(self.topo.device_region)
        return group_links(ClassLinks(sym[0], region), ClassLinks(sym[1], region), self.device_class)

    def datap_cost_per_group(self, partition: np.ndarray) -> np.ndarray:
        return self.group_datap(self.counts(partition))

    def datap_cost(self, partition: np.ndarray) -> float:
        return float(self.datap_cost_per_group(partition).max())

    def breakdown(self, partition: np.ndarray) -> CommCost:
        """CostModel.breakdown on counts: the exact path over the bottleneck edges, the devices matched
        along it (staged_on_path); the device model's values without its D_PP^2 / 2 matchings of D_DP^2."""
        P = self.check_partition(partition)
        K = self.counts(P).astype(float)
        W, _ = self.edges(K)
        pp, order = open_loop_tsp(W)
        dp = float(self.group_datap(K).max())
        staged = self.staged_on_path(P, order)
        edges = tuple(float(W[order[k - 1], order[k]]) for k in range(1, self.d_pp))
        return CommCost(dp=dp, pp=pp, total=dp + pp, partition=staged, pipelines=staged.T.copy(), stage_edges=edges)

    def counts(self, partition: np.ndarray) -> np.ndarray:
        """K (D_PP, C): devices of each class in each group."""
        P = np.asarray(partition)
        rows = np.repeat(np.arange(self.d_pp), P.shape[1])
        flat = np.bincount(rows * self.classes + self.device_class[P.ravel()], minlength=self.d_pp * self.classes)
        return flat.reshape(self.d_pp, self.classes)

    def group_datap(self, K: np.ndarray) -> np.ndarray:
        """DATAP-COST of every group (eq. 2) from its counts."""
        return np.where(K > 0, self.dp_link.class_sums(K), -np.inf).max(1)

    def edges(self, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bottleneck, mean) matrices (D_PP, D_PP) of every pair of groups (eq. 3 and the tie-breaker)."""
        keys = [k.tobytes() for k in K]
        W, mean = np.zeros((self.d_pp, self.d_pp)), np.zeros((self.d_pp, self.d_pp))
        missing = []
        for a, b in combinations(range(self.d_pp), 2):
            key = keys[a] + keys[b] if keys[a] <= keys[b] else keys[b] + keys[a]
            hit = self._edges.get(key)
            if hit is None:
                missing.append((a, b, key))
            else:
                W[a, b] = W[b, a] = hit[0]
                mean[a, b] = mean[b, a] = hit[1]
        if missing:
            if len(self._edges) > CACHE_MAX:
                self._edges.clear()
            a = np.array([m[0] for m in missing])
            b = np.array([m[1] for m in missing])
            bottleneck = self._bottleneck(K[a], K[b])
            transport = self._cheapest_first(K[a], K[b])
            for k, (x, y, key) in enumerate(missing):
                self._edges[key] = (float(bottleneck[k]), float(transport[k]))
                W[x, y] = W[y, x] = bottleneck[k]
                mean[x, y] = mean[y, x] = transport[k]
        return W, mean

    def _bottleneck(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Least edge value at which every row of A matches the same row of B (Hall's condition)."""
        left = A @ self._subsets.T.astype(float)  # (pairs, S)
        right = (B @ self._reach).reshape(len(B), len(self._values), -1)  # (pairs, T, S)
        feasible = (left[:, None, :] <= right).all(-1)  # (pairs, T), monotone in T
        return self._values[feasible.argmax(1)]

    def _cheapest_first(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Mean link of the cheapest-first transport of A's counts to B's (the tie-breaker's matching)."""
        a, b = A.astype(float), B.astype(float)
        total = np.zeros(len(a))
        C = self.classes
        for flat in self._pairs_by_cost:
            c, d = divmod(int(flat), C)
            f = np.minimum(a[:, c], b[:, d])
            total += f * self.class_pp[c, d]
            a[:, c] -= f
            b[:, d] -= f
        return total / self.d_dp

    def path(self, partition: np.ndarray) -> tuple[float, float, list[int], float]:
        """(DATAP-COST, PIPELINEP-COST, the stage order, the tie-breaker) of a partition."""
        K = self.counts(partition).astype(float)
        W, mean = self.edges(K)
        key = W.tobytes()
        found = self._tsp.get(key)
        if found is None:
            if len(self._tsp) > CACHE_MAX:
                self._tsp.clear()
            found = self._tsp[key] = open_loop_tsp(W) if self.d_pp <= SEARCH_EXACT_TSP_MAX else path_2opt(W)
        pp, order = found
        per_group = self.group_datap(K)
        smooth = sum(mean[order[k - 1], order[k]] for k in range(1, self.d_pp)) + per_group.mean()
        return float(per_group.max()), float(pp), order, float(smooth)

    def score(self, partition: np.ndarray) -> tuple[float, float]:
        dp, pp, _, smooth = self.path(partition)
        return dp + pp, smooth

    def staged_on_path(self, partition: np.ndarray, order: list[int]) -> np.ndarray:
        """The partition's rows in `order`, each row's columns matched to the previous row's by a
        least-sum matching among those at the pair's bottleneck (what CostModel.staged reads from the
        device model's matchings, here only for the path's D_PP - 1 edges). On classes: the least-sum
        transport of one row's class counts to the next's over the class pairs at most the bottleneck
        (an assignment whose costs take C^2 values is that transport), spread over the devices; below
        TRANSPORT_FROM replicas the assignment itself on the D_DP x D_DP block, which is quicker there."""
        P = np.asarray(partition)
        W, _ = self.edges(self.counts(P).astype(float))  # cached by path()
        staged = np.empty_like(P)
        staged[0] = P[order[0]]
        for k in range(1, self.d_pp):
            prev, nxt = staged[k - 1], P[order[k]]
            if self.d_dp < TRANSPORT_FROM:
                staged[k] = nxt[_assignment(self.pp_link[prev[:, None], nxt[None, :]], W[order[k - 1], order[k]])]
                continue
            flow = self._transport(self.device_class[prev], self.device_class[nxt], W[order[k - 1], order[k]])
            row = np.empty_like(nxt)
            # the f devices of class c in prev (in their order) meet f devices of class c' in nxt
            of_prev = [list(np.flatnonzero(self.device_class[prev] == c)) for c in range(self.classes)]
            of_next = [list(nxt[self.device_class[nxt] == c]) for c in range(self.classes)]
            for c, c2 in zip(*np.nonzero(flow)):
                f = int(flow[c, c2])
                row[of_prev[c][:f]] = of_next[c2][:f]
                del of_prev[c][:f], of_next[c2][:f]
            staged[k] = row
        return staged

    def _transport(self, prev_classes: np.ndarray, next_classes: np.ndarray, least: float) -> np.ndarray:
        """(C, C) device counts matched between classes: the least-sum transport of prev's counts to next's
        over class pairs whose link is at most `least` (HiGHS; integral, the constraints being a transport's)."""
        C = self.classes
        a, b = np.bincount(prev_classes, minlength=C), np.bincount(next_classes, minlength=C)
        key = a.tobytes() + b.tobytes() + np.float64(least).tobytes()
        hit = self._flows.get(key)
        if hit is not None:
            return hit
        ok = (self.class_pp <= least * (1 + 1e-12)) & (a[:, None] > 0) & (b[None, :] > 0)
        cells = np.argwhere(ok)
        rows = np.zeros((2 * C, len(cells)))
        rows[cells[:, 0], np.arange(len(cells))] = 1
        rows[C + cells[:, 1], np.arange(len(cells))] = 1
        res = linprog(self.class_pp[ok], A_eq=rows, b_eq=np.concatenate([a, b]), bounds=(0, None), method="highs")
        flow = np.zeros((C, C), dtype=int)
        flow[cells[:, 0], cells[:, 1]] = np.rint(res.x).astype(int)
        if not res.success or not (np.array_equal(flow.sum(1), a) and np.array_equal(flow.sum(0), b)):
            raise RuntimeError(f"no matching at the bottleneck {least} (a bug: the edge's value is one)")
        if len(self._flows) > CACHE_MAX:
            self._flows.clear()
        self._flows[key] = flow
        return flow


def _assignment(block: np.ndarray, least: float) -> np.ndarray:
    """Columns of a least-sum assignment of `block` among its entries at most `least` (the bottleneck)."""
    _, cols = linear_sum_assignment(block)  # least sum first, then bottleneck-feasible if it is not
    if block[np.arange(len(block)), cols].max() > least:
        _, cols = linear_sum_assignment(np.where(block <= least, block, np.inf))
    return cols


def path_2opt(W: np.ndarray, starts: int = TWO_OPT_STARTS) -> tuple[float, list[int]]:
    """A short open path over symmetric W: nearest neighbour from every start (vectorised), then 2-opt
    on the `starts` cheapest, each move the best reversal of all (vectorised); an upper bound on the
    exact TSP that the search uses beyond SEARCH_EXACT_TSP_MAX stages."""
    W = np.asarray(W, dtype=float)
    n = len(W)
    if n <= 2:
        return float(W[0, -1]) if n == 2 else 0.0, list(range(n))
    paths = np.empty((n, n), dtype=int)
    paths[:, 0] = np.arange(n)
    seen = np.eye(n, dtype=bool)
    for k in range(1, n):
        d = np.where(seen, np.inf, W[paths[:, k - 1]])
        paths[:, k] = d.argmin(1)
        seen[np.arange(n), paths[:, k]] = True
    lengths = W[paths[:, :-1], paths[:, 1:]].sum(1)
    padded = np.zeros((n + 1, n + 1))  # node n: a free end before the first and after the last
    padded[:n, :n] = W
    best = (np.inf, [])
    i, j = np.triu_indices(n + 1, 1)
    for s in np.argsort(lengths, kind="stable")[:starts]:
        p = np.concatenate([[n], paths[s], [n]])
        while True:
            # reversing p[i+1 .. j] swaps edges (p_i, p_i+1), (p_j, p_j+1) for (p_i, p_j), (p_i+1, p_j+1)
            delta = (padded[p[i], p[j]] + padded[p[i + 1], p[j + 1]]
                     - padded[p[i], p[i + 1]] - padded[p[j], p[j + 1]])
            k = int(delta.argmin())
            if delta[k] >= -1e-12:
                break
            p[i[k] + 1:j[k] + 1] = p[i[k] + 1:j[k] + 1][::-1].copy()
        path = p[1:-1]
        cost = float(W[path[:-1], path[1:]].sum())
        if cost < best[0]:
            best = (cost, path.tolist())
    return best
