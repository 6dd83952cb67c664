"""Links that change during a run: a scenario's `timeline:` (or `--timeline FILE`), as frozen data.

A timeline is a list of events, each at a time (`at_s`, seconds since training starts) or at an iteration
(`at_iteration`, 0-based, warm-up included), that changes the link from one region to another (and back,
unless `one_way`): its delay, rate (absolute `bandwidth_gbps` in the scenario's units, or
`bandwidth_factor` of the scenario's link), jitter or loss, cuts it (`down: true`), brings it back
(`down: false`) or puts it back as the scenario has it (`restore: true`). A region may be named by its
entry's name when the entry has `count` (every region of it), and `*` names every region. A trace (CSV: time_s, from, to, rate_gbps,
delay_ms; an empty cell keeps the value) is replayed as time events, and at its end holds its last values
or wraps around (`at_end: hold | wrap`; the period is the last row's time plus the last interval, or
`period_s`).

Everything that follows a timeline reads it the same way: `LinkState` holds every region pair's link as it
is now and applies changes, `Timeline.cursor()` hands out the changes due at a time or an iteration, in
order. The emulated cluster applies them live (network/timeline_control.py), the simulator predicts each
iteration from them (sim/timeline.py: `predict_iterations`).
"""
from __future__ import annotations

import csv
import heapq
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import HarnessError
from ..files import read_text
from .preemption import (DeviceEvent, SpotMarket, check_mapping, fail, is_device_event, parse_device_event,
                         parse_spot)
from .topology import ScenarioError

_EVENT_KEYS = {"at_s", "at_iteration", "from", "to", "one_way", "delay_ms", "bandwidth_gbps",
               "bandwidth_factor", "jitter_ms", "loss_pct", "down", "restore"}
_CHANGE_KEYS = ("delay_ms", "bandwidth_gbps", "bandwidth_factor", "jitter_ms", "loss_pct", "down", "restore")
_TIMELINE_KEYS = {"events", "trace", "spot"}
_TRACE_KEYS = {"file", "at_end", "period_s", "one_way"}
TRACE_COLUMNS = ("time_s", "from", "to", "rate_gbps", "delay_ms")
AT_END = ("hold", "wrap")
#: names every region in an event's from or to
ANY_REGION = "*"
#: the simulator's rate of a cut link: transfers over it make no progress until it is back
DOWN_GBPS = 1e-12


@dataclass(frozen=True)
class LinkChange:
    """One event: from `at_s` (or iteration `at_iteration`) on, the link src -> dst (and dst -> src unless
    one_way) takes the values given; None leaves a value as it is."""

    where: str  # file and field, for messages ("t.yaml: timeline.events[2]")
    src: str
    dst: str
    at_s: float | None = None
    at_iteration: int | None = None
    one_way: bool = False
    delay_ms: float | None = None
    bandwidth_gbps: float | None = None  # scenario units: multiplied by the run's bandwidth_scale
    bandwidth_factor: float | None = None  # of the scenario's link
    jitter_ms: float | None = None
    loss_pct: float | None = None
    down: bool | None = None
    restore: bool = False

    def describe(self) -> str:
        when = f"t={self.at_s:g} s" if self.at_s is not None else f"iteration {self.at_iteration}"
        arrow = "->" if self.one_way else "<->"
        what = ", ".join(f"{k}={getattr(self, k)}" for k in _CHANGE_KEYS
                         if getattr(self, k) is not None and not (k == "restore" and not self.restore))
        return f"{when}: {self.src} {arrow} {self.dst}: {what or 'no change'}"


@dataclass(frozen=True)
class Trace:
    where: str
    rows: tuple[LinkChange, ...]  # at_s relative to the trace's start, in time order
    at_end: str = "hold"
    period_s: float = 0.0

    def changes(self) -> Iterator[LinkChange]:
        """The rows in time order, once (hold) or repeated every period_s for ever (wrap)."""
        lap = 0
        while True:
            for row in self.rows:
                yield replace(row, at_s=row.at_s + lap * self.period_s)
            if self.at_end != "wrap":
                return
            lap += 1


