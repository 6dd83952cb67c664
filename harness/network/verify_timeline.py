"""`net verify --timeline`: each change of a timeline measured in the emulated cluster: rate and delay before and
after it, and how long it took to show in the measurement.

Two boots of the cluster replay the timeline (its time events; an iteration needs a training run) from when
the probe's streams are steady (timeline_probe.Start): one measures the rate of one device pair per change (a TCP stream, bytes per 100 ms bin), the
other its one-way delay (a UDP stream, every datagram stamped; one kernel, one clock). The controller's log
says when each change was issued (timeline_control.AppliedChange). For each change:
  rate: before = median of the bins of the 1.5 s before it, after = median of the second half of the time to
        the next change; target = the new rate x TCP's payload share (plan.tcp_efficiency), 0 for a cut.
        Shown = the end of the first bin from which three bins in a row are within RATE_TOL of the target.
  delay: before / after = medians of the datagrams sent before it / from 0.2 s after it; target = the new
        one-way delay. Shown = when the first datagram sent after it that carries the new delay was sent.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import HarnessError
from ..files import atomic_write_json, atomic_write_text
from ..scenario.timeline import LinkState
from ..units import gbps_to_bits_per_s
from .emulate import run_emulated
from ..netmodel.tcp import tcp_efficiency
from .timeline_probe import BIN_S

RATE_TOL = 0.10
DELAY_TOL_MS, DELAY_TOL_REL = 1.0, 0.05
SETTLE_S = 4.0
BEFORE_S = 1.5
RATE_KEYS = ("bandwidth_gbps", "bandwidth_factor", "down", "restore")
DELAY_KEYS = ("delay_ms", "restore")


@dataclass
class ChangeEffect:
    event: str
    src: int
    dst: int
    quantity: str  # rate_mbps | delay_ms
    target: float
    before: float | None
    after: float | None
    shown_ms: float | None  # from the change's issue to its effect in the measurement; None: never
    issued_late_ms: float  # when the controller issued it, after its time
    applied_ms: float  # from its issue to the kernel's acknowledgement (the tc calls: a loaded host slows them)

    @property
    def ok(self) -> bool:
        if self.after is None or self.shown_ms is None:
            return False
        if self.quantity == "rate_mbps":
            return abs(self.after - self.target) <= RATE_TOL * max(self.target, self.before or 0.0)
        return abs(self.after - self.target) <= DELAY_TOL_MS + DELAY_TOL_REL * self.target


@dataclass
class TimelineReport:
    scenario: str
    timeline: str
    kernel: str
    effects: list[ChangeEffect]

    @property
    def ok(self) -> bool:
        return bool(self.effects) and all(e.ok for e in self.effects)

    def table(self) -> str:
        lines = [f"{self.scenario}: timeline {self.timeline} (kernel {self.kernel})",
                 f"{'change':<44} {'pair':>7} {'':>9} {'before':>9} {'after':>9} {'target':>9} {'applied ms':>10} "
                 f"{'shown ms':>9}  ok"]
        for e in self.effects:
            fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            unit = "Mbit/s" if e.quantity == "rate_mbps" else "ms"
            lines.append(f"{e.event[:44]:<44} {f'{e.src}->{e.dst}':>7} {unit:>9} {fmt(e.before):>9} "
                         f"{fmt(e.after):>9} {fmt(e.target):>9} {fmt(e.applied_ms):>10} {fmt(e.shown_ms):>9}  "
                         f"{'ok' if e.ok else 'MISS'}")
        lines.append(f"{sum(e.ok for e in self.effects)}/{len(self.effects)} changes took effect as planned")
        return "\n".join(lines)

    def write(self, json_path: Path | None, csv_path: Path | None) -> None:
        rows = [{**asdict(e), "ok": e.ok} for e in self.effects]
        if json_path:
            atomic_write_json(json_path, {"scenario": self.scenario, "timeline": self.timeline, "kernel": self.kernel,
                                          "effects": rows})
        if csv_path:
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["event"], lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
            atomic_write_text(csv_path, buf.getvalue())


def planned_changes(topo) -> list[tuple]:
    """(change, measured pair (d, e), rate target Mbit/s, delay target ms) of every change, in order."""
    timeline = topo.timeline
    late = [c for c in timeline.events if c.at_iteration is not None]
    if late:
        raise HarnessError(f"{late[0].where}: at_iteration: net verify replays a timeline without training; "
                           "it measures time events (at_s)")
    if timeline.trace is not None and timeline.trace.at_end == "wrap":
        raise HarnessError(f"{timeline.trace.where}: at_end: wrap replays for ever; verify a held trace")
    state, out = LinkState.initial(topo), []
    for change in timeline.cursor().due(float("inf")):
        pairs = state.apply(change)
        devices = [(d, e) for r, s in pairs for d in range(topo.n) for e in range(topo.n)
                   if d != e and topo.device_region[d] == r and topo.device_region[e] == s]
        if not devices:
            continue  # regions this topology does not hold
        r, s = topo.device_region[devices[0][0]], topo.device_region[devices[0][1]]
        rate = 0.0 if state.down[r, s] else gbps_to_bits_per_s(state.bandwidth_gbps[r, s]) / 1e6 * tcp_efficiency()
        out.append((change, devices[0], rate, float(state.delay_ms[r, s])))
    if not out:
        raise HarnessError(f"{timeline.source}: no change of the timeline touches a link of this topology")
    return out


def verify_timeline(topo, *, kernel: str = "auto", settle_s: float = SETTLE_S, timeout_s: float = 600.0,
                    stream=None) -> TimelineReport:
    """Replay `topo`'s timeline twice in the emulated cluster (rate, then delay) and measure each change."""
    if topo.timeline is None:
        raise HarnessError(f"{topo.source}: no timeline (give --timeline FILE, or a scenario with timeline:)")
    planned = planned_changes(topo)
    pairs = sorted({p for _, p, _, _ in planned})
    duration = max(c.at_s for c, *_ in planned) + settle_s
    out = Path(tempfile.mkdtemp(prefix="harness-verify-timeline-"))
    try:
        logs, kernels = {}, set()
        for mode in ("rate", "delay"):
            if stream is not None:
                stream.write(f"net verify --timeline: {mode}, {len(pairs)} pair(s), {duration:g} s\n")
            spec = out / f"{mode}.json"
            spec.write_text(json.dumps({"mode": mode, "pairs": pairs, "duration_s": duration}))
            res = run_emulated(topo, [sys.executable, "-m", "harness.network.timeline_probe", str(spec), str(out)],
                               kernel=kernel, timeout_s=timeout_s, timeline_clock="marks")
            if not res.ok:
                raise HarnessError(f"net verify --timeline: the {mode} probe failed (rc {res.returncode}): "
                                   f"{' | '.join(o.strip()[-300:] for o in res.outputs if o.strip())[-600:]}")
            logs[mode], kernels = res.timeline, kernels | {res.kernel}
        effects = []
        for k, (change, (d, e), rate, delay) in enumerate(planned):
            if any(getattr(change, key) not in (None, False) for key in RATE_KEYS):
                effects.append(_rate_effect(change, d, e, rate, logs["rate"], k, out))
            if any(getattr(change, key) not in (None, False) for key in DELAY_KEYS):
                effects.append(_delay_effect(change, d, e, delay, logs["delay"], k, out))
        return TimelineReport(topo.name, topo.timeline.source, "/".join(sorted(kernels)), effects)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _window(log: list[dict], k: int) -> tuple[float, float]:
    """(issued at, the next change's issue or +inf) of change k, on time.monotonic()."""
    nxt = log[k + 1]["applied_monotonic"] if k + 1 < len(log) else float("inf")
    return log[k]["applied_monotonic"], nxt


