"""Max-min fair sharing: the rate every concurrent flow gets when flows share capacities, as TCP flows
through one bottleneck converge to (a fluid model: no loss, equal round trips).

One function for every model that shares a link: the simulator's links (pair, sender's interface,
receiver's interface: netmodel/links.py) and the federated-learning round (server uplink, worker
interfaces: workloads/fl/flows.py). Progressive filling (Bertsekas and Gallager, Data Networks, 6.5.2):
raise every unfrozen flow's rate together; when a resource fills, or a flow reaches its own cap, freeze
the flows it holds; repeat. The allocation is unique, so the order in which ties freeze does not matter.
"""
from __future__ import annotations

import numpy as np

#: flows whose share is within this relative distance of the smallest freeze together (float ties)
TIE = 1e-9


def max_min_fair(crossings: list[np.ndarray], capacity: np.ndarray, flow_cap=np.inf) -> np.ndarray:
    """The max-min fair rate of every flow k that crosses resources crossings[0][k], crossings[1][k], ...
    (indices into `capacity`; a flow counted once per crossing) and is itself capped at flow_cap[k]. A flow
    whose every capacity is infinite gets inf."""
    crossings = [np.asarray(c, dtype=int).ravel() for c in crossings]
    n = len(crossings[0]) if crossings else np.size(flow_cap)
    flow_cap = np.broadcast_to(np.asarray(flow_cap, dtype=float), (n,))
    R = len(capacity)
    rate = np.full(n, np.inf)
    active = np.ones(n, dtype=bool)
    left = np.asarray(capacity, dtype=float).copy()
    while active.any():
        count = sum(np.bincount(c[active], minlength=R) for c in crossings)
        share = np.where(count > 0, left / np.maximum(count, 1), np.inf)
        fs = flow_cap.copy()
        for c in crossings:
            fs = np.minimum(fs, share[c])
        m = fs[active].min()
        if np.isinf(m):  # nothing limits the rest
            break
        freeze = active & (fs <= m * (1 + TIE))
        rate[freeze] = m
        for c in crossings:
            left -= np.bincount(c[freeze], weights=rate[freeze], minlength=R)
        left = np.maximum(left, 0.0)
        active &= ~freeze
    return rate
