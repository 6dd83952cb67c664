"""The host's side of an emulated FL run: plans, the cluster, and measured FL records.

The run's federation is the scenario's at the run's scales (emulated_federation: bandwidths x
bandwidth_scale of which TCP's payload share carries parameters, compute compute_time_scale times
longer, the emulated cluster's per-pair shaping);
every strategy plans for that federation, as it would for the testbed it faces, and its plan is
what the processes send. The cluster is emulated_topology (the server a device of its own behind
its uplink) at the same bandwidth scale. A record carries what was measured: the round, the
distribution (the last parameter to land anywhere), the forward, and the bytes counted as sent.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ...files import atomic_write_json
from ...network.headroom import GUEST_CPU, CpuMonitor, Headroom, host_bound, read_guest
from ...netmodel.tcp import tcp_efficiency
from ...plan.dilation import TARGET_BUSY, Dilation, Probe, further, smallest_factor
from ...scenario import Topology
from ...train.launch import RankFailure
from ...train.rank import PROGRESS_PREFIX
from ...workloads.fl import strategies as st
from ...workloads.fl.federation import Federation, FLError, emulated_topology
from ...workloads.fl.flows import layer_seconds
from ...workloads.fl.models import BranchyModel
from ...workloads.fl.records import FLRecord, to_record
from .runtime import FLSpec, RoundSpec, Transfer

#: The models a worker process builds (harness/workloads/fl/nets.py) and this machine runs; the others are profiles.
RUNNABLE = ("tiny", "mini-inception")
#: Wall-clock allowance per strategy's round on top of the simulated round (warm-up, connections, checks).
ROUND_OVERHEAD_S = 60.0


@dataclass(frozen=True)
class EmuSetting:
    """How an emulated FL run is scaled and bounded."""

    bandwidth_scale: float = 1.0
    compute_time_scale: float = 1.0
    timeout_s: float | None = None  # None: from the simulated rounds
    kernel: str = "auto"
    seed: int = 0
    fault_rank: int | None = None


def emulated_federation(fed: Federation, bandwidth_scale: float, compute_time_scale: float) -> Federation:
    """`fed` as the emulated cluster runs it (Federation.scaled): the shaped rates carry TCP frames, so the
    parameters move at the share of them that is payload."""
    return fed.scaled(bandwidth_scale, compute_time_scale, payload_share=tcp_efficiency())


def plan_rounds(model: BranchyModel, fed: Federation, strategies: list[str], batch: int) -> list[st.Round]:
    """Every strategy's round as the simulator plans it for the (scaled) federation."""
    bounds = [n for n in strategies if not st.get(n).plan]
    if bounds:
        raise FLError(f"--strategy: {bounds[0]} is a bound, not a plan of transfers; --backend sim only")
    return [st.run(n, model, fed, batch) for n in strategies]


def check_runnable(model: BranchyModel) -> None:
    if model.name not in RUNNABLE:
        raise FLError(f"--model: {model.name} does not run on --backend emu (runnable: {', '.join(RUNNABLE)}); "
                      "--backend sim simulates every model")


def fl_spec(model: BranchyModel, fed: Federation, rounds: list[st.Round], batch: int, setting: EmuSetting) -> FLSpec:
    check_runnable(model)
    secs = layer_seconds(model, fed, batch)
    backward = [2 * model.fwd_flop * batch / f for f in fed.flops_per_s]
    timeout = setting.timeout_s or sum(2 * r.seconds + ROUND_OVERHEAD_S for r in rounds)
    return FLSpec(model.name, batch, fed.racks, tuple(tuple(float(x) for x in row) for row in secs),
                  tuple(float(b) for b in backward),
                  tuple(RoundSpec(r.strategy, tuple(Transfer.of(k, t) for k, t in enumerate(r.transfers)))
                        for r in rounds),
                  float(timeout), seed=setting.seed, fault_rank=setting.fault_rank)


