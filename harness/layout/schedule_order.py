"""The order in which a pipeline stage runs the forwards and backwards of one iteration.

One definition for the trainer ("ours", harness/systems/ours/pipeline.py), which runs it, and
the simulator (harness/sim/pipeline.py), which predicts it, so the two cannot drift apart.
Pure (no torch): the simulator runs without it.
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def stage_order(schedule: str, stages: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """[(phase, micro-batch)] of `stage` (0-based) of `stages`, phase "F" (forward) or "B" (backward).

    gpipe: all forwards, then all backwards in reverse, freeing activations last-in
    first-out (torch's ScheduleGPipe, which the baselines run, goes in forward order).
    1f1b: stages - stage - 1 warm-up forwards, then one forward / one backward, then the
    remaining backwards (Narayanan et al. 2021): at most stages - stage micro-batches live.
    """
    n = micro_batches
    if schedule == "gpipe":
        return [("F", k) for k in range(n)] + [("B", k) for k in reversed(range(n))]
    if schedule == "1f1b":
        warm = min(stages - stage - 1, n)
        order = [("F", k) for k in range(warm)]
        for k in range(n - warm):
            order += [("F", warm + k), ("B", k)]
        return order + [("B", k) for k in range(n - warm, n)]
    raise ValueError(f"unknown pipeline schedule {schedule!r}")
