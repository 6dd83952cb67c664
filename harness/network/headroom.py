"""How much of its CPU the emulated cluster used: the headroom that says whether a run measured the links or the host.

Under user-mode Linux every rank, every TCP stack and every netem queue of the cluster runs on ONE virtual CPU,
which is one tree of host processes. When that CPU is busy most of the time, an iteration waits for it, not for the
shaped links, and its time says nothing about the network. Sampled every 0.1 s:
- `busy`, the host's account: the CPU seconds of the kernel's host processes (their own and their reaped
  children's) per second of wall clock, against the CPUs they can use (1 under UML; the host's under the host
  kernel). The guest's own /proc/stat cannot say (Debian's UML kernel counts no idle time there).
- the guest's run queue, beside it: a sampler inside the kernel (`guest_sampler`, started by the launcher) reads
  procs_running; `saturated` is the share of its samples in which a task waited for the CPU. It reads higher than
  `busy`: UML keeps tasks runnable while it waits on the host (its process switches), time the host's core is free.
- the host's steal and run queue (a busy host slows the vCPU without the tree showing more work).
An iteration is host-bound when its CPU was busy for most of it and that delayed the work (host_bound()).

Measured on the 2-core machine this was written on (8 Horovod ranks, tiny GPT, hetpipe-testbed, one iteration
each): undilated, 83 % busy for 2 s iterations the simulator puts at 3 ms; dilated 4500 times, 74 % busy for 11 s;
dilated 15000 times, 33-39 % for 37 s (the guest's samples: 45 % saturated). What an iteration costs the CPU grows
as the links' rate falls (2 CPU s undilated, 8 at 4500, 12-14 at 15000): at a few Mbit/s per link a transfer wakes
the gloo threads for every few segments, each wake-up dear under UML. Yet dilated 4500 and 15000 times the
iterations took the same share of the simulator's time (0.84 and 0.82), their phases on time: a CPU busy with those
wake-ups keeps up, so busy alone does not make an iteration host-bound (host_bound()). Time dilation (DieCast,
NSDI'08) is the cure for the undilated case: every compute phase and every link k times slower (plan/dilation.py).
"""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: An iteration can be host-bound when its CPU ran for at least this share of it (host_bound()).
HOST_BOUND_BUSY = 0.5
#: ... and, with the compute model, its phases ended this share of the iteration late.
LATE_SHARE = 0.05
INTERVAL_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """One look at the cluster: wall clock (time.time(), which a UML guest shares with its host), the tree's
    cumulative CPU seconds, the host's cumulative steal seconds (all its CPUs) and its runnable tasks now."""

    t: float
    cpu_s: float
    steal_s: float
    run_queue: int


@dataclass(frozen=True)
class Headroom:
    """The cluster's CPU over one interval of wall clock (an iteration, a run)."""

    busy: float  # the share of its CPUs the cluster's host processes used (their CPU seconds per second)
    saturated: float  # the guest's samples in which a task waited for its CPU (more runnable than CPUs), share
    runnable: float  # the guest's runnable tasks besides its sampler, mean (nan: no guest samples)
    steal: float  # the host's steal, share of its CPUs
    run_queue: float  # the host's runnable tasks per CPU, mean of the samples

    def to_json(self) -> dict:
        return {k: None if math.isnan(v) else round(v, 4) for k, v in asdict(self).items()}


