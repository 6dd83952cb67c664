"""Simulated vs measured iteration times, per system and scenario, from records of the shared schema.

Measured records (backend emu, local or cluster; from `harness run`) are grouped by
run configuration; the measured time of a group is the mean of its iterations (on one
clock the iterations add up to the run's wall time, so the mean is its throughput;
runner.merge_stats).
The simulator runs the same scenario (scaled to the record's devices), model,
batch, layout, wire precision and library (the run manifest's dtype and device:
CPU runs use gloo, GPU runs NCCL; netmodel.links.PROTOCOLS): ours uses the
pipelines the run recorded in `config`, baselines their grid point and rank
order. Compute speed comes from the device profile: calibrate it from the same
records first (`harness sim calibrate`), since emulated devices are CPU processes.
Error = simulated / measured - 1.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable
from pathlib import Path

import numpy as np

from ..plan import systems as registry
from ..errors import HarnessError
from ..layout import Layout, from_pipelines
from ..compute.model import get_model
from ..workloads.cnn import TRAINABLE_CNNS, get_cnn
from ..compute import BYTES_PER_VALUE
from ..compute.profiles import OP_CLASSES, ComputeProfile, device_profiles
from ..results import read_records
from ..scenario import load_scenario, load_timeline
from ..scenario.transport import KEYS as TRANSPORT_KEYS, Transport
from ..netmodel.links import Links
from ..netmodel.tcp import UML_HZ
from ..netmodel.tcp import tcp_efficiency
from .timeline import PredictedIteration, predict_iterations
from .replan import move_seconds
from .sweep import Simulator

TARGET_ERROR = 0.15
# Backends whose ranks share one host's cores, and the load above which they visibly slow each other.
SHARED_HOST = ("emu", "local")
BUSY_HOST = 0.5
# What a run trained in when its manifest does not say: the trainer's defaults (CPU fp32 over gloo,
# GPU bf16 over NCCL).
DEFAULT_DTYPE = {"emu": "fp32", "local": "fp32", "cluster": "bf16"}
DEFAULT_DEVICE = {"emu": "cpu", "local": "cpu", "cluster": "cuda"}
GROUP_KEYS = ("scenario", "system", "backend", "devices", "model", "layers", "batch", "micro_batch",
              "bandwidth_scale", "seed", "config", "dtype", "device_type", "compute_time_scale", "transport",
              "timeline", "replans", "options")


@dataclass
class Comparison:
    scenario: str
    system: str
    backend: str
    devices: int
    model: str
    layers: int
    batch: int
    config: str
    iterations: int
    measured_s: float
    simulated_s: float
    # busiest rank's compute x ranks / (seconds x host cores), for runs that time compute in the
    # iteration (their entry's compute_observed) on a shared host; nan: unknown
    host_load: float = float("nan")
    # emulated runs: the emulated CPU's busy share over the iterations (network/headroom.py; nan: not measured),
    # and how many of them were host-bound (their time measured the host, not the links)
    cpu_busy: float = float("nan")
    host_bound: int = 0
    named: str = ""  # the system with the options the runs set away from their defaults (System.named)

    @property
    def measured_what(self) -> str:
        """What the measured figure measured: the network, the host (host-bound iterations), or not known."""
        if self.host_bound:
            return "host"
        return "network" if self.cpu_busy == self.cpu_busy else "unknown"

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1

    @property
    def within_target(self) -> bool:
        return abs(self.error) <= TARGET_ERROR


def _config(rec: dict) -> dict:
    c = rec.get("config") or "{}"
    if isinstance(c, dict):
        return c
    try:
        return json.loads(c)
    except json.JSONDecodeError:
        raise HarnessError(f"records: config: not JSON ({c!r})") from None


def load_measured(path: Path, notes: list[str] | None = None) -> list[dict]:
    """Records under `path` (a records.csv or a directory), each with `dtype`, `device_type`,
    `host_cpus` and `scenario_source` (how to load its scenario again) from its run's manifest.json. An
    elastic run's iterations on fewer devices than the run's (after a preemption: a layout on the survivors,
    numbered as they are) are left out, and said in `notes`."""
    path = Path(path)
    files = sorted(path.rglob("records.csv")) if path.is_dir() else [path]
    out = []
    for f in files:
        doc, man = {}, f.parent / "manifest.json"
        if man.exists():
            try:
                doc = json.loads(man.read_text())
            except json.JSONDecodeError:
                doc = {}
        doc = doc if isinstance(doc, dict) else {}
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        section = lambda name: spec.get(name) if isinstance(spec.get(name), dict) else {}  # noqa: E731
        rows = read_records(f)
        gens = doc["elastic"].get("generations") if isinstance(doc.get("elastic"), dict) else None
        if gens:
            whole = len(gens[0]["devices"])
            on_all = [r for r in rows if int(r["devices"]) >= whole]
            if len(on_all) < len(rows) and notes is not None:
                notes.append(f"{f}: {len(rows) - len(on_all)} iterations ran on fewer devices than the run's "
                             f"{whole} (after a preemption): not compared")
            rows = on_all
        for r in rows:
            r.setdefault("host_cpus", doc.get("host_cpus"))
            r.setdefault("dtype", section("model").get("dtype"))
            r.setdefault("device_type", section("run").get("device_type"))
            r.setdefault("scenario_source", section("resolved").get("scenario_source"))
            r.setdefault("kernel", section("resolved").get("kernel"))
            r.setdefault("timeline", section("network").get("timeline"))  # a run's --timeline (a file's path)
            if isinstance(doc.get("replans"), list):  # --replan: the plans it changed to, when, at what cost
                r.setdefault("replans", json.dumps(doc["replans"], sort_keys=True))
            if isinstance(doc.get("transport"), dict):  # the TCP settings the run had (--transport or the scenario's)
                r.setdefault("transport", json.dumps(doc["transport"], sort_keys=True))
            r.setdefault("warmup", section("run").get("warmup"))  # the run's length (a model may depend on it)
            r.setdefault("iters", section("run").get("iters"))
            if section("run").get("options"):  # the system's own options, as the run had them
                r.setdefault("options", json.dumps(section("run")["options"], sort_keys=True))
            if section("compute").get("model"):  # a compute-model run: its devices' times are the table's
                r.setdefault("compute_time_scale", float(section("compute").get("time_scale", 1.0)))
            out.append(r)
    return out


def _topology(rec: dict):
    """The record's scenario at its devices: from the run's scenario_source (a file given by path reloads
    from it), else by the record's scenario name; with the run's --timeline in place of the scenario's."""
    topo = load_scenario(rec.get("scenario_source") or rec["scenario"], devices=int(rec["devices"]))
    if rec.get("backend") != "emu":  # only the emulated cluster applies a timeline (real nodes: not yet)
        return replace(topo, timeline=None)
    return replace(topo, timeline=load_timeline(rec["timeline"], topo)) if rec.get("timeline") else topo


