"""Fault injection: `kill -9` of the harness once at each phase a run passes through, at a fixed point of it.

Before its reaper exists (`harness emulate` at once after its start), while the user-mode Linux kernel boots (its
pid just written to the registry), at the launch gate (a launcher killed between starting the kernel's process and
letting it run), mid-iteration (`harness run --network emulated` once rank 0 has reported its first iteration; and
the same on loopback, `--network none`, whose forked ranks must go too, DiLoCo's with the torchft Lighthouse and
servers in them), and during the teardown (`harness emulate`
once its command has finished). After each, within 10 s and without `net clean`: no host process of any user-mode
Linux kernel of the harness (so no rank inside it), no reaper, no registry entry, no namespace, no temporary
directory, no `~/.uml` directory of it, and no manifest still `running` (the killed run's is `failed`, naming the
killed process). The same at random moments, 23 times: `make soak` (tests/soak/test_kill_random.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from harness.network import kernel, registry

from .kills import ARGV, ROOT, Cycle, isolated_env, leftovers, uml_dirs, wait_clean

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])
pytestmark = [pytest.mark.net, pytest.mark.timeout(400),
              pytest.mark.skipif(bool(_missing), reason=f"user-mode Linux unavailable: {', '.join(_missing)}")]

#: (command, phase, its sign): the kill comes as soon as the sign shows (polled every 10 ms).
POINTS = [
    ("emulate", "before the reaper", lambda c: True),
    ("emulate", "boot", lambda c: bool((c.entry("uml") or {}).get("uml_pid"))),
    ("run", "mid-iteration", lambda c: "harness: iteration 1/" in c.text()),
    ("loopback", "mid-iteration", lambda c: "harness: iteration 1/" in c.text()),
    ("loopback-diloco", "mid-iteration", lambda c: "harness: iteration 1/" in c.text()),
    ("emulate", "teardown", lambda c: "command-finished" in c.text()),
]
#: mid-iteration: enough iterations after the first that the run is still training when the kill comes
LONGER = ["--iters", "50"]


def test_kill_9_at_each_phase_leaves_nothing_within_10_s(tmp_path):
    env = isolated_env(tmp_path)
    uml_before = uml_dirs()
    owners: set[int] = set()
    assert not leftovers(tmp_path, uml_before, owners), "leftovers before the first kill"
    rows = []
    for k, (what, phase, sign) in enumerate(POINTS):
        argv = [*ARGV[what], *LONGER, "--results", str(tmp_path / f"results-{k}")] if what != "emulate" else None
        cycle = Cycle(what, phase, tmp_path, k, env, argv)
        owners.add(cycle.proc.pid)
        try:
            cycle.wait_for(sign)
        finally:
            landed = cycle.kill()
        # a reaper, once started, outlives its owner until it has torn the run down: none now, none before
        early = (cycle.reapers(), cycle.entry("uml")) if phase == "before the reaper" else None
        seconds, left = wait_clean(tmp_path, uml_before, owners)
        rows.append((k, what, phase, landed, seconds, left))
        if phase == "before the reaper":
            assert early == ([], None), f"the kill came after the reaper started: {early}"
        if phase == "mid-iteration":
            (manifest,) = cycle.manifests()
            assert manifest["status"] == "failed", manifest
            assert manifest["reason"].startswith(f"killed: the harness process (pid {cycle.proc.pid})"), manifest
    table = "\n".join(f"{k} {what:8s} {phase:17s} {'killed' if landed else 'ended first'} "
                      f"clean after {s:.2f} s{': LEFT ' + '; '.join(left) if left else ''}"
                      for k, what, phase, landed, s, left in rows)
    print(table)
    assert all(r[3] for r in rows), f"a command ended before its kill\n{table}"
    assert not [r for r in rows if r[5]], f"leftovers 10 s after a kill\n{table}"


LAUNCHER = textwrap.dedent("""
    import sys, time
    from harness.network.uml import spawn_gated
    proc, release = spawn_gated(["sh", "-c", "touch " + sys.argv[1], "umid=harness-gate00"])
    print(proc.pid, flush=True)
    time.sleep(120)  # killed here, before release()
""")


def test_a_launcher_killed_at_the_gate_never_starts_the_kernel(tmp_path):
    """The kernel's process is started held at a gate (network/uml.py: spawn_gated) until the launcher has written
    its pid to the registry; a launcher killed in between must leave a gate that exits without running it."""
    marker = tmp_path / "kernel-started"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(marker)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
    try:
        gate = int(launcher.stdout.readline())
    finally:
        launcher.kill()
        launcher.wait()
    # the gate's command line names the umid: it counts as a kernel's process until it is gone
    _, left = wait_clean(tmp_path, uml_dirs(), {launcher.pid})
    assert not left and not registry.pid_alive(gate), left
    assert not marker.exists(), "the gated command ran after its launcher was killed"
