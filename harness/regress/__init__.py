"""The throughput regression gate: a fixed suite of figures a regression would move, compared with a
committed baseline.

Exact figures are deterministic (the scheduler's COMM-COST of each paper case at a fixed seed and
budget, the simulator's iteration seconds of every system on each case, the bytes on the wire per
rank per iteration that the runtimes count in a short run): any change beyond float
rounding fails until the baseline is renewed on purpose (`harness regress --update-baseline`),
because a figure that should not move and did is either a bug or a change someone must own.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import HarnessError
from ..plan import systems as registry
from ..plan.asked import describe, merged

BASELINE = Path(__file__).resolve().parents[2] / "tests" / "regress" / "baseline.json"
EXACT_RTOL = 1e-9  # float rounding across BLAS builds; anything larger is a changed figure
ALPHA = 0.01  # measured figures: one-sided false-alarm rate per figure and gate run under normal run-to-run noise
SCHEMA = 1


class RegressError(HarnessError):
    pass


@dataclass(frozen=True)
class Figure:
    """One figure of the suite; `higher_is_worse` says which way a regression moves it."""

    name: str
    value: float
    unit: str
    kind: str = "exact"  # exact | measured | absolute (a measured time: compared on the same machine only)
    higher_is_worse: bool = True
    samples: tuple[float, ...] = ()  # measured: one value per repeated run
    host_bound: int = 0  # emulated: runs behind the samples with host-bound iterations (they measured the host)


# ----------------------------------------------------------------------------- bytes on the wire
# Counted by the runtimes (harness/train/wire.py) in a short run of make scenario-5's setting on loopback:
# the count depends on the layout and the model, not on the links, so CI needs no emulated cluster.
# Each system's run is its registry entry's (gate_runs["wire"]).
WIRE_SYSTEMS = registry.gate_runs("wire")
WIRE_RUN = {"network": {"mode": "none"}, "run": {"iters": 2, "warmup": 1}}  # the warm-up takes the set-up's bytes


@dataclass(frozen=True)
class Suite:
    """What the exact figures are computed on; the baseline records it, and a different suite is no baseline."""

    cases: tuple[int, ...] = (1, 2, 3, 4, 5)
    devices: int = 64  # the paper's scale: about 8 s here
    model: str = "gpt3-xl"
    batch: int = 1024
    budget: int = 1000
    seed: int = 0
    wire: tuple[str, ...] = tuple(WIRE_SYSTEMS)  # the systems whose bytes on the wire count

    def to_json(self) -> dict:
        return {**asdict(self), "cases": list(self.cases), "wire": list(self.wire)}


SUITE = Suite()


def exact_figures(suite: Suite | None = None, progress=None) -> list[Figure]:
    """Scheduler COMM-COST (eqs. 1-4 of Yuan et al. 2022) and simulated iteration seconds of each system's
    best layout, per paper case, at the suite's fixed seed and budget. `progress(label)` before each case."""
    import numpy as np

    from ..plan import systems
    from ..compute import c_dp_bytes, c_pp_bytes
    from ..scheduler.cost import CostModel
    from ..layout import default_pipeline_degrees
    from ..compute.model import get_model
    from ..scenario import load_scenario
    from ..sim.sweep import Simulator

    suite = suite or SUITE
    cfg = get_model(suite.model)
    out = []
    for case in suite.cases:
        if progress:
            progress(f"case {case}")
        topo = load_scenario(str(case), devices=suite.devices)
        d_pp, d_dp = default_pipeline_degrees(topo.n, cfg.layers)
        sim = Simulator(topo, d_pp=d_pp, budget=suite.budget, schedule_seed=suite.seed)
        pipes = np.asarray(sim.assignment(cfg, suite.batch))
        comm = CostModel(topo, d_pp, d_dp, c_pp_bytes(cfg, suite.batch, d_dp), c_dp_bytes(cfg, d_pp))
        out.append(Figure(f"case-{case}/schedule/comm-cost", float(comm.pipeline_cost(pipes)), "s"))
        cands = sim.sweep(cfg, suite.batch, systems.names(simulated=True))
        for system in dict.fromkeys(c.system for c in cands):
            best = min(c.seconds for c in cands if c.system == system)
            out.append(Figure(f"case-{case}/sim/{system}", float(best), "s/iter"))
    return out