def simulate_record(rec: dict, overrides: dict[str, ComputeProfile] | None = None) -> float:
    """Simulated seconds of one iteration of the run a record describes."""
    return simulate_run(rec, overrides)[0]


def simulate_run(rec: dict, overrides: dict[str, ComputeProfile] | None = None) -> tuple[float, float]:
    """(iteration seconds, busiest device's compute seconds) of the run a record describes."""
    return run_model(rec, overrides).simulate(None)


def predict_run(rec: dict, overrides: dict[str, ComputeProfile] | None = None,
                iterations: int | None = None) -> list[PredictedIteration] | None:
    """Each iteration of the run a record describes (warm-up included, from its start) under the run's
    timeline (scenario/timeline.py); None when it had none. `iterations`: default up to the record's own.
    A run that re-planned (--replan) runs each iteration on the plan it had then; the iteration after each
    decision pays rank 0's search (as measured), a new plan's first iteration its moves (sim/replan.py)."""
    model = run_model(rec, overrides)
    topo = model.topo
    if topo.timeline is None:
        return None
    n = int(rec["iteration"]) + 1 if iterations is None else iterations
    decisions = json.loads(rec.get("replans") or "[]")
    if not decisions:
        return predict_iterations(topo.timeline, topo, n, lambda now: model.simulate(now)[0])
    searches = {int(d["decided_after"]) + 1: float(d["search_s"]) for d in decisions}
    switches = {int(d["iteration"]): d for d in decisions if d["taken"]}
    current = {"layout": model.layout}

    def at_boundary(now, it: int, changed: bool) -> float | None:
        if it not in searches and it not in switches:
            return None
        pause = searches.get(it, 0.0)
        if it in switches:
            d = switches[it]
            new = replanned(current["layout"], d["pipelines"], d["stages"])
            pause += move_seconds(current["layout"], new, model.cfg, model.links(now), model.bytes_per_value)[0]
            current["layout"] = new
        return pause

    return predict_iterations(topo.timeline, topo, n, lambda now: model.simulate(now, current["layout"])[0],
                              at_boundary)


