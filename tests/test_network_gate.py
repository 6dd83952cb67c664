"""The gate a user-mode Linux kernel is started behind (harness.network.uml.spawn_gated).

A launcher killed between its fork and the moment it records the kernel's pid must not leave a
kernel behind: held at the gate, the command starts only once released, and never if the launcher
dies first. No kernel is needed to check it: the gated command here is a shell command.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.network import registry
from harness.network.uml import spawn_gated

ROOT = Path(__file__).resolve().parent.parent


def _wait_gone(pid: int, deadline_s: float = 10.0) -> bool:
    t0 = time.monotonic()
    while registry.pid_alive(pid):
        if time.monotonic() - t0 > deadline_s:
            return False
        time.sleep(0.02)
    return True


def test_released_command_runs_as_the_same_process_with_dev_null_stdin(tmp_path):
    out = tmp_path / "out.txt"
    proc, release = spawn_gated(["sh", "-c", 'echo $$; cat; echo started'], stdout=open(out, "w"))
    assert proc.poll() is None  # held at the gate
    assert not out.read_text()
    release()
    assert proc.wait(timeout=30) == 0
    pid, started = out.read_text().split()
    assert int(pid) == proc.pid and started == "started"  # exec'd in place; `cat` read /dev/null


def test_a_launcher_killed_before_release_leaves_nothing_started(tmp_path):
    """The launcher (a child python) spawns the gated command and is SIGKILLed before releasing it."""
    marker = tmp_path / "started"
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from harness.network.uml import spawn_gated\n"
         f"proc, release = spawn_gated(['sh', '-c', 'touch {marker}'])\n"
         "print(proc.pid, flush=True)\n"
         "time.sleep(60)\n"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        gated = int(launcher.stdout.readline())
        assert registry.pid_alive(gated)  # waiting at the gate
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert _wait_gone(gated), "the gated process outlived its launcher"
    assert not marker.exists()


def test_release_after_the_gate_was_killed_is_quiet():
    proc, release = spawn_gated(["true"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    release()  # no BrokenPipeError
    assert proc.returncode == -signal.SIGKILL
