"""The launcher's log of a shared cluster boot, cut per run at emulated_guest's marks (train/emulated.py)."""
from __future__ import annotations

import io
import threading

from harness.train.emulated_guest import BEGIN_MARK, END_MARK
from harness.train.emulated import _MarkedLog


def test_each_run_gets_its_lines_and_progress_is_passed_on():
    out = io.StringIO()
    log = _MarkedLog(out)
    log.write("import warning\n")
    log.write(f"{BEGIN_MARK}0\nharness: iteration 1/1: 1.00 s on rank 0\nrank noise\n{END_MARK}0\n")
    log.write(f"{BEGIN_MARK}1\nharness: iteration 1/1: 2.00 s on rank 0\n")
    assert log.part(0) == "import warning\nharness: iteration 1/1: 1.00 s on rank 0\nrank noise\n"
    assert log.part(1) == "harness: iteration 1/1: 2.00 s on rank 0\n"  # under way: so far
    assert out.getvalue() == "harness: iteration 1/1: 1.00 s on rank 0\nharness: iteration 1/1: 2.00 s on rank 0\n"


def test_waiting_for_a_run_ends_at_its_mark_or_when_the_cluster_stops():
    log, done = _MarkedLog(io.StringIO()), threading.Event()
    log.write(f"{BEGIN_MARK}0\n")
    ended = []
    waiter = threading.Thread(target=lambda: ended.append(log.wait_end(0, done)))
    waiter.start()
    log.write(f"{END_MARK}0\n")
    waiter.join(10)
    assert ended == [True]
    waiter = threading.Thread(target=lambda: ended.append(log.wait_end(1, done)))
    waiter.start()
    done.set()  # the cluster stopped during run 1
    waiter.join(10)
    assert ended == [True, False]
