"""One inventory for shaping and training, the rank rule, and `harness cluster sbatch` (no root:
the script is checked as text, then run against fake srun / ip / python that log what they get)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.cli.cluster import job_request
from harness.train.cluster_batch import sbatch_script
from harness.scenario.inventory import InventoryError, load_inventory
from harness.network.node import device_names, rank_network, this_rank_network

ROOT = Path(__file__).resolve().parent.parent
INV = ROOT / "tests/data/cluster-2node.yaml"
RUN_ARGS = ["--scenario", "5", "--devices", "8", "--system", "ours", "--device", "cuda", "--results", "my results"]


def test_one_inventory_for_net_apply_and_the_trainer(capsys, monkeypatch):
    for node in ("gpu-a", "gpu-b"):
        assert main(["net", "apply", "--inventory", str(INV), "--node", node, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("ip netns add harness-") == 8 and out.count("bandwidth scale 0.5") == 2  # from the inventory
    inv = load_inventory(INV)
    # the trainer's reading: node gpu-b lists [7, 6, 5, 4], so its local rank 1 plays device 6
    ns, ifname = device_names("gpu-b", 6)
    shaped = this_rank_network(inv, 1, node="gpu-b", interfaces={"lo", ifname})
    assert (shaped.device, shaped.netns, shaped.ifname, shaped.shaped) == (6, ns, ifname, True)
    assert (shaped.addr, shaped.master_addr) == ("10.214.0.7", "10.214.0.1")  # device 0's namespace hosts the store
    monkeypatch.setenv("HARNESS_NODE", "gpu-b")
    plain = this_rank_network(inv, 1, interfaces={"lo", "ens5"})
    assert (plain.device, plain.ifname, plain.shaped, plain.master_addr) == (6, "ens5", False, "10.0.0.1")
    assert f"ip netns add {ns}" in out and re.search(rf"ip link add {ifname} link ens5 gso_max_segs \d+ type macvlan", out)


def test_rank_rule_names_the_namespace_net_apply_creates():
    inv = load_inventory(INV)
    for node in inv.nodes:
        for k, d in enumerate(node.devices):
            net = rank_network(inv, node.name, k, shaped=True)
            assert net.device == d and (net.netns, net.ifname) == device_names(node.name, d)
            assert re.fullmatch(rf"harness-[0-9a-f]{{6}}-{d}", net.netns) and net.ifname.startswith("hnp-")
    a, b = device_names("gpu-a", 0), device_names("gpu-b", 0)
    assert a != b  # the id comes from the node name


def test_rank_rule_errors(monkeypatch):
    inv = load_inventory(INV)
    monkeypatch.setenv("HARNESS_NODE", "gpu-z")
    with pytest.raises(InventoryError, match=r"nodes: this node 'gpu-z' \(HARNESS_NODE, else the host name\)"):
        this_rank_network(inv, 0, interfaces=set())
    with pytest.raises(InventoryError, match="node 'gpu-a' holds 4 devices, no local rank 4"):
        rank_network(inv, "gpu-a", 4, shaped=False)


def test_sbatch_text(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    assert main(["cluster", "sbatch", "--inventory", str(INV), "--script", str(out), "--partition", "gpu",
                 "--time", "02:00:00", "--", *RUN_ARGS]) == 0
    assert f"wrote {out}" in capsys.readouterr().out and os.access(out, os.X_OK)
    text = out.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --nodelist=gpu-a,gpu-b", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
                 "#SBATCH --time=02:00:00", f"export HARNESS_INVENTORY={INV}"):
        assert line in text.splitlines(), line
    assert "4 GPU processes, shaped at bandwidth scale 0.5" in text
    torchrun = re.search(r"torch\.distributed\.run (.*) \\\n\s+(.*) \\\n\s+(.*)", text)
    assert torchrun.group(1) == "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d"
    assert torchrun.group(2) == '--rdzv-endpoint 10.0.0.1:29400 --rdzv-id "$SLURM_JOB_ID"'
    assert torchrun.group(3) == '--no-python bash -c "$HARNESS_RANK_SH" harness-rank "$@" &'
    srun = [x for x in text.splitlines() if x.startswith("srun ")]
    assert srun == ['srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=4 --kill-on-bad-exit=1 bash -c '
                    '"$HARNESS_NODE_SH" harness-node --scenario 5 --devices 8 --system ours --device cuda '
                    "--results 'my results'"]  # one step per node: nothing to start once the job ends
    ns, ifname = device_names("gpu-b", 6)
    assert f"  gpu-b:1) ns={ns} ifname={ifname} ;;" in text
    # NCCL only on sockets over the namespace's interface, never P2P/NVLink or shared memory around it
    assert ('NCCL_NET=Socket NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 '
            'NCCL_SOCKET_IFNAME="$ifname" GLOO_SOCKET_IFNAME="$ifname"' in text)
    assert ('exec ip netns exec "$ns" "$PYTHON" -m harness run --inventory "$HARNESS_INVENTORY" --network shaped '
            '"$@"' in text)
    at = [text.index(x) for x in ("-m harness net clear", "trap clear EXIT", "kill -TERM $(jobs -p) 2>/dev/null; clear;",
                                  "-m harness net apply", "-m torch.distributed.run")]
    assert at == sorted(at)  # clear on exit and at SIGTERM, then apply, then torchrun
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0


def test_sbatch_cpu_run_asks_no_gpus_and_unshaped_has_no_namespaces(capsys):
    args = [a for a in RUN_ARGS if a != "cuda"]
    args[args.index("--device") + 1:args.index("--device") + 1] = ["cpu"]
    assert main(["cluster", "sbatch", "--inventory", str(INV), "--", *args]) == 0
    text = capsys.readouterr().out
    assert "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=4" in text.splitlines()
    assert "4 CPU processes, shaped" in text
    assert main(["cluster", "sbatch", "--inventory", str(INV), "--no-shaping", "--", *args]) == 0
    text = capsys.readouterr().out
    assert "unshaped (--no-shaping)" in text
    for absent in ("net apply", "net clear", "ip netns", "NCCL_"):
        assert absent not in text, absent
    assert 'exec "$PYTHON" -m harness run --inventory "$HARNESS_INVENTORY" --network none "$@"' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


FAKES = {
    "srun": """
        # srun: drop the options, run the command once per node
        while [[ $1 == --* ]]; do shift; done
        for n in $FAKE_NODES; do SLURMD_NODENAME=$n "$@" || exit $?; done
    """,
    "ip": """
        # ip netns exec NS CMD...: note the namespace, run CMD here
        [[ "$1 $2" == "netns exec" ]] || exit 9
        ns=$3; shift 3
        FAKE_NS=$ns exec "$@"
    """,
    "python": """
        args="$*"
        echo "$SLURMD_NODENAME|${LOCAL_RANK-}|${FAKE_NS-}|${NCCL_NET-}|${NCCL_SOCKET_IFNAME-}|${GLOO_SOCKET_IFNAME-}|${HARNESS_NODE-}|${args//$'\n'/ }" >> "$FAKE_LOG"
        if [[ "$1 $2" == "-m torch.distributed.run" ]]; then  # torchrun: G local ranks of the command
            shift 2; g=1
            while [[ $1 != --no-python ]]; do [[ $1 == --nproc-per-node ]] && g=$2; shift; done; shift
            for ((k = 0; k < g; k++)); do LOCAL_RANK=$k "$@" || exit $?; done
        fi
        [[ "$*" != *"net apply"* || -z "${FAKE_APPLY_FAILS-}" ]] || exit 3
        if [[ "$*" == *"harness run"* && -n "${FAKE_RANKS_WAIT-}" ]]; then  # train until terminated
            while [[ ! -e $FAKE_RANKS_WAIT ]]; do sleep 0.05; done
        fi
    """,
}


def _fake_job(tmp_path, **env):
    """(the job's argv, its environment with the fakes first on PATH, the fakes' call log)."""
    script = tmp_path / "job.sbatch"
    inv = load_inventory(INV)
    script.write_text(sbatch_script(inv, RUN_ARGS, job_request(inv, RUN_ARGS, shaped=True)))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in FAKES.items():
        (bindir / name).write_text("#!/bin/bash\n" + textwrap.dedent(body))
        (bindir / name).chmod(stat.S_IRWXU)
    log = tmp_path / "log"
    return ["bash", str(script)], {"PATH": f"{bindir}:{os.environ['PATH']}", "PYTHON": str(bindir / "python"),
                                   "FAKE_LOG": str(log), "FAKE_NODES": "gpu-a gpu-b", "SLURM_JOB_ID": "42", **env}, log


def _run_job(tmp_path, **env):
    argv, env, log = _fake_job(tmp_path, **env)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    return r, [line.split("|") for line in log.read_text().splitlines()]


def test_sbatch_script_runs_apply_ranks_in_namespaces_then_clear(tmp_path):
    r, calls = _run_job(tmp_path)
    assert r.returncode == 0, r.stderr
    what = [c[7].split(" --")[0] for c in calls]
    one_node = ["-m harness net apply", "-m torch.distributed.run"] + ["-m harness run"] * 4 + ["-m harness net clear"]
    assert what == one_node * 2  # each node's step: apply, its ranks, clear
    assert [c[0] for c in calls] == ["gpu-a"] * 7 + ["gpu-b"] * 7 and calls[0][7].endswith("--node gpu-a")
    inv = load_inventory(INV)
    ranks = [c for c in calls if c[7].startswith("-m harness run")]
    for node, local, ns, nccl, nccl_if, gloo_if, harness_node, argv in ranks:
        net = rank_network(inv, node, int(local), shaped=True)
        assert (ns, nccl, nccl_if, gloo_if, harness_node) == (net.netns, "Socket", net.ifname, net.ifname, node)
        assert argv == f"-m harness run --inventory {INV} --network shaped " + " ".join(RUN_ARGS)


def test_sbatch_script_clears_after_a_failed_apply(tmp_path):
    r, calls = _run_job(tmp_path, FAKE_APPLY_FAILS="1")
    assert r.returncode == 3
    assert [c[7].split(" --inventory")[0] for c in calls] == ["-m harness net apply", "-m harness net clear"]


def test_sbatch_step_clears_when_terminated(tmp_path):
    """Slurm's time limit and scancel send SIGTERM to the step: it stops torchrun and clears."""
    argv, env, log = _fake_job(tmp_path, FAKE_NODES="gpu-a", FAKE_RANKS_WAIT=str(tmp_path / "never"))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and "-m harness run" in log.read_text()):  # a rank is training
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGTERM)  # as slurmstepd signals every process of the step
        p.wait(timeout=30)
        while "net clear" not in log.read_text():  # the step outlives the batch shell, as under slurmstepd
            assert time.monotonic() < deadline + 30, log.read_text()
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the whole session, left behind only on failure
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    what = [line.split("|")[7].split(" --")[0] for line in log.read_text().splitlines()]
    assert what[-1] == "-m harness net clear" and what.count("-m harness net clear") == 1, what


