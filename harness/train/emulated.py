"""Run training specs inside the emulated cluster (network/emulate.py) and read the ranks back.

The host writes the specs to a work directory the cluster can see (hostfs under UML),
starts `harness.train.emulated_guest` once in launcher mode, and reads its JSON
outcome per run. Several runs on one topology share one boot of the cluster, one set of
imports and one warm-up (`record_in_one_boot`): each run is still its own fork of fresh
ranks, with its own manifest, records and log, written as soon as the run ends. Every
failure (a rank, the cluster, a timeout, a stop) becomes a RankFailure with the reason,
so the run's manifest says `failed` and why.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from ..errors import HarnessError
from .launch import RankFailure
from ..files import atomic_write_json, atomic_write_text
from ..scenario import Topology
from .emulated_guest import BEGIN_MARK, END_MARK
from ..plan.request import RunSpec
from .rank import PROGRESS_PREFIX
from .stats import IterationStats
from ..network.headroom import GUEST_CPU, CpuMonitor, Headroom, read_guest, samples_csv


class RunCpu:
    """The emulated cluster's CPU during one run, on its ranks' clock (time.monotonic in the cluster)."""

    def __init__(self, monitor: CpuMonitor, wall_minus_monotonic: float, guest: Path | None = None):
        self.monitor, self.offset, self.guest = monitor, wall_minus_monotonic, guest

    def windows(self, spans: list[tuple[float, float]]) -> list[Headroom | None]:
        """The headroom of each (t0, t1) on the ranks' clock; the guest's samples read once for all of them."""
        guest = read_guest(self.guest) if self.guest else None
        return [self.monitor.window(t0, t1, self.offset, guest) for t0, t1 in spans]

    def csv(self, t0: float, t1: float) -> str:
        return samples_csv(self.monitor.series(t0, t1, self.offset), self.monitor.capacity)

    @property
    def capacity(self) -> float:
        return self.monitor.capacity

TAIL_CHARS = 2000
#: Wall-clock allowance per run on top of its own timeout (cluster set-up, imports, teardown).
RUN_OVERHEAD_S = 30.0


def run_in_emulated_cluster(spec: RunSpec, topo: Topology, work: Path, *,
                            log_path: Path | None = None) -> tuple[str, list[list[IterationStats]], dict]:
    """Train `spec` alone in the emulated cluster of `topo` (scaled: its links are shaped as they are);
    the launcher's output goes to `log_path`. Returns (kernel, per-rank stats, manifest extras)."""
    boot = _Boot([spec], work)
    try:
        boot.run_cluster(topo)
    finally:
        boot.done.set()
    return boot.result(0, log_path)


def record_in_one_boot(plans: list, record, work: Path, shared: dict | None = None) -> list[Path | HarnessError]:
    """Run every plan (one topology: equal network sections) in turn in one boot of the emulated
    cluster; `record(plan, launch, shared)` (experiment.record_run) writes each run's manifest and records as
    its outcome arrives (`shared`: manifest fields of every run, with the boot's). Returns, per plan, its run directory or the error that failed it; raises
    KeyboardInterrupt after a stop (the run under way is then failed, later ones never start)."""
    results: list[Path | HarnessError | None] = [None] * len(plans)
    run_ids = [p.spec.resolved.run_id for p in plans]  # each manifest names the runs of its boot
    boot = _Boot([p.spec for p in plans], work)

    def record_each() -> None:
        for k, plan in enumerate(plans):
            if k > 0 and boot.never_started(k):
                return
            try:
                results[k] = record(plan, lambda spec, topo, out, k=k: boot.result(k, out / "ranks.log"),
                                    {**(shared or {}), "cluster_boot": {"runs": run_ids, "position": k}})
            except HarnessError as e:
                results[k] = e
            except BaseException as e:  # noqa: BLE001 - kept as this run's error, the thread goes on
                results[k] = HarnessError(f"run {plan.spec.resolved.run_id} failed: {type(e).__name__}: {e}")

    recorder = threading.Thread(target=record_each, name="harness-record", daemon=True)
    recorder.start()
    try:
        boot.run_cluster(plans[0].topo)
    finally:
        boot.done.set()  # runs not reported by now fail with the cluster's reason
        recorder.join()
    return results  # type: ignore[return-value]