@dataclass(frozen=True)
class Timeline:
    source: str
    events: tuple[LinkChange, ...] = ()
    trace: Trace | None = None
    devices: tuple[DeviceEvent, ...] = ()  # devices that leave and come back (preemption.py)
    spot: SpotMarket | None = None

    def cursor(self) -> "Cursor":
        return Cursor(self)

    @property
    def has_iteration_events(self) -> bool:
        return any(c.at_iteration is not None for c in self.events)

    def region_names(self) -> set[str]:
        rows = self.trace.rows if self.trace else ()
        return {n for c in (*self.events, *rows) for n in (c.src, c.dst)}

    def to_json(self) -> dict:
        return {"source": self.source, "events": [c.describe() for c in self.events],
                "trace": None if self.trace is None else
                {"where": self.trace.where, "rows": len(self.trace.rows), "at_end": self.trace.at_end,
                 "period_s": self.trace.period_s},
                **({"devices": [e.describe() for e in self.devices]} if self.devices else {}),
                **({"spot": self.spot.to_json()} if self.spot else {})}


class Cursor:
    """Walks a timeline: `due(t, iteration)` gives the changes whose time is <= t or whose iteration is
    <= iteration and that were not given before, in order (time events, then iteration events)."""

    def __init__(self, timeline: Timeline):
        timed = sorted((c for c in timeline.events if c.at_s is not None), key=lambda c: c.at_s)
        streams = [iter(timed)] + ([timeline.trace.changes()] if timeline.trace else [])
        self._timed = heapq.merge(*streams, key=lambda c: c.at_s)
        self._next = next(self._timed, None)
        self._by_iteration = sorted((c for c in timeline.events if c.at_iteration is not None),
                                    key=lambda c: c.at_iteration)

    def next_at_s(self) -> float | None:
        """The time of the next time event (None: no more)."""
        return None if self._next is None else self._next.at_s

    def due(self, t_s: float, iteration: int | None = None) -> list[LinkChange]:
        out = []
        while self._next is not None and self._next.at_s <= t_s:
            out.append(self._next)
            self._next = next(self._timed, None)
        while iteration is not None and self._by_iteration and self._by_iteration[0].at_iteration <= iteration:
            out.append(self._by_iteration.pop(0))
        return out


