"""Iteration timing: what one rank measured in one iteration, and one iteration's figures over all ranks."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass


@dataclass
class IterationStats:
    """One timed iteration as one rank saw it (every system's runtime returns these). loss is NaN on
    ranks that compute none; end: time.monotonic() when the rank finished it (NaN when not taken)."""

    seconds: float
    compute_seconds: float
    exposed_comm_seconds: float
    loss: float
    end: float = math.nan
    compute_overruns: int = 0  # phases whose real computation outran the compute model's time
    compute_late_seconds: float = 0.0  # how long after their modelled deadlines the phases ended (overruns too)
    wire_bytes: int | None = None  # bytes this rank put on the wire in the iteration (debug.count_wire)
    egress_bytes: dict | None = None  # what its interface sent, {"to": {device: bytes}, "unclassified": bytes}, as
    # the kernel counts it (train/wire.py; emulated runs)
    minibatches: list | None = None  # per-minibatch rows of the whole run, on one rank of a system that
    # records them (HetPipe: VW, minibatch, clock, global version, ...); written as minibatches.csv
    replans: list | None = None  # ours with --replan, on its last iteration: what this rank did in each re-plan
    layout: dict | None = None  # the layout it ran on, when devices left or came back (train/elastic.py)
    iteration: int | None = None  # which iteration it was, where a rank's list may not start at the run's first
    # timed one (a DiLoCo replica back mid-run: train/quorum_agent.py)
    outer_syncs: list | None = None  # DiLoCo: the outer syncs this rank ended in the iteration, a row each
    # (systems/diloco/runtime.py); written as outer_syncs.csv


class Journal(list):
    """A rank's timed iterations, each also appended to `path` as it is taken (a JSON line), so that an
    elastic agent that stops the rank mid-run keeps the iterations it did (train/elastic.py)."""

    def __init__(self, path: str | None = None):
        super().__init__()
        self.path = path

    def append(self, s: IterationStats) -> None:
        super().append(s)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(asdict(s)) + "\n")


def merge_stats(per_rank: list[list[IterationStats]], shared_clock: bool = False) -> list[IterationStats]:
    """One iteration's figures from all ranks: its time, the busiest rank's compute, the
    rest exposed communication; loss = mean of the ranks that report one (every
    replica's last stage holds an equal share of the batch).

    Time: with one clock for all ranks (local and emulated runs share a kernel), the
    interval between the iteration's last end over all ranks and the previous one's, so
    the iterations add up to the run's wall time. The slowest rank's own duration
    (the fallback, for ranks on different hosts) overstates it when ranks jitter: each
    iteration takes the maximum of the ranks' noise while their mean period is shorter."""
    n = min(len(s) for s in per_rank)
    ends = None
    if shared_clock and n and all(not math.isnan(s[i].end) for s in per_rank for i in range(n)):
        ends = [max(s[i].end for s in per_rank) for i in range(n)]
        ends.insert(0, max(s[0].end - s[0].seconds for s in per_rank))
    out = []
    for i in range(n):
        its = [s[i] for s in per_rank]
        seconds = ends[i + 1] - ends[i] if ends else max(it.seconds for it in its)
        compute = max(it.compute_seconds for it in its)
        losses = [it.loss for it in its if not math.isnan(it.loss)]
        out.append(IterationStats(
            seconds=seconds, compute_seconds=compute,
            exposed_comm_seconds=max(0.0, seconds - compute),
            loss=sum(losses) / len(losses) if losses else float("nan"),
            end=ends[i + 1] if ends else math.nan,  # on the shared clock: the window [end - seconds, end]
            compute_overruns=sum(it.compute_overruns for it in its), layout=its[0].layout,
            compute_late_seconds=max(it.compute_late_seconds for it in its),  # the latest rank's
        ))
    return out


def egress_summary(per_rank: list[list]) -> dict | None:
    """The run's egress over its timed iterations (each rank's IterationStats, rank = device): "bytes"[src][dst]
    summed, "unclassified"[src], "iterations" counted; None unless every rank read its interface."""
    n = min((len(s) for s in per_rank), default=0)
    if not n or any(it.egress_bytes is None for s in per_rank for it in s[:n]):
        return None
    devices = len(per_rank)
    sent = [[0] * devices for _ in range(devices)]
    other = [0] * devices
    for src, stats in enumerate(per_rank):
        for it in stats[:n]:
            for dst, b in it.egress_bytes["to"].items():  # a journal's JSON keys are strings
                sent[src][int(dst)] += int(b)
            other[src] += int(it.egress_bytes["unclassified"])
    return {"iterations": n, "bytes": sent, "unclassified": other}


def outer_sync_summary(rows: list[dict]) -> dict:
    """A DiLoCo run's outer syncs (every rank's rows, IterationStats.outer_syncs) per outer step: how many, the
    longest rank's blocking seconds on average, the bytes all ranks sent for one, on average, the smallest quorum,
    and the ranks' syncs dropped (a peer failed inside them: torchft does not commit those)."""
    steps: dict[int, list[dict]] = {}
    for r in rows:
        steps.setdefault(r["iteration"], []).append(r)
    per = list(steps.values())
    return {"outer_steps": len(per),
            "seconds": sum(max(r["seconds"] for r in s) for s in per) / len(per),
            "bytes": sum(sum(r["bytes"] for r in s) for s in per) / len(per),
            "participants": min(r["participants"] for r in rows),
            "dropped": sum(1 for r in rows if not r["committed"])}
