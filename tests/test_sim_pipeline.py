"""Pipeline timeline engine: closed forms, and extrapolation against the full event simulation."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.sim import pipeline
from harness.sim.pipeline import StageTimes


def two_stage(f0, f1, b0, b1, ser, delay, R=1):
    a = lambda x: np.full((1, R), float(x))  # noqa: E731
    return StageTimes(np.vstack([a(f0), a(f1)]), np.vstack([a(b0), a(b1)]), a(ser), a(delay), a(ser), a(delay))


@pytest.mark.parametrize("f0,f1,b0,b1,ser,delay", [
    (1.0, 1.0, 2.0, 2.0, 3.0, 0.5),  # link-bound
    (4.0, 1.0, 8.0, 2.0, 0.5, 2.0),  # compute-bound on stage 0
    (1.0, 5.0, 2.0, 1.0, 1.0, 0.0),
])
def test_gpipe_two_stages_on_one_link_matches_tandem_closed_form(f0, f1, b0, b1, ser, delay):
    M = 7
    tl = pipeline.simulate(two_stage(f0, f1, b0, b1, ser, delay), M, "gpipe", overlap=True)
    # forward: servers f0 -> link -> f1 (+ delay), the last item leaves after sum + (M-1) * bottleneck
    t_fwd = f0 + ser + delay + f1 + (M - 1) * max(f0, ser, f1)
    # backward starts when stage 1 has done all forwards
    t1 = t_fwd + M * b1
    t0 = t_fwd + b1 + ser + delay + b0 + (M - 1) * max(b1, ser, b0)
    np.testing.assert_allclose(tl.finish[:, 0], [t0, t1])
    # the link is busy from the first send to the last arrival: at least M * ser + delay
    assert tl.fwd_span[0, 0] >= M * ser + delay - 1e-12
    assert tl.bwd_span[0, 0] >= M * ser + delay - 1e-12


def test_blocking_runtime_never_beats_overlap():
    rng = np.random.default_rng(0)
    P, R, M = 4, 3, 12
    t = StageTimes(rng.uniform(1, 2, (P, R)), rng.uniform(2, 4, (P, R)), rng.uniform(0, 3, (P - 1, R)),
                   rng.uniform(0, 1, (P - 1, R)), rng.uniform(0, 3, (P - 1, R)), rng.uniform(0, 1, (P - 1, R)))
    for sched in ("gpipe", "1f1b"):
        fast = pipeline.simulate(t, M, sched, overlap=True).finish.max()
        slow = pipeline.simulate(t, M, sched, overlap=False).finish.max()
        assert slow >= fast


@pytest.mark.parametrize("schedule,overlap", [("gpipe", True), ("1f1b", False), ("1f1b", True)])
def test_extrapolated_timeline_matches_full_simulation(schedule, overlap):
    rng = np.random.default_rng(7)
    P, R, M = 4, 5, 150
    t = StageTimes(rng.uniform(1, 2, (P, R)), rng.uniform(2, 5, (P, R)), rng.uniform(0, 3, (P - 1, R)),
                   rng.uniform(0, 2, (P - 1, R)), rng.uniform(0, 3, (P - 1, R)), rng.uniform(0, 2, (P - 1, R)))
    full = pipeline.simulate(t, M, schedule, overlap)
    fast = pipeline.timeline(t, M, schedule, overlap)
    np.testing.assert_allclose(fast.finish, full.finish, rtol=1e-9)
    np.testing.assert_allclose(fast.fwd_span, full.fwd_span, rtol=1e-9)


def test_1f1b_task_order_runs_every_task_once_with_warmup():
    P, M = 4, 6
    for j in range(P):
        order = pipeline.task_order("1f1b", P, M, j)
        assert sorted(order) == sorted([("F", m) for m in range(M)] + [("B", m) for m in range(M)])
        assert order[: P - 1 - j] == [("F", m) for m in range(P - 1 - j)]
        # a backward never comes before its forward
        assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(M))


def test_trainer_and_simulator_take_their_order_from_schedule_order(monkeypatch):
    from harness.layout import schedule_order
    from harness.systems.ours import pipeline as trainer

    real, calls = schedule_order.stage_order, []

    def stage0_backwards_in_forward_order(schedule, stages, stage, micro_batches):
        calls.append((schedule, stages, stage, micro_batches))
        order = real(schedule, stages, stage, micro_batches)
        return sorted(order, key=lambda t: (t[0] == "B", t[1])) if stage == 0 else order

    monkeypatch.setattr(schedule_order, "stage_order", stage0_backwards_in_forward_order)
    M, (f, b, ser, delay) = 7, (1.0, 2.0, 3.0, 0.5)
    tl = pipeline.simulate(two_stage(f, f, b, b, ser, delay), M, "gpipe", overlap=True)
    assert calls == [("gpipe", 2, 0, M), ("gpipe", 2, 1, M)]
    # Stage 1 sends gradients M-1, ..., 0 (one per `ser`, the bottleneck); stage 0, now asking for
    # gradient 0 first, waits for the last of them, then runs all M backwards.
    t_fwd = f + ser + delay + f + (M - 1) * ser
    last_grad = t_fwd + b + ser + delay + (M - 1) * ser
    np.testing.assert_allclose(tl.finish[:, 0], [last_grad + M * b, t_fwd + M * b])
    # the trainer calls the order through the module, so it follows the same definition
    assert trainer.schedule_order.stage_order("gpipe", 2, 0, M) == [("F", m) for m in range(M)] + [("B", m) for m in range(M)]
    assert trainer.schedule_order.stage_order("1f1b", 3, 1, M) == real("1f1b", 3, 1, M)


@pytest.mark.parametrize("compute_s, second_ser", [
    (0.01, 0.1),  # back to back: the window the first message grew (114,480 B) carries 100 kB in one round
    (1.0, 0.2 + 0.04276),  # 0.543 s of silence > RTO 0.4 s: halved once (57,240 B), two rounds
])
def test_slow_start_after_idle_in_the_pipeline_engine(compute_s, second_ser):
    """Linux's slow start after idle: a hop's connection starts the iteration silent, so the first 100 kB
    activation goes from the initial window (14,480, 28,960, 57,920 B: 3 rounds of RTT 0.2 s at 1 MB/s);
    the second keeps the grown window unless its sender was silent for longer than the RTO."""
    from harness.netmodel.links import Links
    from harness.scenario.transport import LINUX
    from tests.conftest import make_topology

    delay = np.array([[0.0, 100.0], [100.0, 0.0]])
    links = Links.from_topology(make_topology(delay, np.full((2, 2), 0.008), transport=LINUX))
    f = np.full((2, 1), compute_s)
    zero = np.zeros((1, 1))
    nbytes = 100_000.0
    ser = links.serialization_s(0, 1, nbytes)
    assert ser == pytest.approx(0.1)  # a connection in use
    times = pipeline.StageTimes(f, f, np.full((1, 1), ser), np.full((1, 1), 0.1), np.full((1, 1), ser),
                                np.full((1, 1), 0.1), links, np.array([[0], [1]]), nbytes)
    first_ser = 2 * 0.2 + (nbytes - 43_440) / 1e6
    tl = pipeline.simulate(times, 2, "gpipe", overlap=True)
    second_depart = max(2 * compute_s, compute_s + first_ser)
    assert tl.fwd_span[0, 0] == pytest.approx(second_depart + second_ser + 0.1 - compute_s)
    in_use = pipeline.simulate(replace(times, links=None), 2, "gpipe", overlap=True)
    assert in_use.fwd_span[0, 0] == pytest.approx(max(2 * compute_s, compute_s + 0.1) + 0.2 - compute_s)
