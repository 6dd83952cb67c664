"""A run's layout on the devices it has left: what a restart (or a re-plan) after a preemption runs on.

One rule for the simulator's prediction (sim/preemption.py) and the emulated cluster's elastic agent
(train/elastic.py), so that the two recover onto the same layouts. On all the run's devices: the options as
given. On fewer: the tensor and pipeline degrees given with the replicas the devices allow (a restart's fixed
model-parallel configuration); a system that re-plans also any other pipeline depth, the nearest first; only
degrees whose replicas split the batch (the layout rule would refuse the others, after its search). When no
option lays out the devices, the one with the least bandwidth to the rest waits as a spare and the rule tries
again on the others; for a system that goes on from its survivors' memory, not a device that alone holds some
part of the model while another can wait instead (its state would be lost).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..layout import Layout, LayoutError
from ..scenario import Topology
from . import systems as registry
from .request import LayoutRequest, RunRequest


@dataclass(frozen=True)
class SubsetLayout:
    devices: tuple[int, ...]  # the run's device ids the layout runs on, in its rank order
    layout: Layout  # over ranks 0 .. len(devices) - 1
    search_s: float  # the layout rule's seconds (the scheduler's search, for ours)


def request_of(system: str, layout: Layout, budget: int | None = None) -> LayoutRequest:
    """The options of `system`'s layout rule that give `layout`'s degrees (tp, pp, dp, zero; those it takes),
    and its scheduler's `budget` (a system that searches)."""
    taken = registry.get(system).layout_fields
    values = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "zero": layout.zero, "budget": budget}
    return LayoutRequest(**{k: v for k, v in values.items()
                            if k in taken and v is not None and not (k == "zero" and v == 0)})


def options_on(base: RunRequest, n_all: int, n: int) -> list[LayoutRequest]:
    """The layout options to try on n of the run's n_all devices (module docstring)."""
    want = base.layout
    # a rule that takes no degrees lays out any n itself
    if n == n_all or not registry.get(base.run.system).layout_fields & {"tp", "pp", "dp"}:
        return [want]
    cfg, mb, batch = base.model.cfg, base.model.micro_batch, base.model.batch
    tp = want.tp or 1
    per = batch // mb if batch % mb == 0 else 0

    def fits(pp: int) -> bool:
        return n % (tp * pp) == 0 and pp <= cfg.layers and per > 0 and per % (n // (tp * pp)) == 0

    given = want.pp or 1
    pps = [given] if fits(given) else []
    if registry.get(base.run.system).recovery == "replan":
        pps += sorted((pp for pp in range(1, cfg.layers + 1) if pp != given and fits(pp)),
                      key=lambda pp: (abs(pp - given), pp))
    return [replace(want, pp=pp, dp=n // (tp * pp)) for pp in pps]


def layout_on(base: RunRequest, topo: Topology, devices, held: dict[int, set] | None = None
              ) -> tuple[SubsetLayout | None, str]:
    """(the layout of `base` on the largest laid-out set of `devices` (the run's ids on `topo`, the run's whole
    topology), or None; the rule's last refusal). `held`: what each device holds now (layout/holdings), for a
    system that goes on from its survivors' memory."""
    from .layouts import resolve_layout

    devices, why = sorted(devices), ""
    bw = np.asarray(topo.bandwidth_gbps, dtype=float)
    while devices:
        sub, t0 = topo.subset(devices), time.perf_counter()
        for want in options_on(base, topo.n, len(devices)):
            try:
                lay, _ = resolve_layout(replace(base, layout=want), sub)
            except LayoutError as e:
                why = str(e)
                continue
            return SubsetLayout(tuple(devices), lay, time.perf_counter() - t0), why
        worst = min(_spare_candidates(devices, held or {}), key=lambda d: sum(bw[d, e] for e in devices if e != d))
        devices = [d for d in devices if d != worst]
    return None, why


def _spare_candidates(devices: list[int], held: dict[int, set]) -> list[int]:
    """The devices that may wait as a spare: those whose every item another of `devices` holds too (all, when
    none is)."""
    def kept_elsewhere(d: int) -> bool:
        return all(any(item in held.get(e, ()) for e in devices if e != d) for item in held.get(d, ()))
    return [d for d in devices if kept_elsewhere(d)] or devices
