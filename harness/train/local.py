"""The loopback launcher: fork one rank per device on 127.0.0.1 (no shaping), for debugging, CI and parity tests."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from .launch import fork_ranks
from ..plan.request import RunSpec
from .rank import RankEnv, RankResult, rank_main
from ..plan import systems
from .stats import IterationStats, merge_stats


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@dataclass
class LocalRun:
    """Results of every rank of one run."""

    ranks: list[RankResult]

    @property
    def stats(self) -> list[IterationStats]:
        return merge_stats([r.stats for r in self.ranks], shared_clock=True)  # forked on one host

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters saved by the ranks, merged (the lowest rank holding a name wins)."""
        out: dict[str, torch.Tensor] = {}
        for r in self.ranks:
            for k, v in r.state.items():
                out.setdefault(k, v)
        return out


def run_local(spec: RunSpec, world_size: int | None = None, *, collect_state: bool = False,
              timeout_s: float | None = None, tmp_dir: Path | None = None) -> LocalRun:
    """Fork `world_size` ranks (default: the layout's devices) on loopback and run `spec` on them
    (their results pass through `tmp_dir`: the run's work directory, or the system's).

    Raises launch.RankFailure naming the rank if any rank fails; never hangs past the
    timeout (default the spec's run.timeout_s, + a few seconds of grace to stop the rest).
    """
    world_size = world_size or spec.layout.devices
    systems.get(spec.run.system).train_fn()  # fail fast in the parent on an unknown system
    port = free_port()

    def target(rank: int) -> RankResult:
        env = RankEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port, ifname="lo")
        return rank_main(spec, env, collect_state)

    label = lambda r: f"rank {r} ({spec.layout.role(r)})"  # noqa: E731
    return LocalRun(fork_ranks(world_size, target, timeout_s=timeout_s or spec.run.timeout_s, label=label,
                               tmp_dir=tmp_dir))


def run_local_elastic(spec: RunSpec, topo, workdir: Path) -> dict:
    """`spec` on loopback under the elastic agent (elastic.py), for a run whose devices leave (the debug
    section's preempt fault): generation g's rank r is device devices[r]. Returns run_elastic's account."""
    from .elastic import run_elastic

    systems.get(spec.run.system).train_fn()

    def start_rank(gspec: RunSpec, devices: tuple, generation: int, journal: str):
        port = free_port()

        def target(rank: int) -> RankResult:
            env = RankEnv(rank=rank, world_size=len(devices), master_addr="127.0.0.1", master_port=port,
                          ifname="lo", device_index=devices[rank], journal=journal)
            return rank_main(gspec, env)
        return target

    return run_elastic(spec, topo, start_rank, workdir=Path(workdir))


def local_spec(layout, system: str = "ours", **fields) -> RunSpec:
    """A spec to run `layout` on loopback (tests, notebooks): `fields` name fields of any section
    (model: name, layers, batch, ...; run: iters, warmup, ...; debug: fault_rank, trace, ...)."""
    from dataclasses import fields as dc_fields

    from ..plan.request import DebugSection, ModelSection, NetworkSection, Resolved, RunSection

    sections = {"model": ModelSection, "run": RunSection, "debug": DebugSection}
    parts = {name: {} for name in sections}
    for key, value in fields.items():
        owner = [n for n, cls in sections.items() if key in {f.name for f in dc_fields(cls)}]
        if not owner:
            raise TypeError(f"local_spec: unknown field {key!r}")
        parts[owner[0]][key] = value
    parts["model"].setdefault("layers", layout.layers)
    parts["run"] = {"run_id": "local", "warmup": 0, **parts["run"], "system": system}
    return RunSpec(network=NetworkSection(scenario="none", mode="none"), layout=layout,
                   resolved=Resolved(run_id="local", backend="local", scenario="none", scenario_source="none"),
                   **{name: cls(**parts[name]) for name, cls in sections.items()})
