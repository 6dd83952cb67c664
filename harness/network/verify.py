"""`net verify`: do the emulated links behave like the scenario says? Measured vs target.

For each ordered pair (src, dst), inside the emulated cluster (probe.py):
  RTT: median TCP 1-byte ping-pong. Target = A[src][dst] + A[dst][src].
       Pass: |measured - target| <= 0.5 ms + 3 % of target.
  goodput: one bulk TCP stream, counted at the receiver after slow start.
       Target = rate x TCP's payload share of the frames HTB counts = B[src][dst] x scale x 0.956
       at MTU 1500 (harness/netmodel/tcp.py: tcp_efficiency). Pass: within +-5 % of target.
Pairs the scenario leaves unshaped (node-internal, see plan.py) are not verified.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import HarnessError
from ..files import atomic_write_json, atomic_write_text
from .emulate import run_emulated
from ..netmodel.tcp import frame_bytes, slow_start_rounds, tcp_efficiency
from .plan import build_plan, device_addresses, target_matrices

RTT_TOL_MS = 0.5
RTT_TOL_REL = 0.03
GOODPUT_TOL_REL = 0.05
PAIRS = ("all", "sample")


@dataclass
class PairResult:
    src: int
    dst: int
    rtt_target_ms: float
    rtt_ms: float | None
    rtt_ok: bool
    goodput_target_mbps: float
    goodput_mbps: float | None
    goodput_err_pct: float | None
    goodput_ok: bool
    error: str = ""
    attempts: int = 1
    rtt_samples_ms: list = field(default_factory=list, repr=False)
    wake_late_ms: list = field(default_factory=list, repr=False)  # probe._wake_late_ms beside each ping

    @property
    def rtt_err_ms(self) -> float | None:
        return None if self.rtt_ms is None else self.rtt_ms - self.rtt_target_ms

    @property
    def ok(self) -> bool:
        return self.rtt_ok and self.goodput_ok


@dataclass
class VerifyReport:
    scenario: str
    devices: int
    bandwidth_scale: float
    kernel: str
    pairs: list[PairResult]
    duration_s: float
    tcp_efficiency: float
    readback: dict = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> int:
        return sum(p.ok for p in self.pairs)

    @property
    def ok(self) -> bool:
        return bool(self.pairs) and self.passed == len(self.pairs)

    def worst(self) -> dict:
        rtt = [abs(p.rtt_err_ms) for p in self.pairs if p.rtt_ms is not None]
        gp = [abs(p.goodput_err_pct) for p in self.pairs if p.goodput_err_pct is not None]
        late = [x for p in self.pairs for x in p.wake_late_ms]
        return {"rtt_abs_err_ms": max(rtt, default=None), "goodput_abs_err_pct": max(gp, default=None),
                "wake_late_ms_median": statistics.median(late) if late else None}

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario, "devices": self.devices, "bandwidth_scale": self.bandwidth_scale,
            "kernel": self.kernel, "duration_s": self.duration_s, "tcp_efficiency": self.tcp_efficiency,
            "tolerance": {"rtt_ms": RTT_TOL_MS, "rtt_rel": RTT_TOL_REL, "goodput_rel": GOODPUT_TOL_REL},
            "passed": self.passed, "pairs_total": len(self.pairs), "worst": self.worst(),
            "pairs": [{**asdict(p), "rtt_err_ms": p.rtt_err_ms, "ok": p.ok} for p in self.pairs],
            "readback": self.readback,
        }

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["src", "dst", "rtt_target_ms", "rtt_ms", "rtt_err_ms", "rtt_ok", "goodput_target_mbps",
                    "goodput_mbps", "goodput_err_pct", "goodput_ok", "ok", "attempts", "kernel", "bandwidth_scale", "error"])
        for p in self.pairs:
            w.writerow([p.src, p.dst, _f(p.rtt_target_ms), _f(p.rtt_ms), _f(p.rtt_err_ms), p.rtt_ok,
                        _f(p.goodput_target_mbps), _f(p.goodput_mbps), _f(p.goodput_err_pct), p.goodput_ok,
                        p.ok, p.attempts, self.kernel, self.bandwidth_scale, p.error])
        return buf.getvalue()

    def table(self) -> str:
        lines = [f"{'pair':>7} {'RTT target':>10} {'measured':>9} {'':2} {'goodput target':>14} "
                 f"{'measured':>9} {'err %':>6} {'':2}"]
        for p in self.pairs:
            lines.append(
                f"{p.src:>3}->{p.dst:<3} {p.rtt_target_ms:>8.2f}ms {_f(p.rtt_ms, 2):>7}ms "
                f"{'ok' if p.rtt_ok else 'NO':2} {p.goodput_target_mbps:>10.3f}Mbps {_f(p.goodput_mbps, 3):>9} "
                f"{_f(p.goodput_err_pct, 2):>6} {'ok' if p.goodput_ok else 'NO':2}"
                + (f"  (attempt {p.attempts})" if p.attempts > 1 else "") + (f"  {p.error}" if p.error else ""))
        w = self.worst()
        lines.append(f"{self.passed}/{len(self.pairs)} pairs pass (kernel {self.kernel}, bandwidth scale "
                     f"{self.bandwidth_scale:g}, {self.duration_s:.1f} s); worst |RTT error| "
                     f"{_f(w['rtt_abs_err_ms'], 2)} ms, worst |goodput error| {_f(w['goodput_abs_err_pct'], 2)} %")
        if w["wake_late_ms_median"] is not None:
            lines.append(f"the guest woke its sleepers {w['wake_late_ms_median']:.2f} ms late (median beside the pings): "
                         "a loaded host makes every RTT late by about twice that")
        return "\n".join(lines)

    def write(self, json_path: Path | None = None, csv_path: Path | None = None) -> None:
        if json_path:
            atomic_write_json(Path(json_path), self.to_json())
        if csv_path:
            atomic_write_text(Path(csv_path), self.to_csv())


def _f(v, nd: int = 4):
    return "" if v is None else f"{v:.{nd}f}"


def rtt_ok(measured_ms: float | None, target_ms: float) -> bool:
    return measured_ms is not None and abs(measured_ms - target_ms) <= RTT_TOL_MS + RTT_TOL_REL * target_ms


def goodput_ok(measured_bps: float | None, target_bps: float) -> bool:
    return measured_bps is not None and abs(measured_bps - target_bps) <= GOODPUT_TOL_REL * target_bps


def select_pairs(n: int, which: str, shaped) -> list[tuple[int, int]]:
    """Ordered pairs to measure: all, or a sample (each device to its next and previous one)."""
    if which not in PAIRS:
        raise HarnessError(f"--pairs: must be one of {', '.join(PAIRS)} (got {which!r})")
    if which == "all":
        pairs = [(s, (s + k) % n) for k in range(1, n) for s in range(n)]
    else:
        ks = sorted({1, n - 1}) if n > 1 else []
        pairs = [(s, (s + k) % n) for k in ks for s in range(n)]
    return [(s, d) for s, d in pairs if shaped(s, d)]


def bulk_rounds(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Group pairs into rounds where every device sends at most one stream and receives at most
    one, and no stream's reverse pair (whose link carries its ACKs) runs alongside it."""
    rounds: list[list[tuple[int, int]]] = []
    for s, d in pairs:
        for rnd in rounds:
            if all(s != a and d != b and (d, s) != (a, b) for a, b in rnd):
                rnd.append((s, d))
                break
        else:
            rounds.append([(s, d)])
    return rounds


