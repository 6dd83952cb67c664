"""Fault injection: `kill -9` of the harness at random moments of emulated runs, 20 times.

Each kill lands in a phase chosen in turn (start-up, boot and shaping, the command or training,
teardown) at a random moment inside it, on `harness emulate` or `harness run --network emulated`;
then three on loopback (`harness run --network none`).
After each, within 10 s and without `net clean`: no host process of any user-mode Linux kernel
of the harness (so no rank inside it), no reaper, no registry entry, no namespace, no temporary
directory, no `~/.uml` directory of it, and no manifest still `running`.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.network import kernel, registry

ROOT = Path(__file__).resolve().parent.parent
NET4 = str(ROOT / "tests/data/net-4dev.yaml")

_missing = kernel.uml_missing() + ([] if os.geteuid() == 0 else ["root"])
pytestmark = [pytest.mark.net, pytest.mark.timeout(600),
              pytest.mark.skipif(bool(_missing), reason=f"user-mode Linux unavailable: {', '.join(_missing)}")]

EMULATE = ["emulate", "--scenario", NET4, "--kernel", "uml", "--timeout", "60", "--launcher", "--",
           "sh", "-c", "echo command-started; sleep 1; echo command-finished"]
TRAIN = ["run", "--scenario", "3", "--devices", "4", "--model", "tiny", "--layers", "2", "--batch", "4",
         "--micro-batch", "1", "--d-pp", "2", "--d-dp", "2", "--iters", "2", "--warmup", "1", "--timeout", "120"]
ARGV = {"emulate": EMULATE, "run": [*TRAIN, "--network", "emulated", "--kernel", "uml"],
        "loopback": [*TRAIN, "--network", "none", "--iters", "50"]}
#: Each phase: how long after its first sign a kill may come (uniformly at random).
WINDOW_S = {"start": 2.0, "boot": 3.0, "command": 1.5, "teardown": 0.5}
#: (command, phase) of the 20 kills. Training runs cost a boot plus the guest's imports each (~25 s):
#: the cheaper `harness emulate` takes most kills of the phases both share.
KILLS = ([("emulate", p) for p in ("start", "boot", "boot", "command", "teardown")] * 2
         + [("emulate", "boot"), ("emulate", "command"), ("emulate", "teardown")]
         + [("run", p) for p in ("start", "start", "boot", "boot", "command", "command", "teardown")])
#: And, beyond the 20, training on loopback (no cluster): its forked ranks go with it too.
LOOPBACK_KILLS = [("loopback", "start"), ("loopback", "command"), ("loopback", "command")]
CLEAN_DEADLINE_S = 10.0


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                pass
    return {pid: cmd for pid, cmd in out.items() if registry.pid_alive(pid)}


class _Cycle:
    """One harness command, killed in `phase` at a random moment."""

    def __init__(self, what: str, phase: str, base: Path, k: int, env: dict):
        self.what, self.phase, self.base = what, phase, base
        self.out, self.log = base / f"results-{k}", base / f"log-{k}.txt"
        argv = ARGV[what] if what == "emulate" else [*ARGV[what], "--results", str(self.out)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)

    def _text(self) -> str:
        return self.log.read_text(errors="replace")

    def _uml_entry(self) -> bool:
        for p in (self.base / "registry").glob("uml-*.json"):
            try:
                if json.loads(p.read_text()).get("pid") == self.proc.pid:
                    return True
            except FileNotFoundError:  # dropped between the listing and the read
                pass
        return False

    def _manifests(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in self.out.rglob("manifest.json")]

    def sign(self) -> bool:
        """The first sign of this cycle's phase."""
        if self.phase == "start":  # emulate: from its spawn; training: from its reaper's registration on
            return self.what == "emulate" or any((self.base / "registry").glob("run-*.json"))
        if self.phase == "boot":
            return self._uml_entry()
        if self.phase == "command":
            return ("command-started" if self.what == "emulate" else "harness: iteration") in self._text()
        if self.what == "emulate":
            return "command-finished" in self._text()
        return any(m["status"] == "ok" for m in self._manifests())

    def kill_in_phase(self, rng: random.Random) -> bool:
        """Wait for the phase, kill -9 at a random moment in it; False if the command ended first."""
        deadline = time.monotonic() + 120
        try:
            while not self.sign():
                assert self.proc.poll() is None, f"{self.what} ended before {self.phase}: {self._text()[-2000:]}"
                assert time.monotonic() < deadline, f"{self.what}: no sign of {self.phase} in 120 s"
                time.sleep(0.05)
            time.sleep(rng.uniform(0, WINDOW_S[self.phase]))  # the random moment itself, not a wait
        finally:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode == -9


def _is_reaper_of(cmd: bytes, owners: set[int]) -> bool:
    """A reaper of one of `owners` (others are the other test worker's runs)."""
    args = cmd.split(b"\0")
    return b"harness.network.reaper" in args and args[-2].isdigit() and int(args[-2]) in owners


def _leftovers(base: Path, uml_before: set[str], owners: set[int]) -> list[str]:
    # UML kernels (only the machine-wide tests boot them, one at a time), reapers, the commands and their ranks
    found = [f"process {pid}: {cmd[:120]!r}" for pid, cmd in _cmdlines().items()
             if b"umid=harness-" in cmd or _is_reaper_of(cmd, owners) or str(base).encode() in cmd]
    found += [f"registry entry {p.name}" for p in (base / "registry").glob("*.json")]
    found += [f"temporary directory {p}" for p in (base / "tmp").glob("harness-*")]  # not torch's caches
    found += [f"~/.uml/{p.name}" for p in (Path.home() / ".uml").glob("harness-*") if p.name not in uml_before]
    found += [f"namespace {n}" for n in registry.leftovers()["netns"]]
    found += [f"manifest running {p}" for p in base.glob("results-*/**/manifest.json")
              if json.loads(p.read_text())["status"] == "running"]
    return found


def test_kill_9_at_random_moments_leaves_nothing_within_10_s(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "HARNESS_NET_REGISTRY": str(tmp_path / "registry")}
    uml_before = {p.name for p in (Path.home() / ".uml").glob("harness-*")}
    owners: set[int] = set()
    assert not _leftovers(tmp_path, uml_before, owners), "leftovers before the first kill"
    rows, failed_manifests = [], 0
    for what, phase in KILLS + LOOPBACK_KILLS:
        for _attempt in range(3):  # again when the command ended before its kill (a short teardown)
            k = len(rows)
            cycle = _Cycle(what, phase, tmp_path, k, env)
            owners.add(cycle.proc.pid)
            landed = cycle.kill_in_phase(rng)
            t0 = time.monotonic()
            while (left := _leftovers(tmp_path, uml_before, owners)) and time.monotonic() - t0 < CLEAN_DEADLINE_S:
                time.sleep(0.05)
            rows.append((k, what, phase, landed, time.monotonic() - t0, left))
            for m in cycle._manifests():
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
