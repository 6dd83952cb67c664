"""Run a training spec inside the emulated cluster (network/emulate.py) and read the ranks back.

The host writes the spec to a work directory the cluster can see (hostfs under UML),
starts `harness.train.cluster_worker` once in launcher mode, and reads its JSON
outcome. Every failure (a rank, the cluster, a timeout) becomes a RankFailure with
the reason, so the run's manifest says `failed` and why.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..launch import RankFailure
from ..results import atomic_write_json, atomic_write_text
from ..scenario import Topology
from .config import RunSpec
from .rank import PROGRESS_PREFIX
from .stats import IterationStats

TAIL_CHARS = 2000


def run_in_emulated_cluster(spec: RunSpec, topo: Topology, *,
                            log_path: Path | None = None) -> tuple[str, list[list[IterationStats]], dict]:
    """Train `spec` in the emulated cluster of `topo` (scaled: its links are shaped as they are);
    the launcher's output goes to `log_path`."""
    from ..network.emulate import run_emulated

    timeout_s = spec.run.timeout_s
    work = Path(tempfile.mkdtemp(prefix=f"harness-run-{spec.resolved.run_id}-", dir=_shared_tmp()))
    try:
        spec_path, out_path = work / "spec.json", work / "ranks.json"
        atomic_write_json(spec_path, spec.to_json())
        env = {**os.environ, "OMP_NUM_THREADS": str(spec.run.threads),
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        env.pop("HARNESS_CLUSTER", None)
        cmd = [sys.executable, "-m", "harness.train.cluster_worker", str(spec_path), str(out_path)]
        res = run_emulated(topo, cmd, mode="launcher", kernel=spec.network.kernel,
                           timeout_s=timeout_s + 30, env=env, stream=_ProgressLines(sys.stderr))
        if log_path is not None:
            atomic_write_text(log_path, "".join(res.outputs))
        outcome = json.loads(out_path.read_text()) if out_path.exists() else None
        if outcome is None or outcome["status"] != "ok":
            if outcome is not None:
                reason = outcome["reason"]
            elif res.timed_out:
                reason = f"emulated cluster timed out after {timeout_s + 30:g} s"
            else:
                reason = f"emulated cluster: launcher exited {res.returncodes}: {_tail(res)}"
            raise RankFailure(reason)
        per_rank = [[IterationStats(**s) for s in r] for r in outcome["ranks"]]
        return res.kernel, per_rank, {"startup_s": outcome.get("startup_s"),
                                            "startup_breakdown_s": outcome.get("startup_breakdown_s"), "readback": res.readback}
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _ProgressLines:
    """A stream for run_emulated's log tailer that passes on only the ranks' progress lines."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> None:
        for line in text.splitlines(keepends=True):
            if line.startswith(PROGRESS_PREFIX):
                self.out.write(line)

    def flush(self) -> None:
        self.out.flush()


def _tail(res) -> str:
    outs = getattr(res, "outputs", None) or []
    text = " | ".join(str(o)[-TAIL_CHARS:].strip().replace("\n", " / ") for o in outs if o)
    return text[-TAIL_CHARS:] or "no output"


def _shared_tmp() -> str | None:
    """A directory both the host and a user-mode Linux guest see (hostfs maps the host's /)."""
    return os.environ.get("HARNESS_WORK_DIR") or None
