"""Launcher-mode program inside the emulated cluster: `python -m harness.train.emulated_guest SPEC OUT [SPEC OUT ...]`.

Runs once per boot of the cluster (inside user-mode Linux or the host kernel) with
HARNESS_CLUSTER naming the cluster description, for one run or several in turn. It
imports torch once, then for each run forks one rank per device;
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


#: Lines the launcher prints around each run of a batch, so the host can cut the log per run
#: and knows that run's outcome file is complete (train/emulated.py).
BEGIN_MARK, END_MARK = "harness-run-begin ", "harness-run-end "


def main(pairs: list[tuple[str, str]]) -> int:
    """Train each (SPEC, OUT) in turn in this cluster: torch and every system imported once, one
    warm-up, then per run a fresh fork of its ranks (a run is measured as it would be alone,
    without paying the imports again). Returns 1 if any run failed."""
    t_launch = _process_start_time()
    from ..plan import systems
    from ..files import atomic_write_json
    from ..plan.request import RunSpec
    from .rank import warm_up_parent
    from ..network.headroom import guest_sampling

    try:
        cluster = json.loads(Path(os.environ["HARNESS_CLUSTER"]).read_text())
        specs = [RunSpec.from_json(json.loads(Path(sp).read_text())) for sp, _ in pairs]
        for spec in specs:
            systems.get(spec.run.system).train_fn()  # import every system once, before forking
        t_imported = time.time()
        kinds = {}  # one CPU run of each kind of model: a GPT's and a CNN's kernels differ
        for spec in specs:
            if spec.run.device_type == "cpu":
                kinds.setdefault(spec.model.is_cnn, spec)
        for spec in kinds.values():
            warm_up_parent(spec)
        t_warm = time.time()
    except Exception as e:  # noqa: BLE001 - carried to the host as data
        for _, out in pairs:
            atomic_write_json(Path(out), {"status": "failed", "reason": f"{type(e).__name__}: {e}", "ranks": []})
        return 1
    # the emulated kernel's run queue, sampled beside the ranks (network/headroom.py); the host reads the file
    with guest_sampling(Path(pairs[0][1]).parent):
        return _runs(pairs, specs, cluster, t_launch, t_imported, t_warm)


def _runs(pairs, specs, cluster, t_launch, t_imported, t_warm) -> int:
    from .launch import RankFailure, fork_ranks
    from ..network import netns
    from ..network.timeline_program import changes_of_run, note_run
    from ..plan.layouts import run_topology
    from .elastic import under_agent
    from ..files import atomic_write_json
    from .rank import RankEnv, rank_main

    failed = 0
    devs = sorted(cluster["devices"], key=lambda d: d["index"])
    master = devs[0]["addr"]
    # Connect gloo pairs on first use: a pipeline rank talks to its neighbours and its
    # C_j only, and a full mesh over 100+ ms links costs seconds of start-up.
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    for k, ((_, out_path), spec) in enumerate(zip(pairs, specs)):
        out = Path(out_path)
        _mark(BEGIN_MARK, k)
        t_start = t_launch if k == 0 else time.time()  # a later run starts where the one before ended
        try:
            spec = spec.with_resolved(kernel=cluster.get("kernel", spec.resolved.kernel))
            if len(devs) != spec.layout.devices:
                raise RuntimeError(f"cluster has {len(devs)} devices, the run needs {spec.layout.devices}")

            def target(rank: int, spec=spec, port=MASTER_PORT + k):  # a fresh port: no wait on the last one's
                d = devs[rank]
                netns.enter(d["netns_path"])
                env = RankEnv(rank=rank, world_size=len(devs), master_addr=master, master_port=port,
                              addr=d["addr"], ifname=d["ifname"], device_index=d["index"])
                return rank_main(spec, env)

            label = lambda r: (f"rank {r} (device {devs[r]['index']}, {devs[r]['addr']}: "  # noqa: E731
                               f"{spec.layout.role(devs[r]['index'])})")
            note_run(k)
            topo = run_topology(spec.network)
            if under_agent(spec, topo):  # devices leave and come back: the elastic agent restarts the ranks
                atomic_write_json(out, {**_elastic(spec, topo, devs, port=MASTER_PORT + 100 * (k + 1),
                                                   workdir=out.parent / f"elastic-{k}"),
                                        "readback": cluster.get("readback", {}),
                                        **({} if (changes := changes_of_run(k)) is None else {"timeline": changes})})
                _mark(END_MARK, k)
                continue
            results = fork_ranks(len(devs), target, timeout_s=spec.run.timeout_s, label=label,
                                 tmp_dir=out.parent)  # the run's work directory (the host removes it)
            ready = [r.marks["training"] for r in results if "training" in r.marks]
            shared = {"imports": t_imported - t_launch, "warm_up": t_warm - t_launch} if k == 0 else {}
            atomic_write_json(out, {
                "status": "ok", "reason": "", "kernel": spec.resolved.kernel,
                # the ranks' clock (time.monotonic) on the wall clock, which the host's CPU samples use
                "wall_minus_monotonic": time.time() - time.monotonic(),
                "startup_s": (max(ready) - t_start) if ready else None,
                "startup_breakdown_s": {**shared, **{
                    m: max(r.marks[m] for r in results) - t_start for m in results[0].marks}},
                "readback": cluster.get("readback", {}),
                "ranks": [[asdict(s) for s in r.stats] for r in results],
                **({} if (changes := changes_of_run(k)) is None else {"timeline": changes}),
            })
        except (RankFailure, Exception) as e:  # noqa: BLE001 - carried to the host as data
            failed += 1
            atomic_write_json(out, {"status": "failed", "reason": f"{e}" if isinstance(e, RankFailure)
                                    else f"{type(e).__name__}: {e}", "ranks": []})
        _mark(END_MARK, k)
    return 1 if failed else 0


def _elastic(spec, topo, devs: list[dict], *, port: int, workdir: Path) -> dict:
    """A run under the elastic agent (train/elastic.py): generation g's rank r on device devices[r], its own
    store port; the outcome's one list of iterations (each with the layout it ran on) and the agent's account."""
    from ..network import netns
    from .elastic import run_elastic
    from .rank import RankEnv, rank_main

    def start_rank(gspec, devices, g, journal):
        master = devs[devices[0]]["addr"]

        def target(rank: int):
            d = devs[devices[rank]]
            netns.enter(d["netns_path"])
            env = RankEnv(rank=rank, world_size=len(devices), master_addr=master, master_port=port + g,
                          addr=d["addr"], ifname=d["ifname"], device_index=d["index"], journal=journal)
            return rank_main(gspec, env)
        return target

    got = run_elastic(spec, topo, start_rank, workdir=workdir,
                      label=lambda d: f"device {d} ({devs[d]['addr']})")
    return {"status": "ok", "reason": "", "kernel": spec.resolved.kernel, "startup_s": None,
            "wall_minus_monotonic": time.time() - time.monotonic(),
            "ranks": [[asdict(s) for s in got["stats"]]],
            "elastic": {k: v for k, v in got.items() if k != "stats"}}


def _mark(prefix: str, k: int) -> None:
    print(f"{prefix}{k}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: python -m harness.train.emulated_guest SPEC OUT [SPEC OUT ...]")
    sys.exit(main(list(zip(args[::2], args[1::2]))))
