"""Devices that leave and come back, predicted: the time to N iterations of a system under a timeline's device
events (scenario/preemption.py), with each recovery's cost from the same models as the rest of the simulator;
the same timeline's link events change the links under it: `predict_spot` is sim/timeline.py's one loop of runs
that change (`predict_run`) with this module's recoveries (an iteration a change falls inside runs as a fluid), so
a timeline with both is one prediction, as the emulator runs it.

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
- "quorum" (DiLoCo on torchft): the replicas left go on and one back heals from a peer (_QuorumRecoveries, with
  the system's sim/quorum.QuorumModel).
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

import numpy as np

from ..compute.model import GPTConfig, stage_params
from ..plan import systems as registry
from ..scenario.preemption import (HEARTBEAT_S, KEEPALIVE_MISSED, KEEPALIVE_S, LAST_CALL_S, DeviceEvent,
                                   device_events)
from .replan import item_bytes, transfer_seconds
from .systems import SimError
from .survivor_plans import Plan, SurvivorPlanner
from .timeline import AGAIN, Disruptions, PredictedIteration, RunState, predict_run

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

    def search(self, plan: "Plan") -> float:
        return plan.search_s if self.search_s is None else self.search_s


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
    iterations: list[PredictedIteration] = field(default_factory=list)
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


def _state_bytes(held: dict, cfg: GPTConfig) -> dict[int, float]:
    """What each device writes to a checkpoint: its items' parameters x what training keeps beside the gradient."""
    size = item_bytes(cfg)
    return {d: sum(size[i[0]] for i in items) for d, items in held.items()}


def predict_spot(sim, system: str, cfg: GPTConfig, batch: int, timeline, iterations: int,
                 model: RecoveryModel = RecoveryModel(), layout=None, options: dict | None = None) -> SpotPrediction:
    """`iterations` useful iterations of `system` on the simulator's scenario under `timeline`'s device events
    and link events, from t = 0: the one loop of runs that change (sim/timeline.predict_run) with this module's
    recoveries; see the module docstring. An iteration that a link change falls inside runs as a fluid: the share
    done so far stays done, the rest goes at the new links' pace; a recovery's moves and re-mesh go over the links
    in force. `layout`: a LayoutRequest of options for the system's layout rule (e.g. DeepSpeed's zero); `options`:
    the system's own (e.g. DiLoCo's sync_every), over their defaults."""
    if registry.get(system).recovery == "quorum" and not model.restart_all:
        recoveries = _QuorumRecoveries(sim, system, cfg, batch, timeline, iterations, model, layout, options)
    else:
        recoveries = _Recoveries(sim, system, cfg, batch, timeline, iterations, model, layout, options)
    run = predict_run(timeline, sim.topo, iterations, recoveries)
    recoveries.finished(run)
    out = recoveries.out
    out.iterations, out.total_s = run.iterations, run.t
    return out


