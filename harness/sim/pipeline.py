"""Event-driven timeline of one pipelined iteration, vectorised over data-parallel replicas.

Each stage runs an ordered list of tasks, F(m) and B(m) for micro-batch m, in the
trainer's order (harness/layout/schedule_order.py): GPipe (all forwards, then all backwards
in reverse) or 1F1B (P-1-j warm-up forwards, then one forward / one backward, then
the remaining backwards; Narayanan et al. 2021).
F(m) on stage j > 0 waits for the activation of m from j-1; B(m) on j < P-1 for
its gradient from j+1. Every time is an array over the R replicas, which share
the task structure and differ in device speeds and links.

Two runtimes:
- overlap (ours, Yuan et al. sec. 3.5): receive, compute and send are separate
  streams, so a stage computes while it sends; its sends go out one after another.
- blocking (Megatron-LM / DeepSpeed pipeline engines of 2022): the process blocks in
  the send until the message is delivered (delay + size / rate), then goes on.

Long iterations are extrapolated: the timeline of a max-plus system with constant
task times grows linearly in the number of micro-batches once past the warm-up, so
for M above `exact_up_to` the engine simulates two shorter runs and extends their
per-micro-batch slope (tests check this against the full run).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..netmodel.links import Connections, Links
from ..layout import schedule_order


@dataclass(frozen=True)
class StageTimes:
    """Per-micro-batch times, arrays (P, R) for compute and (P-1, R) for the links.

    fwd_ser[j]/fwd_delay[j]: activation j -> j+1; bwd_ser[j]/bwd_delay[j]: gradient j+1 -> j.
    """

    fwd: np.ndarray
    bwd: np.ndarray
    fwd_ser: np.ndarray
    fwd_delay: np.ndarray
    bwd_ser: np.ndarray
    bwd_delay: np.ndarray
    # with both: every hop's message of `message_bytes` goes through the connection of its device pair
    # (stages: (P, R) devices), so one after a silence longer than the RTO restarts slow start
    # (netmodel/links.Connections); else every hop takes its *_ser, a connection in use
    links: Links | None = None
    stages_devices: np.ndarray | None = None
    message_bytes: float = 0.0

    @property
    def stages(self) -> int:
        return self.fwd.shape[0]


def task_order(schedule: str, P: int, M: int, j: int) -> list[tuple[str, int]]:
    """Stage j's tasks: the order the trainer runs (harness/layout/schedule_order.py)."""
    return schedule_order.stage_order(schedule, P, j, M)


@dataclass(frozen=True)
class PipelineTimes:
    """finish: (P, R) end of each stage's last task; fwd_span/bwd_span: (P-1, R) time from the
    first send to the last arrival on each link (activations j -> j+1, gradients j+1 -> j)."""

    finish: np.ndarray
    fwd_span: np.ndarray
    bwd_span: np.ndarray


PHASES = ("FB", "F", "B")  # the tasks a run simulates: all, the forwards alone, the backwards alone


