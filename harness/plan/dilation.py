"""Time dilation of an emulated run: chosen so that the emulated CPU never bounds an iteration, and what to change
when a run measured the host instead of the links.

The emulated cluster runs every rank on one virtual CPU. Its figures are network figures only while that CPU has
headroom (network/headroom.py): a phase the CPU bounds takes the host's time, not the device's or the link's.
Dilation by k (DieCast, NSDI'08; time-warped emulation, NSDI'06) runs every compute phase k times longer
(--compute-time-scale k, with the compute model) and every link k times slower (--bandwidth-scale s/k, s the
run's own scale of the scenario's links): the same
host work spreads over k times the wall clock, so its share of the CPU falls by about k. Delays stay real (netem
holds them without CPU), so the run is the scenario with its delays k times shorter relative to the rest; the
simulator replays it at the same scales (sim compare), and the records say which scales ran.

Choosing k: a probe runs each request once undilated (one warm-up, one timed iteration) and measures the CPU
seconds c its iteration cost the host (the cluster's busy share x its seconds); the compute model and the network
model give the iteration's seconds T(k) at dilation k (the system's simulator model, as `sim compare` uses it), and
k is the smallest (two significant digits) with c / T(k) <= TARGET_BUSY, taken over every request of the command:
the host's own work then fits in the dilated iteration several times over, and the compute phases in their
dilated times. The model is of the iteration the probe timed: a system whose iterations differ over a run
(registry run_length) is modelled at the probe's length, so DiLoCo's is an inner step, not its average over a cycle
of H with the sync's share in it (that average chose 5900 for a run whose inner steps then were host-bound in 129
of 210). What an iteration costs the CPU is not constant under dilation (slower links wake the ranks'
transport threads for fewer bytes at a time: measured with 8 Horovod ranks, 1.8, 8.4 and 13 CPU s at k = 1, 4500
and 15000, network/headroom.py), so a dilated run's CPU is busier than c / T(k) says; what makes an iteration
host-bound is the CPU delaying its work (headroom.host_bound), which each run measures and says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import systems as registry
from ..compute import BYTES_PER_VALUE
from ..netmodel.tcp import UML_HZ
from .request import RunRequest, RunSpec

#: The undilated CPU seconds of an iteration over its dilated modelled seconds that a chosen dilation aims at
TARGET_BUSY = 0.15
#: The timeout of a dilated run: its expected time this many times over, plus start-up
TIMEOUT_FACTOR = 3.0
STARTUP_S = 120.0


@dataclass(frozen=True)
class Probe:
    """What one request's undilated probe measured: its timed iteration's seconds and the emulated CPU's busy
    share then (network/headroom.py), on which kernel."""

    label: str
    seconds: float
    busy: float
    kernel: str

    @property
    def cpu_s(self) -> float:
        return self.seconds * self.busy


@dataclass(frozen=True)
class Dilation:
    """The dilation chosen for a command's runs and why."""

    factor: float
    probes: tuple[Probe, ...]
    expected_s: tuple[float, ...]  # each request's modelled iteration seconds at `factor`
    base_bandwidth_scale: float = 1.0  # the requests' own --bandwidth-scale, which the factor divides
    unit: str = "iteration"  # what a probe timed: an iteration, or an FL round

    @property
    def bandwidth_scale(self) -> float:
        """The links' scale the dilated runs have: their own divided by the factor."""
        return self.base_bandwidth_scale / self.factor

    def to_json(self) -> dict:
        return {"chosen": True, "factor": self.factor, "compute_time_scale": self.factor,
                "bandwidth_scale": self.bandwidth_scale, "target_busy": TARGET_BUSY,
                "unit": self.unit, "probes": [{"run": p.label, "seconds": p.seconds, "busy": p.busy, "cpu_s": p.cpu_s} for p in self.probes],
                "undilated_cpu_over_dilated_s": [p.cpu_s / t for p, t in zip(self.probes, self.expected_s)],
                "expected_s": list(self.expected_s)}

    def line(self) -> str:
        k = self.factor
        worst = max(range(len(self.probes)), key=lambda i: self.probes[i].cpu_s / self.expected_s[i])
        p = self.probes[worst]
        return (f"time dilation {k:g} (--compute-time-scale {k:g} --bandwidth-scale {self.bandwidth_scale:.3g}): "
                f"undilated, {'an' if self.unit[0] in 'aeiou' else 'a'} "
                f"{self.unit} cost this host {p.cpu_s:.3g} CPU s ({p.label}, {p.seconds:.3g} s, {p.busy:.0%} busy); "
                f"dilated, it is modelled at {self.expected_s[worst]:.3g} s, {p.cpu_s / self.expected_s[worst]:.0%} "
                f"of which that work would take (each run's headroom is measured and said)")


