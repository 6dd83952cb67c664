"""One training run end to end: plan, launch, collect, write records and manifest.

`execute` plans the request (harness/plan/layouts.py), launches the ranks (loopback or the emulated
cluster), merges their per-iteration figures into `IterationRecord`s and writes
results/<scenario>/<run-id>/ atomically. A run that fails leaves manifest.json with
status `failed` and the reason, and no records.
"""
from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from ..errors import HarnessError
from ..compute import pflop_per_iteration
from ..layout import Layout
from ..files import atomic_write_json, atomic_write_text
from ..results import IterationRecord, manifest, run_dir, write_minibatches, write_outer_syncs, write_records
from ..scenario import Topology
from ..plan.request import RunRequest, RunSpec
from ..plan import systems as registry
from ..plan.layouts import RunPlan, plan_run
from ..plan.dilation import advice
from ..network.headroom import HOST_BOUND_BUSY, LATE_SHARE, host_bound
from .nets import net_of
from . import probe
from .stats import IterationStats, egress_summary, merge_stats, outer_sync_summary


def to_records(spec: RunSpec, stats: list[IterationStats], cpu: list | None = None) -> list[IterationRecord]:
    """One record per merged iteration; `cpu`: each one's Headroom (network/headroom.py) or None, when measured."""
    m, lay = spec.model, spec.layout
    cpu = cpu or [None] * len(stats)
    if m.is_cnn:  # a CNN's sample is an image: one "token", no hidden width; forward + backward = 3 x forward
        layers, hidden, seq = len(m.profile.layers), 0, 1
        pflop = 3 * m.profile.fwd_flop * m.batch / 1e15
    else:
        cfg = spec.cfg
        layers, hidden, seq = cfg.layers, cfg.hidden, cfg.seq
        pflop = pflop_per_iteration(cfg, m.batch)
    layout_json = json.dumps(lay.to_json(), sort_keys=True)
    on = [lay if s.layout is None else Layout.from_json(s.layout) for s in stats]  # elastic: each its own
    return [
        IterationRecord(
            run_id=spec.resolved.run_id, scenario=spec.resolved.scenario, system=spec.run.system,
            backend=spec.resolved.backend, kernel=spec.resolved.kernel, devices=on[k].devices, d_pp=on[k].pp,
            d_dp=on[k].dp,
            model=m.name, layers=layers, hidden=hidden, seq=seq, batch=m.batch,
            micro_batch=m.micro_batch, seed=m.seed, bandwidth_scale=spec.network.bandwidth_scale,
            iteration=max(spec.run.warmup, spec.resolved.start_iteration) + k, seconds=s.seconds, pflop=pflop,
            pflops=pflop / s.seconds if s.seconds > 0 else math.nan,  # an iteration a stalled replica's merged into
            tokens_per_s=m.batch * seq / s.seconds if s.seconds > 0 else math.nan, compute_seconds=s.compute_seconds,
            exposed_comm_seconds=s.exposed_comm_seconds, loss=s.loss, d_tp=on[k].tp,
            config=layout_json if s.layout is None else json.dumps(s.layout, sort_keys=True),
            compute_overruns=s.compute_overruns,
            cpu_busy=float("nan") if cpu[k] is None else cpu[k].busy,
            host_bound=iteration_host_bound(spec, cpu[k], s),
        )
        for k, s in enumerate(stats)
    ]


def iteration_host_bound(spec: RunSpec, h, s: IterationStats) -> bool:
    """network/headroom.host_bound of one merged iteration of the run."""
    return host_bound(h, spec.compute.model, s.compute_overruns, s.compute_late_seconds, s.seconds)


def iteration_headroom(cpu, stats: list[IterationStats]) -> list:
    """Each merged iteration's Headroom from the cluster's CPU monitor (emulated.RunCpu), over its window on
    the ranks' clock [end - seconds, end]; None where it was not measured."""
    if cpu is None:
        return [None] * len(stats)
    timed = [k for k, s in enumerate(stats) if not math.isnan(s.end)]
    got = cpu.windows([(stats[k].end - stats[k].seconds, stats[k].end) for k in timed])
    heads = [None] * len(stats)
    for k, h in zip(timed, got):
        heads[k] = h
    return heads


