"""`net verify --transfer-curves`: how long one connection takes to deliver a message on each link class.

`net verify` checks the shaping (rate and delay as configured); a training library's message also pays
TCP's window: slow start, slow start again after an idle period, buffer limits. Per link class (the
ordered pairs of the selection with distinct rate and round-trip time, one pair each), one TCP connection
(TCP_NODELAY, as gloo's) sends, for every (idle time, message size, repetition): a primer message of
two round-trip bandwidth-delay products, which opens the window; then, `idle_s` after the primer's last
byte arrived, the message. Its time runs from the first write to the arrival of its last byte at the
receiver (both ends read one clock: every namespace is in one kernel). Pairs are measured one at a time,
so nothing else loads the kernel's CPU. The kernel's TCP settings (read back from every namespace) and
each link's netem queue limit are written beside the points. A pair whose connection fails (a loaded host's
stall) is measured again, `retries` times at most.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HarnessError
from ..files import atomic_write_json, atomic_write_text
from ..netmodel.tcp import tcp_efficiency
from .plan import build_plan, device_addresses, target_matrices
from .verify import run_probe, select_pairs

#: message sizes (bytes): a pipeline's activation at tiny scale up to a 1.3B model's gradient shard
SIZES = (64 << 10, 512 << 10, 4 << 20, 32 << 20)
IDLES_S = (0.0, 2.0)
REPS = 2
PRIMER_MIN_BYTES = 1 << 20
#: a step of a pair's connection (connect, one message) that takes this long plus STALL_FACTOR times its
#: largest message's time at the link's rate has stalled: the pair fails with its TCP state, and is measured
#: again (a socket's default of minutes cost a whole run its deadline)
STALL_MIN_S = 20.0
STALL_FACTOR = 10.0
FIELDS = ("src", "dst", "rate_mbps", "delay_ms", "rtt_ms", "burst_bytes", "limit_packets", "bytes", "idle_s", "rep",
          "idle_measured_s", "seconds", "ideal_seconds")


@dataclass
class CurveReport:
    scenario: str
    bandwidth_scale: float
    kernel: str
    mtu: int
    transport: dict  # the plan's settings (`auto` resolved)
    readback: dict  # per device: the TCP settings as its namespace holds them
    rows: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "bandwidth_scale": self.bandwidth_scale, "kernel": self.kernel,
                "mtu": self.mtu, "tcp_efficiency": tcp_efficiency(self.mtu), "transport": self.transport,
                "transport_readback": self.readback, "how": __doc__.strip(), "points": self.rows}

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        return buf.getvalue()

    def write(self, out_dir: Path) -> list[Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [out_dir / "transfer-curves.csv", out_dir / "transfer-curves.json"]
        atomic_write_text(paths[0], self.to_csv())
        atomic_write_json(paths[1], self.to_json())
        return paths


def link_classes(pairs: list[tuple[int, int]], rate_bps, rtt_ms) -> list[tuple[int, int]]:
    """The first pair of every distinct (rate, round-trip time) among `pairs`."""
    seen, out = set(), []
    for s, d in pairs:
        key = (round(float(rate_bps[s, d])), round(float(rtt_ms[s, d]), 3))
        if key not in seen:
            seen.add(key)
            out.append((s, d))
    return out


def measure_curves(topo, *, pairs: str = "sample", sizes=SIZES, idles_s=IDLES_S, reps: int = REPS,
                   kernel: str = "auto", timeout_s: float = 1800.0, retries: int = 1, stream=None) -> CurveReport:
    """Transfer time against message size and idle time per link class of `topo` (scaled); see the module
    docstring. retries: a pair whose connection fails is measured again, up to this many times."""
    if not sizes or any(b < 1 for b in sizes) or any(t < 0 for t in idles_s) or not idles_s or reps < 1:
        raise HarnessError("transfer curves: need sizes >= 1 byte, idle times >= 0 and reps >= 1")
    n = topo.n
    addrs, prefix = device_addresses(n)
    plan = build_plan(topo, addrs, [f"if{i}" for i in range(n)], prefix_len=prefix)
    rtt_t, goodput = target_matrices(plan)
    rate = {(dev.index, lk.dst): lk for dev in plan.devices for lk in dev.links}
    chosen = link_classes(select_pairs(n, pairs, lambda s, d: (s, d) in rate and (d, s) in rate),
                          goodput, rtt_t)
    if not chosen:
        raise HarnessError(f"transfer curves: {topo.name} has no shaped pair to measure")
    specs = []
    for s, d in chosen:
        bdp = goodput[s, d] / 8 * rtt_t[s, d] / 1e3
        trials = [{"bytes": int(b), "idle_s": float(t), "rep": r} for t in idles_s for b in sizes for r in range(reps)]
        primer = int(max(PRIMER_MIN_BYTES, 2 * bdp))
        stall_s = STALL_MIN_S + STALL_FACTOR * max([primer, *sizes]) * 8 / goodput[s, d]
        specs.append({"src": s, "dst": d, "trials": trials, "primer_bytes": primer, "stall_s": round(stall_s, 3)})
    meas, res = run_probe(topo, {"messages": specs, "retries": retries}, "transfer curves", kernel=kernel, timeout_s=timeout_s,
                          stream=stream)
    rows = []
    for m in meas:
        s, d = m["src"], m["dst"]
        if "error" in m:
            raise HarnessError(f"transfer curves: pair {s}->{d}: {m['error']}")
        lk = rate[(s, d)]
        for t in m["trials"]:
            ideal = lk.delay_us / 1e6 + t["bytes"] / (goodput[s, d] / 8)
            rows.append({"src": s, "dst": d, "rate_mbps": lk.rate_bps / 1e6, "delay_ms": lk.delay_us / 1e3,
                         "rtt_ms": float(rtt_t[s, d]), "burst_bytes": lk.burst_bytes, "limit_packets": lk.limit_packets,
                         **{k: t[k] for k in ("bytes", "idle_s", "rep", "idle_measured_s", "seconds")},
                         "ideal_seconds": ideal})
    readback = {k: v.get("transport", {}) for k, v in res.readback.items()}
    return CurveReport(topo.name, float(topo.bandwidth_scale), res.kernel, plan.mtu, plan.transport, readback, rows)
