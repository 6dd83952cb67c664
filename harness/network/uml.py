"""Boot a user-mode Linux kernel that runs one job of the emulated cluster, and wait for it.

The Debian `user-mode-linux` package is a Linux 6.1 kernel (with sch_netem, sch_htb,
cls_u32, veth, bridge as modules) that runs as an ordinary host process. It boots with
the host's / as its root (hostfs), so the project's venv and the caller's working
directory are there and the same Python code runs inside. Boot takes ~4 s.

Resources of the guest: ONE virtual CPU (all user-space compute inside UML, e.g. 8
torch ranks, shares one host core) and `mem` of RAM: half the host's memory, at least
6 GiB and at most 32 GiB (enough for 8 ranks that each import torch, ~0.5 GiB each;
the guest's memory is a sparse file, so unused memory costs nothing).

The host learns the outcome only through files in the job directory (hostfs): the exit
status of linux.uml does not carry the guest's. Hosts whose XSAVE area is larger than
UML 6.1 expects (AVX-512/AMX CPUs) need `uml_xstate_shim.c`, built here with the C
compiler on first use and preloaded into linux.uml.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..errors import HarnessError
from . import registry, runner
from .kernel import UML_BINARY, UML_MODULES

MODULES = ("sch_netem", "sch_htb", "cls_u32", "veth", "bridge", "macvlan", "dummy", "tcp_bbr")
MEM_MIN = 6 << 30
MEM_MAX = 32 << 30
SHIM_SRC = Path(__file__).with_name("uml_xstate_shim.c")


class UMLError(HarnessError, RuntimeError):
    """The user-mode Linux kernel could not run the job (one line; console tail in the message)."""


def guest_memory_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(MEM_MAX, max(MEM_MIN, total // 2)))


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "harness"


def xstate_shim() -> Path | None:
    """Path of the compiled shim (built once per source version); None without a C compiler."""
    src = SHIM_SRC.read_bytes()
    out = _cache_dir() / f"uml-xstate-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SRC), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise UMLError(f"{SHIM_SRC}: C compiler failed: {r.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)
    return out


def init_script(job_dir: Path, cwd: str) -> str:
    """The guest's init: mounts, modules, the job, power off."""
    py = sys.executable
    root = Path(__file__).resolve().parents[2]
    mods = " ".join(MODULES)
    return f"""#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME={Path.home()}
export PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmpfs /run && mkdir -p /run/netns
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /mnt && mkdir -p /mnt/lib/modules && mount --bind {UML_MODULES} /mnt/lib/modules
for m in {mods}; do modprobe -d /mnt $m || echo "harness-guest: modprobe $m failed"; done
ip link set lo up
cd {cwd} && {py} -m harness.network.guest {job_dir}
halt -f
"""


#: The emulated links' timing depends on UML being scheduled promptly; on a busy host
#: raise its priority (root only; otherwise it runs at normal priority).
UML_NICE = -10


def _raise_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, UML_NICE)
    except OSError:
        pass


#: Reads one line (the go) from stdin, then becomes the command (same pid) with /dev/null as its
#: stdin; end of file instead (the launcher is gone) exits 1 without starting it.
_GATE = 'read -r go || exit 1; exec "$@" </dev/null'


def spawn_gated(cmd: list[str], **popen_kwargs) -> tuple[subprocess.Popen, Callable[[], None]]:
    """Start `cmd` held at a gate, and the function that lets it run (its stdin is /dev/null).

    Why: a launcher killed between its fork and the moment it records the kernel's pid in the
    registry would leave a kernel its reaper cannot know of (one that may create its ~/.uml
    directory after the teardown). Held at the gate, the process is a shell whose command line
    already names the umid; if the launcher dies before `release()`, the gate reads end of file
    and the command never starts."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(["sh", "-c", _GATE, "sh", *cmd], stdin=r, **popen_kwargs)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)

    def release() -> None:
        try:
            os.write(w, b"go\n")
        except BrokenPipeError:  # the gate is gone already (killed): the caller sees it exit
            pass
        finally:
            os.close(w)

    return proc, release


def boot(job_dir: Path, entry: registry.Entry, *, cwd: str, wall_timeout_s: float,
         started: Callable[[int], None] | None = None) -> bool:
    """Boot UML on the job in `job_dir`, wait for it to halt; False if it had to be killed. `started(pid)` is
    called with the kernel's host pid once it runs (its process tree is the guest's one CPU)."""
    script = job_dir / "init.sh"
    script.write_text(init_script(job_dir, cwd))
    script.chmod(0o755)
    env = dict(os.environ)
    shim = xstate_shim()
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    rid = entry.run_id
    registry.remove_uml_leftovers(rid)
    cmd = [UML_BINARY, f"mem={guest_memory_bytes() >> 20}M", f"umid={registry.umid(rid)}",
           "rootfstype=hostfs", "rw", f"init={script}", "con=null", "con0=null,fd:1"]
    with open(job_dir / "console.log", "wb") as console:
        proc, release = spawn_gated(cmd, stdout=console, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, preexec_fn=_raise_priority)
    entry.uml_pid = proc.pid
    entry.save()
    release()
    if started is not None:
        started(proc.pid)
    deadline = time.monotonic() + wall_timeout_s
    try:
        while proc.poll() is None:
            if runner.stop_requested.is_set():
                raise runner.Stopped("stop requested")
            if time.monotonic() > deadline:
                registry.kill_uml(proc.pid, rid)
                proc.wait()
                return False
            time.sleep(0.05)
        return True
    finally:
        if proc.poll() is None:
            registry.kill_uml(proc.pid, rid)
            proc.wait()


def console_tail(job_dir: Path, lines: int = 5) -> str:
    try:
        text = (job_dir / "console.log").read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" [<")]
    return " | ".join(keep[-lines:])