def _mean(values: list[float]) -> float | None:
    """The mean of the numbers that are not NaN; None when there are none (JSON has no NaN)."""
    known = [v for v in values if not math.isnan(v)]
    return sum(known) / len(known) if known else None


def headroom_summary(spec: RunSpec, heads: list, stats: list[IterationStats], capacity: float) -> dict:
    """The manifest's account of the emulated CPU: per timed iteration its busy share, its phases' lateness and
    its mark, the run's means, and, when any iteration was host-bound, the one line that says what to change."""
    seen = [h for h in heads if h is not None]
    if not seen:
        return {"measured": False}
    marks = [iteration_host_bound(spec, h, s) for h, s in zip(heads, stats)]
    bound = sum(marks)
    out = {"measured": True, "capacity_cpus": capacity, "host_bound_busy": HOST_BOUND_BUSY,
           **{k: _mean([getattr(h, k) for h in seen]) for k in ("busy", "saturated", "runnable", "steal", "run_queue")},
           "host_bound_iterations": bound, "iterations": len(seen), "host_bound": bound > 0,
           "late_share": LATE_SHARE, "compute_model": spec.compute.model,
           "per_iteration": [None if h is None else {**h.to_json(), "compute_late_s": round(s.compute_late_seconds, 4),
                                                     "compute_overruns": s.compute_overruns, "host_bound": m}
                             for h, s, m in zip(heads, stats, marks)]}
    if bound:
        out["advice"] = advice(spec, bound, len(seen))
    return out


def compute_model_summary(spec: RunSpec, stats: list[IterationStats], per_rank: list[list[IterationStats]]) -> dict:
    """The manifest's account of the compute model: its scale, how often the real computation outran
    it in the timed iterations (never hidden: such iterations are slower than modelled), and every
    rank's mean compute seconds per iteration (devices that differ show here)."""
    return {"time_scale": spec.compute.time_scale,
            "overrun_phases": sum(s.compute_overruns for s in stats),
            "iterations_with_overruns": sum(s.compute_overruns > 0 for s in stats),
            "rank_compute_seconds": [sum(s.compute_seconds for s in r) / len(r) if r else None for r in per_rank]}


def _launcher(work: Path):
    """launch(spec, topo, out) for record_run: the ranks on loopback or in the emulated cluster, with
    the command's work directory `work`; returns (kernel, per-rank stats, extra manifest fields)."""
    def launch(spec: RunSpec, topo: Topology, out: Path) -> tuple[str, list[list[IterationStats]], dict]:
        if spec.network.mode == "none":
            from .elastic import under_agent
            from .local import run_local, run_local_elastic

            if under_agent(spec, topo):  # a device leaves (the debug section's preempt fault)
                got = run_local_elastic(spec, topo, Path(tempfile.mkdtemp(prefix="elastic-", dir=work)))
                return "none", [got["stats"]], {"elastic": {k: v for k, v in got.items() if k != "stats"}}
            run = run_local(spec, tmp_dir=work)
            return "none", [r.stats for r in run.ranks], {}
        from .emulated import run_in_emulated_cluster

        return run_in_emulated_cluster(spec, topo, work, log_path=out / "ranks.log")
    return launch


def _guarded(plans: list[RunPlan]):
    """The command's reaper (network/reaper.py), registered before any manifest or directory exists:
    if this process is killed, the runs' manifests still `running` fail and the work directory goes."""
    from ..network.reaper import guarded

    # HARNESS_WORK_DIR: where it goes (a user-mode Linux guest must see it; hostfs maps the host's /)
    return guarded([str(run_dir(p.spec.resolved.scenario, p.spec.resolved.run_id, p.spec.run.results_root)
                        / "manifest.json") for p in plans], work_parent=os.environ.get("HARNESS_WORK_DIR") or None)


