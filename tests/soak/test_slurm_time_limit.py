"""Soak (`make soak`, not in `make test`): a job Slurm ends at its time limit. Slurm counts limits in minutes and
checks them about every 30 s, so this waits 60-90 s for what tests/test_cluster_slurm.py proves with scancel: the
same termination (SIGTERM to every process of the step, SIGKILL after KillWait), the manifest failed and the job's
namespaces cleared by its trap. `#SBATCH --time` in the script is checked in tests/test_cluster_sbatch.py. Run it
once after a change to the sbatch script's signal handling."""
from __future__ import annotations

import pytest

from ..slurm import assert_stopped_and_cleared, marks, start_shaped_job
from ..slurm import slurm  # noqa: F401 (the fixture)

pytestmark = marks()


@pytest.mark.timeout(200)
def test_job_killed_by_its_time_limit_clears_and_fails_its_manifest(slurm):
    results = slurm.d / "results-limit"
    job, names = start_shaped_job(slurm, results, "--time", "0:10")  # rounded up to a minute
    slurm.wait_gone(job, 150)
    assert "DUE TO TIME LIMIT" in slurm.job_log(job, tail=None)
    assert_stopped_and_cleared(slurm, job, results, names)
