"""A one-node Slurm for tests (Debian's slurm-wlm and munge, installed by `make system-deps`): the `slurm` fixture
starts munged, slurmctld and slurmd as its own child processes inside a network namespace of its own (loopback and a
veth pair as the NIC, so nothing touches the host's network), and stops the daemons by pid at the end. Used by
tests/test_cluster_slurm.py and the soak tests/soak/test_slurm_time_limit.py."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.network import registry
from harness.network.node import NETNS_DIR, node_run_id

DAEMONS = ("nsenter", "munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel")
NODE = "hnode"  # the Slurm node name (slurmd -N), also the inventory's
NIC = "hnic0"  # the macvlans' parent: one end of a veth pair in the test's namespace

MISSING = [d for d in DAEMONS if shutil.which(d) is None]
MISSING += [] if os.geteuid() == 0 else ["root (slurmd runs the job's ranks; shaping needs CAP_NET_ADMIN)"]
MISSING += [] if (os.cpu_count() or 1) >= 2 else ["2 CPUs (the job asks one per rank)"]


def marks() -> list:
    """A Slurm test module's marks: machine-wide (its namespaces), the `slurm` group, a skip naming what is missing."""
    return [pytest.mark.machine, pytest.mark.slurm,
            pytest.mark.skipif(bool(MISSING), reason=f"a one-node Slurm needs {', '.join(MISSING)} "
                                                     "(make system-deps installs slurm-wlm and munge)")]


