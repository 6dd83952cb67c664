"""Tune a baseline as the paper did (appendix D.2): run every layout of its grid, keep the best.

megatron: every (D_TP, D_PP, D_DP) in {1,2,4,8}^3 whose product is the device count and that
the model allows. deepspeed: ZeRO-3 over all devices and ZeRO-1 + pipeline for every D_PP.
Each point is one ordinary run (`experiment.execute_many`, the function behind `harness run --each`: emulated,
every point in one boot of the cluster and at one time dilation), so its records and manifest land in
results/<scenario>/<run-id>/ like any run; the tuning summary (every point, the simulator's prediction of it, its
run directory, mean iteration seconds and PFLOPS, the best) is written next to them as
tune-<system>-<stamp>/tune.json and tune.csv.

A budget of K runs the K points the simulator predicts fastest (the paper ran its whole grid on the real cluster;
an emulated grid of a dozen points is most of an hour): the prediction is the one the time-dilation chooser uses
(plan/dilation.py: the system's simulator model on the run's scaled links and its devices' compute profiles),
taken undilated, so its ranking is the scenario's as given.
"""
from __future__ import annotations

import csv
import io
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ... import layout as layouts
from ...plan import systems as registry
from ...errors import HarnessError
from ...layout import Layout
from ...files import atomic_write_json, atomic_write_text
from ...results import read_records, results_root, run_dir
from ...scenario import load_scenario



@dataclass
class TunePoint:
    """One grid point: its layout, where its records are, and what it measured."""

    label: str
    layout: dict
    d_tp: int
    d_pp: int
    d_dp: int
    status: str  # ok | failed | skipped (outside the budget: not run)
    run_dir: str
    seconds: float  # mean iteration seconds over the timed iterations (nan when not measured)
    pflops: float
    reason: str = ""
    predicted: float = math.nan  # the simulator's iteration seconds for this point (nan: not predicted)


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
        lines = [f"{'layout':<34} {'status':<7} {'predicted s':>11} {'iter s':>9} {'PFLOPS':>10}  run"]
        best = self.best
        for p in self.points:
            mark = " *" if p is best else ""
            lines.append(f"{p.label:<34} {p.status:<7} {p.predicted:>11.3f} {p.seconds:>9.3f} {p.pflops:>10.3g}  "
                         f"{p.run_dir if p.status != 'skipped' else p.reason}{mark}")
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


def tune(request, system: str, rank_order: int | None = None, budget: int | None = None, progress: bool = True,
         execute_many=None, within: float | None = None) -> TuneResult:
    """Run the grid points of `system` with `request`'s scenario/model/batch (every one, or the `budget` the
    simulator predicts fastest); returns all points.

    `within`: run no point predicted more than that many times the fastest prediction (`fastest`).
    `request` is a `config.RunRequest`; rank_order is None (rank order) or a seed of the seeded placement
    (harness/layout/). A point that cannot be planned or fails is recorded as failed and the search goes on;
    every run directory is kept. `execute_many(requests)`: each request's run directory or the error that failed
    it (default: experiment.execute_many).
    """
    if execute_many is None:
        from ...train.experiment import execute_many
    stamp = time.strftime("%Y%m%d-%H%M%S")
    grid_layouts, reqs = grid_requests(request, system, rank_order, stamp)
    devices = grid_layouts[0].devices
    predicted, unplanned = predict(reqs)
    chosen = fastest(predicted, unplanned, budget, within)
    if progress:
        print(f"tune {system}: {len(chosen)} of {len(reqs)} layouts"
              + (f" (the {budget} the simulator predicts fastest)" if budget is not None else "")
              + (f" (predicted within {within:g}x of the fastest)" if within is not None else "")
              + (", in one boot of the cluster" if request.network.mode == "emulated" else ""),
              file=sys.stderr, flush=True)
    ran = dict(zip(chosen, execute_many([reqs[k] for k in chosen]))) if chosen else {}
    scenario = load_scenario(request.network.scenario, devices=request.network.devices).name
    points = []
    for k, (lay, req) in enumerate(zip(grid_layouts, reqs)):
        head = (lay.label(), lay.to_json(), lay.tp, lay.pp, lay.dp)
        where = str(run_dir(scenario, req.run.run_id, request.run.results_root))
        out = ran.get(k)
        if k in unplanned:
            points.append(TunePoint(*head, "failed", where, math.nan, math.nan, reason=unplanned[k]))
        elif k not in ran:
            points.append(TunePoint(*head, "skipped", where, math.nan, math.nan, predicted=predicted[k],
                                    reason=f"not among the fastest predicted (predicted {predicted[k]:.3g} s)"))
        elif isinstance(out, Path):
            recs = read_records(out / "records.csv")
            points.append(TunePoint(*head, "ok", str(out), sum(r["seconds"] for r in recs) / len(recs),
                                    sum(r["pflops"] for r in recs) / len(recs), predicted=predicted[k]))
        else:
            points.append(TunePoint(*head, "failed", where, math.nan, math.nan, predicted=predicted[k],
                                    reason=str(out) if out else "not run: the search was stopped"))
    summary = results_root(request.run.results_root) / scenario / f"tune-{system}-{stamp}"
    result = TuneResult(system, scenario, devices, points, summary)
    atomic_write_json(summary / "tune.json", result.to_json())
    atomic_write_text(summary / "tune.csv", _csv(points))
    return result


