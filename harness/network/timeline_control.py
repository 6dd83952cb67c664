"""A timeline applied live in the emulated cluster: one controller, every change in place and read back.

The controller runs beside the job (runner.run_job) in the kernel that holds the cluster. It holds one
netlink socket per device namespace (opened inside it before the job starts), follows the run's clock, and
for each change that falls due recomputes the egress class of every device pair the change touches
(plan.shaped_link: rate, burst, netem limit from the new values) and changes it in place
(apply.change_link: no delete and re-create, so nothing queued is lost and the link is never unshaped).
It then reads the kernel back until it holds the new values: that moment is when the change took effect.
A cut link is netem's loss at 100 % (the class and queue stay), brought back to the link's own loss.
Its log (`AppliedChange`, one per change) is the job's timeline.json and the run's manifest entry.

The clock: with clock="command", t = 0 when the command starts. With clock="marks" (the trainer), nothing
happens until the program marks its iteration 0 (`note_iteration`, through the file MARKS_ENV names; a rank
marks it when the iteration ends, with the time it began): t = 0 is then when it began, and iteration events
fire as their iteration's mark arrives; when several ranks mark (ours: every rank), as the last one's does,
which is where the records put the boundary (their iterations end with the last rank). `note_run(k)` starts
run k of a boot: the links go back to the scenario's and the timeline starts again at its iteration 0. Either clock takes iteration marks.
The program reads the changes of its run back with `changes_of_run` (the file LOG_ENV names).
A device event (scenario/preemption.py) cuts every link to and from the device (or brings them back) and is
then written to the file DEVICES_ENV names, with a preemption's notice before it when it has one: the launcher
(`timeline_program.device_notices`) kills the device's processes, or starts them again.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pyroute2 import IPRoute

from ..errors import HarnessError
from ..scenario.preemption import DeviceEvent, device_events
from ..scenario.timeline import LinkChange, LinkState
from . import netns as harness_netns
from .apply import change_link, change_region_class, compare, readback
from ..netmodel.tcp import frame_bytes
from .plan import (UNSHAPED_MIN_GBPS, DevicePlan, NetworkPlan, RegionClass, ShapedLink, region_class, shaped_link,
                   under_egress, under_region)

CLOCKS = ("command", "marks")
POLL_S = 0.01
#: how long a change may take to show in the kernel's read-back before the run fails
EFFECT_TIMEOUT_S = 5.0
CUT_LOSS_PCT = 100.0

class TimelineError(HarnessError, RuntimeError):
    """A timeline cannot be applied to this cluster, or a change did not take effect (one line)."""


def check_timeline(timeline, topo) -> None:
    """Before anything boots: every link an event changes must be shaped (plan.UNSHAPED_MIN_GBPS: a link
    inside a node has no class to change), and so must every link of a device that can be preempted (its links
    are cut)."""
    state = LinkState.initial(topo)
    sizes = [sum(1 for r in topo.device_region if r == k) for k in range(len(topo.regions))]

    def unshaped(r: int, s: int) -> bool:
        return (r != s or sizes[r] > 1) and topo.region_delay_ms[r, s] == 0 \
            and topo.region_bandwidth_gbps[r, s] >= UNSHAPED_MIN_GBPS

    rows = timeline.trace.rows if timeline.trace else ()
    for change in (*timeline.events, *rows):
        for r, s in state.apply(change):
            if unshaped(r, s):
                raise TimelineError(f"{change.where}: the link {topo.regions[r].name} -> {topo.regions[s].name} "
                                    "is inside a node (not shaped): a timeline cannot change it")
    leaving = [(e.where, e.device) for e in timeline.devices if e.kind == "preempt"]
    if timeline.spot is not None:
        leaving += [(timeline.spot.where, d) for d in range(topo.n) if timeline.spot.rate_of(
            topo.regions[topo.device_region[d]].name, topo.regions[topo.device_region[d]].group) > 0]
    for where, d in leaving:
        r = topo.device_region[d] if 0 <= d < topo.n else None
        bad = next((s for s in range(len(topo.regions)) if r is not None and unshaped(r, s)), None)
        if bad is not None:
            raise TimelineError(f"{where}: device {d}'s link {topo.regions[r].name} -> {topo.regions[bad].name} is "
                                "inside a node (not shaped): a preemption cannot cut it")


@dataclass(frozen=True)
class AppliedChange:
    run: int  # the run of the boot it belongs to (0-based)
    event: str  # LinkChange.describe()
    where: str  # file and field of the event
    due_s: float | None  # its time on the run's clock (None: an iteration event)
    iteration: int | None  # the iteration under way (the last mark), None before any
    applied_s: float  # run clock: the change commands were issued
    effect_s: float  # run clock: the kernel acknowledged the last of them (the new values hold from here)
    applied_monotonic: float  # the moment applied_s on time.monotonic() (records' `end` is on it)
    pairs: int  # device pairs (classes) changed
    # run clock: the kernel's read-back of every device touched held the new values; None: a later change
    # to the same device came first (it is verified with that one)
    verified_s: float | None = None

    @property
    def took_ms(self) -> float:
        return (self.effect_s - self.applied_s) * 1e3

    def to_json(self) -> dict:
        return {**asdict(self), "took_ms": round(self.took_ms, 3),
                "verified_ms": None if self.verified_s is None else round((self.verified_s - self.applied_s) * 1e3, 3)}


class TimelineController:
    """See the module docstring. `start()` before the program starts, `stop()` after; `log` and `error`.

    Two threads, each with its own netlink sockets (pyroute2 0.9 keeps one per thread): the controller
    applies each change when it falls due and goes on; the verifier reads the kernel back behind it, so a
    slow read-back (UML's one CPU under load: up to 0.8 s measured) never makes the next change late."""

    def __init__(self, timeline, topo, plan: NetworkPlan, netns_paths: list[str], *, clock: str = "command",
                 marks_path: Path | None = None, log_path: Path | None = None, jitter_ms: float = 0.0,
                 loss_pct: float = 0.0, devices: list[int] | None = None, zero_monotonic: float | None = None,
                 devices_path: Path | None = None, horizon_s: float = 3600.0):
        if clock not in CLOCKS:
            raise TimelineError(f"clock: must be one of {', '.join(CLOCKS)} (got {clock!r})")
        self.timeline, self.topo, self.plan, self.clock = timeline, topo, plan, clock
        self.marks_path = Path(marks_path) if marks_path else None
        self.log_path = Path(log_path) if log_path else None
        self.base_values = (jitter_ms, loss_pct)
        self.region_devices = [[d for d in range(topo.n) if topo.device_region[d] == r]
                               for r in range(len(topo.regions))]
        self.base = {(dev.index, lk.dst): lk for dev in plan.devices for lk in dev.links}
        self.current = dict(self.base)
        # link_classes: region: the class each device's destinations in one region share, (device, region) -> it
        self.base_regions = {(dev.index, rc.region): rc for dev in plan.devices for rc in dev.region_classes}
        self.current_regions = dict(self.base_regions)
        check_timeline(timeline, topo)
        # device events: in time order (a spot market's draws up to `horizon_s`) and in iteration order
        self.device_timed, self.device_iterations = device_events(timeline, topo, horizon_s)
        # the timed preemptions that come with a notice, in the order their notices fall due
        self.device_notices = sorted((e for e in self.device_timed if e.kind == "preempt" and e.notice_s > 0),
                                     key=lambda e: e.at_s - e.notice_s)
        self.devices_path = Path(devices_path) if devices_path else None
        self.down: set[int] = set()  # devices preempted now: every link to and from them is cut
        # the devices whose egress this controller changes (a real node: its own), netns_paths in their order
        self.devices = list(range(len(plan.devices))) if devices is None else list(devices)
        self._own = set(self.devices)
        self.netns_paths = netns_paths
        self.zero_monotonic = zero_monotonic  # clock="command": t = 0 at this time.monotonic() (None: start())
        self.finished = threading.Event()  # clock="command": the timeline has nothing more to apply
        self.restore_at_stop = False  # set before stop(): the scenario's links again as it stops
        self.log: list[AppliedChange] = []
        self.marks_read = 0
        self.error: str = ""
        self._lock = threading.Lock()
        self._checks: queue.Queue = queue.Queue()
        self._latest: dict[int, int] = {}  # device -> the last check queued for it
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._guarded, args=(self._run,), name="harness-timeline",
                                        daemon=True)
        self._verifier = threading.Thread(target=self._guarded, args=(self._verify,), name="harness-timeline-check",
                                          daemon=True)

    def _pairs(self, r: int, s: int) -> list[tuple[int, int]]:
        return [(d, e) for d in self.region_devices[r] for e in self.region_devices[s] if d != e]

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start both threads and wait until they hold their sockets (the run's clock starts now)."""
        self._t_command = time.monotonic()
        self._verifier.start()
        self._thread.start()
        self._ready.wait()
        if self.error:
            self.stop()
            raise TimelineError(self.error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._checks.put(None)  # the verifier finishes what is queued, then leaves
        if self._verifier.is_alive():
            self._verifier.join()

    def to_json(self) -> list[dict]:
        with self._lock:
            return [c.to_json() for c in self.log]

    # -- the threads -------------------------------------------------------------------------------
    def _guarded(self, body) -> None:
        sockets = {}  # device -> (its namespace's socket, its interface)
        try:
            for d, path in zip(self.devices, self.netns_paths):
                with harness_netns.inside(path):  # the socket stays bound to the namespace it was opened in
                    ipr = IPRoute()
                    sockets[d] = (ipr, ipr.link_lookup(ifname=self.plan.devices[d].ifname)[0])
            if body == self._run:
                self._ready.set()
            body(sockets)
        except BaseException as e:  # noqa: BLE001 - the runner fails the job with it
            self.error = self.error or (str(e) if isinstance(e, HarnessError) else f"timeline: {type(e).__name__}: {e}")
            self._stop.set()
        finally:
            self._ready.set()
            for ipr, _ in sockets.values():
                ipr.close()

    def _run(self, sockets) -> None:
        self._sockets = sockets
        run, iteration, pos, zero = -1, None, 0, None
        marked: dict[int, int] = {}  # iteration -> ranks that marked it so far
        timed, noticed, by_iteration = 0, 0, 0  # device events applied so far (time, notices, iteration)
        if self.clock == "command":
            run, zero = 0, self._t_command if self.zero_monotonic is None else self.zero_monotonic
        state, cursor = LinkState.initial(self.topo, *self.base_values), self.timeline.cursor()
        while not self._stop.is_set():
            marks, pos = self._read_marks(pos)
            self.marks_read = pos  # bytes of the marks file taken in so far
            for kind, value, began, of in marks:
                if kind == "run" and self.clock == "marks":
                    self._restore()
                    state, cursor = LinkState.initial(self.topo, *self.base_values), self.timeline.cursor()
                    run, iteration, zero, marked = value, None, None, {}
                    timed, noticed, by_iteration = 0, 0, 0
                elif kind == "iteration":
                    if value == 0 and zero is None:  # the clock starts with the first rank's iteration 0
                        run, zero = max(run, 0), began
                    marked[value] = marked.get(value, 0) + 1
                    if marked[value] >= of:  # every rank that marks it is there
                        iteration = max(value, iteration if iteration is not None else value)
            if zero is None:
                self._stop.wait(POLL_S)
                continue
            for change in cursor.due(time.monotonic() - zero, iteration):
                self._apply(change, state, run, iteration, zero)
            now, ev, notices = time.monotonic() - zero, self.device_timed, self.device_notices
            while noticed < len(notices) and notices[noticed].at_s - notices[noticed].notice_s <= now:
                self._tell("notice", notices[noticed].device, time.monotonic())
                noticed += 1
            while timed < len(ev) and ev[timed].at_s <= now:
                self._device(ev[timed], state, run, iteration, zero)
                timed += 1
            ev = self.device_iterations
            while by_iteration < len(ev) and iteration is not None and ev[by_iteration].at_iteration <= iteration:
                self._device(ev[by_iteration], state, run, iteration, zero)
                by_iteration += 1
            nxt = min((t for t in (cursor.next_at_s(), self._next_device_s(timed, noticed)) if t is not None),
                      default=None)
            if nxt is None and self.clock == "command" and not self.timeline.has_iteration_events:
                self.finished.set()
            self._stop.wait(POLL_S if nxt is None else min(POLL_S, max(0.0, zero + nxt - time.monotonic())))
        if self.restore_at_stop:
            self._restore()

    def _next_device_s(self, timed: int, noticed: int) -> float | None:
        notices = self.device_notices
        due = [self.device_timed[timed].at_s] if timed < len(self.device_timed) else []
        due += [notices[noticed].at_s - notices[noticed].notice_s] if noticed < len(notices) else []
        return min(due, default=None)

    def _device(self, event: DeviceEvent, state: LinkState, run: int, iteration: int | None, zero: float) -> None:
        """A device leaves (every link to and from it cut: netem's loss at 100 %, nothing it sends arrives, not
        even its kernel's resets) or comes back (its links as the timeline has them now); then the launcher is
        told (device_notices), which kills or starts its processes."""
        d = event.device
        (self.down.add if event.kind == "preempt" else self.down.discard)(d)
        r = self.topo.device_region
        touched: dict[int, list[ShapedLink]] = {}
        for e in range(self.topo.n):
            for a, b in ((d, e), (e, d)):
                if e == d or a not in self._own:
                    continue
                cut = a in self.down or b in self.down
                loss = CUT_LOSS_PCT if cut or state.down[r[a], r[b]] else float(state.loss_pct[r[a], r[b]])
                touched.setdefault(a, []).append(replace(self.current[(a, b)], loss_pct=loss))
        applied = time.monotonic()
        effect = self._change(touched)
        self._tell(event.kind, d, applied)
        self._logged(AppliedChange(run, event.describe(), event.where, event.at_s, iteration, applied - zero,
                                   effect - zero, applied, sum(map(len, touched.values()))), touched, zero)

    def _logged(self, entry: AppliedChange, touched: dict, zero: float) -> None:
        """`entry` in the log, and its read-back queued (its line in the log file once verified)."""
        with self._lock:
            self.log.append(entry)
            k = len(self.log) - 1
        self._queue_check(touched, k, zero)

    def _tell(self, kind: str, device: int, at: float) -> None:
        if self.devices_path is not None:
            with open(self.devices_path, "a") as f:
                f.write(f"{kind} {device} {at:.6f}\n")

    def _read_marks(self, pos: int) -> tuple[list[tuple[str, int, float, int]], int]:
        """New whole lines of the marks file: ("run", k, 0.0, 1) and ("iteration", i, began, ranks marking it)."""
        if self.marks_path is None:
            return [], pos
        try:
            with open(self.marks_path, "rb") as f:
                f.seek(pos)
                data = f.read()
        except FileNotFoundError:
            return [], pos
        whole = data[:data.rfind(b"\n") + 1]
        out = []
        for line in whole.decode().splitlines():
            kind, value, *rest = line.split()
            out.append((kind, int(value), float(rest[0]) if rest else 0.0, int(rest[1]) if len(rest) > 1 else 1))
        return out, pos + len(whole)

    def _apply(self, change: LinkChange, state: LinkState, run: int, iteration: int | None, zero: float) -> None:
        frame = frame_bytes(self.plan.mtu)
        touched: dict[int, list[ShapedLink]] = {}
        regions: dict[int, list[RegionClass]] = {}
        for r, s in state.apply(change):
            for d, e in self._pairs(r, s):
                if d not in self._own:
                    continue  # another node shapes that device's egress
                cut = state.down[r, s] or d in self.down or e in self.down  # a preempted device's stay cut
                loss = CUT_LOSS_PCT if cut else float(state.loss_pct[r, s])
                dev = self.plan.devices[d]
                link = shaped_link(e, self.base[(d, e)].dst_addr, float(state.delay_ms[r, s]),
                                   float(state.bandwidth_gbps[r, s]), float(state.jitter_ms[r, s]), loss,
                                   self.plan.mtu, f"{change.where}: device {d} -> {e}: rate")
                if (d, s) in self.base_regions:  # its region's class takes the region pair's new rate
                    rc = region_class(s, float(state.bandwidth_gbps[r, s]), self.plan.mtu, dev.egress_bps,
                                      len(dev.region_classes))
                    members = sum(lk.parent_minor == rc.class_minor for lk in dev.links)
                    link = under_region(link, rc, members, frame)
                    if rc not in regions.setdefault(d, []):
                        regions[d].append(rc)
                elif dev.egress_bps is not None:
                    link = under_egress(link, dev.egress_bps, len(dev.links), frame)
                touched.setdefault(d, []).append(link)
        applied = time.monotonic()
        effect = self._change(touched, regions)
        self._logged(AppliedChange(run, change.describe(), change.where, change.at_s, iteration, applied - zero,
                                   effect - zero, applied, sum(map(len, touched.values()))), touched, zero)

    def _restore(self) -> None:
        """The scenario's links again (a new run of the boot starts), every device back."""
        self.down.clear()
        touched: dict[int, list[ShapedLink]] = {}
        regions: dict[int, list[RegionClass]] = {}
        for (d, e), link in self.current.items():
            if link != self.base[(d, e)] and d in self._own:
                touched.setdefault(d, []).append(self.base[(d, e)])
        for (d, s), rc in self.current_regions.items():
            if rc != self.base_regions[(d, s)] and d in self._own:
                regions.setdefault(d, []).append(self.base_regions[(d, s)])
                touched.setdefault(d, [])
        if touched:
            self._change(touched, regions)
            self._queue_check(touched, None, 0.0)

    def _change(self, touched: dict[int, list[ShapedLink]], regions: dict[int, list[RegionClass]] | None = None
                ) -> float:
        """The links `touched` (device -> its destinations' new classes) and region classes `regions` from now on;
        when the kernel acknowledged the last change (time.monotonic())."""
        regions = regions or {}
        self.current.update({(d, link.dst): link for d, links in touched.items() for link in links})
        self.current_regions.update({(d, rc.region): rc for d, rcs in regions.items() for rc in rcs})
        return self._to_kernel(touched, regions)

    def _to_kernel(self, touched: dict[int, list[ShapedLink]], regions: dict[int, list[RegionClass]]) -> float:
        """Change the classes in place (each command returns once the kernel holds it), a region's class before
        its destinations'."""
        for d, links in touched.items():
            ipr, idx = self._sockets[d]
            for rc in regions.get(d, ()):
                change_region_class(ipr, idx, self.plan.devices[d], rc)
            for link in links:
                change_link(ipr, idx, self.plan.devices[d], link)
        return time.monotonic()

    def _queue_check(self, touched: dict, entry: int | None, zero: float) -> None:
        wants = {d: self._device_now(d) for d in touched}
        with self._lock:
            seq = max(self._latest.values(), default=0) + 1
            self._latest.update({d: seq for d in wants})
        self._checks.put((seq, wants, entry, zero))

    def _verify(self, sockets) -> None:
        """Read the kernel back behind the controller: each device until it holds what was asked, unless a
        later change to it was queued (that one is checked instead); then the change's log line."""
        while (item := self._checks.get()) is not None:
            seq, wants, entry, zero = item
            superseded = False
            deadline = time.monotonic() + EFFECT_TIMEOUT_S
            for d, want in wants.items():
                while problems := self._problems(sockets[d] if sockets else None, want):
                    with self._lock:
                        if self._latest[d] != seq:
                            superseded = True
                            break
                    if time.monotonic() > deadline:
                        raise TimelineError(f"timeline: device {d}: the kernel did not hold the change within "
                                            f"{EFFECT_TIMEOUT_S:g} s: {problems[0]}")
                    time.sleep(0.001)
            if entry is None:
                continue
            with self._lock:
                done = self.log[entry] = replace(self.log[entry],
                                                 verified_s=None if superseded else time.monotonic() - zero)
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(done.to_json()) + "\n")

    def _problems(self, sock, want: DevicePlan) -> list[str]:
        ipr, idx = sock
        return compare(want, readback(ipr, idx))

    def _device_now(self, d: int) -> DevicePlan:
        dev = self.plan.devices[d]
        return replace(dev, links=tuple(self.current[(d, lk.dst)] for lk in dev.links),
                       region_classes=tuple(self.current_regions[(d, rc.region)] for rc in dev.region_classes))