# make scenario-5's runs: tiny GPT over case 5 at 1/100 of the paper's bandwidth (communication dominates as in
# the paper); ours against the paper's ablation (its seeded placement)
# (runs as asked, section by section: plan/asked.py)
_CASE_5 = {"network": {"scenario": "5", "devices": 8}, "model": {"name": "tiny", "layers": 4, "batch": 8, "micro_batch": 1}}
EMULATED = merged(_CASE_5, {"network": {"bandwidth_scale": 0.01}})  # the wire runs' (WIRE_RUN: on loopback, iterations)
#: The measured runs' time dilation (plan/dilation.py), fixed: a probe's choice differs between hosts and runs,
#: and a baseline compares only with runs at its scales (make scenario-5's probe chose 4.2 here: 14-18 % busy).
DILATION = 4
MEASURED = merged(_CASE_5, {"network": {"bandwidth_scale": 0.01 / DILATION},
                            "compute": {"model": True, "time_scale": float(DILATION)}, "run": {"iters": 2, "warmup": 1}})


def wire_bytes(run: Path) -> list[int]:
    """Each rank's bytes on the wire per iteration in a counted run; the same in every timed iteration,
    or the count is no exact figure."""
    per_rank = json.loads((Path(run) / "manifest.json").read_text()).get("wire_bytes_per_rank")
    if not per_rank or any(not r or None in r for r in per_rank):
        raise RegressError(f"regress: {run}: no bytes on the wire counted (debug.count_wire)")
    for rank, its in enumerate(per_rank):
        if len(set(its)) != 1:
            raise RegressError(f"regress: {run}: rank {rank} put {its} bytes on the wire in its iterations; "
                               "a runtime whose traffic changes between iterations gives no exact figure")
    return [its[0] for its in per_rank]


def wire_figures(out_root: Path, debug: tuple[str, ...] = (), suite: Suite | None = None,
                 asked: dict = EMULATED, progress=None) -> list[Figure]:
    """Bytes on the wire per rank per iteration of the suite's systems (ours, one Megatron and one
    DeepSpeed layout): the busiest rank's and the mean over ranks (exact: a runtime that sends more
    moved them)."""
    out = []
    for name in (suite or SUITE).wire:
        if progress:
            progress(f"bytes on the wire: {name}")
        run = emulated_run(_of(name, asked, WIRE_SYSTEMS[name], WIRE_RUN), out_root, (*debug, "count_wire=1"))
        per_rank = wire_bytes(run)
        out.append(Figure(f"wire/{name}/busiest-rank", float(max(per_rank)), "B/iter"))
        out.append(Figure(f"wire/{name}/mean-rank", sum(per_rank) / len(per_rank), "B/iter"))
    return out


# ----------------------------------------------------------------------------- measured figures
# Each system's emulated runs are its registry entry's (gate_runs["measured"])
MEASURED_SYSTEMS = registry.gate_runs("measured")
# (numerator, denominator) as the paper's roles: the machine's speed cancels out of their ratio
MEASURED_RATIOS = tuple((registry.paper_systems()[a], registry.paper_systems()[b])
                        for a, b in (("ours", "ours-random"), ("ours", "megatron")))
REPEATS = 3  # runs of each system in a gate run
BASELINE_REPEATS = 5  # and in a baseline: its spread is the noise, and more runs narrow Student's t


def _of(system: str, *asked: dict) -> dict:
    """`system`'s run: the descriptions merged (plan/asked.merged), then its name."""
    return merged(*asked, {"run": {"system": system}})


def emulated_run(asked: dict, out_root: Path, debug: tuple[str, ...] = ()) -> Path:
    """One `harness run` of the run `asked` (plan/asked.py; and debug options KEY=VALUE) under `out_root`; its
    run directory."""
    from ..train.experiment import execute

    return execute(_request(asked, out_root, debug))


def emulated_runs(runs: list[dict], out_root: Path, debug: tuple[str, ...] = ()) -> list[Path]:
    """`harness run` of each run asked in turn (one network: emulated, one boot of the cluster, as
    `harness run --each`); their run directories. A failed run fails the gate, in one line."""
    from ..train.experiment import execute_many

    results = execute_many([_request(asked, out_root, debug) for asked in runs])
    bad = [(asked, r) for asked, r in zip(runs, results) if not isinstance(r, Path)]
    if bad:
        asked, why = bad[0]
        raise RegressError(f"regress: {len(bad)} of {len(runs)} emulated runs did not finish; "
                           f"first: {describe(asked)}: {why or 'not started'}")
    return results


def _request(asked: dict, out_root: Path, debug: tuple[str, ...]):
    from ..plan.asked import request_of
    from ..plan.request import DebugSection

    return request_of(merged(asked, {"run": {"results_root": str(out_root)}, "debug": asdict(DebugSection.parse(list(debug)))}))


