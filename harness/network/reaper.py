"""The run dies with its owner: one small process per emulated cluster that, once the harness
process that started the run is gone for any reason (SIGKILL included), tears down what the
run's registry entries list, as `harness net clean` would: the user-mode Linux kernel and all
its host processes (so every rank inside it), namespaces, links, job and temporary
directories, and each of the run's manifests still `running` becomes `failed`.

`start(rid)` runs `python -m harness.network.reaper RID OWNER_PID` in a session of its own (a
terminal's Ctrl-C or a kill of the owner's process group does not reach it); the owner calls
`Reaper.release()` after its own teardown. The reaper waits on a pidfd of the owner and on its
stdin, no polling; it imports only the registry.

Write-ahead: the reaper starts first, then the run's entry names what it is about to create, then
the run creates it; a kill at any moment leaves nothing the reaper does not know of.
`guarded(manifests)` does this for a training command (train/experiment.py): its manifests and
its one work directory, on any network.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: What the owner writes on the reaper's stdin when the run ended and was torn down by the owner.
RELEASE = b"release\n"


class Reaper:
    """The owner's handle on its reaper process."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def release(self) -> None:
        """The run is torn down: the reaper exits without touching anything."""
        try:
            self.proc.stdin.write(RELEASE)
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        self.proc.wait()


def start(rid: str) -> Reaper:
    """A reaper for the registry entries of run `rid`, owned by this process."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "harness.network.reaper", rid, str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    return Reaper(proc)


@contextmanager
def guarded(manifests: list[str], work_parent: str | None = None) -> Iterator[Path]:
    """Register a training command of this process with a reaper before it writes anything: if this
    process dies, the reaper fails each of `manifests` still `running` and removes the command's
    work directory (yielded: created after its registration, in `work_parent` or the system's
    temporary directory, removed at the end)."""
    from . import registry

    rid = registry.new_run_id()
    work = registry.planned_dir("harness-run-", rid, work_parent)
    guard = start(rid)
    entry = registry.Entry(run_id=rid, pid=os.getpid(), kind="run", temp_dirs=[str(work)],
                           manifests=[str(m) for m in manifests])
    try:
        entry.save()
        work.mkdir(mode=0o700)
        yield work
    finally:
        registry.teardown(entry, reason="failed: the harness stopped before the run ended")
        guard.release()


def main(rid: str, owner: int) -> int:
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # only the owner's end, or its release, ends the reaper
    stdin, watch, got = sys.stdin.fileno(), [sys.stdin.fileno()], b""
    try:
        watch.append(os.pidfd_open(owner))
    except ProcessLookupError:
        watch = []  # gone already
    except OSError:
        pass  # no pidfds (Linux < 5.3): the owner's end of our stdin closes when it dies
    if watch:
        while True:
            ready, _, _ = select.select(watch, [], [])
            if stdin in ready:
                data = os.read(stdin, 64)
                got += data
                if got.startswith(RELEASE):
                    return 0
                if data:
                    continue
            break  # the owner exited (its pidfd is readable, or its end of our stdin closed)
    from . import registry

    for entry in registry.entries():
        if entry.run_id == rid:
            registry.teardown(entry, reason=f"killed: the harness process (pid {owner}) that ran it "
                                            f"ended before the run did")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
