"""Devices that leave and come back, predicted: the time to N iterations of a system under a timeline's device
events (scenario/preemption.py), with each recovery's cost from the same models as the rest of the simulator;
the same timeline's link events change the links under it as they do in sim/timeline.py (an iteration a change
falls inside runs as a fluid), so a timeline with both is one prediction, as the emulator runs it.

A system recovers as its registry entry says (plan.systems.System.recovery):
- "replan" (ours): the survivors learn of a lost device within DETECT_S (ours' heartbeat), run the scheduler on the
  devices left (its seconds measured here, as `sim --replan` does, or given: RecoveryModel.search_s), receive what
  their new stages lack from a surviving holder (sim/replan.transfer_seconds: fresh TCP connections over the links),
  rebuild their process groups (REMESH: two round trips to the store) and redo the iteration in flight: nothing else
  is lost. Its runtime does this in new processes (train/snapshots.py: the state from the survivors' memory), so a
  process start is paid too (restart_s). With a notice, the plan without the device is taken at the first boundary
  after the warning when it is in place before the device goes (nothing lost). A device back joins at a boundary
  once its process has started, when the plan with it is faster and pays for its moves over the iterations left.
  Where no survivor holds some block, the run restarts from its last checkpoint, as below.
- "restart" (Megatron, DeepSpeed, ... under torchrun's elastic agent): torchrun's rendezvous declares a node
  gone after its keep-alive misses (TORCHRUN_DETECT_S = 5 s x 3, torch's defaults), waits its last call for
  more nodes (TORCHRUN_LAST_CALL_S, when below the most nodes), starts every process again (start_s),
  loads the last checkpoint and redoes every iteration since. A node that comes back makes the agents
  restart the job the same way (membership changed), on more devices.
A layout on the devices left is the system's layout rule (as `harness run` plans it; the tensor and pipeline
degrees given stay, the replicas follow the devices; ours may take another pipeline depth) on the largest
set of them it can lay out, dropping the devices with the least bandwidth to the rest first (a layout needs its
stages and replicas to divide the devices and the batch); the others wait as spares.
Checkpoints (every `checkpoint_every` iterations; none: a restart starts from iteration 0): every device
writes what it holds beside the gradient (values, master copy, momentum) at `storage_gbps`, all at once.
"""
from __future__ import annotations

import functools
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace

from ..compute import PAPER_BYTES
from ..netmodel.links import Links
from ..compute.model import GPTConfig
from ..plan import systems as registry
from ..plan.survivors import layout_on
from ..scenario.preemption import (HEARTBEAT_S, KEEPALIVE_MISSED, KEEPALIVE_S, LAST_CALL_S, DeviceEvent,
                                   device_events)
from ..layout.holdings import holdings
from .replan import item_bytes, transfer_seconds
from .systems import SimError
from .timeline import ChangingLinks, fluid_iteration, timeline_links

#: ours' failure detector: a heartbeat every HEARTBEAT_S, a device gone after KEEPALIVE_MISSED missed
DETECT_S = HEARTBEAT_S * KEEPALIVE_MISSED
#: torchrun's c10d rendezvous (scenario/preemption.py): a node gone after its keep-alives missed; below max
#: nodes, the rendezvous closes after its last call
TORCHRUN_DETECT_S = KEEPALIVE_S * KEEPALIVE_MISSED
TORCHRUN_LAST_CALL_S = LAST_CALL_S
#: a checkpoint's write and read rate per device when not given (a local NVMe drive, GB/s): an assumption
STORAGE_GBPS = 2.0


