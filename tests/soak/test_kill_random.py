"""Soak (`make soak`, not in `make test`): `kill -9` of the harness at random moments of emulated runs, 20 times,
then three on loopback. tests/test_killed_runs.py kills once at a fixed point of each phase; this repeats the
kills at moments no one chose, which is what finds a window the fixed points miss. Run it once after a change to a
cleanup path (reaper, registry, teardown, the launch gate).

Each kill lands in a phase chosen in turn (start-up, boot and shaping, the command or training, teardown) at a
random moment inside it, on `harness emulate` or `harness run --network emulated`; then three on loopback
(`harness run --network none`). After each, within 10 s and without `net clean`: nothing left (tests/kills.py).
"""
from __future__ import annotations

import os
import random
import time

import pytest

from harness.network import kernel

from ..kills import Cycle, isolated_env, leftovers, uml_dirs, wait_clean

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])
pytestmark = [pytest.mark.net, pytest.mark.timeout(900),
              pytest.mark.skipif(bool(_missing), reason=f"user-mode Linux unavailable: {', '.join(_missing)}")]

#: Each phase: how long after its first sign a kill may come (uniformly at random).
WINDOW_S = {"start": 2.0, "boot": 3.0, "command": 1.5, "teardown": 0.5}
#: (command, phase) of the 20 kills. Training runs cost a boot plus the guest's imports each (~25 s):
#: the cheaper `harness emulate` takes most kills of the phases both share.
KILLS = ([("emulate", p) for p in ("start", "boot", "boot", "command", "teardown")] * 2
         + [("emulate", "boot"), ("emulate", "command"), ("emulate", "teardown")]
         + [("run", p) for p in ("start", "start", "boot", "boot", "command", "command", "teardown")])
#: And, beyond the 20, training on loopback (no cluster): its forked ranks go with it too.
LOOPBACK_KILLS = [("loopback", "start"), ("loopback", "command"), ("loopback", "command")]


def _sign(c: Cycle) -> bool:
    """The first sign of the cycle's phase."""
    if c.phase == "start":  # emulate: from its spawn; training: from its reaper's registration on
        return c.what == "emulate" or any((c.base / "registry").glob("run-*.json"))
    if c.phase == "boot":
        return c.entry("uml") is not None
    if c.phase == "command":
        return ("command-started" if c.what == "emulate" else "harness: iteration") in c.text()
    if c.what == "emulate":
        return "command-finished" in c.text()
    return any(m["status"] == "ok" for m in c.manifests())


def test_kill_9_at_random_moments_leaves_nothing_within_10_s(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    env = isolated_env(tmp_path)
    uml_before = uml_dirs()
    owners: set[int] = set()
    assert not leftovers(tmp_path, uml_before, owners), "leftovers before the first kill"
    rows, failed_manifests = [], 0
    for what, phase in KILLS + LOOPBACK_KILLS:
        for _attempt in range(3):  # again when the command ended before its kill (a short teardown)
            k = len(rows)
            cycle = Cycle(what, phase, tmp_path, k, env)
            owners.add(cycle.proc.pid)
            try:
                cycle.wait_for(_sign, tick_s=0.05)
                time.sleep(rng.uniform(0, WINDOW_S[phase]))  # the random moment itself, not a wait
            finally:
                landed = cycle.kill()
            seconds, left = wait_clean(tmp_path, uml_before, owners)
            rows.append((k, what, phase, landed, seconds, left))
            for m in cycle.manifests():
                if landed and m["status"] == "failed":
                    failed_manifests += 1
                    assert m["reason"].startswith(f"killed: the harness process (pid {cycle.proc.pid})"), m["reason"]
            if landed:
                break
    table = "\n".join(f"{k:2d} {what:8s} {phase:9s} {'killed' if landed else 'ended first'} "
                      f"clean after {s:.2f} s{': LEFT ' + '; '.join(left) if left else ''}"
                      for k, what, phase, landed, s, left in rows)
    print(f"seed {seed}\n{table}")
    assert not [r for r in rows if r[5]], f"seed {seed}: leftovers 10 s after a kill\n{table}"
    landed = sum(r[3] for r in rows if r[1] != "loopback")
    assert landed == len(KILLS), f"seed {seed}: {landed} of {len(KILLS)} kills landed\n{table}"
    assert failed_manifests >= 1, f"no killed run left a failed manifest\n{table}"
