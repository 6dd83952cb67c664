"""What a run created, so that exactly that is removed, also after a SIGKILL.

Every name carries the run id and a dedicated prefix (`harness-<rid>-<i>` namespaces,
`hnb-<rid>` bridge, `hnv-<rid>-<i>` veths, `harness-<rid>` UML instances). A run
writes its registry entry *before* creating anything (an intent log), updates it as
it goes, and removes it after its own teardown. `clean()` tears down the entries
whose owning process is gone; nothing that is not in a registry entry is touched.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..files import atomic_write_json

def _registry_dir() -> Path:
    """/run/harness-net for root (gone at reboot, like namespaces); per user otherwise
    (a user-mode Linux run needs no root)."""
    if "HARNESS_NET_REGISTRY" in os.environ:
        return Path(os.environ["HARNESS_NET_REGISTRY"])
    if os.geteuid() == 0:
        return Path("/run/harness-net")
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/harness-net-{os.geteuid()}"
    return Path(base) / "harness-net"


REGISTRY_DIR = _registry_dir()
RUN_ID_RE = re.compile(r"^[0-9a-f]{6}$")
NETNS_RE = re.compile(r"^harness-[0-9a-f]{6}-\d+$")
LINK_RE = re.compile(r"^hn[bvp]-[0-9a-f]{6}(-\d+)?$")


def new_run_id() -> str:
    return secrets.token_hex(3)


def planned_dir(prefix: str, rid: str, parent: str | None = None) -> Path:
    """A fresh directory path for run `rid`, named before it is created (an entry lists it first);
    in `parent` or the system's temporary directory."""
    return Path(parent or tempfile.gettempdir()) / f"{prefix}{rid}-{secrets.token_hex(4)}"


def netns_name(rid: str, i: int) -> str:
    return f"harness-{rid}-{i}"


def bridge_name(rid: str) -> str:
    return f"hnb-{rid}"


def host_veth_name(rid: str, i: int) -> str:
    return f"hnv-{rid}-{i}"


def device_ifname(rid: str, i: int) -> str:
    return f"hnp-{rid}-{i}"


def umid(rid: str) -> str:
    return f"harness-{rid}"


@dataclass
class Entry:
    run_id: str
    pid: int  # owner; the entry is stale once it is gone
    kind: str  # "cluster" (namespaces here) | "uml" (a UML kernel) | "job" (a job dir) | "node" (net apply)
    #          | "run" (a training command's work dir and manifests, reaper.guarded)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    uml_pid: int = 0
    job_dir: str = ""
    created: float = field(default_factory=time.time)
    temp_dirs: list[str] = field(default_factory=list)  # the run's own temporary directories
    manifests: list[str] = field(default_factory=list)  # the runs' manifest.json: failed if left `running`

    @property
    def path(self) -> Path:
        return REGISTRY_DIR / f"{self.kind}-{self.run_id}.json"

    def holds(self) -> str:
        """What the entry lists, for `net show` and `net clean`."""
        parts = [f"UML kernel pid {self.uml_pid}"] if self.uml_pid else []
        parts += [f"{len(self.netns)} namespaces, {len(self.links)} links"] if self.netns or self.links else []
        parts += [f"{len(self.temp_dirs)} temporary directories"] if self.temp_dirs else []
        parts += [f"{len(self.manifests)} manifests"] if self.manifests else []
        return ", ".join(parts) or "nothing yet"

    def save(self) -> None:
        REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, asdict(self))

    def drop(self) -> None:
        self.path.unlink(missing_ok=True)


def entries() -> list[Entry]:
    out = []
    for p in sorted(REGISTRY_DIR.glob("*.json")) if REGISTRY_DIR.is_dir() else []:
        try:
            out.append(Entry(**json.loads(p.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _is_our_uml(pid: int, rid: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"umid={umid(rid)}".encode() in cmd


#: How long kill_uml waits for the last host process of a UML kernel to go.
UML_EXIT_DEADLINE_S = 10.0


def _uml_pids(rid: str) -> list[int]:
    """Live host processes of run `rid`'s UML kernel: UML runs as several, all with its umid= argument."""
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and _is_our_uml(int(name), rid) and pid_alive(int(name))]


def kill_uml(pid: int, rid: str) -> None:
    """Stop the UML kernel of run `rid`: its process group (after checking the main process is ours),
    then every other host process with its umid, and return once none is left (or after the deadline).
    The main process may already be gone while the others are still exiting (a killed launcher)."""
    seen = set()
    if _is_our_uml(pid, rid):
        seen.add(pid)
        try:
            pgid = os.getpgid(pid)
            if pgid == pid:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # An exiting process may have released its memory, and with it its command line, while it is
    # still alive: wait on every process seen, not only on those the umid still finds.
    deadline = time.monotonic() + UML_EXIT_DEADLINE_S
    while time.monotonic() < deadline:
        found = _uml_pids(rid)
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        seen = {p for p in seen | set(found) if pid_alive(p)}
        if not seen:
            return
        time.sleep(0.05)


def remove_uml_leftovers(rid: str) -> None:
    shutil.rmtree(Path.home() / ".uml" / umid(rid), ignore_errors=True)


def teardown(entry: Entry, reason: str = "") -> None:
    """Remove everything `entry` lists (missing pieces are fine: idempotent); its manifests still
    `running` become `failed` with `reason` (default: its owner is gone)."""
    if entry.kind == "uml":
        kill_uml(entry.uml_pid, entry.run_id)
        remove_uml_leftovers(entry.run_id)
    for d in [entry.job_dir, *entry.temp_dirs]:
        if d:
            shutil.rmtree(d, ignore_errors=True)
    for m in entry.manifests:
        fail_if_running(Path(m), reason or f"killed: its harness process (pid {entry.pid}) is gone")
    if entry.netns or entry.links:
        from .apply import delete_links, delete_netns

        delete_netns([n for n in entry.netns if NETNS_RE.match(n)])
        delete_links([n for n in entry.links if LINK_RE.match(n)])
    entry.drop()


def fail_if_running(path: Path, reason: str) -> bool:
    """Rewrite a run's manifest from `running` to `failed` with `reason` (atomically); True if it did."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get("status") != "running":
        return False
    atomic_write_json(path, {**doc, "status": "failed", "reason": reason})
    return True


def clean(*, include_live: bool = False) -> list[Entry]:
    """Tear down the entries of runs that are gone (or all, with include_live); return them."""
    done = []
    for e in entries():
        if e.kind == "node" and not include_live:
            continue  # real-node shaping stays until `net clear`
        if include_live or not pid_alive(e.pid):
            teardown(e)
            done.append(e)
    return done


def leftovers() -> dict[str, list[str]]:
    """Harness-named namespaces and links that exist in this kernel (for `net show`/`clean`)."""
    from pyroute2 import IPRoute, netns

    names = sorted(n for n in netns.listnetns() if NETNS_RE.match(n))
    with IPRoute() as ipr:
        links = sorted(name for name in (m.get_attr("IFLA_IFNAME") for m in ipr.get_links())
                       if name and LINK_RE.match(name))
    return {"netns": names, "links": links}