class _Recoveries(Disruptions):
    """Devices that leave and come back, and how the system recovers (module docstring): the plan in force, the
    devices up, the events to come, the last checkpoint; what it cost goes to `out`."""

    def __init__(self, sim, system: str, cfg: GPTConfig, batch: int, timeline, iterations: int,
                 model: RecoveryModel, layout, options: dict | None = None):
        self.sim, self.cfg, self.model, self.N, self.source = sim, cfg, model, iterations, timeline.source
        self.recovery = "restart" if model.restart_all else registry.get(system).recovery
        self.planner = SurvivorPlanner(sim, system, cfg, batch, layout, options)
        timed, self.by_iteration = device_events(timeline, sim.topo, _horizon(self.planner, iterations, model))
        self.events = list(timed)
        self.storage_Bps = model.storage_gbps * 1e9
        self.out = SpotPrediction(system)
        self.up, self.ready_at = set(range(sim.topo.n)), {d: 0.0 for d in range(sim.topo.n)}
        self.plan = self.planner.plan(self.up)
        if self.plan is None or len(self.plan.devices) < sim.topo.n:
            raise SimError(f"{system}: no layout on the {sim.topo.n} devices of {sim.topo.name}: {self.planner.why}")
        self.last_ckpt, self.considered = 0, frozenset(self.plan.devices)

    @property
    def devices(self) -> int:
        return len(self.plan.devices)

    def finished(self, run: RunState) -> None:
        """The run has its iterations."""

    def pop(self, until: float) -> list[DeviceEvent]:
        due = [e for e in self.events if e.at_s <= until]
        del self.events[:len(due)]
        for e in due:
            _apply(e, self.up, self.ready_at, self.model)
        return due

    def due(self, run: RunState) -> list[DeviceEvent]:
        """The device events due at this boundary, applied: those timed before now and those of this iteration."""
        due = self.pop(run.t)
        for e in [e for e in self.by_iteration if e.at_iteration <= len(run.iterations)]:
            self.by_iteration.remove(e)
            _apply(e, self.up, self.ready_at, self.model, at=run.t)
            due.append(e)
        return due

    def restart(self, run: RunState, at: float, why: str, flight_s: float, detect: float, rendezvous: bool) -> None:
        """From the last checkpoint on the devices there after `detect`; `rendezvous`: torchrun's, whose last
        call waits while nodes are missing."""
        model = self.model
        self.pop(at + detect)
        ready = {d for d in self.up if self.ready_at[d] <= at + detect}
        new = self.planner.plan(ready)
        wait = model.torchrun_last_call_s if rendezvous and len(self.up) < self.sim.topo.n else 0.0
        lost = len(run.iterations) - self.last_ckpt
        run.t = at + detect + wait + model.start()
        if new is not None and self.last_ckpt > 0:
            run.t += max(_state_bytes(new.held, self.cfg).values()) / self.storage_Bps
        self.out.recoveries.append(Recovery(
            at, why, "restart", detect_s=detect, restart_s=run.t - at - detect, lost_iterations=lost + int(flight_s > 0),
            lost_s=flight_s + sum(i.seconds for i in run.iterations[self.last_ckpt:]),
            devices_after=0 if new is None else len(new.devices)))
        del run.iterations[self.last_ckpt:]
        self.plan, self.considered = new, frozenset(ready)

    def replan(self, run: RunState, at: float, why: str, flight_s: float, kind: str, detect: float,
               without=frozenset()) -> None:
        self.pop(at + detect)
        survivors = {d for d in self.up if self.ready_at[d] <= at + detect} - without
        had = {d: items for d, items in self.plan.held.items() if d in self.up}
        new = self.planner.plan(survivors, had)
        if new is None or not _all_held(had, new.held):  # ours' launcher starts every rank again
            return self.restart(run, at, f"{why}; no copy of some stage survives", flight_s, detect, rendezvous=False)
        links = run.net.links(self.sim)
        moved_s = transfer_seconds(had, new.held, self.cfg, links)[0] if new.held != had else 0.0
        remesh = 2.0 * 2.0 * max(float(links.delay_s[new.devices[0], d]) for d in new.devices)
        start = self.model.start()  # ours' runtime starts its processes again (train/snapshots.py)
        searched = self.model.search(new)
        run.t = at + detect + searched + start + moved_s + remesh
        self.out.recoveries.append(Recovery(at, why, kind, detect_s=detect, replan_s=searched, transfer_s=moved_s,
                                            remesh_s=remesh, restart_s=start, lost_iterations=int(flight_s > 0),
                                            lost_s=flight_s, devices_after=len(new.devices)))
        self.plan, self.considered = new, frozenset(survivors)

    def boundary(self, run: RunState, changed: bool) -> float | str:
        """Device events due, a recovery, a warned device leaving or a device back joining (AGAIN), else a
        declined search and a checkpoint (run.t moves) before the iteration."""
        model, t, done, out = self.model, run.t, len(run.iterations), self.out
        due = self.due(run)
        if self.plan is None:  # no layout on the devices left: wait for one to come back
            if not self.events:
                raise SimError(f"{out.system}: no device left to train on and none comes back ({self.source})")
            out.idle_s += self.events[0].at_s - t
            run.t = self.events[0].at_s
            self.pop(run.t)
            self.restart(run, run.t, "devices back", 0.0, 0.0, rendezvous=self.recovery == "restart")
            return AGAIN
        plan = self.plan
        lost = [e for e in due if e.kind == "preempt" and e.device in plan.devices]
        if lost:
            if self.recovery == "replan":
                self.replan(run, t, lost[0].describe(), 0.0, "replan", model.detect_s)
            else:
                self.restart(run, t, lost[0].describe(), 0.0, model.torchrun_detect_s, rendezvous=True)
            return AGAIN
        # at a boundary: a warned device leaves the plan now (replan systems), a device back joins
        if self.recovery == "replan":
            warned = [e for e in self.events if e.kind == "preempt" and e.device in plan.devices
                      and e.at_s - e.notice_s <= t < e.at_s]
            if warned:
                survivors = {d for d in self.up if self.ready_at[d] <= t} - {e.device for e in warned}
                new = self.planner.plan(survivors, plan.held)
                if new is not None and _all_held(plan.held, new.held):
                    cost = model.search(new) + transfer_seconds(plan.held, new.held, self.cfg, run.net.links(self.sim))[0]
                    if t + cost <= min(e.at_s for e in warned):
                        self.replan(run, t, warned[0].describe() + " (on notice)", 0.0, "graceful", 0.0,
                                    without=frozenset(e.device for e in warned))
                        return AGAIN
        leaving = {e.device for e in self.events if e.kind == "preempt" and e.at_s - e.notice_s <= t}
        ready = frozenset(d for d in self.up if self.ready_at[d] <= t and d not in leaving)
        if ready - self.considered:
            if self.recovery == "restart":
                self.restart(run, t, f"device(s) {sorted(ready - self.considered)} back", 0.0, 0.0, rendezvous=True)
                return AGAIN
            new = self.planner.plan(ready, plan.held)
            self.considered = ready
            now = self.planner.seconds(plan, run.net)
            then = None if new is None else self.planner.seconds(new, run.net)
            if new is not None and then < now:
                cost = model.search(new) + transfer_seconds(plan.held, new.held, self.cfg, run.net.links(self.sim))[0]
                if (now - then) * (self.N - done) > cost:
                    self.replan(run, t, f"device(s) {sorted(set(new.devices) - set(plan.devices))} back", 0.0, "join",
                                0.0)
                    return AGAIN
            if new is not None:
                searched = model.search(new)
                run.t, out.declined_search_s = run.t + searched, out.declined_search_s + searched
        if model.checkpoint_every and done > self.last_ckpt and done % model.checkpoint_every == 0:
            write = max(_state_bytes(plan.held, self.cfg).values()) / self.storage_Bps
            run.t += write
            out.checkpoints, out.checkpoint_s, self.last_ckpt = out.checkpoints + 1, out.checkpoint_s + write, done
        return 0.0

    def seconds(self, run: RunState) -> float:
        return self.planner.seconds(self.plan, run.net)

    def stop(self, until: float):
        """A device of the plan leaving before `until`."""
        return next((e for e in self.events if e.at_s < until and e.kind == "preempt"
                     and e.device in self.plan.devices), None)

    def interrupted(self, run: RunState, hit, begin: float) -> None:
        flight = hit.at_s - begin
        self.pop(hit.at_s)
        if self.recovery == "replan":
            self.replan(run, hit.at_s, hit.describe(), flight, "replan", self.model.detect_s)
        else:
            self.restart(run, hit.at_s, hit.describe(), flight, self.model.torchrun_detect_s, rendezvous=True)

    def completed(self, run: RunState, end: float) -> None:
        self.pop(end)


