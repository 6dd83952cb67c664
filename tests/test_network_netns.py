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


class _UnshareThenSignal:
    """libc whose unshare succeeds and then a signal handler raises (as harness emulate's on SIGTERM)."""

    def __init__(self, real):
        self._real = real

    def unshare(self, flags):
        assert self._real.unshare(flags) == 0
        raise KeyboardInterrupt("signal 15")

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_create_interrupted_after_its_unshare_returns_the_thread_and_leaves_no_file(tmp_path, monkeypatch):
    """CI, 2026-12-05: a SIGTERM during Cluster creation stranded the thread in a fresh namespace, and the
    teardown that followed could not see the host's bridge to delete it."""
    home = _current()
    path = str(tmp_path / "ns")
    monkeypatch.setattr(netns, "_libc", _UnshareThenSignal(netns._libc))
    with pytest.raises(KeyboardInterrupt):
        netns.create(path)
    assert _current() == home
    assert not os.path.exists(path)
