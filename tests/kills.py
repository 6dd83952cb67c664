"""What the kill tests share (tests/test_killed_runs.py at fixed points, tests/soak/test_kill_random.py at random
moments): a harness command started in a subprocess, waited on until a sign of a phase, then `kill -9`; and the
list of what it left behind (none may be left 10 s after the kill, without `net clean`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.network import registry

from .emulation import unaccounted_namespaces

ROOT = Path(__file__).resolve().parent.parent
NET4 = str(ROOT / "tests/data/net-4dev.yaml")

EMULATE = ["emulate", "--scenario", NET4, "--kernel", "uml", "--timeout", "60", "--launcher", "--",
           "sh", "-c", "echo command-started; sleep 1; echo command-finished"]
TRAIN = ["run", "--scenario", "3", "--devices", "4", "--model", "tiny", "--layers", "2", "--batch", "4",
         "--micro-batch", "1", "--d-pp", "2", "--d-dp", "2", "--iters", "2", "--warmup", "1", "--timeout", "120"]
#: DiLoCo on torchft: its Lighthouse and each replica's store and manager server live in the ranks
DILOCO = ["run", "--system", "diloco", "--scenario", "3", "--devices", "4", "--model", "tiny", "--layers", "2",
          "--batch", "4", "--micro-batch", "1", "--sync-every", "2", "--iters", "2", "--warmup", "1",
          "--timeout", "120"]
ARGV = {"emulate": EMULATE, "run": [*TRAIN, "--network", "emulated", "--kernel", "uml"],
        "loopback": [*TRAIN, "--network", "none", "--iters", "50"],
        "loopback-diloco": [*DILOCO, "--network", "none", "--iters", "50"]}
CLEAN_DEADLINE_S = 10.0
#: How long the command may take to show the sign of a phase (a boot and the guest's imports, on a loaded machine).
SIGN_DEADLINE_S = 120.0


def isolated_env(base: Path) -> dict:
    """The environment of the killed commands: their own temporary directory and network registry under `base`,
    so that what they leave is told apart from the other test worker's runs."""
    (base / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(base / "tmp"), "HARNESS_NET_REGISTRY": str(base / "registry")}


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                pass
    return {pid: cmd for pid, cmd in out.items() if registry.pid_alive(pid)}


class Cycle:
    """One harness command (`what`: a key of ARGV, or an argv of its own), to be killed in `phase`."""

    def __init__(self, what: str, phase: str, base: Path, k: int, env: dict, argv: list[str] | None = None):
        self.what, self.phase, self.base = what, phase, base
        self.out, self.log = base / f"results-{k}", base / f"log-{k}.txt"
        argv = argv or (ARGV[what] if what == "emulate" else [*ARGV[what], "--results", str(self.out)])
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def entry(self, kind: str) -> dict | None:
        """This command's registry entry of `kind` ("uml", "run"), if written."""
        for p in (self.base / "registry").glob(f"{kind}-*.json"):
            try:
                doc = json.loads(p.read_text())
            except (FileNotFoundError, ValueError):  # dropped or being replaced between the listing and the read
                continue
            if doc.get("pid") == self.proc.pid:
                return doc
        return None

    def reapers(self) -> list[int]:
        return [pid for pid, cmd in _cmdlines().items() if is_reaper_of(cmd, {self.proc.pid})]

    def manifests(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in self.out.rglob("manifest.json")]

    def wait_for(self, sign, tick_s: float = 0.01) -> None:
        """Poll `sign(self)` until true; fail if the command ends first or shows no sign in SIGN_DEADLINE_S."""
        deadline = time.monotonic() + SIGN_DEADLINE_S
        while not sign(self):
            assert self.proc.poll() is None, f"{self.what} ended before {self.phase}: {self.text()[-2000:]}"
            assert time.monotonic() < deadline, f"{self.what}: no sign of {self.phase} in {SIGN_DEADLINE_S:.0f} s"
            time.sleep(tick_s)

    def kill(self) -> bool:
        """kill -9 now; False if the command had ended by itself first."""
        self.proc.kill()
        self.proc.wait()
        return self.proc.returncode == -9


def is_reaper_of(cmd: bytes, owners: set[int]) -> bool:
    """A reaper of one of `owners` (others are the other test worker's runs)."""
    args = cmd.split(b"\0")
    return b"harness.network.reaper" in args and args[-2].isdigit() and int(args[-2]) in owners


def leftovers(base: Path, uml_before: set[str], owners: set[int]) -> list[str]:
    """What the killed commands of `owners` (run with isolated_env(base)) left on this machine."""
    # UML kernels (only the machine-wide tests boot them, one at a time), reapers, the commands and their ranks
    found = [f"process {pid}: {cmd[:120]!r}" for pid, cmd in _cmdlines().items()
             if b"umid=harness-" in cmd or is_reaper_of(cmd, owners) or str(base).encode() in cmd]
    found += [f"registry entry {p.name}" for p in (base / "registry").glob("*.json")]
    found += [f"temporary directory {p}" for p in (base / "tmp").glob("harness-*")]  # not torch's caches
    found += [f"~/.uml/{p.name}" for p in (Path.home() / ".uml").glob("harness-*") if p.name not in uml_before]
    # the killed commands' entries are under `base`: a namespace the machine's registry lists is another test's
    found += [f"namespace {n}" for n in unaccounted_namespaces()]
    found += [f"manifest running {p}" for p in base.glob("results-*/**/manifest.json")
              if json.loads(p.read_text())["status"] == "running"]
    return found


def uml_dirs() -> set[str]:
    return {p.name for p in (Path.home() / ".uml").glob("harness-*")}


def wait_clean(base: Path, uml_before: set[str], owners: set[int]) -> tuple[float, list[str]]:
    """Seconds until nothing of `owners` is left (at most CLEAN_DEADLINE_S), and what is left then."""
    t0 = time.monotonic()
    while (left := leftovers(base, uml_before, owners)) and time.monotonic() - t0 < CLEAN_DEADLINE_S:
        time.sleep(0.05)
    return time.monotonic() - t0, left