def run_fl_emulated(topo: Topology, fed: Federation, model: BranchyModel, rounds: list[st.Round], batch: int,
                    setting: EmuSetting, work: Path, *, run_id: str, stream=None) -> tuple[list[FLRecord], dict]:
    """Run `rounds` (plan_rounds of `fed` at the setting's scales) in one boot of the emulated cluster;
    (records, manifest extras). `fed` is the scenario's federation (unscaled); raises RankFailure naming
    a process that failed."""
    from ...network.emulate import run_emulated

    scaled = emulated_federation(fed, setting.bandwidth_scale, setting.compute_time_scale)
    spec = fl_spec(model, scaled, rounds, batch, setting)
    spec_path, out_path = Path(work) / "fl-spec.json", Path(work) / "fl-out.json"
    atomic_write_json(spec_path, spec.to_json())
    cluster = emulated_topology(topo, fed).scaled(setting.bandwidth_scale)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    guest_path = Path(work) / GUEST_CPU
    guest_path.unlink(missing_ok=True)  # an earlier boot's samples (the probe's) are not this one's
    cpu = CpuMonitor()
    res = run_emulated(cluster, [sys.executable, "-m", "harness.systems.owl.launcher", str(spec_path), str(out_path)],
                       mode="launcher", kernel=setting.kernel, timeout_s=spec.timeout_s + 60, env=env,
                       stream=None if stream is None else _ProgressOnly(stream), monitor=cpu)
    outcome = json.loads(out_path.read_text()) if out_path.exists() else None
    if outcome is None or outcome["status"] != "ok":
        why = outcome["reason"] if outcome else (
            f"emulated cluster timed out after {spec.timeout_s + 60:g} s" if res.timed_out
            else f"emulated cluster: launcher exited {res.returncodes}: {' '.join(res.outputs)[-500:]}")
        raise RankFailure(why)
    guest = read_guest(guest_path)
    heads = [round_headroom(cpu, ranks[:fed.workers], guest) for ranks in outcome["rounds"]]
    records = [measured_record(r, ranks, fed=fed, scaled=scaled, model=model, batch=batch, run_id=run_id,
                               setting=setting, head=h)
               for r, ranks, h in zip(rounds, outcome["rounds"], heads)]
    return records, {"kernel": res.kernel, "readback": res.readback, "bandwidth_scale": setting.bandwidth_scale,
                     "compute_time_scale": setting.compute_time_scale,
                     "headroom": [None if h is None else h.to_json() for h in heads]}


def run_boots(topo: Topology, feds: list[Federation], model: BranchyModel, names: list[str], batch: int,
              setting: EmuSetting, work: Path, *, run_id: str, repeat: int = 1, dilate: bool = True, stream=None,
              boots: list | None = None, on_dilation=None) -> tuple[list[FLRecord], EmuSetting]:
    """Every strategy's round in one boot per federation (`feds`: one per alpha), each strategy's fastest of
    `repeat` kept; where `dilate`, a probe boot first runs each round undilated and the setting takes the
    dilation chosen from what they cost this host (said on `stream`; `on_dilation(setting, dilation)`).
    Each boot's manifest entry is appended to `boots` as it ends. Returns (records, the setting run)."""
    boots = [] if boots is None else boots
    if dilate:
        rounds = plan_rounds(model, emulated_federation(feds[0], setting.bandwidth_scale, setting.compute_time_scale),
                             names, batch)
        _say(stream, f"harness: time dilation: probing this host's cost of a round ({len(rounds)} round(s), "
                     "undilated, one boot)")
        recs, info = run_fl_emulated(topo, feds[0], model, rounds, batch, replace(setting, timeout_s=None), work,
                                     run_id=run_id)
        d = choose_dilation(model, feds, batch, setting.bandwidth_scale, probes_of(recs, info["kernel"]))
        _say(stream, f"harness: {d.line()}")
        setting = replace(setting, bandwidth_scale=d.bandwidth_scale, compute_time_scale=d.factor)
        if on_dilation is not None:
            on_dilation(setting, d)
    records = []
    for fed in feds:
        rounds = plan_rounds(model, emulated_federation(fed, setting.bandwidth_scale, setting.compute_time_scale),
                             names, batch)
        _say(stream, f"alpha {fed.alpha:g}: {len(names) * repeat} rounds in the emulated cluster ({fed.workers} "
                     "workers, 1 server)")
        recs, info = run_fl_emulated(topo, fed, model, rounds * repeat, batch, setting, work, run_id=run_id,
                                     stream=stream)
        records += fastest_rounds(recs)
        boots.append({"alpha": fed.alpha, **info, "rounds_s": {n: [r.seconds for r in recs if r.strategy == n]
                                                               for n in names}})
    return records, setting


