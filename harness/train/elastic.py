"""torchrun's elastic agent, as the emulated cluster's launcher runs it: training that restarts from its last
checkpoint on the devices it has when a device leaves or comes back.

The timeline controller (network/timeline_control.py) cuts a preempted device's links and tells the launcher
(timeline_program.device_notices), which kills the device's rank: the cloud took the machine. Nobody else knows
yet: every rank touches a keep-alive file every `run.keepalive_s` (rank.keep_alive), and the agent declares
the device gone once KEEPALIVE_MISSED of them are missed, as torchrun's rendezvous does (the survivors meanwhile
wait on a peer whose packets no longer arrive). Then, as torchrun: every rank of the generation is stopped; with
fewer devices than the run's, the rendezvous waits its last call (`run.last_call_s`) for more; the layout rule
lays the run out on the devices there (plan/survivors.py: the same rule the simulator recovers with); a new
generation of ranks starts from the last complete checkpoint (train/checkpoint.py; none: from the run's start)
and redoes every iteration since. A device that comes back makes the agent restart the same way, on more
devices (torchrun: a node waiting to join).

A system that recovers by re-planning (ours) goes on from its survivors' memory instead (train/snapshots.py):
its ranks keep what they hold after each iteration, the agent forgets a preempted device's, re-plans (the same
layout rule) and starts the next generation from the last iteration every item of the new layout survived in;
each rank takes what its device held and receives the rest from a surviving replica over the links. Only the
iteration in flight is lost; where no survivor holds some item, the run goes on from its checkpoint as above.
Warned of a preemption (a timeline's notice_s, a cloud's notice), it loses nothing: the agent stops the ranks
as the iteration the last of them is in ends (every rank has kept it), and the next generation goes on from
there without the device, whose stages others hold (else it waits for the preemption). A device back joins
the same way, at the next boundary. torchrun's agent knows nothing of notices, and restarts at once when a
node joins: the baselines go on until the device goes, and lose the iteration in flight when one comes back.
The processes still restart (their groups are rebuilt from scratch): what that costs is in each event's marks.

Every rank journals its timed iterations as it takes them (stats.Journal), so a stopped generation's iterations
are kept: an iteration's figures are those of the last generation that did it, and its time is from the end of
the iteration before (a recovery shows in the first iteration after it). Each event's record: when the device
left (or came back), when the agent knew, how long the stop, the last call and the restart took, the checkpoint
it went on from and the iterations lost.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..network.timeline_program import device_notices, notices_end
from ..layout.holdings import holdings
from ..plan import systems as registry
from ..plan.request import RunRequest, RunSpec
from ..plan.survivors import layout_on, request_of
from ..scenario.preemption import KEEPALIVE_MISSED
from . import checkpoint, journals, snapshots
from .launch import GRACE_S, RankFailure, describe_exit, run_child, stop_children
from .stats import IterationStats, merge_stats

POLL_S = 0.05


def has_device_events(topo) -> bool:
    return topo.timeline is not None and bool(topo.timeline.devices or topo.timeline.spot)


def under_agent(spec: RunSpec, topo) -> bool:
    """Whether `spec` runs under the agent: devices leave (a timeline's, or the debug section's preempt fault)."""
    return has_device_events(topo) or spec.debug.fault_mode == "preempt"


def run_elastic(spec: RunSpec, topo, start_rank: Callable[[RunSpec, tuple, int, str], Callable[[int], object]],
                *, workdir: Path, label: Callable[[int], str] = lambda d: f"device {d}") -> dict:
    """Train `spec` on `topo`'s devices under the agent (module docstring). `start_rank(spec, devices, generation,
    journal)` gives the function a generation's rank r runs (on device devices[r]). Returns {"stats": the useful
    iterations (IterationStats, in order), "generations": [...], "events": [...], and for a system that
    recovers from memory "memory": the directory its devices' memory was in (removed)}; raises RankFailure when a rank
    fails by itself, no layout fits the devices left, or the run's timeout passes."""
    recovery = registry.get(spec.run.system).recovery
    if recovery == "quorum":  # no restart: torchft's quorum goes on without a replica lost
        from .quorum_agent import run_quorum

        return run_quorum(spec, topo, start_rank, workdir=workdir, label=label)
    if recovery != "replan":
        return _agent(spec, topo, start_rank, workdir, label, None)
    # the devices' memory: the node's tmpfs where there is one (what a rank keeps there is the size of its stage)
    memory = Path(tempfile.mkdtemp(prefix="harness-memory-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                                   else workdir.parent))
    try:
        return {**_agent(spec, topo, start_rank, workdir, label, memory), "memory": str(memory)}
    finally:
        shutil.rmtree(memory, ignore_errors=True)


def _agent(spec: RunSpec, topo, start_rank, workdir: Path, label, memory: Path | None) -> dict:
    """run_elastic; `memory`: where the ranks keep their snapshots (train/snapshots.py), for a system that
    recovers from its survivors' memory."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n, run = topo.n, spec.run
    base = RunRequest(network=spec.network, model=spec.model, run=run,
                      layout=request_of(run.system, spec.layout, spec.replan.budget))
    first_start, ckpt_dir = spec.resolved.start_iteration, spec.resolved.checkpoint_dir
    t0 = time.monotonic()  # the events' clock: the agent's start
    deadline = t0 + run.timeout_s
    alive, down_at, pos = set(range(n)), {}, notices_end()  # earlier runs' notices are theirs
    generations, events, kept = [], [], {}
    began = None  # when the run's first timed iteration began (time.monotonic())
    start, devices, layout, pending = first_start, tuple(range(n)), spec.layout, None
    found, recover = None, None  # the next generation's layout, and its RecoveryPlan (JSON) from memory
    history = []  # (generation, devices, layout) of every generation so far: whose copies a recovery may use
    # the debug section's preempt fault (its device dies at a point of an iteration, or after a while): once
    fault = spec.debug if spec.debug.fault_mode == "preempt" else None
    no_fault = replace(spec.debug, fault_rank=None, fault_mode="kill", fault_iteration=None, fault_notice_s=0.0)
    fault_why = {} if fault is None else {"by": "debug fault", **({} if fault.fault_iteration is None else {
        "iteration": fault.fault_iteration, "during": fault.fault_phase})}
    warned, due = {}, None  # devices under notice (when it came); the debug fault's device once warned: when it goes

    def preempted(d: int, at: float, **why) -> None:
        alive.discard(d)
        warned.pop(d, None)
        down_at[d] = at
        if memory is not None:
            snapshots.forget(memory, d)
        events.append({"event": "preempt", "device": d, "at_s": at - t0, **why})

    def warn(d: int, at: float, **why) -> None:
        warned[d] = at
        events.append({"event": "notice", "device": d, "at_s": at - t0, **why})

    def take_notices() -> list[tuple[str, int, float]]:
        nonlocal pos
        got, pos = device_notices(pos)
        for kind, d, at in got:
            if kind == "notice":
                warn(d, at)
            elif kind == "preempt":
                preempted(d, at)
            elif kind == "return":
                alive.add(d)
                events.append({"event": kind, "device": d, "at_s": at - t0})
        return got

    while True:
        g = len(generations)
        if g:  # the layout on the devices there (decided when the last one ended)
            devices, layout = found.devices, found.layout
        history.append((g, tuple(devices), layout))
        gspec = replace(spec, layout=layout, debug=spec.debug if fault else no_fault).with_resolved(
            start_iteration=start)
        if memory is not None:
            gspec = gspec.with_resolved(snapshots={"root": str(memory), "generation": g, "recover": recover})
        if start != first_start and recover is None:  # from the run's own checkpoint
            gspec = replace(gspec, run=replace(run, resume=ckpt_dir))
        journal = Path(workdir) / f"generation-{g}"
        journal.mkdir(parents=True)
        if ckpt_dir:
            checkpoint.drop_after(Path(ckpt_dir), start)
        target = start_rank(gspec, devices, g, str(journal))
        outdir = journal / "results"
        outdir.mkdir()
        forked = time.monotonic()
        procs = [ctx.Process(target=run_child, args=(r, target, str(outdir), os.getpid()), name=f"rank{r}")
                 for r in range(len(devices))]
        for p in procs:
            p.start()
        gen = {"generation": g, "devices": list(devices), "layout": layout.to_json(), "start_iteration": start,
               "started_s": forked - t0}
        generations.append(gen)
        if pending is not None:
            pending["restart_began"] = forked
        why, waiting, hit, target = None, set(), set(), None
        try:
            while why is None:
                if time.monotonic() > deadline:
                    raise RankFailure(f"elastic agent: timed out after {run.timeout_s:g} s")
                for kind, d, _ in take_notices():
                    if kind == "preempt" and d in devices:  # the machine is gone: its processes with it
                        journals.kill(procs[devices.index(d)])
                        hit.add(d)
                    elif kind == "return":  # its agent starts and waits to join
                        waiting.add(d)
                codes = [p.exitcode for p in procs]
                if fault and fault.fault_rank in devices:  # the debug fault's device (rank.arm_fault)
                    d = fault.fault_rank
                    told = None if d in warned else journals.read_time(journal / f"notice-{devices.index(d)}")
                    if told is not None:  # warned at the point the fault names
                        warn(d, told, **fault_why)
                        due = (d, told + fault.fault_notice_s)
                    if codes[devices.index(d)] == -signal.SIGKILL:  # and taken
                        preempted(d, time.monotonic(), **fault_why)
                        hit.add(d)
                        fault = due = None
                if due is not None and time.monotonic() >= due[1] and due[0] not in devices:
                    preempted(*due, **fault_why)  # it left the run on notice; now it is gone
                    fault = due = None
                for r, c in enumerate(codes):
                    if c not in (None, 0) and not hit:  # a rank failed by itself: the run fails
                        raise RankFailure(describe_exit(r, c, outdir, lambda r: label(devices[r])), rank=r)
                if all(c == 0 for c in codes):
                    why = "done"
                    break
                now = time.monotonic()
                # a device whose keep-alives stopped, and that is gone (a rank that failed on a gone peer
                # waits with the others: its device's agent is still there)
                missed = [devices[r] for r, c in enumerate(codes) if c != 0 and devices[r] not in alive
                          and now - _last_beat(journal, r, forked) > run.keepalive_s * KEEPALIVE_MISSED]
                # a system that re-plans changes its devices between iterations: a device under notice leaves,
                # one back joins, as the iteration the last rank is in ends (torchrun's agent restarts at once)
                leaving = [d for d in warned if d in devices] if memory is not None else []
                if (leaving or waiting) and memory is not None and target is None:
                    kept_now = _kept(memory, g, devices)
                    target = 1 + (start if None in kept_now else min(kept_now))
                between = memory is None or (target is not None and _at_boundary(
                    memory, g, devices, target, journal, max(run.warmup, start)))
                if missed:
                    why = ("lost", missed, now)
                elif leaving and between and _covered(layout, devices, leaving):
                    why = ("notice", leaving, now)  # its stages held by others
                elif waiting and between:
                    why = ("joined", sorted(waiting), now)
                else:
                    time.sleep(POLL_S)
        finally:
            stop_children(procs, GRACE_S)
        if why == "done":  # every rank's own account (a system that journals nothing has it here too)
            per_rank = [journals.result(outdir, r).stats for r in range(len(devices))]
        else:
            per_rank = [journals.journaled(journal / f"stats-{r}.jsonl") for r in range(len(devices))]
        first = max(run.warmup, start)
        for i, s in enumerate(_iterations(per_rank, layout.to_json())):
            kept[first + i] = s
            if began is None:
                began = s.end - s.seconds
        gen["iterations"] = min(map(len, per_rank), default=0)
        if pending is not None:
            restarted, marks = pending.pop("restart_began"), journals.marks(journal, len(devices))
            # forked to training, every rank; and to each milestone on the way (process group, state moved, ...)
            pending["restart_s"] = marks["training"] - restarted if "training" in marks else None
            pending["restart_marks_s"] = {m: at - restarted for m, at in marks.items()}
            pending = None
        if why == "done":
            break
        kind, who, known = why
        stopped = time.monotonic()
        # iterations done when it stopped (a generation that timed one had done its warm-up ones too)
        done = first + gen["iterations"] if gen["iterations"] else start
        # torchrun's rendezvous waits for more devices; a system that re-plans goes on with those there
        wait_s = _last_call(run.last_call_s, n, alive, take_notices) if kind == "lost" and memory is None else 0.0
        if kind == "notice":  # the devices leaving send nothing in the next generation: their copies are not sources
            for d in who:
                snapshots.forget(memory, d)
        there = alive - set(warned)  # a device under notice is not planned on
        held = None if memory is None else \
            {devices[r]: items for r, items in holdings(layout).items() if devices[r] in there}
        found, why_not = layout_on(base, topo, there, held)
        if found is None:
            raise RankFailure(f"elastic agent: no layout of {run.system} on devices {sorted(there)}: {why_not}")
        recover, why_not = None, ""
        if memory is not None:  # from the survivors' memory, where every item of the new layout survived
            plan, source, why_not = snapshots.latest_recovery_plan(memory, history, found.devices, found.layout,
                                                                   topo.bandwidth_gbps)
            recover = None if plan is None else {**plan.to_json(), "generation": source}
        resume = recover["iteration"] if recover else \
            (checkpoint.latest(Path(ckpt_dir)) if ckpt_dir else None) or first_start
        after = {"lost": "preempt", "notice": "notice", "joined": "return"}[kind]
        pending = {"event": "restart", "after": after, "devices": who,
                   "generation": g, "at_s": known - t0,
                   "detect_s": (known - max(down_at[d] for d in who)) if kind == "lost" else None,
                   "stop_s": stopped - known, "last_call_s": wait_s, "replan_s": found.search_s,
                   "resumed_from": resume, "from": "memory" if recover else "checkpoint" if resume else "start",
                   **({"why_not_memory": why_not} if memory is not None and not recover else {}),
                   # done, then redone from the checkpoint (warm-up included), as the simulator counts them; the
                   # iteration the ranks had begun when a device went is in flight, lost too
                   # (a system that re-plans stops its ranks between iterations on a notice or a return: none)
                   "lost_iterations": max(0, done - resume),
                   "in_flight": int(kind == "lost" or (kind == "joined" and memory is None))}
        events.append(pending)
        start = resume
    steps = run.warmup + run.iters
    want = range(max(run.warmup, first_start), steps)
    missing = [i for i in want if i not in kept]
    if missing:
        raise RankFailure(f"elastic agent: iteration {missing[0]} was never completed")
    stats = [kept[i] for i in want]
    # the first one's time from when the run's first timed iteration began (in whichever generation): the
    # iterations add up to the run's time, every restart in it, though a later generation redid them all
    stats[0].seconds = stats[0].end - (began if began is not None else t0)
    return {"stats": stats, "generations": generations, "events": events}


def _last_beat(journal: Path, rank: int, since: float) -> float:
    """The time.monotonic() of rank `rank`'s last keep-alive (rank.keep_alive; the launcher and its ranks share
    one kernel's clock), or `since` before its first."""
    beat = journals.read_time(journal / f"alive-{rank}")
    return since if beat is None else beat


def _kept(memory: Path, generation: int, devices) -> list[int | None]:
    """The last iteration each device of a generation kept in memory in it (None: nothing yet)."""
    return [max((k for g, k in snapshots.saved(memory, d) if g == generation), default=None) for d in devices]


def _at_boundary(memory: Path, generation: int, devices, target: int, journal: Path, timed_from: int) -> bool:
    """Every rank of the generation has kept iteration `target` (or a later one) and journaled the timed ones
    before it (from iteration `timed_from`): they are between iterations, or in the next one, with a common
    copy to go on from."""
    kept = _kept(memory, generation, devices)
    if any(k is None for k in kept) or min(kept) < target:
        return False
    return all(len(journals.journaled(journal / f"stats-{r}.jsonl")) >= target - timed_from
               for r in range(len(devices)))


def _covered(layout, devices, leaving) -> bool:
    """Every item the devices leaving hold is held by another device of the layout too."""
    held = {devices[r]: items for r, items in holdings(layout).items()}
    rest = set().union(*(items for d, items in held.items() if d not in leaving))
    return all(held.get(d, set()) <= rest for d in leaving)


def _last_call(wait_s: float, n: int, alive: set, take_notices) -> float:
    """torchrun's rendezvous with fewer nodes than the most: it closes after its last call, or at once when
    every device is there again. Returns the seconds waited."""
    t0 = time.monotonic()
    while len(alive) < n and time.monotonic() - t0 < wait_s:
        take_notices()
        time.sleep(POLL_S)
    return time.monotonic() - t0


def _iterations(per_rank: list[list[IterationStats]], layout: dict) -> list[IterationStats]:
    """The iterations every rank of a generation finished: merged (one clock), with their end and layout."""
    n = min(map(len, per_rank), default=0)
    if n == 0:
        return []
    cut = [r[:n] for r in per_rank]
    merged = merge_stats(cut, shared_clock=True)
    for i, s in enumerate(merged):
        s.end = max(r[i].end for r in cut)
        s.layout = layout
    return merged
