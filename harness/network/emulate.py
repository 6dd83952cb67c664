"""`run_emulated`: run a command in the local emulated cluster and always tear it down.

This is the launcher the trainer, the baselines and `harness emulate` use.

mode="per-device": the command runs once in every device namespace, all at once, with
  HARNESS_DEVICE (index), HARNESS_WORLD_SIZE, HARNESS_ADDR (own IP), HARNESS_IFNAME,
  HARNESS_PEERS (path of a JSON list of all device IPs by index).
mode="launcher": the command runs ONCE in the root namespace of the kernel that holds
  the cluster (inside UML when UML is used) with HARNESS_CLUSTER = path of a JSON file
  {"kernel", "run_id", "bandwidth_scale", "devices": [{"index", "netns", "netns_path",
  "ifname", "addr"}]}; it forks one child per device, each calling
  `harness.network.netns.enter(netns_path)`, so torch is imported once.
A topology with a timeline (scenario/timeline.py) has its changes applied live while the command runs
(timeline_control.py): t = 0 when the command starts (timeline_clock="command") or at the program's mark of
its iteration 0 ("marks", the trainer); the result's `timeline` lists each change and when it took effect.
Both also get HARNESS_KERNEL ("host"|"uml") and the caller's environment plus `env`,
and run in the caller's working directory (which UML sees through hostfs).

Kernel: see kernel.py. Under user-mode Linux (uml.py) the guest has ONE virtual CPU
(all ranks' compute shares one host core) and half the host's memory, at least 6 GiB,
at most 32 GiB. The result says which kernel ran.

Failure: a non-zero return code of any device, or the timeout (rc 124 for the devices
still running), makes the result non-zero; once one device fails the others get
runner.FAIL_GRACE_S to finish. Teardown happens on success, exceptions, SIGINT and
SIGTERM; after a SIGKILL of this process, its reaper (reaper.py) does the same within seconds
(`harness net clean` removes what any other accident left).
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HarnessError
from . import reaper, registry, uml
from .headroom import CpuMonitor
from .kernel import choose
from .timeline_control import check_timeline
from .runner import TIMEOUT_RC, Job, log_path, read_result, run_job

MODES = ("per-device", "launcher")
#: Wall-clock allowance on top of the command's timeout for booting UML and set-up/teardown.
UML_OVERHEAD_S = 120.0


@dataclass
class EmulationResult:
    kernel: str  # "host" | "uml"
    returncodes: list[int]  # per device (per-device mode) or [rc] (launcher mode)
    outputs: list[str]  # captured stdout+stderr per device (or one entry in launcher mode)
    readback: dict  # kernel state read back after shaping (qdisc/class/filter per device)
    timed_out: bool
    run_id: str = ""
    bandwidth_scale: float = 1.0
    setup_s: float | None = None  # cluster creation + shaping, excluding a UML boot
    plan: dict | None = field(default=None, repr=False)
    #: the timeline's changes as applied (timeline_control.AppliedChange as JSON), [] without a timeline
    timeline: list = field(default_factory=list)

    @property
    def returncode(self) -> int:
        """0 when every device succeeded; 124 on timeout; else the code of a device that failed by
        itself (not one stopped afterwards), a signal N given as 128+N as a shell does."""
        if self.timed_out:
            return TIMEOUT_RC
        if not self.returncodes:
            return 1
        own = [rc for rc in self.returncodes if rc not in (0, -signal.SIGKILL)]
        rc = next(iter(own), next((rc for rc in self.returncodes if rc != 0), 0))
        return 128 - rc if rc < 0 else rc

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class EmulationError(HarnessError, RuntimeError):
    """The emulated cluster could not be set up or did not report back (one line)."""


def run_emulated(topo, command: list[str], *, mode: str = "per-device",
                 kernel: str = "auto", timeout_s: float = 600.0, env: dict[str, str] | None = None,
                 stream=None, timeline_clock: str = "command", monitor: CpuMonitor | None = None) -> EmulationResult:
    """Run `command` in the emulated cluster of `topo` (Topology.scaled: its links are shaped as they are);
    see the module docstring. `monitor` (headroom.py), when given, samples the cluster's CPU while it runs. Write-ahead (reaper.py): the reaper starts, then the registry entry names
    the job dir, then it is created, so that a kill at any moment leaves nothing behind."""
    if mode not in MODES:
        raise EmulationError(f"mode: must be one of {', '.join(MODES)} (got {mode!r})")
    if not command:
        raise EmulationError("command: empty (give the program to run after --)")
    if not (timeout_s > 0):
        raise EmulationError(f"timeout: must be > 0 (got {timeout_s})")
    if topo.timeline is not None:
        check_timeline(topo.timeline, topo)
    which = choose(kernel)
    rid = registry.new_run_id()
    job_dir = registry.planned_dir("harness-net-", rid)
    n_logs = topo.n if mode == "per-device" else 1
    job = Job(run_id=rid, job_dir=str(job_dir), mode=mode, command=tuple(command), timeout_s=float(timeout_s),
              env={**os.environ, **(env or {})}, cwd=os.getcwd(), topo=topo, timeline_clock=timeline_clock)
    tailer = _Tailer([log_path(job_dir, i) for i in range(n_logs)], stream, n_logs > 1)
    entry = registry.Entry(run_id=rid, pid=os.getpid(), kind="uml" if which == "uml" else "job",
                           job_dir=str(job_dir))
    guard = reaper.start(rid)
    try:
        with _signals_as_exceptions():
            entry.save()
            job_dir.mkdir(mode=0o700)
            tailer.start()
            if which == "host":
                if monitor is not None:  # the ranks are this process's children, on the host's CPUs
                    monitor.watch(os.getpid(), capacity=len(os.sched_getaffinity(0)))
                result = run_job(job, kernel="host")
            else:
                result = _run_in_uml(job, entry, monitor)
    finally:
        if monitor is not None:
            monitor.stop()
        tailer.stop()
        outputs = [_read(log_path(job_dir, i)) for i in range(n_logs)]
        registry.teardown(entry)  # UML kernel, job dir
        guard.release()
    if result.get("error"):
        raise EmulationError(f"emulated cluster ({which}): {result['error']}")
    rcs = result["returncodes"]
    return EmulationResult(kernel=result["kernel"], returncodes=rcs, outputs=outputs,
                           readback=result["readback"], timed_out=result["timed_out"], run_id=rid,
                           bandwidth_scale=float(topo.bandwidth_scale), setup_s=result.get("setup_s"),
                           plan=result.get("plan"), timeline=result.get("timeline", []))


def _run_in_uml(job: Job, entry: registry.Entry, monitor: CpuMonitor | None) -> dict:
    job_dir = Path(job.job_dir)
    (job_dir / "job.pickle").write_bytes(pickle.dumps(job))
    started = None if monitor is None else (lambda pid: monitor.watch(pid, capacity=1))  # ONE virtual CPU
    halted = uml.boot(job_dir, entry, cwd=job.cwd, wall_timeout_s=job.timeout_s + UML_OVERHEAD_S, started=started)
    result = read_result(job_dir)
    if result is None:
        n = job.topo.n if job.mode == "per-device" else 1
        if not halted:
            return {"kernel": "uml", "returncodes": [TIMEOUT_RC] * n, "timed_out": True, "readback": {}}
        tail = uml.console_tail(job_dir)
        if "set fp regs failed" in _read(job_dir / "console.log"):
            raise EmulationError("user-mode Linux cannot restore FP registers on this CPU (AVX-512/AMX XSAVE "
                                 "area): it needs harness/network/uml_xstate_shim.c built with a C compiler "
                                 "(apt-get install gcc libc6-dev)")
        raise EmulationError(f"user-mode Linux halted without a result; console: {tail}")
    if result.get("traceback"):
        (job_dir / "guest-traceback.txt").write_text(result["traceback"])
    return result


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class _SignalExit(KeyboardInterrupt):
    """SIGTERM turned into an exception, so `finally` blocks tear down."""


def _stop_flag():
    from . import runner

    return runner.stop_requested


@contextmanager
def _signals_as_exceptions():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        _stop_flag().set()
        raise _SignalExit(f"signal {signum}")

    _stop_flag().clear()
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _Tailer:
    """Copies new lines of the device logs to `stream` while the job runs ("[i] line")."""

    def __init__(self, paths: list[Path], stream, prefix: bool):
        self.paths, self.stream, self.prefix = paths, stream, prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pos = [0] * len(paths)
        self._partial = [b""] * len(paths)

    def start(self) -> None:
        if self.stream is not None:
            self._thread.start()

    def stop(self) -> None:
        if self.stream is not None and self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._poll()

    def _poll(self, final: bool = False) -> None:
        for i, p in enumerate(self.paths):
            try:
                with open(p, "rb") as f:
                    f.seek(self._pos[i])
                    data = f.read()
            except OSError:
                continue
            self._pos[i] += len(data)
            buf = self._partial[i] + data
            *lines, rest = buf.split(b"\n")
            if final and rest:
                lines, rest = lines + [rest], b""
            self._partial[i] = rest
            for ln in lines:
                text = ln.decode(errors="replace")
                self.stream.write(f"[{i}] {text}\n" if self.prefix else f"{text}\n")
            if lines:
                self.stream.flush()


__all__ = ["EmulationResult", "EmulationError", "run_emulated", "MODES"]
