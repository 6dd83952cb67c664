"""Per-iteration times under a timeline: a simulated layout on the links as they are at each moment.

The simulator predicts one iteration on fixed links; under a timeline (scenario/timeline.py: the events, as
data) each iteration runs on the links in force while it runs (`predict_iterations`: a change inside an
iteration applies to the rest of it). A timeline whose devices also leave and come back: sim/preemption.py,
whose loop runs its link events the same way. What is re-simulated on the changed links is the candidate's own model on its own layouts
(Candidate.resimulate), so on the scenario's links an iteration takes exactly what `harness sim` prints.
Not modelled: jitter and loss (netem's; the simulator has no model of either: a timeline that changes them
is predicted as if it did not), TCP's recovery after a cut (its retransmission timer backs off while a link
is down, so the first transfer after it comes back can wait up to the outage again).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import HarnessError
from ..netmodel.links import Links
from ..scenario.timeline import LinkState, Timeline
from .systems import SimError


@dataclass(frozen=True)
class PredictedIteration:
    iteration: int
    start_s: float
    seconds: float  # with pause_s
    changes: int  # changes applied while it ran (or at its start)
    pause_s: float = 0.0  # before it began: a re-plan and its weights' moves (at_boundary)


#: an iteration longer than this with no change left to come never ends (a link cut for good)
NEVER_S = 1e6


def predict_iterations(timeline: Timeline, topo, iterations: int, seconds_at: Callable[[object], float],
                       at_boundary: Callable[[object, int, bool], float | None] | None = None
                       ) -> list[PredictedIteration]:
    """Each iteration's start and length from t = 0, as the links change under it. `seconds_at(topology)`
    gives an iteration's length on fixed links (the simulator). An iteration that a change falls inside runs
    as a fluid: the share of it done so far stays done, the rest goes at the new links' pace (a cut link:
    no progress until it is back). Time and iteration events apply at iteration boundaries.
    `at_boundary(topology, iteration, changed)`, at every boundary (`changed`: the first after changes): None,
    or the seconds a re-plan takes before the iteration starts (what `seconds_at` gives may then change)."""
    net, cache, plan = ChangingLinks(timeline, topo), {}, 0

    def seconds() -> float:
        k = (net.key(), plan)
        if k not in cache:
            cache[k] = float(seconds_at(net.topology()))
        return cache[k]

    out, t, pending = [], 0.0, False
    for it in range(iterations):
        applied = net.advance(t, it)
        start, pause = t, 0.0
        if at_boundary is not None:
            paused = at_boundary(net.topology(), it, pending or bool(applied))
            pending = False
            if paused is not None:
                plan, pause, t = plan + 1, paused, t + paused
        t, _, during, _ = fluid_iteration(t, net, seconds, timeline.source, it)
        pending = pending or bool(during)
        out.append(PredictedIteration(it, start, t - start, applied + during, pause))
    return out


class ChangingLinks:
    """The links under a timeline's link events as a predictor's clock passes them (scenario/timeline.py's
    LinkState and cursor): the scenario's own until the first change."""

    def __init__(self, timeline: Timeline, topo):
        self.topo, self.events = topo, bool(timeline.events or timeline.trace)
        self.state = LinkState.initial(topo) if self.events else None
        self.cursor = timeline.cursor()
        self.changed = False

    def advance(self, t: float, iteration: int | None = None) -> int:
        """Apply the changes due by time t (and by iteration `iteration`'s boundary); how many there were."""
        due = self.cursor.due(t, iteration) if self.events else []
        for c in due:
            self.state.apply(c)
        self.changed = self.changed or bool(due)
        return len(due)

    def next_at_s(self) -> float:
        at = self.cursor.next_at_s() if self.events else None
        return math.inf if at is None else at

    def topology(self):
        return self.state.topology(self.topo) if self.changed else self.topo

    def key(self) -> bytes:
        return self.state.key() if self.changed else b""

    def links(self, sim) -> Links:
        """The links now, as `sim` (a Simulator of the same scenario) models them."""
        return timeline_links(sim, self.topology()) if self.changed else sim.links


def fluid_iteration(t: float, net: ChangingLinks, seconds: Callable[[], float], where: str, iteration: int,
                    stop: Callable[[float], object] | None = None) -> tuple[float, float, int, object]:
    """One iteration from `t` as a fluid over the link changes due while it runs: the share done so far stays
    done, the rest goes at the new links' pace (a cut link: no progress until it is back). `seconds()`: an
    iteration on the links as they are now; `stop(until)`: the first event before `until` that ends it early (a
    device of its plan leaving; None: none). Returns (when it ended or was stopped, its pace then, the changes
    applied during it, the event that stopped it or None)."""
    share, during = 0.0, 0
    while True:
        T = seconds()
        end, change = t + (1.0 - share) * T, net.next_at_s()
        hit = stop(min(end, change)) if stop is not None else None
        if hit is not None:
            return hit.at_s, T, during, hit
        if change >= end:
            if T > NEVER_S and math.isinf(change):
                raise HarnessError(f"{where}: iteration {iteration} never ends: a link it crosses is cut and no "
                                   "later event brings it back")
            return end, T, during, None
        share, t = share + (change - t) / T, change
        during += net.advance(t)


def timeline_links(sim, topo_now) -> Links:
    """The links of `topo_now` (the simulator's scenario with a timeline's changes) as the simulator models
    them: its protocol, NIC model and clock."""
    return replace(Links.from_topology(topo_now, sim.links.protocol, sim.nic), hz=sim.links.hz)


def predict_candidate(sim, cand, timeline, iterations: int) -> list[PredictedIteration]:
    """`iterations` iterations of the candidate (sweep.Candidate) under `timeline`, from t = 0."""
    if cand.resimulate is None:
        raise SimError(f"{cand.system}: its simulator model cannot re-simulate its layout on changed links")
    return predict_iterations(timeline, sim.topo, iterations,
                              lambda topo_now: cand.resimulate(timeline_links(sim, topo_now)))


def unmodelled(timeline) -> list[str]:
    """What the timeline changes that the simulator does not model (jitter, loss), for a note."""
    rows = timeline.trace.rows if timeline.trace else ()
    return sorted({k for c in (*timeline.events, *rows) for k in ("jitter_ms", "loss_pct")
                   if getattr(c, k) is not None})