@pytest.mark.parametrize("argv, needle", [
    ([], "harness run arguments: missing"),
    (["--", "--inventory", "x.yaml"], "--inventory is set by the script"),
    (["--", "--network", "none"], "--network is set by the script (got it in the arguments; --no-shaping runs"),
    (["--", "--scenario", "3"], "--scenario 3: the inventory " + str(INV) + " plays scenario 5-worldwide, not "
                                "3-multi-dc (leave --scenario out: on real nodes the inventory says it)"),
    (["--", "--devices", "16"], "--devices 16: the inventory " + str(INV) + " has 8 devices"),
    (["--", "--bandwidth-scale", "1"], "--bandwidth-scale 1: the inventory " + str(INV) + " shapes at 0.5"),
    (["--", "--system", "megatron", "--zero", "1"], "--zero: not an option of --system megatron"),
    (["--", "--itres", "3"], "harness run arguments: unrecognized arguments: --itres 3"),
    (["--time", "soon", "--", "--scenario", "5"], "--time: not a Slurm time"),
    (["--partition", "a b", "--", "--scenario", "5"], "--partition: not a partition name"),
])
def test_sbatch_bad_arguments_are_one_line_errors(argv, needle, capsys):
    assert main(["cluster", "sbatch", "--inventory", str(INV), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_sbatch_needs_the_same_device_count_on_every_node(tmp_path, capsys):
    inv = tmp_path / "cluster.yaml"
    inv.write_text(INV.read_text().replace("[7, 6, 5, 4]", "[7, 6, 5]").replace("[0, 1, 2, 3]", "[0, 1, 2, 3, 4]"))
    assert main(["cluster", "sbatch", "--inventory", str(inv), "--", "--scenario", "5"]) == 2
    assert "nodes[1].devices: sbatch needs the same number of devices on every node (3 here, 5 on gpu-a)" \
        in capsys.readouterr().err
