"""Re-planning under a timeline, predicted: when the links change, ours' scheduler runs again on the links as
they are, and the new placement starts two iterations later (as ours' runtime can), once every device holds
its new blocks' weights and optimizer state.

The cost of a re-plan, paid before that iteration: the scheduler's own seconds (measured, here, on this
machine) plus the moves: a device that holds a block (or the embedding, or the head) it did not hold before
receives it from the old holder with the fastest link to it, one message per source, all at once, each on a
fresh TCP connection (handshake, slow start: move_seconds); a sender's uplink shared by several receivers, a
receiver's downlink shared by its sources, and the store round trips of gloo's lazy connect are not modelled.
What moves per parameter is what training keeps beside the gradient: its value, SGD's momentum and, in 16-bit
training, the fp32 master copy (compute.training_bytes_per_param less the gradient).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..compute import PAPER_BYTES, training_bytes_per_param
from ..compute.model import GPTConfig
from ..layout import Layout
from ..layout.holdings import holdings, sources_of
from ..plan import systems as registry
from .timeline import PredictedIteration, predict_iterations
from .systems import SimError
from .timeline import timeline_links


#: iterations from the end of rank 0's search to the first iteration on its plan in ours' runtime
#: (harness/systems/ours/replan.py says why): a search before iteration b, the new plan from b + 2
REPLAN_LEAD = 3


@dataclass(frozen=True)
class Replan:
    iteration: int  # the first iteration on the new plan
    plan_seconds: float  # the scheduler's search
    move_seconds: float  # weights and optimizer state to their new devices
    moved_bytes: float
    pipelines: list  # the new plan's (device of stage 0..D_PP-1 per replica)
    seconds_before: float  # an iteration of the old plan on the links as they were at the search
    seconds_after: float  # an iteration of the new plan on them
    searched: int = 0  # the iteration whose start paid the search

    @property
    def seconds(self) -> float:
        return self.plan_seconds + self.move_seconds


def move_sources(old: Layout, new: Layout, rate) -> dict[int, dict[tuple, int]]:
    """What each device of `new` must receive: {device: {item: source}}, an item (holdings) it did not hold
    in `old`, from the old holder with the fastest link to it (`rate[source, device]`, any unit)."""
    return sources_of(holdings(old), holdings(new), rate)


def item_params(cfg: GPTConfig) -> dict[str, int]:
    """Parameters of each kind of item."""
    return {"block": cfg.block_params, "embedding": cfg.embedding_params, "head": cfg.head_params}


def item_bytes(cfg: GPTConfig, bytes_per_value: int = PAPER_BYTES) -> dict[str, float]:
    """Bytes of each kind of item as training keeps it beside the gradient (what moves, what a checkpoint holds)."""
    per_param = training_bytes_per_param(bytes_per_value) - bytes_per_value
    return {kind: n * per_param for kind, n in item_params(cfg).items()}


def move_seconds(old: Layout, new: Layout, cfg: GPTConfig, links, bytes_per_value: int = PAPER_BYTES
                 ) -> tuple[float, float]:
    """(seconds, bytes) to move what `new` places where `old` did not have it, over `links`: the slowest
    device's messages, all at once, each on a connection that has not carried data yet (the pair may never
    have talked: a TCP handshake, then slow start from the initial window; harness/netmodel/tcp.py)
    after the library's ready notice."""
    return transfer_seconds(holdings(old), holdings(new), cfg, links, bytes_per_value)


def transfer_seconds(had: dict[int, set], has: dict[int, set], cfg: GPTConfig, links,
                     bytes_per_value: int = PAPER_BYTES) -> tuple[float, float]:
    """move_seconds on holdings by device (the devices of `links`): what `has` places where `had` did not."""
    size = item_bytes(cfg, bytes_per_value)
    worst, total = 0.0, 0.0
    for d, items in sources_of(had, has, links.rate_Bps).items():
        by_source: dict[int, float] = {}  # one message from each source: its items together
        for item, src in items.items():
            by_source[src] = by_source.get(src, 0.0) + size[item[0]]
        src = np.array(list(by_source))
        path = links.path(src, np.full(len(src), d))
        fresh = path.initial_window()
        arrive = path.transfer(np.array(list(by_source.values())), fresh)[0]
        spent = path.rtt_s + links.protocol.p2p_handshake * links.delay_s[d, src] + arrive
        total += sum(by_source.values())
        worst = max(worst, float(spent.max()))
    return worst, total


def predict_replanned(sim, cand, cfg: GPTConfig, batch: int, timeline, iterations: int,
                      min_gain: float = 0.0, lead: int = REPLAN_LEAD) -> tuple[list[PredictedIteration], list[Replan]]:
    """`iterations` of a scheduled system's candidate (ours, dtfm) under `timeline`, re-planning as ours'
    runtime does (harness/systems/ours/replan.py): at the first iteration boundary after changes the
    scheduler searches on the links as they are (its seconds paid before that iteration), and a plan faster
    by more than `min_gain` (a fraction) than the one last chosen, whose gain over the iterations left pays
    for its moves (the links as they are), starts `lead` - 1 iterations later, after them."""
    if not registry.get(cand.system).scheduled or cand.resimulate is None or cand.layout is None:
        raise SimError(f"{cand.system}: only a scheduled system re-plans (its scheduler runs again on the links as "
                       "they are)")
    current, chosen = {"cand": cand}, {"cand": cand}  # the plan running, the plan last chosen
    pending: dict[int, tuple] = {}  # first iteration of a chosen plan -> (its candidate, search s, before, after)
    replans: list[Replan] = []

    def seconds_at(topo_now) -> float:
        return current["cand"].resimulate(timeline_links(sim, topo_now))

    def at_boundary(topo_now, iteration: int, changed: bool) -> float | None:
        pause = None
        links = timeline_links(sim, topo_now)
        if iteration in pending:
            new, plan_s, before, after = pending.pop(iteration)
            moved_s, moved = move_seconds(current["cand"].layout, new.layout, cfg, links)
            replans.append(Replan(iteration, plan_s, moved_s, moved, new.config["pipelines"], before, after,
                                  iteration - lead + 1))
            current["cand"] = new  # simulated from now on the simulator of the run's devices (resimulate takes links)
            pause = moved_s
        if changed:
            t0 = time.perf_counter()
            other = sim.on_links_of(topo_now)
            (new,) = other.run(cand.system, cfg, batch)
            plan_s = time.perf_counter() - t0
            pause = (pause or 0.0) + plan_s
            before, after = chosen["cand"].resimulate(links), new.resimulate(links)
            start = iteration + lead - 1  # worth it if the iterations left on it pay for its moves
            moves_s = move_seconds(chosen["cand"].layout, new.layout, cfg, links)[0]
            if after < before * (1.0 - min_gain) and (before - after) * (iterations - start) > moves_s:
                chosen["cand"] = new
                pending[iteration + lead - 1] = (new, plan_s, before, after)
        return pause

    pred = predict_iterations(timeline, sim.topo, iterations, seconds_at, at_boundary)
    return pred, replans
