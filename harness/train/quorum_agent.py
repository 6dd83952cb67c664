"""torchft's way through a device that leaves and comes back: no restart. Every replica is a job of its own (as
torchft deploys them: one per replica group, nothing shared but the Lighthouse), so a preempted device takes only
its replica; the others go on, and the Lighthouse's next quorum leaves it out (its heartbeats stopped). A device
that comes back starts a new job for its replica, which asks to join at its first sync and heals from a peer
(torchft's checkpoint transport: the peer's parameters, optimizers and iteration), then trains with the rest.

The agent (for a system whose registry entry says recovery="quorum": DiLoCo) starts a job per replica (the
layout's pipelines: one device, or one of ours' pipelines, a rank a stage), kills the job of a preempted device
(the cloud took the machine; a pipeline goes with any of its devices), starts one for a replica whose devices are
all back at the iteration the others are in (each of its ranks heals from the same rank of a peer), and waits for
every job still there to finish. The jobs find the Lighthouse's
address in the run's quorum directory (LIGHTHOUSE_FILE), where the Lighthouse's rank writes it; its device must
stay to the end. Its account, as the elastic agent's (elastic.py): the run's iterations (every job's merged by
iteration), the jobs started ("generations"), the events, and per loss or return a "restart" row for
recoveries.csv: when the quorum went on without the device (detect_s: from the preemption to the first outer sync
another replica committed without it), the inner steps the lost replica had taken since its last sync
(lost_iterations: work no outer step holds), and for a return the job's start (restart_s: its fork to training)
and its heal (state_moved_s: its fork to the end of its first sync, where it took a peer's state).
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

from ..network.timeline_program import device_notices, notices_end
from ..plan.request import RunSpec
from . import journals
from .launch import GRACE_S, RankFailure, describe_exit, run_child, stop_children
from .stats import IterationStats, merge_stats

POLL_S = 0.05
LIGHTHOUSE_FILE = "lighthouse"  # in the quorum directory: the Lighthouse's address, as its rank wrote it
#: a job that serves the others after its own training (the Lighthouse's) marks this in its journal, then waits
#: for ENDED_FILE in the quorum directory, which the agent writes once every other job is gone or done
STAYING_MARK = "staying"
ENDED_FILE = "ended"


def lighthouse_file(journal: str) -> Path:
    """Where a job finds the Lighthouse's address: in the quorum directory, the parent of every job's journal."""
    return Path(journal).parent / LIGHTHOUSE_FILE


def ended_file(journal: str) -> Path:
    """Where a job staying for the others learns that they are done (STAYING_MARK)."""
    return Path(journal).parent / ENDED_FILE


class _Job:
    """A replica's job: one process a device (its ranks, in the replica's order)."""

    def __init__(self, index: int, devices: tuple, begin: int, journal: Path, procs: list, forked: float):
        self.index, self.devices, self.begin, self.journal, self.procs = index, devices, begin, journal, procs
        self.forked, self.killed = forked, None

    @property
    def live(self) -> bool:
        return self.killed is None and any(p.exitcode is None for p in self.procs)

    def done(self) -> bool:
        """Preempted, or every rank ended well or stays for the others (STAYING_MARK)."""
        return self.killed is not None or all(p.exitcode == 0 or STAYING_MARK in journals.rank_marks(self.journal, r)
                                              for r, p in enumerate(self.procs))

    def kill(self, at: float) -> None:
        for p in self.procs:
            journals.kill(p)
        self.killed = at

    def to_json(self, t0: float) -> dict:
        return {"generation": self.index, "devices": list(self.devices), "start_iteration": self.begin,
                "started_s": self.forked - t0, **({} if self.killed is None else {"preempted_s": self.killed - t0})}


def run_quorum(spec: RunSpec, topo, start_rank, *, workdir: Path, label=lambda d: f"device {d}") -> dict:
    """Train `spec` on `topo`'s devices, a job per replica (module docstring): the layout's pipelines, one device
    each or one of ours' pipelines (its devices in stage order). `start_rank(spec, devices, generation, journal)`
    gives the function a job's rank r runs (on devices[r]). Returns {"stats", "generations", "events"} as
    elastic.run_elastic; raises RankFailure when a job fails by itself or the run's timeout passes."""
    ctx = mp.get_context("fork")
    run, fault = spec.run, spec.debug if spec.debug.fault_mode == "preempt" else None
    t0 = time.monotonic()
    deadline, pos = t0 + run.timeout_s, notices_end()
    units = [tuple(int(d) for d in p) for p in spec.layout.pipelines]
    unit_of = {d: u for u in units for d in u}
    up = set(range(topo.n))
    jobs: list[_Job] = []
    events: list[dict] = []

    def start(unit: tuple, begin: int) -> None:
        journal = Path(workdir) / f"job-{len(jobs)}-device-{'-'.join(map(str, unit))}"
        (journal / "results").mkdir(parents=True)
        target = start_rank(spec.with_resolved(start_iteration=begin), unit, len(jobs), str(journal))
        procs = [ctx.Process(target=run_child, args=(r, target, str(journal / "results"), os.getpid()),
                             name=f"device{d}") for r, d in enumerate(unit)]
        for p in procs:
            p.start()
        jobs.append(_Job(len(jobs), unit, begin, journal, procs, time.monotonic()))

    def preempted(job: _Job, device: int, at: float, **why) -> None:
        job.kill(at)  # a replica of several devices goes with any of them
        events.append({"event": "preempt", "device": device, "at_s": at - t0, **why})

    for u in units:
        start(u, spec.resolved.start_iteration)
    try:
        while True:
            if time.monotonic() > deadline:
                raise RankFailure(f"quorum agent: timed out after {run.timeout_s:g} s")
            got, pos = device_notices(pos)
            for kind, d, at in got:
                live = [j for j in jobs if d in j.devices and j.live]
                if kind == "preempt":
                    up.discard(d)
                    for j in live:
                        preempted(j, d, at)
                elif kind == "return":
                    up.add(d)
                    if not live and all(x in up for x in unit_of[d]):  # its replica's devices are all back
                        events.append({"event": "return", "device": d, "at_s": at - t0})
                        start(unit_of[d], _iteration_under_way(jobs))
                elif kind == "notice":  # torchft knows nothing of notices: the replica trains until it goes
                    events.append({"event": "notice", "device": d, "at_s": at - t0})
            for j in jobs:  # first the debug section's preemption (the rank took itself): its job's other ranks
                for r, p in enumerate(j.procs):  # may have failed on its closed connections meanwhile
                    if fault is not None and j.devices[r] == fault.fault_rank and p.exitcode == -signal.SIGKILL:
                        up.discard(j.devices[r])
                        preempted(j, j.devices[r], time.monotonic(), by="debug fault")
                        fault = None
            for j in (j for j in jobs if j.killed is None):
                for r, p in enumerate(j.procs):
                    if p.exitcode not in (None, 0):
                        raise RankFailure(describe_exit(r, p.exitcode, j.journal / "results",
                                                        lambda _r, d=j.devices[r]: label(d)))
            if all(j.killed is not None or all(p.exitcode == 0 for p in j.procs) for j in jobs):
                break
            if all(j.done() for j in jobs):
                (Path(workdir) / ENDED_FILE).touch()  # the jobs staying for the others may go
            time.sleep(POLL_S)
    finally:
        stop_children([p for j in jobs for p in j.procs], GRACE_S)
    streams = [(j, r, journals.result(j.journal / "results", r).stats if j.killed is None else
                journals.journaled(j.journal / f"stats-{r}.jsonl")) for j in jobs for r in range(len(j.devices))]
    stats = _merged(streams, max(run.warmup, spec.resolved.start_iteration), run.warmup + run.iters, len(units))
    return {"stats": stats, "generations": [j.to_json(t0) for j in jobs],
            "events": events + _recoveries(streams, events, t0)}


