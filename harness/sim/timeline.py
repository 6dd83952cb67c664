"""Per-iteration times under a timeline: a simulated layout on the links as they are at each moment.

The simulator predicts one iteration on fixed links; under a timeline (scenario/timeline.py) each iteration
runs on the links in force while it runs (`predict_iterations`: a change inside an iteration applies to the
rest of it). What is re-simulated on the changed links is the candidate's own model on its own layouts
(Candidate.resimulate), so on the scenario's links an iteration takes exactly what `harness sim` prints.
Not modelled: jitter and loss (netem's; the simulator has no model of either: a timeline that changes them
is predicted as if it did not), TCP's recovery after a cut (its retransmission timer backs off while a link
is down, so the first transfer after it comes back can wait up to the outage again).
"""
from __future__ import annotations

from dataclasses import replace

from ..netmodel.links import Links
from ..scenario.timeline import PredictedIteration, predict_iterations
from .systems import SimError


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