def replanned(lay: Layout, pipelines, stages) -> Layout:
    """`lay` (its schedule, sync, recompute) on a re-plan's pipelines and stages."""
    return from_pipelines(pipelines, lay.layers, lay.placement, stages=tuple(map(tuple, stages)),
                          schedule=lay.schedule, dp_sync=lay.dp_sync, dp_compress=lay.dp_compress,
                          recompute=lay.recompute)


@dataclass(frozen=True)
class RunModel:
    """The simulator of the run a record describes: its topology (scaled, its TCP settings and timeline), its
    layout and model, and `simulate(topology, layout)`: (iteration seconds, busiest device's compute seconds)
    on that topology's links (None: the run's own), on `layout` (None: the run's)."""

    topo: object
    layout: Layout
    cfg: object
    bytes_per_value: int
    links: Callable[[object], Links]
    simulate: Callable[..., tuple[float, float]]
    profiles: list = ()  # each device's compute profile (the compute model's)


def run_model(rec: dict, overrides: dict[str, ComputeProfile] | None = None) -> RunModel:
    """The simulator of the run a record describes (RunModel)."""
    topo = _topology(rec).scaled(float(rec.get("bandwidth_scale") or 1.0) * payload_share(rec.get("backend")))
    if rec.get("transport"):
        topo = replace(topo, transport=_transport(rec["transport"]))
    # a CNN's run is simulated on its chain of layers (the systems that train one take either)
    cfg = get_cnn(rec["model"]) if rec["model"] in TRAINABLE_CNNS else get_model(rec["model"], int(rec["layers"]))
    mb, batch, system = int(rec["micro_batch"]), int(rec["batch"]), rec["system"]
    dtype = rec.get("dtype") or DEFAULT_DTYPE.get(rec.get("backend"), "fp16")
    if dtype not in BYTES_PER_VALUE:
        raise HarnessError(f"records: dtype: unknown {dtype!r} (known: {', '.join(BYTES_PER_VALUE)})")
    bpv = BYTES_PER_VALUE[dtype]
    device = rec.get("device_type") or DEFAULT_DEVICE.get(rec.get("backend"), "cuda")
    protocol = "gloo" if device == "cpu" else "nccl"  # torch.distributed's backend for the device
    entry = registry.get(system)
    conf = _config(rec)
    d_pp = int(conf.get("pp", conf.get("d_pp", rec.get("d_pp") or 1)))
    # the emulator shapes every pair on its own (netmodel.links.Links, nic="per-pair"); real clusters share NICs
    nic = "per-pair" if rec.get("backend") == "emu" else "shared"
    scale = rec.get("compute_time_scale")
    # a compute-model run computes at its devices' profiles (the scenario's GPUs at the run's precision,
    # their slowdown) times its time scale: predicted from the device table, no calibration
    profiles = None if not scale else [replace(p, slowdown=p.slowdown * float(scale))
                                       for p in device_profiles(topo, dtype=dtype)]
    sim = Simulator(topo, overrides, d_pp=d_pp, micro_batch=mb, protocol=protocol, nic=nic, profiles=profiles)
    lay = record_layout(rec, cfg, topo.n, device, lambda: sim.assignment(cfg, batch))
    # the user-mode kernel's clock runs at 100 Hz: its retransmission timeouts are in 10 ms ticks
    hz = UML_HZ if rec.get("kernel") == "uml" else sim.links.hz

    def links(now) -> Links:
        return replace(sim.links if now is None else Links.from_topology(now, protocol, nic), hz=hz)

    # a model whose iterations differ over a run (registry run_length) simulates this run's length
    run = {"iterations": (int(rec["warmup"]), int(rec["iters"]))} if (
        entry.run_length and rec.get("warmup") not in (None, "") and rec.get("iters") not in (None, "")) else {}
    model = entry.simulate_layout_fn(json.loads(rec.get("options") or "{}"))  # its own options (load_measured)

    def simulate(now, layout: Layout | None = None) -> tuple[float, float]:
        return model(links(now), sim.profiles, cfg, batch, layout or lay, mb, bpv, **run)
    return RunModel(sim.topo, lay, cfg, bpv, links, simulate, sim.profiles)