SLURM_CONF = """\
ClusterName=harnesstest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=15
MinJobAge=600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def wait(cond, what: str, timeout_s: float, tick_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(tick_s)
    return got


class Slurm:
    """A one-node Slurm in network namespace `ns`, configured under `d`."""

    def __init__(self, d: Path, ns: str):
        self.d, self.ns = d, ns
        # nsenter, not `ip netns exec`: that one mounts a sysfs of its own, without the cgroups slurmd needs
        self.enter = ["nsenter", f"--net={NETNS_DIR}/{ns}"]
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf"), "PYTHON": sys.executable,
                    "OMP_NUM_THREADS": "1"}

    def run(self, *argv, cwd=None, check=True) -> subprocess.CompletedProcess:
        """A command inside the namespace (clients reach the daemons on its loopback)."""
        r = subprocess.run([*self.enter, *map(str, argv)], env=self.env, cwd=cwd,
                           capture_output=True, text=True, timeout=120)
        assert not check or r.returncode == 0, f"{argv}: {r.stderr[-2000:]}"
        return r

    def harness(self, *argv, cwd=None) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "harness", *argv, cwd=cwd, check=False)

    def submit(self, script: Path) -> str:
        out = self.run("sbatch", "--parsable", script, cwd=script.parent).stdout
        return out.strip().split(";")[0]

    def wait_gone(self, job: str, timeout_s: float) -> None:
        wait(lambda: not self.run("squeue", "-h", "-j", job, check=False).stdout.strip(),
             f"job {job} to end", timeout_s)

    def job_log(self, job: str, tail: int | None = 3000) -> str:
        p = self.d / "jobs" / f"slurm-{job}.out"
        return p.read_text()[-(tail or 0):] if p.exists() else "(no output)"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm")
    (d / "jobs").mkdir()
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    (d / "slurm.conf").write_text(SLURM_CONF.format(host=host, d=d, node=NODE, cpus=os.cpu_count()))
    # registered like a cluster's namespace: a worker killed before its teardown (SIGTERM ends pytest without
    # `finally`) leaves it to `harness net clean`, which removes the namespaces of owners that are gone
    rid = registry.new_run_id()
    ns = registry.netns_name(rid, 0)
    entry = registry.Entry(run_id=rid, pid=os.getpid(), kind="cluster", netns=[ns])
    entry.save()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    procs: list[subprocess.Popen] = []
    s = Slurm(d, ns)
    try:
        for argv in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", NIC, "type", "veth", "peer", "name",
                     f"{NIC}p"], ["ip", "link", "set", f"{NIC}p", "up"], ["ip", "link", "set", NIC, "up"],
                     # an address off loopback: Slurm binds with getaddrinfo(AI_ADDRCONFIG), which wants one
                     ["ip", "addr", "add", "10.215.0.1/24", "dev", f"{NIC}p"]):
            s.run(*argv)
        for name, argv in (
            ("munged", ["munged", "-F", "-f", f"--key-file={key}", f"--socket={d}/munge.socket",
                        f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"]),
            ("slurmctld", ["slurmctld", "-D", "-f", str(d / "slurm.conf")]),
            ("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(d / "slurm.conf")]),
        ):
            log = open(d / f"{name}.out", "w")
            # nsenter execs the daemon: the pid is the daemon's
            procs.append(subprocess.Popen([*s.enter, *argv], env=s.env, stdout=log,
                                          stderr=subprocess.STDOUT))
            if name == "munged":
                wait(lambda: (d / "munge.socket").exists(), "munged's socket", 30, 0.1)
        wait(lambda: s.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle",
             "the node to be idle", 60)
        yield s
    finally:
        if len(procs) == 3:
            with contextlib.suppress(Exception):
                s.run("scancel", "--full", "-u", "root", check=False)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "del", ns])
        entry.drop()


def inventory(slurm, name: str, text: str) -> Path:
    p = slurm.d / name
    p.write_text(textwrap.dedent(text))
    return p


def sbatch(slurm, inv: Path, *args) -> Path:
    script = slurm.d / "jobs" / f"{inv.stem}.sbatch"
    r = slurm.harness("cluster", "sbatch", "--inventory", inv, "--script", script, *args)
    assert r.returncode == 0, r.stderr
    return script


def manifest(results: Path) -> dict | None:
    found = list(results.glob("*/*/manifest.json"))
    return json.loads(found[0].read_text()) if found else None


RUN = ["--system", "ours", "--model", "tiny", "--layers", "2", "--batch", "4", "--warmup", "1"]


def shaped_inventory(slurm) -> Path:
    """Two devices joined at NVLink class: namespaces and macvlans, but no netem (not every kernel has it)."""
    scen = slurm.d / "nvlink-pair.yaml"
    scen.write_text(textwrap.dedent("""
        name: nvlink-pair
        description: two GPUs of one node, NVLink between them
        device: {gpu: V100, peak_tflops: 125, memory_gb: 16}
        regions:
          - {name: node, devices: 2, count: 1}
        intra_region: {delay_ms: 0, bandwidth_gbps: 1200}
        inter_region: {delay_ms: 0, bandwidth_gbps: 1200}
    """))
    return inventory(slurm, "shaped.yaml", f"""
        scenario: {scen}
        subnet: 10.214.0.0/16
        nodes:
          - {{name: {NODE}, nic: {NIC}, host: 127.0.0.1, devices: [0, 1]}}
    """)


def start_shaped_job(slurm, results: Path, *sbatch_args) -> tuple[str, list[str]]:
    """Submit a long shaped run; returns (job id, its namespaces) once it trains in them."""
    job = slurm.submit(sbatch(slurm, shaped_inventory(slurm), *sbatch_args, "--", *RUN, "--iters", "1000000",
                              "--timeout", "3600", "--out", results))
    names = [f"harness-{node_run_id(NODE)}-{d}" for d in (0, 1)]
    wait(lambda: (m := manifest(results)) is not None and m["status"] == "running", "the run to start", 90)
    assert all(os.path.exists(f"{NETNS_DIR}/{n}") for n in names)
    assert manifest(results)["spec"]["network"]["mode"] == "shaped"
    return job, names


def assert_stopped_and_cleared(slurm, job: str, results: Path, names: list[str]) -> None:
    man = manifest(results)
    assert (man["status"], man["reason"]) == ("failed", "terminated by SIGTERM"), slurm.job_log(job)
    # the job's trap clears them; on a busy machine that may end just after squeue lets the job go
    left = lambda: [n for n in names if os.path.exists(f"{NETNS_DIR}/{n}")]  # noqa: E731
    try:
        wait(lambda: not left(), "the job's namespaces to be cleared", 30, tick_s=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}: {left()}\n{slurm.job_log(job)}") from None
    r = slurm.harness("net", "show")
    assert node_run_id(NODE) not in r.stdout, r.stdout


