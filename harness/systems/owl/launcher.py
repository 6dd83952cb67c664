"""The processes of one FL run: `python -m harness.systems.owl.launcher SPEC OUT` inside the emulated cluster.

Reads the cluster (HARNESS_CLUSTER: devices 0..W-1 the workers, device W the server), forks one
process per device into its namespace (train/launch.fork_ranks: a process that dies ends the run
within a grace period, naming it) and writes the outcome to OUT as JSON, also on failure:
{"status": "ok"|"failed", "reason", "kernel", "rounds": [[RankRound per rank] per round]}.
`launch(spec, devices)` does the same on loopback when the devices have no namespace (tests).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

MASTER_PORT = 29600


def label(spec, devices: list[dict]):
    W = spec.workers
    return lambda r: (f"server (device {W}, {devices[r]['addr']})" if r == W else
                      f"worker {r} (rack {spec.rack_of(r)}, {devices[r]['addr']})")


def launch(spec, devices: list[dict], *, port: int = MASTER_PORT, tmp_dir: Path | None = None) -> list[list]:
    """Run `spec` with one process per device ({"addr", "ifname", "netns_path" or None}); per round, per rank
    its RankRound. Raises RankFailure naming the first process that failed."""
    from ...network import netns
    from ...train.launch import fork_ranks
    from .runtime import fl_rank_main

    if len(devices) != spec.workers + 1:
        raise RuntimeError(f"cluster has {len(devices)} devices, the run needs {spec.workers} workers and a server")
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")  # pairs connect on first use: only the plan's
    _warm_up_parent()

    def target(rank: int):
        d = devices[rank]
        if d.get("netns_path"):
            netns.enter(d["netns_path"])
        return fl_rank_main(rank, spec, devices[0]["addr"], port, d.get("ifname", ""))

    per_rank = fork_ranks(len(devices), target, timeout_s=spec.timeout_s, label=label(spec, devices), tmp_dir=tmp_dir)
    return [[per_rank[r][k] for r in range(len(devices))] for k in range(len(spec.rounds))]


def _warm_up_parent() -> None:
    """The first counted call loads the dispatch-mode machinery (most of a second): once, before forking."""
    import torch

    from ...train.wire import WireCounter

    with WireCounter():
        torch.ones(1).add_(1)


def main(spec_path: str, out_path: str) -> int:
    from ...files import atomic_write_json
    from ...network.headroom import guest_sampling
    from ...train.launch import RankFailure
    from .runtime import FLSpec

    out = Path(out_path)
    kernel = "unknown"
    try:
        cluster = json.loads(Path(os.environ["HARNESS_CLUSTER"]).read_text())
        kernel = cluster.get("kernel", kernel)
        spec = FLSpec.from_json(json.loads(Path(spec_path).read_text()))
        devices = sorted(cluster["devices"], key=lambda d: d["index"])
        with guest_sampling(out.parent):  # the kernel's run queue beside the rounds (network/headroom.py)
            rounds = launch(spec, devices, tmp_dir=out.parent)
    except (RankFailure, Exception) as e:  # noqa: BLE001 - carried to the host as data
        reason = str(e) if isinstance(e, RankFailure) else f"{type(e).__name__}: {e}"
        atomic_write_json(out, {"status": "failed", "reason": reason, "kernel": kernel, "rounds": []})
        return 1
    atomic_write_json(out, {"status": "ok", "reason": "", "kernel": kernel,
                            "rounds": [[asdict(r) for r in ranks] for ranks in rounds]})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m harness.systems.owl.launcher SPEC OUT")
    sys.exit(main(sys.argv[1], sys.argv[2]))
