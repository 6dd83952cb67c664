"""Real nodes: the same trainer started by torchrun, one process per GPU.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST0:29400 \\
        -m harness run --inventory cluster.yaml --system ours ...

(`harness cluster sbatch` writes the Slurm job that does this.) The inventory is the one
of `harness net apply` (harness/scenario/inventory.py) and the one source of the run's scenario,
device count and bandwidth scale: run arguments may repeat them, and fail in one line when
they disagree, so the records say what was shaped. Local rank k on node HARNESS_NODE (else the
host name) plays the node's k-th device, and its process-group rank is that device id, not
torchrun's RANK: the c10d rendezvous numbers nodes by host name, not in inventory order.
So the trainer brings its own store (device 0's process hosts it) instead of torchrun's
agent store, which the namespaces could not reach anyway. Which interface gloo/NCCL use
follows one rule (network/node.py `rank_network`): a process that finds its device's
namespace interface is shaped. The run says which it expects (`--network shaped`, the
default, or `none`) and fails in one line when the process is not where it should be.
A shaped process turns NCCL's P2P and shared-memory transports off: ranks of one node
would otherwise reach each other over NVLink or /dev/shm, around their namespaces.

Every process plans the run identically (the scheduler is seeded) and trains
(rank.rank_main); rank 0 gathers the per-iteration figures and writes
results/<scenario>/<run-id>/ (backend "cluster", kernel "host"). torchrun's agent stops
every process when one fails; rank 0 then writes a `failed` manifest with the error it saw.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ..scenario.inventory import InventoryError, load_inventory
from ..network.node import this_rank_network
from ..plan.request import RunRequest
from .experiment import record_run
from ..plan.layouts import plan_run
from .rank import RankEnv, rank_main

STORE_PORT = 29401  # device 0's store (HARNESS_STORE_PORT overrides); 29400 is torchrun's rendezvous
# NCCL for a shaped process: sockets over its namespace's interface, no path around it
SHAPED_NCCL_ENV = {"NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


def run_under_torchrun(req: RunRequest, inventory: Path) -> Path | None:
    """One torchrun process: train; rank 0 writes the run and returns its directory."""
    if any(k not in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        raise InventoryError("--inventory: run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset)")
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    inv = load_inventory(inventory)
    if inv.topo.n != world:
        raise InventoryError(f"{inventory}: nodes hold {inv.topo.n} devices but torchrun started {world} processes")
    net = this_rank_network(inv, local)
    if net.shaped != (req.network.mode == "shaped"):
        raise InventoryError(
            f"--network {req.network.mode}: device {net.device}'s process is "
            + (f"not in its namespace {net.netns} (run `harness net apply` on the node and start it with "
               "`ip netns exec`, or pass --network none)" if not net.shaped else
               f"in its shaped namespace {net.netns} (leave --network none out)"))
    rank = net.device
    os.environ.update(TORCHELASTIC_USE_AGENT_STORE="False", GLOO_SOCKET_IFNAME=net.ifname,
                      NCCL_SOCKET_IFNAME=net.ifname)
    if net.shaped:
        os.environ.update(SHAPED_NCCL_ENV)
    plan = plan_run(req)
    if plan.spec.layout.devices != world:
        raise InventoryError(f"--scenario: {plan.spec.layout.devices} devices, torchrun world is {world}")
    plan = replace(plan, spec=plan.spec.with_resolved(backend="cluster", kernel="host"))
    env = RankEnv(rank=rank, world_size=world, master_addr=net.master_addr,
                  master_port=int(os.environ.get("HARNESS_STORE_PORT", STORE_PORT)), addr=net.addr,
                  ifname=net.ifname, local_rank=local)
    if rank != 0:
        rank_main(plan.spec, env, gather=True)
        return None

    def launch(spec, topo, out):
        result = rank_main(spec, env, gather=True)
        return "host", result.gathered, {"inventory": inv.summary(),
                                         "cpus_allowed": len(os.sched_getaffinity(0))}  # rank 0's cores

    return record_run(plan, launch)
