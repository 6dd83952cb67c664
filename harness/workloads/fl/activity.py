"""When each worker's GPU works in a round: OWL's Fig. 8b ("GPU memory utilization") read from the simulated round.

The paper reports "the average percentage of GPU memory used per unit time", nvidia-smi's memory utilization:
the share of time the GPU's device memory is being read or written. A GPU's memory is read and written while its
kernels run (the forward's layers as flows.forward_schedule runs them, then the backward); the parameters landing
from the network are written at the link's rate, a few GB/s against the device memory's hundreds, and the
gradients' all-reduce likewise, so the model counts the kernels alone. Each worker's backward (twice its
forward's FLOPs, as strategies.e0_seconds counts it) starts when its own forward ends.
"""
from __future__ import annotations

import numpy as np

from .federation import Federation
from .flows import arrivals, forward_schedule, layer_ready, layer_seconds
from .models import BranchyModel
from .strategies import Round


def computation_seconds(model: BranchyModel, fed: Federation, batch: int) -> np.ndarray:
    """Per worker, the seconds its GPU computes in a round: the forward's layers and a backward of twice them."""
    return 3 * layer_seconds(model, fed, batch).sum(axis=1)


def busy_intervals(model: BranchyModel, fed: Federation, batch: int, r: Round) -> list[np.ndarray]:
    """Per worker, (k, 2) [start, end) seconds its GPU runs kernels in round `r`: each forward layer, the backward."""
    if not r.transfers:
        raise ValueError(f"{r.strategy}: a bound, not a plan: it has no timeline")
    ready = layer_ready(model, fed, list(r.transfers), arrivals(fed, list(r.transfers)))
    secs, computation = layer_seconds(model, fed, batch), computation_seconds(model, fed, batch)
    out = []
    for w in range(fed.workers):
        starts, ends = forward_schedule(model, secs[w], ready[w])
        backward = float(computation[w] - secs[w].sum())
        last = float(ends.max()) if len(ends) else 0.0
        spans = np.column_stack([np.append(starts, last), np.append(ends, last + backward)])
        out.append(spans[spans[:, 1] > spans[:, 0]])
    return out


def busy_share(intervals: list[np.ndarray], seconds: float) -> float:
    """The workers' mean share of a round of `seconds` during which their GPU runs kernels."""
    return float(np.mean([(iv[:, 1] - iv[:, 0]).sum() / seconds for iv in intervals]))


def busy_over_time(intervals: list[np.ndarray], seconds: float, bins: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """(bin ends in seconds, the workers' mean busy share in each of `bins` equal slices of the round)."""
    edges = np.linspace(0.0, seconds, bins + 1)
    busy = np.zeros(bins)
    for iv in intervals:
        for a, b in iv:  # each interval's overlap with every bin
            busy += np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)
    return edges[1:], busy / (len(intervals) * np.diff(edges))