def cross_node_traffic(run: Path) -> tuple[float, float]:
    """An emulated run's bytes between nodes an iteration: counted on the wire by its devices' kernels (the
    manifest's "egress": frames, so headers and acknowledgements too) and its system's payload model of the run
    as it ran (registry `cross_node_bytes`, nothing fitted on the run)."""
    doc = json.loads((Path(run) / "manifest.json").read_text())
    counted = doc.get("egress")
    if not counted:
        raise HarnessError(f"{run}: no bytes counted between devices (emulated runs count them)")
    rec = load_measured(Path(run))[0]
    model = run_model(rec)
    region = model.topo.device_region
    sent = sum(b for s, row in enumerate(counted["bytes"]) for d, b in enumerate(row) if region[s] != region[d])
    payload = registry.get(rec["system"]).cross_node_bytes_fn(json.loads(rec.get("options") or "{}"))(
        region, model.cfg, int(rec["batch"]), model.layout, int(rec["micro_batch"]), model.bytes_per_value)
    return sent / counted["iterations"], float(payload)


def payload_share(backend: str | None) -> float:
    """The share of a link's rate that carries TCP's payload in a run on `backend`: an emulated link shapes
    whole frames (HTB counts headers too: netmodel/tcp.tcp_efficiency, as `net verify` and the FL runs take
    it); elsewhere the scenario's bandwidth is what the run's transfers get."""
    return tcp_efficiency() if backend == "emu" else 1.0


def _transport(text: str) -> Transport:
    """The TCP settings a run's manifest recorded."""
    try:
        doc = json.loads(text)
        return Transport(**{k: v for k, v in doc.items() if k in TRANSPORT_KEYS})
    except (json.JSONDecodeError, TypeError, AttributeError):
        raise HarnessError(f"records: transport: not the TCP settings of a run ({text!r})") from None


# ----------------------------------------------------------------------------- the systems' runtime models
def record_layout(rec: dict, cfg, n: int, device: str, schedule_ours) -> Layout:
    """The layout a record ran on: its `config` (Layout.to_json), or for records written before the
    layout module, what its system's entry reads from their legacy keys (record_layout).
    `schedule_ours()` gives the scheduler's pipelines for an ours record that names none."""
    conf = _config(rec)
    if "mesh" in conf:
        return Layout.from_json(conf)
    return registry.get(rec["system"]).record_layout_fn()(rec, conf, cfg, n, device, schedule_ours)


