"""Entering a network namespace from a forked child (Python 3.11 has no os.setns).

Launcher-mode programs (one Python process that imports torch once and forks one
child per device) call `enter(netns_path)` in each child before opening sockets.
"""
from __future__ import annotations

import ctypes
import os

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def enter(netns_path: str) -> None:
    """Move the calling thread (a forked, single-threaded child) into the namespace at `netns_path`."""
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns_path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in(netns_path: str, fn) -> None:
    """Run `fn()` in a forked child inside the namespace; raise if it fails."""
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            enter(netns_path)
            fn()
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            os.write(2, f"netns.run_in({netns_path}): {e}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"netns.run_in({netns_path}) failed")
