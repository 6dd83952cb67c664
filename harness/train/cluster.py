"""Real nodes: the same trainer started by torchrun, one process per GPU.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST0:29400 \\
        -m harness run --inventory cluster.yaml --scenario ... --system ours ...

Every process plans the run identically (the scheduler is seeded), takes device id =
its global RANK, and trains (runner.rank_main with torchrun's MASTER_ADDR/PORT);
rank 0 gathers the per-iteration figures and writes results/<scenario>/<run-id>/
(backend "cluster", kernel "host"). torchrun's agent stops every process when one
fails; rank 0 then writes a `failed` manifest with the error it saw.

cluster.yaml:
    ifname: eth0          # NIC for gloo/NCCL sockets (optional; NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME)
    nodes:                # in RANK order: node k holds devices sum(gpus of nodes < k) ...
      - {host: 10.0.0.1, gpus: 8}
      - {host: 10.0.0.2, gpus: 8}
The scenario (--scenario) describes the links between these devices (delay, bandwidth)
for the scheduler; on real nodes the network itself is whatever it is.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import yaml

from ..errors import HarnessError
from .experiment import RunRequest, plan_run, record_run
from .runner import RankEnv, rank_main


class InventoryError(HarnessError, ValueError):
    """cluster.yaml is missing, malformed, or does not match torchrun's world."""


def load_inventory(path: Path) -> dict:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InventoryError(f"{path}: cannot read inventory ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise InventoryError(f"{path}: nodes: must be a non-empty list of {{host, gpus}}")
    unknown = set(doc) - {"nodes", "ifname"}
    if unknown:
        raise InventoryError(f"{path}: unknown keys {sorted(unknown)}")
    for k, n in enumerate(doc["nodes"]):
        if not isinstance(n, dict) or not isinstance(n.get("gpus"), int) or n["gpus"] < 1 or "host" not in n:
            raise InventoryError(f"{path}: nodes[{k}]: needs host and gpus >= 1 (got {n!r})")
    return doc


def run_under_torchrun(req: RunRequest, inventory: Path) -> Path | None:
    """One torchrun process: train; rank 0 writes the run and returns its directory."""
    inv = load_inventory(inventory)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", 0))
        master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise InventoryError("--inventory: run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset)") from None
    total = sum(n["gpus"] for n in inv["nodes"])
    if total != world:
        raise InventoryError(f"{inventory}: nodes hold {total} GPUs but torchrun started {world} processes")
    plan = plan_run(replace(req, network="none"))
    if plan.spec.devices != world:
        raise InventoryError(f"--scenario: {plan.spec.devices} devices, torchrun world is {world}")
    plan.spec = replace(plan.spec, backend="cluster", kernel="host")
    env = RankEnv(rank=rank, world_size=world, master_addr=master, master_port=port,
                  ifname=inv.get("ifname", ""), local_rank=local)
    if rank != 0:
        rank_main(plan.spec, env, gather=True)
        return None

    def launch(spec, topo, out):
        result = rank_main(spec, env, gather=True)
        return "host", result.gathered, {"inventory": inv}

    return record_run(req, plan, launch)