def _compute_observed(system: str) -> bool:
    """Whether the system's records time compute inside the iteration (ours' runtime times its compute
    sections). The baselines' is a start-up estimate (harness/systems/baselines/train.py: one micro-batch
    through a copy of the stage, times the micro-batches), which misses how the ranks share the host's cores."""
    return registry.get(system).compute_observed


def calibrate_records(records: list[dict]) -> dict[str, ComputeProfile]:
    """Efficiency per GPU type such that the simulator's busiest-device compute equals the measured one.

    For each measured record, the run is simulated at efficiency 1 and 1/2: the busiest device's
    compute is A / efficiency + B, where A is its FLOP-bound work (its stage, the LM head,
    recomputation or not) and B its memory-bound optimizer step (harness/compute/), so
    efficiency = A / (measured compute_seconds - B). The median over records is used; records of
    compute_observed systems (registry) are preferred when present.
    """
    measured = [r for r in records if r.get("backend") != "sim" and (r.get("compute_seconds") or 0) > 0
                and not r.get("compute_time_scale")]  # compute-model runs compute at the table's speed
    if not measured:
        raise HarnessError("records: no measured record with compute_seconds > 0 (backend emu, local or cluster; "
                           "compute-model runs are paced to the device table, not measured)")
    observed = [r for r in measured if _compute_observed(r["system"])]
    use = observed or measured
    by_gpu: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    sims: dict[tuple, tuple[float, float]] = {}
    for r in use:
        devs = {p.gpu: p for p in _topology(r).profiles}  # every GPU type of the run, at one efficiency
        key = tuple(str(r.get(k)) for k in GROUP_KEYS)
        if key not in sims:
            at = [simulate_run(r, {g: ComputeProfile(g, 0.0, {c: e for c in OP_CLASSES}, "probe") for g in devs})[1]
                  for e in (1.0, 0.5)]
            sims[key] = (at[1] - at[0], 2 * at[0] - at[1])  # (A, B)
        flop_bound, memory_bound = sims[key]
        left = float(r["compute_seconds"]) - memory_bound
        eff = min(flop_bound / left, 1.0) if left > 0 else 1.0
        for gpu, dev in devs.items():  # one efficiency for the run: each of its types gets it
            by_gpu.setdefault(gpu, []).append(eff)
            peaks[gpu] = dev.peak_tflops
    what = "in-iteration" if observed else "start-up"
    return {gpu: ComputeProfile(gpu, peaks[gpu], {c: float(np.median(e)) for c in OP_CLASSES},
                                f"calibrated: median of {len(e)} measured records ({what} compute timings)")
            for gpu, e in by_gpu.items()}


def compare(records: list[dict], overrides: dict[str, ComputeProfile] | None = None,
            dtype: str | None = None) -> list[Comparison]:
    """dtype overrides every record's (else its manifest's, else the backend's default)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("backend") == "sim":
            continue
        if dtype:
            r = {**r, "dtype": dtype}
        groups.setdefault(tuple(str(r.get(k)) for k in GROUP_KEYS), []).append(r)
    if not groups:
        raise HarnessError("records: no measured records (backend emu, local or cluster) to compare")
    out = []
    for recs in groups.values():
        first = recs[0]
        measured = float(np.mean([r["seconds"] for r in recs]))
        load = float("nan")
        if (first.get("backend") in SHARED_HOST and first.get("host_cpus") and _compute_observed(first["system"])
                and not first.get("compute_time_scale")):  # a compute-model rank mostly waits: no load to report
            compute = float(np.mean([float(r.get("compute_seconds") or 0) for r in recs]))
            load = int(first["devices"]) * compute / (measured * int(first["host_cpus"]))
        busy = [float(r["cpu_busy"]) for r in recs if r.get("cpu_busy") == r.get("cpu_busy")
                and r.get("cpu_busy") not in (None, "")]
        out.append(Comparison(first["scenario"], first["system"], first["backend"], int(first["devices"]),
                              first["model"], int(first["layers"]), int(first["batch"]), str(first.get("config", "")),
                              len(recs), measured, _simulated(recs, overrides), load,
                              float(np.mean(busy)) if busy else float("nan"),
                              sum(bool(r.get("host_bound")) for r in recs), _named(first)))
    return sorted(out, key=lambda c: (c.scenario, c.named, c.model, c.layers, c.batch, c.config))


def _named(rec: dict) -> str:
    """A run's system with the options it set away from their defaults (runs of one system apart)."""
    return registry.named(rec["system"], json.loads(rec.get("options") or "{}"))