@dataclass
class LinkState:
    """Every region pair's link as it is now (R x R, the diagonal a region's own link): delay, rate (scaled:
    the run's Gbps), jitter, loss and whether it is cut; `base_*` the scenario's, for `restore` and
    `bandwidth_factor`."""

    delay_ms: np.ndarray
    bandwidth_gbps: np.ndarray
    jitter_ms: np.ndarray
    loss_pct: np.ndarray
    down: np.ndarray
    base: tuple = field(repr=False, default=())
    names: tuple[tuple[str, str], ...] = ()  # (region name, its entry's name) per region
    bandwidth_scale: float = 1.0

    @classmethod
    def initial(cls, topo, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> "LinkState":
        links = topo.region_links
        if links is None:
            raise ScenarioError(f"{topo.source}: timeline: changes links by region, and this topology holds "
                                "device-level links")
        R = len(topo.regions)
        arrays = (links[0].astype(float), links[1].astype(float), np.full((R, R), float(jitter_ms)),
                  np.full((R, R), float(loss_pct)), np.zeros((R, R), dtype=bool))
        return cls(*(a.copy() for a in arrays), base=arrays,
                   names=tuple((r.name, r.group or r.name) for r in topo.regions),
                   bandwidth_scale=float(topo.bandwidth_scale))

    def regions(self, name: str) -> list[int]:
        """The regions `name` names: one, every region of an entry with `count`, or every region (*)."""
        return [k for k, (nm, group) in enumerate(self.names) if name in (nm, group, ANY_REGION)]

    def apply(self, change: LinkChange) -> list[tuple[int, int]]:
        """Apply one change; the (src, dst) region pairs it touched (none when its regions are not in this
        topology, e.g. one cut down to fewer devices)."""
        pairs = [(r, s) for r in self.regions(change.src) for s in self.regions(change.dst)]
        if not change.one_way:
            pairs += [(s, r) for r, s in pairs if (s, r) not in pairs]
        base_delay, base_bw, base_jitter, base_loss, _ = self.base
        for p in pairs:
            if change.restore:
                self.delay_ms[p], self.bandwidth_gbps[p] = base_delay[p], base_bw[p]
                self.jitter_ms[p], self.loss_pct[p], self.down[p] = base_jitter[p], base_loss[p], False
                continue
            if change.delay_ms is not None:
                self.delay_ms[p] = change.delay_ms
            if change.bandwidth_gbps is not None:
                self.bandwidth_gbps[p] = change.bandwidth_gbps * self.bandwidth_scale
            if change.bandwidth_factor is not None:
                self.bandwidth_gbps[p] = base_bw[p] * change.bandwidth_factor
            if change.jitter_ms is not None:
                self.jitter_ms[p] = change.jitter_ms
            if change.loss_pct is not None:
                self.loss_pct[p] = change.loss_pct
            if change.down is not None:
                self.down[p] = change.down
        return pairs

    def key(self) -> bytes:
        return b"".join(a.tobytes() for a in (self.delay_ms, self.bandwidth_gbps, self.jitter_ms, self.loss_pct,
                                               self.down))

    def topology(self, topo):
        """`topo` with the links as they are now; a cut link at DOWN_GBPS (jitter and loss are not in a
        Topology: the simulator does not model them)."""
        bw = np.where(self.down, DOWN_GBPS, self.bandwidth_gbps)
        return replace(topo, region_delay_ms=self.delay_ms.copy(), region_bandwidth_gbps=bw)


# ------------------------------------------------------------------------------------------------ parsing
def _number(where: str, value, *, low: float = 0.0, positive: bool = False, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(where, "must be a finite number", value)
    if value < low or (positive and value <= 0) or (high is not None and value > high):
        bound = "> 0" if positive else f">= {low:g}" + ("" if high is None else f" and <= {high:g}")
        fail(where, f"must be {bound}", value)
    return float(value)


def _region(where: str, value, known: set[str]) -> str:
    if not isinstance(value, str) or (value not in known and value != ANY_REGION):
        fail(where, f"unknown region (regions: {', '.join(sorted(known))})", value)
    return value


def region_names(regions) -> set[str]:
    """What an event may name: every region, and every entry that made several (`count`)."""
    return {r.name for r in regions} | {r.group for r in regions if r.group}


def parse_event(d, where: str, known: set[str]) -> LinkChange:
    check_mapping(d, where, _EVENT_KEYS, "an event: at_s or at_iteration, from, to and what changes")
    if ("at_s" in d) == ("at_iteration" in d):
        fail(where, "needs exactly one of at_s, at_iteration")
    at_s = _number(f"{where}.at_s", d["at_s"]) if "at_s" in d else None
    at_it = d.get("at_iteration")
    if "at_iteration" in d and (isinstance(at_it, bool) or not isinstance(at_it, int) or at_it < 0):
        fail(f"{where}.at_iteration", "must be an integer >= 0", at_it)
    for k in ("from", "to"):
        if k not in d:
            fail(f"{where}.{k}", "missing")
    changes = [k for k in _CHANGE_KEYS if k in d]
    if not changes:
        fail(where, f"changes nothing (give one of {', '.join(_CHANGE_KEYS)})")
    for alone in ("restore", "down"):
        if alone in d and len(changes) > 1:
            fail(f"{where}.{alone}", f"goes alone (got also {', '.join(k for k in changes if k != alone)})")
    if "bandwidth_gbps" in d and "bandwidth_factor" in d:
        fail(where, "give bandwidth_gbps or bandwidth_factor, not both")
    for k in ("one_way", "down", "restore"):
        if k in d and not isinstance(d[k], bool):
            fail(f"{where}.{k}", "must be true or false", d[k])
    if d.get("restore") is False:
        fail(f"{where}.restore", "only restore: true means anything")
    num = lambda k, **kw: None if k not in d else _number(f"{where}.{k}", d[k], **kw)  # noqa: E731
    return LinkChange(
        where=where, src=_region(f"{where}.from", d["from"], known), dst=_region(f"{where}.to", d["to"], known),
        at_s=at_s, at_iteration=at_it, one_way=bool(d.get("one_way", False)),
        delay_ms=num("delay_ms"), bandwidth_gbps=num("bandwidth_gbps", positive=True),
        bandwidth_factor=num("bandwidth_factor", positive=True), jitter_ms=num("jitter_ms"),
        loss_pct=num("loss_pct", high=100.0), down=d.get("down"), restore=bool(d.get("restore", False)))


def parse_trace_csv(text: str, where: str, known: set[str], one_way: bool) -> tuple[LinkChange, ...]:
    """The rows of a trace CSV (header TRACE_COLUMNS) as time events; times must not go back."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != list(TRACE_COLUMNS):
        fail(f"{where}: line 1", f"header must be {','.join(TRACE_COLUMNS)}", ",".join(header or []))
    rows, last = [], 0.0
    for line, cells in enumerate(reader, start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        at = f"{where}: line {line}"
        if len(cells) != len(TRACE_COLUMNS):
            fail(at, f"needs {len(TRACE_COLUMNS)} cells ({','.join(TRACE_COLUMNS)})", ",".join(cells))
        t, src, dst, rate, delay = (c.strip() for c in cells)
        values = {}
        for name, cell in (("time_s", t), ("rate_gbps", rate), ("delay_ms", delay)):
            if not cell and name != "time_s":
                continue
            try:
                values[name] = float(cell)
            except ValueError:
                fail(f"{at}: {name}", "must be a number", cell)
        t_s = _number(f"{at}: time_s", values["time_s"])
        if t_s < last:
            fail(f"{at}: time_s", f"goes back in time (after {last:g})", t_s)
        last = t_s
        if "rate_gbps" not in values and "delay_ms" not in values:
            fail(at, "changes nothing (rate_gbps and delay_ms both empty)")
        rows.append(LinkChange(
            where=at, src=_region(f"{at}: from", src, known), dst=_region(f"{at}: to", dst, known), at_s=t_s,
            one_way=one_way,
            bandwidth_gbps=None if "rate_gbps" not in values else _number(f"{at}: rate_gbps", values["rate_gbps"],
                                                                          positive=True),
            delay_ms=None if "delay_ms" not in values else _number(f"{at}: delay_ms", values["delay_ms"])))
    if not rows:
        fail(where, "no rows")
    return tuple(rows)


def parse_timeline(doc, path, known: set[str]) -> Timeline:
    """The `timeline:` mapping of the file at `path` ({events: [...], trace: {file, at_end, period_s, one_way},
    spot: {...}}; an event with preempt: or return: is a device's (preemption.py));
    a trace's file is read relative to that file's directory."""
    path = Path(path)
    where = f"{path}: timeline"
    check_mapping(doc, where, _TIMELINE_KEYS, "events:, trace: and/or spot:")
    if not doc:
        fail(where, "empty (give events:, trace: and/or spot:)")
    events = doc.get("events", [])
    if not isinstance(events, list):
        fail(f"{where}.events", "must be a list", events)
    links = tuple(parse_event(e, f"{where}.events[{k}]", known) for k, e in enumerate(events)
                  if not is_device_event(e))
    devices = tuple(parse_device_event(e, f"{where}.events[{k}]") for k, e in enumerate(events) if is_device_event(e))
    trace = None
    if "trace" in doc:
        trace = parse_trace_entry(doc["trace"], f"{where}.trace", path.parent, known)
    spot = None if "spot" not in doc else parse_spot(doc["spot"], f"{where}.spot", known)
    return Timeline(source=str(path), events=links, trace=trace, devices=devices, spot=spot)


def parse_trace_entry(d, where: str, base_dir: Path, known: set[str]) -> Trace:
    check_mapping(d, where, _TRACE_KEYS, "file:, at_end:")
    if "file" not in d or not isinstance(d["file"], str) or not d["file"]:
        fail(f"{where}.file", "missing (the trace's CSV file)", d.get("file"))
    at_end = d.get("at_end", "hold")
    if at_end not in AT_END:
        fail(f"{where}.at_end", f"must be one of {', '.join(AT_END)}", at_end)
    one_way = d.get("one_way", False)
    if not isinstance(one_way, bool):
        fail(f"{where}.one_way", "must be true or false", one_way)
    path = base_dir / d["file"]
    try:
        text = read_text(path, "trace CSV")
    except HarnessError as e:
        raise ScenarioError(f"{where}.file: {e}") from None
    return trace_of(parse_trace_csv(text, str(path), known, one_way), where, at_end,
                    None if "period_s" not in d else _number(f"{where}.period_s", d["period_s"], positive=True))


def trace_of(rows: tuple[LinkChange, ...], where: str, at_end: str, period_s: float | None) -> Trace:
    """A trace of these rows; a wrapped one's period: period_s, else the last row's time plus the last
    interval between two distinct times (a sampled trace's sample period)."""
    times = sorted({r.at_s for r in rows})
    if period_s is None:
        period_s = times[-1] + (times[-1] - times[-2] if len(times) > 1 else 0.0)
    if at_end == "wrap" and not period_s > times[-1]:
        fail(f"{where}.period_s", f"a wrapped trace needs a period beyond its last row's time {times[-1]:g} s",
              period_s)
    return Trace(where=where, rows=rows, at_end=at_end, period_s=float(period_s))