class _QuorumRecoveries(_Recoveries):
    """A quorum system's way through devices that leave and come back (DiLoCo on torchft; train/quorum_agent.py
    runs it): no restart and no checkpoint.
    - A replica lost: the others go on with the iteration in flight. Their next quorum (at the end of the iteration
      of their next sync) waits for the lost one until its heartbeats have stopped, at most the join timeout
      (QuorumModel.wait_s); then they are a smaller quorum, each keeping its share of the batch (an iteration
      trains fewer samples, as the runtime's do). The lost replica's inner steps since its last sync are work no
      outer step holds: the row's lost_iterations (a replica's steps, not the run's; nothing is redone).
    - A device back: its process starts (RecoveryModel.start), takes its own turn of inner steps on its stale
      model (lost_iterations), joins the others' first quorum after that and heals from a peer in it: the peer's
      state over the link, which the others' sync waits for (transfer_s).
    - Replicas that are pipelines (DiLoCo's `--replica-stages`): a device lost takes its pipeline, the others keep
      theirs as placed (SurvivorPlanner.keeping_pipelines); a pipeline is back when all its devices are, and each
      stage heals from the same stage of a pipeline in the quorum, all at once (its share of the state).
    The wait and the heal are what the run pays. Left out: replicas' drift (a replica lost inside a sync costs
    those still in it the sync timeout), the Lighthouse's device leaving (the runtime refuses such a run), and a
    run whose every replica leaves (an error: nothing to heal from)."""

    def __init__(self, sim, system: str, cfg, batch: int, timeline, iterations: int, model, layout, options):
        super().__init__(sim, system, cfg, batch, timeline, iterations, model, layout, options)
        lay, order = self.plan.layout, self.plan.devices
        self.whole = self.plan if lay is not None and lay.pp > 1 else None  # replicas that are pipelines: kept
        self.replicas = ([tuple(order[d] for d in p) for p in lay.pipelines] if self.whole
                         else [(d,) for d in order])  # the run's device ids, a replica's in stage order
        self.quorum = registry.get(system).quorum_model_of(cfg, options, sim.topo.n)  # a sim/quorum.QuorumModel
        self.waits: list[tuple[int, Recovery]] = []  # (the boundary it is paid at, a loss's row)
        self.during: list = []  # the device events during the last iteration, taken at the boundary after it

    def boundary(self, run: RunState, changed: bool) -> float | str:
        t, done, q = run.t, len(run.iterations), self.quorum
        changed_plan = False
        due, self.during = self.during + self.due(run), []
        for e in (e for e in due if e.kind == "preempt" and e.device in self.plan.devices):
            gone = next(r for r in self.replicas if e.device in r)
            left = [d for d in self.plan.devices if d not in gone]
            if not left:
                raise SimError(f"{self.out.system}: every replica has left at t={e.at_s:g} s ({self.source}): "
                               "no peer to heal from, and a quorum system keeps no checkpoint")
            step, at = self.seconds(run), t if e.at_s is None else e.at_s
            # the iteration it was lost in: a timed event is taken at the boundary after it, one at an iteration
            # as that iteration begins
            inside = done if e.at_s is None or not done else done - 1
            sync = inside + q.turn - 1 - inside % q.turn  # the iteration whose end is the others' next quorum
            to_quorum = t + (sync - done + 1) * step - at
            self.waits.append((sync + 1, Recovery(at, e.describe(), "quorum", detect_s=q.wait_s(to_quorum),
                                                  lost_iterations=inside % q.turn, devices_after=len(left))))
            self.plan, changed_plan = self._plan_on(left), True
        for row in [row for at, row in self.waits if at <= done]:  # the others' quorum waited at this boundary
            self.waits = [(at, r) for at, r in self.waits if r is not row]
            run.t += row.detect_s
            self.out.recoveries.append(row)
        if done and done % q.turn == 0 and not changed_plan:  # a quorum just ended: replicas ready join it
            step = self.seconds(run)
            back = [r for r in self.replicas if r[0] not in self.plan.devices and all(
                d in self.up and self.ready_at[d] + q.turn * step <= t for d in r)]  # started, then a turn of steps
            if back:
                heal = max(self._heal_s(run.net.links(self.sim), r) for r in back)
                run.t += heal
                devices = sorted(d for r in back for d in r)
                self.plan = self._plan_on(set(self.plan.devices) | set(devices))
                self.out.recoveries.append(Recovery(t, f"device(s) {devices} back", "join", transfer_s=heal,
                                                    lost_iterations=q.turn * len(back),
                                                    devices_after=len(self.plan.devices)))
                changed_plan = True
        return AGAIN if changed_plan else 0.0

    def _plan_on(self, devices) -> Plan:
        return self.planner.keeping_pipelines(self.whole, devices) if self.whole else self.planner.plan(devices)

    def _heal_s(self, links, replica: tuple) -> float:
        """A replica back takes a peer's state: the first replica's in the quorum, each stage from the same stage
        (its share of the model's state), all at once."""
        q, plan = self.quorum, self.plan
        if not self.whole:
            return q.heal_s(links, plan.devices[0], replica[0])
        peer = [plan.devices[d] for d in plan.layout.pipelines[0]]
        share = np.asarray(stage_params(self.cfg, list(plan.layout.layers_per_stage))) / self.cfg.params
        return max(replace(q, heal_bytes=q.heal_bytes * share[j]).heal_s(links, peer[j], d)
                   for j, d in enumerate(replica))

    def stop(self, until: float):
        return None  # a replica lost does not stop the others' iteration

    def completed(self, run: RunState, end: float) -> None:
        self.during += self.pop(end)

    def finished(self, run: RunState) -> None:
        """A loss whose quorum came after the last iteration: its row, with no wait paid."""
        self.out.recoveries += [replace(row, detect_s=0.0) for _, row in self.waits]
        self.out.recoveries.sort(key=lambda r: r.at_s)


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


def _horizon(planner: SurvivorPlanner, iterations: int, model: RecoveryModel) -> float:
    """How far in time to draw a spot market: ten times the undisturbed run, and an hour at least."""
    plan = planner.plan(range(planner.sim.topo.n))
    undisturbed = (plan.seconds if plan else 1.0) * iterations
    return max(3600.0, 10.0 * undisturbed + 10.0 * model.torchrun_last_call_s)
