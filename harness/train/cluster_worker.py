"""Launcher-mode program inside the emulated cluster: `python -m harness.train.cluster_worker SPEC OUT`.

Runs once per run (inside user-mode Linux or the host kernel) with HARNESS_CLUSTER
naming the cluster description. It imports torch once, forks one rank per device;
each rank enters its device's namespace, binds gloo to the device's interface and
trains (runner.rank_main). The outcome goes to OUT as JSON, also on failure:
{"status": "ok"|"failed", "reason", "kernel", "startup_s", "ranks": [[IterationStats...]...]}.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path


def _process_start_time() -> float:
    """Wall-clock time this process was started (before Python and torch were imported)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


MASTER_PORT = 29500


def _keep_tcp_window_when_idle() -> None:
    """A training connection idles between bursts (compute, the other phase); Linux would
    restart slow start after each idle period longer than an RTO, costing several RTTs per
    message on 100+ ms links. Long-lived training links are tuned this way in practice."""
    try:
        Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").write_text("0")
    except OSError:
        pass


def main(spec_path: str, out_path: str) -> int:
    t_launch = _process_start_time()
    from ..launch import RankFailure, fork_ranks
    from .. import systems
    from ..network import netns
    from ..results import atomic_write_json
    from .config import RunSpec
    from .rank import RankEnv, rank_main, warm_up_parent

    out = Path(out_path)
    try:
        cluster = json.loads(Path(os.environ["HARNESS_CLUSTER"]).read_text())
        spec = RunSpec.from_json(json.loads(Path(spec_path).read_text()))
        spec = spec.with_resolved(kernel=cluster.get("kernel", spec.resolved.kernel))
        devs = sorted(cluster["devices"], key=lambda d: d["index"])
        if len(devs) != spec.layout.devices:
            raise RuntimeError(f"cluster has {len(devs)} devices, the run needs {spec.layout.devices}")
        master = devs[0]["addr"]
        systems.get(spec.run.system).train_fn()  # import the system once, before forking
        t_imported = time.time()
        if spec.run.device_type == "cpu":
            warm_up_parent(spec)
        t_warm = time.time()
        # Connect gloo pairs on first use: a pipeline rank talks to its neighbours and its
        # C_j only, and a full mesh over 100+ ms links costs seconds of start-up.
        os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")

        def target(rank: int):
            d = devs[rank]
            netns.enter(d["netns_path"])
            _keep_tcp_window_when_idle()
            env = RankEnv(rank=rank, world_size=len(devs), master_addr=master, master_port=MASTER_PORT,
                          addr=d["addr"], ifname=d["ifname"], device_index=d["index"])
            return rank_main(spec, env)

        label = lambda r: f"rank {r} (device {devs[r]['index']}, {devs[r]['addr']})"  # noqa: E731
        results = fork_ranks(len(devs), target, timeout_s=spec.run.timeout_s,
                             label=label)
        ready = [r.marks["training"] for r in results if "training" in r.marks]
        atomic_write_json(out, {
            "status": "ok", "reason": "", "kernel": spec.resolved.kernel,
            "startup_s": (max(ready) - t_launch) if ready else None,
            "startup_breakdown_s": {"imports": t_imported - t_launch, "warm_up": t_warm - t_launch, **{
                k: max(r.marks[k] for r in results) - t_launch for k in results[0].marks}},
            "ranks": [[asdict(s) for s in r.stats] for r in results],
        })
        return 0
    except (RankFailure, Exception) as e:  # noqa: BLE001 - carried to the host as data
        atomic_write_json(out, {"status": "failed", "reason": f"{e}" if isinstance(e, RankFailure)
                                else f"{type(e).__name__}: {e}", "ranks": []})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