@functools.cache
def measured_start_s() -> float:
    """A training process's start on this machine: Python with torch and torch.distributed imported."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True, capture_output=True)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class RecoveryModel:
    checkpoint_every: int | None = None
    storage_gbps: float = STORAGE_GBPS
    start_s: float | None = None  # None: measured_start_s()
    search_s: float | None = None  # a re-plan's scheduler search; None: each one timed here as it runs
    detect_s: float = DETECT_S
    torchrun_detect_s: float = TORCHRUN_DETECT_S
    torchrun_last_call_s: float = TORCHRUN_LAST_CALL_S
    restart_all: bool = False  # every system restarts under torchrun's agent (as `harness run` recovers, so far)

    def start(self) -> float:
        return measured_start_s() if self.start_s is None else self.start_s

    def search(self, plan: "_Plan") -> float:
        return plan.search_s if self.search_s is None else self.search_s


@dataclass(frozen=True)
class SpotIteration:
    iteration: int  # the useful iteration it completed (0-based)
    start_s: float
    seconds: float
    devices: int  # devices it ran on


@dataclass(frozen=True)
class Recovery:
    at_s: float  # the event (or the boundary a re-plan was taken at)
    event: str
    kind: str  # replan | graceful | join | restart
    detect_s: float = 0.0
    replan_s: float = 0.0  # the scheduler's search
    transfer_s: float = 0.0  # weights and optimizer state to their new places
    remesh_s: float = 0.0  # process groups rebuilt
    restart_s: float = 0.0  # rendezvous wait, process start and checkpoint load
    lost_iterations: int = 0  # useful iterations redone (the one in flight counts when it had begun)
    lost_s: float = 0.0  # work done and thrown away
    devices_after: int = 0

    @property
    def seconds(self) -> float:
        return self.detect_s + self.replan_s + self.transfer_s + self.remesh_s + self.restart_s


@dataclass
class SpotPrediction:
    system: str
    iterations: list[SpotIteration] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    checkpoints: int = 0
    checkpoint_s: float = 0.0
    declined_search_s: float = 0.0  # searches for a device back whose plan was not taken
    idle_s: float = 0.0  # no layout on the devices left: waiting for one to come back
    total_s: float = 0.0

    def accounted_s(self) -> float:
        """Where the time went: iterations kept, recoveries (with the work they threw away), checkpoints,
        declined searches, idling; equal to total_s."""
        return (sum(i.seconds for i in self.iterations) + sum(r.seconds + r.lost_s for r in self.recoveries)
                + self.checkpoint_s + self.declined_search_s + self.idle_s)

    @property
    def useful_per_hour(self) -> float:
        return len(self.iterations) / self.total_s * 3600.0 if self.total_s > 0 else 0.0


@dataclass(frozen=True)
class _Plan:
    devices: tuple[int, ...]  # the run's device ids, in the subset's order
    seconds: float  # an iteration on the scenario's links
    search_s: float
    held: dict  # run's device id -> what it holds (layout/holdings.holdings)
    layout: object = None  # its Layout, to simulate it again on links that changed


class _Planner:
    """Layouts of a system on sets of the run's devices, cached (a set's search is measured once)."""

    def __init__(self, sim, system: str, cfg: GPTConfig, batch: int, layout=None):
        from ..plan.request import LayoutRequest

        self.sim, self.entry, self.cfg, self.batch = sim, registry.get(system), cfg, batch
        self.layout = layout or LayoutRequest()
        self.cache: dict[frozenset, _Plan | None] = {}
        self.seconds_cache: dict[tuple, float] = {}
        self.why = ""  # the rule's last refusal

    def plan(self, devices, held: dict | None = None) -> _Plan | None:
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

    def _search(self, devices: list[int], held: dict | None) -> _Plan | None:
        from ..plan.request import ModelSection, NetworkSection, RunRequest, RunSection

        sim, topo = self.sim, self.sim.topo
        base = RunRequest(network=NetworkSection(scenario=topo.name, mode="none"),
                          model=ModelSection(name=self.cfg.name, layers=self.cfg.layers, batch=self.batch,
                                             micro_batch=sim.micro_batch),
                          run=RunSection(system=self.entry.name), layout=self.layout)
        found, self.why = layout_on(base, topo, devices, held)
        if found is None:
            return None
        devices, lay = list(found.devices), found.layout
        held = {devices[k]: items for k, items in holdings(lay).items()}
        plan = _Plan(tuple(devices), 0.0, found.search_s, held, lay)
        return replace(plan, seconds=self._simulate(plan, topo))

    def _simulate(self, plan: _Plan, topo) -> float:
        sim, devices = self.sim, list(plan.devices)
        links = timeline_links(sim, topo.subset(devices))
        profiles = [sim.profiles[d] for d in devices]
        return float(self.entry.simulate_layout_fn()(links, profiles, self.cfg, self.batch, plan.layout,
                                                     sim.micro_batch, PAPER_BYTES)[0])

    def seconds(self, plan: _Plan, links: ChangingLinks) -> float:
        """An iteration of `plan` on the links as they are now (the scenario's when nothing changed them)."""
        if not links.changed:
            return plan.seconds
        key = (plan.devices, id(plan.layout), links.key())
        if key not in self.seconds_cache:
            self.seconds_cache[key] = self._simulate(plan, links.topology())
        return self.seconds_cache[key]


def _state_bytes(held: dict, cfg: GPTConfig) -> dict[int, float]:
    """What each device writes to a checkpoint: its items' parameters x what training keeps beside the gradient."""
    size = item_bytes(cfg)
    return {d: sum(size[i[0]] for i in items) for d, items in held.items()}


def predict_spot(sim, system: str, cfg: GPTConfig, batch: int, timeline, iterations: int,
                 model: RecoveryModel = RecoveryModel(), layout=None) -> SpotPrediction:
    """`iterations` useful iterations of `system` on the simulator's scenario under `timeline`'s device events
    and link events, from t = 0; see the module docstring. An iteration that a link change falls inside runs
    as a fluid (as sim/timeline.predict_iterations): the share done so far stays done, the rest goes at the
    new links' pace; a recovery's moves and re-mesh go over the links in force. `layout`: a LayoutRequest
    of options for the system's layout rule (e.g. DeepSpeed's zero)."""
    recovery = "restart" if model.restart_all else registry.get(system).recovery
    planner, N = _Planner(sim, system, cfg, batch, layout), iterations
    horizon = _horizon(planner, N, model)
    timed, by_iteration = device_events(timeline, sim.topo, horizon)
    events = list(timed)
    storage_Bps = model.storage_gbps * 1e9
    net = ChangingLinks(timeline, sim.topo)
    out = SpotPrediction(system)
    up, ready_at = set(range(sim.topo.n)), {d: 0.0 for d in range(sim.topo.n)}
    plan = planner.plan(up)
    if plan is None or len(plan.devices) < sim.topo.n:
        raise SimError(f"{system}: no layout on the {sim.topo.n} devices of {sim.topo.name}: {planner.why}")
    t, done, last_ckpt, considered = 0.0, 0, 0, frozenset(plan.devices)

    def pop(until: float) -> list[DeviceEvent]:
        due = [e for e in events if e.at_s <= until]
        del events[:len(due)]
        for e in due:
            _apply(e, up, ready_at, model)
        return due

    def ckpt_load_s(p: _Plan) -> float:
        return max(_state_bytes(p.held, cfg).values()) / storage_Bps

    def restart(at: float, why: str, flight_s: float, detect: float, rendezvous: bool) -> None:
        """From the last checkpoint on the devices there after `detect`; `rendezvous`: torchrun's, whose last
        call waits while nodes are missing."""
        nonlocal t, done, plan, considered
        pop(at + detect)
        ready = {d for d in up if ready_at[d] <= at + detect}
        new = planner.plan(ready)
        wait = model.torchrun_last_call_s if rendezvous and len(up) < sim.topo.n else 0.0
        lost = done - last_ckpt
        t = at + detect + wait + model.start()
        if new is not None and last_ckpt > 0:
            t += ckpt_load_s(new)
        out.recoveries.append(Recovery(at, why, "restart", detect_s=detect, restart_s=t - at - detect,
                                       lost_iterations=lost + int(flight_s > 0),
                                       lost_s=flight_s + sum(i.seconds for i in out.iterations[last_ckpt:done]),
                                       devices_after=0 if new is None else len(new.devices)))
        del out.iterations[last_ckpt:]
        done, plan, considered = last_ckpt, new, frozenset(ready)

    def replan(at: float, why: str, flight_s: float, kind: str, detect: float, without=frozenset()) -> None:
        nonlocal t, plan, considered
        pop(at + detect)
        survivors = {d for d in up if ready_at[d] <= at + detect} - without
        had = {d: items for d, items in plan.held.items() if d in up}
        new = planner.plan(survivors, had)
        if new is None or not _all_held(had, new.held):  # ours' launcher starts every rank again
            return restart(at, f"{why}; no copy of some stage survives", flight_s, detect, rendezvous=False)
        links = net.links(sim)
        moved_s = transfer_seconds(had, new.held, cfg, links)[0] if new.held != had else 0.0
        remesh = 2.0 * 2.0 * max(float(links.delay_s[new.devices[0], d]) for d in new.devices)
        start = model.start()  # ours' runtime starts its processes again (train/snapshots.py)
        searched = model.search(new)
        t = at + detect + searched + start + moved_s + remesh
        out.recoveries.append(Recovery(at, why, kind, detect_s=detect, replan_s=searched, transfer_s=moved_s,
                                       remesh_s=remesh, restart_s=start, lost_iterations=int(flight_s > 0),
                                       lost_s=flight_s, devices_after=len(new.devices)))
        plan, considered = new, frozenset(survivors)

    while done < N:
        net.advance(t, done)
        due = pop(t)
        for e in [e for e in by_iteration if e.at_iteration <= done]:  # iteration events: at this boundary
            by_iteration.remove(e)
            _apply(e, up, ready_at, model, at=t)
            due.append(e)
        if plan is None:  # no layout on the devices left: wait for one to come back
            if not events:
                raise SimError(f"{system}: no device left to train on and none comes back ({timeline.source})")
            out.idle_s += events[0].at_s - t
            t = events[0].at_s
            pop(t)
            restart(t, "devices back", 0.0, 0.0, rendezvous=recovery == "restart")
            continue
        lost = [e for e in due if e.kind == "preempt" and e.device in plan.devices]
        if lost:
            if recovery == "replan":
                replan(t, lost[0].describe(), 0.0, "replan", model.detect_s)
            else:
                restart(t, lost[0].describe(), 0.0, model.torchrun_detect_s, rendezvous=True)
            continue
        # at a boundary: a warned device leaves the plan now (replan systems), a device back joins
        if recovery == "replan":
            warned = [e for e in events if e.kind == "preempt" and e.device in plan.devices
                      and e.at_s - e.notice_s <= t < e.at_s]
            if warned:
                survivors = {d for d in up if ready_at[d] <= t} - {e.device for e in warned}
                new = planner.plan(survivors, plan.held)
                if new is not None and _all_held(plan.held, new.held):
                    cost = model.search(new) + transfer_seconds(plan.held, new.held, cfg, net.links(sim))[0]
                    if t + cost <= min(e.at_s for e in warned):
                        replan(t, warned[0].describe() + " (on notice)", 0.0, "graceful", 0.0,
                               without=frozenset(e.device for e in warned))
                        continue
        leaving = {e.device for e in events if e.kind == "preempt" and e.at_s - e.notice_s <= t}
        ready = frozenset(d for d in up if ready_at[d] <= t and d not in leaving)
        if ready - considered:
            if recovery == "restart":
                restart(t, f"device(s) {sorted(ready - considered)} back", 0.0, 0.0, rendezvous=True)
                continue
            new = planner.plan(ready, plan.held)
            considered = ready
            now, then = planner.seconds(plan, net), None if new is None else planner.seconds(new, net)
            if new is not None and then < now:
                cost = model.search(new) + transfer_seconds(plan.held, new.held, cfg, net.links(sim))[0]
                if (now - then) * (N - done) > cost:
                    replan(t, f"device(s) {sorted(set(new.devices) - set(plan.devices))} back", 0.0, "join", 0.0)
                    continue
            if new is not None:
                searched = model.search(new)
                t, out.declined_search_s = t + searched, out.declined_search_s + searched
        if model.checkpoint_every and done > last_ckpt and done % model.checkpoint_every == 0:
            write = max(_state_bytes(plan.held, cfg).values()) / storage_Bps
            t += write
            out.checkpoints, out.checkpoint_s, last_ckpt = out.checkpoints + 1, out.checkpoint_s + write, done
        # one iteration, unless a device of the plan leaves during it; a link change inside it applies to the rest
        begin = t
        end, T, changed, hit = fluid_iteration(
            t, net, lambda: planner.seconds(plan, net), timeline.source, done,
            lambda until: next((e for e in events if e.at_s < until and e.kind == "preempt"
                                and e.device in plan.devices), None))
        if hit is None:
            out.iterations.append(SpotIteration(done, begin, end - begin if changed else T, len(plan.devices)))
            pop(end)
            t, done = end, done + 1
            continue
        flight = hit.at_s - begin
        pop(hit.at_s)
        if recovery == "replan":
            replan(hit.at_s, hit.describe(), flight, "replan", model.detect_s)
        else:
            restart(hit.at_s, hit.describe(), flight, model.torchrun_detect_s, rendezvous=True)
    out.total_s = t
    return out


def _apply(e: DeviceEvent, up: set, ready_at: dict, model: RecoveryModel, at: float | None = None) -> None:
    t = e.at_s if at is None else at
    if e.kind == "preempt":
        up.discard(e.device)
    else:
        up.add(e.device)
        ready_at[e.device] = t + model.start()


def _all_held(had: dict, has: dict) -> bool:
    """Every item `has` places is held by some device of `had`."""
    held = set().union(*had.values()) if had else set()
    return all(items <= held for items in has.values())


def _horizon(planner: _Planner, iterations: int, model: RecoveryModel) -> float:
    """How far in time to draw a spot market: ten times the undisturbed run, and an hour at least."""
    plan = planner.plan(range(planner.sim.topo.n))
    undisturbed = (plan.seconds if plan else 1.0) * iterations
    return max(3600.0, 10.0 * undisturbed + 10.0 * model.torchrun_last_call_s)
