"""`harness cluster sbatch` on a real one-node Slurm (tests/slurm.py): a job that completes, one cancelled mid-run
(Slurm's time limit ends a job the same way, SIGTERM then SIGKILL after KillWait: the soak
tests/soak/test_slurm_time_limit.py waits the minute for one), arguments refused, a kernel without netem."""
from __future__ import annotations

import os

import pytest

from harness.network import kernel
from harness.network.node import NETNS_DIR, node_run_id
from harness.results import read_records

from .slurm import NIC, NODE, RUN, assert_stopped_and_cleared, inventory, manifest, marks, sbatch, start_shaped_job
from .slurm import slurm  # noqa: F401 (the fixture)

pytestmark = marks()


@pytest.mark.timeout(150)
def test_unshaped_cpu_job_completes_with_the_inventory_in_its_records(slurm):
    inv = inventory(slurm, "unshaped.yaml", f"""
        scenario: 3
        devices: 2
        bandwidth_scale: 0.01
        nodes:
          - {{name: {NODE}, nic: lo, host: 127.0.0.1, devices: [0, 1]}}
    """)
    results = slurm.d / "results-unshaped"
    job = slurm.submit(sbatch(slurm, inv, "--no-shaping", "--", *RUN, "--iters", "2", "--results", results))
    slurm.wait_gone(job, 120)
    man = manifest(results)
    assert man is not None and man["status"] == "ok", slurm.job_log(job)
    run = next(results.glob("*/*/records.csv"))
    recs = read_records(run)
    assert {(r["scenario"], r["devices"], r["bandwidth_scale"], r["backend"]) for r in recs} == \
        {("3-multi-dc", 2, 0.01, "cluster")}
    assert man["spec"]["network"]["mode"] == "none" and man["inventory"]["bandwidth_scale"] == 0.01
    assert man["cpus_allowed"] == 2  # --cpus-per-task: one core per rank, not one for the node


@pytest.mark.timeout(150)
def test_cancelled_job_clears_and_fails_its_manifest(slurm):
    results = slurm.d / "results-scancel"
    job, names = start_shaped_job(slurm, results)
    slurm.run("scancel", job)
    slurm.wait_gone(job, 60)
    assert_stopped_and_cleared(slurm, job, results, names)


def test_run_arguments_that_disagree_with_the_inventory_are_refused(slurm):
    inv = inventory(slurm, "refused.yaml", f"""
        scenario: 3
        devices: 2
        nodes:
          - {{name: {NODE}, nic: lo, host: 127.0.0.1, devices: [0, 1]}}
    """)
    r = slurm.harness("cluster", "sbatch", "--inventory", inv, "--", "--scenario", "5", "--system", "ours")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--scenario 5: the inventory" in r.stderr and "plays scenario 3-multi-dc" in r.stderr


def test_a_kernel_without_netem_is_named_in_one_line(slurm):
    inv = inventory(slurm, "netem.yaml", f"""
        scenario: 3
        devices: 2
        nodes:
          - {{name: {NODE}, nic: {NIC}, devices: [0, 1]}}
    """)
    r = slurm.harness("net", "apply", "--inventory", inv, "--node", NODE)
    names = [f"harness-{node_run_id(NODE)}-{d}" for d in (0, 1)]
    try:
        if "CONFIG_NET_SCH_NETEM" in " ".join(kernel.host_missing()):
            assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
            assert "has no sch_netem (modprobe sch_netem, or run unshaped)" in r.stderr
        else:
            assert r.returncode == 0, r.stderr
        assert all(os.path.exists(f"{NETNS_DIR}/{n}") for n in names) == (r.returncode == 0)
    finally:
        assert slurm.harness("net", "clear", "--inventory", inv, "--node", NODE).returncode == 0
    assert not [n for n in names if os.path.exists(f"{NETNS_DIR}/{n}")]