def run_recorded(topo: Topology, feds: list[Federation], model: BranchyModel, names: list[str], batch: int,
                 setting: EmuSetting, out: Path, *, run_id: str, repeat: int = 1, dilate: bool = True, stream=None,
                 finish=None) -> tuple[list[FLRecord], EmuSetting, dict]:
    """run_boots under the reaper, its manifest in `out`: `running` first (with the dilation once chosen), then
    `ok` with every boot and the headroom once `finish(records, setting, headroom)` (which writes the records)
    has returned, or `failed` with the reason. Returns (records, the setting run, the headroom)."""
    from ...errors import HarnessError
    from ...network import reaper
    from ...results import manifest

    man = Path(out) / "manifest.json"
    extra = dict(backend="emu", workload="fl", strategies=names, model=model.name, batch=batch, repeat=repeat,
                 bandwidth_scale=setting.bandwidth_scale, compute_time_scale=setting.compute_time_scale)
    atomic_write_json(man, manifest(run_id, "running", **extra))
    boots: list[dict] = []

    def dilated(chosen, dilation):
        extra.update(bandwidth_scale=chosen.bandwidth_scale, compute_time_scale=chosen.compute_time_scale,
                     dilation=dilation.to_json())
        atomic_write_json(man, manifest(run_id, "running", **extra))

    try:
        with reaper.guarded([str(man)]) as work:
            records, setting = run_boots(topo, feds, model, names, batch, setting, work, run_id=run_id, repeat=repeat,
                                         dilate=dilate, stream=stream, boots=boots, on_dilation=dilated)
            head = headroom_summary(records, setting)
            if finish is not None:
                finish(records, setting, head)
            atomic_write_json(man, manifest(run_id, "ok", **extra, boots=boots,
                                            headroom={k: v for k, v in head.items() if k != "line"}))
    except (HarnessError, KeyboardInterrupt) as e:
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
        atomic_write_json(man, manifest(run_id, "failed", reason=reason, **extra, boots=boots))
        raise
    return records, setting, head


def headroom_summary(records: list[FLRecord], setting: EmuSetting) -> dict:
    """The manifest's account of the emulated CPU over the recorded rounds, with the summary's `line`."""
    busy = [r.cpu_busy for r in records if r.cpu_busy is not None]
    if not busy:
        return {"measured": False, "line": "emulated CPU: not measured"}
    bound = sum(r.host_bound for r in records)
    mean = sum(busy) / len(busy)
    out = {"measured": True, "busy": round(mean, 4), "host_bound_rounds": bound, "rounds": len(records),
           "host_bound": bound > 0}
    if bound:
        out["advice"] = advice(bound, len(records), setting)
    out["line"] = (f"emulated CPU {mean:.0%} busy over the rounds: "
                   + (f"HOST-BOUND, {bound}/{len(records)} rounds host-bound" if bound else "measured the network"))
    return out


def _say(stream, line: str) -> None:
    if stream is not None:
        print(line, file=stream, flush=True)


def round_headroom(cpu: CpuMonitor, workers: list[dict], guest: list) -> Headroom | None:
    """The cluster's CPU over one round: from its workers' first start to their last end, on the wall clock
    the guest shares with the host."""
    starts = [w.get("wall_start", float("nan")) for w in workers]
    if not starts or any(t != t for t in starts):  # nan: not measured
        return None
    return cpu.window(min(starts), max(t + w["end"] for t, w in zip(starts, workers)), 0.0, guest)


