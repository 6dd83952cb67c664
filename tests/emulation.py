"""What the emulated-cluster tests share: whether this machine can run the cluster, as a skip reason; the host's
namespaces that no run registered here accounts for."""
from __future__ import annotations

import os

import pytest

from harness.network import kernel, registry


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


def unaccounted_namespaces() -> list[str]:
    """Harness namespaces on the host that no entry of this machine's registry lists: what a run left behind. The
    Slurm tests run beside the emulated ones (their own xdist group) and register theirs, so a test that checks
    for leftovers looks only at these (entries are written before a namespace and dropped after it)."""
    listed = {n for e in registry.entries() for n in e.netns}
    names = registry.leftovers()["netns"]
    listed |= {n for e in registry.entries() for n in e.netns}  # one torn down between the two reads
    return [n for n in names if n not in listed]
