"""A timeline on real nodes: `harness net apply --inventory I --node N --timeline T [--start WHEN]`.

Every node runs its own controller (timeline_control.TimelineController) for the egress of its own devices,
in the namespaces `net apply` made, on one clock: t = 0 at a wall-clock start given to every node alike
(`--start`; the nodes' clocks are assumed in step, as NTP keeps them to milliseconds). So a change of a link
between two nodes takes effect on each side at its own node, at the same planned moment. There is no iteration
on a node's side of things, so a real-node timeline has time events and traces only. The command stays in the
foreground while the timeline runs; at its end the links keep the timeline's last state (a trace holds), and
when it is stopped early (Ctrl-C, SIGTERM) they go back to the scenario's.
"""
from __future__ import annotations

import math
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from ..scenario import load_timeline
from ..scenario.inventory import load_inventory
from . import registry
from .node import NETNS_DIR, node_plan
from .timeline_control import TimelineController, TimelineError, check_timeline

POLL_S = 0.05


def parse_start(text: str, now: float | None = None) -> float:
    """--start: `now`, seconds since the epoch, or an ISO 8601 time with its zone; as seconds since the epoch."""
    now = time.time() if now is None else now
    if text == "now":
        return now
    try:
        value = float(text)
    except ValueError:
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            raise TimelineError(f"--start: must be now, seconds since the epoch or an ISO 8601 time with a zone "
                                f"(got {text!r})") from None
        if stamp.tzinfo is None:
            raise TimelineError(f"--start: give the time's zone (e.g. {text}Z): every node must read it alike "
                                f"(got {text!r})")
        return stamp.timestamp()
    if not math.isfinite(value) or value < 0:
        raise TimelineError(f"--start: must be now, seconds since the epoch or an ISO 8601 time with a zone "
                            f"(got {text!r})")
    return value


def node_timeline(inventory: Path, node: str, timeline_path: Path):
    """(the node's plan and namespaces, the scaled topology and its timeline), checked: one line when the
    timeline cannot run on real nodes."""
    inv = load_inventory(inventory)
    spec, rid, plan = node_plan(inv, node)
    topo = inv.topo.scaled(inv.bandwidth_scale)
    timeline = load_timeline(timeline_path, topo)
    if timeline.has_iteration_events:
        first = next(c for c in timeline.events if c.at_iteration is not None)
        raise TimelineError(f"{first.where}: at_iteration: on real nodes a timeline follows the wall clock "
                            "(at_s events and traces only)")
    return spec, rid, plan, topo, timeline


def describe_schedule(inventory: Path, node: str, timeline_path: Path) -> list[str]:
    """--dry-run: what the node's controller would change, and when."""
    spec, _, _, topo, timeline = node_timeline(inventory, node, timeline_path)
    check_timeline(timeline, topo)
    lines = [f"# timeline {timeline.source} on node {spec.name} (devices {list(spec.devices)}), t = 0 at --start:"]
    lines += [f"#   {c.describe()}" for c in sorted(timeline.events, key=lambda c: c.at_s)]
    if timeline.trace is not None:
        lines.append(f"#   trace {timeline.trace.where}: {len(timeline.trace.rows)} rows, at its end: "
                     f"{timeline.trace.at_end}")
    return lines


def run_node_timeline(inventory: Path, node: str, timeline_path: Path, start_wall: float, *,
                      stop: threading.Event, log_path: Path | None = None,
                      say: Callable[[str], None] = print) -> list[dict]:
    """Apply the timeline to this node's devices from `start_wall` (seconds since the epoch) until it has
    nothing more to apply or `stop` is set; each change as the kernel holds it (AppliedChange as JSON)."""
    spec, rid, plan, topo, timeline = node_timeline(inventory, node, timeline_path)
    paths = [f"{NETNS_DIR}/{registry.netns_name(rid, d)}" for d in spec.devices]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise TimelineError(f"node {spec.name}: {missing[0]}: no such namespace (run `harness net apply` first)")
    zero = time.monotonic() + (start_wall - time.time())
    control = TimelineController(timeline, topo, plan, paths, clock="command", log_path=log_path,
                                 devices=list(spec.devices), zero_monotonic=zero)
    wait = zero - time.monotonic()
    if wait > 0:
        say(f"timeline {timeline.source}: t = 0 in {wait:.1f} s")
    control.start()
    said = 0
    try:
        while not (stop.is_set() or control.finished.is_set() or control.error):
            stop.wait(POLL_S)
            said = _say_verified(control, said, say)
    finally:
        control.restore_at_stop = not control.finished.is_set()
        control.stop()
    if control.error:
        raise TimelineError(control.error)
    _say_verified(control, said, say)
    if control.restore_at_stop:
        say(f"timeline stopped: node {spec.name}'s links are the scenario's again")
    return control.to_json()


def _say_verified(control: TimelineController, said: int, say) -> int:
    """One line per change read back from the kernel, in order; returns how many were said."""
    log = control.to_json()
    while said < len(log) and (log[said]["verified_ms"] is not None or control.finished.is_set()):
        c = log[said]
        back = "" if c["verified_ms"] is None else f", read back after {c['verified_ms']:.1f} ms"
        say(f"t={c['applied_s']:.2f} s: {c['event']}: {c['pairs']} classes changed, kernel ack {c['took_ms']:.1f} ms"
            f"{back}")
        said += 1
    return said
