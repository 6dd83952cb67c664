"""What the emulated-cluster tests share: whether this machine can run the cluster, as a skip reason."""
from __future__ import annotations

import os

import pytest

from harness.network import kernel


def missing() -> str:
    """Why the emulated cluster cannot run here ('' when it can)."""
    try:
        kernel.choose("auto")
    except kernel.KernelError as e:
        return str(e)
    return "" if os.geteuid() == 0 else "needs root for namespaces"


def marks(timeout_s: int = 300) -> list:
    """An emulated test's marks: `net`, a timeout, and a skip that names what this machine lacks."""
    why = missing()
    return [pytest.mark.net, pytest.mark.timeout(timeout_s),
            pytest.mark.skipif(bool(why), reason=f"emulated cluster unavailable: {why}")]
