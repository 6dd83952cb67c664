"""One record schema for every backend and system, and the layout of run directories.

A run directory is results/<scenario>/<run-id>/ holding manifest.json (status
running|ok|failed, reason, versions, git commit, command) and records.csv (one row
per iteration). Files appear whole or not at all: everything is written to a
temporary file in the same directory and renamed (harness/files.py).
"""
from __future__ import annotations

import csv
import functools
import io
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .compute import FLOP_FORMULA
from .errors import HarnessError
from .files import atomic_write_text, read_text

#: The results root: $HARNESS_RESULTS, else results/ in the directory the command runs in.
RESULTS_DIR = Path(os.environ.get("HARNESS_RESULTS") or Path.cwd() / "results")


def results_root(root: Path | str | None = None) -> Path:
    """`root` (a command's --results) or the default results root."""
    return Path(root) if root else RESULTS_DIR


@dataclass
class IterationRecord:
    """One training iteration of one run (or one simulated iteration, backend=sim)."""

    run_id: str
    scenario: str
    system: str  # ours | ours-random | megatron | deepspeed
    backend: str  # sim | emu | cluster | local (loopback, no shaping)
    kernel: str  # host | uml | none
    devices: int
    d_pp: int
    d_dp: int
    model: str
    layers: int
    hidden: int
    seq: int
    batch: int
    micro_batch: int
    seed: int
    bandwidth_scale: float
    iteration: int
    seconds: float
    pflop: float
    pflops: float
    tokens_per_s: float
    compute_seconds: float
    exposed_comm_seconds: float
    loss: float
    d_tp: int = 1
    config: str = ""  # system-specific layout, JSON (e.g. {"tp":1,"pp":8,"dp":8} or {"zero":3})
    flop_formula: str = FLOP_FORMULA
    # with the compute model (harness/train/compute_model.py): rank phases of this iteration whose real
    # computation took longer than their modelled time (> 0: the iteration is slower than the model)
    compute_overruns: int = 0
    # emulated runs (network/headroom.py): the share of the emulated cluster's CPU its processes used in this
    # iteration (nan: not measured), and whether that CPU was saturated for most of it: a host-bound iteration
    # measured the host, not the links
    cpu_busy: float = float("nan")
    host_bound: bool = False


RECORD_FIELDS = [f.name for f in fields(IterationRecord)]


_issued_run_ids: set[str] = set()


def new_run_id(system: str) -> str:
    """time-system-pid; unique within the process too (runs planned together in one second get -2, -3...)."""
    base = time.strftime("%Y%m%d-%H%M%S") + f"-{system}-{os.getpid()}"
    rid, k = base, 1
    while rid in _issued_run_ids:
        k += 1
        rid = f"{base}-{k}"
    _issued_run_ids.add(rid)
    return rid


def run_dir(scenario: str, run_id: str, root: Path | None = None) -> Path:
    return results_root(root) / scenario / run_id


def records_csv(records: list[IterationRecord]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RECORD_FIELDS)
    w.writeheader()
    for r in records:
        w.writerow(asdict(r))
    return buf.getvalue()


def write_records(path: Path, records: list[IterationRecord]) -> None:
    atomic_write_text(path, records_csv(records))


# minibatches.csv: one row per minibatch of a run whose system records them (HetPipe's virtual workers;
# harness/systems/hetpipe/wsp.py reads them back to check Wave Synchronous Parallel's bounds)
MINIBATCH_FIELDS = ("vw", "minibatch", "clock", "global_version", "admitted", "pushed", "loss")
#: the first stage's gate (HetPipe's runtime): when it finished a wave, when a gated pull completed, how long
#: it waited in it; written since they were recorded, NaN where a minibatch has none (older files lack them)
GATE_FIELDS = ("wave_done", "pulled", "blocked")