def _simulated(recs: list[dict], overrides) -> float:
    """The simulated seconds of a group's iterations: one iteration on the run's links, or under its timeline
    the mean of the predicted iterations the records hold."""
    pred = predict_run(max(recs, key=lambda r: int(r["iteration"])), overrides)
    if pred is None:
        return simulate_record(recs[0], overrides)
    return float(np.mean([pred[int(r["iteration"])].seconds for r in recs]))


def compare_iterations(records: list[dict], overrides: dict[str, ComputeProfile] | None = None) -> list[dict]:
    """Per iteration, measured and predicted, for every measured run with a timeline (by run id): rows of
    run_id, system, iteration, measured_s, simulated_s, error, changes (applied before or during it)."""
    runs: dict[str, list[dict]] = {}
    for r in records:
        if r.get("backend") != "sim":
            runs.setdefault(r["run_id"], []).append(r)
    rows = []
    for run_id, recs in runs.items():
        recs = sorted(recs, key=lambda r: int(r["iteration"]))
        pred = predict_run(recs[-1], overrides)
        if pred is None:
            continue
        for r in recs:
            p = pred[int(r["iteration"])]
            rows.append({"run_id": run_id, "system": r["system"], "iteration": int(r["iteration"]),
                         "measured_s": float(r["seconds"]), "simulated_s": p.seconds,
                         "error": p.seconds / float(r["seconds"]) - 1, "changes": p.changes})
    return rows


def format_table(rows: list[Comparison]) -> str:
    head = f"{'scenario':<14} {'system':<12} {'backend':<7} {'dev':>3} {'model':<8} {'L':>3} {'batch':>6} " \
           f"{'iters':>5} {'measured_s':>11} {'sim_s':>10} {'error':>8} {'cpu':>5} {'measured':>8}  target"
    lines = [head]
    for c in rows:
        if c.cpu_busy == c.cpu_busy:  # the emulated CPU's measured busy share
            cpu = f"{c.cpu_busy:.2f}"
        else:  # the estimate from the ranks' compute timings, where there is one
            cpu = "-" if c.host_load != c.host_load else f"{c.host_load:.2f}"
        lines.append(f"{c.scenario:<14} {c.named or c.system:<12} {c.backend:<7} {c.devices:>3} {c.model:<8} "
                     f"{c.layers:>3} {c.batch:>6} {c.iterations:>5} {c.measured_s:>11.4f} {c.simulated_s:>10.4f} "
                     f"{100 * c.error:>+7.1f}% {cpu:>5} {c.measured_what:>8}  {'ok' if c.within_target else 'MISS'}")
    ok = sum(c.within_target for c in rows)
    lines.append(f"{ok}/{len(rows)} within {100 * TARGET_ERROR:.0f}%")
    bound = [c for c in rows if c.host_bound]
    if bound:
        lines.append(f"measured host: {len(bound)} run(s) had host-bound iterations (the emulated CPU busy for most "
                     f"of them; cpu: its busy share): their times are the host's, not the links', and no comparison "
                     f"of them says anything of the simulator; the run's summary says which flag to change")
    busy = [c for c in rows if c.host_load >= BUSY_HOST and c.cpu_busy != c.cpu_busy]
    if busy:
        lines.append(f"cpu >= {BUSY_HOST}: {len(busy)} run(s) kept the host's cores busy (ranks x busiest compute / "
                     "(seconds x cores)); the ranks slowed each other, which the simulator (a processor per device) "
                     "does not model")
    return "\n".join(lines)
