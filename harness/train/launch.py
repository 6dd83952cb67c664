"""Run one process per device and supervise them: a failing rank ends the whole run.

`fork_ranks` forks the ranks from a parent that has already imported torch (start-up
on few cores stays short: nothing is imported twice), gives each its rank, and
waits. When any rank exits non-zero or is killed, every other rank is terminated
(SIGTERM, then SIGKILL after a grace period) and `RankFailure` names the rank and
why. Children die with the parent (PR_SET_PDEATHSIG), so nothing outlives a
killed launcher. The parent must not have initialised CUDA before forking.

This module knows nothing of training: the per-rank work is a callable.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from ..errors import HarnessError

GRACE_S = 5.0  # SIGTERM -> SIGKILL for ranks still running after a failure
_PR_SET_PDEATHSIG = 1


class RankFailure(HarnessError):
    """A rank crashed, was killed, or the run timed out; str() names the rank(s)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run_child(rank: int, target: Callable[[int], Any], outdir: str, parent: int) -> None:
    _die_with_parent()
    if os.getppid() != parent:  # parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        result = target(rank)
        tmp = Path(outdir) / f".rank{rank}.pkl"
        with open(tmp, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, Path(outdir) / f"rank{rank}.pkl")
    except BaseException as e:  # noqa: BLE001 - the parent reports it, naming the rank
        when = time.monotonic_ns()  # one clock for all ranks: the parent names the earliest failure
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        (Path(outdir) / f"rank{rank}.err").write_text(f"{when}\n{msg}")
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _error(rank: int, outdir: Path) -> tuple[int, str] | None:
    """(when, message) of the exception rank `rank` ended with, if it ended with one."""
    try:
        when, _, msg = (outdir / f"rank{rank}.err").read_text().partition("\n")
        return int(when), msg.strip()
    except (OSError, ValueError):
        return None


def _cause(failed: list[int], others: list[int], outdir: Path) -> int:
    """The rank to name first. A rank that ended without raising (killed by a signal we did not send,
    or exited with a status) is a cause, not a consequence: a peer's exception closes connections, it
    kills nothing; the first seen of those. Otherwise the earliest exception (two ranks' ends can be
    seen in one wait, in any order: the peer of a raising rank fails on the closed connection a moment
    after it, and a busy machine may show the peer's end first)."""
    unraised = [r for r in failed if _error(r, outdir) is None]
    if unraised:
        return unraised[0]
    raised = [(e[0], r) for r in failed + others if (e := _error(r, outdir)) is not None]
    return min(raised)[1]


def describe_exit(rank: int, exitcode: int | None, outdir: Path, label: Callable[[int], str]) -> str:
    err = _error(rank, outdir)
    if err is not None:
        return f"{label(rank)} failed: {err[1]}"
    if exitcode is not None and exitcode < 0:
        return f"{label(rank)} was killed by signal {signal.Signals(-exitcode).name}"
    return f"{label(rank)} exited with status {exitcode}"


def fork_ranks(
    n: int,
    target: Callable[[int], Any],
    *,
    timeout_s: float,
    label: Callable[[int], str] = lambda r: f"rank {r}",
    grace_s: float = GRACE_S,
    tmp_dir: Path | None = None,
) -> list[Any]:
    """Fork `n` children running `target(rank)`; return their results in rank order.

    Raises RankFailure (naming the first failed rank, then others) if any rank fails,
    or if the ranks are not all done within `timeout_s`. Returns only when every
    child has exited. The ranks' results pass through a directory in `tmp_dir` (a run's
    own, so that whoever removes the run's leftovers removes it too; default the system's).
    """
    ctx = mp.get_context("fork")
    outdir = Path(tempfile.mkdtemp(prefix="harness-ranks-", dir=tmp_dir))
    procs = [ctx.Process(target=run_child, args=(r, target, str(outdir), os.getpid()), name=f"rank{r}")
             for r in range(n)]
    failed: list[int] = []
    timed_out = False
    try:
        for p in procs:
            p.start()
        pending = {p.sentinel: r for r, p in enumerate(procs)}
        deadline = time.monotonic() + timeout_s
        while pending and not failed:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for s in wait(list(pending), timeout=min(left, 1.0)):
                r = pending.pop(s)
                procs[r].join()
                if procs[r].exitcode != 0:
                    failed.append(r)
        if failed:
            # Peers usually fail a moment later (connection reset); give the cause time to
            # be recorded so the report names it first.
            time.sleep(0.2)
            # every end seen before we signal anyone is the ranks' own (a killed rank's may show after
            # its peer's exception)
            failed += [r for r, p in enumerate(procs) if r not in failed and p.exitcode not in (None, 0)]
    finally:
        stop_children(procs, grace_s)
    try:
        if failed or timed_out:
            others = [r for r in range(n) if r not in failed and (outdir / f"rank{r}.err").exists()]
            if timed_out:
                running = [r for r, p in enumerate(procs) if p.sentinel in pending]
                msg = f"timed out after {timeout_s:g} s; still running: {', '.join(label(r) for r in running)}"
                raise RankFailure(msg, rank=running[0] if running else None)
            first = _cause(failed, others, outdir)
            msg = describe_exit(first, procs[first].exitcode, outdir, label)
            also = sorted(set(failed + others) - {first})
            if also:
                msg += f" (then: {'; '.join(describe_exit(r, procs[r].exitcode, outdir, label) for r in also)})"
            raise RankFailure(msg, rank=first)
        results = []
        for r in range(n):
            with open(outdir / f"rank{r}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def stop_children(procs, grace_s: float) -> None:
    """Terminate every child still alive: SIGTERM, then SIGKILL; reap all."""
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.join()
    for p in procs:
        if p.pid is not None:
            p.join(0)