def warmup_s(rate_bps: float, rtt_ms: float, mtu: int) -> float:
    """Time for slow start (cwnd 10 -> BDP, doubling per RTT), its overshoot and recovery
    (five more RTTs) and a margin."""
    rtt = max(rtt_ms, 0.1) / 1e3
    return (slow_start_rounds(rate_bps * rtt / 8, frame_bytes(mtu)) + 5) * rtt + 0.5


def run_probe(topo, spec: dict, what: str, *, kernel: str, timeout_s: float, stream=None):
    """Run the measurement program (probe.py) with `spec` in the emulated cluster of `topo`; (its
    measurements, the EmulationResult). A failed or silent probe is one HarnessError naming `what`."""
    tmp = Path(tempfile.mkdtemp(prefix="harness-probe-"))
    try:
        spec_path, out = tmp / "spec.json", tmp / "out.json"
        spec_path.write_text(json.dumps(spec))
        res = run_emulated(topo, [sys.executable, "-m", "harness.network.probe", str(spec_path), str(out)],
                           mode="launcher", kernel=kernel,
                           timeout_s=timeout_s, env={"OMP_NUM_THREADS": "1"}, stream=stream)
        if not res.ok or not out.exists():
            tail = " | ".join(res.outputs[0].strip().splitlines()[-3:]) if res.outputs else ""
            raise HarnessError(f"{what}: probe failed (rc {res.returncode}"
                               f"{', timed out' if res.timed_out else ''}): {tail}")
        return json.loads(out.read_text()), res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify(topo, *, pairs: str = "all", kernel: str = "auto",
           measure_s: float = 2.0, pings: int = 5, retries: int = 1, timeout_s: float = 600.0, stream=None) -> VerifyReport:
    """Measure every selected ordered pair in the emulated cluster of `topo` (scaled: Topology.scaled);
    see module docstring."""
    n = topo.n
    addrs, prefix = device_addresses(n)
    plan = build_plan(topo, addrs, [f"if{i}" for i in range(n)], prefix_len=prefix)  # validates before booting
    rtt_t, gp_t = target_matrices(plan)
    shaped = {(dev.index, link.dst) for dev in plan.devices for link in dev.links}
    chosen = select_pairs(n, pairs, lambda s, d: (s, d) in shaped and (d, s) in shaped)
    rounds = [[{"src": s, "dst": d, "measure_s": measure_s, "rtt_target_ms": float(rtt_t[s, d]),
                "goodput_target_bps": float(gp_t[s, d]),
                "warmup_s": warmup_s(gp_t[s, d], rtt_t[s, d], plan.mtu)} for s, d in rnd]
              for rnd in bulk_rounds(chosen)]
    t0 = time.monotonic()
    meas, res = run_probe(topo, {"pings": pings, "rounds": rounds, "retries": retries}, "net verify",
                          kernel=kernel, timeout_s=timeout_s, stream=stream)
    duration = time.monotonic() - t0
    got = {(r["src"], r["dst"]): r for r in meas}
    results = []
    for s, d in chosen:
        r = b = got.get((s, d), {"error": "not measured"})
        rtt = r.get("rtt_ms")
        gp = b.get("goodput_bps")
        gpt = float(gp_t[s, d])
        results.append(PairResult(
            src=s, dst=d, rtt_target_ms=float(rtt_t[s, d]), rtt_ms=rtt, rtt_ok=rtt_ok(rtt, float(rtt_t[s, d])),
            goodput_target_mbps=gpt / 1e6, goodput_mbps=None if gp is None else gp / 1e6,
            goodput_err_pct=None if gp is None else (gp - gpt) / gpt * 100, goodput_ok=goodput_ok(gp, gpt),
            error=r.get("error", ""), attempts=int(r.get("attempts", 1)),
            rtt_samples_ms=[round(x, 3) for x in r.get("rtt_samples_ms", [])],
            wake_late_ms=[round(x, 3) for x in r.get("wake_late_ms", [])],
        ))
    return VerifyReport(scenario=topo.name, devices=n, bandwidth_scale=float(topo.bandwidth_scale), kernel=res.kernel,
                        pairs=results, duration_s=duration, tcp_efficiency=tcp_efficiency(plan.mtu),
                        readback=res.readback)
