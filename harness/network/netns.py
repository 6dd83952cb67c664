"""Entering and creating network namespaces without forking (Python 3.11 has no os.setns).

Launcher-mode programs (one Python process that imports torch once and forks one
child per device) call `enter(netns_path)` in each child before opening sockets.
"""
from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

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


MS_BIND = 0x1000
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
MNT_DETACH = 0x2
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


@contextmanager
def inside(netns_path: str):
    """Run the calling thread inside the namespace for the block (sockets opened there stay
    bound to it), then return it to the namespace it came from."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:  # `enter` itself inside: a signal handler that raises after its setns must not strand us there
            enter(netns_path)
            yield
        finally:
            _check(_libc.setns(back, CLONE_NEWNET), "setns(back)")
    finally:
        os.close(back)


def create(netns_path: str) -> None:
    """`ip netns add` without forking: a new namespace bind-mounted at `netns_path`."""
    os.makedirs(os.path.dirname(netns_path), exist_ok=True)
    os.close(os.open(netns_path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:  # back on every path: a signal handler that raises just after unshare must not strand the thread
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            _check(_libc.mount(b"/proc/thread-self/ns/net", netns_path.encode(), b"none", MS_BIND, None),
                   f"mount --bind {netns_path}")
        finally:
            _check(_libc.setns(back, CLONE_NEWNET), "setns(back)")
    except BaseException:
        _libc.umount2(netns_path.encode(), MNT_DETACH)  # bound before the exception came: unbind (harmless if not)
        os.unlink(netns_path)
        raise
    finally:
        os.close(back)
