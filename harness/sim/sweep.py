"""Every system, layout and placement for one scenario and setting; the best of each; records.

Placements come from harness/layout/: `default` is rank order (device ids follow the
scenario's regions), `random` the mean over the seeded placements 2022, 2023, 2024 (the
paper's random layouts, Yuan et al. App. D.1; the same rule and seeds as `harness run
--system ours-random --seed S` and the baselines' `--rank-order S`, so a row here and an
emulated run speak of the same assignment). Grids: layout.megatron_degrees and
layout.deepspeed_degrees (App. D.2). A system's best is its fastest (layout,
placement), as the paper reports each baseline's best grid point.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .. import layout as layouts
from ..plan import systems as registry
from ..layout import RANDOM_SEEDS, Layout, LayoutError
from ..compute.compression import NONE, Compression
from ..compute.model import GPTConfig
from ..compute import PAPER_DTYPE, BatchError, c_dp_bytes, c_pp_bytes, pflop_per_iteration
from ..compute.profiles import ComputeProfile, device_profiles
from ..files import atomic_write_json
from ..results import IterationRecord
from ..scenario import Topology
from ..scenario.transport import Transport
from .. import compute as work
from ..netmodel.links import PROTOCOLS, Links
from ..scheduler import DEFAULT_BUDGET
from .systems import SimError, SimResult

PLACEMENTS = ("default", "random")
PAPER_RUNTIME = dict(schedule="gpipe", dp_sync="sharded-ps", recompute=True)  # ours at paper scale (section 3.5)


@functools.lru_cache(maxsize=None)
def _scheduler_source_digest() -> bytes:
    """Digest of the scheduler and cost-model sources (ga-hetero's iteration model and allocator among them):
    a changed scheduler never reuses old cached schedules.
    Taken once per process, as the code a process runs is the code it imported."""
    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "scheduler").glob("*.py")) + sorted((root / "allocation").glob("*.py"))
    return hashlib.sha1(b"".join(f.read_bytes() for f in files)).digest()


@dataclass
class Candidate:
    """One simulated (system, layout, placement); seconds is the mean over the placement's seeds."""

    system: str
    config: dict
    seconds: float
    compute_seconds: float
    seeds: tuple[int, ...]
    best: bool = False
    layout: Layout | None = None  # the layout simulated (the first seed's), for what it holds in memory
    # Links -> seconds: the same model on the same layouts (mean over the same seeds) on other links, e.g. a
    # timeline's links as they change (sim/timeline.py); None: its model cannot
    resimulate: Callable[[Links], float] | None = field(default=None, repr=False, compare=False)


def candidate_memory(c: Candidate, topo: Topology, cfg: GPTConfig, batch: int, micro_batch: int):
    """Whether a candidate's layout fits its devices (layout/memory.MemoryFit): its system's memory model (its registry
    entry's stage_memory) at the micro-batch it ran (its config's where its model chose one, else `micro_batch`);
    None without a layout, or with pipelines that differ (no one table of stages)."""
    from ..layout.memory import memory_fit

    if c.layout is None:
        return None
    try:
        return memory_fit(c.layout, topo, cfg, batch, c.config.get("micro_batch", micro_batch), work.PAPER_BYTES,
                          registry.get(c.system).stage_memory_fn())
    except LayoutError:
        return None


class Simulator:
    """Simulates one scenario; caches scheduled assignments per (c_pp, c_dp) in memory and on disk."""

    def __init__(self, topo: Topology, profile_overrides: dict[str, ComputeProfile] | None = None, *,
                 d_pp: int = 8, scheduler: str = "ga", schedule_seed: int = 0, budget: int = DEFAULT_BUDGET,
                 cache_dir: Path | None = None, ps_mode: str = "grouped",
                 placements: tuple[str, ...] = PLACEMENTS, micro_batch: int = 1, protocol: str = "nccl",
                 nic: str = "shared", profiles: list[ComputeProfile] | None = None, allocator: str | None = None,
                 transport: Transport | None = None, options: dict | None = None):
        if topo.n % d_pp:
            raise SimError(f"--d-pp: {d_pp} does not divide the {topo.n} devices of {topo.name}")
        self._options = dict(profile_overrides=profile_overrides, d_pp=d_pp, scheduler=scheduler,
                             schedule_seed=schedule_seed, budget=budget, cache_dir=cache_dir, ps_mode=ps_mode,
                             placements=placements, micro_batch=micro_batch, protocol=protocol, nic=nic,
                             profiles=profiles, allocator=allocator, transport=transport, options=options)
        self.options = dict(options or {})  # systems' own options as given (name -> value): options_of
        for p in placements:
            if p not in PLACEMENTS:
                raise SimError(f"--placement: unknown placement {p!r} (known: {', '.join(PLACEMENTS)})")
        if transport is not None:  # TCP settings in place of the scenario's (`--transport`)
            topo = replace(topo, transport=transport)
        self.topo = topo
        if protocol not in PROTOCOLS:
            raise SimError(f"--protocol: unknown {protocol!r} (known: {', '.join(PROTOCOLS)})")
        self.links = Links.from_topology(topo, protocol, nic)
        self.protocol, self.nic = protocol, nic
        # every device's compute: given (sim compare of a compute-model run), else the scenario's with overrides
        self.profiles = list(profiles) if profiles is not None else device_profiles(topo, profile_overrides)
        self.d_pp, self.d_dp = d_pp, topo.n // d_pp
        self.scheduler, self.schedule_seed, self.budget = scheduler, schedule_seed, budget
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.ps_mode, self.placements, self.micro_batch = ps_mode, placements, micro_batch
        from ..scheduler import SCHEDULERS, SchedulerError, default_allocator

        if scheduler not in SCHEDULERS:
            raise SchedulerError(f"--scheduler: unknown scheduler {scheduler!r} (known: {', '.join(SCHEDULERS)})")
        self.allocator = default_allocator(scheduler, allocator)
        self._assignments: dict[tuple, np.ndarray] = {}
        self._layers: dict[tuple, list | None] = {}
        links = [topo.region_delay_ms, topo.region_bandwidth_gbps, np.asarray(topo.device_region)]
        if topo.region_links is None:  # links that differ inside a region
            links += [topo.delay_ms, topo.bandwidth_gbps]
        self._fingerprint = hashlib.sha1(
            b"".join(np.ascontiguousarray(m).tobytes() for m in links) + _scheduler_source_digest()
        ).hexdigest()[:12]

    def options_of(self, entry) -> dict:
        """The options of system `entry` (registry): those given that it takes, over its defaults."""
        mine = {o.name for o in entry.options}
        return entry.resolve_options({k: v for k, v in self.options.items() if k in mine})

    def on_links_of(self, topo: Topology) -> "Simulator":
        """This simulator, every option the same, on `topo`'s links (the same devices: a timeline's links as
        they are now); its schedules are searched anew (no cache: a re-plan's cost is its search)."""
        return Simulator(topo, **{**self._options, "cache_dir": None})

    # ---------------------------------------------------------------- assignments
    def _job(self, cfg: GPTConfig, batch: int, codec: Compression = NONE) -> tuple[tuple, Path | None, tuple]:
        from ..scheduler.iteration_cost import ComputeSetting
        from ..scheduler import COMPUTE_AWARE

        cpp = c_pp_bytes(cfg, batch, self.d_dp)
        cdp = codec.c_dp(c_dp_bytes(cfg, self.d_pp), work.PAPER_BYTES, self.d_dp)
        key = (self._fingerprint, self.d_pp, self.d_dp, round(cpp), round(cdp), self.scheduler, self.schedule_seed, self.budget)
        args = (self.topo, self.d_pp, self.d_dp, cpp, cdp, self.scheduler, self.schedule_seed, self.budget)
        if self.scheduler in COMPUTE_AWARE:  # its objective reads the model, batch and every device's profile
            setting = ComputeSetting(cfg, batch, self.micro_batch, PAPER_DTYPE, PAPER_RUNTIME["recompute"],
                                     tuple(self.profiles))
            key, args = key + (setting.digest(),), args + (setting,)
        path = self.cache_dir / ("-".join(map(str, key)) + ".json") if self.cache_dir else None
        return key, path, args

    def _store(self, key, path, doc: dict) -> np.ndarray:
        pipelines = np.asarray(doc["pipelines"], dtype=int)
        if path is not None and not path.exists():
            atomic_write_json(path, doc)
        self._assignments[key] = pipelines
        self._layers[key] = doc.get("layers")
        return pipelines

    def assigned_stages(self, cfg: GPTConfig, batch: int, codec: Compression = NONE
                        ) -> tuple[tuple[int, int], ...] | None:
        """The blocks of every stage a compute-aware scheduler chose with its assignment, else None."""
        from ..scheduler import COMPUTE_AWARE

        if self.scheduler not in COMPUTE_AWARE:
            return None
        self.assignment(cfg, batch, codec=codec)
        layers = self._layers.get(self._job(cfg, batch, codec)[0])
        return tuple(tuple(r) for r in layers[0]) if layers else None

    def prime(self, cfg: GPTConfig, batch: int, doc: dict) -> None:
        """Keep an assignment found elsewhere (the degrees planner's) as this job's when it is the same
        search: same degrees, messages, scheduler, seed and budget; a compute-aware search reads the
        simulator's profiles and runtime too, so it is searched again."""
        from ..scheduler import COMPUTE_AWARE

        key, path, _ = self._job(cfg, batch)
        if self.scheduler in COMPUTE_AWARE or key in self._assignments:
            return
        found = (self._fingerprint, doc["d_pp"], doc["d_dp"], round(doc["c_pp_gb"] * 1e9), round(doc["c_dp_gb"] * 1e9),
                 doc["scheduler"], doc["seed"], doc["trace"][-1][0] if doc["trace"] else 0)
        if found == key:
            self._store(key, path, doc)

    def missing(self, cfg: GPTConfig, batch: int) -> tuple | None:
        """The scheduling job for (cfg, batch) when neither memory nor disk has it, else None."""
        key, path, args = self._job(cfg, batch)
        if key in self._assignments or (path is not None and path.exists()):
            return None
        return key, path, args

    def assignment(self, cfg: GPTConfig, batch: int, progress=None, codec: Compression = NONE) -> np.ndarray:
        """The scheduler's pipelines (D_DP, D_PP) for this model and batch (cached); `codec`: of the data-parallel
        exchange, whose bytes the scheduler weighs."""
        key, path, args = self._job(cfg, batch, codec)
        if key in self._assignments:
            return self._assignments[key]
        if path is not None and path.exists():
            return self._store(key, path, json.loads(path.read_text()))
        return self._store(key, path, schedule_job(args, progress))

    def _placements(self, build) -> list[tuple[str, list[Layout], tuple[int, ...]]]:
        """`build(seed)` -> Layout (seed None: rank order), for every placement asked for."""
        out = []
        if "default" in self.placements:
            out.append(("default", [build(None)], ()))
        if "random" in self.placements:
            out.append(("random", [build(s) for s in RANDOM_SEEDS], RANDOM_SEEDS))
        return out

    def random_layouts(self, cfg: GPTConfig) -> list[Layout]:
        """ours-random's layouts: the seeded placement rule for each of RANDOM_SEEDS (harness/layout/)."""
        return [layouts.seeded(1, self.d_pp, self.d_dp, cfg.layers, s, **PAPER_RUNTIME) for s in RANDOM_SEEDS]

    # ---------------------------------------------------------------- systems
    def run(self, system: str, cfg: GPTConfig, batch: int) -> list[Candidate]:
        """The candidates of `system` (its registry entry's simulator model)."""
        entry = registry.get(system)
        simulate = entry.simulate_fn(registry.LAYOUT_WORKLOAD)
        if simulate is None:
            if entry.layout_rule is None:
                raise SimError(f"--system: {system} has neither a simulator model nor a layout rule")
            return candidates_of_rule(self, entry, cfg, batch)
        return simulate(self, cfg, batch)

    def sweep(self, cfg: GPTConfig, batch: int, which=None) -> list[Candidate]:
        """All candidates of the systems in `which` (default: every system `harness sim` can place),
        with `best` set on each system's fastest."""
        out = []
        which = registry.names(simulated=True) if which is None else which
        for system in which:
            cands = self.run(system, cfg, batch)
            if cands:
                min(cands, key=lambda c: c.seconds).best = True
            out += cands
        return out


# -------------------------------------------------------------------- what the systems' models share
def grid_candidates(sim: Simulator, system: str, grid, cfg: GPTConfig, batch: int,
                    stages_of: Callable[[int], tuple] | None = None) -> list[Candidate]:
    """grid: (config, zero, tp, pp, dp, simulate) per degrees; placements from sim.placements. stages_of(pp): the
    blocks of each stage where the system does not split them evenly (None: evenly)."""
    out = []
    for config, zero, t, p, d, simulate in grid:
        def build(seed, t=t, p=p, d=d, zero=zero):
            opts = {"zero": zero, "stages": stages_of(p) if stages_of and p > 1 else None}
            if seed is None:
                return layouts.in_rank_order(t, p, d, cfg.layers, **opts)
            return layouts.seeded(t, p, d, cfg.layers, seed, **opts)

        try:
            placed = sim._placements(build)
        except LayoutError:
            continue  # more stages than layers
        for name, lays, seeds in placed:
            try:
                runs = [simulate(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch) for lay in lays]
            except (SimError, LayoutError, BatchError):
                break  # this layout does not fit the model/batch (e.g. batch not divisible)
            out.append(mean_candidate(system, {**config, "placement": name}, runs, seeds, lays[0],
                                      on_links(simulate, sim, cfg, batch, lays)))
    return out


def candidates_of_rule(sim: Simulator, entry, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """A system without its own simulator model: the layout its rule picks for this scenario, model and
    batch (as `harness run` would plan it), simulated by the runtime the layout names
    (entry.simulate_layout, at the simulator's protocol and fp16 on the wire)."""
    from ..plan.request import ModelSection, NetworkSection, RunRequest, RunSection
    from ..plan.layouts import resolve_layout

    options = sim.options_of(entry)
    req = RunRequest(network=NetworkSection(scenario=sim.topo.name, mode="none"),
                     model=ModelSection(name=cfg.name, layers=cfg.layers, batch=batch, micro_batch=sim.micro_batch),
                     run=RunSection(system=entry.name, options=options,
                                    device_type="cpu" if sim.protocol == "gloo" else "cuda"))  # as modelled
    lay, _ = resolve_layout(req, sim.topo)
    model = entry.simulate_layout_fn(options)
    seconds, compute = model(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch, work.PAPER_BYTES)
    return [Candidate(entry.name, lay.to_json(), seconds, compute, (), layout=lay,
                      resimulate=lambda links: model(links, sim.profiles, cfg, batch, lay, sim.micro_batch,
                                                     work.PAPER_BYTES)[0])]


def schedule_job(args: tuple, progress=None) -> dict:
    """One scheduler run (top level so worker processes can run it): the assignment JSON.
    progress(candidates evaluated, best cost) as the scheduler's own callback."""
    from ..scheduler import schedule  # imported late: only needed when a schedule is not cached

    topo, d_pp, d_dp, cpp, cdp, scheduler, seed, budget, *setting = args
    return schedule(topo, d_pp, d_dp, cpp, cdp, scheduler=scheduler, seed=seed, budget=budget,
                    progress=progress, setting=setting[0] if setting else None).to_json()


def prefetch_assignments(jobs: list[tuple["Simulator", GPTConfig, int]], workers: int = 1, progress=None) -> int:
    """Run the missing schedules of (simulator, model, batch) jobs, in `workers` processes; returns how many ran."""
    todo, seen = [], set()
    for sim, cfg, batch in jobs:
        m = sim.missing(cfg, batch)
        if m is not None and m[0] not in seen:
            seen.add(m[0])
            todo.append((sim, *m))
    if not todo:
        return 0
    if workers <= 1 or len(todo) == 1:
        for k, (sim, key, path, args) in enumerate(todo):
            sim._store(key, path, schedule_job(args))
            if progress:
                progress(k + 1, len(todo))
        return len(todo)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
        futures = {pool.submit(schedule_job, args): (sim, key, path) for sim, key, path, args in todo}
        for k, fut in enumerate(as_completed(futures)):
            sim, key, path = futures[fut]
            sim._store(key, path, fut.result())
            if progress:
                progress(k + 1, len(todo))
    return len(todo)


def mean_candidate(system: str, config: dict, runs: list[SimResult], seeds, layout: Layout | None = None,
                   resimulate: Callable[[Links], float] | None = None) -> Candidate:
    return Candidate(system, config, float(np.mean([r.seconds for r in runs])),
                     float(np.mean([r.compute_seconds for r in runs])), tuple(seeds), layout=layout,
                     resimulate=resimulate)


def on_links(simulate, sim: "Simulator", cfg: GPTConfig, batch: int, lays: list[Layout], **kw) -> Callable[[Links], float]:
    """A candidate's `resimulate`: `simulate` (a system's model: (links, profiles, cfg, batch, layout, micro_batch,
    **kw) -> SimResult) on the same layouts, profiles and batch, on other links; the mean over the layouts."""
    def seconds(links: Links) -> float:
        return float(np.mean([simulate(links, sim.profiles, cfg, batch, lay, sim.micro_batch, **kw).seconds
                              for lay in lays]))
    return seconds


def to_record(c: Candidate, *, run_id: str, topo: Topology, cfg: GPTConfig, batch: int, micro_batch: int = 1) -> IterationRecord:
    pflop = pflop_per_iteration(cfg, batch)
    cfgd = c.config
    return IterationRecord(
        run_id=run_id, scenario=topo.name, system=c.system, backend="sim", kernel="none", devices=topo.n,
        d_pp=int(cfgd.get("pp", 1)), d_dp=int(cfgd.get("dp", topo.n)), model=cfg.name, layers=cfg.layers,
        hidden=cfg.hidden, seq=cfg.seq, batch=batch, micro_batch=micro_batch,
        seed=int(c.seeds[0]) if c.seeds else 0, bandwidth_scale=topo.bandwidth_scale, iteration=0, seconds=c.seconds,
        pflop=pflop, pflops=pflop / c.seconds, tokens_per_s=batch * cfg.seq / c.seconds,
        compute_seconds=c.compute_seconds, exposed_comm_seconds=max(c.seconds - c.compute_seconds, 0.0),
        loss=float("nan"), d_tp=int(cfgd.get("tp", 1)),
        config=json.dumps({**cfgd, **({"seeds": list(c.seeds)} if len(c.seeds) > 1 else {})}, sort_keys=True),
    )


def record_json(rec: IterationRecord, best: bool) -> dict:
    """The --json entry: the record, `config` as an object, and `best`."""
    d = asdict(rec)
    d["config"] = json.loads(rec.config)
    d["best"] = best
    for k, v in d.items():  # JSON has no NaN: a figure not taken (loss, the emulated CPU's busy share) is null
        if isinstance(v, float) and v != v:
            d[k] = None
    return d