def simulate(times: StageTimes, M: int, schedule: str, overlap: bool, start=None, phase: str = "FB") -> PipelineTimes:
    """The exact event timeline of one iteration; `phase` "F" or "B": only its forwards, or only its
    backwards with every forward done before `start` (a runtime with a barrier between them: dtfm)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r} (known: {', '.join(PHASES)})")
    P, R = times.fwd.shape
    # start: when each stage (P, R) -- or each replica (R,), every stage alike -- may begin
    t0 = np.zeros((P, R)) if start is None else np.broadcast_to(np.asarray(start, dtype=float), (P, R)).copy()
    act = np.full((P, M, R), np.nan)  # arrival of the activation of m at stage j
    grad = np.full((P, M, R), np.nan)  # arrival of the gradient of m at stage j
    act[0] = t0[0]
    grad[P - 1] = -np.inf  # the last stage makes its own gradient after F(m)
    free = t0.copy()  # compute stream (the whole process when blocking)
    send_f = t0.copy()  # send stream towards j+1 (overlap)
    send_b = t0.copy()  # send stream towards j-1 (overlap)
    fwd_done_last = np.full((M, R), np.nan if phase != "B" else -np.inf)
    first_f = np.full((max(P - 1, 0), R), np.inf)
    first_b = np.full((max(P - 1, 0), R), np.inf)
    last_f = np.full((max(P - 1, 0), R), -np.inf)
    last_b = np.full((max(P - 1, 0), R), -np.inf)
    orders = [[t for t in task_order(schedule, P, M, j) if t[0] in phase] for j in range(P)]
    dev = times.stages_devices
    idle_matters = times.links is not None and dev is not None and times.links.transport.slow_start_after_idle
    conns = Connections(times.links) if idle_matters else None

    def hop(j: int, to: int, ser: np.ndarray, depart: np.ndarray) -> np.ndarray:
        return ser if conns is None else conns.send(dev[j], dev[to], times.message_bytes, depart)

    ptr = [0] * P
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for j in range(P):
            order = orders[j]
            while ptr[j] < len(order):
                kind, m = order[ptr[j]]
                if kind == "F":
                    dep = act[j, m]
                    if np.isnan(dep[0]):
                        break
                    end = np.maximum(free[j], dep) + times.fwd[j]
                    free[j] = end
                    if j < P - 1:
                        s = np.maximum(end, send_f[j]) if overlap else end
                        ser = hop(j, j + 1, times.fwd_ser[j], s)
                        arrive = s + ser + times.fwd_delay[j]
                        act[j + 1, m] = arrive
                        first_f[j] = np.minimum(first_f[j], s)
                        last_f[j] = np.maximum(last_f[j], arrive)
                        if overlap:
                            send_f[j] = s + ser
                        else:
                            free[j] = arrive
                    else:
                        fwd_done_last[m] = end
                else:
                    dep = grad[j, m] if j < P - 1 else fwd_done_last[m]
                    if np.isnan(dep[0]):
                        break
                    end = np.maximum(free[j], dep) + times.bwd[j]
                    free[j] = end
                    if j > 0:
                        s = np.maximum(end, send_b[j]) if overlap else end
                        ser = hop(j, j - 1, times.bwd_ser[j - 1], s)
                        arrive = s + ser + times.bwd_delay[j - 1]
                        grad[j - 1, m] = arrive
                        first_b[j - 1] = np.minimum(first_b[j - 1], s)
                        last_b[j - 1] = np.maximum(last_b[j - 1], arrive)
                        if overlap:
                            send_b[j] = s + ser
                        else:
                            free[j] = arrive
                ptr[j] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug, never a user error
    span = lambda first, last: np.where(np.isfinite(first), last - first, 0.0)  # noqa: E731  (0: sent nothing)
    return PipelineTimes(free, span(first_f, last_f), span(first_b, last_b))


def timeline(times: StageTimes, M: int, schedule: str, overlap: bool, start=None,
             exact_up_to: int | None = None, phase: str = "FB") -> PipelineTimes:
    """The iteration's timeline; extrapolated linearly in M for long iterations."""
    P = times.stages
    a = 3 * P + 2
    b = a + 2 * P
    limit = b if exact_up_to is None else max(exact_up_to, b)
    if M <= limit or (schedule == "1f1b" and overlap):
        # 1F1B with overlapped sends lets send queues grow for long: no early periodic regime to extend
        return simulate(times, M, schedule, overlap, start, phase)
    ta = simulate(times, a, schedule, overlap, start, phase)
    tb = simulate(times, b, schedule, overlap, start, phase)
    k = (M - b) / (b - a)
    return PipelineTimes(*(y + k * (y - x) for x, y in ((ta.finish, tb.finish), (ta.fwd_span, tb.fwd_span),
                                                     (ta.bwd_span, tb.bwd_span))))
