"""`harness cluster sbatch`: the Slurm batch script of a real-node training run.

A pure function of the inventory and the `harness run` arguments, so the text can be read,
tested and diffed before anything runs. The job runs one step per node (srun), and that
step does everything on its node:
  1. `harness net apply` (one namespace per GPU process, shaped as the inventory says);
  2. torchrun; each GPU process enters its device's namespace with `ip netns exec` and runs
     `harness run --inventory ...` with gloo/NCCL on sockets over that namespace's interface;
  3. `harness net clear`, from the step's EXIT trap.
Apply, train and clear in one step because a job that hit its time limit or was cancelled
can start no new step: a clear step started from the batch script then fails
(`srun: error: ... has expired`) and every namespace stays. Slurm sends the step SIGTERM
and waits KillWait seconds before SIGKILL; the step's TERM trap clears at once, then stops
torchrun (rank 0 writes a `failed` manifest at SIGTERM, train/experiment.py). `--no-shaping` leaves out 1 and
3 and runs the ranks on the nodes' own network (`--network none`; no root needed).

The run arguments are checked as `harness run` checks them (the inventory is the one
source of scenario, device count and bandwidth scale): the CLI parses them into the request the
ranks will make, planned here, so a mismatch fails before the job is queued. `--device` decides the request: `--gpus-per-node` only for cuda; always
one CPU per rank (`--cpus-per-task`, passed to srun too: since Slurm 22.05 srun does not
inherit it), else every rank of a node shares one core.

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

from ..errors import HarnessError
from ..scenario.inventory import Inventory, InventoryError
from ..network.node import rank_network

RDZV_PORT = 29400


class SbatchError(HarnessError, ValueError):
    """A bad `harness cluster sbatch` argument (one line naming it)."""


def check_args(run_args: list[str], partition: str | None, time: str | None) -> None:
    if not run_args:
        raise SbatchError("harness run arguments: missing (give them after `--`, e.g. -- --system ours)")
    for flag in ("--inventory", "--network"):
        if any(a == flag or a.startswith(flag + "=") for a in run_args):
            raise SbatchError(f"harness run arguments: {flag} is set by the script (got it in the arguments"
                              + ("; --no-shaping runs unshaped)" if flag == "--network" else ")"))
    if partition is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", partition):
        raise SbatchError(f"--partition: not a partition name (got {partition!r})")
    if time is not None and not re.fullmatch(r"(\d+-)?\d+(:\d{2}){0,2}", time):
        raise SbatchError(f"--time: not a Slurm time such as 01:30:00 or 2-00:00:00 (got {time!r})")


def script_args(inv: Inventory, run_args: list[str], *, shaped: bool) -> list[str]:
    """What each rank of the job runs `harness run` with: the arguments given, then the script's own."""
    return [*run_args, "--inventory", str(inv.path), "--network", "shaped" if shaped else "none"]


def check_request(req, run_args: list[str]):
    """`req`, the RunRequest of the job's `harness run` arguments (script_args; the CLI parses them), planned as
    `harness run` plans it: every check (system, model, layout against the devices, batch, scheduler, the
    inventory's scenario/devices/bandwidth scale) now, in one line."""
    from ..plan.layouts import plan_run

    try:
        plan_run(req)
    except HarnessError as e:
        raise SbatchError(f"harness run arguments {' '.join(run_args)}: {e}") from None
    return req


def ranks_per_node(inv: Inventory) -> int:
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


def _heredoc(var: str, lines: list[str]) -> list[str]:
    return [f"{var}=$(cat <<'EOF'", *lines, "EOF", ")", f"export {var}"]


