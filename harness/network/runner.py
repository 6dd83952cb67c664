"""Run a command in the emulated cluster of the *current* kernel (host, or inside UML).

Used directly for the host kernel and by `guest.py` inside user-mode Linux, so both
paths run the same code. A job is a `Job` (pickled to the job directory, which the UML
guest sees through hostfs); each device's stdout+stderr go
to `<job_dir>/dev<i>.log` (the caller tails them to stream), the outcome to
`<job_dir>/result.json`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..files import atomic_write_json
from . import netns as harness_netns
from .cluster import Cluster
from .timeline_control import TimelineController
from .timeline_program import DEVICES_ENV, LOG_ENV, MARKS_ENV

#: After one device fails, the others get this long to finish before they are stopped
#: (a distributed job whose peer died would otherwise wait for its own timeout).
FAIL_GRACE_S = 5.0
TIMEOUT_RC = 124
#: Set by the caller's signal handler: an exception raised from a handler can be swallowed
#: (e.g. inside fork's at-fork hooks), so the wait loop also checks this flag.
stop_requested = threading.Event()


class Stopped(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM/SIGINT/SIGHUP): tear down and leave."""


def log_path(job_dir: Path, i: int) -> Path:
    return Path(job_dir) / f"dev{i}.log"


@dataclass(frozen=True)
class Job:
    """One run of the emulated cluster: the topology as the run sees it (Topology.scaled) and what to
    execute in it. The host runs it directly, or pickles it into the job directory for a UML guest."""

    run_id: str
    job_dir: str
    mode: str  # per-device | launcher
    command: tuple[str, ...]
    timeout_s: float
    env: dict
    cwd: str
    topo: object  # harness.scenario.Topology
    #: when a timeline's t = 0 is (timeline_control.CLOCKS): the command's start, or its iteration-0 mark
    timeline_clock: str = "command"


def run_job(job: Job, kernel: str) -> dict:
    """Create the cluster, run the command(s), tear down; return the result document."""
    job_dir = Path(job.job_dir)
    mode = job.mode
    t0 = time.monotonic()
    result = {"kernel": kernel, "returncodes": [], "timed_out": False, "readback": {}, "error": "",
              "plan": None, "setup_s": None}
    with Cluster(job.topo, run_id=job.run_id) as cluster:
        result["setup_s"] = time.monotonic() - t0
        result["readback"] = cluster.readback
        result["plan"] = cluster.plan.to_json()
        peers = job_dir / "peers.json"
        atomic_write_json(peers, [d.addr for d in cluster.devices])
        base_env = dict(job.env)
        procs, logs = [], []
        control = None
        if job.topo.timeline is not None:
            marks, changes = job_dir / "timeline-marks", job_dir / "timeline-changes.jsonl"
            moves = job_dir / "timeline-devices"
            control = TimelineController(job.topo.timeline, job.topo, cluster.plan,
                                         [d.netns_path for d in cluster.devices], clock=job.timeline_clock,
                                         marks_path=marks, log_path=changes, devices_path=moves,
                                         horizon_s=job.timeout_s)
            base_env.update({MARKS_ENV: str(marks), LOG_ENV: str(changes), DEVICES_ENV: str(moves)})
            control.start()
        try:
            if mode == "per-device":
                for dev in cluster.devices:
                    env = {**base_env, "HARNESS_DEVICE": str(dev.index),
                           "HARNESS_WORLD_SIZE": str(len(cluster.devices)), "HARNESS_ADDR": dev.addr,
                           "HARNESS_IFNAME": dev.ifname, "HARNESS_PEERS": str(peers),
                           "HARNESS_KERNEL": kernel}
                    log = open(log_path(job_dir, dev.index), "wb")
                    logs.append(log)
                    procs.append(_spawn(job, env, log, dev.netns_path))
            else:
                desc = job_dir / "cluster.json"
                atomic_write_json(desc, cluster.describe(kernel))
                env = {**base_env, "HARNESS_CLUSTER": str(desc), "HARNESS_KERNEL": kernel,
                       "HARNESS_WORLD_SIZE": str(len(cluster.devices)), "HARNESS_PEERS": str(peers)}
                log = open(log_path(job_dir, 0), "wb")
                logs.append(log)
                procs.append(_spawn(job, env, log, None))
            rcs, timed_out = _wait(procs, job.timeout_s)
            result["returncodes"], result["timed_out"] = rcs, timed_out
        finally:
            for p in procs:
                _kill(p)
            for log in logs:
                log.close()
            if control is not None:
                control.stop()
                result["timeline"] = control.to_json()
                result["error"] = result["error"] or control.error
    return result


def _spawn(job: dict, env: dict, log, netns_path: str | None) -> subprocess.Popen:
    pre = (lambda: harness_netns.enter(netns_path)) if netns_path else None
    return subprocess.Popen(list(job.command), cwd=job.cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=pre,
                            start_new_session=True)


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _wait(procs: list[subprocess.Popen], timeout_s: float) -> tuple[list[int], bool]:
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        if stop_requested.is_set():
            raise Stopped("stop requested")
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes], False
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at > FAIL_GRACE_S):
            timed_out = now >= deadline
            for p in procs:
                _kill(p)
            rcs = []
            for c, p in zip(codes, procs):
                rcs.append(int(c) if c is not None else (TIMEOUT_RC if timed_out else int(p.returncode)))
            return rcs, timed_out
        time.sleep(0.05)


def write_result(job_dir: Path, result: dict) -> None:
    atomic_write_json(Path(job_dir) / "result.json", result)


def read_result(job_dir: Path) -> dict | None:
    p = Path(job_dir) / "result.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())
