"""A system's layouts on sets of a run's devices, as devices leave and come back (sim/preemption.py asks): each
set's layout is its layout rule's (plan/survivors.layout_on, as `harness run` recovers), searched once and
simulated on the links in force."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..compute import PAPER_BYTES
from ..compute.model import GPTConfig
from ..layout.holdings import holdings
from ..plan import systems as registry
from ..plan.survivors import layout_on
from .timeline import ChangingLinks, timeline_links


@dataclass(frozen=True)
class Plan:
    devices: tuple[int, ...]  # the run's device ids, in the subset's order
    seconds: float  # an iteration on the scenario's links
    search_s: float
    held: dict  # run's device id -> what it holds (layout/holdings.holdings)
    layout: object = None  # its Layout, to simulate it again on links that changed


class SurvivorPlanner:
    """Layouts of a system on sets of the run's devices, cached (a set's search is measured once)."""

    def __init__(self, sim, system: str, cfg: GPTConfig, batch: int, layout=None, options: dict | None = None):
        from ..plan.request import LayoutRequest

        self.sim, self.entry, self.cfg, self.batch = sim, registry.get(system), cfg, batch
        self.layout, self.options = layout or LayoutRequest(), options
        # a quorum's replicas keep their share of the batch: the global batch follows the devices in it (DiLoCo's
        # runtime); every other system trains the whole batch on the devices it has
        self.share = batch // sim.topo.n if self.entry.recovery == "quorum" else None
        self.cache: dict[frozenset, Plan | None] = {}
        self.seconds_cache: dict[tuple, float] = {}
        self.why = ""  # the rule's last refusal

    def plan(self, devices, held: dict | None = None) -> Plan | None:
        """`held`: what the devices hold now (layout_on keeps a device that alone holds some item). A layout
        on every device of the set is the same whatever they hold: searched once."""
        each = frozenset(devices)
        every = self.cache.get((each, None))
        kept = None
        if held is not None and not (every is not None and len(every.devices) == len(each)):
            kept = {d: items for d, items in held.items() if d in each}
        key = (each, None if kept is None else frozenset((d, frozenset(i)) for d, i in kept.items()))
        if key not in self.cache:
            self.cache[key] = self._search(sorted(key[0]), kept)
        return self.cache[key]

    def keeping_pipelines(self, whole: Plan, devices) -> Plan | None:
        """`whole`'s pipelines that lie within `devices`, as they were placed: a quorum system whose replicas are
        pipelines keeps them (DiLoCo's `--replica-stages`: a pipeline leaves and comes back whole, each stage
        healing from the same stage of a peer), where the layout rule would place the devices anew. None: no
        pipeline lies within them."""
        each = frozenset(devices)
        if ("pipelines", each) not in self.cache:
            lay, order = whole.layout, whole.devices  # lay's devices are positions in `order`
            kept = [p for p in lay.pipelines if all(order[d] in each for d in p)]
            plan = None
            if kept:
                ids = sorted(order[d] for p in kept for d in p)
                local = {g: k for k, g in enumerate(ids)}
                mesh = tuple(tuple((local[order[p[j]]],) for p in kept) for j in range(lay.pp))
                sub = replace(lay, dp=len(kept), mesh=mesh)
                held = {ids[k]: items for k, items in holdings(sub).items()}
                plan = Plan(tuple(ids), 0.0, 0.0, held, sub)
                plan = replace(plan, seconds=self._simulate(plan, self.sim.topo))
            self.cache[("pipelines", each)] = plan
        return self.cache[("pipelines", each)]

    def _search(self, devices: list[int], held: dict | None) -> Plan | None:
        from ..plan.request import ModelSection, NetworkSection, RunRequest, RunSection

        sim, topo = self.sim, self.sim.topo
        base = RunRequest(network=NetworkSection(scenario=topo.name, mode="none"),
                          model=ModelSection(name=self.cfg.name, layers=self.cfg.layers,
                                             batch=self.batch_on(len(devices)), micro_batch=sim.micro_batch),
                          run=RunSection(system=self.entry.name,
                                         options=self.entry.resolve_options(self.options or {})),
                          layout=self.layout)
        found, self.why = layout_on(base, topo, devices, held)
        if found is None:
            return None
        devices, lay = list(found.devices), found.layout
        held = {devices[k]: items for k, items in holdings(lay).items()}
        plan = Plan(tuple(devices), 0.0, found.search_s, held, lay)
        return replace(plan, seconds=self._simulate(plan, topo))

    def _simulate(self, plan: Plan, topo) -> float:
        sim, devices = self.sim, list(plan.devices)
        links = timeline_links(sim, topo.subset(devices))
        profiles = [sim.profiles[d] for d in devices]
        return float(self.entry.simulate_layout_fn(self.options)(links, profiles, self.cfg, self.batch_on(len(devices)),
                                                                 plan.layout, sim.micro_batch, PAPER_BYTES)[0])

    def batch_on(self, devices: int) -> int:
        """The global batch an iteration on `devices` devices trains."""
        return self.batch if self.share is None else self.share * devices

    def seconds(self, plan: Plan, links: ChangingLinks) -> float:
        """An iteration of `plan` on the links as they are now (the scenario's when nothing changed them)."""
        if not links.changed:
            return plan.seconds
        key = (plan.devices, id(plan.layout), links.key())
        if key not in self.seconds_cache:
            self.seconds_cache[key] = self._simulate(plan, links.topology())
        return self.seconds_cache[key]