def modelled_seconds(spec: RunSpec, topo, factor: float, kernel: str = "uml") -> float:
    """The iteration's seconds as the compute model and the network model give them with compute `factor` times
    longer and every link `factor` times slower than `topo` (the run's scaled topology)."""
    from ..netmodel.links import Links
    from ..netmodel.tcp import tcp_efficiency

    protocol = "gloo" if spec.run.device_type == "cpu" else "nccl"
    # an emulated link's TCP payload moves at its shaped rate times the payload share, as sim compare models it
    links = Links.from_topology(topo.scaled(tcp_efficiency() / factor), protocol, "per-pair")
    if kernel == "uml":  # its retransmission timeouts are in 10 ms ticks, as sim compare models its runs
        links = replace(links, hz=UML_HZ)
    profiles = [replace(p, slowdown=p.slowdown * factor * spec.compute.time_scale) for p in spec.compute.devices]
    bpv = BYTES_PER_VALUE[spec.model.dtype]
    entry = registry.get(spec.run.system)
    run = {"iterations": (spec.run.warmup, spec.run.iters)} if entry.run_length else {}  # as sim compare does
    model = entry.simulate_layout_fn(spec.run.options)
    return float(model(links, profiles, spec.model.simulated, spec.model.batch, spec.layout, spec.model.micro_batch,
                       bpv, **run)[0])


def round_up(x: float) -> float:
    """x rounded up to two significant digits (a factor a person can type again)."""
    if x <= 1:
        return 1.0
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step - 1e-9) * step


def smallest_factor(ok) -> float:
    """The smallest factor (two significant digits, at least 1) for which ok(factor) holds, ok growing with the
    factor: doubling to a factor that reaches it, then bisecting between it and the last that did not."""
    lo, hi = 1.0, 1.0
    while not ok(hi) and hi < 1e9:
        lo, hi = hi, hi * 2
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return round_up(hi)


def choose(specs_topos: list[tuple[RunSpec, object]], probes: list[Probe]) -> Dilation:
    """The smallest factor (two significant digits) at which every probe's CPU seconds are at most TARGET_BUSY of
    its modelled iteration."""
    need = max(smallest_factor(lambda k, spec=spec, topo=topo, p=p:
                               p.cpu_s <= TARGET_BUSY * modelled_seconds(spec, topo, k, p.kernel))
               for (spec, topo), p in zip(specs_topos, probes))
    expected = tuple(modelled_seconds(spec, topo, need, p.kernel) for (spec, topo), p in zip(specs_topos, probes))
    return Dilation(need, tuple(probes), expected, specs_topos[0][0].network.bandwidth_scale)


def dilated(req: RunRequest, d: Dilation, expected_s: float) -> RunRequest:
    """`req` at dilation d: compute d.factor times longer, links d.factor times slower; its timeout, when the user
    gave none, from the expected time of its iterations (a dilated run's minutes are not a constant's)."""
    run = req.run
    if run.timeout_auto:
        iterations = run.warmup + run.iters
        run = replace(run, timeout_s=STARTUP_S + TIMEOUT_FACTOR * iterations * expected_s / (1 - TARGET_BUSY))
    return replace(req, compute=replace(req.compute, time_scale=d.factor, dilate=False),
                   network=replace(req.network, bandwidth_scale=d.bandwidth_scale), run=run)


def advice(spec: RunSpec, host_bound: int, iterations: int) -> str:
    """One line for a run of which `host_bound` of `iterations` timed iterations were host-bound: what it
    measured, and the flag to change."""
    what = (f"host-bound: the emulated cluster's CPU was busy for most of {host_bound} of {iterations} timed "
            f"iterations and delayed their work, so their times measure the host, not the links; ")
    scale, bw = spec.compute.time_scale, spec.network.bandwidth_scale
    if not spec.compute.model:
        return what + ("add --compute-model (each phase takes its device's time, dilated as this host needs); "
                       "without it the ranks compute for real on the emulated cluster's one CPU")
    return what + further(scale, bw)


def further(scale: float, bandwidth_scale: float) -> str:
    """What to change for a host-bound run at these scales: a chosen dilation, or ten times more."""
    return (f"leave --compute-time-scale unset for a chosen time dilation, or dilate further: --compute-time-scale "
            f"{scale * 10:g} --bandwidth-scale {bandwidth_scale / 10:.3g} (now {scale:g} and {bandwidth_scale:g})")


__all__ = ["Dilation", "Probe", "TARGET_BUSY", "advice", "choose", "dilated", "further", "modelled_seconds",
           "round_up", "smallest_factor"]