def choose_dilation(model: BranchyModel, feds: list[Federation], batch: int, base_bandwidth_scale: float,
                    probes: list[Probe]) -> Dilation:
    """The smallest dilation k (two significant digits) at which each strategy's undilated round's CPU seconds
    (its probe, labelled by strategy) are at most TARGET_BUSY of its round as the flow simulator gives it at k,
    compute k times longer and links k times slower than `base_bandwidth_scale`, in every setting (`feds`:
    one per alpha; the shortest round decides): plan/dilation.py's rule, with the FL round as the iteration."""
    def modelled(name: str, k: float) -> float:
        return min(st.run(name, model, emulated_federation(f, base_bandwidth_scale / k, k), batch).seconds
                   for f in feds)

    k = max(smallest_factor(lambda k, p=p: p.cpu_s <= TARGET_BUSY * modelled(p.label, k)) for p in probes)
    return Dilation(k, tuple(probes), tuple(modelled(p.label, k) for p in probes), base_bandwidth_scale, "round")


def probes_of(records: list[FLRecord], kernel: str) -> list[Probe]:
    """The probe of each strategy from its undilated measured round; a round without headroom cannot say."""
    out = []
    for r in records:
        if r.cpu_busy is None:
            raise FLError(f"time dilation: the probe of {r.strategy} measured no CPU headroom; give "
                          "--compute-time-scale to run without one")
        out.append(Probe(r.strategy, r.seconds, r.cpu_busy, kernel))
    return out


def advice(host_bound_rounds: int, rounds: int, setting: EmuSetting) -> str:
    """One line for a run some of whose rounds were host-bound: what they measured and the flag to change."""
    return (f"host-bound: the emulated cluster's CPU was busy for most of {host_bound_rounds} of {rounds} rounds "
            f"and delayed their layers, so their times measure the host, not the links; "
            + further(setting.compute_time_scale, setting.bandwidth_scale))


def fastest_rounds(records: list[FLRecord]) -> list[FLRecord]:
    """Each strategy's fastest measured round, in first-run order (`fl --repeat`): the host's other work only
    ever adds time to a round in the emulated cluster, so the fastest is the nearest to the undisturbed one."""
    best: dict[str, FLRecord] = {}
    for r in records:
        if r.strategy not in best or r.seconds < best[r.strategy].seconds:
            best[r.strategy] = r
    return list(best.values())


class _ProgressOnly:
    """The launcher's output as run_emulated streams it: progress lines go on (the rest stays in the job's log)."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> None:
        for line in text.splitlines(keepends=True):
            if line.startswith(PROGRESS_PREFIX):
                self.out.write(line)

    def flush(self) -> None:
        self.out.flush()


def measured_record(planned: st.Round, ranks: list[dict], *, fed: Federation, scaled: Federation,
                    model: BranchyModel, batch: int, run_id: str, setting: EmuSetting,
                    head: Headroom | None = None) -> FLRecord:
    """The record of one measured round: times from the workers, bytes from everyone's counts, the cluster's
    CPU over it (`head`) and whether it measured the host (network/headroom.host_bound: busy, and a layer
    outran its modelled time or the paced phases of a worker woke late by LATE_SHARE of the round)."""
    W = fed.workers
    workers = ranks[:W]
    overruns = sum(w["overruns"] for w in workers)
    dist_s = max(max(w["arrivals"]) for w in workers)
    fwd = max(w["forward_end"] for w in workers)
    end = max(w["end"] for w in workers)
    sent: dict[str, float] = {}
    for r in ranks:
        for k, v in r["sent"].items():
            sent[k] = sent.get(k, 0) + v
    rack_bytes = tuple(float(sent.get(f"rack{k}", 0)) for k in range(len(fed.racks)))
    measured = replace(planned, seconds=end, distribution_seconds=dist_s, forward_seconds=fwd, e0_seconds=end - fwd,
                       server_bytes=float(sent.get("server", 0)))
    rec = to_record(measured, run_id=run_id, fed=fed, model=model, batch=batch)
    return replace(rec, backend="emu", rack_bytes=rack_bytes, inter_rack_bytes=float(sent.get("inter", 0)),
                   allreduce_bytes=float(sent.get("allreduce", 0)), bandwidth_scale=setting.bandwidth_scale,
                   compute_time_scale=setting.compute_time_scale,
                   overruns=int(overruns),
                   server_wire_bytes=float(ranks[W].get("interface_tx_bytes") or 0),
                   cpu_busy=None if head is None else round(head.busy, 4),
                   host_bound=host_bound(head, True, overruns,
                                         max(w.get("late_s", 0.0) for w in workers), end))