class _Interrupted(BaseException):
    pass


class _TermWatch:
    """Writes the failed manifest at SIGTERM even while the main thread is blocked in C++ (a
    collective waiting on a dead peer, a rendezvous): Python runs a signal handler only when
    that call returns, which may be after Slurm's or torchrun's SIGKILL, leaving `running`.
    Python's C-level handler writes the signal number to the wakeup fd at once, from any
    thread; a thread reading it writes the manifest. The handler's own path (teardown, then
    the same manifest) follows when the main thread can run it. `final` writes under the same
    lock, so a late SIGTERM never turns an `ok` into `failed`."""

    def __init__(self, write_failed):
        self._write_failed, self._lock, self._done = write_failed, threading.Lock(), False
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="harness-sigterm", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while (data := self._r.recv(64)) and 0 not in data:  # 0: close()
            if signal.SIGTERM in data:
                self.final(lambda: self._write_failed("terminated by SIGTERM"))
                return

    def final(self, write) -> None:
        """Write the run's last manifest (once: after it, SIGTERM writes nothing)."""
        with self._lock:
            if not self._done:
                write()
                self._done = True

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        self._w.setblocking(True)
        self._w.send(b"\0")
        self._thread.join()
        self._r.close()
        self._w.close()


def with_checkpoints(plan: RunPlan) -> RunPlan:
    """--checkpoint-every: where the ranks write (the run directory's checkpoints/); --resume: the iteration
    of the last complete checkpoint there, which the run goes on from. One line for what cannot be."""
    from . import checkpoint

    spec = plan.spec
    run = spec.run
    if run.checkpoint_every is None and run.resume is None:
        return plan
    flag = "--checkpoint-every" if run.checkpoint_every is not None else "--resume"
    if not registry.get(run.system).checkpoints:
        able = ", ".join(n for n, s in registry.registered().items() if s.checkpoints)
        raise HarnessError(f"{flag}: {run.system} does not checkpoint (these do: {able})")
    if spec.replan.enabled:
        raise HarnessError(f"{flag}: not with --replan yet")
    out = run_dir(spec.resolved.scenario, spec.resolved.run_id, run.results_root).resolve()
    changes = {"checkpoint_dir": str(out / checkpoint.DIRNAME)}
    if run.resume is not None:
        start = checkpoint.latest(Path(run.resume))
        if start is None:
            raise HarnessError(f"--resume: {run.resume}: no complete checkpoint (every rank's file of one iteration)")
        if start >= run.warmup + run.iters:
            raise HarnessError(f"--resume: {run.resume}: its checkpoint is after iteration {start}, and this run "
                               f"ends at {run.warmup + run.iters} (--warmup + --iters): nothing to run")
        changes["start_iteration"] = start
    return replace(plan, spec=spec.with_resolved(**changes))


def execute(req: RunRequest) -> Path:
    """Run `req`; returns the run directory. Raises HarnessError (after writing a failed manifest)."""
    if probe.wanted([req]):
        res = execute_many([req])[0]
        if isinstance(res, Path):
            return res
        raise res if isinstance(res, HarnessError) else KeyboardInterrupt()
    plan = with_checkpoints(plan_run(probe.undilated([req])[0]))
    with _guarded([plan]) as work:
        return record_run(plan, _launcher(work))


