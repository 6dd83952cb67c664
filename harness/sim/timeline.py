"""Per-iteration times under a timeline: a simulated layout on the links as they are at each moment.

The simulator predicts one iteration on fixed links; under a timeline (scenario/timeline.py: the events, as
data) each iteration runs on the links in force while it runs (a change inside an iteration applies to the rest
of it). One loop predicts every run that changes (`predict_run`): its link events, and what a `Disruptions`
adds: devices that leave and come back (sim/preemption.py's recoveries), a re-plan when the links change
(sim/replan.py, through `predict_iterations`). What is re-simulated on the changed links is the candidate's own model on its own layouts
(Candidate.resimulate), so on the scenario's links an iteration takes exactly what `harness sim` prints.
Not modelled: jitter and loss (netem's; the simulator has no model of either: a timeline that changes them
is predicted as if it did not), TCP's recovery after a cut (its retransmission timer backs off while a link
is down, so the first transfer after it comes back can wait up to the outage again).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from ..errors import HarnessError
from ..netmodel.links import Links
from ..scenario.timeline import LinkState, Timeline
from .systems import SimError


@dataclass(frozen=True)
class PredictedIteration:
    iteration: int  # the useful iteration it completed (0-based)
    start_s: float
    seconds: float  # with pause_s
    changes: int = 0  # link changes applied while it ran (or at its start)
    pause_s: float = 0.0  # before it began, counted in it: a re-plan's search and its weights' moves
    devices: int = 0  # devices it ran on


#: an iteration longer than this with no change left to come never ends (a link cut for good)
NEVER_S = 1e6
#: what Disruptions.boundary returns when it changed the run (a recovery): the loop looks at the boundary again
AGAIN = "again"


@dataclass
class RunState:
    """A predicted run as it goes: its clock, the links in force and the useful iterations done so far (a
    restart from a checkpoint takes the later ones back)."""

    net: "ChangingLinks"
    t: float = 0.0
    iterations: list[PredictedIteration] = field(default_factory=list)


class Disruptions:
    """What happens to a run besides its links changing, asked by `predict_run` at every iteration boundary and
    during every iteration. This base: nothing (one plan on every device); sim/preemption.py's recoveries are
    devices that leave and come back."""

    devices = 0  # of the plan in force

    def boundary(self, run: RunState, changed: bool) -> float | str:
        """Before the next iteration (`changed`: links changed since the last one began): the seconds of a pause
        counted in it (run.t already moved past it), or AGAIN after changing the run."""
        return 0.0

    def seconds(self, run: RunState) -> float:
        """An iteration of the plan in force on the links as they are now."""
        raise NotImplementedError

    def stop(self, until: float):
        """The first event before `until` that ends the iteration in flight (it has .at_s), or None."""
        return None

    def interrupted(self, run: RunState, hit, begin: float) -> None:
        """The iteration begun at `begin` was stopped by `hit` (from `stop`): recover."""
        raise NotImplementedError

    def completed(self, run: RunState, end: float) -> None:
        """An iteration ended at `end`."""


def predict_run(timeline: Timeline, topo, iterations: int, disruptions: Disruptions) -> RunState:
    """The one predictor of a run that changes: `iterations` useful iterations from t = 0 under the timeline's link
    events and whatever `disruptions` adds (devices that leave: sim/preemption.predict_spot; a re-plan when the
    links change: sim/replan.py through predict_iterations). At each boundary the links due change, then
    `disruptions.boundary`; each iteration runs as a fluid over the changes due while it runs (fluid_iteration),
    stopped early by `disruptions.stop`."""
    run = RunState(ChangingLinks(timeline, topo))
    pending, seen = False, 0
    while len(run.iterations) < iterations:
        done = len(run.iterations)
        applied = run.net.advance(run.t, done)
        seen += applied
        pause = disruptions.boundary(run, pending or bool(applied))
        if pause == AGAIN:
            continue
        begin = run.t
        end, T, during, hit = fluid_iteration(run.t, run.net, lambda: disruptions.seconds(run), timeline.source,
                                              done, disruptions.stop)
        if hit is not None:
            disruptions.interrupted(run, hit, begin)
            pending, seen = True, seen + during
            continue
        run.iterations.append(PredictedIteration(done, begin - pause, pause + (end - begin if during else T),
                                                 seen + during, pause, disruptions.devices))
        disruptions.completed(run, end)
        run.t, pending, seen = end, bool(during), 0
    return run


class _Replans(Disruptions):
    """No device leaves; a hook may pause the run at a boundary and change what an iteration takes."""

    def __init__(self, topo, seconds_at, at_boundary):
        self.seconds_at, self.at_boundary, self.devices = seconds_at, at_boundary, topo.n
        self.cache, self.plan = {}, 0

    def boundary(self, run: RunState, changed: bool) -> float:
        paused = None if self.at_boundary is None else self.at_boundary(run.net.topology(), len(run.iterations),
                                                                        changed)
        if paused is None:
            return 0.0
        self.plan += 1
        run.t += paused
        return paused

    def seconds(self, run: RunState) -> float:
        k = (run.net.key(), self.plan)
        if k not in self.cache:
            self.cache[k] = float(self.seconds_at(run.net.topology()))
        return self.cache[k]


def predict_iterations(timeline: Timeline, topo, iterations: int, seconds_at: Callable[[object], float],
                       at_boundary: Callable[[object, int, bool], float | None] | None = None
                       ) -> list[PredictedIteration]:
    """Each iteration's start and length from t = 0, as the links change under it (predict_run, no device
    leaving). `seconds_at(topology)` gives an iteration's length on fixed links (the simulator). An iteration that a
    change falls inside runs as a fluid: the share of it done so far stays done, the rest goes at the new links'
    pace (a cut link: no progress until it is back). Time and iteration events apply at iteration boundaries.
    `at_boundary(topology, iteration, changed)`, at every boundary (`changed`: the first after changes): None,
    or the seconds a re-plan takes before the iteration starts (what `seconds_at` gives may then change)."""
    return predict_run(timeline, topo, iterations, _Replans(topo, seconds_at, at_boundary)).iterations


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