class _Boot:
    """One boot of the emulated cluster running a list of specs; `result(k)` waits for run k. The specs
    and outcomes are exchanged through `work` (the command's work directory, reaper.guarded: seen by
    the guest, removed with the command)."""

    def __init__(self, specs: list[RunSpec], work: Path):
        self.specs, self.work = specs, Path(work)
        self.done = threading.Event()  # the cluster has stopped; every line it printed is in `log`
        self.res = None  # the EmulationResult, when it returned one
        self.error: BaseException | None = None  # why the cluster stopped otherwise
        self.log = _MarkedLog(sys.stderr)
        self.pairs = []
        self.topo: Topology | None = None
        self.cpu = CpuMonitor()  # the cluster's CPU, sampled from the host (the runs' headroom)
        for k, spec in enumerate(self.specs):
            spec_path, out_path = self.work / f"spec-{k}.json", self.work / f"ranks-{k}.json"
            atomic_write_json(spec_path, spec.to_json())
            self.pairs.append((spec_path, out_path))

    @property
    def timeout_s(self) -> float:
        return sum(s.run.timeout_s + RUN_OVERHEAD_S for s in self.specs)

    def run_cluster(self, topo: Topology) -> None:
        """Boot, run the launcher over every spec, tear down (blocks; stop signals tear down and raise)."""
        self.topo = topo
        from ..network.emulate import run_emulated

        env = {**os.environ, "OMP_NUM_THREADS": str(self.specs[0].run.threads),
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        env.pop("HARNESS_CLUSTER", None)
        cmd = [sys.executable, "-m", "harness.train.emulated_guest",
               *(str(p) for pair in self.pairs for p in pair)]
        try:
            self.res = run_emulated(topo, cmd, mode="launcher", kernel=self.specs[0].network.kernel,
                                    timeout_s=self.timeout_s, env=env, stream=self.log, timeline_clock="marks",
                                    monitor=self.cpu)
        except BaseException as e:
            self.error = e
            raise

    def result(self, k: int, log_path: Path | None) -> tuple[str, list[list[IterationStats]], dict]:
        """Wait for run k's outcome (or the cluster's end), keep its log; (kernel, per-rank stats, extras)."""
        self.log.wait_end(k, self.done)
        if log_path is not None:
            atomic_write_text(log_path, self.log.part(k))
        _, out_path = self.pairs[k]
        outcome = json.loads(out_path.read_text()) if out_path.exists() else None  # written whole, or not at all
        if outcome is None or outcome["status"] != "ok":
            raise RankFailure(outcome["reason"] if outcome is not None else self._why_stopped())
        per_rank = [[IterationStats(**s) for s in r] for r in outcome["ranks"]]
        extras = {"startup_s": outcome.get("startup_s"), "startup_breakdown_s": outcome.get("startup_breakdown_s"),
                  "readback": outcome.get("readback", {})}
        if "wall_minus_monotonic" in outcome:  # record_run reads each iteration's headroom (and pops this)
            extras["cpu"] = RunCpu(self.cpu, float(outcome["wall_minus_monotonic"]), self.work / GUEST_CPU)
        if "elastic" in outcome:  # devices left and came back: the agent's generations and recoveries
            extras["elastic"] = outcome["elastic"]
        if "timeline" in outcome:  # the changes its timeline made during the run, as the controller applied them
            extras["timeline"] = {"source": self.topo.timeline.source, "changes": outcome["timeline"]}
        return outcome.get("kernel", "unknown"), per_rank, extras

    def never_started(self, k: int) -> bool:
        """The cluster stopped during an earlier run (a stop, a timeout): run k never began."""
        return self.done.is_set() and k not in self.log.begins and not self.pairs[k][1].exists()

    def _why_stopped(self) -> str:
        if self.error is not None:
            if isinstance(self.error, KeyboardInterrupt):
                return "interrupted"
            return str(self.error) or type(self.error).__name__
        res = self.res
        if res is not None and res.timed_out:
            return f"emulated cluster timed out after {self.timeout_s:g} s"
        if res is not None:
            return f"emulated cluster: launcher exited {res.returncodes}: {_tail(res)}"
        return "emulated cluster stopped before this run"


class _MarkedLog:
    """The launcher's output as run_emulated's log tailer streams it: kept whole, cut per run at
    emulated_guest's marks, and the ranks' progress lines passed on to `out`."""

    def __init__(self, out):
        self.out, self.lines, self.cond = out, [], threading.Condition()
        self.begins: dict[int, int] = {}
        self.ends: dict[int, int] = {}

    def write(self, text: str) -> None:
        with self.cond:
            for line in text.splitlines(keepends=True):
                for mark, where in ((BEGIN_MARK, self.begins), (END_MARK, self.ends)):
                    if line.startswith(mark) and line[len(mark):].strip().isdigit():
                        where[int(line[len(mark):])] = len(self.lines)
                        break
                else:
                    self.lines.append(line)
                    if line.startswith(PROGRESS_PREFIX):
                        self.out.write(line)
            self.cond.notify_all()

    def flush(self) -> None:
        self.out.flush()

    def wait_end(self, k: int, done: threading.Event) -> bool:
        """Block until run k's end mark arrived (True) or the cluster stopped without it (False)."""
        with self.cond:
            while k not in self.ends:
                if done.is_set():
                    return k in self.ends
                self.cond.wait(0.2)
            return True

    def part(self, k: int) -> str:
        """Run k's lines (the first run's include the launcher's start-up)."""
        with self.cond:
            start = 0 if k == 0 else self.begins.get(k, len(self.lines))
            return "".join(self.lines[start:self.ends.get(k, len(self.lines))])


def _tail(res) -> str:
    outs = getattr(res, "outputs", None) or []
    text = " | ".join(str(o)[-TAIL_CHARS:].strip().replace("\n", " / ") for o in outs if o)
    return text[-TAIL_CHARS:] or "no output"