def _write_rows(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """A CSV of `rows` under `fields` (NaN where a row has none)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", restval="nan")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _read_rows(path: Path, what: str, required: tuple[str, ...], ints: tuple[str, ...]) -> list[dict]:
    """The rows of a CSV `what` written by _write_rows, `ints` as int, the rest float; one line if it is not one."""
    with io.StringIO(read_text(Path(path), what), newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [k for k in required if k not in (reader.fieldnames or ())]
        if missing:
            raise HarnessError(f"{path}: not a {what} (no column {missing[0]!r})")
        return [{k: (int(v) if k in ints else float(v)) for k, v in row.items()} for row in reader]


def write_minibatches(path: Path, rows: list[dict]) -> None:
    _write_rows(path, MINIBATCH_FIELDS + GATE_FIELDS, rows)


def read_minibatches(path: Path) -> list[dict]:
    """The rows of a minibatches.csv, typed (vw, minibatch, clock, global_version: int; the rest float)."""
    return _read_rows(path, "minibatches CSV", MINIBATCH_FIELDS, MINIBATCH_FIELDS[:4])


# outer_syncs.csv: one row per outer sync of each rank of a DiLoCo run (harness/systems/diloco/runtime.py): the
# iteration it ended, the outer step after it, the fragment, how long it blocked, the bytes the rank sent for it,
# the quorum's replicas, whether the rank committed it (0: dropped, as torchft does when a peer failed inside it),
# and when it ended (time.monotonic(), the run's clock)
OUTER_SYNC_FIELDS = ("iteration", "rank", "replica", "outer_step", "fragment", "seconds", "bytes", "participants",
                     "committed", "end")


def write_outer_syncs(path: Path, rows: list[dict]) -> None:
    _write_rows(path, OUTER_SYNC_FIELDS, sorted(rows, key=lambda r: (r["iteration"], r["rank"])))


def read_outer_syncs(path: Path) -> list[dict]:
    """The rows of an outer_syncs.csv, typed (seconds and end: float; the rest int)."""
    return _read_rows(path, "outer syncs CSV", OUTER_SYNC_FIELDS,
                      tuple(k for k in OUTER_SYNC_FIELDS if k not in ("seconds", "end")))


CORE_COLUMNS = ("run_id", "scenario", "system", "backend", "devices", "seconds")  # of every records.csv ever written


def read_records(path: Path) -> list[dict]:
    """Records of a CSV (or every records.csv below a directory) as dicts with typed values."""
    path = Path(path)
    files = sorted(path.rglob("records.csv")) if path.is_dir() else [path]
    types = {f.name: f.type for f in fields(IterationRecord)}
    out = []
    for f in files:
        with io.StringIO(read_text(f, "records CSV"), newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [k for k in CORE_COLUMNS if k not in (reader.fieldnames or ())]
            if missing:
                raise HarnessError(f"{f}: not a records CSV (no column {missing[0]!r})")
            for row in reader:
                out.append({k: _convert(types.get(k, "str"), v) for k, v in row.items()})
    return out


def _convert(typ, v: str):
    if typ in ("bool", bool):
        return v == "True"
    if typ in ("int", int):
        return int(float(v))
    if typ in ("float", float):
        return float(v) if v != "" else float("nan")  # a figure not taken (a column added since the row was written)
    return v


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """HEAD of the harness's checkout, read once per process (a failed run's manifest is then
    written without starting a process, even while signals arrive)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def manifest(run_id: str, status: str, *, reason: str = "", **extra) -> dict:
    """The run manifest: status, reason, versions, git commit, command line, plus `extra`."""
    versions = {"python": platform.python_version()}
    for mod in ("torch", "numpy", "pyroute2"):
        m = sys.modules.get(mod)
        if m is not None:
            versions[mod] = getattr(m, "__version__", "?")
    return {
        "run_id": run_id,
        "status": status,
        "reason": reason,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "git_commit": git_commit(),
        "versions": versions,
        **extra,
    }
