"""`harness cluster sbatch`: the Slurm batch script of a shaped real-node training run.

A pure function of the inventory and the `harness run` arguments, so the text can be read,
tested and diffed before anything runs. The job:
  1. `harness net apply` on every node (one namespace per GPU process, shaped);
  2. torchrun on every node; each GPU process enters its device's namespace with
     `ip netns exec` and runs `harness run --inventory ...` with gloo/NCCL on sockets over
     that namespace's interface;
  3. `harness net clear` on every node, from an EXIT trap, so it also runs after a failure.

Nodes find themselves by `$SLURMD_NODENAME`, and the job asks for exactly the inventory's
nodes (`--nodelist`): the inventory describes particular machines (their NICs, which devices
share NVLink), so the names must be the Slurm node names; mapping SLURM_NODEID to inventory
order instead would silently put the scenario's devices on whatever nodes Slurm picked.
The per-rank namespace is entered by `ip netns exec` in a small shell step (a `case` on
node and LOCAL_RANK) rather than inside the Python process: the script then shows, and
a person can check, exactly which process runs where, and the trainer needs no setns.
"""
from __future__ import annotations

import re
import shlex

from .errors import HarnessError
from .inventory import Inventory, InventoryError
from .network.node import rank_network

RDZV_PORT = 29400


class SbatchError(HarnessError, ValueError):
    """A bad `harness cluster sbatch` argument (one line naming it)."""


def _check_args(run_args: list[str], partition: str | None, time: str | None) -> None:
    if not run_args:
        raise SbatchError("harness run arguments: missing (give them after `--`, e.g. -- --scenario 5 --system ours)")
    if any(a == "--inventory" or a.startswith("--inventory=") for a in run_args):
        raise SbatchError("harness run arguments: --inventory is added by the script (got it in the arguments)")
    if partition is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", partition):
        raise SbatchError(f"--partition: not a partition name (got {partition!r})")
    if time is not None and not re.fullmatch(r"(\d+-)?\d+(:\d{2}){0,2}", time):
        raise SbatchError(f"--time: not a Slurm time such as 01:30:00 or 2-00:00:00 (got {time!r})")


def gpus_per_node(inv: Inventory) -> int:
    """Every node must hold the same number of devices: torchrun and Slurm take one G for all."""
    g = len(inv.nodes[0].devices)
    for k, n in enumerate(inv.nodes):
        if len(n.devices) != g:
            raise InventoryError(f"{inv.path}: nodes[{k}].devices: sbatch needs the same number of devices on "
                                 f"every node ({len(n.devices)} here, {g} on {inv.nodes[0].name})")
    return g


def rank_cases(inv: Inventory) -> list[str]:
    """`case` arms: node:local_rank -> the namespace and interface of the device it plays."""
    out = []
    for node in inv.nodes:
        for k, d in enumerate(node.devices):
            net = rank_network(inv, node.name, k, shaped=True)
            out.append(f"  {node.name}:{k}) ns={net.netns} ifname={net.ifname} ;;  # device {d}")
    return out


def sbatch_script(inv: Inventory, run_args: list[str], *, partition: str | None = None,
                  time: str | None = None) -> str:
    """The batch script text; `inv.path` is written into it as given (pass an absolute path)."""
    _check_args(run_args, partition, time)
    n, g = len(inv.nodes), gpus_per_node(inv)
    every_node = f"srun --nodes={n} --ntasks-per-node=1"
    node_step = "bash -c '\"$PYTHON\" -m harness net {} --inventory \"$HARNESS_INVENTORY\" --node \"$SLURMD_NODENAME\"'"
    head = [
        "#!/bin/bash",
        f"# Written by `harness cluster sbatch` from {inv.path}:",
        f"# scenario {inv.topo.name}, {inv.topo.n} devices on {n} nodes x {g} GPUs.",
        "# 1. harness net apply on every node (one shaped namespace per GPU process; needs root)",
        "# 2. torchrun on every node; each GPU process runs in its device's namespace (ip netns exec)",
        "#    with gloo/NCCL on sockets over the namespace's interface",
        "# 3. harness net clear on every node, on any exit (after scancel, check with `harness net show`)",
        f"#SBATCH --job-name=harness-{inv.topo.name}",
        f"#SBATCH --nodes={n}",
        f"#SBATCH --nodelist={','.join(x.name for x in inv.nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={g}",
    ]
    head += [f"#SBATCH --partition={partition}"] if partition else []
    head += [f"#SBATCH --time={time}"] if time else []
    body = [
        "set -euo pipefail",
        f"export HARNESS_INVENTORY={shlex.quote(str(inv.path))}",
        "export PYTHON=${PYTHON:-python}  # the interpreter with harness and torch on every node",
        "",
        "net_clear() {",
        f"    {every_node} {node_step.format('clear')}",
        "}",
        "trap net_clear EXIT",
        "trap 'exit 143' TERM",
        f"{every_node} {node_step.format('apply')}",
        "",
        "# One GPU process: local rank k on a node plays that node's k-th device (harness/network/node.py).",
        "HARNESS_RANK_SH=$(cat <<'EOF'",
        'case "$SLURMD_NODENAME:$LOCAL_RANK" in',
        *rank_cases(inv),
        '  *) echo "harness: no device for node $SLURMD_NODENAME local rank $LOCAL_RANK" >&2; exit 2 ;;',
        "esac",
        'export HARNESS_NODE="$SLURMD_NODENAME" NCCL_NET=Socket '
        'NCCL_SOCKET_IFNAME="$ifname" GLOO_SOCKET_IFNAME="$ifname"',
        'exec ip netns exec "$ns" "$PYTHON" -m harness run --inventory "$HARNESS_INVENTORY" "$@"',
        "EOF",
        ")",
        "# torchrun, one agent per node; rendezvous on the first node",
        f"{every_node} --kill-on-bad-exit=1 \"$PYTHON\" -m torch.distributed.run \\",
        f"    --nnodes {n} --nproc-per-node {g} --rdzv-backend c10d "
        f"--rdzv-endpoint {inv.nodes[0].address}:{RDZV_PORT} --rdzv-id \"$SLURM_JOB_ID\" \\",
        f"    --no-python bash -c \"$HARNESS_RANK_SH\" harness-rank {shlex.join(run_args)}",
    ]
    return "\n".join(head + body) + "\n"
