"""One rank under any launcher (loopback fork, emulated cluster, torchrun): bootstrap, train, leave.

`rank_main` initialises the default process group, arms the spec's debug faults,
runs the registered system and tears the group down. `RankContext` is what a system
sees of where it runs; `progress` lines are what the emulated launcher forwards.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..files import atomic_write_text
from ..network.timeline_program import note_iteration
from ..plan.request import DebugSection, RunSpec
from ..plan import systems
from . import wire
from .stats import IterationStats, Journal

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PROGRESS_PREFIX = "harness: "


def progress(line: str) -> None:
    """One progress line on stderr (the emulated launcher forwards lines with this prefix)."""
    # one write with its newline: ranks share stderr, and an unbuffered stream would write the newline apart
    print(f"{PROGRESS_PREFIX}{line}\n", end="", file=sys.stderr, flush=True)


def iteration_progress(it: int, steps: int, warmup: int, seconds: float, mark: bool = True) -> None:
    """The line every system prints on rank 0 after iteration `it` (0-based) of `steps`; in an emulated
    cluster with a timeline, also where the run is (its iteration events fire on these marks). A system
    whose every rank marks its iterations (`iteration_mark`) passes mark=False."""
    if mark:
        iteration_mark(it, seconds, 1)
    progress(f"iteration {it + 1}/{steps}{' (warm-up)' if it < warmup else ''}: {seconds:.2f} s on rank 0")


def iteration_mark(it: int, seconds: float, ranks: int) -> None:
    """Tell the emulated cluster's timeline controller, if any, that this rank ended iteration `it` (0-based),
    one of `ranks` ranks that mark: iteration it + 1 begins when the last of them has."""
    now = time.monotonic()
    if it == 0:
        note_iteration(0, now - seconds, ranks)
    note_iteration(it + 1, now, ranks)


def torch_dtype(spec: RunSpec) -> torch.dtype:
    return DTYPES[spec.model.dtype]


@dataclass
class RankContext:
    """Where this rank runs; the default process group is already initialised."""

    rank: int
    world_size: int
    device_index: int  # device id in the scenario (== rank under every launcher here)
    device: torch.device
    addr: str
    ifname: str
    collect_state: bool = False
    journal: str | None = None  # a directory: the rank journals its iterations there (elastic agent)
    state: dict = field(default_factory=dict)
    marks: dict = field(default_factory=dict)  # wall-clock times of milestones (e.g. "training")
    fault: tuple | None = None  # (iteration, phase, fire): the debug section's fault at a point (arm_fault)

    def reached(self, phase: str, iteration: int) -> None:
        """A system calls this where an iteration's `phase` is under way (request.FAULT_PHASES): the debug
        section's fault for this rank fires here when it names this phase of this iteration."""
        if self.fault is not None and self.fault[:2] == (iteration, phase):
            fire, self.fault = self.fault[2], None
            fire()

    def mark(self, name: str) -> None:
        """Note when a milestone was reached (start-up time of a run = first "training" mark); under the
        elastic agent also in the journal, on time.monotonic() (a restart's time to training)."""
        if name not in self.marks and self.journal is not None:
            with open(os.path.join(self.journal, f"marks-{self.rank}.jsonl"), "a") as f:
                f.write(json.dumps({name: time.monotonic()}) + "\n")
        self.marks.setdefault(name, time.time())

    def iteration_log(self) -> Journal:
        """The list a system appends its timed iterations to (journaled when an elastic agent runs it)."""
        return Journal(None if self.journal is None else os.path.join(self.journal, f"stats-{self.rank}.jsonl"))

    def save_state(self, named: dict[str, torch.Tensor]) -> None:
        """Hand over parameters (full GPT names) for parity checks; no-op unless asked for."""
        if self.collect_state:
            self.state.update({k: v.detach().float().cpu().clone() for k, v in named.items()})


@dataclass
class RankResult:
    rank: int
    stats: list[IterationStats]
    state: dict
    marks: dict = field(default_factory=dict)
    gathered: list | None = None  # rank 0 with rank_main(gather=True): every rank's stats


