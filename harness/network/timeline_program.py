"""The program's side of a timeline applied live (timeline_control.py): where it is, what was changed.

A program in the emulated cluster tells the controller where it is (`note_run`, `note_iteration`, through the
file MARKS_ENV names), reads back the link changes of its run (`changes_of_run`) and follows the devices that
leave and come back (`device_notices`); each is a no-op, or empty, where no controller runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

#: set for the program: the file it tells the controller where it is in (note_run, note_iteration)
MARKS_ENV = "HARNESS_TIMELINE_MARKS"
#: set for the program: the file the controller appends each change to as it applies it (JSON lines)
LOG_ENV = "HARNESS_TIMELINE_LOG"
#: set for the program: the file the controller appends each device event to as it applies it (device_notices)
DEVICES_ENV = "HARNESS_TIMELINE_DEVICES"


def _mark(line: str) -> None:
    path = os.environ.get(MARKS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def note_run(run: int) -> None:
    """Tell the emulated cluster's timeline controller, if there is one, that run `run` of this boot (0-based)
    starts: its links go back to the scenario's, and its timeline waits for its iteration 0."""
    _mark(f"run {int(run)}")


def note_iteration(iteration: int, began_monotonic: float, of: int = 1) -> None:
    """Tell the timeline controller, if there is one, that `iteration` (0-based, warm-up included) began at
    `began_monotonic` (time.monotonic()); a no-op elsewhere. `of`: how many ranks mark it; the iteration
    begins for the controller when the last of them has (the records' boundary: the last rank's end)."""
    _mark(f"iteration {int(iteration)} {began_monotonic:.6f} {int(of)}")


def changes_of_run(run: int) -> list[dict] | None:
    """The changes the controller applied during run `run` so far (AppliedChange as JSON); None when the
    program runs without a timeline."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [doc for doc in map(json.loads, lines) if doc["run"] == run]


def device_notices(pos: int = 0) -> tuple[list[tuple[str, int, float]], int]:
    """The device events the controller applied since byte `pos` of the file DEVICES_ENV names, as
    (kind: notice | preempt | return, device, time.monotonic() when its links changed), and the next `pos`;
    ([], pos) without a timeline. The launcher acts on them: kills a preempted device's processes, starts a
    returned one's."""
    path = os.environ.get(DEVICES_ENV)
    if not path:
        return [], pos
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return [], pos
    whole = data[:data.rfind(b"\n") + 1]
    out = [(kind, int(d), float(t)) for kind, d, t in (line.split() for line in whole.decode().splitlines())]
    return out, pos + len(whole)


def notices_end() -> int:
    """Where the device events applied so far end (a `pos` for device_notices: the ones after now); 0 without a
    timeline."""
    path = os.environ.get(DEVICES_ENV)
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0