def execute_many(reqs: list[RunRequest]) -> list[Path | HarnessError | None]:
    """Run every request in turn; returns, per request, its run directory, the error that failed it, or
    None when a stop came first. All are planned before any starts (a bad one stops all, as one line).
    They must share one network section; emulated, they share one boot of the cluster (emulated.py).
    Runs that ask for a chosen time dilation (compute.dilate) are probed first, in a boot of their own
    (train/probe.py), and the manifest of each says what was chosen and why."""
    plans = [with_checkpoints(plan_run(r)) for r in probe.undilated(reqs)]  # every user error now, as one line
    networks = {p.spec.network for p in plans}
    if len(networks) > 1:
        raise HarnessError(f"runs of one command share one network (scenario, devices, bandwidth scale, "
                           f"kernel); got {len(networks)} different ones")
    shared: dict = {}
    if probe.wanted(reqs):
        from .emulated import record_in_one_boot

        with _guarded([]) as work:
            reqs, dilation = probe.probe_and_dilate(reqs, work, lambda ps, w: record_in_one_boot(ps, record_run, w))
        plans = [with_checkpoints(plan_run(r)) for r in reqs]
        if dilation is not None:
            shared = {"dilation": dilation.to_json()}
    with _guarded(plans) as work:
        if plans[0].spec.network.mode == "emulated":
            from .emulated import record_in_one_boot

            return record_in_one_boot(plans, record_run, work, shared)
        results: list[Path | HarnessError | None] = []
        for plan in plans:
            try:
                results.append(record_run(plan, _launcher(work), shared))
            except HarnessError as e:
                results.append(e)
        return results


RECOVERY_COLUMNS = ("at_s", "after", "devices", "generation", "detect_s", "stop_s", "last_call_s", "replan_s",
                    "restart_s", "process_group_s", "state_moved_s", "from", "resumed_from", "lost_iterations",
                    "in_flight")


