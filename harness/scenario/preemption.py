"""Devices that leave and come back during a run: a timeline's device events and its spot market, as data.

A device event (an entry of a timeline's `events:` with `preempt:` or `return:` instead of a link) takes a
device away at a time (`at_s`) or an iteration (`at_iteration`), as a cloud reclaims a spot instance: its
processes are killed and its links cut. `notice_s` is the warning a cloud gives before (AWS: 120 s, GCP: 30 s):
the run may know of it that long before. `return:` brings the device back (a new process on it, its links as
they are). Device ids are the run's (0 .. devices - 1, after `--devices`).

A spot market (`spot:` in the timeline, or `--preempt-rate`) draws preemptions: every device of a region is
reclaimed at `rate_per_hour` (a Poisson process per device), stays away for an exponential time of mean
`down_s`, comes back, and so on; seeded (`seed`), each device from its own stream, so one device's draws do not
depend on how many others there are. `device_events` merges the explicit events and the draws in time order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .topology import ScenarioError

DEVICE_KINDS = ("preempt", "return")
_DEVICE_KEYS = {"at_s", "at_iteration", "preempt", "return", "notice_s"}
_SPOT_KEYS = {"rate_per_hour", "down_s", "notice_s", "seed"}
#: mean seconds a drawn preemption lasts when the market does not say
DEFAULT_DOWN_S = 600.0
#: torchrun's c10d rendezvous (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py), which the baselines
#: recover with (the emulated elastic agent and the simulator both): a keep-alive every KEEPALIVE_S, a node gone
#: after KEEPALIVE_MISSED missed; below the most nodes, the rendezvous closes after LAST_CALL_S
KEEPALIVE_S, KEEPALIVE_MISSED, LAST_CALL_S = 5.0, 3, 30.0
#: ours' failure detector (a system that re-plans): a heartbeat every HEARTBEAT_S, a device gone after
#: KEEPALIVE_MISSED missed
HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class DeviceEvent:
    """Device `device` leaves (preempt) or comes back (return) at `at_s` or at iteration `at_iteration`."""

    where: str  # file and field (or the spot market's draw), for messages
    kind: str  # preempt | return
    device: int
    at_s: float | None = None
    at_iteration: int | None = None
    notice_s: float = 0.0  # preempt: the warning before it

    def describe(self) -> str:
        when = f"t={self.at_s:g} s" if self.at_s is not None else f"iteration {self.at_iteration}"
        notice = f" ({self.notice_s:g} s notice)" if self.kind == "preempt" and self.notice_s else ""
        return f"{when}: device {self.device} {'preempted' if self.kind == 'preempt' else 'returns'}{notice}"


@dataclass(frozen=True)
class SpotMarket:
    """Preemptions drawn per device: `rates` (region or entry name, or *, and preemptions per device-hour; the
    first that names a device's region applies), each lasting an exponential time of mean `down_s`."""

    where: str
    rates: tuple[tuple[str, float], ...]
    down_s: float = DEFAULT_DOWN_S
    notice_s: float = 0.0
    seed: int = 0

    def rate_of(self, region_name: str, group: str | None) -> float:
        for name, rate in self.rates:
            if name in (region_name, group, "*"):
                return rate
        return 0.0

    def draws(self, topo, horizon_s: float) -> list[DeviceEvent]:
        """Every device's preemptions and returns before `horizon_s`, in time order."""
        out = []
        for d in range(topo.n):
            region = topo.regions[topo.device_region[d]]
            rate = self.rate_of(region.name, region.group) / 3600.0
            if rate <= 0:
                continue
            rng, t = np.random.default_rng([self.seed, d]), 0.0
            while True:
                t += rng.exponential(1.0 / rate)
                if t >= horizon_s:
                    break
                where = f"{self.where}: draw of device {d}"
                out.append(DeviceEvent(where, "preempt", d, at_s=round(t, 3), notice_s=self.notice_s))
                t += rng.exponential(self.down_s)
                if t >= horizon_s:
                    break
                out.append(DeviceEvent(where, "return", d, at_s=round(t, 3)))
        return sorted(out, key=lambda e: (e.at_s, e.device))

    def to_json(self) -> dict:
        return {"rates": dict(self.rates), "down_s": self.down_s, "notice_s": self.notice_s, "seed": self.seed}


def device_events(timeline, topo, horizon_s: float = math.inf) -> tuple[list[DeviceEvent], list[DeviceEvent]]:
    """(time events before `horizon_s` in time order, the explicit and the spot market's; iteration events in
    iteration order) of `timeline` on `topo`, checked: every device in the run, a preempted device not
    preempted again before it returns, only a preempted one returns (one line naming the event)."""
    if timeline is None:
        return [], []
    timed = sorted((e for e in timeline.devices if e.at_s is not None and e.at_s < horizon_s), key=lambda e: e.at_s)
    if timeline.spot is not None:
        if not math.isfinite(horizon_s):
            raise ScenarioError(f"{timeline.spot.where}: a spot market draws up to a horizon (give one)")
        timed = sorted(timed + timeline.spot.draws(topo, horizon_s), key=lambda e: e.at_s)
    by_iteration = sorted((e for e in timeline.devices if e.at_iteration is not None), key=lambda e: e.at_iteration)
    for events in (timed, by_iteration):
        down: set[int] = set()
        for e in events:
            if not 0 <= e.device < topo.n:
                raise ScenarioError(f"{e.where}.{e.kind}: device {e.device} is not in the run (devices 0..{topo.n - 1})")
            if e.kind == "preempt" and e.device in down:
                raise ScenarioError(f"{e.where}.preempt: device {e.device} is already preempted (no return before)")
            if e.kind == "return" and e.device not in down:
                raise ScenarioError(f"{e.where}.return: device {e.device} was not preempted before")
            (down.add if e.kind == "preempt" else down.discard)(e.device)
    return timed, by_iteration


# ------------------------------------------------------------------------------------------------ parsing
def fail(where: str, problem: str, value=None):
    """A timeline's mistake, one line: where (file and field), what, what was given."""
    got = "" if value is None else f" (got {value!r})"
    raise ScenarioError(f"{where}: {problem}{got}")


def check_mapping(d, where: str, allowed: set[str], shape: str) -> None:
    """`d` is a mapping of `allowed` keys only (`shape` says what it should look like)."""
    if not isinstance(d, dict):
        fail(where, f"must be a mapping ({shape})", d)
    unknown = sorted(set(d) - allowed)
    if unknown:
        fail(f"{where}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _non_negative(where: str, value, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(where, "must be a finite number", value)
    if value < 0 or (positive and value == 0):
        fail(where, "must be > 0" if positive else "must be >= 0", value)
    return float(value)


def _integer(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(where, "must be an integer >= 0", value)
    return value


def is_device_event(d) -> bool:
    return isinstance(d, dict) and bool(set(d) & set(DEVICE_KINDS))


def parse_device_event(d: dict, where: str) -> DeviceEvent:
    unknown = sorted(set(d) - _DEVICE_KEYS)
    if unknown:
        fail(f"{where}.{unknown[0]}", f"not a key of a device event (allowed: {', '.join(sorted(_DEVICE_KEYS))})")
    kinds = [k for k in DEVICE_KINDS if k in d]
    if len(kinds) > 1:
        fail(where, "give preempt or return, not both")
    kind = kinds[0]
    if ("at_s" in d) == ("at_iteration" in d):
        fail(where, "needs exactly one of at_s, at_iteration")
    if "notice_s" in d and kind != "preempt":
        fail(f"{where}.notice_s", "only a preempt has a notice")
    return DeviceEvent(where, kind, _integer(f"{where}.{kind}", d[kind]),
                       at_s=None if "at_s" not in d else _non_negative(f"{where}.at_s", d["at_s"]),
                       at_iteration=None if "at_iteration" not in d else _integer(f"{where}.at_iteration",
                                                                                    d["at_iteration"]),
                       notice_s=_non_negative(f"{where}.notice_s", d.get("notice_s", 0.0)))


def parse_rates(text, where: str, known: set[str]) -> tuple[tuple[str, float], ...]:
    """`R` (every region) or `region=R,...` (a mapping in YAML): preemptions per device-hour."""
    if isinstance(text, dict):
        items = list(text.items())
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        items = [("*", text)]
    elif isinstance(text, str) and text.strip():
        items = []
        for part in text.split(","):
            name, _, value = part.rpartition("=")
            try:
                items.append((name.strip() or "*", float(value)))
            except ValueError:
                fail(where, "must be R or region=R,... (preemptions per device-hour)", text)
    else:
        fail(where, "must be R or region=R,... (preemptions per device-hour)", text)
    out = []
    for name, rate in items:
        if name != "*" and name not in known:
            fail(where, f"unknown region {name!r} (regions: {', '.join(sorted(known))})")
        out.append((str(name), _non_negative(f"{where}: {name}", rate)))
    return tuple(out)


def parse_spot(d, where: str, known: set[str]) -> SpotMarket:
    check_mapping(d, where, _SPOT_KEYS, "rate_per_hour:, down_s:, notice_s:, seed:")
    if "rate_per_hour" not in d:
        fail(f"{where}.rate_per_hour", "missing (preemptions per device-hour: R, or {region: R, ...})")
    return SpotMarket(where, parse_rates(d["rate_per_hour"], f"{where}.rate_per_hour", known),
                      down_s=_non_negative(f"{where}.down_s", d.get("down_s", DEFAULT_DOWN_S), positive=True),
                      notice_s=_non_negative(f"{where}.notice_s", d.get("notice_s", 0.0)),
                      seed=_integer(f"{where}.seed", d.get("seed", 0)))
