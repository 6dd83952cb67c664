"""`harness sim compare` for FL records: each measured round against the flow simulation of the same round.

The simulation runs on the record's scenario kept to its workers, its alpha, model and batch, at
the run's scales (emulated_federation: the network the emulated cluster shaped, its TCP payload
share, the compute the processes were held to), and plans the strategy as the run did; nothing is calibrated. Error =
simulated / measured - 1, for the round and for the distribution, beside the bytes the
simulator plans and those the run counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import HarnessError
from ...workloads.fl import strategies as st
from ...workloads.fl.federation import federation, load_topology
from ...workloads.fl.flows import traffic
from ...workloads.fl.models import get_branchy
from ...workloads.fl.records import FLRecord
from .emulated import emulated_federation

TARGET_ERROR = 0.15


@dataclass(frozen=True)
class FLComparison:
    record: FLRecord
    simulated: st.Round
    planned_rack_bytes: float

    @property
    def error(self) -> float:
        return self.simulated.seconds / self.record.seconds - 1

    @property
    def measured_what(self) -> str:
        """What the measured round measured: the network, the host (host-bound), or not known."""
        if self.record.host_bound:
            return "host"
        return "network" if self.record.cpu_busy is not None else "unknown"

    @property
    def distribution_error(self) -> float:
        return self.simulated.distribution_seconds / self.record.distribution_seconds - 1


def compare_fl(records: list[FLRecord]) -> list[FLComparison]:
    """A comparison per measured (emu) record."""
    measured = [r for r in records if r.backend == "emu"]
    if not measured:
        raise HarnessError("no measured FL records (backend emu) to compare; run `harness fl --backend emu` first")
    out, topos = [], {}
    for r in measured:
        key = (r.scenario, r.workers)
        if key not in topos:
            topos[key] = load_topology(r.scenario, r.workers)
        own = federation(topos[key])  # at the scenario's alpha (a geo-distributed one has no other)
        at = own if abs(r.alpha - own.alpha) <= 1e-6 else federation(topos[key], r.alpha)  # records keep 6 digits
        fed = emulated_federation(at, r.bandwidth_scale, r.compute_time_scale)
        sim = st.run(r.strategy, get_branchy(r.model), fed, r.batch)
        out.append(FLComparison(r, sim, sum(traffic(fed, sim.transfers)[1])))
    return out


def format_table(rows: list[FLComparison]) -> str:
    lines = [f"{'scenario':<12} {'alpha':>5} {'strategy':<8} {'measured s':>10} {'sim s':>8} {'error':>7} "
             f"{'distrib. s':>10} {'sim':>7} {'error':>7} {'server MB':>9} {'planned':>8} {'racks MB':>8} "
             f"{'planned':>8} {'cpu':>5} {'measured':>8}"]
    for c in rows:
        r, s = c.record, c.simulated
        lines.append(f"{r.scenario:<12} {r.alpha:>5g} {r.strategy:<8} {r.seconds:>10.3f} {s.seconds:>8.3f} "
                     f"{c.error:>+7.1%} {r.distribution_seconds:>10.3f} {s.distribution_seconds:>7.3f} "
                     f"{c.distribution_error:>+7.1%} {r.server_bytes / 1e6:>9.3f} {s.server_bytes / 1e6:>8.3f} "
                     f"{sum(r.rack_bytes) / 1e6:>8.3f} {c.planned_rack_bytes / 1e6:>8.3f} "
                     f"{'-' if r.cpu_busy is None else f'{r.cpu_busy:.2f}':>5} {c.measured_what:>8}")
    worst = max(abs(c.error) for c in rows)
    lines.append(f"largest round error {worst:.1%} (target {TARGET_ERROR:.0%})")
    bound = [c for c in rows if c.record.host_bound]
    if bound:
        lines.append(f"measured host: {len(bound)} round(s) were host-bound (the emulated CPU busy for most of them, "
                     "their layers late; cpu: its busy share): their times are the host's, not the links'; leave "
                     "--compute-time-scale unset for a chosen time dilation")
    return "\n".join(lines)