def grid_requests(request, system: str, rank_order: int | None = None, stamp: str | None = None):
    """The grid's layouts and, for each, `request` as that point's run of `system` (run id <stamp>-<system>-<slug>)."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    lays = grid(system, request, rank_order)
    return lays, [replace(request, run=replace(request.run, system=system, run_id=f"{stamp}-{system}-{_slug(lay)}"),
                          layout=replace(request.layout, explicit=lay)) for lay in lays]


def fastest(predicted: list[float], unplanned: dict[int, str], budget: int | None,
            within: float | None = None) -> list[int]:
    """The points to run: every plannable one, or the `budget` of least predicted seconds (fastest first); with
    `within`, none predicted more than `within` times the fastest prediction (it would have to beat the model by
    that factor to be the best, and an emulated run lasts its predicted time times the dilation)."""
    runnable = [k for k in range(len(predicted)) if k not in unplanned]
    if within is not None and runnable:
        best = min(predicted[k] for k in runnable)
        runnable = [k for k in runnable if predicted[k] <= within * best]
    return sorted(runnable, key=lambda k: predicted[k])[:budget] if budget is not None else runnable


def predict(reqs) -> tuple[list[float], dict[int, str]]:
    """Each request's predicted iteration seconds (plan/dilation.py's model, undilated; on the scenario's devices'
    profiles when the run has no compute model), and the reason of each that cannot be planned."""
    from ...compute.profiles import device_profiles
    from ...plan.dilation import modelled_seconds
    from ...plan.layouts import plan_run

    predicted, unplanned = [], {}
    for k, req in enumerate(reqs):
        try:
            plan = plan_run(req)
        except HarnessError as e:
            predicted.append(math.nan)
            unplanned[k] = str(e)
            continue
        spec = plan.spec
        if not spec.compute.devices:
            spec = replace(spec, compute=replace(spec.compute, devices=tuple(
                device_profiles(plan.topo, dtype=spec.model.dtype))))
        kernel = "uml" if req.network.mode == "emulated" and req.network.kernel != "host" else "host"
        predicted.append(modelled_seconds(spec, plan.topo, 1.0, kernel))
    return predicted, unplanned


def _slug(lay: Layout) -> str:
    if lay.zero == 3:
        return f"zero3-dp{lay.dp}"
    head = f"zero1-pp{lay.pp}-dp{lay.dp}" if lay.zero == 1 else f"tp{lay.tp}-pp{lay.pp}-dp{lay.dp}"
    return f"{head}-{lay.schedule}"


def _csv(points: list[TunePoint]) -> str:
    buf = io.StringIO()
    cols = ["label", "d_tp", "d_pp", "d_dp", "status", "predicted", "seconds", "pflops", "run_dir", "reason"]
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for p in points:
        w.writerow(asdict(p))
    return buf.getvalue()
