"""Wave Synchronous Parallel (HetPipe, Park et al. 2020, Sec. 4-5): virtual workers' pipelines and their clocks.

Inside a virtual worker (VW) up to N_m minibatches are in flight: minibatch p enters the first
stage when minibatch p - N_m has left it (its backward there is done). Every GPU runs its ready
tasks first-in first-out, forwards in minibatch order, backwards in minibatch order; the last
stage runs a minibatch's forward and backward as one task; activations and gradients cross
between stages in the VW's transfer times (harness/systems/hetpipe/).

A wave is N_m consecutive minibatches (local staleness N_m - 1). When a VW completes wave c
(its last minibatch's backward on the first stage) it pushes the wave's aggregated update to
the parameter server (push seconds). The minibatch it admits next, the last of wave c+1, must
use weights holding every VW's updates of waves 0..c-D: once c >= D it waits until every VW
has pushed wave c-D, then pulls the global weights (pull seconds); the N_m - 1 minibatches of
wave c+1 already in the pipeline keep running meanwhile. So a VW resumes past its clock c only
when no VW is more than D waves behind it (the clock distance bound), and D = 0 is BSP-like.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

WAVES = 24  # simulated per VW; the throughput is measured over the second half


@dataclass
class WSPResult:
    seconds_per_wave: float  # steady state: time between global clock ticks
    samples_per_s: float
    wave_done: np.ndarray  # (VWs, waves): when each VW completed each wave
    push_done: np.ndarray  # (VWs, waves)
    resumed: np.ndarray  # (VWs, waves): when the VW admitted the minibatch gated after wave c (nan: none)
    distance_at_resume: list[int]  # waves pushed by the resuming VW minus the fewest any VW has pushed
    pulled: np.ndarray  # (VWs, waves): when the pull at the gate after wave c completed (nan: none)
    admitted: np.ndarray  # (VWs, minibatches): when each minibatch entered the first stage
    done: np.ndarray  # (VWs, minibatches): when each minibatch's backward left the first stage
    first_stage_busy: list = None  # per VW, the (start, end) of every task its first stage ran, in order

    def run_seconds(self, per_vw: int, warmup: int, timed: int) -> float:
        """The mean seconds of a run's timed iterations (`per_vw` minibatches of every VW each, after `warmup`):
        an iteration ends when each VW's last minibatch of it has left the first stage, the slowest VW's."""
        ends = np.concatenate([np.zeros((self.done.shape[0], 1)), self.done[:, per_vw - 1::per_vw]], axis=1)
        if ends.shape[1] < warmup + timed + 1:
            raise ValueError(f"simulated {ends.shape[1] - 1} iterations, the run had {warmup + timed}")
        return float(((ends[:, warmup + timed] - ends[:, warmup]) / timed).max())

    def gate_waits(self) -> tuple[np.ndarray, np.ndarray]:
        """Per gate (every VW, every wave it was gated after): the *waiting* time, from the VW finishing the wave
        to its pull of the global weights completing (Park et al. Sec. 8.4: "the waiting time of a virtual
        worker to receive the updated global weight"), and the *idle* time within it: how long the first stage
        had no task between the wave's end and the gated minibatch's admission (meanwhile it runs the backward
        passes of the wave's other minibatches: "the virtual worker can continue to proceed in the pipeline")."""
        waiting, idle = [], []
        for v, c in zip(*np.nonzero(~np.isnan(self.resumed))):
            start, end = self.wave_done[v, c], self.resumed[v, c]
            busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.first_stage_busy[v])
            waiting.append(self.pulled[v, c] - start)
            idle.append(max(0.0, end - start - busy))
        return np.array(waiting), np.array(idle)

    def records(self, in_flight: int) -> list["MinibatchRecord"]:
        """What a run records per minibatch (wsp.check_bounds reads it), of this simulation."""
        V, waves = self.push_done.shape
        out = []
        for v in range(V):
            version = 0
            for p in range(waves * in_flight):
                c, last = p // in_flight, (p + 1) % in_flight == 0
                if last and c >= 1 and not np.isnan(self.pulled[v, c - 1]):
                    # the pull at this gate: every VW's waves pushed by then, the fewest of them
                    version = int((self.push_done <= self.pulled[v, c - 1]).sum(axis=1).min())
                out.append(MinibatchRecord(v, p, c, version, float(self.admitted[v, p]),
                                           float(self.push_done[v, c]) if last else float("nan")))
        return out


@dataclass(frozen=True)
class MinibatchRecord:
    """One minibatch of one virtual worker, as a WSP run records it.

    clock: its wave (the VW's local clock while it runs); global_version: the global clock of the weights
    it read (the fewest waves of any VW they include); admitted: when it entered the first stage; pushed:
    for a wave's last minibatch, when the wave's update reached the parameter server (else NaN)."""

    vw: int
    minibatch: int  # 0-based, per VW
    clock: int
    global_version: int
    admitted: float
    pushed: float = float("nan")
    loss: float = float("nan")

    @classmethod
    def of_row(cls, row: dict) -> "MinibatchRecord":
        """A row of a run's minibatches.csv (harness/results.py: read_minibatches)."""
        return cls(int(row["vw"]), int(row["minibatch"]), int(row["clock"]), int(row["global_version"]),
                   float(row["admitted"]), float(row["pushed"]), float(row["loss"]))


def recorded_gate_waits(rows: list[dict], in_flight: int) -> tuple[np.ndarray, np.ndarray]:
    """WSPResult.gate_waits from a run's minibatches.csv rows (results.read_minibatches): per gate, *waiting*
    from the first stage finishing wave c (its last minibatch's `wave_done`) to the pull before the gated
    minibatch (the last of wave c + 1, whose `pulled` is set) completing, and *idle*, how long the first stage
    was blocked in that pull (a stage runs one task at a time: blocked, it has none)."""
    done = {(r["vw"], r["minibatch"]): r["wave_done"] for r in rows if not np.isnan(r.get("wave_done", np.nan))}
    waiting, idle = [], []
    for r in rows:
        if np.isnan(r.get("pulled", np.nan)):
            continue
        c = (r["minibatch"] + 1) // in_flight - 2  # the gate after wave c
        end = done.get((r["vw"], (c + 1) * in_flight - 1))
        if end is not None:
            waiting.append(r["pulled"] - end)
            idle.append(r["blocked"])
    return np.array(waiting), np.array(idle)


def global_staleness(in_flight: int, staleness: int) -> int:
    """s_global = (D + 1)(s_local + 1) + s_local - 1 with s_local = N_m - 1 (HetPipe, Sec. 5)."""
    s_local = in_flight - 1
    return (staleness + 1) * (s_local + 1) + s_local - 1


def check_bounds(records: list[MinibatchRecord], in_flight: int, staleness: int) -> list[str]:
    """WSP's two bounds, checked from what was recorded; one line per violation.

    Global staleness: minibatch p (1-based) must read weights holding every VW's updates of its
    minibatches 1 .. p - (s_global + 1), i.e. global_version * N_m >= p - s_global - 1. Clock distance:
    when a VW admits the minibatch gated at the end of its clock c (it enters clock c + 1), no VW may be
    more than D waves behind: c + 1 - (waves the slowest VW has pushed by then) <= D."""
    s_global = global_staleness(in_flight, staleness)
    bad = []
    pushes = {}
    for r in records:
        if not np.isnan(r.pushed):
            pushes.setdefault(r.vw, []).append(r.pushed)
    vws = sorted({r.vw for r in records})
    for r in records:
        p = r.minibatch + 1
        if r.global_version * in_flight < p - s_global - 1:
            bad.append(f"VW {r.vw} minibatch {p}: read global version {r.global_version} (updates of minibatches "
                       f"1..{r.global_version * in_flight}), the bound needs 1..{p - s_global - 1} "
                       f"(s_global {s_global})")
        gated = p % in_flight == 0 and r.clock >= 1
        if gated:
            slowest = min(sum(1 for t in pushes.get(u, []) if t <= r.admitted) for u in vws)
            if r.clock - slowest > staleness:
                bad.append(f"VW {r.vw} entered clock {r.clock} when the slowest VW had pushed {slowest} waves: "
                           f"clock distance {r.clock - slowest} > D = {staleness}")
    return bad


def simulate(vws, in_flight: int, batch: int, staleness: int, push_seconds: float, pull_seconds: float,
             waves: int = WAVES) -> WSPResult:
    """Event simulation of every VW (harness.systems.hetpipe.VirtualWorker) under WSP with threshold `staleness`."""
    V, N = len(vws), in_flight
    total = waves * N
    free = [[0.0] * len(vw.devices) for vw in vws]
    queues = [[[] for _ in vw.devices] for vw in vws]
    wave_done = np.full((V, waves), np.nan)
    push_done = np.full((V, waves), np.nan)
    resumed = np.full((V, waves), np.nan)
    pulled = np.full((V, waves), np.nan)
    admit_at = np.full((V, total), np.nan)
    done = np.full((V, total), np.nan)
    completed = [0] * V
    busy: list[list[tuple[float, float]]] = [[] for _ in range(V)]
    admitted = [0] * V
    last_admit = [0.0] * V
    distance: list[int] = []
    pushed = [0] * V  # waves each VW has pushed
    wave_pushes = [0] * waves  # VWs that have pushed each wave, and the last of their push times
    wave_last_push = [0.0] * waves
    push_at = [[None] * waves for _ in range(V)]  # push_done as Python floats (the hot path reads them)

    def gate(v: int, p: int) -> float | None:
        """Earliest admission of minibatch p by its wave gate; None while some push it waits for is unknown."""
        if (p + 1) % N or p < 2 * N - 1:
            return 0.0
        c = (p + 1) // N - 2  # p closes wave c+1 and is admitted when wave c completes
        if c < staleness:
            return 0.0  # the first D+1 waves run without querying the global weights
        if wave_pushes[c - staleness] < V or push_at[v][c] is None:
            return None
        return max(push_at[v][c], wave_last_push[c - staleness]) + pull_seconds

    def admit(v: int, now: float) -> None:
        while admitted[v] < total and admitted[v] - completed[v] < N:
            p = admitted[v]
            g = gate(v, p)
            if g is None:
                return  # parked until the pushes it needs are known
            t = max(now, g, last_admit[v])
            if g > 0.0:
                c = (p + 1) // N - 2
                resumed[v, c] = t
                pulled[v, c] = g
                distance.append((c + 1) - min(pushed))
            admit_at[v, p] = t
            heapq.heappush(queues[v][0], (t, p, 0, "f"))
            admitted[v] += 1
            last_admit[v] = t

    def complete(v: int, p: int, t: float) -> None:
        completed[v] += 1
        done[v, p] = t
        if (p + 1) % N == 0:
            c = p // N
            wave_done[v, c] = t
            push_done[v, c] = push_at[v][c] = t + push_seconds
            pushed[v] += 1
            wave_pushes[c] += 1
            wave_last_push[c] = max(wave_last_push[c], t + push_seconds)
            for u in range(V):  # a push may release VWs parked at their gate
                admit(u, t)
        admit(v, t)

    for v in range(V):
        admit(v, 0.0)
    while True:
        best = None
        for v, vw in enumerate(vws):
            for k, q in enumerate(queues[v]):
                if q:
                    t = max(free[v][k], q[0][0])
                    if best is None or t < best[0]:
                        best = (t, v, k)
        if best is None:
            break
        t, v, k = best
        _, p, _, kind = heapq.heappop(queues[v][k])
        vw = vws[v]
        K = len(vw.devices)
        if k == K - 1 and kind == "f":
            kind = "fb"  # the last stage: forward and backward back to back
        dur = {"f": vw.fwd[k], "b": vw.bwd[k], "fb": vw.fwd[k] + vw.bwd[k]}[kind]
        end = t + dur
        free[v][k] = end
        if k == 0:
            busy[v].append((t, end))
        if kind == "f":
            heapq.heappush(queues[v][k + 1], (end + vw.send_fwd[k], p, 0, "f"))
        elif k > 0:
            heapq.heappush(queues[v][k - 1], (end + vw.send_bwd[k - 1], p, 1, "b"))
        else:
            complete(v, p, end)
    if np.isnan(push_done).any():
        raise RuntimeError("WSP simulation stalled before every VW finished its waves")  # a bug, not a user error
    clock = push_done.max(0)  # global clock c+1: every VW has pushed wave c
    half = waves // 2
    per_wave = float((clock[-1] - clock[half - 1]) / (waves - half))
    return WSPResult(per_wave, V * N * batch / per_wave, wave_done, push_done, resumed, distance, pulled, admit_at,
                     done, busy)