def sbatch_script(inv: Inventory, run_args: list[str], request, *, partition: str | None = None,
                  time: str | None = None, shaping: bool = True) -> str:
    """The batch script text; `inv.path` is written into it as given (pass an absolute path). `request`: the
    RunRequest of `script_args(inv, run_args, shaped=shaping)`, which every rank will make."""
    from .cluster import SHAPED_NCCL_ENV

    check_args(run_args, partition, time)
    n, g = len(inv.nodes), ranks_per_node(inv)
    cuda = check_request(request, run_args).run.device_type == "cuda"
    what = "GPU processes" if cuda else "CPU processes"
    per_node = f"--nodes={n} --ntasks-per-node=1 --cpus-per-task={g}"
    head = [
        "#!/bin/bash",
        f"# Written by `harness cluster sbatch` from {inv.path}:",
        f"# scenario {inv.topo.name}, {inv.topo.n} devices on {n} nodes x {g} {what}, "
        + (f"shaped at bandwidth scale {inv.bandwidth_scale:g}." if shaping else "unshaped (--no-shaping)."),
        "# One step per node (srun) does everything on its node:",
        *(["#   harness net apply (one shaped namespace per process; needs root),"] if shaping else []),
        "#   torchrun, each process" + (" in its device's namespace (ip netns exec) with gloo/NCCL on sockets"
                                        " over its interface," if shaping else " on the node's network,"),
        *(["#   harness net clear on the step's exit, also after a time limit or scancel (TERM trap)."]
          if shaping else []),
        f"#SBATCH --job-name=harness-{inv.topo.name}",
        f"#SBATCH --nodes={n}",
        f"#SBATCH --nodelist={','.join(x.name for x in inv.nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={g}",
        *([f"#SBATCH --gpus-per-node={g}"] if cuda else []),
        *([f"#SBATCH --partition={partition}"] if partition else []),
        *([f"#SBATCH --time={time}"] if time else []),
    ]
    nccl = " ".join(f"{k}={v}" for k, v in SHAPED_NCCL_ENV.items())
    if shaping:
        rank = [
            "# One process: local rank k on a node plays that node's k-th device (harness/network/node.py).",
            "# NCCL only on sockets over the namespace's interface: P2P (NVLink) and SHM would go around it.",
            *_heredoc("HARNESS_RANK_SH", [
                'case "$SLURMD_NODENAME:$LOCAL_RANK" in',
                *rank_cases(inv),
                '  *) echo "harness: no device for node $SLURMD_NODENAME local rank $LOCAL_RANK" >&2; exit 2 ;;',
                "esac",
                f'export HARNESS_NODE="$SLURMD_NODENAME" {nccl} '
                'NCCL_SOCKET_IFNAME="$ifname" GLOO_SOCKET_IFNAME="$ifname"',
                'exec ip netns exec "$ns" "$PYTHON" -m harness run --inventory "$HARNESS_INVENTORY" '
                '--network shaped "$@"',
            ]),
        ]
        start = ['"$PYTHON" -m harness net apply --inventory "$HARNESS_INVENTORY" --node "$SLURMD_NODENAME" || exit']
        clear = ['clear() { trap - EXIT; "$PYTHON" -m harness net clear --inventory "$HARNESS_INVENTORY" '
                 '--node "$SLURMD_NODENAME"; }',
                 "trap clear EXIT"]
    else:
        rank = [
            "# One process: local rank k on a node plays that node's k-th device (harness/network/node.py).",
            *_heredoc("HARNESS_RANK_SH", [
                'export HARNESS_NODE="$SLURMD_NODENAME"',
                'exec "$PYTHON" -m harness run --inventory "$HARNESS_INVENTORY" --network none "$@"',
            ]),
        ]
        start, clear = [], []
    node = [
        "# One step per node: " + ("apply, torchrun (rendezvous on the first node), clear on exit."
                                   if shaping else "torchrun (rendezvous on the first node)."),
        *_heredoc("HARNESS_NODE_SH", [
            *clear,
            "# SIGTERM (time limit, scancel): stop torchrun"
            + ("; clear at once, before a slow stop meets SIGKILL (processes still in a namespace keep "
               "it until they exit)" if shaping else ""),
            "trap 'trap \"\" TERM; kill -TERM $(jobs -p) 2>/dev/null; " + ("clear; " if shaping else "")
            + "wait; exit 143' TERM",
            *start,
            f'"$PYTHON" -m torch.distributed.run --nnodes {n} --nproc-per-node {g} --rdzv-backend c10d \\',
            f'    --rdzv-endpoint {inv.nodes[0].address}:{RDZV_PORT} --rdzv-id "$SLURM_JOB_ID" \\',
            '    --no-python bash -c "$HARNESS_RANK_SH" harness-rank "$@" &',
            "wait $!",
        ]),
    ]
    body = [
        "set -euo pipefail",
        f"export HARNESS_INVENTORY={shlex.quote(str(inv.path))}",
        "export PYTHON=${PYTHON:-python}  # the interpreter with harness and torch on every node",
        "",
        *rank,
        *node,
        f"srun {per_node} --kill-on-bad-exit=1 bash -c \"$HARNESS_NODE_SH\" harness-node {shlex.join(run_args)}",
    ]
    return "\n".join(head + body) + "\n"