def write_recoveries(path: Path, rows: list[dict]) -> None:
    """recoveries.csv of an elastic run: per restart when the agent knew (s from its start), after what, the
    devices it concerned, the seconds of each part (as the simulator's recoveries.csv names them; process_group_s
    and state_moved_s from the restart's fork, as restart_s), where it went on from (memory: the survivors',
    checkpoint, start) and the iterations lost."""
    import csv
    import io

    text = io.StringIO()
    w = csv.DictWriter(text, RECOVERY_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        marks = {f"{m}_s": v for m, v in r.get("restart_marks_s", {}).items()}  # from the restart's fork
        w.writerow({**r, **marks, "devices": " ".join(map(str, r["devices"]))})
    atomic_write_text(path, text.getvalue())


def replan_summary(rows: list[dict]) -> list[dict]:
    """One entry per re-plan decision (rank 0's): taken or not, the search's seconds, the cost model before
    and after; a taken one adds its moves: the slowest rank's seconds (its first iteration waits for them)
    and the bytes that crossed the links."""
    out = []
    for d in sorted((r for r in rows if r["kind"] == "decision"), key=lambda r: r["iteration"]):
        entry = {k: v for k, v in d.items() if k != "kind"}
        moves = [r for r in rows if r["kind"] == "move" and r["iteration"] == d["iteration"]]
        if d["taken"] and moves:
            entry.update(move_s=max(r["move_s"] for r in moves), rebuild_s=max(r["rebuild_s"] for r in moves),
                         moved_bytes=sum(r["bytes_received"] for r in moves))
        out.append(entry)
    return out


def record_run(plan: RunPlan, launch, shared: dict | None = None) -> Path:
    """Write the manifest (running), call `launch(spec, topo, out) -> (kernel, per-rank stats,
    extra manifest fields)`, then the records and the final manifest; `failed` + reason on any error.
    `shared`: manifest fields of every state (e.g. the runs it shared a cluster boot with)."""
    spec, topo, placement = plan.spec, plan.topo, plan.placement
    out = run_dir(spec.resolved.scenario, spec.resolved.run_id, spec.run.results_root)
    info = {
        "spec": spec.to_json(),
        "host_cpus": os.cpu_count(),  # emulated ranks share them (sim compare's cpu load)
        "host": platform.node(), "pid": os.getpid(),  # whose run it is: `running` with the pid gone is killed
        "placement": None if placement is None else placement.to_json(spec.layout),
        # the scenario's TCP settings (`auto` buffers as written; an emulated run's readback holds the values)
        "transport": topo.transport.to_json(),
        # the best expected loss on the run's synthetic data (nats): what a convergence plot is read against
        "data": {"set": spec.model.data, "loss_floor": net_of(spec.model).floor()},
        **(shared or {}),
    }
    run_id = spec.resolved.run_id

    def on_term(signum, frame):
        # torchrun and Slurm send SIGTERM again while we stop: ignore the repeats, so that
        # the failed manifest below is written whole
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Interrupted(f"terminated by {signal.Signals(signum).name}")

    def write_failed(reason: str) -> None:
        atomic_write_json(out / "manifest.json", manifest(
            run_id, "failed", reason=reason, wall_seconds=time.monotonic() - t0, **info))

    t0 = time.monotonic()
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, on_term) if main else None
    watch = _TermWatch(write_failed) if main else None
    final = watch.final if watch else (lambda write: write())
    try:
        atomic_write_json(out / "manifest.json", manifest(run_id, "running", **info))
        kernel, per_rank, extra = launch(spec, topo, out)
        spec = spec.with_resolved(kernel=kernel)
        stats = merge_stats(per_rank, shared_clock=spec.resolved.backend != "cluster")  # cluster: one clock per host
        cpu = extra.pop("cpu", None)  # the emulated cluster's CPU during the run (emulated.RunCpu)
        heads = iteration_headroom(cpu, stats)
        write_records(out / "records.csv", to_records(spec, stats, heads))
        if cpu is not None:
            extra = {**extra, "headroom": headroom_summary(spec, heads, stats, cpu.capacity)}
            timed = [s for s in stats if not math.isnan(s.end)]
            if timed:  # the emulated CPU over the timed iterations, sample by sample
                atomic_write_text(out / "cpu.csv", cpu.csv(timed[0].end - timed[0].seconds, timed[-1].end))
        rows = [row for r in per_rank for s in r if s.minibatches for row in s.minibatches]
        if rows:
            write_minibatches(out / "minibatches.csv", rows)
        syncs = [row for r in per_rank for s in r if s.outer_syncs for row in s.outer_syncs]
        if syncs:  # DiLoCo's outer syncs, every rank's
            write_outer_syncs(out / "outer_syncs.csv", syncs)
            extra = {**extra, "outer_syncs": outer_sync_summary(syncs)}
        if "elastic" in extra:  # one row per restart of the elastic agent (train/elastic.py)
            write_recoveries(out / "recoveries.csv", [e for e in extra["elastic"]["events"] if e["event"] == "restart"])
        replans = [row for r in per_rank for s in r if s.replans for row in s.replans]
        if spec.replan.enabled:
            extra = {**extra, "replans": replan_summary(replans)}
        if spec.compute.model:
            extra = {**extra, "compute_model": compute_model_summary(spec, stats, per_rank)}
        if spec.debug.count_wire:  # each rank's bytes on the wire in each timed iteration (wire.py)
            extra = {**extra, "wire_bytes_per_rank": [[s.wire_bytes for s in r] for r in per_rank]}
        egress = egress_summary(per_rank)  # emulated runs: what each interface sent to whom
        if egress:
            extra = {**extra, "egress": egress}
        final(lambda: atomic_write_json(out / "manifest.json", manifest(
            run_id, "ok", wall_seconds=time.monotonic() - t0, kernel=kernel, **info, **extra)))
        return out
    except (HarnessError, _Interrupted, KeyboardInterrupt, Exception) as e:
        if main:  # a stop signal now would cut the failed manifest short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else (str(e) or type(e).__name__)
        final(lambda: write_failed(reason))
        if isinstance(e, HarnessError):
            raise
        if isinstance(e, (KeyboardInterrupt, _Interrupted)):
            raise KeyboardInterrupt from None
        raise HarnessError(f"run {run_id} failed: {type(e).__name__}: {e}") from e
    finally:
        if watch is not None:
            watch.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
