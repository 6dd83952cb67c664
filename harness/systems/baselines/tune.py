"""Tune a baseline as the paper did (appendix D.2): run every layout of its grid, keep the best.

megatron: every (D_TP, D_PP, D_DP) in {1,2,4,8}^3 whose product is the device count and that
the model allows. deepspeed: ZeRO-3 over all devices and ZeRO-1 + pipeline for every D_PP.
Each point is one ordinary run (`experiment.execute`, the function behind `harness run`),
so its records and manifest land in results/<scenario>/<run-id>/ like any run; the tuning
summary (every point, its run directory, mean iteration seconds and PFLOPS, the best) is
written next to them as tune-<system>-<stamp>/tune.json and tune.csv.
"""
from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ... import layout as layouts
from ...plan import systems as registry
from ...errors import HarnessError
from ...layout import Layout
from ...files import atomic_write_json, atomic_write_text
from ...results import read_records, results_root
from ...scenario import load_scenario



@dataclass
class TunePoint:
    """One grid point: its layout, where its records are, and what it measured."""

    label: str
    layout: dict
    d_tp: int
    d_pp: int
    d_dp: int
    status: str  # ok | failed
    run_dir: str
    seconds: float  # mean iteration seconds over the timed iterations (nan when failed)
    pflops: float
    reason: str = ""


@dataclass
class TuneResult:
    system: str
    scenario: str
    devices: int
    points: list[TunePoint]
    summary_dir: Path

    @property
    def best(self) -> TunePoint | None:
        ok = [p for p in self.points if p.status == "ok"]
        return min(ok, key=lambda p: p.seconds) if ok else None

    def to_json(self) -> dict:
        best = self.best
        return {
            "system": self.system, "scenario": self.scenario, "devices": self.devices,
            "best": None if best is None else asdict(best),
            "points": [asdict(p) for p in self.points],
        }

    def table(self) -> str:
        """Every point and the best, as aligned text."""
        lines = [f"{'layout':<28} {'status':<7} {'iter s':>9} {'PFLOPS':>10}  run"]
        best = self.best
        for p in self.points:
            mark = " *" if p is best else ""
            lines.append(f"{p.label:<28} {p.status:<7} {p.seconds:>9.3f} {p.pflops:>10.3g}  {p.run_dir}{mark}")
        lines.append("best: " + (f"{best.label} ({best.seconds:.3f} s/iter)" if best else "none (every point failed)"))
        return "\n".join(lines)


def grid(system: str, request, rank_order: int | None = None) -> list[Layout]:
    """The layouts `system` is tuned over for this request (scenario devices, model, batch): its entry's
    tune grid in rank order, or on the seeded placement of `rank_order` (a seed, the permutation ours-random uses)."""
    make = registry.get(system).tune_grid_fn()
    if make is None:
        raise HarnessError(f"--system: tune runs {' or '.join(registry.names(tunable=True))} (got {system!r})")
    devices = load_scenario(request.network.scenario, devices=request.network.devices).n
    m = request.model
    cfg = m.cfg
    grid = make(cfg, devices, m.batch, m.micro_batch, request.layout.schedule or "1f1b")
    if not grid:
        raise HarnessError(
            f"--system {system}: no layout of {devices} devices fits model {cfg.name} "
            f"({cfg.layers} layers, {cfg.heads} heads) with batch {m.batch} / micro-batch {m.micro_batch}"
        )
    if rank_order is None:
        return grid
    return [layouts.seeded(lay.tp, lay.pp, lay.dp, cfg.layers, rank_order, zero=lay.zero, schedule=lay.schedule)
            for lay in grid]


def tune(request, system: str, rank_order: int | None = None, progress: bool = True, execute=None) -> TuneResult:
    """Run every grid point of `system` with `request`'s scenario/model/batch; returns all points.

    `request` is a `config.RunRequest`; rank_order is None (rank order) or a seed of the seeded placement
    (harness/layout/). A failing point is recorded as failed and the search goes on; every
    point's run directory is kept.
    """
    if execute is None:
        from ...train.experiment import execute
    grid_layouts = grid(system, request, rank_order)
    devices = grid_layouts[0].devices
    stamp = time.strftime("%Y%m%d-%H%M%S")
    points = []
    bar = _progress(grid_layouts, system, progress)
    for lay in bar:
        run_id = f"{stamp}-{system}-{_slug(lay)}"
        req = replace(request, run=replace(request.run, system=system, run_id=run_id),
                      layout=replace(request.layout, explicit=lay))
        try:
            out = Path(execute(req))
            recs = read_records(out / "records.csv")
            secs = sum(r["seconds"] for r in recs) / len(recs)
            pflops = sum(r["pflops"] for r in recs) / len(recs)
            points.append(TunePoint(lay.label(), lay.to_json(), lay.tp, lay.pp, lay.dp, "ok", str(out), secs, pflops))
        except HarnessError as e:
            points.append(TunePoint(lay.label(), lay.to_json(), lay.tp, lay.pp, lay.dp, "failed",
                                    str(_run_dir(request, run_id)), math.nan, math.nan, reason=str(e)))
    scenario = load_scenario(request.network.scenario, devices=request.network.devices).name
    summary = results_root(request.run.results_root) / scenario / f"tune-{system}-{stamp}"
    result = TuneResult(system, scenario, devices, points, summary)
    atomic_write_json(summary / "tune.json", result.to_json())
    atomic_write_text(summary / "tune.csv", _csv(points))
    return result


def _run_dir(request, run_id: str) -> Path:
    from ...results import run_dir

    return run_dir(load_scenario(request.network.scenario, devices=request.network.devices).name, run_id,
                   request.run.results_root)


def _slug(lay: Layout) -> str:
    if lay.zero == 3:
        return f"zero3-dp{lay.dp}"
    head = f"zero1-pp{lay.pp}-dp{lay.dp}" if lay.zero == 1 else f"tp{lay.tp}-pp{lay.pp}-dp{lay.dp}"
    return f"{head}-{lay.schedule}"


def _csv(points: list[TunePoint]) -> str:
    buf = io.StringIO()
    cols = ["label", "d_tp", "d_pp", "d_dp", "status", "seconds", "pflops", "run_dir", "reason"]
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for p in points:
        w.writerow(asdict(p))
    return buf.getvalue()


def _progress(items, system: str, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=f"tune {system}", unit="layout")