@dataclass(frozen=True)
class RankEnv:
    """How one rank reaches the others (filled by the launcher)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    addr: str = "127.0.0.1"
    ifname: str = ""
    device_index: int | None = None  # defaults to rank
    local_rank: int | None = None  # GPU index on this host (cuda); defaults to rank
    journal: str | None = None  # elastic agent (train/elastic.py): the directory of keep-alives and iterations


def rank_main(spec: RunSpec, env: RankEnv, collect_state: bool = False, gather: bool = False) -> RankResult:
    """One rank: initialise the default group, run the system, tear the group down.

    With `gather` (ranks that share no parent, e.g. under torchrun), rank 0's result holds
    every rank's stats in `.gathered` (rank order)."""
    torch.set_num_threads(spec.run.threads)
    os.environ.update(
        MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port),
        RANK=str(env.rank), WORLD_SIZE=str(env.world_size),
    )
    if env.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = env.ifname
        os.environ.setdefault("NCCL_SOCKET_IFNAME", env.ifname)
    local = env.rank if env.local_rank is None else env.local_rank
    if spec.run.device_type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if env.journal:
        keep_alive(env.journal, env.rank, spec.run.keepalive_s)
    fn = systems.get(spec.run.system).train_fn()
    kwargs = {"device_id": device} if backend == "nccl" else {}
    t_forked = time.time()
    dist.init_process_group(backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=spec.run.group_timeout_s), **kwargs)
    device_index = env.rank if env.device_index is None else env.device_index
    ctx = RankContext(rank=env.rank, world_size=env.world_size, device_index=device_index,
                      device=device, addr=env.addr, ifname=env.ifname, collect_state=collect_state,
                      journal=env.journal, fault=arm_fault(spec.debug, env.rank, device_index, env.journal))
    ctx.marks["forked"] = t_forked
    ctx.mark("process_group")
    with wire.counting(spec.debug.count_wire, env.ifname):
        stats = fn(ctx, spec)
    result = RankResult(env.rank, stats, ctx.state, ctx.marks)
    if gather:
        everyone = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object(stats, everyone, dst=0)
        result.gathered = everyone
    leave_together(env.rank, env.world_size, spec.run.group_timeout_s)
    dist.destroy_process_group()
    return result


def leave_together(rank: int, world_size: int, timeout_s: float) -> None:
    """Rank 0 hosts the store: it leaves only after every rank said it is done. (A gloo
    barrier would not do: with lazily connected pairs, a rank done with its part of the
    barrier can take the store down while others still need it to connect.)"""
    store = dist.distributed_c10d._get_default_store()
    store.add("harness/done", 1)
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        while store.add("harness/done", 0) < world_size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish within {timeout_s:g} s of rank 0")
            time.sleep(0.02)


def keep_alive(directory: str, rank: int, every_s: float) -> None:
    """The rank's keep-alive for the elastic agent: its time.monotonic() in <directory>/alive-<rank> every
    `every_s` (a thread; it stops with the process, as a preempted device's does)."""
    path, tmp = os.path.join(directory, f"alive-{rank}"), os.path.join(directory, f".alive-{rank}")

    def beat():
        while True:
            with open(tmp, "w") as f:
                f.write(f"{time.monotonic():.6f}")
            os.replace(tmp, path)
            time.sleep(every_s)

    threading.Thread(target=beat, name="harness-keepalive", daemon=True).start()


def arm_fault(debug: DebugSection, rank: int, device_index: int, journal: str | None = None) -> tuple | None:
    """The debug section's fault, so tests see how a run fails, or recovers, when a rank disappears: rank
    `fault_rank` (with fault_mode preempt: the rank on device `fault_rank`) dies `fault_after_s` after joining
    the group (SIGKILL, or exit code 17); with `fault_iteration`, the (iteration, phase, fire) at which it dies
    instead (RankContext.reached). A preemption with `fault_notice_s` warns first: the rank writes
    <journal>/notice-<rank> (its time.monotonic(), for the elastic agent) and dies that many seconds later."""
    if debug.fault_rank is None or debug.fault_rank != (device_index if debug.fault_mode == "preempt" else rank):
        return None

    def fire():
        if debug.fault_notice_s and journal is not None:
            atomic_write_text(os.path.join(journal, f"notice-{rank}"), f"{time.monotonic():.6f}")
            _after(debug.fault_notice_s, _die, debug.fault_mode)
        else:
            _die(debug.fault_mode)
    if debug.fault_iteration is not None:
        return debug.fault_iteration, debug.fault_phase, fire
    _after(debug.fault_after_s, fire)
    return None


def _after(seconds: float, fn, *args) -> None:
    t = threading.Timer(seconds, fn, args=args)
    t.daemon = True
    t.start()


def _die(mode: str) -> None:
    if mode == "exit":
        os._exit(17)
    os.kill(os.getpid(), signal.SIGKILL)  # kill; preempt: the machine is gone, its processes with it


def warm_up_parent(spec: RunSpec) -> None:
    """Run one tiny CPU training step in the launcher before forking, so the children share
    the already faulted-in kernel code instead of each loading it (slow on UML's hostfs).
    Single-threaded (no OpenMP pool exists to break in the children); never touches CUDA."""
    from dataclasses import replace

    from .gpt import GPT, lm_loss, synthetic_batch
    from .nets import net_of

    torch.set_num_threads(1)
    if spec.model.is_cnn:  # a small CNN: one step of it on two images
        net = net_of(spec.model)
        model = net.build()
        images, labels = net.batch(0)
        net.loss(model(images[:2]), labels[:2]).backward()
    else:
        cfg = replace(spec.cfg, layers=1, hidden=64, heads=4, seq=16, vocab=256)
        model = GPT(cfg, 0)
        tokens, targets = synthetic_batch(cfg, 2, 0, 0)
        lm_loss(model(tokens), targets).backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tensor_split(2)
