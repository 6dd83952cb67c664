"""Simulating one round: transfers of parameters under max-min fair sharing, then each worker's forward.

Network. A transfer carries some layers' parameters from the server or a worker to a worker. It
starts when the transfers it waits for have arrived (the previous one in the receiver's lane; for
a relay, the one that brought the layers to its source: constraint 9), plus the request's one-way
delay; its bytes then flow at the max-min fair rate over the resources it crosses (the server's
uplink or the sending worker's interface, the receiving worker's interface, and the pair's own
bandwidth), and the last byte lands one delay later. (A worker's interface: Federation.worker_egress_Bps and
worker_ingress_Bps.) A worker has two lanes, each pulling one
transfer at a time: one from the server and one from its peers (Fig. 4(c): a worker receives from
the server and from a peer at once). Rates are recomputed at every start and end (progressive
filling), so concurrent transfers share exactly as a fluid network would.

Compute. One GPU per worker runs one layer at a time: a layer can run once its parameters have
arrived and its inputs exist (the layer before it in its branch, or for a branch's first layer the
whole previous base); among the layers that can run, the one whose parameters arrived first
(then forward order). The round's forward ends when the last worker's last layer ends; backward,
gradient aggregation and update (the paper's E_0) follow and are the same for every strategy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...netmodel.fair_share import max_min_fair
from .federation import Federation
from .models import BYTES_PER_PARAM, BranchyModel

SERVER = -1


@dataclass(frozen=True)
class Transfer:
    dst: int  # the receiving worker
    src: int  # SERVER or a worker
    layers: tuple[int, ...]  # indices into model.layers
    nbytes: float
    lane: str  # "server" | "peer"
    after: int | None = None  # for a relay: index of the transfer that brought these layers to src


def traffic(fed: Federation, transfers) -> tuple[float, tuple[float, ...], float]:
    """Bytes of a plan by where they go: (out of the server, inside each rack, across racks)."""
    rack = fed.rack_of
    server, inter = 0.0, 0.0
    racks = [0.0] * len(fed.racks)
    for t in transfers:
        if t.src == SERVER:
            server += t.nbytes
        elif rack[t.src] == rack[t.dst]:
            racks[rack[t.src]] += t.nbytes
        else:
            inter += t.nbytes
    return server, tuple(racks), inter


def layer_bytes(model: BranchyModel) -> np.ndarray:
    return np.array([model.bases[i].branches[j].layers[k].params * BYTES_PER_PARAM for i, j, k in model.layers],
                    dtype=float)


def layer_seconds(model: BranchyModel, fed: Federation, batch: int) -> np.ndarray:
    """(workers, layers) forward seconds of a minibatch."""
    flop = np.array([model.bases[i].branches[j].layers[k].fwd_flop for i, j, k in model.layers]) * batch
    return flop[None, :] / np.asarray(fed.flops_per_s)[:, None]


def _pair(fed: Federation, rack: np.ndarray, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes/s, one-way delay s) of every (src, dst), src SERVER or a worker."""
    server = src == SERVER
    rates, delays = fed.rack_links()
    srates, sdelays = fed.server_links()
    a, b = rack[np.where(server, 0, src)], rack[dst]
    return np.where(server, srates[b], rates[a, b]), np.where(server, sdelays[b], delays[a, b])


