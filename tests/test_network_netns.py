"""harness.network.netns.inside returns the thread to its namespace on every path.

A SIGTERM handler that raises (harness emulate's) can interrupt `enter` after its setns has
already moved the thread; the namespace must be restored then too, or the teardown that follows
runs in the device's namespace and leaves the host's bridge behind (CI, 2026-12-03).
"""
from __future__ import annotations

import os
import subprocess

import pytest

from harness.network import netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating a network namespace needs root")


def _current() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


@pytest.fixture
def namespace(tmp_path):
    path = str(tmp_path / "ns")
    netns.create(path)
    yield path
    subprocess.run(["umount", path], check=True)
    os.unlink(path)


def test_inside_enters_and_returns(namespace):
    home = _current()
    with netns.inside(namespace):
        assert _current() == os.stat(namespace).st_ino != home
    assert _current() == home


def test_an_exception_raised_in_enter_after_its_setns_still_returns(namespace, monkeypatch):
    home = _current()
    real = netns.enter

    def interrupted(path):  # as a signal handler raising in enter's `finally: os.close(fd)`
        real(path)
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(netns, "enter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with netns.inside(namespace):
            pytest.fail("the block must not run")
    assert _current() == home