def _rate_effect(change, d, e, target, log, k, out) -> ChangeEffect:
    series = np.array(json.loads((out / f"rate-{d}-{e}.json").read_text()) or [[0.0, 0.0]], dtype=float)
    start, mbps = series[:, 0], series[:, 1] * 8 / BIN_S / 1e6
    at, nxt = _window(log, k)
    end = min(nxt, start[-1] + BIN_S)
    before = mbps[(start >= at - BEFORE_S) & (start + BIN_S <= at)]
    after = mbps[(start >= at + (end - at) / 2) & (start + BIN_S <= end)]
    tol = RATE_TOL * max(target, float(np.median(before)) if before.size else 0.0)
    shown = None
    for i in np.flatnonzero(start >= at):
        run = mbps[i:i + 3]
        if len(run) == 3 and start[i] + 3 * BIN_S <= end and np.all(np.abs(run - target) <= tol):
            shown = (start[i] + BIN_S - at) * 1e3
            break
    return ChangeEffect(change.describe(), d, e, "rate_mbps", target, _median(before), _median(after), shown,
                        (log[k]["applied_s"] - (change.at_s or 0.0)) * 1e3, float(log[k]["took_ms"]))


def _delay_effect(change, d, e, target, log, k, out) -> ChangeEffect:
    got = np.array(json.loads((out / f"delay-{d}-{e}.json").read_text()) or [[0, 0.0, 0.0]], dtype=float)
    sent, delay = got[:, 1], (got[:, 2] - got[:, 1]) * 1e3
    at, nxt = _window(log, k)
    before = delay[(sent >= at - BEFORE_S) & (sent < at)]
    after = delay[(sent >= at + 0.2) & (sent < nxt)]
    new = np.flatnonzero((sent >= at) & (np.abs(delay - target) <= DELAY_TOL_MS + DELAY_TOL_REL * target))
    shown = None if not new.size else (sent[new[0]] - at) * 1e3
    return ChangeEffect(change.describe(), d, e, "delay_ms", target, _median(before), _median(after), shown,
                        (log[k]["applied_s"] - (change.at_s or 0.0)) * 1e3, float(log[k]["took_ms"]))


def _median(v: np.ndarray) -> float | None:
    return float(np.median(v)) if v.size else None