def _iteration_under_way(jobs: list[_Job]) -> int:
    """The iteration the replicas still there are in: one past the last any of them journaled (0 before any)."""
    done = [s.iteration for j in jobs if j.killed is None for s in journals.journaled(j.journal / "stats-0.jsonl")]
    return max(done) + 1 if done else 0


def _merged(streams: list[tuple[_Job, int, list[IterationStats]]], first: int, end: int,
            replicas: int) -> list[IterationStats]:
    """The run's iterations: for each, every rank in step that took it (a stream: a job's rank and its iterations),
    merged on one clock, its time from the end of the one before (never earlier: a wait is counted where it fell).
    A rank is out of step from a sync it dropped (a peer was lost inside it: its steps since the last sync are
    thrown away) and the ranks of a job started for a replica back are out of step from its start, each until its
    next committed sync, where it healed from a peer: its steps until then were on a stale model, and lost. Every
    rank's outer syncs are kept, the dropped ones too."""
    by_it: dict[int, list[IterationStats]] = {}
    took: dict[int, list[IterationStats]] = {}
    syncs: dict[int, list[dict]] = {}
    for job, _, stats in streams:
        in_step = job.index < replicas  # the first jobs: the run's replicas at its start
        for s in stats:
            rows = s.outer_syncs or []
            for r in rows:  # a job back heals in the others' sync: the row has their iteration, the step its own
                syncs.setdefault(r["iteration"], []).append(r)
            took.setdefault(s.iteration, []).append(s)
            dropped = any(not r["committed"] for r in rows)
            if in_step and not dropped:
                by_it.setdefault(s.iteration, []).append(s)
            if dropped:
                in_step = False
            elif rows and not in_step:
                in_step = True  # healed in this sync: counted from the next step
    missing = [i for i in range(first, end) if i not in took]
    if missing:
        raise RankFailure(f"quorum agent: iteration {missing[0]} was never completed")
    out = []
    for i in range(first, end):
        taken = by_it.get(i) or took[i]  # none in step (every job dropped its sync): what was taken
        merged = merge_stats([[s] for s in taken])[0]
        merged.end, merged.iteration = max(s.end for s in taken), i
        merged.outer_syncs = syncs.get(i) or None
        out.append(merged)
    for prev, s in zip(out, out[1:]):
        s.end = max(s.end, prev.end)
        s.seconds = s.end - prev.end
        s.exposed_comm_seconds = max(0.0, s.seconds - s.compute_seconds)
    return out