def run_figures(run: Path) -> dict[str, float]:
    """Per-run values: mean iteration seconds, measured / simulated (sim compare of the run as it ran)
    and, where the run has a placement, measured / its communication lower bound."""
    import numpy as np

    from ..sim.compare import compare, load_measured

    records = load_measured(run)
    if not records:
        raise RegressError(f"regress: {run}: no records")
    seconds = float(np.mean([float(r["seconds"]) for r in records]))
    out = {"seconds": seconds, "measured-over-sim": seconds / compare(records)[0].simulated_s,
           "host-bound": float(sum(bool(r.get("host_bound")) for r in records))}
    placement = json.loads((Path(run) / "manifest.json").read_text()).get("placement") or {}
    bound = (placement.get("comm_lower_bound_s") or {}).get("total")
    if bound:
        out["measured-over-comm-bound"] = seconds / float(bound)
    return out


def measured_figures(out_root: Path, debug: tuple[str, ...] = (), repeats: int = REPEATS,
                     asked: dict = MEASURED, systems: dict | None = None, progress=None) -> list[Figure]:
    """The noisy figures, one sample per run: each system's absolute seconds (compared on the same kind of
    machine only), measured / simulated and measured / bound, and ours / ours-random, which the machine's
    speed cancels out of. Runs alternate between the systems so that a slow spell hits both."""
    import numpy as np

    systems = systems or MEASURED_SYSTEMS
    order = [name for _ in range(repeats) for name in systems]
    if progress:
        progress(f"emulated: {repeats} x {', '.join(systems)} in one boot of the cluster")
    runs = emulated_runs([_of(name, asked, systems[name]) for name in order], out_root, debug)
    per: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for name, run in zip(order, runs):
        per[name].append(run_figures(run))
    out = []
    for name, runs in per.items():
        for key, unit, kind in (("seconds", "s/iter", "absolute"), ("measured-over-sim", "ratio", "measured"),
                                ("measured-over-comm-bound", "ratio", "measured")):
            if all(key in x for x in runs):
                samples = tuple(x[key] for x in runs)
                out.append(Figure(f"emulated/{name}/{key}", float(np.mean(samples)), unit, kind, True, samples,
                                  sum(x["host-bound"] > 0 for x in runs)))
    for num, den in MEASURED_RATIOS:
        if num in per and den in per:
            samples = tuple(a["seconds"] / b["seconds"] for a, b in zip(per[num], per[den]))
            bound = sum(a["host-bound"] > 0 or b["host-bound"] > 0 for a, b in zip(per[num], per[den]))
            out.append(Figure(f"emulated/{num}-over-{den}", float(np.mean(samples)), "ratio", "measured", True,
                              samples, bound))
    return out


