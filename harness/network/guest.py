"""Entry point inside the user-mode Linux kernel: `python -m harness.network.guest JOB_DIR`.

Reads the job the host wrote (job.pickle: runner.Job, the topology inside) through hostfs, runs it with
`runner.run_job` in this (netem-capable) kernel, and writes result.json back, also
when it fails: the UML process's own exit status does not carry ours.
"""
from __future__ import annotations

import pickle
import sys
import traceback
from pathlib import Path

from .runner import run_job, write_result


def main(job_dir: str) -> int:
    d = Path(job_dir)
    try:
        job = pickle.loads((d / "job.pickle").read_bytes())
        result = run_job(job, kernel="uml")
    except BaseException as e:  # noqa: BLE001 - carried back to the host as data
        result = {"kernel": "uml", "returncodes": [], "timed_out": False, "readback": {},
                  "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    write_result(d, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