def host_bound(h: Headroom | None, paced: bool, overruns: int = 0, late_s: float = 0.0, seconds: float = 0.0) -> bool:
    """Whether an iteration measured the host: its CPU was busy for most of it (busy >= HOST_BOUND_BUSY) and
    that delayed the work. Without the compute model (`paced`) the ranks' compute is the host's own, so a busy CPU
    is enough; with it, the modelled phases must also have run late: a real computation that outran its modelled
    time (`overruns`), or phases that woke after their deadlines for LATE_SHARE of the iteration (`late_s` of
    `seconds`). A busy CPU whose phases were on time kept up: at slow link rates the ranks' transport threads
    fill the CPU with wake-ups a few segments apart, and the iteration still took the modelled time (module
    docstring). A transfer the CPU slowed is not seen by the phases; the simulator's comparison is the check."""
    if h is None or h.busy < HOST_BOUND_BUSY:
        return False
    return not paced or overruns > 0 or late_s >= LATE_SHARE * seconds


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def _cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`: its own CPU and that of the children it reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every live descendant (each counts its reaped children: every second once)."""
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _cpu_seconds(pid)
        todo += _children(pid)
    return total


def host_steal_and_queue() -> tuple[float, int]:
    """The host's cumulative steal seconds (all CPUs) and its runnable tasks now, from /proc/stat."""
    steal, running = 0.0, 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu "):
                vals = line.split()[1:]
                steal = int(vals[7]) / _TICK if len(vals) > 7 else 0.0
            elif line.startswith("procs_running "):
                running = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return steal, running


class CpuMonitor:
    """Samples a process tree (the emulated cluster) every `interval_s` from `watch(pid)` until `stop()`;
    `window(t0, t1)` is its Headroom between two wall-clock times. `capacity`: the CPUs the tree can use."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.capacity = 1.0
        self.host_cpus = os.cpu_count() or 1
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._root = 0
        self._carry = 0.0  # CPU seconds of descendants that left the tree unreaped (kept: never counts down)
        self._last = 0.0

    def watch(self, pid: int, capacity: float) -> None:
        self._root, self.capacity = pid, float(capacity)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="harness-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _take(self) -> None:
        cpu = tree_cpu_seconds(self._root)
        if cpu < self._last:  # a process left the tree with its seconds: the series stays cumulative
            self._carry += self._last - cpu
        self._last = cpu
        steal, queue = host_steal_and_queue()
        with self._lock:
            self.samples.append(Sample(time.time(), cpu + self._carry, steal, queue))

    def _run(self) -> None:
        self._take()
        while not self._stop.wait(self.interval_s):
            self._take()
        self._take()

    def window(self, t0: float, t1: float, offset: float = 0.0, guest: list | None = None) -> Headroom | None:
        """The headroom between times t0 < t1 of a clock that is `offset` behind the wall clock (the ranks'
        time.monotonic()); None without samples around it. Waits (briefly) for the sample after t1."""
        deadline = time.monotonic() + 5 * self.interval_s
        while self._thread is not None and time.monotonic() < deadline:
            with self._lock:
                if self.samples and self.samples[-1].t >= t1 + offset:
                    break
            time.sleep(self.interval_s / 2)
        with self._lock:
            samples = list(self.samples)
        return headroom(samples, t0 + offset, t1 + offset, self.capacity, self.host_cpus, guest)

    def series(self, t0: float, t1: float, offset: float = 0.0) -> list[Sample]:
        """The samples from the last one before t0 to the first one after t1 (a clock `offset` behind the wall's)."""
        t0, t1 = t0 + offset, t1 + offset
        with self._lock:
            samples = list(self.samples)
        lo = max([0] + [k for k, s in enumerate(samples) if s.t <= t0])
        hi = min([len(samples) - 1] + [k for k, s in enumerate(samples) if s.t >= t1])
        return samples[lo:hi + 1]


def samples_csv(samples: list[Sample], capacity: float) -> str:
    """The samples as CSV: wall time, seconds from the first, the tree's busy share of its CPUs since the last
    sample, the host's runnable tasks (cpu.csv of an emulated run)."""
    lines = ["t,elapsed_s,busy,host_run_queue"]
    for a, b in zip(samples, samples[1:]):
        if b.t > a.t:
            lines.append(f"{b.t:.3f},{b.t - samples[0].t:.3f},{(b.cpu_s - a.cpu_s) / ((b.t - a.t) * capacity):.4f},"
                         f"{b.run_queue}")
    return "\n".join(lines) + "\n"


def headroom(samples: list[Sample], t0: float, t1: float, capacity: float, host_cpus: int,
             guest: list[tuple[float, int, int]] | None = None) -> Headroom | None:
    """Headroom over [t0, t1] from cumulative samples: each sampling step's busy share weighted by how much of
    it falls inside the window; None when the samples do not cover it. `guest`: the guest sampler's
    (time, runnable, CPUs) lines (read_guest)."""
    if not (t1 > t0) or len(samples) < 2 or samples[0].t > t0 + INTERVAL_S or samples[-1].t < t1 - INTERVAL_S:
        return None
    covered = busy = steal = 0.0
    queues = []
    for a, b in zip(samples, samples[1:]):
        overlap = min(b.t, t1) - max(a.t, t0)
        if overlap <= 0 or b.t <= a.t:
            continue
        dt = b.t - a.t
        share = (b.cpu_s - a.cpu_s) / (dt * capacity)
        covered += overlap
        busy += share * overlap
        steal += (b.steal_s - a.steal_s) / (dt * host_cpus) * overlap
        queues.append(b.run_queue / host_cpus)
    if covered <= 0:
        return None
    inside = [(n, c) for t, n, c in guest or () if t0 <= t <= t1]
    return Headroom(busy=busy / covered, saturated=sum(n > c for n, c in inside) / len(inside) if inside else math.nan,
                    runnable=sum(n for n, _ in inside) / len(inside) if inside else math.nan,
                    steal=max(0.0, steal / covered), run_queue=sum(queues) / len(queues) if queues else math.nan)


def guest_sampler(path: str, interval_s: float = INTERVAL_S) -> None:
    """Inside the emulated kernel: append "wall_time runnable" lines to `path` every `interval_s`, runnable being
    the kernel's running tasks other than this one (procs_running of /proc/stat, which a UML guest counts right
    though it counts no idle time). Runs until killed; the launcher starts it before the ranks."""
    cpus = os.cpu_count() or 1
    with open(path, "a", buffering=1) as out:
        while True:
            try:
                for line in Path("/proc/stat").read_text().splitlines():
                    if line.startswith("procs_running "):
                        out.write(f"{time.time():.3f} {int(line.split()[1]) - 1} {cpus}\n")
                        break
            except (OSError, ValueError):
                pass
            time.sleep(interval_s)


#: The guest sampler's file, in the directory of the runs' outcomes (the host reads it with read_guest)
GUEST_CPU = "guest-cpu.txt"


@contextlib.contextmanager
def guest_sampling(directory: str | Path):
    """Inside the emulated kernel, around a launcher's runs: guest_sampler in a process of its own writing
    `directory`/GUEST_CPU, killed on the way out."""
    sampler = subprocess.Popen([sys.executable, "-m", "harness.network.headroom", str(Path(directory) / GUEST_CPU)],
                               stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        sampler.kill()
        sampler.wait()


def read_guest(path: str | Path) -> list[tuple[float, int, int]]:
    """The guest sampler's lines: (wall time, runnable tasks besides the sampler, the kernel's CPUs)."""
    out = []
    try:
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                try:
                    out.append((float(parts[0]), int(parts[1]), int(parts[2])))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


__all__ = ["CpuMonitor", "Headroom", "Sample", "headroom", "host_bound", "LATE_SHARE", "HOST_BOUND_BUSY",
           "tree_cpu_seconds", "samples_csv", "guest_sampler", "guest_sampling", "read_guest", "GUEST_CPU"]


if __name__ == "__main__":
    guest_sampler(sys.argv[1])