# ----------------------------------------------------------------------------- baseline
def machine() -> dict:
    """How the machine is identified: absolute measured times compare only on the same kind."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"arch": platform.machine(), "cpu": model or platform.processor(), "cpus": os.cpu_count(),
            "system": platform.system()}


def versions() -> dict:
    import numpy
    import scipy

    return {"python": platform.python_version(), "numpy": numpy.__version__, "scipy": scipy.__version__}


def write_baseline(path: Path, figures: list[Figure], suite: Suite | None = None, machine_of: dict | None = None) -> None:
    """Write the baseline (machine_of: the machine its measured figures ran on; default this one). A figure whose
    runs were host-bound is refused (it measured the host, not the links: no reference), in one line, nothing written."""
    bound = [f for f in figures if f.host_bound]
    if bound:
        raise RegressError(f"regress: {bound[0].name}: {bound[0].host_bound} of its runs were host-bound (the "
                           f"emulated CPU busy for most of an iteration); not a baseline: run it on a quieter machine "
                           f"or dilate its time (each run's manifest: headroom.advice)")
    from ..files import atomic_write_json
    from ..results import git_commit

    atomic_write_json(Path(path), {
        "schema": SCHEMA, "commit": git_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_of or machine(), "versions": versions(), "suite": (suite or SUITE).to_json(),
        "figures": {f.name: {k: v for k, v in asdict(f).items() if k not in ("name", "host_bound")} for f in figures},
    })


def baseline_machine(path: Path) -> dict | None:
    """The machine a (readable) baseline was recorded on."""
    try:
        return json.loads(Path(path).read_text()).get("machine")
    except (OSError, ValueError, AttributeError):
        return None


def read_baseline(path: Path, suite: Suite | None = None, same_suite: bool = True) -> dict[str, Figure]:
    """The baseline's figures; a missing, unreadable or (with `same_suite`) foreign-suite file is one
    RegressError line."""
    path, suite = Path(path), suite or SUITE
    renew = "renew it with `harness regress --update-baseline`"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise RegressError(f"regress: baseline {path}: missing; {renew}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RegressError(f"regress: baseline {path}: unreadable ({type(e).__name__}); {renew}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("figures"), dict):
        raise RegressError(f"regress: baseline {path}: schema: expected {SCHEMA} with figures; {renew}")
    if same_suite and doc.get("suite") != suite.to_json():
        raise RegressError(f"regress: baseline {path}: suite: recorded for {doc.get('suite')}, the gate runs "
                           f"{suite.to_json()}; {renew}")
    out = {}
    for name, f in doc["figures"].items():
        try:
            out[name] = Figure(name, float(f["value"]), str(f["unit"]), str(f.get("kind", "exact")),
                               bool(f.get("higher_is_worse", True)), tuple(float(x) for x in f.get("samples", ())))
        except (KeyError, TypeError, ValueError):
            raise RegressError(f"regress: baseline {path}: figures.{name}: expected value and unit; {renew}") from None
    return out


# ----------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class Row:
    figure: str
    unit: str
    baseline: float | None
    now: float | None
    verdict: str  # ok | regressed | changed | improved | new | missing | other machine
    noise: float | None = None  # measured: the relative change that is still noise (the threshold)
    host_bound: int = 0  # now's runs behind it that were host-bound (their samples measured the host)

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.now is None or self.baseline == 0:
            return None
        return self.now / self.baseline - 1

    @property
    def fails(self) -> bool:
        return self.verdict in ("regressed", "changed", "missing")


def noise_threshold(base: Figure, now: Figure) -> float | None:
    """The largest change of a measured figure's mean that is still noise, relative to the baseline:
    the one-sided (1 - ALPHA) prediction bound of the mean of now's runs from the baseline's runs
    (Student's t with n - 1 degrees of freedom on their spread); None with fewer than 2 baseline runs."""
    import numpy as np
    from scipy import stats

    b = np.asarray(base.samples, dtype=float)
    if len(b) < 2 or base.value == 0:
        return None
    m = max(1, len(now.samples))
    return float(stats.t.ppf(1 - ALPHA, len(b) - 1) * b.std(ddof=1) * math.sqrt(1 / len(b) + 1 / m)
                 / abs(base.value))


def compare(baseline: dict[str, Figure], now: list[Figure], same_machine: bool = True) -> list[Row]:
    """One row per figure. An exact figure that moved beyond float rounding is `regressed` when it moved
    the worse way and `changed` otherwise: both fail, the second so that an unexplained change is owned.
    A measured figure fails (`regressed`) only when it moved the worse way by more than its noise
    threshold; an absolute time is compared only on the baseline's kind of machine (`other machine`).
    A figure of the baseline the suite no longer gives is `missing` (fails); one it newly gives is `new`."""
    rows = []
    got = {f.name: f for f in now}
    for f in now:
        b = baseline.get(f.name)
        if b is None:
            rows.append(Row(f.name, f.unit, None, f.value, "new"))
            continue
        worse = (f.value > b.value) == b.higher_is_worse
        if b.kind == "exact":
            close = math.isclose(f.value, b.value, rel_tol=EXACT_RTOL, abs_tol=1e-12)
            rows.append(Row(f.name, f.unit, b.value, f.value, "ok" if close else "regressed" if worse else "changed"))
            continue
        noise = noise_threshold(b, f)
        if b.kind == "absolute" and not same_machine:
            verdict = "other machine"
        elif noise is None:
            verdict = "missing"  # a measured figure without the baseline's spread cannot be judged
        elif abs(f.value / b.value - 1) <= noise:
            verdict = "ok"
        else:
            verdict = "regressed" if worse else "improved"
        rows.append(Row(f.name, f.unit, b.value, f.value, verdict, noise, f.host_bound))
    rows += [Row(n, b.unit, b.value, None, "missing") for n, b in baseline.items() if n not in got]
    return rows


def format_table(rows: list[Row]) -> str:
    width = max([len("figure")] + [len(r.figure) for r in rows])
    num = lambda x: "-" if x is None else f"{x:.0f}" if float(x).is_integer() else f"{x:.6g}"  # noqa: E731
    lines = [f"{'figure':<{width}}  {'unit':<7} {'baseline':>12} {'now':>12} {'change':>9} {'noise':>8}  verdict"]
    for r in rows:
        change = "-" if r.change is None else f"{r.change:+.2%}" if r.change == 0 or abs(r.change) >= 5e-5 \
            else f"{r.change * 100:+.0e}%"  # an exact figure's small move still shows
        noise = "-" if r.noise is None else f"{r.noise:.1%}"
        mark = f" (measured the host: {r.host_bound} host-bound run(s))" if r.host_bound else ""
        lines.append(f"{r.figure:<{width}}  {r.unit:<7} {num(r.baseline):>12} {num(r.now):>12} {change:>9} "
                     f"{noise:>8}  {r.verdict.upper() if r.fails else r.verdict}{mark}")
    return "\n".join(lines)