def _recoveries(streams, events: list[dict], t0: float) -> list[dict]:
    """A "restart" row (recoveries.csv) per replica lost and per replica back (module docstring); a replica of
    several devices counts the steps every one of its ranks completed."""
    rows = []
    for ev in (e for e in events if e["event"] in ("preempt", "return")):
        d, at = ev["device"], t0 + ev["at_s"]
        if ev["event"] == "preempt":
            job = next(j for j, _, _ in streams if d in j.devices and j.killed is not None
                       and math.isclose(j.killed, at))
            mine = [stats for j, _, stats in streams if j is job]
            synced = [row["iteration"] for stats in mine for s in stats for row in (s.outer_syncs or [])]
            last_sync = max(synced, default=job.begin - 1)
            lost = min(sum(1 for s in stats if s.iteration > last_sync) for stats in mine)
            others = [row for j, _, ss in streams for s in ss for row in (s.outer_syncs or [])
                      if row["rank"] not in job.devices]
            # a sync of the others that ends after the loss may still hold the lost replica (it was lost after
            # sending its part): without it is a committed one of a smaller quorum than the last before the loss
            before = max((r["participants"] for r in others if r["end"] <= at and r["committed"]), default=None)
            without = [r["end"] for r in others if r["end"] > at and r["committed"]
                       and (before is None or r["participants"] < before)]
            rows.append({"event": "restart", "after": "preempt", "devices": list(job.devices),
                         "generation": job.index, "at_s": (min(without) if without else at) - t0,
                         "detect_s": (min(without) - at) if without else None, "stop_s": 0.0, "last_call_s": 0.0,
                         "replan_s": 0.0, "from": "quorum", "resumed_from": None, "lost_iterations": lost,
                         "in_flight": 0})
        else:
            job = next(j for j, _, _ in streams if d in j.devices and j.forked >= at)
            mine = [stats for j, _, stats in streams if j is job]
            marks = journals.marks(job.journal, len(job.devices))
            syncs = sorted(row["end"] for stats in mine for s in stats for row in (s.outer_syncs or []))
            before = min(sum(1 for s in stats if syncs and s.end <= syncs[0]) for stats in mine)  # its heal's too
            rows.append({"event": "restart", "after": "return", "devices": list(job.devices),
                         "generation": job.index, "at_s": at - t0, "detect_s": None, "stop_s": 0.0,
                         "last_call_s": 0.0, "replan_s": 0.0,
                         "restart_s": marks["training"] - job.forked if "training" in marks else None,
                         "restart_marks_s": {"state_moved": syncs[0] - job.forked} if syncs else {},
                         "from": "peer", "resumed_from": job.begin, "lost_iterations": before, "in_flight": 0})
    return rows