def arrivals(fed: Federation, transfers: list[Transfer]) -> np.ndarray:
    """The time every transfer's last byte lands at its receiver (seconds from the round's start)."""
    T = len(transfers)
    W = fed.workers
    rack = fed.rack_of
    src = np.array([t.src for t in transfers], dtype=int)
    dst = np.array([t.dst for t in transfers], dtype=int)
    nbytes = np.array([t.nbytes for t in transfers], dtype=float)
    cap, delay = _pair(fed, rack, src, dst) if T else (np.zeros(0), np.zeros(0))
    # resources: 0 the server's uplink, 1..W workers' egress, W+1..2W workers' ingress
    res_cap = np.concatenate([[fed.uplink_Bps], np.full(W, fed.worker_egress_Bps), np.full(W, fed.worker_ingress_Bps)])
    src_res = np.where(src == SERVER, 0, src + 1)
    dst_res = W + 1 + dst
    deps: list[list[int]] = [[] for _ in range(T)]
    last: dict[tuple[int, str], int] = {}
    for k, t in enumerate(transfers):
        key = (t.dst, t.lane)
        if key in last:
            deps[k].append(last[key])
        last[key] = k
        if t.after is not None:
            if not (0 <= t.after < k) or transfers[t.after].dst != t.src:
                raise ValueError(f"transfer {k}: `after` must be an earlier transfer to its source")
            deps[k].append(t.after)
    waiting_on = np.array([len(d) for d in deps])
    dependents: list[list[int]] = [[] for _ in range(T)]
    for k, d in enumerate(deps):
        for j in d:
            dependents[j].append(k)
    arrive = np.full(T, np.nan)
    start = np.where(waiting_on == 0, delay, np.inf)  # request delay from t = 0
    left = nbytes.copy()
    active = np.zeros(T, dtype=bool)
    pending = waiting_on == 0
    now = 0.0
    rate = np.zeros(T)
    changed = True

    def landed(ks: np.ndarray) -> None:
        """Transfers `ks` land one delay from now; those waiting on them start once all they wait for landed."""
        arrive[ks] = now + delay[ks]
        for k in ks:
            for j in dependents[k]:
                waiting_on[j] -= 1
                if waiting_on[j] == 0:
                    start[j] = max(arrive[i] for i in deps[j]) + delay[j]
                    pending[j] = True

    while pending.any() or active.any():
        if changed and active.any():
            idx = np.flatnonzero(active)
            rate[idx] = max_min_fair([src_res[idx], dst_res[idx]], res_cap, cap[idx])
        t_start = start[pending].min() if pending.any() else np.inf
        idx = np.flatnonzero(active)
        ends = now + left[idx] / rate[idx] if len(idx) else np.zeros(0)
        t_end = ends.min() if len(idx) else np.inf
        t_next = min(t_start, t_end)
        if len(idx):
            left[idx] -= rate[idx] * (t_next - now)
        now = t_next
        changed = False
        if len(idx) and t_end <= t_next:
            done = idx[ends <= t_next * (1 + 1e-12) + 1e-15]
            left[done] = 0.0
            active[done] = False
            landed(done)
            changed = True
        starting = np.flatnonzero(pending & (start <= now * (1 + 1e-12) + 1e-15))
        if len(starting):
            pending[starting] = False
            landed(starting[nbytes[starting] <= 0])  # nothing to send: lands after the delay
            active[starting[nbytes[starting] > 0]] = True
            changed = True
    return arrive


def forward_end(model: BranchyModel, seconds: np.ndarray, ready: np.ndarray) -> float:
    """When one worker's forward ends: `seconds` and `ready` (parameters arrived) per layer."""
    return float(forward_schedule(model, seconds, ready)[1].max()) if model.layers else 0.0


def forward_schedule(model: BranchyModel, seconds: np.ndarray, ready: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """When one worker's GPU runs each layer of its forward: (start, end) per layer, by the rule above."""
    layers = model.layers
    n = len(layers)
    base_of = np.array([i for i, _, _ in layers], dtype=int)
    first = [k for k in range(n) if layers[k][2] == 0]  # first layers of branches
    nxt = {k: k + 1 for k in range(n - 1) if layers[k + 1][2] > 0}  # the next layer in the same branch
    base_left = np.bincount(base_of, minlength=len(model.bases))
    gpu, base_end, base = 0.0, 0.0, 0
    candidates: list[int] = []

    def open_bases():
        nonlocal base
        while base < len(model.bases) and base_left[base] == 0:
            base += 1
        candidates.extend(k for k in first if base_of[k] == base)

    open_bases()
    inputs = {k: 0.0 for k in candidates}
    starts, ends = np.zeros(n), np.zeros(n)
    for _ in range(n):
        # the layer that can start first; ties: parameters that arrived first, then forward order
        best = min(candidates, key=lambda k: (max(gpu, ready[k], inputs[k]), ready[k], k))
        start = max(gpu, ready[best], inputs[best])
        gpu = end = start + seconds[best]
        starts[best], ends[best] = start, end
        candidates.remove(best)
        if best in nxt:
            candidates.append(nxt[best])
            inputs[nxt[best]] = end
        base_end = max(base_end, end)
        base_left[base_of[best]] -= 1
        if base_left[base] == 0:
            open_bases()
            for k in candidates:
                inputs.setdefault(k, base_end)
    return starts, ends


def layer_ready(model: BranchyModel, fed: Federation, transfers: list[Transfer], arrive: np.ndarray) -> np.ndarray:
    """(workers, layers): when each worker has each layer's parameters (the first transfer bringing them)."""
    ready = np.full((fed.workers, len(model.layers)), np.inf)
    for t, a in zip(transfers, arrive):
        for l in t.layers:
            ready[t.dst, l] = min(ready[t.dst, l], a)
    zero = layer_bytes(model) == 0
    ready[:, zero] = 0.0
    if np.isinf(ready).any():
        w, l = np.argwhere(np.isinf(ready))[0]
        raise ValueError(f"worker {w} never receives layer {l}")
    return ready
